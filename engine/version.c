/*
 * engine/version.c - what this build of the library is: ferry_version and
 * ferry_features (the optional parts it was built with).
 *
 * FERRY_HAVE_RDMA_TRANSPORT is defined by the build once backends/rdma/
 * is compiled in; libibverbs alone is not enough. FERRY_FEATURE_CUDA is
 * the machine's, not the build's: the CUDA runtime loaded (engine/cuda_rt.h,
 * on this first call) and sees a device.
 */
#include "cuda_rt.h"
#include "ferry.h"

int ferry_version(void)
{
	return FERRY_VERSION_NUMBER;
}

uint32_t ferry_features(void)
{
	uint32_t f = FERRY_FEATURE_SHM | FERRY_FEATURE_TCP;

#ifdef FERRY_HAVE_ZMQ
	f |= FERRY_FEATURE_CONTROL;
#endif
#ifdef FERRY_HAVE_YAML
	f |= FERRY_FEATURE_YAML;
#endif
#if defined(FERRY_HAVE_RDMA) && defined(FERRY_HAVE_RDMA_TRANSPORT)
	f |= FERRY_FEATURE_RDMA;
#endif
	if (cuda_rt_get(NULL)) /* loaded at run time: a device is there */
		f |= FERRY_FEATURE_CUDA;
	return f;
}

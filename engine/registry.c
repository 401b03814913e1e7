/*
 * engine/registry.c - the transports this build has, in rank order.
 *
 * Owns: the one list that names them. The engine starts one of each at
 * ferry_engine_create, in this order, and asks them in this order which
 * one reaches a peer (struct backend_ops.rank says why each stands where
 * it does). A new transport is a folder under backends/ and a line here.
 * rdma is here only when the build found libibverbs and librdmacm
 * (FERRY_HAVE_RDMA_TRANSPORT); on a machine without a device it reaches
 * nobody and its health says why.
 */
#include "internal.h"

extern const struct backend_ops ferry__ctl_backend;
extern const struct backend_ops ferry__tcp_backend;
extern const struct backend_ops ferry__loop_backend;
extern const struct backend_ops ferry__shm_backend;
extern const struct backend_ops ferry__cuda_backend;
#ifdef FERRY_HAVE_RDMA_TRANSPORT
extern const struct backend_ops ferry__rdma_backend;
#endif

const struct backend_ops *const ferry__transports[] = {
	&ferry__ctl_backend,  /* rank 0: holds a PUT while its peer's handshake runs */
#ifdef FERRY_HAVE_RDMA_TRANSPORT
	&ferry__rdma_backend, /* rank 5: a peer with an rdma address, when a device is here */
#endif
	&ferry__tcp_backend,  /* rank 10: a peer given an address goes there, always */
	&ferry__loop_backend, /* rank 20: an engine of this process */
	&ferry__shm_backend,  /* rank 30: an engine of this host */
	&ferry__cuda_backend, /* rank 90: a service, the memory domain of CUDA device memory */
	NULL,
};

/*
 * engine/cuda_rt.c - the CUDA runtime loaded with dlopen (engine/cuda_rt.h).
 *
 * Owns: finding and loading libcudart once per process, the table of the
 * entry points ferry calls, and the sentence that says why CUDA is not
 * usable (logged once). With the toolkit's headers at build time
 * (FERRY_HAVE_CUDA_H), every type and constant declared in cuda_rt.h is
 * checked against them; without them nothing changes but the check.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "log.h"

#ifdef FERRY_HAVE_CUDA_H
#include <cuda_runtime_api.h>
_Static_assert(CUDA_OK == cudaSuccess, "cudaSuccess");
_Static_assert(CUDA_ERR_NO_DEVICE == cudaErrorNoDevice, "cudaErrorNoDevice");
_Static_assert(CUDA_ERR_NOT_READY == cudaErrorNotReady, "cudaErrorNotReady");
_Static_assert(CUDA_MEMCPY_DEFAULT == cudaMemcpyDefault, "cudaMemcpyDefault");
_Static_assert(CUDA_STREAM_NON_BLOCKING == cudaStreamNonBlocking, "cudaStreamNonBlocking");
_Static_assert(CUDA_EVENT_DISABLE_TIMING == cudaEventDisableTiming, "cudaEventDisableTiming");
_Static_assert(CUDA_HOST_REGISTER_PORTABLE == cudaHostRegisterPortable, "cudaHostRegisterPortable");
_Static_assert(CUDA_HOST_REGISTER_READ_ONLY == cudaHostRegisterReadOnly, "cudaHostRegisterReadOnly");
_Static_assert(CUDA_IPC_LAZY_PEER_ACCESS == cudaIpcMemLazyEnablePeerAccess, "cudaIpcMemLazy...");
_Static_assert(CUDA_MEM_TYPE_DEVICE == cudaMemoryTypeDevice, "cudaMemoryTypeDevice");
_Static_assert(CUDA_MEM_TYPE_MANAGED == cudaMemoryTypeManaged, "cudaMemoryTypeManaged");
_Static_assert(CUDA_IPC_HANDLE_BYTES == CUDA_IPC_HANDLE_SIZE, "CUDA_IPC_HANDLE_SIZE");
#if __has_include(<cuda.h>)
#include <cuda.h>
_Static_assert(CUDA_RANGE_DMA_BUF_FD == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
	       "CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD");
_Static_assert(CUDA_POINTER_ATTR_BUFFER_ID == CU_POINTER_ATTRIBUTE_BUFFER_ID,
	       "CU_POINTER_ATTRIBUTE_BUFFER_ID");
#endif
_Static_assert(sizeof(struct cuda_ipc_handle) == sizeof(cudaIpcMemHandle_t), "cudaIpcMemHandle_t");
_Static_assert(sizeof(cuda_err_t) == sizeof(cudaError_t), "cudaError_t");
_Static_assert(sizeof(struct cuda_ptr_attr) >= sizeof(struct cudaPointerAttributes),
	       "cudaPointerAttributes");
_Static_assert(offsetof(struct cuda_ptr_attr, type) == offsetof(struct cudaPointerAttributes, type) &&
		       offsetof(struct cuda_ptr_attr, device) ==
			       offsetof(struct cudaPointerAttributes, device) &&
		       offsetof(struct cuda_ptr_attr, device_ptr) ==
			       offsetof(struct cudaPointerAttributes, devicePointer) &&
		       offsetof(struct cuda_ptr_attr, host_ptr) ==
			       offsetof(struct cudaPointerAttributes, hostPointer),
	       "cudaPointerAttributes layout");
#endif

static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
static struct cuda_rt rt;
static const struct cuda_rt *rt_ok;
static char rt_why[256];
static _Atomic int rt_tried; /* rt_load ran: rt_why is final */

/* The entry points: name, where in the table, required. */
#define E(f, req) { "cuda" #f, offsetof(struct cuda_rt, f), req }
static const struct {
	const char *sym;
	size_t off;
	int required;
} rt_syms[] = {
	E(GetDeviceCount, 1), E(SetDevice, 1), E(StreamCreateWithFlags, 1), E(StreamDestroy, 1),
	E(StreamSynchronize, 1), E(StreamWaitEvent, 1), E(EventCreateWithFlags, 1),
	E(EventDestroy, 1), E(EventRecord, 1), E(EventQuery, 1), E(MemcpyAsync, 1),
	E(LaunchHostFunc, 1), E(HostRegister, 1), E(HostUnregister, 1),
	E(PointerGetAttributes, 1), E(GetLastError, 1), E(GetErrorString, 1),
	E(IpcGetMemHandle, 0), E(IpcOpenMemHandle, 0), E(IpcCloseMemHandle, 0),
};
#undef E

static void *rt_open(const char *env)
{
	static const char *const names[] = { "libcudart.so.13", "libcudart.so.12", "libcudart.so" };
	void *h;

	if (env && *env) {
		snprintf(rt.library, sizeof(rt.library), "%s", env);
		if (!(h = dlopen(env, RTLD_NOW | RTLD_LOCAL)))
			snprintf(rt_why, sizeof(rt_why), "the CUDA runtime named by FERRY_CUDA_RUNTIME "
				 "(%s) did not load: %s", env, dlerror());
		return h;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) {
			snprintf(rt.library, sizeof(rt.library), "%s", names[i]);
			return h;
		}
	}
	snprintf(rt_why, sizeof(rt_why), "no CUDA runtime on this machine (libcudart.so.13, .12 "
		 "or libcudart.so did not load)");
	return NULL;
}

/*
 * An entry point of the driver API: in the runtime's library (a double
 * has it there), else in the libcuda.so.1 the runtime itself loaded
 * (never loaded by us: the runtime's own reference keeps it loaded).
 */
static void *driver_sym(void *runtime, const char *name)
{
	void *f = dlsym(runtime, name), *drv;

	if (f || !(drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)))
		return f;
	f = dlsym(drv, name);
	dlclose(drv);
	return f;
}

static void rt_load(void)
{
	const char *env = getenv("FERRY_CUDA_RUNTIME");
	void *h;
	int n = 0;
	cuda_err_t err;

	if (env && !strcmp(env, "none")) {
		snprintf(rt_why, sizeof(rt_why), "CUDA is off (FERRY_CUDA_RUNTIME=none)");
		goto out;
	}
	if (!(h = rt_open(env)))
		goto out;
	for (size_t i = 0; i < sizeof(rt_syms) / sizeof(rt_syms[0]); i++) {
		void *f = dlsym(h, rt_syms[i].sym);

		if (!f && rt_syms[i].required) {
			snprintf(rt_why, sizeof(rt_why), "the CUDA runtime %s lacks %s", rt.library,
				 rt_syms[i].sym);
			memset(&rt, 0, offsetof(struct cuda_rt, devices)); /* nothing of it is called */
			dlclose(h);
			goto out;
		}
		memcpy((char *)&rt + rt_syms[i].off, &f, sizeof(f));
	}
	/* Kept loaded for the process's life: handles and callbacks live in it. */
	err = rt.GetDeviceCount(&n);
	if (err != CUDA_OK || n <= 0) {
		snprintf(rt_why, sizeof(rt_why), "the CUDA runtime %s sees no device (%s)", rt.library,
			 err == CUDA_OK ? "0 devices" : rt.GetErrorString(err));
		rt.GetLastError(); /* clear it */
		goto out;
	}
	rt.devices = n;
	*(void **)&rt.MemGetAddressRange = driver_sym(h, "cuMemGetAddressRange_v2");
	*(void **)&rt.MemGetHandleForAddressRange = driver_sym(h, "cuMemGetHandleForAddressRange");
	*(void **)&rt.DeviceGet = driver_sym(h, "cuDeviceGet");
	*(void **)&rt.DevicePrimaryCtxRetain = driver_sym(h, "cuDevicePrimaryCtxRetain");
	*(void **)&rt.CtxPushCurrent = driver_sym(h, "cuCtxPushCurrent_v2");
	*(void **)&rt.CtxPopCurrent = driver_sym(h, "cuCtxPopCurrent_v2");
	*(void **)&rt.DevicePrimaryCtxRelease = driver_sym(h, "cuDevicePrimaryCtxRelease_v2");
	*(void **)&rt.PointerGetAttribute = driver_sym(h, "cuPointerGetAttribute");
	rt_ok = &rt;
	log_info("CUDA: %s loaded, %d device(s)", rt.library, n);
	atomic_store(&rt_tried, 1);
	return;
out:
	log_info("CUDA device memory is not available: %s", rt_why);
	atomic_store(&rt_tried, 1);
}

const char *cuda_rt_why(void)
{
	if (!atomic_load(&rt_tried))
		return "not loaded yet (it is, with the first device region)";
	return rt_ok ? "" : rt_why;
}

const struct cuda_rt *cuda_rt_get(const char **why)
{
	pthread_once(&rt_once, rt_load);
	if (!rt_ok && why)
		*why = rt_why;
	return rt_ok;
}

const struct cuda_rt *cuda_rt_loaded(void)
{
	return atomic_load(&rt_tried) ? rt_ok : NULL; /* rt_ok is set before rt_tried */
}

const char *cuda_rt_strerror(cuda_err_t err)
{
	static __thread char buf[32];
	const char *s;

	if (rt.GetErrorString && (s = rt.GetErrorString(err)))
		return s;
	snprintf(buf, sizeof(buf), "CUDA error %d", err);
	return buf;
}

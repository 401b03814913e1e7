/*
 * engine/cuda_rt.h - the CUDA runtime, loaded at run time.
 *
 * Owns: the process-wide table of the few CUDA runtime entry points ferry
 * calls (struct cuda_rt), filled once by dlopen of libcudart (never linked:
 * one build runs on machines with and without a GPU), the types they take
 * (declared here, so the build never needs the toolkit's headers; when the
 * headers are there, engine/cuda_rt.c checks every declaration against
 * them at compile time), and why CUDA is not usable when it is not (no
 * library, a missing entry point, no device): cuda_rt_get's why.
 *
 * The library is libcudart.so.13, .12, or libcudart.so, or the file named
 * by FERRY_CUDA_RUNTIME (read once, at the first use): a path, or "none"
 * (CUDA off: nothing is loaded). The tests point it at their double of the
 * runtime (tests/cuda_double/).
 */
#ifndef FERRY_CUDA_RT_H
#define FERRY_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

/* The runtime's types, as ferry needs them (checked against cuda_runtime_api.h when present). */
typedef int cuda_err_t;          /* cudaError_t */
typedef void *cuda_stream_t;     /* cudaStream_t */
typedef void *cuda_event_t;      /* cudaEvent_t */
typedef void (*cuda_host_fn)(void *arg); /* cudaHostFn_t */

#define CUDA_OK 0                   /* cudaSuccess */
#define CUDA_ERR_NO_DEVICE 100      /* cudaErrorNoDevice */
#define CUDA_ERR_NOT_READY 600      /* cudaErrorNotReady */
#define CUDA_MEMCPY_DEFAULT 4       /* cudaMemcpyDefault: the direction from the pointers */
#define CUDA_STREAM_NON_BLOCKING 1  /* cudaStreamNonBlocking */
#define CUDA_EVENT_DISABLE_TIMING 2 /* cudaEventDisableTiming */
#define CUDA_HOST_REGISTER_PORTABLE 1 /* cudaHostRegisterPortable */
#define CUDA_HOST_REGISTER_READ_ONLY 8 /* cudaHostRegisterReadOnly: a mapping the device only reads */
#define CUDA_IPC_LAZY_PEER_ACCESS 1 /* cudaIpcMemLazyEnablePeerAccess */
#define CUDA_MEM_TYPE_DEVICE 2      /* cudaMemoryTypeDevice */
#define CUDA_MEM_TYPE_MANAGED 3     /* cudaMemoryTypeManaged */
#define CUDA_IPC_HANDLE_BYTES 64    /* CUDA_IPC_HANDLE_SIZE */
#define CUDA_RANGE_DMA_BUF_FD 1     /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (driver API) */
#define CUDA_POINTER_ATTR_BUFFER_ID 7 /* CU_POINTER_ATTRIBUTE_BUFFER_ID (driver API) */

struct cuda_ptr_attr { /* struct cudaPointerAttributes, with room to spare */
	int type;
	int device;
	void *device_ptr;
	void *host_ptr;
	long reserved[16];
};

struct cuda_ipc_handle { /* cudaIpcMemHandle_t */
	char bytes[CUDA_IPC_HANDLE_BYTES];
};

struct cuda_rt {
	cuda_err_t (*GetDeviceCount)(int *n);
	cuda_err_t (*SetDevice)(int dev);
	cuda_err_t (*StreamCreateWithFlags)(cuda_stream_t *s, unsigned flags);
	cuda_err_t (*StreamDestroy)(cuda_stream_t s);
	cuda_err_t (*StreamSynchronize)(cuda_stream_t s); /* only at teardown, never on the reactor's rounds */
	cuda_err_t (*StreamWaitEvent)(cuda_stream_t s, cuda_event_t ev, unsigned flags);
	cuda_err_t (*EventCreateWithFlags)(cuda_event_t *ev, unsigned flags);
	cuda_err_t (*EventDestroy)(cuda_event_t ev);
	cuda_err_t (*EventRecord)(cuda_event_t ev, cuda_stream_t s);
	cuda_err_t (*EventQuery)(cuda_event_t ev);
	cuda_err_t (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, cuda_stream_t s);
	cuda_err_t (*LaunchHostFunc)(cuda_stream_t s, cuda_host_fn fn, void *arg);
	cuda_err_t (*HostRegister)(void *p, size_t n, unsigned flags);
	cuda_err_t (*HostUnregister)(void *p);
	cuda_err_t (*PointerGetAttributes)(struct cuda_ptr_attr *a, const void *p);
	cuda_err_t (*GetLastError)(void);
	const char *(*GetErrorString)(cuda_err_t err);
	/* Same-host IPC (optional: NULL when the library lacks them). */
	cuda_err_t (*IpcGetMemHandle)(struct cuda_ipc_handle *h, void *p);
	cuda_err_t (*IpcOpenMemHandle)(void **p, struct cuda_ipc_handle h, unsigned flags);
	cuda_err_t (*IpcCloseMemHandle)(void *p);
	/*
	 * The driver API's cuMemGetAddressRange_v2 (CUresult; CUdeviceptr as
	 * unsigned long long): the base of the allocation holding p, which an
	 * IPC handle names. Optional: looked up in the runtime's library, else
	 * in the libcuda.so.1 the runtime itself loaded (never loaded by us).
	 */
	int (*MemGetAddressRange)(unsigned long long *base, size_t *size, unsigned long long p);
	/*
	 * The driver API's cuMemGetHandleForAddressRange (CUDA 11.7 on): with
	 * CUDA_RANGE_DMA_BUF_FD, a dma-buf file descriptor of device memory
	 * [p, p + size) (both aligned to the host's page; the caller closes
	 * it), which a NIC's driver registers for GPUDirect RDMA
	 * (ibv_reg_dmabuf_mr). Optional, found as MemGetAddressRange is.
	 */
	int (*MemGetHandleForAddressRange)(void *handle, unsigned long long p, size_t size,
					   int type, unsigned long long flags);
	/*
	 * The driver API's calls that make a device's primary context current
	 * on this thread for a driver call and then give the thread back as it
	 * was (CUdevice as int, CUcontext as void *): cuDeviceGet,
	 * cuDevicePrimaryCtxRetain, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
	 * cuDevicePrimaryCtxRelease_v2. Optional, found as the two above.
	 */
	int (*DeviceGet)(int *dev, int ordinal);
	int (*DevicePrimaryCtxRetain)(void **ctx, int dev);
	int (*CtxPushCurrent)(void *ctx);
	int (*CtxPopCurrent)(void **ctx);
	int (*DevicePrimaryCtxRelease)(int dev);
	/* The driver API's cuPointerGetAttribute (CUdeviceptr as unsigned long long). Optional. */
	int (*PointerGetAttribute)(void *data, int attr, unsigned long long p);
	int devices;         /* what GetDeviceCount said (0 when it failed) */
	char library[128];   /* the file loaded */
};

/*
 * The runtime, loaded on the first call (thread-safe, once per process):
 * the table when it loaded and has at least one device; else NULL, and
 * *why (when why is not NULL) says why in a sentence (also logged once).
 * Any thread.
 */
const struct cuda_rt *cuda_rt_get(const char **why);
/* The runtime if this process has loaded it (and it has a device), else NULL: never loads it. */
const struct cuda_rt *cuda_rt_loaded(void);
/*
 * Why CUDA is not usable, without loading anything: the sentence of the
 * load that was tried, or that none was yet. Any thread.
 */
const char *cuda_rt_why(void);
/* The runtime's text for err ("error N" when it has none or is not loaded). */
const char *cuda_rt_strerror(cuda_err_t err);

#endif

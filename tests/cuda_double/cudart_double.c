/*
 * tests/cuda_double/cudart_double.c - a TEST DOUBLE of the CUDA runtime
 * (libferry_cudart_double.so), never a GPU result.
 *
 * Owns: the few cuda* entry points ferry loads (engine/cuda_rt.h), written
 * here over host memory, so that the tests drive ferry's CUDA memory
 * domain (staging, events, host callbacks, the caller's wait) on a machine
 * without a GPU. "Device memory" is host memory that cudadouble_malloc
 * handed out and PointerGetAttributes knows as a device's; every stream is
 * a thread of this library that runs its queue in order (copies, event
 * records, waits on events, host functions), so completions arrive
 * asynchronously, from another thread, as on a GPU. A test steers it
 * through the cudadouble_* functions: devices seen, a gate that holds a
 * stream (the caller's "kernel"), a delay per copy, errors injected into
 * the next calls of an entry point or into a stream's next copy, counters.
 * Loaded by ferry through FERRY_CUDA_RUNTIME=<this file>.
 *
 * IPC: every "device" allocation is a shared mapping of a memfd of its
 * own, so another process can map the same bytes. An IPC handle
 * (cudaIpcGetMemHandle, of the allocation that holds the pointer, as the
 * real runtime does) names the exporting process, its memfd's descriptor
 * and the allocation's size; cudaIpcOpenMemHandle in another process maps
 * /proc/<pid>/fd/<fd> (the same host memory: what the receiver copies
 * from is what the sender wrote, as with a GPU's IPC mapping) and refuses
 * a handle of its own process, as CUDA does. cuMemGetAddressRange_v2 (the
 * driver's, which ferry looks for beside the runtime) gives an
 * allocation's base. cudadouble_set_ipc(0) makes the runtime one without
 * IPC (cudaIpcGetMemHandle: not supported).
 *
 * dma-buf (GPUDirect RDMA): cuMemGetHandleForAddressRange exports a
 * page-aligned range of an allocation as a descriptor, a duplicate of its
 * memfd, and remembers where in the memfd the range starts
 * (cudadouble_dmabuf_origin), which a test double of the NIC's dma-buf
 * registration maps (the memfd is not a real dma-buf: no driver here
 * takes one), with the allocation's device's context current on the
 * calling thread (cuCtxPushCurrent_v2 of its primary context), else
 * CUDA_ERROR_INVALID_CONTEXT. cudadouble_set_dmabuf(0) makes the driver one
 * without dma-buf export (CUDA_ERROR_NOT_SUPPORTED).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_rt.h"

#define API __attribute__((visibility("default")))
#define ERR_INVALID_VALUE 1
#define ERR_INVALID_DEVICE 101
#define MAX_ALLOCS 128

enum task_kind { T_COPY, T_RECORD, T_WAIT, T_HOSTFN, T_GATE };

struct dev_event {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t recorded, completed;
	int error; /* of the work before its last completed record */
};

struct task {
	enum task_kind kind;
	void *dst;
	const void *src;
	size_t n;
	struct dev_event *ev;
	uint64_t seq;
	cuda_host_fn fn;
	void *arg;
	struct task *next;
};

struct dev_stream {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct task *head, *tail;
	int busy, stop;
	int error;      /* an injected asynchronous error: the next event record carries it */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cond = PTHREAD_COND_INITIALIZER;
static int g_gate_closed;
static int g_devices = -1;
static int g_cur_dev;
static unsigned g_copy_delay_us;
static int g_fail_next_copy; /* inject: the next copy to run, on any stream, fails with this */
static int g_fail_copy_skip; /* ... after this many more have run */
static struct {
	char *base;
	size_t len;
	int dev;
	int fd;       /* its memfd (-1: a mapping opened from another process's handle) */
	uint64_t id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never the same twice */
} g_alloc[MAX_ALLOCS];
static uint64_t g_next_id = 1;
static int g_ipc_off;
static int g_dmabuf_off;
static uint64_t g_dmabuf_exports, g_dmabuf_asked;
/* Descriptors exported by cuMemGetHandleForAddressRange (fd1: fd + 1): where each range starts. */
static struct {
	int fd1;
	uint64_t at;
} g_dmabuf[MAX_ALLOCS];
static uint64_t g_ipc_gets, g_ipc_opens, g_ipc_closes;

/* The double's IPC handle: the exporter, its memfd, the allocation's size. */
struct dbl_ipc {
	uint32_t magic;
	int32_t pid;
	int32_t fd;
	int32_t dev;
	uint64_t len;
};
#define DBL_IPC_MAGIC 0x46444950u
#define ERR_NOT_SUPPORTED 801
#define ERR_INVALID_HANDLE 400
static struct {
	char fn[48];
	int err;
	int skip; /* calls to let through first */
	int count;
} g_fail[8];
static uint64_t g_copies, g_copy_bytes, g_max_piece, g_hostfns, g_waits, g_syncs, g_queries,
	g_pinned, g_streams;
static struct dev_stream *g_default;

/* An error injected into this call of fn, or 0. */
static int injected(const char *fn)
{
	int err = 0;

	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < 8; i++) {
		if (!g_fail[i].count || strcmp(g_fail[i].fn, fn))
			continue;
		if (g_fail[i].skip) {
			g_fail[i].skip--;
			continue;
		}
		g_fail[i].count--;
		err = g_fail[i].err;
		break;
	}
	pthread_mutex_unlock(&g_lock);
	return err;
}

static void *stream_main(void *arg)
{
	struct dev_stream *s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct task *t;

		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cond, &s->lock);
		if (!s->head)
			break;
		t = s->head;
		s->head = t->next;
		if (!s->head)
			s->tail = NULL;
		s->busy = 1;
		pthread_mutex_unlock(&s->lock);
		switch (t->kind) {
		case T_COPY: {
			int fail;

			if (g_copy_delay_us)
				usleep(g_copy_delay_us);
			pthread_mutex_lock(&g_lock);
			fail = g_fail_copy_skip ? 0 : g_fail_next_copy;
			if (g_fail_copy_skip)
				g_fail_copy_skip--;
			else
				g_fail_next_copy = 0;
			pthread_mutex_unlock(&g_lock);
			if (fail)
				s->error = fail;
			else
				memmove(t->dst, t->src, t->n);
			break;
		}
		case T_RECORD:
			pthread_mutex_lock(&t->ev->lock);
			t->ev->completed = t->seq;
			t->ev->error = s->error;
			s->error = 0; /* carried by this record only (not sticky) */
			pthread_cond_broadcast(&t->ev->cond);
			pthread_mutex_unlock(&t->ev->lock);
			break;
		case T_WAIT:
			pthread_mutex_lock(&t->ev->lock);
			while (t->ev->completed < t->seq)
				pthread_cond_wait(&t->ev->cond, &t->ev->lock);
			pthread_mutex_unlock(&t->ev->lock);
			break;
		case T_HOSTFN:
			t->fn(t->arg);
			break;
		case T_GATE:
			pthread_mutex_lock(&g_lock);
			while (g_gate_closed)
				pthread_cond_wait(&g_gate_cond, &g_lock);
			pthread_mutex_unlock(&g_lock);
			break;
		}
		free(t);
		pthread_mutex_lock(&s->lock);
		s->busy = 0;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static struct dev_stream *stream_new(void)
{
	struct dev_stream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	if (pthread_create(&s->thread, NULL, stream_main, s)) {
		free(s);
		return NULL;
	}
	pthread_mutex_lock(&g_lock);
	g_streams++;
	pthread_mutex_unlock(&g_lock);
	return s;
}

static struct dev_stream *stream_of(cuda_stream_t st)
{
	if (st)
		return st;
	pthread_mutex_lock(&g_lock);
	if (!g_default)
		g_default = stream_new();
	pthread_mutex_unlock(&g_lock);
	return g_default;
}

static int enqueue(cuda_stream_t st, struct task *proto)
{
	struct dev_stream *s = stream_of(st);
	struct task *t = malloc(sizeof(*t));

	if (!s || !t) {
		free(t);
		return 2; /* cudaErrorMemoryAllocation */
	}
	*t = *proto;
	t->next = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->tail)
		s->tail->next = t;
	else
		s->head = t;
	s->tail = t;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ---- the runtime's entry points --------------------------------------- */

API cuda_err_t cudaGetDeviceCount(int *n)
{
	int err = injected("cudaGetDeviceCount");

	if (g_devices < 0) {
		const char *env = getenv("FERRY_CUDA_DOUBLE_DEVICES");

		g_devices = env ? atoi(env) : 2;
	}
	*n = err ? 0 : g_devices;
	return err ? err : g_devices ? 0 : CUDA_ERR_NO_DEVICE;
}

API cuda_err_t cudaSetDevice(int dev)
{
	int err = injected("cudaSetDevice");

	if (err)
		return err;
	if (dev < 0 || dev >= g_devices)
		return ERR_INVALID_DEVICE;
	g_cur_dev = dev;
	return 0;
}

/*
 * The driver's contexts, as far as ferry uses them: a device's primary
 * context (named by its ordinal + 1), pushed on and popped off this
 * thread's stack. cuMemGetHandleForAddressRange wants the allocation's
 * device's context current, as the driver does (CUDA_ERROR_INVALID_CONTEXT).
 */
#define ERR_INVALID_CONTEXT 201
static __thread int t_ctx_stack[8];
static __thread int t_ctx_depth;

API int cuDeviceGet(int *dev, int ordinal)
{
	if (ordinal < 0 || ordinal >= g_devices)
		return ERR_INVALID_DEVICE;
	*dev = ordinal;
	return 0;
}

API int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
	*ctx = (void *)(uintptr_t)(dev + 1);
	return 0;
}

API int cuDevicePrimaryCtxRelease_v2(int dev)
{
	(void)dev;
	return 0;
}

API int cuCtxPushCurrent_v2(void *ctx)
{
	if (t_ctx_depth == 8)
		return ERR_INVALID_VALUE;
	t_ctx_stack[t_ctx_depth++] = (int)(uintptr_t)ctx;
	return 0;
}

API int cuCtxPopCurrent_v2(void **ctx)
{
	if (!t_ctx_depth)
		return ERR_INVALID_CONTEXT;
	*ctx = (void *)(uintptr_t)t_ctx_stack[--t_ctx_depth];
	return 0;
}

API cuda_err_t cudaStreamCreateWithFlags(cuda_stream_t *st, unsigned flags)
{
	int err = injected("cudaStreamCreateWithFlags");

	(void)flags;
	if (err)
		return err;
	*st = stream_new();
	return *st ? 0 : 2;
}

API cuda_err_t cudaStreamSynchronize(cuda_stream_t st)
{
	struct dev_stream *s = stream_of(st);

	pthread_mutex_lock(&g_lock);
	g_syncs++;
	pthread_mutex_unlock(&g_lock);
	pthread_mutex_lock(&s->lock);
	while (s->head || s->busy)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

API cuda_err_t cudaStreamDestroy(cuda_stream_t st)
{
	struct dev_stream *s = st;

	if (!s)
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&s->lock);
	s->stop = 1; /* its queue is run out first */
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thread, NULL);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s);
	pthread_mutex_lock(&g_lock);
	g_streams--;
	pthread_mutex_unlock(&g_lock);
	return 0;
}

API cuda_err_t cudaEventCreateWithFlags(cuda_event_t *ev, unsigned flags)
{
	struct dev_event *e;
	int err = injected("cudaEventCreateWithFlags");

	(void)flags;
	if (err)
		return err;
	if (!(e = calloc(1, sizeof(*e))))
		return 2;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	*ev = e;
	return 0;
}

API cuda_err_t cudaEventDestroy(cuda_event_t ev)
{
	struct dev_event *e = ev;

	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	free(e);
	return 0;
}

API cuda_err_t cudaEventRecord(cuda_event_t ev, cuda_stream_t st)
{
	struct dev_event *e = ev;
	struct task t = { .kind = T_RECORD, .ev = e };
	int err = injected("cudaEventRecord");

	if (err)
		return err;
	pthread_mutex_lock(&e->lock);
	t.seq = ++e->recorded;
	pthread_mutex_unlock(&e->lock);
	return enqueue(st, &t);
}

API cuda_err_t cudaEventQuery(cuda_event_t ev)
{
	struct dev_event *e = ev;
	int r;

	pthread_mutex_lock(&g_lock);
	g_queries++;
	pthread_mutex_unlock(&g_lock);
	pthread_mutex_lock(&e->lock);
	r = e->completed < e->recorded ? CUDA_ERR_NOT_READY : e->error;
	pthread_mutex_unlock(&e->lock);
	return r;
}

API cuda_err_t cudaStreamWaitEvent(cuda_stream_t st, cuda_event_t ev, unsigned flags)
{
	struct dev_event *e = ev;
	struct task t = { .kind = T_WAIT, .ev = e };
	int err = injected("cudaStreamWaitEvent");

	(void)flags;
	if (err)
		return err;
	pthread_mutex_lock(&e->lock);
	t.seq = e->recorded; /* the work recorded so far, as CUDA does */
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_lock(&g_lock);
	g_waits++;
	pthread_mutex_unlock(&g_lock);
	return enqueue(st, &t);
}

API cuda_err_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cuda_stream_t st)
{
	struct task t = { .kind = T_COPY, .dst = dst, .src = src, .n = n };
	int err = injected("cudaMemcpyAsync");

	if (err)
		return err;
	if (kind != CUDA_MEMCPY_DEFAULT || (n && (!dst || !src)))
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	g_copies++;
	g_copy_bytes += n;
	if (n > g_max_piece)
		g_max_piece = n;
	pthread_mutex_unlock(&g_lock);
	return enqueue(st, &t);
}

API cuda_err_t cudaLaunchHostFunc(cuda_stream_t st, cuda_host_fn fn, void *arg)
{
	struct task t = { .kind = T_HOSTFN, .fn = fn, .arg = arg };
	int err = injected("cudaLaunchHostFunc");

	if (err)
		return err;
	pthread_mutex_lock(&g_lock);
	g_hostfns++;
	pthread_mutex_unlock(&g_lock);
	return enqueue(st, &t);
}

/*
 * Pinned host ranges, as the runtime keeps them: a range overlapping one
 * already pinned is refused (cudaErrorHostMemoryAlreadyRegistered), a
 * mapping this process cannot write is refused without
 * cudaHostRegisterReadOnly (as on a GPU), unregistering an address that
 * does not start a pinned range is cudaErrorHostMemoryNotRegistered.
 */
#define MAX_PINS 32
#define ERR_ALREADY_REGISTERED 712
#define ERR_NOT_REGISTERED 713
static struct { const char *base; size_t len; } g_pins[MAX_PINS];

/* Is every page of [p, p + n) mapped writable here (/proc/self/maps)? */
static int writable(const void *p, size_t n)
{
	FILE *f = fopen("/proc/self/maps", "r");
	uintptr_t a = (uintptr_t)p, end = a + n, lo, hi;
	char perms[8], line[512];

	if (!f)
		return 0;
	while (a < end && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= a && a < hi) {
			if (perms[1] != 'w')
				break;
			a = hi;
		}
	}
	fclose(f);
	return a >= end;
}

API cuda_err_t cudaHostRegister(void *p, size_t n, unsigned flags)
{
	int err = injected("cudaHostRegister"), slot = -1;
	const char *c = p;

	if (err)
		return err;
	if (!(flags & CUDA_HOST_REGISTER_READ_ONLY) && !writable(p, n))
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_PINS; i++) {
		if (!g_pins[i].base) {
			if (slot < 0)
				slot = i;
		} else if (c < g_pins[i].base + g_pins[i].len && g_pins[i].base < c + n) {
			pthread_mutex_unlock(&g_lock);
			return ERR_ALREADY_REGISTERED;
		}
	}
	if (slot < 0) {
		pthread_mutex_unlock(&g_lock);
		return ERR_INVALID_VALUE;
	}
	g_pins[slot].base = c;
	g_pins[slot].len = n;
	g_pinned += n;
	pthread_mutex_unlock(&g_lock);
	return 0;
}

API cuda_err_t cudaHostUnregister(void *p)
{
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_PINS; i++) {
		if (g_pins[i].base == p) {
			g_pinned -= g_pins[i].len;
			g_pins[i].base = NULL;
			pthread_mutex_unlock(&g_lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return ERR_NOT_REGISTERED;
}

API cuda_err_t cudaPointerGetAttributes(struct cuda_ptr_attr *a, const void *p)
{
	const char *c = p;

	memset(a, 0, sizeof(*a));
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (g_alloc[i].base && c >= g_alloc[i].base && c < g_alloc[i].base + g_alloc[i].len) {
			a->type = CUDA_MEM_TYPE_DEVICE;
			a->device = g_alloc[i].dev;
			a->device_ptr = (void *)c;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	if (!a->type)
		a->host_ptr = (void *)c; /* unregistered host memory (type 0) */
	return 0;
}

API cuda_err_t cudaGetLastError(void)
{
	return 0;
}

API const char *cudaGetErrorString(cuda_err_t err)
{
	static __thread char buf[64];

	snprintf(buf, sizeof(buf), "cuda double error %d", err);
	return buf;
}

/* ---- the test's controls ---------------------------------------------- */

/* "Device memory" of device dev: n bytes of a shared memfd mapping (NULL when the table is full). */
API void *cudadouble_malloc(int dev, size_t n)
{
	void *p = NULL;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t len = ((n ? n : 1) + page - 1) & ~(page - 1); /* whole pages, as a GPU's allocation */

	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_ALLOCS; i++) {
		int fd;

		if (g_alloc[i].base)
			continue;
		if ((fd = memfd_create("cuda-double", MFD_CLOEXEC)) < 0)
			break;
		if (ftruncate(fd, (off_t)len) ||
		    (p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
			p = NULL;
			close(fd);
			break;
		}
		g_alloc[i].base = p;
		g_alloc[i].len = n;
		g_alloc[i].dev = dev;
		g_alloc[i].fd = fd;
		g_alloc[i].id = g_next_id++;
		break;
	}
	pthread_mutex_unlock(&g_lock);
	return p;
}

API void cudadouble_free(void *p)
{
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (g_alloc[i].base == p && g_alloc[i].fd >= 0) {
			munmap(p, g_alloc[i].len ? g_alloc[i].len : 1);
			close(g_alloc[i].fd);
			g_alloc[i].base = NULL;
		}
	}
	pthread_mutex_unlock(&g_lock);
}

/* 0: the runtime behaves as one without IPC (cudaIpcGetMemHandle is not supported). */
API void cudadouble_set_ipc(int on)
{
	g_ipc_off = !on;
}

/* The allocation that holds p (g_lock held), or -1. */
static int alloc_of(const void *p)
{
	const char *c = p;

	for (int i = 0; i < MAX_ALLOCS; i++)
		if (g_alloc[i].base && c >= g_alloc[i].base &&
		    c < g_alloc[i].base + (g_alloc[i].len ? g_alloc[i].len : 1))
			return i;
	return -1;
}

/* The driver API's cuMemGetAddressRange_v2 (CUresult, CUdeviceptr): the allocation of p. */
API int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long p)
{
	int i, err = ERR_INVALID_VALUE;

	pthread_mutex_lock(&g_lock);
	if ((i = alloc_of((const void *)(uintptr_t)p)) >= 0) {
		if (base)
			*base = (uintptr_t)g_alloc[i].base;
		if (size)
			*size = g_alloc[i].len;
		err = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return err;
}

/* 0: the driver behaves as one without dma-buf export (cuMemGetHandleForAddressRange). */
API void cudadouble_set_dmabuf(int on)
{
	g_dmabuf_off = !on;
}

/*
 * The driver API's cuMemGetHandleForAddressRange (CUresult), dma-buf only:
 * [p, p + size) page-aligned, within one allocation (its pages); the
 * descriptor is the caller's to close.
 */
API int cuMemGetHandleForAddressRange(void *handle, unsigned long long p, size_t size, int type,
				      unsigned long long flags)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	int i, fd, err = injected("cuMemGetHandleForAddressRange");

	g_dmabuf_asked++;
	if (err)
		return err;
	if (g_dmabuf_off)
		return ERR_NOT_SUPPORTED;
	if (!handle || type != CUDA_RANGE_DMA_BUF_FD || flags || !size || (p & (page - 1)) ||
	    (size & (page - 1)))
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	i = alloc_of((const void *)(uintptr_t)p);
	if (i >= 0 && (!t_ctx_depth || t_ctx_stack[t_ctx_depth - 1] != g_alloc[i].dev + 1)) {
		pthread_mutex_unlock(&g_lock);
		return ERR_INVALID_CONTEXT; /* no context current, or another device's */
	}
	if (i < 0 || g_alloc[i].fd < 0 ||
	    p + size > (((uintptr_t)g_alloc[i].base + g_alloc[i].len + page - 1) & ~(page - 1)) ||
	    (fd = fcntl(g_alloc[i].fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		pthread_mutex_unlock(&g_lock);
		return ERR_INVALID_VALUE;
	}
	g_dmabuf[fd % MAX_ALLOCS].fd1 = fd + 1;
	g_dmabuf[fd % MAX_ALLOCS].at = p - (uintptr_t)g_alloc[i].base;
	g_dmabuf_exports++;
	pthread_mutex_unlock(&g_lock);
	*(int *)handle = fd;
	return 0;
}

/*
 * Where a descriptor cuMemGetHandleForAddressRange gave starts in its
 * memfd (*at), for the test's double of a NIC's dma-buf registration to
 * map it: 0, or -1 for a descriptor it did not give.
 */
API int cudadouble_dmabuf_origin(int fd, uint64_t *at)
{
	int rc = -1;

	pthread_mutex_lock(&g_lock);
	if (fd >= 0 && g_dmabuf[fd % MAX_ALLOCS].fd1 == fd + 1) {
		*at = g_dmabuf[fd % MAX_ALLOCS].at;
		rc = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return rc;
}

/* The driver API's cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_BUFFER_ID only. */
API int cuPointerGetAttribute(void *data, int attr, unsigned long long p)
{
	int i, err = ERR_INVALID_VALUE;

	if (attr != CUDA_POINTER_ATTR_BUFFER_ID)
		return ERR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	if ((i = alloc_of((const void *)(uintptr_t)p)) >= 0) {
		*(unsigned long long *)data = g_alloc[i].id;
		err = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return err;
}

API cuda_err_t cudaIpcGetMemHandle(struct cuda_ipc_handle *h, void *p)
{
	struct dbl_ipc d = { .magic = DBL_IPC_MAGIC, .pid = (int32_t)getpid() };
	int i, err = injected("cudaIpcGetMemHandle");

	if (err)
		return err;
	if (g_ipc_off)
		return ERR_NOT_SUPPORTED;
	pthread_mutex_lock(&g_lock);
	if ((i = alloc_of(p)) < 0 || g_alloc[i].fd < 0) {
		pthread_mutex_unlock(&g_lock);
		return ERR_INVALID_VALUE;
	}
	d.fd = g_alloc[i].fd;
	d.dev = g_alloc[i].dev;
	d.len = g_alloc[i].len;
	g_ipc_gets++;
	pthread_mutex_unlock(&g_lock);
	memset(h, 0, sizeof(*h));
	memcpy(h->bytes, &d, sizeof(d));
	return 0;
}

API cuda_err_t cudaIpcOpenMemHandle(void **p, struct cuda_ipc_handle h, unsigned flags)
{
	struct dbl_ipc d;
	char path[64];
	void *m;
	int fd, err = injected("cudaIpcOpenMemHandle");

	(void)flags;
	*p = NULL;
	if (err)
		return err;
	memcpy(&d, h.bytes, sizeof(d));
	if (d.magic != DBL_IPC_MAGIC || d.pid == (int32_t)getpid())
		return ERR_INVALID_HANDLE; /* CUDA too refuses a handle of the same process */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)d.pid, (int)d.fd);
	if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
		return ERR_INVALID_HANDLE;
	m = mmap(NULL, d.len ? d.len : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return ERR_INVALID_HANDLE;
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (!g_alloc[i].base) {
			g_alloc[i].base = m;
			g_alloc[i].len = d.len;
			g_alloc[i].dev = d.dev;
			g_alloc[i].fd = -1;
			g_ipc_opens++;
			*p = m;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	if (!*p) {
		munmap(m, d.len ? d.len : 1);
		return ERR_INVALID_VALUE;
	}
	return 0;
}

API cuda_err_t cudaIpcCloseMemHandle(void *p)
{
	int err = ERR_INVALID_VALUE;

	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < MAX_ALLOCS; i++) {
		if (g_alloc[i].base == p && g_alloc[i].fd < 0) {
			munmap(p, g_alloc[i].len ? g_alloc[i].len : 1);
			g_alloc[i].base = NULL;
			g_ipc_closes++;
			err = 0;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return err;
}

API void cudadouble_set_devices(int n)
{
	g_devices = n;
}

API void cudadouble_set_copy_delay_us(unsigned us)
{
	g_copy_delay_us = us;
}

/* The next count calls of fn (after skip that pass) return err. */
API void cudadouble_fail(const char *fn, int err, int skip, int count)
{
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < 8; i++) {
		if (!g_fail[i].count) {
			snprintf(g_fail[i].fn, sizeof(g_fail[i].fn), "%s", fn);
			g_fail[i].err = err;
			g_fail[i].skip = skip;
			g_fail[i].count = count;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
}

/*
 * The next copy to run, on any stream, fails on the "device" with err
 * (asynchronously: its stream's next event record carries err).
 */
API void cudadouble_fail_next_copy(cuda_stream_t st, int err)
{
	(void)st;
	pthread_mutex_lock(&g_lock);
	g_fail_next_copy = err;
	pthread_mutex_unlock(&g_lock);
}

/* The copy to run after skip more have run, on any stream, fails with err. */
API void cudadouble_fail_copy_after(int skip, int err)
{
	pthread_mutex_lock(&g_lock);
	g_fail_copy_skip = skip;
	g_fail_next_copy = err;
	pthread_mutex_unlock(&g_lock);
}

/* The gate: closed, a gate task holds its stream (a caller's long kernel) until opened. */
API void cudadouble_gate_close(void)
{
	pthread_mutex_lock(&g_lock);
	g_gate_closed = 1;
	pthread_mutex_unlock(&g_lock);
}

API void cudadouble_gate_open(void)
{
	pthread_mutex_lock(&g_lock);
	g_gate_closed = 0;
	pthread_cond_broadcast(&g_gate_cond);
	pthread_mutex_unlock(&g_lock);
}

API cuda_err_t cudadouble_gate(cuda_stream_t st)
{
	struct task t = { .kind = T_GATE };

	return enqueue(st, &t);
}

/*
 * A counter: copies, copy_bytes, max_piece, hostfns, waits, syncs, queries,
 * pinned, streams, ipc_gets, ipc_opens, ipc_closes.
 */
API uint64_t cudadouble_stat(const char *name)
{
	uint64_t v = UINT64_MAX;

	pthread_mutex_lock(&g_lock);
	if (!strcmp(name, "copies"))
		v = g_copies;
	else if (!strcmp(name, "copy_bytes"))
		v = g_copy_bytes;
	else if (!strcmp(name, "max_piece"))
		v = g_max_piece;
	else if (!strcmp(name, "hostfns"))
		v = g_hostfns;
	else if (!strcmp(name, "waits"))
		v = g_waits;
	else if (!strcmp(name, "syncs"))
		v = g_syncs;
	else if (!strcmp(name, "queries"))
		v = g_queries;
	else if (!strcmp(name, "pinned"))
		v = g_pinned;
	else if (!strcmp(name, "pinned_ranges")) {
		v = 0;
		for (int i = 0; i < MAX_PINS; i++)
			v += g_pins[i].base != NULL;
	}
	else if (!strcmp(name, "streams"))
		v = g_streams;
	else if (!strcmp(name, "dmabuf_exports"))
		v = g_dmabuf_exports;
	else if (!strcmp(name, "dmabuf_asked"))
		v = g_dmabuf_asked;
	else if (!strcmp(name, "ipc_gets"))
		v = g_ipc_gets;
	else if (!strcmp(name, "ipc_opens"))
		v = g_ipc_opens;
	else if (!strcmp(name, "ipc_closes"))
		v = g_ipc_closes;
	pthread_mutex_unlock(&g_lock);
	return v;
}

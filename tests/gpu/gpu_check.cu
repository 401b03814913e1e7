/*
 * tests/gpu/gpu_check.cu - the check of ferry's CUDA memory domain on a
 * real GPU (run by tests/gpu/run.sh, which builds it with nvcc against
 * libferry.so): two processes on one host over shm, checksums computed on
 * the device.
 *
 * Correctness: device -> device across the two processes for every size of
 * a list from 0 to 190 MiB; device -> host; host -> device; a PUT that
 * names the caller's stream, whose kernel (slow on purpose) writes the
 * tensor after the PUT was submitted. Benchmark: the 190 MiB KV handoff
 * device -> device against cudaMemcpy device to device of the same size;
 * the staged device -> host -> device path against pinned cudaMemcpy D2H
 * plus H2D; 64 B and 1 MiB device PUT -> GET latency (half a round trip).
 * Device PUTs to the child take CUDA IPC (a descriptor over shm, the child
 * copies device to device from the opened handle): the case "ipc_path_taken"
 * says from ferry's health that they did and that none was staged; the
 * staged path is measured too, from a second region registered with
 * FERRY_CUDA_IPC=0 (190 MiB device -> pool -> shm -> device).
 * Prints one line per case and "N passed, N failed"; writes JSON to argv[1].
 *
 * The child is forked before either process calls CUDA (a child of a process
 * that initialized CUDA cannot use it). The parent is engine "ga", the child
 * "gb"; they talk by keys: the parent
 * PUTs "d2d.<i>" etc., the child answers with "sum.<i>" (its device
 * checksum, 8 bytes of host memory).
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define MiB (1ull << 20)
#define MAXSZ (190ull * MiB)
#define POOL (1024ull * MiB)
#define SEC 1000000000ull
/* Every op's deadline: a broken path fails a case in seconds, not the lease. */
#define OP_TIMEOUT (15 * SEC)

static const uint64_t sizes[] = { 0, 1, 63, 4096, 65537, MiB + 3, 8 * MiB, 8 * MiB + 1,
				  33 * MiB, 100 * MiB + 7, MAXSZ };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static int passed, failed;
static char json[65536];
static size_t jlen;

#define CK(x)                                                                           \
	do {                                                                            \
		cudaError_t _e = (x);                                                   \
		if (_e != cudaSuccess) {                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,      \
				cudaGetErrorString(_e));                                \
			exit(3);                                                        \
		}                                                                       \
	} while (0)

static void result(const char *name, bool ok, const char *fmt, ...)
{
	char detail[256] = "";
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	ok ? passed++ : failed++;
	printf("%s %s %s\n", ok ? "PASS" : "FAIL", name, detail);
	fflush(stdout);
	jlen += snprintf(json + jlen, sizeof(json) - jlen, "%s{\"case\":\"%s\",\"ok\":%s,\"detail\":\"%s\"}",
			 passed + failed > 1 ? "," : "", name, ok ? "true" : "false", detail);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* ---- device kernels ------------------------------------------------- */

__global__ void k_fill(uint8_t *p, uint64_t n, uint32_t seed)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = (uint8_t)(seed * 131u + (uint32_t)i * 7u + (uint32_t)(i >> 16));
}

/* A slow producer: spins about `cycles` clocks, then fills. */
__global__ void k_slow_fill(uint8_t *p, uint64_t n, uint32_t seed, long long cycles)
{
	long long t0 = clock64();

	while (clock64() - t0 < cycles)
		;
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = (uint8_t)(seed * 131u + (uint32_t)i * 7u + (uint32_t)(i >> 16));
}

/* A position-weighted checksum (order matters), summed with atomics. */
__global__ void k_sum(const uint8_t *p, uint64_t n, unsigned long long *out)
{
	unsigned long long s = 0;

	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		s += (unsigned long long)p[i] * (i % 65521 + 1);
	atomicAdd(out, s);
}

static unsigned long long *d_sum;

static uint64_t dev_sum(const void *p, uint64_t n)
{
	unsigned long long h = 0;

	CK(cudaMemset(d_sum, 0, sizeof(*d_sum)));
	if (n)
		k_sum<<<512, 256>>>((const uint8_t *)p, n, d_sum);
	CK(cudaMemcpy(&h, d_sum, sizeof(h), cudaMemcpyDeviceToHost));
	return h;
}

static uint64_t host_sum(const uint8_t *p, uint64_t n)
{
	unsigned long long s = 0;

	for (uint64_t i = 0; i < n; i++)
		s += (unsigned long long)p[i] * (i % 65521 + 1);
	return s;
}

/* ---- ferry helpers ---------------------------------------------------- */

static struct ferry_engine *engine(const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.ns = "gpucheck";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = POOL;
	/* GPU_CHECK_SPIN_US: the reactors' spin before they sleep (ferry's default: 50 us). */
	if (getenv("GPU_CHECK_SPIN_US"))
		p.spin_ns = strtoull(getenv("GPU_CHECK_SPIN_US"), NULL, 10) * 1000;
	if ((rc = ferry_engine_create(&p, &e))) {
		fprintf(stderr, "ferry_engine_create %s: %s\n", name, ferry_strerror(rc));
		exit(3);
	}
	return e;
}

/* A number of the "cuda" part of e's health (-1 when it is not there). */
static long long health_num(struct ferry_engine *e, const char *name)
{
	static char h[65536];
	char want[64];
	const char *c, *v;

	if (ferry_engine_health(e, h, sizeof(h)) <= 0 || !(c = strstr(h, "\"cuda\":{")))
		return -1;
	snprintf(want, sizeof(want), "\"%s\":", name);
	if (!(v = strstr(c, want)))
		return -1;
	return atoll(v + strlen(want));
}

/* A number of the "shm" part of e's health (0 when it is not there). */
static long long shm_num(struct ferry_engine *e, const char *name)
{
	static char h[65536];
	char want[64];
	const char *c, *v;

	if (ferry_engine_health(e, h, sizeof(h)) <= 0 || !(c = strstr(h, "\"shm\":{")))
		return 0;
	snprintf(want, sizeof(want), "\"%s\":", name);
	return (v = strstr(c, want)) ? atoll(v + strlen(want)) : 0;
}

static struct ferry_region *dev_region(struct ferry_engine *e, void *p, size_t len)
{
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;
	int rc;

	rp.addr = p;
	rp.len = len;
	rp.mem = FERRY_MEM_CUDA;
	rp.device = 0;
	if ((rc = ferry_region_register(e, &rp, &r))) {
		fprintf(stderr, "ferry_region_register (device): %s\n", ferry_strerror(rc));
		exit(3);
	}
	return r;
}

static struct ferry_sqe *sqe_of(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *s;

	ferry_sq_get(e, &sq);
	while (!(s = ferry_sq_get_sqe(sq)))
		ferry_sq_submit(sq);
	return s;
}

static void submit(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;

	ferry_sq_get(e, &sq);
	ferry_sq_submit(sq);
}

/* The CQE of op ud (30 s at most); res returned, *len set. */
static int wait_op(struct ferry_engine *e, uint64_t ud, uint64_t *len)
{
	struct ferry_cqe c;
	uint64_t end = now_ns() + OP_TIMEOUT;

	while (now_ns() < end) {
		if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 100000000) == 1) {
			if (c.user_data != ud) {
				fprintf(stderr, "unexpected CQE %llu (res %d) waiting for %llu\n",
					(unsigned long long)c.user_data, c.res, (unsigned long long)ud);
				if (c.flags & FERRY_CQE_F_BUF)
					ferry_buf_release(c.buf);
				continue;
			}
			if (len)
				*len = c.len;
			if (c.flags & FERRY_CQE_F_BUF)
				ferry_buf_release(c.buf);
			return c.res;
		}
	}
	return -ETIMEDOUT;
}

static int put_segs(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		    struct ferry_region *r, uint64_t len, uint64_t ud, int wait_kind, void *wait)
{
	struct ferry_seg s = { r, 0, len };
	struct ferry_sqe *q = sqe_of(e);

	ferry_prep_put_segs(q, to, key, &s, 1, ud);
	ferry_sqe_set_flags(q, FERRY_SQE_WAIT_PEER | FERRY_SQE_REPLACE);
	ferry_sqe_set_timeout(q, OP_TIMEOUT);
	if (wait_kind)
		ferry_sqe_set_cuda_wait(q, wait_kind, wait);
	submit(e);
	return wait_op(e, ud, NULL);
}

static int get_segs(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		    struct ferry_region *r, uint64_t cap, uint64_t ud, uint64_t *len)
{
	struct ferry_seg s = { r, 0, cap };
	struct ferry_sqe *q = sqe_of(e);

	ferry_prep_get_segs(q, from, key, &s, 1, ud);
	ferry_sqe_set_timeout(q, OP_TIMEOUT);
	submit(e);
	return wait_op(e, ud, len);
}

static int put_host(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		    const void *p, uint64_t len, uint64_t ud)
{
	struct iovec iov = { (void *)p, len };
	struct ferry_sqe *q = sqe_of(e);

	ferry_prep_put(q, to, key, &iov, 1, ud);
	ferry_sqe_set_flags(q, FERRY_SQE_WAIT_PEER | FERRY_SQE_REPLACE);
	ferry_sqe_set_timeout(q, OP_TIMEOUT);
	submit(e);
	return wait_op(e, ud, NULL);
}

static int get_host(struct ferry_engine *e, struct ferry_peer *from, const char *key, void *p,
		    uint64_t cap, uint64_t ud, uint64_t *len)
{
	struct iovec iov = { p, cap };
	struct ferry_sqe *q = sqe_of(e);

	ferry_prep_get(q, from, key, &iov, 1, ud);
	ferry_sqe_set_timeout(q, OP_TIMEOUT);
	submit(e);
	return wait_op(e, ud, len);
}

/*
 * A GET for a buffer that takes the sender's device memory itself
 * (FERRY_SQE_DEVICE_BUF): the CQE's buffer, or NULL (*res says why).
 */
static struct ferry_buf *get_devbuf(struct ferry_engine *e, struct ferry_peer *from,
				    const char *key, uint64_t ud, int *res)
{
	struct ferry_sqe *q = sqe_of(e);
	struct ferry_cqe c;
	uint64_t end = now_ns() + OP_TIMEOUT;

	ferry_prep_get(q, from, key, NULL, 0, ud);
	ferry_sqe_set_flags(q, FERRY_SQE_DEVICE_BUF);
	ferry_sqe_set_timeout(q, OP_TIMEOUT);
	submit(e);
	*res = -ETIMEDOUT;
	while (now_ns() < end) {
		if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 100000000) != 1)
			continue;
		if (c.user_data != ud) {
			if (c.flags & FERRY_CQE_F_BUF)
				ferry_buf_release(c.buf);
			continue;
		}
		*res = c.res;
		return (c.flags & FERRY_CQE_F_BUF) ? c.buf : NULL;
	}
	return NULL;
}

static uint64_t ud_next = 1;

/* One 64 B copy on a stream of this process, seen done by spinning on its event. */
static void copy64_once(uint8_t *dst, const uint8_t *src)
{
	static cudaStream_t st;
	static cudaEvent_t ev;

	if (!st) {
		CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	}
	CK(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDefault, st));
	CK(cudaEventRecord(ev, st));
	while (cudaEventQuery(ev) == cudaErrorNotReady)
		;
}

/* Nanoseconds per 64 B copy src -> dst seen done by spinning on its event (no ferry). */
static uint64_t copy64_seen_ns(uint8_t *dst, const uint8_t *src)
{
	cudaStream_t st;
	cudaEvent_t ev;
	uint64_t t0, per;
	const int n = 300;

	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	t0 = now_ns();
	for (int i = 0; i < n; i++) {
		CK(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDefault, st));
		CK(cudaEventRecord(ev, st));
		while (cudaEventQuery(ev) == cudaErrorNotReady)
			;
	}
	per = (now_ns() - t0) / n;
	CK(cudaEventDestroy(ev));
	CK(cudaStreamDestroy(st));
	return per;
}

/* ---- the child: receives, checksums on the device, answers ------------ */

enum {
	CMD_D2D = 1, CMD_D2H, CMD_H2D, CMD_STREAM, CMD_PING64, CMD_PING1M, CMD_BIG, CMD_PINGH, CMD_IPCRAW,
	CMD_RAWPING, CMD_HANDOUT, CMD_END
};

struct cmd {
	uint32_t op;
	uint32_t iters;
	uint64_t len;
};

static int child(void)
{
	struct ferry_engine *e = engine("gb");
	struct ferry_peer *p = NULL;
	uint8_t *dst, *host;
	struct ferry_region *rd;

	ferry_peer_open(e, "ga", &p);
	CK(cudaMalloc(&dst, MAXSZ + 4096));
	CK(cudaMalloc(&d_sum, sizeof(*d_sum)));
	CK(cudaMallocHost(&host, MAXSZ + 4096));
	rd = dev_region(e, dst, MAXSZ + 4096);
	for (;;) {
		struct cmd c;
		uint64_t len = 0, sum = 0;
		int rc;

		if ((rc = get_host(e, p, "cmd", &c, sizeof(c), ud_next++, &len)) || len != sizeof(c)) {
			fprintf(stderr, "child: cmd: %s\n", ferry_strerror(rc));
			return 1;
		}
		if (c.op == CMD_END)
			break;
		if (c.op == CMD_IPCRAW) { /* no ferry: 64 B copies out of the parent's allocation */
			cudaIpcMemHandle_t h;
			uint64_t ans[3] = { 0, 0, 0 };
			void *peer = NULL;

			if (get_host(e, p, "handle", &h, sizeof(h), ud_next++, &len) == 0 &&
			    len == sizeof(h) &&
			    cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess) {
				ans[0] = copy64_seen_ns(dst, (const uint8_t *)peer);
				ans[1] = copy64_seen_ns(dst, dst + 4096);
				cudaIpcCloseMemHandle(peer);
			}
			/* What the staged GETs did with the parent's pool, mapped here. */
			ans[2] = (uint64_t)shm_num(e, "peer_pools_pinned") |
				 (uint64_t)shm_num(e, "peer_pools_refused") << 32;
			cudaGetLastError();
			if (put_host(e, p, "sum", ans, sizeof(ans), ud_next++))
				return 1;
			continue;
		}
		if (c.op == CMD_RAWPING) { /* no ferry's copies: each side's own 64 B copy, in turn */
			for (uint32_t i = 0; i < c.iters; i++) {
				if ((rc = get_host(e, p, "ping", host, 64, ud_next++, &len)))
					return 1;
				copy64_once(dst, dst + 4096);
				if ((rc = put_host(e, p, "pong", host, 64, ud_next++)))
					return 1;
			}
			continue;
		}
		if (c.op == CMD_PINGH) { /* the same loop in host memory: the baseline */
			for (uint32_t i = 0; i < c.iters; i++) {
				if ((rc = get_host(e, p, "ping", host, c.len, ud_next++, &len)) ||
				    (rc = put_host(e, p, "pong", host, c.len, ud_next++))) {
					fprintf(stderr, "child: host ping-pong %u: %s\n", i, ferry_strerror(rc));
					return 1;
				}
			}
			continue;
		}
		if (c.op == CMD_PING64 || c.op == CMD_PING1M) {
			for (uint32_t i = 0; i < c.iters; i++) {
				if ((rc = get_segs(e, p, "ping", rd, c.len, ud_next++, &len)) ||
				    (rc = put_segs(e, p, "pong", rd, c.len, ud_next++, 0, NULL))) {
					fprintf(stderr, "child: ping-pong %u of %llu bytes: %s\n", i,
						(unsigned long long)c.len, ferry_strerror(rc));
					return 1;
				}
			}
			continue;
		}
		if (c.op == CMD_HANDOUT) {
			/* The parent's device memory itself, opened here: summed in place. */
			struct ferry_buf *b = get_devbuf(e, p, "data", ud_next++, &rc);
			uint64_t done = now_ns();

			len = b ? ferry_buf_len(b) : 0;
			sum = !b || rc ? ~0ull
			      : ferry_buf_mem(b) != FERRY_MEM_CUDA ? ~1ull
			      : dev_sum(ferry_buf_data(b), len);
			if (b)
				ferry_buf_release(b); /* the parent's PUT ends now */
			uint64_t ans[3] = { sum, len, done };

			if (put_host(e, p, "sum", ans, sizeof(ans), ud_next++))
				return 1;
			continue;
		}
		if (c.op == CMD_D2H) {
			rc = get_host(e, p, "data", host, MAXSZ + 4096, ud_next++, &len);
			sum = rc ? ~0ull : host_sum(host, len);
		} else {
			rc = get_segs(e, p, "data", rd, MAXSZ + 4096, ud_next++, &len);
			sum = rc ? ~0ull : dev_sum(dst, len);
		}
		uint64_t done = now_ns(); /* CLOCK_MONOTONIC: one clock for the processes of a host */

		if (rc)
			fprintf(stderr, "child: GET data: %s\n", ferry_strerror(rc));
		uint64_t ans[3] = { sum, len, done };

		if (put_host(e, p, "sum", ans, sizeof(ans), ud_next++))
			return 1;
	}
	ferry_engine_destroy(e);
	return 0;
}

/* ---- the report --------------------------------------------------------- */

static const char *json_out = "gpu_check.json";
static double t_ferry_d2d = -1, t_memcpy_d2d = -1, t_staged_ref = -1, lat64 = -1, lat1m = -1;
static double t_ferry_staged = -1, t_ferry_d2d_put = -1, lat_host64 = -1, t_pageable_h2d = -1;
static double t_ferry_handout = -1;
static double done_spin_us = -1, done_hostfn_us = -1, job_us = -1, ipc_copy_us = -1, local_copy_us = -1,
	      alt_copy_us = -1;
static long long ipc_puts = -1, staged_puts = -1;
/*
 * GPUDirect RDMA's GPU half on this machine (no RDMA NIC here: the rest
 * cannot run): whether the driver exports a dma-buf of device memory, as
 * ferry asks it to (cuMemGetHandleForAddressRange). A figure, not a case.
 */
static char dmabuf_export[96] = "not asked";

static void probe_dmabuf(void *dptr, size_t n)
{
	typedef int (*get_handle_fn)(void *, unsigned long long, size_t, int, unsigned long long);
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	get_handle_fn f = drv ? (get_handle_fn)dlsym(drv, "cuMemGetHandleForAddressRange") : NULL;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int fd = -1, rc;

	if (!f) {
		snprintf(dmabuf_export, sizeof(dmabuf_export), "the driver has no "
			 "cuMemGetHandleForAddressRange");
	} else if ((rc = f(&fd, (unsigned long long)(uintptr_t)dptr, n & ~(page - 1), 1, 0)) ||
		   fd < 0) {
		snprintf(dmabuf_export, sizeof(dmabuf_export), "CUresult %d%s", rc,
			 rc == 801 ? " (not supported)" : "");
	} else {
		snprintf(dmabuf_export, sizeof(dmabuf_export), "ok");
		close(fd);
	}
	if (drv)
		dlclose(drv);
}

/* The JSON report; error: why the run stopped early (NULL: it ran to the end). */
static void write_json(const char *error)
{
	FILE *f = fopen(json_out, "w");

	if (!f)
		return;
	fprintf(f, "{\"passed\":%d,\"failed\":%d,\"error\":%s%s%s,\"cases\":[%s],\"bench\":{", passed,
		failed, error ? "\"" : "", error ? error : "null", error ? "\"" : "", json);
	fprintf(f, "\"d2d_190MiB_ferry_ms\":%.3f,", t_ferry_d2d);
	fprintf(f, "\"d2d_190MiB_cudaMemcpy_ms\":%.3f,", t_memcpy_d2d);
	fprintf(f, "\"d2d_190MiB_ratio\":%.3f,", t_memcpy_d2d > 0 ? t_ferry_d2d / t_memcpy_d2d : -1);
	fprintf(f, "\"d2d_190MiB_put_cqe_ms\":%.3f,", t_ferry_d2d_put);
	fprintf(f, "\"handout_190MiB_ferry_ms\":%.3f,", t_ferry_handout);
	fprintf(f, "\"handout_190MiB_vs_cudaMemcpy_d2d\":%.3f,",
		t_memcpy_d2d > 0 && t_ferry_handout >= 0 ? t_ferry_handout / t_memcpy_d2d : -1);
	fprintf(f, "\"staged_190MiB_ferry_ms\":%.3f,", t_ferry_staged);
	fprintf(f, "\"staged_ref_d2h_h2d_ms\":%.3f,", t_staged_ref);
	fprintf(f, "\"staged_ferry_vs_ref_bw\":%.3f,", t_ferry_staged > 0 ? t_staged_ref / t_ferry_staged : -1);
	fprintf(f, "\"pageable_h2d_190MiB_ms\":%.3f,", t_pageable_h2d);
	fprintf(f, "\"latency_64B_us\":%.2f,", lat64);
	fprintf(f, "\"latency_1MiB_us\":%.2f,", lat1m);
	fprintf(f, "\"latency_host_64B_us\":%.2f,", lat_host64);
	fprintf(f, "\"pingpong_job_us\":%.2f,", job_us);
	fprintf(f, "\"copy64_seen_by_event_spin_us\":%.2f,", done_spin_us);
	fprintf(f, "\"copy64_seen_by_host_fn_us\":%.2f,", done_hostfn_us);
	fprintf(f, "\"child_copy64_from_ipc_us\":%.2f,", ipc_copy_us);
	fprintf(f, "\"child_copy64_local_us\":%.2f,", local_copy_us);
	fprintf(f, "\"alternating_copy64_half_rt_us\":%.2f,", alt_copy_us);
	fprintf(f, "\"ipc_puts\":%lld,", ipc_puts);
	fprintf(f, "\"staged_puts_before_staged_bench\":%lld,", staged_puts);
	fprintf(f, "\"dmabuf_export\":\"%s\",", dmabuf_export);
	fprintf(f, "\"note\":\"times are the best of the reps, PUT submit to the receiver's GET done; "
		   "d2d_190MiB_ferry_ms is the CUDA IPC path (descriptor over shm, the child's D2D copy "
		   "from the opened handle) when ipc_path_taken passed; staged_190MiB_ferry_ms is D2H, "
		   "shm, H2D (a region with FERRY_CUDA_IPC=0); handout_190MiB_ferry_ms: a GET with "
		   "FERRY_SQE_DEVICE_BUF, PUT submit to the child holding the parent's memory itself "
		   "(no copy: its ratio to cudaMemcpy D2D compares a handover with a copy); "
		   "pingpong_job_us: the parent's device jobs of the ping-pongs, queued to seen done\"}}\n");
	fclose(f);
}

/* The run cannot go on: one failure more, the report of what it saw, the counts. */
static void stop(const char *why)
{
	failed++;
	printf("FAIL stopped %s\n", why);
	write_json(why);
	printf("%d passed, %d failed\n", passed, failed);
	fflush(stdout);
	_exit(1);
}

/* A run stuck past its time still reports what it saw (a test program: stdio here is fine). */
static void on_alarm(int sig)
{
	(void)sig;
	stop("the parent ran past its alarm");
}

/* ---- the anatomy of a device completion, without ferry ------------------ */

static void hostfn_ring(void *arg)
{
	uint64_t one = 1;

	if (write(*(int *)arg, &one, sizeof(one)) < 0)
		perror("eventfd write");
}

/*
 * How long a 64 B device-to-device copy takes to be seen done on this
 * machine, the two ways ferry's reactor sees it: spinning on
 * cudaEventQuery, and sleeping until a host function (cudaLaunchHostFunc)
 * writes an eventfd. Microseconds per copy, in *spin_us and *hostfn_us.
 */
static void completion_anatomy(uint8_t *dst, const uint8_t *src, double *spin_us, double *hostfn_us)
{
	cudaStream_t st;
	cudaEvent_t ev;
	int efd = eventfd(0, EFD_CLOEXEC);
	uint64_t t0, v;
	const int n = 300;

	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	t0 = now_ns();
	for (int i = 0; i < n; i++) {
		CK(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDeviceToDevice, st));
		CK(cudaEventRecord(ev, st));
		while (cudaEventQuery(ev) == cudaErrorNotReady)
			;
	}
	*spin_us = (now_ns() - t0) / 1e3 / n;
	t0 = now_ns();
	for (int i = 0; i < n && efd >= 0; i++) {
		CK(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDeviceToDevice, st));
		CK(cudaLaunchHostFunc(st, hostfn_ring, &efd));
		if (read(efd, &v, sizeof(v)) != sizeof(v))
			break;
	}
	*hostfn_us = efd >= 0 ? (now_ns() - t0) / 1e3 / n : -1;
	if (efd >= 0)
		close(efd);
	CK(cudaEventDestroy(ev));
	CK(cudaStreamDestroy(st));
}

/* ---- the parent: sends, compares, times ------------------------------- */

static struct ferry_engine *pe;
static struct ferry_peer *pp;

static void send_cmd(uint32_t op, uint64_t len, uint32_t iters)
{
	struct cmd c = { op, iters, len };

	if (put_host(pe, pp, "cmd", &c, sizeof(c), ud_next++))
		stop("a command to the child was not delivered (the child is gone?)");
}

static uint64_t child_done; /* when the child's last GET of "data" completed (its CQE reaped) */

static bool answer(uint64_t *sum, uint64_t *len)
{
	uint64_t ans[3], l = 0;

	if (get_host(pe, pp, "sum", ans, sizeof(ans), ud_next++, &l) || l != sizeof(ans))
		return false;
	*sum = ans[0];
	*len = ans[1];
	child_done = ans[2];
	return true;
}

int main(int argc, char **argv)
{
	uint8_t *src, *src2, *host;
	struct ferry_region *rs;
	int devices = 0, st;
	pid_t pid;
	char name[64];

	signal(SIGPIPE, SIG_IGN);
	if (argc > 1)
		json_out = argv[1];
	if (argc > 1 && !strcmp(argv[1], "--probe")) { /* run.sh: the program and its libraries load */
		printf("gpu_check: ferry %d\n", ferry_version());
		return 0;
	}
	/* Fork before any CUDA call: a child of a process that initialized CUDA cannot use it. */
	pid = fork();
	if (pid == 0) {
		alarm(230);
		if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1)
			_exit(2);
		_exit(child());
	}
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
		FILE *f = fopen(json_out, "w");

		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);

		if (f) {
			fprintf(f, "{\"passed\":0,\"failed\":1,\"error\":\"no CUDA device\"}\n");
			fclose(f);
		}
		printf("no CUDA device: nothing checked\n0 passed, 1 failed\n");
		return 1;
	}
	signal(SIGALRM, on_alarm);
	alarm(200);
	pe = engine("ga");
	ferry_peer_open(pe, "gb", &pp);
	result("feature_cuda", (ferry_features() & FERRY_FEATURE_CUDA) != 0, "ferry_features()");
	CK(cudaMalloc(&src, MAXSZ));
	CK(cudaMalloc(&src2, MAXSZ));
	CK(cudaMalloc(&d_sum, sizeof(*d_sum)));
	CK(cudaMallocHost(&host, MAXSZ));
	probe_dmabuf(src, MAXSZ);
	rs = dev_region(pe, src, MAXSZ);

	/* Device -> device across the processes, every size. */
	for (unsigned i = 0; i < NSIZES; i++) {
		uint64_t n = sizes[i], sum = 0, len = 0, want;
		int rc;
		bool ok;

		if (n)
			k_fill<<<1024, 256>>>(src, n, i + 1);
		CK(cudaDeviceSynchronize());
		want = dev_sum(src, n);
		send_cmd(CMD_D2D, n, 0);
		rc = put_segs(pe, pp, "data", rs, n, ud_next++, 0, NULL);
		snprintf(name, sizeof(name), "d2d_%llu", (unsigned long long)n);
		ok = rc == 0 && answer(&sum, &len);
		result(name, ok && len == n && sum == want,
		       "put %s, checksum %llx want %llx", ferry_strerror(rc), (unsigned long long)sum,
		       (unsigned long long)want);
	}
	/*
	 * The PUTs above went by CUDA IPC (ferry's health says which path); the
	 * first may have been staged: a PUT to a peer not reached yet
	 * (FERRY_SQE_WAIT_PEER) is, its transport not being known.
	 */
	ipc_puts = health_num(pe, "ipc_puts");
	staged_puts = health_num(pe, "staged_puts");
	result("ipc_path_taken", ipc_puts >= (long long)NSIZES - 1 && staged_puts <= 1,
	       "ipc_puts %lld staged_puts %lld", ipc_puts, staged_puts);
	/* Device -> host; host -> device. */
	{
		uint64_t n = 50 * MiB + 11, sum = 0, len = 0, want;
		int rc;
		bool ok;

		k_fill<<<1024, 256>>>(src, n, 77);
		CK(cudaDeviceSynchronize());
		want = dev_sum(src, n);
		send_cmd(CMD_D2H, n, 0);
		rc = put_segs(pe, pp, "data", rs, n, ud_next++, 0, NULL);
		ok = rc == 0 && answer(&sum, &len);
		result("d2h_50MiB", ok && len == n && sum == want,
		       "checksum %llx want %llx", (unsigned long long)sum, (unsigned long long)want);
		CK(cudaMemcpy(host, src, n, cudaMemcpyDeviceToHost));
		send_cmd(CMD_H2D, n, 0);
		rc = put_host(pe, pp, "data", host, n, ud_next++);
		ok = rc == 0 && answer(&sum, &len);
		result("h2d_50MiB", ok && len == n && sum == want,
		       "checksum %llx want %llx", (unsigned long long)sum, (unsigned long long)want);
	}
	/* The caller's stream must finish first: its slow kernel writes the tensor. */
	for (int kind = FERRY_CUDA_WAIT_EVENT; kind <= FERRY_CUDA_WAIT_STREAM; kind++) {
		uint64_t n = 16 * MiB, sum = 0, len = 0, want;
		cudaStream_t s;
		cudaEvent_t ev;
		int rc;
		bool ok;

		CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
		k_fill<<<1024, 256>>>(src2, n, 99); /* what the slow kernel will write */
		CK(cudaDeviceSynchronize());
		want = dev_sum(src2, n);
		CK(cudaMemset(src, 0, n));
		CK(cudaDeviceSynchronize());
		k_slow_fill<<<1024, 256, 0, s>>>(src, n, 99, 200000000ll); /* ~0.1 s of spinning */
		CK(cudaEventRecord(ev, s));
		send_cmd(CMD_STREAM, n, 0);
		rc = put_segs(pe, pp, "data", rs, n, ud_next++, kind,
			      kind == FERRY_CUDA_WAIT_EVENT ? (void *)ev : (void *)s);
		ok = rc == 0 && answer(&sum, &len);
		result(kind == FERRY_CUDA_WAIT_EVENT ? "caller_event_first" : "caller_stream_first",
		       ok && sum == want, "checksum %llx want %llx",
		       (unsigned long long)sum, (unsigned long long)want);
		CK(cudaStreamSynchronize(s));
		CK(cudaEventDestroy(ev));
		CK(cudaStreamDestroy(s));
	}

	/*
	 * Benchmark: 190 MiB device -> device between the processes. Timed from
	 * the PUT's submit to the child's GET completion (the child reads
	 * CLOCK_MONOTONIC when it reaps that CQE: one clock for both processes),
	 * the child's GET parked before the clock starts; the PUT's own CQE
	 * (the sender's block given back) comes after and is timed too.
	 */
	{
		uint64_t sum, len, t0, t_put, best = UINT64_MAX, best_put = UINT64_MAX;

		k_fill<<<1024, 256>>>(src, MAXSZ, 5);
		CK(cudaDeviceSynchronize());
		for (int r = 0; r < 7; r++) {
			send_cmd(CMD_BIG, MAXSZ, 0);
			usleep(20000); /* the child's GET waits before the clock starts */
			t0 = now_ns();
			if (put_segs(pe, pp, "data", rs, MAXSZ, ud_next++, 0, NULL))
				break;
			t_put = now_ns() - t0;
			if (!answer(&sum, &len) || len != MAXSZ || child_done < t0)
				break;
			if (child_done - t0 < best)
				best = child_done - t0;
			if (t_put < best_put)
				best_put = t_put;
		}
		t_ferry_d2d = best == UINT64_MAX ? -1 : best / 1e6;
		t_ferry_d2d_put = best_put == UINT64_MAX ? -1 : best_put / 1e6;
		/*
		 * The same 190 MiB handed out (FERRY_SQE_DEVICE_BUF): the child's GET
		 * completes with the parent's memory itself, no copy; timed from the
		 * PUT's submit to that GET's completion; the child then sums it in
		 * place on the device and releases it (the PUT ends then).
		 */
		{
			uint64_t want = dev_sum(src, MAXSZ), hbest = UINT64_MAX;
			bool hok = true;

			for (int r = 0; r < 7 && hok; r++) {
				send_cmd(CMD_HANDOUT, MAXSZ, 0);
				usleep(20000); /* the child's GET waits before the clock starts */
				t0 = now_ns();
				hok = put_segs(pe, pp, "data", rs, MAXSZ, ud_next++, 0, NULL) == 0 &&
				      answer(&sum, &len) && len == MAXSZ && sum == want &&
				      child_done >= t0;
				if (hok && child_done - t0 < hbest)
					hbest = child_done - t0;
			}
			result("handout_190MiB", hok, "device buffer: checksum %llx want %llx, len %llu",
			       (unsigned long long)sum, (unsigned long long)want,
			       (unsigned long long)len);
			t_ferry_handout = hbest == UINT64_MAX ? -1 : hbest / 1e6;
		}
		cudaEvent_t a, b;
		float ms = 0, bestms = 1e9f;

		CK(cudaEventCreate(&a));
		CK(cudaEventCreate(&b));
		for (int r = 0; r < 5; r++) {
			CK(cudaEventRecord(a));
			CK(cudaMemcpy(src2, src, MAXSZ, cudaMemcpyDeviceToDevice));
			CK(cudaEventRecord(b));
			CK(cudaEventSynchronize(b));
			CK(cudaEventElapsedTime(&ms, a, b));
			bestms = ms < bestms ? ms : bestms;
		}
		t_memcpy_d2d = bestms;
		bestms = 1e9f;
		for (int r = 0; r < 5; r++) {
			CK(cudaEventRecord(a));
			CK(cudaMemcpy(host, src, MAXSZ, cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(src2, host, MAXSZ, cudaMemcpyHostToDevice));
			CK(cudaEventRecord(b));
			CK(cudaEventSynchronize(b));
			CK(cudaEventElapsedTime(&ms, a, b));
			bestms = ms < bestms ? ms : bestms;
		}
		t_staged_ref = bestms;
		/* H2D from pageable memory: what a copy from a mapping not pinned here costs. */
		{
			uint8_t *pg = (uint8_t *)malloc(MAXSZ);

			if (pg) {
				memset(pg, 1, MAXSZ);
				bestms = 1e9f;
				for (int r = 0; r < 3; r++) {
					CK(cudaEventRecord(a));
					CK(cudaMemcpy(src2, pg, MAXSZ, cudaMemcpyHostToDevice));
					CK(cudaEventRecord(b));
					CK(cudaEventSynchronize(b));
					CK(cudaEventElapsedTime(&ms, a, b));
					bestms = ms < bestms ? ms : bestms;
				}
				t_pageable_h2d = bestms;
				free(pg);
			}
		}
		/* ferry's staged path: a region registered with IPC off. */
		struct ferry_region *rs2;
		long long staged0 = health_num(pe, "staged_puts");

		setenv("FERRY_CUDA_IPC", "0", 1);
		rs2 = dev_region(pe, src2, MAXSZ);
		unsetenv("FERRY_CUDA_IPC");
		best = UINT64_MAX;
		for (int r = 0; r < 5 && rs2; r++) {
			send_cmd(CMD_BIG, MAXSZ, 0);
			usleep(20000);
			t0 = now_ns();
			if (put_segs(pe, pp, "data", rs2, MAXSZ, ud_next++, 0, NULL) || !answer(&sum, &len) ||
			    len != MAXSZ || child_done < t0)
				break;
			if (child_done - t0 < best)
				best = child_done - t0;
		}
		t_ferry_staged = best == UINT64_MAX ? -1 : best / 1e6;
		result("staged_path_taken", health_num(pe, "staged_puts") > staged0, "staged_puts %lld",
		       health_num(pe, "staged_puts"));
		printf("bench staged_190MiB: ferry %.3f ms (device -> pool -> shm -> device, PUT submit "
		       "-> GET done), pinned cudaMemcpy D2H+H2D %.3f ms, pageable H2D alone %.3f ms\n",
		       t_ferry_staged, t_staged_ref, t_pageable_h2d);
		printf("bench d2d_190MiB: ferry %.3f ms (PUT submit -> the child's GET done; the PUT's "
		       "own CQE at %.3f ms), cudaMemcpy D2D %.3f ms\n", t_ferry_d2d, t_ferry_d2d_put,
		       t_memcpy_d2d);
	}
	/*
	 * Latency: device PUT -> GET ping-pong, half a round trip; and the same
	 * loop in host memory (k == 2), the baseline of this machine's wake-ups.
	 */
	long long cb0 = health_num(pe, "callbacks"), jobs0 = health_num(pe, "jobs_ended"),
		  jns0 = health_num(pe, "job_ns"), opens0 = health_num(pe, "ipc_opens");

	for (int k = 0; k < 3; k++) {
		uint64_t n = k == 1 ? MiB : 64, t0, len;
		uint32_t iters = k == 1 ? 100 : 500;
		bool ok = true;

		send_cmd(k == 2 ? CMD_PINGH : k ? CMD_PING1M : CMD_PING64, n, iters);
		t0 = now_ns();
		for (uint32_t i = 0; i < iters && ok; i++) {
			int rp = k == 2 ? put_host(pe, pp, "ping", host, n, ud_next++)
					: put_segs(pe, pp, "ping", rs, n, ud_next++, 0, NULL);
			int rg = rp ? 0
				    : k == 2 ? get_host(pe, pp, "pong", host, n, ud_next++, &len)
					     : get_segs(pe, pp, "pong", rs, n, ud_next++, &len);

			ok = rp == 0 && rg == 0 && len == n;
			if (!ok)
				fprintf(stderr, "parent: ping-pong %u of %llu bytes: PUT %s, GET %s (%llu)\n", i,
					(unsigned long long)n, ferry_strerror(rp), ferry_strerror(rg),
					(unsigned long long)len);
		}
		double us = ok ? (now_ns() - t0) / 1e3 / iters / 2 : -1;

		*(k == 2 ? &lat_host64 : k ? &lat1m : &lat64) = us;
		printf("bench latency_%s: %.2f us (%s PUT -> GET, half a round trip)\n",
		       k == 2 ? "host_64B" : k ? "1MiB" : "64B", us, k == 2 ? "host" : "device");
		result(k == 2 ? "pingpong_host_64B" : k ? "pingpong_1MiB" : "pingpong_64B", ok, "%.2f us", us);
		if (k == 1) {
			long long jobs = health_num(pe, "jobs_ended") - jobs0;

			job_us = jobs > 0 ? (health_num(pe, "job_ns") - jns0) / 1e3 / jobs : -1;
			printf("bench latency: in the parent, for %u device ping-pongs: %lld host "
			       "functions ran, %lld device jobs took %.2f us each from queued to seen "
			       "done, %lld IPC handles opened\n", 500u + 100u,
			       health_num(pe, "callbacks") - cb0, jobs, job_us,
			       health_num(pe, "ipc_opens") - opens0);
		}
	}
	completion_anatomy(src2, src, &done_spin_us, &done_hostfn_us);
	/* The child copies 64 B out of our allocation (its IPC handle opened there) and out of its own. */
	{
		cudaIpcMemHandle_t h;
		uint64_t ans[3], l = 0;

		CK(cudaIpcGetMemHandle(&h, src));
		send_cmd(CMD_IPCRAW, 0, 0);
		if (put_host(pe, pp, "handle", &h, sizeof(h), ud_next++) == 0 &&
		    get_host(pe, pp, "sum", ans, sizeof(ans), ud_next++, &l) == 0 && l == sizeof(ans) &&
		    ans[0]) {
			ipc_copy_us = ans[0] / 1e3;
			local_copy_us = ans[1] / 1e3;
		}
		printf("bench completion: in the child, a 64 B copy seen done (spinning) in %.2f us out "
		       "of our allocation by its IPC handle, %.2f us out of its own (no ferry)\n",
		       ipc_copy_us, local_copy_us);
		/*
		 * The two processes' own 64 B copies in turn (host messages between
		 * them, no ferry copy): what alternating the GPU between two
		 * processes costs here.
		 */
		{
			uint64_t t0, l2 = 0;
			const uint32_t iters = 300;
			bool ok = true;

			send_cmd(CMD_RAWPING, 64, iters);
			t0 = now_ns();
			for (uint32_t i = 0; i < iters && ok; i++) {
				copy64_once(src2, src2 + 4096);
				ok = put_host(pe, pp, "ping", host, 64, ud_next++) == 0 &&
				     get_host(pe, pp, "pong", host, 64, ud_next++, &l2) == 0;
			}
			alt_copy_us = ok ? (now_ns() - t0) / 1e3 / iters / 2 : -1;
			printf("bench completion: each process's own 64 B copy in turn, a host message "
			       "between: %.2f us per half round trip (no ferry copy)\n", alt_copy_us);
		}
		/* The staged GETs copied out of our pool, mapped in the child: pinned there, once. */
		result("peer_pool_pinned", l == sizeof(ans) && (ans[2] & 0xffffffffu) == 1 && !(ans[2] >> 32),
		       "the child's health: peer_pools_pinned %llu, peer_pools_refused %llu",
		       (unsigned long long)(l == sizeof(ans) ? ans[2] & 0xffffffffu : 0),
		       (unsigned long long)(l == sizeof(ans) ? ans[2] >> 32 : 0));
	}
	printf("bench completion: a 64 B D2D copy seen done in %.2f us spinning on cudaEventQuery, "
	       "%.2f us by a host function writing an eventfd (no ferry)\n", done_spin_us,
	       done_hostfn_us);
	send_cmd(CMD_END, 0, 0);
	waitpid(pid, &st, 0);
	result("child_exit", WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
	ferry_engine_destroy(pe);

	write_json(NULL);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

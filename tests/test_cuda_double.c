/*
 * tests/test_cuda_double.c - ferry's CUDA memory domain (backends/cuda)
 * driven through a TEST DOUBLE of the CUDA runtime
 * (tests/cuda_double/cudart_double.c: host memory behind "device"
 * pointers, every stream a thread of its own, completions delivered
 * asynchronously, errors injected). These cases test ferry's logic:
 * staging device segments into the pool and out of it, pieces, the
 * events the reactor polls, the host function that wakes a sleeping
 * reactor, the caller's stream or event that must finish first, every
 * error path, teardown with copies in flight. NONE OF THIS IS A GPU
 * RESULT: tests/gpu/run.sh is the check on a GPU.
 */
#include <dlfcn.h>
#include <pthread.h>

#include "helpers.h"

#ifndef FERRY_CUDA_DOUBLE
#error "the build names the double's library (FERRY_CUDA_DOUBLE)"
#endif

static void *dbl;
static void *(*d_malloc)(int dev, size_t n);
static void (*d_free)(void *p);
static void (*d_fail)(const char *fn, int err, int skip, int count);
static void (*d_fail_next_copy)(void *st, int err);
static void (*d_delay)(unsigned us);
static void (*d_gate_close)(void);
static void (*d_gate_open)(void);
static int (*d_gate)(void *st);
static uint64_t (*d_stat)(const char *name);
static void (*d_set_ipc)(int on);
static int (*d_stream_create)(void **st, unsigned flags);
static int (*d_stream_destroy)(void *st);
static int (*d_event_create)(void **ev, unsigned flags);
static int (*d_event_destroy)(void *ev);
static int (*d_event_record)(void *ev, void *st);
static int (*d_memcpy_async)(void *dst, const void *src, size_t n, int kind, void *st);
static void (*d_fail_copy_after)(int skip, int err);

#define SYM(v, name) assert_non_null((*(void **)&(v) = dlsym(dbl, name)))

/* Each case runs in a process of its own: the double is loaded here, as ferry loads it. */
static int setup(void **state)
{
	(void)state;
	setenv("FERRY_CUDA_RUNTIME", FERRY_CUDA_DOUBLE, 1);
	dbl = dlopen(FERRY_CUDA_DOUBLE, RTLD_NOW | RTLD_LOCAL);
	assert_non_null(dbl);
	SYM(d_malloc, "cudadouble_malloc");
	SYM(d_free, "cudadouble_free");
	SYM(d_fail, "cudadouble_fail");
	SYM(d_fail_next_copy, "cudadouble_fail_next_copy");
	SYM(d_delay, "cudadouble_set_copy_delay_us");
	SYM(d_gate_close, "cudadouble_gate_close");
	SYM(d_gate_open, "cudadouble_gate_open");
	SYM(d_gate, "cudadouble_gate");
	SYM(d_stat, "cudadouble_stat");
	SYM(d_set_ipc, "cudadouble_set_ipc");
	SYM(d_stream_create, "cudaStreamCreateWithFlags");
	SYM(d_stream_destroy, "cudaStreamDestroy");
	SYM(d_event_create, "cudaEventCreateWithFlags");
	SYM(d_event_destroy, "cudaEventDestroy");
	SYM(d_event_record, "cudaEventRecord");
	SYM(d_memcpy_async, "cudaMemcpyAsync");
	SYM(d_fail_copy_after, "cudadouble_fail_copy_after");
	return 0;
}

static struct ferry_region *dev_reg(struct ferry_engine *e, void *p, size_t len, int dev)
{
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;

	rp.addr = p;
	rp.len = len;
	rp.mem = FERRY_MEM_CUDA;
	rp.device = dev;
	assert_int_equal(ferry_region_register(e, &rp, &r), 0);
	return r;
}

/*
 * Two engines of this process, a and b, each with a device allocation of
 * device 0 registered (d: src_len bytes at a; dst: dst_len at b), and
 * their peers of each other (to: a's of b; from: b's of a).
 */
struct duo {
	struct ferry_engine *a, *b;
	struct ferry_peer *to, *from;
	uint8_t *d, *dst;
	struct ferry_region *r, *rd;
};

static void duo_open(struct duo *p, const char *na, const char *nb, enum ferry_progress_mode mode,
		     size_t pool, size_t src_len, size_t dst_len)
{
	p->a = t_engine(na, mode, pool);
	p->b = t_engine(nb, mode, pool);
	p->to = t_peer(p->a, nb);
	p->from = t_peer(p->b, na);
	p->d = d_malloc(0, src_len);
	p->dst = d_malloc(0, dst_len);
	p->r = dev_reg(p->a, p->d, src_len, 0);
	p->rd = dev_reg(p->b, p->dst, dst_len, 0);
}

static void duo_close(struct duo *p)
{
	ferry_engine_destroy(p->a);
	ferry_engine_destroy(p->b);
	d_free(p->d);
	d_free(p->dst);
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 29 + i * 13 + (i >> 12));
}

/* An SQE, waiting (bounded) while the ring is full: the reactor drains it. */
static struct ferry_sqe *sqe_wait(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;
	int64_t end = t_now() + 5 * SEC;

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	while (!(sqe = ferry_sq_get_sqe(sq)) && t_now() < end)
		usleep(1000);
	assert_non_null(sqe);
	return sqe;
}

/* Wait (5 s at most: a loaded machine) until the cuda part of e's health says name = want. */
static void cuda_health_is(struct ferry_engine *e, const char *name, long long want)
{
	int64_t end = t_now() + 5 * SEC;
	long long v;

	while ((v = t_health_num(e, "\"cuda\":{", name)) != want && t_now() < end)
		usleep(2000);
	if (v != want)
		fail_msg("health cuda.%s is %lld, want %lld", name, v, want);
}

static void put_segs(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		     const struct ferry_seg *s, unsigned n, uint64_t ud, int wait_kind, void *wait)
{
	struct ferry_sqe *sqe = sqe_wait(e);

	ferry_prep_put_segs(sqe, to, key, s, n, ud);
	if (wait_kind)
		ferry_sqe_set_cuda_wait(sqe, wait_kind, wait);
	t_submit(e);
}

/* How much slower the timings of a case are made (valgrind, FERRY_TEST_SLOW): 5, else 1. */
static int slow(void)
{
	return t_under_valgrind() ? 5 : 1;
}

/*
 * The connection to a peer of another process made before a case's
 * deadlines run: a small host PUT (its key stays there, unread).
 */
static void warm(struct ferry_engine *e, struct ferry_peer *to, uint64_t ud)
{
	t_put(e, to, "warm", "w", 1, ud, FERRY_SQE_WAIT_PEER);
	t_expect(e, NULL, ud, 0, NULL);
}

/* A PUT of one segment (it must outlive the op) with a deadline. */
static void put_seg_timeout(struct ferry_engine *e, struct ferry_peer *to, const char *key,
			    const struct ferry_seg *s, uint64_t ud, uint64_t timeout_ns)
{
	struct ferry_sqe *sqe = sqe_wait(e);

	ferry_prep_put_segs(sqe, to, key, s, 1, ud);
	ferry_sqe_set_timeout(sqe, timeout_ns);
	t_submit(e);
}

static void get_segs(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		     const struct ferry_seg *s, unsigned n, uint64_t ud)
{
	struct ferry_sqe *sqe = sqe_wait(e);

	ferry_prep_get_segs(sqe, from, key, s, n, ud);
	t_submit(e);
}

/* Device (two devices) and host segments put, got into device segments: pieces, pinning, health. */
static void test_double_device_to_device(void **state)
{
	struct ferry_engine *a = t_engine("da", FERRY_PROGRESS_THREAD, 64u << 20);
	struct ferry_engine *b = t_engine("db", FERRY_PROGRESS_THREAD, 64u << 20);
	struct ferry_peer *to = t_peer(a, "db"), *from = t_peer(b, "da");
	const size_t big = 20u << 20, small = 12345;
	uint8_t *d0 = d_malloc(0, big), *d1 = d_malloc(1, small), *dst = d_malloc(1, big + small + 2000);
	static uint8_t host[777];
	struct ferry_region_params hp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r0, *r1, *rh = NULL, *rd;
	struct ferry_cqe c;

	(void)state;
	pattern(d0, big, 1);
	pattern(d1, small, 2);
	pattern(host, sizeof(host), 3);
	r0 = dev_reg(a, d0, big, 0);
	r1 = dev_reg(a, d1, small, 1);
	hp.addr = host;
	hp.len = sizeof(host);
	assert_int_equal(ferry_region_register(a, &hp, &rh), 0);
	rd = dev_reg(b, dst, big + small + 2000, 1);
	/* The pool was pinned when the first device region came. */
	assert_true(d_stat("pinned") >= (64u << 20));
	assert_int_equal(t_health_num(a, "\"cuda\":{", "regions"), 2);

	struct ferry_seg src[3] = { { r0, 0, big }, { rh, 0, sizeof(host) }, { r1, 0, small } };
	struct ferry_seg out[2] = { { rd, 0, 1000 }, { rd, 1064, big + small + sizeof(host) - 1000 } };
	uint64_t total = big + small + sizeof(host);

	memset(dst, 0xee, big + small + 2000);
	put_segs(a, to, "kv", src, 3, 1, 0, NULL);
	t_expect(a, NULL, 1, 0, &c);
	assert_int_equal(c.len, total);
	get_segs(b, from, "kv", out, 2, 2);
	t_expect(b, NULL, 2, 0, &c);
	assert_int_equal(c.len, total);
	assert_memory_equal(dst, d0, 1000);
	assert_memory_equal(dst + 1064, d0 + 1000, big - 1000);
	assert_memory_equal(dst + 1064 + big - 1000, host, sizeof(host));
	assert_memory_equal(dst + 1064 + big - 1000 + sizeof(host), d1, small);
	assert_int_equal(dst[1000], 0xee); /* the gap between the segments is left alone */
	/* Cut into pieces of at most 8 MiB; each job's end reached through its event. */
	assert_true(d_stat("max_piece") <= (8u << 20));
	assert_true(d_stat("copies") >= 3 + 1 + 1 + 2);
	assert_int_equal(d_stat("syncs"), 0); /* never a synchronize while running */
	assert_int_equal(t_health_num(a, "\"cuda\":{", "puts"), 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "bytes_d2h"), total);
	assert_int_equal(t_health_num(b, "\"cuda\":{", "gets"), 1);
	assert_int_equal(t_health_num(b, "\"cuda\":{", "bytes_h2d"), total);
	assert_int_equal(t_health_num(a, "\"pool\":{", "bytes_in_use"), 0);
	assert_int_equal(t_health_num(b, "\"pool\":{", "bytes_in_use"), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(ferry_engine_destroy(b), 0);
	d_free(d0);
	d_free(d1);
	d_free(dst);
}

/* A device PUT got zero copy (a host buffer); a host PUT into a GET of device memory, both ways. */
static void test_double_device_and_host(void **state)
{
	struct duo p;
	static uint8_t host[5000];
	struct ferry_cqe c;

	(void)state;
	duo_open(&p, "ha", "hb", FERRY_PROGRESS_THREAD, 8u << 20, 100000, 100000);
	struct ferry_seg s = { p.r, 500, 60000 }, o = { p.rd, 0, 100000 };

	pattern(p.d, 100000, 4);
	pattern(host, sizeof(host), 5);
	put_segs(p.a, p.to, "z", &s, 1, 1, 0, NULL);
	t_expect(p.a, NULL, 1, 0, NULL);
	t_get(p.b, p.from, "z", NULL, 0, 2, 0, 0);
	t_expect(p.b, NULL, 2, 0, &c);
	assert_true(c.flags & FERRY_CQE_F_BUF);
	assert_int_equal(c.len, 60000);
	assert_memory_equal(ferry_buf_data(c.buf), p.d + 500, 60000);
	ferry_buf_release(c.buf);
	/* The GET into device memory waits first: the arrival is not copied in place by the host. */
	get_segs(p.b, p.from, "h", &o, 1, 3);
	t_expect_none(p.b, NULL, 30);
	t_put(p.a, p.to, "h", host, sizeof(host), 4, 0);
	t_expect(p.a, NULL, 4, 0, NULL);
	t_expect(p.b, NULL, 3, 0, &c);
	assert_int_equal(c.len, sizeof(host));
	assert_memory_equal(p.dst, host, sizeof(host));
	/* ... and the data there before the GET. */
	memset(p.dst, 0, 100000);
	t_put(p.a, p.to, "h2", host + 1, 4000, 5, 0);
	t_expect(p.a, NULL, 5, 0, NULL);
	get_segs(p.b, p.from, "h2", &o, 1, 6);
	t_expect(p.b, NULL, 6, 0, &c);
	assert_memory_equal(p.dst, host + 1, 4000);
	/* Too small a device destination: -EMSGSIZE, the data stays for a larger GET. */
	t_put(p.a, p.to, "big", host, sizeof(host), 7, 0);
	t_expect(p.a, NULL, 7, 0, NULL);
	o.len = 100;
	get_segs(p.b, p.from, "big", &o, 1, 8);
	t_expect(p.b, NULL, 8, -EMSGSIZE, &c);
	assert_int_equal(c.len, sizeof(host));
	o.len = 100000;
	get_segs(p.b, p.from, "big", &o, 1, 9);
	t_expect(p.b, NULL, 9, 0, NULL);
	assert_memory_equal(p.dst, host, sizeof(host));
	/* Every byte into device memory went through the domain's copies, none through memcpy. */
	assert_int_equal(t_health_num(p.b, "\"cuda\":{", "gets"), 3);
	duo_close(&p);
}

/*
 * The caller's stream (kind STREAM) or event (kind EVENT) must finish
 * before the PUT copies: its "kernel" (a gate) then writes the tensor.
 * Without ferry's wait the PUT would copy the old bytes, and at once.
 */
static void caller_wait(int kind)
{
	struct ferry_engine *a = t_engine("wa", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_engine *b = t_engine("wb", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_peer *to = t_peer(a, "wb"), *from = t_peer(b, "wa");
	uint8_t *d = d_malloc(0, 65536);
	static uint8_t fresh[65536], got[65536];
	struct ferry_region *r = dev_reg(a, d, 65536, 0);
	struct ferry_seg s = { r, 0, 65536 };
	void *st = NULL, *ev = NULL;

	pattern(d, 65536, 6);     /* what is there before the producer's work */
	pattern(fresh, 65536, 7); /* what its work writes */
	assert_int_equal(d_stream_create(&st, 1), 0);
	d_gate_close();
	assert_int_equal(d_gate(st), 0);
	assert_int_equal(d_memcpy_async(d, fresh, sizeof(fresh), 4, st), 0);
	if (kind == FERRY_CUDA_WAIT_EVENT) {
		assert_int_equal(d_event_create(&ev, 2), 0);
		assert_int_equal(d_event_record(ev, st), 0);
	}
	put_segs(a, to, "t", &s, 1, 1, kind, kind == FERRY_CUDA_WAIT_EVENT ? ev : st);
	cuda_health_is(a, "in_flight", 1); /* taken, and waiting on the GPU for the producer */
	t_expect_none(a, NULL, 150);       /* the producer's work has not run */
	assert_true(d_stat("waits") >= 1);
	d_gate_open();
	t_expect(a, NULL, 1, 0, NULL);
	t_get(b, from, "t", t_iov_of(got, sizeof(got)), 1, 2, 0, 0);
	t_expect(b, NULL, 2, 0, NULL);
	assert_memory_equal(got, fresh, sizeof(fresh));
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	if (ev)
		d_event_destroy(ev);
	d_stream_destroy(st);
	d_free(d);
}

static void test_double_caller_stream_first(void **state)
{
	(void)state;
	caller_wait(FERRY_CUDA_WAIT_STREAM);
}

static void test_double_caller_event_first(void **state)
{
	(void)state;
	caller_wait(FERRY_CUDA_WAIT_EVENT);
}

/*
 * A reactor that sleeps (no deadline, nothing else to do) is woken by the
 * host function behind the copy (the doorbell), not by a poll.
 */
static void test_double_sleeping_reactor_woken(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *a = NULL, *b;
	struct ferry_peer *to, *from;
	uint8_t *d;
	struct ferry_region *r;
	struct ferry_cqe c;
	static uint8_t got[4096];
	int64_t t0;

	(void)state;
	p.name = "sa";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = 4u << 20;
	p.spin_ns = 1000; /* sleeps at once */
	assert_int_equal(ferry_engine_create(&p, &a), 0);
	b = t_engine("sb", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "sb");
	from = t_peer(b, "sa");
	d = d_malloc(0, 4096);
	pattern(d, 4096, 8);
	r = dev_reg(a, d, 4096, 0);
	struct ferry_seg s = { r, 0, 4096 };

	d_delay(300000); /* each copy takes 300 ms: the reactor is long asleep when it ends */
	t0 = t_now();
	put_segs(a, to, "s", &s, 1, 1, 0, NULL);
	t_expect(a, NULL, 1, 0, &c);
	assert_true(t_now() - t0 >= 250 * MS);
	assert_true(t_health_num(a, "\"cuda\":{", "callbacks") >= 1);
	d_delay(0);
	t_get(b, from, "s", t_iov_of(got, sizeof(got)), 1, 2, 0, 0);
	t_expect(b, NULL, 2, 0, NULL);
	assert_memory_equal(got, d, 4096);
	/* The host function cannot be queued before the sleep: the PUT still ends, and it is said. */
	t_log_capture(FERRY_LOG_WARN);
	d_delay(100000);
	d_fail("cudaLaunchHostFunc", 999, 0, 1000000);
	put_segs(a, to, "s2", &s, 1, 3, 0, NULL);
	t_expect(a, NULL, 3, 0, NULL);
	assert_true(t_log_seen(FERRY_LOG_WARN, "cudaLaunchHostFunc", "spins until its copies end"));
	d_delay(0); /* (the failures stay injected: each case is a process of its own) */
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	d_free(d);
}

/*
 * A reactor that spins while the copy runs sees it end by its event: no
 * host function is queued behind the job (one in a stream holds that stream
 * until a CPU thread has run it).
 */
static void test_double_spinning_reactor_no_host_fn(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *a = NULL, *b;
	struct ferry_peer *to, *from;
	uint8_t *d, *dst;
	struct ferry_region *r, *rd;
	struct ferry_cqe c;

	(void)state;
	p.name = "na";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = 4u << 20;
	p.spin_ns = 60ull * SEC; /* never sleeps in this case */
	assert_int_equal(ferry_engine_create(&p, &a), 0);
	p.name = "nb";
	assert_int_equal(ferry_engine_create(&p, &b), 0);
	to = t_peer(a, "nb");
	from = t_peer(b, "na");
	d = d_malloc(0, 4096);
	dst = d_malloc(0, 4096);
	pattern(d, 4096, 12);
	r = dev_reg(a, d, 4096, 0);
	rd = dev_reg(b, dst, 4096, 0);
	struct ferry_seg s = { r, 0, 4096 }, o = { rd, 0, 4096 };

	for (unsigned i = 0; i < 20; i++) {
		put_segs(a, to, "k", &s, 1, 1, 0, NULL);
		t_expect(a, NULL, 1, 0, NULL);
		get_segs(b, from, "k", &o, 1, 2);
		t_expect(b, NULL, 2, 0, &c);
		assert_int_equal(c.len, 4096);
	}
	assert_memory_equal(dst, d, 4096);
	assert_int_equal(d_stat("hostfns"), 0);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "jobs_ended"), 20);
	assert_int_equal(t_health_num(b, "\"cuda\":{", "jobs_ended"), 20);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	d_free(d);
	d_free(dst);
}

/* Injected errors: at issue (synchronous) and on the "device" (asynchronous), PUT and GET. */
static void test_double_injected_errors(void **state)
{
	struct duo p;
	static uint8_t host[10000];
	uint64_t syncs;

	(void)state;
	duo_open(&p, "ea", "eb", FERRY_PROGRESS_THREAD, 4u << 20, 10000, 10000);
	struct ferry_seg s = { p.r, 0, 10000 }, o = { p.rd, 0, 10000 };

	pattern(p.d, 10000, 9);
	t_log_capture(FERRY_LOG_ERROR);
	/* The copy cannot be queued: -EIO, logged, the pool block back. */
	d_fail("cudaMemcpyAsync", 700, 0, 1);
	put_segs(p.a, p.to, "e1", &s, 1, 1, 0, NULL);
	t_expect(p.a, NULL, 1, -EIO, NULL);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "device copy could not be queued", NULL));
	assert_int_equal(t_health_num(p.a, "\"pool\":{", "bytes_in_use"), 0);
	/* The copy fails on the device: the PUT ends with -EIO when its event says so. */
	d_fail_next_copy(NULL, 719);
	put_segs(p.a, p.to, "e2", &s, 1, 2, 0, NULL);
	t_expect(p.a, NULL, 2, -EIO, NULL);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "device copy failed", "cuda double error 719"));
	/* The event cannot be recorded behind queued copies: synchronized once, -EIO. */
	syncs = d_stat("syncs");
	d_fail("cudaEventRecord", 1, 0, 1);
	put_segs(p.a, p.to, "e3", &s, 1, 3, 0, NULL);
	t_expect(p.a, NULL, 3, -EIO, NULL);
	assert_int_equal(d_stat("syncs"), syncs + 1);
	assert_true(t_health_num(p.a, "\"cuda\":{", "errors") >= 3);
	/* Nothing left behind: the next PUT goes through. */
	put_segs(p.a, p.to, "ok", &s, 1, 4, 0, NULL);
	t_expect(p.a, NULL, 4, 0, NULL);
	/* A GET's copy fails on the device: -EIO, the block given back. */
	t_put(p.a, p.to, "g", host, sizeof(host), 5, 0);
	t_expect(p.a, NULL, 5, 0, NULL);
	d_fail_next_copy(NULL, 700);
	get_segs(p.b, p.from, "g", &o, 1, 6);
	t_expect(p.b, NULL, 6, -EIO, NULL);
	assert_int_equal(t_health_num(p.b, "\"pool\":{", "bytes_in_use"), 0);
	/* A GET whose copy cannot be queued: -EIO, and the data stays for the next GET. */
	t_put(p.a, p.to, "g2", host, sizeof(host), 7, 0);
	t_expect(p.a, NULL, 7, 0, NULL);
	d_fail("cudaMemcpyAsync", 1, 0, 1);
	get_segs(p.b, p.from, "g2", &o, 1, 8);
	t_expect(p.b, NULL, 8, -EIO, NULL);
	get_segs(p.b, p.from, "g2", &o, 1, 9);
	t_expect(p.b, NULL, 9, 0, NULL);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	duo_close(&p);
}

/* What is refused, each with its errno and a log line. */
static void test_double_refusals(void **state)
{
	struct ferry_engine *a = t_engine("ra", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *to = t_peer(a, "rb");
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL, *rd;
	uint8_t *d = d_malloc(1, 4096);
	static uint8_t host[4096];
	struct ferry_sqe *sqe;

	(void)state;
	t_log_capture(FERRY_LOG_ERROR);
	rp.mem = FERRY_MEM_CUDA;
	rp.addr = host; /* host memory called device memory */
	rp.len = sizeof(host);
	assert_int_equal(ferry_region_register(a, &rp, &r), -EINVAL);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "not memory of CUDA device", "not device memory"));
	rp.addr = d; /* device 1's memory called device 0's */
	assert_int_equal(ferry_region_register(a, &rp, &r), -EINVAL);
	rp.len = 4097; /* beyond the allocation */
	rp.device = 1;
	assert_int_equal(ferry_region_register(a, &rp, &r), -EINVAL);
	rp.len = 4096;
	rp.device = 7; /* no such device */
	assert_int_equal(ferry_region_register(a, &rp, &r), -EINVAL);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "device 7 does not exist", NULL));
	assert_null(r);
	rd = dev_reg(a, d, 4096, 1);
	struct ferry_seg s = { rd, 0, 4096 };
	/* Streams of device memory are not built: -EOPNOTSUPP, the region unpinned. */
	sqe = t_sqe(a);
	ferry_prep_stream_put_segs(sqe, to, "st", &s, 1, 1);
	t_submit(a);
	t_expect(a, NULL, 1, -EOPNOTSUPP, NULL);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "STREAM_PUT of CUDA device memory", NULL));
	/* A CUDA wait on a PUT of host memory; an unknown kind. */
	sqe = t_sqe(a);
	ferry_prep_put(sqe, to, "h", t_iov_of(host, 10), 1, 2);
	ferry_sqe_set_cuda_wait(sqe, FERRY_CUDA_WAIT_EVENT, host);
	t_submit(a);
	t_expect(a, NULL, 2, -EINVAL, NULL);
	put_segs(a, to, "k", &s, 1, 3, 9, host);
	t_expect(a, NULL, 3, -EINVAL, NULL);
	put_segs(a, to, "k", &s, 1, 4, FERRY_CUDA_WAIT_EVENT, NULL);
	t_expect(a, NULL, 4, -EINVAL, NULL);
	/* ferry gives no device buffers. */
	struct ferry_buf_params bp = FERRY_BUF_PARAMS_INIT;
	struct ferry_buf *buf = NULL;

	bp.mem = FERRY_MEM_CUDA;
	bp.len = 10;
	assert_int_equal(ferry_buf_alloc_params(a, &bp, &buf), -EOPNOTSUPP);
	assert_int_equal(ferry_region_release(&rd), 0); /* unpinned after every refusal */
	assert_int_equal(t_health_num(a, "\"cuda\":{", "regions"), 0);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	ferry_engine_destroy(a);
	d_free(d);
}

/* The runtime loads and sees no device: device memory refused, everything else unchanged. */
static void test_double_no_device(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *to, *from;
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;
	static char h[65536];
	static uint8_t got[100];

	(void)state;
	setenv("FERRY_CUDA_DOUBLE_DEVICES", "0", 1);
	t_log_capture(FERRY_LOG_INFO);
	a = t_engine("na", FERRY_PROGRESS_THREAD, 4u << 20);
	b = t_engine("nb", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "nb");
	from = t_peer(b, "na");
	rp.mem = FERRY_MEM_CUDA;
	rp.addr = got;
	rp.len = 100;
	assert_int_equal(ferry_region_register(a, &rp, &r), -ENODEV);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "CUDA device memory is not available", "no device"));
	assert_false(ferry_features() & FERRY_FEATURE_CUDA);
	assert_true(ferry_engine_health(a, h, sizeof(h)) < (int)sizeof(h));
	assert_non_null(strstr(h, "\"cuda\":{\"available\":false,\"why\":\"the CUDA runtime"));
	assert_non_null(strstr(h, "sees no device"));
	t_put(a, to, "k", "hello", 5, 1, 0);
	t_expect(a, NULL, 1, 0, NULL);
	t_get(b, from, "k", t_iov_of(got, sizeof(got)), 1, 2, 0, 0);
	t_expect(b, NULL, 2, 0, NULL);
	assert_memory_equal(got, "hello", 5);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	unsetenv("FERRY_CUDA_DOUBLE_DEVICES");
}

static void *open_gate_later(void *arg)
{
	(void)arg;
	usleep(200000);
	d_gate_open();
	return NULL;
}

/* Destroy with a device copy in flight: the teardown waits for it, nothing leaks or hangs. */
static void test_double_destroy_in_flight(void **state)
{
	struct ferry_engine *a = t_engine("ia", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *to = t_peer(a, "ib");
	uint8_t *d = d_malloc(0, 1 << 20);
	struct ferry_region *r = dev_reg(a, d, 1 << 20, 0);
	struct ferry_seg s = { r, 0, 1 << 20 };
	void *st = NULL;
	pthread_t t;

	(void)state;
	assert_int_equal(d_stream_create(&st, 1), 0);
	d_gate_close();
	assert_int_equal(d_gate(st), 0);
	put_segs(a, to, "x", &s, 1, 1, FERRY_CUDA_WAIT_STREAM, st);
	cuda_health_is(a, "in_flight", 1);
	t_expect_none(a, NULL, 50);
	assert_int_equal(pthread_create(&t, NULL, open_gate_later, NULL), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	pthread_join(t, NULL);
	assert_true(d_stat("syncs") >= 1); /* at teardown only */
	d_stream_destroy(st);
	d_free(d);
}

/* 0 bytes of device memory; 64 device PUTs in flight at once, each taken intact. */
static void test_double_empty_and_many(void **state)
{
	struct duo p;
	struct ferry_cqe c;
	char key[16];

	(void)state;
	duo_open(&p, "ma", "mb", FERRY_PROGRESS_THREAD, 16u << 20, 64 * 4096, 4096);
	struct ferry_seg s[64], o = { p.rd, 0, 4096 }, none = { p.r, 0, 0 };

	pattern(p.d, 64 * 4096, 12);
	put_segs(p.a, p.to, "empty", &none, 1, 1, 0, NULL);
	t_expect(p.a, NULL, 1, 0, &c);
	assert_int_equal(c.len, 0);
	get_segs(p.b, p.from, "empty", &o, 1, 2);
	t_expect(p.b, NULL, 2, 0, &c);
	assert_int_equal(c.len, 0);
	d_delay(2000); /* the copies overlap the submissions */
	for (unsigned i = 0; i < 64; i++) {
		s[i] = (struct ferry_seg){ p.r, i * 4096ull, 4096 };
		snprintf(key, sizeof(key), "m%u", i);
		put_segs(p.a, p.to, key, &s[i], 1, 100 + i, 0, NULL);
	}
	for (unsigned i = 0; i < 64; i++)
		t_expect(p.a, NULL, 100 + i, 0, NULL); /* in order: one stream, jobs end in order */
	d_delay(0);
	for (unsigned i = 0; i < 64; i++) {
		snprintf(key, sizeof(key), "m%u", i);
		get_segs(p.b, p.from, key, &o, 1, 200 + i);
		t_expect(p.b, NULL, 200 + i, 0, NULL);
		assert_memory_equal(p.dst, p.d + i * 4096ull, 4096);
	}
	assert_int_equal(t_health_num(p.a, "\"cuda\":{", "in_flight"), 0);
	duo_close(&p);
}

/* More device PUTs and GETs than jobs (256): the rest wait in order, none fails. */
static void test_double_more_than_jobs(void **state)
{
	struct duo p;
	const unsigned n = 300;
	static struct ferry_seg s[300], o[300];
	void *st = NULL;
	char key[16];

	(void)state;
	duo_open(&p, "ja", "jb", FERRY_PROGRESS_THREAD, 16u << 20, n * 512, n * 512);
	pattern(p.d, n * 512, 13);
	/* Every PUT waits for the producer's gated stream: all 300 are in the domain at once. */
	assert_int_equal(d_stream_create(&st, 1), 0);
	d_gate_close();
	assert_int_equal(d_gate(st), 0);
	for (unsigned i = 0; i < n; i++) {
		s[i] = (struct ferry_seg){ p.r, i * 512ull, 512 };
		snprintf(key, sizeof(key), "j%u", i);
		put_segs(p.a, p.to, key, &s[i], 1, 1000 + i, FERRY_CUDA_WAIT_STREAM, st);
	}
	cuda_health_is(p.a, "waiting", n - 256);
	cuda_health_is(p.a, "in_flight", 256);
	t_expect_none(p.a, NULL, 50);
	d_gate_open();
	for (unsigned i = 0; i < n; i++)
		t_expect(p.a, NULL, 1000 + i, 0, NULL);
	/* And 300 GETs into device memory at once (the data is there: each starts its copy). */
	for (unsigned i = 0; i < n; i++) {
		o[i] = (struct ferry_seg){ p.rd, i * 512ull, 512 };
		snprintf(key, sizeof(key), "j%u", i);
		get_segs(p.b, p.from, key, &o[i], 1, 2000 + i);
	}
	for (unsigned i = 0; i < n; i++)
		t_expect(p.b, NULL, 2000 + i, 0, NULL);
	assert_memory_equal(p.dst, p.d, n * 512);
	assert_int_equal(t_health_num(p.a, "\"cuda\":{", "waiting"), 0);
	assert_int_equal(t_health_num(p.b, "\"cuda\":{", "gets"), n);
	duo_close(&p);
	d_stream_destroy(st);
}

/* Progress driven by the caller (FERRY_PROGRESS_MANUAL): the same copies, ended by its waits. */
/*
 * Pipelined staging over tcp: two engines of this process, each listening
 * on 127.0.0.1 (a peer given a tcp address goes over tcp), a's peer of b
 * connected to b's address; the connection made by a small host PUT.
 */
static void tcp_pair(struct ferry_engine **a, struct ferry_engine **b, struct ferry_peer **to,
		     struct ferry_peer **from)
{
	struct ferry_engine *e[2];
	const char *names[2] = { "ta", "tb" };
	char addr[128];
	uint8_t one = 1, got = 0;

	for (int i = 0; i < 2; i++) {
		struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;

		p.name = names[i];
		p.ns = "cudatcp";
		p.pool_size = 96u << 20;
		p.progress = FERRY_PROGRESS_THREAD;
		p.listen = "tcp://127.0.0.1:0";
		p.handshake_ms = t_handshake_ms();
		assert_int_equal(ferry_engine_create(&p, &e[i]), 0);
	}
	*a = e[0];
	*b = e[1];
	*to = t_peer(*a, "tb");
	*from = t_peer(*b, "ta");
	assert_true(ferry_engine_address(*b, addr, sizeof(addr)) > 0);
	assert_int_equal(ferry_peer_connect_uri(*to, addr), 0);
	t_put(*a, *to, "hello", &one, 1, 90, 0);
	t_expect(*a, NULL, 90, 0, NULL);
	t_get(*b, *from, "hello", t_iov_of(&got, 1), 1, 91, 0, 10 * SEC);
	t_expect(*b, NULL, 91, 0, NULL);
}

/* Wait (10 s at most) until e's health section.name reaches at least want. */
static void health_reaches(struct ferry_engine *e, const char *section, const char *name,
			   long long want)
{
	int64_t end = t_now() + 10 * SEC;

	while (t_health_num(e, section, name) < want && t_now() < end)
		usleep(2000);
	if (t_health_num(e, section, name) < want)
		fail_msg("health %s%s stays below %lld", section, name, want);
}

/*
 * A large device PUT to a peer over tcp is pipelined: handed to tcp after
 * its first pieces are staged, while the rest still copy (each "copy" of
 * the double takes 40 ms here), tcp sending no byte past what is staged
 * (fill_waits); the data arrives whole. Cancelled while its block is still
 * being filled: its CQE comes only once its copies are done (the caller's
 * device memory is read until then), the block outlives the op until then,
 * and the message tcp goes on with carries the right bytes. A copy that fails after the first part left: the PUT fails, the
 * receiver never gets that data (tcp ends the link), the next PUT goes.
 * A PUT of one piece is staged whole.
 */
static void test_double_pipelined_over_tcp(void **state)
{
	const size_t n = (4u << 20) * 8 + 4321; /* five pieces of the domain's copies */
	struct ferry_engine *a, *b;
	struct ferry_peer *to, *from;
	uint8_t *d = d_malloc(0, n), *got = malloc(n), *want = malloc(n);
	struct ferry_region *r;
	struct ferry_seg s;
	struct ferry_cqe c;
	struct ferry_sqe *sqe;

	(void)state;
	assert_non_null(d);
	assert_non_null(got);
	assert_non_null(want);
	tcp_pair(&a, &b, &to, &from);
	r = dev_reg(a, d, n, 0);
	s = (struct ferry_seg){ r, 0, n };
	pattern(d, n, 11);
	memcpy(want, d, n);
	d_delay(40000);
	/* Pipelined: handed on while its job still runs. */
	put_segs(a, to, "big", &s, 1, 1, 0, NULL);
	health_reaches(a, "\"cuda\":{", "pipelined_puts", 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "in_flight"), 1); /* still copying */
	t_get(b, from, "big", t_iov_of(got, n), 1, 2, 0, 30 * SEC);
	t_expect(a, NULL, 1, 0, NULL);
	t_expect(b, NULL, 2, 0, &c);
	assert_int_equal(c.len, n);
	assert_memory_equal(got, want, n);
	assert_true(t_health_num(a, "\"tcp\":{", "fill_waits") >= 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "staged_puts"), 1);
	/* Cancelled while it is filled: the block stays until the copies end; the data is right. */
	pattern(d, n, 12);
	memcpy(want, d, n);
	put_segs(a, to, "cancelled", &s, 1, 3, 0, NULL);
	health_reaches(a, "\"cuda\":{", "pipelined_puts", 2);
	sqe = t_sqe(a);
	ferry_prep_cancel(sqe, 3, 4);
	t_submit(a);
	t_expect(a, NULL, 4, 0, NULL); /* the CANCEL: it took the PUT */
	/* The PUT ends only when its copies no longer read the caller's device memory. */
	assert_true(t_wait_cqe(a, NULL, &c, 10 * SEC));
	assert_int_equal(t_health_num(a, "\"cuda\":{", "in_flight"), 0);
	assert_int_equal(c.user_data, 3);
	assert_int_equal(c.res, -ECANCELED);
	memset(got, 0, n);
	t_get(b, from, "cancelled", t_iov_of(got, n), 1, 5, 0, 30 * SEC);
	t_expect(b, NULL, 5, 0, NULL);
	assert_memory_equal(got, want, n);
	cuda_health_is(a, "in_flight", 0);
	/* A copy fails after the first part left: the PUT fails, b never sees that key. */
	t_log_capture(FERRY_LOG_ERROR);
	d_fail_copy_after(2, 719);
	put_segs(a, to, "broken", &s, 1, 6, 0, NULL);
	assert_true(t_wait_cqe(a, NULL, &c, 30 * SEC));
	assert_int_equal(c.user_data, 6);
	if (c.res != -ECONNRESET && c.res != -EIO)
		fail_msg("the broken PUT ended with %d", c.res);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "device copy failed", NULL));
	t_get(b, from, "broken", t_iov_of(got, n), 1, 7, FERRY_SQE_NOWAIT, 0);
	t_expect(b, NULL, 7, -EAGAIN, NULL);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	/* The link comes back: the next PUT (one piece: staged whole) goes. */
	d_delay(0);
	s.len = 4u << 20;
	put_segs(a, to, "after", &s, 1, 8, 0, NULL);
	t_expect(a, NULL, 8, 0, NULL);
	t_get(b, from, "after", t_iov_of(got, s.len), 1, 9, 0, 10 * SEC);
	t_expect(b, NULL, 9, 0, NULL);
	assert_memory_equal(got, d, s.len);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "pipelined_puts"), 3);
	/* Nothing left behind in either pool. */
	cuda_health_is(a, "in_flight", 0);
	assert_int_equal(t_health_num(a, "\"pool\":{", "bytes_in_use"), 0);
	assert_int_equal(t_health_num(b, "\"pool\":{", "bytes_in_use"), 0);
	assert_int_equal(ferry_region_release(&r), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	d_free(d);
	free(got);
	free(want);
}

static void test_double_manual_progress(void **state)
{
	struct duo p;
	struct ferry_cqe c;

	(void)state;
	duo_open(&p, "pa", "pb", FERRY_PROGRESS_MANUAL, 4u << 20, 50000, 50000);
	struct ferry_seg s = { p.r, 0, 50000 }, o = { p.rd, 0, 50000 };

	pattern(p.d, 50000, 14);
	d_delay(100000); /* 100 ms a copy: several waits of the caller pass before it ends */
	get_segs(p.b, p.from, "m", &o, 1, 2);
	put_segs(p.a, p.to, "m", &s, 1, 1, 0, NULL);
	t_expect(p.a, p.b, 1, 0, &c);
	assert_int_equal(c.len, 50000);
	t_expect(p.b, p.a, 2, 0, &c);
	assert_int_equal(c.len, 50000);
	assert_memory_equal(p.dst, p.d, 50000);
	d_delay(0);
	duo_close(&p);
}

/* A child's check failed: said on stderr (the parent sees only the status). */
static int child_failed(int line, int rc)
{
	fprintf(stderr, "child %d: the check at line %d failed\n", (int)getpid(), line);
	return rc;
}

/*
 * Two processes over shm: a GET into device memory that waits, a device PUT
 * back; the peer's pool, which the GET's copy reads, pinned here once and
 * unpinned when the connection goes.
 */
static struct t_gate shm_ready;

static int shm_child(void *arg)
{
	struct ferry_engine *b = t_engine("xb", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *from = t_peer(b, "xa");
	uint8_t *dst = d_malloc(0, 300000);
	static uint8_t want[200000];
	struct ferry_region *rd = dev_reg(b, dst, 300000, 0);
	struct ferry_seg o = { rd, 1000, 299000 }, back = { rd, 1000, 200000 };
	struct ferry_cqe c;
	struct ferry_sqe *sqe;

	(void)arg;
	pattern(want, sizeof(want), 11);
	sqe = t_sqe(b);
	ferry_prep_get_segs(sqe, from, "in", &o, 1, 1);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	t_submit(b);
	t_expect_none(b, NULL, 50);
	t_gate_open(&shm_ready); /* the GET waits: the data arrives after it */
	t_expect(b, NULL, 1, 0, &c);
	if (c.len != sizeof(want) || memcmp(dst + 1000, want, sizeof(want)))
		return 2;
	if (t_health_num(b, "\"cuda\":{", "gets") != 1)
		return 3; /* taken into device memory by the domain's copy, not in place by memcpy */
	/*
	 * It was copied out of xa's pool, mapped here read-only: that mapping
	 * was pinned here (read-only), once, beside our own pool.
	 */
	if (t_health_num(b, "\"shm\":{", "peer_pools_pinned") != 1 ||
	    t_health_num(b, "\"shm\":{", "peer_pools_refused") != 0 || d_stat("pinned_ranges") != 2)
		return child_failed(__LINE__, 4);
	sqe = t_sqe(b);
	ferry_prep_put_segs(sqe, from, "out", &back, 1, 2);
	t_submit(b);
	t_expect(b, NULL, 2, 0, NULL);
	/* A second block of that pool: pinned already. */
	sqe = t_sqe(b);
	ferry_prep_get_segs(sqe, from, "in2", &o, 1, 3);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	t_submit(b);
	t_expect(b, NULL, 3, 0, &c);
	if (c.len != 1000 || t_health_num(b, "\"shm\":{", "peer_pools_pinned") != 1 ||
	    d_stat("pinned_ranges") != 2)
		return child_failed(__LINE__, 5);
	ferry_engine_destroy(b);
	/* Our pool and the peer's mapping, both unpinned (the mapping before its unmap). */
	if (d_stat("pinned_ranges") != 0)
		return child_failed(__LINE__, 6);
	d_free(dst);
	return 0;
}

static void test_double_two_processes_shm(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	static uint8_t data[200000], got[200000];
	pid_t pid;

	(void)state;
	pattern(data, sizeof(data), 11);
	t_gate_init(&shm_ready);
	pid = t_fork(shm_child, NULL); /* before any stream thread of the double exists here */
	a = t_engine("xa", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "xb");
	assert_int_equal(t_gate_wait(&shm_ready, 20000), 0);
	t_put(a, to, "in", data, sizeof(data), 1, FERRY_SQE_WAIT_PEER);
	t_expect(a, NULL, 1, 0, NULL);
	t_get(a, to, "out", t_iov_of(got, sizeof(got)), 1, 2, 0, 20 * SEC);
	t_expect(a, NULL, 2, 0, NULL);
	assert_memory_equal(got, data, sizeof(got));
	t_put(a, to, "in2", data, 1000, 3, 0);
	t_expect(a, NULL, 3, 0, NULL);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	t_gate_close(&shm_ready);
}

/*
 * One engine of this process (4 MiB pool, its own thread) with a device
 * allocation of device 0 registered (mem: len bytes), and its peer called
 * peer: one side of a case with two processes.
 */
struct one {
	struct ferry_engine *e;
	struct ferry_peer *peer;
	uint8_t *mem;
	struct ferry_region *reg;
};

static void one_open(struct one *x, const char *name, const char *peer, size_t len)
{
	x->e = t_engine(name, FERRY_PROGRESS_THREAD, 4u << 20);
	x->peer = t_peer(x->e, peer);
	x->mem = d_malloc(0, len);
	x->reg = dev_reg(x->e, x->mem, len, 0);
}

static void one_close(struct one *x)
{
	ferry_engine_destroy(x->e);
	d_free(x->mem);
}

/* ---- CUDA IPC between processes (the double's handles map a memfd across them) ---- */

static struct t_gate ipc_ready, ipc_ready2, ipc_done;

#define IPC_N 8
#define IPC_LEN 300000u

/*
 * The receiver: GETs into device memory (IPC_N of them, one allocation of
 * the sender behind them all) and one into host memory, each copy held
 * 100 ms by the double; then it waits for the sender to go.
 */
static int ipc_child(void *arg)
{
	struct ferry_engine *b = t_engine("ib", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *from = t_peer(b, "ia");
	uint8_t *dst = d_malloc(0, IPC_N * IPC_LEN);
	static uint8_t want[IPC_LEN], host[IPC_LEN];
	struct ferry_region *rd = dev_reg(b, dst, IPC_N * IPC_LEN, 0);
	struct ferry_cqe c;
	char key[16];
	int64_t end;

	(void)arg;
	d_delay(100000);
	static struct ferry_seg o[IPC_N]; /* the segments outlive their ops */

	for (unsigned i = 0; i < IPC_N; i++) {
		struct ferry_sqe *sqe = t_sqe(b);

		o[i] = (struct ferry_seg){ rd, i * IPC_LEN, IPC_LEN };
		snprintf(key, sizeof(key), "k%u", i);
		ferry_prep_get_segs(sqe, from, key, &o[i], 1, 10 + i);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		t_submit(b);
	}
	t_gate_open(&ipc_ready);
	for (unsigned i = 0; i < IPC_N; i++) {
		t_expect(b, NULL, 10 + i, 0, &c);
		if (c.len != IPC_LEN)
			return child_failed(__LINE__, 2);
	}
	for (unsigned i = 0; i < IPC_N; i++) {
		pattern(want, IPC_LEN, 100 + i);
		if (memcmp(dst + i * IPC_LEN, want, IPC_LEN)) {
			size_t k = 0;

			while (dst[i * IPC_LEN + k] == want[k])
				k++;
			fprintf(stderr, "GET %u: byte %zu is %u, want %u\n", i, k,
				dst[i * IPC_LEN + k], want[k]);
			return child_failed(__LINE__, 3);
		}
	}
	/* A host destination: a D2H copy from the opened handle. */
	t_get(b, from, "h", t_iov_of(host, sizeof(host)), 1, 30, 0, 30 * SEC);
	t_expect(b, NULL, 30, 0, &c);
	pattern(want, IPC_LEN, 200);
	if (c.len != IPC_LEN || memcmp(host, want, IPC_LEN))
		return child_failed(__LINE__, 4);
	if (t_health_num(b, "\"cuda\":{", "ipc_gets") != IPC_N + 1 ||
	    t_health_num(b, "\"cuda\":{", "gets") != 0) /* nothing came staged */
		return child_failed(__LINE__, 5);
	/* The handle cache: the sender's one allocation opened once for all of them. */
	if (t_health_num(b, "\"cuda\":{", "ipc_opens") != 1 || d_stat("ipc_opens") != 1)
		return child_failed(__LINE__, 6);
	t_gate_open(&ipc_done);
	/* The sender goes: its handle is closed here. */
	end = t_now() + 10 * SEC;
	while (t_health_num(b, "\"cuda\":{", "ipc_open") != 0 && t_now() < end)
		usleep(5000);
	if (t_health_num(b, "\"cuda\":{", "ipc_closes") != 1 || d_stat("ipc_closes") != 1)
		return child_failed(__LINE__, 7);
	ferry_engine_destroy(b);
	d_free(dst);
	return 0;
}

/* Device to device by IPC: no staging, PUTs end after the receiver's copy, one open. */
static void test_double_ipc_device_to_device(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	uint8_t *src;
	struct ferry_region *rs;
	struct ferry_cqe c;
	char key[16];
	int64_t t0;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_done);
	pid = t_fork(ipc_child, NULL); /* before any stream thread of the double exists here */
	a = t_engine("ia", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "ib");
	/* One allocation; the regions start inside it (the handle names the allocation). */
	src = d_malloc(0, 4096 + (IPC_N + 1) * IPC_LEN);
	for (unsigned i = 0; i < IPC_N; i++)
		pattern(src + 4096 + i * IPC_LEN, IPC_LEN, 100 + i);
	pattern(src + 4096 + IPC_N * IPC_LEN, IPC_LEN, 200);
	rs = dev_reg(a, src + 4096, (IPC_N + 1) * IPC_LEN, 0);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_regions"), 1);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	t0 = t_now();
	static struct ferry_seg segs[IPC_N + 1]; /* the segments outlive their ops */

	for (unsigned i = 0; i < IPC_N; i++) {
		segs[i] = (struct ferry_seg){ rs, i * IPC_LEN, IPC_LEN };
		snprintf(key, sizeof(key), "k%u", i);
		put_segs(a, to, key, &segs[i], 1, 1 + i, 0, NULL);
	}
	/*
	 * Each ends at its RELEASE: in any order (releases that queue in one
	 * round of the receiver go out together, last first).
	 */
	unsigned ended = 0;

	for (unsigned i = 0; i < IPC_N; i++) {
		assert_int_equal(t_wait_cqe(a, NULL, &c, 10 * SEC), 1);
		assert_int_equal(c.res, 0);
		assert_true(c.user_data >= 1 && c.user_data <= IPC_N);
		assert_false(ended & (1u << c.user_data));
		ended |= 1u << c.user_data;
		assert_int_equal(c.len, IPC_LEN);
	}
	/*
	 * The receiver's copies take 100 ms each (the double's delay): a PUT
	 * that ended at its RESULT, before the copy from its memory, is early.
	 */
	assert_true(t_now() - t0 >= 100 * MS);
	segs[IPC_N] = (struct ferry_seg){ rs, IPC_N * IPC_LEN, IPC_LEN };
	put_segs(a, to, "h", &segs[IPC_N], 1, 50, 0, NULL);
	t_expect(a, NULL, 50, 0, NULL);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_puts"), IPC_N + 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "staged_puts"), 0);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "bytes_d2h"), 0);
	assert_int_equal(d_stat("copies"), 0); /* this side copied nothing */
	assert_int_equal(t_gate_wait(&ipc_done, 20000), 0);
	ferry_engine_destroy(a);
	assert_int_equal(t_reap(pid), 0);
	d_free(src);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_done);
}

/*
 * Device buffers handed out (FERRY_SQE_DEVICE_BUF): a GET for a buffer of
 * another process's device PUT gets that memory itself, opened here by IPC,
 * with no copy; the sender's PUT ends only when the buffer is released. A
 * PUT of two segments still comes as a host buffer (staged); a device
 * buffer cannot be PUT on (-EOPNOTSUPP, and the refusal releases it); a
 * GET with the flag and a destination is refused (-EINVAL); an engine
 * destroyed with a buffer out ends its sender's PUT (-ECONNRESET, with the
 * connection) and the release that comes after ends cleanly.
 */
#define DB_LEN 200000u

static struct t_gate db_ready, db_holding, db_let_go, db_done;

static int devbuf_child(void *arg)
{
	struct ferry_engine *b = t_engine("dvb", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *from = t_peer(b, "dva");
	static uint8_t want[DB_LEN];
	struct ferry_cqe c, two, fwd, late;
	struct ferry_sqe *sqe;

	(void)arg;
	for (unsigned i = 0; i < 4; i++) {
		static const char *const keys[] = { "dv", "two", "fwd", "late" };

		sqe = t_sqe(b);
		ferry_prep_get(sqe, from, keys[i], NULL, 0, 10 + i);
		ferry_sqe_set_flags(sqe, FERRY_SQE_DEVICE_BUF);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		t_submit(b);
	}
	sqe = t_sqe(b);
	{
		static char small[8];

		ferry_prep_get(sqe, from, "dv", t_iov_of(small, sizeof(small)), 1, 19);
	}
	ferry_sqe_set_flags(sqe, FERRY_SQE_DEVICE_BUF); /* a destination: not for this flag */
	t_submit(b);
	t_expect(b, NULL, 19, -EINVAL, NULL);
	t_gate_open(&db_ready);
	/* The sender's device memory itself: no copy (the double made none here). */
	t_expect(b, NULL, 10, 0, &c);
	if (c.len != DB_LEN || !(c.flags & FERRY_CQE_F_BUF) || ferry_buf_mem(c.buf) != FERRY_MEM_CUDA ||
	    ferry_buf_device(c.buf) != 0 || ferry_buf_len(c.buf) != DB_LEN)
		return child_failed(__LINE__, 2);
	pattern(want, DB_LEN, 1);
	if (memcmp(ferry_buf_data(c.buf), want, DB_LEN) || d_stat("copies") != 0)
		return child_failed(__LINE__, 3);
	{
		struct ferry_buf *sh[2];

		if (ferry_buf_share(c.buf, 2, sh) != -EINVAL) /* not ours to share */
			return child_failed(__LINE__, 13);
	}
	/* Two segments: a host buffer, staged by the sender. */
	t_expect(b, NULL, 11, 0, &two);
	pattern(want, DB_LEN, 2);
	if (two.len != DB_LEN || ferry_buf_mem(two.buf) != FERRY_MEM_HOST ||
	    ferry_buf_device(two.buf) != -1 || memcmp(ferry_buf_data(two.buf), want, DB_LEN))
		return child_failed(__LINE__, 4);
	ferry_buf_release(two.buf);
	if (t_health_num(b, "\"cuda\":{", "ipc_handouts") != 1 ||
	    t_health_num(b, "\"cuda\":{", "handouts_out") != 1)
		return child_failed(__LINE__, 5);
	t_gate_open(&db_holding);
	if (t_gate_wait(&db_let_go, 30000))
		return child_failed(__LINE__, 6);
	if (ferry_buf_release(c.buf))
		return child_failed(__LINE__, 7);
	/* Not to be PUT on: refused, and the refusal releases it (the sender's PUT ends). */
	t_expect(b, NULL, 12, 0, &fwd);
	if (ferry_buf_mem(fwd.buf) != FERRY_MEM_CUDA)
		return child_failed(__LINE__, 8);
	sqe = t_sqe(b);
	ferry_prep_put_buf(sqe, from, "back", fwd.buf, 20);
	t_submit(b);
	t_expect(b, NULL, 20, -EOPNOTSUPP, NULL);
	/* One released after its engine went. */
	t_expect(b, NULL, 13, 0, &late);
	pattern(want, DB_LEN, 3);
	if (ferry_buf_mem(late.buf) != FERRY_MEM_CUDA || memcmp(ferry_buf_data(late.buf), want, DB_LEN))
		return child_failed(__LINE__, 9);
	{
		int64_t end = t_now() + 5 * SEC;

		while (t_health_num(b, "\"cuda\":{", "handouts_out") != 1 && t_now() < end)
			usleep(1000); /* (fwd's handout ends in a round) */
		if (t_health_num(b, "\"cuda\":{", "handouts_out") != 1)
			return child_failed(__LINE__, 10);
	}
	ferry_engine_destroy(b);
	if (ferry_buf_mem(late.buf) != FERRY_MEM_CUDA || ferry_buf_release(late.buf) != 0)
		return child_failed(__LINE__, 11);
	if (ferry_buf_release(late.buf) != -EINVAL) /* once only */
		return child_failed(__LINE__, 12);
	t_gate_wait(&db_done, 30000);
	return 0;
}

static void test_double_ipc_device_buffer(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	struct ferry_region *rs;
	struct ferry_cqe c;
	uint8_t *src;
	static struct ferry_seg seg[5];
	pid_t pid;

	(void)state;
	t_gate_init(&db_ready);
	t_gate_init(&db_holding);
	t_gate_init(&db_let_go);
	t_gate_init(&db_done);
	pid = t_fork(devbuf_child, NULL); /* before any stream thread of the double exists here */
	a = t_engine("dva", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "dvb");
	src = d_malloc(0, 4096 + 4 * DB_LEN);
	for (unsigned i = 0; i < 4; i++)
		pattern(src + 4096 + i * DB_LEN, DB_LEN, 1 + i);
	rs = dev_reg(a, src + 4096, 4 * DB_LEN, 0);
	assert_int_equal(t_gate_wait(&db_ready, 20000), 0);
	seg[0] = (struct ferry_seg){ rs, 0, DB_LEN };
	seg[1] = (struct ferry_seg){ rs, DB_LEN, DB_LEN / 2 };
	seg[2] = (struct ferry_seg){ rs, DB_LEN + DB_LEN / 2, DB_LEN / 2 };
	seg[3] = (struct ferry_seg){ rs, 3 * DB_LEN, DB_LEN }; /* pattern 4: "fwd" */
	seg[4] = (struct ferry_seg){ rs, 2 * DB_LEN, DB_LEN }; /* pattern 3: "late" */
	put_segs(a, to, "dv", &seg[0], 1, 1, 0, NULL);
	put_segs(a, to, "two", &seg[1], 2, 2, 0, NULL);
	t_expect(a, NULL, 2, 0, NULL); /* staged: it ends when the receiver holds it */
	assert_int_equal(t_gate_wait(&db_holding, 20000), 0);
	t_expect_none(a, NULL, 200 * slow()); /* "dv" is being read in place */
	t_gate_open(&db_let_go);
	t_expect(a, NULL, 1, 0, &c);
	assert_int_equal(c.len, DB_LEN);
	put_segs(a, to, "fwd", &seg[3], 1, 3, 0, NULL);
	t_expect(a, NULL, 3, 0, NULL); /* released by the refusal of its PUT onward */
	put_segs(a, to, "late", &seg[4], 1, 4, 0, NULL);
	assert_int_equal(t_wait_cqe(a, NULL, &c, 20 * SEC), 1);
	assert_int_equal(c.user_data, 4);
	/*
	 * The receiver's engine was destroyed with "late" still out: its PUT
	 * ended then, with the connection (the buffer was released after).
	 */
	assert_int_equal(c.res, -ECONNRESET);
	/* Each went by IPC; "two" was then asked again and sent staged. */
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_puts"), 4);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_restaged"), 1);
	assert_int_equal(d_stat("copies") > 0, 1); /* "two" was staged here */
	t_gate_open(&db_done);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	d_free(src);
	t_gate_close(&db_ready);
	t_gate_close(&db_holding);
	t_gate_close(&db_let_go);
	t_gate_close(&db_done);
}

/*
 * Device buffers out hold at most 48 of the 64 handle slots (IPC_CACHE -
 * IPC_SEGS): of 64 GETs for buffers of 64 allocations, 48 get device
 * buffers and 16 come staged as host memory, and a GET that copies out of
 * a 65th allocation still finds a slot (without the limit the 64 buffers
 * held every slot, and that GET failed with -ENOBUFS).
 */
#define DS_N 63 /* keys h0..h63 */
#define DS_DEVICE 48
#define DS_LEN 4096u

static struct t_gate ds_ready, ds_done;

static int devslots_child(void *arg)
{
	struct ferry_engine *b = t_engine("dsb", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_peer *from = t_peer(b, "dsa");
	static struct ferry_buf *held[DS_N + 1];
	static uint8_t host[DS_LEN], want[DS_LEN];
	struct ferry_cqe c;
	unsigned nhost = 0;
	char key[16];

	(void)arg;
	for (unsigned i = 0; i <= DS_N; i++) {
		struct ferry_sqe *sqe = t_sqe(b);

		snprintf(key, sizeof(key), "h%u", i);
		ferry_prep_get(sqe, from, key, NULL, 0, 100 + i);
		ferry_sqe_set_flags(sqe, FERRY_SQE_DEVICE_BUF);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		t_submit(b);
	}
	t_get(b, from, "copy", t_iov_of(host, sizeof(host)), 1, 200, 0, 30 * SEC);
	t_gate_open(&ds_ready);
	for (unsigned k = 0; k < DS_N + 2; k++) { /* in the order they come */
		unsigned i;

		if (!t_wait_cqe(b, NULL, &c, 30 * SEC) || c.res != 0)
			return child_failed(__LINE__, 2);
		if (c.user_data == 200) { /* a copy from a 50th allocation found its slot */
			pattern(want, DS_LEN, 99);
			if (c.len != DS_LEN || memcmp(host, want, DS_LEN))
				return child_failed(__LINE__, 4);
			continue;
		}
		if ((i = (unsigned)c.user_data - 100) > DS_N)
			return child_failed(__LINE__, 6);
		pattern(want, DS_LEN, 10 + i);
		if (memcmp(ferry_buf_data(c.buf), want, DS_LEN))
			return child_failed(__LINE__, 7);
		if (ferry_buf_mem(c.buf) == FERRY_MEM_HOST) { /* past the limit: staged */
			nhost++;
			ferry_buf_release(c.buf);
		} else {
			held[i] = c.buf;
		}
	}
	if (nhost != DS_N + 1 - DS_DEVICE) /* 48 device buffers, the rest staged */
		return child_failed(__LINE__, 3);
	if (t_health_num(b, "\"cuda\":{", "handouts_out") != DS_DEVICE)
		return child_failed(__LINE__, 5);
	for (unsigned i = 0; i <= DS_N; i++)
		if (held[i])
			ferry_buf_release(held[i]);
	t_gate_wait(&ds_done, 30000);
	ferry_engine_destroy(b);
	return 0;
}

static void test_double_ipc_device_buffers_leave_slots(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	static uint8_t *mem[DS_N + 2];
	static struct ferry_seg seg[DS_N + 2];
	char key[16];
	pid_t pid;

	(void)state;
	t_gate_init(&ds_ready);
	t_gate_init(&ds_done);
	pid = t_fork(devslots_child, NULL);
	a = t_engine("dsa", FERRY_PROGRESS_THREAD, 8u << 20);
	to = t_peer(a, "dsb");
	for (unsigned i = 0; i < DS_N + 2; i++) { /* one allocation each: one handle each */
		mem[i] = d_malloc(0, DS_LEN);
		pattern(mem[i], DS_LEN, i <= DS_N ? 10 + i : 99);
		seg[i] = (struct ferry_seg){ dev_reg(a, mem[i], DS_LEN, 0), 0, DS_LEN };
	}
	assert_int_equal(t_gate_wait(&ds_ready, 20000), 0);
	for (unsigned i = 0; i <= DS_N; i++) {
		snprintf(key, sizeof(key), "h%u", i);
		put_segs(a, to, key, &seg[i], 1, 1 + i, 0, NULL);
	}
	put_segs(a, to, "copy", &seg[DS_N + 1], 1, 500, 0, NULL);
	for (unsigned i = 0; i < DS_N + 2; i++) { /* the handed-out ones end at their releases */
		assert_int_equal(t_wait_cqe(a, NULL, &(struct ferry_cqe){ 0 }, 30 * SEC), 1);
	}
	cuda_health_is(a, "ipc_restaged", DS_N + 1 - DS_DEVICE);
	t_gate_open(&ds_done);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	for (unsigned i = 0; i < DS_N + 2; i++)
		d_free(mem[i]);
	t_gate_close(&ds_ready);
	t_gate_close(&ds_done);
}

/*
 * Ping-pong by IPC both ways (the GPU check's latency loop, which failed
 * on a real GPU): the child GETs "ping" into its device memory and PUTs
 * it back as "pong" from there; the parent PUTs ping, waits for that PUT,
 * then GETs pong, so pong's descriptor is often there before its GET.
 * Then a descriptor stored before a GET too small for its data (-EMSGSIZE
 * with the data's length), and a GET for a buffer of a device PUT (the
 * sender asked to send it again staged: ferry hands out host buffers).
 */
#define PP_ITERS 40
#define PP_LEN 64

static int pingpong_child(void *arg)
{
	struct ferry_engine *b = t_engine("pb", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *from = t_peer(b, "pa");
	uint8_t *dst = d_malloc(0, 1u << 20);
	struct ferry_region *rd = dev_reg(b, dst, 1u << 20, 0);
	static struct ferry_seg s;
	struct ferry_cqe c;

	(void)arg;
	s = (struct ferry_seg){ rd, 0, PP_LEN };
	t_gate_open(&ipc_ready);
	for (unsigned i = 0; i < PP_ITERS; i++) {
		get_segs(b, from, "ping", &s, 1, 100 + i);
		if (t_wait_cqe(b, NULL, &c, 10 * SEC) != 1 || c.user_data != 100 + i || c.res != 0 ||
		    c.len != PP_LEN) {
			fprintf(stderr, "child: GET ping %u: res %d len %llu ud %llu\n", i, c.res,
				(unsigned long long)c.len, (unsigned long long)c.user_data);
			return child_failed(__LINE__, 2);
		}
		put_segs(b, from, "pong", &s, 1, 200 + i, 0, NULL);
		if (t_wait_cqe(b, NULL, &c, 10 * SEC) != 1 || c.user_data != 200 + i || c.res != 0) {
			fprintf(stderr, "child: PUT pong %u: res %d ud %llu\n", i, c.res,
				(unsigned long long)c.user_data);
			return child_failed(__LINE__, 3);
		}
	}
	/* A descriptor that waits for its GET, then "ready" (host, behind it in order). */
	s = (struct ferry_seg){ rd, 0, 2 * PP_LEN };
	put_segs(b, from, "big", &s, 1, 300, 0, NULL);
	t_put(b, from, "ready", "r", 1, 301, 0);
	t_expect(b, NULL, 301, 0, NULL);
	t_expect(b, NULL, 300, 0, NULL); /* after the parent's GET copied it */
	/* For the parent's GET for a buffer: asked again, sent staged (no device buffers). */
	pattern(dst, 100, 77);
	s = (struct ferry_seg){ rd, 0, 100 };
	put_segs(b, from, "buf", &s, 1, 302, 0, NULL);
	t_put(b, from, "ready2", "r", 1, 303, 0); /* behind "buf": it is there when this is */
	t_expect(b, NULL, 303, 0, NULL);
	t_expect(b, NULL, 302, 0, NULL);
	if (t_health_num(b, "\"cuda\":{", "ipc_restaged") != 1)
		return child_failed(__LINE__, 4);
	t_gate_wait(&ipc_done, 20000);
	ferry_engine_destroy(b);
	d_free(dst);
	return 0;
}

static void test_double_ipc_pingpong(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	uint8_t *src, want[PP_LEN];
	struct ferry_region *rs;
	static struct ferry_seg out, in;
	struct ferry_cqe c;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_done);
	pid = t_fork(pingpong_child, NULL);
	a = t_engine("pa", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "pb");
	src = d_malloc(0, 1u << 20);
	rs = dev_reg(a, src, 1u << 20, 0);
	out = (struct ferry_seg){ rs, 0, PP_LEN };
	in = (struct ferry_seg){ rs, 4096, PP_LEN };
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	for (unsigned i = 0; i < PP_ITERS; i++) {
		pattern(src, PP_LEN, i);
		memcpy(want, src, PP_LEN);
		put_segs(a, to, "ping", &out, 1, 1000 + i, 0, NULL);
		assert_int_equal(t_wait_cqe(a, NULL, &c, 10 * SEC), 1);
		assert_int_equal(c.user_data, 1000 + i);
		assert_int_equal(c.res, 0);
		get_segs(a, to, "pong", &in, 1, 2000 + i);
		assert_int_equal(t_wait_cqe(a, NULL, &c, 10 * SEC), 1);
		assert_int_equal(c.user_data, 2000 + i);
		assert_int_equal(c.res, 0);
		assert_int_equal(c.len, PP_LEN);
		assert_memory_equal(src + 4096, want, PP_LEN);
	}
	/*
	 * A GET too small for the data of a descriptor already there: -EMSGSIZE
	 * with the data's length (not the descriptor's), and the data stays.
	 */
	{
		static uint8_t r[8];

		t_get(a, to, "ready", t_iov_of(r, sizeof(r)), 1, 3000, 0, 10 * SEC);
		t_expect(a, NULL, 3000, 0, NULL);
		get_segs(a, to, "big", &in, 1, 3001);
		t_expect(a, NULL, 3001, -EMSGSIZE, &c);
		assert_int_equal(c.len, 2 * PP_LEN);
		in.len = 2 * PP_LEN;
		get_segs(a, to, "big", &in, 1, 3002);
		t_expect(a, NULL, 3002, 0, &c);
		assert_int_equal(c.len, 2 * PP_LEN);
		/* The child sent its first 128 bytes: the last ping's 64, then what it held past them. */
		assert_memory_equal(src + 4096, want, PP_LEN);
	}
	/*
	 * A GET for a buffer (host memory from a pool) of a device PUT by IPC:
	 * restaged. A NOWAIT one that finds the descriptor asks for it and ends
	 * with -EAGAIN (the data comes later, for a later GET).
	 */
	{
		static uint8_t r2[8];
		uint8_t expect[100];
		struct ferry_sqe *sqe;

		t_get(a, to, "ready2", t_iov_of(r2, sizeof(r2)), 1, 3010, 0, 10 * SEC);
		t_expect(a, NULL, 3010, 0, NULL);
		sqe = sqe_wait(a);
		ferry_prep_get(sqe, to, "buf", NULL, 0, 3011);
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
		t_submit(a);
		t_expect(a, NULL, 3011, -EAGAIN, NULL);
		sqe = sqe_wait(a);
		ferry_prep_get(sqe, to, "buf", NULL, 0, 3003);
		ferry_sqe_set_timeout(sqe, 10 * SEC);
		t_submit(a);
		t_expect(a, NULL, 3003, 0, &c);
		assert_true(c.flags & FERRY_CQE_F_BUF);
		assert_int_equal(c.len, 100);
		pattern(expect, 100, 77);
		assert_memory_equal(ferry_buf_data(c.buf), expect, 100);
		ferry_buf_release(c.buf);
		assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_resends"), 1);
	}
	/* Both directions went by IPC, nothing was staged. */
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_puts"), PP_ITERS);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_gets"), PP_ITERS + 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "staged_puts"), 0);
	t_gate_open(&ipc_done);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	d_free(src);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_done);
}

/*
 * A receiver whose CUDA runtime does not load (FERRY_CUDA_RUNTIME=none) is
 * sent a device PUT by IPC: it cannot read the sender's device memory, so
 * it asks for the data staged, and its GET into host memory takes it.
 */
static int noruntime_child(void *arg)
{
	struct ferry_engine *b;
	struct ferry_peer *from;
	static uint8_t host[5000], want[5000];
	struct ferry_cqe c;

	(void)arg;
	setenv("FERRY_CUDA_RUNTIME", "none", 1); /* before this process loads any */
	b = t_engine("nrb", FERRY_PROGRESS_THREAD, 4u << 20);
	from = t_peer(b, "nra");
	t_gate_open(&ipc_ready);
	t_get(b, from, "k", t_iov_of(host, sizeof(host)), 1, 1, 0, 10 * SEC);
	t_expect(b, NULL, 1, 0, &c);
	pattern(want, sizeof(want), 31);
	if (c.len != sizeof(want) || memcmp(host, want, sizeof(want)))
		return child_failed(__LINE__, 2);
	if (t_health_num(b, "\"cuda\":{", "ipc_resends") != 1)
		return child_failed(__LINE__, 3);
	t_gate_wait(&ipc_done, 20000);
	ferry_engine_destroy(b);
	return 0;
}

static void test_double_ipc_to_no_runtime(void **state)
{
	struct one x;
	pid_t pid;
	static struct ferry_seg s;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_done);
	pid = t_fork(noruntime_child, NULL);
	one_open(&x, "nra", "nrb", 5000);
	pattern(x.mem, 5000, 31);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	warm(x.e, x.peer, 9);
	s = (struct ferry_seg){ x.reg, 0, 5000 };
	put_segs(x.e, x.peer, "k", &s, 1, 10, 0, NULL);
	t_expect(x.e, NULL, 10, 0, NULL);
	assert_int_equal(t_health_num(x.e, "\"cuda\":{", "ipc_puts"), 1);
	assert_int_equal(t_health_num(x.e, "\"cuda\":{", "ipc_restaged"), 1);
	t_gate_open(&ipc_done);
	assert_int_equal(t_reap(pid), 0);
	one_close(&x);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_done);
}

/*
 * A GET of a CUDA IPC descriptor that must wait for a job (all of the
 * receiver's jobs busy: its own PUTs wait for a gated stream) is checked
 * first: too small for the data, it fails with -EMSGSIZE and the data's
 * length, and the data stays for a GET that fits.
 */
static int busy_child(void *arg)
{
	struct ferry_engine *b = t_engine("bb", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_peer *to = t_peer(b, "ba");
	uint8_t *own = d_malloc(0, 300 * 512), *dst = d_malloc(0, 4096);
	struct ferry_region *ro, *rd = dev_reg(b, dst, 4096, 0);
	static struct ferry_seg s[300], small, whole;
	static uint8_t r[8], want[1000];
	struct ferry_cqe c;
	void *st = NULL;
	char key[16];

	(void)arg;
	d_set_ipc(0); /* its own PUTs staged: they end once ba holds them */
	ro = dev_reg(b, own, 300 * 512, 0);
	d_set_ipc(1);
	if (d_stream_create(&st, 1) || t_gate_wait(&ipc_ready2, 20000)) /* ba is up */
		return child_failed(__LINE__, 2);
	d_gate_close();
	d_gate(st);
	for (unsigned i = 0; i < 300; i++) { /* 256 jobs busy, 44 ops waiting for one */
		s[i] = (struct ferry_seg){ ro, i * 512ull, 512 };
		snprintf(key, sizeof(key), "o%u", i);
		put_segs(b, to, key, &s[i], 1, 1000 + i, FERRY_CUDA_WAIT_STREAM, st);
	}
	cuda_health_is(b, "in_flight", 256);
	t_gate_open(&ipc_ready);
	t_get(b, to, "ready", t_iov_of(r, sizeof(r)), 1, 1, 0, 10 * SEC);
	t_expect(b, NULL, 1, 0, NULL); /* "big" is here: it went first */
	small = (struct ferry_seg){ rd, 0, 500 };
	get_segs(b, to, "big", &small, 1, 2);
	t_expect(b, NULL, 2, -EMSGSIZE, &c);
	if (c.len != 1000 || t_health_num(b, "\"cuda\":{", "waiting") != 44)
		return child_failed(__LINE__, 3);
	d_gate_open();
	for (unsigned i = 0; i < 300; i++)
		t_expect(b, NULL, 1000 + i, 0, NULL);
	whole = (struct ferry_seg){ rd, 0, 1000 };
	get_segs(b, to, "big", &whole, 1, 3);
	t_expect(b, NULL, 3, 0, &c);
	pattern(want, sizeof(want), 51);
	if (c.len != 1000 || memcmp(dst, want, sizeof(want)))
		return child_failed(__LINE__, 4);
	t_gate_wait(&ipc_done, 20000);
	ferry_engine_destroy(b);
	d_stream_destroy(st);
	d_free(own);
	d_free(dst);
	return 0;
}

static void test_double_ipc_get_when_jobs_busy(void **state)
{
	struct one x;
	static struct ferry_seg s;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_ready2);
	t_gate_init(&ipc_done);
	pid = t_fork(busy_child, NULL);
	one_open(&x, "ba", "bb", 1000);
	pattern(x.mem, 1000, 51);
	t_gate_open(&ipc_ready2);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	s = (struct ferry_seg){ x.reg, 0, 1000 };
	put_segs(x.e, x.peer, "big", &s, 1, 1, 0, NULL);
	t_put(x.e, x.peer, "ready", "r", 1, 2, 0);
	t_expect(x.e, NULL, 2, 0, NULL);
	t_expect(x.e, NULL, 1, 0, NULL); /* after the child's GET that fit */
	assert_int_equal(t_health_num(x.e, "\"cuda\":{", "ipc_puts"), 1);
	t_gate_open(&ipc_done);
	assert_int_equal(t_reap(pid), 0);
	one_close(&x);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_ready2);
	t_gate_close(&ipc_done);
}

/* The runtime refuses to pin the peer's pool: said, and the copy still reads it (pageable). */
static int pin_refused_child(void *arg)
{
	struct one x;
	static uint8_t want[3000];
	static struct ferry_seg o;
	struct ferry_cqe c;

	(void)arg;
	one_open(&x, "pb2", "pa2", 3000); /* its own pool pinned here, with the region */
	o = (struct ferry_seg){ x.reg, 0, 3000 };
	d_fail("cudaHostRegister", 999, 0, 1);
	t_log_capture(FERRY_LOG_WARN);
	get_segs(x.e, x.peer, "k", &o, 1, 1);
	t_gate_open(&ipc_ready);
	t_expect(x.e, NULL, 1, 0, &c);
	pattern(want, sizeof(want), 41);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 2);
	if (t_health_num(x.e, "\"shm\":{", "peer_pools_refused") != 1 ||
	    t_health_num(x.e, "\"shm\":{", "peer_pools_pinned") != 0 || d_stat("pinned_ranges") != 1 ||
	    !t_log_seen(FERRY_LOG_WARN, "could not be pinned here", "pageable speed"))
		return child_failed(__LINE__, 3);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	one_close(&x);
	return 0;
}

static void test_double_peer_pool_pin_refused(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	static uint8_t data[3000];
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	pid = t_fork(pin_refused_child, NULL);
	a = t_engine("pa2", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "pb2");
	pattern(data, sizeof(data), 41);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	t_put(a, to, "k", data, sizeof(data), 1, FERRY_SQE_WAIT_PEER);
	t_expect(a, NULL, 1, 0, NULL);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	t_gate_close(&ipc_ready);
}

/* The receiver keeps a descriptor (no GET) and is killed: the open PUT fails. */
static int ipc_keep_child(void *arg)
{
	struct ferry_engine *b = t_engine("kb", FERRY_PROGRESS_THREAD, 4u << 20);

	(void)arg;
	t_gate_open(&ipc_ready);
	for (;;)
		pause(); /* killed by the test */
	ferry_engine_destroy(b);
	return 0;
}

static void test_double_ipc_peer_killed(void **state)
{
	struct one x;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	pid = t_fork(ipc_keep_child, NULL);
	one_open(&x, "ka", "kb", 100000);
	pattern(x.mem, 100000, 5);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	warm(x.e, x.peer, 9);
	{
		static struct ferry_seg s;

		s = (struct ferry_seg){ x.reg, 0, 100000 };
		put_seg_timeout(x.e, x.peer, "kept", &s, 1, slow() * 1 * SEC);
	}
	/*
	 * Stored there, never read: our memory is still named by it, so the PUT
	 * stays open past its deadline (1 s: the receiver's RESULT stops it), and
	 * a CANCEL cannot end it.
	 */
	cuda_health_is(x.e, "ipc_puts", 1);
	t_expect_none(x.e, NULL, slow() * 1500);
	{
		struct ferry_sqe *sqe = sqe_wait(x.e);

		ferry_prep_cancel(sqe, 1, 2);
		t_submit(x.e);
	}
	t_expect(x.e, NULL, 2, -EALREADY, NULL);
	t_expect_none(x.e, NULL, 50);
	kill(pid, SIGKILL);
	assert_int_equal(t_reap(pid), 128 + SIGKILL);
	t_expect(x.e, NULL, 1, -ECONNRESET, NULL);
	assert_int_equal(t_health_num(x.e, "\"cuda\":{", "staged_puts"), 0);
	one_close(&x);
	t_gate_close(&ipc_ready);
}

/*
 * The receiver's copy from our device memory takes longer (the double holds
 * it 1.2 s; 5 times as long under valgrind) than the PUT's deadline (400 ms;
 * the same): the PUT ends with 0 after the copy, never with -ETIMEDOUT while
 * the receiver reads our memory.
 */
static int ipc_slow_child(void *arg)
{
	struct one x;
	static uint8_t want[100000];
	static struct ferry_seg o;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	int64_t end;

	(void)arg;
	one_open(&x, "lb", "la", 100000);
	o = (struct ferry_seg){ x.reg, 0, 100000 };
	d_delay(slow() * 1200000);
	sqe = t_sqe(x.e);
	ferry_prep_get_segs(sqe, x.peer, "slow", &o, 1, 1);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	t_submit(x.e);
	t_gate_open(&ipc_ready);
	/* The copy is under way: the sender may try to cancel its PUT now. */
	end = t_now() + 10 * SEC;
	while (t_health_num(x.e, "\"cuda\":{", "in_flight") != 1 && t_now() < end)
		usleep(1000);
	t_gate_open(&ipc_done);
	t_expect(x.e, NULL, 1, 0, &c);
	pattern(want, sizeof(want), 15);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 2);
	t_gate_open(&ipc_ready);
	one_close(&x);
	return 0;
}

static void test_double_ipc_copy_past_deadline(void **state)
{
	struct one x;
	static struct ferry_seg s;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	int64_t t0;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_done);
	pid = t_fork(ipc_slow_child, NULL);
	one_open(&x, "la", "lb", 100000);
	pattern(x.mem, 100000, 15);
	s = (struct ferry_seg){ x.reg, 0, 100000 };
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	warm(x.e, x.peer, 9);
	t0 = t_now();
	put_seg_timeout(x.e, x.peer, "slow", &s, 1, slow() * 400 * MS);
	assert_int_equal(t_gate_wait(&ipc_done, 20000), 0);
	usleep(50000);
	sqe = sqe_wait(x.e);
	ferry_prep_cancel(sqe, 1, 2); /* the receiver reads our memory: too late */
	t_submit(x.e);
	t_expect(x.e, NULL, 2, -EALREADY, NULL);
	t_expect(x.e, NULL, 1, 0, &c);
	assert_int_equal(c.len, 100000);
	assert_true(t_now() - t0 >= slow() * 1000 * MS); /* after the receiver's copy */
	assert_int_equal(t_health_num(x.e, "\"ops\":{", "timeouts"), 0);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	assert_int_equal(t_reap(pid), 0);
	one_close(&x);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_done);
}

/*
 * Fallbacks: a runtime without IPC stages; a handle that does not open at the
 * receiver is sent again staged (the GET waiting, or the descriptor stored first).
 */
static int ipc_fallback_child(void *arg)
{
	struct one x;
	static uint8_t want[100000];
	static struct ferry_seg o;
	struct ferry_cqe c;

	(void)arg;
	one_open(&x, "fb", "fa", 100000);
	o = (struct ferry_seg){ x.reg, 0, 100000 };
	t_gate_open(&ipc_ready);
	/* "staged": from a sender whose runtime has no IPC. */
	get_segs(x.e, x.peer, "staged", &o, 1, 1);
	t_expect(x.e, NULL, 1, 0, &c);
	pattern(want, sizeof(want), 6);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 2);
	if (t_health_num(x.e, "\"cuda\":{", "gets") != 1 ||
	    t_health_num(x.e, "\"cuda\":{", "ipc_gets") != 0)
		return child_failed(__LINE__, 3);
	/*
	 * "ipc": the handle does not open here (the GET waits when the
	 * descriptor comes): the descriptor goes back asking for the data, the
	 * sender stages it through its pool, the same GET takes it.
	 */
	t_log_capture(FERRY_LOG_WARN);
	d_fail("cudaIpcOpenMemHandle", 999, 0, 1);
	get_segs(x.e, x.peer, "ipc", &o, 1, 2);
	t_gate_open(&ipc_done);
	t_expect(x.e, NULL, 2, 0, &c);
	pattern(want, sizeof(want), 7);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 4);
	if (t_health_num(x.e, "\"cuda\":{", "ipc_resends") != 1 ||
	    t_health_num(x.e, "\"cuda\":{", "gets") != 2 || /* staged, into device memory */
	    t_health_num(x.e, "\"cuda\":{", "ipc_gets") != 0 ||
	    t_health_num(x.e, "\"cuda\":{", "ipc_opens") != 0 ||
	    !t_log_seen(FERRY_LOG_WARN, "does not open here", "asked again, staged"))
		return child_failed(__LINE__, 5);
	/* "ipc2": the descriptor is stored before the GET comes; the open fails again. */
	memset(x.mem, 0, 100000);
	if (t_gate_wait(&ipc_ready2, 20000))
		return child_failed(__LINE__, 6);
	d_fail("cudaIpcOpenMemHandle", 998, 0, 1);
	get_segs(x.e, x.peer, "ipc2", &o, 1, 3);
	t_expect(x.e, NULL, 3, 0, &c);
	pattern(want, sizeof(want), 8);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 7);
	if (t_health_num(x.e, "\"cuda\":{", "ipc_resends") != 2 ||
	    t_health_num(x.e, "\"cuda\":{", "gets") != 3)
		return child_failed(__LINE__, 8);
	/* "ipc3": the handle opens: by IPC, as before. */
	get_segs(x.e, x.peer, "ipc3", &o, 1, 4);
	t_expect(x.e, NULL, 4, 0, &c);
	pattern(want, sizeof(want), 9);
	if (c.len != sizeof(want) || memcmp(x.mem, want, sizeof(want)))
		return child_failed(__LINE__, 9);
	if (t_health_num(x.e, "\"cuda\":{", "ipc_gets") != 1 ||
	    t_health_num(x.e, "\"cuda\":{", "ipc_opens") != 1)
		return child_failed(__LINE__, 10);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	t_gate_open(&ipc_ready);
	/* Gone right after the GET: the release queued before its CQE still reaches the sender. */
	one_close(&x);
	return 0;
}

static void test_double_ipc_fallbacks(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *to;
	uint8_t *s1, *s2, *s3;
	struct ferry_region *r1, *r2, *r3;
	pid_t pid;

	(void)state;
	t_gate_init(&ipc_ready);
	t_gate_init(&ipc_ready2);
	t_gate_init(&ipc_done);
	pid = t_fork(ipc_fallback_child, NULL);
	a = t_engine("fa", FERRY_PROGRESS_THREAD, 4u << 20);
	to = t_peer(a, "fb");
	s1 = d_malloc(0, 100000);
	s2 = d_malloc(0, 100000);
	pattern(s1, 100000, 6);
	pattern(s2, 100000, 7);
	d_set_ipc(0); /* a runtime without IPC: the region gets no handle */
	r1 = dev_reg(a, s1, 100000, 0);
	d_set_ipc(1);
	r2 = dev_reg(a, s2, 100000, 0);
	s3 = d_malloc(0, 300000);
	r3 = dev_reg(a, s3, 300000, 0);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_regions"), 2);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	{
		static struct ferry_seg s;

		s = (struct ferry_seg){ r1, 0, 100000 };
		put_segs(a, to, "staged", &s, 1, 1, 0, NULL);
		t_expect(a, NULL, 1, 0, NULL);
	}
	assert_int_equal(t_health_num(a, "\"cuda\":{", "staged_puts"), 1);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_puts"), 0);
	assert_int_equal(t_gate_wait(&ipc_done, 20000), 0);
	{
		static struct ferry_seg s[3];

		pattern(s3, 300000, 8);
		pattern(s3 + 100000, 100000, 9);
		s[0] = (struct ferry_seg){ r2, 0, 100000 };
		put_segs(a, to, "ipc", &s[0], 1, 2, 0, NULL);
		t_expect(a, NULL, 2, 0, NULL); /* sent again staged, then taken */
		assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_restaged"), 1);
		assert_int_equal(t_health_num(a, "\"cuda\":{", "staged_puts"), 2);
		assert_int_equal(t_health_num(a, "\"cuda\":{", "puts"), 2);
		s[1] = (struct ferry_seg){ r3, 0, 100000 };
		put_seg_timeout(a, to, "ipc2", &s[1], 3, 20 * SEC);
		cuda_health_is(a, "ipc_puts", 2);
		t_expect_none(a, NULL, 100); /* stored there, not read yet */
		t_gate_open(&ipc_ready2);
		t_expect(a, NULL, 3, 0, NULL);
		assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_restaged"), 2);
		s[2] = (struct ferry_seg){ r3, 100000, 100000 };
		put_segs(a, to, "ipc3", &s[2], 1, 4, 0, NULL);
		t_expect(a, NULL, 4, 0, NULL);
	}
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_puts"), 3);
	assert_int_equal(t_health_num(a, "\"cuda\":{", "ipc_restaged"), 2);
	assert_int_equal(t_gate_wait(&ipc_ready, 20000), 0);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(a);
	d_free(s1);
	d_free(s2);
	d_free(s3);
	t_gate_close(&ipc_ready);
	t_gate_close(&ipc_ready2);
	t_gate_close(&ipc_done);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_double_device_to_device),
		cmocka_unit_test(test_double_device_and_host),
		cmocka_unit_test(test_double_caller_stream_first),
		cmocka_unit_test(test_double_caller_event_first),
		cmocka_unit_test(test_double_sleeping_reactor_woken),
		cmocka_unit_test(test_double_spinning_reactor_no_host_fn),
		cmocka_unit_test(test_double_injected_errors),
		cmocka_unit_test(test_double_refusals),
		cmocka_unit_test(test_double_no_device),
		cmocka_unit_test(test_double_destroy_in_flight),
		cmocka_unit_test(test_double_two_processes_shm),
		cmocka_unit_test(test_double_empty_and_many),
		cmocka_unit_test(test_double_more_than_jobs),
		cmocka_unit_test(test_double_manual_progress),
		cmocka_unit_test(test_double_pipelined_over_tcp),
		cmocka_unit_test(test_double_ipc_device_to_device),
		cmocka_unit_test(test_double_ipc_pingpong),
		cmocka_unit_test(test_double_ipc_device_buffer),
		cmocka_unit_test(test_double_ipc_device_buffers_leave_slots),
		cmocka_unit_test(test_double_ipc_to_no_runtime),
		cmocka_unit_test(test_double_ipc_get_when_jobs_busy),
		cmocka_unit_test(test_double_peer_pool_pin_refused),
		cmocka_unit_test(test_double_ipc_peer_killed),
		cmocka_unit_test(test_double_ipc_copy_past_deadline),
		cmocka_unit_test(test_double_ipc_fallbacks),
	};

	signal(SIGPIPE, SIG_IGN);
	printf("test_cuda_double: a TEST DOUBLE of the CUDA runtime (%s), not a GPU\n",
	       FERRY_CUDA_DOUBLE);
	return t_run_group_apart(tests, setup, NULL);
}

/*
 * tests/test_rdma_cuda.c - GPUDirect RDMA: CUDA device memory registered
 * with the NIC through its dma-buf, read in place by the peer's NIC and
 * written straight into a GET's device memory, on real verbs in ferry's
 * RDMA test guest (tests/rdma-vm/: two Soft-RoCE devices, $RDMA_IP0 on
 * rxe0, $RDMA_IP1 on rxe1); it skips (77) anywhere else.
 *
 * Two TEST DOUBLES stand in for what this guest does not have, and nothing
 * here is a GPU or GPUDirect result:
 *   - the CUDA runtime and driver: tests/cuda_double/ ("device memory" is
 *     host memory, a memfd per allocation; cuMemGetHandleForAddressRange
 *     hands out a duplicate of that memfd as the "dma-buf");
 *   - a NIC's dma-buf registration: Soft-RoCE has none (its
 *     ibv_reg_dmabuf_mr fails), so this file defines ibv_reg_dmabuf_mr,
 *     which ferry (linked statically into this program) calls: with
 *     dmabuf_double on, it maps the descriptor ferry passes at the offset
 *     ferry passes (where the double says that range starts) and registers
 *     that mapping with the real device at the iova ferry passes
 *     (ibv_reg_mr_iova). Soft-RoCE then really moves the bytes, reading and
 *     writing the "device memory" through that mapping: a wrong descriptor,
 *     offset, length or iova from ferry fails the registration, a READ, or
 *     the data checks. With dmabuf_double off it calls the real one.
 *
 * What is checked: the real Soft-RoCE refuses dma-buf registration and
 * ferry says why (health rdma.gpudirect_why) and stages device memory
 * through the pool as before; with the double, a device PUT (three
 * segments, unaligned, one empty) is announced from where it is and READ
 * by the receiver straight into a parked GET's device segments (no
 * staging copy at either end: cuda staged_puts, bytes_d2h and gets stay
 * 0); a small device PUT is announced too (never copied by the CPU into
 * an eager message); data that arrives before its device GET is copied in
 * by the memory domain; a PUT behind the caller's CUDA stream is not
 * announced before that stream's work is done; a driver without dma-buf
 * export is told and staged; every dma-buf descriptor is closed when its
 * region is released.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "rdma_helpers.h"

#ifdef FERRY_HAVE_RDMA_TRANSPORT
#include <infiniband/verbs.h>

#define SECRET "rdma-cuda-secret"
#define NSP "rdmacuda"
#define MIB (1024ull * 1024ull)

static char ip0[64], ip1[64];
/* Engines made by mk() get these (0: the defaults); test_rdma_filling_stalls sets them. */
static uint32_t hb_ms, peer_to_ms;
static void *dbl;
static void *(*d_malloc)(int dev, size_t n);
static void (*d_free)(void *p);
static uint64_t (*d_stat)(const char *name);
static void (*d_set_dmabuf)(int on);
static int (*d_origin)(int fd, uint64_t *at);
static void (*d_gate_close)(void);
static void (*d_gate_open)(void);
static int (*d_gate)(void *st);
static int (*d_stream_create)(void **st, unsigned flags);
static int (*d_stream_destroy)(void *st);
static int (*d_memcpy_async)(void *dst, const void *src, size_t n, int kind, void *st);
static void (*d_delay)(unsigned us);
static void (*d_fail_copy_after)(int skip, int err);

/* ---- the TEST DOUBLE of a NIC's dma-buf registration ---------------------- */

static _Atomic int dmabuf_double;    /* on: the double below; off: the real one */
static _Atomic int dmabuf_double_regs; /* registrations the double made */
static struct {
	struct ibv_mr *mr;
	void *map;
	size_t len;
} dbl_maps[64];
static pthread_mutex_t dbl_lock = PTHREAD_MUTEX_INITIALIZER;

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
				 int fd, int access)
{
	static struct ibv_mr *(*real)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	uint64_t at, page = (uint64_t)sysconf(_SC_PAGESIZE), start, skip;
	struct ibv_mr *mr;
	void *map;

	if (!atomic_load(&dmabuf_double)) {
		if (!real)
			*(void **)&real = dlsym(RTLD_NEXT, "ibv_reg_dmabuf_mr");
		if (!real) {
			errno = ENOSYS;
			return NULL;
		}
		return real(pd, offset, length, iova, fd, access);
	}
	if (d_origin(fd, &at)) {
		errno = EBADF; /* not a descriptor the driver exported */
		return NULL;
	}
	start = (at + offset) & ~(page - 1);
	skip = at + offset - start;
	map = mmap(NULL, skip + length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (map == MAP_FAILED)
		return NULL;
	mr = ibv_reg_mr_iova(pd, (char *)map + skip, length, iova, access);
	if (!mr) {
		int err = errno;

		munmap(map, skip + length);
		errno = err;
		return NULL;
	}
	pthread_mutex_lock(&dbl_lock);
	for (unsigned i = 0; i < 64; i++) {
		if (!dbl_maps[i].mr) {
			dbl_maps[i].mr = mr;
			dbl_maps[i].map = map;
			dbl_maps[i].len = skip + length;
			break;
		}
	}
	pthread_mutex_unlock(&dbl_lock);
	atomic_fetch_add(&dmabuf_double_regs, 1);
	return mr;
}

/* Every deregistration passes here: the double's mappings go with their MRs. */
int ibv_dereg_mr(struct ibv_mr *mr)
{
	static int (*real)(struct ibv_mr *);
	void *map = NULL;
	size_t len = 0;
	int rc;

	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "ibv_dereg_mr");
	pthread_mutex_lock(&dbl_lock);
	for (unsigned i = 0; i < 64; i++) {
		if (dbl_maps[i].mr == mr) {
			map = dbl_maps[i].map;
			len = dbl_maps[i].len;
			dbl_maps[i].mr = NULL;
		}
	}
	pthread_mutex_unlock(&dbl_lock);
	rc = real(mr);
	if (map)
		munmap(map, len);
	return rc;
}

/* ---- engines, regions, data ------------------------------------------------- */

#define SYM(v, name) assert_non_null((*(void **)&(v) = dlsym(dbl, name)))

static struct ferry_engine *mk(const char *name, const char *ip)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	char listen[96];
	int rc;

	snprintf(listen, sizeof(listen), "rdma://%s:0", ip);
	p.name = name;
	p.ns = NSP;
	p.pool_size = 32 * MIB;
	p.progress = FERRY_PROGRESS_THREAD;
	p.spin_ns = 20000;
	p.rdma_listen = listen;
	p.secret = SECRET;
	p.handshake_ms = t_handshake_ms();
	p.heartbeat_ms = hb_ms;
	p.peer_timeout_ms = peer_to_ms;
	rc = ferry_engine_create(&p, &e);
	if (rc)
		fail_msg("engine %s: %s", name, ferry_strerror(rc));
	return e;
}

static long long ch(struct ferry_engine *e, const char *name)
{
	return t_health_num(e, "\"cuda\":{", name);
}

/* The text of rdma.gpudirect_why in e's health. */
static const char *gpudirect_why(struct ferry_engine *e)
{
	static char h[65536], why[256];
	const char *s;

	assert_true(ferry_engine_health(e, h, sizeof(h)) < (int)sizeof(h));
	s = strstr(h, "\"gpudirect_why\":\"");
	assert_non_null(s);
	s += strlen("\"gpudirect_why\":\"");
	snprintf(why, sizeof(why), "%.*s", (int)strcspn(s, "\""), s);
	return why;
}

static struct ferry_region *dev_reg(struct ferry_engine *e, void *p, size_t len)
{
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;

	rp.addr = p;
	rp.len = len;
	rp.mem = FERRY_MEM_CUDA;
	rp.device = 0;
	assert_int_equal(ferry_region_register(e, &rp, &r), 0);
	return r;
}

static void put_segs(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		     const struct ferry_seg *s, unsigned n, uint64_t ud, int wait_kind, void *wait)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_put_segs(sqe, to, key, s, n, ud);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	if (wait_kind)
		ferry_sqe_set_cuda_wait(sqe, wait_kind, wait);
	t_submit(e);
}

static void get_segs(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		     const struct ferry_seg *s, unsigned n, uint64_t ud)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_get_segs(sqe, from, key, s, n, ud);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	t_submit(e);
}

/* Open descriptors of this process. */
static int open_fds(void)
{
	return t_count_files("/proc/self/fd");
}

/* The double's registrations still mapped (each until its MR is deregistered). */
static int double_maps(void)
{
	int n = 0;

	pthread_mutex_lock(&dbl_lock);
	for (unsigned i = 0; i < 64; i++)
		n += dbl_maps[i].mr != NULL;
	pthread_mutex_unlock(&dbl_lock);
	return n;
}

/*
 * a (on RDMA_IP1) and b (on RDMA_IP0), connected (a host PUT went a -> b),
 * each with a device allocation registered: src (n bytes) at a, dst at b.
 */
struct pair {
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;
	uint8_t *src, *dst;
	size_t n;
	struct ferry_region *rs, *rd;
};

static void pair_open(struct pair *p, size_t n)
{
	uint8_t one = 1, got = 0;

	p->a = mk("a", ip1);
	p->b = mk("b", ip0);
	p->ab = peer_at(p->a, "b", p->b);
	p->ba = t_peer(p->b, "a");
	t_put(p->a, p->ab, "hello", &one, 1, 90, 0);
	t_expect(p->a, NULL, 90, 0, NULL);
	t_get(p->b, p->ba, "hello", t_iov_of(&got, 1), 1, 91, 0, 10 * SEC);
	t_expect(p->b, NULL, 91, 0, NULL);
	p->n = n;
	p->src = d_malloc(0, n);
	p->dst = d_malloc(0, n);
	assert_non_null(p->src);
	assert_non_null(p->dst);
	p->rs = dev_reg(p->a, p->src, n);
	p->rd = dev_reg(p->b, p->dst, n);
}

static void pair_close(struct pair *p)
{
	if (p->rs)
		assert_int_equal(ferry_region_release(&p->rs), 0);
	if (p->rd)
		assert_int_equal(ferry_region_release(&p->rd), 0);
	assert_int_equal(rh(p->a, "malformed"), 0);
	assert_int_equal(rh(p->b, "malformed"), 0);
	ferry_engine_destroy(p->a);
	ferry_engine_destroy(p->b);
	d_free(p->src);
	d_free(p->dst);
}

/* ---- the cases ---------------------------------------------------------------- */

/*
 * GPUDirect refused (pair p open): health says why (both of why_has in
 * gpudirect_why), a further region is not asked for a dma-buf again (the
 * double's counter stat unchanged), and a device PUT still arrives whole,
 * staged through the pool.
 */
static void refused_then_staged(struct pair *p, const char *why_has, const char *why_also,
				const char *stat, unsigned seed)
{
	static uint8_t got[MIB + 333];
	struct ferry_seg s = { p->rs, 0, p->n };
	const char *why = gpudirect_why(p->a);
	uint64_t asked = d_stat(stat);
	struct ferry_region *r2;

	assert_true(p->n <= sizeof(got));
	assert_int_equal(rh(p->a, "gpudirect_regions"), 0);
	if (!strstr(why, why_has) || !strstr(why, why_also))
		fail_msg("gpudirect_why: \"%s\"", why);
	r2 = dev_reg(p->a, p->src, 4096); /* refused for good: not asked again */
	assert_int_equal(d_stat(stat), asked);
	assert_int_equal(ferry_region_release(&r2), 0);
	pattern(p->src, p->n, seed);
	put_segs(p->a, p->ab, "staged", &s, 1, 1, 0, NULL);
	t_expect(p->a, NULL, 1, 0, NULL);
	t_get(p->b, p->ba, "staged", t_iov_of(got, p->n), 1, 2, 0, 10 * SEC);
	t_expect(p->b, NULL, 2, 0, NULL);
	assert_true(pattern_ok(got, p->n, seed));
	assert_int_equal(ch(p->a, "staged_puts"), 1);
	assert_int_equal(ch(p->a, "direct_puts"), 0);
	assert_int_equal(rh(p->a, "gpudirect_puts"), 0);
}

/*
 * The real Soft-RoCE: ferry asks the driver for the dma-buf, the device
 * refuses to register it, health says so, and device memory goes staged
 * through the pool as it did before GPUDirect (the data arrives whole).
 */
static void test_gpudirect_refused_by_device(void **state)
{
	struct pair p;

	(void)state;
	atomic_store(&dmabuf_double, 0);
	pair_open(&p, MIB + 333);
	assert_true(d_stat("dmabuf_exports") >= 2); /* asked, at both ends */
	refused_then_staged(&p, "ibv_reg_dmabuf_mr", "rxe", "dmabuf_exports", 3);
	pair_close(&p);
}

/*
 * With the NIC's dma-buf registration doubled: device segments announced
 * where they are and READ by the receiver straight into a parked GET's
 * device segments; neither end's memory domain copies a byte.
 */
static void test_gpudirect_device_to_device(void **state)
{
	const size_t n = 4 * MIB + 5000;
	struct pair p;
	struct ferry_seg src[3], dst[2];
	struct ferry_cqe c;
	uint8_t *tmp = malloc(n);
	size_t len0 = 300 * 1024 + 77, len2 = 2 * MIB + 999, total = len0 + len2;
	int fds;

	(void)state;
	assert_non_null(tmp);
	atomic_store(&dmabuf_double, 1);
	pair_open(&p, n);
	fds = open_fds();
	assert_int_equal(rh(p.a, "gpudirect_regions"), 1);
	assert_int_equal(rh(p.b, "gpudirect_regions"), 1);
	assert_string_equal(gpudirect_why(p.a), "");
	assert_true(atomic_load(&dmabuf_double_regs) >= 4); /* a region per engine, per device */
	pattern(p.src, n, 0);
	memset(p.dst, 0xa5, n);
	/* Out of order, unaligned, one empty; into two device segments of b at odd offsets. */
	src[0] = (struct ferry_seg){ p.rs, 123457, len0 };
	src[1] = (struct ferry_seg){ p.rs, 0, 0 };
	src[2] = (struct ferry_seg){ p.rs, 1001, len2 };
	dst[0] = (struct ferry_seg){ p.rd, 99, MIB + 1 };
	dst[1] = (struct ferry_seg){ p.rd, 2 * MIB, total - (MIB + 1) };
	get_segs(p.b, p.ba, "kv", dst, 2, 2);
	t_expect_none(p.b, NULL, 50); /* parked */
	put_segs(p.a, p.ab, "kv", src, 3, 1, 0, NULL);
	t_expect(p.a, NULL, 1, 0, NULL);
	t_expect(p.b, NULL, 2, 0, &c);
	assert_int_equal(c.len, total);
	assert_null(c.buf);
	memcpy(tmp, p.src + src[0].offset, len0);
	memcpy(tmp + len0, p.src + src[2].offset, len2);
	if (memcmp(p.dst + dst[0].offset, tmp, dst[0].len) ||
	    memcmp(p.dst + dst[1].offset, tmp + dst[0].len, dst[1].len))
		fail_msg("the device segments arrived changed");
	assert_int_equal(p.dst[98], 0xa5); /* nothing around them written */
	assert_int_equal(p.dst[dst[0].offset + dst[0].len], 0xa5);
	assert_int_equal(p.dst[dst[1].offset - 1], 0xa5);
	assert_int_equal(p.dst[dst[1].offset + dst[1].len], 0xa5);
	/* In place at a, straight in at b: no staging copy anywhere. */
	assert_int_equal(rh(p.a, "gpudirect_puts"), 1);
	assert_int_equal(rh(p.b, "read_into_get"), 1);
	assert_int_equal(ch(p.a, "direct_puts"), 1);
	assert_int_equal(ch(p.a, "staged_puts"), 0);
	assert_int_equal(ch(p.a, "bytes_d2h"), 0);
	assert_int_equal(ch(p.b, "gets"), 0);
	assert_int_equal(ch(p.b, "bytes_h2d"), 0);
	/*
	 * A region of an allocation registered before borrows that registration
	 * (no dma-buf, no memory registration: as pyferry registers one per op),
	 * and a PUT from it is read in place too.
	 */
	assert_int_equal(double_maps(), 4);
	{
		uint64_t exports = d_stat("dmabuf_exports");
		struct ferry_region *r2 = dev_reg(p.a, p.src + 4096, 65536);
		struct ferry_seg s2 = { r2, 100, 5000 }, d2 = { p.rd, 0, 5000 };

		assert_int_equal(d_stat("dmabuf_exports"), exports);
		assert_int_equal(double_maps(), 4);
		assert_int_equal(rh(p.a, "gpudirect_regions"), 2);
		assert_int_equal(rh(p.a, "gpudirect_cached"), 1);
		get_segs(p.b, p.ba, "sub", &d2, 1, 4);
		put_segs(p.a, p.ab, "sub", &s2, 1, 3, 0, NULL);
		t_expect(p.a, NULL, 3, 0, NULL);
		t_expect(p.b, NULL, 4, 0, NULL);
		assert_memory_equal(p.dst, p.src + 4096 + 100, 5000);
		assert_int_equal(rh(p.a, "gpudirect_puts"), 2);
		assert_int_equal(ferry_region_release(&r2), 0);
	}
	/*
	 * Released, the regions leave their allocations' registrations cached a
	 * while (RDMA_GD_IDLE_NS), then those go: each dma-buf descriptor closed,
	 * every mapping with its MR.
	 */
	assert_int_equal(ferry_region_release(&p.rs), 0);
	assert_int_equal(ferry_region_release(&p.rd), 0);
	assert_int_equal(rh(p.a, "gpudirect_regions"), 0);
	assert_int_equal(rh(p.a, "gpudirect_cached"), 1);
	{
		int64_t end = t_now() + 30 * SEC;

		while ((double_maps() || rh(p.a, "gpudirect_cached") || rh(p.b, "gpudirect_cached")) &&
		       t_now() < end)
			usleep(20000);
	}
	assert_int_equal(double_maps(), 0);
	assert_int_equal(rh(p.a, "gpudirect_cached"), 0);
	assert_int_equal(open_fds(), fds - 2);
	pair_close(&p);
	free(tmp);
}

/*
 * A small device PUT is announced too (the CPU never copies device memory
 * into an eager message), into a host GET at b; data that arrives before
 * its device GET is stored, then copied in by b's memory domain.
 */
static void test_gpudirect_small_and_stored(void **state)
{
	struct pair p;
	struct ferry_seg s, d;
	uint8_t host[200];
	long long eager;

	(void)state;
	atomic_store(&dmabuf_double, 1);
	pair_open(&p, 64 * 1024);
	pattern(p.src, p.n, 5);
	memset(p.dst, 0, p.n);
	eager = rh(p.a, "eager");
	s = (struct ferry_seg){ p.rs, 7, 100 };
	put_segs(p.a, p.ab, "small", &s, 1, 1, 0, NULL);
	t_expect(p.a, NULL, 1, 0, NULL);
	assert_int_equal(rh(p.a, "eager"), eager);
	assert_int_equal(rh(p.a, "gpudirect_puts"), 1);
	t_get(p.b, p.ba, "small", t_iov_of(host, sizeof(host)), 1, 2, 0, 10 * SEC);
	t_expect(p.b, NULL, 2, 0, NULL);
	assert_memory_equal(host, p.src + 7, 100);
	/* Stored first (no GET yet), then a device GET: the domain copies it in. */
	s = (struct ferry_seg){ p.rs, 4096, 40000 };
	put_segs(p.a, p.ab, "stored", &s, 1, 3, 0, NULL);
	t_expect(p.a, NULL, 3, 0, NULL);
	d = (struct ferry_seg){ p.rd, 10, 40000 };
	get_segs(p.b, p.ba, "stored", &d, 1, 4);
	t_expect(p.b, NULL, 4, 0, NULL);
	assert_memory_equal(p.dst + 10, p.src + 4096, 40000);
	assert_int_equal(ch(p.b, "gets"), 1);
	assert_int_equal(ch(p.a, "staged_puts"), 0);
	assert_int_equal(ch(p.a, "direct_puts"), 2);
	pair_close(&p);
}

/*
 * A PUT behind the caller's CUDA stream: nothing is announced (the peer's
 * NIC could read the old bytes) until the stream's work, which writes
 * the tensor, is done.
 */
static void test_gpudirect_caller_stream(void **state)
{
	struct pair p;
	struct ferry_seg s, d;
	static uint8_t fresh[256 * 1024];
	void *st = NULL;

	(void)state;
	atomic_store(&dmabuf_double, 1);
	pair_open(&p, sizeof(fresh));
	pattern(p.src, p.n, 6);      /* before the producer's work */
	pattern(fresh, p.n, 7);      /* what its work writes */
	memset(p.dst, 0, p.n);
	assert_int_equal(d_stream_create(&st, 1), 0);
	d_gate_close();
	assert_int_equal(d_gate(st), 0);
	assert_int_equal(d_memcpy_async(p.src, fresh, sizeof(fresh), 4, st), 0);
	d = (struct ferry_seg){ p.rd, 0, p.n };
	get_segs(p.b, p.ba, "t", &d, 1, 2);
	s = (struct ferry_seg){ p.rs, 0, p.n };
	put_segs(p.a, p.ab, "t", &s, 1, 1, FERRY_CUDA_WAIT_STREAM, st);
	t_expect_none(p.a, NULL, 200);
	t_expect_none(p.b, NULL, 50);
	assert_int_equal(rh(p.a, "gpudirect_puts"), 0); /* not announced */
	d_gate_open();
	t_expect(p.a, NULL, 1, 0, NULL);
	t_expect(p.b, NULL, 2, 0, NULL);
	assert_memory_equal(p.dst, fresh, sizeof(fresh));
	assert_int_equal(rh(p.a, "gpudirect_puts"), 1);
	assert_int_equal(ch(p.a, "direct_puts"), 1);
	assert_int_equal(ch(p.a, "bytes_d2h"), 0);
	d_stream_destroy(st);
	pair_close(&p);
}

/* A driver without dma-buf export: told in health, the region staged, nothing else changes. */
static void test_gpudirect_no_export(void **state)
{
	struct pair p;

	(void)state;
	atomic_store(&dmabuf_double, 1);
	d_set_dmabuf(0);
	pair_open(&p, 100000);
	assert_int_equal(atomic_load(&dmabuf_double_regs), 0);
	refused_then_staged(&p, "cuMemGetHandleForAddressRange", "not supported", "dmabuf_asked", 8);
	pair_close(&p);
	d_set_dmabuf(1);
}

/* Wait (60 s at most: the guest is slow) until e's health section.name reaches want. */
static void health_reaches(struct ferry_engine *e, const char *section, const char *name,
			   long long want)
{
	int64_t end = t_now() + 60 * SEC;

	while (t_health_num(e, section, name) < want && t_now() < end)
		usleep(5000);
	if (t_health_num(e, section, name) < want)
		fail_msg("health %s%s stays below %lld", section, name, want);
}

/*
 * Staged device memory over rdma (the real rxe: no GPUDirect) is
 * pipelined: announced once its first part is copied into the pool (each
 * "copy" of the double takes 300 ms here), the receiver READing only what
 * the sender's RM_FILLED messages say is there; the data arrives whole. A
 * copy that fails after the announcement: the receiver answers -EIO,
 * delivers nothing, and the connection stays (nothing malformed).
 */
static void test_rdma_pipelined_staging(void **state)
{
	const size_t n = (24u << 20) + 777; /* four pieces of the domain's copies */
	struct pair p;
	struct ferry_seg s;
	struct ferry_cqe c;
	uint8_t *got = malloc(n);

	(void)state;
	assert_non_null(got);
	atomic_store(&dmabuf_double, 0);
	pair_open(&p, n);
	assert_int_equal(rh(p.a, "gpudirect_regions"), 0);
	pattern(p.src, n, 21);
	d_delay(300000);
	s = (struct ferry_seg){ p.rs, 0, n };
	put_segs(p.a, p.ab, "piped", &s, 1, 1, 0, NULL);
	health_reaches(p.a, "\"cuda\":{", "pipelined_puts", 1);
	assert_int_equal(ch(p.a, "in_flight"), 1); /* announced while it still copies */
	t_get(p.b, p.ba, "piped", t_iov_of(got, n), 1, 2, 0, 120 * SEC);
	assert_true(t_wait_cqe(p.a, NULL, &c, 120 * SEC));
	assert_int_equal(c.user_data, 1);
	assert_int_equal(c.res, 0);
	assert_true(t_wait_cqe(p.b, NULL, &c, 120 * SEC));
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, n);
	assert_true(pattern_ok(got, n, 21));
	/* A copy fails after the announcement: -EIO, nothing delivered, the connection stays. */
	t_log_capture(FERRY_LOG_ERROR);
	d_fail_copy_after(1, 719);
	put_segs(p.a, p.ab, "broken", &s, 1, 3, 0, NULL);
	assert_true(t_wait_cqe(p.a, NULL, &c, 120 * SEC));
	assert_int_equal(c.user_data, 3);
	assert_int_equal(c.res, -EIO);
	t_get(p.b, p.ba, "broken", t_iov_of(got, n), 1, 4, FERRY_SQE_NOWAIT, 0);
	t_expect(p.b, NULL, 4, -EAGAIN, NULL);
	assert_int_equal(ch(p.a, "pipelined_puts"), 2);
	assert_int_equal(rh(p.a, "connections_ready"), 1);
	assert_int_equal(t_health_num(p.a, "\"pool\":{", "bytes_in_use"), 0);
	assert_int_equal(t_health_num(p.b, "\"pool\":{", "bytes_in_use"), 0);
	d_delay(0);
	pair_close(&p);
	free(got);
}

/*
 * A sender whose block stops filling (each "copy" takes 1.5 s here, the
 * engines' peer_timeout_ms is 1 s): the receiver refuses that PUT once it
 * has heard nothing more for peer_timeout_ms (-ETIMEDOUT, logged), delivers
 * nothing, and keeps the connection; the sender's PUT ends with that
 * result once its copies are done.
 */
static void test_rdma_filling_stalls(void **state)
{
	const size_t n = (24u << 20) + 777;
	struct pair p;
	struct ferry_seg s;
	struct ferry_cqe c;
	uint8_t *got = malloc(n);

	(void)state;
	assert_non_null(got);
	atomic_store(&dmabuf_double, 0);
	hb_ms = 200;
	peer_to_ms = 1000;
	pair_open(&p, n);
	pattern(p.src, n, 22);
	d_delay(1500000);
	s = (struct ferry_seg){ p.rs, 0, n };
	put_segs(p.a, p.ab, "stalled", &s, 1, 1, 0, NULL);
	assert_true(t_wait_cqe(p.a, NULL, &c, 120 * SEC));
	assert_int_equal(c.user_data, 1);
	assert_int_equal(c.res, -ETIMEDOUT);
	assert_int_equal(ch(p.a, "in_flight"), 0); /* (its CQE came after its copies) */
	assert_true(t_log_seen(FERRY_LOG_WARN, "said nothing more of a block", NULL));
	t_get(p.b, p.ba, "stalled", t_iov_of(got, n), 1, 2, FERRY_SQE_NOWAIT, 0);
	t_expect(p.b, NULL, 2, -EAGAIN, NULL);
	assert_int_equal(rh(p.b, "malformed"), 0);
	assert_int_equal(rh(p.a, "connections_ready"), 1);
	d_delay(0);
	/* The connection still carries: a small PUT arrives. */
	t_put(p.a, p.ab, "after", "x", 1, 3, 0);
	t_expect(p.a, NULL, 3, 0, NULL);
	t_get(p.b, p.ba, "after", t_iov_of(got, 1), 1, 4, 0, 10 * SEC);
	t_expect(p.b, NULL, 4, 0, NULL);
	pair_close(&p);
	free(got);
}

/* Each case runs in a process of its own: the double is loaded here, as ferry loads it. */
static int setup(void **state)
{
	(void)state;
	t_log_capture(FERRY_LOG_INFO);
	setenv("FERRY_CUDA_RUNTIME", FERRY_CUDA_DOUBLE, 1);
	dbl = dlopen(FERRY_CUDA_DOUBLE, RTLD_NOW | RTLD_LOCAL);
	assert_non_null(dbl);
	SYM(d_malloc, "cudadouble_malloc");
	SYM(d_free, "cudadouble_free");
	SYM(d_stat, "cudadouble_stat");
	SYM(d_set_dmabuf, "cudadouble_set_dmabuf");
	SYM(d_origin, "cudadouble_dmabuf_origin");
	SYM(d_gate_close, "cudadouble_gate_close");
	SYM(d_gate_open, "cudadouble_gate_open");
	SYM(d_gate, "cudadouble_gate");
	SYM(d_stream_create, "cudaStreamCreateWithFlags");
	SYM(d_stream_destroy, "cudaStreamDestroy");
	SYM(d_memcpy_async, "cudaMemcpyAsync");
	SYM(d_delay, "cudadouble_set_copy_delay_us");
	SYM(d_fail_copy_after, "cudadouble_fail_copy_after");
	return 0;
}

int main(void)
{
	static const struct CMUnitTest cases[] = {
		cmocka_unit_test_setup(test_gpudirect_refused_by_device, setup),
		cmocka_unit_test_setup(test_gpudirect_device_to_device, setup),
		cmocka_unit_test_setup(test_gpudirect_small_and_stored, setup),
		cmocka_unit_test_setup(test_gpudirect_caller_stream, setup),
		cmocka_unit_test_setup(test_gpudirect_no_export, setup),
		cmocka_unit_test_setup(test_rdma_pipelined_staging, setup),
		cmocka_unit_test_setup(test_rdma_filling_stalls, setup),
	};

	if (!rdma_guest_ips("test_rdma_cuda", ip0, ip1, sizeof(ip0)))
		return 77;
	return t_run_cases_apart("test_rdma_cuda", cases, sizeof(cases) / sizeof(cases[0]), NULL,
				 NULL);
}

#else

int main(void)
{
	printf("test_rdma_cuda: SKIP (this build has no rdma transport: libibverbs-dev, "
	       "librdmacm-dev)\n");
	return 77;
}

#endif

/*
 * tests/test_pool.c - the memory pool allocator (pool/pool.c).
 *
 * Every test arms an alarm (FERRY_TEST_TIMEOUT seconds, default 120) so a
 * hang kills the run instead of stalling it. Randomised tests use a fixed
 * seed (FERRY_TEST_SEED overrides it) and print it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "pool.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

/* ------------------------------------------------------------------ */
/* Harness                                                             */
/* ------------------------------------------------------------------ */

static atomic_int log_errors, log_warns;

static void log_sink(int level, const char *line, void *arg)
{
	(void)arg;
	if (level == FERRY_LOG_ERROR)
		atomic_fetch_add(&log_errors, 1);
	else if (level == FERRY_LOG_WARN)
		atomic_fetch_add(&log_warns, 1);
	if (getenv("FERRY_TEST_VERBOSE"))
		fprintf(stderr, "log[%d]: %s\n", level, line);
}

static int setup(void **state)
{
	const char *t = getenv("FERRY_TEST_TIMEOUT");

	(void)state;
	ferry_log_set(FERRY_LOG_DEBUG, log_sink, NULL);
	atomic_store(&log_errors, 0);
	atomic_store(&log_warns, 0);
	alarm(t ? (unsigned int)atoi(t) : 120);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	alarm(0);
	return 0;
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static uint64_t seed_init(const char *test)
{
	const char *s = getenv("FERRY_TEST_SEED");
	uint64_t seed = s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull;

	print_message("%s: seed %#llx\n", test, (unsigned long long)seed);
	rng_state = seed ? seed : 1;
	return seed;
}

/* A size in 0..1 MiB, skewed to small. */
static size_t skewed_size(uint64_t (*r)(void *), void *ctx)
{
	uint64_t x = r(ctx), k = x % 100;

	x >>= 8;
	if (k < 70)
		return (size_t)(x % (POOL_SMALL_MAX + 1));
	if (k < 95)
		return (size_t)(POOL_SMALL_MAX + 1 + x % (64 * KiB - POOL_SMALL_MAX));
	return (size_t)(64 * KiB + 1 + x % (MiB - 64 * KiB));
}

static uint64_t rnd_ctx(void *ctx)
{
	(void)ctx;
	return rnd();
}

static size_t expected_cap(size_t len)
{
	size_t c = POOL_SMALL_MIN;

	if (len > POOL_SMALL_MAX)
		return (len + POOL_PAGE_SIZE - 1) & ~(size_t)(POOL_PAGE_SIZE - 1);
	while (c < len)
		c *= 2;
	return c;
}

/*
 * Fill a block with a pattern derived from seed: every byte of a block up
 * to 4 KiB, else 64 bytes at the start of every page and the last 64 bytes.
 */
static inline uint8_t pat(uint32_t seed, size_t i)
{
	return (uint8_t)((seed * 2654435761u) >> 24 ^ (i * 131) ^ (i >> 8));
}

static void pattern_apply(uint8_t *d, size_t cap, uint32_t seed, int check, int *bad)
{
	size_t i, pg;

	if (cap <= POOL_PAGE_SIZE) {
		for (i = 0; i < cap; i++) {
			if (!check)
				d[i] = pat(seed, i);
			else if (d[i] != pat(seed, i))
				*bad = 1;
		}
		return;
	}
	for (pg = 0; pg < cap; pg += POOL_PAGE_SIZE)
		for (i = pg; i < pg + 64; i++) {
			if (!check)
				d[i] = pat(seed, i);
			else if (d[i] != pat(seed, i))
				*bad = 1;
		}
	for (i = cap - 64; i < cap; i++) {
		if (!check)
			d[i] = pat(seed, i);
		else if (d[i] != pat(seed, i))
			*bad = 1;
	}
}

static void pattern_fill(uint8_t *d, size_t cap, uint32_t seed)
{
	pattern_apply(d, cap, seed, 0, NULL);
}

static int pattern_ok(const uint8_t *d, size_t cap, uint32_t seed)
{
	int bad = 0;

	pattern_apply((uint8_t *)d, cap, seed, 1, &bad);
	return !bad;
}

static struct pool *mkpool(size_t size, uint32_t max_bufs)
{
	struct pool_params prm = { .size = size, .max_bufs = max_bufs, .name = "test" };
	struct pool *p = NULL;

	assert_int_equal(pool_create(&prm, &p), 0);
	assert_non_null(p);
	return p;
}

static struct pool_stats stats(struct pool *p)
{
	struct pool_stats st;

	pool_get_stats(p, &st);
	return st;
}

/* ------------------------------------------------------------------ */
/* Creation                                                            */
/* ------------------------------------------------------------------ */

static void test_create_destroy(void **state)
{
	struct pool_params prm = { .size = 5000, .name = "ferry-t1", .prefault = 1 };
	struct pool *p = NULL;
	struct pool_stats st;
	char path[64], link[128];
	ssize_t n;
	int fd;

	(void)state;
	assert_int_equal(pool_create(&prm, &p), 0);
	assert_int_equal(pool_size(p), 8192);
	assert_non_null(pool_base(p));
	fd = pool_fd(p);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	assert_true(n > 0);
	link[n] = '\0';
	assert_non_null(strstr(link, "memfd:ferry-t1"));
	/* The region is shared memory backed by the memfd. */
	memset(pool_base(p), 0xab, 8192);
	assert_int_equal(lseek(fd, 0, SEEK_END), 8192);

	st = stats(p);
	assert_int_equal(st.size, 8192);
	assert_int_equal(st.free_bytes, 8192);
	assert_int_equal(st.largest_free, 8192);
	assert_int_equal(st.blocks_in_use, 0);
	assert_true(st.fragmentation == 0.0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
	/* Destroyed: its fd is closed. */
	assert_int_equal(fcntl(fd, F_GETFD), -1);

	/* A one-page pool still serves small blocks (a one-page slab). */
	p = mkpool(1, 0);
	assert_int_equal(pool_size(p), 4096);
	{
		uint64_t off, cap, off2;

		assert_int_equal(pool_block_alloc(p, 10, &off, &cap), 0);
		assert_int_equal(cap, 64);
		assert_int_equal(pool_block_alloc(p, 2048, &off2, &cap), -ENOMEM);
		assert_int_equal(pool_check(p), 0);
		assert_int_equal(pool_block_free(p, off), 0);
		/* The empty slab is cached; a page-sized block reclaims it. */
		assert_int_equal(pool_block_alloc(p, 4096, &off2, &cap), 0);
		assert_int_equal(off2, 0);
		assert_int_equal(pool_block_free(p, off2), 0);
	}
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

static void test_bad_params(void **state)
{
	struct pool_params prm = { .size = 1 * MiB };
	struct pool *p = NULL, *good;
	struct ferry_buf *b = NULL;
	uint64_t off;
	int e0;

	(void)state;
	e0 = atomic_load(&log_errors);
	assert_int_equal(pool_create(NULL, &p), -EINVAL);
	assert_int_equal(pool_create(&prm, NULL), -EINVAL);
	prm.size = 0;
	assert_int_equal(pool_create(&prm, &p), -EINVAL);
	prm.size = (size_t)1 << 50;
	assert_int_equal(pool_create(&prm, &p), -EINVAL);
	prm.size = SIZE_MAX;
	assert_int_equal(pool_create(&prm, &p), -EINVAL);
	prm.size = 1 * MiB;
	prm.max_bufs = UINT32_MAX;
	assert_int_equal(pool_create(&prm, &p), -EINVAL);
	assert_null(p);
	/* Every refusal logged one error line. */
	assert_int_equal(atomic_load(&log_errors) - e0, 6);

	good = mkpool(1 * MiB, 16);
	e0 = atomic_load(&log_errors);
	assert_int_equal(pool_alloc(NULL, 1, &b), -EINVAL);
	assert_int_equal(pool_alloc(good, 1, NULL), -EINVAL);
	assert_int_equal(pool_free(NULL), -EINVAL);
	assert_int_equal(pool_block_alloc(NULL, 1, &off, NULL), -EINVAL);
	assert_int_equal(pool_block_alloc(good, 1, NULL, NULL), -EINVAL);
	assert_int_equal(pool_block_free(NULL, 0), -EINVAL);
	assert_int_equal(pool_release_owner(NULL), -EINVAL);
	assert_int_equal(atomic_load(&log_errors) - e0, 7);
	/* Larger than the region, or absurd: -ENOMEM, counted. */
	assert_int_equal(pool_block_alloc(good, 2 * MiB, &off, NULL), -ENOMEM);
	assert_int_equal(pool_alloc(good, SIZE_MAX, &b), -ENOMEM);
	assert_int_equal(stats(good).alloc_failures, 2);
	assert_int_equal(stats(good).blocks_in_use, 0);
	assert_int_equal(pool_check(good), 0);
	assert_int_equal(pool_release_owner(good), 0);
}

/* ------------------------------------------------------------------ */
/* Shapes of blocks                                                    */
/* ------------------------------------------------------------------ */

static void test_alignment(void **state)
{
	static const size_t lens[] = { 0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 500,
				       1000, 1024, 1025, 2047, 2048, 2049, 4095, 4096,
				       4097, 8192, 12289, 100000, 1 * MiB };
	struct ferry_buf *bufs[sizeof(lens) / sizeof(lens[0])][3];
	struct pool *p = mkpool(16 * MiB, 0);
	uint8_t *base = pool_base(p);
	size_t i, j;

	(void)state;
	for (j = 0; j < 3; j++)
		for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			struct ferry_buf *b;

			assert_int_equal(pool_alloc(p, lens[i], &b), 0);
			bufs[i][j] = b;
			assert_int_equal(b->len, lens[i]);
			assert_int_equal(b->cap, expected_cap(lens[i]));
			assert_ptr_equal(b->data, base + b->offset);
			assert_int_equal(b->state, POOL_BUF_LIVE);
			assert_ptr_equal(b->pool, p);
			if (lens[i] <= POOL_SMALL_MAX) {
				assert_int_equal(b->offset % POOL_SMALL_MIN, 0);
				/* Objects of a class never straddle their own size. */
				assert_int_equal(b->offset % b->cap, 0);
			} else {
				assert_int_equal(b->offset % POOL_PAGE_SIZE, 0);
			}
			assert_true(b->offset + b->cap <= pool_size(p));
			pattern_fill(b->data, b->cap, (uint32_t)(i * 3 + j));
		}
	assert_int_equal(stats(p).blocks_in_use, 3 * (sizeof(lens) / sizeof(lens[0])));
	assert_int_equal(pool_check(p), 0);
	for (j = 0; j < 3; j++)
		for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			assert_true(pattern_ok(bufs[i][j]->data, bufs[i][j]->cap,
					       (uint32_t)(i * 3 + j)));
			assert_int_equal(pool_free(bufs[i][j]), 0);
		}
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(stats(p).bytes_in_use, 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

static void test_zero_length(void **state)
{
	struct pool *p = mkpool(1 * MiB, 0);
	struct ferry_buf *a, *b;
	struct pool_stats st;

	(void)state;
	assert_int_equal(pool_alloc(p, 0, &a), 0);
	assert_int_equal(pool_alloc(p, 0, &b), 0);
	assert_int_equal(a->len, 0);
	assert_int_equal(a->cap, POOL_SMALL_MIN);
	assert_non_null(a->data);
	assert_true(a->offset != b->offset);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 2);
	assert_int_equal(st.bytes_in_use, 2 * POOL_SMALL_MIN);
	assert_int_equal(st.bytes_requested, 0);
	assert_int_equal(pool_free(a), 0);
	assert_int_equal(pool_free(b), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Exhaustion and coalescing                                           */
/* ------------------------------------------------------------------ */

static void test_exhaust_and_coalesce(void **state)
{
	/* 1027 pages: not a power of two, so the final fit needs the exact bin. */
	const size_t size = 4 * MiB + 12 * KiB;
	struct pool *p = mkpool(size, 0);
	size_t cap_offs = 8192, n = 0, i, fails = 0;
	uint64_t *offs = malloc(cap_offs * sizeof(*offs)), off, cap;
	struct pool_stats st;
	int r;

	(void)state;
	seed_init(__func__);
	/* Random sizes until the pool keeps refusing. */
	while (fails < 50) {
		size_t len = skewed_size(rnd_ctx, NULL) / 4;

		r = pool_block_alloc(p, len, &off, &cap);
		if (r == -ENOMEM) {
			fails++;
			continue;
		}
		assert_int_equal(r, 0);
		assert_int_equal(cap, expected_cap(len));
		if (n == cap_offs)
			offs = realloc(offs, (cap_offs *= 2) * sizeof(*offs));
		offs[n++] = off;
	}
	/* Then single pages until the page allocator is dry. */
	while ((r = pool_block_alloc(p, POOL_PAGE_SIZE, &off, &cap)) == 0) {
		if (n == cap_offs)
			offs = realloc(offs, (cap_offs *= 2) * sizeof(*offs));
		offs[n++] = off;
	}
	assert_int_equal(r, -ENOMEM);
	st = stats(p);
	assert_int_equal(st.free_bytes, 0);
	assert_int_equal(st.largest_free, 0);
	assert_true(st.fragmentation == 0.0);
	assert_true(st.alloc_failures >= 51);
	assert_int_equal(st.blocks_in_use, n);
	assert_true(st.bytes_in_use <= size);
	assert_int_equal(pool_check(p), 0);
	/* A whole region can't come from a full pool. */
	assert_int_equal(pool_block_alloc(p, size, &off, &cap), -ENOMEM);

	/* Free everything in random order. */
	for (i = n; i > 1; i--) {
		size_t j = rnd() % i;
		uint64_t t = offs[j];

		offs[j] = offs[i - 1];
		offs[i - 1] = t;
	}
	for (i = 0; i < n; i++) {
		assert_int_equal(pool_block_free(p, offs[i]), 0);
		if (i % 512 == 0)
			assert_int_equal(pool_check(p), 0);
	}
	assert_int_equal(pool_check(p), 0);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.bytes_in_use, 0);
	assert_int_equal(st.bytes_requested, 0);

	/* Everything coalesced back: the whole region is one block again. */
	assert_int_equal(pool_block_alloc(p, size, &off, &cap), 0);
	assert_int_equal(off, 0);
	assert_int_equal(cap, size);
	st = stats(p);
	assert_int_equal(st.free_bytes, 0);
	assert_int_equal(st.bytes_in_use, size);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_block_free(p, off), 0);
	st = stats(p);
	assert_int_equal(st.free_bytes, size);
	assert_int_equal(st.largest_free, size);
	assert_true(st.fragmentation == 0.0);
	assert_int_equal(st.bad_frees, 0);
	free(offs);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Refused frees                                                       */
/* ------------------------------------------------------------------ */

static void test_double_free(void **state)
{
	struct pool *p = mkpool(4 * MiB, 0);
	struct ferry_buf *small, *large, *keep;
	uint64_t off_s, off_l;
	int e0;

	(void)state;
	assert_int_equal(pool_alloc(p, 100, &small), 0);
	assert_int_equal(pool_alloc(p, 10000, &large), 0);
	assert_int_equal(pool_alloc(p, 100, &keep), 0);
	assert_int_equal(pool_free(small), 0);
	assert_int_equal(pool_free(large), 0);
	assert_int_equal(small->state, POOL_BUF_CACHED); /* kept in its class's magazine */
	assert_int_equal(large->state, POOL_BUF_FREE);

	e0 = atomic_load(&log_errors);
	assert_int_equal(pool_free(small), -EINVAL);
	assert_int_equal(pool_free(large), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 2);
	assert_int_equal(atomic_load(&log_errors) - e0, 2);
	assert_int_equal(stats(p).blocks_in_use, 1);
	assert_int_equal(stats(p).frees, 2);

	/* The same by offset. */
	assert_int_equal(pool_block_alloc(p, 100, &off_s, NULL), 0);
	assert_int_equal(pool_block_alloc(p, 3 * POOL_PAGE_SIZE, &off_l, NULL), 0);
	assert_int_equal(pool_block_free(p, off_s), 0);
	assert_int_equal(pool_block_free(p, off_l), 0);
	assert_int_equal(pool_block_free(p, off_s), -EINVAL);
	assert_int_equal(pool_block_free(p, off_l), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 4);
	assert_int_equal(atomic_load(&log_errors) - e0, 4);

	/* A handle whose block was freed underneath it by offset. */
	assert_int_equal(pool_block_free(p, keep->offset), 0);
	assert_int_equal(pool_free(keep), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 5);
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

static void test_block_free_bad_offsets(void **state)
{
	struct pool *p = mkpool(4 * MiB, 0);
	uint64_t big, small, small2, tail, off;
	int e0;

	(void)state;
	assert_int_equal(pool_block_alloc(p, 5 * POOL_PAGE_SIZE, &big, NULL), 0);
	assert_int_equal(pool_block_alloc(p, 64, &small, NULL), 0);
	assert_int_equal(pool_block_alloc(p, 64, &small2, NULL), 0);
	assert_int_equal(pool_block_alloc(p, POOL_PAGE_SIZE * 2, &tail, NULL), 0);
	e0 = atomic_load(&log_errors);

	/* Inside a live large block: not its head. */
	assert_int_equal(pool_block_free(p, big + POOL_PAGE_SIZE), -EINVAL);
	assert_int_equal(pool_block_free(p, big + 4 * POOL_PAGE_SIZE), -EINVAL);
	assert_int_equal(pool_block_free(p, big + 64), -EINVAL);
	/* Inside a small object, or on a free object of a live slab. */
	assert_int_equal(pool_block_free(p, small + 1), -EINVAL);
	assert_int_equal(pool_block_free(p, small + 32), -EINVAL);
	off = small2 + 64;
	while (off == small || off == small2)
		off += 64;
	assert_int_equal(pool_block_free(p, off), -EINVAL);
	/* Beyond the region. */
	assert_int_equal(pool_block_free(p, pool_size(p)), -EINVAL);
	assert_int_equal(pool_block_free(p, UINT64_MAX), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 8);
	assert_int_equal(atomic_load(&log_errors) - e0, 8);
	assert_int_equal(stats(p).blocks_in_use, 4);
	assert_int_equal(pool_check(p), 0);

	/* Inside a free run: its old head, interior and tail. */
	assert_int_equal(pool_block_free(p, big), 0);
	assert_int_equal(pool_block_free(p, big + 2 * POOL_PAGE_SIZE), -EINVAL);
	assert_int_equal(pool_block_free(p, big + 4 * POOL_PAGE_SIZE), -EINVAL);
	/* The never-allocated rest of the region. */
	assert_int_equal(pool_block_free(p, pool_size(p) - POOL_PAGE_SIZE), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 11);
	assert_int_equal(pool_check(p), 0);

	assert_int_equal(pool_block_free(p, small), 0);
	assert_int_equal(pool_block_free(p, small2), 0);
	assert_int_equal(pool_block_free(p, tail), 0);
	/* The slab went back (or is cached): its pages are not blocks. */
	assert_int_equal(pool_block_free(p, small), -EINVAL);
	off = small & ~(uint64_t)(POOL_PAGE_SIZE - 1);
	assert_int_equal(pool_block_free(p, off), -EINVAL);
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

static void test_foreign_handle(void **state)
{
	struct pool *p = mkpool(1 * MiB, 64), *q;
	struct ferry_buf fake, *b, *c, *heap;
	struct pool_stats st;
	int e0;

	(void)state;
	assert_int_equal(pool_alloc(p, 100, &b), 0);
	/* A copy of a live handle on the stack: looks right, is not ours. */
	memcpy(&fake, b, offsetof(struct ferry_buf, state));
	atomic_init(&fake.state, POOL_BUF_LIVE);
	e0 = atomic_load(&log_errors);
	assert_int_equal(pool_free(&fake), -EINVAL);
	assert_int_equal(stats(p).bad_frees, 0); /* no pool to blame */
	/*
	 * Inside the descriptor table but not at the start of a descriptor,
	 * placed so that its "state" is b->flags, which holds the LIVE value:
	 * only the alignment check stands between it and a bogus free.
	 */
	b->flags = POOL_BUF_LIVE;
	assert_int_equal(pool_free((struct ferry_buf *)((char *)b +
		offsetof(struct ferry_buf, flags) - offsetof(struct ferry_buf, state))),
		-EINVAL);
	assert_int_equal(b->flags, POOL_BUF_LIVE);
	assert_int_equal(stats(p).bad_frees, 1);
	/* Heap garbage. */
	heap = malloc(sizeof(*heap));
	memset(heap, 0xff, sizeof(*heap));
	assert_int_equal(pool_free(heap), -EINVAL);
	free(heap);
	/* Pointers that must not even be read. */
	assert_int_equal(pool_free((struct ferry_buf *)(uintptr_t)0x10), -EINVAL);
	assert_int_equal(pool_free((struct ferry_buf *)(uintptr_t)-64), -EINVAL);
	assert_int_equal(atomic_load(&log_errors) - e0, 5);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 1);
	assert_int_equal(b->state, POOL_BUF_LIVE);
	assert_int_equal(pool_check(p), 0);

	/* A handle of a pool that is gone: its table is no longer known. */
	q = mkpool(1 * MiB, 8);
	assert_int_equal(pool_alloc(q, 100, &c), 0);
	assert_int_equal(pool_free(c), 0);
	assert_int_equal(pool_release_owner(q), 0);
	assert_int_equal(pool_free(c), -EINVAL);

	assert_int_equal(pool_free(b), 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Randomised model check                                              */
/* ------------------------------------------------------------------ */

struct live_block {
	uint64_t off, cap, len;
	uint32_t seed;
	struct ferry_buf *h; /* NULL: block API */
};

#define MODEL_STEPS 200000
#define MODEL_MAX_LIVE 1500

static void owner_mark(int32_t *own, const struct live_block *lb, int32_t id)
{
	uint64_t g;

	for (g = lb->off / 64; g < (lb->off + lb->cap) / 64; g++) {
		if (id >= 0)
			assert_int_equal(own[g], -1); /* no two live blocks overlap */
		own[g] = id;
	}
}

static void test_random_model(void **state)
{
	const size_t size = 64 * MiB;
	struct pool *p = mkpool(size, 4096);
	struct live_block *live = calloc(MODEL_MAX_LIVE, sizeof(*live));
	int32_t *own = malloc(size / 64 * sizeof(*own));
	uint64_t bytes = 0, req = 0, enomem = 0, step, allocs = 0;
	uint8_t *base = pool_base(p);
	size_t n = 0, i;
	uint32_t seq = 1;

	(void)state;
	seed_init(__func__);
	for (i = 0; i < size / 64; i++)
		own[i] = -1;

	for (step = 0; step < MODEL_STEPS; step++) {
		int do_alloc = n < 50 || (n < MODEL_MAX_LIVE && rnd() % 100 < 52);

		if (do_alloc) {
			struct live_block lb = { .len = skewed_size(rnd_ctx, NULL) };
			struct pool_stats before = { 0 };
			int r, by_handle = rnd() % 5 != 0;

			if (step % 64 == 0)
				before = stats(p);
			if (by_handle) {
				r = pool_alloc(p, lb.len, &lb.h);
				if (!r) {
					lb.off = lb.h->offset;
					lb.cap = lb.h->cap;
					assert_ptr_equal(lb.h->data, base + lb.off);
				}
			} else {
				r = pool_block_alloc(p, lb.len, &lb.off, &lb.cap);
			}
			if (r == -ENOMEM) {
				enomem++;
				if (step % 64 == 0)
					assert_int_equal(stats(p).alloc_failures,
							 before.alloc_failures + 1);
				continue;
			}
			assert_int_equal(r, 0);
			assert_int_equal(lb.cap, expected_cap(lb.len));
			assert_int_equal(lb.off % (lb.cap < POOL_PAGE_SIZE ? lb.cap
								: POOL_PAGE_SIZE), 0);
			assert_true(lb.off + lb.cap <= size);
			lb.seed = seq++;
			owner_mark(own, &lb, (int32_t)n);
			pattern_fill(base + lb.off, lb.cap, lb.seed);
			live[n++] = lb;
			bytes += lb.cap;
			req += lb.len;
			allocs++;
		} else {
			size_t k = rnd() % n;
			struct live_block lb = live[k];

			assert_true(pattern_ok(base + lb.off, lb.cap, lb.seed));
			owner_mark(own, &lb, -1);
			if (lb.h)
				assert_int_equal(pool_free(lb.h), 0);
			else
				assert_int_equal(pool_block_free(p, lb.off), 0);
			bytes -= lb.cap;
			req -= lb.len;
			live[k] = live[--n];
			if (k < n) { /* renumber the moved block in the owner map */
				owner_mark(own, &live[k], -1);
				owner_mark(own, &live[k], (int32_t)k);
			}
		}
		if (step % 97 == 0) {
			struct pool_stats st = stats(p);

			assert_int_equal(st.blocks_in_use, n);
			assert_int_equal(st.bytes_in_use, bytes);
			assert_int_equal(st.bytes_requested, req);
			assert_int_equal(st.allocs - st.frees, n);
			assert_int_equal(st.allocs, allocs);
			assert_true(st.free_bytes + st.bytes_in_use <= size);
			assert_true(st.largest_free <= st.free_bytes);
			assert_true(st.fragmentation >= 0.0 && st.fragmentation < 1.0);
			assert_int_equal(st.bad_frees, 0);
		}
		if (step % 10000 == 0)
			assert_int_equal(pool_check(p), 0);
	}
	print_message("random model: %zu live at the end, %llu ENOMEM\n", n,
		      (unsigned long long)enomem);
	assert_int_equal(pool_check(p), 0);
	while (n) {
		struct live_block lb = live[--n];

		assert_true(pattern_ok(base + lb.off, lb.cap, lb.seed));
		if (lb.h)
			assert_int_equal(pool_free(lb.h), 0);
		else
			assert_int_equal(pool_block_free(p, lb.off), 0);
	}
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(pool_check(p), 0);
	free(own);
	free(live);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Threads                                                             */
/* ------------------------------------------------------------------ */

#define THR_N 4
#define THR_OPS 40000
#define THR_LIVE 200
#define THR_SLOTS 16

struct thr_ctx {
	struct pool *p;
	uint64_t rng;
	int id;
	int failures; /* pattern or API failures (asserts are not thread-safe) */
	long ops;
};

static struct ferry_buf *_Atomic thr_slots[THR_SLOTS];
static atomic_uint thr_seq;

static uint64_t thr_rnd(void *ctx)
{
	struct thr_ctx *t = ctx;
	uint64_t x = t->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return t->rng = x;
}

/* The pattern seed of each handle, by handle index: it travels with the handle. */
static uint32_t thr_seed[8192];

static int thr_check_free(struct ferry_buf *b)
{
	int bad = !pattern_ok(b->data, b->cap, thr_seed[b->index]);

	return bad + (pool_free(b) != 0);
}

static void *thr_main(void *arg)
{
	struct thr_ctx *t = arg;
	struct ferry_buf *mine[THR_LIVE];
	int n = 0, i;

	for (i = 0; i < THR_OPS; i++) {
		uint64_t k = thr_rnd(t) % 100;

		t->ops++;

		if (k < 50 && n < THR_LIVE) {
			struct ferry_buf *b;
			size_t len = skewed_size(thr_rnd, t) / 2;
			int r = pool_alloc(t->p, len, &b);

			if (r == -ENOMEM)
				continue;
			if (r || b->len != len || b->cap != expected_cap(len)) {
				t->failures++;
				continue;
			}
			thr_seed[b->index] = atomic_fetch_add(&thr_seq, 1);
			pattern_fill(b->data, b->cap, thr_seed[b->index]);
			mine[n++] = b;
		} else if (k < 90 && n > 0) {
			int j = (int)(thr_rnd(t) % (uint64_t)n);

			t->failures += thr_check_free(mine[j]);
			mine[j] = mine[--n];
		} else if (n > 0) {
			/* Hand a block to whichever thread comes by; take one back. */
			int j = (int)(thr_rnd(t) % (uint64_t)n);
			uint64_t slot = thr_rnd(t) % THR_SLOTS;
			struct ferry_buf *got = atomic_exchange(&thr_slots[slot], mine[j]);

			if (got) {
				if (!pattern_ok(got->data, got->cap, thr_seed[got->index]))
					t->failures++;
				mine[j] = got;
			} else {
				mine[j] = mine[--n];
			}
		}
	}
	while (n > 0)
		t->failures += thr_check_free(mine[--n]);
	return NULL;
}

static void test_threads(void **state)
{
	struct pool *p = mkpool(32 * MiB, 8192);
	struct thr_ctx ctx[THR_N];
	pthread_t th[THR_N];
	struct pool_stats st;
	int i;

	(void)state;
	for (i = 0; i < THR_SLOTS; i++)
		atomic_store(&thr_slots[i], NULL);
	for (i = 0; i < THR_N; i++) {
		ctx[i] = (struct thr_ctx){ .p = p, .id = i, .rng = 0x1234567ull * (i + 1) };
		assert_int_equal(pthread_create(&th[i], NULL, thr_main, &ctx[i]), 0);
	}
	for (i = 0; i < THR_N; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(ctx[i].failures, 0);
		assert_int_equal(ctx[i].ops, THR_OPS);
	}
	assert_int_equal(pool_check(p), 0);
	for (i = 0; i < THR_SLOTS; i++) {
		struct ferry_buf *b = atomic_exchange(&thr_slots[i], NULL);

		if (b)
			assert_int_equal(thr_check_free(b), 0);
	}
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.bytes_in_use, 0);
	assert_int_equal(st.bad_frees, 0);
	assert_int_equal(st.allocs, st.frees);
	assert_true(st.allocs > THR_N * THR_OPS / 4);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Lifetime                                                            */
/* ------------------------------------------------------------------ */

static int mapped(void *addr)
{
	unsigned char v;

	return mincore(addr, POOL_PAGE_SIZE, &v) == 0;
}

static void test_refcount(void **state)
{
	struct pool *p = mkpool(1 * MiB, 0);
	struct ferry_buf *b[3];
	uint64_t off;
	uint8_t *base = pool_base(p);
	int fd = pool_fd(p), i;

	(void)state;
	/* No blocks: releasing the owner destroys at once. */
	{
		struct pool *q = mkpool(64 * KiB, 0);
		int qfd = pool_fd(q);
		void *qbase = pool_base(q);

		assert_int_equal(pool_release_owner(q), 0);
		assert_int_equal(fcntl(qfd, F_GETFD), -1);
		assert_false(mapped(qbase));
	}

	for (i = 0; i < 3; i++) {
		assert_int_equal(pool_alloc(p, 5000, &b[i]), 0);
		pattern_fill(b[i]->data, b[i]->cap, (uint32_t)i + 7);
	}
	assert_int_equal(pool_block_alloc(p, 64, &off, NULL), 0);
	assert_int_equal(pool_release_owner(p), 4);
	/* A second release is refused while the pool still lives. */
	assert_int_equal(pool_release_owner(p), -EINVAL);
	/* Blocks stay valid and usable. */
	assert_true(mapped(base));
	assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	for (i = 0; i < 3; i++)
		assert_true(pattern_ok(b[i]->data, b[i]->cap, (uint32_t)i + 7));
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_free(b[0]), 0);
	assert_int_equal(pool_block_free(p, off), 0);
	assert_int_equal(pool_free(b[1]), 0);
	assert_int_equal(stats(p).blocks_in_use, 1);
	assert_int_equal(pool_check(p), 0);
	assert_true(mapped(base));
	/* The last block takes the region with it. */
	assert_int_equal(pool_free(b[2]), 0);
	assert_int_equal(fcntl(fd, F_GETFD), -1);
	assert_false(mapped(base));
}

/* ------------------------------------------------------------------ */
/* Stats                                                               */
/* ------------------------------------------------------------------ */

static void test_stats_fragmentation(void **state)
{
	const unsigned int pages = 256;
	struct pool *p = mkpool(pages * POOL_PAGE_SIZE, 0);
	uint64_t offs[256], off;
	struct pool_stats st;
	unsigned int i;

	(void)state;
	for (i = 0; i < pages; i++)
		assert_int_equal(pool_block_alloc(p, 3000, &offs[i], NULL), 0);
	assert_int_equal(pool_block_alloc(p, 3000, &off, NULL), -ENOMEM);
	st = stats(p);
	assert_int_equal(st.bytes_in_use, pages * POOL_PAGE_SIZE);
	assert_int_equal(st.bytes_requested, pages * 3000);
	assert_int_equal(st.blocks_in_use, pages);
	assert_int_equal(st.free_bytes, 0);
	assert_int_equal(st.largest_free, 0);
	assert_true(st.fragmentation == 0.0);
	assert_int_equal(st.alloc_failures, 1);

	/* Every other page free: 128 holes of one page. */
	for (i = 0; i < pages; i += 2)
		assert_int_equal(pool_block_free(p, offs[i]), 0);
	st = stats(p);
	assert_int_equal(st.free_bytes, pages / 2 * POOL_PAGE_SIZE);
	assert_int_equal(st.largest_free, POOL_PAGE_SIZE);
	assert_float_equal(st.fragmentation, 1.0 - 1.0 / (pages / 2), 1e-9);
	assert_int_equal(pool_block_alloc(p, 2 * POOL_PAGE_SIZE, &off, NULL), -ENOMEM);
	assert_int_equal(pool_check(p), 0);

	/* Free pages 11 and 13: with the holes at 10, 12, 14 they make one of five. */
	assert_int_equal(pool_block_free(p, offs[11]), 0);
	assert_int_equal(pool_block_free(p, offs[13]), 0);
	st = stats(p);
	assert_int_equal(st.largest_free, 5 * POOL_PAGE_SIZE);
	assert_int_equal(pool_block_alloc(p, 5 * POOL_PAGE_SIZE, &off, NULL), 0);
	assert_int_equal(off, offs[10]);
	assert_int_equal(pool_block_free(p, off), 0);
	assert_int_equal(pool_check(p), 0);

	for (i = 1; i < pages; i += 2)
		if (i != 11 && i != 13)
			assert_int_equal(pool_block_free(p, offs[i]), 0);
	st = stats(p);
	assert_int_equal(st.free_bytes, pages * POOL_PAGE_SIZE);
	assert_int_equal(st.largest_free, pages * POOL_PAGE_SIZE);
	assert_true(st.fragmentation == 0.0);
	assert_int_equal(st.allocs, pages + 1);
	assert_int_equal(st.frees, pages + 1);
	assert_int_equal(st.bytes_requested, 0);
	assert_int_equal(pool_check(p), 0);

	/* Holes of 5 and 7 pages share a bin: largest_free is the 7, not the last. */
	{
		static const unsigned int np[] = { 5, 1, 7, 1, 256 - 14 };

		for (i = 0; i < 5; i++) {
			size_t len = np[i] * POOL_PAGE_SIZE;

			assert_int_equal(pool_block_alloc(p, len, &offs[i], NULL), 0);
		}
		assert_int_equal(pool_block_free(p, offs[0]), 0);
		assert_int_equal(pool_block_free(p, offs[2]), 0);
		st = stats(p);
		assert_int_equal(st.free_bytes, 12 * POOL_PAGE_SIZE);
		assert_int_equal(st.largest_free, 7 * POOL_PAGE_SIZE);
		assert_float_equal(st.fragmentation, 1.0 - 7.0 / 12.0, 1e-9);
		for (i = 1; i < 5; i += 2)
			assert_int_equal(pool_block_free(p, offs[i]), 0);
		assert_int_equal(pool_block_free(p, offs[4]), 0);
		assert_int_equal(stats(p).largest_free, pages * POOL_PAGE_SIZE);
	}
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

static void test_descriptor_exhaustion(void **state)
{
	struct pool *p = mkpool(1 * MiB, 4);
	struct ferry_buf *b[4], *x;
	uint64_t off;
	int i, w0;

	(void)state;
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_alloc(p, 100, &b[i]), 0);
	w0 = atomic_load(&log_warns);
	assert_int_equal(pool_alloc(p, 100, &x), -ENOMEM);
	assert_int_equal(pool_alloc(p, 100000, &x), -ENOMEM);
	/* Exhaustion is counted every time but logged at most once a second. */
	for (i = 0; i < 1000; i++)
		assert_int_equal(pool_alloc(p, 100, &x), -ENOMEM);
	assert_true(atomic_load(&log_warns) - w0 <= 2);
	assert_int_equal(stats(p).alloc_failures, 1002);
	/* No block leaked by the refused allocations. */
	assert_int_equal(stats(p).blocks_in_use, 4);
	/* The block API does not need handles. */
	assert_int_equal(pool_block_alloc(p, 100, &off, NULL), 0);
	assert_int_equal(pool_block_free(p, off), 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_free(b[2]), 0);
	assert_int_equal(pool_alloc(p, 100, &x), 0);
	assert_ptr_equal(x, b[2]); /* the handle came back */
	assert_int_equal(pool_alloc(p, 100, &b[2]), -ENOMEM);
	assert_int_equal(pool_free(x), 0);
	for (i = 0; i < 4; i++)
		if (i != 2)
			assert_int_equal(pool_free(b[i]), 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* ------------------------------------------------------------------ */
/* Magazines                                                           */
/* ------------------------------------------------------------------ */

/* A freed small block is kept with its handle and comes back next. */
static void test_magazine_reuse(void **state)
{
	struct pool *p = mkpool(1 * MiB, 0);
	struct ferry_buf *a, *b, *c;
	struct pool_stats st;
	int e0;

	(void)state;
	assert_int_equal(pool_alloc(p, 100, &a), 0);
	memset(a->data, 0xa5, 100);
	assert_int_equal(pool_free(a), 0);
	assert_int_equal(a->state, POOL_BUF_CACHED);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 0); /* kept is not in use */
	assert_int_equal(st.bytes_in_use, 0);
	assert_int_equal(st.bytes_requested, 0);
	assert_int_equal(st.frees, 1);
	assert_int_equal(pool_check(p), 0);

	/* The same class: the kept handle and block, with the new length. */
	assert_int_equal(pool_alloc(p, 90, &b), 0);
	assert_ptr_equal(b, a);
	assert_int_equal(b->state, POOL_BUF_LIVE);
	assert_int_equal(ferry_buf_len(b), 90);
	assert_int_equal(b->cap, 128);
	st = stats(p);
	assert_int_equal(st.blocks_in_use, 1);
	assert_int_equal(st.bytes_requested, 90);
	assert_int_equal(st.allocs, 2);
	assert_int_equal(pool_check(p), 0);
	/* Another class does not take it. */
	assert_int_equal(pool_alloc(p, 1000, &c), 0);
	assert_ptr_not_equal(c, b);

	/* A kept block is free: a second free and a free by offset are refused. */
	assert_int_equal(pool_free(b), 0);
	e0 = atomic_load(&log_errors);
	assert_int_equal(pool_free(b), -EINVAL);
	assert_int_equal(pool_block_free(p, b->offset), -EINVAL);
	assert_int_equal(atomic_load(&log_errors) - e0, 2);
	assert_int_equal(stats(p).bad_frees, 2);
	assert_int_equal(pool_check(p), 0);
	/* Its handle still comes back whole. */
	assert_int_equal(pool_alloc(p, 128, &a), 0);
	assert_ptr_equal(a, b);
	assert_int_equal(pool_free(a), 0);
	assert_int_equal(pool_free(c), 0);
	/* The owner's release gives the kept blocks back: nothing is live. */
	assert_int_equal(pool_release_owner(p), 0);
}

/* At most POOL_MAG_DEPTH per class; the rest go back to their slabs. */
static void test_magazine_bounded(void **state)
{
	struct pool *p = mkpool(1 * MiB, 0);
	struct ferry_buf *b[64];
	int i, reused = 0;

	(void)state;
	for (i = 0; i < 64; i++)
		assert_int_equal(pool_alloc(p, 64, &b[i]), 0);
	for (i = 0; i < 64; i++)
		assert_int_equal(pool_free(b[i]), 0);
	for (i = 0; i < 64; i++)
		reused += b[i]->state == POOL_BUF_CACHED;
	assert_int_equal(reused, 16);
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* Kept blocks and handles are given back on the way to -ENOMEM. */
static void test_magazine_gives_back(void **state)
{
	struct pool *p = mkpool(1 * MiB, 4);
	struct ferry_buf *b[4], *big;
	int i;

	(void)state;
	/* Every handle kept in the 64 B class: a 1 KiB block still gets one. */
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_alloc(p, 64, &b[i]), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_free(b[i]), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_alloc(p, 1000, &b[i]), 0);
	assert_int_equal(stats(p).alloc_failures, 0);
	assert_int_equal(pool_check(p), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_free(b[i]), 0);
	assert_int_equal(pool_release_owner(p), 0);

	/* A kept block holds its slab: the whole region still comes free. */
	p = mkpool(1 * MiB, 0);
	assert_int_equal(pool_alloc(p, 1000, &b[0]), 0);
	assert_int_equal(pool_free(b[0]), 0);
	assert_int_equal(b[0]->state, POOL_BUF_CACHED);
	assert_int_equal(pool_alloc(p, 1 * MiB, &big), 0);
	assert_int_equal(stats(p).alloc_failures, 0);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_free(big), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

/* Blocks freed after the owner let go are not kept: the region goes. */
static void test_magazine_after_owner(void **state)
{
	struct pool *p = mkpool(1 * MiB, 0);
	struct ferry_buf *a, *b;
	int fd = pool_fd(p);

	(void)state;
	assert_int_equal(pool_alloc(p, 64, &a), 0);
	assert_int_equal(pool_alloc(p, 64, &b), 0);
	assert_int_equal(pool_free(a), 0); /* kept */
	assert_int_equal(pool_release_owner(p), 1); /* a given back, b live */
	assert_int_equal(pool_check(p), 0);
	assert_true(fcntl(fd, F_GETFD) >= 0);
	assert_int_equal(pool_free(b), 0); /* not kept: the last reference */
	assert_int_equal(fcntl(fd, F_GETFD), -1); /* the region's memfd is closed */
	assert_int_equal(errno, EBADF);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

static int wrap_released;
static struct ferry_buf *wrap_last;

static void wrap_release(struct ferry_buf *b, void *ctx)
{
	wrap_released++;
	wrap_last = b;
	*(int *)ctx += 1;
}

/* Foreign handles: free runs the hook; the handle comes back only on done. */
static void test_wrap_foreign(void **state)
{
	struct pool *p = mkpool(1 * MiB, 4);
	static char outside[100];
	struct ferry_buf *w, *b[4];
	int ctx = 0, i;

	(void)state;
	wrap_released = 0;
	assert_int_equal(pool_wrap(p, outside, sizeof(outside), 4096, wrap_release, &ctx, &w), 0);
	assert_ptr_equal(w->data, outside);
	assert_int_equal(w->len, sizeof(outside));
	assert_int_equal(w->offset, 4096);
	assert_true(w->flags & POOL_BUF_F_FOREIGN);
	assert_int_equal(stats(p).blocks_in_use, 0); /* no block of ours */
	assert_int_equal(pool_free(w), 0);
	assert_int_equal(wrap_released, 1);
	assert_int_equal(ctx, 1);
	assert_ptr_equal(wrap_last, w);
	assert_int_equal(pool_free(w), -EINVAL); /* double free refused, hook not rerun */
	assert_int_equal(wrap_released, 1);
	/* Until done, the handle is not reusable: 3 of 4 handles are left. */
	for (i = 0; i < 3; i++)
		assert_int_equal(pool_alloc(p, 64, &b[i]), 0);
	assert_int_equal(pool_alloc(p, 64, &b[3]), -ENOMEM);
	pool_wrap_done(w);
	assert_int_equal(pool_alloc(p, 64, &b[3]), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(pool_free(b[i]), 0);
	/* A wrapped handle keeps the pool alive after its owner let go. */
	assert_int_equal(pool_wrap(p, outside, 1, 0, wrap_release, &ctx, &w), 0);
	assert_int_equal(pool_release_owner(p), 1); /* the wrapped handle */
	assert_int_equal(pool_free(w), 0);
	pool_wrap_done(w); /* the last reference: the pool goes (ASan checks) */
	assert_int_equal(pool_wrap(NULL, outside, 1, 0, wrap_release, &ctx, &w), -EINVAL);
}

/*
 * Shared blocks: n handles of one block, each freed on its own; the block
 * goes back with the last (large and small blocks alike); a short table
 * refuses the share and leaves the buffer as it was.
 */
static void test_share(void **state)
{
	struct pool *p = mkpool(1 * MiB, 8);
	struct ferry_buf *b, *s[5], *x;
	size_t sizes[] = { 100, 8192 };
	unsigned k;
	int i;

	(void)state;
	for (k = 0; k < 2; k++) {
		assert_int_equal(pool_alloc(p, sizes[k], &b), 0);
		memset(b->data, 0x5a, sizes[k]);
		assert_int_equal(pool_share(b, 4, s), 0);
		assert_int_equal(stats(p).blocks_in_use, 1);
		for (i = 0; i < 4; i++) {
			assert_ptr_equal(s[i]->data, b->data);
			assert_int_equal(s[i]->len, sizes[k]);
			assert_ptr_equal(s[i]->share_root, b);
		}
		assert_int_equal(pool_free(b), -EINVAL); /* the root is nobody's */
		assert_int_equal(pool_share(s[0], 2, &s[4]), -EINVAL); /* shared already */
		assert_int_equal(pool_check(p), 0);
		for (i = 0; i < 3; i++) {
			assert_int_equal(pool_free(s[i]), 0);
			assert_int_equal(stats(p).blocks_in_use, 1); /* still held */
		}
		assert_int_equal(pool_free(s[1]), -EINVAL); /* a double free of one handle */
		assert_int_equal(pool_free(s[3]), 0);
		assert_int_equal(stats(p).blocks_in_use, 0); /* the last one gave it back */
		assert_int_equal(pool_check(p), 0);
	}
	/* 8 handles: 1 block + 7 shares fit, 8 shares do not (b stays as it was). */
	assert_int_equal(pool_alloc(p, 64, &b), 0);
	{
		struct ferry_buf *many[8];

		assert_int_equal(pool_share(b, 8, many), -ENOMEM);
		assert_int_equal(atomic_load(&b->state), POOL_BUF_LIVE);
		assert_int_equal(pool_check(p), 0);
		assert_int_equal(pool_share(b, 7, many), 0);
		assert_int_equal(pool_alloc(p, 64, &x), -ENOMEM);
		for (i = 0; i < 7; i++)
			assert_int_equal(pool_free(many[i]), 0);
	}
	assert_int_equal(pool_alloc(p, 64, &b), 0);
	assert_int_equal(pool_share(b, 0, s), 0); /* n == 0 frees it */
	assert_int_equal(stats(p).blocks_in_use, 0);
	assert_int_equal(pool_share(NULL, 1, s), -EINVAL);
	assert_int_equal(pool_check(p), 0);
	assert_int_equal(pool_release_owner(p), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_create_destroy),
		T(test_bad_params),
		T(test_alignment),
		T(test_zero_length),
		T(test_exhaust_and_coalesce),
		T(test_double_free),
		T(test_block_free_bad_offsets),
		T(test_foreign_handle),
		T(test_random_model),
		T(test_threads),
		T(test_refcount),
		T(test_stats_fragmentation),
		T(test_descriptor_exhaustion),
		T(test_wrap_foreign),
		T(test_share),
		T(test_magazine_reuse),
		T(test_magazine_bounded),
		T(test_magazine_gives_back),
		T(test_magazine_after_owner),
	};

	return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}

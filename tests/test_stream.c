/*
 * tests/test_stream.c - chunked streams between two engines of one process
 * (the loopback transport, both progress modes where it matters): order,
 * MORE flags, plain GET of one chunk, credits never exceeded (measured at
 * the consumer), per-peer limits, the whole-stream mode, abort with a
 * reason, the gap deadline, subscribers to new streams, many interleaved
 * streams, random chunk sizes with checksums, bad input, and 100k streams
 * opened and closed without growth in memory or open files. Streams across
 * processes (shm) and peer death are in test_stream_shm.c.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include "helpers.h"

static enum ferry_progress_mode THREAD = FERRY_PROGRESS_THREAD;
static enum ferry_progress_mode MANUAL = FERRY_PROGRESS_MANUAL;

struct pair {
	struct ferry_engine *a, *b; /* a streams to b */
	struct ferry_peer *to_b, *from_a;
	bool manual;
};

static struct pair mkpair(void **state, size_t pool)
{
	enum ferry_progress_mode mode = state && *state ? *(enum ferry_progress_mode *)*state
							: FERRY_PROGRESS_THREAD;
	struct pair p;

	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	p.a = t_engine("a", mode, pool);
	p.b = t_engine("b", mode, pool);
	p.to_b = t_peer(p.a, "b");
	p.from_a = t_peer(p.b, "a");
	p.manual = mode == FERRY_PROGRESS_MANUAL;
	return p;
}

static void rmpair(struct pair *p)
{
	assert_int_equal(ferry_engine_destroy(p->a), 0);
	assert_int_equal(ferry_engine_destroy(p->b), 0);
}

static uint8_t pat(unsigned stream, unsigned chunk, size_t i)
{
	return (uint8_t)(stream * 31 + chunk * 131 + i * 7);
}

/* An SQE of e's ring, waiting (bounded) for room: bursts outrun the reactor. */
static struct ferry_sqe *sqe_of(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;
	int64_t end = t_now() + 5 * SEC;

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	while (!(sqe = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq);
		ferry_progress(e); /* MANUAL mode: take the entries */
		usleep(100);
		if (t_now() > end)
			fail_msg("submission ring full for 5 s");
	}
	return sqe;
}

/* Submit one STREAM_PUT of iov (which must outlive the op). */
static void sput(struct ferry_engine *e, struct ferry_peer *to, const char *stream,
		 struct iovec *iov, unsigned n, uint64_t ud, uint32_t flags, uint64_t timeout)
{
	struct ferry_sqe *sqe = sqe_of(e);

	ferry_prep_stream_put(sqe, to, stream, iov, n, ud);
	ferry_sqe_set_flags(sqe, flags);
	ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

static void sget(struct ferry_engine *e, struct ferry_peer *from, const char *stream,
		 uint64_t ud, uint32_t flags, uint64_t timeout)
{
	struct ferry_sqe *sqe = sqe_of(e);

	ferry_prep_stream_get(sqe, from, stream, ud);
	ferry_sqe_set_flags(sqe, flags);
	ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

/* Poll e (driving other in MANUAL mode) for one CQE, up to 5 s. */
static struct ferry_cqe next_cqe_at(struct pair *p, struct ferry_engine *e, int line)
{
	struct ferry_cqe c;

	memset(&c, 0, sizeof(c));
	if (!t_wait_cqe(e, p->manual ? (e == p->a ? p->b : p->a) : NULL, &c, 5 * SEC))
		fail_msg("line %d: no completion on engine %s within 5 s", line,
			 ferry_engine_name(e));
	return c;
}
#define next_cqe(p, e) next_cqe_at(p, e, __LINE__)

/* ------------------------------------------------------------------ */

static void test_order_and_more(void **state)
{
	struct pair p = mkpair(state, 0);
	enum { N = 200 };
	static uint8_t data[N][700];
	static struct iovec iov[N];
	unsigned puts_done = 0, got = 0;

	sget(p.b, p.from_a, "req1_0", 1000, 0, 0);
	for (unsigned i = 0; i < N; i++) {
		size_t len = (i * 37) % 700;

		for (size_t k = 0; k < len; k++)
			data[i][k] = pat(1, i, k);
		iov[i].iov_base = data[i];
		iov[i].iov_len = len;
		sput(p.a, p.to_b, "req1_0", &iov[i], 1, i, i == N - 1 ? FERRY_SQE_STREAM_END : 0, 0);
	}
	while (got < N || puts_done < N) {
		struct ferry_cqe c;

		if (puts_done < N && t_wait_cqe(p.a, p.manual ? p.b : NULL, &c, 1 * MS)) {
			assert_int_equal(c.res, (int)c.user_data); /* res = the chunk's index */
			assert_int_equal(c.opcode, FERRY_OP_STREAM_PUT);
			puts_done++;
		}
		while (got < N && t_wait_cqe(p.b, p.manual ? p.a : NULL, &c, 1 * MS)) {
			size_t len = (got * 37) % 700;

			assert_int_equal(c.user_data, 1000);
			assert_int_equal(c.res, (int)got);
			assert_int_equal(c.len, len);
			assert_true(c.flags & FERRY_CQE_F_BUF);
			assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), got < N - 1);
			for (size_t k = 0; k < len; k++)
				assert_int_equal(((uint8_t *)ferry_buf_data(c.buf))[k], pat(1, got, k));
			assert_int_equal(ferry_buf_release(c.buf), 0);
			got++;
		}
	}
	rmpair(&p);
}

/* Chunks before the STREAM_GET wait under their keys; a plain GET takes one. */
static void test_get_after_and_plain_get(void **state)
{
	struct pair p = mkpair(state, 0);
	static char d[5][16] = { "zero", "one", "two", "three", "four" };
	static struct iovec iov[5];
	char out[16];
	struct iovec oiov = { out, sizeof(out) };
	struct ferry_cqe c;

	for (unsigned i = 0; i < 5; i++) {
		iov[i].iov_base = d[i];
		iov[i].iov_len = strlen(d[i]) + 1;
		sput(p.a, p.to_b, "r7_2", &iov[i], 1, i, i == 4 ? FERRY_SQE_STREAM_END : 0, 0);
	}
	for (unsigned i = 0; i < 5; i++) {
		c = next_cqe(&p, p.a);
		assert_int_equal(c.res, (int)c.user_data);
	}
	/* The upstream chunk key works with a plain GET. */
	t_get(p.b, p.from_a, "r7_2_0", &oiov, 1, 50, 0, 0);
	c = next_cqe(&p, p.b);
	assert_int_equal(c.res, 0);
	assert_string_equal(out, "zero");
	/* The stream goes on from chunk 1. */
	sget(p.b, p.from_a, "r7_2", 51, 0, 0);
	for (unsigned i = 1; i < 5; i++) {
		c = next_cqe(&p, p.b);
		assert_int_equal(c.res, (int)i);
		assert_string_equal(ferry_buf_data(c.buf), d[i]);
		assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), i < 4);
		ferry_buf_release(c.buf);
	}
	rmpair(&p);
}

/*
 * The consumer keeps chunks without releasing them: it must never hold more
 * than max_inflight, and the producer's puts past that wait.
 */
static void test_credits_never_exceeded(void **state)
{
	struct pair p = mkpair(state, 0);
	enum { N = 300, LIMIT = 4 };
	static uint64_t val[N];
	static struct iovec iov[N];
	struct ferry_buf *held[N];
	unsigned nheld = 0, got = 0, max_held = 0, puts_done = 0, seed = 1;

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, LIMIT, 0), 0);
	for (unsigned i = 0; i < N; i++) {
		val[i] = i;
		iov[i].iov_base = &val[i];
		iov[i].iov_len = sizeof(val[i]);
		sput(p.a, p.to_b, "cr", &iov[i], 1, i, i == N - 1 ? FERRY_SQE_STREAM_END : 0, 0);
	}
	sget(p.b, p.from_a, "cr", 9999, 0, 0);
	/* With nothing released, exactly LIMIT chunks arrive, and no more. */
	for (unsigned i = 0; i < LIMIT; i++) {
		struct ferry_cqe c = next_cqe(&p, p.b);

		assert_int_equal(c.res, (int)i);
		held[nheld++] = c.buf;
		got++;
	}
	t_expect_none(p.b, p.manual ? p.a : NULL, 100);
	while (got < N) {
		struct ferry_cqe c;

		/* Release a pseudo-random number of the held chunks (0..2). */
		seed = seed * 1103515245 + 12345;
		for (unsigned r = (seed >> 16) % 3; r > 0 && nheld; r--)
			assert_int_equal(ferry_buf_release(held[--nheld]), 0);
		while (t_wait_cqe(p.b, p.manual ? p.a : NULL, &c, 2 * MS)) {
			assert_int_equal(c.res, (int)got);
			assert_int_equal(*(uint64_t *)ferry_buf_data(c.buf), got);
			held[nheld++] = c.buf;
			got++;
			if (nheld > max_held)
				max_held = nheld;
			assert_true(nheld <= LIMIT); /* measured, not assumed */
		}
		if (nheld == LIMIT) /* full: release one so the stream can go on */
			assert_int_equal(ferry_buf_release(held[--nheld]), 0);
	}
	while (nheld)
		ferry_buf_release(held[--nheld]);
	assert_int_equal(max_held, LIMIT);
	while (puts_done < N) {
		struct ferry_cqe c = next_cqe(&p, p.a);

		assert_true(c.res >= 0);
		puts_done++;
	}
	rmpair(&p);
}

/* The per-peer limit spans the streams to one peer. */
static void test_peer_limit(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v = 42;
	static struct iovec iov = { &v, sizeof(v) };
	struct ferry_buf *held[16];
	unsigned nheld = 0;
	char name[16];

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, 8, 3), 0);
	for (unsigned s = 0; s < 4; s++) {
		snprintf(name, sizeof(name), "pl%u", s);
		sput(p.a, p.to_b, name, &iov, 1, s * 10, 0, 0);
		sput(p.a, p.to_b, name, &iov, 1, s * 10 + 1, FERRY_SQE_STREAM_END, 0);
		sget(p.b, p.from_a, name, 100 + s, 0, 0);
	}
	for (unsigned i = 0; i < 3; i++) {
		struct ferry_cqe c = next_cqe(&p, p.b);

		held[nheld++] = c.buf;
	}
	t_expect_none(p.b, p.manual ? p.a : NULL, 100); /* 3 out, the peer limit */
	for (unsigned i = 3; i < 8; i++) {
		struct ferry_cqe c;

		ferry_buf_release(held[--nheld]);
		c = next_cqe(&p, p.b);
		assert_true(c.res >= 0);
		held[nheld++] = c.buf;
	}
	while (nheld)
		ferry_buf_release(held[--nheld]);
	rmpair(&p);
}

/* window_size -1: one CQE with everything, contiguous. */
static void test_whole(void **state)
{
	struct pair p = mkpair(state, 0);
	enum { N = 40 };
	static uint8_t data[N][3000];
	static struct iovec iov[N];
	size_t total = 0, off = 0;
	struct ferry_cqe c;

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, 2, 0), 0); /* < N: credits must flow */
	sget(p.b, p.from_a, "wh", 77, FERRY_SQE_STREAM_WHOLE, 0);
	for (unsigned i = 0; i < N; i++) {
		size_t len = (i * 977) % 3000;

		for (size_t k = 0; k < len; k++)
			data[i][k] = pat(9, i, k);
		iov[i].iov_base = data[i];
		iov[i].iov_len = len;
		total += len;
		sput(p.a, p.to_b, "wh", &iov[i], 1, i, i == N - 1 ? FERRY_SQE_STREAM_END : 0, 0);
	}
	c = next_cqe(&p, p.b);
	assert_int_equal(c.user_data, 77);
	assert_int_equal(c.res, N);
	assert_int_equal(c.len, total);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	for (unsigned i = 0; i < N; i++) {
		size_t len = (i * 977) % 3000;

		for (size_t k = 0; k < len; k++)
			assert_int_equal(((uint8_t *)ferry_buf_data(c.buf))[off + k], pat(9, i, k));
		off += len;
	}
	ferry_buf_release(c.buf);
	rmpair(&p);
}

/* Abort: queued puts fail, the consumer learns why. */
static void test_abort(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v[6];
	static struct iovec iov[6];
	struct ferry_cqe c;
	struct ferry_sqe *sqe;
	unsigned ok = 0, cancelled = 0;

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, 2, 0), 0);
	for (unsigned i = 0; i < 6; i++) {
		iov[i].iov_base = &v[i];
		iov[i].iov_len = sizeof(v[i]);
		sput(p.a, p.to_b, "ab", &iov[i], 1, i, 0, 0);
	}
	for (unsigned i = 0; i < 2; i++) /* two are delivered, four wait for credit */
		assert_true(next_cqe(&p, p.a).res >= 0);
	sqe = t_sqe(p.a);
	ferry_prep_stream_abort(sqe, p.to_b, "ab", "talker crashed: OOM", 500);
	t_submit(p.a);
	for (unsigned i = 0; i < 5; i++) {
		c = next_cqe(&p, p.a);
		if (c.user_data == 500) {
			assert_int_equal(c.res, 0);
			ok++;
		} else {
			assert_int_equal(c.res, -ECANCELED);
			cancelled++;
		}
	}
	assert_int_equal(ok, 1);
	assert_int_equal(cancelled, 4);
	sget(p.b, p.from_a, "ab", 600, 0, 0);
	for (unsigned i = 0; i < 2; i++) {
		c = next_cqe(&p, p.b);
		assert_int_equal(c.res, (int)i);
		assert_true(c.flags & FERRY_CQE_F_MORE);
		ferry_buf_release(c.buf);
	}
	c = next_cqe(&p, p.b);
	assert_int_equal(c.res, -ECANCELED);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	assert_non_null(c.buf);
	assert_int_equal(c.len, strlen("talker crashed: OOM"));
	assert_memory_equal(ferry_buf_data(c.buf), "talker crashed: OOM", c.len);
	ferry_buf_release(c.buf);
	rmpair(&p);
}

/* The deadline counts the gap between chunks, re-armed at each. */
static void test_gap_deadline(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v[3];
	static struct iovec iov[3];
	struct ferry_cqe c;
	int64_t t0;

	sget(p.b, p.from_a, "gap", 1, 0, 150 * MS);
	for (unsigned i = 0; i < 3; i++) {
		iov[i].iov_base = &v[i];
		iov[i].iov_len = sizeof(v[i]);
		usleep(60000); /* each gap shorter than the deadline, the sum longer */
		sput(p.a, p.to_b, "gap", &iov[i], 1, i, 0, 0);
		c = next_cqe(&p, p.b);
		assert_int_equal(c.res, (int)i);
		ferry_buf_release(c.buf);
	}
	t0 = t_now();
	c = next_cqe(&p, p.b);
	assert_int_equal(c.res, -ETIMEDOUT);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	assert_true(t_now() - t0 < 2 * SEC);
	rmpair(&p);
}

/* A scheduler learns of new streams without polling. */
static void test_accept(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v;
	static struct iovec iov = { &v, sizeof(v) };
	struct ferry_sqe *sqe = t_sqe(p.b);
	struct ferry_cqe c;
	bool seen[3] = { false };

	ferry_prep_stream_accept(sqe, p.from_a, 5);
	t_submit(p.b);
	sput(p.a, p.to_b, "req0_0", &iov, 1, 0, 0, 0);
	sput(p.a, p.to_b, "req1_0", &iov, 1, 1, 0, 0);
	sput(p.a, p.to_b, "req0_0", &iov, 1, 2, 0, 0); /* not new */
	sput(p.a, p.to_b, "req2_0", &iov, 1, 3, FERRY_SQE_STREAM_END, 0);
	for (unsigned i = 0; i < 3; i++) {
		c = next_cqe(&p, p.b);
		assert_int_equal(c.user_data, 5);
		assert_int_equal(c.res, 0);
		assert_true(c.flags & FERRY_CQE_F_MORE);
		assert_int_equal(c.len, 6);
		assert_int_equal(strncmp(ferry_buf_data(c.buf), "req", 3), 0);
		seen[((char *)ferry_buf_data(c.buf))[3] - '0'] = true;
		ferry_buf_release(c.buf);
	}
	assert_true(seen[0] && seen[1] && seen[2]);
	t_expect_none(p.b, p.manual ? p.a : NULL, 50);
	sqe = t_sqe(p.b);
	ferry_prep_cancel(sqe, 5, 6);
	t_submit(p.b);
	for (unsigned i = 0; i < 2; i++) {
		c = next_cqe(&p, p.b);
		assert_int_equal(c.res, c.user_data == 5 ? -ECANCELED : 0);
	}
	rmpair(&p);
}

/* 64 streams interleaved, each in order (10k chunks each; fewer under valgrind). */
static void test_many_streams_order(void **state)
{
	struct pair p = mkpair(state, 32u << 20);
	enum { S = 64 };
	unsigned per = t_under_valgrind() ? 100 : 10000;
	static uint32_t vals[S][2];
	static struct iovec iov[S][2];
	unsigned next_put[S] = { 0 }, next_get[S] = { 0 }, inflight = 0;
	uint64_t total = (uint64_t)S * per, received = 0, puts_done = 0;
	char name[32];

	memset(vals, 0xff, sizeof(vals));
	for (unsigned s = 0; s < S; s++) {
		snprintf(name, sizeof(name), "m%u_1", s);
		sget(p.b, p.from_a, name, s, 0, 0);
	}
	while (received < total) {
		struct ferry_cqe cq[64];
		int n;

		/* Up to 2 chunks per stream in flight: their iovecs alternate. */
		for (unsigned s = 0; s < S; s++) {
			unsigned k = next_put[s];

			if (k >= per || vals[s][k & 1] != UINT32_MAX)
				continue; /* done, or the slot's previous put is not complete */
			snprintf(name, sizeof(name), "m%u_1", s);
			vals[s][k & 1] = k;
			iov[s][k & 1].iov_base = &vals[s][k & 1];
			iov[s][k & 1].iov_len = sizeof(uint32_t);
			sput(p.a, p.to_b, name, &iov[s][k & 1], 1, ((uint64_t)s << 32) | k,
			     k == per - 1 ? FERRY_SQE_STREAM_END : 0, 0);
			next_put[s]++;
			inflight++;
		}
		if (p.manual)
			ferry_progress(p.b);
		n = ferry_cq_poll(ferry_cq_default(p.a), cq, 64);
		for (int i = 0; i < n; i++) {
			unsigned s = (unsigned)(cq[i].user_data >> 32), k = (uint32_t)cq[i].user_data;

			assert_int_equal(cq[i].res, (int)k);
			vals[s][k & 1] = UINT32_MAX;
			inflight--;
			puts_done++;
		}
		if (p.manual)
			ferry_progress(p.a);
		n = ferry_cq_poll(ferry_cq_default(p.b), cq, 64);
		for (int i = 0; i < n; i++) {
			unsigned s = (unsigned)cq[i].user_data;

			assert_int_equal(cq[i].res, (int)next_get[s]);
			assert_int_equal(*(uint32_t *)ferry_buf_data(cq[i].buf), next_get[s]);
			assert_int_equal(!!(cq[i].flags & FERRY_CQE_F_MORE), next_get[s] < per - 1);
			next_get[s]++;
			ferry_buf_release(cq[i].buf);
			received++;
		}
		if (n == 0 && !p.manual)
			usleep(10);
	}
	for (unsigned s = 0; s < S; s++)
		assert_int_equal(next_get[s], per);
	while (puts_done < total) {
		struct ferry_cqe c = next_cqe(&p, p.a);

		assert_true(c.res >= 0);
		puts_done++;
	}
	rmpair(&p);
}

static uint64_t fnv(const void *d, size_t n)
{
	const uint8_t *b = d;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* Random chunk sizes from 0 to 4 MiB, zero copy from the pool, checksums. */
static void test_random_sizes(void **state)
{
	struct pair p = mkpair(state, 64u << 20);
	unsigned n = t_under_valgrind() ? 12 : 60, seed = 7;
	uint64_t sums[64];
	size_t lens[64];
	struct ferry_cqe c;

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, 4, 0), 0);
	sget(p.b, p.from_a, "rnd", 1, 0, 0);
	for (unsigned i = 0; i < n; i++) {
		struct ferry_buf *b;
		struct ferry_sqe *sqe;

		seed = seed * 1103515245 + 12345;
		lens[i] = i == 0 ? 0 : i == 1 ? (4u << 20) : (seed >> 3) % ((4u << 20) + 1);
		assert_int_equal(ferry_buf_alloc(p.a, lens[i], &b), 0);
		for (size_t k = 0; k < lens[i]; k += 64)
			((uint8_t *)ferry_buf_data(b))[k] = (uint8_t)(seed + k);
		sums[i] = fnv(ferry_buf_data(b), lens[i]);
		sqe = t_sqe(p.a);
		ferry_prep_stream_put_buf(sqe, p.to_b, "rnd", b, i);
		ferry_sqe_set_flags(sqe, i == n - 1 ? FERRY_SQE_STREAM_END : 0);
		t_submit(p.a);
		/* Read as we go: the pool holds at most a few chunks. */
		while (t_wait_cqe(p.a, p.manual ? p.b : NULL, &c, 0))
			assert_true(c.res >= 0);
		if (i >= 3) {
			c = next_cqe(&p, p.b);
			assert_int_equal(c.res, (int)(i - 3));
			assert_int_equal(c.len, lens[i - 3]);
			assert_true(fnv(ferry_buf_data(c.buf), c.len) == sums[i - 3]);
			ferry_buf_release(c.buf);
		}
	}
	for (unsigned i = n >= 3 ? n - 3 : 0; i < n; i++) {
		c = next_cqe(&p, p.b);
		assert_int_equal(c.res, (int)i);
		assert_int_equal(c.len, lens[i]);
		assert_true(fnv(ferry_buf_data(c.buf), c.len) == sums[i]);
		ferry_buf_release(c.buf);
	}
	rmpair(&p);
}

static void test_bad_input(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v;
	static struct iovec iov = { &v, sizeof(v) };
	char longkey[FERRY_KEY_MAX];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	memset(longkey, 'k', FERRY_STREAM_KEY_MAX + 1);
	longkey[FERRY_STREAM_KEY_MAX + 1] = '\0';
	sput(p.a, p.to_b, longkey, &iov, 1, 1, 0, 0);
	c = next_cqe(&p, p.a);
	assert_int_equal(c.res, -ENAMETOOLONG);
	sqe = t_sqe(p.a);
	ferry_prep_stream_put(sqe, NULL, "x", &iov, 1, 2);
	t_submit(p.a);
	assert_int_equal(next_cqe(&p, p.a).res, -EINVAL);
	sqe = t_sqe(p.b);
	ferry_prep_stream_get(sqe, NULL, "x", 3);
	t_submit(p.b);
	assert_int_equal(next_cqe(&p, p.b).res, -EINVAL);
	/* One STREAM_GET per stream. */
	sget(p.b, p.from_a, "dup", 4, 0, 0);
	sget(p.b, p.from_a, "dup", 5, 0, 0);
	c = next_cqe(&p, p.b);
	assert_int_equal(c.user_data, 5);
	assert_int_equal(c.res, -EBUSY);
	/* A chunk after the END, while the consumer has not released it. */
	sput(p.a, p.to_b, "end", &iov, 1, 6, FERRY_SQE_STREAM_END, 0);
	assert_int_equal(next_cqe(&p, p.a).res, 0);
	sput(p.a, p.to_b, "end", &iov, 1, 7, 0, 0);
	assert_int_equal(next_cqe(&p, p.a).res, -EPIPE);
	/* Once it was consumed, the key starts a new stream at chunk 0. */
	sget(p.b, p.from_a, "end", 70, 0, 0);
	c = next_cqe(&p, p.b);
	assert_int_equal(c.res, 0);
	ferry_buf_release(c.buf);
	for (int tries = 0;; tries++) {
		sput(p.a, p.to_b, "end", &iov, 1, 71, FERRY_SQE_STREAM_END, 0);
		c = next_cqe(&p, p.a);
		if (c.res != -EPIPE || tries > 500)
			break;
		usleep(1000); /* the credit is on its way back */
	}
	assert_int_equal(c.res, 0);
	/* An empty END-only chunk. */
	sput(p.a, p.to_b, "empty", NULL, 0, 8, FERRY_SQE_STREAM_END, 0);
	assert_int_equal(next_cqe(&p, p.a).res, 0);
	sget(p.b, p.from_a, "empty", 9, 0, 0);
	c = next_cqe(&p, p.b);
	assert_int_equal(c.user_data, 9);
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, 0);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	ferry_buf_release(c.buf);
	rmpair(&p);
}

/* Cleaning up a request ends its streams on both sides. */
static void test_cleanup(void **state)
{
	struct pair p = mkpair(state, 0);
	static uint64_t v[4];
	static struct iovec iov[4];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	struct ferry_buf *held;
	unsigned cancelled = 0, sent = 0;

	assert_int_equal(ferry_peer_set_stream_limits(p.to_b, 1, 0), 0);
	for (unsigned i = 0; i < 4; i++) {
		iov[i].iov_base = &v[i];
		iov[i].iov_len = sizeof(v[i]);
		sput(p.a, p.to_b, "req9_0", &iov[i], 1, i, 0, 0);
	}
	sget(p.b, p.from_a, "req9_0", 100, 0, 0);
	sget(p.b, p.from_a, "req10_0", 101, 0, 0); /* another request: untouched */
	c = next_cqe(&p, p.b);
	assert_int_equal(c.user_data, 100);
	assert_int_equal(c.res, 0);
	held = c.buf; /* released after the cleanup: no credit, no chunk 1 before it */
	/* The consumer drops the request: its STREAM_GET ends. */
	sqe = sqe_of(p.b);
	ferry_prep_cleanup(sqe, NULL, "req9", 102);
	t_submit(p.b);
	for (unsigned i = 0; i < 2; i++) {
		c = next_cqe(&p, p.b);
		if (c.user_data == 100)
			assert_int_equal(c.res, -ECANCELED);
		else
			assert_int_equal(c.user_data, 102);
	}
	ferry_buf_release(held);
	t_expect_none(p.b, p.manual ? p.a : NULL, 50); /* req10's GET still waits */
	/* The producer drops it too: the chunks waiting for credit end. */
	sqe = sqe_of(p.a);
	ferry_prep_cleanup(sqe, NULL, "req9", 200);
	t_submit(p.a);
	for (unsigned i = 0; i < 5; i++) {
		c = next_cqe(&p, p.a);
		if (c.user_data == 200)
			continue;
		if (c.res == -ECANCELED)
			cancelled++;
		else if (c.res >= 0)
			sent++;
	}
	assert_true(sent >= 1 && sent + cancelled == 4);
	rmpair(&p);
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

static long json_num(const char *doc, const char *key)
{
	const char *s = strstr(doc, key);

	return s ? strtol(s + strlen(key) + 2, NULL, 10) : -1;
}

/* 100k streams opened and closed: no growth in streams, blocks, fds, memory. */
static void test_100k_streams(void **state)
{
	struct pair p = mkpair(state, 0);
	unsigned n = t_under_valgrind() ? 2000 : 100000;
	static uint64_t v = 1;
	static struct iovec iov = { &v, sizeof(v) };
	char name[32], health[8192];
	int fds0 = 0;
	long rss0 = 0;

	for (unsigned i = 0; i < n; i++) {
		struct ferry_cqe c;

		snprintf(name, sizeof(name), "s%u_0", i);
		sget(p.b, p.from_a, name, i, 0, 0);
		sput(p.a, p.to_b, name, &iov, 1, i, 0, 0);
		sput(p.a, p.to_b, name, NULL, 0, i, FERRY_SQE_STREAM_END, 0);
		for (unsigned k = 0; k < 2; k++) {
			c = next_cqe(&p, p.b);
			assert_int_equal(c.user_data, i);
			assert_int_equal(c.res, (int)k);
			ferry_buf_release(c.buf);
		}
		for (unsigned k = 0; k < 2; k++)
			assert_true(next_cqe(&p, p.a).res >= 0);
		if (i == 1000) {
			fds0 = count_fds();
			rss0 = rss_kib();
		}
	}
	/* Let the last credits and releases settle. */
	for (int i = 0; i < 50; i++) {
		if (p.manual) {
			ferry_progress(p.a);
			ferry_progress(p.b);
		}
		usleep(2000);
	}
	assert_int_equal(count_fds(), fds0);
	assert_true(rss_kib() - rss0 < 4096); /* tables are preallocated: no growth */
	assert_true(ferry_engine_health(p.a, health, sizeof(health)) < (int)sizeof(health));
	assert_int_equal(json_num(health, "\"streams_open\""), 0);
	assert_int_equal(json_num(health, "\"in_flight\""), 0);
	assert_true(ferry_engine_health(p.b, health, sizeof(health)) < (int)sizeof(health));
	assert_int_equal(json_num(health, "\"streams_open\""), 0);
	assert_int_equal(json_num(health, "\"keys_held\""), 0);
	rmpair(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_prestate(test_order_and_more, &THREAD),
		cmocka_unit_test_prestate(test_order_and_more, &MANUAL),
		cmocka_unit_test_prestate(test_get_after_and_plain_get, &THREAD),
		cmocka_unit_test_prestate(test_credits_never_exceeded, &THREAD),
		cmocka_unit_test_prestate(test_credits_never_exceeded, &MANUAL),
		cmocka_unit_test_prestate(test_peer_limit, &THREAD),
		cmocka_unit_test_prestate(test_whole, &THREAD),
		cmocka_unit_test_prestate(test_abort, &THREAD),
		cmocka_unit_test_prestate(test_gap_deadline, &THREAD),
		cmocka_unit_test_prestate(test_accept, &THREAD),
		cmocka_unit_test_prestate(test_many_streams_order, &THREAD),
		cmocka_unit_test_prestate(test_random_sizes, &THREAD),
		cmocka_unit_test_prestate(test_bad_input, &THREAD),
		cmocka_unit_test_prestate(test_cleanup, &THREAD),
		cmocka_unit_test_prestate(test_100k_streams, &MANUAL),
	};

	alarm(t_under_valgrind() ? 1500 : 300);
	return t_run_group_apart(tests, NULL, NULL);
}

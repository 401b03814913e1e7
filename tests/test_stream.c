/*
 * tests/test_stream.c - chunked streams between two engines of one process
 * (the loopback transport) under load and on bad input: many interleaved
 * streams, random chunk sizes up to 4 MiB with checksums, bad input (key
 * lengths, NULL peers, a second STREAM_GET, a chunk after the END, a key
 * that starts over once consumed), and 100k streams opened and closed
 * without growth in memory or open files. What every transport must show
 * of streams (order, credits, plain GETs of chunks, whole streams, abort,
 * gap deadline, accept, either end's death, cleanup) is the conformance
 * suite (tests/conformance.h), run over loop by test_conformance_loop.
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
		cmocka_unit_test_prestate(test_many_streams_order, &THREAD),
		cmocka_unit_test_prestate(test_random_sizes, &THREAD),
		cmocka_unit_test_prestate(test_bad_input, &THREAD),
		cmocka_unit_test_prestate(test_100k_streams, &MANUAL),
	};

	alarm(t_under_valgrind() ? 1500 : 300);
	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/test_loop.c - what only the loopback transport (engines of one
 * process) shows, in both progress modes: a PUT of a pool buffer hands over
 * the very block, a buffer outlives the engine that owns its pool, PUTs
 * away at a peer that never runs; and key scoping and waiting GETs served
 * in order. What every transport must show (sizes, GET before PUT, NOWAIT,
 * deadlines, cancel, EEXIST / REPLACE, EMSGSIZE, full pools and key table,
 * peers that die and come back, streams, cleanup) is the conformance suite
 * (tests/conformance.h), run over loop by test_conformance_loop.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "helpers.h"

static enum ferry_progress_mode MANUAL = FERRY_PROGRESS_MANUAL;
static enum ferry_progress_mode THREAD = FERRY_PROGRESS_THREAD;

struct pair {
	struct ferry_engine *a, *b; /* a puts to b */
	struct ferry_peer *to_b, *from_a;
};

static struct pair mkpair(void **state, size_t pool)
{
	enum ferry_progress_mode mode = *(enum ferry_progress_mode *)*state;
	struct pair p;

	ferry_log_set(-1, NULL, NULL);
	p.a = t_engine("a", mode, pool);
	p.b = t_engine("b", mode, pool);
	p.to_b = t_peer(p.a, "b");
	p.from_a = t_peer(p.b, "a");
	return p;
}

static void rmpair(struct pair *p)
{
	assert_int_equal(ferry_engine_destroy(p->a), 0);
	assert_int_equal(ferry_engine_destroy(p->b), 0);
}

static void fill(char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)(seed * 131 + i * 7);
}

static void check(const char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != (char)(seed * 131 + i * 7))
			fail_msg("byte %zu differs (seed %u)", i, seed);
}

/* PUT of a pool buffer moves the very same block: no copy at all. */
static void test_put_buf_is_zero_copy(void **state)
{
	struct pair p = mkpair(state, 0);
	struct ferry_buf *b;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	void *where;

	assert_int_equal(ferry_buf_alloc(p.a, 1u << 20, &b), 0);
	fill(ferry_buf_data(b), 1u << 20, 2);
	where = ferry_buf_data(b);
	sqe = t_sqe(p.a);
	ferry_prep_put_buf(sqe, p.to_b, "zc", b, 10);
	t_submit(p.a);
	t_expect(p.a, p.b, 10, 0, &c);
	assert_int_equal(c.len, 1u << 20);
	t_get(p.b, p.from_a, "zc", NULL, 0, 11, 0, 0);
	t_expect(p.b, p.a, 11, 0, &c);
	assert_ptr_equal(c.buf, b);
	assert_ptr_equal(ferry_buf_data(c.buf), where);
	check(ferry_buf_data(c.buf), 1u << 20, 2);
	assert_int_equal(ferry_buf_release(c.buf), 0);
	rmpair(&p);
}

/* Keys are scoped by (from, to): the same key from another peer is another key. */
static void test_key_scope(void **state)
{
	struct pair p = mkpair(state, 0);
	struct ferry_cqe c;

	t_put(p.a, p.to_b, "req1_0_0", "x", 1, 100, 0);
	t_expect(p.a, p.b, 100, 0, NULL);
	t_get(p.b, t_peer(p.b, "c"), "req1_0_0", NULL, 0, 101, FERRY_SQE_NOWAIT, 0);
	t_expect(p.b, p.a, 101, -EAGAIN, NULL);
	/* And a put to oneself is scoped {key}@self_self. */
	t_put(p.b, t_peer(p.b, "b"), "req1_0_0", "y", 1, 102, 0);
	t_expect(p.b, p.a, 102, 0, NULL);
	t_get(p.b, t_peer(p.b, "b"), "req1_0_0", NULL, 0, 103, 0, 0);
	t_expect(p.b, p.a, 103, 0, &c);
	assert_int_equal(*(char *)ferry_buf_data(c.buf), 'y');
	ferry_buf_release(c.buf);
	t_get(p.b, p.from_a, "req1_0_0", NULL, 0, 104, 0, 0);
	t_expect(p.b, p.a, 104, 0, &c);
	assert_int_equal(*(char *)ferry_buf_data(c.buf), 'x');
	ferry_buf_release(c.buf);
	rmpair(&p);
}

static void test_waiters_fifo(void **state)
{
	struct pair p = mkpair(state, 0);
	struct ferry_cqe c;

	t_get(p.b, p.from_a, "q", NULL, 0, 110, 0, 0);
	t_get(p.b, p.from_a, "q", NULL, 0, 111, 0, 0);
	t_expect_none(p.b, p.a, 20);
	t_put(p.a, p.to_b, "q", "1", 1, 112, 0);
	t_expect(p.b, p.a, 110, 0, &c); /* the first GET gets the first PUT */
	ferry_buf_release(c.buf);
	t_expect(p.a, p.b, 112, 0, NULL);
	t_put(p.a, p.to_b, "q", "2", 1, 113, 0);
	t_expect(p.b, p.a, 111, 0, &c);
	assert_int_equal(*(char *)ferry_buf_data(c.buf), '2');
	ferry_buf_release(c.buf);
	t_expect(p.a, p.b, 113, 0, NULL);
	rmpair(&p);
}

/* A buffer from an engine's pool stays valid after that engine is destroyed. */
static void test_buffer_outlives_owner(void **state)
{
	struct pair p = mkpair(state, 0);
	struct ferry_cqe c;
	char data[5000];

	fill(data, sizeof(data), 6);
	t_put(p.a, p.to_b, "o", data, sizeof(data), 170, 0);
	t_expect(p.a, p.b, 170, 0, NULL);
	t_get(p.b, p.from_a, "o", NULL, 0, 171, 0, 0);
	t_expect(p.b, p.a, 171, 0, &c);
	assert_int_equal(ferry_engine_destroy(p.a), 0);
	check(ferry_buf_data(c.buf), sizeof(data), 6);
	assert_int_equal(ferry_buf_release(c.buf), 0);
	assert_int_equal(ferry_engine_destroy(p.b), 0);
}

/*
 * PUTs to a peer that never answers (a MANUAL engine nobody drives) time
 * out; their messages stay away. Once all are away, further PUTs are
 * refused with -ENOBUFS instead of crashing; when the peer runs again they
 * come home and PUTs work again.
 */
static void test_puts_away_at_silent_peer(void **state)
{
	struct ferry_engine_params prm = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *a, *b;
	struct ferry_peer *to_b;
	struct ferry_cqe c;
	int timeouts = 0, nobufs = 0;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	prm.name = "a";
	prm.ns = "test";
	prm.progress = FERRY_PROGRESS_MANUAL;
	prm.pool_size = 1u << 20;
	prm.max_ops = 8;
	assert_int_equal(ferry_engine_create(&prm, &a), 0);
	b = t_engine("b", FERRY_PROGRESS_MANUAL, 1u << 20);
	to_b = t_peer(a, "b");
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 8; i++) {
			struct ferry_sqe *sqe = t_sqe(a);
			char key[16];

			snprintf(key, sizeof(key), "s%d_%d", round, i);
			ferry_prep_put(sqe, to_b, key, NULL, 0, (uint64_t)i);
			ferry_sqe_set_timeout(sqe, 1 * MS);
		}
		t_submit(a);
		for (int i = 0; i < 8; i++) {
			assert_true(t_wait_cqe(a, NULL, &c, 5 * SEC)); /* b is not driven */
			if (c.res == -ETIMEDOUT)
				timeouts++;
			else if (c.res == -ENOBUFS)
				nobufs++;
			else
				fail_msg("PUT: %s", ferry_err_name(c.res));
		}
	}
	assert_int_equal(timeouts, 8);
	assert_int_equal(nobufs, 8);
	/* b runs: the messages come home; PUTs work again. */
	for (int i = 0; i < 10; i++) {
		ferry_progress(b);
		ferry_progress(a);
	}
	t_put(a, to_b, "again", "x", 1, 99, 0);
	t_expect(a, b, 99, 0, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * A PUT of a small iovec travels in its message: it takes no block of the
 * sender's pool (here every block of it is the application's), lands in a
 * GET's iovec that waits, or in a block of the receiver's pool for a GET
 * that comes later (zero copy or into an iovec).
 */
static void test_small_iovec_put_takes_no_block(void **state)
{
	struct pair p = mkpair(state, 1u << 20);
	static struct ferry_buf *held[65536];
	unsigned nheld = 0;
	char src[64], dst[64];
	struct iovec out = { dst, sizeof(dst) };
	struct ferry_cqe c;

	t_put(p.a, p.to_b, "first", "x", 1, 19, 0); /* the peer is resolved */
	t_expect(p.a, p.b, 19, 0, NULL);
	while (nheld < 65536 && ferry_buf_alloc(p.a, 64, &held[nheld]) == 0)
		nheld++;
	assert_true(nheld > 0 && nheld < 65536);
	fill(src, sizeof(src), 7);
	/* a GET waits: the data goes from the message into its iovec */
	memset(dst, 0, sizeof(dst));
	ferry_prep_get(t_sqe(p.b), p.from_a, "waits", &out, 1, 20);
	t_submit(p.b);
	t_put(p.a, p.to_b, "waits", src, sizeof(src), 21, 0);
	t_expect(p.a, p.b, 21, 0, NULL);
	t_expect(p.b, p.a, 20, 0, &c);
	assert_int_equal(c.len, sizeof(src));
	check(dst, sizeof(dst), 7);
	/* no GET yet: it waits in the receiver's pool, for an iovec or zero copy */
	t_put(p.a, p.to_b, "later", src, sizeof(src), 22, 0);
	t_expect(p.a, p.b, 22, 0, NULL);
	t_put(p.a, p.to_b, "later.zc", src, 17, 23, 0);
	t_expect(p.a, p.b, 23, 0, NULL);
	memset(dst, 0, sizeof(dst));
	ferry_prep_get(t_sqe(p.b), p.from_a, "later", &out, 1, 24);
	t_submit(p.b);
	t_expect(p.b, p.a, 24, 0, &c);
	assert_int_equal(c.len, sizeof(src));
	check(dst, sizeof(dst), 7);
	t_get(p.b, p.from_a, "later.zc", NULL, 0, 25, 0, 0);
	t_expect(p.b, p.a, 25, 0, &c);
	assert_int_equal(c.len, 17);
	check(ferry_buf_data(c.buf), 17, 7);
	assert_int_equal(ferry_buf_release(c.buf), 0);
	while (nheld)
		assert_int_equal(ferry_buf_release(held[--nheld]), 0);
	rmpair(&p);
}

/*
 * Direct delivery (backends/loop/loop.c): a small PUT to a MANUAL engine
 * whose GET waits is delivered by the sender's round, under the
 * destination's progress lock: the PUT completes, and the GET's CQE is
 * there, while the destination is never driven. Not when the
 * destination's inbox holds an earlier PUT (order), nor into a GET whose
 * callback belongs on the destination's reactor.
 */
static void reactor_cb(const struct ferry_cqe *cqe, void *arg)
{
	*(struct ferry_cqe *)arg = *cqe;
}

static void test_direct_delivery(void **state)
{
	struct pair p = mkpair(state, 1u << 20);
	char src[64], dst[64], dst2[64];
	struct iovec out = { dst, sizeof(dst) }, out2 = { dst2, sizeof(dst2) };
	struct ferry_cqe c, from_cb;
	struct ferry_sqe *sqe;

	t_put(p.a, p.to_b, "first", "x", 1, 1, 0); /* the peer is resolved */
	t_expect(p.a, p.b, 1, 0, NULL);
	t_get(p.b, p.from_a, "first", NULL, 0, 2, 0, 0);
	t_expect(p.b, p.a, 2, 0, &c);
	assert_int_equal(ferry_buf_release(c.buf), 0);

	/* A GET waits at b; only a is driven: the PUT and the GET both end. */
	fill(src, sizeof(src), 3);
	memset(dst, 0, sizeof(dst));
	ferry_prep_get(t_sqe(p.b), p.from_a, "direct", &out, 1, 10);
	t_submit(p.b);
	ferry_progress(p.b); /* it waits */
	assert_int_equal(ferry_cq_arm(ferry_cq_default(p.b)), 0); /* b's owner sleeps on its fd */
	t_put(p.a, p.to_b, "direct", src, sizeof(src), 11, 0);
	t_expect(p.a, NULL, 11, 0, NULL);
	check(dst, sizeof(dst), 3);
	{
		struct pollfd pfd = { .fd = ferry_cq_fd(ferry_cq_default(p.b)), .events = POLLIN };

		assert_int_equal(t_poll(&pfd, 1, 0), 1); /* and is woken, as by b's own round */
	}
	assert_int_equal(ferry_cq_poll(ferry_cq_default(p.b), &c, 1), 1);
	assert_int_equal(c.user_data, 10);
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, sizeof(src));

	/* A GET for a buffer waits: the data goes into a block of b's pool. */
	t_get(p.b, p.from_a, "direct.zc", NULL, 0, 12, 0, 0);
	ferry_progress(p.b);
	t_put(p.a, p.to_b, "direct.zc", src, 40, 13, 0);
	t_expect(p.a, NULL, 13, 0, NULL);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(p.b), &c, 1), 1);
	assert_int_equal(c.user_data, 12);
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, 40);
	check(ferry_buf_data(c.buf), 40, 3);
	assert_int_equal(ferry_buf_release(c.buf), 0);

	/* An earlier PUT in b's inbox (no GET for it): the next one waits its turn. */
	ferry_prep_get(t_sqe(p.b), p.from_a, "second", &out, 1, 20);
	t_submit(p.b);
	ferry_progress(p.b);
	t_put(p.a, p.to_b, "kept", src, 8, 21, 0);
	t_put(p.a, p.to_b, "second", src, sizeof(src), 22, 0);
	t_expect_none(p.a, NULL, 50);
	t_expect(p.a, p.b, 21, 0, NULL);
	t_expect(p.a, p.b, 22, 0, NULL);
	t_expect(p.b, p.a, 20, 0, NULL);
	t_get(p.b, p.from_a, "kept", NULL, 0, 23, 0, 0);
	t_expect(p.b, p.a, 23, 0, &c);
	assert_int_equal(ferry_buf_release(c.buf), 0);

	/* A GET whose callback runs on b's reactor: b's own round ends it. */
	memset(&from_cb, 0, sizeof(from_cb));
	sqe = t_sqe(p.b);
	ferry_prep_get(sqe, p.from_a, "cb", &out2, 1, 30);
	ferry_sqe_set_callback(sqe, reactor_cb, &from_cb);
	ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	t_submit(p.b);
	ferry_progress(p.b);
	t_put(p.a, p.to_b, "cb", src, sizeof(src), 31, 0);
	t_expect_none(p.a, NULL, 50);
	assert_int_equal(from_cb.user_data, 0);
	t_expect(p.a, p.b, 31, 0, NULL);
	for (int i = 0; i < 100 && from_cb.user_data != 30; i++)
		ferry_progress(p.b);
	assert_int_equal(from_cb.user_data, 30);
	assert_int_equal(from_cb.res, 0);
	rmpair(&p);
}

/*
 * More of the direct path: a PUT of segments of a registered region is
 * gathered (not read as an iovec); a CQE in a CQ other than the armed one
 * still wakes the destination's fd; a sender that submits a PUT in every
 * round still sees its PUTs complete.
 */
static void test_direct_delivery_more(void **state)
{
	struct pair p = mkpair(state, 1u << 20);
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	static char src[64], dst[64], many[20][8];
	static struct iovec many_iov[20];
	struct iovec out = { dst, sizeof(dst) };
	struct ferry_region *reg;
	struct ferry_seg seg;
	struct ferry_cq *other;
	struct ferry_cqe c[4];
	struct ferry_sqe *sqe;
	int done = 0;

	t_put(p.a, p.to_b, "first", "x", 1, 1, 0); /* the peer is resolved */
	t_expect(p.a, p.b, 1, 0, NULL);
	t_get(p.b, p.from_a, "first", NULL, 0, 2, 0, 0);
	t_expect(p.b, p.a, 2, 0, &c[0]);
	assert_int_equal(ferry_buf_release(c[0].buf), 0);

	/* Segments: the bytes of the region, not of the segment list. */
	fill(src, sizeof(src), 9);
	rp.addr = src;
	rp.len = sizeof(src);
	assert_int_equal(ferry_region_register(p.a, &rp, &reg), 0);
	seg = (struct ferry_seg){ .region = reg, .offset = 0, .len = sizeof(src) };
	memset(dst, 0, sizeof(dst));
	ferry_prep_get(t_sqe(p.b), p.from_a, "segs", &out, 1, 10);
	t_submit(p.b);
	ferry_progress(p.b);
	ferry_prep_put_segs(t_sqe(p.a), p.to_b, "segs", &seg, 1, 11);
	t_submit(p.a);
	t_expect(p.a, NULL, 11, 0, NULL);
	check(dst, sizeof(dst), 9);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(p.b), c, 1), 1);
	assert_int_equal(c[0].user_data, 10);
	assert_int_equal(ferry_region_release(&reg), 0);

	/* The GET's CQE goes to another CQ than the armed one: the fd still wakes. */
	assert_int_equal(ferry_cq_create(p.b, &cp, &other), 0);
	sqe = t_sqe(p.b);
	ferry_prep_get(sqe, p.from_a, "other", &out, 1, 20);
	ferry_sqe_set_cq(sqe, other);
	t_submit(p.b);
	ferry_progress(p.b);
	assert_int_equal(ferry_cq_arm(ferry_cq_default(p.b)), 0);
	t_put(p.a, p.to_b, "other", src, sizeof(src), 21, 0);
	t_expect(p.a, NULL, 21, 0, NULL);
	{
		struct pollfd pfd = { .fd = ferry_cq_fd(ferry_cq_default(p.b)), .events = POLLIN };

		assert_int_equal(t_poll(&pfd, 1, 0), 1);
	}
	assert_int_equal(ferry_cq_poll(other, c, 1), 1);
	assert_int_equal(c[0].user_data, 20);
	assert_int_equal(ferry_cq_destroy(other), 0);

	/* A PUT in every round of the sender: each completes in the round after its own. */
	for (int i = 0; i < 20; i++) {
		char key[16];

		snprintf(key, sizeof(key), "many%d", i);
		many_iov[i] = (struct iovec){ many[i], 8 }; /* valid until the CQE */
		ferry_prep_get(t_sqe(p.b), p.from_a, key, &many_iov[i], 1, 100 + (uint64_t)i);
	}
	t_submit(p.b);
	ferry_progress(p.b);
	for (int i = 0; i < 20; i++) {
		char key[16];
		int n;

		snprintf(key, sizeof(key), "many%d", i);
		t_put(p.a, p.to_b, key, src, 8, 200 + (uint64_t)i, 0);
		n = ferry_cq_poll(ferry_cq_default(p.a), c, 4); /* its round sends the PUT */
		assert_true(n >= 0);
		done += n;
	}
	/* Each round ended the PUT of the round before it, never its own. */
	assert_int_equal(done, 19);
	while (done < 20) {
		int n = ferry_cq_poll(ferry_cq_default(p.a), c, 4);

		assert_true(n >= 0);
		done += n;
	}
	for (int i = 0; i < 20; i++)
		t_expect(p.b, NULL, 100 + (uint64_t)i, 0, NULL);
	rmpair(&p);
}

/*
 * A thread in ferry_cq_wait of the destination gets each GET's CQE whichever
 * way its PUT goes: mostly the inbox (the waiter sleeps holding its engine's
 * progress lock), directly when the PUT comes while it is between sleeps (a
 * smoke test: the timing decides, not the test).
 */
struct waiter {
	struct ferry_engine *e;
	struct ferry_cqe c;
	int n;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;

	w->n = ferry_cq_wait(ferry_cq_default(w->e), &w->c, 1, 5 * SEC);
	return NULL;
}

static void test_direct_delivery_wakes_waiter(void **state)
{
	struct pair p = mkpair(state, 1u << 20);
	char src[64], dst[64];
	struct iovec out = { dst, sizeof(dst) };
	struct waiter w = { .e = p.b };
	pthread_t t;

	t_put(p.a, p.to_b, "first", "x", 1, 1, 0);
	t_expect(p.a, p.b, 1, 0, NULL);
	fill(src, sizeof(src), 5);
	for (int i = 0; i < 20; i++) {
		char key[16];

		snprintf(key, sizeof(key), "w%d", i);
		memset(dst, 0, sizeof(dst));
		memset(&w.c, 0, sizeof(w.c));
		ferry_prep_get(t_sqe(p.b), p.from_a, key, &out, 1, 100 + (uint64_t)i);
		t_submit(p.b);
		ferry_progress(p.b);
		assert_int_equal(pthread_create(&t, NULL, wait_thread, &w), 0);
		usleep((useconds_t)(i % 4) * 1000); /* asleep, or not yet */
		t_put(p.a, p.to_b, key, src, sizeof(src), 200 + (uint64_t)i, 0);
		t_expect(p.a, NULL, 200 + (uint64_t)i, 0, NULL);
		assert_int_equal(pthread_join(t, NULL), 0);
		assert_int_equal(w.n, 1);
		assert_int_equal(w.c.user_data, 100 + (uint64_t)i);
		check(dst, sizeof(dst), 5);
	}
	/* The first GET's data ("first", no GET waited) is still b's. */
	t_get(p.b, p.from_a, "first", NULL, 0, 2, 0, 0);
	{
		struct ferry_cqe c;

		t_expect(p.b, p.a, 2, 0, &c);
		assert_int_equal(ferry_buf_release(c.buf), 0);
	}
	rmpair(&p);
}

#define BOTH(t)                                             \
	cmocka_unit_test_prestate(t, &MANUAL),              \
	cmocka_unit_test_prestate(t, &THREAD)

int main(void)
{
	const struct CMUnitTest tests[] = {
		BOTH(test_put_buf_is_zero_copy),
		BOTH(test_key_scope),
		BOTH(test_waiters_fifo),
		BOTH(test_buffer_outlives_owner),
		BOTH(test_small_iovec_put_takes_no_block),
		cmocka_unit_test(test_puts_away_at_silent_peer),
		cmocka_unit_test_prestate(test_direct_delivery, &MANUAL),
		cmocka_unit_test_prestate(test_direct_delivery_more, &MANUAL),
		cmocka_unit_test_prestate(test_direct_delivery_wakes_waiter, &MANUAL),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

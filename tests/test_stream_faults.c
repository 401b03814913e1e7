/*
 * tests/test_stream_faults.c - streams on their error paths, one test per
 * fault found in review: a CANCEL never reaches the engine's own credit
 * ops; a STREAM_GET right after a stream's END reads the next stream; a
 * malformed credit from the wire is refused without a double free; an
 * abort of a whole-stream read frees what it kept; a credit that cannot go
 * back does not keep the reactor awake; a chunk refused or timed out
 * returns its credit, so the chunks behind it go; per-peer credit freed by
 * a cleanup lets blocked streams go; a whole-stream read's timeout is a gap;
 * chunks that arrive out of order are still read from chunk 0 on, also when
 * chunk 0 goes straight to a waiting STREAM_GET; a stream whose chunk
 * failed before it was given an index (its copy, or its wait for credit)
 * stays failed. (A stream whose peer went away stays failed, and an abort
 * of it is not sent: the conformance suite's stream_failed_stays_failed.)
 * In-process engines (loopback transport); MANUAL mode where the order of
 * events matters.
 */
#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include "helpers.h"
#include "internal.h"
#include "pool.h"

static struct ferry_engine *A, *B;
static struct ferry_peer *toB, *fromA;
static bool manual;

static void mk(enum ferry_progress_mode m)
{
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	manual = m == FERRY_PROGRESS_MANUAL;
	A = t_engine("a", m, 0);
	B = t_engine("b", m, 0);
	toB = t_peer(A, "b");
	fromA = t_peer(B, "a");
}

static void rm(void)
{
	if (A)
		assert_int_equal(ferry_engine_destroy(A), 0);
	assert_int_equal(ferry_engine_destroy(B), 0);
	A = B = NULL;
}

static void sput(struct ferry_engine *e, struct ferry_peer *to, const char *s, struct iovec *iov,
		 unsigned n, uint64_t ud, uint32_t fl)
{
	struct ferry_sqe *q = t_sqe(e);

	ferry_prep_stream_put(q, to, s, iov, n, ud);
	ferry_sqe_set_flags(q, fl);
	t_submit(e);
}

static void sget(struct ferry_engine *e, struct ferry_peer *from, const char *s, uint64_t ud,
		 uint32_t fl, uint64_t to)
{
	struct ferry_sqe *q = t_sqe(e);

	ferry_prep_stream_get(q, from, s, ud);
	ferry_sqe_set_flags(q, fl);
	ferry_sqe_set_timeout(q, to);
	t_submit(e);
}

static int waitc(struct ferry_engine *e, struct ferry_cqe *c, int64_t ns)
{
	return t_wait_cqe(e, manual ? (e == A ? B : A) : NULL, c, ns);
}

static uint64_t v8 = 42;
static struct iovec iov8 = { &v8, 8 };

/* A CANCEL of user_data 1 must not find the engine's credit op (its id is 1). */
static void test_cancel_skips_internal_ops(void **state)
{
	struct ferry_cqe c;
	struct ferry_sqe *q;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	sget(B, fromA, "s", 100, 0, 0);
	ferry_progress(B);
	sput(A, toB, "s", &iov8, 1, 200, FERRY_SQE_STREAM_END);
	ferry_progress(A);
	ferry_progress(B);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 1);
	assert_int_equal(c.user_data, 100);
	ferry_buf_release(c.buf);
	ferry_progress(B); /* takes the release, sends the credit */
	q = t_sqe(B);
	ferry_prep_cancel(q, 1, 300);
	t_submit(B);
	ferry_progress(B);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 1);
	assert_int_equal(c.user_data, 300);
	assert_int_equal(c.res, -ENOENT);
	rm();
}

/* A STREAM_GET posted right after the END was handed over reads the next stream. */
static void test_get_after_end_reads_next_stream(void **state)
{
	struct ferry_cqe c;
	int tries;

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	sget(B, fromA, "s", 100, 0, 0);
	sput(A, toB, "s", &iov8, 1, 200, FERRY_SQE_STREAM_END);
	assert_true(waitc(B, &c, 5 * SEC));
	assert_int_equal(c.user_data, 100);
	sget(B, fromA, "s", 101, 0, 0); /* before the END's release */
	ferry_buf_release(c.buf);
	assert_true(waitc(A, &c, 5 * SEC));
	assert_int_equal(c.user_data, 200);
	for (tries = 0; tries < 2000; tries++) { /* -EPIPE until the credit is back */
		sput(A, toB, "s", &iov8, 1, 201, FERRY_SQE_STREAM_END);
		assert_true(waitc(A, &c, 5 * SEC));
		if (c.res != -EPIPE)
			break;
		usleep(1000);
	}
	assert_int_equal(c.res, 0);
	assert_true(waitc(B, &c, 5 * SEC));
	assert_int_equal(c.user_data, 101);
	assert_int_equal(c.res, 0);
	ferry_buf_release(c.buf);
	rm();
}

/* A credit of the wrong length is refused; nothing is freed twice. */
static void test_malformed_credit(void **state)
{
	struct pool_stats st0, st1;
	struct op *op;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	pool_get_stats(A->pool, &st0);
	op = op_alloc_internal(A);
	assert_non_null(op);
	assert_int_equal(pool_alloc(A->pool, 7, &op->buf), 0);
	memset(op->buf->data, 0, 7);
	op->buf->len = 7;
	op->len = 7;
	op->opcode = FERRY_OP_PUT;
	op->flags |= WIRE_F_CREDIT;
	op->peer = toB;
	op->key_len = 1;
	strcpy(op->key, "s");
	op->state = OP_AWAY;
	assert_int_equal(reactor_send(A, op), 0);
	for (int i = 0; i < 5; i++) {
		ferry_progress(B);
		ferry_progress(A);
	}
	pool_get_stats(A->pool, &st1);
	assert_int_equal(st1.bad_frees, st0.bad_frees);
	assert_int_equal(st1.blocks_in_use, st0.blocks_in_use);
	rm();
}

/* An abort of a whole-stream read frees the chunks kept for it. */
static void test_whole_abort_frees(void **state)
{
	struct pool_stats s0, s1;
	struct ferry_cqe c;
	struct ferry_sqe *q;
	static char big[65536];
	struct iovec iov = { big, sizeof(big) };

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	pool_get_stats(A->pool, &s0);
	for (int round = 0; round < 20; round++) {
		char key[32];

		snprintf(key, sizeof(key), "w%d", round);
		sget(B, fromA, key, 100, FERRY_SQE_STREAM_WHOLE, 0);
		sput(A, toB, key, &iov, 1, 1, 0);
		sput(A, toB, key, &iov, 1, 2, 0);
		for (int i = 0; i < 2; i++) {
			assert_true(waitc(A, &c, 5 * SEC));
			assert_true(c.res >= 0);
		}
		q = t_sqe(A);
		ferry_prep_stream_abort(q, toB, key, "bye", 3);
		t_submit(A);
		assert_true(waitc(A, &c, 5 * SEC));
		assert_int_equal(c.res, 0);
		assert_true(waitc(B, &c, 5 * SEC));
		assert_int_equal(c.res, -ECANCELED);
		ferry_buf_release(c.buf);
	}
	for (int i = 0; i < 100; i++) {
		pool_get_stats(A->pool, &s1);
		if (s1.blocks_in_use <= s0.blocks_in_use)
			break;
		usleep(5000);
	}
	assert_int_equal(s1.blocks_in_use, s0.blocks_in_use);
	rm();
}

/* The producer is gone: the consumer's credit fails, and its reactor sleeps. */
static void test_undeliverable_credit_sleeps(void **state)
{
	struct ferry_cqe c;
	uint64_t r0, r1;

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	sget(B, fromA, "s", 100, 0, 0);
	sput(A, toB, "s", &iov8, 1, 200, FERRY_SQE_STREAM_END);
	assert_true(waitc(B, &c, 5 * SEC));
	assert_int_equal(ferry_engine_destroy(A), 0);
	A = NULL;
	ferry_buf_release(c.buf);
	usleep(200000);
	r0 = atomic_load(&B->rounds);
	usleep(500000);
	r1 = atomic_load(&B->rounds);
	/* Asleep, not retrying: a handful of rounds, not tens of thousands. */
	assert_true(r1 - r0 < 1000);
	rm();
}

/* A chunk refused by the consumer returns its credit: the queue behind it goes. */
static void test_refused_chunk_frees_credit(void **state)
{
	struct ferry_cqe c;
	int got11 = 0;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	t_put(A, toB, "s_0", &v8, 8, 1, 0); /* a plain key in the way of chunk 0 */
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	while (ferry_cq_poll(ferry_cq_default(A), &c, 1) == 1)
		;
	ferry_peer_set_stream_limits(toB, 1, 0);
	sput(A, toB, "s", &iov8, 1, 10, 0);
	sput(A, toB, "s", &iov8, 1, 11, FERRY_SQE_STREAM_END); /* waits: limit 1 */
	for (int64_t end = t_now() + 2 * SEC; t_now() < end && !got11;) {
		ferry_progress(B);
		if (ferry_cq_poll(ferry_cq_default(A), &c, 1) == 1) {
			if (c.user_data == 10)
				assert_int_equal(c.res, -EEXIST);
			got11 += c.user_data == 11;
		}
	}
	assert_int_equal(got11, 1);
	rm();
}

/* A chunk that timed out away and was then refused returns its credit too. */
static void test_timed_out_chunk_frees_credit(void **state)
{
	struct ferry_cqe c;
	struct ferry_sqe *q;
	int n = 0;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	t_put(A, toB, "s_0", &v8, 8, 1, 0);
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	while (ferry_cq_poll(ferry_cq_default(A), &c, 1) == 1)
		;
	ferry_peer_set_stream_limits(toB, 1, 0);
	q = t_sqe(A);
	ferry_prep_stream_put(q, toB, "s", &iov8, 1, 10);
	ferry_sqe_set_timeout(q, 1 * MS);
	t_submit(A);
	ferry_progress(A); /* sent */
	usleep(5000);
	ferry_progress(A); /* its deadline */
	assert_int_equal(ferry_cq_poll(ferry_cq_default(A), &c, 1), 1);
	assert_int_equal(c.res, -ETIMEDOUT);
	for (int i = 0; i < 4; i++) {
		ferry_progress(B); /* refused: -EEXIST, the result finds no op */
		ferry_progress(A);
	}
	sput(A, toB, "s", &iov8, 1, 11, FERRY_SQE_STREAM_END);
	for (int64_t end = t_now() + 2 * SEC; t_now() < end && !n;) {
		ferry_progress(B);
		if (ferry_cq_poll(ferry_cq_default(A), &c, 1) == 1)
			n += c.user_data == 11;
	}
	assert_int_equal(n, 1);
	rm();
}

/* Per-peer credit freed by a cleanup lets a stream blocked on the peer go. */
static void test_cleanup_unblocks_peer(void **state)
{
	struct ferry_cqe c;
	struct ferry_sqe *q;
	int got = 0;

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	ferry_peer_set_stream_limits(toB, 16, 2);
	sput(A, toB, "reqX_s", &iov8, 1, 1, 0);
	sput(A, toB, "reqX_s", &iov8, 1, 2, 0);
	for (int i = 0; i < 2; i++) {
		assert_true(waitc(A, &c, 5 * SEC));
		assert_true(c.res >= 0);
	}
	sput(A, toB, "reqY_s", &iov8, 1, 3, 0); /* blocked: the peer holds 2 */
	t_expect_none(A, NULL, 50);
	q = t_sqe(A);
	ferry_prep_cleanup(q, NULL, "reqX", 4);
	t_submit(A);
	for (int i = 0; i < 2; i++) {
		assert_true(waitc(A, &c, 5 * SEC));
		if (c.user_data == 3) {
			assert_int_equal(c.res, 0);
			got = 1;
		}
	}
	assert_int_equal(got, 1);
	rm();
}

/* STREAM_WHOLE: the timeout is the gap between chunks, not the whole stream. */
static void test_whole_gap_timeout(void **state)
{
	struct ferry_cqe c;

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	sget(B, fromA, "w", 100, FERRY_SQE_STREAM_WHOLE, (t_under_valgrind() ? 10 : 1) * 150 * MS);
	for (int i = 0; i < 8; i++) {
		sput(A, toB, "w", &iov8, 1, i, i == 7 ? FERRY_SQE_STREAM_END : 0);
		usleep(40000); /* each gap < 150 ms, the whole > 150 ms */
	}
	assert_true(waitc(B, &c, 5 * SEC));
	assert_int_equal(c.user_data, 100);
	assert_int_equal(c.res, 8);
	ferry_buf_release(c.buf);
	rm();
}

/* Send chunk `key` by hand, as a transport that reorders would deliver it. */
static void raw_chunk(const char *key, uint32_t flags)
{
	struct op *op = op_alloc_internal(A);

	assert_non_null(op);
	assert_int_equal(pool_alloc(A->pool, 8, &op->buf), 0);
	memcpy(op->buf->data, &v8, 8);
	op->buf->len = 8;
	op->len = 8;
	op->opcode = FERRY_OP_PUT;
	op->flags |= WIRE_F_CHUNK | flags;
	op->peer = toB;
	op->key_len = (uint16_t)strlen(key);
	strcpy(op->key, key);
	op->state = OP_AWAY;
	assert_int_equal(reactor_send(A, op), 0);
}

/* Chunks that arrive out of order (tcp stripes over connections) are read in order. */
static void test_reordered_arrival(void **state)
{
	struct ferry_cqe c;
	struct ferry_sqe *q;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	q = t_sqe(B);
	ferry_prep_stream_accept(q, fromA, 7); /* creation by arrival must not skip chunk 0 */
	t_submit(B);
	ferry_progress(B);
	raw_chunk("r_1", 0);
	raw_chunk("r_2", WIRE_F_END);
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	raw_chunk("r_0", 0);
	sget(B, fromA, "r", 100, 0, 0);
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 1);
	assert_int_equal(c.user_data, 7); /* the new stream, announced */
	ferry_buf_release(c.buf);
	for (int k = 0; k < 3; k++) {
		assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 1);
		assert_int_equal(c.user_data, 100);
		assert_int_equal(c.res, k);
		assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), k < 2);
		ferry_buf_release(c.buf);
	}
	rm();
}

/*
 * The same while a STREAM_GET already waits: chunk 0, handed straight to
 * it, must bring the later chunks out of the key table after it.
 */
static void test_reordered_arrival_while_reading(void **state)
{
	struct ferry_cqe c;

	(void)state;
	mk(FERRY_PROGRESS_MANUAL);
	sget(B, fromA, "w", 100, 0, 0);
	ferry_progress(B);
	raw_chunk("w_1", 0);
	raw_chunk("w_2", WIRE_F_END);
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 0); /* chunk 0 first */
	raw_chunk("w_0", 0);
	for (int i = 0; i < 4; i++) {
		ferry_progress(A);
		ferry_progress(B);
	}
	for (int k = 0; k < 3; k++) {
		assert_int_equal(ferry_cq_poll(ferry_cq_default(B), &c, 1), 1);
		assert_int_equal(c.user_data, 100);
		assert_int_equal(c.res, k);
		assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), k < 2);
		ferry_buf_release(c.buf);
	}
	rm();
}

/* The next CQE of e that is not from the engines' own traffic, within 5 s. */
static struct ferry_cqe next_cqe(struct ferry_engine *e)
{
	struct ferry_cqe c;

	memset(&c, 0, sizeof(c));
	if (!waitc(e, &c, 5 * SEC))
		fail_msg("no completion within 5 s");
	return c;
}

/*
 * A STREAM_PUT whose copy into the pool fails (-ENOMEM) never got an index:
 * the stream is failed from then on, so the next chunk cannot take its
 * index (before: it did, and the consumer got a whole-looking stream with
 * chunk 1 missing and chunk 2 as chunk 1, the END). The producer can still
 * tell the consumer (STREAM_ABORT reaches it).
 */
static void test_chunk_failed_before_sending_breaks_stream(void **state)
{
	static struct ferry_buf *fill[4096];
	static char big[64 * 1024];
	struct iovec iov_big = { big, sizeof(big) };
	struct ferry_cqe c;
	struct ferry_sqe *q;
	unsigned nfill = 0;

	(void)state;
	manual = false;
	A = t_engine("a", FERRY_PROGRESS_THREAD, 1u << 20);
	B = t_engine("b", FERRY_PROGRESS_THREAD, 1u << 20);
	toB = t_peer(A, "b");
	fromA = t_peer(B, "a");
	sget(B, fromA, "req2_0", 100, 0, 5 * SEC);
	sput(A, toB, "req2_0", &iov_big, 1, 200, 0);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 200);
	assert_int_equal(c.res, 0); /* chunk 0 */
	c = next_cqe(B);
	assert_int_equal(c.res, 0);
	ferry_buf_release(c.buf);
	/* Chunk 0's block back home first: else it may come back after the fill. */
	for (int64_t end = t_now() + 5 * SEC;
	     t_now() < end && t_health_num(A, "\"pool\":{", "blocks_in_use") != 0;)
		usleep(1000);
	assert_int_equal(t_health_num(A, "\"pool\":{", "blocks_in_use"), 0);
	while (nfill < 4096 && ferry_buf_alloc(A, 4096, &fill[nfill]) == 0)
		nfill++; /* A's pool full */
	sput(A, toB, "req2_0", &iov_big, 1, 201, 0);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 201);
	assert_int_equal(c.res, -ENOMEM);
	while (nfill)
		ferry_buf_release(fill[--nfill]);
	sput(A, toB, "req2_0", &iov_big, 1, 202, FERRY_SQE_STREAM_END);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 202);
	assert_int_equal(c.res, -ENOMEM); /* failed, not chunk 1 */
	q = t_sqe(A); /* the producer gives up: the consumer hears it at once */
	ferry_prep_stream_abort(q, toB, "req2_0", "out of memory", 203);
	t_submit(A);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 203);
	assert_int_equal(c.res, 0);
	c = next_cqe(B);
	assert_int_equal(c.user_data, 100);
	assert_int_equal(c.res, -ECANCELED);
	assert_non_null(c.buf);
	assert_memory_equal(ferry_buf_data(c.buf), "out of memory", 13);
	ferry_buf_release(c.buf);
	rm();
}

/*
 * A chunk that times out while it waits for credit never got an index
 * either: the stream is failed, and the chunk after it does not become
 * chunk 1 once credit comes back.
 */
static void test_chunk_timed_out_waiting_breaks_stream(void **state)
{
	struct ferry_cqe c, held;
	struct ferry_sqe *q;

	(void)state;
	mk(FERRY_PROGRESS_THREAD);
	ferry_peer_set_stream_limits(toB, 1, 0);
	sget(B, fromA, "req3_0", 100, 0, 5 * SEC);
	sput(A, toB, "req3_0", &iov8, 1, 200, 0);
	c = next_cqe(A);
	assert_int_equal(c.res, 0);
	held = next_cqe(B); /* chunk 0, held: no credit */
	assert_int_equal(held.res, 0);
	q = t_sqe(A);
	ferry_prep_stream_put(q, toB, "req3_0", &iov8, 1, 201);
	ferry_sqe_set_timeout(q, 100 * MS);
	t_submit(A);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 201);
	assert_int_equal(c.res, -ETIMEDOUT);
	ferry_buf_release(held.buf); /* credit comes back */
	sput(A, toB, "req3_0", &iov8, 1, 202, FERRY_SQE_STREAM_END);
	c = next_cqe(A);
	assert_int_equal(c.user_data, 202);
	assert_int_equal(c.res, -ETIMEDOUT); /* failed, not chunk 1 */
	assert_int_equal(ferry_cq_wait(ferry_cq_default(B), &c, 1, 200 * MS), -ETIMEDOUT);
	rm();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cancel_skips_internal_ops),
		cmocka_unit_test(test_get_after_end_reads_next_stream),
		cmocka_unit_test(test_malformed_credit),
		cmocka_unit_test(test_whole_abort_frees),
		cmocka_unit_test(test_undeliverable_credit_sleeps),
		cmocka_unit_test(test_refused_chunk_frees_credit),
		cmocka_unit_test(test_timed_out_chunk_frees_credit),
		cmocka_unit_test(test_cleanup_unblocks_peer),
		cmocka_unit_test(test_whole_gap_timeout),
		cmocka_unit_test(test_reordered_arrival),
		cmocka_unit_test(test_reordered_arrival_while_reading),
		cmocka_unit_test(test_chunk_failed_before_sending_breaks_stream),
		cmocka_unit_test(test_chunk_timed_out_waiting_breaks_stream),
	};

	alarm(t_under_valgrind() ? 900 : 120);
	return t_run_group_apart(tests, NULL, NULL);
}

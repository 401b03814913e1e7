/*
 * tests/test_stream_tcp.c - streams and the KV handoff over the tcp
 * transport between real processes on loopback: chunks in order with the
 * credits held across the wire (credits travel back over the producer's
 * connection; while the consumer holds the limit, no chunk more comes) and
 * an empty END chunk, producer death ending the consumer's STREAM_GET with
 * -ECONNRESET, and a 190 MB KV set of 56 layer buffers in one vectored PUT,
 * taken contiguous and scattered.
 */
#include <signal.h>

#include "tcp_helpers.h"

enum { ORDER_N = 3000, LIMIT = 4 };

/* Producer child: ORDER_N chunks to the consumer at addr. */
static int producer(const char *addr, void *arg)
{
	struct mk m = { .name = "prod", .secret = SECRET };
	struct ferry_engine *e = mk_engine(&m);
	struct ferry_peer *to;
	static uint32_t vals[ORDER_N];
	static struct iovec iov[ORDER_N];
	struct ferry_cqe c;
	unsigned done = 0;
	bool hang = arg != NULL;

	if (!e || ferry_peer_open(e, "cons", &to) || ferry_peer_set_address(to, addr))
		return 2;
	ferry_peer_set_stream_limits(to, LIMIT, 0);
	for (unsigned i = 0; i < (hang ? 3u : ORDER_N); i++) {
		struct ferry_sq *sq;
		struct ferry_sqe *sqe;

		vals[i] = i;
		iov[i].iov_base = &vals[i];
		/* The END is an empty chunk (upstream sends END-only chunks). */
		iov[i].iov_len = !hang && i == ORDER_N - 1 ? 0 : sizeof(vals[i]);
		if (ferry_sq_get(e, &sq))
			return 3;
		while (!(sqe = ferry_sq_get_sqe(sq))) {
			ferry_sq_submit(sq);
			usleep(100);
		}
		ferry_prep_stream_put(sqe, to, "t_0", &iov[i], 1, i);
		ferry_sqe_set_flags(sqe, !hang && i == ORDER_N - 1 ? FERRY_SQE_STREAM_END : 0);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		ferry_sq_submit(sq);
		while (ferry_cq_poll(ferry_cq_default(e), &c, 1) == 1) {
			if (c.res != (int)c.user_data)
				return 4;
			done++;
		}
	}
	while (done < (hang ? 3u : ORDER_N)) {
		int res = t_wait_one(e, &c, 30 * SEC);

		if (res != (int)c.user_data)
			return 5;
		done++;
	}
	if (hang)
		pause(); /* killed here */
	ferry_engine_destroy(e);
	return 0;
}

static struct ferry_engine *consumer(void)
{
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET };

	return mk_engine(&m);
}

static void stream_get(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		       uint64_t ud, uint64_t timeout)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_stream_get(sqe, from, key, ud);
	ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

static void test_order_and_credits(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_buf *held[LIMIT];
	char addr[NETADDR_MAX];
	unsigned got = 0, nheld = 0, full = 0;

	(void)state;
	spawn(&ch, producer, NULL);
	e = consumer();
	assert_non_null(e);
	assert_int_equal(ferry_peer_open(e, "prod", &from), 0);
	engine_addr(e, addr, sizeof(addr));
	stream_get(e, from, "t_0", 1, 20 * SEC);
	go(&ch, addr);
	while (got < ORDER_N) {
		struct ferry_cqe c;

		assert_int_equal(t_wait_one(e, &c, 20 * SEC), (int)got);
		assert_true(c.flags & FERRY_CQE_F_BUF);
		if (got == ORDER_N - 1)
			assert_int_equal(c.len, 0); /* the empty END */
		else
			assert_int_equal(*(uint32_t *)ferry_buf_data(c.buf), got);
		assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), got < ORDER_N - 1);
		held[nheld++] = c.buf;
		assert_true(nheld <= LIMIT);
		if (nheld == LIMIT && got < ORDER_N - 1 && full++ % 64 == 0) {
			/* The credits hold across the wire: LIMIT held, nothing more comes. */
			struct ferry_cqe x;

			assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &x, 1, 150 * MS), -ETIMEDOUT);
		}
		/* Release at the limit, and in odd stretches also early (every fifth). */
		if (nheld == LIMIT || ((got / 256) % 2 && got % 5 == 0))
			while (nheld)
				ferry_buf_release(held[--nheld]);
		got++;
	}
	while (nheld)
		ferry_buf_release(held[--nheld]);
	assert_true(full > 64); /* the limit was reached, and checked, often */
	assert_int_equal(t_reap(ch.pid), 0);
	ferry_engine_destroy(e);
}

static void test_producer_death(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	char addr[NETADDR_MAX];
	struct ferry_cqe c;
	int64_t t0;

	(void)state;
	spawn(&ch, producer, (void *)1);
	e = consumer();
	assert_non_null(e);
	assert_int_equal(ferry_peer_open(e, "prod", &from), 0);
	engine_addr(e, addr, sizeof(addr));
	stream_get(e, from, "t_0", 1, 30 * SEC); /* the death, not the gap, ends it */
	go(&ch, addr);
	for (unsigned i = 0; i < 3; i++) {
		assert_int_equal(t_wait_one(e, &c, 10 * SEC), (int)i);
		ferry_buf_release(c.buf);
	}
	usleep(50000);
	t0 = t_now();
	kill(ch.pid, SIGKILL);
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), -ECONNRESET);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	assert_true(t_now() - t0 < (t_under_valgrind() ? 20 : 2) * SEC);
	ferry_engine_destroy(e);
}

enum { KV_LAYERS = 28 };

static size_t kv_layer(void)
{
	return (size_t)big(190 * MIB, 8 * MIB) / (2 * KV_LAYERS) & ~(size_t)63;
}

static int kv_sender(const char *addr, void *arg)
{
	size_t lb = kv_layer();
	struct mk m = { .name = "ar", .secret = SECRET, .pool = 4 * KV_LAYERS * lb + 16 * MIB };
	struct ferry_engine *e = mk_engine(&m);
	struct iovec iov[2 * KV_LAYERS];
	struct ferry_peer *to;
	struct ferry_cqe c;

	(void)arg;
	if (!e || ferry_peer_open(e, "dit", &to) || ferry_peer_set_address(to, addr))
		return 2;
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		iov[i].iov_base = malloc(lb);
		if (!iov[i].iov_base)
			return 3;
		fill(iov[i].iov_base, lb, 0x4b56 + i);
		iov[i].iov_len = lb;
	}
	for (unsigned round = 0; round < 2; round++) {
		struct ferry_sqe *sqe = t_sqe(e);

		ferry_prep_put(sqe, to, round ? "kv_b" : "kv_a", iov, 2 * KV_LAYERS, round);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		t_submit(e);
		if (t_wait_one(e, &c, 60 * SEC) != 0 || c.len != 2 * KV_LAYERS * lb)
			return 4;
	}
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++)
		free(iov[i].iov_base);
	ferry_engine_destroy(e);
	return 0;
}

static void test_kv_handoff(void **state)
{
	size_t lb = kv_layer(), total = 2 * KV_LAYERS * lb;
	struct mk m = { .name = "dit", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = total + 16 * MIB };
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct iovec dst[2 * KV_LAYERS];
	char addr[NETADDR_MAX];
	struct ferry_cqe c;
	uint8_t *whole;

	(void)state;
	spawn(&ch, kv_sender, NULL);
	e = mk_engine(&m);
	assert_non_null(e);
	assert_int_equal(ferry_peer_open(e, "ar", &from), 0);
	engine_addr(e, addr, sizeof(addr));
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		dst[i].iov_base = calloc(1, lb);
		assert_non_null(dst[i].iov_base);
		dst[i].iov_len = lb;
	}
	go(&ch, addr);
	/* Contiguous: one buffer of our pool holds every layer, in order. */
	get(e, from, "kv_a", NULL, 1, 60 * SEC, 0);
	assert_int_equal(t_wait_one(e, &c, 60 * SEC), 0);
	assert_int_equal(c.len, total);
	whole = ferry_buf_data(c.buf);
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++)
		assert_true(checksum(whole + i * lb, lb) == expected_sum(lb, 0x4b56 + i));
	ferry_buf_release(c.buf);
	/* Scattered into our own layer buffers. */
	{
		struct ferry_sqe *sqe = t_sqe(e);

		ferry_prep_get(sqe, from, "kv_b", dst, 2 * KV_LAYERS, 2);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		t_submit(e);
	}
	assert_int_equal(t_wait_one(e, &c, 60 * SEC), 0);
	assert_int_equal(c.len, total);
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		assert_true(checksum(dst[i].iov_base, lb) == expected_sum(lb, 0x4b56 + i));
		free(dst[i].iov_base);
	}
	assert_int_equal(t_reap(ch.pid), 0);
	ferry_engine_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order_and_credits),
		cmocka_unit_test(test_producer_death),
		cmocka_unit_test(test_kv_handoff),
	};

	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	alarm(t_under_valgrind() ? 900 : 180);
	return t_run_group_apart(tests, NULL, NULL);
}

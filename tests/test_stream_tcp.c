/*
 * tests/test_stream_tcp.c - the KV handoff over the tcp transport between
 * real processes on loopback: a 190 MB KV set of 56 layer buffers in one
 * vectored PUT, taken contiguous and scattered. What every transport must
 * show of streams (order, credits across the wire, an empty END, either
 * end's death) is the conformance suite (tests/conformance.h), run over tcp
 * by test_conformance_tcp.
 */
#include "tcp_helpers.h"

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
		cmocka_unit_test(test_kv_handoff),
	};

	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	alarm(t_under_valgrind() ? 900 : 180);
	return t_run_group_apart(tests, NULL, NULL);
}

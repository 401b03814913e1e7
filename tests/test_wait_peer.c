/*
 * tests/test_wait_peer.c - PUTs that wait for their peer to come up
 * (FERRY_SQE_WAIT_PEER): stages start in any order. In one process (the
 * peer's engine made later), in two processes over shm (the peer's process
 * starts later), and over tcp (its address refuses until it listens): the
 * PUT and a STREAM_PUT are delivered once it is up, byte for byte; without
 * the flag the PUT fails at once (-EHOSTUNREACH); with it and no peer, the
 * deadline ends it (-ETIMEDOUT); a CANCEL ends it too.
 */
#include "tcp_helpers.h"

static void test_wait_in_process(void **state)
{
	struct ferry_engine *a = t_engine("wa", FERRY_PROGRESS_THREAD, 0), *b;
	struct ferry_peer *to = t_peer(a, "late"), *from;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	char out[16];
	struct iovec dst = { out, sizeof(out) }, hello = { "hello", 5 };

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	t_put(a, to, "k", "x", 1, 1, 0); /* no flag: nobody holds the name */
	t_expect(a, NULL, 1, -EHOSTUNREACH, NULL);
	sqe = t_sqe(a);
	ferry_prep_put(sqe, to, "k", &hello, 1, 2);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	t_submit(a);
	sqe = t_sqe(a);
	ferry_prep_stream_put(sqe, to, "s", &hello, 1, 3);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER | FERRY_SQE_STREAM_END);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	t_submit(a);
	sqe = t_sqe(a); /* one more, cancelled while it waits */
	ferry_prep_put(sqe, to, "gone", &hello, 1, 4);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	t_submit(a);
	sqe = t_sqe(a);
	ferry_prep_cancel(sqe, 4, 5);
	t_submit(a);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(t_wait_cqe(a, NULL, &c, 5 * SEC), 1);
		assert_true((c.user_data == 5 && c.res == 0) ||
			    (c.user_data == 4 && c.res == -ECANCELED));
	}
	t_expect_none(a, NULL, 300); /* they wait */
	b = t_engine("late", FERRY_PROGRESS_THREAD, 0);
	from = t_peer(b, "wa");
	for (int i = 0; i < 2; i++) {
		assert_int_equal(t_wait_cqe(a, NULL, &c, 10 * SEC), 1);
		assert_true(c.user_data == 2 || c.user_data == 3);
		assert_int_equal(c.res, 0);
	}
	t_get(b, from, "k", &dst, 1, 10, 0, 5 * SEC);
	t_expect(b, NULL, 10, 0, &c);
	assert_int_equal(c.len, 5);
	assert_memory_equal(out, "hello", 5);
	sqe = t_sqe(b);
	ferry_prep_stream_get(sqe, from, "s", 11);
	t_submit(b);
	t_expect(b, NULL, 11, 0, &c);
	assert_memory_equal(ferry_buf_data(c.buf), "hello", 5);
	ferry_buf_release(c.buf);
	/* Nobody comes: the deadline ends it. */
	sqe = t_sqe(a);
	ferry_prep_put(sqe, t_peer(a, "never"), "k", &hello, 1, 12);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 300 * MS);
	t_submit(a);
	t_expect(a, NULL, 12, -ETIMEDOUT, NULL);
	ferry_engine_destroy(b);
	ferry_engine_destroy(a);
}

enum { BIG = 300000 }; /* a rendezvous over tcp, a block over shm */

struct late {
	struct t_gate *go;
	const char *ns;
	int port; /* tcp: listen there; 0: shm */
};

/* The peer, started late: it takes "k" and the stream "s" and checks them. */
static int late_peer(void *arg)
{
	struct late *l = arg;
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	struct ferry_peer *from;
	struct ferry_cqe c;
	char listen[64], out[16];
	struct iovec dst = { out, sizeof(out) };

	if (t_gate_wait(l->go, 60000))
		return 10;
	p.name = "late";
	p.ns = l->ns;
	p.pool_size = 8u << 20;
	if (l->port) {
		snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", l->port);
		p.listen = listen;
		p.secret = SECRET;
		p.handshake_ms = t_handshake_ms();
	}
	if (ferry_engine_create(&p, &e))
		return 11;
	ferry_peer_open(e, "early", &from);
	t_get(e, from, "k", &dst, 1, 1, 0, 20 * SEC);
	if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != 5 || memcmp(out, "hello", 5))
		return 12;
	t_get(e, from, "b", NULL, 0, 3, 0, 20 * SEC); /* a pool buffer that waited too */
	if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != BIG)
		return 14;
	for (size_t i = 0; i < BIG; i++)
		if (((uint8_t *)ferry_buf_data(c.buf))[i] != (uint8_t)(i * 13 + 5))
			return 15;
	ferry_buf_release(c.buf);
	t_get(e, from, "done", NULL, 0, 2, 0, 20 * SEC); /* stay until the early one is done */
	if (t_wait_one(e, &c, 30 * SEC) != 0)
		return 13;
	ferry_buf_release(c.buf);
	ferry_engine_destroy(e);
	return 0;
}

static void wait_across(const char *ns, int port)
{
	struct t_gate go;
	struct late l = { &go, ns, port };
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	struct ferry_peer *to;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	struct iovec hello = { "hello", 5 };
	struct ferry_buf *b;
	char addr[64];
	pid_t pid;

	t_gate_init(&go);
	pid = t_fork(late_peer, &l);
	p.name = "early";
	p.ns = ns;
	p.pool_size = 8u << 20;
	p.secret = port ? SECRET : NULL;
	p.handshake_ms = t_handshake_ms();
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	to = t_peer(e, "late");
	if (port) {
		snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", port);
		assert_int_equal(ferry_peer_set_address(to, addr), 0); /* refuses until it listens */
	}
	sqe = t_sqe(e);
	ferry_prep_put(sqe, to, "k", &hello, 1, 1);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	t_submit(e);
	assert_int_equal(ferry_buf_alloc(e, BIG, &b), 0);
	for (size_t i = 0; i < BIG; i++)
		((uint8_t *)ferry_buf_data(b))[i] = (uint8_t)(i * 13 + 5);
	sqe = t_sqe(e);
	ferry_prep_put_buf(sqe, to, "b", b, 3); /* zero copy: the block must survive the wait */
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	t_submit(e);
	t_expect_none(e, NULL, 300);
	t_gate_open(&go); /* now it starts */
	for (int i = 0; i < 2; i++) {
		assert_int_equal(t_wait_one(e, &c, 40 * SEC), 0);
		assert_true(c.user_data == 1 || c.user_data == 3);
	}
	sqe = t_sqe(e);
	ferry_prep_put(sqe, to, "done", &hello, 1, 2);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	t_submit(e);
	assert_int_equal(t_wait_one(e, &c, 40 * SEC), 0);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(e);
	t_gate_close(&go);
}

static void test_wait_shm(void **state)
{
	(void)state;
	ferry_log_set(-1, NULL, NULL);
	wait_across("wshm", 0);
}

static void test_wait_tcp(void **state)
{
	(void)state;
	ferry_log_set(-1, NULL, NULL);
	wait_across("wtcp", t_free_tcp_port());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wait_in_process),
		cmocka_unit_test(test_wait_shm),
		cmocka_unit_test(test_wait_tcp),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/test_ctl.c - the control channel (control/ctl*.c): handshake and
 * the data address it publishes (control port 0, data port 0), directory
 * queries, store-like keys (PUBLISH / LOOKUP GETs, and the wish of one that
 * ended withdrawn from the holder), a directory query to every peer at once,
 * remote health, remote
 * cancellation, a wrong secret (logged and counted by the engine called), a
 * flood of silent connections (bounded in number and time), malformed
 * messages from a raw ZeroMQ socket,
 * a taken control address (-EADDRINUSE naming it), and a peer killed with
 * SIGKILL declared dead within the configured time. Engines talk over
 * loopback only; every wait is bounded.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_helpers.h"

#ifdef FERRY_HAVE_ZMQ
#include <zmq.h>

#include "ctl_wire.h"

#define CTL_TEST_PREAUTH_MAX 64 /* CTL_GATE_PREAUTH_MAX (control/ctl_int.h) */

#define CNS "ctltest"

static uint32_t mk_handshake_ms; /* 0: t_handshake_ms() */

static struct ferry_engine *mk_ctl_mode(const char *name, const char *secret, uint32_t hb,
					uint32_t timeout, enum ferry_progress_mode mode)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.ns = CNS;
	p.pool_size = 8 * MIB;
	p.control = "tcp://127.0.0.1:0";
	p.secret = secret;
	p.heartbeat_ms = hb;
	p.peer_timeout_ms = timeout;
	p.handshake_ms = mk_handshake_ms ? mk_handshake_ms : t_handshake_ms();
	p.spin_ns = 20000;
	p.progress = mode;
	rc = ferry_engine_create(&p, &e);
	if (rc)
		fail_msg("engine %s: %s", name, ferry_strerror(rc));
	return e;
}

static struct ferry_engine *mk_ctl(const char *name, const char *secret, uint32_t hb,
				   uint32_t timeout)
{
	return mk_ctl_mode(name, secret, hb, timeout, FERRY_PROGRESS_THREAD);
}

static void ctl_addr(struct ferry_engine *e, char *buf, size_t len)
{
	int n = ferry_engine_control_address(e, buf, len);

	assert_true(n > 0 && (size_t)n < len);
}

/* A counter of the control part of e's health JSON ("dropped", ...). */
static long long ctl_stat(struct ferry_engine *e, const char *name)
{
	char h[16384], want[64];
	const char *c, *v;

	assert_true(ferry_engine_health(e, h, sizeof(h)) < (int)sizeof(h));
	c = strstr(h, "\"control\":{");
	assert_non_null(c);
	snprintf(want, sizeof(want), "\"%s\":", name);
	v = strstr(c, want);
	assert_non_null(v);
	return atoll(v + strlen(want));
}

/* Port of "tcp://HOST:PORT". */
static int port_of(const char *ep)
{
	const char *c = strrchr(ep, ':');

	return c ? atoi(c + 1) : -1;
}

/* Take a health CQE (its res is the length): check and release its text. */
static void expect_health_of(struct ferry_engine *e, uint64_t ud, const char *name)
{
	struct ferry_cqe c;
	char want[96];

	assert_int_equal(t_wait_cqe(e, NULL, &c, 5 * SEC), 1);
	assert_int_equal(c.user_data, ud);
	if (c.res <= 0)
		fail_msg("health: %s", ferry_strerror(c.res));
	assert_true(c.flags & FERRY_CQE_F_BUF);
	assert_int_equal(c.len, (uint64_t)c.res);
	assert_int_equal(strlen(ferry_buf_data(c.buf)), c.len);
	snprintf(want, sizeof(want), "\"engine\":\"%s\"", name);
	assert_non_null(strstr(ferry_buf_data(c.buf), want));
	ferry_buf_release(c.buf);
}

static void health_to(struct ferry_engine *e, struct ferry_peer *p, uint64_t ud,
		      uint64_t timeout)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_peer_health(sqe, p, ud);
	ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

/* b calls a; waits until a health query over the session answers. */
static struct ferry_peer *connect_to(struct ferry_engine *b, struct ferry_engine *a)
{
	char addr[NETADDR_MAX];
	struct ferry_peer *p = t_peer(b, ferry_engine_name(a));
	ctl_addr(a, addr, sizeof(addr));
	assert_int_equal(ferry_peer_connect(p, addr), 0);
	health_to(b, p, 900, 5 * SEC);
	expect_health_of(b, 900, ferry_engine_name(a));
	return p;
}

/* ------------------------------------------------------------------ */

static void test_ctl_handshake_publishes_data_address(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	char ca[NETADDR_MAX], cb[NETADDR_MAX], da[NETADDR_MAX];
	const char msg[] = "over the data path, found through the control channel";
	struct ferry_peer *pa, *pb;
	struct iovec v;
	char out[128];
	struct ferry_cqe c;

	(void)state;
	ctl_addr(a, ca, sizeof(ca));
	ctl_addr(b, cb, sizeof(cb));
	assert_true(port_of(ca) > 0 && port_of(cb) > 0 && port_of(ca) != port_of(cb));
	/* The data path listens too (port 0, picked by the kernel), on the control host. */
	engine_addr(a, da, sizeof(da));
	assert_true(port_of(da) > 0 && port_of(da) != port_of(ca));
	assert_non_null(strstr(da, "127.0.0.1"));

	/* b knows only a's control address; a PUT right away waits for the handshake. */
	pa = t_peer(b, "ctlA");
	assert_int_equal(ferry_peer_connect(pa, ca), 0);
	t_put(b, pa, "k1", msg, sizeof(msg), 1, 0);
	t_expect(b, NULL, 1, 0, &c);
	assert_int_equal(c.len, sizeof(msg));
	{
		char learned[PEER_ADDR_MAX] = "";

		assert_true(ferry__peer_addr_get(pa, "tcp", learned, sizeof(learned)));
		assert_string_equal(learned, da); /* learned from a, not configured */
	}

	pb = t_peer(a, "ctlB");
	v.iov_base = out;
	v.iov_len = sizeof(out);
	t_get(a, pb, "k1", &v, 1, 2, 0, 5 * SEC);
	t_expect(a, NULL, 2, 0, &c);
	assert_memory_equal(out, msg, sizeof(msg));

	/* And back: a learned b's data address from b's AUTH. */
	t_put(a, pb, "k2", msg, sizeof(msg), 3, 0);
	t_expect(a, NULL, 3, 0, NULL);
	t_get(b, pa, "k2", &v, 1, 4, 0, 5 * SEC);
	t_expect(b, NULL, 4, 0, NULL);

	/* Remote health both ways. */
	health_to(b, pa, 5, 5 * SEC);
	expect_health_of(b, 5, "ctlA");
	health_to(a, pb, 6, 5 * SEC);
	expect_health_of(a, 6, "ctlB");

	/* The command line asks over the control channel too. */
	{
		char cmd[512], out2[16384];
		size_t got;
		FILE *f;

		setenv("FERRY_SECRET", SECRET, 1);
		snprintf(cmd, sizeof(cmd), "%s/tools/ferry health -n %s -t 5000 -c %s ctlA",
			 FERRY_TEST_BINDIR, CNS, ca);
		f = popen(cmd, "r");
		assert_non_null(f);
		got = fread(out2, 1, sizeof(out2) - 1, f);
		out2[got] = '\0';
		assert_int_equal(pclose(f), 0);
		assert_non_null(strstr(out2, "\"engine\":\"ctlA\""));
		snprintf(cmd, sizeof(cmd), "%s/tools/ferry health -n %s -t 500 -c %s nobody "
			 "2>/dev/null", FERRY_TEST_BINDIR, CNS, ca);
		f = popen(cmd, "r");
		assert_non_null(f);
		assert_int_not_equal(pclose(f), 0);
		unsetenv("FERRY_SECRET");
	}

	/* Bad calls. */
	assert_int_equal(ferry_peer_connect(NULL, ca), -EINVAL);
	assert_int_equal(ferry_peer_connect(pa, NULL), -EINVAL);
	assert_int_equal(ferry_peer_connect(pa, "udp://1.2.3.4:5"), -EINVAL);
	assert_int_equal(ferry_peer_connect(pa, "tcp://127.0.0.1:0"), -EINVAL);
	assert_int_equal(ferry_engine_control_address(NULL, out, sizeof(out)), -EINVAL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_ctl_no_session(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0);
	struct ferry_peer *nobody = t_peer(a, "nobody");
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	char buf[64];

	(void)state;
	health_to(a, nobody, 1, SEC);
	t_expect(a, NULL, 1, -ENOTCONN, NULL);
	sqe = t_sqe(a);
	ferry_prep_lookup(sqe, nobody, "k", 2);
	t_submit(a);
	t_expect(a, NULL, 2, -ENOTCONN, NULL);
	t_fetch(a, nobody, "k", NULL, 0, 3, FERRY_SQE_NOWAIT, 0);
	t_expect(a, NULL, 3, -EAGAIN, NULL);
	t_fetch(a, nobody, "k", NULL, 0, 4, 0, SEC);
	t_expect(a, NULL, 4, -ENOTCONN, NULL);
	sqe = t_sqe(a);
	ferry_prep_lookup(sqe, nobody, "", 5);
	t_submit(a);
	t_expect(a, NULL, 5, -EINVAL, NULL);
	sqe = t_sqe(a);
	ferry_prep_remote_cancel(sqe, NULL, "r", 6);
	t_submit(a);
	t_expect(a, NULL, 6, -EINVAL, &c);
	/* An engine without control: no address. */
	{
		struct ferry_engine *plain = t_engine("plain", FERRY_PROGRESS_THREAD, 0);

		assert_int_equal(ferry_engine_control_address(plain, buf, sizeof(buf)), -ENOTCONN);
		ferry_engine_destroy(plain);
	}
	ferry_engine_destroy(a);
}

static void test_ctl_directory_and_store(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_peer *pa = connect_to(b, a); /* b -> a */
	struct ferry_peer *pb = t_peer(a, "ctlB");
	const char one[] = "published at b", three[] = "published later";
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	uint64_t used;

	(void)state;
	/* b (the producer) publishes k1 for a: it stays at b. */
	used = pool_in_use(b);
	t_publish(b, pa, "req1_k1", one, sizeof(one), 1, 0);
	t_expect(b, NULL, 1, 0, &c);
	assert_int_equal(c.len, sizeof(one));
	assert_int_equal(pool_in_use(b), used + 1);
	t_publish(b, pa, "req1_k1", one, sizeof(one), 2, 0);
	t_expect(b, NULL, 2, -EEXIST, NULL);

	/* a's directory queries: hit and miss, nothing moves. */
	sqe = t_sqe(a);
	ferry_prep_lookup(sqe, pb, "req1_k1", 3);
	t_submit(a);
	t_expect(a, NULL, 3, 1, &c);
	assert_int_equal(c.len, sizeof(one));
	sqe = t_sqe(a);
	ferry_prep_lookup(sqe, pb, "req1_nope", 4);
	t_submit(a);
	t_expect(a, NULL, 4, 0, NULL);

	/* A LOOKUP GET without metadata fetches it from b. */
	t_fetch(a, pb, "req1_k1", NULL, 0, 5, 0, 5 * SEC);
	t_expect(a, NULL, 5, 0, &c);
	assert_true(c.flags & FERRY_CQE_F_BUF);
	assert_int_equal(c.len, sizeof(one));
	assert_memory_equal(ferry_buf_data(c.buf), one, sizeof(one));
	ferry_buf_release(c.buf);
	/* ... and consumed it at b (its block comes back once tcp has the RESULT). */
	for (int i = 0; i < 500 && pool_in_use(b) != used; i++)
		usleep(10000);
	assert_int_equal(pool_in_use(b), used);

	/* Not there yet: NOWAIT says -EAGAIN (after the round trip). */
	t_fetch(a, pb, "req1_k2", NULL, 0, 6, FERRY_SQE_NOWAIT, 0);
	t_expect(a, NULL, 6, -EAGAIN, NULL);

	/* A waiting GET is served the moment b publishes: no polling. */
	t_fetch(a, pb, "req1_k3", NULL, 0, 7, 0, 5 * SEC);
	t_expect_none(a, NULL, 200);
	t_publish(b, pa, "req1_k3", three, sizeof(three), 8, 0);
	t_expect(b, NULL, 8, 0, NULL);
	t_expect(a, NULL, 7, 0, &c);
	assert_memory_equal(ferry_buf_data(c.buf), three, sizeof(three));
	ferry_buf_release(c.buf);

	/* A GET whose wait ends (deadline) leaves nothing behind that breaks later gets. */
	t_fetch(a, pb, "req2_k", NULL, 0, 9, 0, 100 * MS);
	t_expect(a, NULL, 9, -ETIMEDOUT, NULL);

	/* cleanup(request) at the producer frees what it published. */
	t_publish(b, pa, "req3_a", one, sizeof(one), 10, 0);
	t_expect(b, NULL, 10, 0, NULL);
	t_publish(b, pa, "req3_b", one, sizeof(one), 11, 0);
	t_expect(b, NULL, 11, 0, NULL);
	sqe = t_sqe(b);
	ferry_prep_cleanup(sqe, NULL, "req3", 12);
	t_submit(b);
	t_expect(b, NULL, 12, 2, NULL);
	t_fetch(a, pb, "req3_a", NULL, 0, 13, FERRY_SQE_NOWAIT, 0);
	t_expect(a, NULL, 13, -EAGAIN, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* Submit a LOOKUP of every peer (no peer) for key, with a deadline. */
static void lookup_every(struct ferry_engine *e, const char *key, uint64_t ud, int64_t timeout)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_lookup(sqe, NULL, key, ud);
	ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

/* Where is key waiting at the peer (a LOOKUP over the control channel): 0, 1 or 2. */
static int lookup_at(struct ferry_engine *e, struct ferry_peer *p, const char *key, uint64_t ud)
{
	struct ferry_cqe c;

	ferry_prep_lookup(t_sqe(e), p, key, ud);
	t_submit(e);
	assert_int_equal(t_wait_cqe(e, NULL, &c, 5 * SEC), 1);
	assert_int_equal(c.user_data, ud);
	return c.res;
}

/*
 * A LOOKUP GET that ends without its data (deadline, cancel) withdraws the
 * wish its holder remembered: the key published after that stays at the
 * holder (where a later GET fetches it) instead of being pushed to an
 * engine that no longer waits for it. A wish of another GET of the same key
 * stays and is served.
 */
static void test_ctl_lookup_withdrawn(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_peer *pa = connect_to(b, a); /* b -> a */
	struct ferry_peer *pb = t_peer(a, "ctlB");
	const char data[] = "published after the wait ended";
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	(void)state;
	/* Its deadline passes: the LOOKUP that follows on the session finds the wish gone. */
	t_fetch(a, pb, "req4_k", NULL, 0, 1, 0, 300 * MS);
	t_expect(a, NULL, 1, -ETIMEDOUT, NULL);
	assert_int_equal(lookup_at(a, pb, "req4_k", 2), 0);
	t_publish(b, pa, "req4_k", data, sizeof(data), 3, 0);
	t_expect(b, NULL, 3, 0, NULL);
	assert_int_equal(lookup_at(a, pb, "req4_k", 4), 1); /* kept at b, for a */
	t_fetch(a, pb, "req4_k", NULL, 0, 5, FERRY_SQE_NOWAIT, 0);
	t_expect(a, NULL, 5, 0, &c);
	assert_memory_equal(ferry_buf_data(c.buf), data, sizeof(data));
	ferry_buf_release(c.buf);

	/* Cancelled. */
	t_fetch(a, pb, "req5_k", NULL, 0, 6, 0, 0);
	t_expect_none(a, NULL, 200); /* asked, and remembered there */
	sqe = t_sqe(a);
	ferry_prep_cancel(sqe, 6, 7);
	t_submit(a);
	t_expect(a, NULL, 6, -ECANCELED, NULL);
	t_expect(a, NULL, 7, 0, NULL);
	assert_int_equal(lookup_at(a, pb, "req5_k", 8), 0);
	t_publish(b, pa, "req5_k", data, sizeof(data), 9, 0);
	t_expect(b, NULL, 9, 0, NULL);
	assert_int_equal(lookup_at(a, pb, "req5_k", 10), 1);

	/* Two GETs of one key: the one that gave up takes only its own wish. */
	t_fetch(a, pb, "req6_k", NULL, 0, 11, 0, 300 * MS);
	t_fetch(a, pb, "req6_k", NULL, 0, 12, 0, 10 * SEC);
	t_expect(a, NULL, 11, -ETIMEDOUT, NULL);
	assert_int_equal(lookup_at(a, pb, "req6_k", 13), 0);
	t_publish(b, pa, "req6_k", data, sizeof(data), 14, 0);
	t_expect(b, NULL, 14, 0, NULL);
	t_expect(a, NULL, 12, 0, &c);
	assert_memory_equal(ferry_buf_data(c.buf), data, sizeof(data));
	ferry_buf_release(c.buf);
	assert_int_equal(lookup_at(a, pb, "req6_k", 15), 0); /* pushed, taken */

	/* Cancelled before the holder's answer came: withdrawn all the same. */
	sqe = t_sqe(a);
	ferry_prep_fetch(sqe, pb, "req7_k", NULL, 0, 16);
	sqe = t_sqe(a);
	ferry_prep_cancel(sqe, 16, 17);
	t_submit(a); /* one batch: the FETCH goes out, the GET ends at once */
	t_expect(a, NULL, 16, -ECANCELED, NULL);
	t_expect(a, NULL, 17, 0, NULL);
	assert_int_equal(lookup_at(a, pb, "req7_k", 20), 0); /* after the FORGET on the session */
	t_publish(b, pa, "req7_k", data, sizeof(data), 18, 0);
	t_expect(b, NULL, 18, 0, NULL);
	assert_int_equal(lookup_at(a, pb, "req7_k", 19), 1); /* kept at b */
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * The answers of a LOOKUP of every peer (user_data ud): one CQE per holder
 * (MORE, res 1 or 2, len its size, its name in the buffer) into got as
 * "NAME WHERE LEN\n" lines, then the last CQE: its res (how many), or the
 * error that ended it.
 */
static int lookup_answers(struct ferry_engine *e, struct ferry_engine *other, uint64_t ud,
			  char *got, size_t len)
{
	size_t at = 0;

	got[0] = '\0';
	for (;;) {
		struct ferry_cqe q;

		if (!t_wait_cqe(e, other, &q, 5 * SEC))
			fail_msg("LOOKUP %llu: no answer within 5 s", (unsigned long long)ud);
		assert_int_equal(q.user_data, ud);
		if (!(q.flags & FERRY_CQE_F_MORE)) {
			assert_false(q.flags & FERRY_CQE_F_BUF);
			return q.res;
		}
		assert_true(q.res == 1 || q.res == 2);
		assert_true(q.flags & FERRY_CQE_F_BUF);
		at += (size_t)snprintf(got + at, len - at, "%s %d %llu\n",
				       (const char *)ferry_buf_data(q.buf), q.res,
				       (unsigned long long)q.len);
		ferry_buf_release(q.buf);
	}
}

/*
 * A LOOKUP with no peer asks every peer with a session at once: a CQE per
 * holder (MORE: WHERE as res, its size, its name), then how many.
 */
static void test_ctl_lookup_every_peer(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_engine *c = mk_ctl("ctlC", SECRET, 0, 0), *d = mk_ctl("ctlD", SECRET, 0, 0);
	struct ferry_peer *pab = connect_to(a, b), *pac = connect_to(a, c);
	struct ferry_peer *pba = t_peer(b, "ctlA");
	const char one[] = "published at b", two[] = "put at c by a";
	struct ferry_cqe q;

	(void)state;
	(void)pab;
	/* b publishes k for a (1); a's PUT of k waits untaken at c (2). */
	t_publish(b, pba, "req9_k", one, sizeof(one), 1, 0);
	t_expect(b, NULL, 1, 0, NULL);
	t_put(a, pac, "req9_k", two, sizeof(two), 2, 0);
	t_expect(a, NULL, 2, 0, NULL);

	lookup_every(a, "req9_k", 3, 5 * SEC);
	{
		char got[256], want_b[64], want_c[64];

		assert_int_equal(lookup_answers(a, NULL, 3, got, sizeof(got)), 2);
		snprintf(want_b, sizeof(want_b), "ctlB 1 %zu\n", sizeof(one));
		snprintf(want_c, sizeof(want_c), "ctlC 2 %zu\n", sizeof(two));
		assert_non_null(strstr(got, want_b));
		assert_non_null(strstr(got, want_c));
		assert_int_equal(strlen(got), strlen(want_b) + strlen(want_c));
	}

	/* Nobody holds it: 0, one CQE. Nothing moved: b still holds its key. */
	ferry_prep_lookup(t_sqe(a), NULL, "req9_none", 4);
	t_submit(a);
	t_expect(a, NULL, 4, 0, &q);
	assert_false(q.flags & (FERRY_CQE_F_BUF | FERRY_CQE_F_MORE));
	assert_int_equal(lookup_at(a, pab, "req9_k", 5), 1);

	/* An engine without sessions: -ENOTCONN. A NULL peer on another request: -EINVAL. */
	ferry_prep_lookup(t_sqe(d), NULL, "req9_k", 6);
	t_submit(d);
	t_expect(d, NULL, 6, -ENOTCONN, NULL);
	ferry_prep_peer_health(t_sqe(d), NULL, 7);
	t_submit(d);
	t_expect(d, NULL, 7, -EINVAL, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	ferry_engine_destroy(c);
	ferry_engine_destroy(d);
}

/*
 * Two engines that called each other have two sessions: a LOOKUP of every
 * peer still asks (and counts) each peer once.
 */
static void test_ctl_lookup_every_peer_once(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_peer *pab = connect_to(a, b), *pba = connect_to(b, a);
	const char one[] = "published at b";
	char want[64];

	(void)state;
	(void)pab;
	/* b's call to a is its own session: wait until a has both ready. */
	for (int i = 0; i < 500 && ctl_stat(a, "sessions_ready") < 2; i++)
		usleep(10000);
	assert_int_equal(ctl_stat(a, "sessions_ready"), 2);
	t_publish(b, pba, "req10_k", one, sizeof(one), 1, 0);
	t_expect(b, NULL, 1, 0, NULL);
	lookup_every(a, "req10_k", 2, 5 * SEC);
	{
		char got[256];

		assert_int_equal(lookup_answers(a, NULL, 2, got, sizeof(got)), 1);
		snprintf(want, sizeof(want), "ctlB 1 %zu\n", sizeof(one));
		assert_string_equal(got, want);
	}
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * A LOOKUP of every peer that ends before the answers come (deadline,
 * cancel: a MANUAL peer not driven does not answer) holds no buffer; the
 * answers that come later find nothing to complete.
 */
static void test_ctl_lookup_every_peer_ends(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = NULL;
	struct ferry_cqe c;
	char ca[NETADDR_MAX];
	uint64_t used;

	(void)state;
	b = mk_ctl_mode("ctlB", SECRET, 0, 0, FERRY_PROGRESS_MANUAL);
	ctl_addr(a, ca, sizeof(ca));
	assert_int_equal(ferry_peer_connect(t_peer(b, "ctlA"), ca), 0);
	health_to(b, t_peer(b, "ctlA"), 1, 5 * SEC);
	assert_int_equal(t_wait_cqe(b, NULL, &c, 5 * SEC), 1);
	assert_true(c.res > 0);
	ferry_buf_release(c.buf);
	used = pool_in_use(a);

	/* b is not driven now: no answer comes. */
	lookup_every(a, "req11_k", 2, 200 * MS);
	t_expect(a, NULL, 2, -ETIMEDOUT, NULL);
	assert_int_equal(pool_in_use(a), used);
	ferry_prep_lookup(t_sqe(a), NULL, "req11_k", 3);
	t_submit(a);
	t_expect_none(a, NULL, 50);
	assert_int_equal(pool_in_use(a), used); /* no text: holders come as CQEs */
	ferry_prep_cancel(t_sqe(a), 3, 4);
	t_submit(a);
	t_expect(a, NULL, 3, -ECANCELED, NULL);
	t_expect(a, NULL, 4, 0, NULL);
	assert_int_equal(pool_in_use(a), used);

	/* b answers the two late (driven while a waits): nothing else completes. */
	t_expect_none(a, b, 300);
	lookup_every(a, "req11_k", 5, 5 * SEC);
	t_expect(a, b, 5, 0, NULL);
	assert_int_equal(pool_in_use(a), used);

	/* Destroyed while it waits: its buffer goes with the engine's shutdown. */
	ferry_prep_lookup(t_sqe(a), NULL, "req11_k", 6);
	t_submit(a);
	t_expect_none(a, NULL, 50);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* A LOOKUP of every peer right after ferry_peer_connect waits for that handshake. */
static void test_ctl_lookup_every_peer_connecting(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	const char one[] = "published before anyone called";
	char cb[NETADDR_MAX], want[64];

	(void)state;
	t_publish(b, t_peer(b, "ctlA"), "req10_k", one, sizeof(one), 1, 0);
	t_expect(b, NULL, 1, 0, NULL);
	ctl_addr(b, cb, sizeof(cb));
	assert_int_equal(ferry_peer_connect(t_peer(a, "ctlB"), cb), 0);
	lookup_every(a, "req10_k", 2, 5 * SEC);
	{
		char got[256];

		assert_int_equal(lookup_answers(a, NULL, 2, got, sizeof(got)), 1);
		snprintf(want, sizeof(want), "ctlB 1 %zu\n", sizeof(one));
		assert_string_equal(got, want);
	}
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_ctl_remote_cancel(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_peer *pa = connect_to(b, a); /* b -> a */
	struct ferry_peer *pb = t_peer(a, "ctlB");
	const char x[] = "x";
	struct ferry_sqe *sqe;

	(void)state;
	/* b sent a data of request r7 that nobody took; a waits for another key of r7 from b. */
	t_put(b, pa, "r7_0", x, sizeof(x), 1, 0);
	t_expect(b, NULL, 1, 0, NULL);
	t_get(a, pb, "r7_1", NULL, 0, 2, 0, 0);
	t_get(a, pb, "r8_1", NULL, 0, 3, 0, 2 * SEC);
	/* A NOP behind them on the same queue: once it completes both GETs are parked. */
	ferry_prep_nop(t_sqe(a), 30);
	t_submit(a);
	t_expect(a, NULL, 30, 0, NULL);
	/* Where is r7_0 waiting at a? Our PUT of it, not yet taken: 2. */
	sqe = t_sqe(b);
	ferry_prep_lookup(sqe, pa, "r7_0", 31);
	t_submit(b);
	{
		struct ferry_cqe c;

		t_expect(b, NULL, 31, 2, &c);
		assert_int_equal(c.len, sizeof(x));
	}
	/* b gives up r7: a drops the data and its GET ends; r8 is left alone. */
	sqe = t_sqe(b);
	ferry_prep_remote_cancel(sqe, pa, "r7", 4);
	ferry_sqe_set_timeout(sqe, 5 * SEC);
	t_submit(b);
	t_expect(b, NULL, 4, 2, NULL);
	t_expect(a, NULL, 2, -ECANCELED, NULL);
	t_expect_none(a, NULL, 100);
	t_put(b, pa, "r8_1", x, sizeof(x), 5, 0);
	t_expect(b, NULL, 5, 0, NULL);
	t_expect(a, NULL, 3, 0, NULL);
	/* Gone now: 0. */
	sqe = t_sqe(b);
	ferry_prep_lookup(sqe, pa, "r7_0", 32);
	t_submit(b);
	t_expect(b, NULL, 32, 0, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * PUTs to a peer whose handshake has not answered wait in the engine (not
 * at a transport): one whose deadline passes there ends with -ETIMEDOUT,
 * one cancelled there with -ECANCELED, and the call's own failure later
 * (nobody answers: -EHOSTUNREACH after its bound) fails only what still
 * waits; each op completes once. A control port that accepts and never
 * speaks stands in for the silent peer.
 */
static void test_ctl_puts_wait_for_handshake(void **state)
{
	struct ferry_engine *c = mk_ctl("ctlW", SECRET, 0, 0);
	struct ferry_peer *p = t_peer(c, "mute");
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	char ep[64];
	const char x[] = "x";
	struct ferry_cqe e;
	struct ferry_sqe *sqe;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	int64_t t0;

	(void)state;
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 8), 0); /* the kernel accepts; nobody speaks */
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
	assert_int_equal(ferry_peer_connect(p, ep), 0);
	t0 = t_now();
	sqe = t_sqe(c);
	ferry_prep_put(sqe, p, "short", &(struct iovec){ (void *)x, 1 }, 1, 1);
	ferry_sqe_set_timeout(sqe, 200 * MS);
	t_submit(c);
	t_put(c, p, "cancelled", x, 1, 2, 0);
	t_put(c, p, "waits", x, 1, 3, 0);
	sqe = t_sqe(c);
	ferry_prep_cancel(sqe, 2, 4);
	t_submit(c);
	/* The cancel, and the cancelled PUT. */
	for (int n = 0; n < 2; n++) {
		assert_int_equal(t_wait_cqe(c, NULL, &e, 5 * SEC), 1);
		if (e.user_data == 4)
			assert_int_equal(e.res, 0);
		else
			assert_true(e.user_data == 2 && e.res == -ECANCELED);
	}
	assert_int_equal(t_wait_cqe(c, NULL, &e, 5 * SEC), 1);
	assert_int_equal(e.user_data, 1);
	assert_int_equal(e.res, -ETIMEDOUT);
	/*
	 * Its own deadline ended it, well before the call's bound (3 s; 30 s
	 * under valgrind, which a loaded machine may slow tenfold).
	 */
	assert_true(t_now() - t0 < (t_under_valgrind() ? 20 : 2) * SEC);
	/* The call gives up (no answer within its bound): what still waits fails. */
	assert_int_equal(t_wait_cqe(c, NULL, &e, 10 * SEC), 1);
	assert_int_equal(e.user_data, 3);
	assert_int_equal(e.res, -EHOSTUNREACH);
	t_expect_none(c, NULL, 200);
	ferry_engine_destroy(c);
	close(lfd);
}

/*
 * One address per engine, by URI: a's addresses name its control endpoint
 * (ferry://) and its data address (tcp://); b reaches a with the ferry://
 * one alone; a scheme no transport takes, or none, is refused.
 */
static void test_ctl_connect_by_uri(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = mk_ctl("ctlB", SECRET, 0, 0);
	struct ferry_peer *pa = t_peer(b, "ctlA");
	char all[256], ctl_uri[NETADDR_MAX + 8] = "", data[NETADDR_MAX];
	char *sp;
	int n;

	(void)state;
	n = ferry_engine_addresses(a, all, sizeof(all));
	assert_true(n > 0 && (size_t)n < sizeof(all));
	assert_int_equal(ferry_engine_address(a, data, sizeof(data)) > 0, 1);
	assert_non_null(strstr(all, data)); /* tcp://..., the data address */
	assert_true(!strncmp(all, "ferry://127.0.0.1:", 18));
	sp = strchr(all, ' ');
	assert_non_null(sp);
	snprintf(ctl_uri, sizeof(ctl_uri), "%.*s", (int)(sp - all), all);
	assert_int_equal(ferry_engine_addresses(a, all, 5), n); /* cut, like snprintf */
	assert_int_equal(strlen(all), 4);
	assert_int_equal(ferry_peer_connect_uri(pa, ctl_uri), 0);
	health_to(b, pa, 1, 5 * SEC);
	expect_health_of(b, 1, "ctlA");
	assert_int_equal(ferry_peer_connect_uri(pa, "nosuch://10.0.0.1:1"), -EPROTONOSUPPORT);
	assert_int_equal(ferry_peer_connect_uri(pa, "127.0.0.1:1"), -EINVAL);
	assert_int_equal(ferry_peer_connect_uri(NULL, ctl_uri), -EINVAL);
	ferry_engine_destroy(b);
	ferry_engine_destroy(a);
}

static void test_ctl_wrong_secret(void **state)
{
	struct ferry_engine *a, *c;
	struct ferry_peer *pa;
	char ca[NETADDR_MAX];
	const char x[] = "x";

	(void)state;
	t_log_capture(FERRY_LOG_WARN);
	a = mk_ctl("ctlA", SECRET, 0, 0);
	c = mk_ctl("ctlC", "not-the-secret", 0, 0);
	pa = t_peer(c, "ctlA");
	ctl_addr(a, ca, sizeof(ca));
	assert_int_equal(ferry_peer_connect(pa, ca), 0);
	t_put(c, pa, "k", x, sizeof(x), 1, 0);
	t_expect(c, NULL, 1, -EACCES, NULL);
	assert_false(ferry__peer_addr_get(pa, "tcp", (char[PEER_ADDR_MAX]){ 0 },
					  PEER_ADDR_MAX)); /* nothing learned */
	health_to(c, pa, 2, 2 * SEC);
	{
		struct ferry_cqe e;

		assert_int_equal(t_wait_cqe(c, NULL, &e, 5 * SEC), 1);
		assert_int_equal(e.user_data, 2);
		assert_true(e.res == -EACCES || e.res == -ETIMEDOUT);
	}
	/* a is unharmed: a caller with the secret gets in. */
	{
		struct ferry_engine *b = mk_ctl("ctlB", SECRET, 0, 0);

		connect_to(b, a);
		assert_int_equal(ctl_stat(a, "sessions_ready"), 1);
		/*
		 * c checked a's proof first and refused it: it never showed its
		 * own, but it says so, and a (the engine called) logs the refused
		 * peer at warn, with its address, and counts it.
		 */
		assert_int_equal(ctl_stat(c, "auth_failed"), 1);
		for (int i = 0; i < 200 && ctl_stat(a, "auth_failed") == 0; i++)
			usleep(10000);
		assert_int_equal(ctl_stat(a, "auth_failed"), 1);
		assert_true(t_log_seen(FERRY_LOG_WARN, "engine ctlA: ctlC (", "refused our proof"));
		{
			char h[8192];

			assert_true(ferry_engine_health(a, h, sizeof(h)) > 0);
			assert_non_null(strstr(h, "\"security\":{\"peers_refused\":1,"));
		}
		ferry_engine_destroy(b);
	}
	ferry_engine_destroy(c);
	ferry_engine_destroy(a);
}

static long long sec_stat(struct ferry_engine *e, const char *name)
{
	return t_health_num(e, "\"security\":{", name);
}

enum { FLOOD = 200 };

/*
 * 200 silent TCP connections to the control port (libzmq held each for its
 * default 30 s handshake interval; nothing bounded how many): at most 64 that
 * proved nothing are held at once (the oldest hung up on), every one is hung
 * up on within the handshake bound (3 s; here: 15 s at most), each counted,
 * and a peer with the secret still gets a session during the flood. Then a
 * caller that finishes libzmq's greeting and then says nothing, and one that
 * says HELLO and never proves anything: hung up on as well.
 */
static void test_ctl_silent_flood(void **state)
{
	struct ferry_engine *a, *b;
	static int fds[FLOOD];
	char ca[NETADDR_MAX];
	int64_t t0, end;

	(void)state;
	mk_handshake_ms = 3000; /* the bound under test, valgrind or not */
	a = mk_ctl("ctlA", SECRET, 0, 0);
	mk_handshake_ms = 0;
	ctl_addr(a, ca, sizeof(ca));
	t_silent_open(fds, FLOOD, port_of(ca));
	t0 = t_now();
	/* The count bound, at every moment: the oldest go as newer ones come. */
	for (end = t_now() + 10 * SEC; t_now() < end && sec_stat(a, "handshakes_dropped") <
							       FLOOD - CTL_TEST_PREAUTH_MAX;) {
		assert_true(sec_stat(a, "unproved_connections") <= CTL_TEST_PREAUTH_MAX);
		usleep(2000);
	}
	assert_true(sec_stat(a, "handshakes_dropped") >= FLOOD - CTL_TEST_PREAUTH_MAX);
	assert_true(sec_stat(a, "unproved_connections") <= CTL_TEST_PREAUTH_MAX);
	/* A caller with the secret is served all the same. */
	b = mk_ctl("ctlB", SECRET, 0, 0);
	connect_to(b, a);
	/* The time bound: every one of them is hung up on. */
	assert_true(t_silent_all_closed(fds, FLOOD, 15000));
	fprintf(stderr, "# %d silent connections hung up on within %.1f s\n", FLOOD,
		(double)(t_now() - t0) / SEC);
	assert_true(sec_stat(a, "handshakes_dropped") >= FLOOD);
	assert_int_equal(ctl_stat(a, "sessions_ready"), 1); /* b's, still up */

	/* libzmq's greeting done, then silence: no HELLO ever. */
	{
		void *zc = zmq_ctx_new(), *z = zmq_socket(zc, ZMQ_DEALER);
		int no_reconnect = -1, zero = 0;
		long long before = sec_stat(a, "handshakes_dropped");

		zmq_setsockopt(z, ZMQ_RECONNECT_IVL, &no_reconnect, sizeof(no_reconnect));
		zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
		assert_int_equal(zmq_connect(z, ca), 0);
		for (end = t_now() + 15 * SEC;
		     t_now() < end && sec_stat(a, "handshakes_dropped") == before;)
			usleep(20000);
		assert_true(sec_stat(a, "handshakes_dropped") > before);
		zmq_close(z);
		zmq_ctx_term(zc);
	}
	/* HELLO, then no AUTH. */
	{
		void *zc = zmq_ctx_new(), *z = zmq_socket(zc, ZMQ_DEALER);
		int no_reconnect = -1, zero = 0;
		long long before = sec_stat(a, "handshakes_dropped");
		uint8_t m[CTL_HDR_BYTES + sizeof(struct ctl_hello)];
		struct ctl_hello h;

		memset(&h, 0, sizeof(h));
		snprintf(h.caller, sizeof(h.caller), "mute");
		snprintf(h.callee, sizeof(h.callee), "ctlA");
		snprintf(h.ns, sizeof(h.ns), CNS);
		ctl_hdr_pack(m, CTL_HELLO, sizeof(h), 0);
		memcpy(m + CTL_HDR_BYTES, &h, sizeof(h));
		zmq_setsockopt(z, ZMQ_RECONNECT_IVL, &no_reconnect, sizeof(no_reconnect));
		zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
		assert_int_equal(zmq_connect(z, ca), 0);
		assert_int_equal(zmq_send(z, m, sizeof(m), 0), (int)sizeof(m));
		for (end = t_now() + 15 * SEC;
		     t_now() < end && sec_stat(a, "handshakes_dropped") == before;)
			usleep(20000);
		assert_true(sec_stat(a, "handshakes_dropped") > before);
		for (end = t_now() + 5 * SEC; t_now() < end && sec_stat(a, "unproved_connections");)
			usleep(20000);
		assert_int_equal(sec_stat(a, "unproved_connections"), 0);
		zmq_close(z);
		zmq_ctx_term(zc);
	}
	ferry_engine_destroy(b);
	ferry_engine_destroy(a);
}

/* Raw ZeroMQ messages a hostile or broken caller might send. */
static void raw_send(void *z, const void *m, size_t n, int flags)
{
	assert_true(zmq_send(z, m, n, flags) == (int)n);
}

static void test_ctl_malformed_messages(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0);
	void *ctx = zmq_ctx_new();
	void *z = zmq_socket(ctx, ZMQ_DEALER);
	uint8_t m[CTL_HDR_BYTES + sizeof(struct ctl_hello) + 16];
	struct ctl_hello h;
	char ca[NETADDR_MAX];
	int zero = 0, tmo = t_under_valgrind() ? 5000 : 300;
	char big[4096];

	(void)state;
	ctl_addr(a, ca, sizeof(ca));
	zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(z, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
	assert_int_equal(zmq_connect(z, ca), 0);
	raw_send(z, "x", 1, 0);                         /* shorter than a header */
	memset(m, 0xab, sizeof(m));
	raw_send(z, m, CTL_HDR_BYTES, 0);               /* wrong magic */
	ctl_hdr_pack(m, CTL_PING, 0, 1);
	m[4] = 9;                                       /* another version */
	raw_send(z, m, CTL_HDR_BYTES, 0);
	ctl_hdr_pack(m, 77, 0, 1);                      /* unknown type */
	raw_send(z, m, CTL_HDR_BYTES, 0);
	ctl_hdr_pack(m, CTL_PING, 5, 1);                /* length says 5, there are 0 */
	raw_send(z, m, CTL_HDR_BYTES, 0);
	ctl_hdr_pack(m, CTL_HEALTH_REQ, 0, 1);          /* a request before any HELLO */
	raw_send(z, m, CTL_HDR_BYTES, 0);
	ctl_hdr_pack(m, CTL_HELLO, 3, 1);               /* a HELLO of 3 bytes */
	raw_send(z, m, CTL_HDR_BYTES + 3, 0);
	ctl_hdr_pack(m, CTL_PING, 0, 1);                /* two parts */
	raw_send(z, m, CTL_HDR_BYTES, ZMQ_SNDMORE);
	raw_send(z, m, CTL_HDR_BYTES, 0);
	memset(&h, 0, sizeof(h));                       /* names without NUL */
	memset(h.caller, 'a', sizeof(h.caller));
	snprintf(h.callee, sizeof(h.callee), "ctlA");
	snprintf(h.ns, sizeof(h.ns), CNS);
	ctl_hdr_pack(m, CTL_HELLO, sizeof(h), 1);
	memcpy(m + CTL_HDR_BYTES, &h, sizeof(h));
	raw_send(z, m, CTL_HDR_BYTES + sizeof(h), 0);
	/* A well-formed HELLO, then a garbage AUTH: a PROOF comes, then nothing. */
	snprintf(h.caller, sizeof(h.caller), "raw");
	ctl_hdr_pack(m, CTL_HELLO, sizeof(h), 1);
	memcpy(m + CTL_HDR_BYTES, &h, sizeof(h));
	raw_send(z, m, CTL_HDR_BYTES + sizeof(h), 0);
	{
		uint8_t in[512];
		struct ctl_hdr rh;
		int n = zmq_recv(z, in, sizeof(in), 0);

		assert_true(n > 0);
		assert_int_equal(ctl_hdr_check(in, (size_t)n, &rh), 0);
		assert_int_equal(rh.type, CTL_PROOF);
	}
	memset(big, 0, sizeof(big));
	ctl_hdr_pack(m, CTL_AUTH, sizeof(struct ctl_auth), 1); /* a wrong proof */
	memcpy(big, m, CTL_HDR_BYTES);
	raw_send(z, big, CTL_HDR_BYTES + sizeof(struct ctl_auth), 0);
	{
		uint8_t in[512];
		struct ctl_hdr rh;
		int n = zmq_recv(z, in, sizeof(in), 0);

		assert_true(n > 0);
		assert_int_equal(ctl_hdr_check(in, (size_t)n, &rh), 0);
		assert_int_equal(rh.type, CTL_NO);
	}
	/* A frame over the size limit: libzmq drops the connection. */
	{
		size_t n = CTL_MAX_MSG + 4096;
		uint8_t *huge = calloc(1, n);

		assert_non_null(huge);
		raw_send(z, huge, n, 0);
		free(huge);
	}
	zmq_close(z);
	zmq_ctx_term(ctx);
	/* Each one was counted (the oversized frame never reached us). */
	assert_true(ctl_stat(a, "dropped") >= 9);
	assert_int_equal(ctl_stat(a, "auth_failed"), 1);
	assert_int_equal(ctl_stat(a, "sessions_ready"), 0);
	/* a still serves an honest caller. */
	{
		struct ferry_engine *b = mk_ctl("ctlB", SECRET, 0, 0);
		struct ferry_peer *pa = connect_to(b, a);

		health_to(b, pa, 7, 5 * SEC);
		expect_health_of(b, 7, "ctlA");
		ferry_engine_destroy(b);
	}
	ferry_engine_destroy(a);
}

static char logged[1024];

static void grab_log(int level, const char *line, void *arg)
{
	(void)level;
	(void)arg;
	if (strstr(line, "control"))
		snprintf(logged, sizeof(logged), "%s", line);
}

static void test_ctl_addr_in_use(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = NULL;
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	char ca[NETADDR_MAX];

	(void)state;
	ctl_addr(a, ca, sizeof(ca));
	p.name = "ctlB";
	p.ns = CNS;
	p.pool_size = 8 * MIB;
	p.secret = SECRET;
	p.control = ca;
	logged[0] = '\0';
	ferry_log_set(FERRY_LOG_ERROR, grab_log, NULL);
	assert_int_equal(ferry_engine_create(&p, &b), -EADDRINUSE);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	assert_null(b);
	assert_non_null(strstr(logged, ca));
	/* Non-loopback without a secret, and garbage, are refused. */
	p.secret = NULL;
	unsetenv("FERRY_SECRET");
	p.control = "tcp://10.1.2.3:0";
	assert_int_equal(ferry_engine_create(&p, &b), -EACCES);
	p.control = "nonsense";
	assert_int_equal(ferry_engine_create(&p, &b), -EINVAL);
	ferry_engine_destroy(a);
}

/* A child engine that serves until killed. */
static int serve_forever(const char *unused, void *arg)
{
	struct ferry_engine *b;
	int fd = *(int *)arg;
	char addr[NETADDR_MAX];

	(void)unused;
	b = mk_ctl("ctlB", SECRET, 100, 600);
	if (!b || ferry_engine_control_address(b, addr, sizeof(addr)) <= 0)
		return 1;
	if (t_write(fd, addr, strlen(addr)) != (ssize_t)strlen(addr))
		return 2;
	for (;;)
		pause();
	return 0;
}

static void test_ctl_dead_peer(void **state)
{
	const uint32_t timeout_ms = 600;
	struct ferry_engine *a;
	struct ferry_peer *pb;
	struct child ch;
	int back[2];
	char addr[NETADDR_MAX];
	struct ferry_cqe c;
	int64_t t0, took;

	(void)state;
	assert_int_equal(pipe(back), 0);
	spawn(&ch, serve_forever, &back[1]);
	go(&ch, "go");
	assert_int_equal(wait_text(back[0], addr, sizeof(addr), 20000), 0);
	a = mk_ctl("ctlA", SECRET, 100, timeout_ms);
	pb = t_peer(a, "ctlB");
	assert_int_equal(ferry_peer_connect(pb, addr), 0);
	health_to(a, pb, 1, 5 * SEC);
	expect_health_of(a, 1, "ctlB");
	/* A GET that waits on b forever, unless b dies. */
	t_fetch(a, pb, "never", NULL, 0, 2, 0, 0);
	t_expect_none(a, NULL, 300); /* heartbeats keep the session alive meanwhile */
	kill(ch.pid, SIGKILL);
	t0 = t_now();
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	t_expect(a, NULL, 2, -ECONNRESET, &c);
	took = t_now() - t0;
	/* Declared after peer_timeout_ms of silence, within a tick or two more. */
	if (!t_under_valgrind())
		assert_true(took < (int64_t)(timeout_ms + 1500) * MS);
	assert_int_equal(ctl_stat(a, "declared_dead"), 1);
	assert_int_equal(ctl_stat(a, "sessions_ready"), 0);
	health_to(a, pb, 3, 500 * MS); /* the session is gone (being called again) */
	assert_int_equal(t_wait_cqe(a, NULL, &c, 5 * SEC), 1);
	assert_true(c.res == -ETIMEDOUT || c.res == -EHOSTUNREACH);
	close(back[0]);
	close(back[1]);
	ferry_engine_destroy(a);
}

/* A child engine "ctlB" on control port *arg, once told to go; serves until killed. */
static int serve_on_port(const char *unused, void *arg)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *b = NULL;
	const int *a = arg; /* port, back pipe */
	char ep[64];

	(void)unused;
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", a[0]);
	p.name = "ctlB";
	p.ns = CNS;
	p.pool_size = 8 * MIB;
	p.control = ep;
	p.secret = SECRET;
	p.heartbeat_ms = 100;
	p.peer_timeout_ms = 600;
	p.handshake_ms = t_handshake_ms();
	for (int i = 0; i < 100 && ferry_engine_create(&p, &b); i++)
		usleep(50000); /* the address may linger a moment after the last owner died */
	if (!b || t_write(a[1], "up", 2) != 2)
		return 1;
	for (;;)
		pause();
	return 0;
}

/* A peer restarted at the same control address is called again and found. */
static void test_ctl_peer_restarts(void **state)
{
	int arg[2], back[2];
	struct child first, second;
	struct ferry_engine *a;
	struct ferry_peer *pb;
	char ep[64], text[8];

	(void)state;
	assert_int_equal(pipe(back), 0);
	arg[0] = t_free_tcp_port();
	arg[1] = back[1];
	spawn(&first, serve_on_port, arg);
	spawn(&second, serve_on_port, arg);
	go(&first, "go");
	assert_int_equal(wait_text(back[0], text, sizeof(text), 20000), 0);
	a = mk_ctl("ctlA", SECRET, 100, 600);
	pb = t_peer(a, "ctlB");
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", arg[0]);
	assert_int_equal(ferry_peer_connect(pb, ep), 0);
	health_to(a, pb, 1, 5 * SEC);
	expect_health_of(a, 1, "ctlB");
	kill(first.pid, SIGKILL);
	assert_int_equal(t_reap(first.pid), 128 + SIGKILL);
	/* Declared dead, then called again until somebody answers there. */
	for (int i = 0; i < 100 && ctl_stat(a, "declared_dead") == 0; i++)
		usleep(50000);
	assert_int_equal(ctl_stat(a, "declared_dead"), 1);
	go(&second, "go");
	assert_int_equal(wait_text(back[0], text, sizeof(text), 20000), 0);
	health_to(a, pb, 2, 10 * SEC); /* waits for the new session */
	expect_health_of(a, 2, "ctlB");
	kill(second.pid, SIGKILL);
	assert_int_equal(t_reap(second.pid), 128 + SIGKILL);
	close(back[0]);
	close(back[1]);
	ferry_engine_destroy(a);
}

/* Nobody answers at the control address: PUTs that wait fail, nothing hangs. */
static void test_ctl_nobody_there(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 100, 600);
	struct ferry_peer *p = t_peer(a, "ghost");
	char ep[64];
	const char x[] = "x";
	struct ferry_cqe c;

	(void)state;
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", t_free_tcp_port());
	assert_int_equal(ferry_peer_connect(p, ep), 0);
	t_put(a, p, "k", x, sizeof(x), 1, 0);
	assert_int_equal(t_wait_cqe(a, NULL, &c, 10 * SEC), 1); /* the 3 s handshake bound */
	assert_int_equal(c.user_data, 1);
	assert_int_equal(c.res, -EHOSTUNREACH);
	health_to(a, p, 2, 0); /* no deadline: the failed handshake ends it too */
	t_expect(a, NULL, 2, -EHOSTUNREACH, NULL);
	ferry_engine_destroy(a);
}

/* An engine in MANUAL mode runs its control channel inside cq_wait/progress. */
static void test_ctl_manual_mode(void **state)
{
	struct ferry_engine *a = mk_ctl("ctlA", SECRET, 0, 0), *b = NULL;
	struct ferry_peer *pa, *pb;
	const char one[] = "manual";
	char ca[NETADDR_MAX];
	struct ferry_cqe c;

	(void)state;
	b = mk_ctl_mode("ctlB", SECRET, 0, 0, FERRY_PROGRESS_MANUAL);
	ctl_addr(a, ca, sizeof(ca));
	pa = t_peer(b, "ctlA");
	assert_int_equal(ferry_peer_connect(pa, ca), 0);
	health_to(b, pa, 1, 5 * SEC);
	assert_int_equal(t_wait_cqe(b, NULL, &c, 5 * SEC), 1);
	assert_true(c.res > 0);
	ferry_buf_release(c.buf);
	/* The manual engine holds a published key; the threaded one fetches it. */
	t_publish(b, pa, "m1", one, sizeof(one), 2, 0);
	t_expect(b, NULL, 2, 0, NULL);
	pb = t_peer(a, "ctlB");
	t_fetch(a, pb, "m1", NULL, 0, 3, 0, 5 * SEC);
	t_expect(a, b, 3, 0, &c); /* drives b while waiting */
	assert_memory_equal(ferry_buf_data(c.buf), one, sizeof(one));
	ferry_buf_release(c.buf);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ctl_handshake_publishes_data_address),
		cmocka_unit_test(test_ctl_no_session),
		cmocka_unit_test(test_ctl_directory_and_store),
		cmocka_unit_test(test_ctl_lookup_withdrawn),
		cmocka_unit_test(test_ctl_lookup_every_peer),
		cmocka_unit_test(test_ctl_lookup_every_peer_once),
		cmocka_unit_test(test_ctl_lookup_every_peer_ends),
		cmocka_unit_test(test_ctl_lookup_every_peer_connecting),
		cmocka_unit_test(test_ctl_remote_cancel),
		cmocka_unit_test(test_ctl_puts_wait_for_handshake),
		cmocka_unit_test(test_ctl_connect_by_uri),
		cmocka_unit_test(test_ctl_wrong_secret),
		cmocka_unit_test(test_ctl_silent_flood),
		cmocka_unit_test(test_ctl_malformed_messages),
		cmocka_unit_test(test_ctl_addr_in_use),
		cmocka_unit_test(test_ctl_dead_peer),
		cmocka_unit_test(test_ctl_peer_restarts),
		cmocka_unit_test(test_ctl_nobody_there),
		cmocka_unit_test(test_ctl_manual_mode),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

#else

int main(void)
{
	printf("test_ctl: built without libzmq: skipped\n");
	return 77;
}

#endif

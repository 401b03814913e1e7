/*
 * tests/test_tcp_netns.c - the tcp transport between hosts: engines in
 * network namespaces joined by veth pairs, which the test creates and
 * removes. Root only: elsewhere it exits 77 (skipped) and says why.
 *
 * Hosts (namespaces) and links, 10.<net>.<k>.0/24 per veth pair:
 *   A --veth-- B      A --veth-- C
 * Covered: two hosts (many small PUTs and a 64 MiB rendezvous PUT with a
 * checksum, both ways), an engine without a secret refusing a peer that
 * is not on loopback, the link cut (`ip link set down`) in the middle of a
 * transfer (the PUT fails within the peer timeout, no block is kept) and a
 * reconnect once the link is back, three hosts (B and C -> A at once), and
 * the control channel across hosts (one control address on every interface;
 * published wildcard data addresses become the address each side saw;
 * store-like keys fetched from the holder, a NOWAIT miss, remote health).
 * Every process enters its namespace with setns(2) after the fork.
 */
#include <signal.h>
#include <sys/stat.h>

#include "netns.h"
#include "tcp_helpers.h"

static char rundir[256];
static char ns_a[32], ns_b[32], ns_c[32];
static int net; /* second octet of this run's addresses */

static void net_down(void)
{
	ns_sh("ip netns del %s 2>/dev/null", ns_a);
	ns_sh("ip netns del %s 2>/dev/null", ns_b);
	ns_sh("ip netns del %s 2>/dev/null", ns_c);
}

/* A <-> peer over veth pair k: A is 10.net.k.1, peer 10.net.k.2. */
static int net_pair(const char *peer, int k)
{
	char va[16], vp[16];

	snprintf(va, sizeof(va), "fa%d_%d", k, net);
	snprintf(vp, sizeof(vp), "fp%d_%d", k, net);
	return ns_sh("ip link add %s netns %s type veth peer name %s netns %s", va, ns_a, vp,
		     peer) ||
	       ns_sh("ip -n %s addr add 10.%d.%d.1/24 dev %s", ns_a, net, k, va) ||
	       ns_sh("ip -n %s addr add 10.%d.%d.2/24 dev %s", peer, net, k, vp) ||
	       ns_sh("ip -n %s link set %s up", ns_a, va) ||
	       ns_sh("ip -n %s link set %s up", peer, vp) ||
	       ns_sh("ip -n %s link set lo up", peer);
}

static int group_setup(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr, "test_tcp_netns: skipped: needs root (network namespaces)\n");
		exit(77);
	}
	net = 100 + getpid() % 100;
	snprintf(ns_a, sizeof(ns_a), "ferry%da", getpid());
	snprintf(ns_b, sizeof(ns_b), "ferry%db", getpid());
	snprintf(ns_c, sizeof(ns_c), "ferry%dc", getpid());
	if (ns_sh("ip netns add %s", ns_a) || ns_sh("ip netns add %s", ns_b) ||
	    ns_sh("ip netns add %s", ns_c) || ns_sh("ip -n %s link set lo up", ns_a) ||
	    net_pair(ns_b, 1) || net_pair(ns_c, 2)) {
		net_down();
		fprintf(stderr, "test_tcp_netns: skipped: cannot create namespaces and veth pairs "
				"here\n");
		exit(77);
	}
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-tcpns-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	unsetenv("FERRY_SECRET");
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	net_down();
	ns_sh("rm -rf %s", rundir);
	return 0;
}

static int setup(void **state)
{
	(void)state;
	alarm(t_under_valgrind() ? 900 : 120);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	alarm(0);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Roles (children, each in its namespace)                             */
/* ------------------------------------------------------------------ */

struct role {
	const char *ns;
	const char *name;
	const char *listen; /* consumer: where to listen */
	const char *to;     /* producer: the consumer's name */
	const char *secret;
	unsigned small;     /* small PUTs "s<i>" of 1000 B */
	uint64_t large;     /* one PUT "L" of this size (0: none) */
	uint32_t heartbeat_ms, peer_timeout_ms;
	int out;            /* consumer: its address goes here */
	int expect;         /* producer: what its first PUT completes with */
};

/* Producer: reaches `to` at addr, PUTs small then large; 0 if all went as expected. */
static int producer(const char *addr, void *arg)
{
	struct role *r = arg;
	struct mk m = { .name = r->name, .secret = r->secret, .pool = 160 * MIB,
			.heartbeat_ms = r->heartbeat_ms, .peer_timeout_ms = r->peer_timeout_ms };
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	int rc;

	if (ns_enter(r->ns))
		return 20;
	e = mk_engine(&m);
	if (!e)
		return 21;
	ferry_peer_open(e, r->to, &to);
	rc = ferry_peer_set_address(to, addr);
	if (rc)
		return rc == r->expect ? 0 : 22;
	for (unsigned i = 0; i < r->small; i++) {
		struct ferry_buf *b;
		char key[32];

		if (ferry_buf_alloc(e, 1000, &b))
			return 23;
		fill(ferry_buf_data(b), 1000, i);
		snprintf(key, sizeof(key), "s%u", i);
		put_buf(e, to, key, b, i, 20 * SEC);
		if (t_wait_one(e, &c, 20 * SEC) != (i == 0 ? r->expect : 0))
			return i == 0 ? 24 : 25;
		if (r->expect)
			return 0;
	}
	if (r->large) {
		struct ferry_buf *b;

		if (ferry_buf_alloc(e, r->large, &b))
			return 26;
		fill(ferry_buf_data(b), r->large, 99);
		put_buf(e, to, "L", b, 1000, 30 * SEC);
		if (t_wait_one(e, &c, 30 * SEC) != 0)
			return 27;
	}
	rc = pool_in_use(e) ? 28 : 0;
	ferry_engine_destroy(e);
	return rc;
}

/* Consumer: GETs what the producers in `from` send (none: serves until killed). */
struct consumer {
	struct role r;
	const char *from[2];
	unsigned nfrom;
};

static int consumer(const char *unused, void *arg)
{
	struct consumer *k = arg;
	struct role *r = &k->r;
	struct mk m = { .name = r->name, .listen = r->listen, .secret = r->secret,
			.pool = 320 * MIB };
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	uint64_t want = r->large ? expected_sum(r->large, 99) : 0;
	uint8_t *exp = malloc(1000);
	int rc = 0;

	(void)unused;
	if (ns_enter(r->ns))
		return 30;
	e = mk_engine(&m);
	if (!e)
		return 31;
	if (ferry_engine_address(e, addr, sizeof(addr)) <= 0 ||
	    t_write(r->out, addr, strlen(addr)) < 0)
		return 32;
	if (k->nfrom == 0)
		pause(); /* serves until the test kills it */
	for (unsigned p = 0; p < k->nfrom; p++) {
		struct ferry_peer *from = t_peer(e, k->from[p]);
		struct ferry_cqe c;

		for (unsigned i = 0; i < r->small; i++) {
			char key[32];

			snprintf(key, sizeof(key), "s%u", i);
			get(e, from, key, NULL, i, 30 * SEC, 0);
			if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != 1000)
				return 33;
			fill(exp, 1000, i);
			if (memcmp(ferry_buf_data(c.buf), exp, 1000))
				return 34;
			ferry_buf_release(c.buf);
		}
		if (r->large) {
			get(e, from, "L", NULL, 1000, 30 * SEC, 0);
			if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != r->large)
				return 35;
			if (checksum(ferry_buf_data(c.buf), r->large) != want)
				return 36;
			ferry_buf_release(c.buf);
		}
	}
	if (pool_in_use(e))
		rc = 37;
	ferry_engine_destroy(e);
	free(exp);
	return rc;
}

static void start_consumer(struct child *ch, struct consumer *k, char *addr, size_t len)
{
	int p[2];

	assert_int_equal(pipe(p), 0);
	k->r.out = p[1];
	spawn(ch, consumer, k);
	close(p[1]);
	go(ch, "-");
	assert_int_equal(wait_text(p[0], addr, len, 20000), 0);
	close(p[0]);
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_netns_two_hosts(void **state)
{
	char listen[64], addr[NETADDR_MAX];
	struct consumer k = { .r = { .ns = ns_a, .name = "cons", .listen = listen,
				      .secret = SECRET, .small = 500, .large = 64 * MIB },
			      .from = { "prod" }, .nfrom = 1 };
	struct role p = { .ns = ns_b, .name = "prod", .to = "cons", .secret = SECRET,
			  .small = 500, .large = 64 * MIB };
	struct child cc, cp;

	(void)state;
	snprintf(listen, sizeof(listen), "tcp://10.%d.1.1:0", net);
	spawn(&cp, producer, &p);
	start_consumer(&cc, &k, addr, sizeof(addr));
	go(&cp, addr);
	assert_int_equal(t_reap(cp.pid), 0);
	assert_int_equal(t_reap(cc.pid), 0);
}

static void test_netns_no_secret(void **state)
{
	char listen[64], addr[NETADDR_MAX];
	/* A consumer without a secret accepts loopback peers only. */
	struct consumer k = { .r = { .ns = ns_a, .name = "cons", .listen = listen },
			      .nfrom = 0 };
	struct role p = { .ns = ns_b, .name = "prod", .to = "cons", .secret = SECRET, .small = 1,
			  .expect = -EHOSTUNREACH };
	/* A producer without a secret does not even call a remote host. */
	struct role q = { .ns = ns_b, .name = "prod", .to = "cons", .small = 1, .expect = -EACCES };
	struct child cc, cp, cq;

	(void)state;
	snprintf(listen, sizeof(listen), "tcp://10.%d.1.1:0", net);
	spawn(&cp, producer, &p);
	spawn(&cq, producer, &q);
	start_consumer(&cc, &k, addr, sizeof(addr));
	go(&cp, addr);
	assert_int_equal(t_reap(cp.pid), 0);
	go(&cq, addr);
	assert_int_equal(t_reap(cq.pid), 0);
	kill(cc.pid, SIGKILL);
	t_reap(cc.pid);
}

/* The producer's side of the cut: PUTs until told, reports each result on a pipe. */
struct cutter {
	struct role r;
	int results;  /* write end: one int per PUT */
	int go_fd;    /* read end: a byte per PUT to make */
	int go_wr;    /* its write end, which the child closes */
};

static int cut_producer(const char *addr, void *arg)
{
	struct cutter *ct = arg;
	struct role *r = &ct->r;
	struct mk m = { .name = r->name, .secret = r->secret, .pool = 300 * MIB,
			.heartbeat_ms = r->heartbeat_ms, .peer_timeout_ms = r->peer_timeout_ms };
	struct ferry_engine *e;
	struct ferry_peer *to;
	char cmd;

	close(ct->go_wr);
	if (ns_enter(r->ns))
		return 20;
	e = mk_engine(&m);
	if (!e)
		return 21;
	ferry_peer_open(e, r->to, &to);
	if (ferry_peer_set_address(to, addr))
		return 22;
	/* Each byte asks for one PUT: 's' small, 'L' large. */
	for (unsigned n = 0; t_read(ct->go_fd, &cmd, 1) == 1; n++) {
		char key[32];
		struct ferry_buf *b;
		struct ferry_cqe c;
		uint64_t len = cmd == 'L' ? 256 * MIB : 1000;
		int res[2];
		int64_t t0 = t_now();

		if (ferry_buf_alloc(e, len, &b))
			return 23;
		memset(ferry_buf_data(b), 7, len);
		snprintf(key, sizeof(key), "%c%u", cmd, n);
		put_buf(e, to, key, b, 1, 20 * SEC);
		res[0] = t_wait_one(e, &c, 30 * SEC);
		res[1] = (int)((t_now() - t0) / MS);
		if (t_write(ct->results, res, sizeof(res)) != sizeof(res))
			return 24;
	}
	{
		int rc = pool_in_use(e) ? 28 : 0;

		ferry_engine_destroy(e);
		return rc;
	}
}

/* Read one result pair, waiting at most ms. */
static int read_result(int fd, int res[2], int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (t_poll(&p, 1, ms) != 1)
		return -1;
	return t_read(fd, res, 2 * sizeof(int)) == 2 * sizeof(int) ? 0 : -1;
}

static void test_netns_link_down(void **state)
{
	char listen[64], addr[NETADDR_MAX], vp[16];
	struct consumer k = { .r = { .ns = ns_a, .name = "cons", .listen = listen,
				      .secret = SECRET }, .nfrom = 0 };
	struct cutter ct = { .r = { .ns = ns_b, .name = "prod", .to = "cons", .secret = SECRET,
				     .heartbeat_ms = 100, .peer_timeout_ms = 1000 } };
	int res_pipe[2], go_pipe[2], res[2];
	struct child cc, cp;

	(void)state;
	snprintf(listen, sizeof(listen), "tcp://10.%d.1.1:0", net);
	snprintf(vp, sizeof(vp), "fp1_%d", net);
	assert_int_equal(pipe(res_pipe), 0);
	assert_int_equal(pipe(go_pipe), 0);
	ct.results = res_pipe[1];
	ct.go_fd = go_pipe[0];
	ct.go_wr = go_pipe[1];
	spawn(&cp, cut_producer, &ct);
	close(res_pipe[1]);
	close(go_pipe[0]);
	start_consumer(&cc, &k, addr, sizeof(addr));
	go(&cp, addr);

	/* A PUT goes through. */
	assert_int_equal(t_write(go_pipe[1], "s", 1), 1);
	assert_int_equal(read_result(res_pipe[0], res, 30000), 0);
	assert_int_equal(res[0], 0);
	/* A 256 MiB PUT, and the cable is pulled under it. */
	assert_int_equal(t_write(go_pipe[1], "L", 1), 1);
	usleep(30000);
	assert_int_equal(ns_sh("ip -n %s link set %s down", ns_b, vp), 0);
	assert_int_equal(read_result(res_pipe[0], res, 30000), 0);
	/* Failed well within its 20 s deadline: the heartbeat saw the silence. */
	assert_true(res[0] == -ECONNRESET || res[0] == 0);
	assert_true(res[1] < 5000);
	fprintf(stderr, "# link down: the PUT ended with %s after %d ms\n", ferry_err_name(res[0]),
		res[1]);
	/* The cable is back: the next PUT connects anew and arrives. */
	assert_int_equal(ns_sh("ip -n %s link set %s up", ns_b, vp), 0);
	usleep(200000);
	assert_int_equal(t_write(go_pipe[1], "s", 1), 1);
	assert_int_equal(read_result(res_pipe[0], res, 30000), 0);
	assert_int_equal(res[0], 0);
	/* The consumer holds a copy of the pipe's write end: it goes first. */
	kill(cc.pid, SIGKILL);
	t_reap(cc.pid);
	close(go_pipe[1]);
	assert_int_equal(t_reap(cp.pid), 0); /* and kept no block */
	close(res_pipe[0]);
}

static void test_netns_three_hosts(void **state)
{
	char listen[64], addr[NETADDR_MAX], addr_c[NETADDR_MAX];
	struct consumer k = { .r = { .ns = ns_a, .name = "cons", .listen = listen,
				      .secret = SECRET, .small = 300, .large = 32 * MIB },
			      .from = { "pb", "pc" }, .nfrom = 2 };
	struct role pb = { .ns = ns_b, .name = "pb", .to = "cons", .secret = SECRET,
			   .small = 300, .large = 32 * MIB };
	struct role pc = { .ns = ns_c, .name = "pc", .to = "cons", .secret = SECRET,
			   .small = 300, .large = 32 * MIB };
	struct child cc, cb, ccp;

	(void)state;
	/* A listens on every interface: B reaches it on net 1, C on net 2. */
	snprintf(listen, sizeof(listen), "tcp://*:0");
	spawn(&cb, producer, &pb);
	spawn(&ccp, producer, &pc);
	start_consumer(&cc, &k, addr, sizeof(addr));
	{
		int port = atoi(strrchr(addr, ':') + 1);

		assert_true(port > 0);
		snprintf(addr, sizeof(addr), "tcp://10.%d.1.1:%d", net, port);
		snprintf(addr_c, sizeof(addr_c), "tcp://10.%d.2.1:%d", net, port);
	}
	go(&cb, addr);
	go(&ccp, addr_c);
	assert_int_equal(t_reap(cb.pid), 0);
	assert_int_equal(t_reap(ccp.pid), 0);
	assert_int_equal(t_reap(cc.pid), 0);
}

/* ------------------------------------------------------------------ */
/* The control channel across hosts                                    */
/* ------------------------------------------------------------------ */

static struct ferry_engine *ctl_engine(const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = NS;
	p.pool_size = 64 * MIB;
	p.control = "tcp://*:0"; /* every interface: data on *:0 too, published as such */
	p.secret = SECRET;
	return ferry_engine_create(&p, &e) ? NULL : e;
}

/* The holder (host A): publishes two keys for "cons", says its control port, serves. */
static int ctl_holder(const char *unused, void *arg)
{
	int out = *(int *)arg;
	struct ferry_engine *e;
	struct ferry_peer *cons;
	struct ferry_buf *b;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];

	(void)unused;
	if (ns_enter(ns_a) || !(e = ctl_engine("holder")))
		return 40;
	ferry_peer_open(e, "cons", &cons);
	if (ferry_buf_alloc(e, 8 * MIB, &b))
		return 41;
	fill(ferry_buf_data(b), 8 * MIB, 5);
	sqe = t_sqe(e);
	ferry_prep_publish_buf(sqe, cons, "big", b, 1);
	t_submit(e);
	sqe = t_sqe(e);
	ferry_prep_publish(sqe, cons, "small", &(struct iovec){ "hello", 5 }, 1, 2);
	t_submit(e);
	for (int i = 0; i < 2; i++)
		if (t_wait_one(e, &c, 10 * SEC) != 0)
			return 42;
	if (ferry_engine_control_address(e, addr, sizeof(addr)) <= 0 ||
	    t_write(out, strrchr(addr, ':') + 1, strlen(strrchr(addr, ':') + 1)) < 0)
		return 43;
	for (;;)
		pause();
	return 0;
}

/* The consumer (host B): one control address, then fetches, asks, sends back. */
static int ctl_consumer(const char *addr, void *arg)
{
	struct ferry_engine *e;
	struct ferry_peer *h;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	(void)arg;
	if (ns_enter(ns_b) || !(e = ctl_engine("cons")))
		return 50;
	ferry_peer_open(e, "holder", &h);
	if (ferry_peer_connect(h, addr))
		return 51;
	t_fetch(e, h, "big", NULL, 0, 1, 0, 20 * SEC);
	if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != 8 * MIB)
		return 52;
	if (checksum(ferry_buf_data(c.buf), 8 * MIB) != expected_sum(8 * MIB, 5))
		return 53;
	ferry_buf_release(c.buf);
	t_fetch(e, h, "small", NULL, 0, 2, 0, 20 * SEC);
	if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != 5 || memcmp(ferry_buf_data(c.buf), "hello", 5))
		return 54;
	ferry_buf_release(c.buf);
	t_fetch(e, h, "none", NULL, 0, 3, FERRY_SQE_NOWAIT, 20 * SEC);
	if (t_wait_one(e, &c, 30 * SEC) != -EAGAIN)
		return 55;
	sqe = t_sqe(e);
	ferry_prep_peer_health(sqe, h, 4);
	ferry_sqe_set_timeout(sqe, 10 * SEC);
	t_submit(e);
	if (t_wait_one(e, &c, 30 * SEC) <= 0 || !strstr(ferry_buf_data(c.buf), "\"holder\""))
		return 56;
	ferry_buf_release(c.buf);
	/* The holder's wildcard data address became the host we called. */
	{
		char learned[PEER_ADDR_MAX] = "";

		if (!ferry__peer_addr_get(h, "tcp", learned, sizeof(learned)) ||
		    strncmp(learned, "tcp://10.", 9))
			return 57;
	}
	ferry_engine_destroy(e);
	return 0;
}

static void test_netns_control(void **state)
{
	struct child ch, cc;
	char port[16], addr[NETADDR_MAX];
	int p[2];

	(void)state;
#ifndef FERRY_HAVE_ZMQ
	skip(); /* the control channel needs libzmq */
#endif
	assert_int_equal(pipe(p), 0);
	spawn(&ch, ctl_holder, &p[1]);
	spawn(&cc, ctl_consumer, NULL);
	go(&ch, "-");
	assert_int_equal(wait_text(p[0], port, sizeof(port), 20000), 0);
	snprintf(addr, sizeof(addr), "tcp://10.%d.1.1:%s", net, port);
	go(&cc, addr);
	assert_int_equal(t_reap(cc.pid), 0);
	kill(ch.pid, SIGKILL);
	t_reap(ch.pid);
	close(p[0]);
	close(p[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_netns_two_hosts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_netns_no_secret, setup, teardown),
		cmocka_unit_test_setup_teardown(test_netns_link_down, setup, teardown),
		cmocka_unit_test_setup_teardown(test_netns_three_hosts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_netns_control, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, group_setup, group_teardown);
}

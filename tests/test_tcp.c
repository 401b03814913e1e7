/*
 * tests/test_tcp.c - the tcp transport between real processes on loopback.
 *
 * Every test forks its peers (separate address spaces and engines) before
 * it creates an engine of its own; a peer learns the other's address
 * through a pipe (the listener binds port 0). Covered: addresses and
 * parameters, 1 GiB with a checksum, deadlines against a port nobody
 * listens on and a listener that never answers, 3 producers -> 1 consumer
 * and 1 -> 3 (eager and rendezvous sizes, each consumer listening), a wrong
 * secret, malformed frames from a raw socket (after and before the
 * handshake), SIGKILL of either side in the middle of a transfer and a
 * reconnect to the restarted peer at its address, a silent (stopped) peer
 * declared dead by the heartbeat, a peer that leaves right after answering
 * or ends one connection, engines of two namespaces kept apart, a peer
 * given an address that cannot be called not reached through another
 * transport, and 8 concurrent 256 MiB transfers with checksums. Children
 * report through their exit status; the parent asserts. No test leaves a
 * pool block behind (checked through the pool statistics). What every
 * transport must show (order, every size, GET before PUT, NOWAIT, full
 * pools on both sides, peer death, streams) is the conformance suite
 * (tests/conformance.h), run over tcp by test_conformance_tcp.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "internal.h"
#include "netaddr.h"
#include "security.h"
#include "tcp_wire.h"


static char rundir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-tcp-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	unsetenv("FERRY_SECRET");
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	alarm(t_under_valgrind() ? 900 : 120);
	return 0;
}

static int teardown(void **state)
{
	char cmd[300];

	(void)state;
	alarm(0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", rundir);
	if (system(cmd) != 0)
		return -1;
	return 0;
}

/* Sizes: the real ones, or small under valgrind. */
#include "tcp_helpers.h"


/* ------------------------------------------------------------------ */
/* Producers (children)                                                */
/* ------------------------------------------------------------------ */

struct producer {
	const char *name;
	const char *secret;
	unsigned first, count;
	size_t size;        /* bytes per item */
	unsigned window;
	int expect;         /* result every PUT must have */
	size_t pool;
};

/* PUT count items "k<i>" (content: fill(seed i)), windowed. */
static int producer_main(const char *addr, void *arg)
{
	struct producer *p = arg;
	struct mk m = { .name = p->name, .secret = p->secret, .pool = p->pool };
	struct ferry_engine *e = mk_engine(&m);
	struct ferry_peer *to;
	struct ferry_sq *sq;
	unsigned sent = 0, done = 0, window = p->window ? p->window : 128;
	uint8_t *data;
	struct iovec *v;
	int rc = 0;

	if (!e)
		return 10;
	if (ferry_peer_open(e, "cons", &to) || ferry_peer_set_address(to, addr))
		return 11;
	ferry_sq_get(e, &sq);
	data = malloc((size_t)window * (p->size ? p->size : 1));
	v = calloc(window, sizeof(*v));
	if (!data || !v)
		return 12;
	while (done < p->count) {
		struct ferry_sqe *sqe;
		struct ferry_cqe c;

		while (sent < p->count && sent - done < window && (sqe = ferry_sq_get_sqe(sq))) {
			unsigned i = p->first + sent, slot = sent % window;
			char key[48];

			v[slot].iov_base = data + (size_t)slot * p->size;
			v[slot].iov_len = p->size;
			fill(v[slot].iov_base, p->size, i);
			snprintf(key, sizeof(key), "k%u", i);
			ferry_prep_put(sqe, to, key, &v[slot], 1, i);
			ferry_sqe_set_timeout(sqe, 20 * SEC);
			sent++;
		}
		ferry_sq_submit(sq);
		if (t_wait_one(e, &c, 20 * SEC) == -ETIME) {
			fprintf(stderr, "producer %s: no completion after %u\n", p->name, done);
			return 13;
		}
		if (c.res != p->expect) {
			fprintf(stderr, "producer %s: PUT %llu: %s (expected %s)\n", p->name,
				(unsigned long long)c.user_data, ferry_err_name(c.res),
				ferry_err_name(p->expect));
			rc = 14;
			break;
		}
		done++;
	}
	/* In order completions are not promised: the window holds them. */
	if (!rc && pool_in_use(e) != 0)
		rc = 15;
	ferry_engine_destroy(e);
	free(data);
	free(v);
	return rc;
}

/* The consumer side: GET k<first..first+count) from peer, check each. */
static void consume(struct ferry_engine *e, const char *from, unsigned first, unsigned count,
		    size_t size, unsigned window)
{
	struct ferry_peer *pf = t_peer(e, from);
	unsigned asked = 0, got = 0;
	uint8_t *want = malloc(size ? size : 1);

	assert_non_null(want);
	while (got < count) {
		struct ferry_cqe c;

		while (asked < count && asked - got < window) {
			char key[48];

			snprintf(key, sizeof(key), "k%u", first + asked);
			get(e, pf, key, NULL, first + asked, 30 * SEC, 0);
			asked++;
		}
		assert_int_equal(t_wait_one(e, &c, 30 * SEC), 0);
		assert_int_equal(c.len, size);
		assert_true(c.flags & FERRY_CQE_F_BUF);
		fill(want, size, c.user_data);
		assert_memory_equal(ferry_buf_data(c.buf), want, size);
		ferry_buf_release(c.buf);
		got++;
	}
	free(want);
}

/* ------------------------------------------------------------------ */
/* Tests                                                               */
/* ------------------------------------------------------------------ */

static void test_tcp_params(void **state)
{
	struct mk m = { .name = "a", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct mk m2 = { .name = "b", .secret = SECRET };
	struct ferry_engine *a, *b, *c;
	struct ferry_peer *p;
	char addr[NETADDR_MAX], small[8];
	int n;

	(void)state;
	a = mk_engine(&m);
	assert_non_null(a);
	engine_addr(a, addr, sizeof(addr));
	assert_true(strncmp(addr, "tcp://127.0.0.1:", 16) == 0);
	assert_true(atoi(addr + 16) > 0); /* port 0 became a real one */
	n = ferry_engine_address(a, small, sizeof(small));
	assert_int_equal(n, (int)strlen(addr)); /* snprintf-like */
	assert_int_equal(ferry_engine_address(NULL, addr, sizeof(addr)), -EINVAL);

	/* The same address twice: a clear EADDRINUSE. */
	m2.listen = addr;
	assert_int_equal(ferry_engine_create(&(struct ferry_engine_params){
					 .size = sizeof(struct ferry_engine_params),
					 .name = "b", .ns = NS, .listen = addr,
					 .secret = SECRET }, &c),
			 -EADDRINUSE);
	m2.listen = NULL;
	b = mk_engine(&m2);
	assert_non_null(b);
	assert_int_equal(ferry_engine_address(b, addr, sizeof(addr)), -ENOTCONN);

	/* Bad endpoints. */
	assert_int_equal(ferry_engine_create(&(struct ferry_engine_params){
					 .size = sizeof(struct ferry_engine_params),
					 .name = "c", .ns = NS, .listen = "udp://1.2.3.4:5" }, &c),
			 -EINVAL);
	p = t_peer(b, "a");
	assert_int_equal(ferry_peer_set_address(p, "127.0.0.1:5"), -EINVAL);
	assert_int_equal(ferry_peer_set_address(p, "tcp://127.0.0.1"), -EINVAL);
	assert_int_equal(ferry_peer_set_address(p, "tcp://127.0.0.1:99999"), -EINVAL);
	assert_int_equal(ferry_peer_set_address(p, "tcp://127.0.0.1:0"), -EINVAL);
	assert_int_equal(ferry_peer_set_address(NULL, "tcp://127.0.0.1:1"), -EINVAL);
	assert_int_equal(ferry_peer_set_address(p, "tcp://[::1]:7"), 0);
	assert_int_equal(ferry_peer_set_address(p, "tcp://10.1.2.3:7"), 0); /* b has a secret */

	/* Without a secret: loopback peers only. */
	{
		struct mk m3 = { .name = "c" };
		struct ferry_engine *e3 = mk_engine(&m3);
		struct ferry_peer *q;

		assert_non_null(e3);
		q = t_peer(e3, "a");
		assert_int_equal(ferry_peer_set_address(q, "tcp://10.1.2.3:7"), -EACCES);
		assert_int_equal(ferry_peer_set_address(q, "tcp://127.0.0.1:7"), 0);
		ferry_engine_destroy(e3);
	}

	/* A peer_timeout shorter than the heartbeat is refused. */
	assert_int_equal(ferry_engine_create(&(struct ferry_engine_params){
					 .size = sizeof(struct ferry_engine_params),
					 .name = "d", .ns = NS, .heartbeat_ms = 500,
					 .peer_timeout_ms = 100 }, &c),
			 -EINVAL);

	/* The upstream port scheme. */
	assert_int_equal(ferry_port_compat(50000, 100, 2, 1), 50000 + 100 + 2 + 16);
	assert_int_equal(ferry_port_compat(65530, 0, 0, 1), -ERANGE);
	assert_int_equal(ferry_port_compat(0, 0, 0, 0), -ERANGE);

	/* An older params struct (without the tcp fields) still works. */
	{
		struct ferry_engine_params old = { .size = offsetof(struct ferry_engine_params,
								    flags) + sizeof(uint32_t),
						   .name = "old", .ns = NS };
		struct ferry_engine *e4;

		assert_int_equal(ferry_engine_create(&old, &e4), 0);
		assert_int_equal(ferry_engine_address(e4, addr, sizeof(addr)), -ENOTCONN);
		ferry_engine_destroy(e4);
	}
	ferry_engine_destroy(b);
	ferry_engine_destroy(a);
}

struct big_put {
	uint64_t size;
	uint64_t seed;
	unsigned n;        /* PUTs of size each, "b<i>" */
	unsigned window;   /* in flight at most */
	size_t pool;
	int delay_ms;      /* before the first PUT */
};

/* PUT n pool buffers of size, zero copy, filled with fill(seed + i). */
static int big_producer(const char *addr, void *arg)
{
	struct big_put *bp = arg;
	struct mk m = { .name = "prod", .secret = SECRET, .pool = bp->pool };
	struct ferry_engine *e = mk_engine(&m);
	struct ferry_peer *to;
	unsigned sent = 0, done = 0;
	int rc = 0;

	if (!e)
		return 10;
	if (ferry_peer_open(e, "cons", &to) || ferry_peer_set_address(to, addr))
		return 11;
	if (bp->delay_ms)
		usleep((useconds_t)bp->delay_ms * 1000);
	while (done < bp->n) {
		struct ferry_cqe c;

		while (sent < bp->n && sent - done < bp->window) {
			struct ferry_buf *b;
			char key[32];

			if (ferry_buf_alloc(e, bp->size, &b))
				break; /* pool full: wait for a completion */
			fill(ferry_buf_data(b), bp->size, bp->seed + sent);
			snprintf(key, sizeof(key), "b%u", sent);
			put_buf(e, to, key, b, sent, 60 * SEC);
			sent++;
		}
		if (t_wait_one(e, &c, 60 * SEC) != 0) {
			fprintf(stderr, "big producer: PUT %u: %s\n", done, ferry_err_name(c.res));
			rc = 12;
			break;
		}
		done++;
	}
	if (!rc && pool_in_use(e))
		rc = 13;
	ferry_engine_destroy(e);
	return rc;
}

static void big_consume(struct ferry_engine *e, struct big_put *bp)
{
	struct ferry_peer *from = t_peer(e, "prod");
	uint64_t *want = calloc(bp->n, sizeof(*want));

	assert_non_null(want);
	for (unsigned i = 0; i < bp->n; i++)
		want[i] = expected_sum(bp->size, bp->seed + i);
	/* Every GET is posted at once: all transfers run concurrently. */
	for (unsigned i = 0; i < bp->n; i++) {
		char key[32];

		snprintf(key, sizeof(key), "b%u", i);
		get(e, from, key, NULL, i, 60 * SEC, 0);
	}
	for (unsigned i = 0; i < bp->n; i++) {
		struct ferry_cqe c;

		assert_int_equal(t_wait_one(e, &c, 60 * SEC), 0);
		assert_int_equal(c.len, bp->size);
		assert_true(checksum(ferry_buf_data(c.buf), bp->size) == want[c.user_data]);
		ferry_buf_release(c.buf);
	}
	free(want);
}

static void test_tcp_one_gib(void **state)
{
	struct big_put bp = { .size = big(1024 * MIB, 32 * MIB), .seed = 7, .n = 1, .window = 1,
			      .pool = big(1024 * MIB, 32 * MIB) + 16 * MIB };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = bp.pool };
	struct child ch;
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	int64_t t0;

	(void)state;
	spawn(&ch, big_producer, &bp);
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	go(&ch, addr);
	t0 = t_now();
	big_consume(e, &bp);
	fprintf(stderr, "# 1 x %llu MiB in %.2f s\n", (unsigned long long)(bp.size / MIB),
		(double)(t_now() - t0) / SEC);
	assert_int_equal(t_reap(ch.pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

static void test_tcp_eight_concurrent(void **state)
{
	/*
	 * 8 x 256 MiB; each pool holds four at a time, so the rendezvous
	 * makes the rest wait for room on both sides (bounded memory).
	 */
	struct big_put bp = { .size = big(256 * MIB, 4 * MIB), .seed = 100, .n = 8, .window = 8,
			      .pool = big(1024 * MIB, 16 * MIB) + 16 * MIB };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = bp.pool };
	struct child ch;
	struct ferry_engine *e;
	char addr[NETADDR_MAX];

	(void)state;
	spawn(&ch, big_producer, &bp);
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	go(&ch, addr);
	big_consume(e, &bp);
	assert_int_equal(t_reap(ch.pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* 1 producer -> 3 consumers, and the sender's pool running dry          */
/* ------------------------------------------------------------------ */

/* A consumer child: listens, tells the parent where (back pipe), then GETs. */
struct listener_child {
	const char *name;
	unsigned count;
	size_t size, pool;
	int back[2];      /* child writes its address */
	int done[2];      /* the parent says when its PUTs completed */
};

/* GET k0..count-1 from "prod" (zero copy), checking each; 0 or an exit code. */
static int child_consume(struct ferry_engine *e, unsigned count, size_t size)
{
	struct ferry_peer *from;
	unsigned asked = 0, got = 0;
	uint8_t *want = malloc(size ? size : 1);

	if (!want || ferry_peer_open(e, "prod", &from))
		return 20;
	while (got < count) {
		struct ferry_cqe c;

		while (asked < count && asked - got < 16) {
			struct ferry_sqe *sqe = t_sqe(e);
			char key[32];

			snprintf(key, sizeof(key), "k%u", asked);
			ferry_prep_get(sqe, from, key, NULL, 0, asked);
			ferry_sqe_set_timeout(sqe, 30 * SEC);
			t_submit(e);
			asked++;
		}
		if (t_wait_one(e, &c, 30 * SEC) != 0 || c.len != size) {
			fprintf(stderr, "consumer: GET %u: %s\n", got, ferry_err_name(c.res));
			return 21;
		}
		fill(want, size, c.user_data);
		if (memcmp(ferry_buf_data(c.buf), want, size) != 0) {
			fprintf(stderr, "consumer: k%llu damaged\n", (unsigned long long)c.user_data);
			return 22;
		}
		ferry_buf_release(c.buf);
		got++;
	}
	free(want);
	return 0;
}

static int listener_main(const char *unused, void *arg)
{
	struct listener_child *lc = arg;
	struct mk m = { .name = lc->name, .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = lc->pool };
	struct ferry_engine *e = mk_engine(&m);
	char addr[NETADDR_MAX], go_word[8];
	int n, rc;

	(void)unused;
	if (!e)
		return 10;
	n = ferry_engine_address(e, addr, sizeof(addr));
	if (n <= 0 || t_write(lc->back[1], addr, (size_t)n) != n)
		return 11;
	rc = child_consume(e, lc->count, lc->size);
	if (!rc && pool_in_use(e) != 0)
		rc = 13;
	/*
	 * Stay until the producer has every RESULT, so that this test is about
	 * the data path alone; a peer leaving right after its last GET is
	 * peer_leaves_after_answer's case.
	 */
	if (!rc && wait_text(lc->done[0], go_word, sizeof(go_word), 120000))
		rc = 14;
	ferry_engine_destroy(e);
	return rc;
}

static void spawn_listener(struct child *ch, struct listener_child *lc)
{
	assert_int_equal(pipe(lc->back), 0);
	assert_int_equal(pipe(lc->done), 0);
	spawn(ch, listener_main, lc);
	close(lc->back[1]);
	close(lc->done[0]);
}

static void listener_addr(struct child *ch, struct listener_child *lc, char *addr)
{
	go(ch, "start");
	assert_int_equal(wait_text(lc->back[0], addr, NETADDR_MAX, 20000), 0);
	close(lc->back[0]);
}

static void test_tcp_one_to_three(void **state)
{
	unsigned count = (unsigned)big(2000, 100);
	const char *names[3] = { "c0", "c1", "c2" };
	size_t sizes[3] = { 100, 20000, 300000 }; /* eager, eager, rendezvous */
	struct listener_child lc[3];
	struct child ch[3];
	struct mk m = { .name = "prod", .secret = SECRET, .pool = 64 * MIB };
	struct ferry_engine *e;
	struct ferry_peer *to[3];
	uint8_t *data[3];
	struct iovec *v[3];
	unsigned sent[3] = { 0 }, done = 0;

	(void)state;
	for (int i = 0; i < 3; i++) {
		/* Each consumer's pool holds all it may be sent before its GETs. */
		lc[i] = (struct listener_child){ .name = names[i], .count = count,
						 .size = sizes[i],
						 .pool = sizes[i] * count + 64 * MIB };
		spawn_listener(&ch[i], &lc[i]);
	}
	e = mk_engine(&m);
	assert_non_null(e);
	for (int i = 0; i < 3; i++) {
		char addr[NETADDR_MAX];

		listener_addr(&ch[i], &lc[i], addr);
		to[i] = t_peer(e, names[i]);
		assert_int_equal(ferry_peer_set_address(to[i], addr), 0);
		/* 16 items in flight per consumer, each with its own iovec and data. */
		data[i] = malloc(16 * sizes[i]);
		v[i] = calloc(16, sizeof(struct iovec));
		assert_true(data[i] && v[i]);
	}
	/* Round robin over the three, 16 PUTs in flight each. */
	while (done < 3 * count) {
		struct ferry_cqe c;

		for (int i = 0; i < 3; i++) {
			while (sent[i] < count) {
				unsigned slot = sent[i] % 16;
				char key[32];

				if (v[i][slot].iov_base)
					break; /* its previous PUT is still away */
				v[i][slot].iov_base = data[i] + (size_t)slot * sizes[i];
				v[i][slot].iov_len = sizes[i];
				fill(v[i][slot].iov_base, sizes[i], sent[i]);
				snprintf(key, sizeof(key), "k%u", sent[i]);
				put_iov(e, to[i], key, &v[i][slot], ((uint64_t)i << 32) | sent[i],
					20 * SEC);
				sent[i]++;
			}
		}
		assert_int_equal(t_wait_one(e, &c, 30 * SEC), 0);
		v[c.user_data >> 32][(uint32_t)c.user_data % 16].iov_base = NULL;
		done++;
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(t_write(lc[i].done[1], "done", 4), 4);
		close(lc[i].done[1]);
		assert_int_equal(t_reap(ch[i].pid), 0); /* each checked every item */
		free(data[i]);
		free(v[i]);
	}
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/*
 * A peer given an address is reached over tcp or not at all. When the call
 * cannot even start (connect fails at once: no route; a multicast address
 * is refused so everywhere), its PUTs fail with -EHOSTUNREACH, the next one
 * too (it asks again), and nothing goes to the engine of that name that
 * another transport finds (here one in this process, which the in-process
 * transport would reach; over a link cut, test_chaos_tcp saw traffic move
 * to shm so, to the same engine on this host).
 */
/*
 * The tcp part of the engine's health: links and connections as the tick
 * counts them. After a PUT the link is up with all its connections
 * authenticated; once the receiver is gone the sender's tick (heartbeat
 * 100 ms, timeout 400 ms) finds the link dead and says no link is up.
 */
static unsigned health_u(struct ferry_engine *e, const char *field)
{
	static char json[1 << 14];
	char pat[64];
	const char *at;

	assert_true(ferry_engine_health(e, json, sizeof(json)) > 0);
	snprintf(pat, sizeof(pat), "\"%s\":", field);
	at = strstr(json, "\"tcp\":{");
	assert_non_null(at);
	at = strstr(at, pat);
	assert_non_null(at);
	return (unsigned)strtoul(at + strlen(pat), NULL, 10);
}

static bool health_is(struct ferry_engine *e, unsigned up, bool complete, int64_t wait_ns)
{
	int64_t end = t_now() + wait_ns;

	do {
		unsigned ready = health_u(e, "connections_ready"), wanted = health_u(e, "connections_wanted");

		if (health_u(e, "links_up") == up && (!complete || (wanted > 0 && ready == wanted)))
			return true;
		usleep(10000);
	} while (t_now() < end);
	return false;
}

static void test_tcp_health(void **state)
{
	struct mk ma = { .name = "a", .secret = SECRET, .heartbeat_ms = 100, .peer_timeout_ms = 400 };
	struct mk mb = { .name = "b", .secret = SECRET, .listen = "tcp://127.0.0.1:0",
			 .heartbeat_ms = 100, .peer_timeout_ms = 400 };
	struct ferry_engine *a, *b;
	struct ferry_peer *to, *from;
	struct ferry_cqe c;
	char addr[128], data[100] = { 0 };
	struct iovec v = { data, sizeof(data) };

	(void)state;
	a = mk_engine(&ma);
	b = mk_engine(&mb);
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(health_u(a, "links_up"), 0);
	to = t_peer(a, "b");
	from = t_peer(b, "a");
	engine_addr(b, addr, sizeof(addr));
	assert_int_equal(ferry_peer_set_address(to, addr), 0);
	put_iov(a, to, "k", &v, 1, 10 * SEC);
	assert_int_equal(t_wait_one(a, &c, 10 * SEC), 0);
	assert_true(health_is(a, 1, true, 10 * SEC));
	assert_true(health_u(a, "sockets") >= health_u(a, "connections_ready"));
	assert_true(health_is(b, 1, true, 10 * SEC)); /* the callee's end of the link */
	get(b, from, "k", NULL, 2, 0, 0);
	assert_int_equal(t_wait_one(b, &c, 5 * SEC), 0);
	ferry_buf_release(c.buf);
	ferry_engine_destroy(b);
	assert_true(health_is(a, 0, false, (t_under_valgrind() ? 60 : 10) * SEC));
	assert_int_equal(health_u(a, "connections_ready"), 0);
	ferry_engine_destroy(a);
}

static void test_tcp_address_sticks(void **state)
{
	struct mk ma = { .name = "a", .secret = SECRET }, mb = { .name = "b", .secret = SECRET };
	struct ferry_engine *a, *b;
	struct ferry_peer *to, *from;
	struct ferry_cqe c;
	char data[100] = { 0 };
	struct iovec v = { data, sizeof(data) };

	(void)state;
	a = mk_engine(&ma);
	b = mk_engine(&mb);
	assert_non_null(a);
	assert_non_null(b);
	to = t_peer(a, "b");
	from = t_peer(b, "a");
	assert_int_equal(ferry_peer_set_address(to, "tcp://224.0.0.1:9"), 0);
	for (int i = 0; i < 3; i++) {
		put_iov(a, to, "k", &v, (uint64_t)i, 5 * SEC);
		assert_int_equal(t_wait_one(a, &c, 5 * SEC), -EHOSTUNREACH);
	}
	get(b, from, "k", NULL, 9, 0, FERRY_SQE_NOWAIT);
	assert_int_equal(t_wait_one(b, &c, 5 * SEC), -EAGAIN);
	assert_int_equal(pool_in_use(a), 0);
	ferry_engine_destroy(b);
	ferry_engine_destroy(a);
}

static void test_tcp_deadlines(void **state)
{
	struct mk m = { .name = "a", .secret = SECRET };
	struct ferry_engine *e;
	struct ferry_peer *nobody, *silent, *from;
	struct ferry_cqe c;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	char addr[64], data[100] = { 0 };
	struct iovec v = { data, sizeof(data) };
	int lfd, closed_port;
	int64_t t0, dt;

	(void)state;
	/* A port nobody listens on, and a listener that never answers. */
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	getsockname(lfd, (struct sockaddr *)&sa, &len);
	closed_port = ntohs(sa.sin_port);
	close(lfd);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_port = 0;
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 8), 0);
	len = sizeof(sa);
	getsockname(lfd, (struct sockaddr *)&sa, &len);

	e = mk_engine(&m);
	assert_non_null(e);
	nobody = t_peer(e, "nobody");
	silent = t_peer(e, "silent");
	from = t_peer(e, "x");
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", closed_port);
	assert_int_equal(ferry_peer_set_address(nobody, addr), 0);
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
	assert_int_equal(ferry_peer_set_address(silent, addr), 0);

	t0 = t_now();
	put_iov(e, nobody, "k", &v, 1, 5 * SEC);
	assert_int_equal(t_wait_one(e, &c, 5 * SEC), -EHOSTUNREACH);
	assert_true(t_now() - t0 < 2 * SEC);

	t0 = t_now();
	put_iov(e, silent, "k", &v, 2, 300 * MS);
	assert_int_equal(t_wait_one(e, &c, 5 * SEC), -ETIMEDOUT);
	dt = t_now() - t0;
	assert_true(dt >= 250 * MS && dt < 2 * SEC);

	t0 = t_now();
	get(e, from, "never", NULL, 3, 200 * MS, 0);
	assert_int_equal(t_wait_one(e, &c, 5 * SEC), -ETIMEDOUT);
	dt = t_now() - t0;
	assert_true(dt >= 150 * MS && dt < 2 * SEC);

	/* The PUT that timed out still holds its block until the link ends. */
	close(lfd); /* resets the connection waiting in its backlog */
	for (int i = 0; i < 400 && pool_in_use(e); i++)
		usleep(10000);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* Children that report their address on a pipe of their own          */
/* ------------------------------------------------------------------ */

/* A child's pipe besides its address pipe: up_pipe child -> test. */
static int up_pipe[2];

static void tell_test(const char *s)
{
	if (t_write(up_pipe[1], s, strlen(s)) != (ssize_t)strlen(s))
		_exit(30);
}

/* Child side of linked_to_child: make engine m and say "A<its address>" on up_pipe. */
static struct ferry_engine *child_engine(const struct mk *m)
{
	char addr[NETADDR_MAX + 1] = "A";
	struct ferry_engine *e = mk_engine(m);

	if (!e)
		return NULL;
	ferry_engine_address(e, addr + 1, sizeof(addr) - 1);
	tell_test(addr);
	return e;
}

/*
 * Fork fn, a consumer "cons" that says "A<its address>" on up_pipe, then
 * make our engine (m) and point its peer "cons" (to) at that address.
 */
static struct ferry_engine *linked_to_child(struct child *ch,
					    int (*fn)(const char *, void *),
					    const struct mk *m, struct ferry_peer **to)
{
	struct ferry_engine *e;
	char msg[NETADDR_MAX + 2];

	assert_int_equal(pipe(up_pipe), 0);
	spawn(ch, fn, NULL);
	go(ch, "-");
	assert_int_equal(wait_text(up_pipe[0], msg, sizeof(msg), 20000), 0);
	assert_int_equal(msg[0], 'A');
	e = mk_engine(m);
	assert_non_null(e);
	*to = t_peer(e, "cons");
	assert_int_equal(ferry_peer_set_address(*to, msg + 1), 0);
	return e;
}

/* A consumer in another namespace: nothing may reach it. Exits 0 if nothing did. */
static int stranger_main(const char *unused, void *arg)
{
	struct mk m = { .name = "cons", .ns = "elsewhere", .listen = "tcp://127.0.0.1:0",
			.secret = SECRET, .pool = 8 * MIB };
	struct ferry_engine *e;
	struct ferry_cqe c;

	(void)unused;
	(void)arg;
	e = child_engine(&m);
	if (!e)
		return 10;
	get(e, t_peer(e, "prod"), "k0", NULL, 1, 2 * SEC, 0);
	if (t_wait_one(e, &c, 20 * SEC) != -ETIMEDOUT || pool_in_use(e) != 0)
		return 11;
	ferry_engine_destroy(e);
	return 0;
}

/*
 * Engines of two namespaces at the same secret never exchange a byte: the
 * callee refuses a caller of another namespace at the handshake, and the
 * PUT fails with -EHOSTUNREACH (as for an engine of another name).
 */
static void test_tcp_namespaces_isolated(void **state)
{
	struct mk m = { .name = "prod", .secret = SECRET, .pool = 8 * MIB };
	char bytes[100] = "hello";
	struct iovec small = { bytes, sizeof(bytes) };
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_buf *b;
	struct ferry_cqe c;
	struct child ch;

	(void)state;
	e = linked_to_child(&ch, stranger_main, &m, &to);
	assert_int_equal(ferry_buf_alloc(e, 100000, &b), 0); /* rendezvous */
	put_buf(e, to, "k0", b, 1, 10 * SEC);
	assert_int_equal(t_wait_one(e, &c, 15 * SEC), -EHOSTUNREACH);
	put_iov(e, to, "k0", &small, 2, 10 * SEC); /* eager, inline */
	assert_int_equal(t_wait_one(e, &c, 15 * SEC), -EHOSTUNREACH);
	assert_int_equal(t_reap(ch.pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
	close(up_pipe[0]);
	close(up_pipe[1]);
}

static void test_tcp_three_to_one(void **state)
{
	unsigned count = (unsigned)big(3000, 200);
	const char *names[3] = { "p0", "p1", "p2" };
	size_t sizes[3] = { 256, 8192, 100000 };
	struct producer p[3];
	struct child ch[3];
	/*
	 * A PUT completes once the data is stored here, GET or not, so a
	 * producer may run ahead of the GETs: the pool holds all of it, else an
	 * eager PUT finding it full is refused with -ENOBUFS (as documented).
	 */
	size_t all = (size_t)count * (256 + 8192 + 100000);
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = all + all / 4 > 128 * MIB ? all + all / 4 : 128 * MIB };
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	unsigned got[3] = { 0 };

	(void)state;
	for (int i = 0; i < 3; i++) {
		p[i] = (struct producer){ .name = names[i], .secret = SECRET, .count = count,
					  .size = sizes[i], .window = 64 };
		spawn(&ch[i], producer_main, &p[i]);
	}
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	for (int i = 0; i < 3; i++)
		go(&ch[i], addr);
	/* Interleave: one GET per producer at a time, in order. */
	{
		struct ferry_peer *from[3];
		unsigned asked[3] = { 0 };
		unsigned total = 0;
		uint8_t *want = malloc(100000);

		for (int i = 0; i < 3; i++)
			from[i] = t_peer(e, names[i]);
		while (total < 3 * count) {
			struct ferry_cqe c;
			unsigned who;

			for (int i = 0; i < 3; i++) {
				while (asked[i] < count && asked[i] - got[i] < 32) {
					char key[48];

					snprintf(key, sizeof(key), "k%u", asked[i]);
					get(e, from[i], key, NULL, ((uint64_t)i << 32) | asked[i],
					    30 * SEC, 0);
					asked[i]++;
				}
			}
			assert_int_equal(t_wait_one(e, &c, 30 * SEC), 0);
			who = (unsigned)(c.user_data >> 32);
			assert_true(who < 3);
			assert_int_equal(c.len, sizes[who]);
			fill(want, sizes[who], (uint32_t)c.user_data);
			assert_memory_equal(ferry_buf_data(c.buf), want, sizes[who]);
			ferry_buf_release(c.buf);
			got[who]++;
			total++;
		}
		free(want);
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(t_reap(ch[i].pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

static void test_tcp_wrong_secret(void **state)
{
	struct producer bad = { .name = "prod", .secret = "not-the-secret", .count = 1,
				.size = 100, .expect = -EACCES };
	struct producer none = { .name = "prod", .secret = NULL, .count = 1, .size = 100,
				 .expect = -EACCES };
	struct producer good = { .name = "prod", .secret = SECRET, .count = 5, .size = 100 };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct child c1, c2, c3;
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	struct ferry_cqe c;

	(void)state;
	spawn(&c1, producer_main, &bad);
	spawn(&c2, producer_main, &none);
	spawn(&c3, producer_main, &good);
	t_log_capture(FERRY_LOG_WARN);
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	go(&c1, addr);
	assert_int_equal(t_reap(c1.pid), 0); /* its PUT failed with -EACCES */
	/*
	 * The caller refused our proof first (it never showed its own), and
	 * said so: the engine called logs the refused peer at warn, with its
	 * address, and counts it in its health.
	 */
	for (int i = 0; i < 200 && !t_log_seen(FERRY_LOG_WARN, "\"prod\" from tcp://127.0.0.1:",
						  "refused our proof"); i++)
		usleep(10000);
	assert_true(t_log_seen(FERRY_LOG_WARN, "\"prod\" from tcp://127.0.0.1:", "refused our proof"));
	{
		char h[8192];

		assert_true(ferry_engine_health(e, h, sizeof(h)) > 0);
		assert_non_null(strstr(h, "\"security\":{\"peers_refused\":1,"));
	}
	go(&c2, addr);
	assert_int_equal(t_reap(c2.pid), 0);
	/* Nothing of theirs arrived. */
	get(e, t_peer(e, "prod"), "k0", NULL, 1, 0, FERRY_SQE_NOWAIT);
	assert_int_equal(t_wait_one(e, &c, 5 * SEC), -EAGAIN);
	/* And the engine still serves those who hold the secret. */
	go(&c3, addr);
	consume(e, "prod", 0, 5, 100, 5);
	assert_int_equal(t_reap(c3.pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/*
 * 200 silent TCP connections to the data port: at most 64 that proved
 * nothing are held at once (the oldest hung up on as newer ones come), all
 * are hung up on within the handshake bound (3 s; here 15 s at most), each
 * counted in health, and a producer with the secret gets through meanwhile.
 */
static void test_tcp_silent_flood(void **state)
{
	enum { FLOOD = 200, PREAUTH_MAX = 64 /* TCP_PREAUTH_MAX in tcp_int.h */ };
	struct producer good = { .name = "prod", .secret = SECRET, .count = 5, .size = 100 };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.handshake_ms = 3000 /* the bound under test, valgrind or not */ };
	static int fds[FLOOD];
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	struct child ch;
	int64_t t0, end;

	(void)state;
	spawn(&ch, producer_main, &good);
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	t_silent_open(fds, FLOOD, atoi(strrchr(addr, ':') + 1));
	t0 = t_now();
	/* The count bound, at every moment: the oldest go as newer ones come. */
	for (end = t_now() + 10 * SEC;
	     t_now() < end && t_health_num(e, "\"security\":{", "handshakes_dropped") <
				      FLOOD - PREAUTH_MAX;) {
		assert_true(t_health_num(e, "\"security\":{", "unproved_connections") <=
			    PREAUTH_MAX);
		usleep(2000);
	}
	assert_true(t_health_num(e, "\"security\":{", "handshakes_dropped") >= FLOOD - PREAUTH_MAX);
	go(&ch, addr);
	consume(e, "prod", 0, 5, 100, 5);
	assert_int_equal(t_reap(ch.pid), 0);
	assert_true(t_silent_all_closed(fds, FLOOD, 15000));
	fprintf(stderr, "# %d silent connections hung up on within %.1f s\n", FLOOD,
		(double)(t_now() - t0) / SEC);
	assert_true(t_health_num(e, "\"security\":{", "handshakes_dropped") >= FLOOD);
	ferry_engine_destroy(e);
}

/* params.handshake_ms bounds it: 500 ms, a silent caller is gone well before 3 s. */
static void test_tcp_handshake_bound(void **state)
{
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.handshake_ms = 500 };
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	int fd[1];
	int64_t t0;

	(void)state;
	if (t_under_valgrind())
		skip(); /* a bound this short is for a machine at full speed */
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	t_silent_open(fd, 1, atoi(strrchr(addr, ':') + 1));
	t0 = t_now();
	assert_true(t_silent_all_closed(fd, 1, 10000));
	fprintf(stderr, "# a silent caller hung up on after %.2f s (handshake_ms 500)\n",
		(double)(t_now() - t0) / SEC);
	assert_true(t_now() - t0 < 2500 * MS);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* A raw client speaking the protocol by hand                          */
/* ------------------------------------------------------------------ */

static int raw_connect(const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t len;
	struct timeval tv = { 3, 0 };
	int fd;

	assert_int_equal(netaddr_parse(addr, true, &ss, &len), 0);
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	assert_int_equal(t_connect(fd, (struct sockaddr *)&ss, len), 0);
	return fd;
}

static int read_full(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = t_recv(fd, (uint8_t *)p + got, n - got, 0);

		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

/* Handshake as "raw" with secret; returns the fd, or -1 when refused. */
static int raw_handshake(const char *addr, const char *secret)
{
	struct sec_secret s;
	struct tcp_hello h = { 0 }, in;
	uint8_t nc[TCP_NONCE_BYTES], ns[TCP_NONCE_BYTES];
	uint64_t link_id = 42;
	int fd = raw_connect(addr);

	assert_int_equal(sec_secret_load(&s, secret, NULL), 0);
	sec_nonce(nc, sizeof(nc));
	h.magic = TCP_HELLO_MAGIC;
	h.version = TCP_PROTO_VERSION;
	h.type = TCP_H_HELLO;
	h.nconns = 1;
	h.link_id = link_id;
	memcpy(h.nonce, nc, sizeof(nc));
	snprintf(h.ns, sizeof(h.ns), NS);
	snprintf(h.name, sizeof(h.name), "raw");
	tcp_hello_to_wire(&h);
	assert_int_equal(t_send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	assert_int_equal(read_full(fd, &in, sizeof(in)), 0);
	tcp_hello_from_wire(&in);
	assert_int_equal(in.type, TCP_H_PROOF);
	memcpy(ns, in.nonce, sizeof(ns));
	memset(&h, 0, sizeof(h));
	h.magic = TCP_HELLO_MAGIC;
	h.version = TCP_PROTO_VERSION;
	h.type = TCP_H_AUTH;
	sec_proof(&s, "ferry-caller", nc, ns, "raw", "cons", NS, link_id, 0, h.mac);
	tcp_hello_to_wire(&h);
	assert_int_equal(t_send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	if (read_full(fd, &in, sizeof(in))) {
		close(fd);
		return -1;
	}
	tcp_hello_from_wire(&in);
	if (in.type != TCP_H_OK) {
		close(fd);
		return -1;
	}
	return fd;
}

/* After sending something bad: the engine hangs up within a few seconds. */
static bool hung_up(int fd)
{
	uint8_t buf[4096];

	for (;;) {
		ssize_t r = t_recv(fd, buf, sizeof(buf), 0);

		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return true;
		if (r < 0)
			return false; /* timed out: still open */
	}
}

static void raw_frame(int fd, uint8_t type, uint8_t flags, uint16_t key_len, uint32_t len,
		      uint64_t cookie, uint64_t arg, const void *body, size_t body_len)
{
	uint8_t hdr[TCP_FRAME_BYTES];

	tcp_frame_pack(hdr, type, flags, key_len, len, cookie, arg);
	assert_int_equal(t_send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL), sizeof(hdr));
	if (body_len)
		assert_int_equal(t_send(fd, body, body_len, MSG_NOSIGNAL), (ssize_t)body_len);
}

/* Send a HELLO as `name`; the engine's answer into *in (false: it hung up without one). */
static bool raw_hello_answer(const char *addr, const char *name, struct tcp_hello *in)
{
	struct tcp_hello h = { 0 };
	int fd = raw_connect(addr);
	bool answered;

	h.magic = TCP_HELLO_MAGIC;
	h.version = TCP_PROTO_VERSION;
	h.type = TCP_H_HELLO;
	h.nconns = 1;
	h.link_id = 7;
	snprintf(h.ns, sizeof(h.ns), NS);
	snprintf(h.name, sizeof(h.name), "%s", name);
	tcp_hello_to_wire(&h);
	assert_int_equal(t_send(fd, &h, sizeof(h), MSG_NOSIGNAL), sizeof(h));
	answered = read_full(fd, in, sizeof(*in)) == 0;
	if (answered)
		tcp_hello_from_wire(in);
	close(fd);
	return answered;
}

/*
 * A caller whose name no engine can have is refused at its HELLO (NO,
 * EPERM), before any proof: its name would make the keys it stores
 * unparseable ("{key}@{from}_{to}" split at the last '@', so a request's
 * cleanup missed them) and go into logs as it is.
 */
static void test_tcp_bad_peer_name(void **state)
{
	static const char *const bad[] = { "fz@x", "a b", "x\ny", "caf\xc3\xa9", "k/../j" };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct ferry_engine *e;
	struct tcp_hello in;
	char addr[NETADDR_MAX];

	(void)state;
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));
	t_log_capture(FERRY_LOG_WARN);
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_true(raw_hello_answer(addr, bad[i], &in));
		if (in.type != TCP_H_NO || in.status != EPERM)
			fail_msg("name \"%s\": answer type %u status %u", bad[i], in.type, in.status);
	}
	/* Its refusal is one log line: the newline it sent is written '?'. */
	assert_true(t_log_seen(FERRY_LOG_WARN, "refused", "\"x?y\" in namespace"));
	/* The same HELLO with a name an engine can have gets the engine's proof. */
	assert_true(raw_hello_answer(addr, "ok.name_2:x-y", &in));
	assert_int_equal(in.type, TCP_H_PROOF);
	ferry_engine_destroy(e);
}

static void test_tcp_malformed(void **state)
{
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct producer good = { .name = "prod", .secret = SECRET, .count = 20, .size = 5000 };
	struct child ch;
	struct ferry_engine *e;
	char addr[NETADDR_MAX];
	uint8_t body[256];
	int fd;

	(void)state;
	spawn(&ch, producer_main, &good);
	e = mk_engine(&m);
	assert_non_null(e);
	engine_addr(e, addr, sizeof(addr));

	/* Garbage instead of a hello. */
	fd = raw_connect(addr);
	memset(body, 0xab, sizeof(body));
	assert_int_equal(t_send(fd, body, sizeof(body), MSG_NOSIGNAL), sizeof(body));
	assert_true(hung_up(fd));
	close(fd);

	/* A wrong proof. */
	assert_int_equal(raw_handshake(addr, "wrong"), -1);

	/* The raw client is right: a well-formed eager PUT is taken. */
	fd = raw_handshake(addr, SECRET);
	assert_true(fd >= 0);
	memcpy(body, "rawkey", 6);
	memset(body + 6, 0x5a, 10);
	raw_frame(fd, TCP_F_PUT, 0, 6, 16, 77, 10, body, 16);
	{
		uint8_t hdr[TCP_FRAME_BYTES];
		struct tcp_frame f;
		struct ferry_cqe c;
		uint8_t out[10];
		struct iovec v = { out, sizeof(out) };

		assert_int_equal(read_full(fd, hdr, sizeof(hdr)), 0);
		tcp_frame_unpack(hdr, &f);
		assert_int_equal(f.type, TCP_F_RESULT);
		assert_int_equal(f.cookie, 77);
		assert_int_equal((int64_t)f.arg, 0);
		get(e, t_peer(e, "raw"), "rawkey", &v, 1, 5 * SEC, 0);
		assert_int_equal(t_wait_one(e, &c, 5 * SEC), 0);
		assert_int_equal(c.len, 10);
		assert_int_equal(out[9], 0x5a);
	}
	close(fd);

	/* Each of these costs the raw client its connection, nobody else anything. */
	struct {
		uint8_t type, flags;
		uint16_t key_len;
		uint32_t len;
		uint64_t cookie, arg;
		size_t body;
	} bad[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },                           /* type 0 */
		{ 99, 0, 0, 0, 0, 0, 0 },                          /* unknown type */
		{ TCP_F_PUT, 0x80, 3, 13, 1, 10, 13 },             /* unknown flag */
		{ TCP_F_PUT, 0, 3, 12, 1, 10, 13 },                /* len != key + data */
		{ TCP_F_PUT, 0, 0, 10, 1, 10, 10 },                /* no key */
		{ TCP_F_PUT, 0, 200, 210, 1, 10, 0 },              /* key too long */
		{ TCP_F_PUT, 0, 3, 3 + (1u << 30), 1, 1u << 30, 0 }, /* eager too big */
		{ TCP_F_RTS, 0, 3, 3, 1, 0, 3 },                   /* empty offer */
		{ TCP_F_DATA, 0, 0, 100, 12345, 0, 100 },          /* data for no offer */
		{ TCP_F_DATA, 0, 0, 0, 0, 0, 0 },                  /* empty data */
		{ TCP_F_CTS, 0, 0, 0, 999, 0, 0 },                 /* CTS for no offer */
		{ TCP_F_RESULT, 0, 0, 0, 5, 0, 0 },                /* RESULT for no PUT */
		{ TCP_F_RESULT, 0, 0, 0, 5, 1, 0 },                /* positive result */
		{ TCP_F_PING, 0, 0, 4, 0, 0, 4 },                  /* PING with a body */
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		fd = raw_handshake(addr, SECRET);
		assert_true(fd >= 0);
		memset(body, 'k', sizeof(body));
		raw_frame(fd, bad[i].type, bad[i].flags, bad[i].key_len, bad[i].len, bad[i].cookie,
			  bad[i].arg, body, bad[i].body);
		if (!hung_up(fd))
			fail_msg("bad frame %u was not refused", i);
		close(fd);
	}
	/* A key with a NUL inside, and bad magic. */
	fd = raw_handshake(addr, SECRET);
	memcpy(body, "a\0c", 3);
	raw_frame(fd, TCP_F_PUT, 0, 3, 4, 1, 1, body, 4);
	assert_true(hung_up(fd));
	close(fd);
	fd = raw_handshake(addr, SECRET);
	memset(body, 0, 32);
	assert_int_equal(t_send(fd, body, 32, MSG_NOSIGNAL), 32);
	assert_true(hung_up(fd));
	close(fd);
	/* An offer, then data beyond it. */
	fd = raw_handshake(addr, SECRET);
	raw_frame(fd, TCP_F_RTS, 0, 3, 3, 9, 100000, "abc", 3);
	{
		uint8_t hdr[TCP_FRAME_BYTES];
		struct tcp_frame f;

		assert_int_equal(read_full(fd, hdr, sizeof(hdr)), 0);
		tcp_frame_unpack(hdr, &f);
		assert_int_equal(f.type, TCP_F_CTS);
		assert_int_equal(f.cookie, 9);
		raw_frame(fd, TCP_F_DATA, 0, 0, 100, f.arg, 99950, body, 0);
	}
	assert_true(hung_up(fd));
	close(fd);

	/* The engine still works for a good peer, and kept nothing. */
	go(&ch, addr);
	consume(e, "prod", 0, 20, 5000, 20);
	assert_int_equal(t_reap(ch.pid), 0);
	usleep(100000);
	ferry_progress(e);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

struct sink {
	const char *listen;
	size_t pool;
	unsigned expect_keys; /* GET these "k<i>" (0: just live until killed) */
	bool end_one;         /* then end one of the link's connections, keep the others */
};

/* A consumer child at a fixed address; reports its address on fd 'out'. */
static int out_fd = -1;

/*
 * The connections our data listener accepted (local port = its port, with
 * a peer): how many, and the last fd found.
 */
static int accepted_socks(const char *listen_addr, int *last)
{
	const char *colon = strrchr(listen_addr, ':');
	int port = colon ? atoi(colon + 1) : -1, n = 0;

	for (int fd = 3; fd < 1024; fd++) {
		struct sockaddr_in me, peer;
		socklen_t ml = sizeof(me), pl = sizeof(peer);

		if (getsockname(fd, (struct sockaddr *)&me, &ml) || me.sin_family != AF_INET ||
		    ntohs(me.sin_port) != port || getpeername(fd, (struct sockaddr *)&peer, &pl))
			continue;
		*last = fd;
		n++;
	}
	return n;
}

/* The sink counts the connections it authenticated ("connection i of n"). */
static atomic_uint sink_conns_made, sink_conns_want;

static void sink_count_conns(int level, const char *line, void *arg)
{
	const char *p = strstr(line, " connected (connection ");
	unsigned i, n;

	(void)level;
	(void)arg;
	if (getenv("FERRY_LOG"))
		fprintf(stderr, "cons: %s\n", line);
	if (p && sscanf(p, " connected (connection %u of %u)", &i, &n) == 2) {
		atomic_store(&sink_conns_want, n);
		atomic_fetch_add(&sink_conns_made, 1);
	}
}

static int sink_main(const char *unused, void *arg)
{
	struct sink *s = arg;
	struct mk m = { .name = "cons", .listen = s->listen, .secret = SECRET, .pool = s->pool };
	struct ferry_engine *e;
	char addr[NETADDR_MAX];

	(void)unused;
	if (s->end_one)
		ferry_log_set(FERRY_LOG_DEBUG, sink_count_conns, NULL);
	e = mk_engine(&m);
	if (!e)
		return 10;
	ferry_engine_address(e, addr, sizeof(addr));
	if (t_write(out_fd, addr, strlen(addr)) < 0)
		return 11;
	for (unsigned i = 0; i < s->expect_keys; i++) {
		struct ferry_cqe c;
		char key[32];

		snprintf(key, sizeof(key), "k%u", i);
		get(e, t_peer(e, "prod"), key, NULL, i, 20 * SEC, 0);
		if (t_wait_one(e, &c, 20 * SEC) != 0)
			return 12;
		ferry_buf_release(c.buf);
	}
	if (s->end_one) {
		int fd = -1, n = 0;

		/* Every connection of the link authenticated (they follow the first one). */
		for (int i = 0; i < 5000 && (!atomic_load(&sink_conns_want) ||
					     atomic_load(&sink_conns_made) <
						     atomic_load(&sink_conns_want)); i++)
			usleep(1000);
		n = accepted_socks(addr, &fd);
		if (n < 2 || (unsigned)n != atomic_load(&sink_conns_made))
			return 13;
		if (shutdown(fd, SHUT_WR))
			return 14;
		pause();
	}
	if (!s->expect_keys)
		pause();
	ferry_engine_destroy(e);
	return 0;
}

static void start_sink(struct child *ch, struct sink *s, char *addr, size_t len)
{
	int p[2];

	assert_int_equal(pipe(p), 0);
	out_fd = p[1];
	spawn(ch, sink_main, s);
	close(p[1]);
	go(ch, "-");
	assert_int_equal(wait_text(p[0], addr, len, 20000), 0);
	close(p[0]);
}

/* A PUT of a fresh 100-byte pool buffer. */
static void put_small(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		      uint64_t ud)
{
	struct ferry_buf *b;

	assert_int_equal(ferry_buf_alloc(e, 100, &b), 0);
	put_buf(e, to, key, b, ud, 10 * SEC);
}

/*
 * A sink child, and our engine (m) linked to it: its first PUT, k0
 * (user_data 1), made it and the link is up. to: the sink's peer handle;
 * addr (NETADDR_MAX bytes): the sink's address.
 */
static struct ferry_engine *linked_to_sink(struct child *ch, struct sink *s, const struct mk *m,
					   struct ferry_peer **to, char *addr)
{
	struct ferry_engine *e;
	struct ferry_cqe c;

	start_sink(ch, s, addr, NETADDR_MAX);
	e = mk_engine(m);
	assert_non_null(e);
	*to = t_peer(e, "cons");
	assert_int_equal(ferry_peer_set_address(*to, addr), 0);
	put_small(e, *to, "k0", 1);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	assert_int_equal(c.user_data, 1);
	return e;
}

static void test_tcp_kill_receiver(void **state)
{
	struct sink s = { .listen = "tcp://127.0.0.1:0", .pool = big(600 * MIB, 64 * MIB) };
	struct mk m = { .name = "prod", .secret = SECRET, .pool = big(600 * MIB, 64 * MIB) };
	struct child ch, ch2;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_buf *b;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];
	int64_t t0;
	int rc;

	(void)state;
	e = linked_to_sink(&ch, &s, &m, &to, addr);
	/* A large one, and the receiver dies under it. */
	assert_int_equal(ferry_buf_alloc(e, big(512 * MIB, 48 * MIB), &b), 0);
	memset(ferry_buf_data(b), 1, ferry_buf_len(b));
	put_buf(e, to, "big", b, 2, 10 * SEC);
	usleep(20000);
	kill(ch.pid, SIGKILL);
	t0 = t_now();
	rc = t_wait_one(e, &c, 10 * SEC);
	/* It failed (or, rarely, made it before the kill); never hung. */
	assert_true(rc == -ECONNRESET || rc == 0);
	assert_true(t_now() - t0 < 5 * SEC);
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	assert_int_equal(pool_in_use(e), 0); /* the block came back */

	/* The peer comes back at the same address: the next PUT reaches it. */
	s.listen = addr;
	s.expect_keys = 1;
	start_sink(&ch2, &s, addr, sizeof(addr));
	assert_int_equal(ferry_buf_alloc(e, 1000, &b), 0);
	put_buf(e, to, "k0", b, 3, 10 * SEC);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	assert_int_equal(t_reap(ch2.pid), 0);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

static void test_tcp_kill_sender(void **state)
{
	struct big_put bp = { .size = big(512 * MIB, 48 * MIB), .seed = 1, .n = 2, .window = 2,
			      .pool = big(1100 * MIB, 100 * MIB) };
	struct mk m = { .name = "cons", .listen = "tcp://127.0.0.1:0", .secret = SECRET,
			.pool = big(1100 * MIB, 100 * MIB) };
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];
	int rc;

	(void)state;
	spawn(&ch, big_producer, &bp);
	e = mk_engine(&m);
	assert_non_null(e);
	from = t_peer(e, "prod");
	engine_addr(e, addr, sizeof(addr));
	go(&ch, addr);
	/* Wait until data flows, then kill the sender in the middle. */
	get(e, from, "b1", NULL, 1, 30 * SEC, 0);
	for (int i = 0; i < 2000 && pool_in_use(e) == 0; i++)
		usleep(1000);
	kill(ch.pid, SIGKILL);
	rc = t_wait_one(e, &c, 20 * SEC);
	/* The GET waiting on the dead peer gives up (or had its data). */
	assert_true(rc == -ECONNRESET || rc == 0);
	if (rc == 0)
		ferry_buf_release(c.buf);
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	/* b0 may have arrived whole: take it, then nothing may be left. */
	get(e, from, "b0", NULL, 2, 0, FERRY_SQE_NOWAIT);
	if (t_wait_one(e, &c, 5 * SEC) == 0)
		ferry_buf_release(c.buf);
	usleep(100000);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/* A peer that stops answering (SIGSTOP) is declared dead by the heartbeat. */
static void test_tcp_silent_peer(void **state)
{
	struct sink s = { .listen = "tcp://127.0.0.1:0", .pool = 64 * MIB };
	struct mk m = { .name = "prod", .secret = SECRET, .pool = 64 * MIB, .heartbeat_ms = 100,
			.peer_timeout_ms = 600 };
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];
	int64_t t0, dt;

	(void)state;
	e = linked_to_sink(&ch, &s, &m, &to, addr);
	/* Idle for a few heartbeats: the live peer answers, the link stays. */
	usleep(400000);
	put_small(e, to, "k1", 2);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	/* Now it stops: the next PUT fails once the peer timeout passed. */
	kill(ch.pid, SIGSTOP);
	usleep(50000);
	t0 = t_now();
	put_small(e, to, "k2", 3);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), -ECONNRESET);
	dt = t_now() - t0;
	assert_true(dt >= 300 * MS && dt < 3 * SEC);
	kill(ch.pid, SIGKILL);
	kill(ch.pid, SIGCONT);
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/*
 * A peer that leaves right after answering: its RESULT for our last PUT and
 * the end of every connection of the link are all waiting when we look.
 * The RESULT rides connection 0, which busy polling reads after the ring's
 * completions (which bring the other connections' ends), so the link must
 * not fail at the first end: the PUT was delivered and completes with 0.
 * MANUAL mode: nothing runs here while the peer leaves.
 */
static void test_tcp_peer_leaves_after_answer(void **state)
{
	struct sink s = { .listen = "tcp://127.0.0.1:0", .pool = 64 * MIB, .expect_keys = 2 };
	struct mk m = { .name = "prod", .secret = SECRET, .pool = 64 * MIB, .manual = true };
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];
	int64_t t0;

	(void)state;
	/* k0: the link is up, and its first connection carried traffic (read directly). */
	e = linked_to_sink(&ch, &s, &m, &to, addr);
	/* k1 leaves in one round; the peer takes it, answers and exits meanwhile. */
	put_small(e, to, "k1", 2);
	assert_true(ferry_progress(e) >= 0);
	assert_int_equal(t_reap(ch.pid), 0);
	t0 = t_now();
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	assert_int_equal(c.user_data, 2);
	assert_true(t_now() - t0 < 5 * SEC);
	/* The peer is gone now: the next PUT fails, its block comes back. */
	put_small(e, to, "k2", 3);
	assert_true(t_wait_one(e, &c, 10 * SEC) < 0);
	assert_true(c.res == -ECONNRESET || c.res == -EHOSTUNREACH || c.res == -ETIMEDOUT);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
}

/*
 * A peer that ends one connection of the link and keeps the others open
 * (a broken peer, or one lost on the way): the link stops taking PUTs at
 * once (the next one calls anew and arrives) and is dropped after the
 * grace period instead of waiting forever for the other ends.
 */
static atomic_int kept_open_logged;

static void grab_kept_open(int level, const char *line, void *arg)
{
	(void)level;
	(void)arg;
	if (getenv("FERRY_LOG"))
		fprintf(stderr, "prod: %s\n", line);
	if (strstr(line, "kept the others open"))
		atomic_store(&kept_open_logged, 1);
}

static void test_tcp_peer_ends_one_connection(void **state)
{
	struct sink s = { .listen = "tcp://127.0.0.1:0", .pool = 64 * MIB, .expect_keys = 1,
			  .end_one = true };
	struct mk m = { .name = "prod", .secret = SECRET, .pool = 64 * MIB };
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	char addr[NETADDR_MAX];
	int64_t t0;

	(void)state;
	atomic_store(&kept_open_logged, 0);
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_WARN, grab_kept_open, NULL);
	e = linked_to_sink(&ch, &s, &m, &to, addr);
	/* The peer ends one connection: the link is dropped after the grace. */
	t0 = t_now();
	while (!atomic_load(&kept_open_logged) && t_now() - t0 < 10 * SEC)
		usleep(5000);
	assert_true(atomic_load(&kept_open_logged));
	/* The next PUT calls anew and reaches the live peer. */
	put_small(e, to, "k1", 2);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	kill(ch.pid, SIGKILL);
	assert_int_equal(t_reap(ch.pid), 128 + SIGKILL);
	assert_int_equal(pool_in_use(e), 0);
	ferry_engine_destroy(e);
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_tcp_params, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_deadlines, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_address_sticks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_health, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_namespaces_isolated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_three_to_one, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_one_to_three, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_wrong_secret, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_silent_flood, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_handshake_bound, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_malformed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_bad_peer_name, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_silent_peer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_kill_receiver, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_kill_sender, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_peer_leaves_after_answer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_peer_ends_one_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_one_gib, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_eight_concurrent, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/test_rdma.c - what the rdma transport does beyond the conformance
 * suite, on real verbs: it runs in ferry's RDMA test guest (tests/rdma-vm/:
 * two Soft-RoCE devices joined by a veth pair, $RDMA_IP0 on rxe0,
 * $RDMA_IP1 on rxe1) and skips (77) anywhere else.
 *
 * Engines "a" (on RDMA_IP1) and "b" (on RDMA_IP0) of this process, so every
 * byte crosses the wire: eager and announced PUTs of every size class
 * (the health counters say which path each took), a vectored PUT of 56
 * segments of a registered region (one announcement of the segments where
 * they are, read in place; more than an announcement takes: staged), an
 * announced PUT READ straight into a parked GET's registered segments, a burst of PUTs far larger than the
 * receives posted (credits), a malformed announcement (the sender is
 * disconnected, a third engine notices nothing), a peer without the cluster
 * secret (refused; no op of it ever reaches b), a caller that forges its
 * AUTH (refused by the callee), a queue pair forced into the error state
 * (the connection ends on both sides, GETs waiting for the peer's keys end
 * with -ECONNRESET, the next PUT connects again), a peer killed and started
 * again at its address (PUTs fail with -ECONNRESET, then go again), a
 * peer fallen silent (its link down: found by the heartbeats), a device
 * removed under a connection and made again (both engines let go of it,
 * the removal completes, traffic resumes both ways), and no memory region
 * or connection left behind.
 */
#include <signal.h>
#include <sys/wait.h>

#include "rdma_helpers.h"

#ifdef FERRY_HAVE_RDMA_TRANSPORT
#include "rdma_int.h"

#define SECRET "rdma-test-secret"
#define NSP "rdmatest"
#define MIB (1024ull * 1024ull)

static char ip0[64], ip1[64];
/* Engines made by mk() get these (0: the defaults); test_silent_peer sets them. */
static uint32_t hb_ms, peer_to_ms;

static struct ferry_engine *mk(const char *name, const char *ip, const char *secret,
			       enum ferry_progress_mode mode, size_t pool, const char *at)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	char listen[96];
	int rc;

	if (at)
		snprintf(listen, sizeof(listen), "%s", at);
	else
		snprintf(listen, sizeof(listen), "rdma://%s:0", ip);
	p.name = name;
	p.ns = NSP;
	p.pool_size = pool ? pool : 32 * MIB;
	p.progress = mode;
	p.spin_ns = 20000;
	p.rdma_listen = listen;
	p.secret = secret;
	p.handshake_ms = t_handshake_ms(); /* the emulated guest may be slow */
	p.heartbeat_ms = hb_ms;
	p.peer_timeout_ms = peer_to_ms;
	rc = ferry_engine_create(&p, &e);
	if (rc)
		fail_msg("engine %s: %s", name, ferry_strerror(rc));
	return e;
}

/* PUT n bytes from a to b under key and GET them there into fresh memory. */
static void put_get(struct ferry_engine *a, struct ferry_peer *to_b, struct ferry_engine *b,
		    struct ferry_peer *from_a, const char *key, size_t n, unsigned seed)
{
	uint8_t *src = malloc(n + 1), *dst = malloc(n + 17);
	struct iovec iov;
	struct ferry_buf *buf;
	struct ferry_sqe *sqe;

	assert_non_null(src);
	assert_non_null(dst);
	pattern(src, n, seed);
	memset(dst, 0xa5, n + 17);
	/* From a pool buffer: the big ones are announced straight from it. */
	assert_int_equal(ferry_buf_alloc(a, n, &buf), 0);
	memcpy(ferry_buf_data(buf), src, n);
	sqe = t_sqe(a);
	ferry_prep_put_buf(sqe, to_b, key, buf, seed);
	t_submit(a);
	t_expect(a, NULL, seed, 0, NULL);
	iov.iov_base = dst;
	iov.iov_len = n;
	t_get(b, from_a, key, &iov, 1, seed + 1, 0, 10 * SEC);
	{
		struct ferry_cqe c;

		t_expect(b, NULL, seed + 1, 0, &c);
		assert_int_equal(c.len, n);
	}
	if (!pattern_ok(dst, n, seed))
		fail_msg("%zu bytes of %s arrived changed", n, key);
	for (size_t i = n; i < n + 17; i++)
		assert_int_equal(dst[i], 0xa5);
	free(src);
	free(dst);
}

/* Eager and announced PUTs of every size class; the counters say which path each took. */
static void test_sizes(void **state)
{
	static const size_t sizes[] = { 0, 1, 255, 256, 257, 4095, 4096, 4097, 65536,
					MIB + 3, 8 * MIB };
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;
	char key[32];

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		long long reads = rh(b, "reads"), eager = rh(a, "eager");

		snprintf(key, sizeof(key), "k%u", i);
		put_get(a, ab, b, ba, key, sizes[i], i + 1);
		if (sizes[i] <= RDMA_EAGER_MAX) {
			assert_int_equal(rh(a, "eager"), eager + 1);
			assert_int_equal(rh(b, "reads"), reads);
		} else {
			assert_int_equal(rh(a, "eager"), eager);
			assert_true(rh(b, "reads") >= reads + (long long)((sizes[i] + RDMA_READ_PIECE - 1) /
									  RDMA_READ_PIECE));
		}
	}
	assert_int_equal(rh(b, "malformed"), 0);
	assert_int_equal(rh(a, "connections_ready"), 1);
	assert_int_equal(rh(b, "connections_ready"), 1);
	/*
	 * Small messages went inline (rxe grants RDMA_SEND_INLINE): at least
	 * a's PUTs of 0 and 1 byte, and b's answers to them.
	 */
	assert_true(rh(a, "inline_sends") >= 2);
	assert_true(rh(b, "inline_sends") >= 2);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_vectored_56(void **state)
{
	enum { LAYERS = 56 };
	const size_t layer = 64 * 1024 + 24;
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;
	struct ferry_region *r;
	struct ferry_seg segs[LAYERS];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	struct iovec iov;
	uint8_t *mem, *dst;

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	mem = malloc(LAYERS * layer * 2);
	dst = malloc(LAYERS * layer);
	assert_non_null(mem);
	assert_non_null(dst);
	rp.addr = mem;
	rp.len = LAYERS * layer * 2;
	assert_int_equal(ferry_region_register(a, &rp, &r), 0);
	/* Every other layer-sized piece of the region, in reverse order. */
	for (unsigned i = 0; i < LAYERS; i++) {
		segs[i].region = r;
		segs[i].offset = (uint64_t)(LAYERS - 1 - i) * 2 * layer;
		segs[i].len = layer;
		pattern(mem + segs[i].offset, layer, 100 + i);
	}
	{
		long long inplace = rh(a, "announced_in_place"), reads = rh(b, "reads");

		sqe = t_sqe(a);
		ferry_prep_put_segs(sqe, ab, "kv", segs, LAYERS, 1);
		t_submit(a);
		t_expect(a, NULL, 1, 0, NULL);
		/* One announcement of the 56 segments where they are, a READ (at least) of each. */
		assert_int_equal(rh(a, "announced_in_place"), inplace + 1);
		assert_true(rh(b, "reads") >= reads + LAYERS);
	}
	/* Done means read: the memory is the caller's again, b holds its own copy. */
	memset(mem, 0x5a, LAYERS * layer * 2);
	iov.iov_base = dst;
	iov.iov_len = LAYERS * layer;
	t_get(b, ba, "kv", &iov, 1, 2, 0, 10 * SEC);
	t_expect(b, NULL, 2, 0, &c);
	assert_int_equal(c.len, LAYERS * layer);
	for (unsigned i = 0; i < LAYERS; i++)
		if (!pattern_ok(dst + i * layer, layer, 100 + i))
			fail_msg("layer %u arrived changed", i);
	/* More segments than one announcement takes (RDMA_MAX_SEG): staged, and whole. */
	{
		enum { MANY = RDMA_MAX_SEG + 1 };
		struct ferry_seg many[MANY];
		const size_t piece = 4096 + 8;
		long long inplace = rh(a, "announced_in_place");

		for (unsigned i = 0; i < MANY; i++) {
			many[i].region = r;
			many[i].offset = (uint64_t)i * piece;
			many[i].len = piece;
		}
		pattern(mem, MANY * piece, 7);
		sqe = t_sqe(a);
		ferry_prep_put_segs(sqe, ab, "many", many, MANY, 3);
		t_submit(a);
		t_expect(a, NULL, 3, 0, NULL);
		assert_int_equal(rh(a, "announced_in_place"), inplace);
		memset(dst, 0, MANY * piece);
		iov.iov_len = MANY * piece;
		t_get(b, ba, "many", &iov, 1, 4, 0, 10 * SEC);
		t_expect(b, NULL, 4, 0, &c);
		assert_int_equal(c.len, MANY * piece);
		assert_true(pattern_ok(dst, MANY * piece, 7));
	}
	assert_int_equal(rh(b, "malformed"), 0);
	assert_int_equal(ferry_region_release(&r), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	free(mem);
	free(dst);
}

/* An SQE of e's queue, waiting (bounded) while the reactor has not drained it yet. */
static struct ferry_sqe *sqe_wait(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;
	int64_t end = t_now() + 10 * SEC;

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	while (!(sqe = ferry_sq_get_sqe(sq)) && t_now() < end) {
		ferry_sq_submit(sq);
		usleep(1000);
	}
	assert_non_null(sqe);
	return sqe;
}

/*
 * Many more PUTs at once than receives are posted (RDMA_RECVS): credits
 * hold the sender back, nothing is lost, every one arrives, in order (the
 * same key with REPLACE would hide a reordering, so each has its own key
 * and the GETs wait first).
 */
static void test_credits(void **state)
{
	enum { N = 5 * RDMA_RECVS };
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;
	static uint32_t vals[N], got[N];
	struct iovec iov[N];
	struct ferry_sqe *sqe;
	char key[32];
	int ok = 0;

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	put_get(a, ab, b, ba, "warm", 8, 1); /* connected */
	for (unsigned i = 0; i < N; i++) {
		snprintf(key, sizeof(key), "c%u", i);
		iov[i].iov_base = &got[i];
		iov[i].iov_len = sizeof(got[i]);
		sqe = sqe_wait(b);
		ferry_prep_get(sqe, ba, key, &iov[i], 1, 1000 + i);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		t_submit(b);
	}
	for (unsigned i = 0; i < N; i++) {
		sqe = sqe_wait(a);
		vals[i] = 0xc0de0000u + i;
		snprintf(key, sizeof(key), "c%u", i);
		ferry_prep_put(sqe, ab, key, t_iov_of(&vals[i], sizeof(vals[i])), 1, 5000 + i);
		if ((i + 1) % 64 == 0 || i == N - 1)
			t_submit(a);
	}
	for (unsigned i = 0; i < N; i++) {
		struct ferry_cqe c;

		assert_true(t_wait_cqe(a, NULL, &c, 30 * SEC));
		assert_int_equal(c.res, 0);
	}
	for (unsigned i = 0; i < N; i++) {
		struct ferry_cqe c;

		assert_true(t_wait_cqe(b, NULL, &c, 30 * SEC));
		assert_int_equal(c.res, 0);
		/* Delivered in the order sent: the GETs complete in that order too. */
		assert_int_equal(c.user_data, 1000 + i);
		ok += got[i] == 0xc0de0000u + i;
	}
	assert_int_equal(ok, N);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* Drive a MANUAL engine until cond or 10 s pass. */
#define DRIVE_UNTIL(e, cond)                                                       \
	do {                                                                       \
		int64_t end_ = t_now() + 10 * SEC;                                 \
		while (!(cond) && t_now() < end_) {                                \
			ferry_progress(e);                                         \
			usleep(500);                                               \
		}                                                                  \
		assert_true(cond);                                                 \
	} while (0)

static struct rdma_state *state_of(struct ferry_engine *e)
{
	extern const struct backend_ops ferry__rdma_backend;
	struct backend *bk = ferry__backend_of(e, &ferry__rdma_backend);

	assert_non_null(bk);
	return bk->data;
}

static struct rdma_conn *ready_caller(struct rdma_state *st)
{
	for (struct rdma_conn *c = st->conn_list; c; c = c->next)
		if (c->caller && c->state == RC_READY)
			return c;
	return NULL;
}

/*
 * A sender (the MANUAL engine m, driven by this thread, so that it can post
 * on its own connection) announces segments that do not add up to the
 * length: b disconnects it and counts it, and engine a, talking to b all
 * along, notices nothing.
 */
static void test_malformed_announce(void **state)
{
	struct ferry_engine *a, *b, *m;
	struct ferry_peer *ab, *ba, *mb;
	struct rdma_state *ms;
	struct rdma_conn *c;
	struct rdma_seg_wire seg[2];
	struct rdma_hdr h;
	uint32_t v = 7;

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	m = mk("m", ip1, SECRET, FERRY_PROGRESS_MANUAL, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	mb = peer_at(m, "b", b);
	put_get(a, ab, b, ba, "before", 100000, 3);
	t_put(m, mb, "hello", &v, sizeof(v), 1, 0);
	{
		struct ferry_cqe cq;

		assert_true(t_wait_cqe(m, NULL, &cq, 10 * SEC));
		assert_int_equal(cq.res, 0);
	}
	ms = state_of(m);
	c = ready_caller(ms);
	assert_non_null(c);
	memset(&h, 0, sizeof(h));
	memset(seg, 0, sizeof(seg));
	h.type = RM_ANNOUNCE;
	h.nseg = 2;
	h.len = 1u << 20;
	seg[0].len = 4096;
	seg[1].len = 4096; /* 8 KiB announced as 1 MiB */
	assert_int_equal(rdma_post_msg(ms, c, &h, "bad", 3, seg, sizeof(seg), NULL, 0, true), 0);
	{
		int64_t end = t_now() + 10 * SEC;

		while (rh(b, "malformed") < 1 && t_now() < end) {
			ferry_progress(m);
			usleep(1000);
		}
	}
	assert_int_equal(rh(b, "malformed"), 1);
	DRIVE_UNTIL(m, rh(m, "connections_ready") == 0);
	{
		/* b counts it, then logs it: the line may come a moment after. */
		int64_t end = t_now() + 10 * SEC;

		while (!t_log_seen(FERRY_LOG_WARN, "malformed", "bad segment") &&
		       !t_log_seen(FERRY_LOG_WARN, "malformed", "add up") && t_now() < end)
			usleep(1000);
	}
	assert_true(t_log_seen(FERRY_LOG_WARN, "malformed", "bad segment") ||
		    t_log_seen(FERRY_LOG_WARN, "malformed", "add up"));
	/* a goes on as before. */
	put_get(a, ab, b, ba, "after", 300000, 4);
	put_get(a, ab, b, ba, "after2", 10, 5);
	assert_int_equal(rh(a, "connections_ready"), 1);
	ferry_engine_destroy(m);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* An engine with another secret is refused: its PUT fails, b never sees its key. */
static void test_wrong_secret(void **state)
{
	struct ferry_engine *a, *b, *x;
	struct ferry_peer *ab, *ba, *xb;
	struct ferry_cqe c;
	uint32_t v = 9, got = 0;
	struct iovec iov = { &got, sizeof(got) };

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	x = mk("x", ip1, "not-the-secret", FERRY_PROGRESS_THREAD, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	xb = peer_at(x, "b", b);
	t_put(x, xb, "intruder", &v, sizeof(v), 1, 0);
	assert_true(t_wait_cqe(x, NULL, &c, 10 * SEC));
	assert_true(c.res == -EACCES || c.res == -ECONNRESET);
	assert_true(rh(x, "peers_refused") >= 1); /* b did not prove x's secret to x */
	t_get(b, t_peer(b, "x"), "intruder", &iov, 1, 2, FERRY_SQE_NOWAIT, 0);
	t_expect(b, NULL, 2, -EAGAIN, NULL);
	put_get(a, ab, b, ba, "fine", 70000, 6);
	ferry_engine_destroy(x);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * A caller that sends an AUTH it cannot have computed (no secret: 32 bytes
 * of garbage, right after its HELLO, before it even reads b's PROOF) is
 * refused by b, and never becomes a connection of b.
 */
static void test_forged_auth(void **state)
{
	struct ferry_engine *b, *x;
	struct ferry_peer *xb;
	struct rdma_state *xs;
	struct rdma_conn *c = NULL;
	uint8_t junk[SEC_MAC_BYTES];
	uint32_t v = 1;
	int64_t end;

	(void)state;
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	/*
	 * x is stopped right after its HELLO. On a loaded machine one round of
	 * x can also read b's PROOF (x then refuses b, its own secret being
	 * another): that try is given up and x made again, up to 5 times.
	 */
	for (int tries = 0; tries < 5; tries++) {
		bool was_seen = false;

		x = mk("x", ip1, "not-the-secret", FERRY_PROGRESS_MANUAL, 0, NULL);
		xb = peer_at(x, "b", b);
		t_put(x, xb, "intruder", &v, sizeof(v), 1, 0);
		xs = state_of(x);
		end = t_now() + 10 * SEC;
		c = NULL;
		while (t_now() < end) {
			ferry_progress(x);
			c = xs->conn_list;
			if (c && c->state == RC_WAIT_PROOF)
				break;
			if (c)
				was_seen = true;
			else if (was_seen)
				break; /* gone past it: x read b's PROOF and refused it */
			usleep(200);
		}
		if (c && c->state == RC_WAIT_PROOF)
			break;
		ferry_engine_destroy(x);
		x = NULL;
		c = NULL;
		usleep(100000); /* b lets go of the connection x dropped */
	}
	assert_non_null(c);
	assert_int_equal(c->state, RC_WAIT_PROOF); /* HELLO sent, b's PROOF not read */
	memset(junk, 0x5a, sizeof(junk));
	assert_int_equal(rdma_send_ctl(xs, c, RM_AUTH, NULL, 0, junk, sizeof(junk)), 0);
	/* x is not driven from here on: b alone decides. */
	end = t_now() + 10 * SEC;
	while (rh(b, "peers_refused") < 1 && t_now() < end)
		usleep(10000);
	assert_int_equal(rh(b, "peers_refused"), 1);
	assert_int_equal(rh(b, "connections_ready"), 0);
	/* b counts the refusal, then logs it: the line may come a moment after. */
	assert_true(t_log_wait(FERRY_LOG_WARN, "refused", "did not prove the cluster secret",
			       10000));
	ferry_engine_destroy(x);
	ferry_engine_destroy(b);
}

/*
 * The far engine b is a child: killed, started again at its address; a's
 * PUTs go again. Both children are forked before this process has an
 * engine (a child of a process that opened RDMA devices inherits librdmacm's
 * device contexts, which it cannot use), and each makes its engine when
 * told: "go" and the address to listen at ("" for any port) on one pipe,
 * its address back on the other.
 */
struct child {
	pid_t pid;
	int to, from;
};

static int child_b(int in, int out)
{
	struct ferry_engine *b;
	char at[128], addr[128];

	if (t_read(in, at, sizeof(at)) != (ssize_t)sizeof(at))
		_exit(0); /* not needed */
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, at[0] ? at : NULL);
	rdma_addr_of(b, addr, sizeof(addr));
	if (t_write(out, addr, sizeof(addr)) != (ssize_t)sizeof(addr))
		_exit(3);
	for (;;)
		pause();
}

static struct child fork_b(void)
{
	int down[2], up[2];
	struct child ch;

	assert_int_equal(pipe(down), 0);
	assert_int_equal(pipe(up), 0);
	ch.pid = fork();
	assert_true(ch.pid >= 0);
	if (ch.pid == 0) {
		close(down[1]);
		close(up[0]);
		_exit(child_b(down[0], up[1]));
	}
	close(down[0]);
	close(up[1]);
	ch.to = down[1];
	ch.from = up[0];
	return ch;
}

static void start_b(struct child *ch, const char *at, char *addr)
{
	char msg[128] = "";

	if (at)
		snprintf(msg, sizeof(msg), "%s", at);
	assert_int_equal(t_write(ch->to, msg, sizeof(msg)), sizeof(msg));
	assert_int_equal(t_read(ch->from, addr, 128), 128);
}

static void test_kill_reconnect(void **state)
{
	struct ferry_engine *a;
	struct ferry_peer *ab;
	struct ferry_cqe c;
	char addr[128], again[128];
	uint32_t v = 1;
	struct child b1 = fork_b(), b2 = fork_b();
	int st;
	bool ok = false;

	(void)state;
	start_b(&b1, NULL, addr);
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	ab = t_peer(a, "b");
	assert_int_equal(ferry_peer_connect_uri(ab, addr), 0);
	t_put(a, ab, "one", &v, sizeof(v), 1, 0);
	t_expect(a, NULL, 1, 0, NULL);
	assert_int_equal(rh(a, "connections_ready"), 1);
	kill(b1.pid, SIGKILL);
	assert_int_equal(t_waitpid(b1.pid, &st, 0), b1.pid);
	/* The peer's death reaches us (the kernel disconnects its QP). */
	{
		int64_t end = t_now() + 10 * SEC;

		while (rh(a, "connections_ready") != 0 && t_now() < end)
			usleep(10000);
	}
	assert_int_equal(rh(a, "connections_ready"), 0);
	/* A PUT now fails: nobody listens there. */
	t_put(a, ab, "gone", &v, sizeof(v), 2, 0);
	assert_true(t_wait_cqe(a, NULL, &c, 10 * SEC));
	assert_int_equal(c.user_data, 2);
	assert_true(c.res == -EHOSTUNREACH || c.res == -ECONNRESET);
	start_b(&b2, addr, again);
	assert_string_equal(addr, again);
	/* The next PUT calls again. */
	for (int i = 0; i < 20 && !ok; i++) {
		t_put(a, ab, "two", &v, sizeof(v), 10 + i, FERRY_SQE_REPLACE);
		assert_true(t_wait_cqe(a, NULL, &c, 10 * SEC));
		ok = c.res == 0;
		if (!ok) {
			fprintf(stderr, "after the restart: PUT %d: %s\n", i, ferry_strerror(c.res));
			usleep(50000);
		}
	}
	assert_true(ok);
	assert_int_equal(rh(a, "connections_ready"), 1);
	kill(b2.pid, SIGKILL);
	t_waitpid(b2.pid, &st, 0);
	close(b1.to);
	close(b1.from);
	close(b2.to);
	close(b2.from);
	ferry_engine_destroy(a);
}

/*
 * b parks a GET (user_data 2) of key into segs, then a PUTs n patterned
 * bytes (seed) under it from a pool buffer and sees it complete.
 */
static void get_segs_then_put(struct ferry_engine *a, struct ferry_peer *ab, struct ferry_engine *b,
			      struct ferry_peer *ba, const char *key, const struct ferry_seg *segs,
			      unsigned nsegs, size_t n, unsigned seed)
{
	struct ferry_buf *buf;
	struct ferry_sqe *sqe = t_sqe(b);

	ferry_prep_get_segs(sqe, ba, key, segs, nsegs, 2);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	t_submit(b);
	t_expect_none(b, NULL, 50); /* parked */
	assert_int_equal(ferry_buf_alloc(a, n, &buf), 0);
	pattern(ferry_buf_data(buf), n, seed);
	sqe = t_sqe(a);
	ferry_prep_put_buf(sqe, ab, key, buf, 3);
	t_submit(a);
	t_expect(a, NULL, 3, 0, NULL);
}

/*
 * A GET parked at b into segments of a region b registered: an announced
 * PUT is READ straight into them (no block of b's pool, no copy), across a
 * segment boundary in the middle of a READ piece; a GET too small for the
 * data, or one into plain memory, is left to the key table as before.
 */
static void test_read_into_get(void **state)
{
	const size_t n = 3 * MIB + 4096 + 100;
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;
	struct ferry_region *r;
	struct ferry_seg segs[3];
	struct ferry_cqe c;
	uint8_t *mem, *tmp;
	struct iovec iov;
	long long into;

	(void)state;
	a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	ab = peer_at(a, "b", b);
	ba = t_peer(b, "a");
	put_get(a, ab, b, ba, "hello", 64, 1); /* the connection is up */
	mem = malloc(2 * n + 8192);
	tmp = malloc(n);
	assert_non_null(mem);
	assert_non_null(tmp);
	memset(mem, 0xa5, 2 * n + 8192);
	rp.addr = mem;
	rp.len = 2 * n + 8192;
	assert_int_equal(ferry_region_register(b, &rp, &r), 0);
	/* Three pieces out of order; the first ends 1000 bytes into a READ piece. */
	segs[0] = (struct ferry_seg){ .region = r, .offset = n + 4096, .len = RDMA_READ_PIECE + 1000 };
	segs[1] = (struct ferry_seg){ .region = r, .offset = 0, .len = 0 };
	segs[2] = (struct ferry_seg){ .region = r, .offset = 100, .len = n - segs[0].len };
	into = rh(b, "read_into_get");
	get_segs_then_put(a, ab, b, ba, "direct", segs, 3, n, 9);
	t_expect(b, NULL, 2, 0, &c);
	assert_int_equal(c.len, n);
	assert_null(c.buf);
	assert_int_equal(rh(b, "read_into_get"), into + 1);
	memcpy(tmp, mem + segs[0].offset, segs[0].len);
	memcpy(tmp + segs[0].len, mem + segs[2].offset, segs[2].len);
	assert_true(pattern_ok(tmp, n, 9));
	assert_int_equal(mem[segs[0].offset - 1], 0xa5); /* nothing around them written */
	assert_int_equal(mem[segs[0].offset + segs[0].len], 0xa5);
	assert_int_equal(mem[99], 0xa5);
	assert_int_equal(mem[100 + segs[2].len], 0xa5);
	/* Too small for it: not claimed; the GET fails as in the key table, the data stays. */
	segs[0].len = n - 1;
	get_segs_then_put(a, ab, b, ba, "small", segs, 1, n, 10);
	t_expect(b, NULL, 2, -EMSGSIZE, NULL);
	assert_int_equal(rh(b, "read_into_get"), into + 1);
	iov.iov_base = tmp;
	iov.iov_len = n;
	t_get(b, ba, "small", &iov, 1, 6, 0, 10 * SEC);
	t_expect(b, NULL, 6, 0, NULL);
	assert_true(pattern_ok(tmp, n, 10));
	assert_int_equal(rh(b, "malformed"), 0);
	assert_int_equal(ferry_region_release(&r), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	free(mem);
	free(tmp);
}

static void wait_ready(struct ferry_engine *e, long long want, int64_t ns)
{
	int64_t end = t_now() + ns;

	while (rh(e, "connections_ready") != want && t_now() < end)
		usleep(10000);
	assert_int_equal(rh(e, "connections_ready"), want);
}

/*
 * THREAD-mode engines a (on RDMA_IP1) and b (on RDMA_IP0), a's PUT of n
 * bytes to b arrived whole: a's connection to b is READY at both ends.
 */
static void ready_pair(struct ferry_engine **a, struct ferry_engine **b, struct ferry_peer **ab,
		       struct ferry_peer **ba, size_t n)
{
	*a = mk("a", ip1, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	*b = mk("b", ip0, SECRET, FERRY_PROGRESS_THREAD, 0, NULL);
	*ab = peer_at(*a, "b", *b);
	*ba = t_peer(*b, "a");
	put_get(*a, *ab, *b, *ba, "before", n, 1);
	wait_ready(*a, 1, 10 * SEC);
	wait_ready(*b, 1, 10 * SEC);
}

/* ready_pair with heartbeats every 20 ms and a peer dead after 1 s of silence. */
static void ready_pair_watched(struct ferry_engine **a, struct ferry_engine **b,
			       struct ferry_peer **ab, struct ferry_peer **ba, size_t n)
{
	hb_ms = 20;
	peer_to_ms = 1000;
	ready_pair(a, b, ab, ba, n);
}

/*
 * A GET parked at b for a key of a (60 s deadline), then fault(b): the GET
 * ends with -ECONNRESET long before its deadline, and both ends'
 * connections are gone.
 */
static void parked_get_ends(struct ferry_engine *a, struct ferry_engine *b, struct ferry_peer *ba,
			    void (*fault)(struct ferry_engine *b))
{
	uint8_t dst[16];
	struct iovec iov = { dst, sizeof(dst) };
	struct ferry_cqe c;
	int64_t t0;

	t_get(b, ba, "never", &iov, 1, 77, 0, 60 * SEC);
	t_expect_none(b, NULL, 50);
	t0 = t_now();
	fault(b);
	assert_true(t_wait_cqe(b, NULL, &c, 30 * SEC));
	assert_int_equal(c.user_data, 77);
	assert_int_equal(c.res, -ECONNRESET);
	assert_true(t_now() - t0 < 30 * SEC); /* the fault, not the 60 s deadline */
	wait_ready(b, 0, 10 * SEC);
	wait_ready(a, 0, 10 * SEC);
}

static void qp_error_at(struct ferry_engine *b)
{
	assert_int_equal(ferry__rdma_fault_qp_error(b), 0);
}

/* wire.sh blackhole: every packet between the two devices dropped, silently. */
static void wire_cut(struct ferry_engine *b)
{
	const char *wire = getenv("RDMA_WIRE");
	char cmd[512];

	(void)b;
	assert_non_null(wire);
	snprintf(cmd, sizeof(cmd), "/bin/bash %s blackhole", wire);
	assert_int_equal(system(cmd), 0);
}

/*
 * b's queue pair to a goes to the error state (forced through the
 * transport's fault hook, as a NIC fault or a failed work request would):
 * b finds out from its flushed completions, ends the connection (a hears
 * the disconnect), a GET b has parked for a key of a ends with -ECONNRESET
 * long before its deadline, and the next PUTs connect again and arrive
 * whole, an eager one and an announced one. Nothing is counted malformed.
 */
static void test_qp_error(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;

	(void)state;
	ready_pair(&a, &b, &ab, &ba, 4096);
	parked_get_ends(a, b, ba, qp_error_at);
	/* The next PUTs call again; both arrive whole. */
	put_get(a, ab, b, ba, "after_small", 100, 2);
	put_get(a, ab, b, ba, "after_big", 2 * MIB + 5, 3);
	assert_int_equal(rh(a, "connections_ready"), 1);
	assert_int_equal(rh(b, "connections_ready"), 1);
	assert_int_equal(rh(a, "malformed"), 0);
	assert_int_equal(rh(b, "malformed"), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* After test_silent_peer, even a failed one: the wire as wire.sh made it. */
static int mend_wire(void **state)
{
	const char *wire = getenv("RDMA_WIRE");
	char cmd[512];

	(void)state;
	if (!wire)
		return -1;
	snprintf(cmd, sizeof(cmd), "/bin/bash %s mend", wire);
	return system(cmd) == 0 ? 0 : -1;
}

/*
 * Peers that fall silent without a word (the wire between them cut:
 * wire.sh blackhole drops every packet at the receiving end; no DREQ, no
 * rdma_cm event, no error anywhere, nothing in flight): the heartbeats
 * (heartbeat_ms 20 here) find it. Before: the idle connection lives
 * through several peer_timeouts on heartbeats alone, more of them than
 * an end has credits (so the credits come back with the other's). Then a GET b parked for a key of a, with a 60 s deadline, ends
 * with -ECONNRESET within seconds (a heartbeat, then at most 7 tries of the
 * QP's ACK timeout, set from peer_timeout_ms 1000 to about 134 ms), and
 * both ends' connections are gone. With the wire mended, the next PUT
 * connects again (the teardown mends it too, when the case failed first).
 */
static void test_silent_peer(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba;

	(void)state;
	ready_pair_watched(&a, &b, &ab, &ba, 100);
	usleep(2500 * 1000); /* idle: 2.5 peer_timeouts, heartbeats only (~125 each) */
	/* More than the 64 credits an end starts with: each end's heartbeats carry back
	 * the credits of the other's. */
	assert_true(rh(a, "heartbeats") > 64);
	assert_true(rh(b, "heartbeats") > 64);
	assert_int_equal(rh(a, "connections_ready"), 1);
	assert_int_equal(rh(b, "connections_ready"), 1);
	put_get(a, ab, b, ba, "between", 100, 2);
	parked_get_ends(a, b, ba, wire_cut);
	/* The wire mended: the next PUT calls again and arrives whole. */
	assert_int_equal(mend_wire(NULL), 0);
	put_get(a, ab, b, ba, "after", 100, 3);
	assert_int_equal(rh(a, "connections_ready"), 1);
	assert_int_equal(rh(a, "malformed"), 0);
	assert_int_equal(rh(b, "malformed"), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* wire.sh CMD (unplug, replug) in a child; its pid. */
static pid_t wire_spawn(const char *cmd)
{
	const char *wire = getenv("RDMA_WIRE");
	pid_t pid;

	assert_non_null(wire);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/bin/bash", "bash", wire, cmd, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* The child's exit status within ms, or -1 (then it is killed). */
static int wire_wait(pid_t pid, int ms)
{
	int64_t end = t_now() + (int64_t)ms * MS;
	int st;

	while (t_now() < end) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
		if (r < 0 && errno != EINTR)
			return -1;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	t_waitpid(pid, &st, 0);
	return -1;
}

static pid_t unplugging;

static void unplug_rxe1(struct ferry_engine *b)
{
	(void)b;
	unplugging = wire_spawn("unplug");
}

/* After test_device_removed, even a failed one: rxe1 there again. */
static int replug(void **state)
{
	(void)state;
	if (unplugging > 0)
		wire_wait(unplugging, 30000);
	unplugging = 0;
	return wire_wait(wire_spawn("replug"), 30000) == 0 ? 0 : -1;
}

/*
 * a's device (rxe1) removed (`rdma link delete`, which returns only once
 * every process let go of the device) under a live connection: a GET b
 * parked for a key of a ends with -ECONNRESET; a, whose listener and
 * connection were on rxe1, hears it from rdma_cm, and b, which only opened
 * rxe1 (its pool registered there), from the kernel's device events; both
 * let go of everything they held on it, so the removal completes. With the
 * device made again, a's PUTs to b connect again, and b's to a reach a's
 * listener, made again at its address. The same once more with the new rxe1.
 */
/*
 * One removal of rxe1 under a's live connection to b (a GET b parked for a
 * key of a ends with -ECONNRESET), which must complete (every user let go of
 * the device), then rxe1 made again and PUTs both ways: a to b, and b to a
 * through a's listener made again (ba2, ab2: made the first time).
 */
static void unplug_round(struct ferry_engine *a, struct ferry_engine *b, struct ferry_peer *ab,
			 struct ferry_peer *ba, struct ferry_peer **ba2, struct ferry_peer **ab2,
			 int round)
{
	int rc;

	parked_get_ends(a, b, ba, unplug_rxe1);
	rc = wire_wait(unplugging, 20000);
	unplugging = 0;
	if (rc)
		fail_msg("round %d: the removal of rxe1 did not complete within 20 s (rc %d): "
			 "something still holds the device", round, rc);
	/* a heard it from rdma_cm; b (nothing of its on rxe1) otherwise, the first time
	 * only: it never opened the second rxe1. */
	assert_int_equal(rh(a, "devices_removed"), round);
	assert_int_equal(rh(b, "devices_removed"), 1);
	assert_int_equal(rh(a, "connections_ready"), 0);
	assert_int_equal(wire_wait(wire_spawn("replug"), 30000), 0);
	put_get(a, ab, b, ba, "after_small", 100, 2);
	put_get(a, ab, b, ba, "after_big", 2 * MIB + 5, 3);
	if (!*ba2) {
		*ba2 = peer_at(b, "a", a);
		*ab2 = t_peer(a, "b");
	}
	put_get(b, *ba2, a, *ab2, "back", 2 * MIB + 7, 4);
}

static void test_device_removed(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba, *ba2 = NULL, *ab2 = NULL;

	(void)state;
	ready_pair_watched(&a, &b, &ab, &ba, 3 * MIB);
	/*
	 * Twice: the second time rxe1 is a device a opened after it started
	 * (from its connection's id and its listener made again), not one of
	 * those it found at creation.
	 */
	for (int round = 1; round <= 2; round++)
		unplug_round(a, b, ab, ba, &ba2, &ab2, round);
	assert_int_equal(rh(a, "malformed"), 0);
	assert_int_equal(rh(b, "malformed"), 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * As test_device_removed, but b loses every kernel device event (as when
 * its socket overruns: ENOBUFS): it finds rxe1 gone by looking for the
 * device's verbs node, and lets go of it all the same.
 */
static void test_device_removed_events_lost(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *ab, *ba, *ba2 = NULL, *ab2 = NULL;

	(void)state;
	ready_pair_watched(&a, &b, &ab, &ba, 100);
	assert_int_equal(ferry__rdma_fault_uevents_lost(b), 0);
	unplug_round(a, b, ab, ba, &ba2, &ab2, 1);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/*
 * Without RDMA_IP0/1 (not in the guest), every case skips. In it, rxe1 is
 * there (a case that failed while it removed rxe1 leaves it removed, or
 * being removed until that case's process has ended).
 */
static int setup(void **state)
{
	(void)state;
	t_log_capture(FERRY_LOG_INFO);
	if (getenv("RDMA_WIRE") && replug(NULL))
		return -1;
	return 0;
}

int main(void)
{
	static const struct CMUnitTest cases[] = {
		cmocka_unit_test_setup(test_sizes, setup),
		cmocka_unit_test_setup(test_vectored_56, setup),
		cmocka_unit_test_setup(test_credits, setup),
		cmocka_unit_test_setup(test_malformed_announce, setup),
		cmocka_unit_test_setup(test_wrong_secret, setup),
		cmocka_unit_test_setup(test_forged_auth, setup),
		cmocka_unit_test_setup(test_read_into_get, setup),
		cmocka_unit_test_setup(test_qp_error, setup),
		cmocka_unit_test_setup(test_kill_reconnect, setup),
		cmocka_unit_test_setup_teardown(test_silent_peer, setup, mend_wire),
		cmocka_unit_test_setup_teardown(test_device_removed, setup, replug),
		cmocka_unit_test_setup_teardown(test_device_removed_events_lost, setup, replug),
	};

	if (!rdma_guest_ips("test_rdma", ip0, ip1, sizeof(ip0)))
		return 77;
	return t_run_cases_apart("test_rdma", cases, sizeof(cases) / sizeof(cases[0]), NULL, NULL);
}

#else

int main(void)
{
	printf("test_rdma: SKIP (this build has no rdma transport: libibverbs-dev, "
	       "librdmacm-dev)\n");
	return 77;
}

#endif

/*
 * tests/test_shm.c - the shared-memory transport between real processes.
 *
 * Every test forks its peers (separate address spaces, separate engines
 * found by name) inside a private runtime directory: a large payload with a
 * checksum, a lent block's RELEASE waking a sleeping sender, 3 producers
 * -> 1 consumer and 1 -> 3, isolated namespaces, a
 * name live in another process and a crashed engine's files, and no files
 * left behind. Children report through their exit status; the parent
 * asserts. What every transport must show (order, sizes around the inline
 * boundary, GET before PUT, deadlines, full pools, SIGKILL of either side
 * and a restarted peer, streams) is the conformance suite
 * (tests/conformance.h), run over shm by test_conformance_shm.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static char rundir[256];

static int setup(void **state)
{
	(void)state;
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	return t_test_rundir(rundir, sizeof(rundir), "shm", 120);
}

static int teardown(void **state)
{
	(void)state;
	return t_test_rundir_end(rundir); /* nothing left behind */
}

static struct ferry_engine *mk_big(const char *ns, const char *name, size_t pool,
				   uint32_t max_keys, uint32_t max_bufs)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.ns = ns;
	p.pool_size = pool ? pool : (16u << 20);
	p.max_keys = max_keys;
	p.max_bufs = max_bufs;
	rc = ferry_engine_create(&p, &e);
	if (rc) {
		fprintf(stderr, "engine %s/%s: %s\n", ns, name, ferry_strerror(rc));
		return NULL;
	}
	return e;
}

static struct ferry_engine *mk(const char *ns, const char *name, size_t pool)
{
	return mk_big(ns, name, pool, 0, 0);
}

/* A MANUAL engine: nothing moves but inside its own calls. */
static struct ferry_engine *mk_manual(const char *ns, const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = ns;
	p.pool_size = 4u << 20;
	p.progress = FERRY_PROGRESS_MANUAL;
	if (ferry_engine_create(&p, &e)) {
		fprintf(stderr, "engine %s/%s: MANUAL engine refused\n", ns, name);
		return NULL;
	}
	return e;
}

static uint64_t checksum(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/*
 * Fork fn(arg) now and let it start at held_go(). Tests fork every child
 * before the parent creates its engines: a child forked from a process
 * whose engine threads run may inherit a lock held at that instant (the
 * ASan allocator's, for one) and hang.
 */
struct held {
	pid_t pid;
	struct t_gate go;
};

static void spawn_held(struct held *h, int (*fn)(void *), void *arg)
{
	t_gate_init(&h->go);
	h->pid = fork();
	assert_true(h->pid >= 0);
	if (h->pid == 0) {
		alarm(t_under_valgrind() ? 600 : 100);
		if (t_gate_wait(&h->go, 100000))
			_exit(99);
		_exit(fn(arg));
	}
}

static void held_go(struct held *h)
{
	t_gate_open(&h->go);
}

/* ------------------------------------------------------------------ */
/* A producer child: puts `count` keys k<first..> to `to`, windowed.    */
/* ------------------------------------------------------------------ */

struct producer {
	const char *ns, *name, *to;
	unsigned first, count, size;
	struct t_gate *go; /* optional: wait for it before putting */
	unsigned window;
	uint32_t max_bufs; /* 0: default */
};

static int producer_main(void *arg)
{
	struct producer *p = arg;
	struct ferry_engine *e = mk_big(p->ns, p->name, 0, 0, p->max_bufs);
	struct ferry_peer *to;
	struct ferry_sq *sq;
	unsigned sent = 0, done = 0, window = p->window ? p->window : 256;
	int rc = 0;

	if (!e)
		return 10;
	if (p->go && t_gate_wait(p->go, 20000))
		return 11;
	ferry_peer_open(e, p->to, &to);
	ferry_sq_get(e, &sq);
	while (done < p->count) {
		struct ferry_sqe *sqe;
		struct ferry_cqe c;

		while (sent < p->count && sent - done < window && (sqe = ferry_sq_get_sqe(sq))) {
			/* One allocation per item: its iovec, then its data. */
			size_t len = p->size < sizeof(unsigned) ? sizeof(unsigned) : p->size;
			struct iovec *v = malloc(sizeof(*v) + len);
			char key[48];
			unsigned i = p->first + sent;

			if (!v)
				return 14;
			v->iov_base = v + 1;
			v->iov_len = len;
			memset(v->iov_base, (int)(i & 0xff), len);
			memcpy(v->iov_base, &i, sizeof(i));
			snprintf(key, sizeof(key), "k%u", i);
			ferry_prep_put(sqe, to, key, v, 1, (uint64_t)(uintptr_t)v);
			ferry_sqe_set_timeout(sqe, 10 * SEC);
			sent++;
		}
		ferry_sq_submit(sq);
		rc = t_wait_one(e, &c, 10 * SEC);
		if (rc == -ETIME) {
			fprintf(stderr, "producer %s: no completion after %u\n", p->name, done);
			return 12;
		}
		if (c.res == -ENOMEM) {
			/*
			 * Backpressure: our pool is full of blocks the consumer has
			 * not taken yet. Send the same item again a little later.
			 */
			struct iovec *v = (void *)(uintptr_t)c.user_data;
			char key[48];

			usleep(1000);
			snprintf(key, sizeof(key), "k%u", *(unsigned *)v->iov_base);
			while (!(sqe = ferry_sq_get_sqe(sq)))
				ferry_sq_submit(sq);
			ferry_prep_put(sqe, to, key, v, 1, c.user_data);
			ferry_sqe_set_timeout(sqe, 10 * SEC);
			continue;
		}
		free((void *)(uintptr_t)c.user_data);
		if (c.res != 0) {
			fprintf(stderr, "producer %s: PUT %u: %s\n", p->name, done, ferry_strerror(c.res));
			return 13;
		}
		done++;
	}
	ferry_engine_destroy(e);
	return 0;
}

/* Consumer: GET k<first..first+count> from `from` in order, checking data. */
static int consume(struct ferry_engine *e, const char *from, unsigned first, unsigned count,
		   unsigned size, int check_order)
{
	struct ferry_peer *fp;
	struct ferry_sq *sq;
	unsigned posted = 0, done = 0, window = 512;

	ferry_peer_open(e, from, &fp);
	ferry_sq_get(e, &sq);
	while (done < count) {
		struct ferry_sqe *sqe;
		struct ferry_cqe c;
		int rc;

		while (posted < count && posted - done < window && (sqe = ferry_sq_get_sqe(sq))) {
			char key[48];

			snprintf(key, sizeof(key), "k%u", first + posted);
			ferry_prep_get(sqe, fp, key, NULL, 0, first + posted);
			ferry_sqe_set_timeout(sqe, 20 * SEC);
			posted++;
		}
		ferry_sq_submit(sq);
		rc = t_wait_one(e, &c, 20 * SEC);
		if (rc != 0) {
			fprintf(stderr, "consumer: GET %u from %s: %s\n", done, from,
				rc == -ETIME ? "no completion" : ferry_strerror(rc));
			return -1;
		}
		if (check_order && c.user_data != first + done) {
			fprintf(stderr, "consumer: got k%llu, expected k%u\n",
				(unsigned long long)c.user_data, first + done);
			return -2;
		}
		if (c.len != (size < 4 ? 4 : size) ||
		    *(unsigned *)ferry_buf_data(c.buf) != (unsigned)c.user_data) {
			fprintf(stderr, "consumer: k%llu damaged\n", (unsigned long long)c.user_data);
			return -3;
		}
		ferry_buf_release(c.buf);
		done++;
	}
	return 0;
}

/* ------------------------------------------------------------------ */

struct big {
	size_t size;
	uint64_t sum;
	int zero_copy;
};

static int big_producer(void *arg)
{
	struct big *b = arg;
	struct ferry_engine *e = mk("t", "bigp", b->size + (64u << 20));
	struct ferry_peer *to;
	struct ferry_buf *buf;
	struct ferry_sqe *sqe;
	struct ferry_sq *sq;
	struct ferry_cqe c;
	uint64_t *w;

	if (!e || ferry_buf_alloc(e, b->size, &buf))
		return 10;
	w = ferry_buf_data(buf);
	for (size_t i = 0; i < b->size / 8; i++)
		w[i] = i * 0x9e3779b97f4a7c15ull;
	ferry_peer_open(e, "bigc", &to);
	ferry_sq_get(e, &sq);
	sqe = ferry_sq_get_sqe(sq);
	ferry_prep_put_buf(sqe, to, "big", buf, 1);
	ferry_sq_submit(sq);
	if (t_wait_one(e, &c, 30 * SEC) != 0)
		return 11;
	/* Stay until the consumer took it: the data lives in our pool. */
	sleep(1);
	for (int i = 0; i < 300; i++) {
		char h[4096];

		ferry_engine_health(e, h, sizeof(h));
		if (strstr(h, "\"blocks_in_use\":0,"))
			break; /* the consumer released the block: it came home */
		usleep(20000);
	}
	ferry_engine_destroy(e);
	return 0;
}

static void test_big_payload_checksum(void **state)
{
	struct big b = { t_under_valgrind() ? (8u << 20) : (1u << 30), 0, 1 };
	struct ferry_engine *c;
	struct ferry_peer *from;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	uint64_t want = 0;
	struct held h;

	(void)state;
	spawn_held(&h, big_producer, &b);
	c = mk("t", "bigc", 16u << 20);
	assert_non_null(c);
	{
		/* The checksum the producer's pattern must give. */
		uint64_t *w = malloc(b.size);

		assert_non_null(w);
		for (size_t i = 0; i < b.size / 8; i++)
			w[i] = i * 0x9e3779b97f4a7c15ull;
		want = checksum(w, b.size);
		free(w);
	}
	held_go(&h);
	ferry_peer_open(c, "bigp", &from);
	ferry_sq_get(c, &sq);
	sqe = ferry_sq_get_sqe(sq);
	ferry_prep_get(sqe, from, "big", NULL, 0, 1);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	ferry_sq_submit(sq);
	assert_int_equal(t_wait_one(c, &cqe, 60 * SEC), 0);
	assert_int_equal(cqe.len, b.size);
	assert_true(cqe.flags & FERRY_CQE_F_BUF);
	assert_true(checksum(ferry_buf_data(cqe.buf), b.size) == want);
	assert_int_equal(ferry_buf_release(cqe.buf), 0);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(c);
}

/*
 * A block lent to a receiver comes home to a sender whose reactor sleeps,
 * when the receiver lets go of it: the RELEASE is the only thing the
 * receiver writes then (its connection otherwise idle), and it must ring
 * the sleeping sender, whose pool has no room for a second block until it
 * comes back.
 */
struct release_rx {
	struct t_gate got, let_go, done;
};

static int release_receiver(void *arg)
{
	struct release_rx *r = arg;
	struct ferry_engine *e = mk("t", "relrx", 4u << 20);
	struct ferry_peer *from;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;

	if (!e || ferry_peer_open(e, "reltx", &from) || ferry_sq_get(e, &sq))
		return 2;
	sqe = ferry_sq_get_sqe(sq);
	ferry_prep_get(sqe, from, "block", NULL, 0, 1); /* zero copy: the sender's block, lent */
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	ferry_sq_submit(sq);
	if (t_wait_one(e, &cqe, 30 * SEC) || cqe.res != 0 || !cqe.buf)
		return 3;
	t_gate_open(&r->got);
	if (t_gate_wait(&r->let_go, 60000))
		return 4;
	if (ferry_buf_release(cqe.buf))
		return 5;
	if (t_gate_wait(&r->done, 60000)) /* our engine stays while the sender looks */
		return 6;
	ferry_engine_destroy(e);
	return 0;
}

static void test_release_wakes_sleeping_sender(void **state)
{
	struct release_rx r;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_buf *b, *second = NULL;
	struct held h;
	int64_t end;
	int rc;

	(void)state;
	t_gate_init(&r.got);
	t_gate_init(&r.let_go);
	t_gate_init(&r.done);
	spawn_held(&h, release_receiver, &r);
	e = mk("t", "reltx", 1u << 20); /* room for one 768 KiB block, not two */
	assert_non_null(e);
	assert_int_equal(ferry_peer_open(e, "relrx", &to), 0);
	held_go(&h);
	assert_int_equal(ferry_buf_alloc(e, 768u << 10, &b), 0);
	memset(ferry_buf_data(b), 7, 768u << 10);
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_put_buf(sqe, to, "block", b, 1);
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	t_submit(e);
	t_expect(e, NULL, 1, 0, NULL); /* it holds the key; the block stays lent */
	assert_int_equal(t_gate_wait(&r.got, 30000), 0);
	assert_int_equal(ferry_buf_alloc(e, 768u << 10, &second), -ENOMEM);
	usleep(100 * 1000); /* the sender's reactor goes to sleep */
	t_gate_open(&r.let_go);
	end = t_now() + 5 * SEC * (t_under_valgrind() ? 10 : 1);
	while ((rc = ferry_buf_alloc(e, 768u << 10, &second)) == -ENOMEM && t_now() < end)
		usleep(1000);
	assert_int_equal(rc, 0); /* the block came home */
	assert_int_equal(ferry_buf_release(second), 0);
	t_gate_open(&r.done);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(e);
	t_gate_close(&r.got);
	t_gate_close(&r.let_go);
	t_gate_close(&r.done);
}

/* ------------------------------------------------------------------ */
/* Sleepers: every wait sleeps at once, so each hop races a sleep       */
/* ------------------------------------------------------------------ */

/*
 * Both sides sleep as soon as a look finds nothing (spin_ns 1), so almost
 * every message lands while its receiver announces a sleep or has just
 * done so: the pairs of engine/fence.h (a sender's light fence, a
 * sleeper's heavy one) decide whether the doorbell is rung. A wake-up
 * lost there leaves the receiver asleep until its wait's timeout: any
 * wait that long fails the test (each should take microseconds).
 */
struct sleeper_args {
	enum ferry_progress_mode mode;
	unsigned n;
	uint32_t ping_flags, pong_flags; /* FERRY_ENGINE_BUSY_POLL or 0 */
};

#define SLEEPER_WAIT (3 * SEC)

/* Does the kernel offer membarrier(GLOBAL_EXPEDITED), and is it not turned off? */
static bool membarrier_offered(void)
{
	const char *v = getenv("FERRY_MEMBARRIER");
	long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

	return !(v && !strcmp(v, "0")) && q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED);
}

static struct ferry_engine *mk_sleeper(const char *name, enum ferry_progress_mode mode,
				       uint32_t flags)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "t";
	p.pool_size = 1u << 20;
	p.progress = mode;
	p.spin_ns = 1; /* sleep at once: the racy part */
	p.flags = flags;
	return ferry_engine_create(&p, &e) ? NULL : e;
}

/* Wait for a CQE of user_data first..last (within SLEEPER_WAIT); 0, or why not. */
static int sleeper_wait(struct ferry_engine *e, uint64_t first, uint64_t last, int64_t *longest)
{
	struct ferry_cqe c;
	int64_t t0 = t_now(), took;
	int rc;

	do
		rc = ferry_cq_wait(ferry_cq_default(e), &c, 1, SLEEPER_WAIT);
	while (rc == -EINTR);
	took = t_now() - t0;
	if (took > *longest)
		*longest = took;
	if (rc != 1)
		return rc < 0 ? rc : -EPROTO;
	if (c.res < 0)
		return c.res;
	return c.user_data >= first && c.user_data <= last ? 0 : -EPROTO;
}

/* The child: GET k_i, then PUT r_i, n times, each wait sleeping at once. */
static int sleeper_pong(void *arg)
{
	struct sleeper_args *a = arg;
	struct ferry_engine *e;
	struct ferry_peer *ping;
	int64_t longest = 0;
	char key[32], in[8], out[8] = "pong";
	struct iovec iin = { in, sizeof(in) }, iout = { out, sizeof(out) };
	int rc = 0;

	if (!a->pong_flags)
		unsetenv("FERRY_MEMBARRIER"); /* (=1 would make it heavy anyway) */
	e = mk_sleeper("pong", a->mode, a->pong_flags);
	if (!e || ferry_peer_open(e, "ping", &ping))
		return 2;
	if (!a->pong_flags) {
		char h[8192];

		if (ferry_engine_health(e, h, sizeof(h)) < 0 ||
		    !strstr(h, "\"fences\":\"symmetric\"")) {
			fprintf(stderr, "sleeper pong: not symmetric without BUSY_POLL: %.200s\n", h);
			return 5;
		}
	}
	for (unsigned i = 0; i < a->n && !rc; i++) {
		struct ferry_sqe *sqe;

		snprintf(key, sizeof(key), "k%u", i);
		ferry_prep_get(sqe = t_sqe(e), ping, key, &iin, 1, 2 * i);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		t_submit(e);
		if ((rc = sleeper_wait(e, 2 * i, 2 * i, &longest)))
			break;
		snprintf(key, sizeof(key), "r%u", i);
		ferry_prep_put(sqe = t_sqe(e), ping, key, &iout, 1, 2 * i + 1);
		ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		t_submit(e);
		rc = sleeper_wait(e, 2 * i + 1, 2 * i + 1, &longest);
	}
	if (rc || longest >= SLEEPER_WAIT)
		fprintf(stderr, "sleeper pong: %s, longest wait %lld ms\n", ferry_strerror(rc),
			(long long)(longest / MS));
	ferry_engine_destroy(e);
	return rc ? 3 : longest >= SLEEPER_WAIT ? 4 : 0;
}

static void sleepers(enum ferry_progress_mode mode, uint32_t ping_flags, uint32_t pong_flags)
{
	struct sleeper_args a = { mode, t_under_valgrind() ? 200 : 20000, ping_flags, pong_flags };
	struct ferry_engine *e;
	struct ferry_peer *pong;
	int64_t longest = 0;
	char key[32], in[8], out[8] = "ping";
	struct iovec iin = { in, sizeof(in) }, iout = { out, sizeof(out) };
	struct held h;

	spawn_held(&h, sleeper_pong, &a);
	e = mk_sleeper("ping", mode, ping_flags);
	assert_non_null(e);
	if (ping_flags) {
		char h[8192];

		assert_true(ferry_engine_health(e, h, sizeof(h)) > 0);
		if (membarrier_offered())
			assert_non_null(strstr(h, "\"fences\":\"membarrier\""));
		else
			fprintf(stderr, "sleepers: no membarrier here: the full fences are tested\n");
	}
	assert_int_equal(ferry_peer_open(e, "pong", &pong), 0);
	held_go(&h);
	for (unsigned i = 0; i < a.n; i++) {
		struct ferry_sqe *sqe;

		snprintf(key, sizeof(key), "k%u", i);
		ferry_prep_put(sqe = t_sqe(e), pong, key, &iout, 1, 2 * i);
		ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		snprintf(key, sizeof(key), "r%u", i);
		ferry_prep_get(sqe = t_sqe(e), pong, key, &iin, 1, 2 * i + 1);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
		t_submit(e);
		/* Either may come first: the PUT's RESULT or the answer. */
		for (int k = 0; k < 2; k++) {
			int rc = sleeper_wait(e, 2 * i, 2 * i + 1, &longest);

			if (rc)
				fprintf(stderr, "sleepers: hop %u: %s\n", i, ferry_strerror(rc));
			assert_int_equal(rc, 0);
		}
	}
	if (longest >= SLEEPER_WAIT)
		fprintf(stderr, "sleepers: a wait took %lld ms\n", (long long)(longest / MS));
	assert_true(longest < SLEEPER_WAIT);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(e);
}

static void test_sleepers_manual(void **state)
{
	(void)state;
	sleepers(FERRY_PROGRESS_MANUAL, FERRY_ENGINE_BUSY_POLL, FERRY_ENGINE_BUSY_POLL);
}

static void test_sleepers_thread(void **state)
{
	(void)state;
	sleepers(FERRY_PROGRESS_THREAD, FERRY_ENGINE_BUSY_POLL, FERRY_ENGINE_BUSY_POLL);
}

/*
 * A BUSY_POLL engine and a peer process that sleeps with the ordinary
 * fence (not BUSY_POLL; or an older ferry, a seccomp filter): toward it the
 * BUSY_POLL side's fences stay full ones (its wake page does not say
 * heavy_sleeps); its own toward the BUSY_POLL side are full too (a process
 * without a BUSY_POLL engine never registers for membarrier).
 */
static void test_sleepers_mixed(void **state)
{
	(void)state;
	sleepers(FERRY_PROGRESS_THREAD, FERRY_ENGINE_BUSY_POLL, 0);
}

/* Neither BUSY_POLL: the default, full fences on both sides. */
static void test_sleepers_default(void **state)
{
	(void)state;
	sleepers(FERRY_PROGRESS_THREAD, 0, 0);
}

static void test_three_to_one(void **state)
{
	unsigned n = t_under_valgrind() ? 300 : 5000;
	struct producer p[3] = {
		{ "t", "p0", "sink", 0, n, 100, NULL, 128, 0 },
		{ "t", "p1", "sink", 0, n, 1000, NULL, 128, 0 },
		{ "t", "p2", "sink", 0, n, 5000, NULL, 128, 0 },
	};
	struct ferry_engine *c;
	struct held h[3];

	(void)state;
	for (int i = 0; i < 3; i++)
		spawn_held(&h[i], producer_main, &p[i]);
	c = mk("t", "sink", 64u << 20);
	assert_non_null(c);
	for (int i = 0; i < 3; i++)
		held_go(&h[i]);
	/*
	 * Keys are scoped by sender: k0@p0_sink and k0@p1_sink are different
	 * keys. Producers whose pool fills up (their blocks wait here until
	 * consumed) retry later, so order is not checked here, only that every
	 * item arrives exactly once and intact.
	 */
	assert_int_equal(consume(c, "p0", 0, n, 100, 0), 0);
	assert_int_equal(consume(c, "p1", 0, n, 1000, 0), 0);
	assert_int_equal(consume(c, "p2", 0, n, 5000, 0), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(t_reap(h[i].pid), 0);
	ferry_engine_destroy(c);
}

struct cons_arg {
	const char *name;
	unsigned count;
	struct t_gate *ready;
};

static int consumer_main(void *arg)
{
	struct cons_arg *a = arg;
	struct ferry_engine *e = mk("t", a->name, 0);
	int rc;

	if (!e)
		return 10;
	t_gate_open(a->ready);
	rc = consume(e, "src", 0, a->count, 64, 1);
	ferry_engine_destroy(e);
	return rc ? 20 - rc : 0;
}

static void test_one_to_three(void **state)
{
	unsigned n = t_under_valgrind() ? 300 : 5000;
	struct t_gate ready;
	struct cons_arg a[3] = { { "c0", n, &ready }, { "c1", n, &ready }, { "c2", n, &ready } };
	struct ferry_engine *e;
	struct ferry_peer *to[3];
	struct ferry_sq *sq;
	struct held h[3];
	unsigned done = 0, sent = 0;

	(void)state;
	t_gate_init(&ready);
	for (int i = 0; i < 3; i++)
		spawn_held(&h[i], consumer_main, &a[i]);
	e = mk("t", "src", 32u << 20);
	assert_non_null(e);
	for (int i = 0; i < 3; i++) {
		held_go(&h[i]);
		assert_int_equal(t_gate_wait(&ready, 20000), 0);
		to[i] = t_peer(e, a[i].name);
	}
	ferry_sq_get(e, &sq);
	while (done < 3 * n) {
		struct ferry_sqe *sqe;
		struct ferry_cqe c;

		while (sent < 3 * n && sent - done < 256 && (sqe = ferry_sq_get_sqe(sq))) {
			static char recs[3 * 5000][64];
			static struct iovec iov[3 * 5000];
			char key[32];
			unsigned i = sent / 3;

			memcpy(recs[sent], &i, sizeof(i));
			iov[sent].iov_base = recs[sent];
			iov[sent].iov_len = 64;
			snprintf(key, sizeof(key), "k%u", i);
			ferry_prep_put(sqe, to[sent % 3], key, &iov[sent], 1, sent);
			sent++;
		}
		ferry_sq_submit(sq);
		assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
		done++;
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(t_reap(h[i].pid), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

static int ns_twin(void *arg)
{
	struct t_gate *ready = arg;
	struct ferry_engine *e = mk("ns2", "rx", 0);
	struct ferry_peer *from;
	struct ferry_cqe c;
	int rc;

	if (!e)
		return 10;
	ferry_peer_open(e, "tx", &from);
	t_gate_open(ready);
	t_get(e, from, "secret", NULL, 0, 1, 0, 500 * MS);
	rc = t_wait_one(e, &c, 5 * SEC);
	ferry_engine_destroy(e);
	return rc == -ETIMEDOUT ? 0 : 20; /* ns1's PUT must not reach ns2 */
}

static void test_namespaces_isolated(void **state)
{
	struct ferry_engine *tx, *rx;
	struct ferry_cqe c;
	struct t_gate ready;
	struct held twin;
	pid_t pid;

	(void)state;
	t_gate_init(&ready);
	spawn_held(&twin, ns_twin, &ready); /* same names, namespace ns2, another process */
	tx = mk("ns1", "tx", 0);
	rx = mk("ns1", "rx", 0);
	assert_non_null(tx);
	assert_non_null(rx);
	pid = twin.pid;
	held_go(&twin);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	t_put(tx, t_peer(tx, "rx"), "secret", "s", 2, 1, 0);
	assert_int_equal(t_wait_one(tx, &c, 5 * SEC), 0);
	t_get(rx, t_peer(rx, "tx"), "secret", NULL, 0, 2, FERRY_SQE_NOWAIT, 0);
	assert_int_equal(t_wait_one(rx, &c, 5 * SEC), 0);
	ferry_buf_release(c.buf);
	assert_int_equal(t_reap(pid), 0);
	ferry_engine_destroy(tx);
	ferry_engine_destroy(rx);
}

struct still_rx {
	struct t_gate got, done;
};

/*
 * A MANUAL receiver that takes one PUT (its GET completes) and then stops
 * calling ferry: it waits on a pipe, its engine untouched, until told.
 */
static int still_receiver(void *arg)
{
	struct still_rx *r = arg;
	struct ferry_engine *e = mk_manual("t", "still-rx");
	int64_t end = t_now() + 20 * SEC;
	struct ferry_cqe c;
	char in[64];
	int n = 0;

	if (!e)
		return 10;
	t_get(e, t_peer(e, "still-tx"), "k", t_iov_of(in, sizeof(in)), 1, 1, 0, 0);
	while (t_now() < end && (n = ferry_cq_poll(ferry_cq_default(e), &c, 1)) == 0)
		;
	if (n != 1 || c.res != 0 || in[0] != 'p')
		return 11;
	t_gate_open(&r->got);
	if (t_gate_wait(&r->done, 30000))
		return 12;
	ferry_engine_destroy(e);
	return 0;
}

/*
 * A PUT completes once the destination holds its key, without any later
 * call of the destination: the RESULT leaves in the round that took the
 * PUT (a RESULT held for the receiver's reaction, as tcp holds its own,
 * would leave this sender waiting on a receiver that stopped polling).
 */
static void test_result_without_another_call(void **state)
{
	struct still_rx r;
	struct ferry_engine *tx;
	struct held h;
	struct ferry_cqe c;
	char out[64];

	(void)state;
	t_gate_init(&r.got);
	t_gate_init(&r.done);
	spawn_held(&h, still_receiver, &r);
	tx = mk_manual("t", "still-tx");
	assert_non_null(tx);
	held_go(&h);
	memset(out, 'p', sizeof(out));
	t_put(tx, t_peer(tx, "still-rx"), "k", out, sizeof(out), 7, FERRY_SQE_WAIT_PEER);
	assert_int_equal(t_wait_one(tx, &c, 20 * SEC), 0);
	assert_int_equal(c.user_data, 7);
	assert_int_equal(t_gate_wait(&r.got, 20000), 0);
	t_gate_open(&r.done);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(tx);
	t_gate_close(&r.got);
	t_gate_close(&r.done);
}

static int name_holder(void *arg)
{
	struct t_gate *ready = arg;
	struct ferry_engine *e = mk("t", "taken", 0);

	if (!e)
		return 10;
	t_gate_open(ready);
	pause(); /* killed: its socket and lock stay behind */
	return 0;
}

/* A name live in another process is refused; a crashed one's leftovers go. */
static void test_name_taken_and_leftovers(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;
	struct t_gate ready;
	pid_t pid;

	(void)state;
	t_gate_init(&ready);
	pid = t_fork(name_holder, &ready);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	p.name = "taken";
	p.ns = "t";
	p.pool_size = 1u << 20;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(ferry_engine_create(&p, &e), -EADDRINUSE);
	kill(pid, SIGKILL);
	t_reap(pid);
	assert_true(t_count_files(rundir) > 0); /* the crashed engine's files */
	assert_int_equal(ferry_engine_create(&p, &e), 0); /* cleaned up at start */
	ferry_engine_destroy(e);
	assert_int_equal(t_count_files(rundir), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_big_payload_checksum, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_wakes_sleeping_sender, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sleepers_manual, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sleepers_thread, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sleepers_mixed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sleepers_default, setup, teardown),
		cmocka_unit_test_setup_teardown(test_three_to_one, setup, teardown),
		cmocka_unit_test_setup_teardown(test_one_to_three, setup, teardown),
		cmocka_unit_test_setup_teardown(test_namespaces_isolated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_name_taken_and_leftovers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_result_without_another_call, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

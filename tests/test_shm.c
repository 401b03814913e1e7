/*
 * tests/test_shm.c - the shared-memory transport between real processes.
 *
 * Every test forks its peers (separate address spaces, separate engines
 * found by name) inside a private runtime directory: order of many small
 * messages, a large payload with a checksum, 3 producers -> 1 consumer and
 * 1 -> 3, GET before PUT, deadlines, sender pool exhaustion, small PUTs
 * inside the descriptor and larger ones in blocks (sizes around the
 * boundary, gathered iovecs, a receiver too full to take one), SIGKILL of
 * either side in the middle, the first PUT to a peer that died and came
 * back (a new engine of its name), isolated namespaces, and no files left
 * behind. Children report through their exit status; the parent asserts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
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

static void test_order_many_small(void **state)
{
	unsigned n = t_under_valgrind() ? 2000 : 100000;
	/* Handles for every item: a PUT refused for lack of them is retried out of order. */
	struct producer p = { "t", "prod", "cons", 0, n, 32, NULL, 256, 2 * n };
	/*
	 * Room for every key and a handle for every item here too: a PUT
	 * completes once it is stored, GET or not, so the producer may run
	 * all the way ahead of our GETs (seen in CI: 65,536 stored, the
	 * default handle table full, a PUT refused and retried out of order).
	 */
	struct ferry_engine *c;
	struct held h;

	(void)state;
	spawn_held(&h, producer_main, &p);
	c = mk_big("t", "cons", 0, 2 * n, 2 * n);
	assert_non_null(c);
	held_go(&h);
	/* The GETs wait in order; each completes in the order its PUT came. */
	assert_int_equal(consume(c, "prod", 0, n, 32, 1), 0);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(c);
}

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

static void test_get_before_put_and_deadlines(void **state)
{
	struct producer p = { "t", "late", "early", 0, 10, 64, NULL, 4, 0 };
	struct ferry_engine *c;
	struct ferry_peer *from;
	struct ferry_cqe cqe;
	struct held h;
	int64_t t0;

	(void)state;
	spawn_held(&h, producer_main, &p);
	c = mk("t", "early", 0);
	assert_non_null(c);
	from = t_peer(c, "late");
	/* A GET for a peer that does not even exist yet: it waits. */
	t_get(c, from, "k0", NULL, 0, 100, 0, 20 * SEC);
	/* A GET with a short deadline on a key that never comes. */
	t0 = t_now();
	t_get(c, from, "never", NULL, 0, 101, 0, 100 * MS);
	assert_int_equal(t_wait_one(c, &cqe, 5 * SEC), -ETIMEDOUT);
	assert_int_equal(cqe.user_data, 101);
	assert_true(t_now() - t0 >= 100 * MS);
	/* A PUT to a name nobody holds on this host. */
	t_put(c, t_peer(c, "ghost"), "x", "x", 1, 102, 0);
	assert_int_equal(t_wait_one(c, &cqe, 5 * SEC), -EHOSTUNREACH);

	held_go(&h);
	assert_int_equal(t_wait_one(c, &cqe, 20 * SEC), 0);
	assert_int_equal(cqe.user_data, 100);
	assert_int_equal(*(unsigned *)ferry_buf_data(cqe.buf), 0);
	ferry_buf_release(cqe.buf);
	assert_int_equal(consume(c, "late", 1, 9, 64, 1), 0);
	assert_int_equal(t_reap(h.pid), 0);
	ferry_engine_destroy(c);
}

/* ------------------------------------------------------------------ */

struct hold_arg {
	struct t_gate *ready, *done;
	unsigned count;
};

/* Takes `count` zero-copy buffers and holds them until told to stop. */
static int holder_main(void *arg)
{
	struct hold_arg *a = arg;
	struct ferry_engine *e = mk("t", "holder", 0);
	struct ferry_buf *held[64];
	struct ferry_peer *from;
	struct ferry_cqe c;
	unsigned got = 0;

	if (!e)
		return 10;
	ferry_peer_open(e, "filler", &from);
	t_gate_open(a->ready);
	while (got < a->count) {
		char key[32];

		snprintf(key, sizeof(key), "k%u", got);
		t_get(e, from, key, NULL, 0, got, 0, 20 * SEC);
		if (t_wait_one(e, &c, 20 * SEC) != 0)
			return 11;
		if (*(unsigned *)ferry_buf_data(c.buf) != got)
			return 12;
		held[got++] = c.buf;
	}
	t_gate_wait(a->done, 30000);
	for (unsigned i = 0; i < got; i++)
		ferry_buf_release(held[i]);
	usleep(200000);
	ferry_engine_destroy(e);
	return 0;
}

/* The receiver holds every block: the sender's pool runs dry -> -ENOMEM. */
static void test_sender_pool_exhaustion(void **state)
{
	struct t_gate ready, done;
	struct hold_arg a = { &ready, &done, 5 };
	struct ferry_engine *e;
	struct ferry_peer *to;
	static char block[200000];
	struct ferry_cqe c;
	unsigned ok = 0;
	int enomem = 0;
	struct held hd;
	char h[4096];

	(void)state;
	t_gate_init(&ready);
	t_gate_init(&done);
	spawn_held(&hd, holder_main, &a);
	e = mk("t", "filler", 1u << 20);
	assert_non_null(e);
	to = t_peer(e, "holder");
	held_go(&hd);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	for (unsigned i = 0; i < 7; i++) {
		char key[32];

		snprintf(key, sizeof(key), "k%u", i);
		memcpy(block, &i, sizeof(i));
		t_put(e, to, key, block, sizeof(block), i, 0);
		if (t_wait_one(e, &c, 10 * SEC) == 0)
			ok++;
		else if (c.res == -ENOMEM)
			enomem++;
		else
			fail_msg("PUT %u: %s", i, ferry_strerror(c.res));
	}
	/* 1 MiB pool, 200 kB blocks held by the peer: the 6th does not fit. */
	assert_int_equal(ok, 5);
	assert_int_equal(enomem, 2);
	t_gate_open(&done);
	/* The holder checked that everything sent arrived intact: it exits 0 only then. */
	assert_int_equal(t_reap(hd.pid), 0);
	/* Its blocks came back when it released them or died. */
	for (int i = 0; i < 200; i++) {
		ferry_progress(e);
		ferry_engine_health(e, h, sizeof(h));
		if (strstr(h, "\"blocks_in_use\":0,"))
			break;
		usleep(10000);
	}
	assert_non_null(strstr(h, "\"blocks_in_use\":0,"));
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* Small PUTs inside the descriptor (<= 256 B) and the block path above   */
/* ------------------------------------------------------------------ */

static const size_t inline_sizes[] = { 0, 1, 7, 64, 255, 256, 257, 4096 };
#define NSIZES (sizeof(inline_sizes) / sizeof(inline_sizes[0]))

static void fill_pattern(char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)(seed * 31 + i * 7 + 1);
}

static int pattern_ok(const char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (char)(seed * 31 + i * 7 + 1))
			return 0;
	return 1;
}

struct inline_arg {
	struct t_gate *ready, *sent;
};

/*
 * The receiver: for every size, a GET into an iovec waits before the PUT
 * comes ("w<i>"), and a zero-copy GET is posted only after the PUT arrived
 * ("z<i>", held in the key table meanwhile); then "full": its pool is too
 * small to hold an inline PUT nobody waits for.
 */
static int inline_receiver(void *arg)
{
	struct inline_arg *a = arg;
	struct ferry_engine *e = mk("t", "small-rx", 1u << 20);
	static struct ferry_buf *fill[1u << 17];
	unsigned nfill = 0;
	struct ferry_peer *from;
	static char dst[NSIZES][8192];
	struct iovec v[NSIZES];
	struct ferry_sq *sq;
	struct ferry_cqe c;

	if (!e)
		return 10;
	ferry_peer_open(e, "small-tx", &from);
	ferry_sq_get(e, &sq);
	for (unsigned i = 0; i < NSIZES; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);
		char key[16];

		snprintf(key, sizeof(key), "w%u", i);
		memset(dst[i], 0x5a, sizeof(dst[i]));
		v[i] = (struct iovec){ dst[i], sizeof(dst[i]) };
		ferry_prep_get(sqe, from, key, &v[i], 1, 100 + i);
		ferry_sqe_set_timeout(sqe, 20 * SEC);
	}
	ferry_sq_submit(sq);
	t_gate_open(a->ready);
	for (unsigned n = 0; n < NSIZES; n++) {
		unsigned i;

		if (t_wait_one(e, &c, 20 * SEC) != 0)
			return 11;
		i = (unsigned)c.user_data - 100;
		if (i >= NSIZES || c.len != inline_sizes[i] || c.buf ||
		    !pattern_ok(dst[i], inline_sizes[i], i) ||
		    (inline_sizes[i] < sizeof(dst[i]) && dst[i][inline_sizes[i]] != 0x5a)) {
			fprintf(stderr, "inline receiver: w%u wrong\n", i);
			return 12;
		}
	}
	if (t_gate_wait(a->sent, 20000))
		return 13;
	for (unsigned i = 0; i < NSIZES; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);
		char key[16];

		snprintf(key, sizeof(key), "z%u", i);
		ferry_prep_get(sqe, from, key, NULL, 0, 200 + i);
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT); /* it is here already */
		ferry_sq_submit(sq);
		if (t_wait_one(e, &c, 5 * SEC) != 0 || c.len != inline_sizes[i] || !c.buf ||
		    !pattern_ok(ferry_buf_data(c.buf), inline_sizes[i], 50 + i)) {
			fprintf(stderr, "inline receiver: z%u wrong (%d)\n", i, c.res);
			return 14;
		}
		ferry_buf_release(c.buf);
	}
	/* Our pool full: an inline PUT nobody waits for is refused, nothing else breaks. */
	while (nfill < sizeof(fill) / sizeof(fill[0]) && ferry_buf_alloc(e, 1, &fill[nfill]) == 0)
		nfill++;
	if (nfill == sizeof(fill) / sizeof(fill[0]))
		return 15;
	t_gate_open(a->ready);
	if (t_gate_wait(a->sent, 20000))
		return 16;
	while (nfill)
		ferry_buf_release(fill[--nfill]);
	for (unsigned i = 0; i < 200; i++)
		ferry_progress(e);
	usleep(100000);
	ferry_engine_destroy(e);
	return 0;
}

static void test_inline_and_block_sizes(void **state)
{
	struct t_gate ready, sent;
	struct inline_arg a = { &ready, &sent };
	static char src[NSIZES][4096 + 8], zsrc[NSIZES][4096];
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	struct held hd;

	(void)state;
	t_gate_init(&ready);
	t_gate_init(&sent);
	spawn_held(&hd, inline_receiver, &a);
	e = mk("t", "small-tx", 0);
	assert_non_null(e);
	to = t_peer(e, "small-rx");
	held_go(&hd);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	for (unsigned i = 0; i < NSIZES; i++) {
		/* Gathered from two pieces when it can be: the copy must join them. */
		static struct iovec v[NSIZES][2];
		size_t n = inline_sizes[i], half = n / 2;
		struct ferry_sqe *sqe = t_sqe(e);
		char key[16];

		fill_pattern(src[i], n, i);
		memmove(src[i] + half + 8, src[i] + half, n - half); /* a gap between the pieces */
		v[i][0] = (struct iovec){ src[i], half };
		v[i][1] = (struct iovec){ src[i] + half + 8, n - half };
		snprintf(key, sizeof(key), "w%u", i);
		ferry_prep_put(sqe, to, key, v[i], 2, i);
		t_submit(e);
	}
	for (unsigned i = 0; i < NSIZES; i++) {
		struct ferry_buf *b;
		char key[16];

		/* Zero-copy PUTs of pool buffers, small and large, held by the receiver. */
		assert_int_equal(ferry_buf_alloc(e, inline_sizes[i], &b), 0);
		fill_pattern(inline_sizes[i] ? ferry_buf_data(b) : zsrc[i], inline_sizes[i], 50 + i);
		snprintf(key, sizeof(key), "z%u", i);
		ferry_prep_put_buf(t_sqe(e), to, key, b, 50 + i);
		t_submit(e);
	}
	for (unsigned n = 0; n < 2 * NSIZES; n++) {
		if (t_wait_one(e, &c, 10 * SEC) != 0)
			fail_msg("PUT %llu: %s", (unsigned long long)c.user_data, ferry_strerror(c.res));
		assert_true(c.user_data < NSIZES || (c.user_data >= 50 && c.user_data < 50 + NSIZES));
		assert_int_equal(c.len, inline_sizes[c.user_data % 50]);
	}
	t_gate_open(&sent);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	t_put(e, to, "too-many", "x", 1, 99, 0);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), -ENOBUFS);
	assert_int_equal(c.user_data, 99);
	t_gate_open(&sent);
	assert_int_equal(t_reap(hd.pid), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

static int slow_producer(void *arg)
{
	struct t_gate *ready = arg;
	struct ferry_engine *e = mk("t", "victim", 0);
	struct ferry_peer *to;

	if (!e)
		return 10;
	ferry_peer_open(e, "survivor", &to);
	t_put(e, to, "k0", "first", 6, 1, 0);
	t_gate_open(ready);
	pause(); /* killed here */
	return 0;
}

/* The producer dies: GETs waiting on it fail fast; its data already sent stays. */
static void test_sigkill_producer(void **state)
{
	struct producer other = { "t", "other", "survivor", 0, 100, 64, NULL, 16, 0 };
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_cqe c;
	struct t_gate ready;
	struct held victim, h2;
	int64_t t0;
	pid_t pid;

	(void)state;
	t_gate_init(&ready);
	spawn_held(&victim, slow_producer, &ready);
	spawn_held(&h2, producer_main, &other);
	e = mk("t", "survivor", 0);
	assert_non_null(e);
	from = t_peer(e, "victim");
	pid = victim.pid;
	held_go(&victim);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	t_get(e, from, "k0", NULL, 0, 1, 0, 10 * SEC);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	/* Keep the buffer: it is in the victim's pool, mapped here. */
	t_get(e, from, "k1", NULL, 0, 2, 0, 60 * SEC);
	usleep(50000);
	t0 = t_now();
	kill(pid, SIGKILL);
	assert_int_equal(t_reap(pid), 128 + SIGKILL);
	{
		struct ferry_cqe c2;

		assert_int_equal(t_wait_one(e, &c2, 5 * SEC), -ECONNRESET);
		assert_int_equal(c2.user_data, 2);
	}
	assert_true(t_now() - t0 < 1 * SEC); /* within 1 s, not the 60 s deadline */
	/* The data that arrived before the death is still readable. */
	assert_string_equal(ferry_buf_data(c.buf), "first");
	assert_int_equal(ferry_buf_release(c.buf), 0);
	/* The survivor goes on serving others. */
	held_go(&h2);
	assert_int_equal(consume(e, "other", 0, 100, 64, 1), 0);
	assert_int_equal(t_reap(h2.pid), 0);
	ferry_engine_destroy(e);
}

static int greedy_consumer(void *arg)
{
	struct t_gate *ready = arg;
	struct ferry_engine *e = mk("t", "eater", 0);
	struct ferry_peer *from;
	struct ferry_cqe c;

	if (!e)
		return 10;
	ferry_peer_open(e, "feeder", &from);
	t_gate_open(ready);
	for (unsigned i = 0;; i++) {
		char key[32];

		snprintf(key, sizeof(key), "k%u", i);
		t_get(e, from, key, NULL, 0, i, 0, 60 * SEC);
		if (t_wait_one(e, &c, 60 * SEC) != 0)
			return 11;
		/* Never released: the feeder's blocks stay lent to us until we die. */
	}
	return 0;
}

/* The consumer dies: the blocks it held come back, PUTs fail fast. */
static void test_sigkill_consumer(void **state)
{
	struct ferry_engine *e;
	struct ferry_peer *to;
	static char block[100000];
	struct ferry_cqe c;
	struct t_gate ready;
	struct held eater;
	char h[4096];
	pid_t pid;
	int rc = 0;

	(void)state;
	t_gate_init(&ready);
	spawn_held(&eater, greedy_consumer, &ready);
	e = mk("t", "feeder", 8u << 20);
	assert_non_null(e);
	to = t_peer(e, "eater");
	pid = eater.pid;
	held_go(&eater);
	assert_int_equal(t_gate_wait(&ready, 20000), 0);
	for (unsigned i = 0; i < 20; i++) {
		char key[32];

		snprintf(key, sizeof(key), "k%u", i);
		t_put(e, to, key, block, sizeof(block), i, 0);
		assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	}
	ferry_engine_health(e, h, sizeof(h));
	assert_null(strstr(h, "\"blocks_in_use\":0,")); /* lent to the eater */
	kill(pid, SIGKILL);
	assert_int_equal(t_reap(pid), 128 + SIGKILL);
	for (int i = 0; i < 100; i++) {
		ferry_engine_health(e, h, sizeof(h));
		if (strstr(h, "\"blocks_in_use\":0,"))
			break;
		usleep(10000);
	}
	assert_non_null(strstr(h, "\"blocks_in_use\":0,")); /* every block came back */
	t_put(e, to, "after", block, 10, 99, 0);
	rc = t_wait_one(e, &c, 5 * SEC);
	assert_true(rc == -EHOSTUNREACH || rc == -ECONNRESET);
	ferry_engine_destroy(e);
	/* The eater's files stay until the next engine starts in the namespace. */
	assert_true(t_count_files(rundir) > 0);
	e = mk("t", "next", 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

struct incarnation {
	struct t_gate *ready;
	const char *key;
	bool hold; /* keep the block (until killed), else exit 0 on the right data */
};

/* One life of "rx": GET key zero copy, check it, then hold it or leave. */
static int rx_life(void *arg)
{
	struct incarnation *in = arg;
	struct ferry_engine *e = mk("t", "rx", 0);
	struct ferry_peer *from;
	struct ferry_cqe c;
	static char want[1000];

	if (!e)
		return 10;
	ferry_peer_open(e, "tx", &from);
	t_gate_open(in->ready);
	t_get(e, from, in->key, NULL, 0, 1, 0, 10 * SEC);
	if (t_wait_one(e, &c, 15 * SEC) != 0 || c.len != sizeof(want))
		return 11;
	memset(want, in->key[1], sizeof(want));
	if (memcmp(ferry_buf_data(c.buf), want, sizeof(want)) != 0)
		return 12;
	if (in->hold) {
		t_gate_open(in->ready);
		pause(); /* killed here, holding the block */
	}
	ferry_buf_release(c.buf);
	ferry_engine_destroy(e);
	return 0;
}

/*
 * A peer dies and a new engine of its name comes up: the very next PUT to
 * it goes through (it failed with -ECONNRESET: the peer stayed resolved to
 * the dead connection, and only the PUT after it called again).
 */
static void test_restarted_peer(void **state)
{
	struct t_gate ready1, ready2;
	struct incarnation one = { &ready1, "a0", true }, two = { &ready2, "b1", false };
	static char data_a[1000], data_b[1000];
	struct held first, second;
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_cqe c;
	char h[4096];

	(void)state;
	t_gate_init(&ready1);
	t_gate_init(&ready2);
	spawn_held(&first, rx_life, &one);
	spawn_held(&second, rx_life, &two);
	e = mk("t", "tx", 0);
	assert_non_null(e);
	to = t_peer(e, "rx");
	memset(data_a, '0', sizeof(data_a));
	memset(data_b, '1', sizeof(data_b));
	held_go(&first);
	assert_int_equal(t_gate_wait(&ready1, 20000), 0);
	t_put(e, to, "a0", data_a, sizeof(data_a), 1, 0);
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	assert_int_equal(t_gate_wait(&ready1, 20000), 0); /* it holds our block */
	kill(first.pid, SIGKILL);
	assert_int_equal(t_reap(first.pid), 128 + SIGKILL);
	for (int i = 0; i < 500; i++) { /* our engine saw it die: the block came back */
		ferry_engine_health(e, h, sizeof(h));
		if (strstr(h, "\"blocks_in_use\":0,"))
			break;
		usleep(10000);
	}
	assert_non_null(strstr(h, "\"blocks_in_use\":0,"));
	held_go(&second);
	assert_int_equal(t_gate_wait(&ready2, 20000), 0);
	t_put(e, to, "b1", data_b, sizeof(data_b), 2, 0); /* the first PUT to the new rx */
	assert_int_equal(t_wait_one(e, &c, 10 * SEC), 0);
	assert_int_equal(c.user_data, 2);
	assert_int_equal(t_reap(second.pid), 0);
	ferry_engine_destroy(e);
	t_gate_close(&ready1);
	t_gate_close(&ready2);
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
		cmocka_unit_test_setup_teardown(test_order_many_small, setup, teardown),
		cmocka_unit_test_setup_teardown(test_big_payload_checksum, setup, teardown),
		cmocka_unit_test_setup_teardown(test_three_to_one, setup, teardown),
		cmocka_unit_test_setup_teardown(test_one_to_three, setup, teardown),
		cmocka_unit_test_setup_teardown(test_get_before_put_and_deadlines, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sender_pool_exhaustion, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inline_and_block_sizes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sigkill_producer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sigkill_consumer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restarted_peer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_namespaces_isolated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_name_taken_and_leftovers, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

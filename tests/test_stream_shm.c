/*
 * tests/test_stream_shm.c - streams between real processes over the
 * shared-memory transport: order and credits across processes, producer
 * death (the consumer's STREAM_GET ends with -ECONNRESET), consumer death
 * (the producer's chunks waiting for credit fail at once, later ones fail
 * fast), and a KV-cache handoff: a vectored put of many layer buffers (no
 * packing copy by the caller) received contiguous and scattered; credits
 * across processes (they ride on the chunks' block releases: exactly the
 * limit arrives while the consumer holds everything, one more per release;
 * a whole stream and plain GETs of chunks still get theirs).
 * Children are forked before the parent creates engines, and report through
 * their exit status.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static char rundir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-sshm-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
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

static struct ferry_engine *mk(const char *name, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "st";
	p.pool_size = pool ? pool : (16u << 20);
	if (ferry_engine_create(&p, &e))
		return NULL;
	return e;
}

static struct ferry_peer *peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p = NULL;

	return ferry_peer_open(e, name, &p) ? NULL : p;
}

static int wait_one(struct ferry_engine *e, struct ferry_cqe *c, int64_t timeout)
{
	int rc = ferry_cq_wait(ferry_cq_default(e), c, 1, timeout * (t_under_valgrind() ? 10 : 1));

	return rc == 1 ? c->res : -ETIME;
}

static int submit_one(struct ferry_engine *e, struct ferry_sqe **out)
{
	struct ferry_sq *sq;

	if (ferry_sq_get(e, &sq))
		return -1;
	for (int i = 0; i < 50000 && !(*out = ferry_sq_get_sqe(sq)); i++)
		usleep(100);
	return *out ? 0 : -1;
}

static void go(struct ferry_engine *e)
{
	struct ferry_sq *sq;

	if (ferry_sq_get(e, &sq) == 0)
		ferry_sq_submit(sq);
}

/* A child started at a pipe's word, so that it forks before any engine. */
struct child {
	pid_t pid;
	int go[2], ready[2];
};

static void child_spawn(struct child *c, int (*fn)(struct child *))
{
	assert_int_equal(pipe(c->go), 0);
	assert_int_equal(pipe(c->ready), 0);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		char b;

		alarm(t_under_valgrind() ? 900 : 100);
		if (t_read(c->go[0], &b, 1) != 1)
			_exit(99);
		_exit(fn(c));
	}
}

static void child_go(struct child *c)
{
	assert_int_equal(t_write(c->go[1], "g", 1), 1);
}

static void child_ready(struct child *c)
{
	if (t_write(c->ready[1], "r", 1) != 1)
		_exit(98);
}

static void wait_ready(struct child *c)
{
	char b;

	assert_int_equal(t_read(c->ready[0], &b, 1), 1);
}

static int reap(struct child *c)
{
	int st = 0;

	assert_int_equal(t_waitpid(c->pid, &st, 0), c->pid);
	close(c->go[0]);
	close(c->go[1]);
	close(c->ready[0]);
	close(c->ready[1]);
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* ------------------------------------------------------------------ */

enum { ORDER_N = 5000, ORDER_LIMIT = 8 };

/* Producer child: ORDER_N chunks of a stream, limit ORDER_LIMIT, in a window. */
static int producer_order(struct child *ch)
{
	struct ferry_engine *e = mk("prod", 0);
	struct ferry_peer *to = e ? peer(e, "cons") : NULL;
	static uint32_t vals[ORDER_N];
	static struct iovec iov[ORDER_N];
	struct ferry_cqe c;
	unsigned done = 0;

	(void)ch;
	if (!to)
		return 2;
	ferry_peer_set_stream_limits(to, ORDER_LIMIT, 0);
	for (unsigned i = 0; i < ORDER_N; i++) {
		struct ferry_sqe *sqe;

		vals[i] = i;
		iov[i].iov_base = &vals[i];
		/* The END is an empty chunk (upstream sends END-only chunks). */
		iov[i].iov_len = i == ORDER_N - 1 ? 0 : sizeof(vals[i]);
		if (submit_one(e, &sqe))
			return 3;
		ferry_prep_stream_put(sqe, to, "o_0", &iov[i], 1, i);
		ferry_sqe_set_flags(sqe, i == ORDER_N - 1 ? FERRY_SQE_STREAM_END : 0);
		ferry_sqe_set_timeout(sqe, 20 * SEC);
		go(e);
		while (ferry_cq_poll(ferry_cq_default(e), &c, 1) == 1) {
			if (c.res != (int)c.user_data) /* res = the chunk's index */
				return 4;
			done++;
		}
	}
	while (done < ORDER_N) {
		int res = wait_one(e, &c, 20 * SEC);

		if (res != (int)c.user_data)
			return 5;
		done++;
	}
	ferry_engine_destroy(e);
	return 0;
}

static int maybe_one(struct ferry_engine *e, struct ferry_cqe *c, int ms)
{
	return ferry_cq_wait(ferry_cq_default(e), c, 1, (int64_t)ms * MS) == 1;
}

static void test_order_across_processes(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_sqe *sqe;
	struct ferry_buf *held[ORDER_LIMIT + 1];
	unsigned got = 0, nheld = 0, full = 0;

	(void)state;
	child_spawn(&ch, producer_order);
	e = mk("cons", 0);
	assert_non_null(e);
	from = peer(e, "prod");
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_stream_get(sqe, from, "o_0", 1);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	go(e);
	child_go(&ch);
	while (got < ORDER_N) {
		struct ferry_cqe c;

		assert_int_equal(wait_one(e, &c, 20 * SEC), (int)got);
		assert_true(c.flags & FERRY_CQE_F_BUF);
		if (got == ORDER_N - 1)
			assert_int_equal(c.len, 0); /* the empty END */
		else
			assert_int_equal(*(uint32_t *)ferry_buf_data(c.buf), got);
		assert_int_equal(!!(c.flags & FERRY_CQE_F_MORE), got < ORDER_N - 1);
		held[nheld++] = c.buf;
		assert_true(nheld <= ORDER_LIMIT);
		if (nheld == ORDER_LIMIT && got < ORDER_N - 1 && full++ % 64 == 0) {
			/* Credits hold across processes: the limit held, nothing more comes. */
			struct ferry_cqe x;

			assert_false(maybe_one(e, &x, 150));
		}
		/* Release at the limit, and in odd stretches also early (every third). */
		if (nheld == ORDER_LIMIT || ((got / 256) % 2 && got % 3 == 0))
			while (nheld)
				ferry_buf_release(held[--nheld]);
		got++;
	}
	while (nheld)
		ferry_buf_release(held[--nheld]);
	assert_true(full > 64); /* the limit was reached, and checked, often */
	assert_int_equal(reap(&ch), 0);
	ferry_engine_destroy(e);
}

/* Producer child that sends 3 chunks, says so, then waits to be killed. */
static int producer_then_hang(struct child *ch)
{
	struct ferry_engine *e = mk("prod", 0);
	struct ferry_peer *to = e ? peer(e, "cons") : NULL;
	static uint64_t v[3];
	static struct iovec iov[3];
	struct ferry_cqe c;

	if (!to)
		return 2;
	for (unsigned i = 0; i < 3; i++) {
		struct ferry_sqe *sqe;

		iov[i].iov_base = &v[i];
		iov[i].iov_len = sizeof(v[i]);
		if (submit_one(e, &sqe))
			return 3;
		ferry_prep_stream_put(sqe, to, "d_0", &iov[i], 1, i);
		go(e);
		if (wait_one(e, &c, 10 * SEC) != (int)i)
			return 4;
	}
	child_ready(ch);
	pause();
	return 0;
}

static void test_producer_death(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	int64_t t0;

	(void)state;
	child_spawn(&ch, producer_then_hang);
	e = mk("cons", 0);
	assert_non_null(e);
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_stream_get(sqe, peer(e, "prod"), "d_0", 1);
	ferry_sqe_set_timeout(sqe, 30 * SEC); /* the death, not the deadline, ends it */
	go(e);
	child_go(&ch);
	wait_ready(&ch);
	for (unsigned i = 0; i < 3; i++) {
		assert_int_equal(wait_one(e, &c, 5 * SEC), (int)i);
		ferry_buf_release(c.buf);
	}
	t0 = t_now();
	kill(ch.pid, SIGKILL);
	assert_int_equal(reap(&ch), 128 + SIGKILL);
	assert_int_equal(wait_one(e, &c, 5 * SEC), -ECONNRESET);
	assert_false(c.flags & FERRY_CQE_F_MORE);
	assert_true(t_now() - t0 < (t_under_valgrind() ? 10 : 1) * SEC);
	ferry_engine_destroy(e);
}

/* Consumer child: reads 2 chunks without releasing, says so, waits for death. */
static int consumer_then_hang(struct child *ch)
{
	struct ferry_engine *e = mk("cons", 0);
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	if (!e || submit_one(e, &sqe))
		return 2;
	ferry_prep_stream_get(sqe, peer(e, "prod"), "k_0", 1);
	go(e);
	child_ready(ch); /* listening */
	for (unsigned i = 0; i < 2; i++)
		if (wait_one(e, &c, 10 * SEC) != (int)i)
			return 3;
	child_ready(ch);
	pause();
	return 0;
}

static void test_consumer_death(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *to;
	static uint64_t v[6];
	static struct iovec iov[6];
	struct ferry_cqe c;
	unsigned delivered = 0, failed = 0;
	int64_t t0;

	(void)state;
	child_spawn(&ch, consumer_then_hang);
	child_go(&ch);
	wait_ready(&ch);
	e = mk("prod", 0);
	assert_non_null(e);
	to = peer(e, "cons");
	ferry_peer_set_stream_limits(to, 2, 0);
	for (unsigned i = 0; i < 6; i++) {
		struct ferry_sqe *sqe;

		iov[i].iov_base = &v[i];
		iov[i].iov_len = sizeof(v[i]);
		assert_int_equal(submit_one(e, &sqe), 0);
		ferry_prep_stream_put(sqe, to, "k_0", &iov[i], 1, i);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
		go(e);
	}
	for (unsigned i = 0; i < 2; i++) {
		int res = wait_one(e, &c, 5 * SEC);

		assert_int_equal(res, (int)c.user_data);
		delivered++;
	}
	wait_ready(&ch); /* it holds both: the other four wait for credit */
	t0 = t_now();
	kill(ch.pid, SIGKILL);
	assert_int_equal(reap(&ch), 128 + SIGKILL);
	for (unsigned i = 0; i < 4; i++) {
		int res = wait_one(e, &c, 5 * SEC);

		assert_true(res == -ECONNRESET || res == -EPIPE);
		failed++;
	}
	assert_true(t_now() - t0 < (t_under_valgrind() ? 10 : 1) * SEC);
	/* Later chunks of the stream fail fast too. */
	{
		struct ferry_sqe *sqe;

		assert_int_equal(submit_one(e, &sqe), 0);
		ferry_prep_stream_put(sqe, to, "k_0", &iov[0], 1, 99);
		go(e);
		assert_true(wait_one(e, &c, 2 * SEC) < 0);
	}
	assert_int_equal(delivered + failed, 6);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* KV cache: many layer buffers in one vectored put                     */
/* ------------------------------------------------------------------ */

enum { KV_LAYERS = 28 };
#define KV_BYTES (190ull << 20)

static size_t kv_layer_bytes(void)
{
	size_t total = t_under_valgrind() ? (8u << 20) : KV_BYTES;

	return total / (2 * KV_LAYERS) & ~(size_t)63;
}

static uint64_t fnv(const void *d, size_t n, uint64_t h)
{
	const uint8_t *b = d;

	for (size_t i = 0; i < n; i += 8)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* The AR side: K and V of every layer, separate allocations, one PUT. */
static int kv_sender(struct child *ch)
{
	size_t lb = kv_layer_bytes();
	/* Room for both sets: the first is still lent when the second goes. */
	struct ferry_engine *e = mk("ar", 4 * KV_LAYERS * lb + (16u << 20));
	struct ferry_peer *to = e ? peer(e, "dit") : NULL;
	struct iovec iov[2 * KV_LAYERS];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	(void)ch;
	if (!to)
		return 2;
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		uint8_t *p = malloc(lb);

		if (!p)
			return 3;
		for (size_t k = 0; k < lb; k += 8)
			p[k] = (uint8_t)(i * 17 + k / 8);
		iov[i].iov_base = p;
		iov[i].iov_len = lb;
	}
	for (unsigned round = 0; round < 2; round++) {
		if (submit_one(e, &sqe))
			return 4;
		ferry_prep_put(sqe, to, round ? "kv_b" : "kv_a", iov, 2 * KV_LAYERS, round);
		go(e);
		if (wait_one(e, &c, 60 * SEC) != 0 || c.len != 2 * KV_LAYERS * lb)
			return 5;
	}
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++)
		free(iov[i].iov_base);
	ferry_engine_destroy(e);
	return 0;
}

static void test_kv_handoff(void **state)
{
	size_t lb = kv_layer_bytes(), total = 2 * KV_LAYERS * lb;
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	struct iovec dst[2 * KV_LAYERS];
	uint64_t want = 1469598103934665603ull, got = 1469598103934665603ull;

	(void)state;
	child_spawn(&ch, kv_sender);
	e = mk("dit", 16u << 20);
	assert_non_null(e);
	from = peer(e, "ar");
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		uint8_t *p = malloc(lb);

		assert_non_null(p);
		for (size_t k = 0; k < lb; k += 8)
			p[k] = (uint8_t)(i * 17 + k / 8);
		want = fnv(p, lb, want);
		memset(p, 0, lb);
		dst[i].iov_base = p;
		dst[i].iov_len = lb;
	}
	child_go(&ch);
	/* Contiguous, zero copy: one buffer in the sender's pool. */
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_get(sqe, from, "kv_a", NULL, 0, 1);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	go(e);
	assert_int_equal(wait_one(e, &c, 60 * SEC), 0);
	assert_int_equal(c.len, total);
	assert_true(fnv(ferry_buf_data(c.buf), total, 1469598103934665603ull) == want);
	ferry_buf_release(c.buf);
	/* Scattered into the receiver's own layer buffers. */
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_get(sqe, from, "kv_b", dst, 2 * KV_LAYERS, 2);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	go(e);
	assert_int_equal(wait_one(e, &c, 60 * SEC), 0);
	assert_int_equal(c.len, total);
	for (unsigned i = 0; i < 2 * KV_LAYERS; i++) {
		got = fnv(dst[i].iov_base, lb, got);
		free(dst[i].iov_base);
	}
	assert_true(got == want);
	assert_int_equal(reap(&ch), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */
/* Credits over shm: they return with the chunks' blocks (RELEASE)      */
/* ------------------------------------------------------------------ */

enum { CR_N = 64, CR_LIMIT = 4, WH_N = 40 };

/*
 * Producer child: CR_N chunks of stream "cr_0" (chunk i holds i), limit
 * CR_LIMIT; then WH_N chunks of "wh_0" (limit 2, so credits must flow
 * while the consumer holds the whole stream); then CR_N of "pg_0" for
 * plain GETs. Every put must succeed.
 */
static int producer_credits(struct child *ch)
{
	struct ferry_engine *e = mk("prod", 0);
	struct ferry_peer *to = e ? peer(e, "cons") : NULL;
	static uint64_t vals[CR_N];
	static struct iovec iov[CR_N];
	const char *keys[3] = { "cr_0", "wh_0", "pg_0" };
	unsigned counts[3] = { CR_N, WH_N, CR_N }, limits[3] = { CR_LIMIT, 2, CR_LIMIT };
	struct ferry_cqe c;

	(void)ch;
	if (!to)
		return 2;
	for (unsigned i = 0; i < CR_N; i++) {
		vals[i] = i;
		iov[i].iov_base = &vals[i];
		iov[i].iov_len = sizeof(vals[i]);
	}
	for (unsigned s = 0; s < 3; s++) {
		unsigned done = 0;

		ferry_peer_set_stream_limits(to, limits[s], 0);
		for (unsigned i = 0; i < counts[s]; i++) {
			struct ferry_sqe *sqe;

			if (submit_one(e, &sqe))
				return 3;
			ferry_prep_stream_put(sqe, to, keys[s], &iov[i], 1, i);
			ferry_sqe_set_flags(sqe, i == counts[s] - 1 ? FERRY_SQE_STREAM_END : 0);
			ferry_sqe_set_timeout(sqe, 20 * SEC);
		}
		go(e);
		while (done < counts[s]) {
			if (wait_one(e, &c, 30 * SEC) != (int)c.user_data)
				return 4 + (int)s;
			done++;
		}
	}
	ferry_engine_destroy(e);
	return 0;
}

/* Wait for one CQE for at most ms; 1 if one came. */

static void test_credits_across_processes(void **state)
{
	struct child ch;
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_sqe *sqe;
	struct ferry_buf *held[CR_N];
	unsigned got = 0, nheld = 0;
	uint64_t vals[CR_N];
	struct ferry_cqe c;

	(void)state;
	child_spawn(&ch, producer_credits);
	e = mk("cons", 0);
	assert_non_null(e);
	from = peer(e, "prod");
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_stream_get(sqe, from, "cr_0", 1);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	go(e);
	child_go(&ch);

	/* Holding everything: exactly CR_LIMIT chunks come, and no more. */
	while (got < CR_LIMIT) {
		assert_int_equal(wait_one(e, &c, 20 * SEC), (int)got);
		held[nheld++] = c.buf;
		got++;
	}
	assert_false(maybe_one(e, &c, 200));
	/* Each release lets exactly one more chunk come. */
	while (got < CR_N) {
		ferry_buf_release(held[--nheld]);
		assert_int_equal(wait_one(e, &c, 20 * SEC), (int)got);
		assert_int_equal(*(uint64_t *)ferry_buf_data(c.buf), got);
		held[nheld++] = c.buf;
		got++;
		if (got < CR_N)
			assert_false(maybe_one(e, &c, got < 12 ? 50 : 0));
		assert_int_equal(nheld, CR_LIMIT);
	}
	while (nheld)
		ferry_buf_release(held[--nheld]);

	/* Whole stream, limit 2 < WH_N chunks: credits flow while all is held. */
	assert_int_equal(submit_one(e, &sqe), 0);
	ferry_prep_stream_get(sqe, from, "wh_0", 2);
	ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_WHOLE);
	ferry_sqe_set_timeout(sqe, 20 * SEC);
	go(e);
	assert_int_equal(wait_one(e, &c, 30 * SEC), WH_N);
	assert_int_equal(c.len, WH_N * sizeof(uint64_t));
	for (unsigned i = 0; i < WH_N; i++)
		assert_int_equal(((uint64_t *)ferry_buf_data(c.buf))[i], i);
	ferry_buf_release(c.buf);

	/* Plain GETs of chunks (a copy each): their blocks come back at once. */
	for (unsigned i = 0; i < CR_N; i++) {
		char key[32];
		struct iovec d = { &vals[i], sizeof(vals[i]) };

		snprintf(key, sizeof(key), "pg_0_%u", i);
		assert_int_equal(submit_one(e, &sqe), 0);
		ferry_prep_get(sqe, from, key, &d, 1, 100 + i);
		ferry_sqe_set_timeout(sqe, 20 * SEC);
		go(e);
		assert_int_equal(wait_one(e, &c, 30 * SEC), 0);
		assert_int_equal(c.user_data, 100 + i);
		assert_int_equal(vals[i], i);
	}
	assert_int_equal(reap(&ch), 0);
	ferry_engine_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_order_across_processes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_producer_death, setup, teardown),
		cmocka_unit_test_setup_teardown(test_consumer_death, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kv_handoff, setup, teardown),
		cmocka_unit_test_setup_teardown(test_credits_across_processes, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/test_stream_shm.c - the KV-cache handoff between real processes
 * over the shared-memory transport: a vectored put of 56 layer buffers (190
 * MB, no packing copy by the caller) received contiguous (zero copy) and
 * scattered into the receiver's own layer buffers. The child is forked
 * before the parent creates engines, and reports through its exit status.
 * What every transport must show of streams (order, credits across
 * processes, either end's death) is the conformance suite
 * (tests/conformance.h), run over shm by test_conformance_shm.
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
	int go[2];
};

static void child_spawn(struct child *c, int (*fn)(struct child *))
{
	assert_int_equal(pipe(c->go), 0);
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

static int reap(struct child *c)
{
	int st = 0;

	assert_int_equal(t_waitpid(c->pid, &st, 0), c->pid);
	close(c->go[0]);
	close(c->go[1]);
	return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
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
	struct ferry_sqe *sqe = NULL;
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
	if (submit_one(e, &sqe) || !sqe) {
		fail_msg("no submission entry");
		return;
	}
	ferry_prep_get(sqe, from, "kv_a", NULL, 0, 1);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	go(e);
	assert_int_equal(wait_one(e, &c, 60 * SEC), 0);
	assert_int_equal(c.len, total);
	assert_true(fnv(ferry_buf_data(c.buf), total, 1469598103934665603ull) == want);
	ferry_buf_release(c.buf);
	/* Scattered into the receiver's own layer buffers. */
	if (submit_one(e, &sqe) || !sqe) {
		fail_msg("no submission entry");
		return;
	}
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_kv_handoff, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

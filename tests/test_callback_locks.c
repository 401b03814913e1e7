/*
 * tests/test_callback_locks.c - what a callback may do where it runs
 * (api/ferry.h, "Threads"): no ferry callback (a completion's or the log
 * sink) runs while ferry holds a lock of its own, so a callback may call
 * the engine's calls that take one (ferry_peer_open, ferry_cq_create,
 * ferry_engine_health, a first ferry_sq_get); a log callback always gets the arg that was set with it;
 * and the first line a process logs does not undo a ferry_log_set made at
 * the same time. Each case that could hang runs in a child process bounded
 * by alarm: a deadlock is a failed test, not a hung suite.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "helpers.h"

static unsigned child_alarm(void)
{
	return t_under_valgrind() ? 120 : 10;
}

/* In a child: no cmocka asserts (a failure there must be an exit status). */
static struct ferry_engine *c_engine(const char *name, uint32_t max_bufs)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "test";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 1u << 20;
	p.max_bufs = max_bufs;
	if (ferry_engine_create(&p, &e))
		_exit(20);
	return e;
}

static struct ferry_sqe *c_sqe(struct ferry_engine *e, struct ferry_sq **sq)
{
	struct ferry_sqe *sqe;

	if (ferry_sq_get(e, sq) || !(sqe = ferry_sq_get_sqe(*sq)))
		_exit(21);
	return sqe;
}

/* A callback that calls what takes the engine's lock, and says it returned. */
struct lock_cb {
	struct ferry_engine *e;
	atomic_int entered, returned;
	int peer_rc, cq_rc;
};

static void cb_takes_engine_lock(const struct ferry_cqe *cqe, void *arg)
{
	struct lock_cb *l = arg;
	struct ferry_peer *p = NULL;
	struct ferry_cq *cq = NULL;

	(void)cqe;
	atomic_fetch_add(&l->entered, 1);
	l->peer_rc = ferry_peer_open(l->e, "someone-else", &p);
	l->cq_rc = ferry_cq_create(l->e, NULL, &cq);
	atomic_fetch_add(&l->returned, 1);
}

/*
 * A CQ destroyed with a completion nobody polled: its callback runs when
 * the reactor frees the CQ (here in a MANUAL-mode ferry_progress). It must
 * not run under the engine's lock.
 */
static int dead_cq_child(void *arg)
{
	struct lock_cb l = { 0 };
	struct ferry_cq *cq;
	struct ferry_sqe *sqe;
	struct ferry_sq *sq;

	(void)arg;
	alarm(child_alarm());
	l.e = c_engine("deadcq", 0);
	if (ferry_cq_create(l.e, NULL, &cq))
		return 10;
	sqe = c_sqe(l.e, &sq);
	ferry_prep_nop(sqe, 1);
	ferry_sqe_set_callback(sqe, cb_takes_engine_lock, &l);
	ferry_sqe_set_cq(sqe, cq);
	ferry_sq_submit(sq);
	ferry_progress(l.e); /* posted to cq, not polled */
	if (ferry_cq_destroy(cq))
		return 11;
	for (int i = 0; i < 100 && !atomic_load(&l.returned); i++)
		ferry_progress(l.e); /* the reactor frees cq: its callback runs */
	if (atomic_load(&l.entered) != 1 || atomic_load(&l.returned) != 1)
		return 12;
	if (l.peer_rc || l.cq_rc)
		return 13;
	ferry_engine_destroy(l.e);
	return 0;
}

static void test_dead_cq_callback_not_under_lock(void **state)
{
	(void)state;
	assert_int_equal(t_reap(t_fork(dead_cq_child, NULL)), 0);
}

/*
 * A FERRY_SQE_CB_REACTOR STREAM_PUT that waited for its peer's credit and
 * fails when that credit comes back (the pool is exhausted for its copy):
 * it completes inside the round's credit pump, and its callback must not
 * run under the engine's lock.
 */
static int credit_pump_child(void *arg)
{
	struct ferry_engine *b;
	struct ferry_peer *to_b;
	struct ferry_sq *sq;
	struct ferry_buf *hold[64];
	struct lock_cb l = { 0 };
	struct ferry_sqe *sqe;
	static char one[64] = "chunk", two[64] = "chunk";
	struct iovec iov1 = { one, sizeof(one) }, iov2 = { two, sizeof(two) };
	unsigned nhold = 0;
	int64_t end;

	(void)arg;
	alarm(child_alarm());
	ferry_log_set(-1, NULL, NULL);
	l.e = c_engine("pump-a", 16);   /* few buffer handles: easy to exhaust */
	b = c_engine("pump-b", 0);      /* never driven: it acknowledges nothing */
	if (ferry_peer_open(l.e, "pump-b", &to_b) ||
	    ferry_peer_set_stream_limits(to_b, 16, 1)) /* one chunk in flight to b */
		return 11;

	/* Stream s1, chunk 0: sent, never acknowledged, times out: its credit comes back. */
	sqe = c_sqe(l.e, &sq);
	ferry_prep_stream_put(sqe, to_b, "s1", &iov1, 1, 1);
	ferry_sqe_set_timeout(sqe, 30 * MS);
	ferry_sq_submit(sq);
	ferry_progress(l.e);
	/* Stream s2, chunk 0: waits for b's credit (s1 holds it). */
	sqe = c_sqe(l.e, &sq);
	ferry_prep_stream_put(sqe, to_b, "s2", &iov2, 1, 2);
	ferry_sqe_set_callback(sqe, cb_takes_engine_lock, &l);
	ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	ferry_sq_submit(sq);
	ferry_progress(l.e);
	if (atomic_load(&l.entered))
		return 12; /* it should wait */
	/* Exhaust the pool's handles: s2's copy will fail once it may go. */
	while (nhold < 64 && ferry_buf_alloc(l.e, 64, &hold[nhold]) == 0)
		nhold++;
	end = t_now() + 5 * SEC;
	while (!atomic_load(&l.returned) && t_now() < end)
		ferry_progress(l.e); /* s1's deadline, then the credit pump sends s2 */
	if (atomic_load(&l.entered) != 1 || atomic_load(&l.returned) != 1)
		return 13;
	if (l.peer_rc || l.cq_rc)
		return 14;
	while (nhold)
		ferry_buf_release(hold[--nhold]);
	ferry_engine_destroy(l.e);
	ferry_engine_destroy(b);
	return 0;
}

static void test_credit_pump_callback_not_under_lock(void **state)
{
	(void)state;
	assert_int_equal(t_reap(t_fork(credit_pump_child, NULL)), 0);
}

/*
 * A log sink that calls what takes the engine's lock (health, opening a
 * peer): lines logged where ferry holds a lock of its own (a bad segment,
 * checked under the engine's lock; a thread too many asking for a queue)
 * must be written after it lets go. (ferry_sq_get's line for a thread
 * too many is written after the lock as well; making 1024 threads hold
 * queues is more than a test under valgrind may do.)
 */
static struct ferry_engine *sink_engine;
static atomic_int sink_lines;

static void sink_takes_engine_lock(int level, const char *line, void *arg)
{
	struct ferry_peer *p;

	(void)level;
	(void)line;
	(void)arg;
	if (sink_engine) {
		ferry_engine_health(sink_engine, NULL, 0);
		ferry_peer_open(sink_engine, "from-the-sink", &p);
	}
	atomic_fetch_add(&sink_lines, 1);
}

static int log_sink_child(void *arg)
{
	static char mem[4096];
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r;
	struct ferry_peer *self;
	struct ferry_seg seg;
	struct ferry_sqe *sqe;
	struct ferry_sq *sq;
	struct ferry_cqe cqe;
	int n = 0;

	(void)arg;
	alarm(child_alarm());
	sink_engine = c_engine("sink", 0);
	ferry_log_set(FERRY_LOG_ERROR, sink_takes_engine_lock, NULL);
	rp.addr = mem;
	rp.len = sizeof(mem);
	if (ferry_region_register(sink_engine, &rp, &r) ||
	    ferry_peer_open(sink_engine, "sink", &self))
		return 10;
	/* A segment past its region's end: logged by the check made under the lock. */
	seg.region = r;
	seg.offset = 0;
	seg.len = sizeof(mem) + 1;
	sqe = c_sqe(sink_engine, &sq);
	ferry_prep_put_segs(sqe, self, "k", &seg, 1, 1);
	ferry_sq_submit(sq);
	for (int i = 0; i < 1000 && n == 0; i++)
		n = ferry_cq_poll(ferry_cq_default(sink_engine), &cqe, 1);
	if (n != 1 || cqe.res != -EINVAL || !atomic_load(&sink_lines))
		return 11;
	ferry_log_set(-1, NULL, NULL);
	ferry_region_release(&r);
	ferry_engine_destroy(sink_engine);
	return 0;
}

static void test_log_sink_not_under_lock(void **state)
{
	(void)state;
	assert_int_equal(t_reap(t_fork(log_sink_child, NULL)), 0);
}

/* ------------------------------------------------------------------ */

/*
 * ferry_log_set while other threads log: a callback is only ever called
 * with the arg set together with it (never the old callback with the new
 * arg).
 */
struct log_arg {
	int tag;
};

static struct log_arg arg_one = { 1 }, arg_two = { 2 };
static atomic_ulong log_calls, log_mismatch;
static atomic_int log_stop;

static void log_one(int level, const char *line, void *arg)
{
	(void)level;
	(void)line;
	atomic_fetch_add(&log_calls, 1);
	if (arg != &arg_one)
		atomic_fetch_add(&log_mismatch, 1);
}

static void log_two(int level, const char *line, void *arg)
{
	(void)level;
	(void)line;
	atomic_fetch_add(&log_calls, 1);
	if (arg != &arg_two)
		atomic_fetch_add(&log_mismatch, 1);
}

static void *log_setter(void *arg)
{
	(void)arg;
	for (unsigned i = 0; !atomic_load(&log_stop); i++) {
		if (i & 1)
			ferry_log_set(FERRY_LOG_ERROR, log_two, &arg_two);
		else
			ferry_log_set(FERRY_LOG_ERROR, log_one, &arg_one);
	}
	return NULL;
}

static void *log_writer(void *arg)
{
	(void)arg;
	while (!atomic_load(&log_stop))
		ferry_log(FERRY_LOG_ERROR, "line");
	return NULL;
}

static void test_log_set_pairs_cb_and_arg(void **state)
{
	pthread_t setter, writers[2];
	int64_t end = t_now() + (t_under_valgrind() ? 3 : 1) * SEC;

	(void)state;
	ferry_log_set(FERRY_LOG_ERROR, log_one, &arg_one);
	assert_int_equal(pthread_create(&setter, NULL, log_setter, NULL), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&writers[i], NULL, log_writer, NULL), 0);
	while (t_now() < end && !atomic_load(&log_mismatch))
		usleep(1000);
	atomic_store(&log_stop, 1);
	pthread_join(setter, NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(writers[i], NULL);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	assert_true(atomic_load(&log_calls) > 0);
	if (atomic_load(&log_mismatch))
		fail_msg("%lu of %lu log lines went to a callback with another's arg",
			 atomic_load(&log_mismatch), atomic_load(&log_calls));
}

/*
 * The first line a process logs reads FERRY_LOG; a ferry_log_set made
 * meanwhile on another thread is not undone by it. Each try is a fresh
 * process (the threshold is read once per process), with a long
 * environment so that reading it takes a while.
 */
static atomic_int probe_seen;

static void probe_cb(int level, const char *line, void *arg)
{
	(void)level;
	(void)arg;
	if (!strcmp(line, "probe"))
		atomic_store(&probe_seen, 1);
}

static pthread_barrier_t race_start;
static int64_t setter_delay; /* half the time a scan of the environment takes */

static void *first_logger(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&race_start);
	ferry_log(FERRY_LOG_DEBUG, "first"); /* reads FERRY_LOG (unset: warn) */
	return NULL;
}

static void *level_setter(void *arg)
{
	(void)arg;
	int64_t go;

	pthread_barrier_wait(&race_start);
	go = t_now() + setter_delay; /* land while the first line reads FERRY_LOG */
	while (t_now() < go)
		;
	ferry_log_set(FERRY_LOG_DEBUG, probe_cb, NULL);
	return NULL;
}

static int first_log_race_child(void)
{
	pthread_t a, b;

	int64_t t0;

	alarm(child_alarm());
	t0 = t_now();
	if (getenv("FERRY_T_NOT_SET")) /* as long as the FERRY_LOG lookup */
		return 2;
	setter_delay = (t_now() - t0) / 2;
	pthread_barrier_init(&race_start, NULL, 2);
	pthread_create(&a, NULL, first_logger, NULL);
	pthread_create(&b, NULL, level_setter, NULL);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	ferry_log(FERRY_LOG_DEBUG, "probe"); /* the level set must hold */
	return atomic_load(&probe_seen) ? 0 : 1;
}

/* This program's path (argv[0]): under valgrind /proc/self/exe names valgrind's tool. */
static const char *self_path;

static void test_first_log_keeps_level_set(void **state)
{
	enum { PAD = 20000, TRIES = 40 };
	extern char **environ;
	size_t n = 0;
	char **env;
	int failed = 0;

	(void)state;
	while (environ[n])
		n++;
	env = calloc(n + PAD + 1, sizeof(*env));
	assert_non_null(env);
	for (size_t i = 0, k = 0; i < n; i++)
		if (strncmp(environ[i], "FERRY_LOG=", 10))
			env[k++] = environ[i];
	for (size_t i = 0, k = 0; env[k] || i < PAD; k++) {
		if (env[k])
			continue;
		env[k] = malloc(32);
		assert_non_null(env[k]);
		snprintf(env[k], 32, "FERRY_T_PAD_%zu=x", i++);
	}
	for (int i = 0; i < TRIES; i++) {
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0) {
			execle(self_path, "test_callback_locks", "--first-log-race",
			       (char *)NULL, env);
			_exit(127);
		}
		if (t_reap(pid))
			failed++;
	}
	for (size_t i = 0; env[i]; i++)
		if (!strncmp(env[i], "FERRY_T_PAD_", 12))
			free(env[i]);
	free(env);
	if (failed)
		fail_msg("%d of %d processes lost the level set while their first line was logged",
			 failed, TRIES);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_log_keeps_level_set),
		cmocka_unit_test(test_dead_cq_callback_not_under_lock),
		cmocka_unit_test(test_credit_pump_callback_not_under_lock),
		cmocka_unit_test(test_log_sink_not_under_lock),
		cmocka_unit_test(test_log_set_pairs_cb_and_arg),
	};

	if (argc > 1 && !strcmp(argv[1], "--first-log-race"))
		return first_log_race_child();
	self_path = argv[0];
	return cmocka_run_group_tests(tests, NULL, NULL);
}

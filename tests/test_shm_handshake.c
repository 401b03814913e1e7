/*
 * tests/test_shm_handshake.c - the shm handshakes never hold the reactor.
 *
 * Between real processes in a private runtime directory: callers that
 * connect to an engine's socket and stay silent (a few, and more than the
 * half-open table holds) while the engine serves another one; PUTs to an
 * engine in MANUAL mode that is not driven for a while (they wait, in order,
 * while the caller serves a third engine, and go once it is driven); a
 * "peer" that accepts nothing and never answers (the PUTs fail with
 * -EHOSTUNREACH after the handshake's bound, an op's own earlier deadline
 * still applies, the next PUT calls again); a callee whose accept queue is
 * full (the call is tried again within its bound); and engines destroyed in
 * the middle of handshakes. No fd, mapping or file is left behind.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "shm_sock.h"

/* backends/shm/shm_int.h: a fault hook for tests (the next n accepted callers hung up on). */
int ferry__shm_fault_hangup(struct ferry_engine *e, int n);

#define NS "hs"

static char rundir[256];

/* Open fds of this process. */
static int count_fds(void)
{
	return t_count_files("/proc/self/fd") - 1; /* the one opendir holds */
}

static int setup(void **state)
{
	(void)state;
	/* Refused callers and failed handshakes log by design. */
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	return t_test_rundir(rundir, sizeof(rundir), "hs", 120);
}

static int teardown(void **state)
{
	(void)state;
	return t_test_rundir_end(rundir); /* nothing left behind */
}

static struct ferry_engine *mk(const char *name, enum ferry_progress_mode mode)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.ns = NS;
	p.progress = mode;
	p.pool_size = 4u << 20;
	rc = ferry_engine_create(&p, &e);
	if (rc) {
		fprintf(stderr, "engine %s: %s\n", name, ferry_strerror(rc));
		return NULL;
	}
	return e;
}

/* PUT a 4-byte value (i) under key <prefix><i>: iovs must outlive the op. */
static void put_u32(struct ferry_engine *e, struct ferry_peer *to, const char *prefix,
		    uint32_t i, uint32_t *val, struct iovec *iov, uint64_t timeout_ns)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	char key[32];

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	sqe = ferry_sq_get_sqe(sq);
	assert_non_null(sqe);
	*val = i;
	iov->iov_base = val;
	iov->iov_len = sizeof(*val);
	snprintf(key, sizeof(key), "%s%u", prefix, i);
	ferry_prep_put(sqe, to, key, iov, 1, i);
	ferry_sqe_set_timeout(sqe, timeout_ns);
	assert_true(ferry_sq_submit(sq) >= 0);
}

/* n PUTs of prefix0.. to `to`, each of which must complete with 0. */
static void put_all_arrive(struct ferry_engine *e, struct ferry_peer *to, const char *prefix,
			   uint32_t n, uint32_t *vals, struct iovec *iovs)
{
	struct ferry_cqe c;

	for (uint32_t i = 0; i < n; i++)
		put_u32(e, to, prefix, i, &vals[i], &iovs[i], 30 * SEC);
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(t_wait_one(e, &c, 30 * SEC), 0);
}

/*
 * Child side: GET <prefix>0..n-1 from `from` (posted all at once), check
 * each value. Returns 0 or a small error number.
 */
static int get_all(struct ferry_engine *e, const char *from, const char *prefix, uint32_t n)
{
	struct ferry_peer *fp;
	struct ferry_sq *sq;

	if (ferry_peer_open(e, from, &fp) || ferry_sq_get(e, &sq))
		return 2;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_sqe *sqe;
		char key[32];

		while (!(sqe = ferry_sq_get_sqe(sq)))
			ferry_sq_submit(sq);
		snprintf(key, sizeof(key), "%s%u", prefix, i);
		ferry_prep_get(sqe, fp, key, NULL, 0, i);
		ferry_sqe_set_timeout(sqe, 30 * SEC);
	}
	ferry_sq_submit(sq);
	for (uint32_t done = 0; done < n; done++) {
		struct ferry_cqe c;
		int rc = t_wait_one(e, &c, 30 * SEC);

		if (rc) {
			fprintf(stderr, "get_all %s: %u done: %s\n", prefix, done, ferry_strerror(rc));
			return 3;
		}
		if (c.len != 4 || *(uint32_t *)ferry_buf_data(c.buf) != (uint32_t)c.user_data)
			return 4;
		ferry_buf_release(c.buf);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Silent callers                                                      */
/* ------------------------------------------------------------------ */

struct serve_arg {
	const char *name, *from, *prefix;
	uint32_t n;
	int hangups; /* callers the engine hangs up on first, unread (ferry__shm_fault_hangup) */
	struct t_gate ready, done;
};

/* An engine that GETs n keys from `from`, then waits for `done` to go. */
static int serve_main(void *arg)
{
	struct serve_arg *a = arg;
	struct ferry_engine *e = mk(a->name, FERRY_PROGRESS_THREAD);
	int rc;

	if (!e || (a->hangups && ferry__shm_fault_hangup(e, a->hangups)))
		return 10;
	t_gate_open(&a->ready);
	rc = get_all(e, a->from, a->prefix, a->n);
	if (rc == 0 && t_gate_wait(&a->done, 60000))
		rc = 11;
	ferry_engine_destroy(e);
	return rc;
}

/*
 * Wait until every socket of fds[0..n) was hung up by the other side (up
 * to ms); returns how many were.
 */
static int hung_up(const int *fds, int n, int ms)
{
	int64_t end = t_now() + (int64_t)ms * MS;
	int count;

	do {
		count = 0;
		for (int i = 0; i < n; i++) {
			struct pollfd p = { .fd = fds[i], .events = POLLIN | POLLRDHUP };

			if (t_poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)))
				count++;
		}
		if (count == n)
			break;
		usleep(5000);
	} while (t_now() < end);
	return count;
}

/*
 * nsilent callers connect to b and say nothing, then a PUTs 100 keys to b,
 * which GETs them. With the handshake inside the round, b would spend
 * 200 ms on each silent caller before a's call (queued behind them) got
 * its answer: 50 of them, 10 s, and a's handshake gives up after 2 s. Now
 * they cost b nothing: every transfer succeeds. b hangs up on every
 * silent caller on its own: those beyond its half-open table at once,
 * the others once their hello is overdue.
 */
static void silent_callers(int nsilent)
{
	struct serve_arg sa = { .name = "b", .from = "a", .prefix = "s", .n = 100 };
	uint32_t vals[100];
	struct iovec iovs[100];
	struct ferry_engine *a;
	struct ferry_peer *to;
	int *silent = calloc((size_t)nsilent, sizeof(int));
	pid_t pid;

	assert_non_null(silent);
	t_gate_init(&sa.ready);
	t_gate_init(&sa.done);
	pid = t_fork(serve_main, &sa);
	assert_int_equal(t_gate_wait(&sa.ready, 60000), 0);
	for (int i = 0; i < nsilent; i++) {
		silent[i] = shm_sock_connect(NS, "b");
		assert_true(silent[i] >= 0);
	}
	a = mk("a", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	assert_int_equal(ferry_peer_open(a, "b", &to), 0);
	/*
	 * Every PUT succeeds: before, b's accepts waited for each silent
	 * caller's hello in turn (200 ms each), and a's handshake gave up
	 * (-EHOSTUNREACH) long before b answered. No time is asserted here.
	 */
	put_all_arrive(a, to, "s", 100, vals, iovs);
	/* b hangs up on all of them while it lives (its engine still runs). */
	assert_int_equal(hung_up(silent, nsilent, 10000), nsilent);
	t_gate_open(&sa.done);
	assert_int_equal(t_reap(pid), 0);
	for (int i = 0; i < nsilent; i++)
		close(silent[i]);
	free(silent);
	assert_int_equal(ferry_engine_destroy(a), 0);
	t_gate_close(&sa.ready);
	t_gate_close(&sa.done);
}

/*
 * The callee hangs up on a caller before it answers (as on one whose hello
 * came late: starved of its CPU between its connect and its hello): the
 * caller calls again within its handshake's bound, and the PUTs queued on
 * the call all arrive.
 */
static void test_hung_up_caller_calls_again(void **state)
{
	struct serve_arg sa = { .name = "b", .from = "a", .prefix = "h", .n = 20, .hangups = 2 };
	static uint32_t vals[20];
	static struct iovec iovs[20];
	struct ferry_engine *a;
	struct ferry_peer *to;
	char h[65536];
	pid_t pid;

	(void)state;
	t_gate_init(&sa.ready);
	t_gate_init(&sa.done);
	pid = t_fork(serve_main, &sa);
	assert_int_equal(t_gate_wait(&sa.ready, 60000), 0);
	a = mk("a", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	assert_int_equal(ferry_peer_open(a, "b", &to), 0);
	put_all_arrive(a, to, "h", 20, vals, iovs);
	/* Hung up on twice, called three times. */
	assert_true(ferry_engine_health(a, h, sizeof(h)) > 0);
	assert_non_null(strstr(h, "\"calls_again\":2"));
	t_gate_open(&sa.done);
	assert_int_equal(t_reap(pid), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	t_gate_close(&sa.ready);
	t_gate_close(&sa.done);
}

static void test_silent_callers_cost_nothing(void **state)
{
	(void)state;
	silent_callers(50);
}

/* More silent callers than the half-open table holds (64): the rest are refused. */
static void test_silent_caller_flood(void **state)
{
	(void)state;
	silent_callers(120);
}

/* ------------------------------------------------------------------ */
/* A MANUAL-mode peer that is not driven for a while                   */
/* ------------------------------------------------------------------ */

struct manual_arg {
	struct t_gate ready, go;
};

/*
 * Engine m in MANUAL mode: posts GETs for q2, q1, q0 (in that order), says
 * ready, is not driven until `go`; then it drives itself and must see the
 * GETs complete in the order the PUTs were sent: q0, q1, q2.
 */
static int manual_main(void *arg)
{
	struct manual_arg *a = arg;
	struct ferry_engine *e = mk("m", FERRY_PROGRESS_MANUAL);
	struct ferry_peer *fp;
	struct ferry_sq *sq;
	uint32_t got = 0;
	int64_t end;
	int rc = 0;

	if (!e)
		return 10;
	if (ferry_peer_open(e, "a", &fp) || ferry_sq_get(e, &sq))
		return 11;
	for (int i = 2; i >= 0; i--) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);
		char key[8];

		if (!sqe)
			return 12;
		snprintf(key, sizeof(key), "q%d", i);
		ferry_prep_get(sqe, fp, key, NULL, 0, (uint64_t)i);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
	}
	ferry_sq_submit(sq); /* taken by the first ferry_progress */
	t_gate_open(&a->ready);
	if (t_gate_wait(&a->go, 60000))
		return 13;
	end = t_now() + 30 * SEC;
	while (got < 3 && t_now() < end) {
		struct ferry_cqe c;

		ferry_progress(e);
		if (ferry_cq_poll(ferry_cq_default(e), &c, 1) != 1) {
			usleep(200);
			continue;
		}
		if (c.res != 0 || c.user_data != got || c.len != 4 ||
		    *(uint32_t *)ferry_buf_data(c.buf) != got) {
			fprintf(stderr, "m: completion %u: user_data %llu res %d\n", got,
				(unsigned long long)c.user_data, c.res);
			rc = 14;
			break;
		}
		ferry_buf_release(c.buf);
		got++;
	}
	if (!rc && got != 3)
		rc = 15;
	/* Drive on a little so that the RESULTs reach a. */
	end = t_now() + (t_under_valgrind() ? 2000 : 200) * MS;
	while (t_now() < end) {
		ferry_progress(e);
		usleep(500);
	}
	ferry_engine_destroy(e);
	return rc;
}

static void test_manual_peer_not_driven(void **state)
{
	struct manual_arg ma;
	struct serve_arg sa = { .name = "c", .from = "a", .prefix = "t", .n = 20 };
	uint32_t qvals[3], tvals[20];
	struct iovec qiov[3], tiov[20];
	struct ferry_engine *a;
	struct ferry_peer *tm, *tc;
	uint32_t q_done = 0, t_done = 0;
	pid_t pm, pc;

	(void)state;
	t_gate_init(&ma.ready);
	t_gate_init(&ma.go);
	t_gate_init(&sa.ready);
	t_gate_init(&sa.done);
	pm = t_fork(manual_main, &ma);
	pc = t_fork(serve_main, &sa);
	assert_int_equal(t_gate_wait(&ma.ready, 60000), 0);
	assert_int_equal(t_gate_wait(&sa.ready, 60000), 0);
	a = mk("a", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	assert_int_equal(ferry_peer_open(a, "m", &tm), 0);
	assert_int_equal(ferry_peer_open(a, "c", &tc), 0);
	/* m is not driven: these wait for its answer, in order. */
	for (uint32_t i = 0; i < 3; i++)
		put_u32(a, tm, "q", i, &qvals[i], &qiov[i], 30 * SEC);
	/* Meanwhile a serves c: all of it completes, none of m's PUTs does. */
	for (uint32_t i = 0; i < 20; i++)
		put_u32(a, tc, "t", i, &tvals[i], &tiov[i], 30 * SEC);
	while (t_done < 20) {
		struct ferry_cqe c;

		assert_int_equal(t_wait_one(a, &c, 30 * SEC), 0);
		assert_true(c.user_data < 20);
		t_done++;
	}
	usleep(100000); /* and m stays silent a little longer */
	{
		struct ferry_cqe c;

		assert_int_equal(ferry_cq_poll(ferry_cq_default(a), &c, 1), 0);
	}
	t_gate_open(&ma.go);
	/* m drives now: its PUTs complete, in the order they were sent. */
	while (q_done < 3) {
		struct ferry_cqe c;

		assert_int_equal(t_wait_one(a, &c, 30 * SEC), 0);
		assert_int_equal(c.user_data, q_done);
		q_done++;
	}
	assert_int_equal(t_reap(pm), 0);
	t_gate_open(&sa.done);
	assert_int_equal(t_reap(pc), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	t_gate_close(&ma.ready);
	t_gate_close(&ma.go);
	t_gate_close(&sa.ready);
	t_gate_close(&sa.done);
}

/* ------------------------------------------------------------------ */
/* A peer that never answers                                           */
/* ------------------------------------------------------------------ */

/*
 * A listening socket at the path of engine `name`, which accepts nothing
 * (its backlog takes our call) and so never answers a hello.
 */
static int fake_listener(const char *name, char *path, size_t len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(s >= 0);
	assert_int_equal(shm_sock_path(NS, name, path, len), 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(s, 16), 0);
	return s;
}

/* Engine `name` in THREAD mode once `go` opens: GETs h0 from a, waits for `done`. */
struct late_arg {
	const char *name;
	struct t_gate go, ready, done;
};

static int late_main(void *arg)
{
	struct late_arg *l = arg;
	struct ferry_engine *e;
	int rc;

	if (t_gate_wait(&l->go, 60000))
		return 20;
	e = mk(l->name, FERRY_PROGRESS_THREAD);
	if (!e)
		return 21;
	t_gate_open(&l->ready);
	rc = get_all(e, "a", "h", 1);
	if (rc == 0 && t_gate_wait(&l->done, 60000))
		rc = 22;
	ferry_engine_destroy(e);
	return rc;
}

static void test_silent_peer_times_out(void **state)
{
	struct late_arg la = { .name = "ghost" };
	char path[SHM_PATH_MAX];
	uint32_t vals[4], v;
	struct iovec iovs[4], iov;
	struct ferry_engine *a;
	struct ferry_peer *to;
	struct ferry_cqe c;
	int fds_before, lis;
	int64_t t0, took;
	pid_t pid;

	(void)state;
	t_gate_init(&la.go);
	t_gate_init(&la.ready);
	t_gate_init(&la.done);
	pid = t_fork(late_main, &la);
	fds_before = count_fds();
	a = mk("a", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	lis = fake_listener("ghost", path, sizeof(path));
	assert_int_equal(ferry_peer_open(a, "ghost", &to), 0);

	/* Three PUTs with time to spare: the handshake's bound (2 s) ends them. */
	t0 = t_now();
	for (uint32_t i = 0; i < 3; i++)
		put_u32(a, to, "g", i, &vals[i], &iovs[i], 30 * SEC);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(t_wait_one(a, &c, 20 * SEC), -EHOSTUNREACH);
		assert_int_equal(c.user_data, i);
	}
	took = t_now() - t0;
	assert_true(took >= 1500 * MS); /* not before the bound */

	/* An op's own deadline, earlier than the bound, still applies. */
	put_u32(a, to, "g", 3, &vals[3], &iovs[3], 200 * MS);
	assert_int_equal(t_wait_one(a, &c, 20 * SEC), -ETIMEDOUT);
	assert_int_equal(c.user_data, 3);

	/*
	 * The name now belongs to a real engine (another process): the next
	 * PUT calls again and is delivered.
	 */
	close(lis);
	assert_int_equal(unlink(path), 0);
	t_gate_open(&la.go);
	assert_int_equal(t_gate_wait(&la.ready, 60000), 0);
	put_u32(a, to, "h", 0, &v, &iov, 30 * SEC);
	assert_int_equal(t_wait_one(a, &c, 20 * SEC), 0);
	t_gate_open(&la.done);
	assert_int_equal(t_reap(pid), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(count_fds(), fds_before);
	t_gate_close(&la.go);
	t_gate_close(&la.ready);
	t_gate_close(&la.done);
}

/* Engine m in MANUAL mode: driven only between `go` and `done`. */
struct driven_arg {
	struct t_gate ready, go, done;
};

static int driven_main(void *arg)
{
	struct driven_arg *d = arg;
	struct ferry_engine *e = mk("m", FERRY_PROGRESS_MANUAL);
	int64_t end;

	if (!e)
		return 30;
	t_gate_open(&d->ready);
	if (t_gate_wait(&d->go, 60000))
		return 31;
	end = t_now() + 60 * SEC;
	while (t_gate_wait(&d->done, 0) != 0) {
		if (t_now() > end)
			return 32;
		ferry_progress(e);
		usleep(500);
	}
	ferry_engine_destroy(e);
	return 0;
}

/*
 * The callee's accept queue is full (an engine in MANUAL mode, not driven,
 * whose backlog we fill with silent connects): a call finds no room and is
 * tried again by the timer; if the queue stays full, the PUT fails with
 * -EHOSTUNREACH after the bound; once the callee is driven (it empties its
 * queue) a call gets through and the PUT completes.
 */
static void test_full_accept_queue(void **state)
{
	enum { MAX_FILL = 4096 };
	struct driven_arg d;
	static int fill[MAX_FILL]; /* not on the heap: the forked child leaves without freeing */
	int nfill = 0;
	struct ferry_engine *a;
	struct ferry_peer *to;
	struct ferry_cqe c;
	uint32_t v[2];
	struct iovec iov[2];
	pid_t pid;

	(void)state;
	t_gate_init(&d.ready);
	t_gate_init(&d.go);
	t_gate_init(&d.done);
	pid = t_fork(driven_main, &d);
	assert_int_equal(t_gate_wait(&d.ready, 60000), 0);
	for (; nfill < MAX_FILL; nfill++) {
		int fd = shm_sock_connect_nowait(NS, "m");

		if (fd == -EAGAIN)
			break;
		assert_true(fd >= 0);
		fill[nfill] = fd;
	}
	assert_true(nfill < MAX_FILL); /* the queue is full now */
	a = mk("a", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	assert_int_equal(ferry_peer_open(a, "m", &to), 0);

	/* Nobody drives m: the queue stays full past the bound. */
	put_u32(a, to, "x", 0, &v[0], &iov[0], 30 * SEC);
	assert_int_equal(t_wait_one(a, &c, 20 * SEC), -EHOSTUNREACH);

	/* The next PUT calls again; m is driven, empties its queue, answers. */
	put_u32(a, to, "x", 1, &v[1], &iov[1], 30 * SEC);
	t_gate_open(&d.go);
	assert_int_equal(t_wait_one(a, &c, 20 * SEC), 0);
	assert_int_equal(c.user_data, 1);
	t_gate_open(&d.done);
	assert_int_equal(t_reap(pid), 0);
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	assert_int_equal(ferry_engine_destroy(a), 0);
	t_gate_close(&d.ready);
	t_gate_close(&d.go);
	t_gate_close(&d.done);
}

/*
 * Engines destroyed in the middle of handshakes: a's call to a silent
 * listener (its queued PUT ends), b's half-open accepts of silent callers
 * (hung up). No fd is left open, no file behind.
 */
static void test_destroy_mid_handshake(void **state)
{
	char path[SHM_PATH_MAX];
	struct ferry_engine *a, *b;
	struct ferry_peer *to;
	struct ferry_cqe c;
	uint32_t v;
	struct iovec iov;
	int fds_before = count_fds(), lis, silent[5];

	(void)state;
	a = mk("a", FERRY_PROGRESS_THREAD);
	b = mk("b", FERRY_PROGRESS_THREAD);
	assert_non_null(a);
	assert_non_null(b);
	lis = fake_listener("ghost", path, sizeof(path));
	assert_int_equal(ferry_peer_open(a, "ghost", &to), 0);
	put_u32(a, to, "d", 0, &v, &iov, 30 * SEC);
	for (int i = 0; i < 5; i++) {
		silent[i] = shm_sock_connect(NS, "b");
		assert_true(silent[i] >= 0);
	}
	usleep(20000); /* let both engines take them in */
	assert_int_equal(ferry_cq_poll(ferry_cq_default(a), &c, 1), 0); /* still calling */
	assert_int_equal(ferry_engine_destroy(b), 0);
	assert_int_equal(hung_up(silent, 5, 5000), 5);
	assert_int_equal(ferry_engine_destroy(a), 0);
	for (int i = 0; i < 5; i++)
		close(silent[i]);
	close(lis);
	assert_int_equal(unlink(path), 0);
	*strrchr(path, '/') = '\0';
	rmdir(path); /* the namespace directory the listener kept */
	assert_int_equal(count_fds(), fds_before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hung_up_caller_calls_again, setup, teardown),
		cmocka_unit_test_setup_teardown(test_silent_callers_cost_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_silent_caller_flood, setup, teardown),
		cmocka_unit_test_setup_teardown(test_manual_peer_not_driven, setup, teardown),
		cmocka_unit_test_setup_teardown(test_silent_peer_times_out, setup, teardown),
		cmocka_unit_test_setup_teardown(test_full_accept_queue, setup, teardown),
		cmocka_unit_test_setup_teardown(test_destroy_mid_handshake, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/helpers.h - small helpers shared by the cmocka tests.
 *
 * Owns: creating engines with test-sized parameters, submitting one SQE,
 * and waiting for a completion while driving both sides of a loopback pair
 * (MANUAL mode needs every engine driven), a free loopback port for tests
 * that must write one into a configuration, and for tests with real
 * processes: forking a bounded child, its exit status, a one-way "go" pipe
 * (gate), waiting for one completion, and counting what a directory holds
 * (files left behind). Every wait is bounded.
 */
#ifndef FERRY_TEST_HELPERS_H
#define FERRY_TEST_HELPERS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <poll.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "ferry.h"

#define MS 1000000ll
#define SEC 1000000000ll

static inline int64_t t_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

/*
 * Under valgrind (./run test sets FERRY_TEST_VALGRIND), or on a machine as
 * slow (FERRY_TEST_SLOW: the RDMA test guest, emulated by TCG): tests take
 * their smaller sizes and longer bounds.
 */
static inline int t_under_valgrind(void)
{
	return getenv("FERRY_TEST_VALGRIND") != NULL || getenv("FERRY_TEST_SLOW") != NULL;
}

/*
 * params.handshake_ms for tests whose handshakes are not what they test:
 * the default (3 s), or 30 s under valgrind, where a busy machine can take
 * longer than 3 s for one.
 */
static inline uint32_t t_handshake_ms(void)
{
	return t_under_valgrind() ? 30000 : 0;
}

/*
 * Every test program gets a private runtime directory (where engines
 * publish their names on the host), unless FERRY_RUNTIME_DIR is set: test
 * programs run in parallel (ctest -j, other checkouts) and name their
 * engines alike. Children inherit it; the creating process removes it at
 * exit when its engines left it empty.
 */
static char t_rundir[64];
static pid_t t_rundir_owner;

static void t_rundir_remove(void)
{
	if (t_rundir[0] && getpid() == t_rundir_owner)
		rmdir(t_rundir); /* fails, harmlessly, if something is left */
}

__attribute__((constructor)) static void t_private_rundir(void)
{
	/*
	 * No test depends on the machine's GPU: CUDA is off unless a test names
	 * a runtime (the double in tests/cuda_double/, or the real one).
	 */
	setenv("FERRY_CUDA_RUNTIME", "none", 0);
	if (getenv("FERRY_RUNTIME_DIR"))
		return;
	snprintf(t_rundir, sizeof(t_rundir), "/tmp/ferry-t-XXXXXX");
	if (!mkdtemp(t_rundir)) {
		t_rundir[0] = '\0';
		return;
	}
	t_rundir_owner = getpid();
	setenv("FERRY_RUNTIME_DIR", t_rundir, 1);
	atexit(t_rundir_remove);
}

/* t_engine with FERRY_ENGINE_* flags. */
static inline struct ferry_engine *t_engine_flags(const char *name, enum ferry_progress_mode mode,
						  size_t pool_size, uint32_t flags)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "test";
	p.progress = mode;
	p.pool_size = pool_size ? pool_size : (8u << 20);
	p.spin_ns = 20000;
	p.flags = flags;
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	assert_non_null(e);
	return e;
}

static inline struct ferry_engine *t_engine(const char *name, enum ferry_progress_mode mode,
					    size_t pool_size)
{
	return t_engine_flags(name, mode, pool_size, 0);
}

static inline struct ferry_peer *t_peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p = NULL;

	assert_int_equal(ferry_peer_open(e, name, &p), 0);
	return p;
}

static inline struct ferry_sqe *t_sqe(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	sqe = ferry_sq_get_sqe(sq);
	assert_non_null(sqe);
	return sqe;
}

static inline void t_submit(struct ferry_engine *e)
{
	struct ferry_sq *sq = NULL;

	assert_int_equal(ferry_sq_get(e, &sq), 0);
	assert_true(ferry_sq_submit(sq) >= 0);
}

/*
 * Wait up to timeout for one CQE on e's default CQ, driving `other` too
 * (MANUAL mode: the loopback peer must make progress as well). Returns 1
 * with *out filled, or 0 on timeout.
 */
static inline int t_wait_cqe(struct ferry_engine *e, struct ferry_engine *other,
			     struct ferry_cqe *out, int64_t timeout)
{
	int64_t end = t_now() + timeout * (t_under_valgrind() ? 10 : 1);

	do {
		if (other)
			ferry_progress(other);
		/* Short waits: a MANUAL-mode `other` must be driven in between. */
		if (ferry_cq_wait(ferry_cq_default(e), out, 1, other ? 1 * MS : 20 * MS) == 1)
			return 1;
	} while (t_now() < end);
	return 0;
}

/* Wait for the CQE with a given user_data (others are failed on). */
static inline void t_expect(struct ferry_engine *e, struct ferry_engine *other,
			    uint64_t user_data, int res, struct ferry_cqe *out)
{
	struct ferry_cqe c;

	memset(&c, 0, sizeof(c));
	if (!t_wait_cqe(e, other, &c, 5 * SEC))
		fail_msg("no completion for op %llu within 5 s", (unsigned long long)user_data);
	if (c.user_data != user_data || c.res != res)
		fail_msg("op %llu: got user_data %llu res %d (%s), want res %d (%s)",
			 (unsigned long long)user_data, (unsigned long long)c.user_data, c.res,
			 ferry_err_name(c.res), res, ferry_err_name(res));
	if (out)
		*out = c;
}

/* Assert that nothing completes on e within ms milliseconds. */
static inline void t_expect_none(struct ferry_engine *e, struct ferry_engine *other, int ms)
{
	struct ferry_cqe c;

	if (t_wait_cqe(e, other, &c, ms * MS))
		fail_msg("unexpected completion: user_data %llu res %d",
			 (unsigned long long)c.user_data, c.res);
}

/* A one-piece iovec that outlives the op: a rotation through enough of them. */
static inline struct iovec *t_iov_of(const void *data, size_t len)
{
	static __thread struct iovec iovs[512];
	static __thread unsigned next;
	struct iovec *iov = &iovs[next++ % 512];

	iov->iov_base = (void *)data;
	iov->iov_len = len;
	return iov;
}

static inline void t_put(struct ferry_engine *e, struct ferry_peer *to, const char *key,
			 const void *data, size_t len, uint64_t ud, uint32_t flags)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_put(sqe, to, key, t_iov_of(data, len), 1, ud);
	ferry_sqe_set_flags(sqe, flags);
	t_submit(e);
}

/* A GET (FERRY_OP_GET), or with fetch a FETCH (ask the holder for key). */
static inline void t_get_or_fetch(struct ferry_engine *e, bool fetch, struct ferry_peer *from,
				  const char *key, const struct iovec *iov, unsigned n,
				  uint64_t ud, uint32_t flags, uint64_t timeout_ns)
{
	struct ferry_sqe *sqe = t_sqe(e);

	if (fetch)
		ferry_prep_fetch(sqe, from, key, iov, n, ud);
	else
		ferry_prep_get(sqe, from, key, iov, n, ud);
	ferry_sqe_set_flags(sqe, flags);
	ferry_sqe_set_timeout(sqe, timeout_ns);
	t_submit(e);
}

static inline void t_get(struct ferry_engine *e, struct ferry_peer *from, const char *key,
			 const struct iovec *iov, unsigned n, uint64_t ud, uint32_t flags,
			 uint64_t timeout_ns)
{
	t_get_or_fetch(e, false, from, key, iov, n, ud, flags, timeout_ns);
}

/* A PUBLISH (kept here for `to` to fetch): as t_put. */
static inline void t_publish(struct ferry_engine *e, struct ferry_peer *to, const char *key,
			     const void *data, size_t len, uint64_t ud, uint32_t flags)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_publish(sqe, to, key, t_iov_of(data, len), 1, ud);
	ferry_sqe_set_flags(sqe, flags);
	t_submit(e);
}

/* A FETCH (ask the holder for key): as t_get. */
static inline void t_fetch(struct ferry_engine *e, struct ferry_peer *from, const char *key,
			   const struct iovec *iov, unsigned n, uint64_t ud, uint32_t flags,
			   uint64_t timeout_ns)
{
	t_get_or_fetch(e, true, from, key, iov, n, ud, flags, timeout_ns);
}

/* Is port free on loopback right now? */
static inline bool t_port_bindable(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	bool ok;

	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/*
 * A port nobody listens on now, on loopback, below the kernel's ephemeral
 * range (ip_local_port_range): no connection made between this check and
 * the stage's bind can get it as its local port (a port the kernel picked
 * for us could, and once did).
 */
static inline int t_free_tcp_port(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	int lo = 0, hi = 0, span = 8000, start;

	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2)
			lo = 0;
		fclose(f);
	}
	if (lo < 10000 + span)
		lo = 10000 + span; /* an odd range: stay in the registered ports anyway */
	start = (int)(((unsigned)getpid() * 7919u + (unsigned)t_now()) % (unsigned)span);
	for (int i = 0; i < span; i++) {
		int port = lo - span + (start + i) % span;

		if (t_port_bindable(port))
			return port;
	}
	fail_msg("no free port in [%d, %d)", lo - span, lo);
	return -1;
}

/* ------------------------------------------------------------------ */
/* Real processes                                                      */
/* ------------------------------------------------------------------ */

/* Wait for one CQE on e's default CQ, up to timeout ns: its res, or -ETIME when none came. */
static inline int t_wait_one(struct ferry_engine *e, struct ferry_cqe *c, int64_t timeout)
{
	int rc = ferry_cq_wait(ferry_cq_default(e), c, 1, timeout);

	return rc == 1 ? c->res : -ETIME;
}

/*
 * EINTR-safe system calls for tests. A signal (a child's exit, a stop and
 * continue of the whole process group under a debugger or a loaded CI
 * machine, io_uring task work) can interrupt a blocking call even when the
 * test installs no handler, so every helper retries: t_poll keeps its
 * deadline across retries, the others simply call again.
 */
static inline int t_poll(struct pollfd *p, nfds_t n, int ms)
{
	int64_t end = t_now() + (int64_t)ms * MS;

	for (;;) {
		int left = ms < 0 ? -1 : (int)((end - t_now()) / MS);
		int r;

		if (ms >= 0 && left < 0)
			left = 0;
		r = poll(p, n, left);
		if (r >= 0 || errno != EINTR)
			return r;
	}
}

static inline ssize_t t_read(int fd, void *buf, size_t len)
{
	ssize_t r;

	while ((r = read(fd, buf, len)) < 0 && errno == EINTR)
		;
	return r;
}

static inline ssize_t t_write(int fd, const void *buf, size_t len)
{
	ssize_t r;

	while ((r = write(fd, buf, len)) < 0 && errno == EINTR)
		;
	return r;
}

static inline ssize_t t_recv(int fd, void *buf, size_t len, int flags)
{
	ssize_t r;

	while ((r = recv(fd, buf, len, flags)) < 0 && errno == EINTR)
		;
	return r;
}

static inline ssize_t t_send(int fd, const void *buf, size_t len, int flags)
{
	ssize_t r;

	while ((r = send(fd, buf, len, flags)) < 0 && errno == EINTR)
		;
	return r;
}

/* connect(2) on a blocking socket, finished by poll when a signal cut it short. */
static inline int t_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	int err = 0;
	socklen_t elen = sizeof(err);

	if (connect(fd, sa, len) == 0)
		return 0;
	if (errno != EINTR)
		return -1;
	if (t_poll(&p, 1, 10000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) || err) {
		errno = err ? err : ETIMEDOUT;
		return -1;
	}
	return 0;
}

static inline pid_t t_waitpid(pid_t pid, int *st, int options)
{
	pid_t r;

	while ((r = waitpid(pid, st, options)) < 0 && errno == EINTR)
		;
	return r;
}

/* Entries of directory path ("." and ".." aside), or -1 when it cannot be read. */
static inline int t_dir_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Threads of this process, or -1 when they cannot be counted. */
static inline int t_threads(void)
{
	return t_dir_entries("/proc/self/task");
}

/*
 * Fork fn(arg) as a child process (bounded by alarm); its exit status is
 * fn's result. Only from a process with one thread: a child forked beside
 * a live engine's reactor thread inherits every lock that thread held at
 * that instant (ASan's allocator, a log sink's), and hangs on its first
 * use now and then. So fork the children first, then make the engines.
 */
static inline pid_t t_fork(int (*fn)(void *), void *arg)
{
	int threads = t_threads();
	pid_t pid;

	if (threads > 1)
		fail_msg("t_fork with %d threads alive: fork children before making engines", threads);
	pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(t_under_valgrind() ? 600 : 100);
		_exit(fn(arg));
	}
	return pid;
}

/* The exit status of child pid; 128 + the signal when one killed it. */
static inline int t_reap(pid_t pid)
{
	int st = 0;

	assert_int_equal(t_waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

/* Files below dir, recursively (directories themselves not counted); 0 if it is absent. */
static inline int t_count_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		char path[4096];
		struct stat sb;
		int len;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		len = snprintf(path, sizeof(path), "%.2000s/%.255s", dir, de->d_name);
		if (len < 0 || (size_t)len >= sizeof(path))
			continue;
		if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
			n += t_count_files(path);
		else
			n++;
	}
	closedir(d);
	return n;
}

/*
 * A test's own FERRY_RUNTIME_DIR (/tmp/ferry-test-<tag>-XXXXXX into dir),
 * and its alarm: 600 s under valgrind, else seconds. 0, or -1 (no dir).
 */
static inline int t_test_rundir(char *dir, size_t len, const char *tag, unsigned seconds)
{
	snprintf(dir, len, "/tmp/ferry-test-%s-XXXXXX", tag);
	if (!mkdtemp(dir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", dir, 1);
	alarm(t_under_valgrind() ? 600 : seconds);
	return 0;
}

/* The end of such a test: its engines left nothing behind in dir; dir goes. */
static inline int t_test_rundir_end(const char *dir)
{
	alarm(0);
	assert_int_equal(t_count_files(dir), 0);
	rmdir(dir);
	return 0;
}

/* A pipe to say "go" (or "ready") across processes; made before the fork. */
struct t_gate {
	int fd[2];
};

static inline void t_gate_init(struct t_gate *g)
{
	assert_int_equal(pipe2(g->fd, O_NONBLOCK | O_CLOEXEC), 0);
}

static inline void t_gate_open(struct t_gate *g)
{
	char c = 1;

	if (t_write(g->fd[1], &c, 1) != 1)
		abort();
}

/* 0 once the gate was opened (one opening each), -1 after ms without. */
static inline int t_gate_wait(struct t_gate *g, int ms)
{
	struct pollfd p = { .fd = g->fd[0], .events = POLLIN };
	char c;

	if (t_poll(&p, 1, ms) != 1 || t_read(g->fd[0], &c, 1) != 1)
		return -1;
	return 0;
}

static inline void t_gate_close(struct t_gate *g)
{
	close(g->fd[0]);
	close(g->fd[1]);
}

/*
 * A number of e's health JSON: the first "name": after the text of section
 * (e.g. "\"security\":{"); the test fails if either is missing.
 */
static inline long long t_health_num(struct ferry_engine *e, const char *section, const char *name)
{
	static char h[65536];
	char want[64];
	const char *c, *v;

	assert_true(ferry_engine_health(e, h, sizeof(h)) < (int)sizeof(h));
	c = strstr(h, section);
	assert_non_null(c);
	snprintf(want, sizeof(want), "\"%s\":", name);
	v = strstr(c, want);
	assert_non_null(v);
	return atoll(v + strlen(want));
}

/* A socket still open from our side: no EOF or reset read yet (data is read away). */
static inline bool t_still_open(int fd)
{
	char buf[256];

	for (;;) {
		ssize_t r = t_recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (r > 0)
			continue;
		return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
	}
}

/*
 * n silent TCP connections to 127.0.0.1:port, opened at once (non-blocking):
 * fds[] gets them. Then t_silent_all_closed waits, at most ms, until the
 * engine has hung up on each (closing ours): true if it did.
 */
static inline void t_silent_open(int *fds, unsigned n, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

	for (unsigned i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		assert_true(fds[i] >= 0);
		assert_true(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) == 0 ||
			    errno == EINPROGRESS);
	}
}

static inline bool t_silent_all_closed(int *fds, unsigned n, int ms)
{
	int64_t end = t_now() + (int64_t)ms * MS;
	unsigned open_n;

	do {
		open_n = 0;
		for (unsigned i = 0; i < n; i++) {
			if (fds[i] >= 0 && t_still_open(fds[i])) {
				open_n++;
			} else if (fds[i] >= 0) {
				close(fds[i]);
				fds[i] = -1;
			}
		}
		if (open_n)
			usleep(20000);
	} while (open_n && t_now() < end);
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return open_n == 0;
}

/* ------------------------------------------------------------------ */
/* Log lines a test looks for                                          */
/* ------------------------------------------------------------------ */

/*
 * t_log_capture(level): from now on ferry's log lines at or below level
 * are kept (the last 64 KiB, any thread) besides going to stderr when
 * FERRY_LOG is set; t_log_seen(level, a, b) says whether a kept line at
 * exactly that level holds both strings (b may be NULL).
 */
static pthread_mutex_t t_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char t_log_buf[65536];
static size_t t_log_len;

static void t_log_keep(int level, const char *line, void *arg)
{
	size_t n = strlen(line) + 3;

	(void)arg;
	if (getenv("FERRY_LOG"))
		fprintf(stderr, "%s\n", line);
	pthread_mutex_lock(&t_log_lock);
	if (n < sizeof(t_log_buf)) {
		if (t_log_len + n >= sizeof(t_log_buf))
			t_log_len = 0; /* full: start over, the newest lines matter */
		t_log_len += (size_t)snprintf(t_log_buf + t_log_len, sizeof(t_log_buf) - t_log_len,
					      "%d %s\n", level, line);
	}
	pthread_mutex_unlock(&t_log_lock);
}

static inline void t_log_capture(int level)
{
	pthread_mutex_lock(&t_log_lock);
	t_log_len = 0;
	t_log_buf[0] = '\0';
	pthread_mutex_unlock(&t_log_lock);
	ferry_log_set(level, t_log_keep, NULL);
}

static inline bool t_log_seen(int level, const char *a, const char *b)
{
	bool seen = false;
	char *line, *save = NULL, *copy;

	pthread_mutex_lock(&t_log_lock);
	copy = strndup(t_log_buf, t_log_len);
	pthread_mutex_unlock(&t_log_lock);
	if (!copy)
		return false;
	for (line = strtok_r(copy, "\n", &save); line && !seen; line = strtok_r(NULL, "\n", &save))
		seen = atoi(line) == level && strstr(line, a) && (!b || strstr(line, b));
	free(copy);
	return seen;
}

/*
 * t_log_seen, waited for up to ms: a line another thread logs right after
 * the counter the test waited on (a reactor counts, then logs).
 */
static inline bool t_log_wait(int level, const char *a, const char *b, int ms)
{
	int64_t end = t_now() + (int64_t)ms * MS;

	while (!t_log_seen(level, a, b)) {
		if (t_now() > end)
			return false;
		usleep(1000);
	}
	return true;
}

/* ------------------------------------------------------------------ */
/* Running cases apart                                                 */
/* ------------------------------------------------------------------ */

/*
 * Run every case of a cmocka group in a child process of its own (and
 * process group), one after the other: a case that fails (or crashes, or hangs until its
 * alarm) takes its engines, children, sockets and memory with it, so it
 * cannot make a later case fail ("name already live in this namespace").
 * The group's setup and teardown run in each child around its one case.
 * FERRY_TEST_ONLY=GLOB runs only the cases whose names match it (as
 * cmocka_set_test_filter does, e.g. '*peer_leaves*');
 * FERRY_TEST_NOFORK=1 runs the group in this process (for a debugger).
 * A case whose child exits 77 is skipped; when every case is, 77 (skip)
 * is returned for ctest. Otherwise: how many cases failed, as
 * cmocka_run_group_tests returns.
 */
static inline int t_run_cases_apart(const char *group, const struct CMUnitTest *tests, size_t n,
				    CMFixtureFunction setup, CMFixtureFunction teardown)
{
	const char *only = getenv("FERRY_TEST_ONLY");
	unsigned case_alarm = t_under_valgrind() ? 1800 : 400;
	int failed = 0, ran = 0, skipped = 0;

	if (getenv("FERRY_TEST_NOFORK") && !only)
		return _cmocka_run_group_tests(group, tests, n, setup, teardown);
	for (size_t i = 0; i < n; i++) {
		unsigned left;
		pid_t pid;
		int st = 0;

		if (only && fnmatch(only, tests[i].name, 0) != 0)
			continue;
		ran++;
		fflush(stdout);
		fflush(stderr);
		if (getenv("FERRY_TEST_NOFORK")) {
			failed += _cmocka_run_group_tests(group, &tests[i], 1, setup, teardown) != 0;
			continue;
		}
		/* The program's own alarm, if it set one, bounds each case too. */
		left = alarm(0);
		alarm(left);
		pid = fork();
		if (pid < 0) {
			fprintf(stderr, "%s: fork for %s: %s\n", group, tests[i].name, strerror(errno));
			failed++;
			continue;
		}
		if (pid == 0) {
			/* Its own process group: whatever it forks is killed with it. */
			setpgid(0, 0);
			/* A case bounds itself; this is the backstop for one that hangs. */
			alarm(left && left < case_alarm ? left : case_alarm);
			_exit(_cmocka_run_group_tests(group, &tests[i], 1, setup, teardown) ? 1 : 0);
		}
		if (t_waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
			skipped++; /* the case (or the group's setup) said it cannot run here */
		} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			failed++;
			if (WIFSIGNALED(st))
				printf("[  FAILED  ] %s: killed by signal %d (%s)\n", tests[i].name,
				       WTERMSIG(st), strsignal(WTERMSIG(st)));
			else
				printf("[  FAILED  ] %s: exit %d\n", tests[i].name,
				       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		}
		/* Whatever the case's children left running goes with it. */
		kill(-pid, SIGKILL);
	}
	printf("[==========] %s: %d case(s) run apart, %d failed, %d skipped\n", group, ran, failed,
	       skipped);
	if (only && ran == 0) {
		printf("[  FAILED  ] no case matches FERRY_TEST_ONLY=%s\n", only);
		return 1;
	}
	if (failed == 0 && ran > 0 && skipped == ran)
		return 77; /* ctest's SKIP_RETURN_CODE: nothing could run here */
	return failed;
}

#define t_run_group_apart(tests, setup, teardown)                                              \
	t_run_cases_apart(program_invocation_short_name, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

#endif

/*
 * tests/test_shm_sock.c - the shm transport's names, sockets and hello
 * (backends/shm/shm_sock.c): a handshake with a forked child that hands over
 * a memfd and an eventfd, -EADDRINUSE for a live name (same process and
 * another), processes racing for one name while another sweeps, and taking
 * and giving it back in a loop (never two owners), leftovers of SIGKILLed
 * engines removed by the next listen and by the sweep, file and directory modes and a clean directory afterwards,
 * unsafe runtime directories refused, another uid refused (as root), name
 * and path limits, and malformed hellos (each with its error and no fd
 * leaked), random garbage, and a timeout.
 *
 * Every test runs in a fresh FERRY_RUNTIME_DIR (mkdtemp) and bounds its own
 * time with alarm(); forked children bound theirs too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "shm_sock.h"

#define NS "t"

static char tmpdir[64];

/* ------------------------------------------------------------------ */
/* Log capture                                                          */
/* ------------------------------------------------------------------ */

static char logbuf[8192];

static void log_cb(int level, const char *line, void *arg)
{
	size_t n = strlen(logbuf);

	(void)level;
	(void)arg;
	snprintf(logbuf + n, sizeof(logbuf) - n, "%s\n", line);
}

static void log_reset(void)
{
	logbuf[0] = '\0';
}

static void log_expect(const char *a, const char *b)
{
	if (!strstr(logbuf, a) || (b && !strstr(logbuf, b)))
		fail_msg("log lacks '%s'%s%s; log was:\n%s", a, b ? " / " : "", b ? b : "",
			 logbuf);
}

/* ------------------------------------------------------------------ */
/* Fixture                                                              */
/* ------------------------------------------------------------------ */

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	chmod(p, 0700);
	return remove(p) < 0 && errno != ENOENT ? -1 : 0;
}

static void rm_rf(const char *p)
{
	nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state)
{
	(void)state;
	alarm(t_under_valgrind() ? 300 : 30);
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-shmt-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", tmpdir, 1);
	log_reset();
	ferry_log_set(FERRY_LOG_DEBUG, log_cb, NULL);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	ferry_log_set(-1, NULL, NULL);
	rm_rf(tmpdir);
	unsetenv("FERRY_RUNTIME_DIR");
	alarm(0);
	return 0;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

static void path_of(char *buf, size_t len, const char *name, const char *ext)
{
	snprintf(buf, len, "%s/%s/%s.%s", tmpdir, NS, name, ext);
}

static int exists(const char *p)
{
	struct stat st;

	return lstat(p, &st) == 0;
}

/* Entries in dir other than . and .. (-1 if it does not exist). */
static int dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void fill_hello(struct shm_hello *h, const char *name)
{
	memset(h, 0, sizeof(*h));
	h->magic = SHM_MAGIC;
	h->version = SHM_VERSION;
	h->size = sizeof(*h);
	strcpy(h->ns, NS);
	strcpy(h->name, name);
	h->pool_size = 1 << 20;
	h->ring_entries = 256;
	h->ring_bytes = 4096;
	h->cookie = 0x1234567890abcdefull;
}

/* Accept with a bound: poll the listener, then shm_sock_accept. */
static int accept_within(int lfd, int ms)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (t_poll(&p, 1, ms) != 1)
		return -ETIMEDOUT;
	return shm_sock_accept(lfd);
}

static int wait_child(pid_t pid)
{
	int st = 0;

	if (t_waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* A child that listens on name, says 'L' on tell, then waits for a byte. */
static pid_t listener_child(const char *name, int *tell_rd, int *go_wr)
{
	int tell[2], go[2];
	pid_t pid;

	assert_int_equal(pipe2(tell, O_CLOEXEC), 0);
	assert_int_equal(pipe2(go, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct shm_listener l;
		char c = 'L';

		alarm(60);
		close(tell[0]);
		close(go[1]);
		if (shm_sock_listen(NS, name, &l) < 0)
			c = 'F';
		if (t_write(tell[1], &c, 1) != 1)
			_exit(2);
		if (t_read(go[0], &c, 1) != 1)
			_exit(3); /* parent gone or SIGKILL expected */
		shm_sock_unlisten(&l);
		_exit(0);
	}
	close(tell[1]);
	close(go[0]);
	*tell_rd = tell[0];
	*go_wr = go[1];
	{
		char c = 0;

		assert_int_equal(t_read(tell[0], &c, 1), 1);
		assert_int_equal(c, 'L');
	}
	return pid;
}

/* ------------------------------------------------------------------ */
/* Handshake between processes                                          */
/* ------------------------------------------------------------------ */

#define POOL_BYTES 65536

static int child_side(void)
{
	struct shm_hello h, mine;
	int fds[SHM_MAX_FDS];
	unsigned nfds = SHM_MAX_FDS;
	uint64_t one = 7;
	char *p;
	int s, rc;

	alarm(60);
	s = shm_sock_connect(NS, "server");
	if (s < 0)
		return 10;
	rc = shm_sock_recv_hello(s, &h, fds, &nfds, 10000);
	if (rc < 0)
		return 11;
	if (nfds != 2 || h.nfds != 2 || strcmp(h.name, "server") || strcmp(h.ns, NS) ||
	    h.pool_size != POOL_BYTES || h.ring_entries != 256 || h.cookie != 0x1234567890abcdefull)
		return 12;
	if (!(fcntl(fds[0], F_GETFD) & FD_CLOEXEC) || !(fcntl(fds[1], F_GETFD) & FD_CLOEXEC))
		return 13;
	p = mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p == MAP_FAILED)
		return 14;
	for (int i = 0; i < POOL_BYTES; i += 4096)
		if (p[i] != (char)(i / 4096 + 1))
			return 15;
	memcpy(p + 100, "pong", 5);
	munmap(p, POOL_BYTES);
	fill_hello(&mine, "client");
	if (shm_sock_send_hello(s, &mine, NULL, 0) < 0)
		return 16;
	if (t_write(fds[1], &one, sizeof(one)) != sizeof(one))
		return 17;
	close(fds[0]);
	close(fds[1]);
	close(s);
	return 0;
}

static void test_handshake_with_child(void **state)
{
	struct shm_listener l;
	struct shm_hello h, back;
	int memfd, efd, lfd, c, fds[SHM_MAX_FDS];
	uint64_t v = 0;
	char *p;
	pid_t pid;
	int fd0;

	(void)state;
	fd0 = count_fds();
	lfd = shm_sock_listen(NS, "server", &l);
	assert_true(lfd >= 0);
	assert_int_equal(lfd, l.fd);
	assert_int_equal(shm_sock_accept(lfd), -EAGAIN);

	memfd = memfd_create("ferry-test-pool", MFD_CLOEXEC);
	assert_true(memfd >= 0);
	assert_int_equal(ftruncate(memfd, POOL_BYTES), 0);
	p = mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	assert_true(p != MAP_FAILED);
	for (int i = 0; i < POOL_BYTES; i += 4096)
		p[i] = (char)(i / 4096 + 1);
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	assert_true(efd >= 0);

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(child_side());

	c = accept_within(lfd, 10000);
	assert_true(c >= 0);
	assert_true(fcntl(c, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(c, F_GETFD) & FD_CLOEXEC);
	fill_hello(&h, "server");
	h.pool_size = POOL_BYTES;
	h.nfds = 99; /* send_hello sets it */
	fds[0] = memfd;
	fds[1] = efd;
	assert_int_equal(shm_sock_send_hello(c, &h, fds, 2), 0);
	assert_int_equal(shm_sock_recv_hello(c, &back, NULL, &(unsigned){ 0 }, 10000), 0);
	assert_string_equal(back.name, "client");
	assert_int_equal(back.nfds, 0);

	/* The child rings our eventfd after writing into our pool. */
	{
		struct pollfd pf = { .fd = efd, .events = POLLIN };

		assert_int_equal(t_poll(&pf, 1, 10000), 1);
		assert_int_equal(t_read(efd, &v, sizeof(v)), sizeof(v));
		assert_int_equal(v, 7);
	}
	assert_string_equal(p + 100, "pong");
	assert_int_equal(wait_child(pid), 0);

	munmap(p, POOL_BYTES);
	close(memfd);
	close(efd);
	close(c);
	shm_sock_unlisten(&l);
	assert_int_equal(l.fd, -1);
	assert_int_equal(count_fds(), fd0);
	assert_int_equal(dir_entries(tmpdir), 0);
}

/* ------------------------------------------------------------------ */
/* Names                                                                */
/* ------------------------------------------------------------------ */

static void test_addrinuse_same_process(void **state)
{
	struct shm_listener a, b;

	(void)state;
	assert_true(shm_sock_listen(NS, "eng", &a) >= 0);
	log_reset();
	assert_int_equal(shm_sock_listen(NS, "eng", &b), -EADDRINUSE);
	log_expect("'eng'", "'" NS "'");
	assert_int_equal(b.fd, -1);
	assert_int_equal(b.live, 0);
	shm_sock_unlisten(&b); /* holds nothing: must not touch a's files */
	{
		char p[256];

		path_of(p, sizeof(p), "eng", "sock");
		assert_true(exists(p));
	}
	/* Same name elsewhere, another name here: both fine. */
	assert_true(shm_sock_listen("other", "eng", &b) >= 0);
	shm_sock_unlisten(&b);
	assert_true(shm_sock_listen(NS, "eng2", &b) >= 0);
	shm_sock_unlisten(&b);
	shm_sock_unlisten(&a);
	assert_true(shm_sock_listen(NS, "eng", &a) >= 0);
	shm_sock_unlisten(&a);
	shm_sock_unlisten(&a); /* twice: harmless */
}

static void test_addrinuse_other_process(void **state)
{
	struct shm_listener l;
	int rd, wr, s;
	pid_t pid;

	(void)state;
	pid = listener_child("busy", &rd, &wr);
	log_reset();
	assert_int_equal(shm_sock_listen(NS, "busy", &l), -EADDRINUSE);
	log_expect("'busy'", "'" NS "'");
	/* It is live: we can reach it. */
	s = shm_sock_connect(NS, "busy");
	assert_true(s >= 0);
	close(s);
	assert_int_equal(t_write(wr, "x", 1), 1);
	assert_int_equal(wait_child(pid), 0);
	close(rd);
	close(wr);
	assert_int_equal(shm_sock_connect(NS, "busy"), -EHOSTUNREACH);
	assert_true(shm_sock_listen(NS, "busy", &l) >= 0);
	shm_sock_unlisten(&l);
	assert_int_equal(dir_entries(tmpdir), 0);
}

/*
 * Several processes take one name at once while another sweeps: exactly
 * one wins each round, the others get -EADDRINUSE, the sweep never removes
 * the winner's files, and the name is free again once the winner is gone.
 */
static void test_listen_race(void **state)
{
	enum { RACERS = 4 };
	int rounds = t_under_valgrind() ? 3 : 20;

	(void)state;
	for (int r = 0; r < rounds; r++) {
		int start[2], res[2], hold[2], won = 0, busy = 0, s;
		pid_t kids[RACERS + 1];
		char p[256];

		assert_int_equal(pipe2(start, O_CLOEXEC), 0);
		assert_int_equal(pipe2(res, O_CLOEXEC), 0);
		assert_int_equal(pipe2(hold, O_CLOEXEC), 0);
		for (int i = 0; i <= RACERS; i++) {
			kids[i] = fork();
			assert_true(kids[i] >= 0);
			if (kids[i] == 0) {
				struct shm_listener l;
				char c;
				int rc;

				alarm(60);
				ferry_log_set(-1, NULL, NULL);
				close(start[1]);
				close(res[0]);
				close(hold[1]);
				(void)!t_read(start[0], &c, 1); /* EOF: go */
				if (i == RACERS) { /* the sweeper */
					for (int k = 0; k < 50; k++)
						if (shm_sock_sweep(NS) < 0)
							_exit(1);
					_exit(0);
				}
				rc = shm_sock_listen(NS, "race", &l);
				c = rc >= 0 ? 'L' : rc == -EADDRINUSE ? 'U' : (char)-rc;
				if (t_write(res[1], &c, 1) != 1)
					_exit(2);
				(void)!t_read(hold[0], &c, 1); /* EOF: done */
				shm_sock_unlisten(&l);
				_exit(0);
			}
		}
		close(start[0]);
		close(res[1]);
		close(hold[0]);
		close(start[1]); /* release them all */
		for (int i = 0; i < RACERS; i++) {
			char c = 0;

			assert_int_equal(t_read(res[0], &c, 1), 1);
			if (c == 'L')
				won++;
			else if (c == 'U')
				busy++;
			else
				fail_msg("round %d: a racer got neither a name nor EADDRINUSE: %s",
					 r, strerror(c));
		}
		assert_int_equal(won, 1);
		assert_int_equal(busy, RACERS - 1);
		assert_int_equal(wait_child(kids[RACERS]), 0); /* the sweeper is done */
		path_of(p, sizeof(p), "race", "sock");
		assert_true(exists(p));
		s = shm_sock_connect(NS, "race");
		assert_true(s >= 0);
		close(s);
		close(hold[1]);
		for (int i = 0; i < RACERS; i++)
			assert_int_equal(wait_child(kids[i]), 0);
		close(res[0]);
		assert_int_equal(dir_entries(tmpdir), 0);
	}
}

/*
 * Processes take and give back one name in a loop: never two owners at
 * once (an O_EXCL marker file), and an owner's socket file is never removed
 * by the previous owner's unlisten.
 */
static int churn(const char *marker, int iters)
{
	int wins = 0;

	alarm(120);
	ferry_log_set(getenv("T_CHURN_LOG") ? FERRY_LOG_ERROR : -1, NULL, NULL);
	for (int i = 0; i < iters; i++) {
		struct shm_listener l;
		struct stat a, b;
		int rc = shm_sock_listen(NS, "churn", &l), m;

		if (rc == -EADDRINUSE)
			continue;
		if (rc < 0)
			return -rc < 100 ? 100 - rc : 1; /* 100 + errno */
		wins++;
		m = open(marker, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
		if (m < 0)
			return 2; /* someone else owns the name too */
		close(m);
		if (lstat(l.path, &a) < 0)
			return 3;
		usleep(50);
		if (lstat(l.path, &b) < 0 || a.st_ino != b.st_ino)
			return 4; /* our socket file was taken away */
		unlink(marker);
		shm_sock_unlisten(&l);
	}
	return wins ? 0 : 5;
}

static void test_listen_churn(void **state)
{
	enum { KIDS = 3 };
	int iters = t_under_valgrind() ? 30 : 400;
	char marker[256];
	pid_t kids[KIDS];

	(void)state;
	snprintf(marker, sizeof(marker), "%s/owner", tmpdir);
	for (int i = 0; i < KIDS; i++) {
		kids[i] = fork();
		assert_true(kids[i] >= 0);
		if (kids[i] == 0)
			_exit(churn(marker, iters));
	}
	for (int i = 0; i < KIDS; i++) {
		int rc = wait_child(kids[i]);

		if (rc != 0 && rc != 5) /* 5: never won, possible on a busy host */
			fail_msg("churner %d exited with %d (2: two owners, 4: socket removed, "
				 "100 + errno: listen failed)",
				 i, rc);
	}
	assert_int_equal(dir_entries(tmpdir), 0);
}

static pid_t killed_child(const char *name)
{
	int rd, wr;
	pid_t pid = listener_child(name, &rd, &wr);

	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(wait_child(pid), 128 + SIGKILL);
	close(rd);
	close(wr);
	return pid;
}

static void test_crash_leftover_next_listen(void **state)
{
	struct shm_listener l;
	char sock[256], lock[256];
	int s, c;

	(void)state;
	killed_child("dead");
	path_of(sock, sizeof(sock), "dead", "sock");
	path_of(lock, sizeof(lock), "dead", "lock");
	assert_true(exists(sock));
	assert_true(exists(lock));
	assert_int_equal(shm_sock_connect(NS, "dead"), -EHOSTUNREACH);

	assert_true(shm_sock_listen(NS, "dead", &l) >= 0);
	s = shm_sock_connect(NS, "dead");
	assert_true(s >= 0);
	c = accept_within(l.fd, 5000);
	assert_true(c >= 0);
	close(c);
	close(s);
	shm_sock_unlisten(&l);
	assert_false(exists(sock));
	assert_false(exists(lock));
	assert_int_equal(dir_entries(tmpdir), 0);
}

static void test_crash_leftover_sweep(void **state)
{
	char p[256], q[256];
	struct sockaddr_un sa;
	int rd, wr, s;
	pid_t alive;

	(void)state;
	assert_int_equal(shm_sock_sweep(NS), 0); /* no directory yet */
	killed_child("dead1");
	killed_child("dead2");
	alive = listener_child("alive", &rd, &wr);

	/* A socket file with no lock file at all (crash between the two). */
	path_of(p, sizeof(p), "stray", "sock");
	s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	strcpy(sa.sun_path, p);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(s);
	/* Files that are not ours stay. */
	path_of(q, sizeof(q), "notes", "txt");
	close(open(q, O_CREAT | O_WRONLY, 0600));

	assert_int_equal(shm_sock_sweep(NS), 5);
	assert_false(exists(p));
	path_of(p, sizeof(p), "dead1", "sock");
	assert_false(exists(p));
	path_of(p, sizeof(p), "dead2", "lock");
	assert_false(exists(p));
	path_of(p, sizeof(p), "alive", "sock");
	assert_true(exists(p));
	path_of(p, sizeof(p), "alive", "lock");
	assert_true(exists(p));
	assert_true(exists(q));
	assert_int_equal(shm_sock_sweep(NS), 0);
	s = shm_sock_connect(NS, "alive");
	assert_true(s >= 0);
	close(s);

	assert_int_equal(t_write(wr, "x", 1), 1);
	assert_int_equal(wait_child(alive), 0);
	close(rd);
	close(wr);
	unlink(q);
	assert_int_equal(shm_sock_sweep(NS), 0);
	assert_int_equal(dir_entries(tmpdir), 0); /* the empty namespace went too */
}

static void test_modes_and_nothing_left(void **state)
{
	struct shm_listener l;
	char ns_dir[256];
	struct stat st;
	mode_t old;
	int fd0 = count_fds();

	(void)state;
	/* A permissive umask must not widen anything; a strict one not narrow. */
	old = umask(0);
	snprintf(ns_dir, sizeof(ns_dir), "%s/sub", tmpdir);
	setenv("FERRY_RUNTIME_DIR", ns_dir, 1); /* created by listen */
	assert_true(shm_sock_listen(NS, "m", &l) >= 0);
	umask(old);

	assert_int_equal(lstat(ns_dir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	snprintf(ns_dir, sizeof(ns_dir), "%s/sub/%s", tmpdir, NS);
	assert_int_equal(lstat(ns_dir, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0700);
	assert_int_equal(lstat(l.path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(lstat(l.lock_path, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_true(fcntl(l.fd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(l.fd, F_GETFD) & FD_CLOEXEC);
	assert_true(fcntl(l.lock_fd, F_GETFD) & FD_CLOEXEC);
	{
		char p[SHM_PATH_MAX];

		assert_int_equal(shm_sock_path(NS, "m", p, sizeof(p)), 0);
		assert_string_equal(p, l.path);
	}

	old = umask(0777);
	{
		struct shm_listener l2;
		char d2[256];

		/* A new namespace directory and files under umask 0777. */
		assert_true(shm_sock_listen("u", "m2", &l2) >= 0);
		snprintf(d2, sizeof(d2), "%s/sub/u", tmpdir);
		assert_int_equal(lstat(d2, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0700);
		assert_int_equal(lstat(l2.path, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0600);
		assert_int_equal(lstat(l2.lock_path, &st), 0);
		assert_int_equal(st.st_mode & 07777, 0600);
		shm_sock_unlisten(&l2);
		assert_false(exists(d2));
	}
	umask(old);

	shm_sock_unlisten(&l);
	assert_false(exists(ns_dir));
	snprintf(ns_dir, sizeof(ns_dir), "%s/sub", tmpdir);
	assert_int_equal(dir_entries(ns_dir), 0);
	assert_int_equal(count_fds(), fd0);
	{
		struct shm_listener z;

		memset(&z, 0, sizeof(z));
		shm_sock_unlisten(&z); /* zeroed: holds nothing, closes nothing */
		shm_sock_unlisten(NULL);
		assert_int_equal(count_fds(), fd0);
	}
}

static void test_unsafe_runtime_dir_refused(void **state)
{
	struct shm_listener l;
	char d[128], link[512];

	(void)state;
	snprintf(d, sizeof(d), "%s/open", tmpdir);
	assert_int_equal(mkdir(d, 0700), 0);
	assert_int_equal(chmod(d, 0777), 0);
	setenv("FERRY_RUNTIME_DIR", d, 1);
	log_reset();
	assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);
	log_expect(d, "0777");
	assert_int_equal(shm_sock_connect(NS, "x"), -EPERM);
	assert_int_equal(shm_sock_sweep(NS), -EPERM);
	assert_int_equal(dir_entries(d), 0);

	assert_int_equal(chmod(d, 0750), 0); /* group only: still refused */
	assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);

	/* A symlink to a good directory is refused (it could be swapped). */
	assert_int_equal(chmod(d, 0700), 0);
	snprintf(link, sizeof(link), "%s/link", tmpdir);
	assert_int_equal(symlink(d, link), 0);
	setenv("FERRY_RUNTIME_DIR", link, 1);
	assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);

	/* A file where the directory should be. */
	snprintf(link, sizeof(link), "%s/file", tmpdir);
	close(open(link, O_CREAT | O_WRONLY, 0600));
	setenv("FERRY_RUNTIME_DIR", link, 1);
	assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);

	/* An unsafe namespace directory inside a good runtime directory. */
	setenv("FERRY_RUNTIME_DIR", d, 1);
	snprintf(link, sizeof(link), "%s/%s", d, NS);
	assert_int_equal(mkdir(link, 0700), 0);
	assert_int_equal(chmod(link, 0755), 0);
	assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);
	assert_int_equal(chmod(link, 0700), 0);
	assert_true(shm_sock_listen(NS, "x", &l) >= 0);
	shm_sock_unlisten(&l);

	if (geteuid() == 0) {
		/* Owned by someone else. */
		assert_int_equal(chown(d, 65534, 65534), 0);
		assert_int_equal(shm_sock_listen(NS, "x", &l), -EPERM);
		log_expect("owned by uid 65534", NULL);
	}
}

static void test_default_runtime_dir(void **state)
{
	char xdg[128], buf[SHM_PATH_MAX], want[512];
	const char *old = getenv("XDG_RUNTIME_DIR");
	char *saved = old ? strdup(old) : NULL;
	int rc;

	(void)state;
	unsetenv("FERRY_RUNTIME_DIR");
	snprintf(xdg, sizeof(xdg), "%s/xdg", tmpdir);
	assert_int_equal(mkdir(xdg, 0700), 0);
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	assert_int_equal(shm_sock_runtime_dir(buf, sizeof(buf), 1), 0);
	snprintf(want, sizeof(want), "%s/ferry", xdg);
	assert_string_equal(buf, want);
	assert_int_equal(dir_entries(want), 0);
	assert_int_equal(shm_sock_path(NS, "e", buf, sizeof(buf)), 0);
	snprintf(want, sizeof(want), "%s/ferry/%s/e.sock", xdg, NS);
	assert_string_equal(buf, want);

	/* An XDG directory others may enter is not used: /tmp/ferry-<uid>. */
	assert_int_equal(chmod(xdg, 0755), 0);
	rc = shm_sock_path(NS, "e", buf, sizeof(buf));
	snprintf(want, sizeof(want), "/tmp/ferry-%u/%s/e.sock", (unsigned)geteuid(), NS);
	if (rc == 0)
		assert_string_equal(buf, want);
	else
		assert_int_equal(rc, -EPERM); /* a bad /tmp/ferry-<uid> on this host */
	unsetenv("XDG_RUNTIME_DIR");
	rc = shm_sock_path(NS, "e", buf, sizeof(buf));
	if (rc == 0)
		assert_string_equal(buf, want);

	if (saved)
		setenv("XDG_RUNTIME_DIR", saved, 1);
	free(saved);
	setenv("FERRY_RUNTIME_DIR", tmpdir, 1);
}

static void test_bad_names_and_long_paths(void **state)
{
	struct shm_listener l;
	char longname[FERRY_NAME_MAX + 1], deep[256], buf[SHM_PATH_MAX];
	const char *bad[] = { "", ".", "..", "a/b", "a b", "sp\n", "ünï" };

	(void)state;
	memset(longname, 'a', FERRY_NAME_MAX);
	longname[FERRY_NAME_MAX] = '\0';
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(shm_sock_listen(NS, bad[i], &l), -EINVAL);
		assert_int_equal(shm_sock_listen(bad[i], "ok", &l), -EINVAL);
		assert_int_equal(shm_sock_connect(NS, bad[i]), -EINVAL);
		assert_int_equal(shm_sock_sweep(bad[i]), -EINVAL);
	}
	assert_int_equal(shm_sock_listen(NS, longname, &l), -EINVAL);
	assert_int_equal(shm_sock_listen(NULL, "x", &l), -EINVAL);
	assert_int_equal(shm_sock_listen(NS, NULL, &l), -EINVAL);
	assert_int_equal(shm_sock_listen(NS, "x", NULL), -EINVAL);
	assert_int_equal(shm_sock_connect(NULL, NULL), -EINVAL);
	assert_int_equal(shm_sock_path(NS, "x", NULL, 0), -EINVAL);
	assert_int_equal(shm_sock_path(NS, "x", buf, 4), -ENAMETOOLONG);
	longname[FERRY_NAME_MAX - 1] = '\0'; /* 63: a valid name */
	assert_true(shm_name_valid(longname));
	assert_true(shm_name_valid("a.b_c:d-E9"));

	/* The socket path must fit sun_path (107 characters). */
	snprintf(deep, sizeof(deep), "%s/%060d", tmpdir, 0);
	assert_int_equal(mkdir(deep, 0700), 0);
	setenv("FERRY_RUNTIME_DIR", deep, 1);
	log_reset();
	assert_int_equal(shm_sock_listen(NS, longname, &l), -ENAMETOOLONG);
	log_expect("does not fit", NULL);
	assert_int_equal(shm_sock_connect(NS, longname), -ENAMETOOLONG);
	assert_int_equal(dir_entries(deep), 0);
	assert_true(shm_sock_listen(NS, "short", &l) >= 0);
	shm_sock_unlisten(&l);
	setenv("FERRY_RUNTIME_DIR", tmpdir, 1);
}

/* ------------------------------------------------------------------ */
/* Another user                                                         */
/* ------------------------------------------------------------------ */

static int become_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		return -1;
	return 0;
}

static void test_other_uid_refused(void **state)
{
	struct shm_listener l;
	int lfd, c, rc;
	pid_t pid;

	(void)state;
	if (geteuid() != 0) {
		print_message("[ SKIPPED  ] needs root to run a peer as another uid "
			      "(setresuid 65534); not root here\n");
		skip();
	}
	lfd = shm_sock_listen(NS, "root-eng", &l);
	assert_true(lfd >= 0);

	/* 1. Through the API: the directory (0700, ours) stops it: -EPERM. */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(30);
		ferry_log_set(-1, NULL, NULL);
		if (become_nobody() < 0)
			_exit(77);
		_exit(shm_sock_connect(NS, "root-eng") == -EPERM ? 0 : 1);
	}
	rc = wait_child(pid);
	if (rc == 77) {
		shm_sock_unlisten(&l);
		print_message("[ SKIPPED  ] setresuid(65534) not permitted here\n");
		skip();
	}
	assert_int_equal(rc, 0);
	assert_int_equal(shm_sock_accept(lfd), -EAGAIN); /* nobody got through */

	/*
	 * 2. With the file modes opened up, the kernel lets it connect; the
	 * accept side's SO_PEERCRED check must refuse it.
	 */
	assert_int_equal(chmod(tmpdir, 0711), 0);
	{
		char d[256];

		snprintf(d, sizeof(d), "%s/%s", tmpdir, NS);
		assert_int_equal(chmod(d, 0711), 0);
	}
	assert_int_equal(chmod(l.path, 0666), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct sockaddr_un sa;
		int s;
		char b;

		alarm(30);
		if (become_nobody() < 0)
			_exit(77);
		s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		strcpy(sa.sun_path, l.path);
		if (t_connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(2);
		/* The server must hang up on us. */
		_exit(t_recv(s, &b, 1, 0) == 0 ? 0 : 3);
	}
	log_reset();
	c = accept_within(lfd, 10000);
	assert_int_equal(c, -EPERM);
	log_expect("uid 65534", NULL);
	assert_int_equal(wait_child(pid), 0);
	assert_int_equal(chmod(tmpdir, 0700), 0);
	shm_sock_unlisten(&l);

	/* Same uid on a socketpair: fine. */
	{
		int sv[2];

		assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
		assert_int_equal(shm_sock_peer_ok(sv[0]), 0);
		close(sv[0]);
		close(sv[1]);
	}
	assert_int_equal(shm_sock_peer_ok(-1), -EBADF);
	assert_int_equal(shm_sock_accept(-1), -EBADF);
}

/* ------------------------------------------------------------------ */
/* Malformed hellos                                                     */
/* ------------------------------------------------------------------ */

/* Send raw bytes with nfd fresh eventfds attached (closed here after). */
static void raw_send(int s, const void *buf, size_t len, unsigned nfd)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr a;
	} ctl;
	struct iovec iov = { (void *)buf, len };
	struct msghdr m;
	int fds[8];

	assert_true(nfd <= 8);
	memset(&m, 0, sizeof(m));
	memset(&ctl, 0, sizeof(ctl));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	for (unsigned i = 0; i < nfd; i++) {
		fds[i] = eventfd(0, EFD_CLOEXEC);
		assert_true(fds[i] >= 0);
	}
	if (nfd) {
		struct cmsghdr *c;

		m.msg_control = ctl.b;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfd);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfd);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfd);
	}
	assert_int_equal(sendmsg(s, &m, MSG_NOSIGNAL), (ssize_t)len);
	for (unsigned i = 0; i < nfd; i++)
		close(fds[i]);
}

/* recv on a fresh pair after raw_send; checks result, no leak, zeroed out. */
static void expect_recv(const void *buf, size_t len, unsigned nfd, int want, const char *what)
{
	int sv[2], fds[SHM_MAX_FDS] = { -1, -1, -1, -1 }, before, rc;
	unsigned n = SHM_MAX_FDS;
	struct shm_hello h;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	before = count_fds();
	raw_send(sv[1], buf, len, nfd);
	memset(&h, 0x5a, sizeof(h));
	rc = shm_sock_recv_hello(sv[0], &h, fds, &n, 2000);
	if (rc != want)
		fail_msg("%s: got %d (%s), want %d (%s)", what, rc, strerror(-rc), want,
			 strerror(-want));
	if (rc == 0) {
		assert_int_equal(n, nfd);
		for (unsigned i = 0; i < n; i++)
			close(fds[i]);
	} else {
		static const struct shm_hello zero;

		assert_int_equal(n, 0);
		assert_memory_equal(&h, &zero, sizeof(h));
		for (unsigned i = 0; i < SHM_MAX_FDS; i++)
			assert_int_equal(fds[i], -1);
	}
	if (count_fds() != before)
		fail_msg("%s: %d fds before, %d after", what, before, count_fds());
	close(sv[0]);
	close(sv[1]);
}

static void test_malformed_hellos(void **state)
{
	struct shm_hello h;
	unsigned char big[sizeof(h) + 100], junk[sizeof(h)];
	int fd0 = count_fds();

	(void)state;
	/* The control: a good hello with 0..4 fds passes. */
	for (unsigned n = 0; n <= SHM_MAX_FDS; n++) {
		fill_hello(&h, "peer");
		h.nfds = n;
		expect_recv(&h, sizeof(h), n, 0, "valid");
	}

	expect_recv("abcd", 4, 0, -EPROTO, "short");
	expect_recv("", 0, 0, -EPROTO, "empty");
	fill_hello(&h, "peer");
	h.nfds = 1;
	expect_recv(&h, 7, 1, -EPROTO, "short with an fd");

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (unsigned char)(i * 37 + 11);
	expect_recv(junk, sizeof(junk), 0, -EPROTO, "garbage");
	expect_recv(junk, sizeof(junk), 2, -EPROTO, "garbage with fds");

	fill_hello(&h, "peer");
	h.magic ^= 1;
	expect_recv(&h, sizeof(h), 0, -EPROTO, "wrong magic");

	fill_hello(&h, "peer");
	h.version = SHM_VERSION + 1;
	log_reset();
	expect_recv(&h, sizeof(h), 0, -EPROTONOSUPPORT, "wrong version");
	{
		char theirs[32], ours[32];

		snprintf(theirs, sizeof(theirs), "version %u", SHM_VERSION + 1);
		snprintf(ours, sizeof(ours), "version %u", SHM_VERSION);
		log_expect(theirs, ours);
	}
	h.version = 0;
	h.nfds = 1;
	expect_recv(&h, 12, 1, -EPROTONOSUPPORT, "old version, short, an fd");

	fill_hello(&h, "peer");
	h.size = sizeof(h) - 8;
	expect_recv(&h, sizeof(h), 0, -EPROTO, "size field");

	fill_hello(&h, "peer");
	h.nfds = 2;
	expect_recv(&h, sizeof(h), 1, -EPROTO, "claims 2, sends 1");
	expect_recv(&h, sizeof(h), 3, -EPROTO, "claims 2, sends 3");
	expect_recv(&h, sizeof(h), 0, -EPROTO, "claims 2, sends 0");
	h.nfds = 0;
	expect_recv(&h, sizeof(h), 2, -EPROTO, "claims 0, sends 2");
	h.nfds = 5;
	expect_recv(&h, sizeof(h), 5, -EPROTO, "5 fds (more than SHM_MAX_FDS)");
	h.nfds = SHM_MAX_FDS; /* 4 fit, the 5th truncates the control data */
	expect_recv(&h, sizeof(h), SHM_MAX_FDS + 1, -EPROTO, "claims 4, sends 5");
	h.nfds = 8;
	expect_recv(&h, sizeof(h), 8, -EPROTO, "8 fds");
	h.nfds = 0xffffffffu;
	expect_recv(&h, sizeof(h), 4, -EPROTO, "claims 2^32-1");

	fill_hello(&h, "peer");
	memset(h.name, 'a', sizeof(h.name));
	expect_recv(&h, sizeof(h), 0, -EPROTO, "name not terminated");
	fill_hello(&h, "peer");
	h.nfds = 1;
	memset(h.ns, 'n', sizeof(h.ns));
	expect_recv(&h, sizeof(h), 1, -EPROTO, "ns not terminated, an fd");
	fill_hello(&h, "");
	expect_recv(&h, sizeof(h), 0, -EPROTO, "empty name");
	fill_hello(&h, "../x");
	expect_recv(&h, sizeof(h), 0, -EPROTO, "name with a slash");
	fill_hello(&h, "peer");
	h.ns[0] = '\0';
	expect_recv(&h, sizeof(h), 0, -EPROTO, "empty ns");

	fill_hello(&h, "peer");
	memset(big, 0, sizeof(big));
	memcpy(big, &h, sizeof(h));
	expect_recv(big, sizeof(big), 0, -EPROTO, "oversized");
	((struct shm_hello *)big)->nfds = 2;
	expect_recv(big, sizeof(big), 2, -EPROTO, "oversized with fds");
	expect_recv(&h, sizeof(h) - 1, 0, -EPROTO, "one byte short");

	/* Less room than fds sent: refused, all closed. */
	{
		int sv[2], fds[1] = { -1 }, before;
		unsigned n = 1;
		struct shm_hello r;

		assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
		before = count_fds();
		fill_hello(&h, "peer");
		h.nfds = 2;
		raw_send(sv[1], &h, sizeof(h), 2);
		assert_int_equal(shm_sock_recv_hello(sv[0], &r, fds, &n, 2000), -EPROTO);
		assert_int_equal(n, 0);
		assert_int_equal(fds[0], -1);
		assert_int_equal(count_fds(), before);
		close(sv[0]);
		close(sv[1]);
	}
	assert_int_equal(count_fds(), fd0);
}

static void test_hangup_timeout_and_args(void **state)
{
	struct shm_hello h;
	int sv[2], fds[SHM_MAX_FDS], before;
	unsigned n = SHM_MAX_FDS;
	int64_t t0, dt;

	(void)state;
	/* Nothing sent: -ETIMEDOUT after about the timeout. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	before = count_fds();
	t0 = t_now();
	assert_int_equal(shm_sock_recv_hello(sv[0], &h, fds, &n, 150), -ETIMEDOUT);
	dt = t_now() - t0;
	assert_true(dt >= 140 * MS);
	assert_true(dt < 3 * SEC);
	n = SHM_MAX_FDS;
	assert_int_equal(shm_sock_recv_hello(sv[0], &h, fds, &n, 0), -ETIMEDOUT);

	/* The peer closes before its hello: -ECONNRESET. */
	close(sv[1]);
	n = SHM_MAX_FDS;
	assert_int_equal(shm_sock_recv_hello(sv[0], &h, fds, &n, 2000), -ECONNRESET);
	assert_int_equal(n, 0);
	assert_int_equal(count_fds(), before - 1);
	close(sv[0]);

	/* Sending to a closed peer: -ECONNRESET, no SIGPIPE. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[1]);
	fill_hello(&h, "peer");
	assert_int_equal(shm_sock_send_hello(sv[0], &h, NULL, 0), -ECONNRESET);
	close(sv[0]);

	/* Bad arguments. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	fill_hello(&h, "peer");
	fds[0] = fds[1] = fds[2] = fds[3] = 0;
	assert_int_equal(shm_sock_send_hello(sv[0], NULL, NULL, 0), -EINVAL);
	assert_int_equal(shm_sock_send_hello(sv[0], &h, fds, SHM_MAX_FDS + 1), -EINVAL);
	assert_int_equal(shm_sock_send_hello(sv[0], &h, NULL, 1), -EINVAL);
	fds[0] = -1;
	assert_int_equal(shm_sock_send_hello(sv[0], &h, fds, 1), -EINVAL);
	memset(h.name, 'x', sizeof(h.name));
	assert_int_equal(shm_sock_send_hello(sv[0], &h, NULL, 0), -EINVAL);
	n = 1;
	assert_int_equal(shm_sock_recv_hello(sv[0], NULL, fds, &n, 0), -EINVAL);
	assert_int_equal(shm_sock_recv_hello(sv[0], &h, fds, NULL, 0), -EINVAL);
	n = 2;
	assert_int_equal(shm_sock_recv_hello(sv[0], &h, NULL, &n, 0), -EINVAL);
	n = 0;
	assert_int_equal(shm_sock_recv_hello(-1, &h, NULL, &n, 0), -EBADF);
	close(sv[0]);
	close(sv[1]);
}

/* A client of a real listener sends garbage: the server side refuses it. */
static void test_garbage_over_real_connection(void **state)
{
	struct shm_listener l;
	struct shm_hello h;
	int s, c, fds[SHM_MAX_FDS], before;
	unsigned n = SHM_MAX_FDS;

	(void)state;
	assert_true(shm_sock_listen(NS, "srv", &l) >= 0);
	before = count_fds();
	s = shm_sock_connect(NS, "srv");
	assert_true(s >= 0);
	c = accept_within(l.fd, 5000);
	assert_true(c >= 0);
	raw_send(s, "GET / HTTP/1.0\r\n\r\n", 18, 2);
	assert_int_equal(shm_sock_recv_hello(c, &h, fds, &n, 2000), -EPROTO);
	/* And a good one on the same connection still passes. */
	fill_hello(&h, "cli");
	assert_int_equal(shm_sock_send_hello(s, &h, NULL, 0), 0);
	n = SHM_MAX_FDS;
	assert_int_equal(shm_sock_recv_hello(c, &h, fds, &n, 2000), 0);
	assert_string_equal(h.name, "cli");
	close(s);
	n = SHM_MAX_FDS;
	assert_int_equal(shm_sock_recv_hello(c, &h, fds, &n, 2000), -ECONNRESET);
	close(c);
	assert_int_equal(count_fds(), before);
	shm_sock_unlisten(&l);
}

/* Random messages with random fd counts: never a crash, never a leak. */
static void test_random_garbage(void **state)
{
	unsigned char buf[400];
	unsigned seed = 12345;
	int rounds = t_under_valgrind() ? 100 : 1000;
	int before = count_fds();

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	for (int r = 0; r < rounds; r++) {
		int sv[2], fds[SHM_MAX_FDS], rc;
		unsigned n = SHM_MAX_FDS, nfd, len;
		struct shm_hello h;

		len = (unsigned)(rand_r(&seed) % sizeof(buf));
		nfd = (unsigned)(rand_r(&seed) % 7);
		for (unsigned i = 0; i < len; i++)
			buf[i] = (unsigned char)rand_r(&seed);
		/* Often a plausible head, so the later checks are reached. */
		if (len >= 8 && (r & 1)) {
			fill_hello(&h, "peer");
			h.nfds = nfd;
			memcpy(buf, &h, len < sizeof(h) ? len : sizeof(h));
			if (r & 2)
				buf[16 + rand_r(&seed) % 128] = (unsigned char)rand_r(&seed);
		}
		assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
		raw_send(sv[1], buf, len, nfd);
		if (r % 5 == 0)
			close(sv[1]);
		rc = shm_sock_recv_hello(sv[0], &h, fds, &n, 1000);
		if (rc == 0) {
			assert_true(n <= SHM_MAX_FDS);
			for (unsigned i = 0; i < n; i++)
				close(fds[i]);
		} else if (rc != -EPROTO && rc != -EPROTONOSUPPORT && rc != -ECONNRESET) {
			fail_msg("round %d: unexpected %d", r, rc);
		}
		close(sv[0]);
		if (r % 5 != 0)
			close(sv[1]);
	}
	assert_int_equal(count_fds(), before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_handshake_with_child, setup, teardown),
		cmocka_unit_test_setup_teardown(test_addrinuse_same_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_addrinuse_other_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_race, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_churn, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash_leftover_next_listen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash_leftover_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_modes_and_nothing_left, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unsafe_runtime_dir_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_default_runtime_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_names_and_long_paths, setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_uid_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed_hellos, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hangup_timeout_and_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage_over_real_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_random_garbage, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

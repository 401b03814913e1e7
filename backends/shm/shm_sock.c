/*
 * backends/shm/shm_sock.c - names, sockets and the hello of the shm transport.
 *
 * Owns: the runtime and namespace directories, the socket and lock files of
 * a listening name, the sweep of crashed engines' leftovers, connect and
 * accept with the SO_PEERCRED check, and sending and checking the hello
 * (see shm_sock.h for the contract). Connect and receive come in a bounded
 * waiting form and a never-waiting one (-EAGAIN) for the reactor.
 *
 * Locking: a name is live while its <name>.lock is flocked (LOCK_EX). Taking
 * a name, sweeping a namespace and removing an empty namespace directory
 * happen under flock(LOCK_EX) of the namespace directory itself. Giving a
 * name back unlinks the socket first, then the lock file, then drops the
 * lock, so whoever takes the name next never sees our socket file as its
 * own. A lock taken on a file that was unlinked meanwhile is detected (the
 * inode behind the path differs) and the attempt repeated.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "shm_sock.h"

_Static_assert(sizeof(((struct sockaddr_un *)0)->sun_path) == SHM_PATH_MAX,
	       "SHM_PATH_MAX must be sizeof(sun_path)");
_Static_assert(sizeof(struct shm_hello) == 200, "struct shm_hello has no padding");
_Static_assert(offsetof(struct shm_hello, pool_size) == 144, "shm_hello layout");
_Static_assert(FERRY_NAME_MAX == 64, "the hello's layout assumes 64-byte names");

#define HELLO_HEAD 8 /* magic, version, size: enough to tell who is talking */
/* Attempts when a name or directory changes hands under us, with backoff. */
#define NAME_RETRIES 200

int shm_name_valid(const char *s)
{
	size_t n;

	if (!s)
		return 0;
	n = strnlen(s, FERRY_NAME_MAX);
	if (n == 0 || n >= FERRY_NAME_MAX)
		return 0;
	if (!strcmp(s, ".") || !strcmp(s, ".."))
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return 0;
	}
	return 1;
}

/* Checks ns, and name unless name_too is 0. */
static int check_names(const char *what, const char *ns, const char *name, int name_too)
{
	if (!shm_name_valid(ns)) {
		log_error("shm: %s: invalid namespace (1..%d of [A-Za-z0-9._:-], not . or ..)",
			  what, FERRY_NAME_MAX - 1);
		return -EINVAL;
	}
	if (name_too && !shm_name_valid(name)) {
		log_error("shm: %s: invalid engine name in namespace '%s'", what, ns);
		return -EINVAL;
	}
	return 0;
}

/* snprintf that says -ENAMETOOLONG instead of truncating. */
__attribute__((format(printf, 3, 4))) static int fmt_path(char *buf, size_t len,
							   const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

/* Is fd (opened O_DIRECTORY|O_NOFOLLOW) a directory only we can enter? */
static int dir_fd_safe(int dfd, const char *path)
{
	struct stat st;

	if (fstat(dfd, &st) < 0) {
		int e = errno;

		log_error("shm: cannot stat %s: %s", path, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		log_error("shm: %s is not a directory; refusing it", path);
		return -EPERM;
	}
	if (st.st_uid != geteuid()) {
		log_error("shm: %s is owned by uid %u, not by us (uid %u); refusing it", path,
			  (unsigned)st.st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st.st_mode & 077) {
		log_error("shm: %s has mode %04o, group/other may enter it; refusing it "
			  "(chmod 0700 or remove it)",
			  path, (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

/*
 * Open directory path (making it 0700 first with create) and check it.
 * Returns the fd (O_DIRECTORY, CLOEXEC) or a negative errno; -ENOENT
 * (not logged) when it is missing and !create.
 */
static int open_dir(const char *path, int create)
{
	int created = 0, dfd, rc;

	for (int tries = 0;; tries++) {
		if (create) {
			if (mkdir(path, 0700) == 0) {
				created = 1;
			} else if (errno != EEXIST) {
				int e = errno;

				log_error("shm: cannot create %s: %s", path, strerror(e));
				return e == EACCES ? -EPERM : -e;
			}
		}
		dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd >= 0)
			break;
		/* Removed (empty) by an unlisten or sweep between mkdir and open. */
		if (errno == ENOENT && create && tries < NAME_RETRIES)
			continue;
		{
			int e = errno;

			if (e == ENOENT && !create)
				return -ENOENT;
			if (e == ENOTDIR || e == ELOOP) {
				log_error("shm: %s is not a directory (or is a symlink); refusing it",
					  path);
				return -EPERM;
			}
			if (e == EACCES || e == EPERM) {
				log_error("shm: %s: permission denied (another user's directory?)",
					  path);
				return -EPERM;
			}
			log_error("shm: cannot open %s: %s", path, strerror(e));
			return -e;
		}
	}
	/* The umask may have taken bits from the owner: make it exactly 0700. */
	if (created && fchmod(dfd, 0700) < 0) {
		int e = errno;

		close(dfd);
		log_error("shm: cannot chmod %s: %s", path, strerror(e));
		return -e;
	}
	rc = dir_fd_safe(dfd, path);
	if (rc < 0) {
		close(dfd);
		return rc;
	}
	return dfd;
}

static int xdg_usable(const char *xdg)
{
	struct stat st;

	if (!xdg || xdg[0] != '/')
		return 0;
	if (stat(xdg, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 077))
		return 0;
	return access(xdg, W_OK | X_OK) == 0;
}

/* The runtime directory's name, nothing checked on disk but XDG's usability. */
static int runtime_dir_name(char *buf, size_t len)
{
	const char *env = getenv("FERRY_RUNTIME_DIR");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int rc;

	if (env && env[0])
		rc = fmt_path(buf, len, "%s", env);
	else if (xdg_usable(xdg))
		rc = fmt_path(buf, len, "%s/ferry", xdg);
	else
		rc = fmt_path(buf, len, "/tmp/ferry-%u", (unsigned)geteuid());
	if (rc == -ENAMETOOLONG)
		log_error("shm: the runtime directory's path is too long");
	return rc;
}

int shm_sock_runtime_dir(char *buf, size_t len, int create)
{
	int rc, dfd;

	if (!buf || len == 0)
		return -EINVAL;
	rc = runtime_dir_name(buf, len);
	if (rc < 0)
		return rc;
	dfd = open_dir(buf, create);
	if (dfd < 0)
		return dfd;
	close(dfd);
	return 0;
}

/* Remove trailing slashes of a directory name (keeps "/"). */
static void trim_slashes(char *p)
{
	size_t n = strlen(p);

	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
}

static int ns_dir_name(const char *ns, char *buf, size_t len)
{
	char rt[PATH_MAX];
	int rc = runtime_dir_name(rt, sizeof(rt));

	if (rc < 0)
		return rc;
	trim_slashes(rt);
	rc = fmt_path(buf, len, "%s/%s", rt, ns);
	if (rc == -ENAMETOOLONG)
		log_error("shm: namespace '%s': path too long for a unix socket", ns);
	return rc;
}

static int file_path(const char *nsdir, const char *name, const char *ext, char *buf,
		     size_t len)
{
	int rc = fmt_path(buf, len, "%s/%s.%s", nsdir, name, ext);

	if (rc == -ENAMETOOLONG)
		log_error("shm: engine '%s': %s/%s.%s does not fit a unix socket path (%d bytes)",
			  name, nsdir, name, ext, SHM_PATH_MAX - 1);
	return rc;
}

int shm_sock_path(const char *ns, const char *name, char *buf, size_t len)
{
	char nsdir[SHM_PATH_MAX], rt[PATH_MAX];
	int rc;

	if (!buf || len == 0) {
		log_error("shm: shm_sock_path: no buffer");
		return -EINVAL;
	}
	rc = check_names("shm_sock_path", ns, name, 1);
	if (rc < 0)
		return rc;
	rc = shm_sock_runtime_dir(rt, sizeof(rt), 0);
	if (rc < 0 && rc != -ENOENT)
		return rc;
	rc = ns_dir_name(ns, nsdir, sizeof(nsdir));
	if (rc < 0)
		return rc;
	rc = file_path(nsdir, name, "sock", buf, len < SHM_PATH_MAX ? len : SHM_PATH_MAX);
	return rc;
}

/*
 * 1 if fd is the file now at path (not removed or replaced meanwhile). While
 * we hold fd its inode cannot be reused, so inode and device say it.
 */
static int same_file(int fd, const char *path)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_ino == b.st_ino &&
	       a.st_dev == b.st_dev;
}

/*
 * Open the namespace directory (creating both levels with create) and take
 * its flock. Returns the locked fd, -ENOENT when it is missing and !create,
 * -EAGAIN when it was removed while we waited for the lock (try again).
 */
static int ns_lock(const char *ns, int create, char *nsdir, size_t len)
{
	char rt[PATH_MAX];
	int rc, dfd;

	rc = shm_sock_runtime_dir(rt, sizeof(rt), create);
	if (rc < 0)
		return rc;
	rc = ns_dir_name(ns, nsdir, len);
	if (rc < 0)
		return rc;
	dfd = open_dir(nsdir, create);
	if (dfd < 0)
		return dfd;
	while (flock(dfd, LOCK_EX) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		close(dfd);
		log_error("shm: cannot lock %s: %s", nsdir, strerror(e));
		return -e;
	}
	/* Still the directory at that path (not removed while we waited)? */
	if (!same_file(dfd, nsdir)) {
		close(dfd);
		return create ? -EAGAIN : -ENOENT;
	}
	return dfd;
}

/* Remove the namespace directory if empty; the caller holds its flock. */
static void ns_rmdir_locked(const char *nsdir)
{
	if (rmdir(nsdir) < 0 && errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT)
		log_warn("shm: cannot remove %s: %s", nsdir, strerror(errno));
}

/*
 * Take <name>.lock: the fd with flock(LOCK_EX) held, -EADDRINUSE when
 * someone holds it, -EAGAIN when the file we locked is no longer the one at
 * the path (its holder gave it back meanwhile: try again).
 */
static int take_name_lock(const char *lock_path)
{
	struct stat a;
	int fd = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);

	if (fd < 0) {
		int e = errno;

		log_error("shm: cannot open %s: %s", lock_path, strerror(e));
		return e == ELOOP ? -EPERM : -e;
	}
	while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		close(fd);
		if (e == EWOULDBLOCK)
			return -EADDRINUSE;
		log_error("shm: cannot lock %s: %s", lock_path, strerror(e));
		return -e;
	}
	if (!same_file(fd, lock_path) || fstat(fd, &a) < 0) {
		close(fd);
		return -EAGAIN;
	}
	if (!S_ISREG(a.st_mode) || a.st_uid != geteuid()) {
		close(fd);
		log_error("shm: %s is not a regular file of ours; refusing it", lock_path);
		return -EPERM;
	}
	if ((a.st_mode & 07777) != 0600 && fchmod(fd, 0600) < 0) {
		int e = errno;

		close(fd);
		log_error("shm: cannot chmod %s: %s", lock_path, strerror(e));
		return -e;
	}
	return fd;
}

static void sun_of(struct sockaddr_un *sa, const char *path)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	/* Every path reaching here was checked to fit. */
	memcpy(sa->sun_path, path, strnlen(path, sizeof(sa->sun_path) - 1));
}

/* 1 if something listens at path, 0 if not (refused, gone), else -errno. */
static int probe_live(const char *path)
{
	struct sockaddr_un sa;
	int s, rc;

	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	sun_of(&sa, path);
	do
		rc = connect(s, (struct sockaddr *)&sa, sizeof(sa));
	while (rc < 0 && errno == EINTR);
	if (rc == 0 || errno == EAGAIN || errno == EINPROGRESS) {
		rc = 1; /* accepted, or a full backlog: alive either way */
	} else if (errno == ECONNREFUSED || errno == ENOENT) {
		rc = 0;
	} else if (errno == EPROTOTYPE) {
		rc = 1; /* a socket of another type: not ours to remove */
	} else {
		rc = -errno;
	}
	close(s);
	return rc;
}

static void listener_clear(struct shm_listener *l)
{
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	l->lock_fd = -1;
}

static int bind_name(const char *ns, const char *name, const char *path)
{
	struct sockaddr_un sa;
	int s, rc = 0;

	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0) {
		rc = -errno;
		log_error("shm: socket: %s", strerror(-rc));
		return rc;
	}
	sun_of(&sa, path);
	for (int tries = 0;; tries++) {
		struct stat st;

		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		rc = -errno;
		if (rc != -EADDRINUSE || tries >= 2) {
			log_error("shm: cannot bind %s: %s", path, strerror(-rc));
			goto fail;
		}
		/* A file is in the way, though the name's lock is ours. */
		if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
			log_error("shm: %s exists and is not a socket; refusing to remove it",
				  path);
			rc = -EEXIST;
			goto fail;
		}
		rc = probe_live(path);
		if (rc < 0) {
			log_error("shm: cannot probe %s: %s", path, strerror(-rc));
			goto fail;
		}
		if (rc == 1) {
			log_error("shm: engine '%s' is already live in namespace '%s' "
				  "(something listens at %s)",
				  name, ns, path);
			rc = -EADDRINUSE;
			goto fail;
		}
		if (unlink(path) < 0 && errno != ENOENT) {
			rc = -errno;
			log_error("shm: cannot remove the leftover %s: %s", path, strerror(-rc));
			goto fail;
		}
		log_info("shm: removed the leftover socket of a dead engine '%s' in namespace '%s'",
			 name, ns);
	}
	if (chmod(path, 0600) < 0) {
		rc = -errno;
		log_error("shm: cannot chmod %s: %s", path, strerror(-rc));
		unlink(path);
		goto fail;
	}
	if (listen(s, 128) < 0) {
		rc = -errno;
		log_error("shm: cannot listen on %s: %s", path, strerror(-rc));
		unlink(path);
		goto fail;
	}
	return s;
fail:
	close(s);
	return rc;
}

/* Between attempts: yield first, then sleep a little longer each time. */
static void backoff(int attempt)
{
	if (attempt < 4) {
		sched_yield();
	} else {
		struct timespec ts = { 0, (attempt < 50 ? attempt : 50) * 20000L };

		nanosleep(&ts, NULL);
	}
}

int shm_sock_listen(const char *ns, const char *name, struct shm_listener *l)
{
	char nsdir[SHM_PATH_MAX];
	int rc, dfd = -1, lock_fd = -1;

	if (!l) {
		log_error("shm: shm_sock_listen: no listener");
		return -EINVAL;
	}
	listener_clear(l);
	rc = check_names("shm_sock_listen", ns, name, 1);
	if (rc < 0)
		return rc;

	for (int attempt = 0;; attempt++) {
		if (attempt >= NAME_RETRIES) {
			log_error("shm: engine '%s' in namespace '%s': the name keeps changing "
				  "hands; giving up",
				  name, ns);
			return -EBUSY;
		}
		if (attempt)
			backoff(attempt);
		dfd = ns_lock(ns, 1, nsdir, sizeof(nsdir));
		if (dfd == -EAGAIN)
			continue;
		if (dfd < 0)
			return dfd;
		rc = file_path(nsdir, name, "sock", l->path, sizeof(l->path));
		if (rc == 0)
			rc = file_path(nsdir, name, "lock", l->lock_path, sizeof(l->lock_path));
		if (rc < 0)
			goto fail;
		lock_fd = take_name_lock(l->lock_path);
		if (lock_fd == -EAGAIN) {
			close(dfd);
			continue;
		}
		if (lock_fd == -EADDRINUSE) {
			log_error("shm: engine '%s' is already live in namespace '%s' "
				  "(%s is held)",
				  name, ns, l->lock_path);
		}
		if (lock_fd < 0) {
			rc = lock_fd;
			goto fail;
		}
		break;
	}

	rc = bind_name(ns, name, l->path);
	if (rc < 0) {
		/* The lock file is ours: nobody else may be using it. */
		unlink(l->lock_path);
		close(lock_fd);
		goto fail;
	}
	close(dfd);
	l->live = 1;
	l->fd = rc;
	l->lock_fd = lock_fd;
	memcpy(l->ns, ns, strlen(ns) + 1);
	memcpy(l->name, name, strlen(name) + 1);
	return rc;
fail:
	/* Under the namespace lock: the directory goes if we left it empty. */
	ns_rmdir_locked(nsdir);
	close(dfd);
	listener_clear(l);
	return rc;
}

void shm_sock_unlisten(struct shm_listener *l)
{
	char nsdir[SHM_PATH_MAX];
	char *slash;
	int dfd;

	if (!l || l->live != 1)
		return;
	/* Socket first, lock file last: the next owner never finds ours. */
	if (l->path[0] && unlink(l->path) < 0 && errno != ENOENT)
		log_warn("shm: cannot remove %s: %s", l->path, strerror(errno));
	if (l->lock_path[0] && unlink(l->lock_path) < 0 && errno != ENOENT)
		log_warn("shm: cannot remove %s: %s", l->lock_path, strerror(errno));
	if (l->fd >= 0)
		close(l->fd);
	if (l->lock_fd >= 0)
		close(l->lock_fd);

	memcpy(nsdir, l->path, sizeof(nsdir));
	nsdir[sizeof(nsdir) - 1] = '\0';
	slash = strrchr(nsdir, '/');
	if (slash && slash != nsdir) {
		*slash = '\0';
		dfd = open(nsdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd >= 0) {
			int rc;

			do
				rc = flock(dfd, LOCK_EX);
			while (rc < 0 && errno == EINTR);
			/*
			 * Only if the directory we locked is still the one at
			 * that path: if it went and another took its place,
			 * that one is someone else's (maybe mid-listen).
			 */
			if (rc == 0 && same_file(dfd, nsdir))
				ns_rmdir_locked(nsdir);
			close(dfd);
		}
	}
	listener_clear(l);
}

static int has_suffix(const char *s, const char *suf, size_t *base_len)
{
	size_t n = strlen(s), m = strlen(suf);

	if (n <= m || strcmp(s + n - m, suf))
		return 0;
	*base_len = n - m;
	return 1;
}

/* Remove base.sock and base.lock if nobody holds base.lock; how many went. */
static int sweep_one(int dfd, const char *ns, const char *base)
{
	char sock[FERRY_NAME_MAX + 8], lock[FERRY_NAME_MAX + 8];
	struct stat st;
	int lfd, n = 0;

	snprintf(sock, sizeof(sock), "%s.sock", base);
	snprintf(lock, sizeof(lock), "%s.lock", base);
	lfd = openat(dfd, lock, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (lfd < 0) {
		if (errno != ENOENT)
			return 0; /* cannot tell: leave it */
	} else {
		int rc;

		if (fstat(lfd, &st) < 0 || !S_ISREG(st.st_mode)) {
			close(lfd);
			return 0;
		}
		do
			rc = flock(lfd, LOCK_EX | LOCK_NB);
		while (rc < 0 && errno == EINTR);
		if (rc < 0) {
			close(lfd);
			return 0; /* live (or unknown): leave it */
		}
	}
	if (fstatat(dfd, sock, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode) &&
	    unlinkat(dfd, sock, 0) == 0)
		n++;
	if (lfd >= 0) {
		if (unlinkat(dfd, lock, 0) == 0)
			n++;
		close(lfd);
	}
	if (n)
		log_info("shm: removed the leftovers of a dead engine '%s' in namespace '%s'", base,
			 ns);
	return n;
}

int shm_sock_sweep(const char *ns)
{
	char nsdir[SHM_PATH_MAX];
	struct dirent *de;
	DIR *d;
	int dfd, rfd, n = 0;

	if (check_names("shm_sock_sweep", ns, NULL, 0) < 0)
		return -EINVAL;
	for (int attempt = 0;; attempt++) {
		if (attempt)
			backoff(attempt);
		dfd = ns_lock(ns, 0, nsdir, sizeof(nsdir));
		if (dfd == -ENOENT)
			return 0;
		if (dfd != -EAGAIN || attempt >= NAME_RETRIES)
			break;
	}
	if (dfd < 0)
		return dfd;
	rfd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	d = rfd >= 0 ? fdopendir(rfd) : NULL;
	if (!d) {
		int e = errno;

		if (rfd >= 0)
			close(rfd);
		close(dfd);
		log_error("shm: cannot read %s: %s", nsdir, strerror(e));
		return -e;
	}
	while ((de = readdir(d)) != NULL) {
		char base[FERRY_NAME_MAX];
		size_t bl;

		if (!has_suffix(de->d_name, ".sock", &bl) && !has_suffix(de->d_name, ".lock", &bl))
			continue;
		if (bl >= sizeof(base))
			continue;
		memcpy(base, de->d_name, bl);
		base[bl] = '\0';
		if (!shm_name_valid(base))
			continue; /* not a name of ours */
		n += sweep_one(dfd, ns, base);
	}
	closedir(d);
	ns_rmdir_locked(nsdir);
	close(dfd);
	return n;
}

int shm_sock_peer_ok(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		int e = errno;

		log_error("shm: SO_PEERCRED on fd %d: %s", fd, strerror(e));
		return -e;
	}
	if (len != sizeof(cr) || cr.uid != geteuid()) {
		log_error("shm: refusing a peer of uid %u (pid %d): only uid %u may connect",
			  (unsigned)cr.uid, (int)cr.pid, (unsigned)geteuid());
		return -EPERM;
	}
	return 0;
}

/*
 * Connect to (ns, name): with timeout_ms > 0 wait up to that long for room
 * in a full accept backlog, with 0 never wait (-EAGAIN, unlogged).
 */
static int connect_name(const char *ns, const char *name, int timeout_ms)
{
	char path[SHM_PATH_MAX];
	struct sockaddr_un sa;
	struct timeval tv;
	int s, rc, fl;

	if (check_names("shm_sock_connect", ns, name, 1) < 0)
		return -EINVAL;
	rc = shm_sock_path(ns, name, path, sizeof(path));
	if (rc < 0)
		return rc;
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (timeout_ms ? 0 : SOCK_NONBLOCK), 0);
	if (s < 0) {
		rc = -errno;
		log_error("shm: socket: %s", strerror(-rc));
		return rc;
	}
	/* A full backlog makes connect wait; SO_SNDTIMEO bounds the wait. */
	if (timeout_ms) {
		tv.tv_sec = timeout_ms / 1000;
		tv.tv_usec = (timeout_ms % 1000) * 1000;
		(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	sun_of(&sa, path);
	do
		rc = connect(s, (struct sockaddr *)&sa, sizeof(sa));
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int e = errno;

		close(s);
		if (!timeout_ms && (e == EAGAIN || e == EWOULDBLOCK))
			return -EAGAIN;
		switch (e) {
		case ENOENT:
		case ECONNREFUSED:
			log_info("shm: no engine '%s' in namespace '%s' on this host", name, ns);
			return -EHOSTUNREACH;
		case EACCES:
		case EPERM:
			log_error("shm: not allowed to connect to engine '%s' in namespace '%s' "
				  "(%s)",
				  name, ns, path);
			return -EPERM;
		case EAGAIN:
			log_warn("shm: engine '%s' in namespace '%s' did not accept within %d ms",
				 name, ns, timeout_ms);
			return -ETIMEDOUT;
		default:
			log_error("shm: connect to engine '%s' in namespace '%s': %s", name, ns,
				  strerror(e));
			return -e;
		}
	}
	if (timeout_ms) {
		tv.tv_sec = 0;
		tv.tv_usec = 0;
		(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		fl = fcntl(s, F_GETFL);
		if (fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK) < 0) {
			rc = -errno;
			close(s);
			log_error("shm: fcntl: %s", strerror(-rc));
			return rc;
		}
	}
	rc = shm_sock_peer_ok(s);
	if (rc < 0) {
		close(s);
		log_error("shm: engine '%s' in namespace '%s' runs as another user; not using it",
			  name, ns);
		return rc;
	}
	return s;
}

int shm_sock_connect_timeout(const char *ns, const char *name, int timeout_ms)
{
	return connect_name(ns, name, timeout_ms > 0 ? timeout_ms : SHM_CONNECT_TIMEOUT_MS);
}

int shm_sock_connect_nowait(const char *ns, const char *name)
{
	return connect_name(ns, name, 0);
}

int shm_sock_connect(const char *ns, const char *name)
{
	return shm_sock_connect_timeout(ns, name, 0);
}

int shm_sock_accept(int listen_fd)
{
	int c, rc;

	for (;;) {
		c = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (c >= 0)
			break;
		rc = -errno;
		if (rc == -EINTR || rc == -ECONNABORTED)
			continue;
		if (rc == -EAGAIN || rc == -EWOULDBLOCK)
			return -EAGAIN;
		log_error("shm: accept on fd %d: %s", listen_fd, strerror(-rc));
		return rc;
	}
	rc = shm_sock_peer_ok(c);
	if (rc < 0) {
		close(c);
		return rc;
	}
	return c;
}

int shm_sock_send_hello(int fd, const struct shm_hello *h, const int *fds, unsigned nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct shm_hello m;
	struct iovec iov;
	struct msghdr msg;
	ssize_t r;

	if (!h || nfds > SHM_MAX_FDS || (nfds && !fds)) {
		log_error("shm: send_hello: bad arguments (nfds %u, at most %d)", nfds,
			  SHM_MAX_FDS);
		return -EINVAL;
	}
	for (unsigned i = 0; i < nfds; i++) {
		if (fds[i] < 0) {
			log_error("shm: send_hello: fd %u is negative", i);
			return -EINVAL;
		}
	}
	if (!memchr(h->ns, '\0', sizeof(h->ns)) || !shm_name_valid(h->ns) ||
	    !memchr(h->name, '\0', sizeof(h->name)) || !shm_name_valid(h->name)) {
		log_error("shm: send_hello: namespace or name invalid");
		return -EINVAL;
	}
	m = *h;
	m.magic = SHM_MAGIC;
	m.version = SHM_VERSION;
	m.size = sizeof(m);
	m.nfds = nfds;

	memset(&msg, 0, sizeof(msg));
	memset(&ctl, 0, sizeof(ctl));
	iov.iov_base = &m;
	iov.iov_len = sizeof(m);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds) {
		struct cmsghdr *c;

		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	do
		r = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		int e = errno;

		if (e == EPIPE || e == ECONNRESET || e == ENOTCONN) {
			log_warn("shm: send_hello: the peer is gone");
			return -ECONNRESET;
		}
		if (e == EAGAIN || e == EWOULDBLOCK) {
			log_warn("shm: send_hello: the peer's queue is full");
			return -EAGAIN;
		}
		log_error("shm: send_hello: %s", strerror(e));
		return -e;
	}
	if ((size_t)r != sizeof(m)) {
		log_error("shm: send_hello: sent %zd of %zu bytes", r, sizeof(m));
		return -EPROTO;
	}
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int str_ok(const char *s, size_t len)
{
	return memchr(s, '\0', len) != NULL && shm_name_valid(s);
}

/*
 * shm_sock_recv_hello's body; with try_only (timeout_ms 0), nothing there
 * yet is -EAGAIN, unlogged.
 */
static int recv_hello(int fd, struct shm_hello *h, int *fds, unsigned *nfds, int timeout_ms,
		      int try_only)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	union {
		struct shm_hello h;
		unsigned char b[sizeof(struct shm_hello)];
	} in;
	int got[SHM_MAX_FDS];
	unsigned ngot = 0, room;
	int64_t end = timeout_ms >= 0 ? mono_ms() + timeout_ms : 0;
	int rc = 0, extra = 0, hup = 0;
	struct iovec iov;
	struct msghdr msg;
	ssize_t r;

	if (!h || !nfds || (*nfds && !fds)) {
		log_error("shm: recv_hello: bad arguments");
		if (nfds)
			*nfds = 0;
		return -EINVAL;
	}
	room = *nfds < SHM_MAX_FDS ? *nfds : SHM_MAX_FDS;
	*nfds = 0;
	memset(h, 0, sizeof(*h));
	if (fd < 0) {
		log_error("shm: recv_hello: fd %d is not open", fd);
		return -EBADF;
	}

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
		int wait = -1, pr;

		if (timeout_ms >= 0) {
			int64_t left = end - mono_ms();

			wait = left > 0 ? (left > INT_MAX ? INT_MAX : (int)left) : 0;
		}
		pr = poll(&p, 1, wait);
		if (pr < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			log_error("shm: recv_hello: poll: %s", strerror(-rc));
			return rc;
		}
		if (pr == 0) {
			if (try_only)
				return -EAGAIN;
			log_warn("shm: recv_hello: no hello within %d ms", timeout_ms);
			return -ETIMEDOUT;
		}
		if (p.revents & POLLNVAL) {
			log_error("shm: recv_hello: fd %d is not open", fd);
			return -EBADF;
		}
		hup = !!(p.revents & (POLLHUP | POLLRDHUP));

		memset(&in, 0, sizeof(in));
		memset(&ctl, 0, sizeof(ctl));
		memset(&msg, 0, sizeof(msg));
		iov.iov_base = in.b;
		iov.iov_len = sizeof(in.b);
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = ctl.buf;
		msg.msg_controllen = sizeof(ctl.buf);
		r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (r >= 0)
			break;
		if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
			continue; /* spurious wake-up: wait again */
		rc = -errno;
		if (rc == -ECONNRESET || rc == -EPIPE || rc == -ENOTCONN) {
			log_warn("shm: recv_hello: the peer hung up");
			return -ECONNRESET;
		}
		log_error("shm: recv_hello: recvmsg: %s", strerror(-rc));
		return rc;
	}

	/* Take every fd that came, whatever else is wrong, so none leaks. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		const unsigned char *data = CMSG_DATA(c);
		const unsigned char *lim = (const unsigned char *)ctl.buf + msg.msg_controllen;
		size_t n;

		if (c->cmsg_len < CMSG_LEN(0) ||
		    c->cmsg_len > (size_t)(lim - (const unsigned char *)c)) {
			extra = 1;
			break;
		}
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
			extra = 1; /* nothing else is expected (no SO_PASSCRED) */
			continue;
		}
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int v;

			memcpy(&v, data + i * sizeof(int), sizeof(int));
			if (ngot < SHM_MAX_FDS)
				got[ngot++] = v;
			else if (v >= 0) {
				close(v);
				extra = 1;
			}
		}
	}

	if (r == 0 && ngot == 0 && hup) {
		log_warn("shm: recv_hello: the peer hung up before its hello");
		return -ECONNRESET;
	}
	if ((msg.msg_flags & MSG_CTRUNC) || extra) {
		log_warn("shm: recv_hello: control data truncated or unexpected (%u fds)", ngot);
		rc = -EPROTO;
	} else if ((size_t)r < HELLO_HEAD) {
		log_warn("shm: recv_hello: short message (%zd bytes)", r);
		rc = -EPROTO;
	} else if (in.h.magic != SHM_MAGIC) {
		log_warn("shm: recv_hello: bad magic 0x%08x", in.h.magic);
		rc = -EPROTO;
	} else if (in.h.version != SHM_VERSION) {
		log_error("shm: recv_hello: the peer speaks version %u, we speak version %u",
			  (unsigned)in.h.version, (unsigned)SHM_VERSION);
		rc = -EPROTONOSUPPORT;
	} else if ((msg.msg_flags & MSG_TRUNC) || (size_t)r != sizeof(in.h)) {
		log_warn("shm: recv_hello: message of %s%zd bytes, want %zu",
			 (msg.msg_flags & MSG_TRUNC) ? "more than " : "", r, sizeof(in.h));
		rc = -EPROTO;
	} else if (in.h.size != sizeof(in.h)) {
		log_warn("shm: recv_hello: size field %u, want %zu", (unsigned)in.h.size,
			 sizeof(in.h));
		rc = -EPROTO;
	} else if (in.h.nfds > SHM_MAX_FDS || in.h.nfds != ngot) {
		log_warn("shm: recv_hello: claims %u fds, %u attached", in.h.nfds, ngot);
		rc = -EPROTO;
	} else if (ngot > room) {
		log_warn("shm: recv_hello: %u fds attached, room for %u", ngot, room);
		rc = -EPROTO;
	} else if (!str_ok(in.h.ns, sizeof(in.h.ns)) || !str_ok(in.h.name, sizeof(in.h.name))) {
		log_warn("shm: recv_hello: namespace or name not a valid, terminated string");
		rc = -EPROTO;
	}
	if (rc < 0) {
		for (unsigned i = 0; i < ngot; i++)
			if (got[i] >= 0)
				close(got[i]);
		return rc;
	}
	memcpy(h, &in.h, sizeof(*h));
	for (unsigned i = 0; i < ngot; i++)
		fds[i] = got[i];
	*nfds = ngot;
	return 0;
}

int shm_sock_recv_hello(int fd, struct shm_hello *h, int *fds, unsigned *nfds, int timeout_ms)
{
	return recv_hello(fd, h, fds, nfds, timeout_ms, 0);
}

int shm_sock_try_recv_hello(int fd, struct shm_hello *h, int *fds, unsigned *nfds)
{
	return recv_hello(fd, h, fds, nfds, 0, 1);
}

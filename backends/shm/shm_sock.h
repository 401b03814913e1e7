/*
 * backends/shm/shm_sock.h - how shm engines find each other on one host and
 * shake hands (private to the shm transport).
 *
 * Owns: the per-user runtime directory and its per-namespace directories,
 * the name of an engine on the host (a unix socket <dir>/<ns>/<name>.sock and
 * a lock file <name>.lock whose flock says the name is live), removing what
 * crashed engines left behind, connecting and accepting with a check of the
 * peer's uid (SO_PEERCRED), and the versioned hello message that carries the
 * pool memfd and the doorbell eventfds (SCM_RIGHTS).
 *
 * Runtime directory: $FERRY_RUNTIME_DIR if set, else $XDG_RUNTIME_DIR/ferry
 * when XDG_RUNTIME_DIR is an absolute path to a directory we own that is not
 * group/other accessible, else /tmp/ferry-<euid>. Directories are created
 * 0700 and refused (-EPERM, logged) when they exist but are not a directory
 * (symlinks included) owned by the effective uid, or are group/other
 * accessible. Socket and lock files are 0600.
 *
 * Liveness: a name is live while some process holds flock(LOCK_EX) on its
 * lock file (held for the life of the listener). Listening, sweeping and
 * removing an empty namespace directory are serialised by a flock on the
 * namespace directory itself, so no extra file is ever left behind.
 *
 * Every function returns 0, a count or an fd on success and a negative errno
 * on failure; errno is never the channel. Every refusal logs one line.
 * Namespaces and names are 1..FERRY_NAME_MAX-1 characters of [A-Za-z0-9._:-],
 * and neither "." nor "..".
 */
#ifndef FERRY_SHM_SOCK_H
#define FERRY_SHM_SOCK_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

/* Bytes of sockaddr_un.sun_path, the longest socket path plus its NUL. */
#define SHM_PATH_MAX 108

#define SHM_MAGIC 0x46525259u /* "FRRY" */
/*
 * The wire version: any other value is refused with -EPROTONOSUPPORT.
 * Compatible additions take reserved words and caps bits, so the message
 * size stays sizeof(struct shm_hello) within one version. Version 2: ring
 * entries carry their own sequence word and small PUTs travel inline
 * (shm_wire.h).
 */
#define SHM_VERSION 2
#define SHM_MAX_FDS 4

/*
 * caps bit of a hello that asks for the engine's health instead of a
 * connection (no fds attached): the engine answers with one message, its
 * health JSON (ferry_engine_health), and hangs up. See shm_health.c.
 */
#define SHM_CAP_HEALTH (1u << 0)
/*
 * caps bit of a hello with fds: this engine takes SHM_C_RESULT_FREE (a
 * PUT taken by a copy, its block free again) in its control ring.
 */
#define SHM_CAP_RESULT_FREE (1u << 1)
/* Largest health answer sent (a SOCK_SEQPACKET message). */
#define SHM_HEALTH_MAX (128u * 1024u)

/* Default bound of shm_sock_connect's wait for a full accept backlog. */
#define SHM_CONNECT_TIMEOUT_MS 5000

/*
 * The handshake, one SOCK_SEQPACKET message each way, fds attached. Fixed
 * layout, no padding (200 bytes). Both strings are NUL-terminated within
 * their arrays and non-empty; caps bits a side does not know are ignored;
 * resv is sent as zero and ignored on receipt.
 */
struct shm_hello {
	uint32_t magic;   /* SHM_MAGIC */
	uint16_t version; /* SHM_VERSION */
	uint16_t size;    /* sizeof(struct shm_hello) */
	uint32_t caps;
	uint32_t nfds;    /* fds attached with SCM_RIGHTS, <= SHM_MAX_FDS */
	char ns[FERRY_NAME_MAX];
	char name[FERRY_NAME_MAX];
	uint64_t pool_size;
	uint32_t ring_entries;
	uint32_t ring_bytes;
	uint64_t cookie;
	uint64_t resv[4];
};

/* A listening name. Zero-initialised (or after unlisten) it holds nothing. */
struct shm_listener {
	int live;                    /* 1 between listen and unlisten */
	int fd;                      /* listening socket, nonblocking, CLOEXEC */
	int lock_fd;                 /* flock(LOCK_EX) held on lock_path */
	char ns[FERRY_NAME_MAX];
	char name[FERRY_NAME_MAX];
	char path[SHM_PATH_MAX];      /* <dir>/<ns>/<name>.sock */
	char lock_path[SHM_PATH_MAX]; /* <dir>/<ns>/<name>.lock */
};

/*
 * 1 if s is a usable namespace or engine name (see the header comment),
 * else 0. NULL gives 0. Logs nothing.
 */
int shm_name_valid(const char *s);

/*
 * Resolve the runtime directory into buf (len bytes). With create, make it
 * (0700) if missing; without, a missing directory gives -ENOENT. -EPERM
 * (logged) if it exists but is not ours or is group/other accessible,
 * -ENAMETOOLONG if it does not fit buf or a socket path.
 */
int shm_sock_runtime_dir(char *buf, size_t len, int create);

/*
 * The socket path of (ns, name) into buf: <dir>/<ns>/<name>.sock. Creates
 * nothing. -EINVAL (logged) for a bad ns or name or buffer, -ENAMETOOLONG
 * (logged) if the path does not fit buf or sun_path, the errors of
 * shm_sock_runtime_dir otherwise (a missing directory is not an error).
 */
int shm_sock_path(const char *ns, const char *name, char *buf, size_t len);

/*
 * Take the name (ns, name) on this host and listen on it. Fills *l and
 * returns the listening fd (AF_UNIX, SOCK_SEQPACKET, nonblocking, CLOEXEC;
 * also in l->fd). Creates the directories as needed. A socket file left by
 * a crashed engine (its lock is not held) is removed. -EADDRINUSE (logged,
 * naming ns and name) if the name is live, -EINVAL for bad arguments,
 * -EPERM for an unsafe directory, -ENAMETOOLONG, -EBUSY if the name or its
 * directory kept changing hands under us (hundreds of times), or another
 * negative errno of the calls involved. On failure *l holds nothing.
 */
int shm_sock_listen(const char *ns, const char *name, struct shm_listener *l);

/*
 * Give the name back: unlink the socket and lock files, close both fds,
 * remove the namespace directory if it is left empty. Safe on a listener
 * that holds nothing, and to call twice. Must be called by the process that
 * listened (a forked child would remove its parent's name).
 */
void shm_sock_unlisten(struct shm_listener *l);

/*
 * Remove the leftovers of crashed engines in namespace ns: socket and lock
 * files whose lock nobody holds, then the namespace directory if empty.
 * Called at engine start. Returns how many files it removed (0 when the
 * directory does not exist) or a negative errno (-EINVAL, -EPERM, ...).
 */
int shm_sock_sweep(const char *ns);

/*
 * Connect to the engine (ns, name) on this host with a timeout_ms bound on
 * the wait when its accept backlog is full (<= 0: SHM_CONNECT_TIMEOUT_MS).
 * Returns the connected fd (nonblocking, CLOEXEC) after checking that the
 * listener runs as our effective uid. -EHOSTUNREACH if nobody holds the
 * name, -EPERM (logged) if permissions or the listener's uid refuse us,
 * -ETIMEDOUT, -EINVAL, or another negative errno.
 */
int shm_sock_connect_timeout(const char *ns, const char *name, int timeout_ms);

/*
 * shm_sock_connect_timeout without any wait, for the reactor: -EAGAIN
 * (nothing logged) when the listener's accept backlog is full (call again
 * later). Every other result is as above.
 */
int shm_sock_connect_nowait(const char *ns, const char *name);

/* shm_sock_connect_timeout with the default bound. */
int shm_sock_connect(const char *ns, const char *name);

/*
 * Accept one connection on listen_fd. Returns the fd (nonblocking, CLOEXEC)
 * or -EAGAIN when none is pending. A peer whose uid is not our effective uid
 * is refused: its fd is closed, a line logged, -EPERM returned (call again
 * for the next one). -EBADF/-EINVAL/-ENOTSOCK for a bad listen_fd.
 */
int shm_sock_accept(int listen_fd);

/*
 * 0 if the peer of the unix socket fd (SO_PEERCRED) runs as our effective
 * uid, -EPERM (logged) if not, the getsockopt error otherwise.
 */
int shm_sock_peer_ok(int fd);

/*
 * Send the hello *h with fds[0..nfds) attached. This call sets magic,
 * version, size and nfds of the message it sends (h is not modified); ns
 * and name in *h must be valid names. Never raises SIGPIPE. -EINVAL
 * (logged) for nfds > SHM_MAX_FDS, a negative fd or bad strings,
 * -ECONNRESET if the peer is gone, -EAGAIN if its queue is full.
 */
int shm_sock_send_hello(int fd, const struct shm_hello *h, const int *fds, unsigned nfds);

/*
 * Wait up to timeout_ms (< 0: forever) for one hello on fd and check all of
 * it. *nfds is in/out: on entry the room in fds (capped at SHM_MAX_FDS), on
 * return how many fds were received (CLOEXEC) into fds. Returns 0, or:
 * -ETIMEDOUT (nothing came), -ECONNRESET (the peer hung up), -EPROTO (short,
 * long or garbled message, wrong magic or size field, nfds that does not
 * match the fds attached or exceeds the room, truncated control data,
 * strings not terminated, empty or not valid names),
 * -EPROTONOSUPPORT (another version; the line logged says both), -EINVAL
 * for bad arguments. On any failure every fd received is closed, *nfds is
 * 0 and *h is zeroed; nothing is written outside *h and fds[0..room).
 */
int shm_sock_recv_hello(int fd, struct shm_hello *h, int *fds, unsigned *nfds, int timeout_ms);

/*
 * shm_sock_recv_hello without waiting, for the reactor: -EAGAIN (nothing
 * logged, nothing received) when no message is there yet; every other
 * result is as above.
 */
int shm_sock_try_recv_hello(int fd, struct shm_hello *h, int *fds, unsigned *nfds);

/*
 * Ask the engine (ns, name) on this host for its health JSON (shm_health.c).
 * Writes at most len bytes including the NUL into buf and returns the
 * length of the answer, or -EHOSTUNREACH (nobody holds the name),
 * -ETIMEDOUT (no answer within timeout_ms), -ECONNRESET (it hung up without
 * answering: an engine without health requests), -EMSGSIZE (the answer
 * does not fit buf), -EINVAL, -EPERM, or another negative errno.
 */
int shm_health_query(const char *ns, const char *name, char *buf, size_t len, int timeout_ms);

struct ferry_engine;
/*
 * Answer a health request on fd (the engine side; reactor). Sends one
 * message and returns 0 or a negative errno (logged). Does not close fd.
 */
int shm_health_answer(struct ferry_engine *e, int fd);

#endif

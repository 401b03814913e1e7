/*
 * fuzz/harness.h - what the fuzz harnesses share (private to fuzz/).
 *
 * Owns: reading a fuzz input as a stream of fields (struct fz_in); the
 * process setup of a harness (a private FERRY_RUNTIME_DIR, SIGPIPE ignored,
 * ferry's log silenced unless FERRY_FUZZ_LOG names a level: bad input is
 * logged by design, and a line per input would drown the fuzzer); the
 * harnesses' own engines (MANUAL progress: nothing moves unless the
 * harness drives it, so a run is as deterministic as the kernel lets it
 * be), driving one until it is quiet, submitting one op and reaping
 * completions; and the one way a harness reports a broken invariant
 * (FZ_FAIL: a line and abort(), which libFuzzer records as a crash with
 * its input).
 *
 * Everything is static inline: each harness is one program, and the replay
 * build compiles this with gcc -Wall -Wextra -Werror too.
 */
#ifndef FERRY_FUZZ_HARNESS_H
#define FERRY_FUZZ_HARNESS_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ferry.h"
#include "internal.h"

#define FZ_FAIL(...)                                             \
	do {                                                     \
		fprintf(stderr, "fuzz: invariant broken: " __VA_ARGS__); \
		fprintf(stderr, "\n");                           \
		abort();                                         \
	} while (0)

/* ------------------------------------------------------------------ */
/* The input                                                           */
/* ------------------------------------------------------------------ */

struct fz_in {
	const uint8_t *p;
	size_t n;
};

static inline bool fz_left(const struct fz_in *in)
{
	return in->n > 0;
}

/* The next byte, or 0 once the input is spent. */
static inline uint8_t fz_u8(struct fz_in *in)
{
	uint8_t v = 0;

	if (in->n) {
		v = *in->p++;
		in->n--;
	}
	return v;
}

static inline uint16_t fz_u16(struct fz_in *in)
{
	uint16_t lo = fz_u8(in);

	return (uint16_t)(lo | (uint16_t)fz_u8(in) << 8);
}

static inline uint32_t fz_u32(struct fz_in *in)
{
	uint32_t lo = fz_u16(in);

	return lo | (uint32_t)fz_u16(in) << 16;
}

/* Up to n bytes into out (the rest zeroed); returns how many came from the input. */
static inline size_t fz_bytes(struct fz_in *in, void *out, size_t n)
{
	size_t k = n < in->n ? n : in->n;

	memcpy(out, in->p, k);
	memset((uint8_t *)out + k, 0, n - k);
	in->p += k;
	in->n -= k;
	return k;
}

/* ------------------------------------------------------------------ */
/* The process                                                         */
/* ------------------------------------------------------------------ */

static char fz_rundir[64];

static inline void fz_rundir_remove(void)
{
	if (fz_rundir[0])
		rmdir(fz_rundir); /* fails, harmlessly, if an engine left something */
}

/* Once per process, before the first engine. */
static inline void fz_setup(void)
{
	static bool done;
	const char *lv = getenv("FERRY_FUZZ_LOG");

	if (done)
		return;
	done = true;
	signal(SIGPIPE, SIG_IGN);
	if (!getenv("FERRY_RUNTIME_DIR")) {
		snprintf(fz_rundir, sizeof(fz_rundir), "/tmp/ferry-fuzz-XXXXXX");
		if (mkdtemp(fz_rundir)) {
			setenv("FERRY_RUNTIME_DIR", fz_rundir, 1);
			atexit(fz_rundir_remove);
		} else {
			fz_rundir[0] = '\0';
		}
	}
	if (!lv || !*lv)
		ferry_log_set(-1, NULL, NULL);
	else
		ferry_log_set(strcmp(lv, "debug") == 0  ? FERRY_LOG_DEBUG
			      : strcmp(lv, "info") == 0 ? FERRY_LOG_INFO
			      : strcmp(lv, "warn") == 0 ? FERRY_LOG_WARN
							: FERRY_LOG_ERROR,
			      NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* Engines                                                             */
/* ------------------------------------------------------------------ */

#define FZ_NS "fz"
#define FZ_SECRET "fuzz-cluster-secret"

struct fz_engine_opts {
	const char *name;
	const char *listen;  /* tcp, or NULL */
	const char *control; /* the control channel, or NULL */
	size_t pool;         /* 0: 8 MiB */
};

/* An engine of the harness, in namespace FZ_NS with secret FZ_SECRET; aborts if none. */
static inline struct ferry_engine *fz_engine(const struct fz_engine_opts *o)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	fz_setup();
	p.name = o->name;
	p.ns = FZ_NS;
	p.pool_size = o->pool ? o->pool : 8u << 20;
	p.progress = FERRY_PROGRESS_MANUAL;
	p.max_ops = 256;
	p.max_keys = 1024;
	p.max_bufs = 1024;
	p.listen = o->listen;
	p.control = o->control;
	p.secret = FZ_SECRET;
	rc = ferry_engine_create(&p, &e);
	if (rc)
		FZ_FAIL("engine %s: %s", o->name, ferry_strerror(rc));
	return e;
}

static inline struct ferry_peer *fz_peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p = NULL;

	if (ferry_peer_open(e, name, &p))
		FZ_FAIL("peer %s", name);
	return p;
}

/*
 * Drive e until it is quiet: two rounds in a row that did nothing, or
 * max rounds. Returns the rounds run.
 */
static inline int fz_settle(struct ferry_engine *e, int max)
{
	int idle = 0, i;

	for (i = 0; i < max && idle < 2; i++)
		idle = ferry_progress(e) > 0 ? 0 : idle + 1;
	return i;
}

static inline struct ferry_sqe *fz_sqe(struct ferry_engine *e, struct ferry_sq **sqp)
{
	struct ferry_sqe *sqe;

	if (ferry_sq_get(e, sqp))
		FZ_FAIL("no submission queue");
	sqe = ferry_sq_get_sqe(*sqp);
	if (!sqe)
		FZ_FAIL("submission queue full");
	return sqe;
}

/* A PUT of len bytes (a pool buffer) under key to `to`. */
static inline void fz_put(struct ferry_engine *e, struct ferry_peer *to, const char *key,
			  size_t len, uint64_t user_data)
{
	struct ferry_sq *sq;
	struct ferry_buf *b;
	struct ferry_sqe *sqe;

	if (ferry_buf_alloc(e, len, &b))
		FZ_FAIL("no pool buffer of %zu bytes", len);
	memset(ferry_buf_data(b), 0x5a, len);
	sqe = fz_sqe(e, &sq);
	ferry_prep_put_buf(sqe, to, key, b, user_data);
	ferry_sqe_set_timeout(sqe, 10ull * 1000000000ull);
	ferry_sq_submit(sq);
}

/* Drop what e holds of request key (from `from`, NULL: anyone): CLEANUP. */
static inline void fz_cleanup(struct ferry_engine *e, struct ferry_peer *from, const char *key)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;

	if (!key[0] || strlen(key) >= FERRY_KEY_MAX)
		return;
	sqe = fz_sqe(e, &sq);
	ferry_prep_cleanup(sqe, from, key, 0);
	ferry_sq_submit(sq);
}

/* Take every completion of e's default CQ (buffers released); returns how many. */
static inline unsigned fz_reap(struct ferry_engine *e)
{
	struct ferry_cqe c[32];
	unsigned total = 0;
	int n;

	while ((n = ferry_cq_poll(ferry_cq_default(e), c, 32)) > 0) {
		for (int i = 0; i < n; i++) {
			if (getenv("FERRY_FUZZ_LOG"))
				fprintf(stderr, "fuzz: %s: completion %llu: res %d (%s), %llu bytes\n",
					ferry_engine_name(e), (unsigned long long)c[i].user_data,
					c[i].res, ferry_strerror(c[i].res),
					(unsigned long long)c[i].len);
			if (c[i].buf)
				ferry_buf_release(c[i].buf);
		}
		total += (unsigned)n;
	}
	return total;
}

static inline uint64_t fz_pool_blocks(struct ferry_engine *e)
{
	struct pool_stats ps;

	pool_get_stats(e->pool, &ps);
	return ps.blocks_in_use;
}

/* Open file descriptors of this process. */
static inline int fz_fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1; /* d's own */
}

/* The open fds and what they are, to stderr (when an fd count went wrong). */
static inline void fz_fd_dump(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	while (d && (de = readdir(d))) {
		char path[300], target[256];
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = '\0';
		fprintf(stderr, "fuzz: fd %s: %s\n", de->d_name, target);
	}
	if (d)
		closedir(d);
}

/*
 * What an engine holds when idle: after an input it must hold no more.
 * The blocks are taken once, when the engine is made; the fds at the start
 * of each input (fz_idle_fds), since libFuzzer opens some of its own
 * between inputs (the pipes of its symbolizer).
 */
struct fz_idle {
	uint64_t blocks; /* pool blocks in use */
	int fds;         /* open fds of the process, or -1: not checked */
};

static inline void fz_idle_take(struct ferry_engine *e, struct fz_idle *idle, bool fds)
{
	idle->blocks = fz_pool_blocks(e);
	idle->fds = fds ? fz_fd_count() : -1;
}

static inline void fz_idle_fds(struct fz_idle *idle)
{
	if (idle->fds >= 0)
		idle->fds = fz_fd_count();
}

/*
 * After an input: e drops every key it was given and finishes what is
 * away; it must then hold no more pool blocks than idle (a block a peer's
 * misbehaviour left behind is a leak, found here rather than when the pool
 * runs dry) and, when counted, the process no more fds (a descriptor a
 * peer handed over and nobody closed). keys: the keys the input may have
 * stored (NUL-separated, ended by ""), dropped with a CLEANUP each.
 */
static inline void fz_engine_clean(struct ferry_engine *e, struct ferry_peer *from,
				   const char *keys, const struct fz_idle *idle)
{
	uint64_t start = 0;
	int round;

	for (const char *k = keys; k && *k; k += strlen(k) + 1)
		fz_cleanup(e, from, k);
	/*
	 * Rounds until it holds nothing more, for at most 2 s: the kernel may
	 * take a moment (io_uring cancels, a poll that sees the hang-up), more
	 * on a loaded machine; only a leak waits it out.
	 */
	for (round = 0;; round++) {
		ferry_progress(e);
		fz_reap(e);
		if (round >= 4 && fz_pool_blocks(e) <= idle->blocks &&
		    (idle->fds < 0 || fz_fd_count() <= idle->fds))
			break;
		if (round == 200)
			start = ferry__now_ns();
		if (round > 200) {
			if (ferry__now_ns() - start > 2000000000ull)
				break;
			usleep(100);
		}
	}
	if (fz_pool_blocks(e) > idle->blocks)
		FZ_FAIL("engine %s holds %llu pool blocks after the input (%llu before)",
			ferry_engine_name(e), (unsigned long long)fz_pool_blocks(e),
			(unsigned long long)idle->blocks);
	if (idle->fds >= 0 && fz_fd_count() > idle->fds) {
		fz_fd_dump();
		FZ_FAIL("%d file descriptors open after the input (%d before)", fz_fd_count(),
			idle->fds);
	}
}

/* A list of keys (NUL-separated, ended by ""), bounded. */
struct fz_keys {
	char buf[8192];
	size_t len;
};

static inline void fz_keys_add(struct fz_keys *k, const void *key, size_t n)
{
	if (n == 0 || n >= FERRY_KEY_MAX || k->len + n + 2 > sizeof(k->buf))
		return;
	if (memchr(key, '\0', n))
		return;
	memcpy(k->buf + k->len, key, n);
	k->len += n;
	k->buf[k->len++] = '\0';
	k->buf[k->len] = '\0';
}

/*
 * The harness's LLVMFuzzerInitialize: setup_fn() once before the first
 * input (libFuzzer, or fuzz/replay.c), teardown_fn() at exit.
 */
#define FZ_INITIALIZE(setup_fn, teardown_fn)                \
	int LLVMFuzzerInitialize(int *argc, char ***argv)   \
	{                                                   \
		(void)argc;                                 \
		(void)argv;                                 \
		setup_fn();                                 \
		atexit(teardown_fn);                        \
		return 0;                                   \
	}

#endif

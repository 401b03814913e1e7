/*
 * bench/bench_shm.c - the shared-memory transport between two processes,
 * against its floors and its peers, in one run.
 *
 * The program forks one peer process before any engine exists (engines do
 * not survive fork); the parent (CPU 0) and the child (CPU 1) are pinned
 * with sched_setaffinity, for the floors and for ferry alike, and drive one
 * ferry engine each, found by (namespace, name) in a private
 * FERRY_RUNTIME_DIR. The parent sends the child commands over a pipe; the
 * child answers over another and writes timestamps into a shared page.
 *
 * Prints ONE JSON object on stdout (progress goes to stderr):
 *   floor       bare shared-memory 64 B ping-pong (both spinning), eventfd
 *               ping-pong (both blocked in read(): the cross-core wake-up),
 *               memcpy of every bandwidth size
 *   latency_64B one-way = RTT / 2 of a ping-pong between the two engines:
 *               A PUTs k_i to B, B GETs it and PUTs r_i back, A GETs r_i;
 *               busy (MANUAL, both callers spinning in ferry_cq_poll, with
 *               default engines and with one-poller ones, SINGLE_POLLER |
 *               BUSY_POLL, as UCX's single-thread worker; and
 *               THREAD with a spin that never ends, callbacks on the
 *               reactor) and adaptive (THREAD, default spin, a pause between
 *               round trips so that every thread sleeps)
 *   bandwidth   64 KiB / 4 MiB / 64 MiB / 1 GiB streamed with a window, MANUAL
 *               mode: zero-copy (pool buffer PUT, GET zero-copy + release)
 *               and copy (PUT of an iovec: one copy into the sender's pool;
 *               GET zero-copy + release)
 *   put_get_190MB  one 190,000,000 B payload: PUT submit -> GET complete
 *   ucx         ucx_perftest UCX_TLS=shm tag_lat / tag_bw, and tag_sync_lat
 *               64 B (a send acknowledged once matched, as a PUT is: the
 *               like-for-like peer) (bench/peers_shm.sh),
 *               one run of each after each rep of the busy MANUAL ping-pong
 *               (the machine's speed changes from minute to minute; ferry's
 *               rep r and UCX's are measured side by side: paired_vs_ucx)
 *   targets     pass / fail / n/a of the targets
 * Every figure is the median (and min/max) over --reps repetitions.
 *
 * Options: --quick (CI smoke, < 30 s: fewer samples, no 1 GiB), --reps N
 * (default 5; 3 with --quick), --no-ucx (skip the UCX peers), --only
 * SECTIONS, --engine-flags busy_poll,single_poller (FERRY_ENGINE_* flags of
 * every engine; single_poller of the MANUAL ones).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)
#define GIB ((size_t)1024 * 1024 * 1024)
#define BIG_PAYLOAD ((size_t)190000000)

#define UD_PUT (1ull << 62)
#define UD_GET (2ull << 62)
#define UD_MASK (3ull << 62)

static struct {
	bool quick;
	int reps;
	bool no_ucx;
	const char *only; /* comma-separated sections, NULL = all */
	const char *engine_flags; /* --engine-flags, NULL = none */
	uint32_t flags;           /* FERRY_ENGINE_* from it */
} opt;

/* Whether section name runs (--only). */
static bool want(const char *name)
{
	const char *p = opt.only;
	size_t n = strlen(name);

	if (!p)
		return true;
	while ((p = strstr(p, name))) {
		if ((p == opt.only || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
			return true;
		p += n;
	}
	return false;
}



#include "bench_util.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* ------------------------------------------------------------------ */
/* The two processes: commands, shared page, pinning                   */
/* ------------------------------------------------------------------ */

enum cmd_op {
	C_QUIT = 0,
	C_SPIN,       /* n: cache-line ping-pong */
	C_EVENTFD,    /* n: eventfd ping-pong */
	C_OPEN,       /* create engine (mode, spin_ns, pool, ns) */
	C_CLOSE,      /* destroy it */
	C_LAT,        /* n round trips; variant: 0 copy, 1 zero-copy; cb: reactor callbacks */
	C_BW,         /* n GETs of keys b<seq..>, zero-copy, release each */
	C_BIG,        /* one GET of key g<seq>, check stamps, timestamp */
};

struct cmd {
	int op;
	int variant;
	int cb;
	int mode;
	uint64_t n;
	uint64_t seq;
	uint64_t spin_ns;
	uint64_t pool;
	uint64_t size;
	int sleep_wait; /* C_OPEN, MANUAL: wait in ferry_cq_wait (spin, then sleep) */
	uint32_t flags; /* C_OPEN: FERRY_ENGINE_* of this pair, besides --engine-flags */
	char ns[32];
};

struct reply {
	int rc;
	int pad;
	uint64_t v;
};

/* The shared page: two cache lines for the spin floor, timestamps. */
struct shared {
	_Alignas(64) _Atomic uint64_t ping;
	uint8_t ping_payload[56];
	_Alignas(64) _Atomic uint64_t pong;
	uint8_t pong_payload[56];
	_Alignas(64) _Atomic uint64_t t_done;  /* child: CLOCK_MONOTONIC of its last GET */
	_Atomic uint64_t child_err;
};

static struct shared *shm;
static int cmd_fd[2], rep_fd[2];
static int efd_a, efd_b; /* eventfds: parent -> child, child -> parent */
static pid_t child_pid;
static int cpu_parent = -1, cpu_child = -1;

static void xwrite(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = write(fd, c, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("write(pipe)", -errno);
		c += w;
		n -= (size_t)w;
	}
}

static void xread(int fd, void *p, size_t n)
{
	char *c = p;

	while (n) {
		ssize_t r = read(fd, c, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0)
			die("read(pipe): peer process gone", -EPIPE);
		if (r < 0)
			die("read(pipe)", -errno);
		c += r;
		n -= (size_t)r;
	}
}

static void reply(int rc, uint64_t v)
{
	struct reply r = { rc, 0, v };

	xwrite(rep_fd[1], &r, sizeof(r));
}

static struct reply get_reply(void)
{
	struct reply r;

	xread(rep_fd[0], &r, sizeof(r));
	if (r.rc < 0)
		die("peer process", r.rc);
	return r;
}

static void send_cmd(const struct cmd *c)
{
	xwrite(cmd_fd[1], c, sizeof(*c));
}

static int pin_to(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return -1;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set) ? -errno : 0;
}

/* ------------------------------------------------------------------ */
/* Engines                                                             */
/* ------------------------------------------------------------------ */

/*
 * The busy_manual_one_poller pair's flags: one polling thread per engine, no
 * fence for sleepers (the promise a UCS_THREAD_MODE_SINGLE UCX worker makes).
 */
#define ONE_POLLER (FERRY_ENGINE_SINGLE_POLLER | FERRY_ENGINE_BUSY_POLL)

static struct ferry_engine *engine(const char *ns, const char *name, int mode, uint64_t spin_ns,
				   size_t pool, uint32_t flags)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = ns;
	p.progress = (enum ferry_progress_mode)mode;
	p.spin_ns = spin_ns;
	p.pool_size = pool;
	p.flags = opt.flags | flags; /* --engine-flags: single_poller for MANUAL engines only */
	if (mode != FERRY_PROGRESS_MANUAL)
		p.flags &= ~FERRY_ENGINE_SINGLE_POLLER;
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

static struct ferry_peer *peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p;

	CHECK(ferry_peer_open(e, name, &p));
	return p;
}

static struct ferry_sqe *sqe_of(struct ferry_engine *e, struct ferry_sq *sq)
{
	struct ferry_sqe *sqe;

	while (!(sqe = ferry_sq_get_sqe(sq))) {
		struct ferry_cqe c;

		ferry_sq_submit(sq);
		ferry_progress(e);
		(void)c;
	}
	return sqe;
}

/*
 * One batch of completions: busy = spin in ferry_cq_poll (MANUAL, or a
 * THREAD engine whose caller spins), else sleep in ferry_cq_wait.
 */
static int next_cqes(struct ferry_engine *e, bool busy, struct ferry_cqe *c, unsigned max)
{
	struct ferry_cq *cq = ferry_cq_default(e);
	int n;

	if (busy) {
		do {
			n = ferry_cq_poll(cq, c, max);
		} while (n == 0);
	} else {
		do {
			n = ferry_cq_wait(cq, c, max, -1);
		} while (n == 0 || n == -EINTR);
	}
	if (n < 0)
		die("ferry_cq_poll/wait", n);
	return n;
}

/* ------------------------------------------------------------------ */
/* Latency ping-pong with reactor callbacks (THREAD, busy)              */
/* ------------------------------------------------------------------ */

/*
 * Both sides run the ping-pong inside FERRY_SQE_CB_REACTOR callbacks on
 * their reactor threads (spinning forever); the main threads sleep. This is
 * the only way to have THREAD mode "busy" on 2 vCPUs without four spinning
 * threads fighting for two cores.
 */
struct cbpp {
	struct ferry_engine *e;
	struct ferry_sq *sq; /* the reactor thread's */
	struct ferry_peer *to;
	bool initiator;
	bool zc;
	uint64_t i, n, t0;
	uint64_t *samples;
	_Atomic uint64_t puts_done;
	_Atomic int finished;
	int err;
	char out[64], in[64];
	struct iovec out_iov, in_iov;
};

static void cbpp_put_cb(const struct ferry_cqe *c, void *arg);
static void cbpp_get_cb(const struct ferry_cqe *c, void *arg);

/* Submit PUT (out key) and GET (in key) of round i from the current thread. */
static void cbpp_send(struct cbpp *s, struct ferry_sq *sq, uint64_t i, bool with_get, bool with_put)
{
	char key[32];
	struct ferry_sqe *sqe;

	if (with_put) {
		key_of(key, s->initiator ? 'k' : 'r', i);
		sqe = sqe_of(s->e, sq);
		if (s->zc) {
			struct ferry_buf *b;

			while (ferry_buf_alloc(s->e, 64, &b))
				;
			memcpy(ferry_buf_data(b), s->out, 64);
			ferry_prep_put_buf(sqe, s->to, key, b, UD_PUT | i);
		} else {
			ferry_prep_put(sqe, s->to, key, &s->out_iov, 1, UD_PUT | i);
		}
		ferry_sqe_set_callback(sqe, cbpp_put_cb, s);
		ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	}
	if (with_get) { /* after the PUT: it is posted while the PUT travels */
		key_of(key, s->initiator ? 'r' : 'k', i);
		sqe = sqe_of(s->e, sq);
		ferry_prep_get(sqe, s->to, key, s->zc ? NULL : &s->in_iov, s->zc ? 0 : 1, UD_GET | i);
		ferry_sqe_set_callback(sqe, cbpp_get_cb, s);
		ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	}
	ferry_sq_submit(sq);
}

static void cbpp_put_cb(const struct ferry_cqe *c, void *arg)
{
	struct cbpp *s = arg;

	if (c->res < 0)
		s->err = c->res;
	atomic_fetch_add(&s->puts_done, 1);
}

static void cbpp_get_cb(const struct ferry_cqe *c, void *arg)
{
	struct cbpp *s = arg;
	uint64_t t1 = now_ns();

	if (c->res < 0)
		s->err = c->res;
	if (c->buf)
		ferry_buf_release(c->buf);
	if (!s->sq && ferry_sq_get(s->e, &s->sq))
		s->err = -ENOMEM;
	if (s->initiator) {
		s->samples[s->i] = t1 - s->t0;
		s->i++;
		if (s->i < s->n && !s->err) {
			s->t0 = now_ns();
			cbpp_send(s, s->sq, s->i, true, true);
			return;
		}
	} else {
		/* Answer round i, then wait for round i + 1. */
		uint64_t i = s->i++;

		cbpp_send(s, s->sq, i, false, true);
		if (s->i < s->n && !s->err) {
			cbpp_send(s, s->sq, s->i, true, false);
			return;
		}
	}
	atomic_store(&s->finished, 1);
}

static void cbpp_wait(struct cbpp *s)
{
	struct timespec ms = { 0, 1000000 };

	while (!atomic_load(&s->finished) || atomic_load(&s->puts_done) < s->n)
		nanosleep(&ms, NULL);
	if (s->err)
		die("ping-pong on the reactor", s->err);
}

/* ------------------------------------------------------------------ */
/* The child process                                                   */
/* ------------------------------------------------------------------ */

static void child_lat(struct ferry_engine *e, bool busy, const struct cmd *c)
{
	struct ferry_peer *to = peer(e, "a");
	struct ferry_sq *sq;
	char out[64], in[64];
	struct iovec out_iov = { out, sizeof(out) }, in_iov = { in, sizeof(in) };
	bool zc = c->variant == 1;
	uint64_t served = 0, puts = 0;
	char key[32];

	memset(out, 'r', sizeof(out));
	if (c->cb) {
		struct cbpp s = { .e = e, .to = to, .initiator = false, .zc = zc, .n = c->n };
		struct ferry_sq *msq;

		s.out_iov = (struct iovec){ s.out, sizeof(s.out) };
		s.in_iov = (struct iovec){ s.in, sizeof(s.in) };
		memset(s.out, 'r', sizeof(s.out));
		CHECK(ferry_sq_get(e, &msq));
		cbpp_send(&s, msq, 0, true, false);
		reply(0, 0); /* ready */
		cbpp_wait(&s);
		reply(0, s.n);
		return;
	}
	CHECK(ferry_sq_get(e, &sq));
	snprintf(key, sizeof(key), "k0");
	ferry_prep_get(sqe_of(e, sq), to, key, zc ? NULL : &in_iov, zc ? 0 : 1, UD_GET | 0);
	ferry_sq_submit(sq);
	reply(0, 0); /* ready: the first GET waits */
	while (served < c->n || puts < c->n) {
		struct ferry_cqe cq[16];
		int n = next_cqes(e, busy, cq, 16);

		for (int k = 0; k < n; k++) {
			if (cq[k].res < 0)
				die("child latency op", cq[k].res);
			if ((cq[k].user_data & UD_MASK) == UD_PUT) {
				puts++;
				continue;
			}
			if (cq[k].buf)
				ferry_buf_release(cq[k].buf);
			key_of(key, 'r', served);
			if (zc) {
				struct ferry_buf *b;
				int rc;

				while ((rc = ferry_buf_alloc(e, 64, &b)) == -ENOMEM)
					ferry_progress(e);
				CHECK(rc);
				memcpy(ferry_buf_data(b), out, 64);
				ferry_prep_put_buf(sqe_of(e, sq), to, key, b, UD_PUT | served);
			} else {
				ferry_prep_put(sqe_of(e, sq), to, key, &out_iov, 1, UD_PUT | served);
			}
			served++;
			if (served < c->n) {
				key_of(key, 'k', served);
				ferry_prep_get(sqe_of(e, sq), to, key, zc ? NULL : &in_iov, zc ? 0 : 1,
					       UD_GET | served);
			}
			ferry_sq_submit(sq);
		}
	}
	reply(0, served);
}

static void child_bw(struct ferry_engine *e, bool busy, const struct cmd *c)
{
	struct ferry_peer *from = peer(e, "a");
	struct ferry_sq *sq;
	uint64_t posted = 0, got = 0, ahead = 64;
	char key[32];

	CHECK(ferry_sq_get(e, &sq));
	while (posted < c->n && posted < ahead) {
		snprintf(key, sizeof(key), "b%llu", (unsigned long long)(c->seq + posted));
		ferry_prep_get(sqe_of(e, sq), from, key, NULL, 0, UD_GET | posted);
		posted++;
	}
	ferry_sq_submit(sq);
	reply(0, 0);
	while (got < c->n) {
		struct ferry_cqe cq[32];
		int n = next_cqes(e, busy, cq, 32);

		for (int k = 0; k < n; k++) {
			if (cq[k].res < 0)
				die("child GET", cq[k].res);
			if (cq[k].len != c->size)
				die("child GET: wrong length", -EPROTO);
			ferry_buf_release(cq[k].buf);
			got++;
			if (posted < c->n) {
				snprintf(key, sizeof(key), "b%llu", (unsigned long long)(c->seq + posted));
				ferry_prep_get(sqe_of(e, sq), from, key, NULL, 0, UD_GET | posted);
				posted++;
			}
		}
		if (got == c->n)
			atomic_store(&shm->t_done, now_ns());
		ferry_sq_submit(sq);
	}
	/*
	 * MANUAL mode: the RELEASE of the last block leaves with our next
	 * round. Run it now, or the sender's next large allocation waits for
	 * a block we hold no more while we wait for its next command.
	 */
	ferry_progress(e);
	reply(0, got);
}

static void child_big(struct ferry_engine *e, bool busy, const struct cmd *c)
{
	struct ferry_peer *from = peer(e, "a");
	struct ferry_sq *sq;
	struct ferry_cqe cq;
	const uint64_t *w;
	char key[32];
	int bad = 0;

	CHECK(ferry_sq_get(e, &sq));
	snprintf(key, sizeof(key), "g%llu", (unsigned long long)c->seq);
	ferry_prep_get(sqe_of(e, sq), from, key, NULL, 0, UD_GET);
	ferry_sq_submit(sq);
	reply(0, 0);
	next_cqes(e, busy, &cq, 1);
	atomic_store(&shm->t_done, now_ns());
	if (cq.res < 0)
		die("child big GET", cq.res);
	w = ferry_buf_data(cq.buf);
	/* The sender stamped the first and the last word with seq. */
	if (cq.len != c->size || w[0] != c->seq || w[c->size / 8 - 1] != c->seq)
		bad = 1;
	ferry_buf_release(cq.buf);
	reply(bad ? -EPROTO : 0, cq.len);
}

static int child_main(void)
{
	struct ferry_engine *e = NULL;
	int mode = 0;
	bool busy = true;

	who = "bench_shm[peer]";
	pin_to(cpu_child);
	for (;;) {
		struct cmd c;

		xread(cmd_fd[0], &c, sizeof(c));
		switch (c.op) {
		case C_QUIT:
			if (e)
				ferry_engine_destroy(e);
			return 0;
		case C_SPIN:
			for (uint64_t i = 1; i <= c.n; i++) {
				uint8_t tmp[56];

				while (atomic_load_explicit(&shm->ping, memory_order_acquire) != i)
					cpu_relax();
				memcpy(tmp, shm->ping_payload, sizeof(tmp));
				memcpy(shm->pong_payload, tmp, sizeof(tmp));
				atomic_store_explicit(&shm->pong, i, memory_order_release);
			}
			reply(0, c.n);
			break;
		case C_EVENTFD:
			for (uint64_t i = 0; i < c.n; i++) {
				uint64_t v;

				if (read(efd_a, &v, sizeof(v)) != sizeof(v))
					die("read(eventfd)", -errno);
				v = 1;
				if (write(efd_b, &v, sizeof(v)) != sizeof(v))
					die("write(eventfd)", -errno);
			}
			reply(0, c.n);
			break;
		case C_OPEN:
			mode = c.mode;
			/* "busy": MANUAL, or THREAD whose reactor never sleeps. */
			busy = mode == FERRY_PROGRESS_MANUAL && !c.sleep_wait;
			e = engine(c.ns, "b", mode, c.spin_ns, c.pool, c.flags);
			reply(0, 0);
			break;
		case C_CLOSE:
			CHECK(ferry_engine_destroy(e));
			e = NULL;
			reply(0, 0);
			break;
		case C_LAT:
			child_lat(e, busy, &c);
			break;
		case C_BW:
			child_bw(e, busy, &c);
			break;
		case C_BIG:
			child_big(e, busy, &c);
			break;
		default:
			reply(-EINVAL, 0);
		}
	}
}

/* ------------------------------------------------------------------ */
/* Floors                                                              */
/* ------------------------------------------------------------------ */

struct lat_result {
	struct stat3 p50, p99; /* one-way, ns */
	uint64_t samples;      /* per rep */
};

static struct lat_result lat_from_n(double *p50, double *p99, uint64_t samples, int reps)
{
	struct lat_result r;

	r.p50 = stat_of(p50, reps);
	r.p99 = stat_of(p99, reps);
	r.samples = samples;
	return r;
}

static struct lat_result lat_from(double *p50, double *p99, uint64_t samples)
{
	return lat_from_n(p50, p99, samples, opt.reps);
}

/* Shared cache lines, both processes spinning; one-way = RTT / 2. */
static struct lat_result floor_spin(uint64_t n)
{
	struct cmd c = { .op = C_SPIN, .n = n * (uint64_t)(opt.reps + 1) };
	uint64_t *s = malloc(sizeof(uint64_t) * n), seq = 0;
	double p50[64], p99[64];
	uint8_t tmp[56];

	memset(tmp, 7, sizeof(tmp));
	atomic_store(&shm->ping, 0);
	atomic_store(&shm->pong, 0);
	send_cmd(&c);
	for (int r = -1; r < opt.reps; r++) {
		for (uint64_t i = 0; i < n; i++) {
			uint64_t t0 = now_ns();

			seq++;
			memcpy(shm->ping_payload, tmp, sizeof(tmp));
			atomic_store_explicit(&shm->ping, seq, memory_order_release);
			while (atomic_load_explicit(&shm->pong, memory_order_acquire) != seq)
				cpu_relax();
			memcpy(tmp, shm->pong_payload, sizeof(tmp));
			s[i] = (now_ns() - t0) / 2;
		}
		if (r >= 0) {
			p50[r] = pct(s, n, 50);
			p99[r] = pct(s, n, 99);
		}
	}
	get_reply();
	free(s);
	return lat_from(p50, p99, n);
}

/* eventfd ping-pong, each side blocked in read(): the cross-core wake-up. */
/*
 * Cross-core wake-up floor: an eventfd ping-pong, each side blocked in
 * read(). With pause_ns, the initiator sleeps that long before each round
 * trip, so both sides are asleep between messages exactly as in ferry's
 * adaptive measurement (an idle vCPU wakes slower than a busy one).
 */
static struct lat_result floor_eventfd(uint64_t n, uint64_t pause_ns)
{
	struct cmd c = { .op = C_EVENTFD, .n = n * (uint64_t)(opt.reps + 1) };
	uint64_t *s = malloc(sizeof(uint64_t) * n);
	double p50[64], p99[64];
	struct timespec pause = { 0, (long)pause_ns };

	send_cmd(&c);
	for (int r = -1; r < opt.reps; r++) {
		for (uint64_t i = 0; i < n; i++) {
			uint64_t v = 1, t0;

			if (pause_ns)
				nanosleep(&pause, NULL);
			t0 = now_ns();

			if (write(efd_a, &v, sizeof(v)) != sizeof(v) ||
			    read(efd_b, &v, sizeof(v)) != sizeof(v))
				die("eventfd ping-pong", -errno);
			s[i] = (now_ns() - t0) / 2;
		}
		if (r >= 0) {
			p50[r] = pct(s, n, 50);
			p99[r] = pct(s, n, 99);
		}
	}
	get_reply();
	free(s);
	return lat_from(p50, p99, n);
}

/* ------------------------------------------------------------------ */
/* ferry latency                                                       */
/* ------------------------------------------------------------------ */

struct pair {
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_sq *sq;
	int mode;
	bool busy; /* the caller spins in ferry_cq_poll */
};

static int ns_seq;

static void pair_open_flags(struct pair *p, int mode, uint64_t spin_ns, size_t pool_a,
			    size_t pool_b, bool busy, uint32_t flags)
{
	struct cmd c = { .op = C_OPEN, .mode = mode, .spin_ns = spin_ns, .pool = pool_b,
			 .sleep_wait = mode == FERRY_PROGRESS_MANUAL && !busy, .flags = flags };

	snprintf(c.ns, sizeof(c.ns), "bench_shm.%d", ns_seq++);
	send_cmd(&c);
	get_reply();
	p->e = engine(c.ns, "a", mode, spin_ns, pool_a, flags);
	p->to = peer(p->e, "b");
	CHECK(ferry_sq_get(p->e, &p->sq));
	p->mode = mode;
	p->busy = busy;
}

static void pair_open(struct pair *p, int mode, uint64_t spin_ns, size_t pool_a, size_t pool_b,
		      bool busy)
{
	pair_open_flags(p, mode, spin_ns, pool_a, pool_b, busy, 0);
}

static void pair_close(struct pair *p)
{
	struct cmd c = { .op = C_CLOSE };

	send_cmd(&c);
	get_reply();
	CHECK(ferry_engine_destroy(p->e));
	p->e = NULL;
}

/*
 * Ping-pong of 64 B: per round trip the parent posts PUT k_i and GET r_i in
 * one submit (the PUT first: the GET is posted while the PUT travels, as an
 * application that expects an answer would) and stops the clock at the
 * GET's completion. variant 0: PUT of
 * an iovec (one 64 B copy into the pool), GET into an iovec (one copy out);
 * variant 1: PUT of a pool buffer, zero-copy GET + release. pause_ns > 0
 * sleeps between round trips (adaptive mode). One-way = RTT / 2.
 */
static struct lat_result lat_bench_reps(struct pair *p, int variant, bool cb, uint64_t n,
					uint64_t pause_ns, int reps)
{
	uint64_t warm = n / 10 + 10, total = warm + n * (uint64_t)reps;
	struct cmd c = { .op = C_LAT, .variant = variant, .cb = cb, .n = total };
	uint64_t *s = malloc(sizeof(uint64_t) * total), puts = 0;
	double p50[64], p99[64];
	char out[64], in[64];
	struct iovec out_iov = { out, sizeof(out) }, in_iov = { in, sizeof(in) };
	bool zc = variant == 1;
	struct timespec pause = { 0, (long)pause_ns };

	memset(out, 'k', sizeof(out));
	send_cmd(&c);
	get_reply(); /* the peer's first GET waits */
	if (cb) {
		struct cbpp st = { .e = p->e, .to = p->to, .initiator = true, .zc = zc, .n = total,
				   .samples = s };

		st.out_iov = (struct iovec){ st.out, sizeof(st.out) };
		st.in_iov = (struct iovec){ st.in, sizeof(st.in) };
		memset(st.out, 'k', sizeof(st.out));
		st.t0 = now_ns();
		cbpp_send(&st, p->sq, 0, true, true);
		cbpp_wait(&st);
	} else {
		for (uint64_t i = 0; i < total; i++) {
			char key[32];
			uint64_t t0;
			bool got = false;

			if (pause_ns)
				nanosleep(&pause, NULL);
			t0 = now_ns();
			key_of(key, 'k', i);
			if (zc) {
				struct ferry_buf *b;
				int rc;

				while ((rc = ferry_buf_alloc(p->e, 64, &b)) == -ENOMEM)
					ferry_progress(p->e);
				CHECK(rc);
				memcpy(ferry_buf_data(b), out, 64);
				ferry_prep_put_buf(sqe_of(p->e, p->sq), p->to, key, b, UD_PUT | i);
			} else {
				ferry_prep_put(sqe_of(p->e, p->sq), p->to, key, &out_iov, 1, UD_PUT | i);
			}
			key_of(key, 'r', i);
			ferry_prep_get(sqe_of(p->e, p->sq), p->to, key, zc ? NULL : &in_iov, zc ? 0 : 1,
				       UD_GET | i);
			ferry_sq_submit(p->sq);
			while (!got) {
				struct ferry_cqe cq[8];
				int k = next_cqes(p->e, p->busy, cq, 8);
				uint64_t t1 = now_ns();

				for (int j = 0; j < k; j++) {
					if (cq[j].res < 0)
						die("latency op", cq[j].res);
					if ((cq[j].user_data & UD_MASK) == UD_PUT) {
						puts++;
						continue;
					}
					s[i] = t1 - t0;
					got = true;
					if (cq[j].buf)
						ferry_buf_release(cq[j].buf);
				}
			}
		}
		while (puts < total) {
			struct ferry_cqe cq[8];
			int k = next_cqes(p->e, p->busy, cq, 8);

			for (int j = 0; j < k; j++) {
				if (cq[j].res < 0)
					die("latency PUT", cq[j].res);
				puts++;
			}
		}
	}
	get_reply();
	for (int r = 0; r < reps; r++) {
		uint64_t *v = s + warm + (uint64_t)r * n;

		for (uint64_t i = 0; i < n; i++)
			v[i] /= 2; /* one way */
		p50[r] = pct(v, n, 50);
		p99[r] = pct(v, n, 99);
	}
	free(s);
	return lat_from_n(p50, p99, n, reps);
}

static struct lat_result lat_bench(struct pair *p, int variant, bool cb, uint64_t n,
				   uint64_t pause_ns)
{
	return lat_bench_reps(p, variant, cb, n, pause_ns, opt.reps);
}

/* ------------------------------------------------------------------ */
/* Bandwidth                                                           */
/* ------------------------------------------------------------------ */

struct bw_result {
	size_t size;
	uint64_t iters, window;
	struct stat3 memcpy_gbps, memcpy_pool_gbps, zc_gbps, copy_gbps, zc_us;
	double ratio_copy_memcpy, ratio_copy_memcpy_paired;
	bool measured;
};

static uint64_t bw_seq;

/*
 * Stream iters transfers of size with up to window PUTs in flight; the child
 * GETs each (zero copy) and releases it at once. Time: parent's first
 * submit to the child's last GET completion (CLOCK_MONOTONIC, same host).
 */
static double bw_stream(struct pair *p, size_t size, uint64_t iters, uint64_t window, bool copy,
			const char *src)
{
	struct cmd c = { .op = C_BW, .n = iters, .seq = bw_seq, .size = size };
	struct iovec iov = { (void *)src, size };
	uint64_t sent = 0, done = 0, t0;
	struct ferry_cqe cq[32];

	bw_seq += iters;
	send_cmd(&c);
	get_reply(); /* its first GETs wait */
	t0 = now_ns();
	while (done < iters) {
		bool more = false;

		while (sent < iters && sent - done < window) {
			char key[32];

			snprintf(key, sizeof(key), "b%llu", (unsigned long long)(c.seq + sent));
			if (copy) {
				ferry_prep_put(sqe_of(p->e, p->sq), p->to, key, &iov, 1, UD_PUT | sent);
			} else {
				struct ferry_buf *b;
				int rc = ferry_buf_alloc(p->e, size, &b);

				if (rc == -ENOMEM)
					break; /* blocks still at the peer: wait for releases */
				CHECK(rc);
				ferry_prep_put_buf(sqe_of(p->e, p->sq), p->to, key, b, UD_PUT | sent);
			}
			sent++;
			more = true;
		}
		if (more)
			ferry_sq_submit(p->sq);
		int k = ferry_cq_poll(ferry_cq_default(p->e), cq, 32);

		if (k < 0)
			die("ferry_cq_poll", k);
		for (int j = 0; j < k; j++) {
			if (cq[j].res == -ENOMEM && copy) {
				/* Pool full of blocks the peer has not released yet: again. */
				char key[32];
				uint64_t i = cq[j].user_data & ~UD_MASK;

				snprintf(key, sizeof(key), "b%llu", (unsigned long long)(c.seq + i));
				ferry_prep_put(sqe_of(p->e, p->sq), p->to, key, &iov, 1, cq[j].user_data);
				ferry_sq_submit(p->sq);
				continue;
			}
			if (cq[j].res < 0)
				die("bandwidth PUT", cq[j].res);
			done++;
		}
	}
	get_reply();
	return (double)(atomic_load(&shm->t_done) - t0);
}

static struct bw_result bw_bench(struct pair *p, size_t size, uint64_t iters, uint64_t window,
				 char *src, char *dst)
{
	struct bw_result r = { .size = size, .iters = iters, .window = window, .measured = true };
	double mc[64], mp[64], zc[64], cp[64], zus[64], paired[64];
	struct ferry_buf *pb;

	/* warm-up */
	bw_stream(p, size, iters / 4 + 1, window, true, src);
	bw_stream(p, size, iters / 4 + 1, window, false, src);
	for (int i = 0; i < opt.reps; i++) {
		uint64_t t0 = now_ns();
		double ns;

		for (uint64_t k = 0; k < iters; k++) {
			memcpy(dst, src, size);
			clobber(dst);
		}
		mc[i] = (double)size * (double)iters / (double)(now_ns() - t0);
		/*
		 * The copy the engine makes (into a pool block); the block is given
		 * back at once so that it cannot split the pool for the streams.
		 */
		{
			int rc;

			while ((rc = ferry_buf_alloc(p->e, size, &pb)) == -ENOMEM)
				ferry_progress(p->e); /* releases on their way home */
			CHECK(rc);
		}
		t0 = now_ns();
		for (uint64_t k = 0; k < iters; k++) {
			memcpy(ferry_buf_data(pb), src, size);
			clobber(ferry_buf_data(pb));
		}
		mp[i] = (double)size * (double)iters / (double)(now_ns() - t0);
		ferry_buf_release(pb);
		ns = bw_stream(p, size, iters, window, true, src);
		cp[i] = (double)size * (double)iters / ns;
		ns = bw_stream(p, size, iters, window, false, src);
		zc[i] = (double)size * (double)iters / ns;
		zus[i] = ns / (double)iters / 1e3;
		paired[i] = cp[i] / mc[i];
	}
	r.memcpy_gbps = stat_of(mc, opt.reps);
	r.memcpy_pool_gbps = stat_of(mp, opt.reps);
	r.copy_gbps = stat_of(cp, opt.reps);
	r.zc_gbps = stat_of(zc, opt.reps);
	r.zc_us = stat_of(zus, opt.reps);
	r.ratio_copy_memcpy = r.copy_gbps.median / r.memcpy_gbps.median;
	{
		struct stat3 ps = stat_of(paired, opt.reps);

		r.ratio_copy_memcpy_paired = ps.median;
	}
	progress("%7zu KiB: memcpy %.2f GB/s, copy path %.2f GB/s (%.3f), zero-copy %.2f us/transfer",
		 size / KIB, r.memcpy_gbps.median, r.copy_gbps.median, r.ratio_copy_memcpy,
		 r.zc_us.median);
	return r;
}

/* One payload: PUT submit -> the peer's GET complete, in ms; p50 over reps. */
struct big_result {
	struct stat3 ms;    /* per-rep values: median, min, max */
	uint64_t reps;
};

static struct big_result big_bench(struct pair *p, bool copy, int reps, const char *src)
{
	double v[64];
	struct big_result r;
	struct iovec iov = { (void *)src, BIG_PAYLOAD };

	for (int i = 0; i < reps; i++) {
		struct cmd c = { .op = C_BIG, .seq = ++bw_seq, .size = BIG_PAYLOAD };
		struct ferry_cqe cq;
		uint64_t t0;
		char key[32];

		snprintf(key, sizeof(key), "g%llu", (unsigned long long)c.seq);
		send_cmd(&c);
		get_reply(); /* its GET waits */
		if (copy) {
			((uint64_t *)src)[0] = c.seq;
			((uint64_t *)src)[BIG_PAYLOAD / 8 - 1] = c.seq;
			t0 = now_ns();
			ferry_prep_put(sqe_of(p->e, p->sq), p->to, key, &iov, 1, UD_PUT);
		} else {
			struct ferry_buf *b;
			uint64_t *w;

			int rc;
			uint64_t give_up = now_ns() + 5000000000ull;

			/* The previous payload's RELEASE may still be on its way home. */
			while ((rc = ferry_buf_alloc(p->e, BIG_PAYLOAD, &b)) == -ENOMEM &&
			       now_ns() < give_up) {
				struct timespec us10 = { 0, 10000 };

				if (!ferry_progress(p->e) && p->mode == FERRY_PROGRESS_THREAD)
					nanosleep(&us10, NULL);
			}
			CHECK(rc);
			w = ferry_buf_data(b);
			w[0] = c.seq;
			w[BIG_PAYLOAD / 8 - 1] = c.seq;
			t0 = now_ns();
			ferry_prep_put_buf(sqe_of(p->e, p->sq), p->to, key, b, UD_PUT);
		}
		ferry_sq_submit(p->sq);
		next_cqes(p->e, p->busy, &cq, 1);
		if (cq.res < 0)
			die("190 MB PUT", cq.res);
		get_reply();
		v[i] = (double)(atomic_load(&shm->t_done) - t0) / 1e6;
	}
	r.ms = stat_of(v, reps);
	r.reps = (uint64_t)reps;
	return r;
}

/* ------------------------------------------------------------------ */
/* UCX peers                                                           */
/* ------------------------------------------------------------------ */

#define UCX_TESTS 5
#define UCX_SYNC_LAT 4 /* tag_sync_lat 64 B: acknowledged, as ferry's PUT (bench/count.sh) */
static const struct {
	const char *test;
	size_t bytes;
	const char *json;
} ucx_tests[UCX_TESTS] = {
	{ "tag_lat", 8, "tag_lat_8B" },
	{ "tag_lat", 64, "tag_lat_64B" },
	{ "tag_bw", 65536, "tag_bw_64KiB" },
	{ "tag_bw", 4194304, "tag_bw_4MiB" },
	{ "tag_sync_lat", 64, "tag_sync_lat_64B" },
};

struct ucx_result {
	bool installed, ran;
	char version[32], netns[96], error[160];
	double p50_us[UCX_TESTS][64], avg_us[UCX_TESTS][64], gbps[UCX_TESTS][64];
	int n[UCX_TESTS];
	int fails;
};

/* reps runs of every UCX test, their figures appended to u's (zeroed once). */
static void ucx_run(struct ucx_result *u, int reps)
{
	char script[1024], cmdline[1400], line[512];
	const char *dir = getenv("FERRY_BENCH_DIR");
	FILE *f;

	if (dir) {
		snprintf(script, sizeof(script), "%s/peers_shm.sh", dir);
	} else {
		/* The source tree this file was compiled from. */
		char *slash;

		snprintf(script, sizeof(script), "%s", __FILE__);
		slash = strrchr(script, '/');
		if (slash)
			snprintf(slash + 1, sizeof(script) - (size_t)(slash + 1 - script), "peers_shm.sh");
		else
			snprintf(script, sizeof(script), "bench/peers_shm.sh");
	}
	if (access(script, R_OK)) {
		snprintf(u->error, sizeof(u->error), "peers script not found");
		return;
	}
	snprintf(cmdline, sizeof(cmdline), "bash '%s' --reps %d --server-cpu %d --client-cpu %d %s",
		 script, reps, cpu_child < 0 ? 0 : cpu_child, cpu_parent < 0 ? 0 : cpu_parent,
		 opt.quick ? "--quick" : "");
	f = popen(cmdline, "r");
	if (!f) {
		snprintf(u->error, sizeof(u->error), "popen failed");
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char test[32], why[256];
		size_t bytes;
		int rep;
		double p50, avg, mbps, rate;

		line[strcspn(line, "\n")] = '\0';
		if (!strncmp(line, "ucx installed ", 14)) {
			u->installed = true;
			snprintf(u->version, sizeof(u->version), "%.30s", line + 14);
		} else if (!strcmp(line, "ucx not_installed")) {
			u->installed = false;
		} else if (!strncmp(line, "netns ", 6)) {
			snprintf(u->netns, sizeof(u->netns), "%.90s", line + 6);
		} else if (sscanf(line, "run %31s %zu %d %lf %lf %lf %lf", test, &bytes, &rep, &p50,
				  &avg, &mbps, &rate) == 7) {
			for (int t = 0; t < UCX_TESTS; t++) {
				if (strcmp(test, ucx_tests[t].test) || bytes != ucx_tests[t].bytes ||
				    u->n[t] >= 64)
					continue;
				u->p50_us[t][u->n[t]] = p50;
				u->avg_us[t][u->n[t]] = avg;
				u->gbps[t][u->n[t]] = mbps * 1048576.0 / 1e9; /* MiB/s -> GB/s */
				u->n[t]++;
				u->ran = true;
			}
		} else if (sscanf(line, "fail %31s %zu %d %255s", test, &bytes, &rep, why) == 4) {
			u->fails++;
			snprintf(u->error, sizeof(u->error), "%.20s %zu: %.100s", test, bytes, why);
		}
	}
	pclose(f);
	json_safe(u->version);
	json_safe(u->netns);
	json_safe(u->error);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */


static void usage(FILE *f)
{
	fprintf(f, "usage: bench_shm [--quick] [--reps N] [--no-ucx] [--only S] [--engine-flags F]\n"
		   "  --quick   short run for CI smoke tests (< 30 s: fewer samples, no 1 GiB)\n"
		   "  --reps N  repetitions of every measurement (default 5, max 64)\n"
		   "  --no-ucx  do not run the UCX peers (bench/peers_shm.sh)\n"
		   "  --only S  run only these sections (comma-separated: floor, busy, thread,\n"
		   "            ucx, adaptive, bw; for profiling - the JSON then holds zeros)\n"
		   "  --engine-flags F  create the engines with these FERRY_ENGINE_* flags\n"
		   "            (comma-separated: busy_poll, single_poller; single_poller\n"
		   "            for the MANUAL engines only)\n"
		   "Prints one JSON object on stdout; progress on stderr.\n");
}

static void jlat(const char *k, const struct lat_result *r, const char *what)
{
	jopen(k);
	if (what)
		jstr("measures", what);
	jstat("one_way_p50_ns", r->p50, 1);
	jstat("one_way_p99_ns", r->p99, 1);
	jnum("samples_per_rep", (double)r->samples);
	jclose();
}

static void jbw(const struct bw_result *b)
{
	char k[32];

	if (b->size >= GIB)
		snprintf(k, sizeof(k), "%zuGiB", b->size / GIB);
	else if (b->size >= MIB)
		snprintf(k, sizeof(k), "%zuMiB", b->size / MIB);
	else
		snprintf(k, sizeof(k), "%zuKiB", b->size / KIB);
	jopen(k);
	jnum("bytes", (double)b->size);
	if (!b->measured) {
		jstr("skipped", "--quick");
		jclose();
		return;
	}
	jnum("transfers_per_rep", (double)b->iters);
	jnum("window", (double)b->window);
	jstat("memcpy_gb_per_s", b->memcpy_gbps, 3);
	jstat("memcpy_into_pool_gb_per_s", b->memcpy_pool_gbps, 3);
	jstat("copy_gb_per_s", b->copy_gbps, 3);
	jstat("zero_copy_gb_per_s", b->zc_gbps, 1);
	jstat("zero_copy_us_per_transfer", b->zc_us, 3);
	jfix("ratio_copy_vs_memcpy", b->ratio_copy_memcpy, 3);
	jfix("ratio_copy_vs_memcpy_paired", b->ratio_copy_memcpy_paired, 3);
	jclose();
}

/* A target: result "pass", "fail" or "n/a". */
static int t_pass, t_fail, t_na;

static void jtarget(const char *name, const char *target, double value, double threshold,
		    const char *unit, int res /* 1 pass, 0 fail, -1 n/a */, const char *note)
{
	jopen(NULL);
	jstr("name", name);
	jstr("target", target);
	if (res < 0) {
		jstr("value", "n/a");
		jstr("threshold", "n/a");
	} else {
		jfix("value", value, 3);
		jfix("threshold", threshold, 3);
	}
	jstr("unit", unit);
	jstr("result", res > 0 ? "pass" : res == 0 ? "fail" : "n/a");
	if (note)
		jstr("note", note);
	jclose();
	if (res > 0)
		t_pass++;
	else if (res == 0)
		t_fail++;
	else
		t_na++;
}

int main(int argc, char **argv)
{
	uint64_t t_start = now_ns();
	double load_start = loadavg1();
	char rundir[] = "/tmp/ferry-bench-shm-XXXXXX";
	struct lat_result f_spin, f_efd, f_efd_paused, l_man_copy, l_man_zc, l_thr_busy, l_thr_busy_zc, l_adapt,
		l_adapt_zc, l_adapt_small, l_adapt_man, l_adapt_man_zc;
	struct bw_result bw[4];
	size_t bw_sizes[4] = { 64 * KIB, 4 * MIB, 64 * MIB, 1 * GIB };
	struct big_result big_zc, big_copy, big_adapt;
	struct ucx_result *ucx = calloc(1, sizeof(*ucx));
	double busy_copy_p50[64] = { 0 }; /* per rep, when the UCX peers are interleaved */
	double one_copy_p50[64] = { 0 };  /* the same, one poller */
	struct lat_result l_one_copy, l_one_zc;
	bool ucx_interleaved;
	struct pair p;
	uint64_t lat_n, adapt_n, spin_n, efd_n, pause_ns = 200000;
	size_t pool_big;
	double pool_create_s;
	char *src, *dst;
	int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	int pin_rc_parent;
	char cpu[128];
	time_t tnow = time(NULL);
	int status;
	who = "bench_shm";

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			opt.quick = true;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			opt.reps = atoi(argv[++i]);
			if (opt.reps < 1 || opt.reps > 64) {
				fprintf(stderr, "bench_shm: --reps takes 1..64\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--no-ucx")) {
			opt.no_ucx = true;
		} else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
			opt.only = argv[++i];
		} else if (!strcmp(argv[i], "--engine-flags") && i + 1 < argc) {
			opt.engine_flags = argv[++i];
			if (parse_engine_flags(opt.engine_flags, &opt.flags)) {
				usage(stderr);
				return 2;
			}
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (!opt.reps)
		opt.reps = opt.quick ? 3 : 5;
	ucx_interleaved = !opt.no_ucx && want("ucx") && want("busy");
	lat_n = opt.quick ? 5000 : 50000;
	adapt_n = opt.quick ? 300 : 2000;
	spin_n = opt.quick ? 20000 : 200000;
	efd_n = opt.quick ? 500 : 3000;

	/* A private runtime directory: the engines find each other there. */
	if (!mkdtemp(rundir))
		die("mkdtemp", -errno);
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);

	/* Two CPUs: parent on 0, peer on 1. */
	if (ncpu >= 2) {
		cpu_parent = 0;
		cpu_child = 1;
	}
	pin_rc_parent = pin_to(cpu_parent);

	shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shm == MAP_FAILED)
		die("mmap", -errno);
	efd_a = eventfd(0, EFD_CLOEXEC);
	efd_b = eventfd(0, EFD_CLOEXEC);
	if (efd_a < 0 || efd_b < 0 || pipe(cmd_fd) || pipe(rep_fd))
		die("eventfd/pipe", -errno);

	/* Fork before any engine exists: engines do not survive fork. */
	fflush(NULL);
	child_pid = fork();
	if (child_pid < 0)
		die("fork", -errno);
	if (child_pid == 0) {
		/* Never outlive the parent, even spinning in a loop. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		close(cmd_fd[1]);
		close(rep_fd[0]);
		_exit(child_main());
	}
	close(cmd_fd[0]);
	close(rep_fd[1]);
	signal(SIGPIPE, SIG_IGN);
	bench_watchdog(opt.quick ? 600 : 1800);
	progress("peer process %d; pinned: parent cpu %d, peer cpu %d (%s); runtime dir %s",
		 (int)child_pid, cpu_parent, cpu_child,
		 cpu_parent < 0 ? "one CPU: not pinned" : pin_rc_parent ? "pinning failed" : "ok",
		 rundir);

	/* --- floors: latency ------------------------------------------------ */
	progress("floors: shared cache-line ping-pong (%llu x %d), eventfd ping-pong (%llu x %d)",
		 (unsigned long long)spin_n, opt.reps, (unsigned long long)efd_n, opt.reps);
	memset(&f_spin, 0, sizeof(f_spin));
	l_one_copy = l_one_zc = f_efd = f_efd_paused = l_man_copy = l_man_zc = l_thr_busy = l_thr_busy_zc = l_adapt = l_adapt_zc = l_adapt_small = l_adapt_man = l_adapt_man_zc = f_spin;
	memset(&big_zc, 0, sizeof(big_zc));
	big_copy = big_adapt = big_zc;
	memset(bw, 0, sizeof(bw));
	pool_create_s = 0;
	pool_big = 0;
	if (want("floor")) {
		f_spin = floor_spin(spin_n);
		f_efd = floor_eventfd(efd_n, 0);
		f_efd_paused = floor_eventfd(efd_n / 10 + 100, pause_ns);
	}
	progress("spin one-way p50 %.0f ns p99 %.0f ns; eventfd one-way p50 %.1f us p99 %.1f us",
		 f_spin.p50.median, f_spin.p99.median, f_efd.p50.median / 1e3,
		 f_efd.p99.median / 1e3);
	progress("eventfd one-way with a %llu us pause before each round trip: p50 %.1f us p99 %.1f us",
		 (unsigned long long)(pause_ns / 1000), f_efd_paused.p50.median / 1e3,
		 f_efd_paused.p99.median / 1e3);

	/* --- ferry latency: busy -------------------------------------------- */
	progress("64 B ping-pong, MANUAL, both callers spinning (%llu x %d)",
		 (unsigned long long)lat_n, opt.reps);
	if (want("busy") && !ucx_interleaved) {
		pair_open(&p, FERRY_PROGRESS_MANUAL, 0, 16 * MIB, 16 * MIB, true);
		l_man_copy = lat_bench(&p, 0, false, lat_n, 0);
		l_man_zc = lat_bench(&p, 1, false, lat_n, 0);
		pair_close(&p);
		pair_open_flags(&p, FERRY_PROGRESS_MANUAL, 0, 16 * MIB, 16 * MIB, true, ONE_POLLER);
		l_one_copy = lat_bench(&p, 0, false, lat_n, 0);
		l_one_zc = lat_bench(&p, 1, false, lat_n, 0);
		pair_close(&p);
	} else if (want("busy")) {
		/*
		 * The UCX peers run after each rep (nothing of ours runs
		 * meanwhile: the peer process waits on its command pipe), so
		 * ferry's rep r and UCX's rep r see the machine in the same
		 * state; paired_vs_ucx holds the per-rep ratios.
		 */
		double c50[64], c99[64], z50[64], z99[64];
		double oc50[64], oc99[64], oz50[64], oz99[64];

		for (int r = 0; r < opt.reps; r++) {
			struct lat_result c, z;

			pair_open(&p, FERRY_PROGRESS_MANUAL, 0, 16 * MIB, 16 * MIB, true);
			c = lat_bench_reps(&p, 0, false, lat_n, 0, 1);
			z = lat_bench_reps(&p, 1, false, lat_n, 0, 1);
			pair_close(&p);
			c50[r] = c.p50.median, c99[r] = c.p99.median;
			z50[r] = z.p50.median, z99[r] = z.p99.median;
			pair_open_flags(&p, FERRY_PROGRESS_MANUAL, 0, 16 * MIB, 16 * MIB, true,
					ONE_POLLER);
			c = lat_bench_reps(&p, 0, false, lat_n, 0, 1);
			z = lat_bench_reps(&p, 1, false, lat_n, 0, 1);
			pair_close(&p);
			oc50[r] = c.p50.median, oc99[r] = c.p99.median;
			oz50[r] = z.p50.median, oz99[r] = z.p99.median;
			progress("rep %d: MANUAL copy p50 %.0f ns, one poller %.0f ns; UCX peers "
				 "(bench/peers_shm.sh)", r, c50[r], oc50[r]);
			ucx_run(ucx, 1);
		}
		l_man_copy = lat_from(c50, c99, lat_n);
		l_man_zc = lat_from(z50, z99, lat_n);
		l_one_copy = lat_from(oc50, oc99, lat_n);
		l_one_zc = lat_from(oz50, oz99, lat_n);
		memcpy(busy_copy_p50, c50, sizeof(c50));
		memcpy(one_copy_p50, oc50, sizeof(oc50));
	}
	progress("MANUAL one-way p50/p99: copy %.0f/%.0f ns, zero-copy %.0f/%.0f ns",
		 l_man_copy.p50.median, l_man_copy.p99.median, l_man_zc.p50.median,
		 l_man_zc.p99.median);
	progress("MANUAL, one poller: copy %.0f/%.0f ns, zero-copy %.0f/%.0f ns",
		 l_one_copy.p50.median, l_one_copy.p99.median, l_one_zc.p50.median,
		 l_one_zc.p99.median);

	progress("64 B ping-pong, THREAD spin_ns=10 s, callbacks on the reactors (%llu x %d)",
		 (unsigned long long)lat_n, opt.reps);
	if (want("thread")) {
		pair_open(&p, FERRY_PROGRESS_THREAD, 10000000000ull, 16 * MIB, 16 * MIB, false);
		l_thr_busy = lat_bench(&p, 0, true, lat_n, 0);
		l_thr_busy_zc = lat_bench(&p, 1, true, lat_n, 0);
		pair_close(&p);
	}
	progress("THREAD busy one-way p50/p99: copy %.0f/%.0f ns, zero-copy %.0f/%.0f ns",
		 l_thr_busy.p50.median, l_thr_busy.p99.median, l_thr_busy_zc.p50.median,
		 l_thr_busy_zc.p99.median);

	/* --- UCX peers (nothing of ours runs meanwhile) --------------------- */
	if (!opt.no_ucx && want("ucx")) {
		if (!ucx_interleaved) {
			progress("UCX peers: bench/peers_shm.sh (ucx_perftest, UCX_TLS=shm)");
			ucx_run(ucx, opt.reps);
		}
		for (int t = 0; t < UCX_TESTS && ucx->ran; t++)
			progress("UCX %s %zu B: p50 %.3f us, %.2f GB/s (%d runs)", ucx_tests[t].test,
				 ucx_tests[t].bytes, stat_of(ucx->p50_us[t], ucx->n[t]).median,
				 stat_of(ucx->gbps[t], ucx->n[t]).median, ucx->n[t]);
		if (!ucx->installed)
			progress("UCX: ucx_perftest not installed (apt-get install ucx-utils)");
	}

	/* --- ferry latency: adaptive ---------------------------------------- */
	progress("64 B ping-pong, THREAD default spin, %llu us pause (%llu x %d)",
		 (unsigned long long)(pause_ns / 1000), (unsigned long long)adapt_n, opt.reps);
	if (want("adaptive")) {
		pair_open(&p, FERRY_PROGRESS_THREAD, 0, 256 * MIB, 16 * MIB, false);
		l_adapt = lat_bench(&p, 0, false, adapt_n, pause_ns);
		l_adapt_zc = lat_bench(&p, 1, false, adapt_n, pause_ns);
		big_adapt = big_bench(&p, false, opt.quick ? 3 : 9, NULL);
		pair_close(&p);
		/*
		 * MANUAL mode, callers in ferry_cq_wait: each caller drives its
		 * own engine and sleeps in its io_uring wait, so a message costs
		 * one wake-up (the peer's doorbell) instead of three.
		 */
		pair_open(&p, FERRY_PROGRESS_MANUAL, 0, 16 * MIB, 16 * MIB, false);
		l_adapt_man = lat_bench(&p, 0, false, adapt_n, pause_ns);
		l_adapt_man_zc = lat_bench(&p, 1, false, adapt_n, pause_ns);
		pair_close(&p);
		/* The same with a 1 us spin: what the spinning costs on 2 vCPUs. */
		pair_open(&p, FERRY_PROGRESS_THREAD, 1000, 16 * MIB, 16 * MIB, false);
		l_adapt_small = lat_bench(&p, 0, false, adapt_n, pause_ns);
		pair_close(&p);
	}
	progress("adaptive one-way p50/p99: copy %.1f/%.1f us, zero-copy %.1f/%.1f us; "
		 "190 MB zero-copy %.3f ms",
		 l_adapt.p50.median / 1e3, l_adapt.p99.median / 1e3, l_adapt_zc.p50.median / 1e3,
		 l_adapt_zc.p99.median / 1e3, big_adapt.ms.median);
	progress("adaptive MANUAL (callers asleep in ferry_cq_wait): one-way p50/p99 copy "
		 "%.1f/%.1f us, zero-copy %.1f/%.1f us",
		 l_adapt_man.p50.median / 1e3, l_adapt_man.p99.median / 1e3,
		 l_adapt_man_zc.p50.median / 1e3, l_adapt_man_zc.p99.median / 1e3);
	progress("adaptive, spin_ns = 1 us: one-way p50/p99 copy %.1f/%.1f us",
		 l_adapt_small.p50.median / 1e3, l_adapt_small.p99.median / 1e3);

	/* --- bandwidth and the 190 MB payload, MANUAL ----------------------- */
	if (want("bw")) {
		pool_big = opt.quick ? 512 * MIB : 2304 * MIB;
		{
			size_t srclen = opt.quick ? 256 * MIB : 1 * GIB;
			uint64_t t0 = now_ns();

			src = malloc(srclen);
			dst = malloc(srclen);
			if (!src || !dst)
				die("malloc", -ENOMEM);
			memset(src, 0x5a, srclen);
			memset(dst, 0xa5, srclen);
			progress("touched 2 x %zu MiB of malloc memory in %.2f s", srclen / MIB,
				 (double)(now_ns() - t0) / 1e9);
			t0 = now_ns();
			pair_open(&p, FERRY_PROGRESS_MANUAL, 0, pool_big, 16 * MIB, true);
			pool_create_s = (double)(now_ns() - t0) / 1e9;
			progress("sender pool %zu MiB prefaulted in %.2f s", pool_big / MIB, pool_create_s);
		}
		for (int i = 0; i < 4; i++) {
			static const uint64_t iters_full[4] = { 4000, 200, 24, 3 };
			static const uint64_t iters_quick[4] = { 1000, 50, 6, 0 };
			static const uint64_t window[4] = { 16, 8, 4, 2 };
			uint64_t it = opt.quick ? iters_quick[i] : iters_full[i];

			if (!it) {
				bw[i] = (struct bw_result){ .size = bw_sizes[i], .measured = false };
				continue;
			}
			bw[i] = bw_bench(&p, bw_sizes[i], it, window[i], src, dst);
		}
		big_zc = big_bench(&p, false, opt.quick ? 5 : 21, src);
		big_copy = big_bench(&p, true, opt.quick ? 3 : 5, src);
		pair_close(&p);
		progress("190 MB PUT->GET: zero-copy p50 %.3f ms, copy p50 %.3f ms", big_zc.ms.median,
			 big_copy.ms.median);
		free(src);
		free(dst);
	}

	{
		struct cmd q = { .op = C_QUIT };

		send_cmd(&q);
		waitpid(child_pid, &status, 0);
	}
	rmdir(rundir);

	/* --- JSON ----------------------------------------------------------- */
	read_cpu_model(cpu, sizeof(cpu));
	jheader("bench_shm", tnow, load_start, ncpu, cpu);
	jopen("config");
	jbool("quick", opt.quick);
	jnum("reps", opt.reps);
	jstr("stat", "median, min and max over reps");
	jstr("processes", "parent (engine a, sender) + one forked peer (engine b), "
			  "each pinned with sched_setaffinity");
	jnum("parent_cpu", cpu_parent);
	jnum("peer_cpu", cpu_child);
	jbool("pinned", cpu_parent >= 0 && pin_rc_parent == 0);
	jstr("clock", "CLOCK_MONOTONIC; cross-process intervals use the peer's timestamp");
	jstr("engine_flags", opt.engine_flags ? opt.engine_flags : "");
	jclose();

	jopen("floor");
	jlat("shm_spin_pingpong_64B", &f_spin,
	     "two cache lines in shared memory, both processes spinning; one-way = RTT/2");
	jlat("eventfd_wakeup", &f_efd,
	     "eventfd ping-pong across the two CPUs, each side blocked in read(); one-way = RTT/2");
	jlat("eventfd_wakeup_paused", &f_efd_paused,
	     "the same with the adaptive benchmarks' pause before each round trip, so both "
	     "sides are asleep between messages (the floor of the adaptive target)");
	jclose();

	jopen("latency_64B");
	jstr("measures", "ping-pong A->B->A between the two processes: A PUTs k_i and posts "
			 "GET r_i (one submit), B GETs k_i and PUTs r_i; one-way = (PUT k_i submit -> GET r_i "
			 "complete) / 2");
	jstr("copy", "PUT of a 64 B iovec (copied into the sender's pool), GET into a 64 B iovec");
	jstr("zero_copy", "ferry_buf_alloc(64) + PUT of the pool buffer, GET zero-copy + release");
	jopen("busy_manual");
	jstr("mode", "MANUAL, both callers spinning in ferry_cq_poll");
	jlat("copy", &l_man_copy, NULL);
	jlat("zero_copy", &l_man_zc, NULL);
	jclose();
	jopen("busy_manual_one_poller");
	jstr("mode", "MANUAL with FERRY_ENGINE_SINGLE_POLLER | FERRY_ENGINE_BUSY_POLL (one "
		     "polling thread per engine and no fence for sleepers: the promise "
		     "ucx_perftest's UCS_THREAD_MODE_SINGLE worker makes), both callers spinning");
	jlat("copy", &l_one_copy, NULL);
	jlat("zero_copy", &l_one_zc, NULL);
	jclose();
	jopen("busy_thread");
	jstr("mode", "THREAD, spin_ns = 10 s (reactors never sleep); the ping-pong runs in "
		     "FERRY_SQE_CB_REACTOR callbacks on the reactor threads, main threads asleep");
	jlat("copy", &l_thr_busy, NULL);
	jlat("zero_copy", &l_thr_busy_zc, NULL);
	jclose();
	jopen("adaptive");
	jstr("mode", "THREAD, default spin_ns (50 us), callers in ferry_cq_wait; a 200 us pause "
		     "between round trips so that reactors and callers all sleep");
	jnum("pause_ns", (double)pause_ns);
	jlat("copy", &l_adapt, NULL);
	jlat("zero_copy", &l_adapt_zc, NULL);
	jclose();
	jopen("adaptive_manual");
	jstr("mode", "MANUAL, default spin_ns (50 us), each caller drives its engine from "
		     "ferry_cq_wait and sleeps in the engine's io_uring wait; a 200 us pause "
		     "between round trips so that both sides sleep");
	jnum("pause_ns", (double)pause_ns);
	jlat("copy", &l_adapt_man, NULL);
	jlat("zero_copy", &l_adapt_man_zc, NULL);
	jclose();
	jopen("adaptive_spin_1us");
	jstr("mode", "as adaptive, but spin_ns = 1 us for reactors and callers (diagnostic: "
		     "the caller and the reactor of a process share one CPU here)");
	jlat("copy", &l_adapt_small, NULL);
	jclose();
	jopen("ratios");
	jfix("busy_manual_copy_p50_vs_spin_floor", l_man_copy.p50.median / f_spin.p50.median, 3);
	jfix("adaptive_copy_p50_vs_wakeup_floor", l_adapt.p50.median / f_efd_paused.p50.median, 3);
	jfix("adaptive_zero_copy_p50_vs_wakeup_floor",
	     l_adapt_zc.p50.median / f_efd_paused.p50.median, 3);
	jfix("adaptive_manual_copy_p50_vs_wakeup_floor",
	     l_adapt_man.p50.median / f_efd_paused.p50.median, 3);
	jfix("adaptive_manual_zero_copy_p50_vs_wakeup_floor",
	     l_adapt_man_zc.p50.median / f_efd_paused.p50.median, 3);
	jfix("wakeup_floor_paused_vs_back_to_back", f_efd_paused.p50.median / f_efd.p50.median, 3);
	jfix("adaptive_spin_1us_copy_p50_vs_wakeup_floor",
	     l_adapt_small.p50.median / f_efd.p50.median, 3);
	jfix("busy_thread_copy_p50_vs_spin_floor", l_thr_busy.p50.median / f_spin.p50.median, 3);
	jclose();
	jclose();

	jopen("bandwidth");
	jstr("mode", "MANUAL, sender (parent) and receiver (peer) each spinning in ferry_cq_poll");
	jstr("measures", "transfers streamed back to back with up to `window` PUTs in flight; time "
			 "= sender's first submit -> receiver's last GET complete; GB/s = 1e9 B/s");
	jstr("copy_path", "PUT of an iovec of pre-touched malloc memory (one copy, into the "
			  "sender's pool); receiver GET zero-copy + release (no second copy)");
	jstr("zero_copy_path", "ferry_buf_alloc + PUT of the pool buffer; receiver GET zero-copy + "
			       "release; no byte is copied or read, so GB/s is size / time per "
			       "transfer");
	jstr("floor", "memcpy of the same size between two pre-touched malloc buffers, same rep");
	jnum("sender_pool_bytes", (double)pool_big);
	jfix("sender_pool_prefault_s", pool_create_s, 2);
	for (int i = 0; i < 4; i++)
		jbw(&bw[i]);
	jclose();

	jopen("put_get_190MB");
	jnum("bytes", (double)BIG_PAYLOAD);
	jstr("measures", "PUT submit (parent) -> GET complete (peer), GET posted first; ms");
	jopen("zero_copy_manual");
	jstat("ms", big_zc.ms, 4);
	jnum("reps", (double)big_zc.reps);
	jclose();
	jopen("zero_copy_thread_adaptive");
	jstat("ms", big_adapt.ms, 4);
	jnum("reps", (double)big_adapt.reps);
	jclose();
	jopen("copy_manual");
	jstr("path", "PUT of an iovec (one 190 MB copy into the sender's pool), GET zero-copy");
	jstat("ms", big_copy.ms, 4);
	jnum("reps", (double)big_copy.reps);
	jclose();
	jclose();

	/* UCX */
	if (opt.no_ucx) {
		jstr("ucx", "not run (--no-ucx)");
	} else if (!ucx->installed) {
		jstr("ucx", "not installed");
	} else {
		jopen("ucx");
		jstr("tool", "ucx_perftest (Debian ucx-utils), UCX_TLS=shm, bench/peers_shm.sh");
		jstr("version", ucx->version);
		jstr("netns", ucx->netns);
		jnum("server_cpu", cpu_child);
		jnum("client_cpu", cpu_parent);
		jstr("units", "latency: one-way us (ucx_perftest reports half the round trip), p50 "
			      "of its run; bandwidth: GB/s = 1e9 B/s (converted from its MiB/s)");
		jnum("failed_runs", ucx->fails);
		if (ucx->error[0])
			jstr("last_error", ucx->error);
		for (int t = 0; t < UCX_TESTS; t++) {
			jopen(ucx_tests[t].json);
			jnum("runs", ucx->n[t]);
			if (ucx->n[t]) {
				if (t < 2 || t == UCX_SYNC_LAT) {
					jstat("p50_us", stat_of(ucx->p50_us[t], ucx->n[t]), 3);
					jstat("avg_us", stat_of(ucx->avg_us[t], ucx->n[t]), 3);
				} else {
					jstat("gb_per_s", stat_of(ucx->gbps[t], ucx->n[t]), 3);
				}
			}
			jclose();
		}
		jclose();
	}

	/* Targets. */
	{
		bool have_lat = ucx->installed && ucx->n[1] > 0 && want("busy");
		bool have_bw = ucx->installed && ucx->n[3] > 0 && want("bw");
		bool have_ad = want("adaptive") && want("floor"), have_bw_sec = want("bw");
		double ucx_lat64 = have_lat ? stat_of(ucx->p50_us[1], ucx->n[1]).median * 1e3 : 0;
		double ucx_bw4 = have_bw ? stat_of(ucx->gbps[3], ucx->n[3]).median : 0;
		double v;

		jopen("ratios_vs_ucx");
		if (have_lat) {
			jfix("busy_manual_copy_p50_vs_ucx_tag_lat_64B", l_man_copy.p50.median / ucx_lat64, 3);
			jfix("busy_manual_zero_copy_p50_vs_ucx_tag_lat_64B",
			     l_man_zc.p50.median / ucx_lat64, 3);
			jfix("busy_thread_copy_p50_vs_ucx_tag_lat_64B", l_thr_busy.p50.median / ucx_lat64, 3);
			jfix("busy_one_poller_copy_p50_vs_ucx_tag_lat_64B",
			     l_one_copy.p50.median / ucx_lat64, 3);
		}
		if (have_lat && ucx->n[UCX_SYNC_LAT])
			jfix("busy_manual_copy_p50_vs_ucx_tag_sync_lat_64B",
			     l_man_copy.p50.median /
				     (stat_of(ucx->p50_us[UCX_SYNC_LAT], ucx->n[UCX_SYNC_LAT]).median * 1e3),
			     3);
		if (have_lat && ucx->n[0])
			jfix("busy_manual_copy_p50_vs_ucx_tag_lat_8B",
			     l_man_copy.p50.median / (stat_of(ucx->p50_us[0], ucx->n[0]).median * 1e3), 3);
		if (have_bw) {
			jfix("zero_copy_4MiB_vs_ucx_tag_bw_4MiB", bw[1].zc_gbps.median / ucx_bw4, 3);
			jfix("copy_4MiB_vs_ucx_tag_bw_4MiB", bw[1].copy_gbps.median / ucx_bw4, 3);
		}
		if (ucx->installed && ucx->n[2])
			jfix("copy_64KiB_vs_ucx_tag_bw_64KiB",
			     bw[0].copy_gbps.median / stat_of(ucx->gbps[2], ucx->n[2]).median, 3);
		jclose();
		if (have_lat && ucx_interleaved && ucx->n[1] == opt.reps) {
			/* Rep r of ferry against the UCX run right after it. */
			double ratio[64], one[64], sync_ratio[64];
			int better = 0, one_better = 0, sync_better = 0;
			bool have_sync = ucx->n[UCX_SYNC_LAT] == opt.reps;

			for (int r = 0; r < opt.reps; r++) {
				ratio[r] = busy_copy_p50[r] / (ucx->p50_us[1][r] * 1e3);
				better += ratio[r] <= 1.0;
				one[r] = one_copy_p50[r] / (ucx->p50_us[1][r] * 1e3);
				one_better += one[r] <= 1.0;
				if (have_sync) {
					sync_ratio[r] = busy_copy_p50[r] /
							 (ucx->p50_us[UCX_SYNC_LAT][r] * 1e3);
					sync_better += sync_ratio[r] <= 1.0;
				}
			}
			jopen("paired_vs_ucx");
			jstr("measures", "per rep: ferry MANUAL copy p50 (default, and one poller) / "
				 "the UCX tag_lat 64 B p50 run right after it (and its tag_sync_lat 64 B)");
			jstat("busy_manual_copy_p50_vs_ucx_tag_lat_64B", stat_of(ratio, opt.reps), 3);
			jnum("reps_ferry_as_fast_or_faster", better);
			jstat("busy_one_poller_copy_p50_vs_ucx_tag_lat_64B", stat_of(one, opt.reps), 3);
			jnum("reps_one_poller_as_fast_or_faster", one_better);
			if (have_sync) {
				/* The like-for-like peer: its send, as a PUT, waits for the receiver. */
				jstat("busy_manual_copy_p50_vs_ucx_tag_sync_lat_64B",
				      stat_of(sync_ratio, opt.reps), 3);
				jnum("reps_as_fast_as_tag_sync_lat_or_faster", sync_better);
			}
			jnum("reps", opt.reps);
			jclose();
		}

		jkey("targets");
		jraw("[");
		js.need_comma = false;
		jtarget("busy_64B_one_way_p50_vs_ucx_tag_lat", "ferry MANUAL copy p50 <= UCX shm tag_lat 64 B p50",
			l_man_copy.p50.median, ucx_lat64, "ns",
			have_lat ? l_man_copy.p50.median <= ucx_lat64 : -1,
			have_lat ? NULL : "ucx_perftest not available");
		v = l_adapt_man.p50.median;
		jtarget("adaptive_64B_one_way_p50_vs_wakeup",
			"MANUAL, callers asleep in ferry_cq_wait: <= 1.5 x eventfd wake-up p50 "
			"(same pause)",
			v, 1.5 * f_efd_paused.p50.median, "ns",
			have_ad ? v <= 1.5 * f_efd_paused.p50.median : -1,
			have_ad ? NULL : "not measured (--only)");
		v = l_adapt.p50.median;
		jtarget("adaptive_thread_64B_one_way_p50_vs_wakeup",
			"THREAD, reactors and callers asleep: <= 1.5 x eventfd wake-up p50 (same pause)",
			v, 1.5 * f_efd_paused.p50.median, "ns",
			have_ad ? v <= 1.5 * f_efd_paused.p50.median : -1,
			have_ad ? NULL : "not measured (--only)");
		jtarget("zero_copy_4MiB_vs_ucx_tag_bw", ">= 2 x UCX shm tag_bw 4 MiB", bw[1].zc_gbps.median,
			2 * ucx_bw4, "GB/s", have_bw ? bw[1].zc_gbps.median >= 2 * ucx_bw4 : -1,
			have_bw ? NULL : "ucx_perftest not available");
		jtarget("copy_1GiB_vs_memcpy", ">= 0.9 x memcpy 1 GiB",
			bw[3].measured ? bw[3].ratio_copy_memcpy : 0, 0.9, "ratio",
			bw[3].measured ? bw[3].ratio_copy_memcpy >= 0.9 : -1,
			bw[3].measured ? NULL : "1 GiB not measured with --quick");
		jtarget("put_get_190MB_zero_copy_p50", "<= 5 ms", big_zc.ms.median, 5.0, "ms",
			have_bw_sec ? big_zc.ms.median <= 5.0 : -1,
			have_bw_sec ? NULL : "not measured (--only)");
		jraw("]");
		js.need_comma = true;
	}
	jbool("all_targets_pass", t_fail == 0 && t_na == 0);
	jnum("targets_pass", t_pass);
	jnum("targets_fail", t_fail);
	jnum("targets_na", t_na);
	jfix("elapsed_s", (double)(now_ns() - t_start) / 1e9, 1);
	jclose();

	printf("%s\n", js.p);
	free(js.p);
	free(ucx);
	progress("targets: %d pass, %d fail, %d n/a; %.1f s", t_pass, t_fail, t_na,
		 (double)(now_ns() - t_start) / 1e9);
	return 0;
}

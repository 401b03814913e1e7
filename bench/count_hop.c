/*
 * bench/count_hop.c - the programs bench/count.sh runs under callgrind to
 * count the instructions of one op on each of ferry's fast paths (the
 * deterministic figures of docs/benchmarks.md, "The fast path, counted").
 * Collection is switched on and off from here (callgrind client requests;
 * run it with --collect-atstart=no), so a run counts only what the mode
 * names, and the script divides by the op count printed on stderr:
 *
 *   inproc N        two MANUAL engines in this process (the loop transport):
 *                   a GET is posted and parked, then from the PUT's prep to
 *                   the GET's CQE is counted (bench_core's timed window),
 *                   the PUT's CQE is reaped uncounted; N transfers
 *   inproc_whole N  the same, counted to the PUT's CQE reaped too: the
 *                   whole transfer, wherever its work falls (a direct
 *                   delivery moves the PUT's completion out of the window
 *                   above, an inbox delivery into it)
 *   idle N          N ferry_cq_poll calls on an idle MANUAL engine that has
 *                   an in-process peer
 *   hop shm|shm_zc|tcp N
 *                   one-way 64 B hops between two processes (this one, "a",
 *                   and a child it forks, "b"; under valgrind both are
 *                   counted, each into its own file): a PUTs k_i and GETs
 *                   r_i, b GETs k_i and answers with r_i; shm_zc PUTs a pool
 *                   buffer and GETs zero copy. The busy spin while the other
 *                   side works is left out: before each poll the program
 *                   waits uncounted until a round would find work
 *                   (reactor_has_work or the engine's io_uring), so every
 *                   counted round does something (tcp: or one of this
 *                   process's sockets has data, since tcp reads its hot
 *                   connections in each round). Per hop = (a + b) / 2N.
 *                   After the hops a counts N idle polls with the connection
 *                   live (a second window, dumped on its own).
 *
 * COUNT_ENGINE_FLAGS in the environment (busy_poll, single_poller, comma
 * separated) creates every engine with those FERRY_ENGINE_* flags.
 *
 * Every mode prints "count_hop: <what> ops=N" lines on stderr; a dump is
 * named after its window (CALLGRIND_DUMP_STATS_AT), so one file per process
 * holds each window's total. Natively (no valgrind) the client requests do
 * nothing, and the program just runs: `count_hop` with no argument runs a
 * short inproc check and prints {} (./run bench runs every program here).
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_DUMP_STATS_AT(s) ((void)(s))
#define CALLGRIND_ZERO_STATS
#endif

#include "bench_base.h"
#include "ferry.h"
#include "internal.h" /* reactor_has_work, e->ring: the uncounted wait */

#define UD_PUT (1ull << 62)
#define UD_GET (1ull << 61)

/* Collection on or off (a toggle underneath: keep the state here). */
static int collecting;
static void collect(int on)
{
	if (collecting != on) {
		CALLGRIND_TOGGLE_COLLECT;
		collecting = on;
	}
}

/* Start a window: nothing counted so far stays in it. */
static void window_begin(void)
{
	collect(0);
	CALLGRIND_ZERO_STATS;
}

/* End a window: its total goes to a dump of its own, named what. */
static void window_end(const char *what)
{
	collect(0);
	CALLGRIND_DUMP_STATS_AT(what);
}

/*
 * COUNT_ENGINE_FLAGS: engine flags to count with, a comma-separated list of
 * busy_poll and single_poller (FERRY_ENGINE_*); unset: none.
 */
static uint32_t engine_flags(void)
{
	const char *v = getenv("COUNT_ENGINE_FLAGS");
	uint32_t f = 0;

	if (v && parse_engine_flags(v, &f))
		die("COUNT_ENGINE_FLAGS (busy_poll, single_poller)", -EINVAL);
	return f;
}

static struct ferry_engine *engine(const char *name, const char *listen)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = "count-hop";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 16u << 20;
	p.listen = listen;
	p.flags = engine_flags();
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

/* --- in-process ------------------------------------------------------ */

static void inproc(unsigned n, int count, bool whole)
{
	struct ferry_engine *a = engine("inproc.a", NULL), *b = engine("inproc.b", NULL);
	struct ferry_peer *to_b, *from_a;
	struct ferry_sq *sqa, *sqb;
	struct ferry_cq *cqa = ferry_cq_default(a), *cqb = ferry_cq_default(b);
	static char src[64], dst[64];
	struct iovec in = { src, sizeof(src) }, out = { dst, sizeof(dst) };
	unsigned warm = 256, polls = 0;

	CHECK(ferry_peer_open(a, "inproc.b", &to_b));
	CHECK(ferry_peer_open(b, "inproc.a", &from_a));
	CHECK(ferry_sq_get(a, &sqa));
	CHECK(ferry_sq_get(b, &sqb));
	for (unsigned i = 0; i < warm + n; i++) {
		struct ferry_cqe c[4];
		char key[24];
		bool put_done = false, get_done = false;
		int k;

		if (i == warm && count)
			window_begin();
		key_of(key, 'k', i);
		ferry_prep_get(next_sqe(sqb), from_a, key, &out, 1, UD_GET | i);
		ferry_sq_submit(sqb);
		ferry_progress(b); /* the GET waits */
		if (i >= warm)
			collect(count);
		ferry_prep_put(next_sqe(sqa), to_b, key, &in, 1, UD_PUT | i);
		ferry_sq_submit(sqa);
		while (!get_done) {
			k = ferry_cq_poll(cqa, c, 4);
			if (k < 0)
				die("ferry_cq_poll (PUT side)", k);
			put_done |= k > 0;
			k = ferry_cq_poll(cqb, c, 4);
			if (k < 0 || (k > 0 && c[0].res < 0))
				die("GET", k < 0 ? k : c[0].res);
			get_done = k > 0;
			polls++;
		}
		if (!whole)
			collect(0);
		while (!put_done) {
			k = ferry_cq_poll(cqa, c, 4);
			if (k < 0 || (k > 0 && c[0].res < 0))
				die("PUT", k < 0 ? k : c[0].res);
			put_done = k > 0;
		}
		collect(0);
	}
	if (count) {
		window_end(whole ? "inproc_whole" : "inproc");
		fprintf(stderr, "count_hop: %s ops=%u\n", whole ? "inproc_whole" : "inproc", n);
	}
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* N ferry_cq_poll calls on an idle engine (its peers connected). */
__attribute__((noinline)) static void idle_polls(struct ferry_engine *e, unsigned n,
						 const char *what)
{
	struct ferry_cq *cq = ferry_cq_default(e);
	struct ferry_cqe c;

	for (unsigned i = 0; i < 64; i++) /* settle */
		if (ferry_cq_poll(cq, &c, 1) != 0)
			die("an idle poll found a CQE", -EPROTO);
	window_begin();
	collect(1);
	for (unsigned i = 0; i < n; i++)
		if (ferry_cq_poll(cq, &c, 1) != 0)
			die("an idle poll found a CQE", -EPROTO);
	window_end(what);
	fprintf(stderr, "count_hop: %s ops=%u\n", what, n);
}

static void idle(unsigned n)
{
	inproc(64, 0, false); /* the same engines' path warmed, then idle ones */
	struct ferry_engine *a = engine("idle.a", NULL), *b = engine("idle.b", NULL);
	struct ferry_peer *to_b;
	struct ferry_sq *sqa;
	struct ferry_cqe c;
	static char src[64];
	struct iovec in = { src, sizeof(src) };

	CHECK(ferry_peer_open(a, "idle.b", &to_b));
	CHECK(ferry_sq_get(a, &sqa));
	ferry_prep_put(next_sqe(sqa), to_b, "warm", &in, 1, 1);
	ferry_sq_submit(sqa);
	while (ferry_cq_poll(ferry_cq_default(a), &c, 1) == 0)
		ferry_progress(b);
	idle_polls(a, n, "idle");
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* --- two processes --------------------------------------------------- */

static uint64_t blind_polls, blind_cqes;
static struct pollfd socks[64]; /* tcp: this process's sockets, data on one is work */
static nfds_t nsocks;

/* tcp reads its hot connections in every round: data there is work too. */
static void find_sockets(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	nsocks = 0;
	while (d && (de = readdir(d)) && nsocks < 64) {
		char p[300], l[64];
		ssize_t n;

		snprintf(p, sizeof(p), "/proc/self/fd/%s", de->d_name);
		n = readlink(p, l, sizeof(l) - 1);
		if (n > 0 && !strncmp(l, "socket:", 7)) {
			socks[nsocks].fd = atoi(de->d_name);
			socks[nsocks++].events = POLLIN;
		}
	}
	if (d)
		closedir(d);
}

static bool sockets_readable(void)
{
	return nsocks && poll(socks, nsocks, 0) > 0;
}

/*
 * Wait uncounted until a round of e would find work. A transport whose
 * has_work cannot see everything (it never should) would hang us here: after
 * a long look, poll once uncounted, and say so at the end (blind polls, and
 * how many of them found a CQE: work the count then missed).
 */
static int next_cqes(struct ferry_engine *e, struct ferry_cqe *c, unsigned max)
{
	struct ferry_cq *cq = ferry_cq_default(e);
	int was = collecting, k;

	for (;;) {
		unsigned spins = 0;

		collect(0);
		while (!io_uring_cq_ready(&e->ring) && !reactor_has_work(e) && !sockets_readable() &&
		       ++spins < 20000) {
			if (nsocks)
				io_uring_get_events(&e->ring);
			cpu_relax();
		}
		if (spins < 20000) {
			collect(was);
			k = ferry_cq_poll(cq, c, max);
		} else {
			k = ferry_cq_poll(cq, c, max);
			blind_polls++;
			blind_cqes += k > 0;
			collect(was);
		}
		if (k < 0)
			die("ferry_cq_poll", k);
		if (k > 0)
			return k;
	}
}

struct side {
	struct ferry_engine *e;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	bool zc;
	char out[64], in[64];
	struct iovec out_iov, in_iov;
	uint64_t puts, gets; /* CQEs taken so far */
};

/* A warm-up PUT (warm) waits for its peer to come up (bounded), as a first one may. */
static void put64(struct side *s, const char *key, uint64_t ud, bool warm)
{
	struct ferry_sqe *sqe;

	if (s->zc) {
		struct ferry_buf *b;
		int rc;

		while ((rc = ferry_buf_alloc(s->e, 64, &b)) == -ENOMEM)
			ferry_progress(s->e);
		CHECK(rc);
		memcpy(ferry_buf_data(b), s->out, 64);
		ferry_prep_put_buf(sqe = next_sqe(s->sq), s->peer, key, b, ud);
	} else {
		ferry_prep_put(sqe = next_sqe(s->sq), s->peer, key, &s->out_iov, 1, ud);
	}
	if (warm) {
		ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
		ferry_sqe_set_timeout(sqe, 60ull * 1000000000);
	}
}

static void get64(struct side *s, const char *key, uint64_t ud)
{
	ferry_prep_get(next_sqe(s->sq), s->peer, key, s->zc ? NULL : &s->in_iov, s->zc ? 0 : 1, ud);
}

/* COUNT_HOP_LOG set: every CQE is logged (read once: a getenv per CQE was ~300 instructions, counted). */
static bool hop_log;

/* Take the CQEs that came (counted in s->puts, s->gets). */
static void take(struct side *s, struct ferry_cqe *c, int k)
{
	for (int i = 0; i < k; i++) {
		if (hop_log)
			fprintf(stderr, "count_hop: %s cqe ud %llx res %d\n", ferry_engine_name(s->e),
				(unsigned long long)c[i].user_data, c[i].res);
		if (c[i].res < 0)
			die(c[i].user_data & UD_PUT ? "a PUT" : "a GET", c[i].res);
		if (c[i].user_data & UD_PUT) {
			s->puts++;
		} else {
			if (c[i].len != 64)
				die("GET length", -EMSGSIZE);
			if (c[i].buf)
				CHECK(ferry_buf_release(c[i].buf));
			s->gets++;
		}
	}
}

/* a: PUT k_i and GET r_i, wait for both; rounds [from, to) counted if count. */
static void a_rounds(struct side *s, uint64_t from, uint64_t to, int count)
{
	struct ferry_cqe c[8];
	char key[24];

	collect(count);
	for (uint64_t i = from; i < to; i++) {
		key_of(key, 'k', i);
		put64(s, key, UD_PUT | i, !count);
		key_of(key, 'r', i);
		get64(s, key, UD_GET | i);
		ferry_sq_submit(s->sq);
		while (s->gets < i + 1)
			take(s, c, next_cqes(s->e, c, 8));
	}
	while (s->puts < to)
		take(s, c, next_cqes(s->e, c, 8));
	collect(0);
}

/* b: GET k_i; when it completes, PUT r_i and GET k_(i+1). */
static void b_rounds(struct side *s, uint64_t from, uint64_t to, int count)
{
	struct ferry_cqe c[8];
	char key[24];

	collect(count);
	for (uint64_t i = from; i < to; i++) {
		while (s->gets < i + 1)
			take(s, c, next_cqes(s->e, c, 8));
		key_of(key, 'r', i);
		put64(s, key, UD_PUT | i, !count);
		key_of(key, 'k', i + 1);
		get64(s, key, UD_GET | (i + 1));
		ferry_sq_submit(s->sq);
	}
	while (s->puts < to)
		take(s, c, next_cqes(s->e, c, 8));
	collect(0);
}

static void pin(int cpu)
{
	cpu_set_t set;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)sched_setaffinity(0, sizeof(set), &set);
}

static void report(const char *how, const char *side, unsigned n)
{
	fprintf(stderr,
		"count_hop: hop %s %s ops=%u blind_polls=%llu blind_cqes=%llu\n", how, side, n,
		(unsigned long long)blind_polls, (unsigned long long)blind_cqes);
}

/* One side: its engine, the other's address (tcp) through the pipes, the hops. */
static void hop_side(bool is_a, const char *how, unsigned n, int rfd, int wfd)
{
	bool tcp = !strcmp(how, "tcp");
	struct side s = { 0 };
	char addr[256] = "", go = 1;
	unsigned warm = 200;

	pin(is_a ? 0 : 1);
	s.zc = !strcmp(how, "shm_zc");
	s.out_iov = (struct iovec){ s.out, sizeof(s.out) };
	s.in_iov = (struct iovec){ s.in, sizeof(s.in) };
	s.e = engine(is_a ? "hop.a" : "hop.b", tcp ? "tcp://127.0.0.1:0" : NULL);
	CHECK(ferry_peer_open(s.e, is_a ? "hop.b" : "hop.a", &s.peer));
	CHECK(ferry_sq_get(s.e, &s.sq));
	if (tcp && ferry_engine_address(s.e, addr, sizeof(addr)) < 0)
		die("ferry_engine_address", -ENOTCONN);
	write_all(wfd, addr, sizeof(addr)); /* "I am up" (and where, for tcp) */
	read_all(rfd, addr, sizeof(addr));
	if (tcp)
		CHECK(ferry_peer_set_address(s.peer, addr));
	if (is_a) {
		a_rounds(&s, 0, warm, 0);
		if (tcp)
			find_sockets();
		blind_polls = blind_cqes = 0;
		window_begin();
		a_rounds(&s, warm, warm + n, 1);
		window_end(how);
		report(how, "a", n);
		idle_polls(s.e, n, tcp ? "idle_tcp.a" : "idle_shm.a");
		write_all(wfd, &go, 1); /* b counts its idle polls */
		read_all(rfd, &go, 1);
	} else {
		get64(&s, "k0", UD_GET);
		ferry_sq_submit(s.sq);
		b_rounds(&s, 0, warm, 0);
		if (tcp)
			find_sockets();
		blind_polls = blind_cqes = 0;
		window_begin();
		b_rounds(&s, warm, warm + n, 1);
		window_end(how);
		report(how, "b", n);
		read_all(rfd, &go, 1); /* stay up while a counts its idle polls */
		idle_polls(s.e, n, tcp ? "idle_tcp.b" : "idle_shm.b");
		write_all(wfd, &go, 1);
	}
	ferry_engine_destroy(s.e);
}

static int hop(const char *how, unsigned n)
{
	int rfd, wfd;
	pid_t pid;

	if (strcmp(how, "shm") && strcmp(how, "shm_zc") && strcmp(how, "tcp")) {
		fprintf(stderr, "count_hop: hop shm|shm_zc|tcp N\n");
		return 2;
	}
	pid = fork_pair(&rfd, &wfd);
	if (pid == 0) {
		hop_side(false, how, n, rfd, wfd);
		_exit(0);
	}
	hop_side(true, how, n, rfd, wfd);
	return child_status(pid);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	unsigned n;

	who = "count_hop";
	alarm(1200); /* a hang ends the program (SIGALRM), also under valgrind */
	hop_log = getenv("COUNT_HOP_LOG") != NULL;
	ferry_log_set(hop_log ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	if (!*mode) { /* ./run bench: a short native check */
		inproc(1000, 0, false);
		printf("{}\n");
		return 0;
	}
	if (!strcmp(mode, "hop") && argc > 2) {
		n = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 2000;
		return hop(argv[2], n);
	}
	n = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 2000;
	if (!strcmp(mode, "inproc") || !strcmp(mode, "inproc_whole"))
		inproc(n, 1, !strcmp(mode, "inproc_whole"));
	else if (!strcmp(mode, "idle"))
		idle(n);
	else {
		fprintf(stderr, "usage: count_hop inproc|inproc_whole|idle N | hop shm|shm_zc|tcp N\n");
		return 2;
	}
	return 0;
}

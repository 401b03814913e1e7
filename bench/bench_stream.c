/*
 * bench/bench_stream.c - what streaming costs over the transport's raw
 * PUT -> GET, measured side by side in the same run, over shm between two
 * processes (MANUAL mode, both sides busy-polling, one core each).
 *
 * Two ways to move the same chunks from a producer to a consumer:
 *   raw     PUT of key "r{run}_{i}", the consumer keeps a window of GETs
 *           posted ahead (one GET per chunk: the upstream way, minus polling)
 *   stream  STREAM_PUT of stream "s{run}", the consumer posts one
 *           multishot STREAM_GET; credits flow back as it releases chunks
 * Every chunk is a pool buffer (zero copy) whose first bytes carry its send
 * time; the consumer stamps its arrival (CLOCK_MONOTONIC is shared).
 *   latency     chunks paced (one in flight at a time): one-way p50/p99
 *   throughput  chunks back to back, at most WINDOW in flight both ways
 *               (raw: PUTs outstanding; stream: credits), bytes / time
 * Sizes: 4 KiB (a codec chunk) and 1 MiB (a hidden-state chunk). Each case
 * runs raw and stream alternately, REPS times, and reports medians and the
 * ratio stream / raw. Target (issue 6): streaming adds <= 10 %.
 *
 * Usage: bench_stream [--quick] [--tcp] [--only CASE[,CASE]]
 * JSON on stdout, progress on stderr. --only runs the named cases (lat_4k, lat_1m,
 * bw_4k, bw_1m) alone, for profiling.
 * --tcp: the same over the tcp transport on loopback (the consumer listens on
 * a port the kernel picks; a cluster secret on both sides).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#define WINDOW 16
#define REPS 5
#define MAX_N 200000

enum { MODE_RAW = 0, MODE_STREAM = 1 };

struct job {
	int mode;
	int run;
	size_t size;
	uint32_t n;
	bool paced;
};

/* Shared with the consumer process. */
struct shared {
	struct job job;
	_Atomic int seq, ack; /* the producer bumps seq, the consumer acks it */
	_Atomic int quit;
	uint64_t first_send, last_recv;
	uint32_t nsamples;
	uint64_t lat[MAX_N];
	_Atomic uint32_t received; /* paced mode: the producer waits for each */
	int err;
	char addr[128]; /* --tcp: where the consumer listens */
};

static struct shared *sh;
static char ns[64];
static bool tcp;

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static struct ferry_engine *mk(const char *name, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = ns;
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = pool;
	if (tcp) {
		p.listen = strcmp(name, "cons") ? NULL : "tcp://127.0.0.1:0";
		p.secret = "bench-stream-secret";
	}
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

static struct ferry_sqe *sqe_get(struct ferry_engine *e, struct ferry_sq *sq)
{
	struct ferry_sqe *sqe;

	while (!(sqe = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq);
		ferry_progress(e);
	}
	return sqe;
}

/* ------------------------------------------------------------------ */
/* Consumer                                                            */
/* ------------------------------------------------------------------ */

static void post_get(struct ferry_sqe *sqe, struct ferry_peer *from, int run, uint32_t i)
{
	char key[32];

	snprintf(key, sizeof(key), "r%d_%u", run, i);
	ferry_prep_get(sqe, from, key, NULL, 0, i);
}

static void consume(struct ferry_engine *e, struct ferry_sq *sq, struct ferry_peer *from)
{
	const struct job *j = &sh->job;
	uint32_t got = 0, posted = 0;
	char key[32];

	sh->nsamples = 0;
	if (j->mode == MODE_STREAM) {
		snprintf(key, sizeof(key), "s%d", j->run);
		ferry_prep_stream_get(sqe_get(e, sq), from, key, 0);
	} else {
		for (; posted < WINDOW && posted < j->n; posted++)
			post_get(sqe_get(e, sq), from, j->run, posted);
	}
	ferry_sq_submit(sq);
	atomic_store(&sh->ack, atomic_load(&sh->seq)); /* ready */
	while (got < j->n) {
		struct ferry_cqe c[32];
		int n = ferry_cq_poll(ferry_cq_default(e), c, 32);
		uint64_t now = n > 0 ? now_ns() : 0;

		for (int i = 0; i < n; i++) {
			uint64_t sent;

			if (c[i].res < 0) {
				sh->err = c[i].res;
				return;
			}
			memcpy(&sent, ferry_buf_data(c[i].buf), sizeof(sent));
			sh->lat[sh->nsamples++] = now - sent;
			sh->last_recv = now;
			ferry_buf_release(c[i].buf);
			got++;
			if (j->mode == MODE_RAW && posted < j->n)
				post_get(sqe_get(e, sq), from, j->run, posted++);
		}
		if (n > 0) {
			if (j->mode == MODE_RAW)
				ferry_sq_submit(sq);
			atomic_store_explicit(&sh->received, got, memory_order_release);
		}
	}
}

static int consumer_main(void)
{
	struct ferry_engine *e;
	struct ferry_peer *from;
	struct ferry_sq *sq;
	int seen = 0;

	pin(1);
	e = mk("cons", tcp ? (256u << 20) : (64u << 20));
	if (tcp)
		CHECK(ferry_engine_address(e, sh->addr, sizeof(sh->addr)));
	CHECK(ferry_peer_open(e, "prod", &from));
	CHECK(ferry_sq_get(e, &sq));
	atomic_store(&sh->ack, -1); /* up */
	while (!atomic_load(&sh->quit)) {
		int s = atomic_load(&sh->seq);

		if (s == seen) {
			ferry_progress(e);
			continue;
		}
		seen = s;
		consume(e, sq, from);
		atomic_store(&sh->ack, -2 - s); /* done */
	}
	ferry_engine_destroy(e);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Producer                                                            */
/* ------------------------------------------------------------------ */

struct result {
	double p50_ns, p99_ns, gbps;
};

static struct result produce(struct ferry_engine *e, struct ferry_sq *sq, struct ferry_peer *to,
			     const struct job *j)
{
	static int seq;
	uint32_t sent = 0, done = 0;
	struct result r = { 0, 0, 0 };
	char key[32];

	sh->job = *j;
	sh->received = 0;
	atomic_store(&sh->seq, ++seq);
	while (atomic_load(&sh->ack) != seq)
		ferry_progress(e);
	if (j->mode == MODE_STREAM)
		snprintf(key, sizeof(key), "s%d", j->run);
	while (done < j->n) {
		struct ferry_cqe c[32];
		int n;

		if (sent < j->n && sent - done < WINDOW &&
		    (!j->paced || atomic_load_explicit(&sh->received, memory_order_acquire) == sent)) {
			struct ferry_buf *b;
			struct ferry_sqe *sqe;
			uint64_t t;

			if (ferry_buf_alloc(e, j->size, &b) == 0) {
				memset((char *)ferry_buf_data(b) + 8, (int)sent, 64);
				sqe = sqe_get(e, sq);
				t = now_ns();
				memcpy(ferry_buf_data(b), &t, sizeof(t));
				if (sent == 0)
					sh->first_send = t;
				if (j->mode == MODE_STREAM) {
					ferry_prep_stream_put_buf(sqe, to, key, b, sent);
					if (sent == j->n - 1)
						ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_END);
				} else {
					char k[32];

					snprintf(k, sizeof(k), "r%d_%u", j->run, sent);
					ferry_prep_put_buf(sqe, to, k, b, sent);
				}
				ferry_sq_submit(sq);
				sent++;
			}
		}
		n = ferry_cq_poll(ferry_cq_default(e), c, 32);
		for (int i = 0; i < n; i++) {
			if (c[i].res < 0)
				die("put", c[i].res);
			done++;
		}
	}
	while (atomic_load(&sh->ack) != -2 - seq) {
		if (sh->err)
			die("consumer", sh->err);
		ferry_progress(e);
	}
	r.p50_ns = pct(sh->lat, sh->nsamples, 50);
	r.p99_ns = pct(sh->lat, sh->nsamples, 99);
	r.gbps = (double)j->size * j->n / (double)(sh->last_recv - sh->first_send);
	return r;
}

static int run_seq;

/* Is case @name in the comma-separated list @only (NULL: every case)? */
static bool wanted(const char *only, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = only; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0'))
			return true;
	return !only;
}

static void one_case(struct ferry_engine *e, struct ferry_sq *sq, struct ferry_peer *to,
		     const char *name, size_t size, uint32_t n, bool paced)
{
	double v[2][3][REPS];
	const char *modes[2] = { "raw", "stream" };

	for (int rep = 0; rep < REPS; rep++) {
		for (int m = 0; m < 2; m++) {
			struct job j = { .mode = (rep & 1) ? 1 - m : m, .run = ++run_seq,
					 .size = size, .n = n, .paced = paced };
			struct result r = produce(e, sq, to, &j);

			v[j.mode][0][rep] = r.p50_ns;
			v[j.mode][1][rep] = r.p99_ns;
			v[j.mode][2][rep] = r.gbps;
		}
	}
	jopen(name);
	jnum("size", (double)size);
	jnum("chunks", n);
	jbool("paced", paced);
	for (int m = 0; m < 2; m++) {
		jopen(modes[m]);
		jstat("p50_ns", stat_of(v[m][0], REPS), 0);
		jstat("p99_ns", stat_of(v[m][1], REPS), 0);
		jstat("gbps", stat_of(v[m][2], REPS), 3);
		jclose();
	}
	{
		double p50 = stat_of(v[1][0], REPS).median / stat_of(v[0][0], REPS).median;
		double p99 = stat_of(v[1][1], REPS).median / stat_of(v[0][1], REPS).median;
		double bw = stat_of(v[0][2], REPS).median / stat_of(v[1][2], REPS).median;

		jopen("stream_over_raw");
		jfix("p50", p50, 3);
		jfix("p99", p99, 3);
		jfix("time_per_byte", bw, 3); /* raw bandwidth / stream bandwidth */
		jclose();
		jclose();
		progress("%-14s raw p50 %.0f ns p99 %.0f ns %.2f GB/s | stream p50 %.0f ns p99 %.0f "
			 "ns %.2f GB/s | stream/raw p50 %.3f p99 %.3f time %.3f",
			 name, stat_of(v[0][0], REPS).median, stat_of(v[0][1], REPS).median,
			 stat_of(v[0][2], REPS).median, stat_of(v[1][0], REPS).median,
			 stat_of(v[1][1], REPS).median, stat_of(v[1][2], REPS).median, p50, p99,
			 bw);
	}
}

int main(int argc, char **argv)
{
	bool quick = false;
	const char *only = NULL;
	time_t started = time(NULL);
	double load0 = loadavg1();
	struct ferry_engine *e;
	struct ferry_peer *to;
	struct ferry_sq *sq;
	pid_t child;
	int st;
	char rundir[] = "/tmp/ferry-bench-stream-XXXXXX", cpu[128];

	who = "bench_stream";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--tcp"))
			tcp = true;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else {
			fprintf(stderr, "usage: bench_stream [--quick] [--tcp] [--only CASE[,CASE]]\n");
			return 2;
		}
	}
	if (!mkdtemp(rundir))
		die("mkdtemp", -errno);
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	snprintf(ns, sizeof(ns), "bstream%d", (int)getpid());
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap", -errno);
	atomic_store(&sh->ack, 0);
	child = fork();
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the producer */
		if (getppid() == 1)
			_exit(1);
		_exit(consumer_main());
	}
	while (atomic_load(&sh->ack) != -1)
		usleep(1000);
	alarm(quick ? 300 : 900); /* a hang is a failure with a name, not a stuck job */
	pin(0);
	e = mk("prod", 128u << 20);
	CHECK(ferry_peer_open(e, "cons", &to));
	if (tcp)
		CHECK(ferry_peer_set_address(to, sh->addr));
	CHECK(ferry_peer_set_stream_limits(to, getenv("BS_LIMIT") ? (uint32_t)atoi(getenv("BS_LIMIT")) : WINDOW, 1u << 20));
	CHECK(ferry_sq_get(e, &sq));

	read_cpu_model(cpu, sizeof(cpu));
	jheader("bench_stream", started, load0, (double)sysconf(_SC_NPROCESSORS_ONLN), cpu);
	jstr("transport", tcp ? "tcp" : "shm");
	jnum("reps", REPS);
	jnum("window", WINDOW);
	jopen("cases");
	if (wanted(only, "lat_4k"))
		one_case(e, sq, to, "lat_4k", 4096, quick ? 2000 : 20000, true);
	if (wanted(only, "lat_1m"))
		one_case(e, sq, to, "lat_1m", 1u << 20, quick ? 200 : 2000, true);
	if (wanted(only, "bw_4k"))
		one_case(e, sq, to, "bw_4k", 4096, quick ? 5000 : 100000, false);
	if (wanted(only, "bw_1m"))
		one_case(e, sq, to, "bw_1m", 1u << 20, quick ? 300 : 3000, false);
	jclose();
	jclose();
	atomic_store(&sh->quit, 1);
	waitpid(child, &st, 0);
	ferry_engine_destroy(e);
	rmdir(rundir);
	printf("%.*s\n", (int)js.len, js.p);
	return 0;
}

/*
 * bench/bench_tcp.c - the tcp transport between two processes on loopback,
 * against its peers (ucx_perftest UCX_TLS=tcp, iperf3, qperf) in one run.
 *
 * The program forks one peer process before any engine exists; the parent
 * (CPU 0) sends, the child (CPU 1) receives and answers, each driving one
 * MANUAL-mode engine and spinning in ferry_cq_poll (busy mode). The child
 * listens on 127.0.0.1 port 0 and tells the parent its address over a pipe;
 * both hold the same cluster secret, so every connection is authenticated
 * as in production.
 *
 * Prints ONE JSON object on stdout (progress goes to stderr):
 *   latency     one-way = RTT / 2 of a ping-pong (A PUTs p_i to B, B GETs it
 *               and PUTs r_i back, A GETs r_i), 64 B and 64 KiB, p50/p99
 *   bandwidth   64 KiB / 4 MiB / 1 GiB streamed with a window: the sender
 *               PUTs pool buffers (zero copy), the receiver GETs zero copy and
 *               releases; a PUT completes once the receiver holds the key
 *   conns       4 MiB bandwidth with 1, 2 and 4 connections per peer (how
 *               the default, TCP_DEFAULT_CONNS in backends/tcp/tcp.c, was
 *               chosen)
 *   peers       bench/peers_tcp.sh: ucx_perftest tag_lat / tag_bw, iperf3 one
 *               stream, qperf tcp_bw / tcp_lat, pinned the same way
 *   targets     pass / fail / n/a of the targets
 * Every figure is the median (and min/max) over --reps repetitions. The
 * loopback peers run once after each rep of ferry's main pair, not all at
 * the end: this machine's speed changes from one minute to the next, so
 * ferry rep r and the peers' rep r are measured side by side, and `paired`
 * gives the median of the per-rep ratios ferry / peer beside the targets
 * (which compare the medians, as before).
 *
 *   veth        (--veth, root) the same latency and 64 KiB / 4 MiB streams
 *               between two network namespaces joined by a veth pair that the
 *               benchmark creates and removes, and the peers across it
 *
 * Options: --quick (smoke: fewer samples, no 1 GiB), --reps N (default 3),
 * --no-peers, --veth, --conns N (only the 4 MiB run with N connections),
 * --only lat|lat64|bw (ferry alone: only the latency runs, only the 64 B
 * one, or only 4 MiB bandwidth with the default connections; for quick A/B
 * comparisons and for counting syscalls per round trip).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)
#define GIB ((size_t)1024 * 1024 * 1024)
#define SECRET "bench-tcp-secret"
#define MAX_REPS 16
#define UD_BW (1ull << 61)

static struct {
	bool quick, peers, main_pair, veth;
	int reps;
	int conns; /* --conns N: only the connections-per-peer runs, N only */
	char only; /* --only lat|lat64|bw: 'l', '6' or 'b', else 0 */
} opt = { false, true, true, false, 3, 0, 0 };

/* Commands the parent sends the child. */
enum { C_LAT = 1, C_BW = 2, C_QUIT = 3 };

struct cmd {
	int kind;
	uint64_t size, iters, window;
	uint64_t base; /* bandwidth: keys b<base ...> */
};

static int cmd_fd[2], rep_fd[2];
static pid_t child_pid;
/* --veth: the child's namespace and the address it listens on. */
static char child_ns[64];
static char child_listen[64] = "tcp://127.0.0.1:0";

static int enter_ns(const char *ns)
{
	char path[128];
	int fd, rc;

	snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = setns(fd, CLONE_NEWNET) ? -errno : 0;
	close(fd);
	return rc;
}

static void xwrite(int fd, const void *p, size_t n)
{
	if (write(fd, p, n) != (ssize_t)n)
		die("pipe write", -EIO);
}

static void xread(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r <= 0)
			die("pipe read", -EIO);
		got += (size_t)r;
	}
}

static void pin_to(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static struct ferry_engine *engine(const char *name, const char *listen, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = "benchtcp";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = pool;
	p.listen = listen;
	p.secret = SECRET;
	/*
	 * Both engines are MANUAL and sit undriven while the peers run
	 * between reps (tens of seconds): a silent peer must not be declared
	 * dead meanwhile.
	 */
	p.peer_timeout_ms = 600000;
	p.max_ops = 8192;
	p.cq_entries = 8192;
	p.sq_entries = 1024;
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

static struct ferry_sqe *sqe_of(struct ferry_engine *e, struct ferry_sq *sq)
{
	struct ferry_sqe *s;

	while (!(s = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq);
		ferry_progress(e);
	}
	return s;
}

/*
 * Spin until a CQE comes; any result. The clock is read every 4096 empty
 * polls only: a read per poll made every turn of the spin ~30 ns longer
 * (UCX's perftest loop reads none).
 */
static void next_cqe_any(struct ferry_engine *e, struct ferry_cqe *c)
{
	uint64_t t0 = now_ns();
	unsigned polls = 0;

	while (ferry_cq_poll(ferry_cq_default(e), c, 1) != 1) {
		if (!(++polls & 4095) && now_ns() - t0 > 60ull * 1000000000ull)
			die("no completion for 60 s", -ETIMEDOUT);
	}
}

/* Spin until a CQE comes; it must have succeeded. */
static void next_cqe(struct ferry_engine *e, struct ferry_cqe *c)
{
	next_cqe_any(e, c);
	if (c->res < 0)
		die("op failed", c->res);
}

/*
 * Keep driving the engine a moment before leaving it idle (blocked on the
 * command pipe): answers still on their way leave (a RESULT may wait up to
 * 20 us for a PUT to travel with, docs/design.md section 12).
 */
static void drive_for(struct ferry_engine *e, uint64_t ns)
{
	uint64_t t0 = now_ns();

	while (now_ns() - t0 < ns)
		ferry_progress(e);
}

/* PUTs the receiver refused for want of pool room or key slots (sent again). */
static uint64_t refused_total;

/* ------------------------------------------------------------------ */
/* The child: receives and answers                                     */
/* ------------------------------------------------------------------ */

static void child_lat(struct ferry_engine *e, struct ferry_peer *a, const struct cmd *c)
{
	struct ferry_sq *sq;
	char *data = calloc(1, c->size);
	struct iovec v = { data, c->size };
	uint64_t done = 0;
	char key[32];

	CHECK(ferry_sq_get(e, &sq));
	key_of(key, 'p', 0);
	ferry_prep_get(sqe_of(e, sq), a, key, NULL, 0, 1ull << 62);
	ferry_sq_submit(sq);
	while (done < c->iters) {
		struct ferry_cqe q;

		next_cqe(e, &q);
		if (q.user_data != 1ull << 62)
			continue; /* our PUTs completing */
		key_of(key, 'r', done);
		ferry_prep_put(sqe_of(e, sq), a, key, &v, 1, 7);
		done++;
		if (done < c->iters) {
			key_of(key, 'p', done);
			ferry_prep_get(sqe_of(e, sq), a, key, NULL, 0, 1ull << 62);
		}
		ferry_sq_submit(sq);
		/*
		 * The answer does not need the data: the buffer goes back once
		 * the answer is on its way, as a latency-minded application
		 * would do it (UCX's tag_lat receives into a fixed buffer and
		 * gives nothing back).
		 */
		ferry_buf_release(q.buf);
	}
	/* The last PUTs' completions. */
	drive_for(e, 1000000);
	free(data);
}

static void child_bw(struct ferry_engine *e, struct ferry_peer *a, const struct cmd *c)
{
	struct ferry_sq *sq;
	uint64_t asked = 0, got = 0, base = c->base;
	char key[32];

	CHECK(ferry_sq_get(e, &sq));
	while (got < c->iters) {
		struct ferry_cqe q;

		while (asked < c->iters && asked - got < c->window) {
			key_of(key, 'b', base + asked);
			ferry_prep_get(sqe_of(e, sq), a, key, NULL, 0, asked);
			asked++;
		}
		ferry_sq_submit(sq);
		next_cqe(e, &q);
		if (!(q.flags & FERRY_CQE_F_BUF))
			continue; /* a PUT of the latency run completing late */
		ferry_buf_release(q.buf);
		got++;
	}
	drive_for(e, 1000000); /* the last RESULTs */
}

static int child_main(void)
{
	struct ferry_engine *e;
	struct ferry_peer *a;
	char addr[128];
	size_t pool;
	int n;

	/* Never outlive the parent (it may hold the benchmark lock's fd). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	pin_to(1);
	if (child_ns[0] && enter_ns(child_ns))
		die("setns", -errno);
	xread(cmd_fd[0], &pool, sizeof(pool));
	e = engine("rx", child_listen, pool);
	n = ferry_engine_address(e, addr, sizeof(addr));
	if (n <= 0)
		die("ferry_engine_address", n);
	xwrite(rep_fd[1], addr, sizeof(addr));
	CHECK(ferry_peer_open(e, "tx", &a));
	for (;;) {
		struct cmd c;
		int ok = 0;

		xread(cmd_fd[0], &c, sizeof(c));
		if (c.kind == C_QUIT)
			break;
		if (c.kind == C_LAT)
			child_lat(e, a, &c);
		else
			child_bw(e, a, &c);
		xwrite(rep_fd[1], &ok, sizeof(ok));
	}
	ferry_engine_destroy(e);
	return 0;
}

/* ------------------------------------------------------------------ */
/* The parent: sends and measures                                      */
/* ------------------------------------------------------------------ */

struct pair {
	struct ferry_engine *e;
	struct ferry_peer *b;
	struct ferry_sq *sq;
};

/* conns 0: the library's default (TCP_DEFAULT_CONNS), as an application gets it. */
static void pair_open(struct pair *p, size_t pool, int conns)
{
	char addr[128], env[16];

	snprintf(env, sizeof(env), "%d", conns);
	if (conns)
		setenv("FERRY_TCP_CONNS", env, 1);
	else
		unsetenv("FERRY_TCP_CONNS");
	xwrite(cmd_fd[1], &pool, sizeof(pool));
	xread(rep_fd[0], addr, sizeof(addr));
	p->e = engine("tx", NULL, pool);
	CHECK(ferry_peer_open(p->e, "rx", &p->b));
	CHECK(ferry_peer_set_address(p->b, addr));
	CHECK(ferry_sq_get(p->e, &p->sq));
}

static void run_child_cmd(const struct cmd *c)
{
	xwrite(cmd_fd[1], c, sizeof(*c));
}

static void wait_child_ok(void)
{
	int ok;

	xread(rep_fd[0], &ok, sizeof(ok));
}

struct lat {
	double p50[MAX_REPS], p99[MAX_REPS];
};

static void lat_once(struct pair *p, size_t size, uint64_t n, double *p50, double *p99)
{
	struct cmd c = { .kind = C_LAT, .size = size, .iters = n };
	uint64_t *rtt = malloc(sizeof(*rtt) * n);
	char *data = calloc(1, size);
	struct iovec v = { data, size };
	char key[32];

	run_child_cmd(&c);
	for (uint64_t i = 0; i < n; i++) {
		struct ferry_cqe q;
		uint64_t t0 = now_ns();

		key_of(key, 'r', i);
		ferry_prep_get(sqe_of(p->e, p->sq), p->b, key, NULL, 0, 1ull << 62);
		key_of(key, 'p', i);
		ferry_prep_put(sqe_of(p->e, p->sq), p->b, key, &v, 1, 5);
		ferry_sq_submit(p->sq);
		do
			next_cqe(p->e, &q);
		while (q.user_data != 1ull << 62);
		rtt[i] = now_ns() - t0;
		ferry_buf_release(q.buf);
	}
	wait_child_ok();
	drive_for(p->e, 1000000);
	/* Drop the first tenth: connection set-up and warm-up. */
	*p50 = pct(rtt + n / 10, n - n / 10, 50) / 2;
	*p99 = pct(rtt + n / 10, n - n / 10, 99) / 2;
	free(rtt);
	free(data);
}

static double bw_once(struct pair *p, size_t size, uint64_t iters, uint64_t window)
{
	static uint64_t seq; /* keys are never reused, even across pairs */
	struct cmd c = { .kind = C_BW, .size = size, .iters = iters, .window = window,
			 .base = seq };
	uint64_t sent = 0, done = 0, t0;
	char key[32];

	run_child_cmd(&c);
	t0 = now_ns();
	while (done < iters) {
		struct ferry_cqe q;

		while (sent < iters && sent - done < window) {
			struct ferry_buf *b;

			if (ferry_buf_alloc(p->e, size, &b))
				break;
			key_of(key, 'b', seq + sent);
			ferry_prep_put_buf(sqe_of(p->e, p->sq), p->b, key, b, UD_BW | sent);
			sent++;
		}
		ferry_sq_submit(p->sq);
		next_cqe_any(p->e, &q);
		if ((q.user_data & UD_BW) != UD_BW)
			continue; /* a PUT of the latency run completing late */
		if (q.res == -ENOBUFS || q.res == -ENOSPC) {
			/*
			 * The receiver's pool or key table was full (the stream
			 * runs ahead of its GETs): the same PUT again, as an
			 * application would.
			 */
			struct ferry_buf *b;
			uint64_t i = q.user_data & ~UD_BW;

			while (ferry_buf_alloc(p->e, size, &b))
				ferry_progress(p->e);
			key_of(key, 'b', seq + i);
			ferry_prep_put_buf(sqe_of(p->e, p->sq), p->b, key, b, UD_BW | i);
			refused_total++;
			continue;
		}
		if (q.res < 0)
			die("PUT failed", q.res);
		done++;
	}
	seq += iters;
	wait_child_ok();
	return (double)size * (double)iters / (double)(now_ns() - t0); /* GB/s */
}

static void pair_close(struct pair *p)
{
	ferry_engine_destroy(p->e);
	p->e = NULL;
}

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

#define PEER_MAX 24

struct peer_fig {
	char tool[16], test[16];
	uint64_t bytes;
	int n;
	double v[MAX_REPS]; /* us (latency, one way) or GB/s */
};

static struct peer_fig peers[PEER_MAX];
static int npeers;
static char peer_info[256];

static struct peer_fig *peer_of(const char *tool, const char *test, uint64_t bytes)
{
	for (int i = 0; i < npeers; i++)
		if (!strcmp(peers[i].tool, tool) && !strcmp(peers[i].test, test) &&
		    peers[i].bytes == bytes)
			return &peers[i];
	if (npeers == PEER_MAX)
		return NULL;
	snprintf(peers[npeers].tool, sizeof(peers[npeers].tool), "%s", tool);
	snprintf(peers[npeers].test, sizeof(peers[npeers].test), "%s", test);
	peers[npeers].bytes = bytes;
	return &peers[npeers++];
}

static void peers_run_args(int reps, const char *extra, const char *prefix)
{
	char script[1024], cmdline[1600], line[512];
	char *slash;
	FILE *f;

	snprintf(script, sizeof(script), "%s", __FILE__);
	slash = strrchr(script, '/');
	if (slash)
		snprintf(slash + 1, sizeof(script) - (size_t)(slash + 1 - script), "peers_tcp.sh");
	if (getenv("FERRY_BENCH_DIR"))
		snprintf(script, sizeof(script), "%s/peers_tcp.sh", getenv("FERRY_BENCH_DIR"));
	snprintf(cmdline, sizeof(cmdline), "bash '%s' --reps %d %s %s", script, reps,
		 opt.quick ? "--quick" : "", extra);
	f = popen(cmdline, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char tool[16], test[16];
		unsigned long long bytes;
		int rep;
		double v;
		struct peer_fig *pf;

		line[strcspn(line, "\n")] = '\0';
		if (!strncmp(line, "info ", 5)) {
			size_t l = strlen(peer_info);

			if (strstr(peer_info, line + 5))
				continue; /* said by an earlier rep */
			snprintf(peer_info + l, sizeof(peer_info) - l, "%s%.100s", l ? "; " : "",
				 line + 5);
			for (char *s = peer_info; *s; s++)
				if (*s == '"' || *s == '\\')
					*s = '\'';
		} else if (sscanf(line, "run %15s %15s %llu %d %lf", tool, test, &bytes, &rep,
				  &v) == 5) {
			char ptool[16];

			snprintf(ptool, sizeof(ptool), "%s%s", prefix, tool);
			pf = peer_of(ptool, test, bytes);
			if (pf && pf->n < MAX_REPS)
				pf->v[pf->n++] = v;
		} else {
			progress("peers: %s", line);
		}
	}
	pclose(f);
}

/* One rep of the loopback peers (their figures are appended in rep order). */
static void peers_run_rep(void)
{
	peers_run_args(1, "", "");
}

static double peer_median(const char *tool, const char *test, uint64_t bytes)
{
	for (int i = 0; i < npeers; i++)
		if (!strcmp(peers[i].tool, tool) && !strcmp(peers[i].test, test) &&
		    peers[i].bytes == bytes && peers[i].n)
			return stat_of(peers[i].v, peers[i].n).median;
	return -1;
}

/*
 * The per-rep ratios ferry / peer (ferry's rep r scaled by `scale`, the peer's
 * rep r run right after it), when the peer has one figure per rep; JSON
 * `paired.<name>` with their median, min and max and how many reps ferry
 * did as well or better (`higher_is_better` says which way that is).
 */
static void jpaired(const char *name, const double *ours, double scale, const char *tool,
		    const char *test, uint64_t bytes, bool higher_is_better)
{
	double ratio[MAX_REPS];
	int better = 0;

	for (int i = 0; i < npeers; i++) {
		const struct peer_fig *pf = &peers[i];

		if (strcmp(pf->tool, tool) || strcmp(pf->test, test) || pf->bytes != bytes ||
		    pf->n != opt.reps)
			continue;
		for (int r = 0; r < opt.reps; r++) {
			if (!(pf->v[r] > 0))
				return; /* a peer run without a figure: no ratios */
			ratio[r] = ours[r] * scale / pf->v[r];
			better += higher_is_better ? ratio[r] >= 1.0 : ratio[r] <= 1.0;
		}
		jopen(name);
		jstat("ferry_over_peer", stat_of(ratio, opt.reps), 3);
		jnum("reps_ferry_as_good_or_better", better);
		jnum("reps", opt.reps);
		jclose();
		return;
	}
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* --veth: the same ping-pong and streams between two namespaces over a veth pair. */
struct veth_res {
	bool ran;
	char why[128];
	double lat50[2][MAX_REPS], bw[2][MAX_REPS];
};

static int sh(const char *cmd)
{
	int rc = system(cmd);

	return rc == 0 ? 0 : -1;
}

static void veth_run(struct veth_res *v)
{
	char cmd[1024], na[24], nb[24];
	int net = 200 + getpid() % 50;
	struct pair p;

	snprintf(na, sizeof(na), "fbench%da", getpid());
	snprintf(nb, sizeof(nb), "fbench%db", getpid());
	snprintf(cmd, sizeof(cmd),
		 "ip netns add %s && ip netns add %s && "
		 "ip link add vba%d netns %s type veth peer name vbb%d netns %s && "
		 "ip -n %s addr add 10.%d.1.1/24 dev vba%d && ip -n %s addr add 10.%d.1.2/24 dev vbb%d && "
		 "ip -n %s link set vba%d up && ip -n %s link set vbb%d up && "
		 "ip -n %s link set lo up && ip -n %s link set lo up",
		 na, nb, net, na, net, nb, na, net, net, nb, net, net, na, net, nb, net, na, nb);
	if (geteuid() != 0 || sh(cmd)) {
		snprintf(v->why, sizeof(v->why), "%s", geteuid() ? "needs root" :
			 "cannot create namespaces");
		goto out;
	}
	snprintf(child_ns, sizeof(child_ns), "%s", nb);
	snprintf(child_listen, sizeof(child_listen), "tcp://10.%d.1.2:0", net);
	if (pipe(cmd_fd) || pipe(rep_fd))
		die("pipe", -errno);
	child_pid = fork();
	if (child_pid == 0)
		_exit(child_main());
	{
		/* The parent's side in namespace a, for this section only. */
		int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);

		if (enter_ns(na))
			die("setns", -errno);
		pair_open(&p, 256 * MIB, 0);
		for (int r = 0; r < opt.reps; r++) {
			uint64_t n = opt.quick ? 2000 : 10000;
			double p99;

			progress("veth, rep %d", r);
			lat_once(&p, 64, n, &v->lat50[0][r], &p99);
			lat_once(&p, 64 * KIB, n / 4, &v->lat50[1][r], &p99);
			v->bw[0][r] = bw_once(&p, 64 * KIB, opt.quick ? 5000 : 20000, 64);
			v->bw[1][r] = bw_once(&p, 4 * MIB, opt.quick ? 100 : 300, 16);
		}
		pair_close(&p);
		{
			struct cmd q = { .kind = C_QUIT };

			run_child_cmd(&q);
		}
		waitpid(child_pid, NULL, 0);
		if (self >= 0) {
			if (setns(self, CLONE_NEWNET))
				die("setns back", -errno);
			close(self);
		}
	}
	v->ran = true;
	/* The peers across the same pair. */
	if (opt.peers) {
		snprintf(cmd, sizeof(cmd), "--veth %s %s 10.%d.1.2", na, nb, net);
		peers_run_args(opt.reps, cmd, "veth_");
	}
out:
	snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", na,
		 nb);
	if (system(cmd) < 0)
		progress("could not remove namespaces %s %s", na, nb);
	child_ns[0] = '\0';
}

static int t_pass, t_fail, t_na;

static void jtarget(const char *name, double ours, double theirs, bool higher_is_better)
{
	const char *verdict;

	if (ours < 0 || theirs < 0) {
		verdict = "n/a";
		t_na++;
	} else if (higher_is_better ? ours >= theirs : ours <= theirs) {
		verdict = "pass";
		t_pass++;
	} else {
		verdict = "fail";
		t_fail++;
	}
	jopen(name);
	jnum("ferry", ours);
	jnum("peer", theirs);
	jstr("verdict", verdict);
	jclose();
}

int main(int argc, char **argv)
{
	static const int conn_choices[] = { 1, 2, 4 };
	double lat50[2][MAX_REPS] = { { 0 } }, lat99[2][MAX_REPS] = { { 0 } };
	double bw[3][MAX_REPS] = { { 0 } }, cbw[3][MAX_REPS] = { { 0 } };
	time_t started = time(NULL);
	double load0 = loadavg1();
	struct pair p;
	size_t pool;

	who = "bench_tcp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			opt.quick = true;
		else if (!strcmp(argv[i], "--no-peers"))
			opt.peers = false;
		else if (!strcmp(argv[i], "--veth"))
			opt.veth = true;
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			opt.reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--conns") && i + 1 < argc)
			opt.conns = atoi(argv[++i]), opt.main_pair = false;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc &&
			 (!strcmp(argv[i + 1], "lat") || !strcmp(argv[i + 1], "bw") ||
			  !strcmp(argv[i + 1], "lat64")))
			opt.only = !strcmp(argv[++i], "lat64") ? '6' : argv[i][0], opt.peers = false;
		else {
			fprintf(stderr, "usage: %s [--quick] [--reps N] [--no-peers] [--veth] "
				"[--conns N] [--only lat|lat64|bw]\n", argv[0]);
			return 2;
		}
	}
	if (opt.reps < 1 || opt.reps > MAX_REPS)
		opt.reps = 3;
	if (!getenv("FERRY_LOG")) /* quiet unless asked */
		ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	signal(SIGPIPE, SIG_IGN);
	bench_watchdog(opt.quick ? 900 : 3600); /* the veth part, if interrupted, leaves its namespaces */
	if (pipe(cmd_fd) || pipe(rep_fd))
		die("pipe", -errno);
	child_pid = fork();
	if (child_pid == 0)
		_exit(child_main());
	pin_to(0);

	if (opt.main_pair) {
		pool = opt.quick ? 256 * MIB : GIB + 64 * MIB;
		pair_open(&p, pool, 0);
		for (int r = 0; r < opt.reps; r++) {
			uint64_t n = opt.quick ? 2000 : 20000;

			if (opt.only != 'b') {
				progress("latency, rep %d", r);
				lat_once(&p, 64, n, &lat50[0][r], &lat99[0][r]);
				if (opt.only != '6')
					lat_once(&p, 64 * KIB, n / 4, &lat50[1][r], &lat99[1][r]);
			}
			if (opt.only == 'l' || opt.only == '6') {
				bw[0][r] = bw[1][r] = bw[2][r] = -1;
				continue;
			}
			progress("bandwidth, rep %d", r);
			bw[0][r] = opt.only ? -1 : bw_once(&p, 64 * KIB, opt.quick ? 5000 : 40000, 64);
			bw[1][r] = bw_once(&p, 4 * MIB, opt.quick ? 100 : 600, 16);
			bw[2][r] = opt.quick || opt.only ? -1 : bw_once(&p, GIB, 2, 1);
			if (opt.peers) {
				progress("peers (ucx_perftest, iperf3, qperf), rep %d", r);
				peers_run_rep();
			}
		}
		pair_close(&p);
		{
			struct cmd q = { .kind = C_QUIT };

			run_child_cmd(&q);
		}
		waitpid(child_pid, NULL, 0);
	}

	/* Connections per peer, 4 MiB: a fresh pair for each choice. */
	for (int ci = 0; ci < 3 && !opt.only; ci++) {
		if (opt.conns && opt.conns != conn_choices[ci])
			continue;
		if (pipe(cmd_fd) || pipe(rep_fd))
			die("pipe", -errno);
		child_pid = fork();
		if (child_pid == 0)
			_exit(child_main());
		pair_open(&p, 256 * MIB, conn_choices[ci]);
		progress("4 MiB with %d connections", conn_choices[ci]);
		for (int r = 0; r < opt.reps; r++)
			cbw[ci][r] = bw_once(&p, 4 * MIB, opt.quick ? 100 : 600, 16);
		pair_close(&p);
		{
			struct cmd q = { .kind = C_QUIT };

			run_child_cmd(&q);
		}
		waitpid(child_pid, NULL, 0);
	}
	if (opt.peers && !opt.main_pair)
		for (int r = 0; r < opt.reps; r++) {
			progress("peers (ucx_perftest, iperf3, qperf), rep %d", r);
			peers_run_rep();
		}
	struct veth_res vr = { 0 };

	if (opt.veth)
		veth_run(&vr);

	{
		char cpu[128];

		read_cpu_model(cpu, sizeof(cpu));
		jheader("bench_tcp", started, load0, (double)sysconf(_SC_NPROCESSORS_ONLN), cpu);
	}
	jnum("reps", opt.reps);
	jbool("quick", opt.quick);
	jstr("mode", "MANUAL, busy polling; sender on CPU 0, receiver on CPU 1; loopback");
	jstr("connections", "the library default (TCP_DEFAULT_CONNS) except in the conns section");
	jnum("refused_and_resent", (double)refused_total);
	jopen("latency_one_way_ns");
	for (int s = 0; s < 2; s++) {
		jopen(s ? "64KiB" : "64B");
		jstat("p50", stat_of(lat50[s], opt.reps), 0);
		jstat("p99", stat_of(lat99[s], opt.reps), 0);
		jclose();
	}
	jclose();
	jopen("bandwidth_GBps");
	for (int s = 0; s < 3; s++) {
		if (bw[s][0] < 0)
			continue;
		jstat(s == 0 ? "64KiB" : s == 1 ? "4MiB" : "1GiB", stat_of(bw[s], opt.reps), 3);
	}
	jclose();
	jopen("conns_4MiB_GBps");
	for (int ci = 0; ci < 3; ci++) {
		char k[8];

		snprintf(k, sizeof(k), "%d", conn_choices[ci]);
		jstat(k, stat_of(cbw[ci], opt.reps), 3);
	}
	jclose();
	if (opt.veth) {
		jopen("veth");
		jbool("ran", vr.ran);
		if (!vr.ran)
			jstr("why", vr.why);
		else {
			jstat("latency_64B_one_way_ns_p50", stat_of(vr.lat50[0], opt.reps), 0);
			jstat("latency_64KiB_one_way_ns_p50", stat_of(vr.lat50[1], opt.reps), 0);
			jstat("bandwidth_64KiB_GBps", stat_of(vr.bw[0], opt.reps), 3);
			jstat("bandwidth_4MiB_GBps", stat_of(vr.bw[1], opt.reps), 3);
		}
		jclose();
	}
	jopen("peers");
	jstr("info", peer_info);
	for (int i = 0; i < npeers; i++) {
		char k[64];

		snprintf(k, sizeof(k), "%.15s_%.15s_%llu", peers[i].tool, peers[i].test,
			 (unsigned long long)peers[i].bytes);
		jstat(k, stat_of(peers[i].v, peers[i].n), 3);
	}
	jclose();
	jopen("targets");
	{
		double bw4 = stat_of(bw[1], opt.reps).median;
		double l64 = stat_of(lat50[0], opt.reps).median / 1000.0;

		jtarget("bw_4MiB_vs_ucx_tcp_tag_bw", bw4, peer_median("ucx", "tag_bw", 4 * MIB),
			true);
		jtarget("bw_4MiB_vs_iperf3_one_stream", bw4, peer_median("iperf3", "stream", 0),
			true);
		jtarget("lat_64B_one_way_us_vs_ucx_tcp_tag_lat", l64,
			peer_median("ucx", "tag_lat", 64), false);
	}
	jnum("pass", t_pass);
	jnum("fail", t_fail);
	jnum("n_a", t_na);
	jclose();
	jopen("paired");
	jpaired("bw_4MiB_vs_ucx_tcp_tag_bw", bw[1], 1.0, "ucx", "tag_bw", 4 * MIB, true);
	jpaired("bw_4MiB_vs_iperf3_one_stream", bw[1], 1.0, "iperf3", "stream", 0, true);
	jpaired("lat_64B_one_way_vs_ucx_tcp_tag_lat", lat50[0], 1e-3, "ucx", "tag_lat", 64,
		false);
	jclose();
	jclose();
	printf("%s\n", js.p);
	return 0;
}

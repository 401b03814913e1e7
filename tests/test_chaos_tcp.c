/*
 * tests/test_chaos_tcp.c - chaos over tcp: two processes, "a" and "b", in
 * two network namespaces joined by a veth pair exchange PUT/GET and
 * streams both ways (tests/chaos.h: every payload and chunk checked
 * against its key) while the parent cuts the link (`ip link set down`, on
 * either end, at random) and restores it at random intervals: some cuts
 * shorter than the peer timeout (the connections live on, everything is
 * late), most longer (both sides declare the other dead and call again
 * once the link is back). Root only: elsewhere, or without `ip netns`, it
 * exits 77 (skipped) and says why.
 *
 * Asserts: no wrong data, index, order or length; failures only with the
 * errors a cut explains; tcp carries every peer (both processes share one
 * runtime directory, so shm could reach the other engine: it must not);
 * every op ends within its deadline (and the slack) and nothing is
 * pending at the end; no key, stream record, op or pool block left, no
 * more file descriptors and RSS at the end than in the first half; the
 * runtime directory empty, nothing new in /dev/shm.
 * The namespaces go at the end, and a janitor process removes them should
 * the test die.
 *
 * FERRY_CHAOS_SECONDS=N runs N seconds of chaos (default 25; 8 under
 * valgrind), FERRY_CHAOS_SEED=S repeats a schedule (the seed is printed).
 */
#include "chaos.h"
#include "netns.h"

#define HEARTBEAT_MS 100
#define PEER_TIMEOUT_MS 1000

static char rundir[128];
static char nsn[2][32], dev[2][16];
static int net, janitor_fd = -1;
static struct ch_shared *sh;
static pid_t pids[2];

static void net_down(void)
{
	for (int i = 0; i < 2; i++)
		if (nsn[i][0])
			ns_sh("ip netns del %s 2>/dev/null", nsn[i]);
}

/* What the janitor does when the test process is gone: namespaces and runtime dir. */
static void leave(void)
{
	net_down();
	if (rundir[0])
		ns_sh("rm -rf %s", rundir);
}

static int group_setup(void **state)
{
	unsigned tag = (unsigned)getpid() ^ (unsigned)(t_now() / 1000) << 16;

	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr, "test_chaos_tcp: skipped: needs root (network namespaces)\n");
		exit(77);
	}
	if (ns_sh("ip netns list >/dev/null 2>&1") != 0) {
		fprintf(stderr, "test_chaos_tcp: skipped: `ip netns` is not available here\n");
		exit(77);
	}
	/* Names of this run only: two copies of the suite do not meet. */
	net = 16 + (int)(tag % 200);
	snprintf(nsn[0], sizeof(nsn[0]), "ferrych%ua", tag % 100000000u);
	snprintf(nsn[1], sizeof(nsn[1]), "ferrych%ub", tag % 100000000u);
	snprintf(dev[0], sizeof(dev[0]), "cha%u", tag % 100000000u);
	snprintf(dev[1], sizeof(dev[1]), "chb%u", tag % 100000000u);
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-chaostcp-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	janitor_fd = ns_janitor(leave);
	if (janitor_fd < 0 || ns_sh("ip netns add %s", nsn[0]) ||
	    ns_sh("ip netns add %s", nsn[1]) ||
	    ns_sh("ip link add %s netns %s type veth peer name %s netns %s", dev[0], nsn[0], dev[1],
		  nsn[1]) ||
	    ns_sh("ip -n %s addr add 10.%d.1.1/24 dev %s", nsn[0], net, dev[0]) ||
	    ns_sh("ip -n %s addr add 10.%d.1.2/24 dev %s", nsn[1], net, dev[1]) ||
	    ns_sh("ip -n %s link set %s up", nsn[0], dev[0]) ||
	    ns_sh("ip -n %s link set %s up", nsn[1], dev[1]) ||
	    ns_sh("ip -n %s link set lo up", nsn[0]) || ns_sh("ip -n %s link set lo up", nsn[1])) {
		net_down();
		fprintf(stderr, "test_chaos_tcp: skipped: cannot create namespaces and a veth pair "
				"here\n");
		exit(77);
	}
	unsetenv("FERRY_SECRET");
	/* Cut links are the point: the warnings they cause would drown the report. */
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	net_down();
	if (janitor_fd >= 0)
		close(janitor_fd);
	ns_sh("rm -rf %s", rundir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < 2; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			t_waitpid(pids[i], NULL, 0);
			pids[i] = 0;
		}
	if (sh)
		munmap(sh, sizeof(*sh));
	sh = NULL;
	return 0;
}

/* In the worker: its namespace, its engine listening there, the other's address. */
static struct ferry_engine *tcp_make(struct ch_shared *s, int me)
{
	struct mk m = {.name = s->name[me],
		       .ns = "chaos",
		       .listen = s->listen[me],
		       .secret = SECRET,
		       .pool = 64 * MIB,
		       .heartbeat_ms = HEARTBEAT_MS,
		       .peer_timeout_ms = PEER_TIMEOUT_MS};
	struct ferry_engine *e;

	/*
	 * Both "hosts" keep the one runtime directory: shm would find the
	 * other engine there, and the test checks that tcp carries it anyway.
	 */
	if (ns_enter(s->netns[me])) {
		fprintf(stderr, "chaos: %s: cannot enter namespace %s\n", s->name[me],
			s->netns[me]);
		return NULL;
	}
	e = mk_engine(&m);
	if (!e || ferry_engine_address(e, s->addr[me], sizeof(s->addr[me])) <= 0)
		return NULL;
	atomic_store(&s->addr_set[me], 1);
	if (!ch_wait_flag(&s->addr_set[!me], 20000 * s->scale)) {
		fprintf(stderr, "chaos: %s: no address from %s\n", s->name[me], s->name[!me]);
		ferry_engine_destroy(e);
		return NULL;
	}
	return e;
}

static void link_set(int side, bool up)
{
	int rc = ns_sh("ip -n %s link set %s %s", nsn[side], dev[side], up ? "up" : "down");

	if (rc != 0)
		fail_msg("ip link set %s %s in %s: exit %d", dev[side], up ? "up" : "down",
			 nsn[side], rc);
}

static void test_chaos_tcp(void **state)
{
	int cuts = 0, long_cuts = 0, shm_before = ch_shm_files();
	int64_t t_end, started = t_now(), down_total = 0;
	char events[160];
	uint64_t rng;

	(void)state;
	sh = ch_start("tcp", t_under_valgrind() ? 8 : 25);
	sh->nworkers = 2;
	sh->tcp = true;
	for (int i = 0; i < 2; i++) {
		snprintf(sh->name[i], sizeof(sh->name[i]), "%c", 'a' + i);
		snprintf(sh->netns[i], sizeof(sh->netns[i]), "%.31s", nsn[i]);
		snprintf(sh->listen[i], sizeof(sh->listen[i]), "tcp://10.%d.1.%d:0", net, i + 1);
	}
	rng = sh->seed;
	alarm((unsigned)(sh->run_ns / SEC + 200 * sh->scale));

	sh->t0 = t_now();
	for (int i = 0; i < 2; i++)
		pids[i] = ch_spawn(sh, i, janitor_fd, tcp_make);
	assert_true(ch_wait_flag(&sh->ready[0], 30000 * sh->scale));
	assert_true(ch_wait_flag(&sh->ready[1], 30000 * sh->scale));
	t_end = sh->t0 + sh->run_ns;
	atomic_store(&sh->go, 1);

	/* Cut and restore the link until the time is up. */
	while (t_now() < t_end) {
		int side = (int)(ch_rand(&rng) & 1);
		int64_t down = ch_between(&rng, 50, 2500) * MS;

		ch_sleep(ch_between(&rng, 300, 2500) * MS);
		link_set(side, false);
		cuts++;
		if (down > PEER_TIMEOUT_MS * MS)
			long_cuts++;
		down_total += down;
		ch_sleep(down);
		link_set(side, true);
	}
	/* The link stays up: both sides call again and everything under way ends. */
	ch_sleep(2 * SEC);
	snprintf(events, sizeof(events),
		 "the link cut %d times (%d longer than the %d ms peer "
		 "timeout), down %.1f s in all",
		 cuts, long_cuts, PEER_TIMEOUT_MS, (double)down_total / SEC);
	if (!ch_drain(sh)) {
		ch_report(sh, "tcp", events, t_now() - started);
		fail_msg("chaos tcp: not drained within 30 s (seed %llu)",
			 (unsigned long long)sh->seed);
	}
	atomic_store(&sh->phase, CH_FINISH);
	ch_finish_survivors(sh, pids, "tcp", events, started);
	assert_true(cuts > 0);
	assert_int_equal(t_count_files(rundir), 0);
	assert_int_equal(ch_shm_files(), shm_before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_chaos_tcp, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

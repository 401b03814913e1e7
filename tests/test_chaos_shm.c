/*
 * tests/test_chaos_shm.c - chaos over shared memory: three processes
 * exchange PUT/GET and streams both ways (tests/chaos.h: every payload and
 * chunk checked against its key) while one of them, the victim "v", is
 * killed with SIGKILL and started again under the same engine name at
 * random intervals (some during its start-up). The two survivors "a" and
 * "b" live through it all.
 *
 * Asserts: no wrong data, index, order or length anywhere; nothing fails
 * between the two survivors, and to and from the victim only with the
 * errors its death explains; every op of every process ends within its
 * deadline (and the slack), and nothing stays pending at the end; the
 * survivors end with no key, stream record, op or pool block left, and
 * with no more file descriptors and RSS than in the first half of the
 * run; the runtime directory is empty at the end and nothing appeared in
 * /dev/shm.
 *
 * FERRY_CHAOS_SECONDS=N runs N seconds of chaos (default 30; 12 under
 * valgrind), FERRY_CHAOS_SEED=S repeats a schedule (the seed is printed).
 * The parent makes no engine: it forks the workers, kills and restarts the
 * victim, and reads the shared stats.
 */
#include "chaos.h"

#define VICTIM 2

static char rundir[128];
static struct ch_shared *sh;
static pid_t pids[CH_MAXW];

static struct ferry_engine *shm_make(struct ch_shared *s, int me)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = s->name[me];
	p.ns = "chaos";
	p.pool_size = (me == s->victim ? 32ull : 64ull) << 20;
	p.spin_ns = 20000;
	rc = ferry_engine_create(&p, &e);
	if (rc)
		fprintf(stderr, "chaos: engine %s: %s\n", p.name, ferry_strerror(rc));
	return e;
}

static pid_t start(int me)
{
	return pids[me] = ch_spawn(sh, me, -1, shm_make);
}

static int setup(void **state)
{
	(void)state;
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-chaos-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	/* Peers dying is the point: their warnings would drown the report. */
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR, NULL, NULL);
	return 0;
}

static int teardown(void **state)
{
	char cmd[200];

	(void)state;
	for (int i = 0; i < CH_MAXW; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			t_waitpid(pids[i], NULL, 0);
			pids[i] = 0;
		}
	if (sh)
		munmap(sh, sizeof(*sh));
	sh = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", rundir);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_chaos_shm(void **state)
{
	int shm_before = ch_shm_files(), kills = 0, kills_starting = 0, rc;
	int64_t t_end, started = t_now();
	char events[160];
	uint64_t rng;
	pid_t v;

	(void)state;
	sh = ch_start("shm", t_under_valgrind() ? 12 : 30);
	sh->nworkers = 3;
	sh->victim = VICTIM;
	snprintf(sh->name[0], sizeof(sh->name[0]), "a");
	snprintf(sh->name[1], sizeof(sh->name[1]), "b");
	snprintf(sh->name[2], sizeof(sh->name[2]), "v");
	rng = sh->seed;
	alarm((unsigned)(sh->run_ns / SEC + 200 * sh->scale));

	sh->t0 = t_now();
	start(0);
	start(1);
	assert_true(ch_wait_flag(&sh->ready[0], 20000 * sh->scale));
	assert_true(ch_wait_flag(&sh->ready[1], 20000 * sh->scale));
	t_end = sh->t0 + sh->run_ns;
	atomic_store(&sh->go, 1);

	/* Kill and restart the victim until the time is up. */
	while (t_now() < t_end) {
		bool early = ch_rand(&rng) % 100 < 15;

		atomic_store(&sh->ready[VICTIM], 0);
		atomic_fetch_add(&sh->inc[VICTIM], 1);
		v = start(VICTIM);
		if (early) {
			ch_sleep(ch_between(&rng, 0, 60) * MS); /* perhaps in its start-up */
			if (!atomic_load(&sh->ready[VICTIM]))
				kills_starting++;
		} else {
			if (!ch_wait_flag(&sh->ready[VICTIM], 10000 * sh->scale))
				fail_msg("victim incarnation %d not ready within 10 s",
					 atomic_load(&sh->inc[VICTIM]));
			/* Long enough to be found; under valgrind at most twice as long. */
			ch_sleep(ch_between(&rng, 150, 1500) * MS *
				 (sh->scale < 2 ? sh->scale : 2));
		}
		kill(v, SIGKILL);
		rc = ch_reap_within(v, 10000);
		pids[VICTIM] = 0;
		if (rc != 128 + SIGKILL)
			fail_msg("victim incarnation %d ended with %d before its SIGKILL",
				 atomic_load(&sh->inc[VICTIM]), rc);
		kills++;
		ch_sleep(ch_between(&rng, 0, 400) * MS);
	}

	/* The last incarnation lives to the end; the survivors find it first. */
	atomic_store(&sh->ready[VICTIM], 0);
	atomic_fetch_add(&sh->inc[VICTIM], 1);
	v = start(VICTIM);
	assert_true(ch_wait_flag(&sh->ready[VICTIM], 10000 * sh->scale));
	ch_sleep(1500 * MS);

	/* Drain: everything under way ends, every announced key is asked for. */
	snprintf(events, sizeof(events),
		 "the victim killed %d times (%d in its start-up), %d "
		 "incarnations",
		 kills, kills_starting, atomic_load(&sh->inc[VICTIM]));
	if (!ch_drain(sh)) {
		ch_report(sh, "shm", events, t_now() - started);
		fail_msg("chaos shm: not drained within 30 s (seed %llu)",
			 (unsigned long long)sh->seed);
	}
	atomic_store(&sh->phase, CH_FINISH_VICTIM);
	rc = ch_reap_within(v, 30000 * sh->scale);
	pids[VICTIM] = 0;
	if (rc != 0)
		ch_report(sh, "shm", events, t_now() - started);
	assert_int_equal(rc, 0);
	atomic_store(&sh->phase, CH_FINISH);
	ch_finish_survivors(sh, pids, "shm", events, started);
	assert_true(kills > 0);
	assert_int_equal(t_count_files(rundir), 0);
	assert_int_equal(ch_shm_files(), shm_before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_chaos_shm, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

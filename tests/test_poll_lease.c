/*
 * tests/test_poll_lease.c - THREAD mode's callers that poll in a loop run
 * the rounds (engine/reactor_sleep.c, reactor_poll_watch): while
 * ferry_cq_poll finds nothing again and again, the reactor thread parks
 * under a lease that each poll renews (health ops.poll_leases counts those
 * sleeps), the polls carry every transfer meanwhile, and when the polls
 * stop the lease runs out: what came for the engine after its last poll
 * is still delivered, by the reactor thread, without any poll or wait on
 * that engine, and a wait on another engine by the thread that polled
 * it ends its lease at once; and a callback that must run on the reactor thread keeps
 * the reactor from parking while it is pending.
 */
#include "helpers.h"
#include "internal.h"

struct pair {
	struct ferry_engine *a, *b;
	struct ferry_peer *to_b, *from_a;
};

/* Engines named after the test (tag): a test that failed leaves no name taken for the next. */
static void pair_open(struct pair *p, const char *tag)
{
	char a[32], b[32];

	ferry_log_set(-1, NULL, NULL);
	snprintf(a, sizeof(a), "pl-%s-a", tag);
	snprintf(b, sizeof(b), "pl-%s-b", tag);
	p->a = t_engine(a, FERRY_PROGRESS_THREAD, 0);
	p->b = t_engine(b, FERRY_PROGRESS_THREAD, 0);
	p->to_b = t_peer(p->a, b);
	p->from_a = t_peer(p->b, a);
}

static void pair_close(struct pair *p)
{
	ferry_engine_destroy(p->a);
	ferry_engine_destroy(p->b);
}

/* Poll e's default CQ in a tight loop (no wait) until one CQE, or 10 s. */
static struct ferry_cqe poll_one(struct ferry_engine *e)
{
	int64_t end = t_now() + 10 * SEC * (t_under_valgrind() ? 6 : 1);
	struct ferry_cqe c;
	int n;

	while ((n = ferry_cq_poll(ferry_cq_default(e), &c, 1)) == 0)
		if (t_now() > end)
			fail_msg("%s: nothing to poll within the bound", ferry_engine_name(e));
	assert_int_equal(n, 1);
	return c;
}

/* One 64 B PUT a -> b into a GET posted first, both ends reaped by polling only. */
static void polled_transfer(struct pair *p, unsigned i)
{
	char key[32], out[64], in[64];
	struct ferry_cqe c;

	snprintf(key, sizeof(key), "k%u", i);
	memset(out, (int)(i & 0xff), sizeof(out));
	memset(in, 0, sizeof(in));
	t_get(p->b, p->from_a, key, t_iov_of(in, sizeof(in)), 1, 2 * i + 1, 0, 0);
	t_put(p->a, p->to_b, key, out, sizeof(out), 2 * i, 0);
	c = poll_one(p->b);
	assert_int_equal(c.user_data, 2 * i + 1);
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, sizeof(in));
	assert_memory_equal(in, out, sizeof(in));
	c = poll_one(p->a);
	assert_int_equal(c.user_data, 2 * i);
	assert_int_equal(c.res, 0);
}

/*
 * Transfers reaped by polling until b's reactor parked under a lease at
 * least min_leases times (or the bound): how many transfers it took.
 */
static unsigned poll_until_leased(struct pair *p, unsigned first, long long min_leases)
{
	int64_t end = t_now() + 20 * SEC;
	unsigned i = first;

	do {
		polled_transfer(p, i++);
	} while ((i - first < 200 ||
		  t_health_num(p->b, "\"ops\":{", "poll_leases") < min_leases) && t_now() < end);
	return i;
}

static void test_polls_carry_the_transfers(void **state)
{
	struct pair p;
	unsigned n;

	(void)state;
	pair_open(&p, "carry");
	n = poll_until_leased(&p, 0, 1);
	/*
	 * Dense polls made b's reactor park under a lease (not spin beside
	 * them), and every transfer meanwhile went through: the data checked
	 * in polled_transfer, each GET and PUT completed once.
	 */
	assert_true(t_health_num(p.b, "\"ops\":{", "poll_leases") >= 1);
	assert_int_equal(t_health_num(p.b, "\"ops\":{", "gets"), (long long)n);
	assert_int_equal(t_health_num(p.a, "\"ops\":{", "puts"), (long long)n);
	pair_close(&p);
}

static void test_lease_runs_out(void **state)
{
	char out[64] = "arrives after b's last poll", in[64] = { 0 };
	unsigned n, leased_at_put = 0;
	struct ferry_cqe c;
	struct pair p;

	(void)state;
	pair_open(&p, "out");
	n = poll_until_leased(&p, 0, 1);
	for (unsigned round = 0; round < 5; round++) {
		char key[32];

		snprintf(key, sizeof(key), "late%u", round);
		/* b is polled densely right up to here, then never again this round. */
		for (int i = 0; i < 1000; i++)
			ferry_cq_poll(ferry_cq_default(p.b), &c, 0);
		t_get(p.b, p.from_a, key, t_iov_of(in, sizeof(in)), 1, 1000 + round, 0, 0);
		t_put(p.a, p.to_b, key, out, sizeof(out), 2000 + round, 0);
		if (atomic_load(&p.b->watcher) == WATCH_LEASE &&
		    atomic_load(&p.b->reactor_parked) == REACTOR_ASLEEP)
			leased_at_put++; /* the PUT found b's reactor asleep, unannounced */
		/*
		 * a's PUT completes once b's GET holds the key: b's reactor
		 * must wake when its lease runs out (nobody rings it, nobody
		 * polls b) and deliver. Only a is polled (a wait would end
		 * b's lease: test_wait_elsewhere_ends_the_lease).
		 */
		c = poll_one(p.a);
		assert_int_equal(c.user_data, 2000 + round);
		assert_int_equal(c.res, 0);
		c = poll_one(p.b);
		assert_int_equal(c.user_data, 1000 + round);
		assert_int_equal(c.res, 0);
		assert_memory_equal(in, out, sizeof(out));
		memset(in, 0, sizeof(in));
		n = poll_until_leased(&p, n, t_health_num(p.b, "\"ops\":{", "poll_leases") + 1);
	}
	if (!t_under_valgrind())
		assert_true(leased_at_put >= 1); /* the case this test is for happened */
	pair_close(&p);
}

/*
 * Is e's reactor asleep under a lease? (Not a moment's WATCH_LEASE: a
 * reactor that takes a lease and finds it spent holds it a moment, running.)
 */
static bool leased_sleep(struct ferry_engine *e)
{
	return atomic_load(&e->watcher) == WATCH_LEASE &&
	       atomic_load(&e->reactor_parked) == REACTOR_ASLEEP;
}

/*
 * One thread polls b, then waits on a (two stages of one thread): its wait
 * ends the lease it kept on b at once (b's sleep announced again), rather
 * than leaving b's reactor to find a's PUT when the lease runs out; and
 * the polls that made that lease make no other one once b's reactor wakes.
 */
static void test_wait_elsewhere_ends_the_lease(void **state)
{
	unsigned n = 0, seen = 0;
	bool leased_again;
	struct ferry_cqe c;
	struct pair p;

	(void)state;
	pair_open(&p, "switch");
	for (int round = 0; round < 20 && seen < 3; round++) {
		n = poll_until_leased(&p, n, t_health_num(p.b, "\"ops\":{", "poll_leases") + 1);
		for (int i = 0; i < 1000; i++) /* b polled right up to the wait on a */
			ferry_cq_poll(ferry_cq_default(p.b), &c, 0);
		if (!leased_sleep(p.b))
			continue; /* not the case this test is for (the reactor was up) */
		assert_int_equal(ferry_cq_wait(ferry_cq_default(p.a), &c, 1, 0), -ETIMEDOUT);
		assert_false(leased_sleep(p.b));
		/*
		 * b's reactor wakes when the lease it slept under runs out and
		 * finds the polls above stamped since its last look: spent (the
		 * lease they made has ended), they start no new one. Watched
		 * for two leases' time (by reading, which stamps nothing).
		 */
		leased_again = false;
		for (int64_t end = t_now() + 2 * (int64_t)POLL_LEASE_NS; t_now() < end;)
			leased_again |= leased_sleep(p.b);
		assert_false(leased_again);
		seen++;
	}
	if (!t_under_valgrind())
		assert_true(seen >= 1);
	pair_close(&p);
}

static void on_reactor(const struct ferry_cqe *cqe, void *arg)
{
	atomic_store((_Atomic int *)arg, cqe->res == 0 ? 1 : -1);
}

/*
 * A GET whose callback runs on the reactor thread (FERRY_SQE_CB_REACTOR):
 * no stand-in may run it, so while it is pending the reactor does not park
 * under a lease however densely its engine is polled, and the callback runs.
 */
static void test_reactor_callback_keeps_the_reactor(void **state)
{
	char out[64] = "for the reactor's callback", in[64] = { 0 };
	_Atomic int done = 0;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	long long leases;
	struct pair p;
	int64_t end;

	(void)state;
	pair_open(&p, "cb");
	poll_until_leased(&p, 0, 1);
	sqe = t_sqe(p.b);
	ferry_prep_get(sqe, p.from_a, "cb", t_iov_of(in, sizeof(in)), 1, 77);
	ferry_sqe_set_callback(sqe, on_reactor, (void *)&done);
	ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	t_submit(p.b);
	/* The reactor takes the GET (a stand-in leaves it in the ring for it). */
	end = t_now() + 5 * SEC;
	while (t_health_num(p.b, "\"ops\":{", "in_flight") < 1 && t_now() < end)
		ferry_cq_poll(ferry_cq_default(p.b), &c, 0);
	assert_int_equal(t_health_num(p.b, "\"ops\":{", "in_flight"), 1);
	leases = t_health_num(p.b, "\"ops\":{", "poll_leases");
	end = t_now() + 50 * MS;
	while (t_now() < end)
		ferry_cq_poll(ferry_cq_default(p.b), &c, 0);
	assert_int_equal(t_health_num(p.b, "\"ops\":{", "poll_leases"), leases);
	t_put(p.a, p.to_b, "cb", out, sizeof(out), 78, 0);
	assert_int_equal(t_wait_one(p.a, &c, 5 * SEC), 0);
	end = t_now() + 5 * SEC;
	while (!atomic_load(&done) && t_now() < end)
		ferry_cq_poll(ferry_cq_default(p.b), &c, 0);
	assert_int_equal(atomic_load(&done), 1);
	assert_memory_equal(in, out, sizeof(out));
	pair_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_polls_carry_the_transfers),
		cmocka_unit_test(test_lease_runs_out),
		cmocka_unit_test(test_wait_elsewhere_ends_the_lease),
		cmocka_unit_test(test_reactor_callback_keeps_the_reactor),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

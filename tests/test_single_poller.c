/*
 * tests/test_single_poller.c - FERRY_ENGINE_SINGLE_POLLER: a MANUAL engine
 * driven by one thread. The first thread that polls, waits, arms or drives
 * progress becomes the engine's poller; the same calls from any other
 * thread fail with -EPERM (logged once) and change nothing
 * (ferry_engine_claim_poller claims or refuses beforehand); any thread
 * still submits. The poller's rounds take no lock and its CQs are reaped
 * without a compare-and-swap (engine/cq.c), so: transfers, callbacks, a
 * full CQ's overflow, waits, the fd protocol and re-entry from a callback
 * all behave as on any engine; and an in-process sender on another thread
 * never delivers into such an engine itself (backends/loop's direct path
 * would run the destination's round outside its poller), while one on the
 * poller's own thread still does.
 */
#include <poll.h>

#include "helpers.h"
#include "internal.h"

static struct ferry_engine *sp_engine(const char *name, uint32_t cq_entries)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "test";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 8u << 20;
	p.cq_entries = cq_entries;
	p.flags = FERRY_ENGINE_SINGLE_POLLER;
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	return e;
}

static bool health_has(struct ferry_engine *e, const char *text)
{
	static char h[65536];

	assert_true(ferry_engine_health(e, h, sizeof(h)) < (int)sizeof(h));
	return strstr(h, text) != NULL;
}

/* Poll e until one CQE (driving other too, when given), within 5 s. */
static struct ferry_cqe poll_one(struct ferry_engine *e, struct ferry_engine *other)
{
	int64_t end = t_now() + 5 * SEC * (t_under_valgrind() ? 10 : 1);
	struct ferry_cqe c;
	int n;

	while ((n = ferry_cq_poll(ferry_cq_default(e), &c, 1)) == 0) {
		if (other)
			assert_true(ferry_progress(other) >= 0);
		if (t_now() > end)
			fail_msg("%s: no completion within the bound", ferry_engine_name(e));
	}
	assert_int_equal(n, 1);
	return c;
}

static void test_needs_manual(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL, *d;

	(void)state;
	t_log_capture(FERRY_LOG_ERROR);
	p.name = "sp-thread";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_THREAD;
	p.flags = FERRY_ENGINE_SINGLE_POLLER;
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	assert_null(e);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "FERRY_ENGINE_SINGLE_POLLER", "MANUAL"));
	e = sp_engine("sp-manual", 0);
	d = t_engine("sp-default", FERRY_PROGRESS_MANUAL, 0);
	assert_true(health_has(e, "\"pollers\":\"single\""));
	assert_true(health_has(d, "\"pollers\":\"any\""));
	ferry_engine_destroy(e);
	ferry_engine_destroy(d);
}

static atomic_int cb_ran, cb_nested_cqes;
static struct ferry_cq *cb_cq;
static uint64_t cb_rounds_seen;

/*
 * A callback that polls its own CQ from the reap (after the round: the
 * nested poll runs a round of its own): the CQEs it takes count, none lost.
 */
static void reentrant_cb(const struct ferry_cqe *c, void *arg)
{
	struct ferry_cqe more[4];
	int n;

	(void)arg;
	assert_int_equal(c->res, 0);
	n = ferry_cq_poll(cb_cq, more, 4);
	assert_true(n >= 0);
	for (int i = 0; i < n; i++)
		assert_int_equal(more[i].user_data, 200);
	atomic_fetch_add(&cb_nested_cqes, n);
	atomic_fetch_add(&cb_ran, 1);
}

/*
 * A reactor callback runs inside the round (MANUAL mode): the progress
 * flag keeps its polls from running a round inside the round.
 */
static void in_round_cb(const struct ferry_cqe *c, void *arg)
{
	struct ferry_engine *e = arg;
	uint64_t rounds = atomic_load(&e->rounds);
	struct ferry_cqe more[4];

	assert_int_equal(c->res, 0);
	assert_int_equal(ferry_progress(e), 0);
	assert_true(ferry_cq_poll(cb_cq, more, 4) >= 0);
	cb_rounds_seen = atomic_load(&e->rounds) - rounds;
	atomic_fetch_add(&cb_ran, 1);
}

/* Transfers both ways, callbacks, a CQ of 4 overflowing, waits: as on any engine. */
static void test_transfers_overflow_waits(void **state)
{
	struct ferry_engine *a = sp_engine("sp-ta", 4), *b = sp_engine("sp-tb", 4);
	struct ferry_peer *to_b = t_peer(a, "sp-tb"), *from_a = t_peer(b, "sp-ta");
	char out[64], in[64];
	bool seen[32] = { false };
	struct ferry_cqe c[8];
	int64_t end;

	(void)state;
	for (unsigned i = 0; i < 200; i++) {
		char key[32];

		snprintf(key, sizeof(key), "k%u", i);
		memset(out, (int)i, sizeof(out));
		t_get(b, from_a, key, t_iov_of(in, sizeof(in)), 1, 1000 + i, 0, 0);
		t_put(a, to_b, key, out, sizeof(out), i, 0);
		c[0] = poll_one(b, a);
		assert_int_equal(c[0].user_data, 1000 + i);
		assert_int_equal(c[0].res, 0);
		assert_memory_equal(in, out, sizeof(out));
		c[0] = poll_one(a, b);
		assert_int_equal(c[0].user_data, i);
		assert_int_equal(c[0].res, 0);
	}
	/* 32 NOPs into a CQ of 4: the overflow holds the rest, each comes once. */
	for (unsigned i = 0; i < 32; i++)
		ferry_prep_nop(t_sqe(a), i);
	t_submit(a);
	end = t_now() + 5 * SEC;
	for (unsigned got = 0; got < 32;) {
		int n = ferry_cq_poll(ferry_cq_default(a), c, 3);

		assert_true(n >= 0);
		for (int k = 0; k < n; k++) {
			assert_true(c[k].user_data < 32);
			assert_false(seen[c[k].user_data]);
			seen[c[k].user_data] = true;
		}
		got += (unsigned)n;
		assert_true(t_now() < end);
	}
	/* Callbacks polling their own CQ from the reap: plain NOPs they take count once. */
	cb_cq = ferry_cq_default(a);
	for (unsigned i = 0; i < 8; i++) {
		struct ferry_sqe *sqe = t_sqe(a);

		ferry_prep_nop(sqe, 100 + i);
		ferry_sqe_set_callback(sqe, reentrant_cb, NULL);
		ferry_prep_nop(t_sqe(a), 200);
	}
	t_submit(a);
	{
		int plain = 0;

		end = t_now() + 5 * SEC;
		while ((atomic_load(&cb_ran) < 8 || plain + atomic_load(&cb_nested_cqes) < 8) &&
		       t_now() < end) {
			int n = ferry_cq_poll(cb_cq, c, 8);

			assert_true(n >= 0);
			for (int k = 0; k < n; k++)
				assert_int_equal(c[k].user_data, 200);
			plain += n;
		}
		assert_int_equal(atomic_load(&cb_ran), 8);
		assert_int_equal(plain + atomic_load(&cb_nested_cqes), 8);
		assert_int_equal(ferry_cq_poll(cb_cq, c, 8), 0);
	}
	/* A reactor callback (inside the round) that polls and drives: no nested round. */
	{
		struct ferry_sqe *sqe = t_sqe(a);

		atomic_store(&cb_ran, 0);
		ferry_prep_nop(sqe, 300);
		ferry_sqe_set_callback(sqe, in_round_cb, a);
		ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
		t_submit(a);
		end = t_now() + 5 * SEC;
		while (atomic_load(&cb_ran) < 1 && t_now() < end)
			assert_true(ferry_cq_poll(cb_cq, c, 8) >= 0);
		assert_int_equal(atomic_load(&cb_ran), 1);
		assert_int_equal(cb_rounds_seen, 0);
	}
	/* A wait with nothing coming times out; with a NOP, returns it. */
	assert_int_equal(ferry_cq_wait(ferry_cq_default(a), c, 1, 5 * MS), -ETIMEDOUT);
	ferry_prep_nop(t_sqe(a), 77);
	t_submit(a);
	assert_int_equal(ferry_cq_wait(ferry_cq_default(a), c, 1, 5 * SEC), 1);
	assert_int_equal(c[0].user_data, 77);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

struct other {
	struct ferry_engine *e;
	int poll, wait, progress, arm, claim;
	struct t_gate go, done;
};

/* Every polling call from a thread that is not the poller: refused. */
static void *other_thread(void *arg)
{
	struct other *o = arg;
	struct ferry_cqe c;

	if (t_gate_wait(&o->go, 10000))
		return NULL;
	o->poll = ferry_cq_poll(ferry_cq_default(o->e), &c, 1);
	o->wait = ferry_cq_wait(ferry_cq_default(o->e), &c, 1, 1 * MS);
	o->progress = ferry_progress(o->e);
	o->arm = ferry_cq_arm(ferry_cq_default(o->e));
	o->claim = ferry_engine_claim_poller(o->e);
	/* Submitting is any thread's: a NOP from here completes for the poller. */
	ferry_prep_nop(t_sqe(o->e), 55);
	t_submit(o->e);
	t_gate_open(&o->done);
	return NULL;
}

static void test_other_thread_refused(void **state)
{
	struct ferry_engine *e = sp_engine("sp-refuse", 0);
	struct other o = { .e = e };
	struct ferry_cqe c;
	pthread_t t;

	(void)state;
	t_gate_init(&o.go);
	t_gate_init(&o.done);
	t_log_capture(FERRY_LOG_ERROR);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), &c, 1), 0); /* this thread: the poller */
	/* A CQE waiting in the CQ: the refused calls must leave it there. */
	ferry_prep_nop(t_sqe(e), 44);
	t_submit(e);
	assert_true(ferry_progress(e) > 0);
	assert_true(cq_has_entries(ferry_cq_default(e)));
	assert_int_equal(pthread_create(&t, NULL, other_thread, &o), 0);
	t_gate_open(&o.go);
	assert_int_equal(t_gate_wait(&o.done, 10000), 0);
	pthread_join(t, NULL);
	assert_int_equal(o.poll, -EPERM);
	assert_int_equal(o.wait, -EPERM);
	assert_int_equal(o.progress, -EPERM);
	assert_int_equal(o.arm, -EPERM);
	assert_int_equal(o.claim, -EPERM);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "sp-refuse", "FERRY_ENGINE_SINGLE_POLLER"));
	assert_int_equal(ferry_engine_claim_poller(e), 0);
	c = poll_one(e, NULL);
	assert_int_equal(c.user_data, 44); /* still there, once */
	c = poll_one(e, NULL);
	assert_int_equal(c.user_data, 55);
	assert_int_equal(c.res, 0);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), &c, 1), 0);
	ferry_engine_destroy(e);
	t_gate_close(&o.go);
	t_gate_close(&o.done);
}

/* The first thread to poll is the poller, whichever it is. */
static void *first_poller(void *arg)
{
	struct ferry_cqe c;

	return (void *)(intptr_t)ferry_cq_poll(ferry_cq_default(arg), &c, 1);
}

static void test_first_thread_wins(void **state)
{
	struct ferry_engine *e = sp_engine("sp-first", 0);
	struct ferry_cqe c;
	pthread_t t;
	void *rc;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(pthread_create(&t, NULL, first_poller, e), 0);
	pthread_join(t, &rc);
	assert_int_equal((intptr_t)rc, 0);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), &c, 1), -EPERM);
	assert_int_equal(ferry_progress(e), -EPERM);
	assert_int_equal(ferry_engine_claim_poller(e), -EPERM);
	ferry_engine_destroy(e); /* any thread, once its poller stopped */
}

/* A claim makes the poller (nothing polled yet); a default engine: any thread may. */
static void *claim_only(void *arg)
{
	return (void *)(intptr_t)ferry_engine_claim_poller(arg);
}

static void test_claim(void **state)
{
	struct ferry_engine *e = sp_engine("sp-claim", 0);
	struct ferry_engine *d = t_engine("sp-claim-d", FERRY_PROGRESS_MANUAL, 0);
	struct ferry_cqe c;
	pthread_t t;
	void *rc;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(ferry_engine_claim_poller(NULL), -EINVAL);
	assert_int_equal(pthread_create(&t, NULL, claim_only, e), 0);
	pthread_join(t, &rc);
	assert_int_equal((intptr_t)rc, 0);
	assert_int_equal(ferry_engine_claim_poller(e), -EPERM);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), &c, 1), -EPERM);
	assert_int_equal(pthread_create(&t, NULL, claim_only, d), 0);
	pthread_join(t, &rc);
	assert_int_equal((intptr_t)rc, 0);
	assert_int_equal(ferry_engine_claim_poller(d), 0);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(d), &c, 1), 0);
	ferry_engine_destroy(e);
	ferry_engine_destroy(d);
}

/* ------------------------------------------------------------------ */
/* The loop transport's direct delivery                                */
/* ------------------------------------------------------------------ */

struct dest {
	struct ferry_engine *b;
	struct ferry_peer *from_a;
	char in[64];
	int get_res;
	struct t_gate parked, go, done;
};

/* B's poller: park a GET, stop polling until told, then take the GET's CQE. */
static void *dest_poller(void *arg)
{
	struct dest *d = arg;
	int64_t end = t_now() + 10 * SEC;
	struct ferry_cqe c;
	int n;

	/* A first transfer: the sender's peer is resolved before the one that counts. */
	t_get(d->b, d->from_a, "warm", t_iov_of(d->in, sizeof(d->in)), 1, 8, 0, 0);
	while ((n = ferry_cq_poll(ferry_cq_default(d->b), &c, 1)) == 0 && t_now() < end)
		;
	if (n != 1 || c.user_data != 8 || c.res != 0)
		return NULL;
	t_get(d->b, d->from_a, "direct", t_iov_of(d->in, sizeof(d->in)), 1, 9, 0, 0);
	while (t_health_num(d->b, "\"ops\":{", "in_flight") < 1 && t_now() < end)
		(void)ferry_cq_poll(ferry_cq_default(d->b), &c, 1);
	t_gate_open(&d->parked);
	if (t_gate_wait(&d->go, 10000))
		return NULL;
	end = t_now() + 10 * SEC;
	d->get_res = -ETIME;
	while (t_now() < end) {
		if (ferry_cq_poll(ferry_cq_default(d->b), &c, 1) == 1) {
			d->get_res = c.user_data == 9 ? c.res : -EPROTO;
			break;
		}
	}
	t_gate_open(&d->done);
	return NULL;
}

/*
 * A sender on another thread never runs B's round: its PUT waits in B's
 * inbox while B's poller does not poll, and completes once it does.
 */
static void test_no_direct_delivery_from_another_thread(void **state)
{
	struct ferry_engine *a = t_engine("sp-da", FERRY_PROGRESS_MANUAL, 0);
	struct dest d = { .b = sp_engine("sp-db", 0) };
	struct ferry_peer *to_b = t_peer(a, "sp-db");
	char out[64];
	struct ferry_cqe c;
	int64_t end;
	pthread_t t;

	(void)state;
	d.from_a = t_peer(d.b, "sp-da");
	t_gate_init(&d.parked);
	t_gate_init(&d.go);
	t_gate_init(&d.done);
	memset(out, 0x5a, sizeof(out));
	assert_int_equal(pthread_create(&t, NULL, dest_poller, &d), 0);
	t_put(a, to_b, "warm", out, sizeof(out), 0, 0);
	c = poll_one(a, NULL);
	assert_int_equal(c.user_data, 0);
	assert_int_equal(c.res, 0);
	assert_int_equal(t_gate_wait(&d.parked, 10000), 0);
	t_put(a, to_b, "direct", out, sizeof(out), 1, 0);
	end = t_now() + 300 * MS;
	while (t_now() < end)
		if (ferry_cq_poll(ferry_cq_default(a), &c, 1) != 0)
			fail_msg("the PUT completed while its destination's poller did not poll "
				 "(res %d): delivered outside its poller", c.res);
	t_gate_open(&d.go);
	assert_int_equal(t_gate_wait(&d.done, 20000), 0);
	pthread_join(t, NULL);
	assert_int_equal(d.get_res, 0);
	assert_memory_equal(d.in, out, sizeof(out));
	c = poll_one(a, NULL);
	assert_int_equal(c.user_data, 1);
	assert_int_equal(c.res, 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(d.b);
	t_gate_close(&d.parked);
	t_gate_close(&d.go);
	t_gate_close(&d.done);
}

/*
 * Both engines on this thread, B's poller: A's round delivers into B's
 * parked GET itself (B's CQ holds the GET's CQE before B runs a round).
 */
static void test_direct_delivery_on_the_pollers_thread(void **state)
{
	struct ferry_engine *a = sp_engine("sp-sa", 0), *b = sp_engine("sp-sb", 0);
	struct ferry_peer *to_b = t_peer(a, "sp-sb"), *from_a = t_peer(b, "sp-sa");
	char out[64], in[64];
	struct ferry_cqe c;
	int64_t end = t_now() + 5 * SEC;

	(void)state;
	memset(out, 0x3c, sizeof(out));
	t_put(a, to_b, "first", out, 1, 0, 0); /* the peer is resolved */
	c = poll_one(a, b);
	assert_int_equal(c.res, 0);
	t_get(b, from_a, "first", t_iov_of(in, sizeof(in)), 1, 0, 0, 0);
	c = poll_one(b, NULL);
	assert_int_equal(c.res, 0);
	t_get(b, from_a, "same", t_iov_of(in, sizeof(in)), 1, 2, 0, 0);
	while (t_health_num(b, "\"ops\":{", "in_flight") < 1 && t_now() < end)
		assert_int_equal(ferry_cq_poll(ferry_cq_default(b), &c, 1), 0);
	t_put(a, to_b, "same", out, sizeof(out), 1, 0);
	assert_true(ferry_progress(a) >= 0); /* A's round: the PUT goes */
	assert_true(cq_has_entries(ferry_cq_default(b)));
	c = poll_one(b, NULL);
	assert_int_equal(c.user_data, 2);
	assert_int_equal(c.res, 0);
	assert_memory_equal(in, out, sizeof(out));
	c = poll_one(a, b);
	assert_int_equal(c.user_data, 1);
	assert_int_equal(c.res, 0);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

/* The fd protocol: arm, a NOP submitted by another thread makes the fd readable. */
static void *submit_nop(void *arg)
{
	usleep(20000);
	ferry_prep_nop(t_sqe(arg), 66);
	t_submit(arg);
	return NULL;
}

static void test_fd_protocol(void **state)
{
	struct ferry_engine *e = sp_engine("sp-fd", 0);
	struct ferry_cq *cq = ferry_cq_default(e);
	struct pollfd p = { .fd = ferry_cq_fd(cq), .events = POLLIN };
	struct ferry_cqe c;
	pthread_t t;

	(void)state;
	assert_int_equal(ferry_cq_poll(cq, &c, 1), 0);
	assert_int_equal(ferry_cq_arm(cq), 0);
	assert_int_equal(pthread_create(&t, NULL, submit_nop, e), 0);
	assert_int_equal(t_poll(&p, 1, 10000), 1);
	pthread_join(t, NULL);
	c = poll_one(e, NULL);
	assert_int_equal(c.user_data, 66);
	ferry_engine_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_needs_manual),
		cmocka_unit_test(test_transfers_overflow_waits),
		cmocka_unit_test(test_other_thread_refused),
		cmocka_unit_test(test_first_thread_wins),
		cmocka_unit_test(test_claim),
		cmocka_unit_test(test_no_direct_delivery_from_another_thread),
		cmocka_unit_test(test_direct_delivery_on_the_pollers_thread),
		cmocka_unit_test(test_fd_protocol),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

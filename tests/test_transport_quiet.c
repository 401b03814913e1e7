/*
 * tests/test_transport_quiet.c - a transport's quiet (engine/transport.h):
 * while a transport says it has nothing to do, the rounds skip its
 * progress, sqs_drained and round_end hooks; any other hook the reactor
 * calls (here: resolve, put) and ferry__backend_wake from any thread bring
 * them back. The transport is a TEST DOUBLE (tests/transport_double.h) that
 * counts its hooks and goes quiet in progress when told to; it reaches the
 * one peer "dbl-peer" and refuses its PUTs.
 */
#include <pthread.h>

#include "helpers.h"
#include "transport_double.h"

static struct {
	int progress, round_end, drained, resolve, put;
	bool go_quiet;
} seen;

static int q_progress(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	seen.progress++;
	if (seen.go_quiet)
		ferry__backend_quiet(b);
	return 0;
}

static int q_round_end(struct ferry_engine *e, struct backend *b)
{
	(void)e, (void)b;
	seen.round_end++;
	return 0;
}

static void q_drained(struct ferry_engine *e, struct backend *b)
{
	(void)e, (void)b;
	seen.drained++;
}

static int q_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *p)
{
	(void)e, (void)b;
	if (strcmp(p->name, "dbl-peer") != 0)
		return -EHOSTUNREACH;
	seen.resolve++;
	p->transport = b;
	return 0;
}

static int q_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	(void)e, (void)b, (void)op;
	seen.put++;
	return -ECONNREFUSED;
}

/* TD_HOOKS, with the hooks this test watches put over them. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const struct backend_ops quiet_double = {
	TD_HOOKS("dblq", 90),
	.init = td_init,
	.resolve = q_resolve,
	.put = q_put,
	.progress = q_progress,
	.sqs_drained = q_drained,
	.round_end = q_round_end,
};
#pragma GCC diagnostic pop

TD_REGISTRY(&quiet_double);

static void rounds(struct ferry_engine *e, int n)
{
	for (int i = 0; i < n; i++)
		ferry_progress(e);
}

static void *waker(void *arg)
{
	struct ferry_engine *e = arg;

	ferry__backend_wake(e, ferry__backend_of(e, &quiet_double));
	return NULL;
}

static void put_to(struct ferry_engine *e, struct ferry_peer *p, uint64_t ud)
{
	t_put(e, p, "k", "x", 1, ud, 0);
	t_expect(e, NULL, ud, -ECONNREFUSED, NULL);
}

static void test_quiet_skips_round_hooks(void **state)
{
	struct ferry_engine *e;
	struct ferry_peer *p;
	pthread_t t;
	int was, end_was;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	e = t_engine("quiet", FERRY_PROGRESS_MANUAL, 0);
	p = t_peer(e, "dbl-peer");
	assert_non_null(ferry__backend_of(e, &quiet_double));
	rounds(e, 3);
	assert_true(seen.progress >= 3); /* not quiet: every round */
	assert_true(seen.round_end >= 3);

	seen.go_quiet = true;
	rounds(e, 1); /* it says so in this one (its round_end is skipped already) */
	was = seen.progress;
	end_was = seen.round_end;
	rounds(e, 5);
	assert_int_equal(seen.progress, was); /* skipped */
	assert_int_equal(seen.round_end, end_was);

	/* Another thread changed what it looks at: the next round calls it. */
	assert_int_equal(pthread_create(&t, NULL, waker, e), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	rounds(e, 3);
	assert_int_equal(seen.progress, was + 1); /* once, then quiet again */

	/* The reactor calls another hook (resolve, then put): the rounds run it again. */
	was = seen.progress;
	put_to(e, p, 1);
	assert_int_equal(seen.resolve, 1);
	assert_true(seen.put >= 1);
	assert_true(seen.progress > was);
	was = seen.progress;
	rounds(e, 3);
	assert_true(seen.progress <= was + 1);
	was = seen.progress;
	put_to(e, p, 2); /* resolved already: only put clears it */
	assert_true(seen.progress > was);
	assert_true(seen.drained >= 1); /* the round that drained the PUT called it */

	seen.go_quiet = false;
	ferry__backend_wake(e, ferry__backend_of(e, &quiet_double));
	was = seen.progress;
	rounds(e, 4);
	assert_int_equal(seen.progress, was + 4);
	assert_int_equal(ferry_engine_destroy(e), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quiet_skips_round_hooks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

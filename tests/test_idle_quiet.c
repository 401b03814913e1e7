/*
 * tests/test_idle_quiet.c - the real transports' quiet on an idle engine
 * (engine/transport.h): an engine that uses no control channel, no tcp
 * listener and no CUDA job has the round hooks of ctl, tcp, cuda and rdma
 * skipped after its first rounds, and loop's once its inbox stayed empty
 * for 64 rounds; a tcp listener keeps tcp's hooks running (its accepts are
 * read from its ring each round); and a quiet engine still carries what it
 * is asked to (an in-process PUT -> GET between two quiet loops, a tcp PUT
 * that clears tcp's quiet when it resolves).
 */
#include "helpers.h"
#include "internal.h"

/* Engine e's transport named name, or NULL when this build has none running. */
static struct backend *backend_named(struct ferry_engine *e, const char *name)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (!strcmp(e->backends[i].ops->name, name) && e->backends[i].data)
			return &e->backends[i];
	return NULL;
}

static void rounds(struct ferry_engine *e, int n)
{
	for (int i = 0; i < n; i++)
		ferry_progress(e);
}

static void test_idle_engine_is_quiet(void **state)
{
	static const char *const quiet_ones[] = { "ctl", "tcp", "cuda", "rdma" };
	struct ferry_engine *a, *b;
	struct ferry_peer *to_b, *from_a;
	struct backend *lp;
	char out[8] = { 0 };
	struct iovec iov = { out, sizeof(out) };
	struct ferry_cqe c;
	unsigned seen = 0;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	a = t_engine("iq-a", FERRY_PROGRESS_MANUAL, 0);
	b = t_engine("iq-b", FERRY_PROGRESS_MANUAL, 0);
	rounds(a, 3);
	for (unsigned i = 0; i < sizeof(quiet_ones) / sizeof(quiet_ones[0]); i++) {
		struct backend *be = backend_named(a, quiet_ones[i]);

		if (!be)
			continue; /* not in this build */
		seen++;
		assert_true(backend_quiet(be));
	}
	assert_true(seen >= 2); /* ctl and tcp are in every build */
	lp = backend_named(a, "loop");
	assert_non_null(lp);
	assert_false(backend_quiet(lp)); /* an empty inbox 3 rounds running: still read */

	/*
	 * Both loops quiet (an empty inbox LOOP_QUIET_ROUNDS = 64 rounds
	 * running): the PUT must wake b's, its result a's.
	 */
	to_b = t_peer(a, "iq-b");
	from_a = t_peer(b, "iq-a");
	rounds(a, 64);
	rounds(b, 64);
	assert_true(backend_quiet(lp));
	assert_true(backend_quiet(backend_named(b, "loop")));
	t_put(a, to_b, "k1", "hello", 5, 1, 0);
	t_get(b, from_a, "k1", &iov, 1, 2, 0, 0);
	t_expect(b, a, 2, 0, &c);
	assert_int_equal(c.len, 5);
	t_expect(a, b, 1, 0, NULL);
	assert_memory_equal(out, "hello", 5);
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(ferry_engine_destroy(b), 0);
}

static void test_tcp_listener_is_not_quiet(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	struct backend *tcp;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	p.name = "iq-listen";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 8u << 20;
	p.listen = "tcp://127.0.0.1:0";
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	rounds(e, 5);
	tcp = backend_named(e, "tcp");
	assert_non_null(tcp);
	assert_false(backend_quiet(tcp)); /* its accept is out on its ring */
	assert_int_equal(ferry_engine_destroy(e), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_idle_engine_is_quiet),
		cmocka_unit_test(test_tcp_listener_is_not_quiet),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * tests/test_concurrency.c - threads, callbacks, waiting and teardown:
 * 4 threads submitting at once, several threads consuming one CQ,
 * callbacks and CQEs side by side (and where callbacks run), ferry_cq_fd +
 * ferry_cq_arm inside a real epoll loop, cq_wait timeouts and wake-ups, a
 * MANUAL-mode sleeper woken by another thread's submission, queue reuse,
 * destroying an engine with ops in flight, the rounds a THREAD-mode
 * caller runs while its reactor sleeps (stand-ins), and spins that stop
 * yielding their CPU to a busy loop on it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "helpers.h"

#define NTHREADS 4

static unsigned per_thread(void)
{
	return t_under_valgrind() ? 200 : 3000; /* 4 x 3000 < max_keys */
}

/* ------------------------------------------------------------------ */

struct submitter {
	struct ferry_engine *a;
	struct ferry_peer *to_b;
	unsigned id;
	unsigned sent;
	pthread_barrier_t *all_have_sq; /* the 4 SQs exist at once, none reused */
};

static void *put_thread(void *arg)
{
	struct submitter *s = arg;
	struct ferry_sq *sq;
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	struct ferry_cq *cq;
	struct ferry_cqe cqes[32];
	unsigned done = 0, n = per_thread();
	uint64_t *vals = calloc(n, sizeof(*vals));

	assert_non_null(vals);
	assert_int_equal(ferry_cq_create(s->a, &cp, &cq), 0);
	assert_int_equal(ferry_sq_get(s->a, &sq), 0);
	pthread_barrier_wait(s->all_have_sq);
	while (done < n) {
		struct ferry_sqe *sqe;

		while (s->sent < n && (sqe = ferry_sq_get_sqe(sq))) {
			static __thread struct iovec iov[4096];
			char key[32];
			unsigned i = s->sent++;

			vals[i] = ((uint64_t)s->id << 32) | i;
			iov[i % 4096].iov_base = &vals[i];
			iov[i % 4096].iov_len = sizeof(vals[i]);
			snprintf(key, sizeof(key), "t%u_%u", s->id, i);
			ferry_prep_put(sqe, s->to_b, key, &iov[i % 4096], 1, vals[i]);
			ferry_sqe_set_cq(sqe, cq);
		}
		ferry_sq_submit(sq);
		int got = ferry_cq_wait(cq, cqes, 32, 5 * SEC);

		if (got < 0)
			fail_msg("thread %u: cq_wait %d after %u puts", s->id, got, done);
		for (int i = 0; i < got; i++) {
			assert_int_equal(cqes[i].res, 0);
			assert_int_equal(cqes[i].user_data >> 32, s->id);
		}
		done += (unsigned)got;
	}
	assert_int_equal(ferry_cq_destroy(cq), 0);
	assert_int_equal(ferry_sq_put(sq), 0);
	free(vals);
	return NULL;
}

/* 4 threads put at once, each from its own SQ; every key arrives intact. */
static void test_four_threads_submit(void **state)
{
	struct ferry_engine *a = t_engine("a", FERRY_PROGRESS_THREAD, 16u << 20);
	struct ferry_engine *b = t_engine("b", FERRY_PROGRESS_THREAD, 16u << 20);
	struct ferry_peer *from_a = t_peer(b, "a");
	struct submitter s[NTHREADS];
	pthread_t th[NTHREADS];
	pthread_barrier_t all_have_sq;
	unsigned n = per_thread();
	char h[4096];

	(void)state;
	assert_int_equal(pthread_barrier_init(&all_have_sq, NULL, NTHREADS), 0);
	for (unsigned i = 0; i < NTHREADS; i++) {
		s[i] = (struct submitter){ a, t_peer(a, "b"), i + 1, 0, &all_have_sq };
		assert_int_equal(pthread_create(&th[i], NULL, put_thread, &s[i]), 0);
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&all_have_sq);
	/* Every value is there exactly once, under its own key. */
	for (unsigned t = 1; t <= NTHREADS; t++) {
		for (unsigned i = 0; i < n; i += (t_under_valgrind() ? 1 : 7)) {
			uint64_t v = 0;
			struct iovec iov = { &v, sizeof(v) };
			struct ferry_cqe c;
			char key[32];

			snprintf(key, sizeof(key), "t%u_%u", t, i);
			t_get(b, from_a, key, &iov, 1, 1, FERRY_SQE_NOWAIT, 0);
			t_expect(b, NULL, 1, 0, &c);
			assert_int_equal(v, ((uint64_t)t << 32) | i);
		}
	}
	ferry_engine_health(a, h, sizeof(h));
	assert_non_null(strstr(h, "\"threads\":4"));
	ferry_engine_destroy(a);
	ferry_engine_destroy(b); /* drops the keys never read */
}

/* ------------------------------------------------------------------ */

struct consumer {
	struct ferry_cq *cq;
	_Atomic unsigned *seen;
	_Atomic unsigned *total;
	unsigned want;
};

static void *consume_thread(void *arg)
{
	struct consumer *c = arg;
	struct ferry_cqe cqes[16];

	while (atomic_load(c->total) < c->want) {
		int n = ferry_cq_wait(c->cq, cqes, 16, 20 * MS);

		for (int i = 0; i < n; i++) {
			atomic_fetch_add(&c->seen[cqes[i].user_data], 1);
			atomic_fetch_add(c->total, 1);
		}
	}
	return NULL;
}

/* Several threads consume one CQ: each completion is taken exactly once. */
static void test_many_consumers_one_cq(void **state)
{
	struct ferry_engine *e = t_engine("mc", FERRY_PROGRESS_THREAD, 1u << 20);
	unsigned want = t_under_valgrind() ? 2000 : 100000;
	_Atomic unsigned *seen = calloc(want, sizeof(*seen));
	_Atomic unsigned total = 0;
	struct consumer c = { ferry_cq_default(e), seen, &total, want };
	pthread_t th[3];
	struct ferry_sq *sq;
	unsigned i = 0;
	int64_t end = t_now() + 60 * SEC;

	(void)state;
	for (int t = 0; t < 3; t++)
		assert_int_equal(pthread_create(&th[t], NULL, consume_thread, &c), 0);
	assert_int_equal(ferry_sq_get(e, &sq), 0);
	while (i < want && t_now() < end) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		if (!sqe) {
			ferry_sq_submit(sq);
			continue;
		}
		ferry_prep_nop(sqe, i++);
	}
	ferry_sq_submit(sq);
	for (int t = 0; t < 3; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(atomic_load(&total), want);
	for (i = 0; i < want; i++)
		if (atomic_load(&seen[i]) != 1)
			fail_msg("completion %u seen %u times", i, atomic_load(&seen[i]));
	free(seen);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

struct cb_log {
	pthread_t expect_thread;
	int on_expected, elsewhere;
	_Atomic int calls; /* bumped last: seeing it publishes the rest */
	uint64_t last_user_data;
	int last_res;
};

static void record_cb(const struct ferry_cqe *cqe, void *arg)
{
	struct cb_log *l = arg;

	l->last_user_data = cqe->user_data;
	l->last_res = cqe->res;
	if (pthread_equal(pthread_self(), l->expect_thread))
		l->on_expected++;
	else
		l->elsewhere++;
	atomic_fetch_add(&l->calls, 1);
}

static void test_callbacks_and_cqes(void **state)
{
	struct ferry_engine *e = t_engine("cb", FERRY_PROGRESS_THREAD, 1u << 20);
	struct cb_log polled = { .expect_thread = pthread_self() };
	struct cb_log reactor = { .expect_thread = pthread_self() };
	struct ferry_cqe cqes[8];
	struct ferry_sq *sq;
	int got = 0;
	int64_t end = t_now() + 5 * SEC;

	(void)state;
	assert_int_equal(ferry_sq_get(e, &sq), 0);
	for (unsigned i = 0; i < 6; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		ferry_prep_nop(sqe, i);
		if (i % 2)
			ferry_sqe_set_callback(sqe, record_cb, &polled);
	}
	{
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		ferry_prep_nop(sqe, 99);
		ferry_sqe_set_callback(sqe, record_cb, &reactor);
		ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	}
	ferry_sq_submit(sq);
	while ((got < 3 || polled.calls < 3) && t_now() < end) {
		int n = ferry_cq_poll(ferry_cq_default(e), cqes + got, (unsigned)(8 - got));

		assert_true(n >= 0);
		got += n;
	}
	/* CQEs without callbacks are returned; the others ran their callback. */
	assert_int_equal(got, 3);
	for (int i = 0; i < got; i++)
		assert_int_equal(cqes[i].user_data % 2, 0);
	assert_int_equal(polled.calls, 3);
	assert_int_equal(polled.on_expected, 3); /* on the polling thread */
	while (reactor.calls < 1 && t_now() < end)
		usleep(100);
	assert_int_equal(reactor.calls, 1);
	assert_int_equal(reactor.elsewhere, 1); /* CB_REACTOR: on the reactor thread */
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), cqes, 8), 0);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

/* The UCX-style protocol: poll until empty, arm, sleep on the fd. */
static void epoll_roundtrip(enum ferry_progress_mode mode)
{
	struct ferry_engine *a = t_engine("ea", mode, 1u << 20);
	struct ferry_engine *b = t_engine("eb", FERRY_PROGRESS_THREAD, 1u << 20);
	struct ferry_peer *to_b = t_peer(a, "eb"), *from_a = t_peer(b, "ea");
	struct ferry_cq *cq = ferry_cq_default(a);
	struct epoll_event ev = { .events = EPOLLIN }, out;
	int ep = epoll_create1(EPOLL_CLOEXEC), fd = ferry_cq_fd(cq), rounds = 0, completions = 0;
	struct iovec iov = { "payload", 8 };
	struct ferry_sqe *sqe;

	assert_true(ep >= 0);
	assert_true(fd >= 0);
	assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);

	/*
	 * Nothing pending: arm succeeds and epoll sleeps until its timeout.
	 * (MANUAL mode hands out the io_uring fd, whose task work may end an
	 * epoll_wait with EINTR: a loop retries, as with any signal.)
	 */
	assert_int_equal(ferry_cq_arm(cq), 0);
	{
		int n;

		while ((n = epoll_wait(ep, &out, 1, 50)) < 0 && errno == EINTR)
			;
		assert_int_equal(n, 0);
	}

	/* A PUT whose completion must wake the loop. */
	sqe = t_sqe(a);
	ferry_prep_put(sqe, to_b, "ek", &iov, 1, 7);
	t_submit(a);
	/* A GET on a key that never comes, with a deadline: the fd must wake for it too. */
	t_get(a, t_peer(a, "nobody"), "none", NULL, 0, 8, 0, 100 * MS);
	while (completions < 2 && rounds < 1000) {
		struct ferry_cqe c;
		int n;

		rounds++;
		while ((n = ferry_cq_poll(cq, &c, 1)) == 1) {
			completions++;
			if (c.user_data == 7)
				assert_int_equal(c.res, 0);
			else
				assert_int_equal(c.res, -ETIMEDOUT);
		}
		if (completions == 2)
			break;
		if (ferry_cq_arm(cq) == -EBUSY)
			continue; /* completions arrived meanwhile */
		n = epoll_wait(ep, &out, 1, 5000);
		if (n < 0 && errno == EINTR)
			continue;
		assert_int_equal(n, 1); /* woken, not timed out */
	}
	assert_int_equal(completions, 2);
	/* The data really went. */
	t_get(b, from_a, "ek", NULL, 0, 9, FERRY_SQE_NOWAIT, 0);
	{
		struct ferry_cqe c;

		t_expect(b, NULL, 9, 0, &c);
		assert_string_equal(ferry_buf_data(c.buf), "payload");
		ferry_buf_release(c.buf);
	}
	close(ep);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_epoll_thread_mode(void **state)
{
	(void)state;
	epoll_roundtrip(FERRY_PROGRESS_THREAD);
}

static void test_epoll_manual_mode(void **state)
{
	(void)state;
	epoll_roundtrip(FERRY_PROGRESS_MANUAL);
}

/*
 * MANUAL fd + arm with deadlines: the fd stays quiet while nothing is due
 * (no spurious wake per arm), and a deadline earlier than the one already
 * armed still wakes the loop on time.
 */
static void test_manual_arm_deadlines(void **state)
{
	struct ferry_engine *e = t_engine("ad", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *p = t_peer(e, "nobody");
	struct ferry_cq *cq = ferry_cq_default(e);
	struct pollfd pfd = { .fd = ferry_cq_fd(cq), .events = POLLIN };
	struct ferry_cqe c;
	int wakes = 0;
	int64_t t0;

	(void)state;
	t_get(e, p, "late", NULL, 0, 1, 0, 10 * SEC);
	ferry_progress(e);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(ferry_cq_poll(cq, &c, 1), 0);
		if (ferry_cq_arm(cq) == -EBUSY)
			continue;
		if (t_poll(&pfd, 1, 20) != 0)
			wakes++;
	}
	assert_true(wakes <= 1); /* at most the first arm's own leftovers */

	t_get(e, p, "soon", NULL, 0, 2, 0, 100 * MS);
	t0 = t_now();
	for (;;) {
		int n = ferry_cq_poll(cq, &c, 1);

		if (n == 1) {
			assert_int_equal(c.user_data, 2);
			assert_int_equal(c.res, -ETIMEDOUT);
			break;
		}
		if (ferry_cq_arm(cq) == -EBUSY)
			continue;
		t_poll(&pfd, 1, 5000);
		if (t_now() - t0 > 4 * SEC)
			fail_msg("the 100 ms deadline did not wake the fd");
	}
	assert_true(t_now() - t0 < 4 * SEC);
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

static void *wake_later(void *arg)
{
	usleep(50000);
	ferry_cq_wake(arg);
	return NULL;
}

static void test_wait_timeout_and_wake(void **state)
{
	enum ferry_progress_mode modes[2] = { FERRY_PROGRESS_THREAD, FERRY_PROGRESS_MANUAL };

	(void)state;
	for (int m = 0; m < 2; m++) {
		struct ferry_engine *e = t_engine("w", modes[m], 1u << 20);
		struct ferry_cqe c;
		int64_t t0 = t_now();
		pthread_t th;

		assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 0), -ETIMEDOUT);
		assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 30 * MS), -ETIMEDOUT);
		assert_true(t_now() - t0 >= 30 * MS);
		assert_int_equal(pthread_create(&th, NULL, wake_later, ferry_cq_default(e)), 0);
		assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 10 * SEC), -EINTR);
		pthread_join(th, NULL);
		ferry_engine_destroy(e);
	}
}

struct late_submit {
	struct ferry_engine *e;
};

static void *submit_later(void *arg)
{
	struct late_submit *l = arg;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;

	usleep(50000);
	assert_int_equal(ferry_sq_get(l->e, &sq), 0);
	sqe = ferry_sq_get_sqe(sq);
	ferry_prep_nop(sqe, 4242);
	ferry_sq_submit(sq);
	ferry_sq_put(sq);
	return NULL;
}

/* MANUAL mode: a thread asleep in cq_wait is woken by another's submit. */
static void test_manual_sleeper_woken_by_submit(void **state)
{
	struct ferry_engine *e = t_engine("ms", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct late_submit l = { e };
	struct ferry_cqe c;
	pthread_t th;
	int64_t t0 = t_now();

	(void)state;
	assert_int_equal(pthread_create(&th, NULL, submit_later, &l), 0);
	assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 10 * SEC), 1);
	assert_int_equal(c.user_data, 4242);
	assert_true(t_now() - t0 < 5 * SEC);
	pthread_join(th, NULL);
	ferry_engine_destroy(e);
}

/* A queue given back is reused by the next thread, not duplicated. */
struct grab {
	struct ferry_engine *e;
	struct ferry_sq *sq;
};

static void *grab_queue(void *arg)
{
	struct grab *g = arg;

	assert_int_equal(ferry_sq_get(g->e, &g->sq), 0);
	assert_int_equal(ferry_sq_put(g->sq), 0);
	return NULL;
}

static void test_queue_reuse(void **state)
{
	struct ferry_engine *e = t_engine("qr", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_sq *first = NULL, *again = NULL;
	struct grab g = { e, NULL };
	pthread_t th;
	char h[4096];

	(void)state;
	assert_int_equal(ferry_sq_get(e, &first), 0);
	assert_int_equal(ferry_sq_get(e, &again), 0);
	assert_ptr_equal(first, again); /* one queue per thread */
	assert_int_equal(ferry_sq_put(first), 0);
	/* Another thread now gets that same queue back. */
	assert_int_equal(pthread_create(&th, NULL, grab_queue, &g), 0);
	pthread_join(th, NULL);
	assert_ptr_equal(g.sq, first);
	ferry_engine_health(e, h, sizeof(h));
	assert_non_null(strstr(h, "\"threads\":1"));
	ferry_engine_destroy(e);
}

/* ------------------------------------------------------------------ */

struct teardown_log {
	int cancelled, other;
	int shutdown_seen;
	struct ferry_engine *e;
};

static void teardown_cb(const struct ferry_cqe *cqe, void *arg)
{
	struct teardown_log *l = arg;
	struct ferry_sq *sq;

	if (cqe->res == -ECANCELED)
		l->cancelled++;
	else
		l->other++;
	if (cqe->buf)
		ferry_buf_release(cqe->buf);
	/* Inside destroy, the engine refuses new work instead of crashing. */
	if (ferry_sq_get(l->e, &sq) == -ESHUTDOWN)
		l->shutdown_seen++;
}

static void destroy_in_flight(enum ferry_progress_mode mode)
{
	struct ferry_engine *a = t_engine("da", mode, 4u << 20);
	struct ferry_engine *b = t_engine("db", mode, 4u << 20);
	struct ferry_peer *to_b = t_peer(a, "db"), *from_a = t_peer(b, "da");
	struct teardown_log log = { .e = b };
	struct ferry_buf *buf;
	struct ferry_sq *sq;
	int parked = 20, queued = 0;

	/* GETs that wait forever on b. */
	assert_int_equal(ferry_sq_get(b, &sq), 0);
	for (int i = 0; i < parked; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);
		char key[16];

		snprintf(key, sizeof(key), "w%d", i);
		ferry_prep_get(sqe, from_a, key, NULL, 0, (uint64_t)i);
		ferry_sqe_set_callback(sqe, teardown_cb, &log);
	}
	ferry_sq_submit(sq);
	/* Let b take them, then give it data nobody reads. */
	for (int i = 0; i < 100; i++)
		ferry_progress(b);
	usleep(20000);
	t_put(a, to_b, "unread", "zzz", 3, 500, 0);
	t_expect(a, b, 500, 0, NULL);
	/* A pool buffer PUT that is still in the ring when b dies (MANUAL). */
	assert_int_equal(ferry_buf_alloc(b, 4096, &buf), 0);
	if (mode == FERRY_PROGRESS_MANUAL) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		ferry_prep_put_buf(sqe, t_peer(b, "da"), "never-sent", buf, 600);
		ferry_sqe_set_callback(sqe, teardown_cb, &log);
		ferry_sq_submit(sq); /* nobody drives b again */
		queued = 1;
	} else {
		ferry_buf_release(buf);
	}
	assert_int_equal(ferry_engine_destroy(b), 0);
	assert_int_equal(log.cancelled, parked + queued);
	assert_int_equal(log.other, 0);
	assert_int_equal(log.shutdown_seen, parked + queued);
	assert_int_equal(ferry_engine_destroy(a), 0);
	/* ASan/LSan and valgrind prove nothing leaked. */
}

static void test_destroy_in_flight_manual(void **state)
{
	(void)state;
	destroy_in_flight(FERRY_PROGRESS_MANUAL);
}

static void test_destroy_in_flight_thread(void **state)
{
	(void)state;
	destroy_in_flight(FERRY_PROGRESS_THREAD);
}

/* PUTs in flight from a to a destination that is destroyed. */
static void test_destroy_destination_under_load(void **state)
{
	struct ferry_engine *a = t_engine("la", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_engine *b = t_engine("lb", FERRY_PROGRESS_THREAD, 8u << 20);
	struct ferry_peer *to_b = t_peer(a, "lb");
	struct ferry_sq *sq;
	struct ferry_cqe c;
	unsigned sent = 0, done = 0, ok = 0, n = t_under_valgrind() ? 200 : 3000;
	static char payload[256];
	struct iovec iov = { payload, sizeof(payload) };
	int64_t end = t_now() + 30 * SEC;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(ferry_sq_get(a, &sq), 0);
	while (done < n && t_now() < end) {
		struct ferry_sqe *sqe;

		/* Up to just past half before the destroy, the rest after it. */
		while (sent < n && (!b || sent <= n / 2) && (sqe = ferry_sq_get_sqe(sq))) {
			char key[24];

			snprintf(key, sizeof(key), "x%u", sent);
			ferry_prep_put(sqe, to_b, key, &iov, 1, sent++);
			ferry_sqe_set_timeout(sqe, 5 * SEC);
		}
		ferry_sq_submit(sq);
		if (b && sent > n / 2) {
			ferry_engine_destroy(b); /* in the middle of the stream */
			b = NULL;
		}
		while (ferry_cq_poll(ferry_cq_default(a), &c, 1) == 1) {
			done++;
			if (c.res == 0)
				ok++;
			else if (c.res != -ECONNRESET && c.res != -EHOSTUNREACH)
				fail_msg("PUT %llu: unexpected %s", (unsigned long long)c.user_data,
					 ferry_err_name(c.res));
		}
	}
	assert_int_equal(done, n); /* every PUT completed, none hung */
	assert_true(ok < n); /* those sent after the destroy cannot have landed */
	ferry_engine_destroy(a);
}

/* Destroying a CQ that entries in the ring still target: no use after free. */
static void test_cq_destroy_with_entries_pending(void **state)
{
	struct ferry_engine *e = t_engine("cqd", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_cq *cq;
	struct ferry_cqe c;
	struct ferry_sqe *sqe;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(ferry_cq_create(e, NULL, &cq), 0);
	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 5);
	ferry_sqe_set_cq(sqe, cq);
	t_submit(e);
	assert_int_equal(ferry_cq_destroy(cq), 0); /* the NOP is still in the ring */
	assert_int_equal(ferry_cq_destroy(cq), -EINVAL); /* twice: refused */
	t_expect(e, NULL, 5, -EINVAL, &c);         /* it lands on the default CQ */
	for (int i = 0; i < 3; i++)
		ferry_progress(e); /* the reactor frees the CQ now (ASan watches) */
	ferry_engine_destroy(e);
}

/* THREAD mode: create, use and destroy CQs while the reactor runs. */
static void test_cq_churn_thread_mode(void **state)
{
	struct ferry_engine *e = t_engine("churn", FERRY_PROGRESS_THREAD, 1u << 20);
	int n = t_under_valgrind() ? 100 : 2000, busy = 0;

	(void)state;
	for (int i = 0; i < n; i++) {
		struct ferry_cq *cq;
		struct ferry_cqe c;
		struct ferry_sqe *sqe;
		int rc;

		assert_int_equal(ferry_cq_create(e, NULL, &cq), 0);
		sqe = t_sqe(e);
		ferry_prep_nop(sqe, (uint64_t)i);
		ferry_sqe_set_cq(sqe, cq);
		t_submit(e);
		assert_int_equal(ferry_cq_wait(cq, &c, 1, 5 * SEC), 1);
		assert_int_equal(c.user_data, (uint64_t)i);
		while ((rc = ferry_cq_destroy(cq)) == -EBUSY)
			busy++;
		assert_int_equal(rc, 0);
	}
	ferry_engine_destroy(e);
}

struct waker {
	struct ferry_cq *cq;
	unsigned delay_us;
};

static void *wake_after(void *arg)
{
	struct waker *w = arg;

	if (w->delay_us)
		usleep(w->delay_us);
	ferry_cq_wake(w->cq);
	return NULL;
}

/* ferry_cq_wake is never lost, whenever it lands relative to the sleep. */
static void test_wake_never_lost(void **state)
{
	enum ferry_progress_mode modes[2] = { FERRY_PROGRESS_THREAD, FERRY_PROGRESS_MANUAL };
	int n = t_under_valgrind() ? 20 : 400;

	(void)state;
	for (int m = 0; m < 2; m++) {
		struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
		struct ferry_engine *e;

		p.name = "wk";
		p.ns = "test";
		p.progress = modes[m];
		p.pool_size = 1u << 20;
		p.spin_ns = 1; /* sleep at once: the racy part */
		assert_int_equal(ferry_engine_create(&p, &e), 0);
		for (int i = 0; i < n; i++) {
			struct waker w = { ferry_cq_default(e), (unsigned)(i % 7) * 13 };
			struct ferry_cqe c;
			pthread_t th;
			int64_t t0 = t_now();

			assert_int_equal(pthread_create(&th, NULL, wake_after, &w), 0);
			assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 10 * SEC), -EINTR);
			assert_true(t_now() - t0 < 5 * SEC);
			pthread_join(th, NULL);
		}
		ferry_engine_destroy(e);
	}
}

/* ------------------------------------------------------------------ */

struct thread_seen {
	pthread_t thread;
	_Atomic int calls;
};

static void note_thread(const struct ferry_cqe *cqe, void *arg)
{
	struct thread_seen *t = arg;

	(void)cqe;
	t->thread = pthread_self();
	atomic_fetch_add(&t->calls, 1);
}

/* Poll (which runs no round in THREAD mode) until one CQE comes. */
static int poll_one(struct ferry_engine *e, struct ferry_cqe *c, int64_t timeout)
{
	int64_t end = t_now() + timeout * (t_under_valgrind() ? 10 : 1);

	while (t_now() < end) {
		if (ferry_cq_poll(ferry_cq_default(e), c, 1) == 1)
			return 1;
		usleep(100);
	}
	return 0;
}

/*
 * THREAD mode with the reactor asleep: a submit runs the round itself, but a
 * CB_REACTOR callback still runs on the reactor thread, and a deadline the
 * stand-in round armed still fires (the reactor is woken for it).
 */
static void test_stand_in_rounds(void **state)
{
	struct ferry_engine *e = t_engine("si", FERRY_PROGRESS_THREAD, 1u << 20);
	struct ferry_peer *self = t_peer(e, "si");
	struct thread_seen seen = { .calls = 0 };
	struct ferry_sqe *sqe;
	struct ferry_cqe c;
	int64_t t0, end = t_now() + 5 * SEC * (t_under_valgrind() ? 10 : 1);
	char buf[8];
	struct iovec iov = { buf, sizeof(buf) };

	(void)state;
	usleep(50 * 1000); /* the reactor spins 20 us, then sleeps */
	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 1);
	ferry_sqe_set_callback(sqe, note_thread, &seen);
	ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR);
	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 2);
	t_submit(e);
	assert_int_equal(poll_one(e, &c, 5 * SEC), 1);
	assert_int_equal(c.user_data, 2);
	while (atomic_load(&seen.calls) < 1 && t_now() < end)
		usleep(100);
	assert_int_equal(atomic_load(&seen.calls), 1);
	assert_false(pthread_equal(seen.thread, pthread_self())); /* on the reactor */

	usleep(50 * 1000);
	t0 = t_now();
	t_get(e, self, "never", &iov, 1, 3, 0, 30 * MS);
	assert_int_equal(poll_one(e, &c, 5 * SEC), 1);
	assert_int_equal(c.user_data, 3);
	assert_int_equal(c.res, -ETIMEDOUT);
	assert_true(t_now() - t0 >= 30 * MS);
	ferry_engine_destroy(e);
}

static atomic_int hog_stop;

static void *hog(void *arg)
{
	(void)arg;
	while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
		;
	return NULL;
}

/*
 * A busy loop on the engine's only CPU: the spins of its reactor and of a
 * waiting caller yield that CPU, lose it for the loop's time slice, see so
 * (health ops.yields_lost) and sleep instead; every transfer still comes.
 */
static void test_spin_gives_way_to_a_busy_cpu(void **state)
{
	struct ferry_engine *e;
	struct ferry_peer *self;
	struct ferry_cqe c;
	cpu_set_t one;
	pthread_t h;
	char out[8] = "payload", in[8];
	struct iovec iov = { in, sizeof(in) };
	long long lost = 0;
	int64_t end;
	unsigned i;

	(void)state;
	if (t_under_valgrind())
		skip(); /* valgrind runs one thread at a time: no CPU to share */
	/* This process runs apart (t_run_group_apart): pin it, and every thread after. */
	assert_int_equal(sched_getaffinity(0, sizeof(one), &one), 0);
	for (i = 0; i < CPU_SETSIZE && !CPU_ISSET(i, &one); i++)
		;
	CPU_ZERO(&one);
	CPU_SET(i, &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	assert_int_equal(pthread_create(&h, NULL, hog, NULL), 0);
	e = t_engine("busy", FERRY_PROGRESS_THREAD, 1u << 20);
	self = t_peer(e, "busy");
	end = t_now() + 20 * SEC;
	for (i = 0; t_now() < end && lost == 0; i++) {
		char key[16];

		snprintf(key, sizeof(key), "k%u", i);
		t_put(e, self, key, out, sizeof(out), 1, 0);
		t_get(e, self, key, &iov, 1, 2, 0, 10 * SEC);
		for (int got = 0; got < 2;) {
			int n = ferry_cq_wait(ferry_cq_default(e), &c, 1, 10 * SEC);

			assert_int_equal(n, 1);
			assert_int_equal(c.res, 0);
			if (c.user_data == 2)
				assert_int_equal(c.len, sizeof(out));
			got++;
		}
		assert_memory_equal(in, out, sizeof(out));
		/* Nothing comes: the wait spins (and yields) before it sleeps. */
		assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &c, 1, 2 * MS), -ETIMEDOUT);
		lost = t_health_num(e, "\"ops\"", "yields_lost");
	}
	printf("busy CPU: %u transfers until a spin saw its yield lost\n", i);
	assert_true(lost > 0);
	ferry_engine_destroy(e);
	atomic_store(&hog_stop, 1);
	pthread_join(h, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_four_threads_submit),
		cmocka_unit_test(test_many_consumers_one_cq),
		cmocka_unit_test(test_callbacks_and_cqes),
		cmocka_unit_test(test_epoll_thread_mode),
		cmocka_unit_test(test_epoll_manual_mode),
		cmocka_unit_test(test_manual_arm_deadlines),
		cmocka_unit_test(test_wait_timeout_and_wake),
		cmocka_unit_test(test_manual_sleeper_woken_by_submit),
		cmocka_unit_test(test_queue_reuse),
		cmocka_unit_test(test_destroy_in_flight_manual),
		cmocka_unit_test(test_destroy_in_flight_thread),
		cmocka_unit_test(test_destroy_destination_under_load),
		cmocka_unit_test(test_cq_destroy_with_entries_pending),
		cmocka_unit_test(test_cq_churn_thread_mode),
		cmocka_unit_test(test_wake_never_lost),
		cmocka_unit_test(test_stand_in_rounds),
		cmocka_unit_test(test_spin_gives_way_to_a_busy_cpu),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

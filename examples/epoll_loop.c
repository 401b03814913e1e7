/*
 * examples/epoll_loop.c - ferry inside an epoll event loop.
 *
 * An application that already sleeps in epoll_wait (or libuv, asyncio...)
 * adds ferry's completion queues to it with ferry_cq_fd() and follows the
 * arm protocol of ferry.h before every sleep:
 *
 *     for each CQ: poll until it is empty, then ferry_cq_arm(cq):
 *         0       the fd will become readable when a completion arrives
 *         -EBUSY  completions arrived meanwhile: poll again, do not sleep
 *     epoll_wait(...)
 *
 * A timerfd in the same epoll set paces a producer: on every tick one PUT
 * goes from engine "ep.producer" to engine "ep.consumer", where a GET
 * posted in advance (with a deadline) is waiting for it. The loop never
 * spins: between ticks the thread is asleep in epoll_wait.
 *
 * The same loop runs in both progress modes:
 *   THREAD  the reactor threads move the data; the fd is an eventfd that
 *           the reactor writes when it posts to an armed CQ.
 *   MANUAL  nothing moves unless this thread drives it: ferry_cq_poll
 *           drives the engine, and the fd (the engine's io_uring fd) wakes
 *           the loop when the engine has work (a doorbell, a deadline).
 *
 * usage: epoll_loop [thread|manual]   (default: both, one after the other)
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <ferry.h>

#define ITEMS 8
#define TICK_NS (20 * 1000 * 1000)           /* one PUT every 20 ms */
#define GET_DEADLINE_NS (2000ull * 1000 * 1000) /* a GET gives up after 2 s */

enum { TAG_TIMER = 1, TAG_PRODUCER = 2, TAG_CONSUMER = 3 };

struct app {
	struct ferry_engine *prod, *cons;
	struct ferry_peer *to_cons, *from_prod;
	struct ferry_sq *sq_prod, *sq_cons;
	char in[ITEMS][64];  /* GET destinations (copy path) */
	char out[ITEMS][64]; /* PUT sources; valid until the PUT's CQE */
	struct iovec in_iov[ITEMS], out_iov[ITEMS];
	int next_put, puts_done, gets_done, errors, wakeups;
};

static struct ferry_engine *make_engine(const char *name, enum ferry_progress_mode mode)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.progress = mode;
	p.pool_size = 1 << 20;
	rc = ferry_engine_create(&p, &e);
	if (rc < 0)
		fprintf(stderr, "epoll_loop: engine %s: %s\n", name, ferry_strerror(rc));
	return e;
}

static void handle(struct app *a, const struct ferry_cqe *c)
{
	int i = (int)(c->user_data & 0xffff);

	if (c->res < 0) {
		a->errors++;
		fprintf(stderr, "  %s item-%d: %s\n", c->opcode == FERRY_OP_PUT ? "PUT" : "GET", i,
			ferry_strerror(c->res));
	}
	if (c->opcode == FERRY_OP_PUT) {
		a->puts_done++;
	} else if (c->opcode == FERRY_OP_GET) {
		a->gets_done++;
		if (c->res >= 0)
			printf("  got item-%d (%llu bytes): \"%s\"\n", i, (unsigned long long)c->len,
			       a->in[i]);
	}
}

/* Poll until empty, then arm. Returns true if the CQ is armed (safe to sleep). */
static bool drain_and_arm(struct app *a, struct ferry_cq *cq)
{
	struct ferry_cqe cqes[16];
	int n, rc;

	for (;;) {
		while ((n = ferry_cq_poll(cq, cqes, 16)) > 0)
			for (int k = 0; k < n; k++)
				handle(a, &cqes[k]);
		rc = ferry_cq_arm(cq);
		if (rc == 0)
			return true;
		if (rc != -EBUSY) {
			fprintf(stderr, "epoll_loop: ferry_cq_arm: %s\n", ferry_strerror(rc));
			return false;
		}
		/* -EBUSY: something completed (or needs progress) meanwhile */
	}
}

static void put_next(struct app *a)
{
	int i = a->next_put++;
	struct ferry_sqe *sqe = ferry_sq_get_sqe(a->sq_prod);
	char key[32];

	snprintf(a->out[i], sizeof(a->out[i]), "hello #%d from the producer", i);
	a->out_iov[i].iov_base = a->out[i];
	a->out_iov[i].iov_len = strlen(a->out[i]) + 1;
	snprintf(key, sizeof(key), "item-%d", i);
	ferry_prep_put(sqe, a->to_cons, key, &a->out_iov[i], 1, (uint64_t)i);
	ferry_sq_submit(a->sq_prod);
}

static int run(enum ferry_progress_mode mode)
{
	const char *mname = mode == FERRY_PROGRESS_THREAD ? "THREAD" : "MANUAL";
	struct itimerspec its = { .it_interval = { 0, TICK_NS }, .it_value = { 0, TICK_NS } };
	struct epoll_event ev, evs[8];
	struct app a;
	int ep = -1, tfd = -1, rc = 1;

	memset(&a, 0, sizeof(a));
	printf("%s mode\n", mname);
	a.prod = make_engine("ep.producer", mode);
	a.cons = make_engine("ep.consumer", mode);
	if (!a.prod || !a.cons)
		goto out;
	if (ferry_peer_open(a.prod, "ep.consumer", &a.to_cons) < 0 ||
	    ferry_peer_open(a.cons, "ep.producer", &a.from_prod) < 0 ||
	    ferry_sq_get(a.prod, &a.sq_prod) < 0 || ferry_sq_get(a.cons, &a.sq_cons) < 0)
		goto out;

	/* Post every GET now: each waits (up to its deadline) for its PUT. */
	for (int i = 0; i < ITEMS; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(a.sq_cons);
		char key[32];

		snprintf(key, sizeof(key), "item-%d", i);
		a.in_iov[i].iov_base = a.in[i];
		a.in_iov[i].iov_len = sizeof(a.in[i]);
		ferry_prep_get(sqe, a.from_prod, key, &a.in_iov[i], 1, (uint64_t)i);
		ferry_sqe_set_timeout(sqe, GET_DEADLINE_NS);
	}
	ferry_sq_submit(a.sq_cons);

	/* One epoll set: the timer and both engines' completion queues. */
	ep = epoll_create1(EPOLL_CLOEXEC);
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (ep < 0 || tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) < 0) {
		perror("epoll_loop: epoll/timerfd");
		goto out;
	}
	ev.events = EPOLLIN;
	ev.data.u32 = TAG_TIMER;
	epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
	ev.data.u32 = TAG_PRODUCER; /* the fd belongs to the CQ: never close it */
	epoll_ctl(ep, EPOLL_CTL_ADD, ferry_cq_fd(ferry_cq_default(a.prod)), &ev);
	ev.data.u32 = TAG_CONSUMER;
	epoll_ctl(ep, EPOLL_CTL_ADD, ferry_cq_fd(ferry_cq_default(a.cons)), &ev);

	while (a.gets_done < ITEMS || a.puts_done < a.next_put) {
		int n;

		/* The protocol: both CQs empty and armed before we sleep. */
		if (!drain_and_arm(&a, ferry_cq_default(a.prod)) ||
		    !drain_and_arm(&a, ferry_cq_default(a.cons)))
			goto out;
		if (a.gets_done == ITEMS && a.puts_done == a.next_put)
			break;
		n = epoll_wait(ep, evs, 8, 5000);
		if (n < 0 && errno != EINTR) {
			perror("epoll_loop: epoll_wait");
			goto out;
		}
		if (n == 0) {
			fprintf(stderr, "epoll_loop: nothing happened for 5 s\n");
			goto out;
		}
		a.wakeups++;
		for (int k = 0; k < n; k++) {
			uint64_t ticks;

			if (evs[k].data.u32 != TAG_TIMER)
				continue; /* a CQ: drained at the top of the loop */
			if (read(tfd, &ticks, sizeof(ticks)) == sizeof(ticks) && a.next_put < ITEMS)
				put_next(&a);
		}
	}
	printf("  %s: %d PUTs, %d GETs, %d errors, %d wake-ups of epoll_wait\n", mname,
	       a.puts_done, a.gets_done, a.errors, a.wakeups);
	rc = a.errors ? 1 : 0;
out:
	if (tfd >= 0)
		close(tfd);
	if (ep >= 0)
		close(ep);
	if (a.cons)
		ferry_engine_destroy(a.cons);
	if (a.prod)
		ferry_engine_destroy(a.prod);
	return rc;
}

int main(int argc, char **argv)
{
	int rc = 0;

	if (argc > 2 || (argc == 2 && strcmp(argv[1], "thread") && strcmp(argv[1], "manual"))) {
		fprintf(stderr, "usage: epoll_loop [thread|manual]\n");
		return 2;
	}
	if (argc == 1 || !strcmp(argv[1], "thread"))
		rc |= run(FERRY_PROGRESS_THREAD);
	if (argc == 1 || !strcmp(argv[1], "manual"))
		rc |= run(FERRY_PROGRESS_MANUAL);
	return rc;
}

/*
 * overhead.c - the C side of pyferry's per-call overhead measurement
 * (overhead.sh runs it beside overhead.py): the same loops as the Python
 * side, written against ferry.h. Two engines of one process (the loop
 * transport), THREAD mode, one thread: a NOP submitted and waited for, and a
 * 64 B PUT (copied) then a zero-copy GET of it and the buffer's release,
 * each waited for on a CQ of the thread's own; then a NOP on a MANUAL-mode
 * engine (no reactor: the closest to the binding's own cost). Prints ns per
 * iteration.
 */
#include <errno.h>
#include <ferry.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int wait_ud(struct ferry_cq *cq, uint64_t ud, struct ferry_cqe *c)
{
	for (;;) {
		int n = ferry_cq_wait(cq, c, 1, -1);

		if (n == 1 && c->user_data == ud)
			return c->res;
		if (n < 0 && n != -EINTR)
			return n;
	}
}

int main(int argc, char **argv)
{
	struct ferry_engine_params pp = FERRY_ENGINE_PARAMS_INIT, cp = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_cq_params qp = FERRY_CQ_PARAMS_INIT;
	struct ferry_engine *p, *c;
	struct ferry_peer *to, *from;
	struct ferry_cq *pcq, *ccq;
	struct ferry_sq *psq, *csq;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	char payload[64] = { 1 };
	struct iovec iov = { payload, sizeof(payload) };
	long iters = argc > 1 ? atol(argv[1]) : 200000;
	uint64_t ud = 0;
	double t0;

	pp.name = "ovh-prod";
	pp.ns = "ovh-c";
	pp.pool_size = 8 << 20;
	cp = pp;
	cp.name = "ovh-cons";
	if (ferry_engine_create(&pp, &p) || ferry_engine_create(&cp, &c) ||
	    ferry_peer_open(p, "ovh-cons", &to) || ferry_peer_open(c, "ovh-prod", &from) ||
	    ferry_cq_create(p, &qp, &pcq) || ferry_cq_create(c, &qp, &ccq))
		return 1;
	for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
		t0 = now_ns();
		for (long i = 0; i < iters; i++) {
			ferry_sq_get(p, &psq);
			sqe = ferry_sq_get_sqe(psq);
			ferry_prep_nop(sqe, ++ud);
			ferry_sqe_set_cq(sqe, pcq);
			ferry_sq_submit(psq);
			if (wait_ud(pcq, ud, &cqe) < 0)
				return 2;
		}
		if (pass)
			printf("c nop: %.0f ns\n", (now_ns() - t0) / iters);
		t0 = now_ns();
		for (long i = 0; i < iters; i++) {
			ferry_sq_get(p, &psq);
			sqe = ferry_sq_get_sqe(psq);
			ferry_prep_put(sqe, to, "k", &iov, 1, ++ud);
			ferry_sqe_set_cq(sqe, pcq);
			ferry_sq_submit(psq);
			if (wait_ud(pcq, ud, &cqe) < 0)
				return 3;
			ferry_sq_get(c, &csq);
			sqe = ferry_sq_get_sqe(csq);
			ferry_prep_get(sqe, from, "k", NULL, 0, ++ud);
			ferry_sqe_set_cq(sqe, ccq);
			ferry_sq_submit(csq);
			if (wait_ud(ccq, ud, &cqe) < 0)
				return 4;
			ferry_buf_release(cqe.buf);
		}
		if (pass)
			printf("c put+get 64 B: %.0f ns\n", (now_ns() - t0) / iters);
	}
	ferry_engine_destroy(c);
	ferry_engine_destroy(p);
	/* MANUAL mode: no reactor thread, the wait drives progress itself */
	pp.name = "ovh-manual";
	pp.progress = FERRY_PROGRESS_MANUAL;
	if (ferry_engine_create(&pp, &p) || ferry_cq_create(p, &qp, &pcq))
		return 5;
	for (int pass = 0; pass < 2; pass++) {
		t0 = now_ns();
		for (long i = 0; i < iters; i++) {
			ferry_sq_get(p, &psq);
			sqe = ferry_sq_get_sqe(psq);
			ferry_prep_nop(sqe, ++ud);
			ferry_sqe_set_cq(sqe, pcq);
			ferry_sq_submit(psq);
			if (wait_ud(pcq, ud, &cqe) < 0)
				return 6;
		}
		if (pass)
			printf("c nop (manual): %.0f ns\n", (now_ns() - t0) / iters);
	}
	ferry_engine_destroy(p);
	return 0;
}

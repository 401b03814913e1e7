/*
 * bench/count_ops.c - the instructions an op costs, for callgrind: the
 * deterministic side of deciding a hot-path change (docs/benchmarks.md,
 * "Instructions per op"). Two engines in MANUAL mode, driven by this one
 * thread, over the in-process transport ("loop") or over tcp on loopback
 * ("tcp": the consumer is given the producer's address, so tcp carries it
 * although both are in this process). After a warm-up, each kind of op runs
 * N times inside a function of its own (window_*), which callgrind counts
 * alone:
 *
 *   valgrind --tool=callgrind --collect-atstart=no \
 *            --toggle-collect=window_put_get_64 build/bench/count_ops loop 20000
 *
 * and "Collected" / N is the instructions per op. The windows:
 *   window_nop           one NOP: submit, progress, poll its CQE
 *   window_put_get_64    a GET posted, then a 64 B PUT of an iovec into it
 *                        (copied into the GET's iovec), both CQEs polled
 *   window_put_get_zc    a 4 KiB pool buffer PUT zero copy, a zero-copy GET,
 *                        the buffer released
 *   window_stream_64     one 64 B STREAM_PUT chunk into a STREAM_GET that reads
 *                        the stream, its chunk released
 * Only ferry's API is used, so the same file builds against an older tree
 * for a before/after count.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry.h"

static void die(const char *what, int rc) __attribute__((noreturn));
static void die(const char *what, int rc)
{
	fprintf(stderr, "count_ops: %s: %s\n", what, ferry_strerror(rc));
	exit(1);
}

#define CHECK(call)                          \
	do {                                 \
		int rc_ = (call);            \
		if (rc_ < 0)                 \
			die(#call, rc_);     \
	} while (0)

static struct ferry_engine *prod, *cons;
static struct ferry_peer *to_cons, *from_prod;
static struct ferry_sq *psq, *csq;
static char key[64];

static struct ferry_engine *engine(const char *name, const char *listen)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = "count-ops";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 64u << 20;
	p.listen = listen;
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

static struct ferry_sqe *sqe_of(struct ferry_sq *sq)
{
	struct ferry_sqe *s = ferry_sq_get_sqe(sq);

	if (!s)
		die("ferry_sq_get_sqe", -ENOSPC);
	return s;
}

/* Drive both engines until n CQEs came on cq; returns the last. */
static struct ferry_cqe reap(struct ferry_cq *cq, unsigned n)
{
	struct ferry_cqe c = { 0 }, got;
	unsigned seen = 0;

	while (seen < n) {
		ferry_progress(prod);
		ferry_progress(cons);
		while (seen < n && ferry_cq_poll(cq, &got, 1) == 1) {
			if (got.res < 0)
				die("an op", got.res);
			c = got;
			seen++;
		}
	}
	return c;
}

__attribute__((noinline)) static void window_nop(unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		ferry_prep_nop(sqe_of(psq), i);
		ferry_sq_submit(psq);
		reap(ferry_cq_default(prod), 1);
	}
}

__attribute__((noinline)) static void window_put_get_64(unsigned n, unsigned base)
{
	static char src[64], dst[64];
	struct iovec in = { src, sizeof(src) }, out = { dst, sizeof(dst) };

	for (unsigned i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "k%u", base + i);
		ferry_prep_get(sqe_of(csq), from_prod, key, &out, 1, i);
		ferry_sq_submit(csq);
		ferry_prep_put(sqe_of(psq), to_cons, key, &in, 1, i);
		ferry_sq_submit(psq);
		reap(ferry_cq_default(cons), 1);
		reap(ferry_cq_default(prod), 1);
	}
}

__attribute__((noinline)) static void window_put_get_zc(unsigned n, unsigned base)
{
	for (unsigned i = 0; i < n; i++) {
		struct ferry_buf *b;
		struct ferry_cqe c;

		CHECK(ferry_buf_alloc(prod, 4096, &b));
		snprintf(key, sizeof(key), "z%u", base + i);
		ferry_prep_get(sqe_of(csq), from_prod, key, NULL, 0, i);
		ferry_sq_submit(csq);
		ferry_prep_put_buf(sqe_of(psq), to_cons, key, b, i);
		ferry_sq_submit(psq);
		c = reap(ferry_cq_default(cons), 1);
		ferry_buf_release(c.buf);
		reap(ferry_cq_default(prod), 1);
	}
}

__attribute__((noinline)) static void window_stream_64(unsigned n)
{
	static char src[64];
	struct iovec in = { src, sizeof(src) };

	for (unsigned i = 0; i < n; i++) {
		struct ferry_cqe c;

		ferry_prep_stream_put(sqe_of(psq), to_cons, "s", &in, 1, i);
		ferry_sq_submit(psq);
		c = reap(ferry_cq_default(cons), 1);
		ferry_buf_release(c.buf);
		reap(ferry_cq_default(prod), 1);
	}
}

int main(int argc, char **argv)
{
	const char *how = argc > 1 ? argv[1] : "loop";
	unsigned n = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 20000, warm = n / 4 + 1;
	char addr[128];

	if (strcmp(how, "loop") && strcmp(how, "tcp")) {
		fprintf(stderr, "usage: count_ops [loop|tcp] [N]\n");
		return 2;
	}
	alarm(600); /* a hang ends the program (SIGALRM) */
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL); /* loopback without a secret: no warning */
	prod = engine("producer", !strcmp(how, "tcp") ? "tcp://127.0.0.1:0" : NULL);
	cons = engine("consumer", !strcmp(how, "tcp") ? "tcp://127.0.0.1:0" : NULL);
	CHECK(ferry_peer_open(prod, "consumer", &to_cons));
	CHECK(ferry_peer_open(cons, "producer", &from_prod));
	if (!strcmp(how, "tcp")) {
		struct ferry_peer *back;

		if (ferry_engine_address(cons, addr, sizeof(addr)) < 0)
			die("ferry_engine_address", -ENOTCONN);
		CHECK(ferry_peer_set_address(to_cons, addr));
		if (ferry_engine_address(prod, addr, sizeof(addr)) < 0)
			die("ferry_engine_address", -ENOTCONN);
		CHECK(ferry_peer_open(cons, "producer", &back));
		CHECK(ferry_peer_set_address(back, addr));
	}
	CHECK(ferry_sq_get(prod, &psq));
	CHECK(ferry_sq_get(cons, &csq));
	/* The stream's reader: one STREAM_GET for every chunk. */
	ferry_prep_stream_get(sqe_of(csq), from_prod, "s", 999);
	ferry_sq_submit(csq);

	window_nop(warm); /* warm-up: connections, pool slabs, caches */
	window_put_get_64(warm, 0);
	window_put_get_zc(warm, 0);
	window_stream_64(warm);
	window_nop(n);
	window_put_get_64(n, warm);
	window_put_get_zc(n, warm);
	window_stream_64(n);
	fprintf(stderr, "count_ops: %s: %u of each op after %u warm-up ops\n", how, n, warm);
	ferry_engine_destroy(prod);
	ferry_engine_destroy(cons);
	return 0;
}

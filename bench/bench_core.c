/*
 * bench/bench_core.c - the core figures of ferry and their floors, in one run.
 *
 * Prints ONE JSON object on stdout (progress goes to stderr):
 *   nop         NOP submit -> complete rate: MANUAL batch 1 and 32, THREAD batch 32
 *   floor       bare io_uring NOP (batch 1 and 32) and memcpy (4 MiB, 64 MiB)
 *   latency_64B in-process PUT -> GET of 64 B, put-submit -> get-complete,
 *               p50/p99, GET into an iovec and zero-copy, MANUAL and THREAD mode
 *               (THREAD also with the caller asleep in ferry_cq_wait)
 *   bandwidth   PUT -> GET at 4 MiB and 64 MiB: copy path (PUT of an iovec,
 *               GET zero-copy) and zero-copy path (PUT of a pool buffer),
 *               with the ratio copy / memcpy of the same run
 *   zero_copy   PUT -> GET time of a pool buffer from 4 KiB to 1 GiB
 *   targets     pass/fail of the project's targets
 * Every figure is the median (and min/max) over --reps repetitions; the
 * floors are measured in the same run, interleaved with what they bound.
 *
 * Options: --quick (CI smoke, ~5 s), --reps N (default 5; 3 with --quick),
 * --no-prefault (create the 1.1 GiB pool with FERRY_ENGINE_NO_PREFAULT).
 *
 * Uses the public API only (plus liburing for the floor).
 */
#include <errno.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)
#define GIB ((size_t)1024 * 1024 * 1024)

#define UD_PUT (1ull << 62)
#define UD_GET (2ull << 62)
#define UD_MASK (3ull << 62)

static struct {
	bool quick;
	int reps;
	bool no_prefault;
} opt = { .reps = 0 };


#include "bench_util.h"

/* ------------------------------------------------------------------ */
/* Engines                                                             */
/* ------------------------------------------------------------------ */

static struct ferry_engine *engine(const char *name, enum ferry_progress_mode mode,
				   size_t pool_size, uint32_t flags)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;

	p.name = name;
	p.ns = "bench_core";
	p.progress = mode;
	p.pool_size = pool_size;
	p.flags = flags;
	CHECK(ferry_engine_create(&p, &e));
	return e;
}

static struct ferry_peer *peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p;

	CHECK(ferry_peer_open(e, name, &p));
	return p;
}

static struct ferry_sq *sq_of(struct ferry_engine *e)
{
	struct ferry_sq *sq;

	CHECK(ferry_sq_get(e, &sq));
	return sq;
}

/* ------------------------------------------------------------------ */
/* NOP rate                                                            */
/* ------------------------------------------------------------------ */

/* ns per NOP: batch NOPs, one submit, poll the CQ until all completed. */
static double nop_run(struct ferry_engine *e, unsigned batch, uint64_t ops)
{
	struct ferry_sq *sq = sq_of(e);
	struct ferry_cq *cq = ferry_cq_default(e);
	struct ferry_cqe cqes[64];
	uint64_t t0, done = 0, ud = 0;

	t0 = now_ns();
	while (done < ops) {
		unsigned got = 0;

		for (unsigned i = 0; i < batch; i++)
			ferry_prep_nop(next_sqe(sq), ud++);
		ferry_sq_submit(sq);
		while (got < batch) {
			int n = ferry_cq_poll(cq, cqes, 64);

			if (n < 0)
				die("ferry_cq_poll", n);
			for (int i = 0; i < n; i++)
				if (cqes[i].res < 0)
					die("NOP completion", cqes[i].res);
			got += (unsigned)n;
		}
		done += batch;
	}
	return (double)(now_ns() - t0) / (double)done;
}

struct nop_result {
	struct stat3 ns_per_op, ops_per_s;
	uint64_t ops;
};

static struct nop_result nop_bench(const char *label, enum ferry_progress_mode mode,
				   unsigned batch, uint64_t ops)
{
	char name[FERRY_NAME_MAX];
	struct ferry_engine *e;
	double ns[64], rate[64];
	struct nop_result r;

	snprintf(name, sizeof(name), "nop.%s.b%u", mode == FERRY_PROGRESS_MANUAL ? "manual" : "thread",
		 batch);
	e = engine(name, mode, 1 * MIB, 0);
	nop_run(e, batch, ops / 10 + batch); /* warm up */
	for (int i = 0; i < opt.reps; i++) {
		ns[i] = nop_run(e, batch, ops);
		rate[i] = 1e9 / ns[i];
	}
	CHECK(ferry_engine_destroy(e));
	r.ns_per_op = stat_of(ns, opt.reps);
	r.ops_per_s = stat_of(rate, opt.reps);
	r.ops = ops;
	progress("%-24s %8.1f ns/op  %6.2f M ops/s (median of %d)", label, r.ns_per_op.median,
		 r.ops_per_s.median / 1e6, opt.reps);
	return r;
}

/* The floor: a bare io_uring NOP loop. */
static double uring_nop_run(struct io_uring *ring, unsigned batch, uint64_t ops)
{
	uint64_t t0 = now_ns(), done = 0;

	while (done < ops) {
		struct io_uring_cqe *cqe;
		unsigned head, n = 0;
		int rc;

		for (unsigned i = 0; i < batch; i++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			if (!sqe)
				die("io_uring_get_sqe", -EBUSY);
			io_uring_prep_nop(sqe);
			io_uring_sqe_set_data64(sqe, done + i);
		}
		rc = io_uring_submit_and_wait(ring, batch);
		if (rc < 0)
			die("io_uring_submit_and_wait", rc);
		io_uring_for_each_cqe(ring, head, cqe) {
			if (cqe->res < 0)
				die("io_uring NOP", cqe->res);
			n++;
		}
		io_uring_cq_advance(ring, n);
		if (n != batch)
			die("io_uring: short completion batch", -EIO);
		done += batch;
	}
	return (double)(now_ns() - t0) / (double)done;
}

static struct nop_result uring_nop_bench(unsigned batch, uint64_t ops)
{
	struct io_uring ring;
	double ns[64], rate[64];
	struct nop_result r;
	int rc = io_uring_queue_init(64, &ring, 0);

	if (rc < 0)
		die("io_uring_queue_init", rc);
	uring_nop_run(&ring, batch, ops / 10 + batch);
	for (int i = 0; i < opt.reps; i++) {
		ns[i] = uring_nop_run(&ring, batch, ops);
		rate[i] = 1e9 / ns[i];
	}
	io_uring_queue_exit(&ring);
	r.ns_per_op = stat_of(ns, opt.reps);
	r.ops_per_s = stat_of(rate, opt.reps);
	r.ops = ops;
	progress("io_uring NOP batch %-5u %8.1f ns/op  %6.2f M ops/s (floor)", batch,
		 r.ns_per_op.median, r.ops_per_s.median / 1e6);
	return r;
}

static void jnop(const char *k, const struct nop_result *r, unsigned batch)
{
	jopen(k);
	jnum("batch", batch);
	jnum("ops_per_rep", (double)r->ops);
	jstat("ns_per_op", r->ns_per_op, 1);
	jstat("ops_per_s", r->ops_per_s, 0);
	jclose();
}

/* ------------------------------------------------------------------ */
/* PUT -> GET between two engines                                      */
/* ------------------------------------------------------------------ */

struct pair {
	struct ferry_engine *a, *b;   /* a puts, b gets */
	struct ferry_peer *to_b, *from_a;
	struct ferry_sq *sqa, *sqb;
	struct ferry_cq *cqa, *cqb;
	bool manual;
	bool block; /* THREAD: sleep in ferry_cq_wait instead of polling */
};

static void pair_open(struct pair *p, const char *an, const char *bn,
		      enum ferry_progress_mode mode, size_t pool_a, uint32_t flags_a)
{
	memset(p, 0, sizeof(*p));
	p->a = engine(an, mode, pool_a, flags_a);
	p->b = engine(bn, mode, 4 * MIB, 0);
	p->to_b = peer(p->a, bn);
	p->from_a = peer(p->b, an);
	p->sqa = sq_of(p->a);
	p->sqb = sq_of(p->b);
	p->cqa = ferry_cq_default(p->a);
	p->cqb = ferry_cq_default(p->b);
	p->manual = mode == FERRY_PROGRESS_MANUAL;
}

static void pair_close(struct pair *p)
{
	CHECK(ferry_engine_destroy(p->a));
	CHECK(ferry_engine_destroy(p->b));
}

/*
 * One transfer: the GET is posted first (a consumer already waiting), then
 * the PUT; returns the ns from the PUT's submit to the GET's completion.
 * put_iov != NULL: PUT of an iovec (one copy into the pool), else of
 * put_buf (zero copy). get_iov != NULL: GET copies into it, else zero copy.
 * Polling both CQs also drives both engines in MANUAL mode.
 */
static uint64_t transfer(struct pair *p, uint64_t seq, const struct iovec *put_iov,
			 struct ferry_buf *put_buf, const struct iovec *get_iov, uint64_t expect_len)
{
	char key[32];
	struct ferry_cqe c[8];
	uint64_t t0, t_get = 0;
	bool put_done = false, get_done = false;

	snprintf(key, sizeof(key), "k%llu", (unsigned long long)seq);
	ferry_prep_get(next_sqe(p->sqb), p->from_a, key, get_iov, get_iov ? 1 : 0, UD_GET | seq);
	ferry_sq_submit(p->sqb);
	if (p->manual)
		ferry_progress(p->b); /* park the GET */
	t0 = now_ns();
	if (put_iov)
		ferry_prep_put(next_sqe(p->sqa), p->to_b, key, put_iov, 1, UD_PUT | seq);
	else
		ferry_prep_put_buf(next_sqe(p->sqa), p->to_b, key, put_buf, UD_PUT | seq);
	ferry_sq_submit(p->sqa);
	while (!put_done || !get_done) {
		int n;

		if (p->block) {
			/* the GET first: its completion stops the clock */
			n = get_done ? ferry_cq_wait(p->cqa, c, 8, -1) : 0;
		} else {
			n = ferry_cq_poll(p->cqa, c, 8);
		}
		if (n < 0)
			die("ferry_cq_poll/wait (PUT side)", n);

		for (int i = 0; i < n; i++) {
			if (c[i].user_data != (UD_PUT | seq) || c[i].res < 0)
				die("PUT completion", c[i].res < 0 ? c[i].res : -EPROTO);
			put_done = true;
		}
		if (get_done)
			continue;
		n = p->block ? ferry_cq_wait(p->cqb, c, 8, -1) : ferry_cq_poll(p->cqb, c, 8);
		if (n < 0)
			die("ferry_cq_poll/wait (GET side)", n);
		for (int i = 0; i < n; i++) {
			if (!t_get)
				t_get = now_ns();
			if (c[i].user_data != (UD_GET | seq) || c[i].res < 0)
				die("GET completion", c[i].res < 0 ? c[i].res : -EPROTO);
			if (c[i].len != expect_len)
				die("GET length", -EMSGSIZE);
			if (get_iov ? (c[i].flags & FERRY_CQE_F_BUF) != 0
				    : !(c[i].flags & FERRY_CQE_F_BUF) || !c[i].buf)
				die("GET buffer flag", -EPROTO);
			if (c[i].buf)
				CHECK(ferry_buf_release(c[i].buf));
			get_done = true;
		}
	}
	return t_get - t0;
}

struct lat_result {
	struct stat3 p50, p99;
	int samples;
};

static struct lat_result latency_bench(struct pair *p, bool get_zero_copy, int samples,
				       uint64_t *seq)
{
	static char src[64], dst[64];
	struct iovec piov = { src, sizeof(src) }, giov = { dst, sizeof(dst) };
	uint64_t *v = malloc(sizeof(uint64_t) * (size_t)samples);
	double p50[64], p99[64];
	struct lat_result r;

	memset(src, 0x5a, sizeof(src));
	for (int i = 0; i < samples / 10 + 10; i++) /* warm up */
		transfer(p, (*seq)++, &piov, NULL, get_zero_copy ? NULL : &giov, 64);
	for (int rep = 0; rep < opt.reps; rep++) {
		for (int i = 0; i < samples; i++)
			v[i] = transfer(p, (*seq)++, &piov, NULL, get_zero_copy ? NULL : &giov, 64);
		p50[rep] = pct(v, (size_t)samples, 50);
		p99[rep] = pct(v, (size_t)samples, 99);
	}
	if (!get_zero_copy && memcmp(src, dst, sizeof(src)))
		die("64 B GET: data differs", -EIO);
	free(v);
	r.p50 = stat_of(p50, opt.reps);
	r.p99 = stat_of(p99, opt.reps);
	r.samples = samples;
	return r;
}

static void jlat(const char *k, const struct lat_result *r)
{
	jopen(k);
	jnum("samples_per_rep", r->samples);
	jstat("p50_ns", r->p50, 0);
	jstat("p99_ns", r->p99, 0);
	jclose();
}

/* ------------------------------------------------------------------ */
/* Bandwidth                                                           */
/* ------------------------------------------------------------------ */

static double memcpy_gbps(void *dst, const void *src, size_t size, int iters)
{
	uint64_t t0 = now_ns();

	for (int i = 0; i < iters; i++) {
		memcpy(dst, src, size);
		clobber(dst);
	}
	return (double)size * iters / (double)(now_ns() - t0);
}

/* Copy path: PUT of an iovec (copied once into the pool), GET zero copy. */
static double copy_put_get_gbps(struct pair *p, const void *src, size_t size, int iters,
				uint64_t *seq)
{
	struct iovec iov = { (void *)src, size };
	uint64_t t0 = now_ns();

	for (int i = 0; i < iters; i++)
		transfer(p, (*seq)++, &iov, NULL, NULL, size);
	return (double)size * iters / (double)(now_ns() - t0);
}

/* Zero-copy path: allocate a pool buffer, PUT it, GET zero copy, release. */
static double zc_put_get_gbps(struct pair *p, size_t size, int iters, uint64_t *seq)
{
	uint64_t t0 = now_ns();

	for (int i = 0; i < iters; i++) {
		struct ferry_buf *b;

		CHECK(ferry_buf_alloc(p->a, size, &b));
		transfer(p, (*seq)++, NULL, b, NULL, size);
	}
	return (double)size * iters / (double)(now_ns() - t0);
}

struct bw_result {
	size_t size;
	int iters;
	struct stat3 memcpy_gbps, memcpy_to_pool_gbps, copy_gbps, zc_gbps, ratio_paired;
	double ratio_of_medians;
};

static struct bw_result bw_bench(struct pair *p, size_t size, int iters, uint64_t *seq)
{
	double mc[64], mp[64], cp[64], zc[64], ratio[64];
	char *src = malloc(size), *dst = malloc(size);
	struct ferry_buf *pb;
	struct bw_result r;

	if (!src || !dst)
		die("malloc", -ENOMEM);
	memset(src, 0xa5, size); /* touch once: fresh pages cost 3-4 us each here */
	memset(dst, 0, size);
	CHECK(ferry_buf_alloc(p->a, size, &pb));
	/* warm up every path once */
	memcpy_gbps(dst, src, size, 1);
	memcpy_gbps(ferry_buf_data(pb), src, size, 1);
	copy_put_get_gbps(p, src, size, 1, seq);
	zc_put_get_gbps(p, size, 1, seq);
	for (int rep = 0; rep < opt.reps; rep++) {
		mc[rep] = memcpy_gbps(dst, src, size, iters);
		mp[rep] = memcpy_gbps(ferry_buf_data(pb), src, size, iters);
		cp[rep] = copy_put_get_gbps(p, src, size, iters, seq);
		zc[rep] = zc_put_get_gbps(p, size, iters, seq);
		ratio[rep] = cp[rep] / mc[rep];
	}
	CHECK(ferry_buf_release(pb));
	free(src);
	free(dst);
	r.size = size;
	r.iters = iters;
	r.memcpy_gbps = stat_of(mc, opt.reps);
	r.memcpy_to_pool_gbps = stat_of(mp, opt.reps);
	r.copy_gbps = stat_of(cp, opt.reps);
	r.zc_gbps = stat_of(zc, opt.reps);
	r.ratio_paired = stat_of(ratio, opt.reps);
	r.ratio_of_medians = r.copy_gbps.median / r.memcpy_gbps.median;
	progress("%4zu MiB: memcpy %.2f GB/s, memcpy->pool %.2f, copy PUT->GET %.2f (x%.3f), "
		 "zero-copy %.0f GB/s",
		 size / MIB, r.memcpy_gbps.median, r.memcpy_to_pool_gbps.median, r.copy_gbps.median,
		 r.ratio_of_medians, r.zc_gbps.median);
	return r;
}

static void jbw(const char *k, const struct bw_result *r)
{
	jopen(k);
	jnum("bytes", (double)r->size);
	jnum("iters_per_rep", r->iters);
	jstat("copy_put_get_gb_per_s", r->copy_gbps, 3);
	jstat("zero_copy_put_get_gb_per_s", r->zc_gbps, 1);
	jstat("memcpy_gb_per_s", r->memcpy_gbps, 3);
	jstat("memcpy_into_pool_gb_per_s", r->memcpy_to_pool_gbps, 3);
	jfix("ratio_copy_put_get_vs_memcpy", r->ratio_of_medians, 3);
	jstat("ratio_copy_put_get_vs_memcpy_paired", r->ratio_paired, 3);
	jclose();
}

/* ------------------------------------------------------------------ */
/* Zero-copy PUT -> GET time against size                              */
/* ------------------------------------------------------------------ */

struct zc_result {
	size_t size;
	struct stat3 p50, p99, alloc_ns, release_ns;
	int samples;
};

static struct zc_result zc_bench(struct pair *p, size_t size, int samples, uint64_t *seq)
{
	uint64_t *v = malloc(sizeof(uint64_t) * (size_t)samples);
	uint64_t *va = malloc(sizeof(uint64_t) * (size_t)samples);
	double p50[64], p99[64], al[64], rl[64];
	struct zc_result r;

	for (int rep = -1; rep < opt.reps; rep++) { /* rep -1: warm-up */
		uint64_t rel_total = 0;

		for (int i = 0; i < samples; i++) {
			struct ferry_buf *b;
			uint64_t t0 = now_ns();

			CHECK(ferry_buf_alloc(p->a, size, &b));
			va[i] = now_ns() - t0;
			/* transfer() releases the GET's buffer; time it apart below */
			v[i] = transfer(p, (*seq)++, NULL, b, NULL, size);
		}
		if (rep < 0)
			continue;
		/* release cost, measured apart: alloc + release without a transfer */
		for (int i = 0; i < samples; i++) {
			struct ferry_buf *b;
			uint64_t t0;

			CHECK(ferry_buf_alloc(p->a, size, &b));
			t0 = now_ns();
			CHECK(ferry_buf_release(b));
			rel_total += now_ns() - t0;
		}
		p50[rep] = pct(v, (size_t)samples, 50);
		p99[rep] = pct(v, (size_t)samples, 99);
		al[rep] = pct(va, (size_t)samples, 50);
		rl[rep] = (double)rel_total / samples;
	}
	free(v);
	free(va);
	r.size = size;
	r.samples = samples;
	r.p50 = stat_of(p50, opt.reps);
	r.p99 = stat_of(p99, opt.reps);
	r.alloc_ns = stat_of(al, opt.reps);
	r.release_ns = stat_of(rl, opt.reps);
	progress("zero-copy PUT->GET %10zu B: p50 %6.0f ns  p99 %6.0f ns (alloc %.0f ns, "
		 "release %.0f ns)",
		 size, r.p50.median, r.p99.median, r.alloc_ns.median, r.release_ns.median);
	return r;
}

static void jzc(const struct zc_result *r)
{
	jopen(NULL);
	jnum("bytes", (double)r->size);
	jnum("samples_per_rep", r->samples);
	jstat("p50_ns", r->p50, 0);
	jstat("p99_ns", r->p99, 0);
	jstat("buf_alloc_p50_ns", r->alloc_ns, 0);
	jstat("buf_release_mean_ns", r->release_ns, 0);
	jclose();
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */


static void usage(FILE *f)
{
	fprintf(f, "usage: bench_core [--quick] [--reps N] [--no-prefault]\n"
		   "  --quick        short run for CI smoke tests (fewer ops, 3 reps)\n"
		   "  --reps N       repetitions of every measurement (default 5, max 64)\n"
		   "  --no-prefault  create the 1.1 GiB pool with FERRY_ENGINE_NO_PREFAULT\n"
		   "Prints one JSON object on stdout; progress on stderr.\n");
}

int main(int argc, char **argv)
{
	uint64_t t_start = now_ns(), seq = 0;
	struct nop_result nm1, nm32, nt32, u1, u32;
	struct lat_result lm_iov, lm_zc, lt_iov, lt_zc, lt_wait;
	struct bw_result bw4, bw64;
	struct zc_result zc[4];
	size_t zc_sizes[4] = { 4 * KIB, 4 * MIB, 64 * MIB, 1 * GIB };
	size_t big_pool = 1152 * MIB; /* 1.125 GiB: room for a 1 GiB block */
	uint64_t nop_ops, nop1_ops;
	int lat_samples, zc_samples, it4, it64;
	double pool_create_s;
	struct pair p;
	char cpu[128];
	time_t tnow = time(NULL);
	bool t_nop, t_copy, t_zc;
	double zc1g, load_start = loadavg1();
	who = "bench_core";

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick")) {
			opt.quick = true;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			opt.reps = atoi(argv[++i]);
			if (opt.reps < 1 || opt.reps > 64) {
				fprintf(stderr, "bench_core: --reps takes 1..64\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--no-prefault")) {
			opt.no_prefault = true;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (!opt.reps)
		opt.reps = opt.quick ? 3 : 5;
	nop_ops = opt.quick ? 200000 : 2000000;
	nop1_ops = opt.quick ? 50000 : 500000;
	lat_samples = opt.quick ? 2000 : 20000;
	zc_samples = opt.quick ? 200 : 1000;
	it4 = opt.quick ? 16 : 64;  /* x 4 MiB per rep */
	it64 = opt.quick ? 2 : 8;   /* x 64 MiB per rep */

	/* --- NOP rates and the io_uring floor ------------------------------ */
	progress("NOP rates (%d reps)", opt.reps);
	u1 = uring_nop_bench(1, nop1_ops);
	nm1 = nop_bench("MANUAL NOP batch 1", FERRY_PROGRESS_MANUAL, 1, nop1_ops);
	u32 = uring_nop_bench(32, nop_ops);
	nm32 = nop_bench("MANUAL NOP batch 32", FERRY_PROGRESS_MANUAL, 32, nop_ops);
	nt32 = nop_bench("THREAD NOP batch 32", FERRY_PROGRESS_THREAD, 32, nop_ops);

	/* --- 64 B PUT -> GET latency --------------------------------------- */
	progress("64 B PUT->GET latency, %d samples x %d reps", lat_samples, opt.reps);
	pair_open(&p, "lat.m.a", "lat.m.b", FERRY_PROGRESS_MANUAL, 4 * MIB, 0);
	lm_iov = latency_bench(&p, false, lat_samples, &seq);
	lm_zc = latency_bench(&p, true, lat_samples, &seq);
	pair_close(&p);
	progress("MANUAL: GET iovec p50 %.0f p99 %.0f ns; zero-copy p50 %.0f p99 %.0f ns",
		 lm_iov.p50.median, lm_iov.p99.median, lm_zc.p50.median, lm_zc.p99.median);
	pair_open(&p, "lat.t.a", "lat.t.b", FERRY_PROGRESS_THREAD, 4 * MIB, 0);
	lt_iov = latency_bench(&p, false, lat_samples, &seq);
	lt_zc = latency_bench(&p, true, lat_samples, &seq);
	p.block = true;
	lt_wait = latency_bench(&p, true, lat_samples / 4, &seq);
	pair_close(&p);
	progress("THREAD: GET iovec p50 %.0f p99 %.0f ns; zero-copy p50 %.0f p99 %.0f ns; "
		 "zero-copy, caller in ferry_cq_wait p50 %.0f p99 %.0f ns",
		 lt_iov.p50.median, lt_iov.p99.median, lt_zc.p50.median, lt_zc.p99.median,
		 lt_wait.p50.median, lt_wait.p99.median);

	/* --- bandwidth and zero copy, on one pair with a 1.125 GiB pool ---- */
	progress("creating a %zu MiB pool (%s)", big_pool / MIB,
		 opt.no_prefault ? "FERRY_ENGINE_NO_PREFAULT" : "prefaulted");
	{
		uint64_t t0 = now_ns();

		pair_open(&p, "bw.a", "bw.b", FERRY_PROGRESS_MANUAL, big_pool,
			  opt.no_prefault ? FERRY_ENGINE_NO_PREFAULT : 0);
		pool_create_s = (double)(now_ns() - t0) / 1e9;
	}
	progress("pool ready in %.2f s; bandwidth (%d reps)", pool_create_s, opt.reps);
	bw4 = bw_bench(&p, 4 * MIB, it4, &seq);
	bw64 = bw_bench(&p, 64 * MIB, it64, &seq);
	for (int i = 0; i < 4; i++)
		zc[i] = zc_bench(&p, zc_sizes[i], zc_samples, &seq);
	pair_close(&p);

	/* --- JSON ---------------------------------------------------------- */
	read_cpu_model(cpu, sizeof(cpu));
	jheader("bench_core", tnow, load_start, (double)sysconf(_SC_NPROCESSORS_ONLN), cpu);
	jopen("config");
	jbool("quick", opt.quick);
	jnum("reps", opt.reps);
	jstr("stat", "median, min and max over reps");
	jclose();

	jopen("nop");
	jnop("manual_batch1", &nm1, 1);
	jnop("manual_batch32", &nm32, 32);
	jnop("thread_batch32", &nt32, 32);
	jclose();

	jopen("floor");
	jnop("io_uring_nop_batch1", &u1, 1);
	jnop("io_uring_nop_batch32", &u32, 32);
	jopen("memcpy_gb_per_s");
	jstat("4MiB", bw4.memcpy_gbps, 3);
	jstat("64MiB", bw64.memcpy_gbps, 3);
	jclose();
	jopen("ratios");
	jfix("manual_nop_batch1_vs_io_uring", nm1.ns_per_op.median / u1.ns_per_op.median, 3);
	jfix("manual_nop_batch32_vs_io_uring", nm32.ns_per_op.median / u32.ns_per_op.median, 3);
	jfix("thread_nop_batch32_vs_io_uring", nt32.ns_per_op.median / u32.ns_per_op.median, 3);
	jfix("copy_put_get_4MiB_vs_memcpy", bw4.ratio_of_medians, 3);
	jfix("copy_put_get_64MiB_vs_memcpy", bw64.ratio_of_medians, 3);
	jclose();
	jclose();

	jopen("latency_64B");
	jstr("measures", "put-submit -> get-complete, GET posted before the PUT");
	jopen("manual");
	jlat("get_iovec", &lm_iov);
	jlat("get_zero_copy", &lm_zc);
	jclose();
	jopen("thread");
	jlat("get_iovec", &lt_iov);
	jlat("get_zero_copy", &lt_zc);
	jlat("get_zero_copy_caller_in_cq_wait", &lt_wait);
	jclose();
	jclose();

	jopen("bandwidth");
	jstr("mode", "manual");
	jstr("copy_path", "PUT iovec (malloc, pre-touched) -> pool copy; GET zero copy");
	jstr("zero_copy_path", "ferry_buf_alloc + PUT pool buffer; GET zero copy; release");
	jbw("4MiB", &bw4);
	jbw("64MiB", &bw64);
	jclose();

	jopen("zero_copy_put_get");
	jnum("pool_bytes", (double)big_pool);
	jbool("prefault", !opt.no_prefault);
	jfix("pool_create_s", pool_create_s, 3);
	jkey("sizes");
	jraw("[");
	js.need_comma = false;
	for (int i = 0; i < 4; i++)
		jzc(&zc[i]);
	jraw("]");
	js.need_comma = true;
	jfix("growth_1GiB_vs_4KiB", zc[3].p50.median / zc[0].p50.median, 3);
	jclose();

	t_nop = nm32.ops_per_s.median >= 10e6;
	t_copy = bw64.ratio_of_medians >= 0.9;
	zc1g = zc[3].p50.median;
	t_zc = zc1g <= 2000;
	jkey("targets");
	jraw("[");
	js.need_comma = false;
	jopen(NULL);
	jstr("name", "manual_nop_batch32_ops_per_s");
	jstr("target", ">= 10000000");
	jfix("value", nm32.ops_per_s.median, 0);
	jbool("pass", t_nop);
	jclose();
	jopen(NULL);
	jstr("name", "copy_put_get_64MiB_vs_memcpy");
	jstr("target", ">= 0.9");
	jfix("value", bw64.ratio_of_medians, 3);
	jbool("pass", t_copy);
	jclose();
	jopen(NULL);
	jstr("name", "zero_copy_put_get_1GiB_p50_ns");
	jstr("target", "<= 2000");
	jfix("value", zc1g, 0);
	jbool("pass", t_zc);
	jclose();
	jraw("]");
	js.need_comma = true;
	jbool("all_targets_pass", t_nop && t_copy && t_zc);
	jfix("elapsed_s", (double)(now_ns() - t_start) / 1e9, 1);
	jclose();

	printf("%s\n", js.p);
	free(js.p);
	progress("targets: nop %s, copy %s, zero-copy %s; %.1f s",
		 t_nop ? "PASS" : "FAIL", t_copy ? "PASS" : "FAIL", t_zc ? "PASS" : "FAIL",
		 (double)(now_ns() - t_start) / 1e9);
	return 0;
}

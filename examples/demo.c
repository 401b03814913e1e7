/*
 * examples/demo.c - `./run demo`: an in-process producer -> consumer.
 *
 * Two engines in THREAD mode (a reactor thread each) in one process:
 * "producer" and "consumer". A producer thread puts N items (4 KiB to
 * 4 MiB, log-spaced) under the keys "item-<i>": three in four as pool
 * buffers (zero copy), one in four from an ordinary iovec (one copy into the
 * pool). Every item carries a header with its index, its length and a
 * checksum of the payload. PUT completions arrive as callbacks on the
 * producer thread.
 *
 * The consumer posts the GETs of the first quarter of the items before the
 * producer even starts (they wait for their data), and the GET of each
 * later item only once its PUT has completed (the data waits for the GET).
 * Every GET is zero copy: the consumer checks the checksum in place and
 * releases the buffer. At the end it prints what moved (items, bytes, MB/s,
 * latency p50/p99) and the consumer's health JSON.
 *
 * Exit status: 0 if every item arrived intact, 1 otherwise, 2 for bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ferry.h>

#define MIN_SIZE (4u << 10)
#define MAX_SIZE (4u << 20)
#define HDR_MAGIC 0x79727265666f6d64ull /* "dmoferry" */
#define DEADLINE_NS (30ull * 1000000000ull)

struct item_hdr {
	uint64_t magic;
	uint64_t index;
	uint64_t len;   /* whole item, header included */
	uint64_t sum;   /* FNV-1a of the bytes after the header */
};

struct item {
	size_t size;
	bool copy_path;             /* PUT from an iovec instead of a pool buffer */
	void *heap;                 /* copy path: the iovec's memory */
	struct iovec iov;
	_Atomic uint64_t put_submit_ns;
	_Atomic int put_res;        /* 1 until the PUT completed */
	uint64_t get_submit_ns;
	uint64_t get_done_ns;
	int get_res;
	bool waited;                /* GET posted before the PUT */
	bool ok;
};

static struct {
	int n;
	struct item *items;
	struct ferry_engine *prod, *cons;
	int put_failures;
	int gets_done, get_failures, bad_sums;
	uint64_t t_start;
} demo;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* 2^x for 0 <= x <= 10, without libm: 2^int(x) * e^(frac(x) ln 2). */
static double pow2(double x)
{
	double r = 1, e = 1, term = 1, y = x - (int)x;

	for (int k = 0; k < (int)x; k++)
		r *= 2;
	for (int k = 1; k < 20; k++) {
		term *= y * 0.6931471805599453 / k;
		e += term;
	}
	return r * e;
}

/* Item i's size: log-spaced from 4 KiB (first) to 4 MiB (last), 64 B multiple. */
static size_t item_size(int i, int n)
{
	double f = n > 1 ? (double)i / (n - 1) : 1.0;
	size_t s = (size_t)((double)MIN_SIZE * pow2(10.0 * f));

	s &= ~(size_t)63;
	return s < MIN_SIZE ? MIN_SIZE : s > MAX_SIZE ? MAX_SIZE : s;
}

/* Fill an item: header + pseudo-random payload (xorshift, seeded by i). */
static void fill(void *data, size_t size, int i)
{
	struct item_hdr *h = data;
	unsigned char *p = (unsigned char *)data + sizeof(*h);
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	size_t n = size - sizeof(*h);

	for (size_t k = 0; k < n; k += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + k, &x, n - k < 8 ? n - k : 8);
	}
	h->magic = HDR_MAGIC;
	h->index = (uint64_t)i;
	h->len = size;
	h->sum = fnv1a(p, n);
}

/* ------------------------------------------------------------------ */
/* Producer                                                            */
/* ------------------------------------------------------------------ */

static int puts_done; /* producer thread only */

/* Runs on the producer thread, inside its ferry_cq_wait. */
static void on_put(const struct ferry_cqe *cqe, void *arg)
{
	struct item *it = arg;

	puts_done++;
	if (cqe->res < 0) {
		demo.put_failures++;
		fprintf(stderr, "demo: PUT item-%" PRIu64 ": %s\n", cqe->user_data,
			ferry_strerror(cqe->res));
	}
	free(it->heap); /* copy path: the iovec may go once the PUT completed */
	it->heap = NULL;
	atomic_store_explicit(&it->put_res, cqe->res < 0 ? cqe->res : 0, memory_order_release);
}

static void *producer_main(void *arg)
{
	struct ferry_engine *e = demo.prod;
	struct ferry_cq *cq = ferry_cq_default(e);
	struct ferry_cqe cqes[16];
	struct ferry_peer *to;
	struct ferry_sq *sq;
	int rc;

	(void)arg;
	if ((rc = ferry_peer_open(e, "consumer", &to)) < 0 || (rc = ferry_sq_get(e, &sq)) < 0) {
		fprintf(stderr, "demo: producer setup: %s\n", ferry_strerror(rc));
		demo.put_failures = demo.n;
		for (int i = 0; i < demo.n; i++)
			atomic_store(&demo.items[i].put_res, rc);
		return NULL;
	}
	for (int i = 0; i < demo.n; i++) {
		struct item *it = &demo.items[i];
		struct ferry_buf *buf = NULL;
		struct ferry_sqe *sqe;
		char key[32];

		if (it->copy_path) {
			it->heap = malloc(it->size);
			if (!it->heap) {
				rc = -ENOMEM;
				goto failed;
			}
			fill(it->heap, it->size, i);
			it->iov.iov_base = it->heap;
			it->iov.iov_len = it->size;
		} else {
			/* Backpressure: the pool is full until the consumer releases. */
			while ((rc = ferry_buf_alloc(e, it->size, &buf)) == -ENOMEM)
				ferry_cq_wait(cq, cqes, 16, 1000000);
			if (rc < 0)
				goto failed;
			fill(ferry_buf_data(buf), it->size, i);
		}
		while (!(sqe = ferry_sq_get_sqe(sq)))
			ferry_cq_wait(cq, cqes, 16, 1000000);
		snprintf(key, sizeof(key), "item-%d", i);
		if (it->copy_path)
			ferry_prep_put(sqe, to, key, &it->iov, 1, (uint64_t)i);
		else
			ferry_prep_put_buf(sqe, to, key, buf, (uint64_t)i);
		ferry_sqe_set_callback(sqe, on_put, it);
		ferry_sqe_set_timeout(sqe, DEADLINE_NS);
		atomic_store(&it->put_submit_ns, now_ns());
		ferry_sq_submit(sq);
		/* Completions so far run their callbacks now, without waiting. */
		ferry_cq_poll(cq, cqes, 16);
		continue;
failed:
		fprintf(stderr, "demo: item-%d not sent: %s\n", i, ferry_strerror(rc));
		demo.put_failures++;
		puts_done++;
		atomic_store(&it->put_res, rc);
	}
	while (puts_done < demo.n)
		if (ferry_cq_wait(cq, cqes, 16, DEADLINE_NS) == -ETIMEDOUT)
			break;
	ferry_sq_put(sq);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Consumer                                                            */
/* ------------------------------------------------------------------ */

/* Runs on the main thread, inside its ferry_cq_wait / ferry_cq_poll. */
static void on_get(const struct ferry_cqe *cqe, void *arg)
{
	struct item *it = arg;
	const struct item_hdr *h;

	it->get_done_ns = now_ns();
	it->get_res = cqe->res;
	demo.gets_done++;
	if (cqe->res < 0) {
		demo.get_failures++;
		fprintf(stderr, "demo: GET item-%" PRIu64 ": %s\n", cqe->user_data,
			ferry_strerror(cqe->res));
		return;
	}
	h = ferry_buf_data(cqe->buf);
	it->ok = cqe->len == it->size && ferry_buf_len(cqe->buf) == it->size &&
		 h->magic == HDR_MAGIC && h->index == cqe->user_data && h->len == it->size &&
		 h->sum == fnv1a((const unsigned char *)(h + 1), it->size - sizeof(*h));
	if (!it->ok) {
		demo.bad_sums++;
		fprintf(stderr, "demo: item-%" PRIu64 " arrived damaged (%" PRIu64 " bytes)\n",
			cqe->user_data, cqe->len);
	}
	ferry_buf_release(cqe->buf); /* zero copy: the buffer is ours to release */
}

static int post_get(struct ferry_sq *sq, struct ferry_peer *from, int i)
{
	struct ferry_cqe cqes[16];
	struct ferry_sqe *sqe;
	char key[32];

	while (!(sqe = ferry_sq_get_sqe(sq)))
		ferry_cq_wait(ferry_cq_default(demo.cons), cqes, 16, 1000000);
	snprintf(key, sizeof(key), "item-%d", i);
	ferry_prep_get(sqe, from, key, NULL, 0, (uint64_t)i); /* no iovec: zero copy */
	ferry_sqe_set_callback(sqe, on_get, &demo.items[i]);
	ferry_sqe_set_timeout(sqe, DEADLINE_NS);
	demo.items[i].get_submit_ns = now_ns();
	return 0;
}

/* ------------------------------------------------------------------ */
/* Report                                                              */
/* ------------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, int n, int p)
{
	int i = (p * (n - 1) + 50) / 100;

	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	return v[i];
}

static void fmt_bytes(char *out, size_t len, uint64_t b)
{
	if (b >= (1u << 20))
		snprintf(out, len, "%.1f MiB", (double)b / (1 << 20));
	else
		snprintf(out, len, "%.1f KiB", (double)b / (1 << 10));
}

/*
 * One row: latency of an item is PUT submit -> GET completion when the GET
 * waited, GET submit -> GET completion when the data was already there.
 * MB/s is the row's bytes over the sum of its latencies (items one after
 * the other); the "all" row gives bytes over the wall time of the run.
 */
static void row(const char *label, int which, uint64_t wall_ns)
{
	uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)demo.n), bytes = 0, sum = 0;
	char b[32];
	int n = 0;

	for (int i = 0; i < demo.n; i++) {
		struct item *it = &demo.items[i];
		uint64_t from;

		if (it->get_res < 0 || !it->get_done_ns || (which == 0 && !it->waited) ||
		    (which == 1 && it->waited))
			continue;
		from = it->waited ? atomic_load(&it->put_submit_ns) : it->get_submit_ns;
		lat[n] = it->get_done_ns > from ? it->get_done_ns - from : 0;
		sum += lat[n];
		bytes += it->size;
		n++;
	}
	fmt_bytes(b, sizeof(b), bytes);
	if (n == 0) {
		printf("  %-26s %5d %11s %9s %10s %10s\n", label, 0, "-", "-", "-", "-");
	} else {
		double mbs = (double)bytes / 1e6 / ((double)(which == 2 ? wall_ns : sum) / 1e9);

		printf("  %-26s %5d %11s %9.0f %10.1f %10.1f\n", label, n, b, mbs,
		       (double)pct(lat, n, 50) / 1e3, (double)pct(lat, n, 99) / 1e3);
	}
	free(lat);
}

static void print_health(struct ferry_engine *e)
{
	int len = ferry_engine_health(e, NULL, 0);
	char *buf;

	if (len < 0 || !(buf = malloc((size_t)len + 1)))
		return;
	ferry_engine_health(e, buf, (size_t)len + 1);
	printf("consumer health: %s\n", buf);
	free(buf);
}

static struct ferry_engine *make_engine(const char *name, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.ns = "demo";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = pool;
	rc = ferry_engine_create(&p, &e);
	if (rc < 0)
		fprintf(stderr, "demo: engine %s: %s\n", name, ferry_strerror(rc));
	return e;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: demo [--items N] [--help]\n"
		   "  --items N  items to move, 1..100000 (default 64); sizes 4 KiB .. 4 MiB\n"
		   "An in-process producer engine puts N checksummed items, a consumer engine\n"
		   "gets them (some GETs before their PUT); prints what moved and the\n"
		   "consumer's health JSON. Exit status 1 if any item failed or was damaged.\n");
}

int main(int argc, char **argv)
{
	struct ferry_cqe cqes[16];
	struct ferry_peer *from;
	struct ferry_sq *sq;
	pthread_t thr;
	int early, rc, waited = 0, zc = 0, ok = 0;
	uint64_t wall, total = 0;
	char b[32];

	demo.n = 64;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--items") && i + 1 < argc) {
			char *end;
			long v = strtol(argv[++i], &end, 10);

			if (*end || v < 1 || v > 100000) {
				fprintf(stderr, "demo: --items takes 1..100000\n");
				return 2;
			}
			demo.n = (int)v;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	demo.items = calloc((size_t)demo.n, sizeof(*demo.items));
	if (!demo.items)
		return 1;
	for (int i = 0; i < demo.n; i++) {
		demo.items[i].size = item_size(i, demo.n);
		demo.items[i].copy_path = i % 4 == 3;
		atomic_init(&demo.items[i].put_res, 1);
		total += demo.items[i].size;
	}
	fmt_bytes(b, sizeof(b), total);
	printf("ferry demo: producer -> consumer in one process, THREAD mode, %d items "
	       "(4 KiB .. 4 MiB, %s)\n", demo.n, b);

	/* The producer's pool holds what is in flight; 64 MiB makes it wait at times. */
	demo.prod = make_engine("producer", 64u << 20);
	demo.cons = make_engine("consumer", 4u << 20);
	if (!demo.prod || !demo.cons)
		return 1;
	if ((rc = ferry_peer_open(demo.cons, "producer", &from)) < 0 ||
	    (rc = ferry_sq_get(demo.cons, &sq)) < 0) {
		fprintf(stderr, "demo: consumer setup: %s\n", ferry_strerror(rc));
		return 1;
	}

	/* A quarter of the GETs go first: they wait for data not yet put. */
	early = demo.n / 4 > 0 ? demo.n / 4 : 1;
	for (int i = 0; i < early; i++) {
		post_get(sq, from, i);
		demo.items[i].waited = true;
	}
	ferry_sq_submit(sq);
	printf("consumer: %d GETs posted before any PUT; they wait for their data\n", early);

	demo.t_start = now_ns();
	if ((rc = pthread_create(&thr, NULL, producer_main, NULL)) != 0) {
		fprintf(stderr, "demo: producer thread: %s\n", strerror(rc));
		return 1;
	}
	/* The rest: GET each item once its PUT completed (the data waits). */
	for (int i = early; i < demo.n; i++) {
		struct item *it = &demo.items[i];

		/* Meanwhile, completions of earlier GETs run their callbacks. */
		while (atomic_load_explicit(&it->put_res, memory_order_acquire) == 1)
			ferry_cq_wait(ferry_cq_default(demo.cons), cqes, 16, 100000);
		if (atomic_load(&it->put_res) < 0) {
			it->get_res = atomic_load(&it->put_res);
			demo.gets_done++;
			demo.get_failures++;
			continue;
		}
		post_get(sq, from, i);
		ferry_sq_submit(sq);
	}
	while (demo.gets_done < demo.n)
		if (ferry_cq_wait(ferry_cq_default(demo.cons), cqes, 16, DEADLINE_NS) == -ETIMEDOUT)
			break;
	wall = now_ns() - demo.t_start;
	pthread_join(thr, NULL);

	for (int i = 0; i < demo.n; i++) {
		waited += demo.items[i].waited;
		zc += !demo.items[i].copy_path;
		ok += demo.items[i].ok;
	}
	printf("\n  %-26s %5s %11s %9s %10s %10s\n", "GET", "items", "bytes", "MB/s",
	       "p50 us", "p99 us");
	row("posted before its PUT", 0, wall);
	row("posted after its PUT", 1, wall);
	row("all", 2, wall);
	printf("\n  latency: PUT submit -> GET done if the GET waited, GET submit -> done "
	       "otherwise;\n  MB/s: bytes / sum of latencies per row, bytes / wall time "
	       "(%.1f ms) for all\n", (double)wall / 1e6);
	printf("  PUTs: %d zero-copy (pool buffers), %d copy (iovec); GETs: all zero-copy\n",
	       zc, demo.n - zc);
	printf("  checksums: %d/%d ok, %d damaged, %d PUT and %d GET failures\n\n", ok, demo.n,
	       demo.bad_sums, demo.put_failures, demo.get_failures);
	print_health(demo.cons);

	ferry_engine_destroy(demo.cons);
	ferry_engine_destroy(demo.prod);
	free(demo.items);
	return ok == demo.n ? 0 : 1;
}

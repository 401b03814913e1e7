/*
 * bench/bench_rdma.c - ferry's rdma transport between two engines, and the
 * same over tcp, in one run: 64 B latency and bandwidth at 64 KiB, 4 MiB
 * and 190 MB (the Bagel KV handoff; --quick leaves it out).
 *
 * Needs an RDMA device on each of two addresses: --ip0 A --ip1 B (default
 * $RDMA_IP0 / $RDMA_IP1, which ferry's RDMA test guest sets: tests/rdma-vm);
 * engine "rx" listens on A, "tx" on B, so every PUT crosses from B's device
 * to A's. Both engines are in this process, each with its reactor thread
 * (THREAD mode), holding one cluster secret. bench/rdma_guest.sh runs it in
 * the guest beside perftest (ib_read_bw, ib_write_bw, ib_send_lat) and
 * prints the ratios; bench/rdma_hosts.sh does the same on real NICs.
 *
 *   latency    one-way = RTT / 2: tx PUTs p_i, rx's waiting GET takes it,
 *              rx PUTs r_i back, tx's waiting GET takes it; p50 and p99
 *   bandwidth  tx PUTs pool buffers (announced: rx pulls them by RDMA READ),
 *              a window of --window in flight; rx GETs each zero copy and
 *              releases it; GB/s from the first submit to the last GET
 *
 * Prints ONE JSON object on stdout; progress on stderr. Emulated figures
 * (Soft-RoCE under TCG) say nothing about hardware: only ratios taken in
 * the same run mean something.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define SECRET "bench-rdma-secret"
#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_rdma: %s: %s\n", what, ferry_strerror(rc));
	exit(1);
}

static uint64_t spin_ns; /* --spin-ns: the engines' spin (0: ferry's default) */

static struct ferry_engine *mk(const char *name, const char *transport, const char *ip,
			       size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;
	char listen[96];
	int rc;

	snprintf(listen, sizeof(listen), "%s://%s:0", transport, ip);
	p.name = name;
	p.ns = "bench-rdma";
	p.pool_size = pool;
	p.secret = SECRET;
	p.max_ops = 4096;
	p.spin_ns = spin_ns;
	if (!strcmp(transport, "rdma"))
		p.rdma_listen = listen;
	else
		p.listen = listen;
	if ((rc = ferry_engine_create(&p, &e)))
		die(name, rc);
	return e;
}

static struct ferry_peer *peer(struct ferry_engine *e, const char *name, struct ferry_engine *at,
			       const char *scheme)
{
	char all[512], uri[256], want[16];
	const char *s;
	struct ferry_peer *p;
	int rc;

	if ((rc = ferry_peer_open(e, name, &p)))
		die("ferry_peer_open", rc);
	if (!at)
		return p;
	ferry_engine_addresses(at, all, sizeof(all));
	snprintf(want, sizeof(want), "%s://", scheme);
	s = strstr(all, want);
	if (!s)
		die("no address of that scheme", -ENOTCONN);
	snprintf(uri, sizeof(uri), "%.*s", (int)strcspn(s, " "), s);
	if ((rc = ferry_peer_connect_uri(p, uri)))
		die("ferry_peer_connect_uri", rc);
	return p;
}

static struct ferry_sqe *sqe_of(struct ferry_engine *e)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;

	if (ferry_sq_get(e, &sq))
		die("ferry_sq_get", -EIO);
	while (!(sqe = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq);
		usleep(10);
	}
	return sqe;
}

static void submit(struct ferry_engine *e)
{
	struct ferry_sq *sq;

	ferry_sq_get(e, &sq);
	ferry_sq_submit(sq);
}

static struct ferry_cqe wait1(struct ferry_engine *e)
{
	struct ferry_cqe c;

	for (int i = 0; i < 60000; i++)
		if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 1000000) == 1) {
			if (c.res < 0)
				die("an op failed", c.res);
			return c;
		}
	die("no completion in 60 s", -ETIMEDOUT);
	return c;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void latency(struct ferry_engine *tx, struct ferry_engine *rx, struct ferry_peer *t2r,
		    struct ferry_peer *r2t, struct ferry_peer *t_from_r, struct ferry_peer *r_from_t,
		    unsigned n, double *p50, double *p99)
{
	static char ping[64], pong[64], in_r[64], in_t[64];
	uint64_t *s = calloc(n, sizeof(*s));
	char key[32];

	for (unsigned i = 0; i < n + 10; i++) {
		struct iovec ir = { in_r, sizeof(in_r) }, it = { in_t, sizeof(in_t) };
		struct iovec op = { ping, sizeof(ping) }, oq = { pong, sizeof(pong) };
		uint64_t t0;

		snprintf(key, sizeof(key), "p%u", i);
		ferry_prep_get(sqe_of(rx), r_from_t, key, &ir, 1, 1);
		submit(rx);
		snprintf(key, sizeof(key), "r%u", i);
		ferry_prep_get(sqe_of(tx), t_from_r, key, &it, 1, 2);
		submit(tx);
		usleep(200); /* both GETs wait before the clock starts */
		t0 = now_ns();
		snprintf(key, sizeof(key), "p%u", i);
		ferry_prep_put(sqe_of(tx), t2r, key, &op, 1, 3);
		submit(tx);
		wait1(rx); /* the ping arrived */
		snprintf(key, sizeof(key), "r%u", i);
		ferry_prep_put(sqe_of(rx), r2t, key, &oq, 1, 4);
		submit(rx);
		for (int got = 0; got < 2; got++)
			wait1(tx); /* the pong arrived, and the ping's PUT is done */
		if (i >= 10)
			s[i - 10] = (now_ns() - t0) / 2;
		wait1(rx); /* the pong's PUT is done */
	}
	qsort(s, n, sizeof(*s), cmp_u64);
	*p50 = (double)s[n / 2] / 1000.0;
	*p99 = (double)s[n * 99 / 100] / 1000.0;
	free(s);
}

static double bandwidth(struct ferry_engine *tx, struct ferry_engine *rx, struct ferry_peer *t2r,
			struct ferry_peer *r_from_t, size_t size, unsigned count, unsigned window)
{
	uint64_t t0 = now_ns();
	unsigned sent = 0, done = 0, got = 0;
	char key[32];

	for (unsigned i = 0; i < count; i++) {
		snprintf(key, sizeof(key), "b%zu_%u", size, i);
		ferry_prep_get(sqe_of(rx), r_from_t, key, NULL, 0, 100 + i);
	}
	submit(rx);
	while (got < count) {
		struct ferry_cqe c;

		while (sent < count && sent - done < window) {
			struct ferry_buf *b;
			int rc;

			while ((rc = ferry_buf_alloc(tx, size, &b)) == -ENOMEM) {
				if (ferry_cq_wait(ferry_cq_default(tx), &c, 1, 1000000) == 1) {
					if (c.res < 0)
						die("PUT", c.res);
					done++;
				}
			}
			if (rc)
				die("ferry_buf_alloc", rc);
			memset(ferry_buf_data(b), (int)sent, size < 4096 ? size : 4096);
			snprintf(key, sizeof(key), "b%zu_%u", size, sent);
			ferry_prep_put_buf(sqe_of(tx), t2r, key, b, 1);
			submit(tx);
			sent++;
		}
		while (ferry_cq_poll(ferry_cq_default(tx), &c, 1) == 1) {
			if (c.res < 0)
				die("PUT", c.res);
			done++;
		}
		if (ferry_cq_wait(ferry_cq_default(rx), &c, 1, 200000) == 1) {
			if (c.res < 0)
				die("GET", c.res);
			ferry_buf_release(c.buf);
			got++;
		}
	}
	while (done < count) {
		wait1(tx);
		done++;
	}
	return (double)size * count / ((double)(now_ns() - t0));
}

int main(int argc, char **argv)
{
	const char *ip0 = getenv("RDMA_IP0"), *ip1 = getenv("RDMA_IP1");
	const char *transports[] = { "rdma", "tcp" };
	bool quick = false;
	unsigned lat_n = 200;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--ip0") && i + 1 < argc)
			ip0 = argv[++i];
		else if (!strcmp(argv[i], "--ip1") && i + 1 < argc)
			ip1 = argv[++i];
		else if (!strcmp(argv[i], "--spin-ns") && i + 1 < argc)
			spin_ns = strtoull(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: bench_rdma [--quick] [--ip0 A --ip1 B] [--spin-ns N]\n");
			return 2;
		}
	}
	if (!ip0 || !ip1 || !(ferry_features() & FERRY_FEATURE_RDMA)) {
		fprintf(stderr, "bench_rdma: needs the rdma transport and two RDMA addresses "
				"(--ip0/--ip1, or RDMA_IP0/RDMA_IP1 in tests/rdma-vm's guest)\n");
		printf("{\"skipped\":\"no RDMA here\"}\n");
		return 0;
	}
	if (quick)
		lat_n = 20;
	printf("{\"bench\":\"rdma\",\"quick\":%s,\"spin_ns\":%llu", quick ? "true" : "false",
	       (unsigned long long)spin_ns);
	for (unsigned t = 0; t < 2; t++) {
		size_t pool = quick ? 64 * MIB : 512 * MIB;
		struct ferry_engine *rx = mk("rx", transports[t], ip0, pool);
		struct ferry_engine *tx = mk("tx", transports[t], ip1, pool);
		struct ferry_peer *t2r = peer(tx, "rx", rx, transports[t]);
		struct ferry_peer *r2t = peer(rx, "tx", tx, transports[t]);
		struct ferry_peer *t_from_r = t2r, *r_from_t = r2t;
		double p50, p99;
		static const size_t sizes[] = { 64 * KIB, 4 * MIB, 190 * MIB };

		fprintf(stderr, "bench_rdma: %s latency\n", transports[t]);
		latency(tx, rx, t2r, r2t, t_from_r, r_from_t, lat_n, &p50, &p99);
		printf(",\"%s\":{\"latency_64B_us\":{\"p50\":%.2f,\"p99\":%.2f}", transports[t], p50,
		       p99);
		for (unsigned s = 0; s < 3; s++) {
			unsigned count = sizes[s] <= 64 * KIB ? (quick ? 64 : 1024)
							      : sizes[s] <= 4 * MIB ? (quick ? 8 : 64) : 2;
			double gbps;

			if (quick && sizes[s] > 4 * MIB)
				continue;
			fprintf(stderr, "bench_rdma: %s %zu B x %u\n", transports[t], sizes[s], count);
			gbps = bandwidth(tx, rx, t2r, r_from_t, sizes[s], count, 8);
			printf(",\"bw_%zu_GBps\":%.4f", sizes[s], gbps);
		}
		printf("}");
		ferry_engine_destroy(tx);
		ferry_engine_destroy(rx);
	}
	printf("}\n");
	return 0;
}

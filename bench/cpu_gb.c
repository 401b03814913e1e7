/*
 * bench/cpu_gb.c - the CPU cost of bandwidth: user + system CPU seconds
 * per GB moved by ferry over tcp (or shm), both ends counted (getrusage of
 * each process: its reactor thread included), for bench/cpu_gb.sh, which
 * runs iperf3 beside it the same way. NOT a test: a benchmark for a quiet
 * machine (docs/benchmarks.md, "CPU per GB").
 *
 *   cpu_gb tcp|shm SIZE COUNT
 *
 * Two processes (this one, "a", and a child, "b"), THREAD mode, each
 * waiting in ferry_cq_wait: a PUTs COUNT pool buffers of SIZE bytes zero
 * copy (4 in flight), b GETs each zero copy and releases it; the clock and
 * the CPU count start after the first (it made the connection). Prints one
 * JSON object: bytes timed, wall seconds, GB/s, each end's CPU seconds and
 * the CPU seconds per GB (10^9 bytes) of both together. With no argument it moves a
 * few small buffers and prints {} (./run bench runs every program here).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_base.h"
#include "ferry.h"

#define WINDOW 4u
#define UD_PUT (1ull << 62)

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage u;

	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
	       (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static struct ferry_cqe wait_one(struct ferry_engine *e)
{
	struct ferry_cqe c;
	int n;

	while ((n = ferry_cq_wait(ferry_cq_default(e), &c, 1, 30ll * 1000000000)) == 0)
		;
	if (n < 0)
		die("ferry_cq_wait", n);
	if (c.res < 0)
		die(c.user_data & UD_PUT ? "a PUT" : "a GET", c.res);
	return c;
}

static void side(bool is_a, bool tcp, uint64_t size, unsigned count, int rfd, int wfd, bool print)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;
	struct ferry_peer *peer;
	struct ferry_sq *sq;
	char addr[256] = "", key[32];
	double t0, c0, wall, cpu;
	unsigned posted = 0, done = 0;

	p.name = is_a ? "cpugb.a" : "cpugb.b";
	p.ns = "cpu-gb";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = (size_t)size * (WINDOW * 2 + 2) + (64u << 20);
	p.listen = tcp ? "tcp://127.0.0.1:0" : NULL;
	CHECK(ferry_engine_create(&p, &e));
	CHECK(ferry_peer_open(e, is_a ? "cpugb.b" : "cpugb.a", &peer));
	CHECK(ferry_sq_get(e, &sq));
	if (tcp && ferry_engine_address(e, addr, sizeof(addr)) < 0)
		die("ferry_engine_address", -ENOTCONN);
	write_all(wfd, addr, sizeof(addr));
	read_all(rfd, addr, sizeof(addr));
	if (tcp)
		CHECK(ferry_peer_set_address(peer, addr));
	t0 = now_s();
	c0 = cpu_s();
	if (is_a) {
		while (done < count) {
			while (posted < count && posted - done < WINDOW) {
				struct ferry_buf *b;
				struct ferry_sqe *s;

				CHECK(ferry_buf_alloc(e, size, &b));
				memset(ferry_buf_data(b), (int)posted, 64); /* the rest as it is */
				snprintf(key, sizeof(key), "d%u", posted);
				ferry_prep_put_buf(s = next_sqe(sq), peer, key, b, UD_PUT | posted);
				if (!posted) {
					ferry_sqe_set_flags(s, FERRY_SQE_WAIT_PEER);
					ferry_sqe_set_timeout(s, 60ull * 1000000000);
				}
				ferry_sq_submit(sq);
				posted++;
			}
			wait_one(e);
			if (++done == 1) { /* the first one made the connection: not timed */
				t0 = now_s();
				c0 = cpu_s();
			}
		}
	} else {
		while (done < count) {
			struct ferry_cqe c;

			while (posted < count && posted - done < WINDOW) {
				snprintf(key, sizeof(key), "d%u", posted);
				ferry_prep_get(next_sqe(sq), peer, key, NULL, 0, posted);
				ferry_sq_submit(sq);
				posted++;
			}
			c = wait_one(e);
			if (c.len != size)
				die("GET length", -EMSGSIZE);
			CHECK(ferry_buf_release(c.buf));
			if (++done == 1) {
				t0 = now_s();
				c0 = cpu_s();
			}
		}
	}
	wall = now_s() - t0;
	cpu = cpu_s() - c0;
	if (is_a) {
		double other[2], gb = (double)size * (count - 1) / 1e9;

		read_all(rfd, other, sizeof(other));
		if (other[0] > wall)
			wall = other[0]; /* b's last GET ends the transfer */
		if (print)
			printf("{\"transport\":\"%s\",\"size\":%llu,\"count\":%u,\"bytes\":%.0f,"
		       "\"wall_s\":%.4f,\"gbps\":%.3f,\"cpu_s_sender\":%.4f,\"cpu_s_receiver\":%.4f,"
		       "\"cpu_s_per_gb\":%.4f}\n",
		       tcp ? "tcp" : "shm", (unsigned long long)size, count, gb * 1e9, wall,
		       gb / wall, cpu, other[1], (cpu + other[1]) / gb);
	} else {
		double mine[2] = { wall, cpu };

		write_all(wfd, mine, sizeof(mine));
	}
	ferry_engine_destroy(e);
}

int main(int argc, char **argv)
{
	const char *how = argc > 1 ? argv[1] : NULL;
	uint64_t size = argc > 2 ? strtoull(argv[2], NULL, 10) : 4096;
	unsigned count = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 8;
	int rfd, wfd, st;
	bool tcp;
	pid_t pid;

	who = "cpu_gb";
	alarm(600);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	if (how && strcmp(how, "tcp") && strcmp(how, "shm")) {
		fprintf(stderr, "usage: cpu_gb [tcp|shm SIZE COUNT]\n");
		return 2;
	}
	tcp = how && !strcmp(how, "tcp");
	if (!size || count < 2)
		die("SIZE and COUNT", -EINVAL);
	pid = fork_pair(&rfd, &wfd);
	if (pid == 0) {
		side(false, tcp, size, count, rfd, wfd, false);
		_exit(0);
	}
	/* No argument (./run bench): a short check over shm, its figures not printed. */
	side(true, tcp, size, count, rfd, wfd, how != NULL);
	st = child_status(pid);
	if (!how)
		printf("{}\n");
	return st;
}

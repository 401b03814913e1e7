/*
 * bench/bench_send_zc.c - does io_uring's zero-copy send (SEND_ZC) win over
 * a plain send on this machine's TCP paths? The question behind the tcp
 * transport's choice of plain sends (docs/design.md section 12).
 *
 * A sender (CPU 0) streams 4 MiB messages over one TCP connection on
 * loopback to a receiver (CPU 1) that drains it with busy non-blocking
 * recv() into one buffer, as the transport does. The sender keeps one send
 * in flight (the stream's order), through io_uring, three ways:
 *   send       IORING_OP_SEND (the kernel copies the buffer into the socket)
 *   zc         IORING_OP_SEND_ZC (pins the pages; a notification says when
 *              the buffer is free again, and whether the kernel copied it)
 *   zc_fixed   SEND_ZC from a registered buffer (IORING_RECVSEND_FIXED_BUF)
 * Both sockets get 4 MiB buffers and TCP_NODELAY, like the transport's.
 * The modes alternate, --reps times (default 5); medians [min-max] of GB/s
 * (10^9 B/s) and the fraction of zero-copy notifications that reported a
 * copy (IORING_SEND_ZC_REPORT_USAGE), as ONE JSON object on stdout.
 *
 * Options: --reps N, --msgs N (messages per run, default 400), --quick.
 */
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define MSG_BYTES ((size_t)4 << 20)
#define SOCKBUF (4 << 20)
#define NBUF 4
#define MAX_REPS 16

/* liburing 2.3 lacks these names; the values are the kernel's ABI. */
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

enum { M_SEND, M_ZC, M_ZC_FIXED, M__N };
static const char *const mode_name[M__N] = { "send", "zc", "zc_fixed" };

static void pin_cpu(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	sched_setaffinity(0, sizeof(s), &s);
}

static void sock_opts(int fd)
{
	int one = 1, big = SOCKBUF;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
}

/* The receiver: drain `total` bytes with busy non-blocking recv, then ack. */
static int receiver(int lfd, size_t total)
{
	char *buf = malloc(MSG_BYTES);
	size_t got = 0;
	int fd;

	pin_cpu(1);
	fd = accept(lfd, NULL, NULL);
	if (fd < 0 || !buf)
		return 1;
	sock_opts(fd);
	while (got < total) {
		ssize_t n = recv(fd, buf, MSG_BYTES, MSG_DONTWAIT);

		if (n > 0)
			got += (size_t)n;
		else if (n == 0 || (errno != EAGAIN && errno != EINTR))
			return 2;
	}
	if (send(fd, "k", 1, 0) != 1)
		return 3;
	close(fd);
	free(buf);
	return 0;
}

/* One run: msgs x 4 MiB in mode; returns GB/s, counts notifications. */
static double run_once(int mode, unsigned msgs, unsigned *notifs, unsigned *copied)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	size_t total = (size_t)msgs * MSG_BYTES, sent = 0;
	struct iovec iov[NBUF];
	struct io_uring ring;
	int lfd, fd, rc, st = 0;
	int busy[NBUF] = { 0 };
	bool sending = false;
	unsigned queued = 0;
	uint64_t t0;
	pid_t pid;
	char k;

	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 1) ||
	    getsockname(lfd, (struct sockaddr *)&a, &alen))
		die("listen", -errno);
	pid = fork();
	if (pid == 0)
		_exit(receiver(lfd, total));
	close(lfd);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	sock_opts(fd);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect", -errno);
	if ((rc = io_uring_queue_init(64, &ring, 0)))
		die("io_uring_queue_init", rc);
	for (int i = 0; i < NBUF; i++) {
		iov[i].iov_base = aligned_alloc(4096, MSG_BYTES);
		iov[i].iov_len = MSG_BYTES;
		if (!iov[i].iov_base)
			die("aligned_alloc", -ENOMEM);
		memset(iov[i].iov_base, 0x5a + i, MSG_BYTES);
	}
	if (mode == M_ZC_FIXED && (rc = io_uring_register_buffers(&ring, iov, NBUF)))
		die("io_uring_register_buffers", rc);
	t0 = now_ns();
	while (sent < total) {
		struct io_uring_cqe *cqe;

		/* One send in flight: a free buffer (its last notification came). */
		for (int i = 0; i < NBUF && !sending && queued < msgs; i++) {
			struct io_uring_sqe *sqe;

			if (busy[i])
				continue;
			sqe = io_uring_get_sqe(&ring);
			if (mode == M_SEND)
				io_uring_prep_send(sqe, fd, iov[i].iov_base, MSG_BYTES, MSG_WAITALL);
			else if (mode == M_ZC)
				io_uring_prep_send_zc(sqe, fd, iov[i].iov_base, MSG_BYTES, MSG_WAITALL,
						      IORING_SEND_ZC_REPORT_USAGE);
			else
				io_uring_prep_send_zc_fixed(sqe, fd, iov[i].iov_base, MSG_BYTES,
							    MSG_WAITALL, IORING_SEND_ZC_REPORT_USAGE,
							    (unsigned)i);
			io_uring_sqe_set_data64(sqe, (uint64_t)i);
			busy[i] = 1;
			sending = true;
			queued++;
		}
		if ((rc = io_uring_submit_and_wait(&ring, 1)) < 0)
			die("io_uring_submit_and_wait", rc);
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			int i = (int)cqe->user_data;

			if (cqe->flags & IORING_CQE_F_NOTIF) {
				(*notifs)++;
				if ((uint32_t)cqe->res & IORING_NOTIF_USAGE_ZC_COPIED)
					(*copied)++;
				busy[i] = 0;
			} else {
				if (cqe->res < 0)
					die("send", cqe->res);
				sent += (size_t)cqe->res;
				sending = false;
				if ((size_t)cqe->res < MSG_BYTES)
					die("short send", -EIO);
				if (!(cqe->flags & IORING_CQE_F_MORE))
					busy[i] = 0;
			}
			io_uring_cqe_seen(&ring, cqe);
		}
	}
	if (recv(fd, &k, 1, 0) != 1)
		die("ack", -EIO);
	t0 = now_ns() - t0;
	/* Notifications still due (the last sends). */
	for (int i = 0; i < NBUF; i++)
		while (busy[i]) {
			struct io_uring_cqe *cqe;

			if (io_uring_wait_cqe(&ring, &cqe))
				break;
			if (cqe->flags & IORING_CQE_F_NOTIF) {
				(*notifs)++;
				if ((uint32_t)cqe->res & IORING_NOTIF_USAGE_ZC_COPIED)
					(*copied)++;
				busy[(int)cqe->user_data] = 0;
			}
			io_uring_cqe_seen(&ring, cqe);
		}
	io_uring_queue_exit(&ring);
	close(fd);
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("receiver", -EIO);
	for (int i = 0; i < NBUF; i++)
		free(iov[i].iov_base);
	return (double)total / (double)t0;
}

int main(int argc, char **argv)
{
	double gbps[M__N][MAX_REPS];
	unsigned notifs[M__N] = { 0 }, copied[M__N] = { 0 };
	unsigned msgs = 400;
	bool quick = false;
	int reps = 5;
	time_t started = time(NULL);
	double load0 = loadavg1();
	char cpu[128];

	who = "bench_send_zc";
	(void)pct;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--msgs") && i + 1 < argc)
			msgs = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--quick"))
			reps = 3, msgs = 100, quick = true;
		else {
			fprintf(stderr, "usage: %s [--reps N] [--msgs N] [--quick]\n", argv[0]);
			return 2;
		}
	}
	if (reps < 1 || reps > MAX_REPS)
		reps = 5;
	if (msgs < 1)
		msgs = 400;
	signal(SIGPIPE, SIG_IGN);
	pin_cpu(0);
	for (int r = 0; r < reps; r++)
		for (int m = 0; m < M__N; m++) {
			gbps[m][r] = run_once(m, msgs, &notifs[m], &copied[m]);
			progress("rep %d %-8s %.3f GB/s", r, mode_name[m], gbps[m][r]);
		}
	read_cpu_model(cpu, sizeof(cpu));
	jheader("bench_send_zc", started, load0, (double)sysconf(_SC_NPROCESSORS_ONLN), cpu);
	jnum("reps", reps);
	jnum("msgs", msgs);
	jbool("quick", quick);
	jstr("path", "TCP loopback, one connection, 4 MiB messages, sender CPU 0 (io_uring, one "
		     "send in flight), receiver CPU 1 (busy recv)");
	jopen("GBps");
	for (int m = 0; m < M__N; m++)
		jstat(mode_name[m], stat_of(gbps[m], reps), 3);
	jclose();
	jopen("zc_notifications_copied");
	for (int m = M_ZC; m < M__N; m++)
		jfix(mode_name[m], notifs[m] ? (double)copied[m] / notifs[m] : -1, 3);
	jclose();
	jclose();
	printf("%s\n", js.p);
	return 0;
}

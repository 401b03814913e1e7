/*
 * bench/bench_base.h - the few helpers every ferry benchmark program uses,
 * JSON or not: dying on an error with the benchmark's name, CHECK, an SQE
 * or death, the cheap decimal keys of the timed and counted loops, and
 * a benchmark's second process with two pipes to it, whole reads and writes
 * on those pipes, the child's exit status, and engine flags by name.
 * bench_util.h (statistics, the JSON writer) includes it; a program that
 * needs no more (count_hop, cpu_gb) includes this alone.
 *
 * Header-only on purpose: every benchmark source is its own program. A
 * benchmark sets `who` (its name, shown on stderr) before it prints
 * anything. Every function is static inline, so a program pays for (and is
 * warned about) none it does not use.
 */
#ifndef FERRY_BENCH_BASE_H
#define FERRY_BENCH_BASE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry.h"

static const char *who = "bench";

/*
 * Engine flags by name, "busy_poll,single_poller" (either, both, or ""),
 * ORed into *flags as FERRY_ENGINE_* bits; -1 for a name it does not know.
 */
static inline int parse_engine_flags(const char *list, uint32_t *flags)
{
	char buf[128], *save = NULL;

	if (strlen(list) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", list);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (!strcmp(t, "busy_poll"))
			*flags |= FERRY_ENGINE_BUSY_POLL;
		else if (!strcmp(t, "single_poller"))
			*flags |= FERRY_ENGINE_SINGLE_POLLER;
		else
			return -1;
	}
	return 0;
}

static inline void die(const char *what, int rc) __attribute__((noreturn));
static inline void die(const char *what, int rc)
{
	fprintf(stderr, "%s: %s: %s (%s)\n", who, what, ferry_strerror(rc), ferry_err_name(rc));
	exit(1);
}

#define CHECK(call)                                  \
	do {                                         \
		int rc_ = (call);                    \
		if (rc_ < 0)                         \
			die(#call, rc_);             \
	} while (0)

/* The next SQE of sq; a full ring is the benchmark's bug: die. */
static inline struct ferry_sqe *next_sqe(struct ferry_sq *sq)
{
	struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

	if (!sqe)
		die("ferry_sq_get_sqe: ring full", -EAGAIN);
	return sqe;
}

/*
 * The key "<prefix><n>" in decimal, into out (at least 22 bytes). The timed
 * loops name their keys with this rather than snprintf, which cost ~0.25 us
 * per key on the test machine (two keys per hop: more than half of what the
 * transport itself spends between reading a frame and sending the answer,
 * docs/benchmarks.md): the harness's time, not the transport's.
 */
static inline void key_of(char *out, char prefix, uint64_t n)
{
	char digits[24];
	unsigned len = 0;

	do {
		digits[len++] = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	*out++ = prefix;
	while (len)
		*out++ = digits[--len];
	*out = '\0';
}

/* All n bytes to fd (a pipe between a benchmark's processes), or die. */
static inline void write_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("write (pipe)", w < 0 ? -errno : -EPIPE);
		p = (const char *)p + w;
		n -= (size_t)w;
	}
}

/* All n bytes from fd, or die (the other end closed: -EPIPE). */
static inline void read_all(int fd, void *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("read (pipe)", r < 0 ? -errno : -EPIPE);
		p = (char *)p + r;
		n -= (size_t)r;
	}
}

/*
 * A child process joined to this one by two pipes: returns the child's pid
 * here and 0 in the child; on each side *rfd and *wfd are its own ends (the
 * other side's are closed, so a side that dies is read as EOF). Dies when
 * it cannot.
 */
static inline pid_t fork_pair(int *rfd, int *wfd)
{
	int down[2], up[2]; /* parent -> child, child -> parent */
	pid_t pid;

	if (pipe(down) || pipe(up))
		die("pipe", -errno);
	pid = fork();
	if (pid < 0)
		die("fork", -errno);
	close(pid ? down[0] : down[1]);
	close(pid ? up[1] : up[0]);
	*rfd = pid ? up[0] : down[0];
	*wfd = pid ? down[1] : up[1];
	return pid;
}

/* 0 when child pid exited with 0, else 1 (waited for, EINTR retried). */
static inline int child_status(pid_t pid)
{
	int st = 0;

	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

#endif

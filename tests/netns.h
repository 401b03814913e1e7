/*
 * tests/netns.h - network namespaces for the tests that play several hosts
 * (test_tcp_netns.c, test_chaos_tcp.c): a shell command, entering a
 * namespace in a forked child, and a janitor process that removes the
 * test's namespaces when the test process goes, however it goes (a failed
 * assertion, its alarm, a SIGKILL).
 */
#ifndef FERRY_TEST_NETNS_H
#define FERRY_TEST_NETNS_H

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline int ns_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run a shell command line; its exit status. */
static inline int ns_sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* Move the calling process into network namespace ns (made with `ip netns add`). */
static inline int ns_enter(const char *ns)
{
	char path[128];
	int fd, rc;

	snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	rc = setns(fd, CLONE_NEWNET);
	close(fd);
	return rc;
}

/*
 * Start a process that runs cleanup() once the returned fd is closed: by
 * the caller when it is done, or by the kernel when the caller dies.
 * Children forked later hold a copy: they must close it (or die with the
 * caller). -1 when it cannot start.
 */
static inline int ns_janitor(void (*cleanup)(void))
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC))
		return -1;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		char c;

		close(p[1]);
		setsid(); /* not in the test's process group: a kill of it spares us */
		signal(SIGINT, SIG_IGN);
		signal(SIGTERM, SIG_IGN);
		while (read(p[0], &c, 1) < 0 && errno == EINTR)
			;
		cleanup();
		_exit(0);
	}
	close(p[0]);
	return p[1];
}

#endif

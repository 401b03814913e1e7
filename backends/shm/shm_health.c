/*
 * backends/shm/shm_health.c - asking a running engine on this host for its
 * health, through the name it listens on.
 *
 * Owns: both ends of the health request. The caller connects to
 * <runtime dir>/<ns>/<name>.sock like a peer would, sends a hello with
 * SHM_CAP_HEALTH set and no fds; the engine (accept_hello in
 * shm_handshake.c) answers with one SOCK_SEQPACKET message holding its
 * ferry_engine_health() JSON and hangs up. The same uid check as for peers applies (SO_PEERCRED), so
 * only our own user can ask. Used by `ferry health`.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "shm_sock.h"

int shm_health_answer(struct ferry_engine *e, int fd)
{
	char *text;
	int n, rc = 0;
	ssize_t r;

	n = ferry_engine_health(e, NULL, 0);
	if (n < 0)
		return n;
	if ((size_t)n + 1 > SHM_HEALTH_MAX) {
		log_warn("shm: engine %s: health of %d bytes is more than one answer holds (%u)",
			 e->name, n, SHM_HEALTH_MAX);
		n = SHM_HEALTH_MAX - 1; /* cut: the asker sees invalid JSON, not a hang */
	}
	text = malloc((size_t)n + 1);
	if (!text)
		return -ENOMEM;
	ferry_engine_health(e, text, (size_t)n + 1);
	do
		r = send(fd, text, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		rc = -errno;
		log_info("shm: engine %s: health answer not sent: %s", e->name, ferry_strerror(rc));
	}
	free(text);
	return rc;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int shm_health_query(const char *ns, const char *name, char *buf, size_t len, int timeout_ms)
{
	struct shm_hello h;
	int64_t end;
	ssize_t r;
	int fd, rc;

	if (!buf || len < 2) {
		log_error("shm: health query: no room for an answer");
		return -EINVAL;
	}
	if (timeout_ms <= 0)
		timeout_ms = SHM_CONNECT_TIMEOUT_MS;
	end = now_ms() + timeout_ms;
	fd = shm_sock_connect_timeout(ns, name, timeout_ms);
	if (fd < 0)
		return fd;
	memset(&h, 0, sizeof(h));
	snprintf(h.ns, sizeof(h.ns), "%s", ns);
	snprintf(h.name, sizeof(h.name), "ferry-health");
	h.caps = SHM_CAP_HEALTH;
	rc = shm_sock_send_hello(fd, &h, NULL, 0);
	if (rc)
		goto out;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t left = end - now_ms();

		if (left <= 0) {
			log_info("shm: health of %s/%s: no answer within %d ms", ns, name, timeout_ms);
			rc = -ETIMEDOUT;
			goto out;
		}
		rc = poll(&p, 1, (int)left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0) {
			rc = -errno;
			goto out;
		}
		if (rc > 0)
			break;
	}
	/* MSG_TRUNC: the length of the whole message even when it was cut. */
	do
		r = recv(fd, buf, len - 1, MSG_TRUNC | MSG_DONTWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		rc = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto out;
	}
	if (r == 0) {
		log_info("shm: %s/%s hung up without a health answer", ns, name);
		rc = -ECONNRESET;
		goto out;
	}
	if ((size_t)r > len - 1) {
		buf[len - 1] = '\0';
		rc = -EMSGSIZE;
		goto out;
	}
	buf[r] = '\0';
	rc = (int)r;
out:
	close(fd);
	return rc;
}

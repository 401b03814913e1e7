/*
 * tests/tcp_helpers.h - what the tcp tests share: engines with tcp
 * parameters, data patterns and checksums, children forked before any
 * engine that wait for an address on a pipe, and one-line op submission.
 * Every wait is bounded.
 */
#ifndef FERRY_TEST_TCP_HELPERS_H
#define FERRY_TEST_TCP_HELPERS_H

#include <errno.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "internal.h"
#include "netaddr.h"

#define NS "tcptest"
#define SECRET "test-cluster-secret"
#define MIB (1024ull * 1024ull)

static inline uint64_t big(uint64_t real, uint64_t small)
{
	return t_under_valgrind() ? small : real;
}

struct mk {
	const char *name;
	const char *ns;      /* NULL: NS */
	const char *listen;  /* NULL: none */
	const char *secret;  /* NULL: none */
	size_t pool;
	uint32_t heartbeat_ms, peer_timeout_ms;
	uint32_t handshake_ms; /* 0: t_handshake_ms() */
	uint32_t max_ops;
	uint32_t max_keys;
	uint32_t max_bufs;
	bool manual;         /* FERRY_PROGRESS_MANUAL: rounds run only when the test calls */
};

static inline struct ferry_engine *mk_engine(const struct mk *m)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = m->name;
	p.ns = m->ns ? m->ns : NS;
	p.pool_size = m->pool ? m->pool : 32 * MIB;
	p.listen = m->listen;
	p.secret = m->secret;
	p.heartbeat_ms = m->heartbeat_ms;
	p.peer_timeout_ms = m->peer_timeout_ms;
	p.handshake_ms = m->handshake_ms ? m->handshake_ms : t_handshake_ms();
	p.max_ops = m->max_ops;
	p.max_keys = m->max_keys;
	p.max_bufs = m->max_bufs;
	p.spin_ns = 20000;
	if (m->manual)
		p.progress = FERRY_PROGRESS_MANUAL;
	if (p.pool_size > 256 * MIB)
		p.flags = FERRY_ENGINE_NO_PREFAULT;
	rc = ferry_engine_create(&p, &e);
	if (rc) {
		fprintf(stderr, "engine %s: %s\n", m->name, ferry_strerror(rc));
		return NULL;
	}
	return e;
}

/* 64-bit words, position-dependent: catches moved, lost or stale bytes. */
static inline void fill(void *p, size_t n, uint64_t seed)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n / 8; i++) {
		uint64_t w = (seed + i) * 0x9e3779b97f4a7c15ull;

		memcpy(b + 8 * i, &w, 8); /* p may be unaligned */
	}
	for (size_t i = n / 8 * 8; i < n; i++)
		((uint8_t *)p)[i] = (uint8_t)(seed + i);
}

static inline uint64_t checksum(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n / 8; i++) {
		uint64_t w;

		memcpy(&w, b + 8 * i, 8);
		h = (h ^ w) * 1099511628211ull + i;
	}
	for (size_t i = n / 8 * 8; i < n; i++)
		h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
	return h;
}

static inline uint64_t expected_sum(size_t n, uint64_t seed)
{
	void *p = malloc(n ? n : 1);
	uint64_t h;

	assert_non_null(p);
	fill(p, n, seed);
	h = checksum(p, n);
	free(p);
	return h;
}

static inline uint64_t pool_in_use(struct ferry_engine *e)
{
	struct pool_stats ps;

	pool_get_stats(e->pool, &ps);
	return ps.blocks_in_use;
}

/* ------------------------------------------------------------------ */
/* Processes and pipes                                                 */
/* ------------------------------------------------------------------ */

/* A child forked before any engine, which waits for an address. */
struct child {
	pid_t pid;
	int fd[2]; /* parent writes the address, child reads it */
};

static inline int wait_text(int fd, char *buf, size_t len, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t n;

	if (t_poll(&p, 1, ms) != 1)
		return -1;
	n = t_read(fd, buf, len - 1);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return 0;
}

static inline void spawn(struct child *c, int (*fn)(const char *addr, void *arg), void *arg)
{
	assert_int_equal(pipe(c->fd), 0);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		char addr[NETADDR_MAX];

		alarm(t_under_valgrind() ? 900 : 100);
		close(c->fd[1]);
		if (wait_text(c->fd[0], addr, sizeof(addr), 100000))
			_exit(99);
		_exit(fn(addr, arg));
	}
	close(c->fd[0]);
}

static inline void go(struct child *c, const char *addr)
{
	if (t_write(c->fd[1], addr, strlen(addr)) != (ssize_t)strlen(addr))
		abort();
	close(c->fd[1]);
}

static inline void engine_addr(struct ferry_engine *e, char *buf, size_t len)
{
	int n = ferry_engine_address(e, buf, len);

	assert_true(n > 0 && (size_t)n < len);
}

/* Submit a PUT of a copy of [data, len) (kept alive by the caller). */
static inline void put_iov(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		    struct iovec *v, uint64_t ud, uint64_t timeout)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_put(sqe, to, key, v, 1, ud);
	if (timeout)
		ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

static inline void put_buf(struct ferry_engine *e, struct ferry_peer *to, const char *key,
		    struct ferry_buf *b, uint64_t ud, uint64_t timeout)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_put_buf(sqe, to, key, b, ud);
	if (timeout)
		ferry_sqe_set_timeout(sqe, timeout);
	t_submit(e);
}

static inline void get(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		struct iovec *v, uint64_t ud, uint64_t timeout, uint32_t flags)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_get(sqe, from, key, v, v ? 1 : 0, ud);
	if (timeout)
		ferry_sqe_set_timeout(sqe, timeout);
	if (flags)
		ferry_sqe_set_flags(sqe, flags);
	t_submit(e);
}
#endif

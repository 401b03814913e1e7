/*
 * backends/shm/shm_handshake.c - how an shm connection comes up: calling a
 * peer engine, being called, and the checks of the peer's hello.
 *
 * Owns: the handshakes, both ways, and their bounds. Handshakes never block
 * a round. Calling a peer is a non-blocking connect and our hello; the
 * connection then waits for the answer (an io_uring poll on its socket),
 * not up and not in st->live, its PUTs queued in order on the pending
 * list, and comes up (st->live, queued PUTs sent by shm.c) when the answer
 * is checked and mapped. Accepting, the caller's hello is read at once if
 * it is there, else the caller waits in a bounded table of half-open
 * slots, its socket polled. A timer on the same io_uring, armed only while
 * handshakes are under way, ends calls unanswered within SHM_HANDSHAKE_MS
 * (their PUTs fail with -EHOSTUNREACH and the peer is resolved again by its
 * next PUT), retries a connect that found a full accept queue, and hangs up
 * on callers silent for SHM_ACCEPT_HELLO_MS. A hello asking for health is
 * answered by shm_health.c.
 *
 * Per connection, the connecting side creates the memfd of the rings
 * (shm_wire.h) and sends it with its hello; both sides send their pool
 * (mapped read-only by the other), doorbell eventfd and wake page. Every
 * fd a peer hands us is checked before it is used: the doorbell must be an
 * eventfd, every memfd sealed against shrinking and as large as announced.
 * The hello message itself (its layout, receiving it with its fds) is
 * shm_sock.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "shm_int.h"
#include "shm_sock.h"
#include "shm_wire.h"

/*
 * How long a connection we start may take to be answered (the peer's hello
 * with its fds). PUTs queued on it meanwhile keep their own deadlines.
 */
#define SHM_HANDSHAKE_MS 2000
/*
 * How long an accepted caller may take to send its hello. A caller sends it
 * right after connecting, so it is normally there at once; a silent one
 * only holds a slot of the half-open table meanwhile.
 */
#define SHM_ACCEPT_HELLO_MS 250
/*
 * While handshakes are under way, a timer looks at their bounds (and tries
 * again a connect that found the peer's accept queue full) this often.
 */
#define SHM_TICK_MS 25

/* A connection's io_uring cookie (shm_int.h). */
static uint64_t conn_cookie(const struct shm_conn *c)
{
	return ((uint64_t)c->gen << 16) | (c->id + 1);
}

/* ------------------------------------------------------------------ */
/* The peer's hello: checks and mappings                               */
/* ------------------------------------------------------------------ */

/* Is fd an eventfd (the only doorbell a peer may hand us)? */
static bool is_eventfd(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return false;
	link[n] = '\0';
	return strcmp(link, "anon_inode:[eventfd]") == 0;
}

/*
 * The size of a memfd a peer handed us, which must be sealed against
 * shrinking: a region that shrank under our mapping would fault when read.
 */
static int fd_size(int fd, uint64_t *size)
{
	struct stat sb;
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		log_error("shm: a peer's memory is not sealed against shrinking: refused");
		return -EPROTO;
	}
	if (fstat(fd, &sb) < 0) {
		int rc = -errno;

		log_error("shm: fstat of a peer's memory: %s", strerror(-rc));
		return rc;
	}
	*size = (uint64_t)sb.st_size;
	return 0;
}

static void fill_hello(struct ferry_engine *e, struct shm_hello *h)
{
	memset(h, 0, sizeof(*h));
	snprintf(h->ns, sizeof(h->ns), "%s", e->ns);
	snprintf(h->name, sizeof(h->name), "%s", e->name);
	h->pool_size = pool_size(e->pool);
	h->ring_entries = SHM_PUT_ENTRIES;
	h->caps = SHM_CAP_RESULT_FREE;
	h->ring_bytes = (uint32_t)SHM_RINGS_BYTES;
}


/*
 * The peer's hello came: check it, take its fds [pool, doorbell, wake] and,
 * from a caller, [rings], and bring the connection up (st->live, its
 * socket watched for the hang-up). Closes every fd of fds; on failure c is
 * left as it was (not up), for the caller to drop.
 */
static int conn_attach(struct ferry_engine *e, struct backend *b, struct shm_conn *c,
		       const struct shm_hello *h, int *fds, unsigned nfds, bool connector)
{
	struct shm_state *st = b->data;
	uint64_t sz;
	int rc = -EPROTO;

	if (strcmp(h->ns, e->ns) != 0 || h->ring_entries != SHM_PUT_ENTRIES ||
	    h->ring_bytes != SHM_RINGS_BYTES || nfds != (connector ? 3u : 4u)) {
		log_error("shm: engine %s: hello from %s does not match (namespace %s, ring %u/%u, "
			  "%u fds)", e->name, h->name, h->ns, h->ring_entries, h->ring_bytes, nfds);
		goto out;
	}
	if (!is_eventfd(fds[1])) {
		log_error("shm: the doorbell %s sent is not an eventfd: refused", h->name);
		goto out;
	}
	c->peer_doorbell = fds[1];
	fds[1] = -1;
	c->peer_takes_result_free = (h->caps & SHM_CAP_RESULT_FREE) != 0;
	/* Every refusal below logs its line (fd_size its own): an acceptor says nothing else. */
	if (fd_size(fds[0], &sz))
		goto out;
	if (sz < h->pool_size || h->pool_size == 0) {
		log_error("shm: pool of %s: %llu bytes, announced %llu", h->name,
			  (unsigned long long)sz, (unsigned long long)h->pool_size);
		goto out;
	}
	c->peer_pool = mmap(NULL, h->pool_size, PROT_READ, MAP_SHARED, fds[0], 0);
	if (c->peer_pool == MAP_FAILED) {
		c->peer_pool = NULL;
		rc = -errno;
		log_error("shm: mapping the pool of %s: %s", h->name, strerror(-rc));
		goto out;
	}
	c->peer_pool_size = h->pool_size;
	if (fd_size(fds[2], &sz))
		goto out;
	if (sz < 4096) {
		log_error("shm: the wake page %s sent is %llu bytes, less than 4096: refused",
			  h->name, (unsigned long long)sz);
		goto out;
	}
	c->peer_wake = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
	if (c->peer_wake == MAP_FAILED) {
		c->peer_wake = NULL;
		rc = -errno;
		log_error("shm: mapping the wake page of %s: %s", h->name, strerror(-rc));
		goto out;
	}
	/*
	 * Read once. Its membarrier reaches our threads only if we registered.
	 * (A wake page is writable by every peer of its engine: one that sets
	 * heavy_sleeps falsely can make others lose their wake-ups of that
	 * engine, as it could by writing `sleeping` there: no new power.)
	 */
	c->peer_sleeps_heavy =
		atomic_load_explicit(&c->peer_wake->heavy_sleeps, memory_order_relaxed) ==
			WAKE_HEAVY_SLEEPS &&
		fence_registered();
	if (!connector) {
		void *rings;

		if (fd_size(fds[3], &sz))
			goto out;
		if (sz != SHM_RINGS_BYTES) {
			log_error("shm: the rings %s sent are %llu bytes, not %llu: refused",
				  h->name, (unsigned long long)sz,
				  (unsigned long long)SHM_RINGS_BYTES);
			goto out;
		}
		rings = mmap(NULL, SHM_RINGS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[3], 0);
		if (rings == MAP_FAILED) {
			rc = -errno;
			log_error("shm: mapping the rings of %s: %s", h->name, strerror(-rc));
			goto out;
		}
		c->rings = rings;
	}
	c->tx = &c->rings->dir[connector ? 0 : 1];
	c->rx = &c->rings->dir[connector ? 1 : 0];
	c->up = true;
	st->live[st->nlive++] = c;
	shm_arm_poll(e, b, c->sock, conn_cookie(c));
	log_debug("shm: engine %s connected to %s (%s)", e->name, c->peer_name,
		  connector ? "we called" : "it called");
	rc = 0;
out:
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Handshakes: the timer                                               */
/* ------------------------------------------------------------------ */

/* While any handshake is under way, look at the bounds every SHM_TICK_MS. */
void shm_arm_tick(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	struct io_uring_sqe *sqe;

	if (st->tick_armed || (!st->nhalf_open && !st->nconnecting))
		return;
	sqe = ferry__ring_sqe(e);
	if (!sqe) {
		log_limited(FERRY__LOG_ERROR, "shm: io_uring full, handshake timer not armed "
			    "(tried again next round)");
		return;
	}
	st->tick_ts.tv_sec = 0;
	st->tick_ts.tv_nsec = SHM_TICK_MS * 1000000ll;
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, backend_tag(b, SHM_COOKIE_TICK));
	io_uring_submit(&e->ring);
	st->tick_armed = true;
}

/* ------------------------------------------------------------------ */
/* Handshakes: someone calls us                                        */
/* ------------------------------------------------------------------ */

/*
 * An accepted caller's hello came (rc 0) or will never come (rc < 0):
 * answer a health request, or answer with our hello and bring the
 * connection up, or hang up. Takes fd and the fds received.
 */
static void accept_hello(struct ferry_engine *e, struct backend *b, int fd, int rc,
			 const struct shm_hello *h, int *fds, unsigned nfds)
{
	struct shm_state *st = b->data;
	int ours[3] = { pool_fd(e->pool), e->doorbell_fd, e->wake_fd };
	struct shm_hello me;
	struct shm_conn *c = NULL;

	if (rc) {
		log_limited(FERRY__LOG_WARN, "shm: engine %s: refused a caller: %s", e->name,
			    ferry_strerror(rc));
		close(fd);
		return;
	}
	if ((h->caps & SHM_CAP_HEALTH) && nfds == 0) {
		shm_health_answer(e, fd); /* `ferry health`: one answer, then hang up */
		close(fd);
		return;
	}
	fill_hello(e, &me);
	if (shm_sock_send_hello(fd, &me, ours, 3) != 0 || !(c = shm_conn_new(e, st, fd, h->name))) {
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		close(fd);
		return;
	}
	if (conn_attach(e, b, c, h, fds, nfds, false) != 0)
		shm_conn_reap(st, c); /* nobody else knew of it; closes fd */
}

static uint64_t half_open_cookie(const struct shm_state *st, uint32_t slot)
{
	return ((uint64_t)st->half_open[slot].gen << 16) | (SHM_COOKIE_HALF_OPEN + slot);
}

/* Take fd out of half-open slot i (it stays open). */
static int half_open_take(struct shm_state *st, uint32_t i)
{
	int fd = st->half_open[i].fd;

	st->half_open[i].fd = -1;
	st->nhalf_open--;
	return fd;
}

void shm_half_open_close(struct shm_state *st, uint32_t i)
{
	int fd = half_open_take(st, i);

	shutdown(fd, SHUT_RDWR); /* ends its poll */
	close(fd);
}

/*
 * A caller was accepted: its hello is normally there already. If not, it
 * waits in a half-open slot, its socket polled, for SHM_ACCEPT_HELLO_MS;
 * when every slot is taken, the oldest is hung up on to make room.
 */
static void accept_caller(struct ferry_engine *e, struct backend *b, int fd)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS];
	unsigned nfds = SHM_MAX_FDS, i;
	int rc, left = atomic_load(&st->fault_hangups);

	if (left > 0 && atomic_compare_exchange_strong(&st->fault_hangups, &left, left - 1)) {
		shutdown(fd, SHUT_RDWR); /* the fault asked for (tests) */
		close(fd);
		return;
	}
	rc = shm_sock_try_recv_hello(fd, &h, fds, &nfds);

	if (rc != -EAGAIN) {
		accept_hello(e, b, fd, rc, &h, fds, nfds);
		return;
	}
	if (st->nhalf_open == SHM_HALF_OPEN_MAX) {
		/*
		 * Full: the oldest goes. A caller that means it sends its hello
		 * right after connecting, so a flood of silent ones cannot keep
		 * it out; refusing the newest could (it may be accepted in the
		 * moment between its connect and its hello).
		 */
		uint32_t oldest = 0;

		for (i = 1; i < SHM_HALF_OPEN_MAX; i++)
			if (st->half_open[i].deadline < st->half_open[oldest].deadline)
				oldest = i;
		log_limited(FERRY__LOG_WARN, "shm: engine %s: %u callers have not sent their hello "
			    "yet; hanging up on the oldest", e->name, SHM_HALF_OPEN_MAX);
		shm_half_open_close(st, oldest);
	}
	for (i = 0; st->half_open[i].fd >= 0; i++)
		;
	st->half_open[i].fd = fd;
	st->half_open[i].gen = ++st->next_gen;
	st->half_open[i].deadline = ferry__now_ns() + SHM_ACCEPT_HELLO_MS * 1000000ull;
	st->nhalf_open++;
	shm_arm_poll(e, b, fd, half_open_cookie(st, i));
	shm_arm_tick(e, b);
}

/* The socket of half-open slot i woke up (res: the poll's revents or an error). */
void shm_half_open_cqe(struct ferry_engine *e, struct backend *b, uint32_t i, uint32_t gen,
		       int res)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS], rc;
	unsigned nfds = SHM_MAX_FDS;

	if (i >= SHM_HALF_OPEN_MAX || st->half_open[i].fd < 0 || st->half_open[i].gen != gen)
		return; /* a slot already closed (its poll ended with the shutdown) */
	memset(&h, 0, sizeof(h));
	rc = res < 0 ? res : shm_sock_try_recv_hello(st->half_open[i].fd, &h, fds, &nfds);
	if (rc == -EAGAIN) {
		if (!(res & (POLLHUP | POLLRDHUP | POLLERR))) {
			shm_arm_poll(e, b, st->half_open[i].fd, half_open_cookie(st, i));
			return;
		}
		rc = -ECONNRESET;
	}
	if (rc)
		nfds = 0;
	accept_hello(e, b, half_open_take(st, i), rc, &h, fds, nfds);
}

void shm_accept_all(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;

	for (;;) {
		int fd = shm_sock_accept(st->lis.fd);

		if (fd == -EAGAIN)
			break;
		if (fd < 0) {
			if (fd == -EPERM)
				continue;
			break;
		}
		accept_caller(e, b, fd);
	}
}

/* ------------------------------------------------------------------ */
/* Handshakes: we call                                                 */
/* ------------------------------------------------------------------ */

/*
 * The call failed (why) or ran out of time: the PUTs queued on it fail with
 * -EHOSTUNREACH, and the peers it carried are resolved again by their next
 * PUT.
 */
static void call_fail(struct ferry_engine *e, struct backend *b, struct shm_conn *c,
		      const char *why)
{
	log_warn("shm: engine %s: handshake with %s: %s", e->name, c->peer_name, why);
	shm_conn_fail(e, c, NULL, -EHOSTUNREACH);
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
		if (p->backend == b && p->transport == c)
			reactor_unresolve(e, p);
	shm_conn_reap(b->data, c);
}

/*
 * Our call got through (c->sock): send our hello with our pool, doorbell
 * and wake page, and the rings, then watch the socket for the answer.
 */
static int call_hello(struct ferry_engine *e, struct backend *b, struct shm_conn *c)
{
	int ours[4] = { pool_fd(e->pool), e->doorbell_fd, e->wake_fd, c->ring_fd };
	struct shm_hello me;
	int rc;

	fill_hello(e, &me);
	rc = shm_sock_send_hello(c->sock, &me, ours, 4);
	if (rc)
		return rc;
	/* (the rings' fd stays until the answer: a call hung up on is made again) */
	shm_arm_poll(e, b, c->sock, conn_cookie(c));
	return 0;
}

/*
 * The callee hung up before it answered (why), within our handshake's
 * bound: call again (the timer connects, call_hello sends the hello again),
 * the PUTs queued on the call still waiting. A callee hangs up on a caller
 * whose hello is late (SHM_ACCEPT_HELLO_MS): one starved of its CPU between
 * its connect and its hello is such a caller. False: the bound has passed.
 */
static bool call_again(struct ferry_engine *e, struct backend *b, struct shm_conn *c,
		       const char *why)
{
	struct shm_state *st = b->data;

	if (ferry__now_ns() >= c->hs_deadline)
		return false;
	log_info("shm: engine %s: %s hung up before it answered (%s): calling again", e->name,
		 c->peer_name, why);
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	c->connect_again = true;
	c->gen = ++st->next_gen; /* (no poll of the old socket is left: it ended) */
	st->calls_again++;
	shm_arm_tick(e, b);
	return true;
}

/*
 * Call the engine called name: connect (without waiting: a full accept
 * queue is tried again by the timer) and send our hello. The connection
 * waits for the answer, not up, PUTs queueing on it; shm_call_answered or the
 * timer ends the wait. -EHOSTUNREACH at once when nobody holds the name.
 */
int shm_call_start(struct ferry_engine *e, struct backend *b, const char *name,
		   struct shm_conn **out)
{
	struct shm_state *st = b->data;
	struct shm_rings *rings;
	struct shm_conn *c;
	int ringfd, sock, rc;

	sock = shm_sock_connect_nowait(e->ns, name);
	if (sock < 0 && sock != -EAGAIN)
		return sock;
	ringfd = memfd_create("ferry-shm-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ringfd < 0 || ftruncate(ringfd, (off_t)SHM_RINGS_BYTES) < 0 ||
	    fcntl(ringfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = -errno;
		goto fail;
	}
	rings = mmap(NULL, SHM_RINGS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, ringfd, 0);
	if (rings == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	c = shm_conn_new(e, st, sock >= 0 ? sock : -1, name);
	if (!c) {
		munmap(rings, SHM_RINGS_BYTES);
		rc = -EMFILE;
		goto fail;
	}
	c->rings = rings;
	c->ring_fd = ringfd;
	c->connect_again = sock == -EAGAIN;
	c->hs_deadline = ferry__now_ns() + SHM_HANDSHAKE_MS * 1000000ull;
	st->nconnecting++;
	if (sock >= 0 && (rc = call_hello(e, b, c)) != 0 &&
	    !((rc == -EPIPE || rc == -ECONNRESET) && call_again(e, b, c, ferry_strerror(rc)))) {
		log_info("shm: engine %s: calling %s: %s", e->name, name, ferry_strerror(rc));
		shm_conn_fail(e, c, NULL, rc); /* nothing waits on it yet */
		shm_conn_reap(st, c);
		return rc;
	}
	shm_arm_tick(e, b);
	*out = c;
	return 0;
fail:
	log_error("shm: engine %s: calling %s: %s", e->name, name, ferry_strerror(rc));
	if (ringfd >= 0)
		close(ringfd);
	if (sock >= 0)
		close(sock);
	return rc;
}

/*
 * The socket of a call under way woke up: the answer, or the end of it.
 * True when the connection came up (its queued PUTs may go).
 */
bool shm_call_answered(struct ferry_engine *e, struct backend *b, struct shm_conn *c, int res)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS], rc;
	unsigned nfds = SHM_MAX_FDS;

	rc = res < 0 ? res : shm_sock_try_recv_hello(c->sock, &h, fds, &nfds);
	if (rc == -EAGAIN) {
		if (!(res & (POLLHUP | POLLRDHUP | POLLERR))) {
			shm_arm_poll(e, b, c->sock, conn_cookie(c));
			return false;
		}
		rc = -ECONNRESET;
	}
	if (rc == 0 && strcmp(h.name, c->peer_name) != 0) {
		log_error("shm: called %s, %s answered", c->peer_name, h.name);
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		rc = -EPROTO;
	}
	if (rc == -ECONNRESET && call_again(e, b, c, "no answer read"))
		return false;
	if (rc == 0)
		rc = conn_attach(e, b, c, &h, fds, nfds, true);
	if (rc) {
		call_fail(e, b, c, rc == -ECONNRESET ? "it hung up" : ferry_strerror(rc));
		return false;
	}
	if (c->ring_fd >= 0) { /* answered: the callee has the rings */
		close(c->ring_fd);
		c->ring_fd = -1;
	}
	st->nconnecting--;
	return true; /* shm.c sends what was queued meanwhile, in order */
}

/* The timer: bounds of half-open accepts and of calls, calls to try again. */
void shm_handshakes_check(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	uint64_t now = ferry__now_ns();

	for (uint32_t i = 0; i < SHM_HALF_OPEN_MAX && st->nhalf_open; i++) {
		if (st->half_open[i].fd >= 0 && now >= st->half_open[i].deadline) {
			log_limited(FERRY__LOG_WARN, "shm: engine %s: a caller sent no hello "
				    "within %d ms: hung up", e->name, SHM_ACCEPT_HELLO_MS);
			shm_half_open_close(st, i);
		}
	}
	for (uint32_t i = 0; i < SHM_MAX_CONNS && st->nconnecting; i++) {
		struct shm_conn *c = st->conns[i];
		int sock;

		if (!c || c->up || c->dead)
			continue;
		if (now >= c->hs_deadline) {
			char why[64];

			snprintf(why, sizeof(why), "%s %d ms",
				 c->connect_again ? "its accept queue stayed full for" :
						    "no answer within",
				 SHM_HANDSHAKE_MS);
			call_fail(e, b, c, why);
			continue;
		}
		if (!c->connect_again)
			continue;
		sock = shm_sock_connect_nowait(e->ns, c->peer_name);
		if (sock == -EAGAIN)
			continue;
		if (sock < 0) {
			call_fail(e, b, c, ferry_strerror(sock));
			continue;
		}
		c->sock = sock;
		c->connect_again = false;
		if ((sock = call_hello(e, b, c)) != 0 &&
		    !((sock == -EPIPE || sock == -ECONNRESET) &&
		      call_again(e, b, c, ferry_strerror(sock))))
			call_fail(e, b, c, ferry_strerror(sock));
	}
}

int ferry__shm_fault_hangup(struct ferry_engine *e, int n)
{
	for (unsigned i = 0; e && i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (strcmp(b->ops->name, "shm") == 0 && b->data) {
			atomic_store(&((struct shm_state *)b->data)->fault_hangups, n);
			return 0;
		}
	}
	return -ENODEV;
}

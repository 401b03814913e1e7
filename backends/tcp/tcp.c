/*
 * backends/tcp/tcp.c - the tcp transport: engines on other hosts (or any
 * engine given an address), over sockets driven by io_uring.
 *
 * Owns: the listener, links (everything between us and one peer engine:
 * one to TCP_MAX_CONNS connections), the authenticated handshake of every
 * connection (security.h), the data path (eager frames, rendezvous),
 * heartbeats and dead-peer detection, and what happens when a peer dies,
 * misbehaves or comes back.
 *
 * The transport has its own io_uring (created on first use), so that its
 * many socket ops neither compete with the reactor's small ring nor depend
 * on its internals: the reactor's ring watches this ring's fd (a multishot
 * poll), so a completion here wakes a sleeping reactor, and progress()
 * reaps it. SQEs are prepared during a round and submitted once at its end
 * (round_end): one io_uring_enter per round, however many PUTs it carried.
 *
 * Busy polling: frames queued during a round leave with one non-blocking
 * send (sendmsg for more than TCP_COALESCE_MAX bytes) per connection from
 * this thread, the application's PUTs right after the round took them
 * (sqs_drained), the rest at the round's end (round_end); the ring's SENDMSG
 * only carries what the socket had no room for. A connection that carries
 * traffic is "hot": read with a non-blocking recv() every round rather than
 * through a RECV on the ring, whose completion needs task work that
 * interrupts the spinning thread. Before the progress thread sleeps,
 * has_work arms a RECV on every hot connection (it goes cold), so a sleeping
 * engine still wakes through the ring. A connection is never read both ways
 * at once. Lone RESULTs wait a moment for the application's next PUT to
 * share their send (flush_all).
 *
 * Data path (tcp_wire.h): a PUT of up to TCP_EAGER_MAX bytes goes eagerly,
 * key and data in one frame (up to TCP_INLINE_MAX bytes of an iovec are
 * copied into the message, not into a pool block); the receiver copies it
 * from its staging buffer into a block of its pool and answers RESULT. A
 * larger PUT sends an offer (RTS); the receiver answers CTS once a block of
 * its pool holds room for it (or RESULT with an error), and only then does
 * the data move, in TCP_CHUNK frames spread over every connection of the
 * link, received straight into that block. A receiver that is slow to
 * consume therefore makes its sender wait with the data in the sender's own
 * pool block (which the PUT held anyway), never buffer more. An eager frame
 * that finds the receiver's pool full is refused (-ENOBUFS) rather than
 * held: holding it would stop the socket that also carries the RESULTs
 * freeing that pool.
 *
 * Ownership: a PUT's block moves from the op to a tcp_msg when the PUT is
 * taken (a small PUT from an iovec has none: its data is copied into the
 * msg). The msg lives until the peer's RESULT came (or the link died) AND
 * no send of ours still reads it; only then is the block freed. A deadline
 * or a cancel completes the op but leaves the msg to finish (the data may
 * still be delivered, as the API says).
 *
 * Trust: nothing is read from a connection before its handshake proved the
 * peer holds the cluster secret. After that, every frame is checked (magic,
 * type, reserved bits, key length and termination, lengths against the
 * limits and against what was offered, offsets against the block, ids and
 * generations of slots); a peer that breaks a rule loses its link, and
 * only it.
 *
 * Liveness: every frame received counts as a sign of life. An idle link is
 * pinged every heartbeat; a link silent for peer_timeout is declared dead.
 * A dead link fails its PUTs (-ECONNRESET), the GETs waiting on that peer,
 * and frees every block it held; the next PUT to the peer connects anew. *
 * The files (the types and what they share: tcp_int.h; the wire format:
 * tcp_wire.h):
 *   tcp.c            this file: the transport's table, setup and teardown
 *                    (init, fini, the tables and the ring made on first
 *                    use), the ring's completions, the round (progress,
 *                    sqs_drained, round_end, busy polling of hot
 *                    connections, prepare_sleep), the public calls
 *                    (ferry_engine_address, ferry_peer_set_address)
 *   tcp_link.c       links and connections: lifetime, faults, liveness
 *   tcp_handshake.c  the listener, calls, the authenticated handshake
 *   tcp_send.c       PUTs going out: messages, send queues, flushing
 *   tcp_recv.c       frames coming in: parsing, the frame handlers, offers
 * The data path (tcp_put, flushing, a frame's parse and its answer) calls
 * nothing across these files per frame: what it shares is inline in
 * tcp_int.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(p, n) ((void)(p), (void)(n))
#endif

#include "tcp_int.h"

/* ------------------------------------------------------------------ */
/* The ring                                                           */
/* ------------------------------------------------------------------ */

struct io_uring_sqe *tcp_get_sqe(struct tcp_state *st)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);

	if (!sqe) {
		io_uring_submit(&st->ring);
		sqe = io_uring_get_sqe(&st->ring);
	}
	if (sqe)
		st->inflight++;
	else
		log_error("tcp: engine %s: io_uring full", st->engine->name);
	return sqe;
}

/* Watch our ring's fd from the reactor's ring: our completions wake it. */
static void arm_ringfd(struct tcp_state *st)
{
	struct ferry_engine *e = st->engine;
	struct io_uring_sqe *sqe;

	if (st->ringfd_armed)
		return;
	sqe = ferry__ring_sqe(e);
	if (!sqe) {
		log_error("tcp: engine %s: the reactor's io_uring is full", e->name);
		return;
	}
	io_uring_prep_poll_multishot(sqe, st->ring.ring_fd, POLLIN);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, K_RINGFD));
	st->ringfd_armed = true;
	io_uring_submit(&e->ring);
}

static void arm_tick(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;
	uint64_t ns = st->heartbeat_ns / 2;

	if (st->tick_armed)
		return;
	if (st->wait_mem_head || st->stalled)
		ns = 1000000; /* look for pool room / control frames each ms */
	if (ns > 250000000)
		ns = 250000000;
	sqe = tcp_get_sqe(st);
	if (!sqe)
		return;
	st->tick_ts.tv_sec = (long long)(ns / 1000000000);
	st->tick_ts.tv_nsec = (long long)(ns % 1000000000);
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_TICK, 0, 0));
	st->tick_armed = true;
}

/* A link is ENDING: tcp_check_time looks at it again when its grace may be over. */
void tcp_arm_end_check(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;

	if (st->end_armed)
		return;
	sqe = tcp_get_sqe(st);
	if (!sqe)
		return; /* the next tick does it */
	st->end_ts.tv_sec = 0;
	st->end_ts.tv_nsec = (long long)(TCP_END_GRACE_NS / 4);
	io_uring_prep_timeout(sqe, &st->end_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_END, 0, 0));
	st->end_armed = true;
}

static void tables_free(struct tcp_state *st)
{
	free(st->msgs);
	free(st->rxs);
	free(st->ctls);
	st->msgs = NULL;
	st->rxs = NULL;
	st->ctls = NULL;
	st->free_msgs = NULL;
	st->free_rxs = NULL;
	st->free_ctls = NULL;
}

/* Tables and ring are made on first use: an engine without tcp pays nothing. */
int tcp_state_ready(struct tcp_state *st)
{
	struct ferry_engine *e = st->engine;
	int rc;

	if (st->ready)
		return 0;
	st->nmsgs = 2 * e->max_ops;
	st->nrxs = e->max_ops;
	st->nctls = 4 * e->max_ops;
	st->msgs = calloc(st->nmsgs, sizeof(*st->msgs));
	st->rxs = calloc(st->nrxs, sizeof(*st->rxs));
	st->ctls = calloc(st->nctls, sizeof(*st->ctls));
	if (!st->msgs || !st->rxs || !st->ctls) {
		tables_free(st);
		return -ENOMEM;
	}
	for (uint32_t i = st->nmsgs; i-- > 0;) {
		st->msgs[i].id = i;
		st->msgs[i].tx.kind = TX_MSG;
		st->msgs[i].wait_next = st->free_msgs;
		st->free_msgs = &st->msgs[i];
	}
	for (uint32_t i = st->nrxs; i-- > 0;) {
		st->rxs[i].id = i;
		st->rxs[i].next = st->free_rxs;
		st->free_rxs = &st->rxs[i];
	}
	for (uint32_t i = st->nctls; i-- > 0;) {
		st->ctls[i].tx.kind = TX_CTL;
		st->ctls[i].free_next = st->free_ctls;
		st->free_ctls = &st->ctls[i];
	}
	rc = io_uring_queue_init(TCP_RING_ENTRIES, &st->ring, 0);
	if (rc < 0) {
		log_error("tcp: engine %s: io_uring_queue_init: %s", e->name, ferry_strerror(rc));
		tables_free(st);
		return rc;
	}
	st->ready = true;
	arm_ringfd(st);
	return 0;
}

/* ------------------------------------------------------------------ */
/* The round: completions, busy polling                               */
/* ------------------------------------------------------------------ */

static void on_send(struct tcp_state *st, struct tcp_conn *c, int res)
{
	c->send_armed = false;
	if (c->dead)
		return;
	if (res <= 0) {
		if (res == -EINTR || res == -EAGAIN) {
			conn_kick(st, c);
			return;
		}
		tcp_conn_end(st, c, res ? -res : EPIPE);
		return;
	}
	tcp_tx_consume(st, c, (uint64_t)res);
	conn_kick(st, c);
}

static void on_recv(struct tcp_state *st, struct tcp_conn *c, int res)
{
	c->recv_armed = false;
	if (c->dead)
		return;
	if (res <= 0) {
		if (res == -EINTR || res == -EAGAIN) {
			tcp_conn_arm_recv(st, c);
			return;
		}
		tcp_conn_end(st, c, -res);
		return;
	}
	/* The kernel wrote these bytes; valgrind cannot see io_uring do it. */
	if (c->direct)
		VALGRIND_MAKE_MEM_DEFINED((uint8_t *)c->direct->buf->data + c->direct_off, res);
	else
		VALGRIND_MAKE_MEM_DEFINED(c->rx + c->rx_tail, res);
	/*
	 * Traffic: read it directly from now on, until it goes quiet or we
	 * sleep. At most TCP_MAX_HOT at a time: a round reads every hot
	 * connection, the others cost nothing while they wait on the ring.
	 */
	if (st->nhot < TCP_MAX_HOT)
		hot_add(st, c);
	tcp_rx_bytes(st, c, (uint64_t)res);
}

static void on_ring_cqe(struct tcp_state *st, uint64_t ud, int res)
{
	unsigned kind = ud & 0xf;
	uint32_t slot = (uint32_t)((ud >> 4) & 0xfffff), gen = (uint32_t)(ud >> 24);
	struct tcp_conn *c;

	st->inflight--;
	switch (kind) {
	case K_LISTEN:
		if (st->lfd < 0 || gen != st->lgen)
			return;
		if (res >= 0)
			tcp_accept_all(st);
		tcp_arm_listen(st);
		return;
	case K_TICK:
		st->tick_armed = false;
		st->tick_due = true;
		return;
	case K_END:
		st->end_armed = false;
		st->tick_due = true;
		return;
	case K_POLL:
	case K_RECV:
	case K_SEND:
		c = slot < TCP_MAX_SOCKS ? st->conns[slot] : NULL;
		if (!c || c->gen != gen)
			return;
		if (kind == K_POLL)
			tcp_on_poll(st, c, res);
		else if (kind == K_RECV)
			on_recv(st, c, res);
		else
			on_send(st, c, res);
		return;
	default:
		return; /* cancels */
	}
}

static int reap_own(struct tcp_state *st)
{
	struct io_uring_cqe *cqe;
	int n = 0;

	/*
	 * Every round asks: an empty ring answers here, without
	 * io_uring_peek_cqe's call into liburing (which enters the kernel
	 * only when completions overflowed).
	 */
	if (!io_uring_cq_ready(&st->ring) &&
	    !(IO_URING_READ_ONCE(*st->ring.sq.kflags) & IORING_SQ_CQ_OVERFLOW))
		return 0;
	while (io_uring_peek_cqe(&st->ring, &cqe) == 0) {
		uint64_t ud = cqe->user_data;
		int res = cqe->res;

		io_uring_cqe_seen(&st->ring, cqe);
		on_ring_cqe(st, ud, res);
		n++;
	}
	return n;
}

/*
 * Busy polling: read a hot connection with a non-blocking recv() in this
 * thread, which sees bytes as soon as the peer's send put them in the
 * socket, instead of waiting for io_uring to turn the socket's readiness
 * into a completion (task work, delivered by interrupting this thread).
 * Returns 2 if the bytes filled the buffer (more may wait), 1 if fewer
 * came (or the end), 0 if none were there.
 */
static int conn_read(struct tcp_state *st, struct tcp_conn *c)
{
	size_t len;
	ssize_t n;
	void *p;

	if (c->recv_armed || c->dead || c->ended || c->rx_stalled || c->hs != HS_READY)
		return 0;
	rx_target(c, &p, &len);
	n = recv(c->fd, p, len, MSG_DONTWAIT);
	if (n > 0) {
		tcp_rx_bytes(st, c, (uint64_t)n);
		return (size_t)n == len ? 2 : 1;
	}
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	tcp_conn_end(st, c, n ? errno : 0);
	return 1;
}

/* A connection quiet for TCP_HOT_NS, with nothing expected, goes back to io_uring. */
static void conn_cool(struct tcp_state *st, struct tcp_conn *c)
{
	hot_del(st, c);
	tcp_conn_arm_recv(st, c);
}

/* One round of direct reads; returns how many brought bytes. */
static int read_hot(struct tcp_state *st)
{
	uint64_t now = reactor_now(st->engine);
	int n = 0;

	for (uint32_t i = 0; i < st->nhot;) {
		struct tcp_conn *c = st->hot[i];
		int got = 0, reads = 0, rc;

		/* A read that did not fill its buffer drained the socket. */
		do {
			rc = conn_read(st, c);
			got |= rc > 0;
		} while (rc == 2 && ++reads < TCP_READS_PER_ROUND && c->hot);
		if (!got && c->hot && !c->dead && !c->rx_stalled && !c->direct &&
		    now - c->last_rx_ns > TCP_HOT_NS &&
		    !(c->link && c->link->msgs && link_primary(c->link) == c))
			conn_cool(st, c);
		n += got;
		if (i < st->nhot && st->hot[i] == c)
			i++;
	}
	return n;
}

/* The progress thread is about to sleep: every connection reads through io_uring. */
static void cool_all(struct tcp_state *st)
{
	while (st->nhot)
		conn_cool(st, st->hot[st->nhot - 1]);
}

static bool links_alive(struct tcp_state *st)
{
	return st->nconns || st->links;
}

/*
 * No link, no socket op out on the ring (no listener, no tick), nothing
 * held: until a PUT or a resolve (the reactor clears quiet before either)
 * the round hooks would do nothing: skip them (transport.h, quiet). A
 * socket op out keeps the hooks running: its completion is read from the
 * ring each round (the ring fd's poll on the reactor's ring needs a
 * syscall to be posted; a busy round makes none). Everything looked at here
 * is written on the progress side only.
 */
static void tcp_maybe_quiet(struct tcp_state *st, struct backend *b)
{
	if (st->inflight || st->wait_mem_head || st->stalled || st->tick_due || st->ndead ||
	    st->nflush || st->nending || st->nhot || st->tick_armed ||
	    atomic_load_explicit(&st->h_links_up, memory_order_relaxed) ||
	    atomic_load_explicit(&st->h_links_other, memory_order_relaxed) ||
	    io_uring_sq_ready(&st->ring) || io_uring_cq_ready(&st->ring) ||
	    (IO_URING_READ_ONCE(*st->ring.sq.kflags) & IORING_SQ_CQ_OVERFLOW))
		return;
	ferry__backend_quiet(b);
}

static int tcp_progress(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	int n;

	(void)e;
	if (!st->ready)
		return 0;
	n = reap_own(st);
	if (st->wait_mem_head)
		n += tcp_retry_wait_mem(st);
	if (st->stalled)
		n += tcp_retry_stalled(st);
	if (st->tick_due) {
		st->tick_due = false;
		if (st->fill_waits)
			tcp_fill_check(st); /* (a filling that failed after the hook ran: it asked) */
		tcp_check_time(st);
		tcp_reap_links(st);
		tcp_health_count(st);
		if (st->nending)
			tcp_arm_end_check(st);
	}
	if (st->ndead)
		tcp_sweep_dead(st);
	/* One more tick after the last link went: the health counts say so. */
	if (links_alive(st) || st->wait_mem_head ||
	    atomic_load_explicit(&st->h_links_up, memory_order_relaxed) ||
	    atomic_load_explicit(&st->h_links_other, memory_order_relaxed))
		arm_tick(st);
	return n;
}

/*
 * The end of the round, after the PUTs of the application's SQs were
 * taken: what every connection queued in this round leaves now (one
 * sendmsg each), then the hot connections are read (after the sends, so
 * that a reply never waits behind a read that finds nothing), what those
 * frames made is sent, and the ring's SQEs go in one io_uring_enter.
 */
static int tcp_round_end(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	int n = 0;

	(void)e;
	if (!st->ready) {
		ferry__backend_quiet(b); /* no ring: nothing here ever has work */
		return 0;
	}
	if (st->nflush)
		tcp_flush_all(st, true);
	if (st->nhot) {
		n = read_hot(st);
		if (st->nflush)
			tcp_flush_all(st, true);
	}
	if (io_uring_sq_ready(&st->ring))
		io_uring_submit(&st->ring);
	if (!links_alive(st))
		tcp_maybe_quiet(st, b);
	return n;
}

/*
 * The round took the application's entries: what they queued (PUTs, with
 * any RESULTs held for them) leaves now, before the round spends time on
 * the other backends, its timers and its reads. round_end sends the rest.
 */
static void tcp_sqs_drained(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (st->ready && st->nflush)
		tcp_flush_all(st, true);
}

/*
 * Asked before the progress thread sleeps (it announced the sleep first):
 * hot connections get their RECV armed here, so that bytes arriving while
 * it sleeps wake it through the ring, and held RESULTs leave (nobody
 * reacts to them in a sleep).
 */
static bool tcp_has_work(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (!st->ready)
		return false;
	return io_uring_sq_ready(&st->ring) || io_uring_cq_ready(&st->ring) || st->nflush ||
	       (st->stalled && st->free_ctls);
}

/*
 * Before the progress side sleeps: hot connections (read by busy polling)
 * go back to io_uring recvs, and what was held back to be sent in one go
 * leaves now, so that no byte waits for a round that will not come.
 */
static bool tcp_prepare_sleep(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	if (!st->ready)
		return false;
	if ((st->nhot || st->nflush) &&
	    atomic_load_explicit(&e->wake->sleeping, memory_order_relaxed)) {
		cool_all(st);
		if (st->nflush)
			tcp_flush_all(st, false);
		if (io_uring_sq_ready(&st->ring))
			io_uring_submit(&st->ring);
	}
	return tcp_has_work(e, b);
}

static void tcp_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
		       uint32_t flags)
{
	struct tcp_state *st = b->data;

	(void)e;
	(void)res;
	if (!st || cookie != K_RINGFD)
		return;
	if (!(flags & IORING_CQE_F_MORE)) {
		st->ringfd_armed = false;
		if (st->ready)
			arm_ringfd(st);
	}
}

/* ------------------------------------------------------------------ */
/* The backend                                                        */
/* ------------------------------------------------------------------ */

static int tcp_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct tcp_state *st = b->data;
	char address[PEER_ADDR_MAX];
	bool has_address = ferry__peer_addr_get(peer, "tcp", address, sizeof(address));
	struct tcp_link *l;
	int rc;

	(void)e;
	if (!has_address && !st->links)
		return -EHOSTUNREACH; /* the common case of engines without tcp */
	rc = tcp_link_for(st, peer, &l);
	if (rc) {
		/*
		 * A peer given an address is reached there or not at all: a
		 * call that cannot start (no route) must not hand it to another
		 * transport that finds an engine of its name (shm, loop).
		 */
		return has_address ? -ENETUNREACH : rc;
	}
	l->refs++;
	peer->transport = l;
	return 0;
}

static void tcp_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	(void)b;
	if (peer->transport)
		link_unref(peer->transport);
	peer->transport = NULL;
}

static void tcp_forget(struct ferry_engine *e, struct backend *b, struct op *op)
{
	/* The message finishes on its own; its ack is stale (reactor_put_done checks). */
	(void)e;
	(void)b;
	(void)op;
}

static int tcp_init(struct ferry_engine *e, struct backend *b)
{
	const struct ferry_engine_params *p = e->create_params;
	struct tcp_state *st = calloc(1, sizeof(*st));
	const char *env;
	int rc;

	if (!st)
		return -ENOMEM;
	st->engine = e;
	st->b = b;
	st->lfd = -1;
	b->data = st;
	if (p && p->size > offsetof(struct ferry_engine_params, listen)) {
		if (p->listen && strnlen(p->listen, NETADDR_MAX) >= NETADDR_MAX) {
			log_error("ferry_engine_create: listen endpoint longer than %d bytes",
				  NETADDR_MAX - 1);
			rc = -EINVAL;
			goto fail;
		}
		if (p->listen)
			snprintf(st->listen_text, sizeof(st->listen_text), "%s", p->listen);
	}
	rc = sec_engine_params(p, &st->secret, &st->heartbeat_ns, &st->peer_timeout_ns);
	if (rc)
		goto fail;
	if (st->peer_timeout_ns < st->heartbeat_ns) {
		log_error("ferry_engine_create: peer_timeout_ms is shorter than heartbeat_ms");
		rc = -EINVAL;
		goto fail;
	}
	st->conns_per_link = TCP_DEFAULT_CONNS;
	st->result_hold_ns = TCP_RESULT_HOLD_NS;
	env = getenv("FERRY_TCP_HOLD_NS");
	if (env && *env)
		st->result_hold_ns = strtoull(env, NULL, 10);
	env = getenv("FERRY_TCP_CONNS");
	if (env && atoi(env) >= 1 && atoi(env) <= TCP_MAX_CONNS)
		st->conns_per_link = (uint16_t)atoi(env);
	if (st->listen_text[0]) {
		if ((rc = tcp_listen_start(st)) || (rc = tcp_state_ready(st)))
			goto fail;
		tcp_arm_listen(st);
		io_uring_submit(&st->ring);
	}
	return 0;
fail:
	if (st->lfd >= 0)
		close(st->lfd);
	if (st->ready)
		io_uring_queue_exit(&st->ring);
	tables_free(st);
	free(st);
	b->data = NULL;
	return rc;
}

static void tcp_fini(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	uint64_t until;

	if (!st)
		return;
	/* Answers still queued or held (RESULTs) leave first, as far as the sockets take them. */
	if (st->ready && st->nflush)
		tcp_flush_all(st, false);
	if (st->lfd >= 0) {
		shutdown(st->lfd, SHUT_RDWR);
		close(st->lfd);
		st->lfd = -1;
	}
	for (struct tcp_link *l = st->links; l; l = l->next)
		tcp_link_fail(st, l, -ECANCELED, NULL);
	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++)
		if (st->conns[i])
			tcp_conn_kill(st, st->conns[i]);
	tcp_reap_links(st);
	/* Every op of the ring must end before the memory it uses goes. */
	if (st->ready) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);

		if (sqe) {
			io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
			io_uring_sqe_set_data64(sqe, 0);
			st->inflight++;
		}
		io_uring_submit(&st->ring);
		until = ferry__now_ns() + 2000000000ull;
		while (st->inflight && ferry__now_ns() < until) {
			struct io_uring_cqe *cqe;
			struct __kernel_timespec ts = { 0, 10000000 };

			if (io_uring_wait_cqe_timeout(&st->ring, &cqe, &ts) == 0)
				reap_own(st);
			tcp_sweep_dead(st);
			io_uring_submit(&st->ring);
		}
		if (st->inflight)
			log_warn("tcp: engine %s: %u socket ops did not end", e->name, st->inflight);
		for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++)
			if (st->conns[i])
				tcp_conn_free(st, st->conns[i]);
		/* What stayed waiting for memory. */
		while (st->wait_mem_head) {
			struct tcp_rx *r = st->wait_mem_head;

			st->wait_mem_head = r->next;
			rx_free(st, r);
		}
		io_uring_queue_exit(&st->ring);
	}
	reactor_unresolve_all(e, b);
	tables_free(st);
	free(st);
	b->data = NULL;
}

/*
 * The control plane declared the engine `name` dead: fail the data links to
 * it as if they had gone silent (their ops fail with res). A link that
 * failed alone is no such verdict (PEER_LOST): the peer may be alive.
 */
static void tcp_peer_event(struct ferry_engine *e, struct backend *b, const char *name,
			   enum peer_event ev, int res)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (ev != PEER_DEAD)
		return;
	for (struct tcp_link *l = st->links; l; l = l->next)
		if (l->state != LINK_DEAD && strcmp(l->peer_name, name) == 0)
			tcp_link_fail(st, l, res, "the control channel declared it dead");
}

static int tcp_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
		       const char *uri)
{
	(void)e;
	(void)b;
	return ferry_peer_set_address(peer, uri);
}

static int tcp_address(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct tcp_state *st = b->data;

	(void)e;
	return st->bound[0] ? snprintf(buf, len, "%s", st->bound) : 0;
}

/*
 * Its part of the engine's health: the listening address, and links and
 * connections as the last tick counted them (links up and not; of the up
 * links' connections, how many are authenticated out of how many they
 * should have; every socket open, handshakes included).
 */
static int tcp_health(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct tcp_state *st = b->data;

	(void)e;
	return snprintf(buf, len,
			",\"tcp\":{\"address\":\"%s\",\"links_up\":%u,\"links_other\":%u,"
			"\"connections_ready\":%u,\"connections_wanted\":%u,\"sockets\":%u,"
			"\"fill_waits\":%llu}",
			st->bound, atomic_load_explicit(&st->h_links_up, memory_order_relaxed),
			atomic_load_explicit(&st->h_links_other, memory_order_relaxed),
			atomic_load_explicit(&st->h_conns_ready, memory_order_relaxed),
			atomic_load_explicit(&st->h_conns_wanted, memory_order_relaxed),
			atomic_load_explicit(&st->h_sockets, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_fill_waits,
								 memory_order_relaxed));
}

/* A block being filled has more (or failed): the links waiting for it look again. */
static void tcp_staged_more(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (st && st->fill_waits)
		tcp_fill_check(st);
}

const struct backend_ops ferry__tcp_backend = {
	.name = "tcp",
	.rank = 10,
	.caps = TRANSPORT_CAP_SAME_HOST | TRANSPORT_CAP_REMOTE | TRANSPORT_CAP_MEM_HOST,
	.init = tcp_init,
	.fini = tcp_fini,
	.resolve = tcp_resolve,
	.unresolve = tcp_unresolve,
	.put = tcp_put,
	.iov_put_max = TCP_INLINE_MAX,
	.progress = tcp_progress,
	.has_work = tcp_has_work,
	.prepare_sleep = tcp_prepare_sleep,
	.sqs_drained = tcp_sqs_drained,
	.round_end = tcp_round_end,
	.forget = tcp_forget,
	.on_cqe = tcp_on_cqe,
	.health = tcp_health,
	.scheme = "tcp",
	.connect = tcp_connect,
	.address = tcp_address,
	.peer_event = tcp_peer_event,
	.sends_filling = true,
	.staged_more = tcp_staged_more,
};

/* ------------------------------------------------------------------ */
/* Public calls                                                        */
/* ------------------------------------------------------------------ */

static struct tcp_state *tcp_of(struct ferry_engine *e)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops == &ferry__tcp_backend)
			return e->backends[i].data;
	return NULL;
}

/*
 * Control channel hook (ctl.h): the control channel declared engine `name`
 * dead; its data links go too, as if they had gone silent.
 */

int ferry_engine_address(struct ferry_engine *e, char *buf, size_t len)
{
	struct tcp_state *st;

	if (!e || (!buf && len)) {
		log_error("ferry_engine_address: NULL %s", e ? "buf" : "engine");
		return -EINVAL;
	}
	st = tcp_of(e);
	if (!st || !st->bound[0])
		return -ENOTCONN;
	return snprintf(buf, len, "%s", st->bound);
}

int ferry_peer_set_address(struct ferry_peer *p, const char *endpoint)
{
	struct sockaddr_storage ss;
	struct tcp_state *st;
	char text[NETADDR_MAX];
	socklen_t len;
	int rc;

	if (!p || !endpoint) {
		log_error("ferry_peer_set_address: NULL %s", p ? "endpoint" : "peer");
		return -EINVAL;
	}
	rc = netaddr_parse_peer("ferry_peer_set_address", endpoint, &ss, &len);
	if (rc)
		return rc;
	st = tcp_of(p->engine);
	if (!st) {
		log_error("ferry_peer_set_address: engine %s has no tcp transport", p->engine->name);
		return -EINVAL;
	}
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
		log_error("ferry_peer_set_address: %s for %s is not a loopback address and engine "
			  "%s has no cluster secret", endpoint, p->name, p->engine->name);
		return -EACCES;
	}
	sec_note_no_secret(&st->secret, p->engine->name);
	netaddr_format((struct sockaddr *)&ss, text, sizeof(text));
	return ferry__peer_addr_set(p, text);
}

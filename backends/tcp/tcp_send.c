/*
 * backends/tcp/tcp_send.c - the tcp transport's send side: PUTs going out.
 *
 * Owns: taking a PUT (tcp_put: its message, its eager frame or offer,
 * queued on the link's primary connection or held until the link is up),
 * the rendezvous chunks handed to each connection's chunk slots (never
 * past what a block still being filled holds: tcp_fill_check), and
 * flushing the send queues: gathered into one send() when small, iovecs
 * and sendmsg otherwise, a SENDMSG on the ring for what the socket had no
 * room for, RESULTs held a moment for a PUT to share their send
 * (tcp_flush_all). This is the per-op path: what it calls per frame is
 * here or inline in tcp_int.h.
 */
#include <unistd.h>

#include "tcp_int.h"

/* ------------------------------------------------------------------ */
/* Messages (PUTs going out)                                          */
/* ------------------------------------------------------------------ */

void tcp_msg_send(struct tcp_state *st, struct tcp_link *l, struct tcp_msg *m)
{
	struct tcp_conn *c = link_primary(l);

	if (!c) {
		tcp_link_fail(st, l, -ECONNRESET, "no connection left");
		return;
	}
	m->tx_busy = true;
	tx_push(c, &m->tx);
	conn_kick(st, c);
}

int tcp_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct tcp_state *st = b->data;
	struct tcp_link *l = op->peer->transport;
	struct tcp_msg *m;

	if (!link_open(l)) {
		/* Lost or ending since: call again (the peer may be back), or give up. */
		struct tcp_link *nl;

		if (tcp_link_for(st, op->peer, &nl))
			return -ECONNRESET;
		nl->refs++;
		link_unref(l);
		op->peer->transport = l = nl;
	}
	m = st->free_msgs;
	if (!m) {
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: %u PUTs away at peers that do not "
			    "answer: refusing more", e->name, st->nmsgs);
		return -ENOBUFS;
	}
	st->free_msgs = m->wait_next;
	m->wait_next = NULL;
	m->state = MSG_LIVE;
	m->gen++;
	m->op = op;
	m->op_gen = op->gen;
	m->buf = op->buf;
	op->buf = NULL; /* the message owns the block now */
	m->len = op->len;
	/*
	 * An iovec of at most TCP_INLINE_MAX bytes (iov_put_max): copied here,
	 * so a deadline that ends the op before the frame leaves cannot leave it
	 * pointing at the caller's memory.
	 */
	if (!m->buf)
		op_gather(op, m->inl, m->len);
	m->link = l;
	l->refs++;
	m->resulted = false;
	m->tx_busy = false;
	m->cts = false;
	m->chunks_out = 0;
	m->next_off = 0;
	m->rendezvous = m->len > TCP_EAGER_MAX;
	m->flags = frame_flags(op->flags & WIRE_F__ALL);
	m->key_len = op->key_len;
	copy_short(m->key, op->key, op->key_len + 1u);
	m->tx.key = m->key;
	m->tx.key_len = m->key_len;
	if (m->rendezvous) {
		tcp_frame_pack(m->tx.hdr, TCP_F_RTS, (uint8_t)m->flags, m->key_len, m->key_len,
			       msg_cookie(m), m->len);
		m->tx.data = NULL;
		m->tx.data_len = 0;
	} else {
		tcp_frame_pack(m->tx.hdr, TCP_F_PUT, (uint8_t)m->flags, m->key_len,
			       (uint32_t)(m->key_len + m->len), msg_cookie(m), m->len);
		m->tx.data = m->buf ? m->buf->data : m->inl;
		m->tx.data_len = m->len;
	}
	m->prev = NULL;
	m->next = l->msgs;
	if (l->msgs)
		l->msgs->prev = m;
	l->msgs = m;
	op->state = OP_AWAY;
	if (l->state == LINK_UP) {
		tcp_msg_send(st, l, m);
	} else {
		if (l->wait_tail)
			l->wait_tail->wait_next = m;
		else
			l->wait_head = m;
		l->wait_tail = m;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* Sending                                                            */
/* ------------------------------------------------------------------ */

/*
 * Give the connection's free chunk slots the next pieces of rendezvous
 * data: no byte past what its block holds so far (a block still being
 * filled, pool_filled: then the link waits, fill_wait, for tcp_fill_check).
 */
static void conn_take_chunks(struct tcp_state *st, struct tcp_link *l, struct tcp_conn *c)
{
	for (unsigned i = 0; i < TCP_CHUNKS_PER_CONN && l->rdv_head; i++) {
		struct tcp_chunk *k = &c->chunks[i];
		struct tcp_msg *m = l->rdv_head;
		uint64_t n, filled;

		if (k->busy)
			continue;
		filled = pool_filled(m->buf);
		if (unlikely(filled == POOL_FILL_FAILED || filled <= m->next_off)) {
			if (!l->fill_wait) {
				l->fill_wait = true;
				st->fill_waits++;
				atomic_fetch_add_explicit(&st->h_fill_waits, 1, memory_order_relaxed);
			}
			if (filled == POOL_FILL_FAILED)
				st->tick_due = true; /* failed before we got here: the next round ends it */
			break;
		}
		n = filled - m->next_off;
		if (n > TCP_CHUNK)
			n = TCP_CHUNK;
		tcp_frame_pack(k->tx.hdr, TCP_F_DATA, 0, 0, (uint32_t)n, m->rx_slot, m->next_off);
		k->tx.key = NULL;
		k->tx.key_len = 0;
		k->tx.data = (const uint8_t *)m->buf->data + m->next_off;
		k->tx.data_len = n;
		k->msg = m;
		k->busy = true;
		m->next_off += n;
		m->chunks_out++;
		if (m->next_off == m->len) {
			l->rdv_head = m->wait_next;
			if (!l->rdv_head)
				l->rdv_tail = NULL;
			m->wait_next = NULL;
		}
		tx_push(c, &k->tx);
	}
}

static uint64_t tx_total(const struct tcp_tx *t)
{
	return TCP_FRAME_BYTES + t->key_len + t->data_len;
}

/* The pieces of t not sent yet (of its header, key, data): how many, into p / len. */
static unsigned tx_unsent(const struct tcp_tx *t, const uint8_t *p[3], uint64_t len[3])
{
	const uint8_t *part[3] = { t->hdr, t->key, t->data };
	uint64_t plen[3] = { TCP_FRAME_BYTES, t->key_len, t->data_len };
	uint64_t skip = t->sent;
	unsigned k = 0;

	for (unsigned i = 0; i < 3; i++) {
		if (skip >= plen[i]) {
			skip -= plen[i];
			continue;
		}
		p[k] = part[i] + skip;
		len[k++] = plen[i] - skip;
		skip = 0;
	}
	return k;
}

/* The iovecs of what is queued (up to TCP_IOV_MAX); returns how many. */
static unsigned conn_iov(struct tcp_state *st, struct tcp_conn *c)
{
	unsigned n = 0;

	if (c->link && c->link->rdv_head)
		conn_take_chunks(st, c->link, c);
	for (struct tcp_tx *t = c->txq; t && n + 3 <= TCP_IOV_MAX; t = t->next) {
		const uint8_t *p[3];
		uint64_t len[3];
		unsigned k = tx_unsent(t, p, len);

		for (unsigned i = 0; i < k; i++, n++) {
			c->iov[n].iov_base = (void *)p[i];
			c->iov[n].iov_len = len[i];
		}
	}
	memset(&c->mh, 0, sizeof(c->mh));
	c->mh.msg_iov = c->iov;
	c->mh.msg_iovlen = n;
	return n;
}

/* n bytes of the send queue left: the items sent whole are done. */
void tcp_tx_consume(struct tcp_state *st, struct tcp_conn *c, uint64_t n)
{
	while (n && c->txq) {
		struct tcp_tx *t = c->txq;
		uint64_t rest = tx_total(t) - t->sent;

		if (n < rest) {
			t->sent += n;
			break;
		}
		n -= rest;
		c->txq = t->next;
		if (!c->txq)
			c->txq_tail = NULL;
		tx_done(st, t);
	}
}

/*
 * A queue of at most TCP_COALESCE_MAX bytes (and no rendezvous data waiting
 * for a chunk slot) gathered straight into st->coalesce, for one send():
 * cheaper in the kernel than sendmsg's iovec import, and no iovecs to
 * build. Returns its length; 0 when it is empty or larger (conn_iov and
 * sendmsg then).
 */
static size_t conn_gather(struct tcp_state *st, struct tcp_conn *c)
{
	size_t total = 0;
	uint8_t *p = st->coalesce;

	if (c->link && c->link->rdv_head)
		return 0;
	for (const struct tcp_tx *t = c->txq; t; t = t->next) {
		total += tx_total(t) - t->sent;
		if (total > TCP_COALESCE_MAX)
			return 0;
	}
	for (const struct tcp_tx *t = c->txq; t; t = t->next) {
		const uint8_t *part[3];
		uint64_t len[3];
		unsigned k = tx_unsent(t, part, len);

		for (unsigned i = 0; i < k; i++) {
			ferry__payload_copy(p, part[i], len[i]);
			p += len[i];
		}
	}
	return total;
}

/*
 * Send what is queued: first straight from this thread (a non-blocking
 * send of the gathered queue, or a sendmsg, which on an idle connection
 * takes everything: no SQE, no completion to wait for), then, for what the
 * socket had no room for, a SENDMSG on the ring, which waits for room in
 * the kernel.
 */
static void conn_flush(struct tcp_state *st, struct tcp_conn *c)
{
	struct io_uring_sqe *sqe;
	size_t small;
	ssize_t n;

	for (int tries = 0; tries < 4; tries++) {
		if (c->send_armed || c->dead || c->ended || c->hs != HS_READY)
			return;
		if ((small = conn_gather(st, c))) {
			n = send(c->fd, st->coalesce, small, MSG_NOSIGNAL | MSG_DONTWAIT);
		} else {
			if (!conn_iov(st, c))
				return;
			n = sendmsg(c->fd, &c->mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			tcp_conn_end(st, c, errno);
			return;
		}
		tcp_tx_consume(st, c, (uint64_t)n);
		if (!c->txq && !(c->link && c->link->rdv_head))
			return; /* all of it left (the common case): no other look */
	}
	if (c->send_armed || c->dead || !conn_iov(st, c))
		return;
	sqe = tcp_get_sqe(st);
	if (!sqe) {
		if (c->link)
			tcp_link_fail(st, c->link, -ECONNRESET, "io_uring full");
		return;
	}
	io_uring_prep_sendmsg(sqe, c->fd, &c->mh, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_SEND, c->slot, c->gen));
	c->send_armed = true;
}

/*
 * A PUT joined held RESULTs: it goes first, so that the peer meets the
 * frame that completes its GET (and makes it react) before the RESULTs
 * that complete its PUTs. Answers may come in any order; PUTs and data
 * keep theirs.
 */
static void results_last(struct tcp_conn *c)
{
	struct tcp_tx *head = c->txq, *last = NULL;

	while (c->txq && c->txq->kind == TX_CTL && c->txq->hdr[4] == TCP_F_RESULT &&
	       !c->txq->sent) {
		last = c->txq;
		c->txq = c->txq->next;
	}
	if (!last)
		return;
	if (!c->txq) {
		c->txq = head; /* nothing else after all */
		return;
	}
	last->next = NULL;
	c->txq_tail->next = head;
	c->txq_tail = last;
}

/* Nothing but RESULTs queued on c? */
static bool only_results(const struct tcp_conn *c)
{
	for (const struct tcp_tx *t = c->txq; t; t = t->next)
		if (t->kind != TX_CTL || t->hdr[4] != TCP_F_RESULT)
			return false;
	return true;
}

/*
 * Send what the round queued. A connection with nothing but RESULTs queued
 * may keep them up to result_hold_ns (unless hold is false): the PUT they
 * answer often completed a GET, and the application's reaction (its next
 * PUT, often to the same peer) then leaves in the same sendmsg: one send and
 * one receive on the critical path instead of two each. A hold that caught
 * nothing (a one-way stream) makes the connection skip the next 2^n - 1
 * holds (n vain holds in a row, up to 6), so streams pay for one in 64 at
 * most. Held frames keep has_work true: nobody sleeps on them.
 */
void tcp_flush_all(struct tcp_state *st, bool hold)
{
	uint64_t now = hold ? reactor_now(st->engine) : 0;
	uint32_t kept = 0;

	while (st->nflush > kept) {
		struct tcp_conn *c = st->flushq[--st->nflush];

		if (hold && only_results(c)) {
			if (!c->flush_held && c->hold_skip) {
				c->hold_skip--;
			} else if (!c->flush_held || now - c->held_ns < st->result_hold_ns) {
				if (!c->flush_held)
					c->held_ns = now;
				c->flush_held = true;
				st->flushq[st->nflush] = st->flushq[kept];
				st->flushq[kept++] = c;
				st->nflush++;
				continue;
			} else {
				/* Nothing came to go with them: a one-way stream. */
				if (c->hold_vain < 6)
					c->hold_vain++;
				c->hold_skip = (1u << c->hold_vain) - 1;
			}
		}
		if (c->flush_held && !only_results(c)) {
			c->hold_vain = 0;
			results_last(c);
		}
		c->flush_queued = false;
		c->flush_held = false;
		conn_flush(st, c);
	}
}

void tcp_fill_check(struct tcp_state *st)
{
again:
	for (struct tcp_link *l = st->links; l && st->fill_waits; l = l->next) {
		struct tcp_msg *m = l->rdv_head;
		uint64_t filled = m ? pool_filled(m->buf) : 0;

		if (!l->fill_wait || (m && filled != POOL_FILL_FAILED && filled <= m->next_off))
			continue;
		l->fill_wait = false;
		st->fill_waits--;
		if (m && filled == POOL_FILL_FAILED) {
			/* Its receiver has part of it: only the link's end makes it drop that. */
			tcp_link_fail(st, l, -ECONNRESET, "a PUT's device memory could not be staged "
				      "while it was sent");
			goto again; /* (the list may have changed) */
		}
		for (unsigned i = 0; i < TCP_MAX_CONNS; i++)
			if (l->conns[i])
				conn_kick(st, l->conns[i]);
	}
}

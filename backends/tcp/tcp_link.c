/*
 * backends/tcp/tcp_link.c - the tcp transport's links and connections:
 * their lifetime, their faults and their liveness.
 *
 * Owns: making links and connections (tcp_link_for: the link a peer's PUT
 * goes on, calling it anew when it has none) and freeing them; stopping a
 * connection (tcp_conn_kill); a connection's end and the link's ENDING
 * grace (tcp_conn_end); a link's failure, which fails its PUTs, the GETs
 * waiting on its peer and frees every block it held (tcp_link_fail);
 * heartbeats, dead-peer detection and handshake deadlines
 * (tcp_check_time). None of it runs per frame. See tcp.c for the
 * transport as a whole.
 */
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_int.h"

/* ------------------------------------------------------------------ */
/* Links and connections: lifetime                                    */
/* ------------------------------------------------------------------ */

struct tcp_link *tcp_link_new(struct tcp_state *st, const char *peer, bool caller)
{
	struct tcp_link *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->refs = 1; /* the table's */
	l->state = LINK_CONNECTING;
	l->caller = caller;
	snprintf(l->peer_name, sizeof(l->peer_name), "%s", peer);
	key_suffix_make(&l->arrive_sfx, l->peer_name, st->engine->name);
	l->last_rx_ns = reactor_now(st->engine);
	l->last_ping_ns = l->last_rx_ns;
	l->next = st->links;
	st->links = l;
	return l;
}

struct tcp_conn *tcp_conn_new(struct tcp_state *st, int fd, bool caller)
{
	struct tcp_conn *c;
	uint32_t slot;

	for (slot = 0; slot < TCP_MAX_SOCKS && st->conns[slot]; slot++)
		;
	if (slot == TCP_MAX_SOCKS) {
		log_error("tcp: engine %s: more than %u connections", st->engine->name,
			  TCP_MAX_SOCKS);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->rx = malloc(TCP_RX_STAGE);
	if (!c->rx) {
		free(c);
		return NULL;
	}
	c->st = st;
	c->slot = slot;
	c->gen = ++st->next_gen & 0xffffffffu;
	c->fd = fd;
	c->caller = caller;
	c->hs_deadline = reactor_now(st->engine) + st->engine->handshake_ns;
	for (unsigned i = 0; i < TCP_CHUNKS_PER_CONN; i++)
		c->chunks[i].tx.kind = TX_CHUNK;
	st->conns[slot] = c;
	st->nconns++;
	return c;
}

void tcp_conn_free(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->dead)
		st->ndead--;
	/* A block kept for the recv that wrote into it. */
	if (c->direct && c->direct->orphan)
		rx_free(st, c->direct);
	st->conns[c->slot] = NULL;
	st->nconns--;
	if (c->fd >= 0)
		close(c->fd);
	if (!c->caller && c->hs != HS_READY)
		tcp_count_preauth(st);
	free(c->rx);
	free(c);
}

/*
 * A dead connection goes once no op of the ring still uses it. Called only
 * from tcp_sweep_dead, at the end of a round: whoever killed it may still be
 * using it further up the stack.
 */
static void conn_maybe_free(struct tcp_state *st, struct tcp_conn *c)
{
	if (!c->dead || c->poll_armed || c->recv_armed || c->send_armed)
		return;
	tcp_conn_free(st, c);
}

static void flushq_del(struct tcp_state *st, struct tcp_conn *c)
{
	if (!c->flush_queued)
		return;
	c->flush_queued = false;
	c->flush_held = false;
	for (uint32_t i = 0; i < st->nflush; i++)
		if (st->flushq[i] == c) {
			st->flushq[i] = st->flushq[--st->nflush];
			break;
		}
}

/*
 * Stop a connection: what it had queued is dropped (the link's failure
 * answers the PUTs), the socket is shut so in-flight ops end, and the
 * connection is freed when their completions came.
 */
void tcp_conn_kill(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	st->ndead++;
	hot_del(st, c);
	flushq_del(st, c);
	/* A block no recv writes into is the link's to free (tcp_link_fail). */
	if (!c->recv_armed)
		c->direct = NULL;
	shutdown(c->fd, SHUT_RDWR);
	while (c->txq) {
		struct tcp_tx *t = c->txq;

		c->txq = t->next;
		tx_done(st, t);
	}
	c->txq_tail = NULL;
	if (c->rx_stalled) {
		struct tcp_conn **pp = &st->stalled;

		while (*pp && *pp != c)
			pp = &(*pp)->next_stalled;
		if (*pp)
			*pp = c->next_stalled;
		c->rx_stalled = false;
	}
	if (c->link) {
		for (unsigned i = 0; i < TCP_MAX_CONNS; i++)
			if (c->link->conns[i] == c)
				c->link->conns[i] = NULL;
		c->link = NULL;
	}
	if (c->poll_armed || c->recv_armed || c->send_armed) {
		struct io_uring_sqe *sqe = tcp_get_sqe(st);

		if (sqe) {
			io_uring_prep_cancel_fd(sqe, c->fd, IORING_ASYNC_CANCEL_ALL);
			io_uring_sqe_set_data64(sqe, 0);
		}
	}
}

void tcp_sweep_dead(struct tcp_state *st)
{
	for (uint32_t i = 0; i < TCP_MAX_SOCKS && st->ndead; i++)
		if (st->conns[i] && st->conns[i]->dead)
			conn_maybe_free(st, st->conns[i]);
}

/* A link for peer: a live one, or a new call when it has an address. */
int tcp_link_for(struct tcp_state *st, struct ferry_peer *peer, struct tcp_link **out)
{
	struct ferry_engine *e = st->engine;
	char address[PEER_ADDR_MAX] = "";
	struct tcp_link *l;
	int rc;

	ferry__peer_addr_get(peer, "tcp", address, sizeof(address));
	for (l = st->links; l; l = l->next)
		if (link_open(l) && strcmp(l->peer_name, peer->name) == 0)
			break;
	if (l) {
		*out = l;
		return 0;
	}
	if (!address[0])
		return -EHOSTUNREACH;
	if ((rc = tcp_state_ready(st)))
		return rc;
	l = tcp_link_new(st, peer->name, true);
	if (!l)
		return -ENOMEM;
	if ((rc = netaddr_parse(address, true, &l->addr, &l->addrlen)) ||
	    (rc = sec_nonce((uint8_t *)&l->link_id, sizeof(l->link_id)))) {
		tcp_link_fail(st, l, -EHOSTUNREACH, NULL);
		return -EHOSTUNREACH;
	}
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&l->addr)) {
		log_error("tcp: engine %s: not calling %s at %s: no cluster secret is set",
			  e->name, peer->name, address);
		tcp_link_fail(st, l, -EACCES, NULL);
		return -EACCES;
	}
	l->nconns = st->conns_per_link;
	rc = tcp_caller_start(st, l, 0);
	if (rc) {
		tcp_link_fail(st, l, -EHOSTUNREACH, NULL);
		return -EHOSTUNREACH;
	}
	*out = l;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Faults                                                             */
/* ------------------------------------------------------------------ */

static bool other_live_link(struct tcp_state *st, struct tcp_link *l)
{
	for (struct tcp_link *o = st->links; o; o = o->next)
		if (o != l && o->state != LINK_DEAD && strcmp(o->peer_name, l->peer_name) == 0)
			return true;
	return false;
}

/*
 * c ended: the peer closed it (err 0: the end of its stream) or it broke
 * (err: the receive's or the send's errno). A peer engine that leaves ends
 * every connection of its link, and we see those ends in no particular
 * order, while another connection may still hold frames sent before them:
 * the RESULTs of our last PUTs ride connection 0, and busy polling reads
 * it after the ring's completions, which bring the others' ends. So the
 * first end makes the link ENDING, not dead: it takes no new PUTs (the next
 * one calls anew), sends nothing more on ended connections, and keeps
 * reading the others; it fails once every ready connection ended, or
 * TCP_END_GRACE_NS after its first end (tcp_check_time) if the peer keeps
 * some open. What was queued on an ended connection then fails with the
 * link, as before.
 */
void tcp_conn_end(struct tcp_state *st, struct tcp_conn *c, int err)
{
	struct tcp_link *l = c->link;

	if (c->dead || c->ended)
		return;
	if (err)
		log_warn("tcp: engine %s: connection %u to %s: %s", st->engine->name, c->index,
			 l ? l->peer_name : "?", strerror(err));
	else
		log_info("tcp: engine %s: %s closed connection %u", st->engine->name,
			 l ? l->peer_name : "?", c->index);
	if (!l || (l->state != LINK_UP && l->state != LINK_ENDING)) {
		if (l)
			tcp_link_fail(st, l, -ECONNRESET, NULL);
		else
			tcp_conn_kill(st, c);
		return;
	}
	c->ended = true;
	hot_del(st, c);
	flushq_del(st, c);
	if (l->state == LINK_UP) {
		l->state = LINK_ENDING;
		l->ended_ns = reactor_now(st->engine);
		st->nending++;
		tcp_arm_end_check(st);
	}
	for (unsigned i = 0; i < TCP_MAX_CONNS; i++) {
		struct tcp_conn *o = l->conns[i];

		if (o && !o->dead && !o->ended && o->hs == HS_READY)
			return; /* it may still bring frames */
	}
	tcp_link_fail(st, l, -ECONNRESET, NULL);
}

/*
 * The peer is gone (or broke the protocol, or could not be reached): its
 * PUTs fail with res, GETs waiting on it give up, every block it held comes
 * back. why == NULL: already logged (or no error, a peer leaving).
 */
void tcp_link_fail(struct tcp_state *st, struct tcp_link *l, int res, const char *why)
{
	struct ferry_engine *e = st->engine;

	if (!l || l->state == LINK_DEAD)
		return;
	if (l->state == LINK_ENDING)
		st->nending--;
	l->state = LINK_DEAD;
	if (why)
		log_warn("tcp: engine %s: link to %s lost: %s", e->name, l->peer_name, why);
	l->refs++; /* it must outlive the loops below */
	for (unsigned i = 0; i < TCP_MAX_CONNS; i++)
		if (l->conns[i])
			tcp_conn_kill(st, l->conns[i]);
	l->rdv_head = l->rdv_tail = NULL;
	if (l->fill_wait) {
		l->fill_wait = false;
		st->fill_waits--;
	}
	while (l->wait_head) {
		struct tcp_msg *m = l->wait_head;

		l->wait_head = m->wait_next;
		m->wait_next = NULL;
		/*
		 * It never left (the link never came up): its block goes back
		 * to its op, which may be sent again (FERRY_SQE_WAIT_PEER) or
		 * frees it as any PUT that did not hand its data over.
		 */
		if (m->op && m->buf && m->op->gen == m->op_gen) {
			m->op->buf = m->buf;
			m->buf = NULL;
		}
	}
	l->wait_tail = NULL;
	for (struct tcp_msg *m = l->msgs, *next; m; m = next) {
		next = m->next;
		m->next_off = m->len;
		msg_result(st, m, res);
	}
	/* Offers it made us: blocks written by a recv in flight wait for it. */
	for (uint32_t i = 0; i < st->nrxs; i++) {
		struct tcp_rx *r = &st->rxs[i];

		if (r->link != l || r->state == RX_FREE)
			continue;
		if (r->state == RX_WAIT_MEM)
			continue; /* tcp_retry_wait_mem frees it in order */
		r->orphan = true;
		r->link = NULL;
		r->state = RX_WAIT_MEM; /* not findable any more */
		{
			bool pinned = false;

			for (uint32_t s = 0; s < TCP_MAX_SOCKS && !pinned; s++) {
				struct tcp_conn *c = st->conns[s];

				pinned = c && c->direct == r && c->recv_armed;
			}
			if (!pinned) {
				r->state = RX_FREE;
				rx_free(st, r);
			}
		}
	}
	if (!other_live_link(st, l)) {
		for (uint32_t i = 0; i < e->max_ops; i++) {
			struct op *op = &e->ops[i];

			if (op->state == OP_PARKED && op->peer &&
			    strcmp(op->peer->name, l->peer_name) == 0)
				op_complete(e, op, res == -ECANCELED ? res : -ECONNRESET, 0, NULL);
		}
		/* Its streams: STREAM_GETs end, chunks waiting for credit fail. */
		ferry__peer_event(e, st->b, l->peer_name, PEER_LOST,
				  res == -ECANCELED ? res : -ECONNRESET);
	}
	link_unref(l);
}

/* Drop dead links from the table (peers still resolved to one keep it). */
void tcp_reap_links(struct tcp_state *st)
{
	for (struct tcp_link **pp = &st->links, *l; (l = *pp);) {
		if (l->state == LINK_DEAD) {
			*pp = l->next;
			link_unref(l);
		} else {
			pp = &l->next;
		}
	}
}

/* ------------------------------------------------------------------ */
/* Heartbeats and handshake deadlines                                 */
/* ------------------------------------------------------------------ */

/* The health hook's counts of links and connections (read from any thread). */
void tcp_health_count(struct tcp_state *st)
{
	uint32_t up = 0, other = 0, ready = 0, wanted = 0, sockets = 0;

	for (struct tcp_link *l = st->links; l; l = l->next) {
		if (l->state != LINK_UP) {
			other += l->state != LINK_DEAD;
			continue;
		}
		up++;
		wanted += l->nconns;
		for (uint16_t i = 0; i < l->nconns; i++)
			ready += l->conns[i] && !l->conns[i]->dead && l->conns[i]->hs == HS_READY;
	}
	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++)
		sockets += st->conns[i] && !st->conns[i]->dead;
	atomic_store_explicit(&st->h_links_up, up, memory_order_relaxed);
	atomic_store_explicit(&st->h_links_other, other, memory_order_relaxed);
	atomic_store_explicit(&st->h_conns_ready, ready, memory_order_relaxed);
	atomic_store_explicit(&st->h_conns_wanted, wanted, memory_order_relaxed);
	atomic_store_explicit(&st->h_sockets, sockets, memory_order_relaxed);
}

int tcp_check_time(struct tcp_state *st)
{
	uint64_t now = reactor_now(st->engine);
	int n = 0;

	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++) {
		struct tcp_conn *c = st->conns[i];

		if (!c || c->dead || c->hs == HS_READY || now < c->hs_deadline)
			continue;
		if (c->link && c->caller) {
			log_info("tcp: engine %s: handshake with %s timed out", st->engine->name,
				 c->link->peer_name);
			tcp_hs_fail(st, c, -EHOSTUNREACH, NULL);
		} else {
			char addr[NETADDR_MAX];

			netaddr_format((struct sockaddr *)&c->peer_sa, addr, sizeof(addr));
			STAT_ADD(st->engine->stats.handshakes_dropped, 1);
			log_limited(FERRY__LOG_WARN, "tcp: engine %s: a caller at %s%s%s%s did not "
				    "finish its handshake within %u ms: hung up", st->engine->name,
				    addr, c->peer_name[0] ? " (\"" : "", c->peer_name,
				    c->peer_name[0] ? "\")" : "",
				    (unsigned)(st->engine->handshake_ns / 1000000));
			tcp_conn_kill(st, c);
		}
		n++;
	}
	for (struct tcp_link *l = st->links; l; l = l->next) {
		struct tcp_conn *c;

		if (l->state == LINK_ENDING && now - l->ended_ns >= TCP_END_GRACE_NS) {
			log_warn("tcp: engine %s: %s ended some connections of its link and kept "
				 "the others open for %llu ms: link dropped", st->engine->name,
				 l->peer_name, (unsigned long long)(TCP_END_GRACE_NS / 1000000));
			tcp_link_fail(st, l, -ECONNRESET, NULL);
			n++;
			continue;
		}
		if (l->state != LINK_UP)
			continue;
		if (now - l->last_rx_ns > st->peer_timeout_ns) {
			log_warn("tcp: engine %s: %s silent for %llu ms: declared dead",
				 st->engine->name, l->peer_name,
				 (unsigned long long)((now - l->last_rx_ns) / 1000000));
			tcp_link_fail(st, l, -ECONNRESET, NULL);
			n++;
			continue;
		}
		if (now - l->last_rx_ns >= st->heartbeat_ns &&
		    now - l->last_ping_ns >= st->heartbeat_ns && (c = link_primary(l))) {
			if (ctl_send(st, c, TCP_F_PING, now, 0))
				l->last_ping_ns = now;
		}
	}
	return n;
}

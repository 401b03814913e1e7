/*
 * backends/rdma/rdma_conn.c - connections of the rdma transport: rdma_cm
 * events, the authenticated handshake, faults and teardown.
 *
 * Owns: the listener, calls (rdma_resolve_addr, _route, rdma_connect),
 * accepts, the handshake on the new QP, the handshake deadline, the
 * heartbeat of an idle connection (rdma_check_time: a CREDIT the peer's
 * device must acknowledge within the ACK timeout set from peer_timeout_ms),
 * the fault path of a connection (every PUT on it ends, GETs waiting for its peer end
 * when no other connection to it lives, its peer handles are unresolved so
 * that the next PUT calls again) and the teardown once its work requests
 * came back.
 *
 * One connection per direction: the PUTs of A to B travel on the QP that A
 * called (A is its caller), B's answers (RESULTs) come back on it, and B
 * reads A's announced blocks through it; B's own PUTs to A go on the QP
 * that B calls. So there is nothing to tie-break, and order per pair is the
 * order of one QP.
 *
 * Trust. A QP is set up by rdma_cm before anything is proved (the connect
 * carries only a magic and a version, checked), and it is of no use to the
 * other end until the handshake is done: the first messages must be, in
 * this order, HELLO (caller: its name and a nonce), PROOF (callee: its
 * nonce and its HMAC over both nonces and both names: security.h), AUTH
 * (caller: its HMAC). Anything else before READY disconnects the peer. A
 * callee's QP never allows remote access; a caller's QP allows remote READs
 * (of its pool, what it announces) only once the callee proved the secret
 * to it: until then its access flags are 0. Without a secret only loopback
 * peers are served and called (sec_peer_allowed), as over tcp. A handshake has
 * params.handshake_ms (3 s by default) from the call or the accept.
 */
#include <netinet/in.h>
#include <unistd.h>

#include "netaddr.h"
#include "rdma_int.h"

static const char *const state_names[] = {
	[RC_RESOLVING] = "resolving",   [RC_CONNECTING] = "connecting",
	[RC_ACCEPTING] = "accepting",   [RC_WAIT_PROOF] = "waiting for the proof",
	[RC_WAIT_HELLO] = "waiting for hello", [RC_WAIT_AUTH] = "waiting for auth",
	[RC_READY] = "ready",           [RC_DEAD] = "dead",
};

/* ------------------------------------------------------------------ */
/* Lifetime                                                           */
/* ------------------------------------------------------------------ */

static struct rdma_conn *conn_new(struct rdma_state *st, struct rdma_cm_id *id, bool caller)
{
	struct rdma_conn *c;
	uint32_t slot;

	for (slot = 0; slot < RDMA_MAX_CONNS && st->conns[slot]; slot++)
		;
	if (slot == RDMA_MAX_CONNS) {
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: %u connections already",
			    st->engine->name, RDMA_MAX_CONNS);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (posix_memalign((void **)&c->slab, 4096, (size_t)(RDMA_RECVS + RDMA_SENDS) * RDMA_SLOT)) {
		free(c);
		return NULL;
	}
	c->st = st;
	c->id = id;
	c->slot = slot;
	c->gen = ++st->next_gen;
	c->caller = caller;
	c->refs = 1; /* the table */
	id->context = c;
	for (uint32_t i = 0; i < RDMA_SENDS; i++)
		c->send_free[i] = RDMA_SENDS - 1 - i;
	c->nsend_free = RDMA_SENDS;
	c->hs_deadline = ferry__now_ns() + st->hs_ns;
	st->conns[slot] = c;
	c->next = st->conn_list;
	st->conn_list = c;
	atomic_fetch_add_explicit(&st->h_other, 1, memory_order_relaxed);
	return c;
}

static void conn_free(struct rdma_conn *c)
{
	free(c->slab);
	free(c);
}

void rdma_conn_unref(struct rdma_state *st, struct rdma_conn *c)
{
	(void)st;
	if (--c->refs == 0)
		conn_free(c);
}

/* The QP of c on its device, its buffers registered, its receives posted. */
static int qp_setup(struct rdma_state *st, struct rdma_conn *c)
{
	struct ibv_qp_init_attr qa;
	int rc;

	if ((rc = rdma_dev_for(st, c->id->verbs, &c->dev)))
		return rc;
	c->slab_mr = ibv_reg_mr(c->dev->pd, c->slab, (size_t)(RDMA_RECVS + RDMA_SENDS) * RDMA_SLOT,
				IBV_ACCESS_LOCAL_WRITE);
	if (!c->slab_mr)
		return errno ? -errno : -ENOMEM;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = c->dev->cq;
	qa.recv_cq = c->dev->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = RDMA_SQ_DEPTH;
	qa.cap.max_recv_wr = RDMA_RECVS;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = RDMA_SEND_INLINE;
	if (rdma_create_qp(c->id, c->dev->pd, &qa)) {
		/* A device that sends nothing inline (or less): asked again without. */
		log_info("rdma: engine %s: a QP with %u bytes inline: %s; without", st->engine->name,
			 RDMA_SEND_INLINE, strerror(errno));
		qa.cap.max_inline_data = 0;
		if (rdma_create_qp(c->id, c->dev->pd, &qa)) {
			rc = errno ? -errno : -EIO;
			log_error("rdma: engine %s: rdma_create_qp: %s", st->engine->name,
				  ferry_strerror(rc));
			return rc;
		}
	}
	c->max_inline = qa.cap.max_inline_data; /* what the device granted */
	c->qp_made = true;
	c->credits = RDMA_RECVS;
	rdma_post_recvs(st, c);
	return c->recv_out == RDMA_RECVS ? 0 : -EIO;
}

static void conn_param(struct rdma_conn *c, struct rdma_conn_param *p, struct rdma_cm_pdata *pd)
{
	uint32_t rd = c->dev->max_rd < RDMA_READS_MAX ? c->dev->max_rd : RDMA_READS_MAX;

	memset(p, 0, sizeof(*p));
	memset(pd, 0, sizeof(*pd));
	pd->magic = RDMA_CM_MAGIC;
	pd->version = RDMA_VERSION;
	p->private_data = pd;
	p->private_data_len = sizeof(*pd);
	p->responder_resources = (uint8_t)rd;
	p->initiator_depth = (uint8_t)rd;
	/*
	 * 6 retries after the first try, not 7: a message the peer's device
	 * never acknowledges must fail (the heartbeat counts on it), and
	 * Soft-RoCE takes 7 to mean "retry forever" (as rnr_retry does).
	 */
	p->retry_count = RDMA_RETRIES;
	p->rnr_retry_count = 7; /* a receiver out of receives: wait (credits prevent it) */
}

/* The remote access a QP allows: 0 until its peer proved the secret (callers only). */
static int qp_access(struct rdma_conn *c, unsigned flags)
{
	struct ibv_qp_attr a = { .qp_access_flags = flags };

	return ibv_modify_qp(c->id->qp, &a, IBV_QP_ACCESS_FLAGS) ? -errno : 0;
}

static bool other_live(struct rdma_state *st, struct rdma_conn *c)
{
	for (struct rdma_conn *x = st->conn_list; x; x = x->next)
		if (x != c && x->state == RC_READY && strcmp(x->peer_name, c->peer_name) == 0)
			return true;
	return false;
}

void rdma_conn_fail(struct rdma_state *st, struct rdma_conn *c, int res, const char *why)
{
	struct ferry_engine *e = st->engine;
	bool was_ready = c->state == RC_READY;

	if (c->state == RC_DEAD)
		return;
	if (why)
		log_warn("rdma: engine %s: connection %s %s (%s) lost: %s", e->name,
			 c->caller ? "to" : "from", c->peer_name[0] ? c->peer_name : "(unknown)",
			 state_names[c->state], why);
	if (!c->caller && !was_ready && st->npreauth)
		st->npreauth--;
	atomic_fetch_sub_explicit(was_ready ? &st->h_ready : &st->h_other, 1,
				  memory_order_relaxed);
	c->state = RC_DEAD;
	c->dead_ns = ferry__now_ns();
	c->fail_res = res;
	if (c->established)
		rdma_disconnect(c->id);
	if (c->qp_made) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		ibv_modify_qp(c->id->qp, &a, IBV_QP_STATE); /* what is posted comes back flushed */
	}
	rdma_conn_drop_data(st, c, res);
	st->ndead++;
	c->refs++; /* outlive the unresolves */
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
		if (p->backend == st->b && p->transport == c)
			reactor_unresolve(e, p);
	if (was_ready && c->peer_name[0] && !other_live(st, c)) {
		for (uint32_t i = 0; i < e->max_ops; i++) {
			struct op *op = &e->ops[i];

			if (op->state == OP_PARKED && op->peer &&
			    strcmp(op->peer->name, c->peer_name) == 0)
				op_complete(e, op, res == -ECANCELED ? res : -ECONNRESET, 0, NULL);
		}
		ferry__peer_event(e, st->b, c->peer_name, PEER_LOST,
				  res == -ECANCELED ? res : -ECONNRESET);
	}
	rdma_conn_unref(st, c);
}

/*
 * Dead connections whose work requests all came back (or that waited 2 s,
 * or whose device is gone) go.
 */
void rdma_sweep(struct rdma_state *st)
{
	uint64_t now = ferry__now_ns();

	for (struct rdma_conn **pp = &st->conn_list, *c; (c = *pp);) {
		if (c->state != RC_DEAD ||
		    ((c->wr_out || c->recv_out) && !c->drop_now &&
		     now - c->dead_ns < 2000000000ull)) {
			pp = &c->next;
			continue;
		}
		*pp = c->next;
		st->ndead--;
		st->conns[c->slot] = NULL;
		if (c->qp_made)
			rdma_destroy_qp(c->id); /* no DMA into our blocks after this */
		c->wr_out = 0;
		rdma_conn_drop_data(st, c, c->fail_res); /* incoming PUTs whose READs were out */
		if (c->slab_mr)
			ibv_dereg_mr(c->slab_mr);
		c->slab_mr = NULL;
		rdma_destroy_id(c->id);
		c->id = NULL;
		rdma_conn_unref(st, c);
	}
}

uint8_t rdma_ack_timeout_for(uint64_t peer_timeout_ns)
{
	uint8_t t = 8; /* about 1 ms a try: below that a busy fabric would look dead */

	while (t < 24 && ((RDMA_RETRIES + 1ull) * 4096ull << (t + 1)) <= peer_timeout_ns)
		t++;
	return t;
}

/*
 * Handshakes past their deadline fail; an incoming PUT of a block being
 * filled whose sender said nothing more for peer_timeout_ns is refused
 * (rdma_rx_unfilled: -ETIMEDOUT); a READY connection idle for
 * heartbeat_ns posts a CREDIT (a heartbeat). The peer's device must
 * acknowledge it: if the peer's host is gone or cut off (no DREQ ever
 * comes), the QP's retries run out and the send completes in error, which
 * ends the connection as any failed work request does (rdma_on_wc). A
 * connection with work requests out is being probed by them already, and
 * one with fewer than 2 credits keeps its last for a CREDIT of its own.
 */
void rdma_check_time(struct rdma_state *st)
{
	uint64_t now = ferry__now_ns();

	rdma_gd_sweep(st, now);
	for (struct rdma_conn *c = st->conn_list; c; c = c->next) {
		if (c->state == RC_READY) {
			struct rdma_hdr h = { .type = RM_CREDIT };
			bool stopped = false;

			for (struct rdma_rx *r = c->rx_head; r; r = r->next) {
				if (r->state == RX_READING && r->limit < r->len &&
				    now - r->fill_ns >= st->peer_timeout_ns) {
					log_warn("rdma: engine %s: %s said nothing more of a block "
						 "it is filling for %llu ms: that PUT is refused",
						 st->engine->name, c->peer_name,
						 (unsigned long long)(st->peer_timeout_ns / 1000000));
					rdma_rx_unfilled(r, -ETIMEDOUT);
					stopped = true;
				}
			}
			if (stopped)
				rdma_conn_pump(st, c);

			if (now - c->last_tx_ns >= st->heartbeat_ns && !c->wr_out &&
			    rdma_post_msg(st, c, &h, NULL, 0, NULL, 0, NULL, 0, true) == 0)
				atomic_fetch_add_explicit(&st->h_heartbeats, 1,
							  memory_order_relaxed);
			continue;
		}
		if (c->state == RC_DEAD || now < c->hs_deadline)
			continue;
		rdma_conn_fail(st, c, c->established ? -ETIMEDOUT : -EHOSTUNREACH,
			       "the handshake took too long");
	}
}

/* Before connect / accept: the QP's acknowledgement timeout (rdma_state.ack_timeout). */
static void set_ack_timeout(struct rdma_state *st, struct rdma_cm_id *id)
{
	uint8_t t = st->ack_timeout;

	if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)) &&
	    !st->ack_timeout_warned) {
		st->ack_timeout_warned = true;
		log_warn("rdma: engine %s: cannot set the queue pairs' ACK timeout (%s): a silent "
			 "peer is found dead after the device's default retries, not within "
			 "peer_timeout_ms", st->engine->name, ferry_strerror(-errno));
	}
}

/* ------------------------------------------------------------------ */
/* Calls and the listener                                             */
/* ------------------------------------------------------------------ */

int rdma_listen_start(struct rdma_state *st)
{
	struct sockaddr_storage ss;
	char text[NETADDR_MAX];
	int rc;

	if ((rc = rdma_parse_uri(st->listen_text, &ss)))
		return rc;
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
		log_error("ferry_engine_create: rdma_listen %s is not a loopback address and the "
			  "engine has no cluster secret", st->listen_text);
		return -EACCES;
	}
	if (rdma_create_id(st->ec, &st->listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(st->listen_id, (struct sockaddr *)&ss) ||
	    rdma_listen(st->listen_id, 128)) {
		rc = errno ? -errno : -EIO;
		log_error("ferry_engine_create: rdma_listen %s: %s", st->listen_text,
			  ferry_strerror(rc));
		if (st->listen_id)
			rdma_destroy_id(st->listen_id);
		st->listen_id = NULL;
		return rc;
	}
	{
		const struct sockaddr *la = rdma_get_local_addr(st->listen_id);

		memcpy(&st->bound_sa, la, la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
								   : sizeof(struct sockaddr_in));
	}
	netaddr_format(rdma_get_local_addr(st->listen_id), text, sizeof(text));
	if (strlen(text) + 2 > sizeof(st->bound))
		return -ENAMETOOLONG;
	memcpy(st->bound, "rdma://", 7);
	memcpy(st->bound + 7, text + 6, strlen(text + 6) + 1); /* text is tcp://HOST:PORT */
	return 0;
}

int rdma_conn_call(struct rdma_state *st, struct ferry_peer *peer, struct rdma_conn **out)
{
	char uri[PEER_ADDR_MAX];
	struct sockaddr_storage dst, src;
	struct rdma_cm_id *id;
	struct rdma_conn *c;
	int rc;

	if (!ferry__peer_addr_get(peer, "rdma", uri, sizeof(uri)) || rdma_parse_uri(uri, &dst))
		return -EINVAL;
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&dst))
		return -EACCES;
	if (rdma_create_id(st->ec, &id, NULL, RDMA_PS_TCP))
		return -errno;
	c = conn_new(st, id, true);
	if (!c) {
		rdma_destroy_id(id);
		return -ENOMEM;
	}
	snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer->name);
	memcpy(&c->peer_sa, &dst, sizeof(dst));
	c->state = RC_RESOLVING;
	/* From the address we listen on: the device of this engine, over the wire. */
	if (st->listen_id) {
		memcpy(&src, rdma_get_local_addr(st->listen_id), sizeof(struct sockaddr_in6));
		if (src.ss_family == AF_INET)
			((struct sockaddr_in *)&src)->sin_port = 0;
		else
			((struct sockaddr_in6 *)&src)->sin6_port = 0;
	}
	if (rdma_resolve_addr(id, st->listen_id ? (struct sockaddr *)&src : NULL,
			      (struct sockaddr *)&dst, RDMA_CONNECT_MS)) {
		rc = -errno;
		log_warn("rdma: engine %s: rdma_resolve_addr %s: %s", st->engine->name, uri,
			 ferry_strerror(rc));
		rdma_conn_fail(st, c, -EHOSTUNREACH, NULL);
		return rc;
	}
	*out = c;
	return 0;
}

/* ------------------------------------------------------------------ */
/* The handshake                                                      */
/* ------------------------------------------------------------------ */

int rdma_send_ctl(struct rdma_state *st, struct rdma_conn *c, uint8_t type, const void *key,
		  uint16_t key_len, const void *body, uint32_t body_len)
{
	struct rdma_hdr h = { .type = type, .key_len = key_len };

	return rdma_post_msg(st, c, &h, key, key_len, body, body_len, NULL, 0, false);
}

static void refuse(struct rdma_state *st, struct rdma_conn *c, const char *why)
{
	atomic_fetch_add_explicit(&st->h_refused, 1, memory_order_relaxed);
	log_warn("rdma: engine %s: %s %s refused: %s", st->engine->name,
		 c->caller ? "callee" : "caller", c->peer_name[0] ? c->peer_name : "(unnamed)", why);
	rdma_conn_fail(st, c, -EACCES, NULL);
}

static void became_ready(struct rdma_state *st, struct rdma_conn *c)
{
	if (!c->caller && st->npreauth)
		st->npreauth--;
	c->state = RC_READY;
	atomic_fetch_sub_explicit(&st->h_other, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&st->h_ready, 1, memory_order_relaxed);
	rdma_conn_pump(st, c);
}

void rdma_hs_message(struct rdma_state *st, struct rdma_conn *c, const struct rdma_hdr *h,
		     const uint8_t *body, uint32_t body_len)
{
	struct ferry_engine *e = st->engine;
	uint8_t mac[SEC_MAC_BYTES], pb[SEC_NONCE_BYTES + SEC_MAC_BYTES];
	const uint8_t *key = body;

	switch (c->state) {
	case RC_ACCEPTING: /* its HELLO may come before the ESTABLISHED event */
	case RC_WAIT_HELLO:
		if (h->type != RM_HELLO || h->key_len == 0 || h->key_len >= FERRY_NAME_MAX ||
		    memchr(key, '\0', h->key_len) || body_len != (uint32_t)h->key_len + SEC_NONCE_BYTES) {
			refuse(st, c, "its first message is not a well-formed HELLO");
			return;
		}
		memcpy(c->peer_name, key, h->key_len);
		c->peer_name[h->key_len] = '\0';
		memcpy(c->nonce_peer, body + h->key_len, SEC_NONCE_BYTES);
		if (sec_nonce(c->nonce_me, SEC_NONCE_BYTES)) {
			rdma_conn_fail(st, c, -EIO, "no random bytes for a nonce");
			return;
		}
		sec_proof(&st->secret, "ferry-rdma-callee", c->nonce_peer, c->nonce_me, c->peer_name,
			  e->name, e->ns, 0, 0, mac);
		memcpy(pb, c->nonce_me, SEC_NONCE_BYTES);
		memcpy(pb + SEC_NONCE_BYTES, mac, SEC_MAC_BYTES);
		if (rdma_send_ctl(st, c, RM_PROOF, NULL, 0, pb, sizeof(pb))) {
			rdma_conn_fail(st, c, -EIO, "cannot send the proof");
			return;
		}
		c->state = RC_WAIT_AUTH;
		return;
	case RC_WAIT_PROOF:
		if (h->type != RM_PROOF || h->key_len || body_len != sizeof(pb)) {
			refuse(st, c, "its answer to HELLO is not a well-formed PROOF");
			return;
		}
		memcpy(c->nonce_peer, body, SEC_NONCE_BYTES);
		sec_proof(&st->secret, "ferry-rdma-callee", c->nonce_me, c->nonce_peer, e->name,
			  c->peer_name, e->ns, 0, 0, mac);
		if (!sec_proof_equal(mac, body + SEC_NONCE_BYTES)) {
			refuse(st, c, "it did not prove the cluster secret");
			return;
		}
		sec_proof(&st->secret, "ferry-rdma-caller", c->nonce_me, c->nonce_peer, e->name,
			  c->peer_name, e->ns, 0, 0, mac);
		if (rdma_send_ctl(st, c, RM_AUTH, NULL, 0, mac, sizeof(mac))) {
			rdma_conn_fail(st, c, -EIO, "cannot send the proof");
			return;
		}
		/* The callee proved the secret: now it may read what we announce. */
		if (qp_access(c, IBV_ACCESS_REMOTE_READ)) {
			rdma_conn_fail(st, c, -EIO, "ibv_modify_qp (remote read) failed");
			return;
		}
		became_ready(st, c);
		return;
	case RC_WAIT_AUTH:
		if (h->type != RM_AUTH || h->key_len || body_len != SEC_MAC_BYTES) {
			refuse(st, c, "its answer to PROOF is not a well-formed AUTH");
			return;
		}
		sec_proof(&st->secret, "ferry-rdma-caller", c->nonce_peer, c->nonce_me, c->peer_name,
			  e->name, e->ns, 0, 0, mac);
		if (!sec_proof_equal(mac, body)) {
			refuse(st, c, "it did not prove the cluster secret");
			return;
		}
		became_ready(st, c);
		return;
	default:
		refuse(st, c, "a message before the connection was established");
		return;
	}
}

/* ------------------------------------------------------------------ */
/* rdma_cm events                                                     */
/* ------------------------------------------------------------------ */

static void on_connect_request(struct rdma_state *st, struct rdma_cm_id *id,
			       const struct rdma_cm_pdata *pd, uint8_t pd_len)
{
	struct rdma_conn_param p;
	struct rdma_cm_pdata mine;
	struct rdma_conn *c;
	struct sockaddr *sa = rdma_get_peer_addr(id);

	if (pd_len < sizeof(*pd) || pd->magic != RDMA_CM_MAGIC) {
		atomic_fetch_add_explicit(&st->h_malformed, 1, memory_order_relaxed);
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: a connect request that is not "
			    "ferry's (private data %u bytes): rejected", st->engine->name, pd_len);
		goto reject;
	}
	if (pd->version != RDMA_VERSION) {
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: a connect request of ferry's rdma "
			    "wire version %u (this engine speaks %u): rejected", st->engine->name,
			    (unsigned)pd->version, (unsigned)RDMA_VERSION);
		goto reject;
	}
	if (!sec_peer_allowed(&st->secret, sa)) {
		atomic_fetch_add_explicit(&st->h_refused, 1, memory_order_relaxed);
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: a caller from a non-loopback address "
			    "and no cluster secret: rejected", st->engine->name);
		goto reject;
	}
	if (st->npreauth >= RDMA_PREAUTH_MAX) {
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: %u callers have proved nothing yet: "
			    "rejected", st->engine->name, st->npreauth);
		goto reject;
	}
	c = conn_new(st, id, false);
	if (!c)
		goto reject;
	memcpy(&c->peer_sa, sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							  : sizeof(struct sockaddr_in));
	st->npreauth++;
	c->state = RC_ACCEPTING;
	if (qp_setup(st, c)) {
		rdma_reject(id, NULL, 0);
		rdma_conn_fail(st, c, -EIO, "no queue pair for it");
		return;
	}
	conn_param(c, &p, &mine);
	set_ack_timeout(st, id);
	if (rdma_accept(id, &p)) {
		rdma_conn_fail(st, c, -EIO, "rdma_accept failed");
		return;
	}
	return;
reject:
	rdma_reject(id, NULL, 0);
	rdma_destroy_id(id);
}

static void on_established(struct rdma_state *st, struct rdma_conn *c)
{
	struct ferry_engine *e = st->engine;
	size_t n = strlen(e->name);

	c->established = true;
	/* Nothing of ours is readable through it before the handshake (or ever: a callee). */
	if (qp_access(c, 0)) {
		rdma_conn_fail(st, c, -EIO, "ibv_modify_qp (no remote access) failed");
		return;
	}
	if (!c->caller) {
		if (c->state == RC_ACCEPTING)
			c->state = RC_WAIT_HELLO;
		return;
	}
	if (sec_nonce(c->nonce_me, SEC_NONCE_BYTES)) {
		rdma_conn_fail(st, c, -EIO, "no random bytes for a nonce");
		return;
	}
	c->state = RC_WAIT_PROOF;
	if (rdma_send_ctl(st, c, RM_HELLO, e->name, (uint16_t)n, c->nonce_me, SEC_NONCE_BYTES))
		rdma_conn_fail(st, c, -EIO, "cannot send HELLO");
}

static void on_event(struct rdma_state *st, enum rdma_cm_event_type type, struct rdma_cm_id *id,
		     int status, const struct rdma_cm_pdata *pd, uint8_t pd_len)
{
	struct rdma_conn *c = id->context;
	struct rdma_conn_param p;
	struct rdma_cm_pdata mine;

	if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		on_connect_request(st, id, pd, pd_len);
		return;
	}
	if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
		struct rdma_dev *d = c && c->dev ? c->dev : rdma_dev_of(st, id->verbs);

		if (d) {
			rdma_dev_gone(st, d, "rdma_cm said so");
		} else if (c) {
			/* (before its QP: on no device of ours yet) */
			c->drop_now = true;
			rdma_conn_fail(st, c, -ECONNRESET, "its device was removed");
			rdma_sweep(st);
		} else if (id == st->listen_id) {
			rdma_listener_lost(st);
		}
		return;
	}
	if (!c || c->state == RC_DEAD)
		return;
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(id, RDMA_CONNECT_MS))
			rdma_conn_fail(st, c, -EHOSTUNREACH, "rdma_resolve_route failed");
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (qp_setup(st, c)) {
			rdma_conn_fail(st, c, -EHOSTUNREACH, "no queue pair");
			return;
		}
		conn_param(c, &p, &mine);
		set_ack_timeout(st, id);
		c->state = RC_CONNECTING;
		if (rdma_connect(id, &p))
			rdma_conn_fail(st, c, -EHOSTUNREACH, "rdma_connect failed");
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		on_established(st, c);
		return;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		c->established = false;
		rdma_conn_fail(st, c, c->caller && c->state <= RC_CONNECTING ? -EHOSTUNREACH
									     : -ECONNRESET,
			       rdma_event_str(type));
		(void)status;
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
		rdma_conn_fail(st, c, -ECONNRESET, "the peer disconnected");
		return;
	default:
		return;
	}
}

void rdma_cm_events(struct rdma_state *st)
{
	struct rdma_cm_event *ev;

	if (!st->ec)
		return;
	for (int n = 0; n < 256 && rdma_get_cm_event(st->ec, &ev) == 0; n++) {
		enum rdma_cm_event_type type = ev->event;
		struct rdma_cm_id *id = ev->id;
		int status = ev->status;
		struct rdma_cm_pdata pd;
		uint8_t pd_len = ev->param.conn.private_data_len;

		memset(&pd, 0, sizeof(pd));
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST && ev->param.conn.private_data)
			memcpy(&pd, ev->param.conn.private_data,
			       pd_len < sizeof(pd) ? pd_len : sizeof(pd));
		/* Acked first: rdma_destroy_id waits for its events' acks. */
		rdma_ack_cm_event(ev);
		on_event(st, type, id, status, &pd, pd_len);
	}
}

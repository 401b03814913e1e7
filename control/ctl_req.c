/*
 * control/ctl_req.c - the requests that ride a control channel session.
 *
 * Owns: our requests (a table of 1024 waiting for their answers: PEER_HEALTH,
 * LOOKUP, REMOTE_CANCEL, and the FETCH of a LOOKUP GET), the peer's requests
 * answered here (health, where a key waits, a fetch of a published key, the
 * cleanup of a request), store-like keys (a PUBLISH PUT kept in the key
 * table; a fetch that finds nothing yet parks an engine-made GET with a
 * callback on the key, so the publish itself sends it), and the hooks the
 * reactor calls for those ops. Sessions: ctl_session.c; sockets: ctl_sock.c;
 * handshakes: ctl_hello.c.
 */
#ifdef FERRY_HAVE_ZMQ
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_int.h"

void ctl_req_free(struct ctl_state *st, struct ctl_req *r)
{
	r->type = 0;
	r->op = NULL;
	st->nreqs--;
}

/*
 * One peer's part of a LOOKUP of every peer (res: 1 or 2 it holds the key,
 * 0 not, < 0 it did not answer). A holder is a CQE of its own (MORE: res
 * 1 or 2, len its size, its name as text in the buffer); the last part
 * completes the op: res = how many hold it.
 */
static void lookup_all_part(struct ctl_state *st, struct ctl_req *r, int res, uint64_t len)
{
	struct ferry_engine *e = st->e;
	struct op *op = r->op;

	if (!op || op->gen != r->op_gen || !op_state_pending(op->state))
		return; /* it ended (deadline, cancel) */
	if (res > 0) {
		size_t n = strlen(r->peer);
		struct ferry_buf *name = NULL;

		if (!op_can_post_more(e, op) || pool_alloc(e->pool, n + 1, &name)) {
			log_warn("ctl: engine %s: LOOKUP of %s at every peer: no room to report "
				 "holder %s", e->name, r->key, r->peer);
		} else {
			memcpy(name->data, r->peer, n + 1);
			name->len = n;
			op_post_more(e, op, res, len, name);
		}
		op->chunk++;
	} else if (res < 0) {
		log_info("ctl: engine %s: LOOKUP of %s at every peer: %s did not answer: %s",
			 e->name, r->key, r->peer, ferry_strerror(res));
	}
	if (--op->iovcnt)
		return;
	op_complete(e, op, (int)op->chunk, 0, NULL);
}

/* Complete a request's op with res (unless it ended meanwhile). */
void ctl_req_finish(struct ctl_state *st, struct ctl_req *r, int res, uint64_t len,
		    struct ferry_buf *buf)
{
	struct op *op = r->op;

	if (r->all) {
		lookup_all_part(st, r, res, len);
		ctl_req_free(st, r);
		return;
	}

	if (op && op->gen == r->op_gen && op_state_pending(op->state))
		op_complete(st->e, op, res, len, buf);
	else if (buf)
		pool_free(buf);
	ctl_req_free(st, r);
}

void ctl_req_send(struct ctl_state *st, struct ctl_session *s, struct ctl_req *r)
{
	struct ctl_key k = { 0 };
	int rc;

	if (r->type == CTL_HEALTH_REQ) {
		rc = ctl_send_msg(st, s, CTL_HEALTH_REQ, r->seq, NULL, 0, NULL, 0);
	} else {
		k.flags = htole32(r->flags);
		k.timeout_ms = htole32(r->timeout_ms);
		k.key_len = htole16(r->key_len);
		rc = ctl_send_msg(st, s, r->type, r->seq, &k, sizeof(k), r->key, r->key_len);
	}
	if (rc) {
		ctl_req_finish(st, r, rc == -EHOSTUNREACH ? -ECONNRESET : rc, 0, NULL);
		return;
	}
	r->sent = true;
	r->sess = (uint32_t)(s - st->sessions) + 1;
	if (r->type == CTL_FETCH && !(r->flags & CTL_FETCH_NOWAIT) &&
	    (s->peer_caps & CTL_CAP_FORGET) && r->op && r->op->gen == r->op_gen &&
	    op_state_pending(r->op->state)) {
		/*
		 * The holder may remember the wish: should the GET end without
		 * its data, even before the answer comes, it is told to forget
		 * (FORGET follows the FETCH on the session). An answer other
		 * than "remembered" takes the mark off.
		 */
		r->op->flags |= OP_F_WISH;
		r->op->wish_seq = r->seq;
		r->op->key_len = r->key_len;
		memcpy(r->op->key, r->key, (size_t)r->key_len + 1);
	}
}

/* A GET from peer `name` waits parked: fail those that asked the control channel. */
void ctl_fail_lookup_gets(struct ctl_state *st, const char *name, int res)
{
	struct ferry_engine *e = st->e;

	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *op = &e->ops[i];

		if (op->state == OP_PARKED && op->peer && strcmp(op->peer->name, name) == 0 &&
		    (op->opcode == FERRY_OP_FETCH ||
		     (op->opcode == FERRY_OP_GET && (op->flags & FERRY_SQE_CB_REACTOR) &&
		      op->cb_arg == st)))
			op_complete(e, op, res, 0, NULL);
	}
}


/* ------------------------------------------------------------------ */
/* Requests answered here                                              */
/* ------------------------------------------------------------------ */

/* Parse a ctl_key body: 0 and the key (NUL-terminated) or -EPROTO. */
int ctl_key_parse(const uint8_t *body, size_t blen, struct ctl_key *k, char *key)
{
	if (blen < CTL_KEY_BYTES)
		return -EPROTO;
	memcpy(k, body, sizeof(*k));
	k->flags = le32toh(k->flags);
	k->timeout_ms = le32toh(k->timeout_ms);
	k->key_len = le16toh(k->key_len);
	if (k->resv || k->resv2 || k->key_len == 0 || k->key_len >= FERRY_KEY_MAX ||
	    blen != CTL_KEY_BYTES + (size_t)k->key_len ||
	    memchr(body + CTL_KEY_BYTES, '\0', k->key_len) || (k->flags & ~CTL_FETCH_NOWAIT))
		return -EPROTO;
	memcpy(key, body + CTL_KEY_BYTES, k->key_len);
	key[k->key_len] = '\0';
	return 0;
}

/* Send key's data (buf, ours now) to peer over the data path, as an engine-made PUT. */
static int push_to(struct ferry_engine *e, struct ferry_peer *peer, const char *key,
		   uint16_t key_len, struct ferry_buf *buf, uint64_t len, uint64_t timeout_ns)
{
	struct op *op = op_alloc_internal(e);
	int rc;

	if (!op) {
		log_warn("ctl: engine %s: no free op to send %s to %s: dropped", e->name, key,
			 peer->name);
		pool_free(buf);
		return -ENOBUFS;
	}
	op->opcode = FERRY_OP_PUT;
	op->peer = peer;
	op->buf = buf;
	op->len = len;
	op->key_len = key_len;
	memcpy(op->key, key, key_len);
	op->key[key_len] = '\0';
	op->state = OP_AWAY;
	rc = reactor_send(e, op);
	if (rc) {
		log_warn("ctl: engine %s: sending %s to %s: %s", e->name, key, peer->name,
			 ferry_strerror(rc));
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
		return rc;
	}
	if (op->state == OP_AWAY)
		op_arm_deadline(e, op, timeout_ns);
	return 0;
}

/* A published key a peer waits for has come (or the wait ended): send it. */
static void fetch_ready(const struct ferry_cqe *cqe, void *arg)
{
	struct op *op = (struct op *)(uintptr_t)cqe->user_data;
	struct ctl_state *st = arg;

	if (cqe->res < 0 || !cqe->buf)
		return; /* deadline, cleanup, shutdown: nothing to send */
	push_to(st->e, op->peer, op->key, op->key_len, cqe->buf, cqe->len, st->peer_timeout_ns);
}

static int take_published(struct ferry_engine *e, const char *fullkey, size_t n,
			  struct ferry_buf **buf, uint64_t *len)
{
	uint64_t h = keytable_hash(fullkey, n);
	struct key_entry *ke = keytable_find(&e->keys, fullkey, n, h);

	if (!ke || !ke->present)
		return -EAGAIN;
	*buf = ke->buf;
	*len = ke->len;
	ke->buf = NULL;
	ke->present = false;
	STAT_ADD(e->keys.present, (uint32_t)-1);
	keytable_put(&e->keys, ke);
	return 0;
}

int ctl_on_fetch(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		 const char *key, uint64_t seq)
{
	struct ferry_engine *e = st->e;
	char fullkey[FULLKEY_MAX];
	struct ferry_buf *buf;
	struct key_entry *ke;
	struct op *op;
	uint64_t len, timeout;
	int n = keytable_compose(fullkey, key, k->key_len, e->name, s->peer_name);

	if (n < 0)
		return n;
	if (!s->peer->backend && !atomic_load(&s->peer->naddrs)) {
		/* Nowhere to send it: it published no data address and has no link to us. */
		log_warn("ctl: engine %s: %s asks for %s but listens for no data: refused",
			 e->name, s->peer_name, key);
		return -EHOSTUNREACH;
	}
	if (take_published(e, fullkey, (size_t)n, &buf, &len) == 0)
		return push_to(e, s->peer, key, k->key_len, buf, len, st->peer_timeout_ns);
	if (k->flags & CTL_FETCH_NOWAIT)
		return -EAGAIN;
	/* Remember the wish: a GET op of the engine's parked on the key, with a callback. */
	op = op_alloc_internal(e);
	if (!op)
		return -ENOBUFS;
	ke = keytable_get(&e->keys, fullkey, (size_t)n, keytable_hash(fullkey, (size_t)n));
	if (!ke) {
		ferry__op_free(e, op);
		return -ENOSPC;
	}
	STAT_ADD(e->stats.submitted, 1);
	op->opcode = FERRY_OP_GET;
	op->flags = FERRY_SQE_CB_REACTOR;
	op->cb = fetch_ready;
	op->cb_arg = st;
	op->user_data = (uintptr_t)op;
	op->peer = s->peer;
	op->key_len = k->key_len;
	memcpy(op->key, key, (size_t)k->key_len + 1);
	op->wish_seq = seq;
	op->state = OP_PARKED;
	op->entry = ke;
	op_list_append(&ke->waiters, &ke->waiters_tail, op);
	timeout = k->timeout_ms ? (uint64_t)k->timeout_ms * 1000000ull : CTL_FETCH_MAX_NS;
	op_arm_deadline(e, op, timeout < CTL_FETCH_MAX_NS ? timeout : CTL_FETCH_MAX_NS);
	return 1;
}

void ctl_on_forget(struct ctl_state *st, struct ctl_session *s, const char *key,
		   uint16_t key_len, uint64_t seq)
{
	struct ferry_engine *e = st->e;
	char fullkey[FULLKEY_MAX];
	struct key_entry *ke;
	int n = keytable_compose(fullkey, key, key_len, e->name, s->peer_name);

	if (n < 0)
		return;
	ke = keytable_find(&e->keys, fullkey, (size_t)n, keytable_hash(fullkey, (size_t)n));
	for (struct op *op = ke ? ke->waiters : NULL; op; op = op->next) {
		if (op->cb == fetch_ready && op->cb_arg == st && op->peer == s->peer &&
		    op->wish_seq == seq) {
			log_debug("ctl: engine %s: %s no longer waits for %s: wish dropped", e->name,
				  s->peer_name, key);
			op_complete(e, op, -ECANCELED, 0, NULL);
			return;
		}
	}
	/* Served meanwhile (the data is on its way), or its deadline passed. */
	log_debug("ctl: engine %s: %s forgets %s, which waits for nothing here", e->name,
		  s->peer_name, key);
}

/*
 * Where is the peer's key waiting here? 1: published for it (a PUT with
 * PUBLISH to it); 2: arrived from it and not yet taken; 0: neither.
 */
int ctl_on_lookup(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		  const char *key, uint64_t *len)
{
	struct ferry_engine *e = st->e;
	char fullkey[FULLKEY_MAX];
	struct key_entry *ke;

	*len = 0;
	for (int where = 1; where <= 2; where++) {
		int n = keytable_compose(fullkey, key, k->key_len,
					 where == 1 ? e->name : s->peer_name,
					 where == 1 ? s->peer_name : e->name);

		if (n < 0)
			return n;
		ke = keytable_find(&e->keys, fullkey, (size_t)n,
				   keytable_hash(fullkey, (size_t)n));
		if (ke && ke->present) {
			*len = ke->len;
			return where;
		}
	}
	return 0;
}

int ctl_on_cancel(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		  const char *r)
{
	struct ferry_engine *e = st->e;
	int n;

	/* What came from it, what we published for it (and its wishes parked there), its streams. */
	n = ferry__cleanup_keys(e, r, k->key_len, s->peer_name, e->name);
	n += ferry__cleanup_keys(e, r, k->key_len, e->name, s->peer_name);
	n += stream_cleanup(e, r, k->key_len, s->peer);
	log_info("ctl: engine %s: %s cancelled request %s here (%d dropped)", e->name,
		 s->peer_name, r, n);
	return n;
}

void ctl_on_health_req(struct ctl_state *st, struct ctl_session *s, uint64_t seq)
{
	size_t cap = CTL_MAX_MSG - CTL_HDR_BYTES - sizeof(struct ctl_answer);
	char *text = malloc(cap);
	struct ctl_answer a = { 0 };
	int n;

	if (!text) {
		ctl_send_answer(st, s, CTL_HEALTH, seq, -ENOMEM, 0);
		return;
	}
	n = ferry_engine_health(st->e, text, cap);
	if (n < 0 || (size_t)n >= cap) {
		ctl_send_answer(st, s, CTL_HEALTH, seq, n < 0 ? n : -EMSGSIZE, 0);
	} else {
		a.res = (int32_t)htole32((uint32_t)n);
		a.len = htole64((uint64_t)n);
		ctl_send_msg(st, s, CTL_HEALTH, seq, &a, sizeof(a), text, (size_t)n);
	}
	free(text);
}

/* ------------------------------------------------------------------ */
/* Answers to our requests                                             */
/* ------------------------------------------------------------------ */

static struct ctl_req *req_find(struct ctl_state *st, struct ctl_session *s, uint64_t seq)
{
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
		struct ctl_req *r = &st->reqs[i];

		if (r->type && r->sent && r->seq == seq && strcmp(r->peer, s->peer_name) == 0)
			return r;
	}
	return NULL;
}

void ctl_on_answer(struct ctl_state *st, struct ctl_session *s, const struct ctl_hdr *h,
		   const uint8_t *body)
{
	static const uint8_t asked[CTL__MAX] = {
		[CTL_HEALTH] = CTL_HEALTH_REQ, [CTL_LOOKUP_ANS] = CTL_LOOKUP,
		[CTL_FETCH_ANS] = CTL_FETCH, [CTL_CANCEL_ANS] = CTL_CANCEL,
	};
	struct ctl_req *r = req_find(st, s, h->seq);
	struct ctl_answer a;
	struct ferry_buf *buf = NULL;
	int32_t res;

	if (!r || r->type != asked[h->type]) {
		log_info("ctl: engine %s: %s from %s answers nothing we asked (seq %llu): dropped",
			 st->e->name, ctl_type_name(h->type), s->peer_name, (unsigned long long)h->seq);
		return;
	}
	if (h->len < sizeof(a) || (h->type != CTL_HEALTH && h->len != sizeof(a))) {
		CTL_DROP(st, "ctl: engine %s: %s from %s of %u bytes: malformed, dropped", st->e->name,
			 ctl_type_name(h->type), s->peer_name, h->len);
		ctl_req_finish(st, r, -EPROTO, 0, NULL);
		return;
	}
	memcpy(&a, body, sizeof(a));
	res = (int32_t)le32toh((uint32_t)a.res);
	a.len = le64toh(a.len);
	if (res < -4095 || (h->type == CTL_HEALTH && res >= 0 &&
			    ((uint64_t)res != h->len - sizeof(a) || a.len != (uint64_t)res))) {
		CTL_DROP(st, "ctl: engine %s: %s from %s: result %d does not fit: dropped", st->e->name,
			 ctl_type_name(h->type), s->peer_name, res);
		ctl_req_finish(st, r, -EPROTO, 0, NULL);
		return;
	}
	switch (h->type) {
	case CTL_HEALTH:
		if (res >= 0) {
			int rc = pool_alloc(st->e->pool, (size_t)res + 1, &buf);

			if (rc) {
				ctl_req_finish(st, r, rc, 0, NULL);
				return;
			}
			memcpy(buf->data, body + sizeof(a), (size_t)res);
			((char *)buf->data)[res] = '\0';
			buf->len = (uint64_t)res;
		}
		ctl_req_finish(st, r, res, res >= 0 ? (uint64_t)res : 0, buf);
		return;
	case CTL_LOOKUP_ANS:
		if (res > 2)
			res = -EPROTO;
		ctl_req_finish(st, r, res, res > 0 ? a.len : 0, NULL);
		return;
	case CTL_FETCH_ANS:
		/* Only a wish the holder remembered (1) is withdrawn should the GET end. */
		if (res != 1 && r->op && r->op->gen == r->op_gen && op_state_pending(r->op->state))
			r->op->flags &= ~OP_F_WISH;
		if (res < 0) {
			ctl_req_finish(st, r, res, 0, NULL); /* -EAGAIN: nobody holds it yet */
			return;
		}
		/* Sent, or remembered: the data completes the GET. */
		ctl_req_free(st, r);
		return;
	default: /* CTL_CANCEL_ANS */
		ctl_req_finish(st, r, res, 0, NULL);
		return;
	}
}

/* ------------------------------------------------------------------ */
/* Hooks the reactor calls                                             */
/* ------------------------------------------------------------------ */

static struct ctl_req *req_new(struct ctl_state *st)
{
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
		struct ctl_req *r = &st->reqs[i];

		if (!r->type) {
			memset(r, 0, sizeof(*r));
			r->seq = ++st->next_seq;
			st->nreqs++;
			return r;
		}
	}
	return NULL;
}

/* Queue a request for op to op->peer; it is sent once the session is READY. */
static int req_start(struct ctl_state *st, struct op *op, uint8_t type, const char *key,
		     uint16_t key_len, uint32_t flags, uint32_t timeout_ms)
{
	struct ctl_session *s;
	struct ctl_req *r;

	ctl_connects_first(st);
	s = ctl_session_for(st, op->peer->name, false);
	if (!s)
		return -ENOTCONN;
	r = req_new(st);
	if (!r) {
		log_limited(FERRY__LOG_WARN, "ctl: engine %s: %d requests wait for answers: "
			    "refusing more", st->e->name, CTL_MAX_REQS);
		return -ENOBUFS;
	}
	r->type = type;
	r->op = op;
	r->op_gen = op->gen;
	snprintf(r->peer, sizeof(r->peer), "%s", op->peer->name);
	r->flags = flags;
	r->timeout_ms = timeout_ms;
	r->key_len = key_len;
	if (key_len)
		memcpy(r->key, key, key_len);
	r->key[key_len] = '\0';
	if (s->state == CS_READY)
		ctl_req_send(st, s, r);
	return 0;
}

/*
 * The session a LOOKUP of every peer asks peer s over: two engines that
 * called each other have two READY sessions, and each peer counts once. A
 * peer without CTL_CAP_DIRECTORY would drop the LOOKUP unanswered and hold
 * the whole op until its deadline: it is not asked. A peer whose session is
 * still shaking hands (ferry_peer_connect just now) is asked once it is
 * READY (session_ready sends what waited, or fails it if the peer lacks
 * the capability; a handshake that fails fails it too). A caller session
 * waiting to call again (BACKOFF) does not count: that peer is down, and
 * the query would wait for it until its deadline.
 */
static bool asks_over(struct ctl_state *st, struct ctl_session *s)
{
	if (s->state == CS_READY)
		return (s->peer_caps & CTL_CAP_DIRECTORY) &&
		       ctl_session_for(st, s->peer_name, true) == s;
	return s->state != CS_FREE && s->state != CS_BACKOFF && s->peer_name[0] &&
	       !ctl_session_for(st, s->peer_name, true) &&
	       ctl_session_for(st, s->peer_name, false) == s;
}

/*
 * LOOKUP with no peer: ask every peer with a session (READY, or shaking
 * hands) at once. The op completes when the last has answered (or failed);
 * see lookup_all_part.
 */
static int lookup_all(struct ctl_state *st, struct op *op, const char *key, uint16_t key_len)
{
	struct ferry_engine *e = st->e;
	struct ctl_session *ask[CTL_MAX_SESSIONS];
	struct ctl_req *reqs[CTL_MAX_SESSIONS];
	uint32_t npeers = 0;

	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++)
		if (asks_over(st, &st->sessions[i]))
			ask[npeers++] = &st->sessions[i];
	if (!npeers)
		return -ENOTCONN;
	if (CTL_MAX_REQS - st->nreqs < npeers) {
		log_limited(FERRY__LOG_WARN, "ctl: engine %s: %d requests wait for answers: "
			    "refusing a LOOKUP of every peer", e->name, CTL_MAX_REQS);
		return -ENOBUFS;
	}
	op->len = 0;
	op->chunk = 0;
	op->iovcnt = npeers;
	op->state = OP_AWAY;
	/* Every part exists before the first is sent: a send that fails finishes its part. */
	for (uint32_t i = 0; i < npeers; i++) {
		struct ctl_req *r = req_new(st); /* room was counted above */

		r->type = CTL_LOOKUP;
		r->all = true;
		r->op = op;
		r->op_gen = op->gen;
		snprintf(r->peer, sizeof(r->peer), "%s", ask[i]->peer_name);
		r->key_len = key_len;
		memcpy(r->key, key, key_len);
		r->key[key_len] = '\0';
		reqs[i] = r;
	}
	for (uint32_t i = 0; i < npeers; i++)
		if (ask[i]->state == CS_READY)
			ctl_req_send(st, ask[i], reqs[i]); /* may finish it (the last: the op) */
	return 0;
}

static void dir_do_op(struct ferry_engine *e, void *svc, struct op *op, const struct ferry_sqe *sqe)
{
	struct ctl_state *st = svc;
	uint8_t type = sqe->opcode == FERRY_OP_PEER_HEALTH ? CTL_HEALTH_REQ
		       : sqe->opcode == FERRY_OP_LOOKUP    ? CTL_LOOKUP
							   : CTL_CANCEL;
	int rc;

	if ((!sqe->peer && type != CTL_LOOKUP) || (sqe->peer && sqe->peer->engine != e)) {
		log_error("op %llx: %s peer", (unsigned long long)sqe->user_data,
			  sqe->peer ? "foreign" : "NULL");
		op_complete(e, op, -EINVAL, 0, NULL);
		return;
	}
	if (type != CTL_HEALTH_REQ && (sqe->key_len == 0 || sqe->key_len >= FERRY_KEY_MAX)) {
		log_error("op %llx: %s of %u bytes", (unsigned long long)sqe->user_data,
			  type == CTL_LOOKUP ? "key" : "request id", sqe->key_len);
		op_complete(e, op, sqe->key_len ? -ENAMETOOLONG : -EINVAL, 0, NULL);
		return;
	}
	if (!st) {
		op_complete(e, op, -EOPNOTSUPP, 0, NULL);
		return;
	}
	if (!sqe->peer) {
		ctl_connects_first(st);
		rc = lookup_all(st, op, sqe->key, sqe->key_len);
		if (rc)
			op_complete(e, op, rc, 0, NULL);
		else if (op_state_pending(op->state) && op->iovcnt)
			op_arm_deadline(e, op, sqe->timeout_ns);
		return;
	}
	op->state = OP_AWAY;
	rc = req_start(st, op, type, sqe->key, sqe->key_len, 0, 0);
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	if (op->state == OP_AWAY)
		op_arm_deadline(e, op, sqe->timeout_ns);
}

static void dir_publish(struct ferry_engine *e, void *svc, struct op *op)
{
	char fullkey[FULLKEY_MAX];
	uint64_t len = op->len;
	int n, rc;

	(void)svc;
	n = keytable_compose(fullkey, op->key, op->key_len, e->name, op->peer->name);
	if (n < 0) {
		op_complete(e, op, n, 0, NULL);
		return;
	}
	/* Held here like any key that arrived; a wish parked on it takes it at once. */
	rc = reactor_deliver(e, NULL, fullkey, (size_t)n, op->buf, len, op->flags & WIRE_F_REPLACE);
	if (rc == 0)
		op->buf = NULL;
	op_complete(e, op, rc, rc ? 0 : len, NULL);
}

static void dir_forget(struct ferry_engine *e, void *svc, struct op *op)
{
	struct ctl_state *st = svc;
	struct ctl_session *s = st && op->peer ? ctl_session_for(st, op->peer->name, true) : NULL;
	struct ctl_key k = { .key_len = htole16(op->key_len) };

	(void)e;
	if (!s || s->state != CS_READY || !(s->peer_caps & CTL_CAP_FORGET))
		return; /* a session that ended took the wish with it */
	ctl_send_msg(st, s, CTL_FORGET, op->wish_seq, &k, sizeof(k), op->key, op->key_len);
}

static void dir_fetch(struct ferry_engine *e, void *svc, struct op *op, const struct ferry_sqe *sqe)
{
	struct ctl_state *st = svc;
	bool nowait = sqe->flags & FERRY_SQE_NOWAIT;
	uint64_t ms = sqe->timeout_ns / 1000000ull;
	int rc;

	if (!st) {
		op_complete(e, op, -EOPNOTSUPP, 0, NULL);
		return;
	}
	if (ms == 0 && sqe->timeout_ns)
		ms = 1;
	ctl_connects_first(st);
	if (nowait && !ctl_session_for(st, op->peer->name, true)) {
		op_complete(e, op, -EAGAIN, 0, NULL); /* nobody we can ask holds it yet */
		return;
	}
	rc = req_start(st, op, CTL_FETCH, sqe->key, sqe->key_len, nowait ? CTL_FETCH_NOWAIT : 0,
		       ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms);
	if (rc) {
		op_complete(e, op, rc == -ENOTCONN && nowait ? -EAGAIN : rc, 0, NULL);
		return;
	}
	/* A NOWAIT lookup waits for the answer, and for the data if it is sent: bound it. */
	if (nowait && op->heap_idx == UINT32_MAX && op_state_pending(op->state))
		op_arm_deadline(e, op, st->peer_timeout_ns);
}

/* The control channel as the engine's directory service (engine/directory.h). */
const struct directory_ops ctl_directory = {
	.name = "control channel",
	.publish = dir_publish,
	.fetch = dir_fetch,
	.forget = dir_forget,
	.do_op = dir_do_op,
};

#endif

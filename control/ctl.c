/*
 * control/ctl.c - the control channel between engines, on ZeroMQ.
 *
 * Owns: the control endpoint (a ROUTER socket bound at params.control), the
 * sessions with peers (ours: a DEALER per peer we call with
 * ferry_peer_connect; theirs: a routing id at our ROUTER), their
 * authenticated handshake (security.h's HMAC over fresh nonces, roles
 * "ferry-ctl-caller" / "ferry-ctl-callee"), the exchange of data addresses,
 * heartbeats and the dead-peer verdict, receiving and checking every
 * message, and the public calls. The requests that ride a READY session (a
 * peer's health, directory queries, fetches of published keys, remote
 * cancellation) and store-like keys live in ctl_req.c; the types both
 * share in ctl_int.h; the message format in ctl_wire.h.
 *
 * It runs inside the reactor, as a backend: no thread of ours (libzmq keeps
 * one I/O thread per context; the context is made only when the engine uses
 * the channel). Each socket's ZMQ_FD is polled with a oneshot POLL_ADD on
 * the reactor's io_uring; ZMQ_FD is edge-triggered (it signals "look at
 * ZMQ_EVENTS", not "a message waits"), so after every wake-up, and after
 * every send on a socket (a send may swallow the signal), the socket is
 * drained while ZMQ_EVENTS says POLLIN, and only then re-armed. A TIMEOUT on
 * the same ring ticks heartbeats and deadlines while sessions exist.
 *
 * As a backend it carries a PUT only while the handshake with its peer is
 * under way: the PUT waits in the session, and once the peer's data address
 * is known the PUT is handed to the transport that now reaches it (tcp).
 *
 * Liveness: every valid message of a READY session counts as a sign of
 * life; an idle session is pinged every heartbeat_ms, and one silent for
 * peer_timeout_ms is declared dead. For a peer with a control session this
 * verdict is the one that counts: it fails the peer's requests, its LOOKUP
 * GETs, and (a PEER_DEAD event, engine/transport.h) its data links, since a
 * dead engine can hold none. The data path keeps its own check of its connections with the
 * same two numbers; a data link that fails alone only fails what rode it
 * and is called again by the next PUT (the peer may well be alive).
 *
 * Trust: before a session is READY only HELLO/AUTH (callee) or PROOF/OK/NO
 * (caller) are read; everything else is dropped and logged. Every message
 * is checked (ctl_hdr_check, then its body's exact length, NUL-terminated
 * names and addresses, key lengths); a bad one is logged and dropped, a bad
 * handshake message ends the session. Without a cluster secret only
 * loopback peers are served and called (warned), as on the data path.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "ctl_wire.h"
#include "netaddr.h"
#include "security.h"

#ifdef FERRY_HAVE_ZMQ
#include <zmq.h>

#include "ctl_int.h"

struct ctl_state *ctl_state_of(struct ferry_engine *e)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops == &ferry__ctl_backend)
			return e->backends[i].data;
	return NULL;
}

static const char *check_text(int rc)
{
	return rc == -EPROTONOSUPPORT ? "another protocol version"
	       : rc == -EBADMSG       ? "an unknown type"
				      : "malformed";
}

const char *ctl_type_name(unsigned t)
{
	static const char *const names[CTL__MAX] = {
		"?", "HELLO", "PROOF", "AUTH", "OK", "NO", "PING", "PONG", "HEALTH_REQ",
		"HEALTH", "LOOKUP", "LOOKUP_ANS", "FETCH", "FETCH_ANS", "CANCEL",
		"CANCEL_ANS", "BYE", "FORGET",
	};

	return t < CTL__MAX ? names[t] : "?";
}

/* ------------------------------------------------------------------ */
/* Sockets and the reactor's ring                                      */
/* ------------------------------------------------------------------ */

static struct io_uring_sqe *ring_sqe(struct ctl_state *st)
{
	struct io_uring *ring = &st->e->ring;
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	if (!sqe)
		log_error("ctl: engine %s: the reactor's io_uring is full", st->e->name);
	return sqe;
}

void ctl_sock_arm(struct ctl_state *st, struct ctl_sock *s, uint32_t slot)
{
	struct io_uring_sqe *sqe;

	if (!s->z || s->armed || s->dirty)
		return;
	sqe = ring_sqe(st);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, s->fd, POLLIN);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, ck(CK_POLL, slot, s->gen)));
	s->armed = true;
}

void ctl_sock_close(struct ctl_state *st, struct ctl_sock *s, uint32_t slot)
{
	if (!s->z)
		return;
	if (s->armed) {
		struct io_uring_sqe *sqe = ring_sqe(st);

		if (sqe) {
			io_uring_prep_poll_remove(sqe, backend_tag(st->b, ck(CK_POLL, slot, s->gen)));
			io_uring_sqe_set_data64(sqe, backend_tag(st->b, ck(CK_CANCEL, 0, 0)));
			io_uring_submit(&st->e->ring);
		}
	}
	zmq_close(s->z);
	s->z = NULL;
	s->fd = -1;
	s->armed = false;
	s->dirty = false;
	s->gen++;
}

static int ensure_ctx(struct ctl_state *st)
{
	if (st->zctx)
		return 0;
	st->zctx = zmq_ctx_new();
	if (!st->zctx) {
		log_error("ctl: engine %s: zmq_ctx_new: %s", st->e->name, zmq_strerror(errno));
		return -ENOMEM;
	}
	zmq_ctx_set(st->zctx, ZMQ_IO_THREADS, 1);
	zmq_ctx_set(st->zctx, ZMQ_BLOCKY, 0);
	return 0;
}

/* A socket of type with our options; its ZMQ_FD into s. */
int ctl_sock_open(struct ctl_state *st, struct ctl_sock *s, int type, const char *endpoint)
{
	int zero = 0, one = 1, rc;
	int64_t maxmsg = CTL_MAX_MSG;
	size_t fdlen = sizeof(s->fd);

	if ((rc = ensure_ctx(st)))
		return rc;
	s->z = zmq_socket(st->zctx, type);
	if (!s->z) {
		rc = -errno;
		log_error("ctl: engine %s: zmq_socket: %s", st->e->name, zmq_strerror(errno));
		return rc;
	}
	zmq_setsockopt(s->z, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(s->z, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
	if (strchr(endpoint, '['))
		zmq_setsockopt(s->z, ZMQ_IPV6, &one, sizeof(one));
	if (type == ZMQ_ROUTER) {
		/*
		 * libzmq's own greeting bounded too (its default: 30 s): a second
		 * after ctl_gate.c's bound, which hangs up (and counts) first.
		 */
		int ivl = (int)(st->e->handshake_ns / 1000000) + 1000;

		zmq_setsockopt(s->z, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
		zmq_setsockopt(s->z, ZMQ_HANDSHAKE_IVL, &ivl, sizeof(ivl));
	}
	if (zmq_getsockopt(s->z, ZMQ_FD, &s->fd, &fdlen)) {
		rc = -errno;
		zmq_close(s->z);
		s->z = NULL;
		return rc;
	}
	s->armed = false;
	s->dirty = true; /* look once: the edge may have passed already */
	st->any_dirty = true;
	st->need_arm = true;
	return 0;
}

/* "tcp://HOST:0" -> "tcp://HOST:*" (ZeroMQ's way to ask for any port). */
static void zmq_endpoint(const char *in, char *out, size_t len)
{
	size_t n = strlen(in);

	if (n >= 2 && strcmp(in + n - 2, ":0") == 0 && n + 1 < len)
		snprintf(out, len, "%.*s:*", (int)(n - 2), in);
	else
		snprintf(out, len, "%s", in);
}

/* ------------------------------------------------------------------ */
/* Sending                                                             */
/* ------------------------------------------------------------------ */

static void session_dead(struct ctl_state *st, struct ctl_session *s, int res, const char *why);
static int take_connects(struct ctl_state *st);

/*
 * ferry_peer_connect calls wait in a mailbox for the next round; an op
 * submitted right after one may be taken first (SQEs are drained before
 * the backends run): take them now.
 */
void ctl_connects_first(struct ctl_state *st)
{
	if (atomic_load_explicit(&st->connects_pending, memory_order_acquire))
		take_connects(st);
}

/*
 * Send one message to a session: header, body, then extra (a key or text).
 * Returns 0, or a negative errno (the message is dropped; logged).
 */
int ctl_send_msg(struct ctl_state *st, struct ctl_session *s, uint16_t type, uint64_t seq,
		 const void *body, size_t blen, const void *extra, size_t elen)
{
	uint8_t small[CTL_HDR_BYTES + 512];
	size_t n = CTL_HDR_BYTES + blen + elen;
	uint8_t *m = n <= sizeof(small) ? small : malloc(n);
	struct ctl_sock *sk = s->caller ? &s->sock : &st->router;
	int rc = 0;

	if (!m)
		return -ENOMEM;
	if (n > CTL_MAX_MSG) {
		rc = -EMSGSIZE;
		goto out;
	}
	ctl_hdr_pack(m, type, (uint32_t)(blen + elen), seq);
	if (blen)
		memcpy(m + CTL_HDR_BYTES, body, blen);
	if (elen)
		memcpy(m + CTL_HDR_BYTES + blen, extra, elen);
	if (!sk->z) {
		rc = -ENOTCONN;
		goto out;
	}
	if (!s->caller && zmq_send(sk->z, s->id, s->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		rc = -errno;
	else if (zmq_send(sk->z, m, n, ZMQ_DONTWAIT) < 0)
		rc = -errno;
	sk->dirty = true; /* a send may have taken the edge of ZMQ_FD */
	st->any_dirty = true;
	if (rc)
		log_info("ctl: engine %s: %s to %s not sent: %s", st->e->name, ctl_type_name(type),
			 s->peer_name[0] ? s->peer_name : "a caller", zmq_strerror(-rc));
out:
	if (m != small)
		free(m);
	return rc;
}

int ctl_send_answer(struct ctl_state *st, struct ctl_session *s, uint16_t type, uint64_t seq,
		    int32_t res, uint64_t len)
{
	struct ctl_answer a = { .res = (int32_t)htole32((uint32_t)res), .len = htole64(len) };

	return ctl_send_msg(st, s, type, seq, &a, sizeof(a), NULL, 0);
}

/* ------------------------------------------------------------------ */
/* Sessions                                                            */
/* ------------------------------------------------------------------ */

static struct ctl_session *session_new(struct ctl_state *st)
{
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->state == CS_FREE) {
			uint32_t gen = s->sock.gen;

			memset(s, 0, sizeof(*s));
			s->sock.gen = gen + 1;
			s->sock.fd = -1;
			s->slot = i;
			st->nsessions++;
			return s;
		}
	}
	return NULL;
}

static void session_free(struct ctl_state *st, struct ctl_session *s)
{
	ctl_sock_close(st, &s->sock, s->slot + 1);
	s->state = CS_FREE;
	s->id_len = 0;
	s->peer_name[0] = '\0';
	s->peer = NULL;
	st->nsessions--;
}

/* The best session to peer `name`: a READY one, else (any) one in the making. */
struct ctl_session *ctl_session_for(struct ctl_state *st, const char *name, bool ready)
{
	struct ctl_session *best = NULL;

	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->state == CS_FREE || strcmp(s->peer_name, name))
			continue;
		if (s->state == CS_READY)
			return s;
		if (!ready && (!best || s->caller))
			best = s;
	}
	return best;
}

static struct ctl_session *session_by_id(struct ctl_state *st, const void *id, size_t n)
{
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->state != CS_FREE && !s->caller && s->id_len == n && memcmp(s->id, id, n) == 0)
			return s;
	}
	return NULL;
}

/*
 * Our call to a peer is through (res 0: the PUTs that waited in the engine
 * for it go to the transport that now reaches the peer) or failed (they
 * fail with res). Only our calls hold PUTs (ctl_reaching): one per peer.
 */
static void waiters_go(struct ctl_state *st, struct ctl_session *s, int res)
{
	if (s->caller && s->peer)
		ferry__peer_reached(st->e, s->peer, res);
}

/* The peer `name` has no READY session left. */
static void peer_gone(struct ctl_state *st, const char *name, int res)
{
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
		struct ctl_req *r = &st->reqs[i];

		if (r->type && strcmp(r->peer, name) == 0)
			ctl_req_finish(st, r, res, 0, NULL);
	}
	ctl_fail_lookup_gets(st, name, res);
	ferry__peer_event(st->e, st->b, name, PEER_DEAD, res); /* its data links go */
}

static void session_dead(struct ctl_state *st, struct ctl_session *s, int res, const char *why)
{
	bool was_ready = s->state == CS_READY;
	char name[FERRY_NAME_MAX];

	snprintf(name, sizeof(name), "%s", s->peer_name);
	if (was_ready)
		STAT_ADD(st->ready, (uint64_t)-1);
	if (why)
		log_warn("ctl: engine %s: session with %s ended: %s", st->e->name,
			 name[0] ? name : "a caller", why);
	waiters_go(st, s, s->state == CS_READY ? res : (s->refused ? -EACCES : -EHOSTUNREACH));
	if (s->caller) {
		ctl_sock_close(st, &s->sock, s->slot + 1);
		s->state = CS_BACKOFF;
		s->retry_at = reactor_now(st->e) + (s->refused ? st->peer_timeout_ns : st->heartbeat_ns);
	} else {
		session_free(st, s);
	}
	if (was_ready && name[0] && !ctl_session_for(st, name, true)) {
		peer_gone(st, name, res);
	} else if (was_ready && name[0]) {
		/*
		 * Another session to the peer lives on (both called each other),
		 * but what went out on this one will not be answered: fail it.
		 */
		uint32_t sess = (uint32_t)(s - st->sessions) + 1;

		for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
			struct ctl_req *r = &st->reqs[i];

			if (r->type && r->sent && r->sess == sess)
				ctl_req_finish(st, r, -ECONNRESET, 0, NULL);
		}
	} else if (name[0] && !ctl_session_for(st, name, true)) {
		/* Never reached: requests that waited for it fail (GETs wait on). */
		for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
			struct ctl_req *r = &st->reqs[i];

			if (r->type && r->type != CTL_FETCH && !r->sent && strcmp(r->peer, name) == 0)
				ctl_req_finish(st, r, s->refused ? -EACCES : -EHOSTUNREACH, 0, NULL);
		}
	}
}

/* The session is READY: note the peer's data address, let what waited go. */
static void session_ready(struct ctl_state *st, struct ctl_session *s, const char *data_addr)
{
	struct ferry_engine *e = st->e;
	struct sockaddr_storage ss;
	socklen_t sl;
	char text[NETADDR_MAX] = "";
	int rc;

	if (!s->peer && (rc = ferry_peer_open(e, s->peer_name, &s->peer))) {
		session_dead(st, s, rc, "no peer handle");
		return;
	}
	if (data_addr[0]) {
		if (netaddr_parse(data_addr, true, &ss, &sl)) {
			log_warn("ctl: engine %s: %s published a malformed data address", e->name,
				 s->peer_name);
		} else {
			/* A wildcard host means "where you found me". */
			bool any = ss.ss_family == AF_INET
					   ? ((struct sockaddr_in *)&ss)->sin_addr.s_addr == INADDR_ANY
					   : IN6_IS_ADDR_UNSPECIFIED(
						     &((struct sockaddr_in6 *)&ss)->sin6_addr);

			if (any && s->seen_host[0]) {
				char ep[NETADDR_MAX];
				unsigned port = ntohs(((struct sockaddr_in *)&ss)->sin_port);

				snprintf(ep, sizeof(ep), strchr(s->seen_host, ':') ? "tcp://[%s]:%u"
										 : "tcp://%s:%u",
					 s->seen_host, port);
				if (netaddr_parse(ep, true, &ss, &sl))
					ss.ss_family = AF_UNSPEC;
			}
			if (ss.ss_family != AF_UNSPEC)
				netaddr_format((struct sockaddr *)&ss, text, sizeof(text));
		}
	}
	if (text[0] && ferry__peer_addr_set(s->peer, text)) /* its data path's address */
		log_warn("ctl: engine %s: %s: no room for its address %s", e->name, s->peer_name,
			 text);
	s->state = CS_READY;
	s->refused = false;
	if (!s->caller)
		ctl_gate_proved(st, s->fd); /* its connection stays open */
	STAT_ADD(st->ready, 1);
	s->last_rx = s->last_ping = reactor_now(e);
	log_info("ctl: engine %s: session with %s ready (%s; data at %s)", e->name, s->peer_name,
		 s->caller ? "we called" : "it called", text[0] ? text : "none");
	waiters_go(st, s, 0);
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
		struct ctl_req *r = &st->reqs[i];

		if (!r->type || r->sent || strcmp(r->peer, s->peer_name) != 0)
			continue;
		if (r->all && !(s->peer_caps & CTL_CAP_DIRECTORY))
			ctl_req_finish(st, r, -EOPNOTSUPP, 0, NULL); /* it would drop the LOOKUP */
		else
			ctl_req_send(st, s, r);
	}
}

/* Our data address, to publish ("" when the engine listens for no data). */
static void my_data_addr(struct ctl_state *st, char out[CTL_ADDR_BYTES])
{
	memset(out, 0, CTL_ADDR_BYTES);
	if (ferry_engine_address(st->e, out, CTL_ADDR_BYTES) < 0)
		out[0] = '\0';
}

/* Call the peer: a fresh DEALER, then HELLO. */
static void call_start(struct ctl_state *st, struct ctl_session *s)
{
	struct ferry_engine *e = st->e;
	struct ctl_hello h;
	char ep[NETADDR_MAX + 2];
	int rc;

	zmq_endpoint(s->endpoint, ep, sizeof(ep));
	if ((rc = ctl_sock_open(st, &s->sock, ZMQ_DEALER, ep)))
		goto fail;
	if (zmq_connect(s->sock.z, ep)) {
		rc = -errno;
		log_error("ctl: engine %s: cannot call %s at %s: %s", e->name, s->peer_name, ep,
			  zmq_strerror(errno));
		goto fail;
	}
	if ((rc = sec_nonce(s->nonce_me, sizeof(s->nonce_me))))
		goto fail;
	memset(&h, 0, sizeof(h));
	h.caps = htole32(CTL_CAPS);
	snprintf(h.ns, sizeof(h.ns), "%s", e->ns);
	snprintf(h.caller, sizeof(h.caller), "%s", e->name);
	snprintf(h.callee, sizeof(h.callee), "%s", s->peer_name);
	memcpy(h.nonce, s->nonce_me, sizeof(h.nonce));
	s->state = CS_WAIT_PROOF;
	s->hs_deadline = reactor_now(e) + e->handshake_ns;
	if ((rc = ctl_send_msg(st, s, CTL_HELLO, 0, &h, sizeof(h), NULL, 0)))
		goto fail;
	return;
fail:
	ctl_sock_close(st, &s->sock, s->slot + 1);
	s->state = CS_BACKOFF;
	s->retry_at = reactor_now(e) + st->peer_timeout_ns;
	waiters_go(st, s, rc == -EACCES ? rc : -EHOSTUNREACH);
}

/* ------------------------------------------------------------------ */
/* Receiving                                                           */
/* ------------------------------------------------------------------ */

static bool name_ok(const char *s, size_t cap)
{
	size_t n = strnlen(s, cap);

	if (n == 0 || n >= cap)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '-' || c == '_' || c == ':'))
			return false;
	}
	return true;
}

/* ZeroMQ's Peer-Address text (a numeric IPv4 or IPv6 address) as a socket address. */
static bool peer_sockaddr(const char *text, struct sockaddr_storage *ss)
{
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if (!text)
		return false;
	in->sin_family = AF_INET;
	if (inet_pton(AF_INET, text, &in->sin_addr) == 1)
		return true;
	memset(ss, 0, sizeof(*ss));
	in6->sin6_family = AF_INET6;
	return inet_pton(AF_INET6, text, &in6->sin6_addr) == 1;
}

/* A message of a READY session. */
static void on_ready_msg(struct ctl_state *st, struct ctl_session *s, const struct ctl_hdr *h,
			 const uint8_t *body)
{
	struct ctl_key k;
	char key[FERRY_KEY_MAX];
	uint64_t len;
	int res;

	s->last_rx = reactor_now(st->e);
	switch (h->type) {
	case CTL_PING:
		if (h->len == 0)
			ctl_send_msg(st, s, CTL_PONG, h->seq, NULL, 0, NULL, 0);
		break;
	case CTL_PONG:
		break;
	case CTL_BYE:
		log_info("ctl: engine %s: %s closed its session", st->e->name, s->peer_name);
		session_dead(st, s, -ECONNRESET, NULL);
		return;
	case CTL_HEALTH_REQ:
		if (h->len)
			goto malformed;
		ctl_on_health_req(st, s, h->seq);
		break;
	case CTL_LOOKUP:
	case CTL_FETCH:
	case CTL_CANCEL:
		if (ctl_key_parse(body, h->len, &k, key))
			goto malformed;
		if (h->type == CTL_LOOKUP) {
			res = ctl_on_lookup(st, s, &k, key, &len);
			ctl_send_answer(st, s, CTL_LOOKUP_ANS, h->seq, res, len);
		} else if (h->type == CTL_FETCH) {
			res = ctl_on_fetch(st, s, &k, key, h->seq);
			ctl_send_answer(st, s, CTL_FETCH_ANS, h->seq, res, 0);
		} else {
			res = ctl_on_cancel(st, s, &k, key);
			ctl_send_answer(st, s, CTL_CANCEL_ANS, h->seq, res, 0);
		}
		break;
	case CTL_FORGET:
		if (ctl_key_parse(body, h->len, &k, key) || k.flags || k.timeout_ms)
			goto malformed;
		ctl_on_forget(st, s, key, k.key_len, h->seq);
		break;
	case CTL_HEALTH:
	case CTL_LOOKUP_ANS:
	case CTL_FETCH_ANS:
	case CTL_CANCEL_ANS:
		ctl_on_answer(st, s, h, body);
		break;
	default:
		CTL_DROP(st, "ctl: engine %s: %s from %s after the handshake: dropped", st->e->name,
			 ctl_type_name(h->type), s->peer_name);
		break;
	}
	return;
malformed:
	CTL_DROP(st, "ctl: engine %s: malformed %s (%u bytes) from %s: dropped", st->e->name,
		 ctl_type_name(h->type), h->len, s->peer_name);
}

/* Callee: a HELLO from a routing id without a session. */
static void on_hello(struct ctl_state *st, const void *id, size_t id_len, const uint8_t *body,
		     uint32_t blen, const char *peer_addr, int fd)
{
	struct ferry_engine *e = st->e;
	struct ctl_session tmp, *s;
	struct sockaddr_storage pss;
	struct ctl_hello h;
	struct ctl_proof p;

	if (blen != sizeof(h)) {
		CTL_DROP(st, "ctl: engine %s: HELLO of %u bytes from %s: dropped", e->name, blen,
			 peer_addr ? peer_addr : "?");
		return;
	}
	memcpy(&h, body, sizeof(h));
	if (!name_ok(h.caller, sizeof(h.caller)) || !name_ok(h.callee, sizeof(h.callee)) ||
	    strnlen(h.ns, sizeof(h.ns)) >= sizeof(h.ns) || h.resv) {
		CTL_DROP(st, "ctl: engine %s: malformed HELLO from %s: dropped", e->name,
			 peer_addr ? peer_addr : "?");
		return;
	}
	if (!sec_peer_allowed(&st->secret, peer_sockaddr(peer_addr, &pss) ? (struct sockaddr *)&pss
									   : NULL)) {
		log_warn("ctl: engine %s: refusing %s from %s: no cluster secret is set, so only "
			 "loopback peers are served", e->name, h.caller, peer_addr ? peer_addr : "?");
		return;
	}
	memset(&tmp, 0, sizeof(tmp));
	memcpy(tmp.id, id, id_len);
	tmp.id_len = (uint32_t)id_len;
	snprintf(tmp.peer_name, sizeof(tmp.peer_name), "%s", h.caller);
	if (strcmp(h.ns, e->ns) || strcmp(h.callee, e->name)) {
		log_warn("ctl: engine %s/%s: %s called %s/%s: refused", e->ns, e->name, h.caller,
			 h.ns, h.callee);
		ctl_send_answer(st, &tmp, CTL_NO, 0, -ENOENT, 0);
		return;
	}
	s = session_new(st);
	if (!s) {
		log_warn("ctl: engine %s: %d sessions: refusing %s", e->name, CTL_MAX_SESSIONS,
			 h.caller);
		ctl_send_answer(st, &tmp, CTL_NO, 0, -EBUSY, 0);
		return;
	}
	memcpy(s->id, id, id_len);
	s->id_len = (uint32_t)id_len;
	s->fd = fd;
	snprintf(s->peer_name, sizeof(s->peer_name), "%s", h.caller);
	snprintf(s->seen_host, sizeof(s->seen_host), "%s", peer_addr ? peer_addr : "");
	memcpy(s->nonce_peer, h.nonce, sizeof(h.nonce));
	s->peer_caps = le32toh(h.caps);
	if (sec_nonce(s->nonce_me, sizeof(s->nonce_me))) {
		session_free(st, s);
		return;
	}
	memset(&p, 0, sizeof(p));
	p.caps = htole32(CTL_CAPS);
	snprintf(p.name, sizeof(p.name), "%s", e->name);
	memcpy(p.nonce, s->nonce_me, sizeof(p.nonce));
	sec_proof(&st->secret, ROLE_CALLEE, s->nonce_peer, s->nonce_me, s->peer_name, e->name,
		  e->ns, 0, 0, p.mac);
	s->state = CS_WAIT_AUTH;
	s->hs_deadline = reactor_now(e) + e->handshake_ns;
	if (ctl_send_msg(st, s, CTL_PROOF, 0, &p, sizeof(p), NULL, 0))
		session_free(st, s);
}

static void on_callee_msg(struct ctl_state *st, const void *id, size_t id_len,
			  const uint8_t *frame, size_t n, const char *peer_addr, int fd)
{
	struct ferry_engine *e = st->e;
	struct ctl_session *s = session_by_id(st, id, id_len);
	const uint8_t *body = frame + CTL_HDR_BYTES;
	struct ctl_hdr h;
	int rc = ctl_hdr_check(frame, n, &h);

	if (rc) {
		CTL_DROP(st, "ctl: engine %s: a message from %s failed its checks (%s): %s", e->name,
			 s ? s->peer_name : (peer_addr ? peer_addr : "?"), check_text(rc),
			 s && s->state != CS_READY ? "session ended" : "dropped");
		if (s && s->state != CS_READY)
			session_free(st, s);
		return;
	}
	if (h.type == CTL_HELLO) {
		if (s) /* the same caller starts over: forget the old session */
			session_dead(st, s, -ECONNRESET, "its caller started over");
		on_hello(st, id, id_len, body, h.len, peer_addr, fd);
		return;
	}
	if (!s) {
		STAT_ADD(st->dropped, 1);
		log_limited(FERRY__LOG_WARN, "ctl: engine %s: %s from %s before any HELLO: dropped",
			    e->name, ctl_type_name(h.type), peer_addr ? peer_addr : "?");
		return;
	}
	if (s->state == CS_READY) {
		on_ready_msg(st, s, &h, body);
		return;
	}
	/* CS_WAIT_AUTH: only AUTH, or the caller's NO: our proof was wrong. */
	if (h.type == CTL_NO) {
		STAT_ADD(e->stats.peers_refused, 1);
		STAT_ADD(st->auth_failed, 1);
		log_limited(FERRY__LOG_WARN, "ctl: engine %s: %s (%s) refused our proof: the two "
			    "engines do not hold the same cluster secret", e->name, s->peer_name,
			    peer_addr ? peer_addr : "?");
		session_free(st, s);
		return;
	}
	if (h.type != CTL_AUTH || h.len != sizeof(struct ctl_auth)) {
		log_warn("ctl: engine %s: %s (%u bytes) from %s instead of AUTH: session ended",
			 e->name, ctl_type_name(h.type), h.len, s->peer_name);
		session_free(st, s);
		return;
	}
	{
		struct ctl_auth a;
		struct ctl_ok ok;
		uint8_t want[SEC_MAC_BYTES];

		memcpy(&a, body, sizeof(a));
		sec_proof(&st->secret, ROLE_CALLER, s->nonce_peer, s->nonce_me, s->peer_name,
			  e->name, e->ns, 0, 0, want);
		if (!sec_proof_equal(want, a.mac)) {
			STAT_ADD(e->stats.peers_refused, 1);
			CTL_REFUSE(st, "ctl: engine %s: %s (%s) failed to prove the cluster secret: "
				 "refused", e->name, s->peer_name, peer_addr ? peer_addr : "?");
			ctl_send_answer(st, s, CTL_NO, 0, -EACCES, 0);
			session_free(st, s);
			return;
		}
		if (strnlen(a.data_addr, sizeof(a.data_addr)) >= sizeof(a.data_addr)) {
			log_warn("ctl: engine %s: AUTH of %s: data address not terminated: refused",
				 e->name, s->peer_name);
			ctl_send_answer(st, s, CTL_NO, 0, -EPROTO, 0);
			session_free(st, s);
			return;
		}
		my_data_addr(st, ok.data_addr);
		if (ctl_send_msg(st, s, CTL_OK, 0, &ok, sizeof(ok), NULL, 0)) {
			session_free(st, s);
			return;
		}
		session_ready(st, s, a.data_addr);
	}
}

static void on_caller_msg(struct ctl_state *st, struct ctl_session *s, const uint8_t *frame,
			  size_t n)
{
	struct ferry_engine *e = st->e;
	const uint8_t *body = frame + CTL_HDR_BYTES;
	struct ctl_hdr h;
	int rc = ctl_hdr_check(frame, n, &h);

	if (rc) {
		CTL_DROP(st, "ctl: engine %s: a message from %s failed its checks (%s): dropped",
			 e->name, s->peer_name, check_text(rc));
		if (s->state != CS_READY)
			session_dead(st, s, -EPROTO, "a broken handshake");
		return;
	}
	if (s->state == CS_READY) {
		on_ready_msg(st, s, &h, body);
		return;
	}
	if (h.type == CTL_NO) {
		struct ctl_answer a = { 0 };

		if (h.len == sizeof(a))
			memcpy(&a, body, sizeof(a));
		log_warn("ctl: engine %s: %s refused us: %s", e->name, s->peer_name,
			 ferry_strerror((int32_t)le32toh((uint32_t)a.res)));
		s->refused = true;
		session_dead(st, s, -EACCES, NULL);
		return;
	}
	if (s->state == CS_WAIT_PROOF && h.type == CTL_PROOF && h.len == sizeof(struct ctl_proof)) {
		struct ctl_proof p;
		struct ctl_auth a;
		uint8_t want[SEC_MAC_BYTES];

		memcpy(&p, body, sizeof(p));
		memcpy(s->nonce_peer, p.nonce, sizeof(p.nonce));
		sec_proof(&st->secret, ROLE_CALLEE, s->nonce_me, s->nonce_peer, e->name,
			  s->peer_name, e->ns, 0, 0, want);
		if (strnlen(p.name, sizeof(p.name)) >= sizeof(p.name) ||
		    strcmp(p.name, s->peer_name) || !sec_proof_equal(want, p.mac)) {
			CTL_REFUSE(st, "ctl: engine %s: the engine at %s failed to prove it is %s "
				   "holding the cluster secret: hung up", e->name, s->endpoint,
				   s->peer_name);
			/* Say so: the engine we called logs and counts it too. */
			ctl_send_answer(st, s, CTL_NO, 0, -EACCES, 0);
			s->refused = true;
			session_dead(st, s, -EACCES, NULL);
			return;
		}
		s->peer_caps = le32toh(p.caps);
		memset(&a, 0, sizeof(a));
		sec_proof(&st->secret, ROLE_CALLER, s->nonce_me, s->nonce_peer, e->name,
			  s->peer_name, e->ns, 0, 0, a.mac);
		my_data_addr(st, a.data_addr);
		s->state = CS_WAIT_OK;
		if (ctl_send_msg(st, s, CTL_AUTH, 0, &a, sizeof(a), NULL, 0))
			session_dead(st, s, -EHOSTUNREACH, "AUTH not sent");
		return;
	}
	if (s->state == CS_WAIT_OK && h.type == CTL_OK && h.len == sizeof(struct ctl_ok)) {
		struct ctl_ok ok;

		memcpy(&ok, body, sizeof(ok));
		if (strnlen(ok.data_addr, sizeof(ok.data_addr)) >= sizeof(ok.data_addr)) {
			session_dead(st, s, -EPROTO, "OK with an unterminated address");
			return;
		}
		session_ready(st, s, ok.data_addr);
		return;
	}
	log_warn("ctl: engine %s: %s (%u bytes) from %s during the handshake: hung up", e->name,
		 ctl_type_name(h.type), h.len, s->peer_name);
	session_dead(st, s, -EPROTO, NULL);
}

/* Take one message from the ROUTER. Returns false when there was none. */
static bool recv_router(struct ctl_state *st)
{
	zmq_msg_t id, body, extra;
	const char *peer_addr;
	bool bad = false;

	zmq_msg_init(&id);
	if (zmq_msg_recv(&id, st->router.z, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&id);
		return false;
	}
	zmq_msg_init(&body);
	if (!zmq_msg_more(&id) || zmq_msg_recv(&body, st->router.z, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&id);
		zmq_msg_close(&body);
		return true;
	}
	while (zmq_msg_more(&body)) { /* more parts than ours: drain them, drop it all */
		bad = true;
		zmq_msg_init(&extra);
		if (zmq_msg_recv(&extra, st->router.z, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&extra);
			break;
		}
		zmq_msg_close(&body);
		body = extra;
	}
	peer_addr = zmq_msg_gets(&body, "Peer-Address");
	if (bad || zmq_msg_size(&id) == 0 || zmq_msg_size(&id) > CTL_ID_MAX)
		CTL_DROP(st, "ctl: engine %s: a message of more parts than one from %s: dropped",
			 st->e->name, peer_addr ? peer_addr : "?");
	else
		on_callee_msg(st, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
			      zmq_msg_size(&body), peer_addr, ctl_gate_srcfd(st, &body));
	zmq_msg_close(&id);
	zmq_msg_close(&body);
	return true;
}

static bool recv_dealer(struct ctl_state *st, struct ctl_session *s)
{
	zmq_msg_t m;
	bool more;

	zmq_msg_init(&m);
	if (zmq_msg_recv(&m, s->sock.z, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);
		return false;
	}
	more = zmq_msg_more(&m);
	if (more) {
		CTL_DROP(st, "ctl: engine %s: a message of several parts from %s: dropped", st->e->name,
			 s->peer_name);
		while (more) {
			zmq_msg_close(&m);
			zmq_msg_init(&m);
			if (zmq_msg_recv(&m, s->sock.z, ZMQ_DONTWAIT) < 0)
				break;
			more = zmq_msg_more(&m);
		}
	} else {
		on_caller_msg(st, s, zmq_msg_data(&m), zmq_msg_size(&m));
	}
	zmq_msg_close(&m);
	return true;
}

/* What recv_router / recv_dealer do with a message, without the socket (ctl_int.h). */
void ctl_take_router_msg(struct ctl_state *st, const void *id, size_t id_len,
			 const uint8_t *frame, size_t n, const char *peer_addr, int fd)
{
	on_callee_msg(st, id, id_len, frame, n, peer_addr, fd);
}

void ctl_take_dealer_msg(struct ctl_state *st, struct ctl_session *s, const uint8_t *frame,
			 size_t n)
{
	on_caller_msg(st, s, frame, n);
}

bool ctl_sock_readable(void *z)
{
	uint32_t ev = 0;
	size_t n = sizeof(ev);

	return z && zmq_getsockopt(z, ZMQ_EVENTS, &ev, &n) == 0 && (ev & ZMQ_POLLIN);
}

static int drain(struct ctl_state *st)
{
	int n = 0;

	st->any_dirty = false;
	n += ctl_gate_drain(st); /* connections first: a message may come on a new one */
	if (st->router.dirty) {
		st->router.dirty = false;
		for (int i = 0; ctl_sock_readable(st->router.z); i++) {
			if (i == CTL_DRAIN_MAX) {
				st->router.dirty = st->any_dirty = true; /* the rest next round */
				break;
			}
			if (recv_router(st))
				n++;
		}
	}
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->state == CS_FREE || !s->caller || !s->sock.dirty)
			continue;
		s->sock.dirty = false;
		for (int k = 0; s->sock.z && ctl_sock_readable(s->sock.z); k++) {
			if (k == CTL_DRAIN_MAX) {
				s->sock.dirty = st->any_dirty = true;
				break;
			}
			if (recv_dealer(st, s))
				n++;
		}
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Time: heartbeats, verdicts, handshake deadlines, retries            */
/* ------------------------------------------------------------------ */

static int check_time(struct ctl_state *st)
{
	uint64_t now = reactor_now(st->e);
	int n = 0;

	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		switch (s->state) {
		case CS_BACKOFF:
			if (now >= s->retry_at) {
				call_start(st, s);
				n++;
			}
			break;
		case CS_WAIT_PROOF:
		case CS_WAIT_OK:
		case CS_WAIT_AUTH:
			if (now >= s->hs_deadline && !s->caller) {
				STAT_ADD(st->e->stats.handshakes_dropped, 1);
				log_limited(FERRY__LOG_WARN, "ctl: engine %s: %s (%s) did not prove the "
					    "cluster secret within %llu ms: hung up", st->e->name,
					    s->peer_name, s->seen_host[0] ? s->seen_host : "?",
					    (unsigned long long)(st->e->handshake_ns / 1000000));
				session_dead(st, s, -EHOSTUNREACH, NULL);
				n++;
			} else if (now >= s->hs_deadline) {
				log_info("ctl: engine %s: handshake with %s timed out", st->e->name,
					 s->peer_name[0] ? s->peer_name : "a caller");
				session_dead(st, s, -EHOSTUNREACH, NULL);
				n++;
			}
			break;
		case CS_READY:
			if (now - s->last_rx > st->peer_timeout_ns) {
				char why[96];

				snprintf(why, sizeof(why), "silent for %llu ms: declared dead",
					 (unsigned long long)((now - s->last_rx) / 1000000));
				STAT_ADD(st->declared_dead, 1);
				session_dead(st, s, -ECONNRESET, why);
				n++;
			} else if (now - s->last_rx >= st->heartbeat_ns &&
				   now - s->last_ping >= st->heartbeat_ns) {
				ctl_send_msg(st, s, CTL_PING, ++st->next_seq, NULL, 0, NULL, 0);
				s->last_ping = now;
			}
			break;
		default:
			break;
		}
	}
	n += ctl_gate_tick(st);
	/* Requests whose op ended (deadline, cancel) and got no answer. */
	for (uint32_t i = 0; i < CTL_MAX_REQS && st->nreqs; i++) {
		struct ctl_req *r = &st->reqs[i];

		if (r->type && (r->op->gen != r->op_gen || !op_state_pending(r->op->state)))
			ctl_req_free(st, r);
	}
	return n;
}

static void arm_tick(struct ctl_state *st)
{
	struct io_uring_sqe *sqe;
	uint64_t ns = st->heartbeat_ns / 2;

	if (st->tick_armed || (!st->nsessions && !st->nreqs && !st->gate.npreauth))
		return;
	if (ns > 250000000ull)
		ns = 250000000ull; /* handshake deadlines and retries need some resolution */
	sqe = ring_sqe(st);
	if (!sqe)
		return;
	st->tick_ts.tv_sec = (long long)(ns / 1000000000ull);
	st->tick_ts.tv_nsec = (long long)(ns % 1000000000ull);
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, ck(CK_TICK, 0, 0)));
	st->tick_armed = true;
}

/* ------------------------------------------------------------------ */
/* ferry_peer_connect's mailbox                                        */
/* ------------------------------------------------------------------ */

static int take_connects(struct ctl_state *st)
{
	struct ctl_connect list[CTL_MAX_SESSIONS];
	uint32_t n;

	pthread_mutex_lock(&st->lock);
	n = st->nconnects;
	memcpy(list, st->connects, n * sizeof(list[0]));
	st->nconnects = 0;
	atomic_store(&st->connects_pending, 0);
	pthread_mutex_unlock(&st->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct ctl_session *s = NULL;

		for (uint32_t j = 0; j < CTL_MAX_SESSIONS; j++) {
			struct ctl_session *c = &st->sessions[j];

			if (c->state != CS_FREE && c->caller && c->peer == list[i].peer)
				s = c;
		}
		if (s && strcmp(s->endpoint, list[i].endpoint) == 0)
			continue; /* already calling there */
		if (s) {
			if (s->state == CS_READY)
				session_dead(st, s, -ECONNRESET, "its control address changed");
			ctl_sock_close(st, &s->sock, s->slot + 1);
		} else if (!(s = session_new(st))) {
			log_error("ctl: engine %s: %d sessions: not calling %s", st->e->name,
				  CTL_MAX_SESSIONS, list[i].peer->name);
			continue;
		}
		s->caller = true;
		s->peer = list[i].peer;
		snprintf(s->peer_name, sizeof(s->peer_name), "%s", s->peer->name);
		snprintf(s->endpoint, sizeof(s->endpoint), "%s", list[i].endpoint);
		{
			/* The host we call: the data address's host when it publishes a wildcard. */
			const char *h = s->endpoint + strlen("tcp://");
			const char *colon = strrchr(h, ':');
			size_t hl = colon ? (size_t)(colon - h) : 0;

			if (hl && h[0] == '[' && h[hl - 1] == ']') {
				h++;
				hl -= 2;
			}
			snprintf(s->seen_host, sizeof(s->seen_host), "%.*s", (int)hl, h);
		}
		call_start(st, s);
	}
	return (int)n;
}

/* ------------------------------------------------------------------ */
/* The backend                                                         */
/* ------------------------------------------------------------------ */

static int ctl_progress(struct ferry_engine *e, struct backend *b)
{
	struct ctl_state *st = b->data;
	int n = 0;

	(void)e;
	if (atomic_load_explicit(&st->connects_pending, memory_order_acquire))
		n += take_connects(st);
	if (st->any_dirty) {
		n += drain(st);
		st->need_arm = true;
	}
	if (st->tick_due) {
		st->tick_due = false;
		n += check_time(st);
	}
	if (!st->zctx)
		return n;
	if (st->need_arm) {
		st->need_arm = false;
		ctl_sock_arm(st, &st->router, 0);
		ctl_sock_arm(st, &st->gate.mon, CTL_GATE_SLOT);
		for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++)
			if (st->sessions[i].caller)
				ctl_sock_arm(st, &st->sessions[i].sock, i + 1);
	}
	if (!st->tick_armed)
		arm_tick(st);
	if (io_uring_sq_ready(&e->ring))
		io_uring_submit(&e->ring);
	return n;
}

static bool ctl_has_work(struct ferry_engine *e, struct backend *b)
{
	struct ctl_state *st = b->data;

	(void)e;
	return st->any_dirty || st->tick_due ||
	       atomic_load_explicit(&st->connects_pending, memory_order_relaxed);
}

static void ctl_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
		       uint32_t flags)
{
	struct ctl_state *st = b->data;
	unsigned kind = cookie & 0xf;
	uint32_t slot = (uint32_t)((cookie >> 4) & 0xffff), gen = (uint32_t)(cookie >> 20);
	struct ctl_sock *s;

	(void)e;
	(void)res;
	(void)flags;
	if (!st)
		return;
	if (kind == CK_TICK) {
		st->tick_armed = false;
		st->tick_due = true;
		return;
	}
	if (kind != CK_POLL)
		return;
	if (slot == 0)
		s = &st->router;
	else if (slot == CTL_GATE_SLOT)
		s = &st->gate.mon;
	else if (slot <= CTL_MAX_SESSIONS)
		s = &st->sessions[slot - 1].sock;
	else
		return;
	if ((s->gen & 0xfffffffful) != gen || !s->z)
		return;
	s->armed = false;
	s->dirty = true;
	st->any_dirty = true;
}

/*
 * Before any transport resolves peer: our call to it still in its
 * handshake (or waiting to call again) holds its PUTs in the engine until
 * the handshake tells its data address (waiters_go); a peer that refused us
 * fails them with -EACCES. A peer with a READY session, or none of ours,
 * is for the transports.
 */
static int ctl_reaching(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct ctl_state *st = b->data;

	(void)e;
	ctl_connects_first(st); /* a ferry_peer_connect just before this PUT */
	if (!st->nsessions || ctl_session_for(st, peer->name, true))
		return 0;
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->caller && s->peer == peer && s->state != CS_FREE && s->state != CS_READY)
			return s->refused && s->state == CS_BACKOFF ? -EACCES : 1;
	}
	return 0;
}

static int ctl_init(struct ferry_engine *e, struct backend *b)
{
	const struct ferry_engine_params *p = e->create_params;
	struct ctl_state *st = calloc(1, sizeof(*st));
	const char *control = NULL;
	char ep[NETADDR_MAX + 2];
	size_t len = sizeof(st->bound);
	int rc;

	if (!st)
		return -ENOMEM;
	st->e = e;
	st->b = b;
	st->router.fd = -1;
	pthread_mutex_init(&st->lock, NULL);
	b->data = st;
	ferry__directory_set(e, &ctl_directory, st);
	if (p && p->size > offsetof(struct ferry_engine_params, listen)) {
		st->heartbeat_ns = (uint64_t)p->heartbeat_ms * 1000000ull;
		st->peer_timeout_ns = (uint64_t)p->peer_timeout_ms * 1000000ull;
		rc = sec_secret_load(&st->secret, p->secret, p->secret_file);
	} else {
		rc = sec_secret_load(&st->secret, NULL, NULL);
	}
	if (rc)
		goto fail;
	if (!st->heartbeat_ns)
		st->heartbeat_ns = CTL_DEFAULT_HEARTBEAT_MS * 1000000ull;
	if (!st->peer_timeout_ns)
		st->peer_timeout_ns = CTL_DEFAULT_PEER_TIMEOUT_MS * 1000000ull;
	if (p && p->size > offsetof(struct ferry_engine_params, control))
		control = p->control;
	if (!control)
		return 0;
	if (strnlen(control, NETADDR_MAX) >= NETADDR_MAX) {
		log_error("ferry_engine_create: control endpoint longer than %d bytes",
			  NETADDR_MAX - 1);
		rc = -EINVAL;
		goto fail;
	}
	{
		struct sockaddr_storage ss;
		socklen_t sl;

		if ((rc = netaddr_parse(control, true, &ss, &sl)))
			goto fail;
		if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
			log_error("ferry_engine_create: control endpoint %s is not a loopback "
				  "address and engine %s has no cluster secret", control, e->name);
			rc = -EACCES;
			goto fail;
		}
	}
	sec_note_no_secret(&st->secret, e->name);
	zmq_endpoint(control, ep, sizeof(ep));
	if ((rc = ctl_sock_open(st, &st->router, ZMQ_ROUTER, ep)))
		goto fail;
	if (zmq_bind(st->router.z, ep)) {
		rc = -errno;
		log_error("ferry_engine_create: cannot listen for control on %s: %s%s", control,
			  zmq_strerror(errno),
			  rc == -EADDRINUSE ? " (another process holds that address)" : "");
		if (rc != -EADDRINUSE && rc != -EACCES && rc != -EADDRNOTAVAIL)
			rc = -EINVAL;
		goto fail;
	}
	if (zmq_getsockopt(st->router.z, ZMQ_LAST_ENDPOINT, st->bound, &len))
		st->bound[0] = '\0';
	if ((rc = ctl_gate_open(st)))
		goto fail;
	log_debug("ctl: engine %s: control on %s", e->name, st->bound);
	return 0;
fail:
	ferry__directory_set(e, NULL, NULL);
	if (st->gate.mon.z)
		zmq_close(st->gate.mon.z);
	if (st->router.z)
		zmq_close(st->router.z);
	if (st->zctx)
		zmq_ctx_term(st->zctx);
	pthread_mutex_destroy(&st->lock);
	free(st);
	b->data = NULL;
	return rc;
}

static void ctl_fini(struct ferry_engine *e, struct backend *b)
{
	struct ctl_state *st = b->data;

	if (!st)
		return;
	ferry__directory_set(e, NULL, NULL); /* from now on: -EOPNOTSUPP */
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		if (s->state == CS_READY)
			ctl_send_msg(st, s, CTL_BYE, 0, NULL, 0, NULL, 0);
		if (s->state != CS_FREE) {
			waiters_go(st, s, -ECANCELED);
			session_free(st, s);
		}
	}
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++)
		if (st->reqs[i].type)
			ctl_req_finish(st, &st->reqs[i], -ECANCELED, 0, NULL);
	ctl_gate_close(st);
	ctl_sock_close(st, &st->router, 0);
	if (st->zctx)
		zmq_ctx_term(st->zctx);
	reactor_unresolve_all(e, b);
	pthread_mutex_destroy(&st->lock);
	free(st);
	b->data = NULL;
}

/* "ferry://HOST:PORT": the control endpoint, "tcp://HOST:PORT" to ZeroMQ. */
static int ctl_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
		       const char *uri)
{
	char ep[NETADDR_MAX];

	(void)e;
	(void)b;
	if (snprintf(ep, sizeof(ep), "tcp://%s", uri + strlen("ferry://")) >= (int)sizeof(ep)) {
		log_error("ferry_peer_connect_uri: %s is longer than %d bytes", uri, NETADDR_MAX - 1);
		return -EINVAL;
	}
	return ferry_peer_connect(peer, ep);
}

static int ctl_address(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct ctl_state *st = b->data;

	(void)e;
	if (strncmp(st->bound, "tcp://", 6) != 0)
		return 0;
	return snprintf(buf, len, "ferry://%s", st->bound + 6);
}

static int ctl_health(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct ctl_state *st = b->data;

	(void)e;
	return snprintf(buf, len,
			",\"control\":{\"address\":\"%s\",\"sessions_ready\":%llu,"
			"\"declared_dead\":%llu,\"dropped\":%llu,\"auth_failed\":%llu}",
			st->bound, (unsigned long long)STAT_GET(st->ready),
			(unsigned long long)STAT_GET(st->declared_dead),
			(unsigned long long)STAT_GET(st->dropped),
			(unsigned long long)STAT_GET(st->auth_failed));
}

const struct backend_ops ferry__ctl_backend = {
	.name = "ctl",
	.rank = 0,
	.caps = TRANSPORT_CAP_HOLDS,
	.init = ctl_init,
	.fini = ctl_fini,
	.reaching = ctl_reaching,
	.progress = ctl_progress,
	.has_work = ctl_has_work,
	.on_cqe = ctl_on_cqe,
	.health = ctl_health,
	.scheme = "ferry",
	.connect = ctl_connect,
	.address = ctl_address,
};

/* ------------------------------------------------------------------ */
/* Public calls                                                        */
/* ------------------------------------------------------------------ */


int ferry_engine_control_address(struct ferry_engine *e, char *buf, size_t len)
{
	struct ctl_state *st;

	if (!e || (!buf && len)) {
		log_error("ferry_engine_control_address: NULL %s", e ? "buf" : "engine");
		return -EINVAL;
	}
	st = ctl_state_of(e);
	if (!st || !st->bound[0])
		return -ENOTCONN;
	return snprintf(buf, len, "%s", st->bound);
}

int ferry_peer_connect(struct ferry_peer *p, const char *control_endpoint)
{
	struct sockaddr_storage ss;
	struct ctl_state *st;
	char text[NETADDR_MAX];
	socklen_t len;
	int rc;

	if (!p || !control_endpoint) {
		log_error("ferry_peer_connect: NULL %s", p ? "endpoint" : "peer");
		return -EINVAL;
	}
	rc = netaddr_parse_peer("ferry_peer_connect", control_endpoint, &ss, &len);
	if (rc)
		return rc;
	st = ctl_state_of(p->engine);
	if (!st)
		return -EOPNOTSUPP;
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
		log_error("ferry_peer_connect: %s for %s is not a loopback address and engine %s "
			  "has no cluster secret", control_endpoint, p->name, p->engine->name);
		return -EACCES;
	}
	sec_note_no_secret(&st->secret, p->engine->name);
	netaddr_format((struct sockaddr *)&ss, text, sizeof(text));
	pthread_mutex_lock(&st->lock);
	if (st->nconnects == CTL_MAX_SESSIONS) {
		pthread_mutex_unlock(&st->lock);
		return -ENOMEM;
	}
	st->connects[st->nconnects].peer = p;
	snprintf(st->connects[st->nconnects].endpoint, NETADDR_MAX, "%s", text);
	st->nconnects++;
	atomic_store_explicit(&st->connects_pending, 1, memory_order_release);
	pthread_mutex_unlock(&st->lock);
	reactor_wake(p->engine);
	return 0;
}

#else /* !FERRY_HAVE_ZMQ */

static int ctl_init(struct ferry_engine *e, struct backend *b)
{
	const struct ferry_engine_params *p = e->create_params;

	b->data = NULL;
	if (p && p->size > offsetof(struct ferry_engine_params, control) && p->control) {
		log_error("ferry_engine_create: a control endpoint needs libzmq, which this build "
			  "does not have");
		return -EOPNOTSUPP;
	}
	return 0;
}

static void ctl_fini(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	(void)b;
}


static int ctl_progress(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	(void)b;
	return 0;
}

static bool ctl_has_work(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	(void)b;
	return false;
}

static int ctl_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
		       const char *uri)
{
	(void)e;
	(void)b;
	(void)peer;
	log_error("ferry_peer_connect_uri: %s: this build has no control channel (libzmq)", uri);
	return -EOPNOTSUPP;
}

const struct backend_ops ferry__ctl_backend = {
	.name = "ctl",
	.rank = 0,
	.init = ctl_init,
	.fini = ctl_fini,
	.scheme = "ferry",
	.connect = ctl_connect,
	.progress = ctl_progress,
	.has_work = ctl_has_work,
};

int ferry_engine_control_address(struct ferry_engine *e, char *buf, size_t len)
{
	(void)buf;
	(void)len;
	return e ? -EOPNOTSUPP : -EINVAL;
}

int ferry_peer_connect(struct ferry_peer *p, const char *control_endpoint)
{
	(void)control_endpoint;
	return p ? -EOPNOTSUPP : -EINVAL;
}

#endif

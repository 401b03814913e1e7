/*
 * control/ctl_hello.c - the control channel's authenticated handshake.
 *
 * Owns: calling a peer (a fresh DEALER, then HELLO with our nonce) and the
 * messages of a session that is not READY yet, both ways: as callee,
 * HELLO (checked, answered with PROOF: security.h's HMAC over both
 * nonces, role "ferry-ctl-callee") and AUTH (the caller's proof, role
 * "ferry-ctl-caller", and its data address; answered with OK and ours);
 * as caller, PROOF (answered with AUTH), OK, and NO (refused). Every
 * received message starts here (ctl_take_router_msg / ctl_take_dealer_msg,
 * from ctl_sock.c or fuzz/fuzz_ctl.c); those of a READY session go on to
 * ctl_session.c.
 *
 * Trust: before a session is READY only HELLO/AUTH (callee) or PROOF/OK/NO
 * (caller) are read; everything else is dropped and logged. Every message
 * is checked (ctl_hdr_check, then its body's exact length, NUL-terminated
 * names and addresses, key lengths); a bad one is logged and dropped, a bad
 * handshake message ends the session. Without a cluster secret only
 * loopback peers are served and called (warned), as on the data path.
 */
#ifdef FERRY_HAVE_ZMQ
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctl_int.h"

static const char *check_text(int rc)
{
	return rc == -EPROTONOSUPPORT ? "another protocol version"
	       : rc == -EBADMSG       ? "an unknown type"
				      : "malformed";
}

/* Our data address, to publish ("" when the engine listens for no data). */
static void my_data_addr(struct ctl_state *st, char out[CTL_ADDR_BYTES])
{
	memset(out, 0, CTL_ADDR_BYTES);
	if (ferry_engine_address(st->e, out, CTL_ADDR_BYTES) < 0)
		out[0] = '\0';
}

/* Call the peer: a fresh DEALER, then HELLO. */
void ctl_call_start(struct ctl_state *st, struct ctl_session *s)
{
	struct ferry_engine *e = st->e;
	struct ctl_hello h;
	char ep[NETADDR_MAX + 2];
	int rc;

	ctl_zmq_endpoint(s->endpoint, ep, sizeof(ep));
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
	ctl_waiters_go(st, s, rc == -EACCES ? rc : -EHOSTUNREACH);
}

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
	s = ctl_session_new(st);
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
		ctl_session_free(st, s);
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
		ctl_session_free(st, s);
}

static void on_callee_msg(struct ctl_state *st, const void *id, size_t id_len,
			  const uint8_t *frame, size_t n, const char *peer_addr, int fd)
{
	struct ferry_engine *e = st->e;
	struct ctl_session *s = ctl_session_by_id(st, id, id_len);
	const uint8_t *body = frame + CTL_HDR_BYTES;
	struct ctl_hdr h;
	int rc = ctl_hdr_check(frame, n, &h);

	if (rc) {
		CTL_DROP(st, "ctl: engine %s: a message from %s failed its checks (%s): %s", e->name,
			 s ? s->peer_name : (peer_addr ? peer_addr : "?"), check_text(rc),
			 s && s->state != CS_READY ? "session ended" : "dropped");
		if (s && s->state != CS_READY)
			ctl_session_free(st, s);
		return;
	}
	if (h.type == CTL_HELLO) {
		if (s) /* the same caller starts over: forget the old session */
			ctl_session_dead(st, s, -ECONNRESET, "its caller started over");
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
		ctl_on_ready_msg(st, s, &h, body);
		return;
	}
	/* CS_WAIT_AUTH: only AUTH, or the caller's NO: our proof was wrong. */
	if (h.type == CTL_NO) {
		STAT_ADD(e->stats.peers_refused, 1);
		STAT_ADD(st->auth_failed, 1);
		log_limited(FERRY__LOG_WARN, "ctl: engine %s: %s (%s) refused our proof: the two "
			    "engines do not hold the same cluster secret", e->name, s->peer_name,
			    peer_addr ? peer_addr : "?");
		ctl_session_free(st, s);
		return;
	}
	if (h.type != CTL_AUTH || h.len != sizeof(struct ctl_auth)) {
		log_warn("ctl: engine %s: %s (%u bytes) from %s instead of AUTH: session ended",
			 e->name, ctl_type_name(h.type), h.len, s->peer_name);
		ctl_session_free(st, s);
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
			ctl_session_free(st, s);
			return;
		}
		if (strnlen(a.data_addr, sizeof(a.data_addr)) >= sizeof(a.data_addr)) {
			log_warn("ctl: engine %s: AUTH of %s: data address not terminated: refused",
				 e->name, s->peer_name);
			ctl_send_answer(st, s, CTL_NO, 0, -EPROTO, 0);
			ctl_session_free(st, s);
			return;
		}
		my_data_addr(st, ok.data_addr);
		if (ctl_send_msg(st, s, CTL_OK, 0, &ok, sizeof(ok), NULL, 0)) {
			ctl_session_free(st, s);
			return;
		}
		ctl_session_ready(st, s, a.data_addr);
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
			ctl_session_dead(st, s, -EPROTO, "a broken handshake");
		return;
	}
	if (s->state == CS_READY) {
		ctl_on_ready_msg(st, s, &h, body);
		return;
	}
	if (h.type == CTL_NO) {
		struct ctl_answer a = { 0 };

		if (h.len == sizeof(a))
			memcpy(&a, body, sizeof(a));
		log_warn("ctl: engine %s: %s refused us: %s", e->name, s->peer_name,
			 ferry_strerror((int32_t)le32toh((uint32_t)a.res)));
		s->refused = true;
		ctl_session_dead(st, s, -EACCES, NULL);
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
			ctl_session_dead(st, s, -EACCES, NULL);
			return;
		}
		s->peer_caps = le32toh(p.caps);
		memset(&a, 0, sizeof(a));
		sec_proof(&st->secret, ROLE_CALLER, s->nonce_me, s->nonce_peer, e->name,
			  s->peer_name, e->ns, 0, 0, a.mac);
		my_data_addr(st, a.data_addr);
		s->state = CS_WAIT_OK;
		if (ctl_send_msg(st, s, CTL_AUTH, 0, &a, sizeof(a), NULL, 0))
			ctl_session_dead(st, s, -EHOSTUNREACH, "AUTH not sent");
		return;
	}
	if (s->state == CS_WAIT_OK && h.type == CTL_OK && h.len == sizeof(struct ctl_ok)) {
		struct ctl_ok ok;

		memcpy(&ok, body, sizeof(ok));
		if (strnlen(ok.data_addr, sizeof(ok.data_addr)) >= sizeof(ok.data_addr)) {
			ctl_session_dead(st, s, -EPROTO, "OK with an unterminated address");
			return;
		}
		ctl_session_ready(st, s, ok.data_addr);
		return;
	}
	log_warn("ctl: engine %s: %s (%u bytes) from %s during the handshake: hung up", e->name,
		 ctl_type_name(h.type), h.len, s->peer_name);
	ctl_session_dead(st, s, -EPROTO, NULL);
}

/* A message ctl_sock.c received (or fuzz/fuzz_ctl.c made up): ctl_int.h. */
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

#endif

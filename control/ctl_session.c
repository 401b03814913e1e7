/*
 * control/ctl_session.c - the control channel's sessions with peers and
 * their state machine.
 *
 * Owns: the table of sessions (ours: a DEALER per peer we call with
 * ferry_peer_connect; theirs: a routing id at our ROUTER), their states
 * (BACKOFF, WAIT_PROOF / WAIT_OK as caller, WAIT_AUTH as callee, READY;
 * ctl_hello.c moves them through the handshake), what READY means (the
 * peer's data address noted, the PUTs and requests that waited let go),
 * the messages of a READY session (PING, PONG, BYE, and the requests and
 * answers handed to ctl_req.c), the end of a session and of a peer, and
 * time: heartbeats, the dead-peer verdict, handshake deadlines, retries.
 *
 * Liveness: every valid message of a READY session counts as a sign of
 * life; an idle session is pinged every heartbeat_ms, and one silent for
 * peer_timeout_ms is declared dead. For a peer with a control session this
 * verdict is the one that counts: it fails the peer's requests, its LOOKUP
 * GETs, and (a PEER_DEAD event, engine/transport.h) its data links, since a
 * dead engine can hold none. The data path keeps its own check of its
 * connections with the same two numbers; a data link that fails alone only
 * fails what rode it and is called again by the next PUT (the peer may well
 * be alive).
 */
#ifdef FERRY_HAVE_ZMQ
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_int.h"

/* ------------------------------------------------------------------ */
/* Sessions                                                            */
/* ------------------------------------------------------------------ */

struct ctl_session *ctl_session_new(struct ctl_state *st)
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

void ctl_session_free(struct ctl_state *st, struct ctl_session *s)
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

struct ctl_session *ctl_session_by_id(struct ctl_state *st, const void *id, size_t n)
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
void ctl_waiters_go(struct ctl_state *st, struct ctl_session *s, int res)
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

void ctl_session_dead(struct ctl_state *st, struct ctl_session *s, int res, const char *why)
{
	bool was_ready = s->state == CS_READY;
	char name[FERRY_NAME_MAX];

	snprintf(name, sizeof(name), "%s", s->peer_name);
	if (was_ready)
		STAT_ADD(st->ready, (uint64_t)-1);
	if (why)
		log_warn("ctl: engine %s: session with %s ended: %s", st->e->name,
			 name[0] ? name : "a caller", why);
	ctl_waiters_go(st, s, s->state == CS_READY ? res : (s->refused ? -EACCES : -EHOSTUNREACH));
	if (s->caller) {
		ctl_sock_close(st, &s->sock, s->slot + 1);
		s->state = CS_BACKOFF;
		s->retry_at = reactor_now(st->e) + (s->refused ? st->peer_timeout_ns : st->heartbeat_ns);
	} else {
		ctl_session_free(st, s);
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
void ctl_session_ready(struct ctl_state *st, struct ctl_session *s, const char *data_addr)
{
	struct ferry_engine *e = st->e;
	struct sockaddr_storage ss;
	socklen_t sl;
	char text[NETADDR_MAX] = "";
	int rc;

	if (!s->peer && (rc = ferry_peer_open(e, s->peer_name, &s->peer))) {
		ctl_session_dead(st, s, rc, "no peer handle");
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
	ctl_waiters_go(st, s, 0);
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

/* A message of a READY session. */
void ctl_on_ready_msg(struct ctl_state *st, struct ctl_session *s, const struct ctl_hdr *h,
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
		ctl_session_dead(st, s, -ECONNRESET, NULL);
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

/* ------------------------------------------------------------------ */
/* Time: heartbeats, verdicts, handshake deadlines, retries            */
/* ------------------------------------------------------------------ */

int ctl_check_time(struct ctl_state *st)
{
	uint64_t now = reactor_now(st->e);
	int n = 0;

	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &st->sessions[i];

		switch (s->state) {
		case CS_BACKOFF:
			if (now >= s->retry_at) {
				ctl_call_start(st, s);
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
				ctl_session_dead(st, s, -EHOSTUNREACH, NULL);
				n++;
			} else if (now >= s->hs_deadline) {
				log_info("ctl: engine %s: handshake with %s timed out", st->e->name,
					 s->peer_name[0] ? s->peer_name : "a caller");
				ctl_session_dead(st, s, -EHOSTUNREACH, NULL);
				n++;
			}
			break;
		case CS_READY:
			if (now - s->last_rx > st->peer_timeout_ns) {
				char why[96];

				snprintf(why, sizeof(why), "silent for %llu ms: declared dead",
					 (unsigned long long)((now - s->last_rx) / 1000000));
				STAT_ADD(st->declared_dead, 1);
				ctl_session_dead(st, s, -ECONNRESET, why);
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

#endif

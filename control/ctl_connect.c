/*
 * control/ctl_connect.c - ferry_peer_connect and the control channel's
 * other public calls.
 *
 * Owns: ferry_peer_connect's mailbox (any thread leaves the peer and its
 * control endpoint there, under the state's lock, and wakes the reactor;
 * the reactor takes them at its next round, or first thing when an op
 * needs them now, and calls: a new caller session, or the old one moved to
 * the new endpoint), ferry_engine_control_address, and both calls in a
 * build without libzmq (-EOPNOTSUPP).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "netaddr.h"
#include "security.h"

#ifdef FERRY_HAVE_ZMQ
#include "ctl_int.h"


/*
 * ferry_peer_connect calls wait in a mailbox for the next round; an op
 * submitted right after one may be taken first (SQEs are drained before
 * the backends run): take them now.
 */
void ctl_connects_first(struct ctl_state *st)
{
	if (atomic_load_explicit(&st->connects_pending, memory_order_acquire))
		ctl_take_connects(st);
}

int ctl_take_connects(struct ctl_state *st)
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
				ctl_session_dead(st, s, -ECONNRESET, "its control address changed");
			ctl_sock_close(st, &s->sock, s->slot + 1);
		} else if (!(s = ctl_session_new(st))) {
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
		ctl_call_start(st, s);
	}
	return (int)n;
}



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
	ferry__backend_wake(p->engine, st->b); /* its rounds run again (quiet) */
	return 0;
}

#else /* !FERRY_HAVE_ZMQ */


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

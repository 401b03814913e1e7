/*
 * control/ctl_sock.c - the control channel's ZeroMQ sockets on the
 * reactor's io_uring: opening, polling, sending and receiving.
 *
 * Owns: the ZeroMQ context (made when the engine first uses the channel),
 * each socket's options and the oneshot POLL_ADD of its ZMQ_FD, sending a
 * message (header, body, extra) to a session's socket, and draining the
 * sockets: the ROUTER (sessions peers made with us), each DEALER (our
 * calls), the gate's monitor first. ZMQ_FD is edge-triggered (it signals
 * "look at ZMQ_EVENTS", not "a message waits"), so after every wake-up, and
 * after every send on a socket (a send may swallow the signal), the socket
 * is drained while ZMQ_EVENTS says POLLIN, and only then re-armed. What a
 * received message does is ctl_hello.c's (ctl_take_router_msg,
 * ctl_take_dealer_msg); a message of more parts than ours is dropped here.
 */
#ifdef FERRY_HAVE_ZMQ
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctl_int.h"

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

struct io_uring_sqe *ctl_ring_sqe(struct ctl_state *st)
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
	sqe = ctl_ring_sqe(st);
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
		struct io_uring_sqe *sqe = ctl_ring_sqe(st);

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
	backend_busy(st->b); /* ctl_progress looks at it next round (quiet) */
	return 0;
}

/* "tcp://HOST:0" -> "tcp://HOST:*" (ZeroMQ's way to ask for any port). */
void ctl_zmq_endpoint(const char *in, char *out, size_t len)
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
	backend_busy(st->b); /* ctl_progress looks at it next round (quiet) */
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
/* Receiving                                                           */
/* ------------------------------------------------------------------ */

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
	while (zmq_msg_more(&body)) { /* more parts than ours: ctl_drain them, drop it all */
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
		ctl_take_router_msg(st, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&body),
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
		ctl_take_dealer_msg(st, s, zmq_msg_data(&m), zmq_msg_size(&m));
	}
	zmq_msg_close(&m);
	return true;
}

bool ctl_sock_readable(void *z)
{
	uint32_t ev = 0;
	size_t n = sizeof(ev);

	return z && zmq_getsockopt(z, ZMQ_EVENTS, &ev, &n) == 0 && (ev & ZMQ_POLLIN);
}

int ctl_drain(struct ctl_state *st)
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

#endif

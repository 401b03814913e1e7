/*
 * control/ctl_gate.c - the control port's door: how many connections
 * that have proved nothing it holds, and for how long.
 *
 * Owns: the table of connections accepted at the control ROUTER (learned
 * from libzmq's socket monitor, an inproc PAIR socket polled by the reactor
 * like the others: ACCEPTED gives each connection's fd, DISCONNECTED and
 * CLOSED end it), which of them carry a session that proved the cluster
 * secret (ctl_session.c tells, from the fd a message came on, ZMQ_SRCFD),
 * and hanging up on the others: a connection that has not proved the
 * secret within params.handshake_ms (as the data port), and the oldest of
 * them when CTL_GATE_PREAUTH_MAX wait at once. libzmq's own ZMTP greeting is
 * bounded too (ZMQ_HANDSHAKE_IVL, set in ctl_sock.c a second after this
 * bound, so that the gate acts, and counts, first), but a connection
 * that completes it and then stays silent, or says HELLO and never proves
 * anything, would otherwise live as long as it likes, each holding a file
 * descriptor of this process.
 *
 * Hanging up is shutdown(2) of a socket libzmq owns: libzmq sees the end and
 * closes it. The fd is checked first to still be that connection (its peer
 * address as seen at ACCEPTED): a DISCONNECTED not yet read may mean libzmq
 * closed it and the number now names another file.
 *
 * Without ZMQ_SRCFD (a libzmq that has not got it) no connection can be
 * told apart as proved: the time bound is then not enforced (logged once),
 * the count bound still is, against the oldest.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "ctl.h"

#ifdef FERRY_HAVE_ZMQ
#include <zmq.h>

#include "ctl_int.h"

/* Callers that proved nothing, now; health reads it (security.unproved_connections). */
static void preauth_add(struct ctl_state *st, int d)
{
	st->gate.npreauth += (uint32_t)d;
	atomic_store_explicit(&st->e->stats.unproved_control, st->gate.npreauth,
			      memory_order_relaxed);
}

static bool same_peer(const struct ctl_door *d)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	return getpeername(d->fd, (struct sockaddr *)&ss, &sl) == 0 && sl == d->peer_len &&
	       memcmp(&ss, &d->peer, sl) == 0;
}

static void door_hang_up(struct ctl_state *st, struct ctl_door *d, const char *why)
{
	char addr[NETADDR_MAX] = "?";

	if (d->hung)
		return;
	d->hung = true;
	preauth_add(st, -1);
	STAT_ADD(st->e->stats.handshakes_dropped, 1);
	if (d->peer_len)
		netaddr_format((struct sockaddr *)&d->peer, addr, sizeof(addr));
	log_limited(FERRY__LOG_WARN, "ctl: engine %s: a caller at %s %s: hung up", st->e->name,
		    addr, why);
	if (same_peer(d))
		shutdown(d->fd, SHUT_RDWR);
}

static struct ctl_door *door_of(struct ctl_state *st, int fd)
{
	for (uint32_t i = 0; i < CTL_GATE_MAX; i++)
		if (st->gate.doors[i].fd == fd)
			return &st->gate.doors[i];
	return NULL;
}

static void door_gone(struct ctl_state *st, int fd)
{
	struct ctl_door *d = door_of(st, fd);

	if (!d)
		return;
	if (!d->proved && !d->hung)
		preauth_add(st, -1);
	st->gate.nopen--;
	d->fd = -1;
}

static struct ctl_door *oldest_unproved(struct ctl_state *st)
{
	struct ctl_door *old = NULL;

	for (uint32_t i = 0; i < CTL_GATE_MAX; i++) {
		struct ctl_door *d = &st->gate.doors[i];

		if (d->fd >= 0 && !d->proved && !d->hung && (!old || d->since < old->since))
			old = d;
	}
	return old;
}

static void door_accepted(struct ctl_state *st, int fd)
{
	struct ctl_gate *g = &st->gate;
	struct ctl_door *d = NULL;

	if (door_of(st, fd)) /* its DISCONNECTED was missed: the number is new */
		door_gone(st, fd);
	if (g->npreauth >= CTL_GATE_PREAUTH_MAX) {
		struct ctl_door *old = oldest_unproved(st);

		if (old)
			door_hang_up(st, old, "was the oldest of too many that had not proved the "
				     "cluster secret yet");
	}
	for (uint32_t i = 0; i < CTL_GATE_MAX && !d; i++)
		if (g->doors[i].fd < 0)
			d = &g->doors[i];
	if (!d) {
		/* Every door taken (proved ones too): this one does not come in. */
		struct ctl_door tmp = { .fd = fd };

		tmp.peer_len = sizeof(tmp.peer);
		if (getpeername(fd, (struct sockaddr *)&tmp.peer, &tmp.peer_len))
			tmp.peer_len = 0;
		preauth_add(st, 1);
		door_hang_up(st, &tmp, "found every one of the control port's connections taken");
		return;
	}
	memset(d, 0, sizeof(*d));
	d->fd = fd;
	d->since = reactor_now(st->e);
	d->peer_len = sizeof(d->peer);
	if (getpeername(fd, (struct sockaddr *)&d->peer, &d->peer_len))
		d->peer_len = 0; /* gone already: its DISCONNECTED follows */
	g->nopen++;
	preauth_add(st, 1);
}

/* One monitor event; false when there was none. */
static bool recv_event(struct ctl_state *st)
{
	zmq_msg_t ev, where;
	uint16_t id;
	uint32_t value;
	bool ok;

	zmq_msg_init(&ev);
	if (zmq_msg_recv(&ev, st->gate.mon.z, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&ev);
		return false;
	}
	ok = zmq_msg_size(&ev) == 6;
	if (ok) {
		memcpy(&id, zmq_msg_data(&ev), 2);
		memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
	}
	while (zmq_msg_more(&ev)) { /* the endpoint frame: not needed */
		zmq_msg_init(&where);
		if (zmq_msg_recv(&where, st->gate.mon.z, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&where);
			break;
		}
		zmq_msg_close(&ev);
		ev = where;
	}
	zmq_msg_close(&ev);
	if (!ok)
		return true;
	if (id == ZMQ_EVENT_ACCEPTED)
		door_accepted(st, (int)value);
	else if (id == ZMQ_EVENT_DISCONNECTED || id == ZMQ_EVENT_CLOSED)
		door_gone(st, (int)value);
	return true;
}

int ctl_gate_open(struct ctl_state *st)
{
	struct ctl_gate *g = &st->gate;
	char ep[64];
	int rc;

	for (uint32_t i = 0; i < CTL_GATE_MAX; i++)
		g->doors[i].fd = -1;
	g->srcfd = true;
	snprintf(ep, sizeof(ep), "inproc://ferry-ctl-gate-%p", (void *)st);
	if (zmq_socket_monitor(st->router.z, ep,
			       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED)) {
		rc = -errno;
		log_error("ctl: engine %s: zmq_socket_monitor: %s", st->e->name,
			  zmq_strerror(errno));
		return rc;
	}
	if ((rc = ctl_sock_open(st, &g->mon, ZMQ_PAIR, ep)))
		return rc;
	if (zmq_connect(g->mon.z, ep)) {
		rc = -errno;
		log_error("ctl: engine %s: monitor connect: %s", st->e->name, zmq_strerror(errno));
		zmq_close(g->mon.z);
		g->mon.z = NULL;
		return rc;
	}
	return 0;
}

void ctl_gate_close(struct ctl_state *st)
{
	if (st->router.z)
		zmq_socket_monitor(st->router.z, NULL, 0);
	ctl_sock_close(st, &st->gate.mon, CTL_GATE_SLOT);
}

int ctl_gate_drain(struct ctl_state *st)
{
	int n = 0;

	if (!st->gate.mon.dirty)
		return 0;
	st->gate.mon.dirty = false;
	for (int i = 0; st->gate.mon.z && ctl_sock_readable(st->gate.mon.z); i++) {
		if (i == CTL_DRAIN_MAX) {
			st->gate.mon.dirty = st->any_dirty = true; /* the rest next round */
			break;
		}
		if (recv_event(st))
			n++;
	}
	return n;
}

void ctl_gate_proved(struct ctl_state *st, int fd)
{
	struct ctl_door *d = fd >= 0 ? door_of(st, fd) : NULL;

	if (d && !d->proved) {
		if (!d->hung)
			preauth_add(st, -1);
		d->proved = true;
	}
}

int ctl_gate_srcfd(struct ctl_state *st, const void *msg)
{
	int fd = zmq_msg_get((const zmq_msg_t *)msg, ZMQ_SRCFD);

	if (fd < 0 && st->gate.srcfd) {
		st->gate.srcfd = false;
		log_info("ctl: engine %s: this libzmq does not say which connection a message "
			 "came on (ZMQ_SRCFD): callers that prove nothing are bounded in number, "
			 "not in time", st->e->name);
	}
	return fd;
}

int ctl_gate_tick(struct ctl_state *st)
{
	uint64_t now = reactor_now(st->e);
	int n = 0;

	if (!st->gate.srcfd || !st->gate.npreauth)
		return 0;
	for (uint32_t i = 0; i < CTL_GATE_MAX; i++) {
		struct ctl_door *d = &st->gate.doors[i];

		if (d->fd >= 0 && !d->proved && !d->hung && now - d->since >= st->e->handshake_ns) {
			char why[96];

			snprintf(why, sizeof(why), "did not prove the cluster secret within %llu ms",
				 (unsigned long long)(st->e->handshake_ns / 1000000));
			door_hang_up(st, d, why);
			n++;
		}
	}
	return n;
}

#endif

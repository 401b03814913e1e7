/*
 * control/ctl.c - the control channel between engines, on ZeroMQ. This
 * file: the channel as a backend of the reactor.
 *
 * Owns: the channel's ops table, its init (the control endpoint: a ROUTER
 * socket bound at params.control, the cluster secret, the directory
 * service's registration) and fini, its rounds (what the other files do,
 * run in order: the ferry_peer_connect mailbox, the sockets' messages, the
 * tick), its io_uring completions and the tick timer, the PUTs it holds
 * while a handshake is under way (ctl_reaching), its health, and the stub
 * of a build without libzmq. The rest of the channel:
 *   ctl_sock.c     sockets on the reactor's io_uring, sending, receiving
 *   ctl_session.c  sessions and their state machine, heartbeats, verdicts
 *   ctl_hello.c    the authenticated handshake (HELLO, PROOF, AUTH, OK, NO)
 *   ctl_connect.c  ferry_peer_connect's mailbox and the public calls
 *   ctl_req.c      the requests that ride a READY session, store-like keys
 *   ctl_gate.c     the control port's door (connections that prove nothing)
 * the types they share in ctl_int.h; the message format in ctl_wire.h.
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
 * Liveness (heartbeats and the dead-peer verdict): ctl_session.c. Trust
 * (what is read before a session is READY, how every message is checked):
 * ctl_hello.c.
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

static void arm_tick(struct ctl_state *st)
{
	struct io_uring_sqe *sqe;
	uint64_t ns = st->heartbeat_ns / 2;

	if (st->tick_armed || (!st->nsessions && !st->nreqs && !st->gate.npreauth))
		return;
	if (ns > 250000000ull)
		ns = 250000000ull; /* handshake deadlines and retries need some resolution */
	sqe = ctl_ring_sqe(st);
	if (!sqe)
		return;
	st->tick_ts.tv_sec = (long long)(ns / 1000000000ull);
	st->tick_ts.tv_nsec = (long long)(ns % 1000000000ull);
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, ck(CK_TICK, 0, 0)));
	st->tick_armed = true;
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
		n += ctl_take_connects(st);
	if (st->any_dirty) {
		n += ctl_drain(st);
		st->need_arm = true;
	}
	if (st->tick_due) {
		st->tick_due = false;
		n += ctl_check_time(st);
	}
	if (!st->zctx)
		goto quiet; /* no channel in use: no socket, no tick */
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
quiet:
	/*
	 * The channel is not in use (no ZeroMQ context: no socket, no tick):
	 * nothing to do until a socket is opened (ctl_sock.c clears quiet with
	 * any_dirty) or a ferry_peer_connect from any thread (it wakes the
	 * backend): skip the rounds (transport.h, quiet), then look once more
	 * at what other threads write. A channel in use runs every round: its
	 * sockets' polls complete on the reactor's ring on their own time.
	 */
	if (!st->any_dirty && !st->tick_due && !st->need_arm) {
		ferry__backend_quiet(b);
		if (atomic_load(&st->connects_pending))
			backend_busy(b);
	}
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
 * the handshake tells its data address (ctl_waiters_go); a peer that refused us
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
	rc = sec_engine_params(p, &st->secret, &st->heartbeat_ns, &st->peer_timeout_ns);
	if (rc)
		goto fail;
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
	ctl_zmq_endpoint(control, ep, sizeof(ep));
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
			ctl_waiters_go(st, s, -ECANCELED);
			ctl_session_free(st, s);
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

#endif

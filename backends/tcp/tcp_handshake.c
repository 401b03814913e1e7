/*
 * backends/tcp/tcp_handshake.c - how the tcp transport's connections are
 * made: the listener, calls to a peer, the authenticated handshake.
 *
 * Owns: the listening socket and accepting callers (no more than
 * TCP_PREAUTH_MAX of them unproved at once); opening a link's connections
 * (tcp_caller_start); both ends of the handshake (security.h: HELLO, PROOF,
 * AUTH, OK or NO), driven by poll completions (tcp_on_poll), after which a
 * connection joins its link and io_uring carries it (conn_ready). Nothing
 * is read from a connection as a frame before this proved the peer holds
 * the cluster secret.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include "tcp_int.h"

static void arm_poll(struct tcp_state *st, struct tcp_conn *c, unsigned events)
{
	struct io_uring_sqe *sqe;

	if (c->poll_armed)
		return;
	sqe = tcp_get_sqe(st);
	if (!sqe) {
		tcp_conn_kill(st, c);
		return;
	}
	io_uring_prep_poll_add(sqe, c->fd, events);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_POLL, c->slot, c->gen));
	c->poll_armed = true;
}

/* ------------------------------------------------------------------ */
/* Handshake                                                          */
/* ------------------------------------------------------------------ */

static void hello_fill(struct tcp_state *st, struct tcp_hello *h, uint16_t type)
{
	memset(h, 0, sizeof(*h));
	h->magic = TCP_HELLO_MAGIC;
	h->version = TCP_PROTO_VERSION;
	h->type = type;
	h->caps = TCP_CAPS;
	snprintf(h->ns, sizeof(h->ns), "%s", st->engine->ns);
	snprintf(h->name, sizeof(h->name), "%s", st->engine->name);
}

/* Handshake messages are small and the socket fresh: a send is whole or fails. */
static int hello_send(struct tcp_conn *c, struct tcp_hello *h)
{
	ssize_t n;

	tcp_hello_to_wire(h);
	n = send(c->fd, h, sizeof(*h), MSG_NOSIGNAL | MSG_DONTWAIT);
	if (n == (ssize_t)sizeof(*h))
		return 0;
	return n < 0 ? -errno : -EIO;
}

/* Read what there is of the next hello. 1: whole, 0: more to come, < 0: error. */
static int hello_recv(struct tcp_conn *c)
{
	ssize_t n = recv(c->fd, (uint8_t *)&c->hin + c->hin_got, sizeof(c->hin) - c->hin_got,
			 MSG_DONTWAIT);

	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	if (n == 0)
		return -ECONNRESET;
	c->hin_got += (uint32_t)n;
	if (c->hin_got < sizeof(c->hin))
		return 0;
	c->hin_got = 0;
	tcp_hello_from_wire(&c->hin);
	if (c->hin.magic != TCP_HELLO_MAGIC)
		return -EPROTO;
	return 1;
}

/* The connection is authenticated: from here on io_uring carries it. */
static void conn_ready(struct tcp_state *st, struct tcp_conn *c)
{
	int fl = fcntl(c->fd, F_GETFL);

	/* Blocking mode: io_uring waits on the socket itself instead of -EAGAIN. */
	if (fl >= 0)
		fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK);
	c->hs = HS_READY;
	c->link->last_rx_ns = reactor_now(st->engine);
	tcp_conn_arm_recv(st, c);
	if (!c->caller)
		tcp_count_preauth(st);
}

static void link_up(struct tcp_state *st, struct tcp_link *l);

static void refuse(struct tcp_state *st, struct tcp_conn *c, int err)
{
	struct tcp_hello h;

	hello_fill(st, &h, TCP_H_NO);
	h.status = (uint32_t)err;
	hello_send(c, &h);
	tcp_conn_kill(st, c);
}

/* Callee: a HELLO came. */
static void callee_hello(struct tcp_state *st, struct tcp_conn *c)
{
	struct ferry_engine *e = st->engine;
	struct tcp_hello *in = &c->hin, h;
	struct tcp_link *l = NULL;
	char addr[NETADDR_MAX];

	netaddr_format((struct sockaddr *)&c->peer_sa, addr, sizeof(addr));
	if (in->type != TCP_H_HELLO || in->version != TCP_PROTO_VERSION) {
		log_warn("tcp: engine %s: refused %s: protocol version %u type %u (we speak %u)",
			 e->name, addr, in->version, in->type, TCP_PROTO_VERSION);
		refuse(st, c, EPROTONOSUPPORT);
		return;
	}
	/* A name no engine can have (an '@' would break its keys apart): refused too. */
	if (strcmp(in->ns, e->ns) != 0 || !ferry__name_valid(in->name) || in->nconns == 0 ||
	    in->nconns > TCP_MAX_CONNS || in->conn_index >= in->nconns) {
		log_warn("tcp: engine %s: refused %s (\"%s\" in namespace \"%s\", connection "
			 "%u of %u)", e->name, addr, in->name, in->ns, in->conn_index, in->nconns);
		refuse(st, c, EPERM);
		return;
	}
	snprintf(c->peer_name, sizeof(c->peer_name), "%s", in->name);
	c->link_id = in->link_id;
	c->index = in->conn_index;
	c->nconns = in->nconns;
	memcpy(c->nonce_peer, in->nonce, TCP_NONCE_BYTES);
	if (sec_nonce(c->nonce_me, TCP_NONCE_BYTES)) {
		refuse(st, c, EIO);
		return;
	}
	(void)l;
	hello_fill(st, &h, TCP_H_PROOF);
	memcpy(h.nonce, c->nonce_me, TCP_NONCE_BYTES);
	sec_proof(&st->secret, "ferry-callee", c->nonce_peer, c->nonce_me, c->peer_name, e->name,
		  e->ns, c->link_id, c->index, h.mac);
	if (hello_send(c, &h)) {
		tcp_conn_kill(st, c);
		return;
	}
	c->hs = HS_WAIT_AUTH;
	arm_poll(st, c, POLLIN);
}

/* Callee: the caller's proof came. */
static void callee_auth(struct tcp_state *st, struct tcp_conn *c)
{
	struct ferry_engine *e = st->engine;
	uint8_t want[TCP_MAC_BYTES];
	struct tcp_link *l;
	struct tcp_hello h;
	char addr[NETADDR_MAX];

	netaddr_format((struct sockaddr *)&c->peer_sa, addr, sizeof(addr));
	sec_proof(&st->secret, "ferry-caller", c->nonce_peer, c->nonce_me, c->peer_name, e->name,
		  e->ns, c->link_id, c->index, want);
	if (c->hin.type == TCP_H_NO) {
		/* The caller found our proof wrong: the two hold different secrets. */
		STAT_ADD(e->stats.peers_refused, 1);
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: \"%s\" from %s refused our proof "
			    "(%s): the two engines do not hold the same cluster secret", e->name,
			    c->peer_name, addr,
			    ferry_strerror(c->hin.status && c->hin.status < 4096 ?
						   -(int)c->hin.status : -EPROTO));
		tcp_conn_kill(st, c);
		return;
	}
	if (c->hin.type != TCP_H_AUTH || !sec_proof_equal(want, c->hin.mac)) {
		STAT_ADD(e->stats.peers_refused, 1);
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: refused \"%s\" from %s: wrong secret",
			    e->name, c->peer_name, addr);
		refuse(st, c, EACCES);
		return;
	}
	/* Join the caller's link, or start it. */
	for (l = st->links; l; l = l->next)
		if (!l->caller && link_open(l) && l->link_id == c->link_id &&
		    strcmp(l->peer_name, c->peer_name) == 0)
			break;
	if (!l) {
		l = tcp_link_new(st, c->peer_name, false);
		if (!l) {
			refuse(st, c, ENOMEM);
			return;
		}
		l->link_id = c->link_id;
		l->nconns = c->nconns;
		l->state = LINK_UP;
	}
	if (c->index >= l->nconns || l->conns[c->index]) {
		log_warn("tcp: engine %s: refused %s: connection %u of its link twice", e->name,
			 c->peer_name, c->index);
		refuse(st, c, EPROTO);
		return;
	}
	hello_fill(st, &h, TCP_H_OK);
	if (hello_send(c, &h)) {
		tcp_conn_kill(st, c);
		return;
	}
	l->conns[c->index] = c;
	c->link = l;
	log_debug("tcp: engine %s: %s connected (connection %u of %u)", e->name, c->peer_name,
		  c->index, l->nconns);
	conn_ready(st, c);
}

/*
 * The handshake of our connection c failed (res; why, or NULL: logged). A
 * link still calling fails with it. A link already up only loses c and
 * goes on with its other connections: they are authenticated and may
 * carry answers to PUTs already sent (if the peer is leaving, their ends
 * follow, see tcp_conn_end).
 */
void tcp_hs_fail(struct tcp_state *st, struct tcp_conn *c, int res, const char *why)
{
	struct tcp_link *l = c->link;

	if (l && (l->state == LINK_UP || l->state == LINK_ENDING)) {
		log_info("tcp: engine %s: connection %u to %s not made (%s): the link goes on "
			 "without it", st->engine->name, c->index, l->peer_name,
			 why ? why : ferry_strerror(res));
		tcp_conn_kill(st, c);
		return;
	}
	tcp_link_fail(st, l, res, why);
}

/* Caller: the callee's proof came. */
static void caller_proof(struct tcp_state *st, struct tcp_conn *c)
{
	struct ferry_engine *e = st->engine;
	struct tcp_link *l = c->link;
	uint8_t want[TCP_MAC_BYTES];
	struct tcp_hello h;

	if (c->hin.type == TCP_H_NO) {
		int err = c->hin.status && c->hin.status < 4096 ? (int)c->hin.status : EPROTO;

		log_warn("tcp: engine %s: %s refused us: %s", e->name, l->peer_name,
			 ferry_strerror(-err));
		tcp_hs_fail(st, c, err == EACCES ? -EACCES : -EHOSTUNREACH, NULL);
		return;
	}
	if (c->hin.type != TCP_H_PROOF || c->hin.version != TCP_PROTO_VERSION) {
		log_warn("tcp: engine %s: %s answered with version %u type %u", e->name,
			 l->peer_name, c->hin.version, c->hin.type);
		tcp_hs_fail(st, c, -EHOSTUNREACH, NULL);
		return;
	}
	if (strcmp(c->hin.name, l->peer_name) != 0 || strcmp(c->hin.ns, e->ns) != 0) {
		log_warn("tcp: engine %s: called %s, \"%s\" in namespace \"%s\" answered", e->name,
			 l->peer_name, c->hin.name, c->hin.ns);
		tcp_hs_fail(st, c, -EHOSTUNREACH, NULL);
		return;
	}
	memcpy(c->nonce_peer, c->hin.nonce, TCP_NONCE_BYTES);
	sec_proof(&st->secret, "ferry-callee", c->nonce_me, c->nonce_peer, e->name, l->peer_name,
		  e->ns, l->link_id, c->index, want);
	if (!sec_proof_equal(want, c->hin.mac)) {
		log_warn("tcp: engine %s: %s does not hold our secret: hung up", e->name,
			 l->peer_name);
		/* Say so before hanging up: the engine we called logs and counts it too. */
		hello_fill(st, &h, TCP_H_NO);
		h.status = EACCES;
		hello_send(c, &h);
		tcp_hs_fail(st, c, -EACCES, NULL);
		return;
	}
	hello_fill(st, &h, TCP_H_AUTH);
	sec_proof(&st->secret, "ferry-caller", c->nonce_me, c->nonce_peer, e->name, l->peer_name,
		  e->ns, l->link_id, c->index, h.mac);
	if (hello_send(c, &h)) {
		tcp_hs_fail(st, c, -EHOSTUNREACH, "handshake send failed");
		return;
	}
	c->hs = HS_WAIT_OK;
	arm_poll(st, c, POLLIN);
}

static void caller_ok(struct tcp_state *st, struct tcp_conn *c)
{
	struct tcp_link *l = c->link;

	if (c->hin.type != TCP_H_OK) {
		int err = c->hin.type == TCP_H_NO && c->hin.status && c->hin.status < 4096 ?
				  (int)c->hin.status : EPROTO;

		log_warn("tcp: engine %s: %s refused us: %s", st->engine->name, l->peer_name,
			 ferry_strerror(-err));
		tcp_hs_fail(st, c, err == EACCES ? -EACCES : -EHOSTUNREACH, NULL);
		return;
	}
	conn_ready(st, c);
	if (l->state == LINK_CONNECTING)
		link_up(st, l);
}

static void link_up(struct tcp_state *st, struct tcp_link *l)
{
	l->state = LINK_UP;
	log_debug("tcp: engine %s: link to %s up", st->engine->name, l->peer_name);
	while (l->wait_head && l->state == LINK_UP) {
		struct tcp_msg *m = l->wait_head;

		l->wait_head = m->wait_next;
		if (!l->wait_head)
			l->wait_tail = NULL;
		m->wait_next = NULL;
		tcp_msg_send(st, l, m);
	}
	/* The other connections, for bandwidth. */
	for (uint16_t i = 1; i < l->nconns && l->state == LINK_UP; i++)
		if (tcp_caller_start(st, l, i))
			break;
}

/* Handshake progress on a poll event. */
void tcp_on_poll(struct tcp_state *st, struct tcp_conn *c, int res)
{
	int rc;

	c->poll_armed = false;
	if (c->dead)
		return;
	if (res < 0 && res != -EINTR) {
		if (c->link)
			tcp_hs_fail(st, c, -EHOSTUNREACH, ferry_strerror(res));
		else
			tcp_conn_kill(st, c);
		return;
	}
	if (c->hs == HS_CONNECTING) {
		int err = 0;
		socklen_t len = sizeof(err);
		struct tcp_hello h;

		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err == 0 && !(res & (POLLOUT)))
			err = ECONNREFUSED;
		if (err) {
			log_info("tcp: engine %s: cannot reach %s: %s", st->engine->name,
				 c->link->peer_name, strerror(err));
			tcp_hs_fail(st, c, -EHOSTUNREACH, NULL);
			return;
		}
		hello_fill(st, &h, TCP_H_HELLO);
		h.conn_index = c->index;
		h.nconns = c->link->nconns;
		h.link_id = c->link->link_id;
		memcpy(h.nonce, c->nonce_me, TCP_NONCE_BYTES);
		if ((rc = hello_send(c, &h))) {
			tcp_hs_fail(st, c, -EHOSTUNREACH, ferry_strerror(rc));
			return;
		}
		c->hs = HS_WAIT_PROOF;
		arm_poll(st, c, POLLIN);
		return;
	}
	rc = hello_recv(c);
	if (rc == 0) {
		arm_poll(st, c, POLLIN);
		return;
	}
	if (rc < 0) {
		if (c->link && c->caller) {
			log_info("tcp: engine %s: handshake with %s: %s", st->engine->name,
				 c->link->peer_name, ferry_strerror(rc));
			tcp_hs_fail(st, c, -EHOSTUNREACH, NULL);
		} else {
			log_info("tcp: engine %s: a caller left during its handshake: %s",
				 st->engine->name, ferry_strerror(rc));
			tcp_conn_kill(st, c);
		}
		return;
	}
	switch (c->hs) {
	case HS_WAIT_HELLO:
		callee_hello(st, c);
		break;
	case HS_WAIT_AUTH:
		callee_auth(st, c);
		break;
	case HS_WAIT_PROOF:
		caller_proof(st, c);
		break;
	case HS_WAIT_OK:
		caller_ok(st, c);
		break;
	}
}

static int set_sockopts(int fd)
{
	int one = 1, big = 4 << 20;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	return 0;
}

/* Open connection index of a link we call. */
int tcp_caller_start(struct tcp_state *st, struct tcp_link *l, uint16_t index)
{
	struct tcp_conn *c;
	int fd, rc;

	fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	set_sockopts(fd);
	c = tcp_conn_new(st, fd, true);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->link = l;
	c->index = index;
	c->hs = HS_CONNECTING;
	l->conns[index] = c;
	if ((rc = sec_nonce(c->nonce_me, TCP_NONCE_BYTES))) {
		tcp_conn_kill(st, c);
		return rc;
	}
	if (connect(fd, (struct sockaddr *)&l->addr, l->addrlen) < 0 && errno != EINPROGRESS) {
		rc = -errno;
		log_info("tcp: engine %s: connect to %s: %s", st->engine->name, l->peer_name,
			 ferry_strerror(rc));
		tcp_conn_kill(st, c);
		return rc;
	}
	arm_poll(st, c, POLLOUT);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Listener                                                           */
/* ------------------------------------------------------------------ */

void tcp_arm_listen(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;

	if (st->lfd < 0)
		return;
	sqe = tcp_get_sqe(st);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, st->lfd, POLLIN);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_LISTEN, 0, st->lgen));
}

/* Callers accepted that have not proved the cluster secret yet (health says it too). */
unsigned tcp_count_preauth(struct tcp_state *st)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++) {
		struct tcp_conn *c = st->conns[i];

		n += c && !c->dead && !c->caller && c->hs != HS_READY;
	}
	atomic_store_explicit(&st->engine->stats.unproved_data, n, memory_order_relaxed);
	return n;
}

/* Too many callers prove nothing at once: the oldest is hung up on. */
static void drop_oldest_preauth(struct tcp_state *st)
{
	struct tcp_conn *old = NULL;
	char addr[NETADDR_MAX];

	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++) {
		struct tcp_conn *c = st->conns[i];

		if (c && !c->dead && !c->caller && c->hs != HS_READY &&
		    (!old || c->hs_deadline < old->hs_deadline))
			old = c;
	}
	if (!old)
		return;
	netaddr_format((struct sockaddr *)&old->peer_sa, addr, sizeof(addr));
	STAT_ADD(st->engine->stats.handshakes_dropped, 1);
	log_limited(FERRY__LOG_WARN, "tcp: engine %s: a caller at %s was the oldest of %u that had "
		    "not proved the cluster secret yet: hung up", st->engine->name, addr,
		    TCP_PREAUTH_MAX);
	tcp_conn_kill(st, old);
}

void tcp_accept_all(struct tcp_state *st)
{
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t len = sizeof(sa);
		struct tcp_conn *c;
		char addr[NETADDR_MAX];
		int fd = accept4(st->lfd, (struct sockaddr *)&sa, &len,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("tcp: engine %s: accept: %s", st->engine->name,
					 strerror(errno));
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;
		}
		if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&sa)) {
			netaddr_format((struct sockaddr *)&sa, addr, sizeof(addr));
			log_warn("tcp: engine %s: refused %s: no cluster secret is set, so only "
				 "loopback peers are accepted", st->engine->name, addr);
			close(fd);
			continue;
		}
		if (tcp_count_preauth(st) >= TCP_PREAUTH_MAX)
			drop_oldest_preauth(st);
		set_sockopts(fd);
		c = tcp_conn_new(st, fd, false);
		if (!c) {
			close(fd);
			continue;
		}
		memcpy(&c->peer_sa, &sa, sizeof(sa));
		c->hs = HS_WAIT_HELLO;
		arm_poll(st, c, POLLIN);
		tcp_count_preauth(st);
	}
}

int tcp_listen_start(struct tcp_state *st)
{
	struct ferry_engine *e = st->engine;
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, rc, one = 1;

	rc = netaddr_parse(st->listen_text, false, &ss, &len);
	if (rc)
		return rc;
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss))
		log_warn("tcp: engine %s listens on %s without a cluster secret: only loopback "
			 "peers will be accepted (set params.secret, FERRY_SECRET or "
			 "params.secret_file)", e->name, st->listen_text);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) < 0) {
		rc = -errno;
		log_error("tcp: engine %s: cannot listen on %s: %s%s", e->name, st->listen_text,
			  ferry_strerror(rc),
			  rc == -EADDRINUSE ? " (another process holds this address; use port 0 "
					      "and publish ferry_engine_address)" : "");
		close(fd);
		return rc;
	}
	if (listen(fd, TCP_BACKLOG) < 0) {
		rc = -errno;
		log_error("tcp: engine %s: listen on %s: %s", e->name, st->listen_text,
			  ferry_strerror(rc));
		close(fd);
		return rc;
	}
	len = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &len);
	netaddr_format((struct sockaddr *)&ss, st->bound, sizeof(st->bound));
	st->lfd = fd;
	st->lgen++;
	log_debug("tcp: engine %s listens on %s", e->name, st->bound);
	return 0;
}

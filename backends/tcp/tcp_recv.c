/*
 * backends/tcp/tcp_recv.c - the tcp transport's receive side: frames
 * coming in on an authenticated connection.
 *
 * Owns: parsing the staging buffer (take_frame: the header's checks, then
 * the frame type's handler from the table tcp_frame_take), every check a
 * frame's type requires (lengths, keys, cookies and slots against our
 * tables: nothing read off a socket is trusted), handing an eager PUT to
 * the key table and answering RESULT, incoming offers (RTS) waiting for
 * pool room and their CTS, rendezvous data received into its block
 * (staged, or straight into the block: tcp_rx_bytes), and the RECVs armed
 * on the ring. A frame that breaks a rule is logged and fails its link.
 * This is the per-frame path: what it calls per frame is here or inline in
 * tcp_int.h.
 */
#include "tcp_int.h"

/* ------------------------------------------------------------------ */
/* Receiving                                                          */
/* ------------------------------------------------------------------ */

static struct tcp_msg *msg_find(struct tcp_state *st, struct tcp_link *l, uint64_t cookie)
{
	uint32_t id = (uint32_t)cookie;
	struct tcp_msg *m;

	if (id >= st->nmsgs)
		return NULL;
	m = &st->msgs[id];
	if (m->state != MSG_LIVE || m->gen != (uint32_t)(cookie >> 32) || m->link != l)
		return NULL;
	return m;
}

static struct tcp_rx *rx_find(struct tcp_state *st, struct tcp_link *l, uint64_t cookie)
{
	uint32_t id = (uint32_t)cookie;
	struct tcp_rx *r;

	if (id >= st->nrxs)
		return NULL;
	r = &st->rxs[id];
	if (r->state != RX_RECEIVING || r->gen != (uint32_t)(cookie >> 32) || r->link != l)
		return NULL;
	return r;
}

/*
 * Hand arrived data in buf to the key table under fullkey (n bytes, or a
 * negative errno: the key's composing failed); returns the PUT's result
 * (buf is freed when it was not taken).
 */
static int deliver_full(struct tcp_state *st, const char *fullkey, int n, struct ferry_buf *buf,
			uint64_t len, uint32_t flags)
{
	int rc = n < 0 ? n : reactor_deliver(st->engine, NULL, fullkey, (size_t)n, buf, len,
					     wire_flags((uint8_t)flags));

	if (rc)
		pool_free(buf);
	return rc;
}

/* The same for a key as it came (without its "@from_to"). */
static int deliver(struct tcp_state *st, struct tcp_link *l, const char *key, uint16_t key_len,
		   struct ferry_buf *buf, uint64_t len, uint32_t flags)
{
	char fullkey[FULLKEY_MAX];

	return deliver_full(st, fullkey, keytable_compose_sfx(fullkey, key, key_len, &l->arrive_sfx),
			    buf, len, flags);
}

/* Try to give a waiting offer its block; then answer CTS. */
static bool rx_try_mem(struct tcp_state *st, struct tcp_rx *r)
{
	if (pool_alloc(st->engine->pool, r->len, &r->buf) != 0)
		return false;
	r->state = RX_RECEIVING;
	r->gen++;
	r->got = 0;
	if (!ctl_send(st, r->conn, TCP_F_CTS, r->cookie, ((uint64_t)r->gen << 32) | r->id)) {
		/* No control frame now: give the block back, try again later. */
		pool_free(r->buf);
		r->buf = NULL;
		r->state = RX_WAIT_MEM;
		return false;
	}
	return true;
}

static void wait_mem_push(struct tcp_state *st, struct tcp_rx *r)
{
	r->state = RX_WAIT_MEM;
	r->next = NULL;
	if (st->wait_mem_tail)
		st->wait_mem_tail->next = r;
	else
		st->wait_mem_head = r;
	st->wait_mem_tail = r;
}

/* Offers waiting for pool room, in order; returns how many moved. */
int tcp_retry_wait_mem(struct tcp_state *st)
{
	int n = 0;

	while (st->wait_mem_head) {
		struct tcp_rx *r = st->wait_mem_head;
		bool gone = !r->link || r->link->state == LINK_DEAD;

		if (!gone && !rx_try_mem(st, r))
			break;
		st->wait_mem_head = r->next;
		if (!st->wait_mem_head)
			st->wait_mem_tail = NULL;
		r->next = NULL;
		if (gone)
			rx_free(st, r);
		n++;
	}
	return n;
}

static void rx_complete(struct tcp_state *st, struct tcp_rx *r)
{
	struct tcp_link *l = r->link;
	struct tcp_conn *c = r->conn;
	struct ferry_buf *buf = r->buf;
	int rc;

	r->buf = NULL;
	rc = deliver(st, l, r->key, r->key_len, buf, r->len, r->flags);
	/* A control frame was kept for this answer when the offer came. */
	if (!ctl_send(st, c, TCP_F_RESULT, r->cookie, (uint64_t)(int64_t)rc))
		log_warn("tcp: engine %s: no control frame left to answer %s", st->engine->name,
			 l->peer_name);
	rx_free(st, r);
}

static void conn_stall(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->rx_stalled)
		return;
	c->rx_stalled = true;
	c->next_stalled = st->stalled;
	st->stalled = c;
}

/* ------------------------------------------------------------------ */
/* Frame handlers                                                     */
/* ------------------------------------------------------------------ */

/*
 * Frame handlers, one per type (tcp_frame_take). Each is given a frame
 * whose header passed take_frame's checks (magic, a type below
 * TCP_F__MAX, reserved bits), checks what its type requires, in this
 * order: its lengths, then (a frame with a key) that the whole body came
 * and the key is sound, then the control frames its answers need in
 * reserve; then takes it. Returns what take_frame returns: 1 taken, 0
 * more bytes (or a control frame) needed first, -1 with *why set when the
 * peer broke a rule (take_frame logs it and fails the link).
 */
typedef int tcp_take_fn(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
			const char **why);

static int take_put(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		    const char **why)
{
	struct tcp_link *l = c->link;
	uint32_t avail = c->rx_tail - c->rx_head;
	const uint8_t *key = c->rx + c->rx_head + TCP_FRAME_BYTES;
	char fullkey[FULLKEY_MAX];
	struct ferry_buf *buf;
	int rc, n;

	if (f->key_len == 0 || f->key_len >= FERRY_KEY_MAX || f->arg > TCP_EAGER_MAX ||
	    f->len != f->key_len + f->arg) {
		*why = "bad eager frame lengths";
		return -1;
	}
	if (avail < TCP_FRAME_BYTES + f->len)
		return 0;
	if (!wire_key_ok(key, f->key_len)) {
		*why = "bad key";
		return -1;
	}
	if (!ctl_available(st, 1)) {
		conn_stall(st, c);
		return 0;
	}
	/*
	 * A GET into an iovec that waits for it takes the data straight from the
	 * receive buffer; else it goes into a block of our pool for the key table.
	 */
	n = keytable_compose_sfx(fullkey, (const char *)key, f->key_len, &l->arrive_sfx);
	if (n >= 0 && reactor_deliver_copy(st->engine, fullkey, (size_t)n, key + f->key_len,
					   f->arg, wire_flags((uint8_t)f->flags))) {
		rc = 0;
	} else if (n < 0) {
		rc = n;
	} else if ((rc = pool_alloc(st->engine->pool, f->arg, &buf)) == 0) {
		ferry__payload_copy(buf->data, key + f->key_len, f->arg);
		rc = deliver_full(st, fullkey, n, buf, f->arg, f->flags);
	} else {
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: pool full, refusing an "
			    "eager PUT of %llu bytes from %s", st->engine->name,
			    (unsigned long long)f->arg, l->peer_name);
		rc = -ENOBUFS;
	}
	ctl_send(st, c, TCP_F_RESULT, f->cookie, (uint64_t)(int64_t)rc);
	c->rx_head += TCP_FRAME_BYTES + f->len;
	return 1;
}

static int take_rts(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		    const char **why)
{
	struct tcp_link *l = c->link;
	uint32_t avail = c->rx_tail - c->rx_head;
	const uint8_t *key = c->rx + c->rx_head + TCP_FRAME_BYTES;
	struct tcp_rx *r;

	if (f->key_len == 0 || f->key_len >= FERRY_KEY_MAX || f->len != f->key_len ||
	    f->arg == 0) {
		*why = "bad offer lengths";
		return -1;
	}
	if (avail < TCP_FRAME_BYTES + f->len)
		return 0;
	if (!wire_key_ok(key, f->key_len)) {
		*why = "bad key";
		return -1;
	}
	/* One frame for CTS, one kept for the RESULT. */
	if (!ctl_available(st, 2)) {
		conn_stall(st, c);
		return 0;
	}
	c->rx_head += TCP_FRAME_BYTES + f->len;
	if (f->arg > pool_size(st->engine->pool)) {
		log_info("tcp: engine %s: %s offers %llu bytes, more than the pool",
			 st->engine->name, l->peer_name, (unsigned long long)f->arg);
		ctl_send(st, c, TCP_F_RESULT, f->cookie, (uint64_t)(int64_t)-EMSGSIZE);
		return 1;
	}
	r = st->free_rxs;
	if (!r) {
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: %u offers pending, refusing "
			    "one from %s", st->engine->name, st->nrxs, l->peer_name);
		ctl_send(st, c, TCP_F_RESULT, f->cookie, (uint64_t)(int64_t)-ENOBUFS);
		return 1;
	}
	st->free_rxs = r->next;
	r->next = NULL;
	r->link = l;
	r->conn = c;
	r->len = f->arg;
	r->got = 0;
	r->cookie = f->cookie;
	r->flags = f->flags;
	r->key_len = f->key_len;
	copy_short(r->key, key, f->key_len);
	r->key[f->key_len] = '\0';
	if (st->wait_mem_head || !rx_try_mem(st, r))
		wait_mem_push(st, r);
	return 1;
}

static int take_cts(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		    const char **why)
{
	struct tcp_link *l = c->link;
	struct tcp_msg *m;

	if (f->len || f->key_len) {
		*why = "bad CTS";
		return -1;
	}
	c->rx_head += TCP_FRAME_BYTES;
	m = msg_find(st, l, f->cookie);
	if (!m || !m->rendezvous || m->cts) {
		*why = "CTS for no offer";
		return -1;
	}
	m->cts = true;
	if (m->resulted)
		return 1;
	m->rx_slot = f->arg;
	m->next_off = 0;
	m->wait_next = NULL;
	if (l->rdv_tail)
		l->rdv_tail->wait_next = m;
	else
		l->rdv_head = m;
	l->rdv_tail = m;
	for (unsigned i = 0; i < l->nconns; i++)
		if (l->conns[i] && !l->conns[i]->dead)
			conn_kick(st, l->conns[i]);
	return 1;
}

static int take_data(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		     const char **why)
{
	struct tcp_rx *r;
	uint64_t have, n;

	if (f->key_len || f->len == 0) {
		*why = "bad DATA lengths";
		return -1;
	}
	r = rx_find(st, c->link, f->cookie);
	if (!r || f->arg > r->len || f->len > r->len - f->arg || f->len > r->len - r->got) {
		*why = "DATA outside its offer";
		return -1;
	}
	c->rx_head += TCP_FRAME_BYTES;
	have = c->rx_tail - c->rx_head;
	n = have < f->len ? have : f->len;
	ferry__payload_copy((uint8_t *)r->buf->data + f->arg, c->rx + c->rx_head, n);
	c->rx_head += (uint32_t)n;
	r->got += n;
	if (n < f->len) {
		/* The rest goes straight into the block. */
		c->direct = r;
		c->direct_off = f->arg + n;
		c->direct_left = f->len - n;
		return 1;
	}
	if (r->got == r->len)
		rx_complete(st, r);
	return 1;
}

static int take_result(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		       const char **why)
{
	struct tcp_link *l = c->link;
	struct tcp_msg *m;
	int64_t res = (int64_t)f->arg;

	if (f->len || f->key_len || res > 0 || res < -4095) {
		*why = "bad RESULT";
		return -1;
	}
	c->rx_head += TCP_FRAME_BYTES;
	m = msg_find(st, l, f->cookie);
	if (!m || m->resulted) {
		*why = "RESULT for no PUT";
		return -1;
	}
	if (m->rendezvous && res == 0 && (!m->cts || m->next_off < m->len)) {
		*why = "RESULT before the data was sent";
		return -1;
	}
	/* Chunks not yet queued will not be. */
	if (m->rendezvous && m->cts && m->next_off < m->len) {
		struct tcp_msg **pp = &l->rdv_head, *prev = NULL;

		while (*pp && *pp != m) {
			prev = *pp;
			pp = &(*pp)->wait_next;
		}
		if (*pp) {
			*pp = m->wait_next;
			if (l->rdv_tail == m)
				l->rdv_tail = prev;
		}
		m->wait_next = NULL;
		m->next_off = m->len;
	}
	msg_result(st, m, (int)res);
	return 1;
}

static int take_ping(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		     const char **why)
{
	if (f->len || f->key_len) {
		*why = "bad PING";
		return -1;
	}
	if (!ctl_available(st, 1)) {
		conn_stall(st, c);
		return 0;
	}
	c->rx_head += TCP_FRAME_BYTES;
	ctl_send(st, c, TCP_F_PONG, f->cookie, 0);
	return 1;
}

static int take_pong(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
		     const char **why)
{
	(void)st;
	if (f->len || f->key_len) {
		*why = "bad PONG";
		return -1;
	}
	c->rx_head += TCP_FRAME_BYTES;
	return 1;
}

/* A type with no handler (0, which take_frame's header check refuses first). */
static int take_unknown(struct tcp_state *st, struct tcp_conn *c, const struct tcp_frame *f,
			const char **why)
{
	(void)st;
	(void)c;
	(void)f;
	*why = "unknown frame";
	return -1;
}

/* The handler of each frame type; take_frame refuses types from TCP_F__MAX up. */
static tcp_take_fn *const tcp_frame_take[TCP_F__MAX] = {
	[0] = take_unknown,
	[TCP_F_PUT] = take_put,
	[TCP_F_RTS] = take_rts,
	[TCP_F_CTS] = take_cts,
	[TCP_F_DATA] = take_data,
	[TCP_F_RESULT] = take_result,
	[TCP_F_PING] = take_ping,
	[TCP_F_PONG] = take_pong,
};

/*
 * Take one frame from the staging buffer. Returns 1 if taken, 0 if more
 * bytes (or a resource) are needed first, -1 if the peer broke a rule (its
 * link is failed). The header is checked here (the type against the
 * table's bounds too), the rest by the type's handler.
 */
static int take_frame(struct tcp_state *st, struct tcp_conn *c)
{
	struct tcp_link *l = c->link;
	struct tcp_frame f;
	const char *why;
	int rc;

	if (c->rx_tail - c->rx_head < TCP_FRAME_BYTES)
		return 0;
	tcp_frame_unpack(c->rx + c->rx_head, &f);
	if (f.magic != TCP_FRAME_MAGIC || f.type == 0 || f.type >= TCP_F__MAX || f.resv ||
	    (f.flags & ~TCP_FRAME_F__ALL)) {
		why = "bad frame header";
	} else {
		rc = tcp_frame_take[f.type](st, c, &f, &why);
		if (rc >= 0)
			return rc;
	}
	log_warn("tcp: engine %s: disconnecting %s: %s (type %u, len %u)", st->engine->name,
		 l->peer_name, why, f.type, f.len);
	tcp_link_fail(st, l, -ECONNRESET, NULL);
	return -1;
}

/* ------------------------------------------------------------------ */
/* Reading                                                            */
/* ------------------------------------------------------------------ */

void tcp_conn_arm_recv(struct tcp_state *st, struct tcp_conn *c)
{
	struct io_uring_sqe *sqe;
	size_t len;
	void *p;

	if (c->recv_armed || c->hot || c->dead || c->ended || c->rx_stalled)
		return;
	sqe = tcp_get_sqe(st);
	if (!sqe) {
		tcp_link_fail(st, c->link, -ECONNRESET, "io_uring full");
		return;
	}
	rx_target(c, &p, &len);
	io_uring_prep_recv(sqe, c->fd, p, len, c->direct ? MSG_WAITALL : 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_RECV, c->slot, c->gen));
	c->recv_armed = true;
}

void tcp_rx_parse(struct tcp_state *st, struct tcp_conn *c)
{
	while (!c->dead && !c->direct && !c->rx_stalled && take_frame(st, c) > 0)
		;
	if (c->dead)
		return;
	if (c->rx_head == c->rx_tail)
		c->rx_head = c->rx_tail = 0;
	tcp_conn_arm_recv(st, c); /* a hot connection is read by the next round instead */
}

/* n bytes came into rx_target's place. */
void tcp_rx_bytes(struct tcp_state *st, struct tcp_conn *c, uint64_t n)
{
	uint64_t now = reactor_now(st->engine);

	c->link->last_rx_ns = now;
	c->last_rx_ns = now;
	if (c->direct) {
		struct tcp_rx *r = c->direct;

		c->direct_off += n;
		c->direct_left -= n;
		r->got += n;
		if (c->direct_left) {
			tcp_conn_arm_recv(st, c);
			return;
		}
		c->direct = NULL;
		c->hdr_next = true;
		if (r->got == r->len)
			rx_complete(st, r);
	} else {
		c->rx_tail += (uint32_t)n;
		if (c->rx_tail - c->rx_head >= TCP_FRAME_BYTES)
			c->hdr_next = false;
	}
	tcp_rx_parse(st, c);
}

/* Connections that waited for control frames try again. */
int tcp_retry_stalled(struct tcp_state *st)
{
	struct tcp_conn *list = st->stalled;
	int n = 0;

	if (!st->free_ctls)
		return 0;
	st->stalled = NULL;
	while (list) {
		struct tcp_conn *c = list;

		list = c->next_stalled;
		c->next_stalled = NULL;
		c->rx_stalled = false;
		tcp_rx_parse(st, c);
		n++;
	}
	return n;
}

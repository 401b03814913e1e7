/*
 * backends/tcp/tcp_int.h - what the pieces of the tcp transport share
 * (private to backends/tcp/ and its tests).
 *
 * Owns: the transport's limits, the io_uring cookie format, the types
 * (messages, control frames, incoming offers, connections, links, the
 * transport's state), the small helpers every piece calls on the data path
 * (static inline here, so that a frame queued, sent or answered costs no
 * call across files: tx_push, conn_kick, ctl_send, msg_result, ...) and the
 * functions each file offers the others. The transport itself is described
 * in tcp.c's header comment; the wire format in tcp_wire.h.
 *
 *   tcp.c            the table, setup and teardown, the ring, the round
 *                    (completions, busy polling), the public calls
 *   tcp_link.c       links and connections: lifetime, faults, liveness
 *   tcp_handshake.c  the listener, calls, the authenticated handshake
 *   tcp_send.c       PUTs going out: messages, send queues, flushing
 *   tcp_recv.c       frames coming in: parsing, the frame handlers, offers
 */
#ifndef FERRY_TCP_INT_H
#define FERRY_TCP_INT_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "internal.h"
#include "netaddr.h"
#include "security.h"
#include "tcp_wire.h"

#define TCP_EAGER_MAX (64u * 1024u) /* payloads up to this go in one frame */
/*
 * A PUT of an iovec of at most this many bytes is copied into its message
 * (backend_ops.iov_put_max) instead of a pool block: no block to take and
 * give back per small PUT. 2 * max_ops messages: 512 KiB of them per 1024
 * ops, touched only as messages are used.
 */
#define TCP_INLINE_MAX 256u
#define TCP_RX_STAGE (256u * 1024u) /* per connection: frames are parsed from here */
#define TCP_CHUNK (512u * 1024u)    /* rendezvous data per frame */
#define TCP_CHUNKS_PER_CONN 4       /* chunks one connection has queued at most */
#define TCP_IOV_MAX 64              /* iovecs per sendmsg */
/*
 * A send queue of at most this many bytes is gathered into one buffer and
 * leaves with send() instead of sendmsg(): on the test machine a 133-byte
 * send() cost ~0.4 us less than a sendmsg() of the same bytes in 4 iovecs
 * (docs/benchmarks.md); copying that little costs far less.
 */
#define TCP_COALESCE_MAX 2048u
#define TCP_MAX_SOCKS 1024          /* connections of one engine */
#define TCP_PREAUTH_MAX 64          /* callers that proved nothing yet, at once */
#define TCP_RING_ENTRIES 256
#define TCP_BACKLOG 128
#define TCP_HOT_NS 2000000ull       /* a connection quiet this long is read by io_uring again */
#define TCP_MAX_HOT 16              /* connections read directly, at most */
#define TCP_READS_PER_ROUND 8       /* direct reads of one connection per round at most */
#define TCP_END_GRACE_NS 100000000ull /* a link whose peer ended some connections: see conn_end */

/*
 * RESULTs alone on a connection wait this long for a frame to go with them
 * (flush_all); FERRY_TCP_HOLD_NS overrides (0: never), benchmarks measure it.
 */
#define TCP_RESULT_HOLD_NS 20000ull

/* Connections per link: FERRY_TCP_CONNS overrides (benchmarks measure it). */
#define TCP_DEFAULT_CONNS 4

/* io_uring cookies: kind in the low 4 bits, connection slot, generation. */
enum { K_LISTEN = 1, K_POLL = 2, K_RECV = 3, K_SEND = 4, K_TICK = 5, K_RINGFD = 6, K_END = 7 };

static inline uint64_t mk_cookie(unsigned kind, uint32_t slot, uint32_t gen)
{
	return ((uint64_t)gen << 24) | ((uint64_t)slot << 4) | kind;
}

/* ------------------------------------------------------------------ */
/* Types                                                              */
/* ------------------------------------------------------------------ */

enum { TX_MSG = 1, TX_CTL = 2, TX_CHUNK = 3 };

/* Something queued on a connection's send side: a header, a key, data. */
struct tcp_tx {
	struct tcp_tx *next;
	uint8_t kind;
	uint8_t hdr[TCP_FRAME_BYTES];
	const void *key;
	uint32_t key_len;
	const void *data;
	uint64_t data_len;
	uint64_t sent; /* bytes of hdr + key + data already sent */
};

enum { MSG_FREE = 0, MSG_LIVE };

/* A PUT on its way out. */
struct tcp_msg {
	struct tcp_tx tx;      /* the eager frame or the offer */
	struct op *op;
	uint32_t op_gen;
	uint32_t id, gen;      /* its name on the wire: gen << 32 | id */
	uint8_t state;
	bool tx_busy;          /* its frame is queued or being sent */
	bool resulted;         /* the peer answered (or the link died) */
	bool rendezvous;
	bool cts;              /* the receiver said where the data goes */
	struct ferry_buf *buf; /* its data; NULL when it is in inl */
	uint64_t len;
	uint64_t rx_slot;      /* the receiver's slot (from CTS) */
	uint64_t next_off;     /* rendezvous: next byte to put in a chunk */
	uint32_t chunks_out;   /* chunks queued or being sent */
	struct tcp_link *link;
	struct tcp_msg *next, *prev; /* the link's messages */
	struct tcp_msg *wait_next;   /* link waiting / rendezvous queue */
	uint32_t flags;
	uint16_t key_len;
	char key[FERRY_KEY_MAX];
	uint8_t inl[TCP_INLINE_MAX]; /* the data of a small PUT made from an iovec */
};

/* A control frame (RESULT, CTS, PING, PONG): header only. */
struct tcp_ctl {
	struct tcp_tx tx;
	struct tcp_ctl *free_next;
};

struct tcp_chunk {
	struct tcp_tx tx;
	struct tcp_msg *msg;
	bool busy;
};

enum { RX_FREE = 0, RX_WAIT_MEM, RX_RECEIVING };

/* An incoming rendezvous PUT. */
struct tcp_rx {
	uint32_t id, gen;
	uint8_t state;
	bool orphan;           /* its link died while a recv wrote into it */
	struct tcp_link *link;
	struct tcp_conn *conn; /* where its offer came from (answers go there) */
	struct ferry_buf *buf;
	uint64_t len, got;
	uint64_t cookie;       /* the sender's message */
	uint32_t flags;
	uint16_t key_len;
	char key[FERRY_KEY_MAX];
	struct tcp_rx *next;   /* free list / waiting for memory */
};

enum {
	HS_CONNECTING = 1, /* caller: connect in progress */
	HS_WAIT_PROOF,     /* caller: HELLO sent */
	HS_WAIT_OK,        /* caller: AUTH sent */
	HS_WAIT_HELLO,     /* callee: accepted */
	HS_WAIT_AUTH,      /* callee: PROOF sent */
	HS_READY,
};

struct tcp_conn {
	struct tcp_state *st;
	struct tcp_link *link; /* NULL for a callee before its HELLO */
	uint32_t slot, gen;
	int fd;
	uint8_t hs;
	bool caller;
	bool dead;
	bool ended;            /* the peer closed it, or it broke: nothing more in or out (conn_end) */
	bool poll_armed, recv_armed, send_armed;
	bool rx_stalled;       /* waits for a control frame or an rx slot */
	bool hot;              /* read directly each round (no RECV armed), see conn_read */
	bool flush_queued;     /* in st->flushq: its send queue goes out at the round's end */
	bool flush_held;       /* only RESULTs queued: held back a moment (see flush_all) */
	uint64_t held_ns;      /* since when */
	uint32_t hold_skip;    /* flushes not to hold: the last holds caught no PUT */
	uint8_t hold_vain;     /* holds in a row that caught nothing (backoff 2^n - 1) */
	uint32_t hot_pos;      /* its place in st->hot */
	uint64_t last_rx_ns;   /* when it last received bytes */
	uint16_t index;        /* its place in the link */
	uint64_t hs_deadline;
	struct tcp_hello hin;
	uint32_t hin_got;
	uint8_t nonce_me[TCP_NONCE_BYTES], nonce_peer[TCP_NONCE_BYTES];
	char peer_name[FERRY_NAME_MAX];
	uint64_t link_id;
	uint16_t nconns;
	struct sockaddr_storage peer_sa;
	/* Receive: frames are parsed from rx[rx_head, rx_tail). */
	uint8_t *rx;
	uint32_t rx_head, rx_tail;
	struct tcp_rx *direct; /* receiving data straight into a block */
	uint64_t direct_off, direct_left, direct_len;
	bool hdr_next;         /* a direct receive ended: read the next header alone */
	/* Send. */
	struct tcp_tx *txq, *txq_tail;
	struct tcp_chunk chunks[TCP_CHUNKS_PER_CONN];
	struct iovec iov[TCP_IOV_MAX];
	struct msghdr mh;
	struct tcp_conn *next_stalled;
};

/* ENDING: some connections ended, the others are read until they end too (conn_end). */
enum { LINK_CONNECTING = 1, LINK_UP, LINK_ENDING, LINK_DEAD };

struct tcp_link {
	int refs;              /* the table, each peer resolved to it */
	uint8_t state;
	bool caller;
	char peer_name[FERRY_NAME_MAX];
	struct key_suffix arrive_sfx; /* "@{peer_name}_{engine}": the keys of its PUTs */
	uint64_t link_id;
	uint16_t nconns;       /* connections it should have */
	struct tcp_conn *conns[TCP_MAX_CONNS];
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct tcp_msg *msgs;                   /* every message of the link */
	struct tcp_msg *wait_head, *wait_tail;  /* PUTs before the link was up */
	struct tcp_msg *rdv_head, *rdv_tail;    /* data to send */
	/*
	 * The head of rdv waits for its block to be filled further (pipelined
	 * staging of device memory: pool_filled): tcp_fill_check looks again.
	 */
	bool fill_wait;
	uint64_t last_rx_ns, last_ping_ns;
	uint64_t ended_ns;     /* when it began ENDING */
	uint32_t rr;
	struct tcp_link *next;
};

struct tcp_state {
	struct ferry_engine *engine;
	struct backend *b;
	bool ready;            /* tables and ring exist */
	struct io_uring ring;
	bool ringfd_armed;
	uint32_t inflight;     /* SQEs whose CQE has not come */
	bool tick_armed;
	bool tick_due;         /* the tick fired: deadlines, heartbeats, reaping */
	bool end_armed;        /* a K_END timeout is on the ring */
	uint32_t nending;      /* links ENDING */
	uint32_t nconns;       /* connections in the table */
	struct __kernel_timespec tick_ts, end_ts;
	/* Configuration. */
	struct sec_secret secret;
	char listen_text[NETADDR_MAX];
	char bound[NETADDR_MAX];
	int lfd;
	uint32_t lgen;
	uint64_t heartbeat_ns, peer_timeout_ns;
	uint16_t conns_per_link;
	uint64_t result_hold_ns;
	/* Tables. */
	struct tcp_conn *conns[TCP_MAX_SOCKS];
	uint32_t next_gen;
	struct tcp_link *links;
	struct tcp_msg *msgs;
	uint32_t nmsgs;
	struct tcp_msg *free_msgs;
	struct tcp_rx *rxs;
	uint32_t nrxs;
	struct tcp_rx *free_rxs;
	struct tcp_rx *wait_mem_head, *wait_mem_tail;
	struct tcp_ctl *ctls;
	uint32_t nctls;
	struct tcp_ctl *free_ctls;
	struct tcp_conn *stalled;
	uint32_t fill_waits;   /* links with fill_wait set */
	uint32_t ndead;        /* dead connections not yet freed */
	/* Connections read with recv() each round instead of an armed RECV. */
	struct tcp_conn *hot[TCP_MAX_SOCKS];
	uint32_t nhot;
	/* Connections with frames queued since the last flush. */
	struct tcp_conn *flushq[TCP_MAX_SOCKS];
	uint32_t nflush;
	/* A small send queue gathered for one send() (conn_gather). */
	uint8_t coalesce[TCP_COALESCE_MAX];
	/*
	 * What the health hook says (any thread reads them): links and
	 * connections as tcp_check_time last counted them, at each tick.
	 */
	_Atomic uint32_t h_links_up, h_links_other, h_conns_ready, h_conns_wanted, h_sockets;
	_Atomic uint64_t h_fill_waits; /* times a link's data waited for its block to be filled */
};

/* ------------------------------------------------------------------ */
/* Shared helpers (the data path: inline in every piece)              */
/* ------------------------------------------------------------------ */

/* The WIRE_F_* flags of a PUT <-> the byte a frame carries. */
static const struct {
	uint32_t wire;
	uint8_t frame;
} flag_map[] = {
	{ WIRE_F_REPLACE, TCP_FRAME_F_REPLACE }, { WIRE_F_CHUNK, TCP_FRAME_F_CHUNK },
	{ WIRE_F_END, TCP_FRAME_F_END },         { WIRE_F_ABORT, TCP_FRAME_F_ABORT },
	{ WIRE_F_CREDIT, TCP_FRAME_F_CREDIT },   { WIRE_F_WANT, TCP_FRAME_F_WANT },
};

static inline uint8_t frame_flags(uint32_t wire)
{
	uint8_t f = 0;

	if (!(wire & WIRE_F__ALL))
		return 0; /* a plain PUT */

	for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
		if (wire & flag_map[i].wire)
			f |= flag_map[i].frame;
	return f;
}

static inline uint32_t wire_flags(uint8_t frame)
{
	uint32_t w = 0;

	if (!frame)
		return 0; /* a plain PUT */

	for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
		if (frame & flag_map[i].frame)
			w |= flag_map[i].wire;
	return w;
}

static inline void link_unref(struct tcp_link *l)
{
	if (--l->refs == 0)
		free(l);
}

/* Done with it when answered and nothing of ours still reads it. */
static inline void msg_maybe_free(struct tcp_state *st, struct tcp_msg *m)
{
	struct tcp_link *l = m->link;

	if (!m->resulted || m->tx_busy || m->chunks_out)
		return;
	if (m->buf)
		pool_free(m->buf);
	m->buf = NULL;
	if (m->prev)
		m->prev->next = m->next;
	else
		l->msgs = m->next;
	if (m->next)
		m->next->prev = m->prev;
	m->next = m->prev = NULL;
	m->state = MSG_FREE;
	m->link = NULL;
	m->wait_next = st->free_msgs;
	st->free_msgs = m;
	link_unref(l);
}

static inline void msg_result(struct tcp_state *st, struct tcp_msg *m, int res)
{
	if (m->resulted)
		return;
	m->resulted = true;
	if (m->op)
		reactor_put_done(st->engine, m->op, m->op_gen, res);
	m->op = NULL;
	msg_maybe_free(st, m);
}

static inline void ctl_free(struct tcp_state *st, struct tcp_ctl *k)
{
	k->free_next = st->free_ctls;
	st->free_ctls = k;
}

/* A queued item left completely, or its connection died. */
static inline void tx_done(struct tcp_state *st, struct tcp_tx *t)
{
	switch (t->kind) {
	case TX_MSG: {
		struct tcp_msg *m = (struct tcp_msg *)t;

		m->tx_busy = false;
		msg_maybe_free(st, m);
		break;
	}
	case TX_CTL:
		ctl_free(st, (struct tcp_ctl *)t);
		break;
	case TX_CHUNK: {
		struct tcp_chunk *k = (struct tcp_chunk *)t;
		struct tcp_msg *m = k->msg;

		k->busy = false;
		k->msg = NULL;
		m->chunks_out--;
		msg_maybe_free(st, m);
		break;
	}
	}
}

static inline void tx_push(struct tcp_conn *c, struct tcp_tx *t)
{
	t->next = NULL;
	t->sent = 0;
	if (c->txq_tail)
		c->txq_tail->next = t;
	else
		c->txq = t;
	c->txq_tail = t;
}

/* Frames were queued on c: they leave at the end of the round (tcp_round_end). */
static inline void conn_kick(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->flush_queued || c->send_armed || c->dead || c->ended || c->hs != HS_READY)
		return;
	c->flush_queued = true;
	st->flushq[st->nflush++] = c;
}

static inline bool ctl_send(struct tcp_state *st, struct tcp_conn *c, uint8_t type,
			    uint64_t cookie, uint64_t arg)
{
	struct tcp_ctl *k = st->free_ctls;

	if (!k || c->dead || c->ended)
		return false;
	st->free_ctls = k->free_next;
	tcp_frame_pack(k->tx.hdr, type, 0, 0, 0, cookie, arg);
	k->tx.key = NULL;
	k->tx.key_len = 0;
	k->tx.data = NULL;
	k->tx.data_len = 0;
	tx_push(c, &k->tx);
	conn_kick(st, c);
	return true;
}

/* Frames needing an answer need a control frame in reserve. */
static inline bool ctl_available(struct tcp_state *st, unsigned n)
{
	struct tcp_ctl *k = st->free_ctls;

	while (k && n) {
		k = k->free_next;
		n--;
	}
	return n == 0;
}

/* A link that takes new PUTs and connections (not ENDING or DEAD). */
static inline bool link_open(const struct tcp_link *l)
{
	return l->state == LINK_CONNECTING || l->state == LINK_UP;
}

/* The connection that carries offers and control: the first one ready. */
static inline struct tcp_conn *link_primary(struct tcp_link *l)
{
	for (unsigned i = 0; i < l->nconns; i++) {
		struct tcp_conn *c = l->conns[i];

		if (c && !c->dead && !c->ended && c->hs == HS_READY)
			return c;
	}
	return NULL;
}

static inline uint64_t msg_cookie(const struct tcp_msg *m)
{
	return ((uint64_t)m->gen << 32) | m->id;
}

/* Hot connections are read with recv() every round (busy polling). */
static inline void hot_add(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->hot)
		return;
	c->hot = true;
	c->hot_pos = st->nhot;
	st->hot[st->nhot++] = c;
}

static inline void hot_del(struct tcp_state *st, struct tcp_conn *c)
{
	struct tcp_conn *last;

	if (!c->hot)
		return;
	c->hot = false;
	last = st->hot[--st->nhot];
	st->hot[c->hot_pos] = last;
	last->hot_pos = c->hot_pos;
}

static inline void rx_free(struct tcp_state *st, struct tcp_rx *r)
{
	if (r->buf)
		pool_free(r->buf);
	r->buf = NULL;
	r->state = RX_FREE;
	r->orphan = false;
	r->link = NULL;
	r->conn = NULL;
	r->next = st->free_rxs;
	st->free_rxs = r;
}

/* Where the next bytes of c go: the rest of a data chunk, or staging. */
static inline void rx_target(struct tcp_conn *c, void **p, size_t *len)
{
	if (c->direct) {
		*p = (uint8_t *)c->direct->buf->data + c->direct_off;
		*len = c->direct_left > (1u << 30) ? (1u << 30) : c->direct_left;
		return;
	}
	/* Room for the largest frame after what is there. */
	if (c->rx_head && TCP_RX_STAGE - c->rx_tail < TCP_FRAME_BYTES + FERRY_KEY_MAX +
						      TCP_EAGER_MAX) {
		memmove(c->rx, c->rx + c->rx_head, c->rx_tail - c->rx_head);
		c->rx_tail -= c->rx_head;
		c->rx_head = 0;
	}
	*p = c->rx + c->rx_tail;
	*len = TCP_RX_STAGE - c->rx_tail;
	/*
	 * After a chunk received straight into its block, the next frame is
	 * most often the next chunk: read its header alone, so that its data
	 * also goes straight to the block instead of through staging and a
	 * memcpy (which cost the receiver about a third of its copying).
	 */
	if (c->hdr_next && c->rx_tail - c->rx_head < TCP_FRAME_BYTES)
		*len = TCP_FRAME_BYTES - (c->rx_tail - c->rx_head);
}

/* ------------------------------------------------------------------ */
/* What each piece offers the others                                  */
/* ------------------------------------------------------------------ */

/* tcp.c: the ring. */
struct io_uring_sqe *tcp_get_sqe(struct tcp_state *st);
void tcp_arm_end_check(struct tcp_state *st);
int tcp_state_ready(struct tcp_state *st);

/* tcp_link.c: links and connections, their lifetime, faults and liveness. */
struct tcp_link *tcp_link_new(struct tcp_state *st, const char *peer, bool caller);
int tcp_link_for(struct tcp_state *st, struct ferry_peer *peer, struct tcp_link **out);
struct tcp_conn *tcp_conn_new(struct tcp_state *st, int fd, bool caller);
void tcp_conn_free(struct tcp_state *st, struct tcp_conn *c);
void tcp_conn_kill(struct tcp_state *st, struct tcp_conn *c);
void tcp_sweep_dead(struct tcp_state *st);
void tcp_conn_end(struct tcp_state *st, struct tcp_conn *c, int err);
void tcp_link_fail(struct tcp_state *st, struct tcp_link *l, int res, const char *why);
void tcp_reap_links(struct tcp_state *st);
int tcp_check_time(struct tcp_state *st);
/* At each tick: count links and connections for the health hook. */
void tcp_health_count(struct tcp_state *st);

/* tcp_handshake.c: the listener, calls, the handshake. */
void tcp_on_poll(struct tcp_state *st, struct tcp_conn *c, int res);
void tcp_hs_fail(struct tcp_state *st, struct tcp_conn *c, int res, const char *why);
int tcp_caller_start(struct tcp_state *st, struct tcp_link *l, uint16_t index);
unsigned tcp_count_preauth(struct tcp_state *st);
void tcp_arm_listen(struct tcp_state *st);
void tcp_accept_all(struct tcp_state *st);
int tcp_listen_start(struct tcp_state *st);

/* tcp_send.c: PUTs going out, the send queues. */
int tcp_put(struct ferry_engine *e, struct backend *b, struct op *op);
void tcp_msg_send(struct tcp_state *st, struct tcp_link *l, struct tcp_msg *m);
void tcp_tx_consume(struct tcp_state *st, struct tcp_conn *c, uint64_t n);
void tcp_flush_all(struct tcp_state *st, bool hold);

/* tcp_recv.c: frames coming in. */
void tcp_conn_arm_recv(struct tcp_state *st, struct tcp_conn *c);
void tcp_rx_parse(struct tcp_state *st, struct tcp_conn *c);
void tcp_rx_bytes(struct tcp_state *st, struct tcp_conn *c, uint64_t n);
int tcp_retry_wait_mem(struct tcp_state *st);
int tcp_retry_stalled(struct tcp_state *st);
/*
 * Links whose next rendezvous data waits for its block to be filled
 * (fill_wait): sent on when there is more, the link failed when the filling
 * failed (POOL_FILL_FAILED: that PUT must not be delivered). Reactor only.
 */
void tcp_fill_check(struct tcp_state *st);

#endif

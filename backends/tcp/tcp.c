/*
 * backends/tcp/tcp.c - the tcp transport: engines on other hosts (or any
 * engine given an address), over sockets driven by io_uring.
 *
 * Owns: the listener, links (everything between us and one peer engine:
 * one to TCP_MAX_CONNS connections), the authenticated handshake of every
 * connection (security.h), the data path (eager frames, rendezvous),
 * heartbeats and dead-peer detection, and what happens when a peer dies,
 * misbehaves or comes back.
 *
 * The transport has its own io_uring (created on first use), so that its
 * many socket ops neither compete with the reactor's small ring nor depend
 * on its internals: the reactor's ring watches this ring's fd (a multishot
 * poll), so a completion here wakes a sleeping reactor, and progress()
 * reaps it. SQEs are prepared during a round and submitted once at its end
 * (round_end): one io_uring_enter per round, however many PUTs it carried.
 *
 * Busy polling: frames queued during a round leave with one non-blocking
 * send (sendmsg for more than TCP_COALESCE_MAX bytes) per connection from
 * this thread, the application's PUTs right after the round took them
 * (sqs_drained), the rest at the round's end (round_end); the ring's SENDMSG
 * only carries what the socket had no room for. A connection that carries
 * traffic is "hot": read with a non-blocking recv() every round rather than
 * through a RECV on the ring, whose completion needs task work that
 * interrupts the spinning thread. Before the progress thread sleeps,
 * has_work arms a RECV on every hot connection (it goes cold), so a sleeping
 * engine still wakes through the ring. A connection is never read both ways
 * at once. Lone RESULTs wait a moment for the application's next PUT to
 * share their send (flush_all).
 *
 * Data path (tcp_wire.h): a PUT of up to TCP_EAGER_MAX bytes goes eagerly,
 * key and data in one frame (up to TCP_INLINE_MAX bytes of an iovec are
 * copied into the message, not into a pool block); the receiver copies it
 * from its staging buffer into a block of its pool and answers RESULT. A
 * larger PUT sends an offer (RTS); the receiver answers CTS once a block of
 * its pool holds room for it (or RESULT with an error), and only then does
 * the data move, in TCP_CHUNK frames spread over every connection of the
 * link, received straight into that block. A receiver that is slow to
 * consume therefore makes its sender wait with the data in the sender's own
 * pool block (which the PUT held anyway), never buffer more. An eager frame
 * that finds the receiver's pool full is refused (-ENOBUFS) rather than
 * held: holding it would stop the socket that also carries the RESULTs
 * freeing that pool.
 *
 * Ownership: a PUT's block moves from the op to a tcp_msg when the PUT is
 * taken (a small PUT from an iovec has none: its data is copied into the
 * msg). The msg lives until the peer's RESULT came (or the link died) AND
 * no send of ours still reads it; only then is the block freed. A deadline
 * or a cancel completes the op but leaves the msg to finish (the data may
 * still be delivered, as the API says).
 *
 * Trust: nothing is read from a connection before its handshake proved the
 * peer holds the cluster secret. After that, every frame is checked (magic,
 * type, reserved bits, key length and termination, lengths against the
 * limits and against what was offered, offsets against the block, ids and
 * generations of slots); a peer that breaks a rule loses its link, and
 * only it.
 *
 * Liveness: every frame received counts as a sign of life. An idle link is
 * pinged every heartbeat; a link silent for peer_timeout is declared dead.
 * A dead link fails its PUTs (-ECONNRESET), the GETs waiting on that peer,
 * and frees every block it held; the next PUT to the peer connects anew.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(p, n) ((void)(p), (void)(n))
#endif

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
#define TCP_DEFAULT_HEARTBEAT_MS 1000
#define TCP_DEFAULT_PEER_TIMEOUT_MS 10000
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

static uint64_t mk_cookie(unsigned kind, uint32_t slot, uint32_t gen)
{
	return ((uint64_t)gen << 24) | ((uint64_t)slot << 4) | kind;
}

/* ------------------------------------------------------------------ */
/* Types                                                               */
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
	uint64_t link_id;
	uint16_t nconns;       /* connections it should have */
	struct tcp_conn *conns[TCP_MAX_CONNS];
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct tcp_msg *msgs;                   /* every message of the link */
	struct tcp_msg *wait_head, *wait_tail;  /* PUTs before the link was up */
	struct tcp_msg *rdv_head, *rdv_tail;    /* data to send */
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
	uint32_t ndead;        /* dead connections not yet freed */
	/* Connections read with recv() each round instead of an armed RECV. */
	struct tcp_conn *hot[TCP_MAX_SOCKS];
	uint32_t nhot;
	/* Connections with frames queued since the last flush. */
	struct tcp_conn *flushq[TCP_MAX_SOCKS];
	uint32_t nflush;
	/* A small send queue gathered for one send() (conn_gather). */
	uint8_t coalesce[TCP_COALESCE_MAX];
};

static void link_fail(struct tcp_state *st, struct tcp_link *l, int res, const char *why);
static void conn_end(struct tcp_state *st, struct tcp_conn *c, int err);
static void conn_kill(struct tcp_state *st, struct tcp_conn *c);
static void conn_kick(struct tcp_state *st, struct tcp_conn *c);
static void conn_arm_recv(struct tcp_state *st, struct tcp_conn *c);
static void rx_parse(struct tcp_state *st, struct tcp_conn *c);
static void tx_done(struct tcp_state *st, struct tcp_tx *t);
static void rx_free(struct tcp_state *st, struct tcp_rx *r);

/* ------------------------------------------------------------------ */
/* The ring                                                            */
/* ------------------------------------------------------------------ */

static struct io_uring_sqe *get_sqe(struct tcp_state *st)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);

	if (!sqe) {
		io_uring_submit(&st->ring);
		sqe = io_uring_get_sqe(&st->ring);
	}
	if (sqe)
		st->inflight++;
	else
		log_error("tcp: engine %s: io_uring full", st->engine->name);
	return sqe;
}

/* Watch our ring's fd from the reactor's ring: our completions wake it. */
static void arm_ringfd(struct tcp_state *st)
{
	struct ferry_engine *e = st->engine;
	struct io_uring_sqe *sqe;

	if (st->ringfd_armed)
		return;
	sqe = io_uring_get_sqe(&e->ring);
	if (!sqe) {
		io_uring_submit(&e->ring);
		sqe = io_uring_get_sqe(&e->ring);
	}
	if (!sqe) {
		log_error("tcp: engine %s: the reactor's io_uring is full", e->name);
		return;
	}
	io_uring_prep_poll_multishot(sqe, st->ring.ring_fd, POLLIN);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, K_RINGFD));
	st->ringfd_armed = true;
	io_uring_submit(&e->ring);
}

static void arm_tick(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;
	uint64_t ns = st->heartbeat_ns / 2;

	if (st->tick_armed)
		return;
	if (st->wait_mem_head || st->stalled)
		ns = 1000000; /* look for pool room / control frames each ms */
	if (ns > 250000000)
		ns = 250000000;
	sqe = get_sqe(st);
	if (!sqe)
		return;
	st->tick_ts.tv_sec = (long long)(ns / 1000000000);
	st->tick_ts.tv_nsec = (long long)(ns % 1000000000);
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_TICK, 0, 0));
	st->tick_armed = true;
}

/* A link is ENDING: check_time looks at it again when its grace may be over. */
static void arm_end_check(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;

	if (st->end_armed)
		return;
	sqe = get_sqe(st);
	if (!sqe)
		return; /* the next tick does it */
	st->end_ts.tv_sec = 0;
	st->end_ts.tv_nsec = (long long)(TCP_END_GRACE_NS / 4);
	io_uring_prep_timeout(sqe, &st->end_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_END, 0, 0));
	st->end_armed = true;
}

static void tables_free(struct tcp_state *st)
{
	free(st->msgs);
	free(st->rxs);
	free(st->ctls);
	st->msgs = NULL;
	st->rxs = NULL;
	st->ctls = NULL;
	st->free_msgs = NULL;
	st->free_rxs = NULL;
	st->free_ctls = NULL;
}

/* Tables and ring are made on first use: an engine without tcp pays nothing. */
static int state_ready(struct tcp_state *st)
{
	struct ferry_engine *e = st->engine;
	int rc;

	if (st->ready)
		return 0;
	st->nmsgs = 2 * e->max_ops;
	st->nrxs = e->max_ops;
	st->nctls = 4 * e->max_ops;
	st->msgs = calloc(st->nmsgs, sizeof(*st->msgs));
	st->rxs = calloc(st->nrxs, sizeof(*st->rxs));
	st->ctls = calloc(st->nctls, sizeof(*st->ctls));
	if (!st->msgs || !st->rxs || !st->ctls) {
		tables_free(st);
		return -ENOMEM;
	}
	for (uint32_t i = st->nmsgs; i-- > 0;) {
		st->msgs[i].id = i;
		st->msgs[i].tx.kind = TX_MSG;
		st->msgs[i].wait_next = st->free_msgs;
		st->free_msgs = &st->msgs[i];
	}
	for (uint32_t i = st->nrxs; i-- > 0;) {
		st->rxs[i].id = i;
		st->rxs[i].next = st->free_rxs;
		st->free_rxs = &st->rxs[i];
	}
	for (uint32_t i = st->nctls; i-- > 0;) {
		st->ctls[i].tx.kind = TX_CTL;
		st->ctls[i].free_next = st->free_ctls;
		st->free_ctls = &st->ctls[i];
	}
	rc = io_uring_queue_init(TCP_RING_ENTRIES, &st->ring, 0);
	if (rc < 0) {
		log_error("tcp: engine %s: io_uring_queue_init: %s", e->name, ferry_strerror(rc));
		tables_free(st);
		return rc;
	}
	st->ready = true;
	arm_ringfd(st);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Links and connections: lifetime                                     */
/* ------------------------------------------------------------------ */

static void link_unref(struct tcp_link *l)
{
	if (--l->refs == 0)
		free(l);
}

static struct tcp_link *link_new(struct tcp_state *st, const char *peer, bool caller)
{
	struct tcp_link *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->refs = 1; /* the table's */
	l->state = LINK_CONNECTING;
	l->caller = caller;
	snprintf(l->peer_name, sizeof(l->peer_name), "%s", peer);
	l->last_rx_ns = reactor_now(st->engine);
	l->last_ping_ns = l->last_rx_ns;
	l->next = st->links;
	st->links = l;
	return l;
}

static struct tcp_conn *conn_new(struct tcp_state *st, int fd, bool caller)
{
	struct tcp_conn *c;
	uint32_t slot;

	for (slot = 0; slot < TCP_MAX_SOCKS && st->conns[slot]; slot++)
		;
	if (slot == TCP_MAX_SOCKS) {
		log_error("tcp: engine %s: more than %u connections", st->engine->name,
			  TCP_MAX_SOCKS);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->rx = malloc(TCP_RX_STAGE);
	if (!c->rx) {
		free(c);
		return NULL;
	}
	c->st = st;
	c->slot = slot;
	c->gen = ++st->next_gen & 0xffffffffu;
	c->fd = fd;
	c->caller = caller;
	c->hs_deadline = reactor_now(st->engine) + st->engine->handshake_ns;
	for (unsigned i = 0; i < TCP_CHUNKS_PER_CONN; i++)
		c->chunks[i].tx.kind = TX_CHUNK;
	st->conns[slot] = c;
	st->nconns++;
	return c;
}

static unsigned count_preauth(struct tcp_state *st);

static void conn_free(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->dead)
		st->ndead--;
	/* A block kept for the recv that wrote into it. */
	if (c->direct && c->direct->orphan)
		rx_free(st, c->direct);
	st->conns[c->slot] = NULL;
	st->nconns--;
	if (c->fd >= 0)
		close(c->fd);
	if (!c->caller && c->hs != HS_READY)
		count_preauth(st);
	free(c->rx);
	free(c);
}

/*
 * A dead connection goes once no op of the ring still uses it. Called only
 * from sweep_dead, at the end of a round: whoever killed it may still be
 * using it further up the stack.
 */
static void conn_maybe_free(struct tcp_state *st, struct tcp_conn *c)
{
	if (!c->dead || c->poll_armed || c->recv_armed || c->send_armed)
		return;
	conn_free(st, c);
}

static void arm_poll(struct tcp_state *st, struct tcp_conn *c, unsigned events)
{
	struct io_uring_sqe *sqe;

	if (c->poll_armed)
		return;
	sqe = get_sqe(st);
	if (!sqe) {
		conn_kill(st, c);
		return;
	}
	io_uring_prep_poll_add(sqe, c->fd, events);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_POLL, c->slot, c->gen));
	c->poll_armed = true;
}

/* Hot connections are read with recv() every round (busy polling). */
static void hot_add(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->hot)
		return;
	c->hot = true;
	c->hot_pos = st->nhot;
	st->hot[st->nhot++] = c;
}

static void hot_del(struct tcp_state *st, struct tcp_conn *c)
{
	struct tcp_conn *last;

	if (!c->hot)
		return;
	c->hot = false;
	last = st->hot[--st->nhot];
	st->hot[c->hot_pos] = last;
	last->hot_pos = c->hot_pos;
}

static void flushq_del(struct tcp_state *st, struct tcp_conn *c)
{
	if (!c->flush_queued)
		return;
	c->flush_queued = false;
	c->flush_held = false;
	for (uint32_t i = 0; i < st->nflush; i++)
		if (st->flushq[i] == c) {
			st->flushq[i] = st->flushq[--st->nflush];
			break;
		}
}

/*
 * Stop a connection: what it had queued is dropped (the link's failure
 * answers the PUTs), the socket is shut so in-flight ops end, and the
 * connection is freed when their completions came.
 */
static void conn_kill(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->dead)
		return;
	c->dead = true;
	st->ndead++;
	hot_del(st, c);
	flushq_del(st, c);
	/* A block no recv writes into is the link's to free (link_fail). */
	if (!c->recv_armed)
		c->direct = NULL;
	shutdown(c->fd, SHUT_RDWR);
	while (c->txq) {
		struct tcp_tx *t = c->txq;

		c->txq = t->next;
		tx_done(st, t);
	}
	c->txq_tail = NULL;
	if (c->rx_stalled) {
		struct tcp_conn **pp = &st->stalled;

		while (*pp && *pp != c)
			pp = &(*pp)->next_stalled;
		if (*pp)
			*pp = c->next_stalled;
		c->rx_stalled = false;
	}
	if (c->link) {
		for (unsigned i = 0; i < TCP_MAX_CONNS; i++)
			if (c->link->conns[i] == c)
				c->link->conns[i] = NULL;
		c->link = NULL;
	}
	if (c->poll_armed || c->recv_armed || c->send_armed) {
		struct io_uring_sqe *sqe = get_sqe(st);

		if (sqe) {
			io_uring_prep_cancel_fd(sqe, c->fd, IORING_ASYNC_CANCEL_ALL);
			io_uring_sqe_set_data64(sqe, 0);
		}
	}
}

static void sweep_dead(struct tcp_state *st)
{
	for (uint32_t i = 0; i < TCP_MAX_SOCKS && st->ndead; i++)
		if (st->conns[i] && st->conns[i]->dead)
			conn_maybe_free(st, st->conns[i]);
}

/* ------------------------------------------------------------------ */
/* Messages (PUTs going out)                                           */
/* ------------------------------------------------------------------ */

static uint64_t msg_cookie(const struct tcp_msg *m)
{
	return ((uint64_t)m->gen << 32) | m->id;
}

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

/* Done with it when answered and nothing of ours still reads it. */
static void msg_maybe_free(struct tcp_state *st, struct tcp_msg *m)
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

static void msg_result(struct tcp_state *st, struct tcp_msg *m, int res)
{
	if (m->resulted)
		return;
	m->resulted = true;
	if (m->op)
		reactor_put_done(st->engine, m->op, m->op_gen, res);
	m->op = NULL;
	msg_maybe_free(st, m);
}

static void tx_push(struct tcp_conn *c, struct tcp_tx *t)
{
	t->next = NULL;
	t->sent = 0;
	if (c->txq_tail)
		c->txq_tail->next = t;
	else
		c->txq = t;
	c->txq_tail = t;
}

/* The connection that carries offers and control: the first one ready. */
static struct tcp_conn *link_primary(struct tcp_link *l)
{
	for (unsigned i = 0; i < l->nconns; i++) {
		struct tcp_conn *c = l->conns[i];

		if (c && !c->dead && !c->ended && c->hs == HS_READY)
			return c;
	}
	return NULL;
}

/* A link that takes new PUTs and connections (not ENDING or DEAD). */
static bool link_open(const struct tcp_link *l)
{
	return l->state == LINK_CONNECTING || l->state == LINK_UP;
}

static void msg_send(struct tcp_state *st, struct tcp_link *l, struct tcp_msg *m)
{
	struct tcp_conn *c = link_primary(l);

	if (!c) {
		link_fail(st, l, -ECONNRESET, "no connection left");
		return;
	}
	m->tx_busy = true;
	tx_push(c, &m->tx);
	conn_kick(st, c);
}

/* ------------------------------------------------------------------ */
/* Control frames                                                      */
/* ------------------------------------------------------------------ */

static bool ctl_send(struct tcp_state *st, struct tcp_conn *c, uint8_t type, uint64_t cookie,
		     uint64_t arg)
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

static void ctl_free(struct tcp_state *st, struct tcp_ctl *k)
{
	k->free_next = st->free_ctls;
	st->free_ctls = k;
}

/* Frames needing an answer need a control frame in reserve. */
static bool ctl_available(struct tcp_state *st, unsigned n)
{
	struct tcp_ctl *k = st->free_ctls;

	while (k && n) {
		k = k->free_next;
		n--;
	}
	return n == 0;
}

/* ------------------------------------------------------------------ */
/* Sending                                                             */
/* ------------------------------------------------------------------ */

/* Give the connection's free chunk slots the next pieces of rendezvous data. */
static void conn_take_chunks(struct tcp_link *l, struct tcp_conn *c)
{
	for (unsigned i = 0; i < TCP_CHUNKS_PER_CONN && l->rdv_head; i++) {
		struct tcp_chunk *k = &c->chunks[i];
		struct tcp_msg *m = l->rdv_head;
		uint64_t n;

		if (k->busy)
			continue;
		n = m->len - m->next_off;
		if (n > TCP_CHUNK)
			n = TCP_CHUNK;
		tcp_frame_pack(k->tx.hdr, TCP_F_DATA, 0, 0, (uint32_t)n, m->rx_slot, m->next_off);
		k->tx.key = NULL;
		k->tx.key_len = 0;
		k->tx.data = (const uint8_t *)m->buf->data + m->next_off;
		k->tx.data_len = n;
		k->msg = m;
		k->busy = true;
		m->next_off += n;
		m->chunks_out++;
		if (m->next_off == m->len) {
			l->rdv_head = m->wait_next;
			if (!l->rdv_head)
				l->rdv_tail = NULL;
			m->wait_next = NULL;
		}
		tx_push(c, &k->tx);
	}
}

static uint64_t tx_total(const struct tcp_tx *t)
{
	return TCP_FRAME_BYTES + t->key_len + t->data_len;
}

/* A queued item left completely, or its connection died. */
static void tx_done(struct tcp_state *st, struct tcp_tx *t)
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

/* Frames were queued on c: they leave at the end of the round (tcp_round_end). */
static void conn_kick(struct tcp_state *st, struct tcp_conn *c)
{
	if (c->flush_queued || c->send_armed || c->dead || c->ended || c->hs != HS_READY)
		return;
	c->flush_queued = true;
	st->flushq[st->nflush++] = c;
}

/* The pieces of t not sent yet (of its header, key, data): how many, into p / len. */
static unsigned tx_unsent(const struct tcp_tx *t, const uint8_t *p[3], uint64_t len[3])
{
	const uint8_t *part[3] = { t->hdr, t->key, t->data };
	uint64_t plen[3] = { TCP_FRAME_BYTES, t->key_len, t->data_len };
	uint64_t skip = t->sent;
	unsigned k = 0;

	for (unsigned i = 0; i < 3; i++) {
		if (skip >= plen[i]) {
			skip -= plen[i];
			continue;
		}
		p[k] = part[i] + skip;
		len[k++] = plen[i] - skip;
		skip = 0;
	}
	return k;
}

/* The iovecs of what is queued (up to TCP_IOV_MAX); returns how many. */
static unsigned conn_iov(struct tcp_conn *c)
{
	unsigned n = 0;

	if (c->link && c->link->rdv_head)
		conn_take_chunks(c->link, c);
	for (struct tcp_tx *t = c->txq; t && n + 3 <= TCP_IOV_MAX; t = t->next) {
		const uint8_t *p[3];
		uint64_t len[3];
		unsigned k = tx_unsent(t, p, len);

		for (unsigned i = 0; i < k; i++, n++) {
			c->iov[n].iov_base = (void *)p[i];
			c->iov[n].iov_len = len[i];
		}
	}
	memset(&c->mh, 0, sizeof(c->mh));
	c->mh.msg_iov = c->iov;
	c->mh.msg_iovlen = n;
	return n;
}

/* n bytes of the send queue left: the items sent whole are done. */
static void tx_consume(struct tcp_state *st, struct tcp_conn *c, uint64_t n)
{
	while (n && c->txq) {
		struct tcp_tx *t = c->txq;
		uint64_t rest = tx_total(t) - t->sent;

		if (n < rest) {
			t->sent += n;
			break;
		}
		n -= rest;
		c->txq = t->next;
		if (!c->txq)
			c->txq_tail = NULL;
		tx_done(st, t);
	}
}

/*
 * A queue of at most TCP_COALESCE_MAX bytes (and no rendezvous data waiting
 * for a chunk slot) gathered straight into st->coalesce, for one send():
 * cheaper in the kernel than sendmsg's iovec import, and no iovecs to
 * build. Returns its length; 0 when it is empty or larger (conn_iov and
 * sendmsg then).
 */
static size_t conn_gather(struct tcp_state *st, struct tcp_conn *c)
{
	size_t total = 0;
	uint8_t *p = st->coalesce;

	if (c->link && c->link->rdv_head)
		return 0;
	for (const struct tcp_tx *t = c->txq; t; t = t->next) {
		total += tx_total(t) - t->sent;
		if (total > TCP_COALESCE_MAX)
			return 0;
	}
	for (const struct tcp_tx *t = c->txq; t; t = t->next) {
		const uint8_t *part[3];
		uint64_t len[3];
		unsigned k = tx_unsent(t, part, len);

		for (unsigned i = 0; i < k; i++) {
			ferry__payload_copy(p, part[i], len[i]);
			p += len[i];
		}
	}
	return total;
}

/*
 * Send what is queued: first straight from this thread (a non-blocking
 * send of the gathered queue, or a sendmsg, which on an idle connection
 * takes everything: no SQE, no completion to wait for), then, for what the
 * socket had no room for, a SENDMSG on the ring, which waits for room in
 * the kernel.
 */
static void conn_flush(struct tcp_state *st, struct tcp_conn *c)
{
	struct io_uring_sqe *sqe;
	size_t small;
	ssize_t n;

	for (int tries = 0; tries < 4; tries++) {
		if (c->send_armed || c->dead || c->ended || c->hs != HS_READY)
			return;
		if ((small = conn_gather(st, c))) {
			n = send(c->fd, st->coalesce, small, MSG_NOSIGNAL | MSG_DONTWAIT);
		} else {
			if (!conn_iov(c))
				return;
			n = sendmsg(c->fd, &c->mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			conn_end(st, c, errno);
			return;
		}
		tx_consume(st, c, (uint64_t)n);
		if (!c->txq && !(c->link && c->link->rdv_head))
			return; /* all of it left (the common case): no other look */
	}
	if (c->send_armed || c->dead || !conn_iov(c))
		return;
	sqe = get_sqe(st);
	if (!sqe) {
		if (c->link)
			link_fail(st, c->link, -ECONNRESET, "io_uring full");
		return;
	}
	io_uring_prep_sendmsg(sqe, c->fd, &c->mh, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_SEND, c->slot, c->gen));
	c->send_armed = true;
}

/*
 * A PUT joined held RESULTs: it goes first, so that the peer meets the
 * frame that completes its GET (and makes it react) before the RESULTs
 * that complete its PUTs. Answers may come in any order; PUTs and data
 * keep theirs.
 */
static void results_last(struct tcp_conn *c)
{
	struct tcp_tx *head = c->txq, *last = NULL;

	while (c->txq && c->txq->kind == TX_CTL && c->txq->hdr[4] == TCP_F_RESULT &&
	       !c->txq->sent) {
		last = c->txq;
		c->txq = c->txq->next;
	}
	if (!last)
		return;
	if (!c->txq) {
		c->txq = head; /* nothing else after all */
		return;
	}
	last->next = NULL;
	c->txq_tail->next = head;
	c->txq_tail = last;
}

/* Nothing but RESULTs queued on c? */
static bool only_results(const struct tcp_conn *c)
{
	for (const struct tcp_tx *t = c->txq; t; t = t->next)
		if (t->kind != TX_CTL || t->hdr[4] != TCP_F_RESULT)
			return false;
	return true;
}

/*
 * Send what the round queued. A connection with nothing but RESULTs queued
 * may keep them up to result_hold_ns (unless hold is false): the PUT they
 * answer often completed a GET, and the application's reaction (its next
 * PUT, often to the same peer) then leaves in the same sendmsg: one send and
 * one receive on the critical path instead of two each. A hold that caught
 * nothing (a one-way stream) makes the connection skip the next 2^n - 1
 * holds (n vain holds in a row, up to 6), so streams pay for one in 64 at
 * most. Held frames keep has_work true: nobody sleeps on them.
 */
static void flush_all(struct tcp_state *st, bool hold)
{
	uint64_t now = hold ? reactor_now(st->engine) : 0;
	uint32_t kept = 0;

	while (st->nflush > kept) {
		struct tcp_conn *c = st->flushq[--st->nflush];

		if (hold && only_results(c)) {
			if (!c->flush_held && c->hold_skip) {
				c->hold_skip--;
			} else if (!c->flush_held || now - c->held_ns < st->result_hold_ns) {
				if (!c->flush_held)
					c->held_ns = now;
				c->flush_held = true;
				st->flushq[st->nflush] = st->flushq[kept];
				st->flushq[kept++] = c;
				st->nflush++;
				continue;
			} else {
				/* Nothing came to go with them: a one-way stream. */
				if (c->hold_vain < 6)
					c->hold_vain++;
				c->hold_skip = (1u << c->hold_vain) - 1;
			}
		}
		if (c->flush_held && !only_results(c)) {
			c->hold_vain = 0;
			results_last(c);
		}
		c->flush_queued = false;
		c->flush_held = false;
		conn_flush(st, c);
	}
}

static void on_send(struct tcp_state *st, struct tcp_conn *c, int res)
{
	c->send_armed = false;
	if (c->dead)
		return;
	if (res <= 0) {
		if (res == -EINTR || res == -EAGAIN) {
			conn_kick(st, c);
			return;
		}
		conn_end(st, c, res ? -res : EPIPE);
		return;
	}
	tx_consume(st, c, (uint64_t)res);
	conn_kick(st, c);
}

/* ------------------------------------------------------------------ */
/* Receiving                                                           */
/* ------------------------------------------------------------------ */

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

static void rx_free(struct tcp_state *st, struct tcp_rx *r)
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

/* The WIRE_F_* flags of a PUT <-> the byte a frame carries. */
static const struct {
	uint32_t wire;
	uint8_t frame;
} flag_map[] = {
	{ WIRE_F_REPLACE, TCP_FRAME_F_REPLACE }, { WIRE_F_CHUNK, TCP_FRAME_F_CHUNK },
	{ WIRE_F_END, TCP_FRAME_F_END },         { WIRE_F_ABORT, TCP_FRAME_F_ABORT },
	{ WIRE_F_CREDIT, TCP_FRAME_F_CREDIT },   { WIRE_F_WANT, TCP_FRAME_F_WANT },
};

static uint8_t frame_flags(uint32_t wire)
{
	uint8_t f = 0;

	if (!(wire & WIRE_F__ALL))
		return 0; /* a plain PUT */

	for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
		if (wire & flag_map[i].wire)
			f |= flag_map[i].frame;
	return f;
}

static uint32_t wire_flags(uint8_t frame)
{
	uint32_t w = 0;

	if (!frame)
		return 0; /* a plain PUT */

	for (size_t i = 0; i < sizeof(flag_map) / sizeof(flag_map[0]); i++)
		if (frame & flag_map[i].frame)
			w |= flag_map[i].wire;
	return w;
}

/* Hand arrived data to the key table; returns the PUT's result. */
static int deliver(struct tcp_state *st, struct tcp_link *l, const char *key, uint16_t key_len,
		   struct ferry_buf *buf, uint64_t len, uint32_t flags)
{
	struct ferry_engine *e = st->engine;
	char fullkey[FULLKEY_MAX];
	int n, rc;

	n = keytable_compose(fullkey, key, key_len, l->peer_name, e->name);
	rc = n < 0 ? n : reactor_deliver(e, NULL, fullkey, (size_t)n, buf, len,
					 wire_flags((uint8_t)flags));
	if (rc)
		pool_free(buf);
	return rc;
}

static bool key_ok(const uint8_t *key, uint16_t key_len)
{
	if (key_len == 0 || key_len >= FERRY_KEY_MAX)
		return false;
	return memchr(key, '\0', key_len) == NULL;
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
static int retry_wait_mem(struct tcp_state *st)
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

/*
 * Take one frame from the staging buffer. Returns 1 if taken, 0 if more
 * bytes (or a resource) are needed first, -1 if the peer broke a rule (its
 * link is failed).
 */
static int take_frame(struct tcp_state *st, struct tcp_conn *c)
{
	struct tcp_link *l = c->link;
	uint32_t avail = c->rx_tail - c->rx_head;
	const uint8_t *p = c->rx + c->rx_head;
	struct tcp_frame f;
	const char *why;

	if (avail < TCP_FRAME_BYTES)
		return 0;
	tcp_frame_unpack(p, &f);
	if (f.magic != TCP_FRAME_MAGIC || f.type == 0 || f.type >= TCP_F__MAX || f.resv ||
	    (f.flags & ~TCP_FRAME_F__ALL)) {
		why = "bad frame header";
		goto bad;
	}
	switch (f.type) {
	case TCP_F_PUT: {
		const uint8_t *key = p + TCP_FRAME_BYTES;
		struct ferry_buf *buf;
		int rc;

		if (f.key_len == 0 || f.key_len >= FERRY_KEY_MAX || f.arg > TCP_EAGER_MAX ||
		    f.len != f.key_len + f.arg) {
			why = "bad eager frame lengths";
			goto bad;
		}
		if (avail < TCP_FRAME_BYTES + f.len)
			return 0;
		if (!key_ok(key, f.key_len)) {
			why = "bad key";
			goto bad;
		}
		if (!ctl_available(st, 1)) {
			conn_stall(st, c);
			return 0;
		}
		rc = pool_alloc(st->engine->pool, f.arg, &buf);
		if (rc == 0) {
			ferry__payload_copy(buf->data, key + f.key_len, f.arg);
			rc = deliver(st, l, (const char *)key, f.key_len, buf, f.arg, f.flags);
		} else {
			log_limited(FERRY__LOG_WARN, "tcp: engine %s: pool full, refusing an "
				    "eager PUT of %llu bytes from %s", st->engine->name,
				    (unsigned long long)f.arg, l->peer_name);
			rc = -ENOBUFS;
		}
		ctl_send(st, c, TCP_F_RESULT, f.cookie, (uint64_t)(int64_t)rc);
		c->rx_head += TCP_FRAME_BYTES + f.len;
		return 1;
	}
	case TCP_F_RTS: {
		const uint8_t *key = p + TCP_FRAME_BYTES;
		struct tcp_rx *r;

		if (f.key_len == 0 || f.key_len >= FERRY_KEY_MAX || f.len != f.key_len ||
		    f.arg == 0) {
			why = "bad offer lengths";
			goto bad;
		}
		if (avail < TCP_FRAME_BYTES + f.len)
			return 0;
		if (!key_ok(key, f.key_len)) {
			why = "bad key";
			goto bad;
		}
		/* One frame for CTS, one kept for the RESULT. */
		if (!ctl_available(st, 2)) {
			conn_stall(st, c);
			return 0;
		}
		c->rx_head += TCP_FRAME_BYTES + f.len;
		if (f.arg > pool_size(st->engine->pool)) {
			log_info("tcp: engine %s: %s offers %llu bytes, more than the pool",
				 st->engine->name, l->peer_name, (unsigned long long)f.arg);
			ctl_send(st, c, TCP_F_RESULT, f.cookie, (uint64_t)(int64_t)-EMSGSIZE);
			return 1;
		}
		r = st->free_rxs;
		if (!r) {
			log_limited(FERRY__LOG_WARN, "tcp: engine %s: %u offers pending, refusing "
				    "one from %s", st->engine->name, st->nrxs, l->peer_name);
			ctl_send(st, c, TCP_F_RESULT, f.cookie, (uint64_t)(int64_t)-ENOBUFS);
			return 1;
		}
		st->free_rxs = r->next;
		r->next = NULL;
		r->link = l;
		r->conn = c;
		r->len = f.arg;
		r->got = 0;
		r->cookie = f.cookie;
		r->flags = f.flags;
		r->key_len = f.key_len;
		memcpy(r->key, key, f.key_len);
		r->key[f.key_len] = '\0';
		if (st->wait_mem_head || !rx_try_mem(st, r))
			wait_mem_push(st, r);
		return 1;
	}
	case TCP_F_CTS: {
		struct tcp_msg *m;

		if (f.len || f.key_len) {
			why = "bad CTS";
			goto bad;
		}
		c->rx_head += TCP_FRAME_BYTES;
		m = msg_find(st, l, f.cookie);
		if (!m || !m->rendezvous || m->cts) {
			why = "CTS for no offer";
			goto bad;
		}
		m->cts = true;
		if (m->resulted)
			return 1;
		m->rx_slot = f.arg;
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
	case TCP_F_DATA: {
		struct tcp_rx *r;
		uint64_t have, n;

		if (f.key_len || f.len == 0) {
			why = "bad DATA lengths";
			goto bad;
		}
		r = rx_find(st, l, f.cookie);
		if (!r || f.arg > r->len || f.len > r->len - f.arg || f.len > r->len - r->got) {
			why = "DATA outside its offer";
			goto bad;
		}
		c->rx_head += TCP_FRAME_BYTES;
		have = c->rx_tail - c->rx_head;
		n = have < f.len ? have : f.len;
		ferry__payload_copy((uint8_t *)r->buf->data + f.arg, c->rx + c->rx_head, n);
		c->rx_head += (uint32_t)n;
		r->got += n;
		if (n < f.len) {
			/* The rest goes straight into the block. */
			c->direct = r;
			c->direct_off = f.arg + n;
			c->direct_left = f.len - n;
			return 1;
		}
		if (r->got == r->len)
			rx_complete(st, r);
		return 1;
	}
	case TCP_F_RESULT: {
		struct tcp_msg *m;
		int64_t res = (int64_t)f.arg;

		if (f.len || f.key_len || res > 0 || res < -4095) {
			why = "bad RESULT";
			goto bad;
		}
		c->rx_head += TCP_FRAME_BYTES;
		m = msg_find(st, l, f.cookie);
		if (!m || m->resulted) {
			why = "RESULT for no PUT";
			goto bad;
		}
		if (m->rendezvous && res == 0 && (!m->cts || m->next_off < m->len)) {
			why = "RESULT before the data was sent";
			goto bad;
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
	case TCP_F_PING:
		if (f.len || f.key_len) {
			why = "bad PING";
			goto bad;
		}
		if (!ctl_available(st, 1)) {
			conn_stall(st, c);
			return 0;
		}
		c->rx_head += TCP_FRAME_BYTES;
		ctl_send(st, c, TCP_F_PONG, f.cookie, 0);
		return 1;
	case TCP_F_PONG:
		if (f.len || f.key_len) {
			why = "bad PONG";
			goto bad;
		}
		c->rx_head += TCP_FRAME_BYTES;
		return 1;
	default:
		why = "unknown frame";
		break;
	}
bad:
	log_warn("tcp: engine %s: disconnecting %s: %s (type %u, len %u)", st->engine->name,
		 l->peer_name, why, f.type, f.len);
	link_fail(st, l, -ECONNRESET, NULL);
	return -1;
}

/* Where the next bytes of c go: the rest of a data chunk, or staging. */
static void rx_target(struct tcp_conn *c, void **p, size_t *len)
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

static void conn_arm_recv(struct tcp_state *st, struct tcp_conn *c)
{
	struct io_uring_sqe *sqe;
	size_t len;
	void *p;

	if (c->recv_armed || c->hot || c->dead || c->ended || c->rx_stalled)
		return;
	sqe = get_sqe(st);
	if (!sqe) {
		link_fail(st, c->link, -ECONNRESET, "io_uring full");
		return;
	}
	rx_target(c, &p, &len);
	io_uring_prep_recv(sqe, c->fd, p, len, c->direct ? MSG_WAITALL : 0);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_RECV, c->slot, c->gen));
	c->recv_armed = true;
}

static void rx_parse(struct tcp_state *st, struct tcp_conn *c)
{
	while (!c->dead && !c->direct && !c->rx_stalled && take_frame(st, c) > 0)
		;
	if (c->dead)
		return;
	if (c->rx_head == c->rx_tail)
		c->rx_head = c->rx_tail = 0;
	conn_arm_recv(st, c); /* a hot connection is read by the next round instead */
}

/* n bytes came into rx_target's place. */
static void rx_bytes(struct tcp_state *st, struct tcp_conn *c, uint64_t n)
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
			conn_arm_recv(st, c);
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
	rx_parse(st, c);
}

static void on_recv(struct tcp_state *st, struct tcp_conn *c, int res)
{
	c->recv_armed = false;
	if (c->dead)
		return;
	if (res <= 0) {
		if (res == -EINTR || res == -EAGAIN) {
			conn_arm_recv(st, c);
			return;
		}
		conn_end(st, c, -res);
		return;
	}
	/* The kernel wrote these bytes; valgrind cannot see io_uring do it. */
	if (c->direct)
		VALGRIND_MAKE_MEM_DEFINED((uint8_t *)c->direct->buf->data + c->direct_off, res);
	else
		VALGRIND_MAKE_MEM_DEFINED(c->rx + c->rx_tail, res);
	/*
	 * Traffic: read it directly from now on, until it goes quiet or we
	 * sleep. At most TCP_MAX_HOT at a time: a round reads every hot
	 * connection, the others cost nothing while they wait on the ring.
	 */
	if (st->nhot < TCP_MAX_HOT)
		hot_add(st, c);
	rx_bytes(st, c, (uint64_t)res);
}

/*
 * Busy polling: read a hot connection with a non-blocking recv() in this
 * thread, which sees bytes as soon as the peer's send put them in the
 * socket, instead of waiting for io_uring to turn the socket's readiness
 * into a completion (task work, delivered by interrupting this thread).
 * Returns 2 if the bytes filled the buffer (more may wait), 1 if fewer
 * came (or the end), 0 if none were there.
 */
static int conn_read(struct tcp_state *st, struct tcp_conn *c)
{
	size_t len;
	ssize_t n;
	void *p;

	if (c->recv_armed || c->dead || c->ended || c->rx_stalled || c->hs != HS_READY)
		return 0;
	rx_target(c, &p, &len);
	n = recv(c->fd, p, len, MSG_DONTWAIT);
	if (n > 0) {
		rx_bytes(st, c, (uint64_t)n);
		return (size_t)n == len ? 2 : 1;
	}
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return 0;
	conn_end(st, c, n ? errno : 0);
	return 1;
}

/* A connection quiet for TCP_HOT_NS, with nothing expected, goes back to io_uring. */
static void conn_cool(struct tcp_state *st, struct tcp_conn *c)
{
	hot_del(st, c);
	conn_arm_recv(st, c);
}

/* One round of direct reads; returns how many brought bytes. */
static int read_hot(struct tcp_state *st)
{
	uint64_t now = reactor_now(st->engine);
	int n = 0;

	for (uint32_t i = 0; i < st->nhot;) {
		struct tcp_conn *c = st->hot[i];
		int got = 0, reads = 0, rc;

		/* A read that did not fill its buffer drained the socket. */
		do {
			rc = conn_read(st, c);
			got |= rc > 0;
		} while (rc == 2 && ++reads < TCP_READS_PER_ROUND && c->hot);
		if (!got && c->hot && !c->dead && !c->rx_stalled && !c->direct &&
		    now - c->last_rx_ns > TCP_HOT_NS &&
		    !(c->link && c->link->msgs && link_primary(c->link) == c))
			conn_cool(st, c);
		n += got;
		if (i < st->nhot && st->hot[i] == c)
			i++;
	}
	return n;
}

/* The progress thread is about to sleep: every connection reads through io_uring. */
static void cool_all(struct tcp_state *st)
{
	while (st->nhot)
		conn_cool(st, st->hot[st->nhot - 1]);
}

/* Connections that waited for control frames try again. */
static int retry_stalled(struct tcp_state *st)
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
		rx_parse(st, c);
		n++;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

static bool other_live_link(struct tcp_state *st, struct tcp_link *l)
{
	for (struct tcp_link *o = st->links; o; o = o->next)
		if (o != l && o->state != LINK_DEAD && strcmp(o->peer_name, l->peer_name) == 0)
			return true;
	return false;
}

/*
 * c ended: the peer closed it (err 0: the end of its stream) or it broke
 * (err: the receive's or the send's errno). A peer engine that leaves ends
 * every connection of its link, and we see those ends in no particular
 * order, while another connection may still hold frames sent before them:
 * the RESULTs of our last PUTs ride connection 0, and busy polling reads
 * it after the ring's completions, which bring the others' ends. So the
 * first end makes the link ENDING, not dead: it takes no new PUTs (the next
 * one calls anew), sends nothing more on ended connections, and keeps
 * reading the others; it fails once every ready connection ended, or
 * TCP_END_GRACE_NS after its first end (check_time) if the peer keeps
 * some open. What was queued on an ended connection then fails with the
 * link, as before.
 */
static void conn_end(struct tcp_state *st, struct tcp_conn *c, int err)
{
	struct tcp_link *l = c->link;

	if (c->dead || c->ended)
		return;
	if (err)
		log_warn("tcp: engine %s: connection %u to %s: %s", st->engine->name, c->index,
			 l ? l->peer_name : "?", strerror(err));
	else
		log_info("tcp: engine %s: %s closed connection %u", st->engine->name,
			 l ? l->peer_name : "?", c->index);
	if (!l || (l->state != LINK_UP && l->state != LINK_ENDING)) {
		if (l)
			link_fail(st, l, -ECONNRESET, NULL);
		else
			conn_kill(st, c);
		return;
	}
	c->ended = true;
	hot_del(st, c);
	flushq_del(st, c);
	if (l->state == LINK_UP) {
		l->state = LINK_ENDING;
		l->ended_ns = reactor_now(st->engine);
		st->nending++;
		arm_end_check(st);
	}
	for (unsigned i = 0; i < TCP_MAX_CONNS; i++) {
		struct tcp_conn *o = l->conns[i];

		if (o && !o->dead && !o->ended && o->hs == HS_READY)
			return; /* it may still bring frames */
	}
	link_fail(st, l, -ECONNRESET, NULL);
}

/*
 * The peer is gone (or broke the protocol, or could not be reached): its
 * PUTs fail with res, GETs waiting on it give up, every block it held comes
 * back. why == NULL: already logged (or no error, a peer leaving).
 */
static void link_fail(struct tcp_state *st, struct tcp_link *l, int res, const char *why)
{
	struct ferry_engine *e = st->engine;

	if (!l || l->state == LINK_DEAD)
		return;
	if (l->state == LINK_ENDING)
		st->nending--;
	l->state = LINK_DEAD;
	if (why)
		log_warn("tcp: engine %s: link to %s lost: %s", e->name, l->peer_name, why);
	l->refs++; /* it must outlive the loops below */
	for (unsigned i = 0; i < TCP_MAX_CONNS; i++)
		if (l->conns[i])
			conn_kill(st, l->conns[i]);
	l->rdv_head = l->rdv_tail = NULL;
	while (l->wait_head) {
		struct tcp_msg *m = l->wait_head;

		l->wait_head = m->wait_next;
		m->wait_next = NULL;
		/*
		 * It never left (the link never came up): its block goes back
		 * to its op, which may be sent again (FERRY_SQE_WAIT_PEER) or
		 * frees it as any PUT that did not hand its data over.
		 */
		if (m->op && m->buf && m->op->gen == m->op_gen) {
			m->op->buf = m->buf;
			m->buf = NULL;
		}
	}
	l->wait_tail = NULL;
	for (struct tcp_msg *m = l->msgs, *next; m; m = next) {
		next = m->next;
		m->next_off = m->len;
		msg_result(st, m, res);
	}
	/* Offers it made us: blocks written by a recv in flight wait for it. */
	for (uint32_t i = 0; i < st->nrxs; i++) {
		struct tcp_rx *r = &st->rxs[i];

		if (r->link != l || r->state == RX_FREE)
			continue;
		if (r->state == RX_WAIT_MEM)
			continue; /* retry_wait_mem frees it in order */
		r->orphan = true;
		r->link = NULL;
		r->state = RX_WAIT_MEM; /* not findable any more */
		{
			bool pinned = false;

			for (uint32_t s = 0; s < TCP_MAX_SOCKS && !pinned; s++) {
				struct tcp_conn *c = st->conns[s];

				pinned = c && c->direct == r && c->recv_armed;
			}
			if (!pinned) {
				r->state = RX_FREE;
				rx_free(st, r);
			}
		}
	}
	if (!other_live_link(st, l)) {
		for (uint32_t i = 0; i < e->max_ops; i++) {
			struct op *op = &e->ops[i];

			if (op->state == OP_PARKED && op->peer &&
			    strcmp(op->peer->name, l->peer_name) == 0)
				op_complete(e, op, res == -ECANCELED ? res : -ECONNRESET, 0, NULL);
		}
		/* Its streams: STREAM_GETs end, chunks waiting for credit fail. */
		ferry__peer_event(e, st->b, l->peer_name, PEER_LOST,
				  res == -ECANCELED ? res : -ECONNRESET);
	}
	link_unref(l);
}

/* Drop dead links from the table (peers still resolved to one keep it). */
static void reap_links(struct tcp_state *st)
{
	for (struct tcp_link **pp = &st->links, *l; (l = *pp);) {
		if (l->state == LINK_DEAD) {
			*pp = l->next;
			link_unref(l);
		} else {
			pp = &l->next;
		}
	}
}

/* ------------------------------------------------------------------ */
/* Handshake                                                           */
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
	conn_arm_recv(st, c);
	if (!c->caller)
		count_preauth(st);
}

static void link_up(struct tcp_state *st, struct tcp_link *l);

static void refuse(struct tcp_state *st, struct tcp_conn *c, int err)
{
	struct tcp_hello h;

	hello_fill(st, &h, TCP_H_NO);
	h.status = (uint32_t)err;
	hello_send(c, &h);
	conn_kill(st, c);
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
		conn_kill(st, c);
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
		conn_kill(st, c);
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
		l = link_new(st, c->peer_name, false);
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
		conn_kill(st, c);
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
 * follow, see conn_end).
 */
static void hs_fail(struct tcp_state *st, struct tcp_conn *c, int res, const char *why)
{
	struct tcp_link *l = c->link;

	if (l && (l->state == LINK_UP || l->state == LINK_ENDING)) {
		log_info("tcp: engine %s: connection %u to %s not made (%s): the link goes on "
			 "without it", st->engine->name, c->index, l->peer_name,
			 why ? why : ferry_strerror(res));
		conn_kill(st, c);
		return;
	}
	link_fail(st, l, res, why);
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
		hs_fail(st, c, err == EACCES ? -EACCES : -EHOSTUNREACH, NULL);
		return;
	}
	if (c->hin.type != TCP_H_PROOF || c->hin.version != TCP_PROTO_VERSION) {
		log_warn("tcp: engine %s: %s answered with version %u type %u", e->name,
			 l->peer_name, c->hin.version, c->hin.type);
		hs_fail(st, c, -EHOSTUNREACH, NULL);
		return;
	}
	if (strcmp(c->hin.name, l->peer_name) != 0 || strcmp(c->hin.ns, e->ns) != 0) {
		log_warn("tcp: engine %s: called %s, \"%s\" in namespace \"%s\" answered", e->name,
			 l->peer_name, c->hin.name, c->hin.ns);
		hs_fail(st, c, -EHOSTUNREACH, NULL);
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
		hs_fail(st, c, -EACCES, NULL);
		return;
	}
	hello_fill(st, &h, TCP_H_AUTH);
	sec_proof(&st->secret, "ferry-caller", c->nonce_me, c->nonce_peer, e->name, l->peer_name,
		  e->ns, l->link_id, c->index, h.mac);
	if (hello_send(c, &h)) {
		hs_fail(st, c, -EHOSTUNREACH, "handshake send failed");
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
		hs_fail(st, c, err == EACCES ? -EACCES : -EHOSTUNREACH, NULL);
		return;
	}
	conn_ready(st, c);
	if (l->state == LINK_CONNECTING)
		link_up(st, l);
}

static int caller_start(struct tcp_state *st, struct tcp_link *l, uint16_t index);

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
		msg_send(st, l, m);
	}
	/* The other connections, for bandwidth. */
	for (uint16_t i = 1; i < l->nconns && l->state == LINK_UP; i++)
		if (caller_start(st, l, i))
			break;
}

/* Handshake progress on a poll event. */
static void on_poll(struct tcp_state *st, struct tcp_conn *c, int res)
{
	int rc;

	c->poll_armed = false;
	if (c->dead)
		return;
	if (res < 0 && res != -EINTR) {
		if (c->link)
			hs_fail(st, c, -EHOSTUNREACH, ferry_strerror(res));
		else
			conn_kill(st, c);
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
			hs_fail(st, c, -EHOSTUNREACH, NULL);
			return;
		}
		hello_fill(st, &h, TCP_H_HELLO);
		h.conn_index = c->index;
		h.nconns = c->link->nconns;
		h.link_id = c->link->link_id;
		memcpy(h.nonce, c->nonce_me, TCP_NONCE_BYTES);
		if ((rc = hello_send(c, &h))) {
			hs_fail(st, c, -EHOSTUNREACH, ferry_strerror(rc));
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
			hs_fail(st, c, -EHOSTUNREACH, NULL);
		} else {
			log_info("tcp: engine %s: a caller left during its handshake: %s",
				 st->engine->name, ferry_strerror(rc));
			conn_kill(st, c);
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
static int caller_start(struct tcp_state *st, struct tcp_link *l, uint16_t index)
{
	struct tcp_conn *c;
	int fd, rc;

	fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	set_sockopts(fd);
	c = conn_new(st, fd, true);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->link = l;
	c->index = index;
	c->hs = HS_CONNECTING;
	l->conns[index] = c;
	if ((rc = sec_nonce(c->nonce_me, TCP_NONCE_BYTES))) {
		conn_kill(st, c);
		return rc;
	}
	if (connect(fd, (struct sockaddr *)&l->addr, l->addrlen) < 0 && errno != EINPROGRESS) {
		rc = -errno;
		log_info("tcp: engine %s: connect to %s: %s", st->engine->name, l->peer_name,
			 ferry_strerror(rc));
		conn_kill(st, c);
		return rc;
	}
	arm_poll(st, c, POLLOUT);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Listener                                                            */
/* ------------------------------------------------------------------ */

static void arm_listen(struct tcp_state *st)
{
	struct io_uring_sqe *sqe;

	if (st->lfd < 0)
		return;
	sqe = get_sqe(st);
	if (!sqe)
		return;
	io_uring_prep_poll_add(sqe, st->lfd, POLLIN);
	io_uring_sqe_set_data64(sqe, mk_cookie(K_LISTEN, 0, st->lgen));
}

/* Callers accepted that have not proved the cluster secret yet (health says it too). */
static unsigned count_preauth(struct tcp_state *st)
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
	conn_kill(st, old);
}

static void accept_all(struct tcp_state *st)
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
		if (count_preauth(st) >= TCP_PREAUTH_MAX)
			drop_oldest_preauth(st);
		set_sockopts(fd);
		c = conn_new(st, fd, false);
		if (!c) {
			close(fd);
			continue;
		}
		memcpy(&c->peer_sa, &sa, sizeof(sa));
		c->hs = HS_WAIT_HELLO;
		arm_poll(st, c, POLLIN);
		count_preauth(st);
	}
}

static int listen_start(struct tcp_state *st)
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

/* ------------------------------------------------------------------ */
/* Heartbeats and handshake deadlines                                  */
/* ------------------------------------------------------------------ */

static int check_time(struct tcp_state *st)
{
	uint64_t now = reactor_now(st->engine);
	int n = 0;

	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++) {
		struct tcp_conn *c = st->conns[i];

		if (!c || c->dead || c->hs == HS_READY || now < c->hs_deadline)
			continue;
		if (c->link && c->caller) {
			log_info("tcp: engine %s: handshake with %s timed out", st->engine->name,
				 c->link->peer_name);
			hs_fail(st, c, -EHOSTUNREACH, NULL);
		} else {
			char addr[NETADDR_MAX];

			netaddr_format((struct sockaddr *)&c->peer_sa, addr, sizeof(addr));
			STAT_ADD(st->engine->stats.handshakes_dropped, 1);
			log_limited(FERRY__LOG_WARN, "tcp: engine %s: a caller at %s%s%s%s did not "
				    "finish its handshake within %u ms: hung up", st->engine->name,
				    addr, c->peer_name[0] ? " (\"" : "", c->peer_name,
				    c->peer_name[0] ? "\")" : "",
				    (unsigned)(st->engine->handshake_ns / 1000000));
			conn_kill(st, c);
		}
		n++;
	}
	for (struct tcp_link *l = st->links; l; l = l->next) {
		struct tcp_conn *c;

		if (l->state == LINK_ENDING && now - l->ended_ns >= TCP_END_GRACE_NS) {
			log_warn("tcp: engine %s: %s ended some connections of its link and kept "
				 "the others open for %llu ms: link dropped", st->engine->name,
				 l->peer_name, (unsigned long long)(TCP_END_GRACE_NS / 1000000));
			link_fail(st, l, -ECONNRESET, NULL);
			n++;
			continue;
		}
		if (l->state != LINK_UP)
			continue;
		if (now - l->last_rx_ns > st->peer_timeout_ns) {
			log_warn("tcp: engine %s: %s silent for %llu ms: declared dead",
				 st->engine->name, l->peer_name,
				 (unsigned long long)((now - l->last_rx_ns) / 1000000));
			link_fail(st, l, -ECONNRESET, NULL);
			n++;
			continue;
		}
		if (now - l->last_rx_ns >= st->heartbeat_ns &&
		    now - l->last_ping_ns >= st->heartbeat_ns && (c = link_primary(l))) {
			if (ctl_send(st, c, TCP_F_PING, now, 0))
				l->last_ping_ns = now;
		}
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* The backend                                                         */
/* ------------------------------------------------------------------ */

static void on_ring_cqe(struct tcp_state *st, uint64_t ud, int res)
{
	unsigned kind = ud & 0xf;
	uint32_t slot = (uint32_t)((ud >> 4) & 0xfffff), gen = (uint32_t)(ud >> 24);
	struct tcp_conn *c;

	st->inflight--;
	switch (kind) {
	case K_LISTEN:
		if (st->lfd < 0 || gen != st->lgen)
			return;
		if (res >= 0)
			accept_all(st);
		arm_listen(st);
		return;
	case K_TICK:
		st->tick_armed = false;
		st->tick_due = true;
		return;
	case K_END:
		st->end_armed = false;
		st->tick_due = true;
		return;
	case K_POLL:
	case K_RECV:
	case K_SEND:
		c = slot < TCP_MAX_SOCKS ? st->conns[slot] : NULL;
		if (!c || c->gen != gen)
			return;
		if (kind == K_POLL)
			on_poll(st, c, res);
		else if (kind == K_RECV)
			on_recv(st, c, res);
		else
			on_send(st, c, res);
		return;
	default:
		return; /* cancels */
	}
}

static int reap_own(struct tcp_state *st)
{
	struct io_uring_cqe *cqe;
	int n = 0;

	/*
	 * Every round asks: an empty ring answers here, without
	 * io_uring_peek_cqe's call into liburing (which enters the kernel
	 * only when completions overflowed).
	 */
	if (!io_uring_cq_ready(&st->ring) &&
	    !(IO_URING_READ_ONCE(*st->ring.sq.kflags) & IORING_SQ_CQ_OVERFLOW))
		return 0;
	while (io_uring_peek_cqe(&st->ring, &cqe) == 0) {
		uint64_t ud = cqe->user_data;
		int res = cqe->res;

		io_uring_cqe_seen(&st->ring, cqe);
		on_ring_cqe(st, ud, res);
		n++;
	}
	return n;
}

static bool links_alive(struct tcp_state *st)
{
	return st->nconns || st->links;
}

static int tcp_progress(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	int n;

	(void)e;
	if (!st->ready)
		return 0;
	n = reap_own(st);
	if (st->wait_mem_head)
		n += retry_wait_mem(st);
	if (st->stalled)
		n += retry_stalled(st);
	if (st->tick_due) {
		st->tick_due = false;
		check_time(st);
		reap_links(st);
		if (st->nending)
			arm_end_check(st);
	}
	if (st->ndead)
		sweep_dead(st);
	if (links_alive(st) || st->wait_mem_head)
		arm_tick(st);
	return n;
}

/*
 * The end of the round, after the PUTs of the application's SQs were
 * taken: what every connection queued in this round leaves now (one
 * sendmsg each), then the hot connections are read (after the sends, so
 * that a reply never waits behind a read that finds nothing), what those
 * frames made is sent, and the ring's SQEs go in one io_uring_enter.
 */
static int tcp_round_end(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	int n = 0;

	(void)e;
	if (!st->ready)
		return 0;
	if (st->nflush)
		flush_all(st, true);
	if (st->nhot) {
		n = read_hot(st);
		if (st->nflush)
			flush_all(st, true);
	}
	if (io_uring_sq_ready(&st->ring))
		io_uring_submit(&st->ring);
	return n;
}

/*
 * The round took the application's entries: what they queued (PUTs, with
 * any RESULTs held for them) leaves now, before the round spends time on
 * the other backends, its timers and its reads. round_end sends the rest.
 */
static void tcp_sqs_drained(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (st->ready && st->nflush)
		flush_all(st, true);
}

/*
 * Asked before the progress thread sleeps (it announced the sleep first):
 * hot connections get their RECV armed here, so that bytes arriving while
 * it sleeps wake it through the ring, and held RESULTs leave (nobody
 * reacts to them in a sleep).
 */
static bool tcp_has_work(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (!st->ready)
		return false;
	return io_uring_sq_ready(&st->ring) || io_uring_cq_ready(&st->ring) || st->nflush ||
	       (st->stalled && st->free_ctls);
}

/*
 * Before the progress side sleeps: hot connections (read by busy polling)
 * go back to io_uring recvs, and what was held back to be sent in one go
 * leaves now, so that no byte waits for a round that will not come.
 */
static bool tcp_prepare_sleep(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;

	if (!st->ready)
		return false;
	if ((st->nhot || st->nflush) &&
	    atomic_load_explicit(&e->wake->sleeping, memory_order_relaxed)) {
		cool_all(st);
		if (st->nflush)
			flush_all(st, false);
		if (io_uring_sq_ready(&st->ring))
			io_uring_submit(&st->ring);
	}
	return tcp_has_work(e, b);
}

static void tcp_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
		       uint32_t flags)
{
	struct tcp_state *st = b->data;

	(void)e;
	(void)res;
	if (!st || cookie != K_RINGFD)
		return;
	if (!(flags & IORING_CQE_F_MORE)) {
		st->ringfd_armed = false;
		if (st->ready)
			arm_ringfd(st);
	}
}

/* A link for peer: a live one, or a new call when it has an address. */
static int link_for(struct tcp_state *st, struct ferry_peer *peer, struct tcp_link **out)
{
	struct ferry_engine *e = st->engine;
	char address[PEER_ADDR_MAX] = "";
	struct tcp_link *l;
	int rc;

	ferry__peer_addr_get(peer, "tcp", address, sizeof(address));
	for (l = st->links; l; l = l->next)
		if (link_open(l) && strcmp(l->peer_name, peer->name) == 0)
			break;
	if (l) {
		*out = l;
		return 0;
	}
	if (!address[0])
		return -EHOSTUNREACH;
	if ((rc = state_ready(st)))
		return rc;
	l = link_new(st, peer->name, true);
	if (!l)
		return -ENOMEM;
	if ((rc = netaddr_parse(address, true, &l->addr, &l->addrlen)) ||
	    (rc = sec_nonce((uint8_t *)&l->link_id, sizeof(l->link_id)))) {
		link_fail(st, l, -EHOSTUNREACH, NULL);
		return -EHOSTUNREACH;
	}
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&l->addr)) {
		log_error("tcp: engine %s: not calling %s at %s: no cluster secret is set",
			  e->name, peer->name, address);
		link_fail(st, l, -EACCES, NULL);
		return -EACCES;
	}
	l->nconns = st->conns_per_link;
	rc = caller_start(st, l, 0);
	if (rc) {
		link_fail(st, l, -EHOSTUNREACH, NULL);
		return -EHOSTUNREACH;
	}
	*out = l;
	return 0;
}

static int tcp_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct tcp_state *st = b->data;
	char address[PEER_ADDR_MAX];
	bool has_address = ferry__peer_addr_get(peer, "tcp", address, sizeof(address));
	struct tcp_link *l;
	int rc;

	(void)e;
	if (!has_address && !st->links)
		return -EHOSTUNREACH; /* the common case of engines without tcp */
	rc = link_for(st, peer, &l);
	if (rc) {
		/*
		 * A peer given an address is reached there or not at all: a
		 * call that cannot start (no route) must not hand it to another
		 * transport that finds an engine of its name (shm, loop).
		 */
		return has_address ? -ENETUNREACH : rc;
	}
	l->refs++;
	peer->transport = l;
	return 0;
}

static void tcp_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	(void)b;
	if (peer->transport)
		link_unref(peer->transport);
	peer->transport = NULL;
}

static int tcp_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct tcp_state *st = b->data;
	struct tcp_link *l = op->peer->transport;
	struct tcp_msg *m;

	if (!link_open(l)) {
		/* Lost or ending since: call again (the peer may be back), or give up. */
		struct tcp_link *nl;

		if (link_for(st, op->peer, &nl))
			return -ECONNRESET;
		nl->refs++;
		link_unref(l);
		op->peer->transport = l = nl;
	}
	m = st->free_msgs;
	if (!m) {
		log_limited(FERRY__LOG_WARN, "tcp: engine %s: %u PUTs away at peers that do not "
			    "answer: refusing more", e->name, st->nmsgs);
		return -ENOBUFS;
	}
	st->free_msgs = m->wait_next;
	m->wait_next = NULL;
	m->state = MSG_LIVE;
	m->gen++;
	m->op = op;
	m->op_gen = op->gen;
	m->buf = op->buf;
	op->buf = NULL; /* the message owns the block now */
	m->len = op->len;
	/*
	 * An iovec of at most TCP_INLINE_MAX bytes (iov_put_max): copied here,
	 * so a deadline that ends the op before the frame leaves cannot leave it
	 * pointing at the caller's memory.
	 */
	if (!m->buf)
		op_gather(op, m->inl, m->len);
	m->link = l;
	l->refs++;
	m->resulted = false;
	m->tx_busy = false;
	m->cts = false;
	m->chunks_out = 0;
	m->next_off = 0;
	m->rendezvous = m->len > TCP_EAGER_MAX;
	m->flags = frame_flags(op->flags & WIRE_F__ALL);
	m->key_len = op->key_len;
	memcpy(m->key, op->key, op->key_len + 1u);
	m->tx.key = m->key;
	m->tx.key_len = m->key_len;
	if (m->rendezvous) {
		tcp_frame_pack(m->tx.hdr, TCP_F_RTS, (uint8_t)m->flags, m->key_len, m->key_len,
			       msg_cookie(m), m->len);
		m->tx.data = NULL;
		m->tx.data_len = 0;
	} else {
		tcp_frame_pack(m->tx.hdr, TCP_F_PUT, (uint8_t)m->flags, m->key_len,
			       (uint32_t)(m->key_len + m->len), msg_cookie(m), m->len);
		m->tx.data = m->buf ? m->buf->data : m->inl;
		m->tx.data_len = m->len;
	}
	m->prev = NULL;
	m->next = l->msgs;
	if (l->msgs)
		l->msgs->prev = m;
	l->msgs = m;
	op->state = OP_AWAY;
	if (l->state == LINK_UP) {
		msg_send(st, l, m);
	} else {
		if (l->wait_tail)
			l->wait_tail->wait_next = m;
		else
			l->wait_head = m;
		l->wait_tail = m;
	}
	return 0;
}

static void tcp_forget(struct ferry_engine *e, struct backend *b, struct op *op)
{
	/* The message finishes on its own; its ack is stale (reactor_put_done checks). */
	(void)e;
	(void)b;
	(void)op;
}

static int tcp_init(struct ferry_engine *e, struct backend *b)
{
	const struct ferry_engine_params *p = e->create_params;
	struct tcp_state *st = calloc(1, sizeof(*st));
	const char *env;
	int rc;

	if (!st)
		return -ENOMEM;
	st->engine = e;
	st->b = b;
	st->lfd = -1;
	b->data = st;
	if (p && p->size > offsetof(struct ferry_engine_params, listen)) {
		if (p->listen && strnlen(p->listen, NETADDR_MAX) >= NETADDR_MAX) {
			log_error("ferry_engine_create: listen endpoint longer than %d bytes",
				  NETADDR_MAX - 1);
			rc = -EINVAL;
			goto fail;
		}
		if (p->listen)
			snprintf(st->listen_text, sizeof(st->listen_text), "%s", p->listen);
		st->heartbeat_ns = (uint64_t)p->heartbeat_ms * 1000000ull;
		st->peer_timeout_ns = (uint64_t)p->peer_timeout_ms * 1000000ull;
		rc = sec_secret_load(&st->secret, p->secret, p->secret_file);
	} else {
		rc = sec_secret_load(&st->secret, NULL, NULL);
	}
	if (rc)
		goto fail;
	if (!st->heartbeat_ns)
		st->heartbeat_ns = TCP_DEFAULT_HEARTBEAT_MS * 1000000ull;
	if (!st->peer_timeout_ns)
		st->peer_timeout_ns = TCP_DEFAULT_PEER_TIMEOUT_MS * 1000000ull;
	if (st->peer_timeout_ns < st->heartbeat_ns) {
		log_error("ferry_engine_create: peer_timeout_ms is shorter than heartbeat_ms");
		rc = -EINVAL;
		goto fail;
	}
	st->conns_per_link = TCP_DEFAULT_CONNS;
	st->result_hold_ns = TCP_RESULT_HOLD_NS;
	env = getenv("FERRY_TCP_HOLD_NS");
	if (env && *env)
		st->result_hold_ns = strtoull(env, NULL, 10);
	env = getenv("FERRY_TCP_CONNS");
	if (env && atoi(env) >= 1 && atoi(env) <= TCP_MAX_CONNS)
		st->conns_per_link = (uint16_t)atoi(env);
	if (st->listen_text[0]) {
		if ((rc = listen_start(st)) || (rc = state_ready(st)))
			goto fail;
		arm_listen(st);
		io_uring_submit(&st->ring);
	}
	return 0;
fail:
	if (st->lfd >= 0)
		close(st->lfd);
	if (st->ready)
		io_uring_queue_exit(&st->ring);
	tables_free(st);
	free(st);
	b->data = NULL;
	return rc;
}

static void tcp_fini(struct ferry_engine *e, struct backend *b)
{
	struct tcp_state *st = b->data;
	uint64_t until;

	if (!st)
		return;
	/* Answers still queued or held (RESULTs) leave first, as far as the sockets take them. */
	if (st->ready && st->nflush)
		flush_all(st, false);
	if (st->lfd >= 0) {
		shutdown(st->lfd, SHUT_RDWR);
		close(st->lfd);
		st->lfd = -1;
	}
	for (struct tcp_link *l = st->links; l; l = l->next)
		link_fail(st, l, -ECANCELED, NULL);
	for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++)
		if (st->conns[i])
			conn_kill(st, st->conns[i]);
	reap_links(st);
	/* Every op of the ring must end before the memory it uses goes. */
	if (st->ready) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);

		if (sqe) {
			io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
			io_uring_sqe_set_data64(sqe, 0);
			st->inflight++;
		}
		io_uring_submit(&st->ring);
		until = ferry__now_ns() + 2000000000ull;
		while (st->inflight && ferry__now_ns() < until) {
			struct io_uring_cqe *cqe;
			struct __kernel_timespec ts = { 0, 10000000 };

			if (io_uring_wait_cqe_timeout(&st->ring, &cqe, &ts) == 0)
				reap_own(st);
			sweep_dead(st);
			io_uring_submit(&st->ring);
		}
		if (st->inflight)
			log_warn("tcp: engine %s: %u socket ops did not end", e->name, st->inflight);
		for (uint32_t i = 0; i < TCP_MAX_SOCKS; i++)
			if (st->conns[i])
				conn_free(st, st->conns[i]);
		/* What stayed waiting for memory. */
		while (st->wait_mem_head) {
			struct tcp_rx *r = st->wait_mem_head;

			st->wait_mem_head = r->next;
			rx_free(st, r);
		}
		io_uring_queue_exit(&st->ring);
	}
	reactor_unresolve_all(e, b);
	tables_free(st);
	free(st);
	b->data = NULL;
}

/*
 * The control plane declared the engine `name` dead: fail the data links to
 * it as if they had gone silent (their ops fail with res). A link that
 * failed alone is no such verdict (PEER_LOST): the peer may be alive.
 */
static void tcp_peer_event(struct ferry_engine *e, struct backend *b, const char *name,
			   enum peer_event ev, int res)
{
	struct tcp_state *st = b->data;

	(void)e;
	if (ev != PEER_DEAD)
		return;
	for (struct tcp_link *l = st->links; l; l = l->next)
		if (l->state != LINK_DEAD && strcmp(l->peer_name, name) == 0)
			link_fail(st, l, res, "the control channel declared it dead");
}

static int tcp_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
		       const char *uri)
{
	(void)e;
	(void)b;
	return ferry_peer_set_address(peer, uri);
}

static int tcp_address(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct tcp_state *st = b->data;

	(void)e;
	return st->bound[0] ? snprintf(buf, len, "%s", st->bound) : 0;
}

const struct backend_ops ferry__tcp_backend = {
	.name = "tcp",
	.rank = 10,
	.caps = TRANSPORT_CAP_SAME_HOST | TRANSPORT_CAP_REMOTE | TRANSPORT_CAP_MEM_HOST,
	.init = tcp_init,
	.fini = tcp_fini,
	.resolve = tcp_resolve,
	.unresolve = tcp_unresolve,
	.put = tcp_put,
	.iov_put_max = TCP_INLINE_MAX,
	.progress = tcp_progress,
	.has_work = tcp_has_work,
	.prepare_sleep = tcp_prepare_sleep,
	.sqs_drained = tcp_sqs_drained,
	.round_end = tcp_round_end,
	.forget = tcp_forget,
	.on_cqe = tcp_on_cqe,
	.scheme = "tcp",
	.connect = tcp_connect,
	.address = tcp_address,
	.peer_event = tcp_peer_event,
};

/* ------------------------------------------------------------------ */
/* Public calls                                                        */
/* ------------------------------------------------------------------ */

static struct tcp_state *tcp_of(struct ferry_engine *e)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops == &ferry__tcp_backend)
			return e->backends[i].data;
	return NULL;
}

/*
 * Control channel hook (ctl.h): the control channel declared engine `name`
 * dead; its data links go too, as if they had gone silent.
 */

int ferry_engine_address(struct ferry_engine *e, char *buf, size_t len)
{
	struct tcp_state *st;

	if (!e || (!buf && len)) {
		log_error("ferry_engine_address: NULL %s", e ? "buf" : "engine");
		return -EINVAL;
	}
	st = tcp_of(e);
	if (!st || !st->bound[0])
		return -ENOTCONN;
	return snprintf(buf, len, "%s", st->bound);
}

int ferry_peer_set_address(struct ferry_peer *p, const char *endpoint)
{
	struct sockaddr_storage ss;
	struct tcp_state *st;
	char text[NETADDR_MAX];
	socklen_t len;
	int rc;

	if (!p || !endpoint) {
		log_error("ferry_peer_set_address: NULL %s", p ? "endpoint" : "peer");
		return -EINVAL;
	}
	rc = netaddr_parse_peer("ferry_peer_set_address", endpoint, &ss, &len);
	if (rc)
		return rc;
	st = tcp_of(p->engine);
	if (!st) {
		log_error("ferry_peer_set_address: engine %s has no tcp transport", p->engine->name);
		return -EINVAL;
	}
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
		log_error("ferry_peer_set_address: %s for %s is not a loopback address and engine "
			  "%s has no cluster secret", endpoint, p->name, p->engine->name);
		return -EACCES;
	}
	sec_note_no_secret(&st->secret, p->engine->name);
	netaddr_format((struct sockaddr *)&ss, text, sizeof(text));
	return ferry__peer_addr_set(p, text);
}

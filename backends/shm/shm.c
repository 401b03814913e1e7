/*
 * backends/shm/shm.c - the shared-memory transport: engines in different
 * processes of one host.
 *
 * Owns: connections to peer engines found by name (shm_sock.c does the
 * socket, the names and the hello) and their handshakes, the descriptor
 * rings in shared memory that carry PUTs and their results, the read-only
 * mapping of each peer's pool, the accounting of blocks lent to peers, and
 * what happens when a peer dies or misbehaves.
 *
 * Handshakes never block a round. Calling a peer is a non-blocking connect
 * and our hello; the connection then waits for the answer (an io_uring poll
 * on its socket), not up and not in st->live, its PUTs queued in order on
 * the pending list, and comes up (st->live, queued PUTs sent) when the
 * answer is checked and mapped. Accepting, the caller's hello is read at
 * once if it is there, else the caller waits in a bounded table of
 * half-open slots, its socket polled. A timer on the same io_uring, armed
 * only while handshakes are under way, ends calls unanswered within
 * SHM_HANDSHAKE_MS (their PUTs fail with -EHOSTUNREACH and the peer is
 * resolved again by its next PUT), retries a connect that found a full
 * accept queue, and hangs up on callers silent for SHM_ACCEPT_HELLO_MS.
 * The data path never looks at handshake state: only connections that are
 * up are in st->live.
 *
 * Per connection, the connecting side creates one memfd holding two
 * directions; each direction has a PUT ring (descriptors {key, offset, len})
 * and a control ring (RESULT of a PUT, RELEASE of a block). The two rings
 * are separate so that draining control never needs room anywhere: that is
 * what rules out a deadlock when both sides push PUTs at each other. Each
 * entry carries its own sequence word: the consumer polls the entry it
 * wants next, one cache line for "ready" and its content.
 *
 * Data path: a PUT of at most SHM_INLINE_MAX bytes travels inside its
 * descriptor (the block it came in is free at once); the receiver copies it
 * into a waiting GET's iovec, or into a block of its own pool, and answers
 * RESULT_INLINE. A larger PUT's data is a block of the sender's pool (the
 * reactor copied an iovec into one). When a GET into an iovec already waits
 * for its key, the receiver copies the block out through its read-only
 * mapping at once and answers RESULT_FREE (the block is the sender's again).
 * Otherwise it wraps the block, read in place, into a foreign handle
 * (pool_wrap) and hands it to its key table; the sender keeps the block
 * "lent" until the receiver's RELEASE (when the application releases the
 * buffer, or after a later GET copied it out) or until the receiver dies.
 *
 * Sleep and wake: an entry is published with a release store of its
 * sequence word, PUTs as they go, control entries (RESULTs, RELEASEs) as
 * they come; once per round and connection the producer then reads the
 * consumer engine's `sleeping` word (its wake page, mapped from the peer)
 * and writes its doorbell eventfd only if it sleeps. While both sides are
 * busy, no syscall per message.
 *
 * Trust: everything read from shared memory is copied, then checked
 * (indices, lengths, offsets against the mapped size, key termination); a
 * peer that breaks a rule is disconnected. The peer's pool is mapped
 * read-only, so nothing it sends can make us write into its memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "shm_sock.h"
#include "shm_wire.h"

#define SHM_MAX_CONNS 256u
/*
 * How long a connection we start may take to be answered (the peer's hello
 * with its fds). PUTs queued on it meanwhile keep their own deadlines.
 */
#define SHM_HANDSHAKE_MS 2000
/*
 * How long an accepted caller may take to send its hello. A caller sends it
 * right after connecting, so it is normally there at once; a silent one
 * only holds a slot of the half-open table meanwhile.
 */
#define SHM_ACCEPT_HELLO_MS 250
/* Accepted callers whose hello has not come yet; beyond, the oldest is hung up on. */
#define SHM_HALF_OPEN_MAX 64u
/*
 * While handshakes are under way, a timer looks at their bounds (and tries
 * again a connect that found the peer's accept queue full) this often.
 */
#define SHM_TICK_MS 25
#define SHM_PER_ROUND 256

/*
 * io_uring cookies (below backend_tag's byte): the listener, a connection
 * (gen << 16 | id + 1), a half-open accept (gen << 16 | COOKIE_HALF_OPEN +
 * slot), the handshake timer.
 */
#define COOKIE_LISTENER 0u
#define COOKIE_HALF_OPEN 0x1000u
#define COOKIE_TICK 0xffffu

struct shm_state;

/* A control entry's content, as we build it or copied out of a peer's ring. */
struct shm_ctrl {
	uint16_t type;
	int32_t res;
	uint64_t op_cookie;
	uint64_t buf_cookie;
	uint64_t offset;
};

struct shm_conn {
	_Atomic int refs;    /* the table, each peer resolved to it, each wrapped block */
	_Atomic int closed;  /* release hooks stop queueing */
	_Atomic int users;   /* release hooks inside */
	uint32_t id;
	uint32_t gen;        /* tells its io_uring poll from a former one's */
	bool dead;
	bool up;             /* handshake done, in st->live (else: we are calling) */
	bool connect_again;  /* calling: the peer's accept queue was full */
	int sock;            /* -1 while connect_again */
	struct shm_state *st;
	char peer_name[FERRY_NAME_MAX];
	struct shm_rings *rings;
	struct shm_dir *tx, *rx;
	const uint8_t *peer_pool;
	uint64_t peer_pool_size;
	int peer_doorbell;
	struct wake_page *peer_wake;
	struct op *pending_head, *pending_tail; /* PUTs waiting for ring room */
	uint64_t puts_sent, puts_taken;
	/*
	 * Our ends of the rings, kept here: the shared words are only read
	 * where the peer writes them (its heads of our rings, the sequence
	 * words of its entries), so what it scribbles over ours cannot
	 * mislead us. The peer's heads are read again only when the copy says
	 * a ring is full.
	 */
	uint32_t put_tail, put_head_seen;   /* tx PUT ring */
	uint32_t ctrl_tail, ctrl_head_seen; /* tx control ring */
	uint32_t ctrl_published;            /* ctrl_tail at the last wake check */
	uint32_t rx_put_head, rx_ctrl_head; /* rx rings */
	bool peer_takes_result_free;        /* its hello had SHM_CAP_RESULT_FREE */
	/* Calling (cold: the data path never looks). */
	int ring_fd;         /* the rings' memfd, until our hello is sent */
	uint64_t hs_deadline; /* the handshake's bound */
};

struct shm_state {
	struct ferry_engine *engine;
	struct backend *b;
	struct shm_listener lis;
	uint32_t next_gen;
	/* Accepted callers whose hello has not come yet (fd -1: free slot). */
	struct shm_half_open {
		int fd;
		uint32_t gen;
		uint64_t deadline;
	} half_open[SHM_HALF_OPEN_MAX];
	uint32_t nhalf_open;
	uint32_t nconnecting;    /* connections we started, not up nor failed yet */
	bool tick_armed;
	struct __kernel_timespec tick_ts;
	struct shm_conn *conns[SHM_MAX_CONNS]; /* by slot (the id peers' cookies name) */
	struct shm_conn *live[SHM_MAX_CONNS];  /* the same, packed: what rounds walk */
	uint32_t nlive;
	struct ferry_buf **lent;  /* by handle index: blocks a peer holds */
	uint16_t *lent_conn;      /* conn id + 1 */
	uint64_t *lent_credit;    /* stream_credit_token of a lent chunk (0: none) */
	uint32_t max_bufs;
	struct ferry_buf *_Atomic releases; /* foreign blocks released, any thread */
};

/* ------------------------------------------------------------------ */
/* Connections: lifetime                                               */
/* ------------------------------------------------------------------ */

static void conn_unref(struct shm_conn *c)
{
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (c->rings)
		munmap(c->rings, SHM_RINGS_BYTES);
	if (c->peer_pool)
		munmap((void *)c->peer_pool, c->peer_pool_size);
	if (c->peer_wake)
		munmap(c->peer_wake, 4096);
	if (c->peer_doorbell >= 0)
		close(c->peer_doorbell);
	if (c->ring_fd >= 0)
		close(c->ring_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c);
}

static uint64_t conn_cookie(const struct shm_conn *c)
{
	return ((uint64_t)c->gen << 16) | (c->id + 1);
}

/*
 * Ring the peer's doorbell (an eventfd: checked at the handshake). A write
 * blocks only if the counter is full, which a peer would have to do on
 * purpose: check that it can take the write first, so that the reactor is
 * not held by someone else's fd (the window between the check and the
 * write is the peer's own doing, and it is the same user).
 */
static void ring_peer(struct shm_conn *c)
{
	struct pollfd p = { .fd = c->peer_doorbell, .events = POLLOUT };
	uint64_t one = 1;

	if (poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)) {
		log_limited(FERRY__LOG_WARN, "shm: the doorbell of %s takes no more writes; "
			    "not ringing it", c->peer_name);
		return;
	}
	if (write(c->peer_doorbell, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_debug("shm: doorbell of %s: %s", c->peer_name, ferry_strerror(-errno));
}

static void wake_peer(struct shm_conn *c)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->peer_wake->sleeping, memory_order_relaxed) &&
	    !atomic_exchange(&c->peer_wake->doorbell_rung, 1))
		ring_peer(c);
}

static struct io_uring_sqe *ring_sqe(struct ferry_engine *e)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

	if (!sqe) {
		io_uring_submit(&e->ring);
		sqe = io_uring_get_sqe(&e->ring);
	}
	return sqe;
}

static void arm_poll(struct ferry_engine *e, struct backend *b, int fd, uint64_t cookie)
{
	struct io_uring_sqe *sqe = ring_sqe(e);

	if (!sqe) {
		log_error("shm: io_uring full, cannot watch fd %d", fd);
		return;
	}
	io_uring_prep_poll_add(sqe, fd, POLLIN | POLLRDHUP | POLLHUP | POLLERR);
	io_uring_sqe_set_data64(sqe, backend_tag(b, cookie));
	io_uring_submit(&e->ring); /* a busy reactor may not sleep for long */
}

/* ------------------------------------------------------------------ */
/* Rings                                                               */
/* ------------------------------------------------------------------ */

/*
 * Room in a ring we produce into, from our tail and the consumer's head
 * last seen (read again only when that says full); -1 if the consumer's
 * head is nonsense (a peer that writes garbage).
 */
static int64_t ring_room(struct shm_ring_ctl *r, uint32_t entries, uint32_t tail,
			 uint32_t *head_seen)
{
	uint32_t head;

	if (tail - *head_seen < entries)
		return (int64_t)(entries - (tail - *head_seen));
	head = atomic_load_explicit(&r->head, memory_order_acquire);
	if (tail - head > entries)
		return -1;
	*head_seen = head;
	return (int64_t)(entries - (tail - head));
}

/*
 * The entry at position head of a ring we consume, from its sequence word:
 * 1 ready (seq == head + 1), 0 not yet (the previous lap's seq, or 0 on the
 * first lap), -1 garbage (a peer that scribbles: disconnect it).
 */
static int entry_state(const _Atomic uint32_t *seq_word, uint32_t head, uint32_t entries)
{
	uint32_t seq = atomic_load_explicit(seq_word, memory_order_acquire);

	if (likely(seq == head + 1u))
		return 1;
	if (seq == head + 1u - entries || (seq == 0 && head < entries))
		return 0;
	return -1;
}

/*
 * While we poll the next PUT entry we also ask for its second cache line
 * (where a short key's inline data lies), so that both lines can travel
 * together when the entry comes. Probes put it at ~60 ns less from seeing an
 * entry to delivering it, in 2 runs of 3; end to end the difference stayed
 * within this machine's noise (docs/benchmarks.md).
 */
static int put_entry_state(struct shm_conn *c)
{
	const struct shm_put_desc *d = &c->rx->puts[c->rx_put_head % SHM_PUT_ENTRIES];

	__builtin_prefetch((const char *)d + 64);
	return entry_state(&d->seq, c->rx_put_head, SHM_PUT_ENTRIES);
}

static int ctrl_entry_state(struct shm_conn *c)
{
	return entry_state(&c->rx->ctrls[c->rx_ctrl_head % SHM_CTRL_ENTRIES].seq,
			   c->rx_ctrl_head, SHM_CTRL_ENTRIES);
}

static int64_t ctrl_room(struct shm_conn *c)
{
	return ring_room(&c->tx->ctrl, SHM_CTRL_ENTRIES, c->ctrl_tail, &c->ctrl_head_seen);
}

static int64_t put_room(struct shm_conn *c)
{
	return ring_room(&c->tx->put, SHM_PUT_ENTRIES, c->put_tail, &c->put_head_seen);
}

static void conn_fail(struct ferry_engine *e, struct shm_conn *c, const char *why, int res);
static int conn_for(struct ferry_engine *e, struct backend *b, const char *name,
		    struct shm_conn **out);

/*
 * Write and publish a control entry. The peer's sleep word is read once
 * for all of a round's entries, by ctrl_published_since_check at the end
 * of conn_progress, which every round runs for every live connection.
 */
static bool send_ctrl(struct ferry_engine *e, struct shm_conn *c, const struct shm_ctrl *m)
{
	int64_t room = ctrl_room(c);
	struct shm_ctrl_desc *d;

	if (room < 0) {
		conn_fail(e, c, "control ring head out of range", -ECONNRESET);
		return false;
	}
	if (room == 0)
		return false;
	d = &c->tx->ctrls[c->ctrl_tail % SHM_CTRL_ENTRIES];
	d->type = m->type;
	d->res = m->res;
	d->op_cookie = m->op_cookie;
	d->buf_cookie = m->buf_cookie;
	d->offset = m->offset;
	atomic_store_explicit(&d->seq, c->ctrl_tail + 1u, memory_order_release);
	c->ctrl_tail++;
	return true;
}

/* Were control entries written since the last call? */
static bool ctrl_published_since_check(struct shm_conn *c)
{
	if (c->ctrl_tail == c->ctrl_published)
		return false;
	c->ctrl_published = c->ctrl_tail;
	return true;
}

/* ------------------------------------------------------------------ */
/* Sending PUTs                                                        */
/* ------------------------------------------------------------------ */

static bool send_put(struct ferry_engine *e, struct shm_conn *c, struct op *op)
{
	struct shm_state *st = c->st;
	int64_t room = put_room(c);
	struct shm_put_desc *d;
	struct ferry_buf *buf = op->buf;
	uint64_t credit = stream_credit_token(op);
	/*
	 * A stream chunk's credit comes back with its block's RELEASE: never
	 * inline. An op without a block (an iovec of <= SHM_INLINE_MAX bytes,
	 * struct backend_ops) is a plain PUT: always inline.
	 */
	bool inline_data = op->len <= SHM_INLINE_MAX && !credit;

	if (room < 0) {
		conn_fail(e, c, "PUT ring head out of range", -ECONNRESET);
		return false;
	}
	if (room == 0)
		return false;
	d = &c->tx->puts[c->put_tail % SHM_PUT_ENTRIES];
	d->flags = op->flags & WIRE_F__ALL;
	d->op_cookie = ((uint64_t)op->index << 32) | op->gen;
	d->len = op->len;
	d->key_len = op->key_len;
	memcpy(d->body, op->key, op->key_len + 1u);
	if (inline_data) {
		char *dst = d->body + shm_inline_at(op->key_len);

		d->type = SHM_D_PUT_INLINE;
		d->buf_cookie = 0;
		d->offset = 0;
		if (buf)
			ferry__payload_copy(dst, buf->data, op->len);
		else
			op_gather(op, dst, op->len);
	} else {
		d->type = SHM_D_PUT;
		d->buf_cookie = buf->index;
		d->offset = buf->offset;
		st->lent_credit[buf->index] = credit;
		if (credit)
			d->flags |= WIRE_F_RELCREDIT;
	}
	atomic_store_explicit(&d->seq, c->put_tail + 1u, memory_order_release);
	c->put_tail++;
	if (inline_data) {
		if (buf)
			pool_free(buf); /* its bytes are in the entry */
	} else {
		/* The block is lent until the peer's RESULT (error) or RELEASE. */
		st->lent[buf->index] = buf;
		st->lent_conn[buf->index] = (uint16_t)(c->id + 1);
	}
	op->buf = NULL;
	c->puts_sent++;
	wake_peer(c);
	return true;
}

static void pending_unlink(struct shm_conn *c, struct op *op)
{
	op_list_remove(&c->pending_head, &c->pending_tail, op);
}

static int flush_pending(struct ferry_engine *e, struct shm_conn *c)
{
	int n = 0;

	while (c->pending_head && !c->dead) {
		struct op *op = c->pending_head;

		if (!send_put(e, c, op))
			break;
		pending_unlink(c, op);
		n++;
	}
	return n;
}

static int shm_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct shm_conn *c = op->peer->transport;

	if (c->dead) {
		/*
		 * The connection this peer was resolved to died before this PUT
		 * (nothing of it was sent there): call again, the peer may be
		 * back (a new engine of its name), or give up.
		 */
		struct shm_conn *nc;

		if (conn_for(e, b, op->peer->name, &nc))
			return -ECONNRESET;
		conn_unref(c);
		op->peer->transport = c = nc;
	}
	if (op->buf && op->buf->pool != e->pool) {
		/* Another engine's block (same process): the peer maps only ours. */
		struct ferry_buf *own;
		int rc = pool_alloc(e->pool, op->len, &own);

		if (rc)
			return rc;
		ferry__payload_copy(own->data, op->buf->data, op->len);
		pool_free(op->buf);
		op->buf = own;
	}
	/*
	 * While it is being handed over, the op must not be found (and
	 * completed) by conn_fail should the peer's ring turn out bad: the
	 * reactor completes it once, from our return value.
	 */
	op->state = OP_FREE;
	if (likely(c->up) && !c->pending_head && send_put(e, c, op)) {
		op->state = OP_AWAY;
		return 0;
	}
	if (c->dead)
		return -ECONNRESET;
	op->state = OP_AWAY;
	/* No room, or the peer has not answered yet: wait in order behind the others. */
	op_list_append(&c->pending_head, &c->pending_tail, op);
	return 0;
}

static void shm_forget(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct shm_conn *c = op->peer->transport;

	(void)e;
	(void)b;
	/*
	 * Still waiting for ring room or the handshake: it never left (an
	 * AWAY op is in no other list).
	 */
	if (c && (op->prev || op->next || c->pending_head == op))
		pending_unlink(c, op);
}

/* ------------------------------------------------------------------ */
/* Releases of foreign blocks (any thread)                             */
/* ------------------------------------------------------------------ */

static void release_hook(struct ferry_buf *buf, void *ctx)
{
	struct shm_conn *c = ctx;
	struct shm_state *st;

	atomic_fetch_add(&c->users, 1);
	if (atomic_load(&c->closed)) {
		atomic_fetch_sub(&c->users, 1);
		pool_wrap_done(buf);
		conn_unref(c);
		return;
	}
	st = c->st;
	struct ferry_buf *head = atomic_load_explicit(&st->releases, memory_order_relaxed);

	do {
		atomic_store_explicit(&buf->release_next, head, memory_order_relaxed);
	} while (!atomic_compare_exchange_weak_explicit(&st->releases, &head, buf,
							memory_order_release,
							memory_order_relaxed));
	reactor_wake(st->engine);
	atomic_fetch_sub(&c->users, 1);
}

static int flush_releases(struct ferry_engine *e, struct shm_state *st)
{
	struct ferry_buf *list = atomic_exchange_explicit(&st->releases, NULL, memory_order_acquire);
	int n = 0;

	while (list) {
		struct ferry_buf *buf = list;
		struct shm_conn *c = buf->release_ctx;
		struct shm_ctrl d = { .type = SHM_C_RELEASE, .buf_cookie = buf->remote_cookie,
				      .offset = buf->offset };

		list = atomic_load_explicit(&buf->release_next, memory_order_relaxed);
		if (!c->dead && !send_ctrl(e, c, &d) && !c->dead) {
			/* No room yet: put it back for the next round. */
			struct ferry_buf *head = atomic_load(&st->releases);

			do {
				atomic_store(&buf->release_next, head);
			} while (!atomic_compare_exchange_weak(&st->releases, &head, buf));
			continue;
		}
		pool_wrap_done(buf);
		conn_unref(c);
		n++;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Receiving                                                           */
/* ------------------------------------------------------------------ */

static void free_lent(struct shm_state *st, uint64_t idx)
{
	struct ferry_buf *buf = st->lent[idx];

	st->lent[idx] = NULL;
	st->lent_conn[idx] = 0;
	st->lent_credit[idx] = 0;
	pool_free(buf);
}

static bool take_ctrl(struct ferry_engine *e, struct shm_conn *c, const struct shm_ctrl *d)
{
	struct shm_state *st = c->st;
	uint64_t idx = d->buf_cookie;
	bool lent_here = idx < st->max_bufs && st->lent_conn[idx] == c->id + 1 &&
			 st->lent[idx] && st->lent[idx]->offset == d->offset;

	switch (d->type) {
	case SHM_C_RESULT: {
		uint64_t oi = d->op_cookie >> 32;

		if (!lent_here || d->res > 0 || d->res < -4095)
			return false;
		if (d->res < 0)
			free_lent(st, idx); /* refused: the block is ours again */
		c->puts_taken++;
		if (oi < e->max_ops)
			reactor_put_done(e, &e->ops[oi], (uint32_t)d->op_cookie, d->res);
		return true;
	}
	case SHM_C_RESULT_FREE: {
		uint64_t oi = d->op_cookie >> 32, credit;

		if (!lent_here || d->res != 0)
			return false;
		credit = st->lent_credit[idx];
		free_lent(st, idx); /* taken by a copy: the block is ours again */
		c->puts_taken++;
		if (oi < e->max_ops)
			reactor_put_done(e, &e->ops[oi], (uint32_t)d->op_cookie, 0);
		if (credit) /* (a chunk never takes this path: no harm if one did) */
			stream_chunk_released(e, credit);
		return true;
	}
	case SHM_C_RESULT_INLINE: {
		uint64_t oi = d->op_cookie >> 32;
		struct op *op;

		if (oi >= e->max_ops || d->res > 0 || d->res < -4095)
			return false;
		op = &e->ops[oi];
		c->puts_taken++;
		/* Ours and still away at this peer (or a stale answer: ignored). */
		if (op->peer && op->peer->transport == c)
			reactor_put_done(e, op, (uint32_t)d->op_cookie, d->res);
		return true;
	}
	case SHM_C_RELEASE: {
		uint64_t credit;

		if (!lent_here)
			return false;
		credit = st->lent_credit[idx];
		free_lent(st, idx);
		if (credit)
			stream_chunk_released(e, credit);
		return true;
	}
	default:
		return false;
	}
}

/*
 * An inline PUT: its data is read in place from the entry, into a waiting
 * GET's iovec or into a block of our pool (like tcp's eager data: a full
 * pool refuses it with -ENOBUFS). Returns the RESULT's res.
 */
static int take_inline(struct ferry_engine *e, struct shm_conn *c, const char *fullkey, int n,
		       const void *src, uint64_t len, uint32_t flags)
{
	struct ferry_buf *buf;
	int rc;

	if (n < 0)
		return n;
	if (reactor_deliver_copy(e, fullkey, (size_t)n, src, len, flags))
		return 0;
	if (pool_alloc(e->pool, len, &buf)) {
		log_limited(FERRY__LOG_WARN, "shm: engine %s: pool full, refusing a %llu-byte PUT "
			    "from %s", e->name, (unsigned long long)len, c->peer_name);
		return -ENOBUFS;
	}
	ferry__payload_copy(buf->data, src, len);
	rc = reactor_deliver(e, NULL, fullkey, (size_t)n, buf, len, flags);
	if (rc)
		pool_free(buf);
	return rc;
}

/*
 * Take the PUT entry d (in the peer's ring): its fixed fields and key are
 * copied out first, then checked; only an inline PUT's data is read in
 * place afterwards (what the peer changes there meanwhile is its own loss).
 */
static bool take_put(struct ferry_engine *e, struct shm_conn *c, const struct shm_put_desc *d)
{
	uint16_t type = d->type, key_len = d->key_len;
	uint32_t flags = d->flags;
	uint64_t offset = d->offset, len = d->len;
	struct shm_ctrl res = { .type = SHM_C_RESULT, .op_cookie = d->op_cookie,
				.buf_cookie = d->buf_cookie, .offset = offset };
	char key[FERRY_KEY_MAX], fullkey[FULLKEY_MAX];
	struct ferry_buf *buf;
	int n, rc;

	if ((type != SHM_D_PUT && type != SHM_D_PUT_INLINE) || key_len == 0 ||
	    key_len >= FERRY_KEY_MAX || (flags & ~WIRE_F__ALL))
		return false;
	memcpy(key, d->body, key_len + 1u);
	if (key[key_len] != '\0' || strnlen(key, key_len) != key_len)
		return false;
	if (type == SHM_D_PUT_INLINE) {
		if (len > SHM_INLINE_MAX || (flags & WIRE_F_RELCREDIT))
			return false;
		n = keytable_compose(fullkey, key, key_len, c->peer_name, e->name);
		res.type = SHM_C_RESULT_INLINE;
		res.res = take_inline(e, c, fullkey, n, d->body + shm_inline_at(key_len), len, flags);
		send_ctrl(e, c, &res); /* room was checked by the caller */
		return true;
	}
	if (offset > c->peer_pool_size || len > c->peer_pool_size - offset)
		return false;
	n = keytable_compose(fullkey, key, key_len, c->peer_name, e->name);
	if (n >= 0 && c->peer_takes_result_free &&
	    reactor_deliver_copy(e, fullkey, (size_t)n, c->peer_pool + offset, len, flags)) {
		/* A GET into an iovec took a copy: the block goes back with the RESULT. */
		res.type = SHM_C_RESULT_FREE;
		res.res = 0;
		send_ctrl(e, c, &res); /* room was checked by the caller */
		return true;
	}
	rc = n < 0 ? n : pool_wrap(e->pool, (void *)(c->peer_pool + offset), len, offset,
				   release_hook, c, &buf);
	if (rc == 0) {
		buf->remote_cookie = res.buf_cookie;
		atomic_fetch_add(&c->refs, 1); /* the mapping lives while the block does */
		rc = reactor_deliver(e, NULL, fullkey, (size_t)n, buf, len, flags);
		if (rc) {
			pool_wrap_cancel(buf);
			conn_unref(c);
		}
	}
	res.res = rc;
	send_ctrl(e, c, &res); /* room was checked by the caller */
	return true;
}

/*
 * One connection's share of a round: its control entries, then its PUTs
 * (each needs control room for its RESULT), then what waits for PUT room.
 * The heads are published once at the end, with one fence before the
 * peer's sleep word is read.
 */
static int conn_progress(struct ferry_engine *e, struct shm_conn *c)
{
	uint32_t put_head = c->rx_put_head;
	bool published;
	int n = 0, ready;

	/* Control first: it never needs room anywhere. */
	for (int i = 0; i < SHM_PER_ROUND && (ready = ctrl_entry_state(c)) != 0; i++) {
		const struct shm_ctrl_desc *d = &c->rx->ctrls[c->rx_ctrl_head % SHM_CTRL_ENTRIES];
		struct shm_ctrl m;

		if (ready < 0) {
			conn_fail(e, c, "control entry out of sequence", -ECONNRESET);
			return n + 1;
		}
		m.type = d->type;
		m.res = d->res;
		m.op_cookie = d->op_cookie;
		m.buf_cookie = d->buf_cookie;
		m.offset = d->offset;
		c->rx_ctrl_head++;
		if (!take_ctrl(e, c, &m)) {
			conn_fail(e, c, "malformed control descriptor", -ECONNRESET);
			return n + 1;
		}
		n++;
	}
	if (n)
		atomic_store_explicit(&c->rx->ctrl.head, c->rx_ctrl_head, memory_order_release);
	for (int i = 0; i < SHM_PER_ROUND && (ready = put_entry_state(c)) != 0; i++) {
		int64_t room;

		if (ready < 0) {
			conn_fail(e, c, "PUT entry out of sequence", -ECONNRESET);
			return n + 1;
		}
		room = ctrl_room(c);
		if (room <= 0) {
			if (room < 0)
				conn_fail(e, c, "control ring head out of range", -ECONNRESET);
			break; /* its RESULT needs room: later */
		}
		if (!take_put(e, c, &c->rx->puts[c->rx_put_head % SHM_PUT_ENTRIES])) {
			conn_fail(e, c, "malformed PUT descriptor", -ECONNRESET);
			return n + 1;
		}
		c->rx_put_head++;
		n++;
		if (c->dead)
			return n; /* its control ring went bad under us */
	}
	if (c->rx_put_head != put_head)
		atomic_store_explicit(&c->rx->put.head, c->rx_put_head, memory_order_release);
	published = ctrl_published_since_check(c);
	if (n || published) {
		/*
		 * The peer may sleep: until our control entries come (it said so
		 * in its wake page), or until we make room (want_room). The fence
		 * pairs with its announcement before it looks at the rings.
		 */
		bool wake = published;

		atomic_thread_fence(memory_order_seq_cst);
		/* Both flags are cleared (no short circuit between them). */
		if (n && ((int)(atomic_load_explicit(&c->rx->put.want_room, memory_order_relaxed) &&
				atomic_exchange(&c->rx->put.want_room, 0)) |
			  (int)(atomic_load_explicit(&c->rx->ctrl.want_room, memory_order_relaxed) &&
				atomic_exchange(&c->rx->ctrl.want_room, 0))))
			wake = true;
		if (wake && atomic_load_explicit(&c->peer_wake->sleeping, memory_order_relaxed) &&
		    !atomic_exchange(&c->peer_wake->doorbell_rung, 1))
			ring_peer(c);
	}
	n += flush_pending(e, c);
	return n;
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

static bool other_live_conn(struct shm_state *st, struct shm_conn *c)
{
	for (uint32_t i = 0; i < st->nlive; i++) {
		struct shm_conn *o = st->live[i];

		if (o != c && !o->dead && strcmp(o->peer_name, c->peer_name) == 0)
			return true;
	}
	return false;
}

/*
 * The peer is gone (or broke the protocol): its ops fail, the blocks it
 * held come back, GETs waiting on it give up. Blocks it lent us stay
 * mapped until the application releases them.
 */
static void conn_fail(struct ferry_engine *e, struct shm_conn *c, const char *why, int res)
{
	struct shm_state *st = c->st;
	bool others;

	if (c->dead)
		return;
	c->dead = true;
	if (why)
		log_warn("shm: engine %s: disconnecting %s: %s", e->name, c->peer_name, why);
	while (c->pending_head) {
		struct op *op = c->pending_head;

		pending_unlink(c, op);
		op->state = OP_FREE;
		op_complete(e, op, res, 0, NULL);
	}
	if (!c->up) {
		/*
		 * A call that never got its answer: only the PUTs queued on it
		 * knew of it (no block was lent, nothing arrived through it).
		 */
		st->nconnecting--;
		if (c->sock >= 0)
			shutdown(c->sock, SHUT_RDWR); /* ends its poll */
		atomic_store(&c->closed, 1);
		return;
	}
	others = other_live_conn(st, c);
	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *op = &e->ops[i];

		if (op->state == OP_AWAY && op->peer && op->peer->transport == c) {
			op->state = OP_FREE;
			op_complete(e, op, res, 0, NULL);
		} else if (op->state == OP_PARKED && !others && op->peer &&
			   strcmp(op->peer->name, c->peer_name) == 0) {
			op_complete(e, op, res, 0, NULL);
		}
	}
	if (!others)
		ferry__peer_event(e, st->b, c->peer_name, PEER_LOST, res); /* its streams */
	for (uint32_t i = 0; i < st->max_bufs; i++)
		if (st->lent_conn[i] == c->id + 1)
			free_lent(st, i);
	atomic_store(&c->closed, 1);
	while (atomic_load(&c->users))
		cpu_relax();
	/*
	 * Tell the peer now: the socket may outlive this (blocks it lent us
	 * keep the connection's memory), but the conversation is over.
	 */
	shutdown(c->sock, SHUT_RDWR);
	/* The table keeps its reference until conn_reap: callers still use c. */
}

static void conn_reap(struct shm_state *st, struct shm_conn *c)
{
	for (uint32_t i = 0; i < st->nlive; i++) {
		if (st->live[i] == c) {
			st->live[i] = st->live[--st->nlive];
			break;
		}
	}
	st->conns[c->id] = NULL;
	conn_unref(c); /* the table's reference */
}

/* ------------------------------------------------------------------ */
/* Connection setup                                                    */
/* ------------------------------------------------------------------ */

/* Is fd an eventfd (the only doorbell a peer may hand us)? */
static bool is_eventfd(int fd)
{
	char path[64], link[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return false;
	link[n] = '\0';
	return strcmp(link, "anon_inode:[eventfd]") == 0;
}

/*
 * The size of a memfd a peer handed us, which must be sealed against
 * shrinking: a region that shrank under our mapping would fault when read.
 */
static int fd_size(int fd, uint64_t *size)
{
	struct stat sb;
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		log_error("shm: a peer's memory is not sealed against shrinking: refused");
		return -EPROTO;
	}
	if (fstat(fd, &sb) < 0) {
		int rc = -errno;

		log_error("shm: fstat of a peer's memory: %s", strerror(-rc));
		return rc;
	}
	*size = (uint64_t)sb.st_size;
	return 0;
}

static void fill_hello(struct ferry_engine *e, struct shm_hello *h)
{
	memset(h, 0, sizeof(*h));
	snprintf(h->ns, sizeof(h->ns), "%s", e->ns);
	snprintf(h->name, sizeof(h->name), "%s", e->name);
	h->pool_size = pool_size(e->pool);
	h->ring_entries = SHM_PUT_ENTRIES;
	h->caps = SHM_CAP_RESULT_FREE;
	h->ring_bytes = (uint32_t)SHM_RINGS_BYTES;
}

/* A connection not yet up, in a free slot; NULL (logged) when none is free. */
static struct shm_conn *conn_new(struct ferry_engine *e, struct shm_state *st, int sock,
				 const char *peer_name)
{
	struct shm_conn *c;
	uint32_t slot;

	for (slot = 0; slot < SHM_MAX_CONNS && st->conns[slot]; slot++)
		;
	if (slot == SHM_MAX_CONNS) {
		log_error("shm: engine %s: more than %u connections", e->name, SHM_MAX_CONNS);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		log_error("shm: engine %s: out of memory for a connection", e->name);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	c->id = slot;
	c->st = st;
	c->sock = sock;
	c->ring_fd = -1;
	c->peer_doorbell = -1;
	snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer_name);
	c->gen = ++st->next_gen;
	st->conns[slot] = c;
	return c;
}

/*
 * The peer's hello came: check it, take its fds [pool, doorbell, wake] and,
 * from a caller, [rings], and bring the connection up (st->live, its
 * socket watched for the hang-up). Closes every fd of fds; on failure c is
 * left as it was (not up), for the caller to drop.
 */
static int conn_attach(struct ferry_engine *e, struct backend *b, struct shm_conn *c,
		       const struct shm_hello *h, int *fds, unsigned nfds, bool connector)
{
	struct shm_state *st = b->data;
	uint64_t sz;
	int rc = -EPROTO;

	if (strcmp(h->ns, e->ns) != 0 || h->ring_entries != SHM_PUT_ENTRIES ||
	    h->ring_bytes != SHM_RINGS_BYTES || nfds != (connector ? 3u : 4u)) {
		log_error("shm: engine %s: hello from %s does not match (namespace %s, ring %u/%u, "
			  "%u fds)", e->name, h->name, h->ns, h->ring_entries, h->ring_bytes, nfds);
		goto out;
	}
	if (!is_eventfd(fds[1])) {
		log_error("shm: the doorbell %s sent is not an eventfd: refused", h->name);
		goto out;
	}
	c->peer_doorbell = fds[1];
	fds[1] = -1;
	c->peer_takes_result_free = (h->caps & SHM_CAP_RESULT_FREE) != 0;
	/* Every refusal below logs its line (fd_size its own): an acceptor says nothing else. */
	if (fd_size(fds[0], &sz))
		goto out;
	if (sz < h->pool_size || h->pool_size == 0) {
		log_error("shm: pool of %s: %llu bytes, announced %llu", h->name,
			  (unsigned long long)sz, (unsigned long long)h->pool_size);
		goto out;
	}
	c->peer_pool = mmap(NULL, h->pool_size, PROT_READ, MAP_SHARED, fds[0], 0);
	if (c->peer_pool == MAP_FAILED) {
		c->peer_pool = NULL;
		rc = -errno;
		log_error("shm: mapping the pool of %s: %s", h->name, strerror(-rc));
		goto out;
	}
	c->peer_pool_size = h->pool_size;
	if (fd_size(fds[2], &sz))
		goto out;
	if (sz < 4096) {
		log_error("shm: the wake page %s sent is %llu bytes, less than 4096: refused",
			  h->name, (unsigned long long)sz);
		goto out;
	}
	c->peer_wake = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
	if (c->peer_wake == MAP_FAILED) {
		c->peer_wake = NULL;
		rc = -errno;
		log_error("shm: mapping the wake page of %s: %s", h->name, strerror(-rc));
		goto out;
	}
	if (!connector) {
		void *rings;

		if (fd_size(fds[3], &sz))
			goto out;
		if (sz != SHM_RINGS_BYTES) {
			log_error("shm: the rings %s sent are %llu bytes, not %llu: refused",
				  h->name, (unsigned long long)sz,
				  (unsigned long long)SHM_RINGS_BYTES);
			goto out;
		}
		rings = mmap(NULL, SHM_RINGS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fds[3], 0);
		if (rings == MAP_FAILED) {
			rc = -errno;
			log_error("shm: mapping the rings of %s: %s", h->name, strerror(-rc));
			goto out;
		}
		c->rings = rings;
	}
	c->tx = &c->rings->dir[connector ? 0 : 1];
	c->rx = &c->rings->dir[connector ? 1 : 0];
	c->up = true;
	st->live[st->nlive++] = c;
	arm_poll(e, b, c->sock, conn_cookie(c));
	log_debug("shm: engine %s connected to %s (%s)", e->name, c->peer_name,
		  connector ? "we called" : "it called");
	rc = 0;
out:
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Handshakes: the timer                                               */
/* ------------------------------------------------------------------ */

/* While any handshake is under way, look at the bounds every SHM_TICK_MS. */
static void arm_tick(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	struct io_uring_sqe *sqe;

	if (st->tick_armed || (!st->nhalf_open && !st->nconnecting))
		return;
	sqe = ring_sqe(e);
	if (!sqe) {
		log_limited(FERRY__LOG_ERROR, "shm: io_uring full, handshake timer not armed "
			    "(tried again next round)");
		return;
	}
	st->tick_ts.tv_sec = 0;
	st->tick_ts.tv_nsec = SHM_TICK_MS * 1000000ll;
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, backend_tag(b, COOKIE_TICK));
	io_uring_submit(&e->ring);
	st->tick_armed = true;
}

/* ------------------------------------------------------------------ */
/* Handshakes: someone calls us                                        */
/* ------------------------------------------------------------------ */

/*
 * An accepted caller's hello came (rc 0) or will never come (rc < 0):
 * answer a health request, or answer with our hello and bring the
 * connection up, or hang up. Takes fd and the fds received.
 */
static void accept_hello(struct ferry_engine *e, struct backend *b, int fd, int rc,
			 const struct shm_hello *h, int *fds, unsigned nfds)
{
	struct shm_state *st = b->data;
	int ours[3] = { pool_fd(e->pool), e->doorbell_fd, e->wake_fd };
	struct shm_hello me;
	struct shm_conn *c = NULL;

	if (rc) {
		log_limited(FERRY__LOG_WARN, "shm: engine %s: refused a caller: %s", e->name,
			    ferry_strerror(rc));
		close(fd);
		return;
	}
	if ((h->caps & SHM_CAP_HEALTH) && nfds == 0) {
		shm_health_answer(e, fd); /* `ferry health`: one answer, then hang up */
		close(fd);
		return;
	}
	fill_hello(e, &me);
	if (shm_sock_send_hello(fd, &me, ours, 3) != 0 || !(c = conn_new(e, st, fd, h->name))) {
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		close(fd);
		return;
	}
	if (conn_attach(e, b, c, h, fds, nfds, false) != 0)
		conn_reap(st, c); /* nobody else knew of it; closes fd */
}

static uint64_t half_open_cookie(const struct shm_state *st, uint32_t slot)
{
	return ((uint64_t)st->half_open[slot].gen << 16) | (COOKIE_HALF_OPEN + slot);
}

/* Take fd out of half-open slot i (it stays open). */
static int half_open_take(struct shm_state *st, uint32_t i)
{
	int fd = st->half_open[i].fd;

	st->half_open[i].fd = -1;
	st->nhalf_open--;
	return fd;
}

static void half_open_close(struct shm_state *st, uint32_t i)
{
	int fd = half_open_take(st, i);

	shutdown(fd, SHUT_RDWR); /* ends its poll */
	close(fd);
}

/*
 * A caller was accepted: its hello is normally there already. If not, it
 * waits in a half-open slot, its socket polled, for SHM_ACCEPT_HELLO_MS;
 * when every slot is taken, the oldest is hung up on to make room.
 */
static void accept_caller(struct ferry_engine *e, struct backend *b, int fd)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS];
	unsigned nfds = SHM_MAX_FDS, i;
	int rc = shm_sock_try_recv_hello(fd, &h, fds, &nfds);

	if (rc != -EAGAIN) {
		accept_hello(e, b, fd, rc, &h, fds, nfds);
		return;
	}
	if (st->nhalf_open == SHM_HALF_OPEN_MAX) {
		/*
		 * Full: the oldest goes. A caller that means it sends its hello
		 * right after connecting, so a flood of silent ones cannot keep
		 * it out; refusing the newest could (it may be accepted in the
		 * moment between its connect and its hello).
		 */
		uint32_t oldest = 0;

		for (i = 1; i < SHM_HALF_OPEN_MAX; i++)
			if (st->half_open[i].deadline < st->half_open[oldest].deadline)
				oldest = i;
		log_limited(FERRY__LOG_WARN, "shm: engine %s: %u callers have not sent their hello "
			    "yet; hanging up on the oldest", e->name, SHM_HALF_OPEN_MAX);
		half_open_close(st, oldest);
	}
	for (i = 0; st->half_open[i].fd >= 0; i++)
		;
	st->half_open[i].fd = fd;
	st->half_open[i].gen = ++st->next_gen;
	st->half_open[i].deadline = ferry__now_ns() + SHM_ACCEPT_HELLO_MS * 1000000ull;
	st->nhalf_open++;
	arm_poll(e, b, fd, half_open_cookie(st, i));
	arm_tick(e, b);
}

/* The socket of half-open slot i woke up (res: the poll's revents or an error). */
static void half_open_cqe(struct ferry_engine *e, struct backend *b, uint32_t i, uint32_t gen,
			  int res)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS], rc;
	unsigned nfds = SHM_MAX_FDS;

	if (i >= SHM_HALF_OPEN_MAX || st->half_open[i].fd < 0 || st->half_open[i].gen != gen)
		return; /* a slot already closed (its poll ended with the shutdown) */
	memset(&h, 0, sizeof(h));
	rc = res < 0 ? res : shm_sock_try_recv_hello(st->half_open[i].fd, &h, fds, &nfds);
	if (rc == -EAGAIN) {
		if (!(res & (POLLHUP | POLLRDHUP | POLLERR))) {
			arm_poll(e, b, st->half_open[i].fd, half_open_cookie(st, i));
			return;
		}
		rc = -ECONNRESET;
	}
	if (rc)
		nfds = 0;
	accept_hello(e, b, half_open_take(st, i), rc, &h, fds, nfds);
}

static void accept_all(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;

	for (;;) {
		int fd = shm_sock_accept(st->lis.fd);

		if (fd == -EAGAIN)
			break;
		if (fd < 0) {
			if (fd == -EPERM)
				continue;
			break;
		}
		accept_caller(e, b, fd);
	}
}

/* ------------------------------------------------------------------ */
/* Handshakes: we call                                                 */
/* ------------------------------------------------------------------ */

/*
 * The call failed (why) or ran out of time: the PUTs queued on it fail with
 * -EHOSTUNREACH, and the peers it carried are resolved again by their next
 * PUT.
 */
static void call_fail(struct ferry_engine *e, struct backend *b, struct shm_conn *c,
		      const char *why)
{
	log_warn("shm: engine %s: handshake with %s: %s", e->name, c->peer_name, why);
	conn_fail(e, c, NULL, -EHOSTUNREACH);
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
		if (p->backend == b && p->transport == c)
			reactor_unresolve(e, p);
	conn_reap(b->data, c);
}

/*
 * Our call got through (c->sock): send our hello with our pool, doorbell
 * and wake page, and the rings, then watch the socket for the answer.
 */
static int call_hello(struct ferry_engine *e, struct backend *b, struct shm_conn *c)
{
	int ours[4] = { pool_fd(e->pool), e->doorbell_fd, e->wake_fd, c->ring_fd };
	struct shm_hello me;
	int rc;

	fill_hello(e, &me);
	rc = shm_sock_send_hello(c->sock, &me, ours, 4);
	if (rc)
		return rc;
	close(c->ring_fd);
	c->ring_fd = -1;
	arm_poll(e, b, c->sock, conn_cookie(c));
	return 0;
}

/*
 * Call the engine called name: connect (without waiting: a full accept
 * queue is tried again by the timer) and send our hello. The connection
 * waits for the answer, not up, PUTs queueing on it; call_answered or the
 * timer ends the wait. -EHOSTUNREACH at once when nobody holds the name.
 */
static int call_start(struct ferry_engine *e, struct backend *b, const char *name,
		      struct shm_conn **out)
{
	struct shm_state *st = b->data;
	struct shm_rings *rings;
	struct shm_conn *c;
	int ringfd, sock, rc;

	sock = shm_sock_connect_nowait(e->ns, name);
	if (sock < 0 && sock != -EAGAIN)
		return sock;
	ringfd = memfd_create("ferry-shm-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ringfd < 0 || ftruncate(ringfd, (off_t)SHM_RINGS_BYTES) < 0 ||
	    fcntl(ringfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = -errno;
		goto fail;
	}
	rings = mmap(NULL, SHM_RINGS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, ringfd, 0);
	if (rings == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	c = conn_new(e, st, sock >= 0 ? sock : -1, name);
	if (!c) {
		munmap(rings, SHM_RINGS_BYTES);
		rc = -EMFILE;
		goto fail;
	}
	c->rings = rings;
	c->ring_fd = ringfd;
	c->connect_again = sock == -EAGAIN;
	c->hs_deadline = ferry__now_ns() + SHM_HANDSHAKE_MS * 1000000ull;
	st->nconnecting++;
	if (sock >= 0 && (rc = call_hello(e, b, c)) != 0) {
		log_info("shm: engine %s: calling %s: %s", e->name, name, ferry_strerror(rc));
		conn_fail(e, c, NULL, rc); /* nothing waits on it yet */
		conn_reap(st, c);
		return rc;
	}
	arm_tick(e, b);
	*out = c;
	return 0;
fail:
	log_error("shm: engine %s: calling %s: %s", e->name, name, ferry_strerror(rc));
	if (ringfd >= 0)
		close(ringfd);
	if (sock >= 0)
		close(sock);
	return rc;
}

/* The socket of a call under way woke up: the answer, or the end of it. */
static void call_answered(struct ferry_engine *e, struct backend *b, struct shm_conn *c, int res)
{
	struct shm_state *st = b->data;
	struct shm_hello h;
	int fds[SHM_MAX_FDS], rc;
	unsigned nfds = SHM_MAX_FDS;

	rc = res < 0 ? res : shm_sock_try_recv_hello(c->sock, &h, fds, &nfds);
	if (rc == -EAGAIN) {
		if (!(res & (POLLHUP | POLLRDHUP | POLLERR))) {
			arm_poll(e, b, c->sock, conn_cookie(c));
			return;
		}
		rc = -ECONNRESET;
	}
	if (rc == 0 && strcmp(h.name, c->peer_name) != 0) {
		log_error("shm: called %s, %s answered", c->peer_name, h.name);
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		rc = -EPROTO;
	}
	if (rc == 0)
		rc = conn_attach(e, b, c, &h, fds, nfds, true);
	if (rc) {
		call_fail(e, b, c, rc == -ECONNRESET ? "it hung up" : ferry_strerror(rc));
		return;
	}
	st->nconnecting--;
	flush_pending(e, c); /* what was queued meanwhile, in order */
}

/* The timer: bounds of half-open accepts and of calls, calls to try again. */
static void handshakes_check(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	uint64_t now = ferry__now_ns();

	for (uint32_t i = 0; i < SHM_HALF_OPEN_MAX && st->nhalf_open; i++) {
		if (st->half_open[i].fd >= 0 && now >= st->half_open[i].deadline) {
			log_limited(FERRY__LOG_WARN, "shm: engine %s: a caller sent no hello "
				    "within %d ms: hung up", e->name, SHM_ACCEPT_HELLO_MS);
			half_open_close(st, i);
		}
	}
	for (uint32_t i = 0; i < SHM_MAX_CONNS && st->nconnecting; i++) {
		struct shm_conn *c = st->conns[i];
		int sock;

		if (!c || c->up || c->dead)
			continue;
		if (now >= c->hs_deadline) {
			char why[64];

			snprintf(why, sizeof(why), "%s %d ms",
				 c->connect_again ? "its accept queue stayed full for" :
						    "no answer within",
				 SHM_HANDSHAKE_MS);
			call_fail(e, b, c, why);
			continue;
		}
		if (!c->connect_again)
			continue;
		sock = shm_sock_connect_nowait(e->ns, c->peer_name);
		if (sock == -EAGAIN)
			continue;
		if (sock < 0) {
			call_fail(e, b, c, ferry_strerror(sock));
			continue;
		}
		c->sock = sock;
		c->connect_again = false;
		if ((sock = call_hello(e, b, c)) != 0)
			call_fail(e, b, c, ferry_strerror(sock));
	}
}

/* ------------------------------------------------------------------ */
/* The backend                                                         */
/* ------------------------------------------------------------------ */

/*
 * The connection that carries PUTs to the engine called name, with a
 * reference for the caller: one up, else a call under way (its PUTs
 * queue), else a new call. Up first, since both engines may have called
 * each other. 0, or -EHOSTUNREACH.
 */
static int conn_for(struct ferry_engine *e, struct backend *b, const char *name,
		    struct shm_conn **out)
{
	struct shm_state *st = b->data;
	struct shm_conn *c = NULL;

	for (uint32_t i = 0; i < SHM_MAX_CONNS && !(c && c->up); i++) {
		struct shm_conn *o = st->conns[i];

		if (o && !o->dead && strcmp(o->peer_name, name) == 0 && (!c || o->up))
			c = o;
	}
	if (!c && call_start(e, b, name, &c) != 0)
		return -EHOSTUNREACH;
	atomic_fetch_add(&c->refs, 1);
	*out = c;
	return 0;
}

static int shm_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct shm_conn *c;
	int rc = conn_for(e, b, peer->name, &c);

	if (rc == 0)
		peer->transport = c;
	return rc;
}

static void shm_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	(void)b;
	if (peer->transport)
		conn_unref(peer->transport);
	peer->transport = NULL;
}

static int shm_progress(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	int n = 0;

	if (atomic_load_explicit(&st->releases, memory_order_relaxed))
		n += flush_releases(e, st);
	if (unlikely((st->nhalf_open | st->nconnecting) && !st->tick_armed))
		arm_tick(e, b); /* its SQE could not be had before: try again */
	for (uint32_t i = 0; i < st->nlive;) {
		struct shm_conn *c = st->live[i];

		if (!c->dead)
			n += conn_progress(e, c);
		if (c->dead)
			conn_reap(st, c); /* moves the last one here */
		else
			i++;
	}
	return n;
}

/*
 * Before sleeping with work that waits for room in a ring the peer drains:
 * say so, then look again (the peer rings us when it sees want_room).
 */
static bool room_appeared(struct shm_ring_ctl *r, uint32_t entries, uint32_t tail,
			  uint32_t *head_seen)
{
	atomic_store(&r->want_room, 1);
	atomic_thread_fence(memory_order_seq_cst);
	return ring_room(r, entries, tail, head_seen) != 0;
}

static bool ctrl_room_appeared(struct shm_conn *c)
{
	return room_appeared(&c->tx->ctrl, SHM_CTRL_ENTRIES, c->ctrl_tail, &c->ctrl_head_seen);
}

/* Some queued release can be sent (its peer's control ring has room, or is gone). */
/* Room in c's control ring now; ask: or say we want it (before a sleep), then look again. */
static bool ctrl_room_now(struct shm_conn *c, bool ask)
{
	return ctrl_room(c) != 0 || (ask && ctrl_room_appeared(c));
}

static bool releases_can_move(struct shm_state *st, bool ask)
{
	if (st->nlive == 0)
		return true; /* only gone peers: nothing to wait for */
	for (uint32_t i = 0; i < st->nlive; i++) {
		struct shm_conn *c = st->live[i];

		if (c->dead || ctrl_room_now(c, ask))
			return true;
	}
	return false;
}

/*
 * Work for progress now? ask (before a sleep): where work waits for room in
 * a ring the peer drains, tell the peer to ring us when it makes room.
 */
static bool shm_look(struct shm_state *st, bool ask)
{
	for (uint32_t i = 0; i < st->nlive; i++) {
		struct shm_conn *c = st->live[i];

		if (c->dead)
			return true; /* to be reaped */
		if (ctrl_entry_state(c) != 0)
			return true; /* ready, or garbage to disconnect */
		/* PUTs to take need control room for their RESULT. */
		if (put_entry_state(c) != 0 && ctrl_room_now(c, ask))
			return true;
		if (c->pending_head &&
		    (put_room(c) != 0 ||
		     (ask && room_appeared(&c->tx->put, SHM_PUT_ENTRIES, c->put_tail,
					   &c->put_head_seen))))
			return true;
	}
	/* Releases wait for control room, which the loop above asked for. */
	return atomic_load_explicit(&st->releases, memory_order_relaxed) &&
	       releases_can_move(st, ask);
}

static bool shm_has_work(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	return shm_look(b->data, false);
}

static bool shm_prepare_sleep(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	return shm_look(b->data, true);
}

static void shm_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
		       uint32_t flags)
{
	struct shm_state *st = b->data;

	uint32_t low = (uint32_t)(cookie & 0xffff), gen = (uint32_t)(cookie >> 16);

	(void)flags;
	if (!st)
		return; /* after fini */
	if (low == COOKIE_LISTENER) {
		if (!st->lis.live || res == -ECANCELED)
			return;
		if (res >= 0)
			accept_all(e, b);
		arm_poll(e, b, st->lis.fd, COOKIE_LISTENER);
		return;
	}
	if (low == COOKIE_TICK) {
		st->tick_armed = false;
		handshakes_check(e, b);
		arm_tick(e, b);
		return;
	}
	if (low >= COOKIE_HALF_OPEN) {
		half_open_cqe(e, b, low - COOKIE_HALF_OPEN, gen, res);
		return;
	}
	{
		uint32_t slot = low - 1;
		struct shm_conn *c = slot < SHM_MAX_CONNS ? st->conns[slot] : NULL;

		if (!c || c->gen != gen)
			return; /* a connection already gone */
		if (!c->up) {
			if (!c->dead)
				call_answered(e, b, c, res);
			return;
		}
		/*
		 * After the hello, the socket only speaks by hanging up. What the
		 * peer wrote into the rings before it went (its last RESULTs and
		 * RELEASEs, PUTs already sent) is taken first.
		 */
		if (res >= 0 && (res & (POLLHUP | POLLRDHUP | POLLERR)) && !c->dead)
			conn_progress(e, c);
		if (res < 0) {
			conn_fail(e, c, ferry_strerror(res), -ECONNRESET);
		} else if (res & (POLLHUP | POLLRDHUP | POLLERR)) {
			if (!c->dead)
				log_info("shm: engine %s: %s went away", e->name, c->peer_name);
			conn_fail(e, c, NULL, -ECONNRESET); /* a peer leaving is no error */
		} else {
			conn_fail(e, c, "unexpected data on its socket", -ECONNRESET);
		}
		conn_reap(st, c);
	}
}

static int shm_init(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = calloc(1, sizeof(*st));
	int rc;

	if (!st)
		return -ENOMEM;
	st->engine = e;
	st->b = b;
	st->max_bufs = e->max_bufs;
	st->lent = calloc(st->max_bufs, sizeof(*st->lent));
	st->lent_conn = calloc(st->max_bufs, sizeof(*st->lent_conn));
	st->lent_credit = calloc(st->max_bufs, sizeof(*st->lent_credit));
	if (!st->lent || !st->lent_conn || !st->lent_credit) {
		rc = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < SHM_HALF_OPEN_MAX; i++)
		st->half_open[i].fd = -1;
	shm_sock_sweep(e->ns); /* leftovers of crashed engines */
	rc = shm_sock_listen(e->ns, e->name, &st->lis);
	if (rc < 0)
		goto fail;
	b->data = st;
	arm_poll(e, b, st->lis.fd, COOKIE_LISTENER);
	return 0;
fail:
	free(st->lent);
	free(st->lent_conn);
	free(st->lent_credit);
	free(st);
	return rc;
}

static void shm_fini(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;

	if (!st)
		return;
	shm_sock_unlisten(&st->lis);
	for (uint32_t i = 0; i < SHM_HALF_OPEN_MAX; i++)
		if (st->half_open[i].fd >= 0)
			half_open_close(st, i);
	for (uint32_t i = 0; i < SHM_MAX_CONNS; i++) {
		if (st->conns[i]) {
			conn_fail(e, st->conns[i], NULL, -ECANCELED);
			conn_reap(st, st->conns[i]);
		}
	}
	/* Releases queued before the connections closed. */
	for (struct ferry_buf *buf = atomic_exchange(&st->releases, NULL), *next; buf; buf = next) {
		next = atomic_load(&buf->release_next);
		pool_wrap_done(buf);
		conn_unref(buf->release_ctx);
	}
	reactor_unresolve_all(e, b);
	free(st->lent);
	free(st->lent_conn);
	free(st->lent_credit);
	free(st);
	b->data = NULL;
}

const struct backend_ops ferry__shm_backend = {
	.name = "shm",
	.rank = 30,
	.caps = TRANSPORT_CAP_SAME_HOST | TRANSPORT_CAP_ZERO_COPY | TRANSPORT_CAP_MEM_HOST,
	.init = shm_init,
	.fini = shm_fini,
	.resolve = shm_resolve,
	.unresolve = shm_unresolve,
	.put = shm_put,
	.iov_put_max = SHM_INLINE_MAX,
	.progress = shm_progress,
	.has_work = shm_has_work,
	.prepare_sleep = shm_prepare_sleep,
	.forget = shm_forget,
	.on_cqe = shm_on_cqe,
};

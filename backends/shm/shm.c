/*
 * backends/shm/shm.c - the shared-memory transport: engines in different
 * processes of one host. This file: the backend's entry points and its data
 * path (the hot path: every PUT, entry, RESULT and RELEASE goes through here).
 *
 * Owns: the backend's table of operations, its init and fini and its
 * io_uring completions (handed on to the files below); the descriptor
 * rings in shared memory that carry PUTs and their results (sending,
 * receiving, the sleep and wake of both sides), the reading of each peer's
 * pool through its read-only mapping, and the accounting of blocks lent to
 * peers. The connections themselves (their lifetime, finding one for a
 * peer, what happens when a peer dies or misbehaves) are shm_conn.c's;
 * their handshakes (calling, accepting, the hello's checks and mappings,
 * the handshake timer) shm_handshake.c's; the socket, the names and the
 * hello message shm_sock.c's; `ferry health` shm_health.c's. What they
 * share: shm_int.h.
 *
 * Handshakes never block a round, and the data path never looks at
 * handshake state: only connections that are up are in st->live. PUTs to
 * a peer that has not answered yet wait, in order, on its connection's
 * pending list (shm_handshake.c sends them when it comes up).
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
 * A CUDA IPC descriptor (WIRE_F_CUDA_IPC, backends/cuda: the data is the
 * sender's device memory, named by handle) always goes as a block, is never
 * copied out at arrival, and its PUT ends at that RELEASE (the receiver's
 * copy from the sender's memory is done), not at its RESULT.
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
#include "shm_int.h"
#include "shm_sock.h"
#include "shm_wire.h"


#define SHM_PER_ROUND 256

/* A control entry's content, as we build it or copied out of a peer's ring. */
struct shm_ctrl {
	uint16_t type;
	int32_t res;
	uint64_t op_cookie;
	uint64_t buf_cookie;
	uint64_t offset;
};

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
	fence_light(c->peer_sleeps_heavy); /* pairs with the peer's announce_sleep */
	if (atomic_load_explicit(&c->peer_wake->sleeping, memory_order_relaxed) &&
	    !atomic_exchange(&c->peer_wake->doorbell_rung, 1))
		ring_peer(c);
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

/*
 * The sequence word an entry of a ring we consume holds while it is not
 * ready: the previous lap's (0 on the first lap, untouched memory).
 */
static inline uint32_t entry_not_yet(uint32_t head, uint32_t entries)
{
	return head < entries ? 0 : head + 1u - entries;
}

/*
 * Nothing for conn_progress: neither ring holds its next entry (ready or
 * garbage: anything but the previous lap's word), no control entry awaits
 * the wake check, no PUT waits for room. Most rounds of a live connection
 * end here, without conn_progress's frame.
 */
static inline bool conn_quiet(const struct shm_conn *c)
{
	uint32_t ch = c->rx_ctrl_head, ph = c->rx_put_head;

	return atomic_load_explicit(&c->rx->ctrls[ch % SHM_CTRL_ENTRIES].seq,
				    memory_order_relaxed) == entry_not_yet(ch, SHM_CTRL_ENTRIES) &&
	       atomic_load_explicit(&c->rx->puts[ph % SHM_PUT_ENTRIES].seq,
				    memory_order_relaxed) == entry_not_yet(ph, SHM_PUT_ENTRIES) &&
	       c->ctrl_tail == c->ctrl_published && !c->pending_head;
}

static int64_t ctrl_room(struct shm_conn *c)
{
	return ring_room(&c->tx->ctrl, SHM_CTRL_ENTRIES, c->ctrl_tail, &c->ctrl_head_seen);
}

static int64_t put_room(struct shm_conn *c)
{
	return ring_room(&c->tx->put, SHM_PUT_ENTRIES, c->put_tail, &c->put_head_seen);
}

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
		shm_conn_fail(e, c, "control ring head out of range", -ECONNRESET);
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
	bool inline_data = op->len <= SHM_INLINE_MAX && !credit && !(op->flags & WIRE_F_CUDA_IPC);

	if (room < 0) {
		shm_conn_fail(e, c, "PUT ring head out of range", -ECONNRESET);
		return false;
	}
	if (room == 0)
		return false;
	d = &c->tx->puts[c->put_tail % SHM_PUT_ENTRIES];
	d->flags = op->flags & (WIRE_F__ALL | WIRE_F_CUDA_IPC);
	d->op_cookie = ((uint64_t)op->index << 32) | op->gen;
	/* A CUDA IPC descriptor's op->len is the data it names: its block is what goes. */
	d->len = (op->flags & WIRE_F_CUDA_IPC) ? buf->len : op->len;
	d->key_len = op->key_len;
	copy_short(d->body, op->key, op->key_len + 1u);
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
		/* A CUDA IPC descriptor: the PUT ends when the peer gives it back. */
		st->lent_ipc[buf->index] = (op->flags & WIRE_F_CUDA_IPC) ? SHM_LENT_IPC | d->op_cookie : 0;
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

		if (shm_conn_for(e, b, op->peer->name, &nc))
			return -ECONNRESET;
		shm_conn_unref(c);
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
	 * completed) by shm_conn_fail should the peer's ring turn out bad: the
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
/* Device copies out of a peer's pool                                  */
/* ------------------------------------------------------------------ */

static void release_hook(struct ferry_buf *buf, void *ctx);

/*
 * A device copy is about to read buf: when it is a block of a peer's pool
 * (mapped here read-only, so pageable to CUDA in this process), that whole
 * mapping is pinned, once per connection (cudaHostRegister with the
 * read-only flag: the first time costs as much as pinning the peer's pool
 * size; a copy of 190 MiB from pageable memory cost ~4x a pinned one on an
 * H200), and shm_conn_free unpins it before the unmap. A refusal is said
 * once per connection, and its copies read the pool at pageable speed.
 */
static void shm_dma_source(struct ferry_engine *e, struct backend *b, struct ferry_buf *buf)
{
	struct shm_state *st = b->data;
	struct shm_conn *c;
	const char *why = "";
	uint64_t t0;
	int rc;

	if (!(buf->flags & POOL_BUF_F_FOREIGN) || buf->release_fn != release_hook)
		return;
	c = buf->release_ctx; /* held by buf: the mapping stays while we pin it */
	if (atomic_load_explicit(&c->dma_pin, memory_order_relaxed))
		return;
	t0 = ferry__now_ns();
	rc = memory_dma_pin(c->peer_pool, c->peer_pool_size, &why);
	atomic_store(&c->dma_pin, rc == 0 ? 1 : -1);
	if (rc == 0) {
		STAT_ADD(st->dma_pins, 1);
		log_info("shm: engine %s: %s's pool (%llu bytes) pinned here for device copies "
			 "(%.1f ms)", e->name, c->peer_name, (unsigned long long)c->peer_pool_size,
			 (ferry__now_ns() - t0) / 1e6);
	} else {
		STAT_ADD(st->dma_refusals, 1);
		log_warn("shm: engine %s: %s's pool could not be pinned here for device copies: %s "
			 "(its blocks are copied to the device at pageable speed)", e->name,
			 c->peer_name, why);
	}
}

static int shm_health_part(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct shm_state *st = b->data;

	(void)e;
	return snprintf(buf, len, ",\"shm\":{\"connections\":%u,\"calls_again\":%u,"
			"\"peer_pools_pinned\":%llu,\"peer_pools_refused\":%llu}", st->nlive,
			st->calls_again, (unsigned long long)STAT_GET(st->dma_pins),
			(unsigned long long)STAT_GET(st->dma_refusals));
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
		shm_conn_unref(c);
		return;
	}
	st = c->st;
	pool_release_push(&st->releases, buf);
	ferry__backend_wake(st->engine, st->b); /* flush_releases runs in a round */
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
				      .offset = buf->offset,
				      .res = (buf->flags & POOL_BUF_F_RESEND) ? SHM_RELEASE_RESEND : 0 };

		list = atomic_load_explicit(&buf->release_next, memory_order_relaxed);
		if (!c->dead && !send_ctrl(e, c, &d) && !c->dead) {
			/* No room yet: put it back for the next round. */
			pool_release_push(&st->releases, buf);
			continue;
		}
		pool_wrap_done(buf);
		shm_conn_unref(c);
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
	st->lent_ipc[idx] = 0;
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
		c->puts_taken++;
		if (d->res == 0 && st->lent_ipc[idx]) {
			/*
			 * IPC: the receiver holds the descriptor and may copy from our
			 * memory from now on: no deadline, it ends at the RELEASE.
			 */
			if (oi < e->max_ops)
				reactor_put_held(e, &e->ops[oi], (uint32_t)d->op_cookie);
			return true;
		}
		if (d->res < 0)
			free_lent(st, idx); /* refused: the block is ours again */
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
		uint64_t credit, ipc;

		if (!lent_here)
			return false;
		credit = st->lent_credit[idx];
		ipc = st->lent_ipc[idx];
		free_lent(st, idx);
		if (credit)
			stream_chunk_released(e, credit);
		if (ipc && ((ipc & ~SHM_LENT_IPC) >> 32) < e->max_ops) {
			struct op *op = &e->ops[(ipc & ~SHM_LENT_IPC) >> 32];

			if (d->res == SHM_RELEASE_RESEND) /* not read: the receiver asks for it staged */
				reactor_put_restage(e, op, (uint32_t)ipc);
			else
				reactor_put_done(e, op, (uint32_t)ipc, 0);
		}
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
	rc = reactor_deliver_waiting(e, fullkey, (size_t)n, src, len, flags, false);
	if (rc > 0)
		return 0;
	if (rc < 0 || pool_alloc(e->pool, len, &buf)) {
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
	char fullkey[FULLKEY_MAX];
	struct ferry_buf *buf;
	int n, rc;

	if ((type != SHM_D_PUT && type != SHM_D_PUT_INLINE) || key_len == 0 ||
	    key_len >= FERRY_KEY_MAX || (flags & ~(WIRE_F__ALL | WIRE_F_CUDA_IPC)))
		return false;
	/* The key, copied out once into the full key, then checked there. */
	copy_short(fullkey, d->body, key_len + 1u);
	if (fullkey[key_len] != '\0' || key_has_nul(fullkey, key_len))
		return false;
	n = keytable_append_sfx(fullkey, key_len, &c->arrive_sfx);
	if (type == SHM_D_PUT_INLINE) {
		if (len > SHM_INLINE_MAX || (flags & (WIRE_F_RELCREDIT | WIRE_F_CUDA_IPC)))
			return false;
		res.type = SHM_C_RESULT_INLINE;
		res.res = take_inline(e, c, fullkey, n, d->body + shm_inline_at(key_len), len, flags);
		send_ctrl(e, c, &res); /* room was checked by the caller */
		return true;
	}
	if (offset > c->peer_pool_size || len > c->peer_pool_size - offset)
		return false;
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
			shm_conn_unref(c);
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
			shm_conn_fail(e, c, "control entry out of sequence", -ECONNRESET);
			return n + 1;
		}
		m.type = d->type;
		m.res = d->res;
		m.op_cookie = d->op_cookie;
		m.buf_cookie = d->buf_cookie;
		m.offset = d->offset;
		c->rx_ctrl_head++;
		if (!take_ctrl(e, c, &m)) {
			shm_conn_fail(e, c, "malformed control descriptor", -ECONNRESET);
			return n + 1;
		}
		n++;
	}
	if (n)
		atomic_store_explicit(&c->rx->ctrl.head, c->rx_ctrl_head, memory_order_release);
	for (int i = 0; i < SHM_PER_ROUND && (ready = put_entry_state(c)) != 0; i++) {
		int64_t room;

		if (ready < 0) {
			shm_conn_fail(e, c, "PUT entry out of sequence", -ECONNRESET);
			return n + 1;
		}
		room = ctrl_room(c);
		if (room <= 0) {
			if (room < 0)
				shm_conn_fail(e, c, "control ring head out of range", -ECONNRESET);
			break; /* its RESULT needs room: later */
		}
		if (!take_put(e, c, &c->rx->puts[c->rx_put_head % SHM_PUT_ENTRIES])) {
			shm_conn_fail(e, c, "malformed PUT descriptor", -ECONNRESET);
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
		 * pairs with its announcement before it looks at the rings
		 * (announce_sleep, room_appeared: heavy where it says so).
		 */
		bool wake = published;

		fence_light(c->peer_sleeps_heavy);
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
	if (c->pending_head)
		n += flush_pending(e, c);
	return n;
}

/* The connection is gone: every block still lent through it is ours again (shm_conn_fail). */
void shm_lent_drop(struct shm_state *st, struct shm_conn *c)
{
	for (uint32_t i = 0; i < st->max_bufs; i++)
		if (st->lent_conn[i] == c->id + 1)
			free_lent(st, i);
}

/* ------------------------------------------------------------------ */
/* The backend                                                         */
/* ------------------------------------------------------------------ */

static int shm_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct shm_conn *c;
	int rc = shm_conn_for(e, b, peer->name, &c);

	if (rc == 0)
		peer->transport = c;
	return rc;
}

static void shm_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	(void)b;
	if (peer->transport)
		shm_conn_unref(peer->transport);
	peer->transport = NULL;
}

/*
 * The connections from live[from] on: each that is not quiet makes
 * progress, a dead one is reaped; with none live at all the backend goes
 * quiet.
 */
static __attribute__((noinline)) int shm_progress_conns(struct ferry_engine *e, struct backend *b,
						      uint32_t from)
{
	struct shm_state *st = b->data;
	int n = 0;

	for (uint32_t i = from; i < st->nlive;) {
		struct shm_conn *c = st->live[i];

		if (likely(!c->dead) && !conn_quiet(c))
			n += conn_progress(e, c);
		if (c->dead)
			shm_conn_reap(st, c); /* moves the last one here */
		else
			i++;
	}
	if (!st->nlive && !(st->nhalf_open | st->nconnecting)) {
		/*
		 * Nothing to look at until a connection is made (resolve, put,
		 * or the listener's completion: each runs after the reactor
		 * cleared quiet) or a buffer is released (its hook wakes us):
		 * skip the rounds (transport.h, quiet), then look once more.
		 */
		ferry__backend_quiet(b);
		if (atomic_load(&st->releases))
			backend_busy(b);
	}
	return n;
}

/* Released blocks to give back, connections being made: then the connections. */
static __attribute__((noinline)) int shm_progress_slow(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;
	int n = 0;

	if (atomic_load_explicit(&st->releases, memory_order_relaxed))
		n += flush_releases(e, st);
	if (unlikely((st->nhalf_open | st->nconnecting) && !st->tick_armed))
		shm_arm_tick(e, b); /* its SQE could not be had before: try again */
	return n + shm_progress_conns(e, b, 0);
}

/*
 * live[i] is the first connection that is not quiet (or is dead): when it
 * is the last one (often the only one), conn_progress for it alone, in
 * this frame; else shm_progress_conns from it on.
 */
static __attribute__((noinline)) int shm_progress_busy(struct ferry_engine *e, struct backend *b,
						     uint32_t i)
{
	struct shm_state *st = b->data;
	struct shm_conn *c = st->live[i];
	int n;

	if (c->dead || i + 1 < st->nlive)
		return shm_progress_conns(e, b, i);
	n = conn_progress(e, c);
	if (unlikely(c->dead))
		n += shm_progress_conns(e, b, i); /* reaps it */
	return n;
}

/*
 * A round's look at the connections. Up to the first that is not quiet it
 * calls nothing (most rounds of a live connection find it quiet: then no
 * call and no frame at all); from there shm_progress_busy does the work.
 */
static int shm_progress(struct ferry_engine *e, struct backend *b)
{
	struct shm_state *st = b->data;

	if (unlikely(atomic_load_explicit(&st->releases, memory_order_relaxed) ||
		     (st->nhalf_open | st->nconnecting) || !st->nlive))
		return shm_progress_slow(e, b);
	for (uint32_t i = 0; i < st->nlive; i++) {
		const struct shm_conn *c = st->live[i];

		if (c->dead || !conn_quiet(c))
			return shm_progress_busy(e, b, i);
	}
	return 0;
}

/*
 * Before sleeping with work that waits for room in a ring the peer drains:
 * say so, then look again (the peer rings us when it sees want_room).
 */
static bool room_appeared(struct shm_ring_ctl *r, uint32_t entries, uint32_t tail,
			  uint32_t *head_seen, bool heavy)
{
	atomic_store(&r->want_room, 1);
	fence_heavy(heavy); /* pairs with the peer's fence in conn_progress (light if we said heavy) */
	return ring_room(r, entries, tail, head_seen) != 0;
}

static bool ctrl_room_appeared(struct shm_conn *c)
{
	return room_appeared(&c->tx->ctrl, SHM_CTRL_ENTRIES, c->ctrl_tail, &c->ctrl_head_seen,
			     c->st->engine->asym_fences);
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
					   &c->put_head_seen, st->engine->asym_fences))))
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
	if (low == SHM_COOKIE_LISTENER) {
		if (!st->lis.live || res == -ECANCELED)
			return;
		if (res >= 0)
			shm_accept_all(e, b);
		shm_arm_poll(e, b, st->lis.fd, SHM_COOKIE_LISTENER);
		return;
	}
	if (low == SHM_COOKIE_TICK) {
		st->tick_armed = false;
		shm_handshakes_check(e, b);
		shm_arm_tick(e, b);
		return;
	}
	if (low >= SHM_COOKIE_HALF_OPEN) {
		shm_half_open_cqe(e, b, low - SHM_COOKIE_HALF_OPEN, gen, res);
		return;
	}
	{
		uint32_t slot = low - 1;
		struct shm_conn *c = slot < SHM_MAX_CONNS ? st->conns[slot] : NULL;

		if (!c || c->gen != gen)
			return; /* a connection already gone */
		if (!c->up) {
			if (!c->dead && shm_call_answered(e, b, c, res))
				flush_pending(e, c); /* what was queued meanwhile, in order */
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
			shm_conn_fail(e, c, ferry_strerror(res), -ECONNRESET);
		} else if (res & (POLLHUP | POLLRDHUP | POLLERR)) {
			if (!c->dead)
				log_info("shm: engine %s: %s went away", e->name, c->peer_name);
			shm_conn_fail(e, c, NULL, -ECONNRESET); /* a peer leaving is no error */
		} else {
			shm_conn_fail(e, c, "unexpected data on its socket", -ECONNRESET);
		}
		shm_conn_reap(st, c);
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
	st->lent_ipc = calloc(st->max_bufs, sizeof(*st->lent_ipc));
	if (!st->lent || !st->lent_conn || !st->lent_credit || !st->lent_ipc) {
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
	shm_arm_poll(e, b, st->lis.fd, SHM_COOKIE_LISTENER);
	return 0;
fail:
	free(st->lent);
	free(st->lent_conn);
	free(st->lent_credit);
	free(st->lent_ipc);
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
			shm_half_open_close(st, i);
	/*
	 * Releases queued since the last round go to the peers still there
	 * (they read them before our hang-up): a CUDA IPC PUT whose copy ended
	 * here ends there, rather than being reset.
	 */
	flush_releases(e, st);
	for (uint32_t i = 0; i < SHM_MAX_CONNS; i++) {
		if (st->conns[i]) {
			shm_conn_fail(e, st->conns[i], NULL, -ECANCELED);
			shm_conn_reap(st, st->conns[i]);
		}
	}
	/* Releases queued before the connections closed. */
	for (struct ferry_buf *buf = atomic_exchange(&st->releases, NULL), *next; buf; buf = next) {
		next = atomic_load(&buf->release_next);
		pool_wrap_done(buf);
		shm_conn_unref(buf->release_ctx);
	}
	reactor_unresolve_all(e, b);
	free(st->lent);
	free(st->lent_conn);
	free(st->lent_credit);
	free(st->lent_ipc);
	free(st);
	b->data = NULL;
}

const struct backend_ops ferry__shm_backend = {
	.name = "shm",
	.rank = 30,
	.caps = TRANSPORT_CAP_SAME_HOST | TRANSPORT_CAP_ZERO_COPY | TRANSPORT_CAP_MEM_HOST |
		TRANSPORT_CAP_CUDA_IPC,
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
	.dma_source = shm_dma_source,
	.health = shm_health_part,
};

/*
 * engine/reactor.c - the reactor's op path: one loop per engine.
 *
 * Owns: draining the submission rings into ops, the op table (the flags
 * each op takes, what issues it) and the checks of an SQE, issuing NOP,
 * PUT, GET and CANCEL, handing a PUT to the transport that reaches its peer,
 * matching arrivals with waiting GETs through the key table, completing
 * ops (and the CQEs of multishot ops), one reactor round
 * (reactor_run_once), the THREAD-mode reactor thread's loop and
 * ferry_progress (and progress_unlock). Everything an op goes through on its way is here, so the
 * calls between them stay in one translation unit.
 *
 * Elsewhere: the sleep, the wake and stand-in rounds (reactor_sleep.c),
 * waiting for a peer and peer events (reactor_peer.c), the reactor's
 * creation and destroy (reactor_setup.c), overflowed and destroyed CQs
 * (cq.c). In THREAD mode a thread runs the rounds, spinning for spin_ns
 * while work flows; in MANUAL mode the same rounds run inside
 * ferry_progress and the CQ calls. Whoever runs a round holds
 * e->progress_busy, so everything the reactor owns is single-threaded and
 * needs no lock.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "reactor_int.h"
#include "stream_int.h" /* stream_round_due */

#define MAX_IOV 1024

uint64_t ferry__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ */
/* Ops                                                                 */
/* ------------------------------------------------------------------ */

static struct op *op_alloc(struct ferry_engine *e)
{
	struct op *op = e->free_ops;

	if (!op)
		return NULL;
	e->free_ops = op->next;
	STAT_ADD(e->ops_in_use, 1);
	op->gen++;
	op->next = op->prev = NULL;
	op->heap_idx = NO_SLOT;
	op->entry = NULL;
	op->buf = NULL;
	op->len = 0;
	op->deadline = 0;
	op->stream = NULL;
	op->interval = 0;
	return op;
}

struct op *op_alloc_internal(struct ferry_engine *e)
{
	struct op *op = op_alloc(e);

	if (op) {
		op->flags = OP_F_INTERNAL;
		op->cq = NULL;
		op->cb = NULL;
		op->cb_arg = NULL;
		op->start = 0;
		op->iov = NULL;
		op->iovcnt = 0;
		op->user_data = 0;
	}
	return op;
}

static inline void op_free(struct ferry_engine *e, struct op *op)
{
	if (op->cq)
		STAT_ADD(op->cq->inflight, (uint64_t)-1);
	if (op->flags & OP_F_REACTOR_CB)
		e->reactor_cb_ops--;
	op->state = OP_FREE;
	op->gen++;
	op->next = e->free_ops;
	e->free_ops = op;
	STAT_ADD(e->ops_in_use, (uint32_t)-1);
}

void ferry__op_free(struct ferry_engine *e, struct op *op)
{
	op_free(e, op);
}

static unsigned lat_bucket(uint64_t ns)
{
	unsigned b = ns ? 63u - (unsigned)__builtin_clzll(ns) : 0;

	return b > 31 ? 31 : b;
}

/* op, parked under its key (op->entry), off that key's list of waiters. */
static inline void unpark(struct ferry_engine *e, struct op *op)
{
	struct key_entry *ke = op->entry;

	op_list_remove(&ke->waiters, &ke->waiters_tail, op);
	op->entry = NULL;
	keytable_put(&e->keys, ke);
}

/*
 * What an op's end undoes besides its CQE: a PUT waiting for its peer to
 * come, its deadline, its stream's or the directory's part, its place under
 * a key or in a transport's list, its pinned regions, a block it still
 * holds; *res may change (a stream's op). False when the op does not end
 * here after all (it waits for its peer, or for its device copies), or
 * ended without a CQE (an internal op, freed).
 */
static bool op_end_slow(struct ferry_engine *e, struct op *op, int *res, uint64_t len)
{
	if (unlikely(op->flags & FERRY_SQE_WAIT_PEER) &&
	    (*res == -EHOSTUNREACH || *res == -ECONNREFUSED) && op->peer &&
	    reactor_wait_for_peer(e, op))
		return false; /* the peer is not up yet: the PUT waits for it (its deadline still runs) */
	if (op->heap_idx != NO_SLOT)
		timer_del(&e->timers, op);
	if (op->opcode >= FERRY_OP_STREAM_PUT || (op->flags & OP_F_INTERNAL))
		*res = stream_op_ending(e, op, *res);
	if (unlikely(op->flags & OP_F_WISH)) {
		op->flags &= ~OP_F_WISH;
		if (*res < 0 && e->dir)
			e->dir->forget(e, e->dir_svc, op); /* the holder forgets the wish */
	}
	if (op->state == OP_PARKED)
		unpark(e, op);
	else if (unlikely(op->flags & OP_F_WAIT_PEER))
		reactor_peer_wait_remove(op);
	else if (op->state == OP_AWAY && op->peer && op->peer->backend &&
		 op->peer->backend->ops->forget) {
		backend_busy(op->peer->backend);
		op->peer->backend->ops->forget(e, op->peer->backend, op);
	}
	if (unlikely(op->flags & OP_F_PINNED)) {
		/* (A PUT handed on while it is staged is pinned: it names device segments.) */
		if (unlikely(op->flags & OP_F_FILLING) && memory_device_defer(e, op, *res, len))
			return false; /* its copies still read the caller's device memory: it ends then */
		memory_unpin(op->segs, op->iovcnt); /* its regions may go now */
		op->flags &= ~OP_F_PINNED;
	}
	op->state = OP_FREE;

	if ((op->opcode == FERRY_OP_PUT || op->opcode == FERRY_OP_PUBLISH ||
	     op->opcode == FERRY_OP_STREAM_PUT || op->opcode == FERRY_OP_STREAM_ABORT) && op->buf) {
		/* Still ours: the PUT never handed its data over. */
		pool_free(op->buf);
		op->buf = NULL;
	}
	if (op->flags & OP_F_INTERNAL) {
		ferry__op_free(e, op);
		return false;
	}
	return true;
}

/* Flags that send an op's end through op_end_slow (with its state and opcode). */
#define OP_F_END_SLOW (FERRY_SQE_WAIT_PEER | OP_F_INTERNAL | OP_F_WISH | OP_F_WAIT_PEER | \
		       OP_F_PINNED)

/* The CQE of op's end. */
static inline void cqe_of(struct ferry_cqe *c, const struct op *op, int res, uint64_t len,
			  struct ferry_buf *buf)
{
	c->user_data = op->user_data;
	c->res = res;
	c->flags = buf ? FERRY_CQE_F_BUF : 0;
	c->len = len;
	c->buf = buf;
	c->opcode = op->opcode;
	memset(c->resv, 0, sizeof(c->resv));
}

/*
 * op_complete's other ends, out of its frame: a reactor callback (not
 * cold: an application of reactor callbacks lives here), a full or
 * overflowing CQ (cq_post queues the CQE).
 */
static __attribute__((noinline)) void op_post_slow(struct ferry_engine *e, struct op *op, int res,
						   uint64_t len, struct ferry_buf *buf)
{
	struct ferry_cqe cqe;

	cqe_of(&cqe, op, res, len, buf);
	if (op->flags & FERRY_SQE_CB_REACTOR) {
		op->cb(&cqe, op->cb_arg);
		op_free(e, op);
	} else if (cq_post(op->cq, &cqe, op->cb, op->cb_arg, op)) {
		op_free(e, op);
	}
}

/* op_complete's counters of a failure (rare: out of its frame). */
static __attribute__((noinline, cold)) void count_failure(struct ferry_engine *e, struct op *op,
							   int res)
{
	STAT_ADD(e->stats.failed, 1);
	if (res == -ETIMEDOUT)
		STAT_ADD(e->stats.timeouts, 1);
	else if (res == -ECANCELED)
		STAT_ADD(e->stats.cancelled, 1);
	if (op->peer && op->opcode != FERRY_OP_CANCEL)
		STAT_ADD(op->peer->stats.errors, 1);
}

/*
 * The counters of an op that ends well (op_complete and its fast path):
 * puts or gets with their bytes, each side's; a sampled op's latency
 * (start: op->start, 0 when not sampled) into the histogram.
 */
static inline __attribute__((always_inline)) void count_success(struct ferry_engine *e,
								 struct op *op, uint64_t len,
								 uint64_t start)
{
	if (op->opcode == FERRY_OP_PUT || op->opcode == FERRY_OP_STREAM_PUT ||
	    op->opcode == FERRY_OP_PUBLISH) {
		STAT_ADD(e->stats.puts, 1);
		STAT_ADD(e->stats.bytes_put, len);
		if (start)
			STAT_ADD(e->stats.lat_put[lat_bucket(reactor_now(e) - start)], 1);
		STAT_ADD(op->peer->stats.puts, 1);
		STAT_ADD(op->peer->stats.bytes_out, len);
	} else if (op->opcode == FERRY_OP_GET || op->opcode == FERRY_OP_STREAM_GET ||
		   op->opcode == FERRY_OP_FETCH) {
		STAT_ADD(e->stats.gets, 1);
		STAT_ADD(e->stats.bytes_got, len);
		if (start)
			STAT_ADD(e->stats.lat_get[lat_bucket(reactor_now(e) - start)], 1);
		STAT_ADD(op->peer->stats.gets, 1);
		STAT_ADD(op->peer->stats.bytes_in, len);
	}
}

/*
 * op's CQE written in its CQ's free slot (cq_post's two steps, without its
 * copy) and published; the op is free again.
 */
static inline __attribute__((always_inline)) void
post_in_place(struct ferry_engine *e, struct op *op, struct cq_slot *slot, int res, uint64_t len,
	      struct ferry_buf *buf)
{
	cqe_of(&slot->cqe, op, res, len, buf);
	slot->cb = op->cb;
	slot->cb_arg = op->cb_arg;
	cq_slot_publish(op->cq, slot);
	op_free(e, op);
}

/*
 * Every end of an op but op_complete's plainest (below): undoing what the
 * op holds, a failure's counters, a sampled latency, a reactor callback, a
 * full CQ. Out of op_complete's frame, so that the plain end saves no
 * registers and calls nothing.
 */
static __attribute__((noinline)) void op_complete_general(struct ferry_engine *e, struct op *op,
							  int res, uint64_t len,
							  struct ferry_buf *buf)
{
	struct cq_slot *slot;

	/*
	 * A plain op (a PUT whose transport is done with it, a GET taken out
	 * of its key's list: state OP_FREE, no block held, not a stream's,
	 * none of the flags above) has only its deadline to undo.
	 */
	if (unlikely(op->state != OP_FREE || op->buf || op->opcode >= FERRY_OP_STREAM_PUT ||
		     (op->flags & OP_F_END_SLOW))) {
		if (!op_end_slow(e, op, &res, len))
			return;
	} else if (op->heap_idx != NO_SLOT) {
		timer_del(&e->timers, op);
	}
	STAT_ADD(e->stats.completed, 1);
	if (res < 0)
		count_failure(e, op, res);
	else
		count_success(e, op, len, op->start);

	if (likely(!(op->flags & FERRY_SQE_CB_REACTOR) && !op->cq->overflow_head) &&
	    (slot = cq_slot_free(op->cq))) {
		post_in_place(e, op, slot, res, len, buf);
		return;
	}
	op_post_slow(e, op, res, len, buf);
}

void op_complete(struct ferry_engine *e, struct op *op, int res, uint64_t len,
		 struct ferry_buf *buf)
{
	struct cq_slot *slot;

	/*
	 * The plainest end, which most ops have: a plain op (see above) with
	 * no deadline, a result, no latency sample, and room in its CQ for
	 * the CQE (no reactor callback, nothing queued ahead). No call here:
	 * everything else goes to op_complete_general, as a tail call.
	 */
	if (likely(op->state == OP_FREE && !op->buf && op->opcode < FERRY_OP_STREAM_PUT &&
		   !(op->flags & (OP_F_END_SLOW | FERRY_SQE_CB_REACTOR)) &&
		   op->heap_idx == NO_SLOT && res >= 0 && !op->start &&
		   !op->cq->overflow_head && (slot = cq_slot_free(op->cq)))) {
		STAT_ADD(e->stats.completed, 1);
		count_success(e, op, len, 0);
		post_in_place(e, op, slot, res, len, buf);
		return;
	}
	op_complete_general(e, op, res, len, buf);
}

/* ------------------------------------------------------------------ */
/* Key table side: GET and arrivals                                    */
/* ------------------------------------------------------------------ */


/*
 * Hand data to a GET. Returns false (and completes the GET with
 * -EMSGSIZE) when the GET's iovec is too small; the data then stays.
 * On true, ownership of buf has moved (to the caller's CQE, or freed after
 * the copy).
 */
/*
 * A GET that was handed a CUDA IPC descriptor it cannot read (its handles
 * do not open here) waits again under its key, first in line, with what
 * is left of its deadline: the sender was asked (the descriptor's RELEASE)
 * to send the data again, staged through its pool.
 */
static void repark_get(struct ferry_engine *e, struct op *op, const char *fullkey, size_t n)
{
	struct key_entry *ke = keytable_get(&e->keys, fullkey, n, keytable_hash(fullkey, n));

	if (!ke) {
		op_complete(e, op, -ENOSPC, 0, NULL);
		return;
	}
	op->state = OP_PARKED;
	op->entry = ke;
	op->prev = NULL;
	op->next = ke->waiters;
	if (ke->waiters)
		ke->waiters->prev = op;
	else
		ke->waiters_tail = op;
	ke->waiters = op;
	if (op->deadline && op->heap_idx == NO_SLOT)
		timer_add(&e->timers, op); /* memory_device_get took it out; a passed one fires next round */
}

static bool give_to_get(struct ferry_engine *e, struct op *op, struct ferry_buf *buf, uint64_t len,
			uint32_t wflags, const char *fullkey, size_t fullkey_len)
{
	if (unlikely(wflags & WIRE_F_ABORT)) {
		/* A plain GET of an aborted stream's chunk: the reason, and an error. */
		op_complete(e, op, -ECANCELED, len, buf);
		return true;
	}
	if (unlikely(wflags & WIRE_F_CUDA_IPC)) {
		/* The sender's device memory, by IPC: the memory domain copies it (it completes the op). */
		int rc = memory_device_get(e, op, buf, len, wflags);

		if (rc == MEMORY_DEVICE_RESEND) {
			/* Not readable here: the sender is asked to send it again, staged. */
			buf->flags |= POOL_BUF_F_RESEND;
			pool_free(buf);
			if (op->flags & FERRY_SQE_NOWAIT) /* it comes later, for a later GET */
				op_complete(e, op, -EAGAIN, 0, NULL);
			else
				repark_get(e, op, fullkey, fullkey_len);
			return true;
		}
		if (rc) /* the data stays for another GET; too small a GET learns its length */
			op_complete(e, op, rc, rc == -EMSGSIZE ? op->len : 0, NULL);
		return rc == 0;
	}
	if (op->iovcnt) {
		if (len > op->len) {
			log_info("GET %llx: %llu bytes do not fit its %llu-byte iovec",
				 (unsigned long long)op->user_data, (unsigned long long)len,
				 (unsigned long long)op->len);
			op_complete(e, op, -EMSGSIZE, len, NULL);
			return false;
		}
		if (unlikely(op->flags & OP_F_DEVICE)) {
			int rc = memory_device_get(e, op, buf, len, 0); /* it completes the op */

			if (rc)
				op_complete(e, op, rc, 0, NULL); /* the data stays for another GET */
			return rc == 0;
		}
		op_scatter(op, buf->data, len);
		STAT_ADD(e->stats.copies, 1);
		pool_free(buf);
		op_complete(e, op, 0, len, NULL);
		return true;
	}
	STAT_ADD(e->stats.zero_copies, 1);
	op_complete(e, op, 0, len, buf);
	return true;
}

int reactor_deliver(struct ferry_engine *e, struct ferry_peer *from, const char *fullkey,
		    size_t fullkey_len, struct ferry_buf *buf, uint64_t len, uint32_t flags)
{
	uint64_t h;
	struct key_entry *ke;

	if (unlikely(flags & WIRE_F_CREDIT))
		return stream_credit_arrived(e, fullkey, fullkey_len, buf, len);
	if ((flags & WIRE_F_CHUNK) && stream_chunk_direct(e, fullkey, fullkey_len, buf, len,
							   flags & WIRE_F__ALL)) {
		STAT_ADD(e->stats.deliveries, 1);
		return 0;
	}
	h = keytable_hash(fullkey, fullkey_len);
	ke = keytable_find(&e->keys, fullkey, fullkey_len, h);

	if (ke && ke->present) {
		if (!(flags & FERRY_SQE_REPLACE)) {
			STAT_ADD(e->stats.refused, 1);
			return -EEXIST;
		}
		pool_free(ke->buf);
		ke->buf = NULL;
		ke->present = false;
		STAT_ADD(e->keys.present, (uint32_t)-1);
	}
	if (!ke) {
		if (e->keys.present >= e->keys.max_present ||
		    !(ke = keytable_insert(&e->keys, fullkey, fullkey_len, h))) {
			log_limited(FERRY__LOG_WARN, "engine %s: key table full (%u keys held), "
				    "refusing %s", e->name, STAT_GET(e->keys.present), fullkey);
			STAT_ADD(e->stats.refused, 1);
			return -ENOSPC;
		}
	}
	STAT_ADD(e->stats.deliveries, 1);
	while (ke->waiters) {
		struct op *op = ke->waiters;

		/* Unlink by hand: the entry must stay while we use it. */
		ke->waiters = op->next;
		if (ke->waiters)
			ke->waiters->prev = NULL;
		else
			ke->waiters_tail = NULL;
		op->next = op->prev = NULL;
		op->entry = NULL;
		op->state = OP_FREE;
		if (give_to_get(e, op, buf, len, flags, fullkey, fullkey_len)) {
			keytable_put(&e->keys, ke);
			if (flags & WIRE_F_CHUNK)
				stream_chunk_taken(e, fullkey, fullkey_len, flags);
			return 0;
		}
	}
	if (e->keys.present >= e->keys.max_present) {
		keytable_put(&e->keys, ke);
		STAT_ADD(e->stats.refused, 1);
		return -ENOSPC;
	}
	ke->buf = buf;
	ke->len = len;
	ke->from = from;
	ke->wflags = flags & (WIRE_F__ALL | WIRE_F_CUDA_IPC);
	ke->present = true;
	STAT_ADD(e->keys.present, 1);
	if (flags & WIRE_F_CHUNK)
		stream_chunk_arrived(e, ke);
	return 0;
}

/*
 * The first GET waiting under fullkey that len bytes fit (a device GET
 * only when device_ok), or NULL: also for a message that is no plain
 * PUT's data (credits, chunks, aborts, IPC). For reactor_deliver_copy
 * (host memory only: the CPU copies) and reactor_parked_get (the
 * transport writes it), which add their own rules.
 */
static inline struct op *first_waiter(struct ferry_engine *e, const char *fullkey,
				      size_t fullkey_len, uint64_t len, uint32_t flags,
				      bool device_ok, struct key_entry **kep)
{
	struct key_entry *ke;
	struct op *op;

	if (flags & WIRE_F_NOT_DATA)
		return NULL;
	ke = keytable_find(&e->keys, fullkey, fullkey_len, keytable_hash(fullkey, fullkey_len));
	if (!ke || !(op = ke->waiters) || ((op->flags & OP_F_DEVICE) && !device_ok) || len > op->len)
		return NULL;
	*kep = ke;
	return op;
}

/* op, the first GET waiting under its key, is served now: off the key, a delivery. */
static inline void take_waiter(struct ferry_engine *e, struct op *op)
{
	STAT_ADD(e->stats.deliveries, 1);
	unpark(e, op);
	op->state = OP_FREE;
}

/* Copy src into op, the first GET waiting under its key (into an iovec), and complete it. */
static inline __attribute__((always_inline)) void
copy_to_waiter(struct ferry_engine *e, struct op *op, const void *src, uint64_t len)
{
	take_waiter(e, op);
	op_scatter(op, src, len);
	STAT_ADD(e->stats.copies, 1);
	op_complete(e, op, 0, len, NULL);
}

bool reactor_deliver_copy(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			  const void *src, uint64_t len, uint32_t flags)
{
	struct key_entry *ke = NULL;
	struct op *op = first_waiter(e, fullkey, fullkey_len, len, flags, false, &ke);

	if (!op || (op->opcode != FERRY_OP_GET && op->opcode != FERRY_OP_FETCH) || !op->iovcnt)
		return false; /* no GET, a zero-copy one, or one that is too small */
	copy_to_waiter(e, op, src, len);
	return true;
}

int reactor_deliver_waiting(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			    const void *src, uint64_t len, uint32_t flags, bool elsewhere)
{
	struct key_entry *ke;
	struct ferry_buf *buf;
	struct op *op;

	if (flags & WIRE_F_NOT_DATA)
		return 0;
	ke = keytable_find(&e->keys, fullkey, fullkey_len, keytable_hash(fullkey, fullkey_len));
	if (!ke || !(op = ke->waiters) || (op->flags & OP_F_DEVICE) ||
	    (elsewhere && (op->flags & FERRY_SQE_CB_REACTOR)))
		return 0; /* none waits, device memory, or its callback is the reactor's to run */
	if (op->iovcnt) {
		if ((op->opcode != FERRY_OP_GET && op->opcode != FERRY_OP_FETCH) || len > op->len)
			return 0;
		copy_to_waiter(e, op, src, len);
		return 1;
	}
	if (op->opcode != FERRY_OP_GET)
		return 0; /* the arrival path says what happens */
	if (pool_alloc(e->pool, len, &buf))
		return -ENOBUFS;
	/* A GET for a buffer: a block of ours with the data (give_to_get's zero copy). */
	ferry__payload_copy(buf->data, src, len);
	take_waiter(e, op);
	STAT_ADD(e->stats.zero_copies, 1);
	op_complete(e, op, 0, len, buf);
	return 1;
}

struct op *reactor_parked_get(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			      uint64_t len, uint32_t flags)
{
	struct key_entry *ke = NULL;
	struct op *op = first_waiter(e, fullkey, fullkey_len, len, flags, true, &ke);

	if (!op || ke->present || op->opcode != FERRY_OP_GET || !(op->flags & FERRY_SQE_SEGS))
		return NULL;
	return op;
}

void reactor_claim_get(struct ferry_engine *e, struct op *op)
{
	unpark(e, op);
	if (op->heap_idx != NO_SLOT)
		timer_del(&e->timers, op);
	op->state = OP_AWAY;
	op->flags |= OP_F_HELD;
}

void reactor_claimed_get_done(struct ferry_engine *e, struct op *op, int res, uint64_t len)
{
	op->state = OP_FREE; /* not AWAY: no transport has anything of it to forget */
	op->flags &= ~OP_F_HELD;
	if (res == 0) {
		STAT_ADD(e->stats.deliveries, 1);
		STAT_ADD(e->stats.zero_copies, 1);
	}
	op_complete(e, op, res, res == 0 ? len : 0, NULL);
}

/* Can op take one more non-final CQE now? */
bool op_can_post_more(struct ferry_engine *e, struct op *op)
{
	return (op->flags & FERRY_SQE_CB_REACTOR) || e->free_ops ||
	       (!op->cq->overflow_head && cq_has_space(op->cq));
}

/* Post a CQE flagged MORE for a multishot op that stays pending. */
void op_post_more(struct ferry_engine *e, struct op *op, int res, uint64_t len,
		      struct ferry_buf *buf)
{
	struct ferry_cqe cqe = {
		.user_data = op->user_data,
		.res = res,
		.flags = FERRY_CQE_F_MORE | (buf ? FERRY_CQE_F_BUF : 0),
		.len = len,
		.buf = buf,
		.opcode = op->opcode,
	};
	struct op *carrier;

	if (op->flags & FERRY_SQE_CB_REACTOR) {
		op->cb(&cqe, op->cb_arg);
		return;
	}
	if (!op->cq->overflow_head && cq_has_space(op->cq)) {
		cq_post(op->cq, &cqe, op->cb, op->cb_arg, NULL);
		return;
	}
	/* Full: a spare op carries this completion through the overflow list. */
	carrier = op_alloc_internal(e);
	carrier->flags = 0;
	carrier->opcode = op->opcode;
	carrier->user_data = op->user_data;
	carrier->cq = op->cq;
	STAT_ADD(op->cq->inflight, 1);
	if (cq_post(op->cq, &cqe, op->cb, op->cb_arg, carrier))
		ferry__op_free(e, carrier);
}

void reactor_put_done(struct ferry_engine *e, struct op *op, uint32_t gen, int res)
{
	if (op->gen != gen || op->state != OP_AWAY)
		return; /* completed meanwhile (deadline, cancel): a stale ack */
	op->state = OP_FREE;
	op_complete(e, op, res, res < 0 ? 0 : op->len, NULL);
}

void reactor_put_held(struct ferry_engine *e, struct op *op, uint32_t gen)
{
	if (op->gen != gen || op->state != OP_AWAY)
		return; /* completed meanwhile: a stale answer */
	timer_del(&e->timers, op);
	op->flags |= OP_F_HELD;
}

void reactor_put_restage(struct ferry_engine *e, struct op *op, uint32_t gen)
{
	int rc;

	if (op->gen != gen || op->state != OP_AWAY)
		return; /* completed meanwhile: a stale answer */
	timer_del(&e->timers, op);
	op->flags &= ~(OP_F_HELD | WIRE_F_CUDA_IPC);
	op->state = OP_FREE;
	if ((rc = memory_device_restage(e, op)))
		op_complete(e, op, rc, 0, NULL);
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

/*
 * drain_plain_put and drain_plain_get repeat the checks of dispatch,
 * check_key, check_peer, check_iov, op_take_put, do_put and reactor_send
 * for the entries they take: a check added to these must be added there
 * (or the lanes must leave the entries it concerns to the general path).
 */
static int check_key(const struct ferry_sqe *sqe)
{
	if (sqe->key_len >= FERRY_KEY_MAX) {
		log_error("op %llx: key of %u bytes (max %d)", (unsigned long long)sqe->user_data,
			  sqe->key_len, FERRY_KEY_MAX - 1);
		return -ENAMETOOLONG;
	}
	if (sqe->key_len == 0 || sqe->key[0] == '\0' ||
	    strnlen(sqe->key, FERRY_KEY_MAX) != sqe->key_len) {
		log_error("op %llx: empty or malformed key", (unsigned long long)sqe->user_data);
		return -EINVAL;
	}
	return 0;
}

static int check_peer(struct ferry_engine *e, const struct ferry_sqe *sqe)
{
	if (!sqe->peer || sqe->peer->engine != e) {
		log_error("op %llx: %s peer", (unsigned long long)sqe->user_data,
			  sqe->peer ? "foreign" : "NULL");
		return -EINVAL;
	}
	return 0;
}

static int check_iov(const struct ferry_sqe *sqe)
{
	if (sqe->iovcnt > MAX_IOV || (sqe->iovcnt && !sqe->iov)) {
		log_error("op %llx: bad iovec (%u entries, iov %p)",
			  (unsigned long long)sqe->user_data, sqe->iovcnt, (void *)sqe->iov);
		return -EINVAL;
	}
	if (sqe->flags & FERRY_SQE_SEGS)
		return 0; /* segments: memory_check_pin, once the op is ours */
	for (uint64_t i = 0, total = 0; i < sqe->iovcnt; i++) {
		if (!sqe->iov[i].iov_base && sqe->iov[i].iov_len) {
			log_error("op %llx: iov[%llu] is NULL with length %zu",
				  (unsigned long long)sqe->user_data, (unsigned long long)i,
				  sqe->iov[i].iov_len);
			return -EINVAL;
		}
		if (__builtin_add_overflow(total, sqe->iov[i].iov_len, &total)) {
			log_error("op %llx: the lengths of its %u iovec entries add up past 2^64",
				  (unsigned long long)sqe->user_data, sqe->iovcnt);
			return -EINVAL;
		}
	}
	return 0;
}

void op_arm_deadline(struct ferry_engine *e, struct op *op, uint64_t timeout_ns)
{
	if (timeout_ns) {
		op->deadline = reactor_now(e) + timeout_ns;
		if (op->deadline < e->now) /* overflow: effectively none */
			op->deadline = UINT64_MAX;
		timer_add(&e->timers, op);
	}
}

void reactor_unresolve(struct ferry_engine *e, struct ferry_peer *peer)
{
	struct backend *b = peer->backend;

	if (b) {
		if (b->ops->unresolve) {
			backend_busy(b);
			b->ops->unresolve(e, b, peer);
		}
		peer->backend = NULL;
		peer->transport = NULL;
	}
}


/*
 * A PUT of device segments that the memory domain left where they are for
 * a transport that sends them so (OP_F_DEVICE_DIRECT), now going through
 * one that does not (the peer was resolved again since: a reconnection):
 * the domain stages it after all (device_restage). 0: the domain has it.
 */
static int direct_restage(struct ferry_engine *e, struct op *op)
{
	uint8_t state = op->state;
	int rc;

	if (op->heap_idx != NO_SLOT)
		timer_del(&e->timers, op); /* (it waited for its peer: the staged PUT's deadline comes) */
	op->state = OP_FREE;
	if ((rc = memory_device_restage(e, op)))
		op->state = state; /* the caller ends it (reactor_put_done wants it AWAY) */
	return rc;
}

/* Hand the PUT to b, its peer's transport; a peer gone is asked for again next time. */
static inline int transport_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	int rc;

	backend_busy(b);
	rc = b->ops->put(e, b, op);
	if (rc == -EHOSTUNREACH || rc == -ECONNRESET)
		reactor_unresolve(e, op->peer); /* ask again next time: it may be back */
	return rc;
}

/* What a PUT's handing over (rc) leaves: it failed, or it is away with its deadline. */
static inline void put_handed(struct ferry_engine *e, struct op *op, int rc, uint64_t timeout_ns)
{
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
	} else if (op->state == OP_AWAY && op->heap_idx == NO_SLOT) {
		op_arm_deadline(e, op, timeout_ns);
	}
}

/* Find the transport that reaches op->peer and hand it the PUT. */
int reactor_send(struct ferry_engine *e, struct op *op)
{
	struct ferry_peer *peer = op->peer;
	int rc;

	if (!peer->backend) {
		/* A connection to it being made: the PUT waits here, in order. */
		for (unsigned i = 0; i < e->nbackends; i++) {
			struct backend *b = &e->backends[i];

			if (!b->ops->reaching || !b->data ||
			    (backend_busy(b), !(rc = b->ops->reaching(e, b, peer))))
				continue;
			if (rc < 0)
				return rc;
			op->flags |= OP_F_WAIT_PEER;
			op_list_append(&peer->wait_head, &peer->wait_tail, op);
			return 0;
		}
		rc = -EHOSTUNREACH;
		for (unsigned i = 0; i < e->nbackends && rc == -EHOSTUNREACH; i++) {
			if (!e->backends[i].ops->resolve)
				continue; /* a service (the control plane): it carries no PUT */
			backend_busy(&e->backends[i]);
			rc = e->backends[i].ops->resolve(e, &e->backends[i], peer);
			if (rc == 0)
				peer->backend = &e->backends[i];
		}
		if (!peer->backend) {
			/* -ENETUNREACH: its own transport cannot reach it now; no other may. */
			log_info("PUT %llx: %s \"%s\" in namespace \"%s\"",
				 (unsigned long long)op->user_data,
				 rc == -ENETUNREACH ? "cannot call the address of"
						    : "no engine reachable as",
				 peer->name, e->ns);
			return -EHOSTUNREACH;
		}
	}
	if (unlikely(op->flags & (OP_F_FILLING | OP_F_DEVICE_DIRECT))) {
		/* Device memory the domain did not stage whole (backends/cuda). */
		const struct backend_ops *t = peer->backend->ops;

		uint64_t filled = (op->flags & OP_F_FILLING) && op->buf ? pool_filled(op->buf) : 0;

		if (filled == POOL_FILL_FAILED) {
			/* Its block was given back (its peer was away), then its copies failed. */
			log_error("PUT %llx: its device memory could not be staged",
				  (unsigned long long)op->user_data);
			return -EIO;
		}
		if ((op->flags & OP_F_FILLING) && !t->sends_filling && op->buf &&
		    filled != op->buf->len) {
			/* Not reached: the domain hands a block on early only to such a transport. */
			log_error("PUT %llx: a block still being filled, for a transport that sends "
				  "only whole ones", (unsigned long long)op->user_data);
			return -EIO;
		}
		if ((op->flags & OP_F_DEVICE_DIRECT) &&
		    (!t->device_in_place || !t->device_in_place(e, peer->backend, op)))
			return direct_restage(e, op);
	}
	if (unlikely(!op->buf && op->len > peer->backend->ops->iov_put_max)) {
		/* Segments left where they are by do_put: this transport takes them so, or a copy. */
		if ((op->flags & FERRY_SQE_SEGS) && peer->backend->ops->segs_in_place)
			STAT_ADD(e->stats.zero_copies, 1);
		else if ((rc = op_fill(e, op)))
			return rc;
	}
	return transport_put(e, peer->backend, op);
}

/*
 * Put the data of a PUT-like op into a pool buffer of ours: a buffer the
 * caller gave (op->buf, zero copy; a peer's block is copied), or a copy of
 * the iovec. Returns 0 or a negative errno (op->buf then NULL or still
 * ours, freed by op_complete).
 */
int op_fill(struct ferry_engine *e, struct op *op)
{
	int rc;

	if (op->buf && (op->buf->flags & POOL_BUF_F_FOREIGN)) {
		/* A peer's block, mapped here: ship a copy, give the block back. */
		struct ferry_buf *own;

		rc = pool_alloc(e->pool, op->buf->len, &own);
		if (rc)
			return rc; /* op_complete frees the foreign one */
		ferry__payload_copy(own->data, op->buf->data, op->buf->len);
		pool_free(op->buf);
		op->buf = own;
		op->len = own->len;
		STAT_ADD(e->stats.copies, 1);
	} else if (op->buf) {
		op->len = op->buf->len;
		STAT_ADD(e->stats.zero_copies, 1);
	} else {
		uint64_t total = (op->flags & FERRY_SQE_SEGS) ? segs_total(op->segs, op->iovcnt)
							      : iov_total(op->iov, op->iovcnt);

		rc = pool_alloc(e->pool, total, &op->buf);
		if (rc) {
			log_info("op %llx: pool exhausted for %llu bytes",
				 (unsigned long long)op->user_data, (unsigned long long)total);
			return rc;
		}
		op_gather(op, op->buf->data, total);
		op->len = total;
		STAT_ADD(e->stats.copies, 1);
	}
	return 0;
}

/* An SQE's segments (FERRY_SQE_SEGS) checked and their regions pinned until the op ends. */
static int op_pin(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	int rc;

	if (likely(!(sqe->flags & FERRY_SQE_SEGS)))
		return 0;
	if ((rc = memory_check_pin(e, sqe)) < 0)
		return rc;
	op->flags |= OP_F_PINNED;
	if (unlikely(rc)) {
		if (op->opcode != FERRY_OP_PUT && op->opcode != FERRY_OP_PUBLISH &&
		    op->opcode != FERRY_OP_GET && op->opcode != FERRY_OP_FETCH) {
			log_error("op %llx: %s of CUDA device memory is not supported (PUT, PUBLISH, "
				  "GET and FETCH are)", (unsigned long long)op->user_data,
				  op->opcode == FERRY_OP_STREAM_PUT ? "STREAM_PUT" : "this op");
			return -EOPNOTSUPP; /* op_complete unpins */
		}
		op->flags |= OP_F_DEVICE;
	}
	return 0;
}

/* Check a PUT-like SQE and take its buffer. 0, or the op is completed. */
int op_take_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	int rc;

	if (sqe->buf) {
		op->buf = sqe->buf; /* ownership moved at submission */
		if (atomic_load(&op->buf->state) != POOL_BUF_LIVE) {
			log_error("op %llx: buffer is not live (released twice?)",
				  (unsigned long long)op->user_data);
			op->buf = NULL;
			op_complete(e, op, -EINVAL, 0, NULL);
			return -EINVAL;
		}
		if (op->buf->flags & POOL_BUF_F_DEVICE) {
			/* Another process's device memory, lent to us: it is not ours to send on. */
			log_error("op %llx: a device buffer a GET handed out (FERRY_SQE_DEVICE_BUF) "
				  "cannot be PUT: copy it into a registered region first",
				  (unsigned long long)op->user_data);
			op_complete(e, op, -EOPNOTSUPP, 0, NULL); /* (it frees the buffer, as any refused PUT's) */
			return -EOPNOTSUPP;
		}
	}
	if ((rc = check_peer(e, sqe)) || (rc = check_key(sqe)) || (rc = check_iov(sqe)) ||
	    (sqe->buf && sqe->iovcnt && (rc = -EINVAL)) || (rc = op_pin(e, op, sqe))) {
		op_complete(e, op, rc, 0, NULL);
		return rc;
	}
	return 0;
}

/* A PUT whose data is in op->buf (or its iovec) goes to its transport, deadline timeout_ns. */
static void put_send(struct ferry_engine *e, struct op *op, uint64_t timeout_ns)
{
	if (unlikely(op->opcode == FERRY_OP_PUBLISH)) {
		if (e->dir)
			e->dir->publish(e, e->dir_svc, op); /* kept here, for a peer to fetch */
		else
			op_complete(e, op, -EOPNOTSUPP, 0, NULL);
		return;
	}
	op->state = OP_AWAY;
	op->interval = timeout_ns; /* FERRY_SQE_WAIT_PEER: its deadline while it waits */
	put_handed(e, op, reactor_send(e, op), timeout_ns);
}

void reactor_put_staged(struct ferry_engine *e, struct op *op, int res)
{
	op->state = OP_FREE;
	if (res)
		op_complete(e, op, res, 0, NULL);
	else
		put_send(e, op, op->interval);
}

/* A PUT of device segments: the memory domain copies them into the pool first. */
static void put_device(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	int rc;

	op->key_len = sqe->key_len;
	copy_short(op->key, sqe->key, sqe->key_len + 1u);
	op->interval = sqe->timeout_ns; /* its deadline runs once the data is staged */
	if ((rc = memory_device_put(e, op, sqe)))
		op_complete(e, op, rc, 0, NULL);
}

static void do_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	int rc;

	if (op_take_put(e, op, sqe))
		return;
	if (unlikely(op->flags & OP_F_DEVICE)) {
		put_device(e, op, sqe);
		return;
	}
	if (unlikely(sqe->cuda_wait_kind)) {
		log_error("op %llx: a CUDA wait on a PUT of no device memory",
			  (unsigned long long)op->user_data);
		op_complete(e, op, -EINVAL, 0, NULL);
		return;
	}
	if (!sqe->buf && op->opcode != FERRY_OP_PUBLISH && op->peer->backend &&
	    op->peer->backend->ops->iov_put_max &&
	    (op->len = sqe_payload_len(sqe)) <= op->peer->backend->ops->iov_put_max) {
		/* The transport copies it straight from the iovec (struct backend_ops). */
		STAT_ADD(e->stats.copies, 1);
	} else if (!sqe->buf && op->opcode == FERRY_OP_PUT && (op->flags & FERRY_SQE_SEGS) &&
		   (!op->peer->backend || op->peer->backend->ops->segs_in_place)) {
		/*
		 * The transport sends the segments from where they are (struct
		 * backend_ops); one not known yet is known at reactor_send, which
		 * stages them if it does not.
		 */
		op->len = sqe_payload_len(sqe);
	} else if ((rc = op_fill(e, op))) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	op->key_len = sqe->key_len;
	copy_short(op->key, sqe->key, sqe->key_len + 1u);
	put_send(e, op, sqe->timeout_ns);
}

/* A LOOKUP GET parked (or NOWAIT): the directory service asks its holder. */
static void directory_fetch(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	if (e->dir)
		e->dir->fetch(e, e->dir_svc, op, sqe);
	else
		op_complete(e, op, -EOPNOTSUPP, 0, NULL);
}

/*
 * A GET (or FETCH) whose full key is fullkey (n bytes, hash h): the data,
 * if it is there, or NOWAIT's -EAGAIN, or the op parked under its key with
 * its deadline. True when it parked.
 */
static bool get_take_or_park(struct ferry_engine *e, struct op *op, const char *fullkey, int n,
			     uint64_t h, bool nowait, uint64_t timeout_ns)
{
	struct key_entry *ke = keytable_find(&e->keys, fullkey, (size_t)n, h);

	if (ke && ke->present) {
		struct ferry_buf *buf = ke->buf;
		uint64_t len = ke->len;
		uint32_t wflags = ke->wflags;

		/*
		 * A CUDA IPC descriptor's len is the descriptor's, not the data's:
		 * the memory domain checks the data against the GET (ipc_probe).
		 */
		if (op->iovcnt && len > op->len && !(wflags & WIRE_F_CUDA_IPC)) {
			op_complete(e, op, -EMSGSIZE, len, NULL);
			return false;
		}
		struct ferry_peer *src = ke->from;

		ke->buf = NULL;
		ke->present = false;
		STAT_ADD(e->keys.present, (uint32_t)-1);
		keytable_put(&e->keys, ke);
		if (unlikely(!give_to_get(e, op, buf, len, wflags, fullkey, (size_t)n))) {
			/* Not taken (a device copy that could not start): it stays under its key. */
			if ((ke = keytable_get(&e->keys, fullkey, (size_t)n, h))) {
				ke->buf = buf;
				ke->len = len;
				ke->from = src;
				ke->wflags = wflags;
				ke->present = true;
				STAT_ADD(e->keys.present, 1);
			} else {
				pool_free(buf);
			}
			return false;
		}
		if (wflags & WIRE_F_CHUNK)
			stream_chunk_taken(e, fullkey, (size_t)n, wflags);
		return false;
	}
	if (nowait) {
		op_complete(e, op, -EAGAIN, 0, NULL);
		return false;
	}
	if (!ke)
		ke = keytable_insert(&e->keys, fullkey, (size_t)n, h);
	if (!ke) {
		op_complete(e, op, -ENOSPC, 0, NULL);
		return false;
	}
	op->state = OP_PARKED;
	op->entry = ke;
	op_list_append(&ke->waiters, &ke->waiters_tail, op);
	op_arm_deadline(e, op, timeout_ns);
	return true;
}

static void do_get(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	char fullkey[FULLKEY_MAX];
	int rc, n;

	if ((rc = check_peer(e, sqe)) || (rc = check_key(sqe)) || (rc = check_iov(sqe)) ||
	    (rc = op_pin(e, op, sqe))) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	if ((sqe->flags & FERRY_SQE_DEVICE_BUF) && sqe->iovcnt) {
		log_error("op %llx: FERRY_SQE_DEVICE_BUF is for a GET without destination",
			  (unsigned long long)op->user_data);
		op_complete(e, op, -EINVAL, 0, NULL);
		return;
	}
	n = keytable_compose_sfx(fullkey, sqe->key, sqe->key_len, &sqe->peer->from_sfx);
	if (n < 0) {
		op_complete(e, op, n, 0, NULL);
		return;
	}
	op->len = sqe_payload_len(sqe); /* capacity while waiting */
	if (get_take_or_park(e, op, fullkey, n, keytable_hash(fullkey, (size_t)n),
			     (sqe->flags & FERRY_SQE_NOWAIT) && op->opcode != FERRY_OP_FETCH,
			     sqe->timeout_ns) &&
	    unlikely(op->opcode == FERRY_OP_FETCH))
		directory_fetch(e, op, sqe); /* ask the holder */
}

static void do_cancel(struct ferry_engine *e, struct op *op, uint64_t target)
{
	int res = -ENOENT;

	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *t = &e->ops[i];

		if (t == op || t->user_data != target || (t->flags & OP_F_INTERNAL))
			continue; /* the engine's own ops are not the application's to cancel */
		if (unlikely(t->state == OP_AWAY && (t->flags & OP_F_HELD))) {
			/*
			 * Its memory is being read (a PUT: CUDA IPC, an rdma READ) or
			 * written (a GET an rdma READ fills) in place: it ends when that is done.
			 */
			log_info("CANCEL %llx: %s %llx is being %s in place: too late to stop it",
				 (unsigned long long)op->user_data,
				 t->opcode == FERRY_OP_GET ? "GET" : "PUT", (unsigned long long)target,
				 t->opcode == FERRY_OP_GET ? "filled" : "read by its receiver");
			res = -EALREADY;
			break;
		}
		if (op_state_pending(t->state)) {
			op_complete(e, t, -ECANCELED, 0, NULL);
			res = 0;
			break;
		}
		if (t->state == OP_OVERFLOW)
			res = -EALREADY;
	}
	op_complete(e, op, res, 0, NULL);
}

/* Take one SQE. Returns false when it could not be taken (no free op). */
static void do_nop(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	(void)sqe;
	STAT_ADD(e->stats.nops, 1);
	op_complete(e, op, 0, 0, NULL);
}

static void do_cancel_sqe(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	do_cancel(e, op, sqe->cancel_user_data);
}

/* PEER_HEALTH, LOOKUP, REMOTE_CANCEL: the directory service's (directory.h). */
static void directory_do_op(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	if (e->dir)
		e->dir->do_op(e, e->dir_svc, op, sqe);
	else
		op_complete(e, op, -EOPNOTSUPP, 0, NULL);
}

/*
 * Every op: its name (for the logs), the FERRY_SQE_* flags it takes
 * besides FERRY_SQE_CB_REACTOR (any other is -EINVAL, as ferry.h says),
 * and what issues it. Its ending, where it has one of its own, is the
 * stream layer's (op_complete calls stream_op_ending for stream ops).
 */
static const struct op_def {
	const char *name;
	uint32_t flags;
	void (*issue)(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
} op_defs[FERRY_OP__MAX] = {
	[FERRY_OP_NOP] = { "NOP", 0, do_nop },
	[FERRY_OP_PUT] = { "PUT", FERRY_SQE_REPLACE | FERRY_SQE_SEGS | FERRY_SQE_WAIT_PEER, do_put },
	[FERRY_OP_GET] = { "GET", FERRY_SQE_NOWAIT | FERRY_SQE_SEGS | FERRY_SQE_DEVICE_BUF, do_get },
	[FERRY_OP_CANCEL] = { "CANCEL", 0, do_cancel_sqe },
	[FERRY_OP_STREAM_PUT] = { "STREAM_PUT",
				  FERRY_SQE_STREAM_END | FERRY_SQE_SEGS | FERRY_SQE_WAIT_PEER,
				  stream_do_put },
	[FERRY_OP_STREAM_GET] = { "STREAM_GET", FERRY_SQE_STREAM_WHOLE, stream_do_get },
	[FERRY_OP_STREAM_ABORT] = { "STREAM_ABORT", 0, stream_do_abort },
	[FERRY_OP_STREAM_ACCEPT] = { "STREAM_ACCEPT", 0, stream_do_accept },
	[FERRY_OP_CLEANUP] = { "CLEANUP", 0, ferry__do_cleanup },
	[FERRY_OP_PEER_HEALTH] = { "PEER_HEALTH", 0, directory_do_op },
	[FERRY_OP_LOOKUP] = { "LOOKUP", 0, directory_do_op },
	[FERRY_OP_REMOTE_CANCEL] = { "REMOTE_CANCEL", 0, directory_do_op },
	[FERRY_OP_PUBLISH] = { "PUBLISH", FERRY_SQE_REPLACE | FERRY_SQE_SEGS, do_put },
	[FERRY_OP_FETCH] = { "FETCH", FERRY_SQE_NOWAIT | FERRY_SQE_SEGS, do_get },
};

static bool dispatch(struct ferry_engine *e, const struct ferry_sqe *sqe)
{
	struct ferry_cq *cq = sqe->cq ? sqe->cq : &e->default_cq;
	struct op *op;

	STAT_ADD(e->stats.submitted, 1);
	/* Fast path: a NOP needs no op when its CQ has room. */
	if (sqe->opcode == FERRY_OP_NOP && !sqe->flags && cq->engine == e &&
	    !atomic_load_explicit(&cq->dead, memory_order_relaxed) &&
	    !(sqe->flags & FERRY_SQE_CB_REACTOR) && cq_has_space(cq)) {
		struct ferry_cqe cqe = { .user_data = sqe->user_data, .opcode = FERRY_OP_NOP };

		STAT_ADD(e->stats.nops, 1);
		STAT_ADD(e->stats.completed, 1);
		cq_post(cq, &cqe, sqe->cb, sqe->cb_arg, NULL);
		return true;
	}
	op = op_alloc(e);
	if (!op) {
		STAT_ADD(e->stats.submitted, (uint64_t)-1);
		return false;
	}
	op->opcode = sqe->opcode;
	op->flags = sqe->flags;
	op->user_data = sqe->user_data;
	/*
	 * The latency histogram samples one op in 16, counted (not by the op's
	 * slot: the free list hands the same slot out again and again): the
	 * clock is not free.
	 */
	op->start = (e->lat_seq++ & 15) == 0 ? reactor_now(e) : 0;
	op->cb = sqe->cb;
	op->cb_arg = sqe->cb_arg;
	op->peer = NULL;
	op->iov = sqe->iov;
	op->iovcnt = sqe->iovcnt;
	op->cq = cq;
	/*
	 * One test for a well-formed entry; what is wrong is found below, in
	 * the order the errors are reported.
	 */
	if (likely(cq->engine == e && !atomic_load_explicit(&cq->dead, memory_order_relaxed)) &&
	    likely(sqe->opcode < FERRY_OP__MAX) &&
	    likely(!(op->flags & ~(op_defs[sqe->opcode].flags | FERRY_SQE_CB_REACTOR))) &&
	    likely(op_defs[sqe->opcode].issue != NULL) &&
	    likely(!(op->flags & FERRY_SQE_CB_REACTOR) || op->cb)) {
		STAT_ADD(cq->inflight, 1);
		goto valid;
	}
	op->cq = cq->engine == e && !atomic_load_explicit(&cq->dead, memory_order_relaxed)
			 ? cq : &e->default_cq;
	STAT_ADD(op->cq->inflight, 1);
	/*
	 * Bits above FERRY_SQE__ALL are the engine's own (OP_F_*): whatever the
	 * first error is, none of them may reach op_complete as the op's.
	 */
	op->flags &= FERRY_SQE__ALL;

	if (cq->engine != e || atomic_load_explicit(&cq->dead, memory_order_relaxed)) {
		log_error("op %llx: target CQ %s", (unsigned long long)sqe->user_data,
			  cq->engine != e ? "belongs to another engine" : "was destroyed");
		goto invalid;
	}
	if ((op->flags & FERRY_SQE_CB_REACTOR) && !op->cb) {
		log_error("op %llx: CB_REACTOR without a callback", (unsigned long long)op->user_data);
		op->flags &= ~FERRY_SQE_CB_REACTOR;
		goto invalid;
	}
	if (sqe->flags & ~FERRY_SQE__ALL) {
		log_error("op %llx: unknown flags 0x%x", (unsigned long long)op->user_data,
			  sqe->flags & ~FERRY_SQE__ALL);
		goto invalid;
	}
	if (sqe->opcode >= FERRY_OP__MAX || !op_defs[sqe->opcode].issue) {
		log_error("op %llx: unknown opcode %u", (unsigned long long)sqe->user_data,
			  sqe->opcode);
		goto invalid;
	}
	if (op->flags & ~(op_defs[sqe->opcode].flags | FERRY_SQE_CB_REACTOR)) {
		log_error("op %llx: %s does not take the flags 0x%x", (unsigned long long)op->user_data,
			  op_defs[sqe->opcode].name,
			  op->flags & ~(op_defs[sqe->opcode].flags | FERRY_SQE_CB_REACTOR));
		goto invalid;
	}
	log_error("op %llx: refused (flags 0x%x, opcode %u)", (unsigned long long)op->user_data,
		  op->flags, sqe->opcode); /* a case the test above has and the list misses */
	goto invalid;
valid:
	if (sqe->opcode != FERRY_OP_NOP && sqe->opcode != FERRY_OP_CANCEL)
		op->peer = sqe->peer && sqe->peer->engine == e ? sqe->peer : NULL;
	if (op->flags & FERRY_SQE_CB_REACTOR) {
		op->flags |= OP_F_REACTOR_CB; /* no stand-in round while it is pending */
		e->reactor_cb_ops++;
	}
	op_defs[sqe->opcode].issue(e, op, sqe);
	return true;
invalid:
	if ((sqe->opcode == FERRY_OP_PUT || sqe->opcode == FERRY_OP_PUBLISH ||
	     sqe->opcode == FERRY_OP_STREAM_PUT) &&
	    sqe->buf && atomic_load(&sqe->buf->state) == POOL_BUF_LIVE)
		op->buf = sqe->buf; /* ownership moved at submission: free it */
	op_complete(e, op, -EINVAL, 0, NULL);
	return true;
}

/* Would this SQE send to a peer not yet resolved to a transport? */
static bool stand_in_must_not_send(struct ferry_engine *e, const struct ferry_sqe *slot)
{
	const struct ferry_peer *p = slot->peer;

	if (slot->opcode != FERRY_OP_PUT && slot->opcode != FERRY_OP_STREAM_PUT &&
	    slot->opcode != FERRY_OP_STREAM_ABORT)
		return false;
	if (!p || p->engine != e)
		return false; /* refused by dispatch */
	return !p->backend;
}

/*
 * What both lanes below ask of an entry besides its flags: one of the
 * engine's peers, the engine's default CQ or a live one of its own, an
 * iovec (or none) with no NULL base under a length and lengths that add up
 * (*len), a well-formed key. *cq is the CQ.
 */
static inline __attribute__((always_inline)) bool
plain_entry(struct ferry_engine *e, const struct ferry_sqe *slot, struct ferry_cq **cq, uint64_t *len)
{
	const struct iovec *iov = slot->iov;
	uint32_t iovcnt = slot->iovcnt, klen = slot->key_len;
	uint64_t total = 0;

	*cq = slot->cq ? slot->cq : &e->default_cq;
	if (!slot->peer || slot->peer->engine != e || (*cq)->engine != e ||
	    atomic_load_explicit(&(*cq)->dead, memory_order_relaxed) || iovcnt > MAX_IOV ||
	    (iovcnt && !iov) || klen == 0 || klen >= FERRY_KEY_MAX)
		return false;
	for (uint32_t i = 0; i < iovcnt; i++)
		if ((!iov[i].iov_base && iov[i].iov_len) ||
		    __builtin_add_overflow(total, iov[i].iov_len, &total))
			return false;
	*len = total;
	return !key_has_nul(slot->key, klen);
}

/* A lane's op, filled from its slot as dispatch fills one (and counted so). */
static inline struct op *plain_op(struct ferry_engine *e, const struct ferry_sqe *slot,
				  uint8_t opcode, uint32_t flags, struct ferry_cq *cq, uint64_t len)
{
	struct op *op = op_alloc(e);

	op->opcode = opcode;
	op->flags = flags;
	op->user_data = slot->user_data;
	op->start = (e->lat_seq++ & 15) == 0 ? reactor_now(e) : 0; /* as dispatch samples */
	op->cb = slot->cb;
	op->cb_arg = slot->cb_arg;
	op->peer = slot->peer;
	op->iov = slot->iov;
	op->iovcnt = slot->iovcnt;
	op->cq = cq;
	op->len = len;
	STAT_ADD(e->stats.submitted, 1);
	STAT_ADD(cq->inflight, 1);
	return op;
}

/*
 * The plain PUT, taken straight from its ring slot: an iovec that its
 * peer's transport copies itself (at most backend_ops.iov_put_max bytes),
 * or a live block of a pool of this process (zero copy), to a peer
 * resolved to a transport, into the engine's default CQ or a live one of
 * its own, no flag but REPLACE, no CUDA wait, a well-formed key.
 * Everything dispatch, do_put and reactor_send would check of it holds, so
 * they are skipped: the op is filled from the slot, the slot given back
 * (before anything can complete the op), the transport called. Any other entry, a malformed one too (its error is
 * theirs to report), is left to them: false. The caller checked that an
 * op is free.
 */
static bool drain_plain_put(struct ferry_engine *e, struct ferry_sq *sq,
			    const struct ferry_sqe *slot, uint32_t head)
{
	struct ferry_buf *buf = slot->buf;
	uint32_t flags = slot->flags;
	uint64_t len, timeout_ns;
	struct ferry_cq *cq;
	struct backend *b;
	struct op *op;

	if ((flags & ~FERRY_SQE_REPLACE) || slot->cuda_wait_kind || !plain_entry(e, slot, &cq, &len) ||
	    !(b = slot->peer->backend))
		return false;
	if (buf) {
		/* A live block of a pool of this process: it goes as it is (op_fill's zero copy). */
		if (slot->iovcnt || (buf->flags & POOL_BUF_F_FOREIGN) ||
		    atomic_load_explicit(&buf->state, memory_order_acquire) != POOL_BUF_LIVE)
			return false;
		len = buf->len;
	} else if (!b->ops->iov_put_max || len > b->ops->iov_put_max) {
		return false;
	}
	op = plain_op(e, slot, FERRY_OP_PUT, flags, cq, len);
	op->buf = buf; /* ownership moved at submission */
	op->key_len = slot->key_len;
	copy_short(op->key, slot->key, slot->key_len);
	op->key[slot->key_len] = '\0';
	timeout_ns = slot->timeout_ns;
	atomic_store_explicit(&sq->head, head + 1, memory_order_release);
	if (buf)
		STAT_ADD(e->stats.zero_copies, 1);
	else
		STAT_ADD(e->stats.copies, 1); /* the transport copies it from the iovec */
	op->state = OP_AWAY;
	op->interval = timeout_ns;
	put_handed(e, op, transport_put(e, b, op), timeout_ns); /* (put_send's, its transport known) */
	return true;
}

/*
 * The plain GET, taken straight from its ring slot: into an iovec (or for
 * a buffer), from one of the engine's peers, into the engine's default CQ
 * or a live one of its own, no flag but NOWAIT, a well-formed key; as
 * drain_plain_put, everything else is left to dispatch and do_get (false).
 */
static bool drain_plain_get(struct ferry_engine *e, struct ferry_sq *sq,
			    const struct ferry_sqe *slot, uint32_t head)
{
	uint32_t flags = slot->flags;
	char fullkey[FULLKEY_MAX];
	uint64_t len, timeout_ns;
	struct ferry_cq *cq;
	struct op *op;
	int n;

	if ((flags & ~FERRY_SQE_NOWAIT) || !plain_entry(e, slot, &cq, &len) ||
	    (n = keytable_compose_sfx(fullkey, slot->key, slot->key_len,
				      &slot->peer->from_sfx)) < 0)
		return false;
	op = plain_op(e, slot, FERRY_OP_GET, flags, cq, len); /* len: its capacity while waiting */
	timeout_ns = slot->timeout_ns;
	atomic_store_explicit(&sq->head, head + 1, memory_order_release);
	get_take_or_park(e, op, fullkey, n, keytable_hash(fullkey, (size_t)n),
			 flags & FERRY_SQE_NOWAIT, timeout_ns);
	return true;
}

/*
 * Take the entries of every ring. Each entry's slot is given back before
 * anything can complete its op (the general path copies the entry out
 * first; the plain lanes fill their op from the slot first), so that an
 * application that sees a completion can always count on its entry's
 * slot being free again.
 */
static bool drain_sqs(struct ferry_engine *e, int *count)
{
	uint32_t nsqs = atomic_load_explicit(&e->nsqs, memory_order_acquire);
	bool drained = true;
	int n = 0;

	for (uint32_t i = 0; i < nsqs; i++) {
		struct ferry_sq *sq = e->sqs[i];
		uint32_t tail = atomic_load_explicit(&sq->tail, memory_order_acquire);
		uint32_t head = atomic_load_explicit(&sq->head, memory_order_relaxed);

		while (head != tail) {
			const struct ferry_sqe *slot = &sq->sqes[head & sq->mask];
			struct ferry_sqe local;
			size_t klen = slot->key_len < FERRY_KEY_MAX ? slot->key_len : 0;

			if (unlikely(!e->free_ops)) {
				drained = false;
				break; /* no free op: leave the rest in the ring */
			}
			if (unlikely(e->standing_in && (slot->flags & FERRY_SQE_CB_REACTOR))) {
				/* Its callback is the reactor thread's: leave it (and what follows). */
				e->stand_in_needs_reactor = true;
				drained = false;
				break;
			}
			if (unlikely(e->standing_in && stand_in_must_not_send(e, slot))) {
				/*
				 * First contact with a peer (a handshake that may take up
				 * to a second or two): the reactor's job, never the
				 * submitting caller's.
				 */
				e->stand_in_needs_reactor = true;
				drained = false;
				break;
			}
			if ((slot->opcode == FERRY_OP_PUT && drain_plain_put(e, sq, slot, head)) ||
			    (slot->opcode == FERRY_OP_GET && drain_plain_get(e, sq, slot, head))) {
				head++;
				n++;
				continue;
			}
			memcpy(&local, slot, offsetof(struct ferry_sqe, key));
			copy_short(local.key, slot->key, klen);
			local.key[klen] = '\0';
			atomic_store_explicit(&sq->head, ++head, memory_order_release);
			dispatch(e, &local);
			n++;
		}
	}
	*count += n;
	return drained;
}

/* ------------------------------------------------------------------ */
/* Rounds                                                              */
/* ------------------------------------------------------------------ */

struct io_uring_sqe *ferry__ring_sqe(struct ferry_engine *e)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

	if (!sqe) {
		io_uring_submit(&e->ring);
		sqe = io_uring_get_sqe(&e->ring);
	}
	return sqe;
}

void reactor_reap_ring(struct ferry_engine *e)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&e->ring, head, cqe) {
		unsigned bi = (unsigned)(cqe->user_data >> 56);

		if (bi) {
			struct backend *b = &e->backends[bi - 1];

			if (bi <= e->nbackends && b->ops->on_cqe) {
				backend_busy(b);
				b->ops->on_cqe(e, b, cqe->user_data & ((1ull << 56) - 1), cqe->res,
					       cqe->flags);
			}
		} else if (cqe->user_data == TAG_DOORBELL)
			e->doorbell_armed = false;
		else if (cqe->user_data == TAG_TIMEOUT)
			e->timeout_armed_at = 0; /* re-arm at the next arm */
		n++;
	}
	if (n)
		io_uring_cq_advance(&e->ring, n);
}

int reactor_run_once(struct ferry_engine *e)
{
	struct op *op;
	bool drained;
	unsigned i;
	int n = 0;

	e->now_valid = false;
	/*
	 * A stand-in leaves the parked reactor's state alone: its sleep stays
	 * announced and its io_uring completions stay for it (they end its wait).
	 */
	if (!e->standing_in) {
		if (atomic_load_explicit(&e->wake->sleeping, memory_order_relaxed))
			atomic_store_explicit(&e->wake->sleeping, 0, memory_order_relaxed);
		if (io_uring_cq_ready(&e->ring))
			reactor_reap_ring(e);
	}
	atomic_store_explicit(&e->rounds, e->rounds + 1, memory_order_relaxed);
	if (atomic_load_explicit(&e->overflowing_cqs, memory_order_relaxed))
		n += (int)cq_flush_overflows(e);
	/*
	 * Submissions first: a PUT leaves before this round spends time on
	 * arrivals, and a GET submitted with it is waiting when they come.
	 */
	drained = !sqs_pending(e) || drain_sqs(e, &n); /* the check inline: most rounds have none */
	if (n)
		for (uint32_t m = round_hooks_from(e, e->has_drained, 0); m;
		     m = round_hooks_from(e, e->has_drained, i + 1)) {
			i = (unsigned)__builtin_ctz(m);
			e->round_drained[i](e, &e->backends[i]);
		}
	for (uint32_t m = round_hooks_from(e, ~0u, 0); m; m = round_hooks_from(e, ~0u, i + 1)) {
		i = (unsigned)__builtin_ctz(m);
		n += e->round_progress[i](e, &e->backends[i]);
	}
	if (stream_round_due(e))
		n += stream_round(e);
	if (unlikely(e->retry_at) && reactor_now(e) >= e->retry_at)
		n += reactor_retry_peers(e);
	while (e->timers.n && (op = timer_pop_expired(&e->timers, reactor_now(e)))) {
		op_complete(e, op, -ETIMEDOUT, 0, NULL);
		n++;
	}
	for (uint32_t m = round_hooks_from(e, e->has_end, 0); m;
	     m = round_hooks_from(e, e->has_end, i + 1)) {
		i = (unsigned)__builtin_ctz(m);
		n += e->round_end[i](e, &e->backends[i]);
	}
	if (e->dirty_cqs)
		cq_flush_wakeups(e);
	if (atomic_load_explicit(&e->dead_cqs_pending, memory_order_relaxed))
		cq_reap_dead(e, drained);
	return n;
}

void ferry__futex_wake_all(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

void progress_unlock_shared(struct ferry_engine *e)
{
	atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
	/* A MANUAL-mode waiter may be sleeping until the driver leaves (its futex_sleep: heavy). */
	fence_light(e->asym_fences);
	if (e->mode == FERRY_PROGRESS_MANUAL &&
	    atomic_load_explicit(&e->cq_waiters, memory_order_relaxed)) {
		atomic_fetch_add(&e->cq_seq, 1);
		ferry__futex_wake_all(&e->cq_seq);
	}
}

int ferry_progress(struct ferry_engine *e)
{
	int n;

	if (unlikely(!e)) {
		log_error("ferry_progress: NULL engine");
		return -EINVAL;
	}
	if (e->mode != FERRY_PROGRESS_MANUAL)
		return 0;
	if (unlikely(!poller_ok(e)))
		return -EPERM;
	if (!progress_try_lock(e))
		return 0;
	n = reactor_run_once(e);
	progress_unlock(e);
	return n;
}

void *reactor_thread_main(void *arg)
{
	struct ferry_engine *e = arg;
	uint64_t last_work = ferry__now_ns(), lease_until;

	while (!atomic_load_explicit(&e->stop, memory_order_relaxed)) {
		if (reactor_run_once(e)) {
			last_work = reactor_now(e);
			continue;
		}
		if (reactor_poll_lease(e, reactor_now(e), &lease_until)) {
			/*
			 * Callers poll in a loop or spin in ferry_cq_wait: they
			 * run the rounds until the lease runs out.
			 */
			reactor_thread_sleep(e, lease_until); /* counts it in poll_leases */
			last_work = ferry__now_ns();
			continue;
		}
		if (reactor_now(e) - last_work < e->spin_ns) {
			if (e->now - last_work < SPIN_PAUSE_NS) {
				cpu_relax();
				continue;
			}
			/*
			 * The spin yields its CPU now: let go progress meanwhile,
			 * so that a caller on this CPU that submits runs the round
			 * itself instead of waiting for us to be scheduled again.
			 * A yield that lost the CPU (busy CPUs) ends the spin, and
			 * while they stay busy we sleep at once (reactor_sleep.c).
			 */
			if (!reactor_spin_contended(e, e->now)) {
				bool kept;

				e->parked_until = 0;
				atomic_store_explicit(&e->reactor_parked, REACTOR_YIELDING,
						      memory_order_relaxed);
				atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
				kept = reactor_spin_yield(e);
				while (!progress_try_lock(e))
					sched_yield(); /* a stand-in round: short */
				atomic_store_explicit(&e->reactor_parked, REACTOR_RUNNING,
						      memory_order_relaxed);
				if (kept)
					continue;
			}
		}
		reactor_thread_sleep(e, 0);
		last_work = ferry__now_ns();
	}
	return NULL;
}

/*
 * engine/reactor.c - the reactor: one loop per engine.
 *
 * Owns: draining the submission rings into ops, dispatching each op
 * (NOP, PUT, GET, CANCEL), matching arrivals with waiting GETs through the
 * key table, deadlines, completing ops, and the one place the progress side
 * sleeps: an io_uring wait on the doorbell eventfd (and the next deadline).
 * In THREAD mode a thread runs this loop, spinning for spin_ns while work
 * flows; in MANUAL mode the same rounds run inside ferry_progress and the
 * CQ calls. Whoever runs a round holds e->progress_busy, so everything the
 * reactor owns is single-threaded and needs no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#define NO_SLOT UINT32_MAX
#define TAG_DOORBELL 1ull
#define TAG_TIMEOUT 2ull
#define MAX_IOV 1024

uint64_t ferry__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int ferry__futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
	struct timespec ts, *tsp = NULL;

	if (timeout_ns >= 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tsp = &ts;
	}
	if (syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, tsp, NULL, 0) < 0)
		return -errno;
	return 0;
}

/* How long an idle spin pauses before it starts to yield its CPU. */
#define SPIN_PAUSE_NS 2000

void ferry__spin_step(uint64_t spun_ns)
{
	if (spun_ns < SPIN_PAUSE_NS)
		cpu_relax();
	else
		sched_yield();
}

void ferry__futex_wake_all(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
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

void ferry__op_free(struct ferry_engine *e, struct op *op)
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

static unsigned lat_bucket(uint64_t ns)
{
	unsigned b = ns ? 63u - (unsigned)__builtin_clzll(ns) : 0;

	return b > 31 ? 31 : b;
}

static void unpark(struct ferry_engine *e, struct op *op)
{
	struct key_entry *ke = op->entry;

	op_list_remove(&ke->waiters, &ke->waiters_tail, op);
	op->entry = NULL;
	keytable_put(&e->keys, ke);
}

#define RETRY_FIRST_NS 5000000ull    /* a peer not up: tried again after 5 ms, */
#define RETRY_MAX_NS 200000000ull    /* then less and less often, at least every 200 ms */

/*
 * A FERRY_SQE_WAIT_PEER PUT met a peer that is not up (-EHOSTUNREACH, or
 * its address refused: nothing of it was delivered): it waits on the
 * peer's wait list instead of completing, and the peer is tried again
 * (retry_peers) until it is up or the PUT's deadline passes. False when the
 * op must complete after all (the engine is closing).
 */
static bool wait_for_peer(struct ferry_engine *e, struct op *op)
{
	struct ferry_peer *peer = op->peer;

	if (atomic_load_explicit(&e->closing, memory_order_relaxed) ||
	    (op->flags & OP_F_WAIT_PEER))
		return false;
	if (op->state == OP_PARKED || op->state == OP_QUEUED)
		return false; /* not a PUT that was on its way */
	op->state = OP_AWAY;
	op->flags |= OP_F_WAIT_PEER;
	op_list_append(&peer->wait_head, &peer->wait_tail, op);
	if (op->heap_idx == NO_SLOT && op->interval)
		op_arm_deadline(e, op, op->interval);
	if (!peer->retrying) {
		peer->retrying = true;
		peer->retry_next = e->retry_peers;
		e->retry_peers = peer;
	}
	if (!e->retry_at) { /* retry_peers sets its own next time */
		if (!e->retry_ns)
			e->retry_ns = RETRY_FIRST_NS;
		e->retry_at = reactor_now(e) + e->retry_ns;
	}
	return true;
}

/* Try the peers that PUTs wait for again (due at e->retry_at). Returns events. */
static int retry_peers(struct ferry_engine *e)
{
	struct ferry_peer *list = e->retry_peers, *p;
	int n = 0;

	e->retry_peers = NULL;
	e->retry_at = UINT64_MAX; /* while they are tried: no new schedule */
	while ((p = list)) {
		list = p->retry_next;
		p->retrying = false;
		p->retry_next = NULL;
		if (p->wait_head) {
			ferry__peer_reached(e, p, 0); /* those that still cannot go wait again */
			n++;
		}
	}
	if (e->retry_peers) { /* still not up: less often */
		e->retry_ns = e->retry_ns * 2 > RETRY_MAX_NS ? RETRY_MAX_NS : e->retry_ns * 2;
		e->retry_at = reactor_now(e) + e->retry_ns;
	} else {
		e->retry_at = 0;
		e->retry_ns = 0; /* all up: the next wait starts soon again */
	}
	return n;
}

/* Off its peer's wait list (OP_F_WAIT_PEER): it ended there (deadline, cancel, destroy). */
static void peer_wait_remove(struct op *op)
{
	op_list_remove(&op->peer->wait_head, &op->peer->wait_tail, op);
	op->flags &= ~OP_F_WAIT_PEER;
}


void ferry__peer_reached(struct ferry_engine *e, struct ferry_peer *peer, int res)
{
	unsigned n = 0;

	/* The ones waiting now, once each: one that must wait again goes to the tail. */
	for (struct op *w = peer->wait_head; w; w = w->next)
		n++;
	while (n-- && peer->wait_head) {
		struct op *op = peer->wait_head;
		uint32_t gen = op->gen;
		int rc = res;

		peer_wait_remove(op);
		if (!rc)
			rc = reactor_send(e, op);
		if (rc)
			reactor_put_done(e, op, gen, rc);
	}
}


void op_complete(struct ferry_engine *e, struct op *op, int res, uint64_t len,
		 struct ferry_buf *buf)
{
	struct ferry_cqe cqe;

	if (unlikely(op->flags & FERRY_SQE_WAIT_PEER) && (res == -EHOSTUNREACH || res == -ECONNREFUSED) &&
	    op->peer && wait_for_peer(e, op))
		return; /* the peer is not up yet: the PUT waits for it (its deadline still runs) */
	if (op->heap_idx != NO_SLOT)
		timer_del(&e->timers, op);
	if (op->opcode >= FERRY_OP_STREAM_PUT || (op->flags & OP_F_INTERNAL))
		res = stream_op_ending(e, op, res);
	if (unlikely(op->flags & OP_F_WISH)) {
		op->flags &= ~OP_F_WISH;
		if (res < 0 && e->dir)
			e->dir->forget(e, e->dir_svc, op); /* the holder forgets the wish */
	}
	if (op->state == OP_PARKED)
		unpark(e, op);
	else if (unlikely(op->flags & OP_F_WAIT_PEER))
		peer_wait_remove(op);
	else if (op->state == OP_AWAY && op->peer && op->peer->backend &&
		 op->peer->backend->ops->forget)
		op->peer->backend->ops->forget(e, op->peer->backend, op);
	if (unlikely(op->flags & OP_F_PINNED)) {
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
		return;
	}

	STAT_ADD(e->stats.completed, 1);
	if (res < 0) {
		STAT_ADD(e->stats.failed, 1);
		if (res == -ETIMEDOUT)
			STAT_ADD(e->stats.timeouts, 1);
		else if (res == -ECANCELED)
			STAT_ADD(e->stats.cancelled, 1);
		if (op->peer && op->opcode != FERRY_OP_CANCEL)
			STAT_ADD(op->peer->stats.errors, 1);
	} else if (op->opcode == FERRY_OP_PUT || op->opcode == FERRY_OP_STREAM_PUT ||
		   op->opcode == FERRY_OP_PUBLISH) {
		STAT_ADD(e->stats.puts, 1);
		STAT_ADD(e->stats.bytes_put, len);
		if (op->start)
			STAT_ADD(e->stats.lat_put[lat_bucket(reactor_now(e) - op->start)], 1);
		STAT_ADD(op->peer->stats.puts, 1);
		STAT_ADD(op->peer->stats.bytes_out, len);
	} else if (op->opcode == FERRY_OP_GET || op->opcode == FERRY_OP_STREAM_GET ||
		   op->opcode == FERRY_OP_FETCH) {
		STAT_ADD(e->stats.gets, 1);
		STAT_ADD(e->stats.bytes_got, len);
		if (op->start)
			STAT_ADD(e->stats.lat_get[lat_bucket(reactor_now(e) - op->start)], 1);
		STAT_ADD(op->peer->stats.gets, 1);
		STAT_ADD(op->peer->stats.bytes_in, len);
	}

	cqe.user_data = op->user_data;
	cqe.res = res;
	cqe.flags = buf ? FERRY_CQE_F_BUF : 0;
	cqe.len = len;
	cqe.buf = buf;
	cqe.opcode = op->opcode;
	memset(cqe.resv, 0, sizeof(cqe.resv));

	if (op->flags & FERRY_SQE_CB_REACTOR) {
		op->cb(&cqe, op->cb_arg);
		ferry__op_free(e, op);
	} else if (cq_post(op->cq, &cqe, op->cb, op->cb_arg, op)) {
		ferry__op_free(e, op);
	}
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
static bool give_to_get(struct ferry_engine *e, struct op *op, struct ferry_buf *buf, uint64_t len,
			uint32_t wflags)
{
	if (unlikely(wflags & WIRE_F_ABORT)) {
		/* A plain GET of an aborted stream's chunk: the reason, and an error. */
		op_complete(e, op, -ECANCELED, len, buf);
		return true;
	}
	if (op->iovcnt) {
		if (len > op->len) {
			log_info("GET %llx: %llu bytes do not fit its %llu-byte iovec",
				 (unsigned long long)op->user_data, (unsigned long long)len,
				 (unsigned long long)op->len);
			op_complete(e, op, -EMSGSIZE, len, NULL);
			return false;
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
		    !(ke = keytable_get(&e->keys, fullkey, fullkey_len, h))) {
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
		if (give_to_get(e, op, buf, len, flags)) {
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
	ke->wflags = flags & WIRE_F__ALL;
	ke->present = true;
	STAT_ADD(e->keys.present, 1);
	if (flags & WIRE_F_CHUNK)
		stream_chunk_arrived(e, ke);
	return 0;
}

bool reactor_deliver_copy(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			  const void *src, uint64_t len, uint32_t flags)
{
	struct key_entry *ke;
	struct op *op;

	if (flags & (WIRE_F_CREDIT | WIRE_F_CHUNK | WIRE_F_ABORT | WIRE_F_RELCREDIT))
		return false;
	ke = keytable_find(&e->keys, fullkey, fullkey_len, keytable_hash(fullkey, fullkey_len));
	if (!ke || !(op = ke->waiters) || (op->opcode != FERRY_OP_GET && op->opcode != FERRY_OP_FETCH) ||
	    !op->iovcnt ||
	    len > op->len)
		return false; /* no GET, a zero-copy one, or one that is too small */
	STAT_ADD(e->stats.deliveries, 1);
	op_list_remove(&ke->waiters, &ke->waiters_tail, op);
	op->entry = NULL;
	op->state = OP_FREE;
	keytable_put(&e->keys, ke);
	op_scatter(op, src, len);
	STAT_ADD(e->stats.copies, 1);
	op_complete(e, op, 0, len, NULL);
	return true;
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

void ferry__peer_event(struct ferry_engine *e, const struct backend *from, const char *name,
		       enum peer_event ev, int res)
{
	if (ev == PEER_LOST)
		stream_peer_lost(e, name, res);
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (b != from && b->data && b->ops->peer_event)
			b->ops->peer_event(e, b, name, ev, res);
	}
}

void ferry__directory_set(struct ferry_engine *e, const struct directory_ops *ops, void *svc)
{
	e->dir = ops;
	e->dir_svc = svc;
}

struct backend *ferry__backend_of(struct ferry_engine *e, const struct backend_ops *ops)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops == ops)
			return &e->backends[i];
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                            */
/* ------------------------------------------------------------------ */

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
	for (uint32_t i = 0; i < sqe->iovcnt; i++) {
		if (!sqe->iov[i].iov_base && sqe->iov[i].iov_len) {
			log_error("op %llx: iov[%u] is NULL with length %zu",
				  (unsigned long long)sqe->user_data, i, sqe->iov[i].iov_len);
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
		if (b->ops->unresolve)
			b->ops->unresolve(e, b, peer);
		peer->backend = NULL;
		peer->transport = NULL;
	}
}

void reactor_unresolve_all(struct ferry_engine *e, struct backend *b)
{
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
		if (p->backend == b)
			reactor_unresolve(e, p);
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

			if (!b->ops->reaching || !b->data || !(rc = b->ops->reaching(e, b, peer)))
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
	rc = peer->backend->ops->put(e, peer->backend, op);
	if (rc == -EHOSTUNREACH || rc == -ECONNRESET)
		reactor_unresolve(e, peer); /* ask again next time: it may be back */
	return rc;
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
	if ((rc = memory_check_pin(e, sqe)))
		return rc;
	op->flags |= OP_F_PINNED;
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
	}
	if ((rc = check_peer(e, sqe)) || (rc = check_key(sqe)) || (rc = check_iov(sqe)) ||
	    (sqe->buf && sqe->iovcnt && (rc = -EINVAL)) || (rc = op_pin(e, op, sqe))) {
		op_complete(e, op, rc, 0, NULL);
		return rc;
	}
	return 0;
}

static void do_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	int rc;

	if (op_take_put(e, op, sqe))
		return;
	if (!sqe->buf && op->opcode != FERRY_OP_PUBLISH && op->peer->backend &&
	    op->peer->backend->ops->iov_put_max &&
	    (op->len = sqe_payload_len(sqe)) <= op->peer->backend->ops->iov_put_max) {
		/* The transport copies it straight from the iovec (struct backend_ops). */
		STAT_ADD(e->stats.copies, 1);
	} else if ((rc = op_fill(e, op))) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	op->key_len = sqe->key_len;
	memcpy(op->key, sqe->key, sqe->key_len + 1u);
	if (unlikely(op->opcode == FERRY_OP_PUBLISH)) {
		if (e->dir)
			e->dir->publish(e, e->dir_svc, op); /* kept here, for a peer to fetch */
		else
			op_complete(e, op, -EOPNOTSUPP, 0, NULL);
		return;
	}
	op->state = OP_AWAY;
	op->interval = sqe->timeout_ns; /* FERRY_SQE_WAIT_PEER: its deadline while it waits */
	rc = reactor_send(e, op);
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	if (op->state == OP_AWAY && op->heap_idx == NO_SLOT)
		op_arm_deadline(e, op, sqe->timeout_ns);
}

/* A LOOKUP GET parked (or NOWAIT): the directory service asks its holder. */
static void directory_fetch(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	if (e->dir)
		e->dir->fetch(e, e->dir_svc, op, sqe);
	else
		op_complete(e, op, -EOPNOTSUPP, 0, NULL);
}

static void do_get(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	char fullkey[FULLKEY_MAX];
	struct key_entry *ke;
	uint64_t h;
	int rc, n;

	if ((rc = check_peer(e, sqe)) || (rc = check_key(sqe)) || (rc = check_iov(sqe)) ||
	    (rc = op_pin(e, op, sqe))) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	n = keytable_compose(fullkey, sqe->key, sqe->key_len, sqe->peer->name, e->name);
	if (n < 0) {
		op_complete(e, op, n, 0, NULL);
		return;
	}
	op->len = sqe_payload_len(sqe); /* capacity while waiting */
	h = keytable_hash(fullkey, (size_t)n);
	ke = keytable_find(&e->keys, fullkey, (size_t)n, h);
	if (ke && ke->present) {
		struct ferry_buf *buf = ke->buf;
		uint64_t len = ke->len;

		if (op->iovcnt && len > op->len) {
			op_complete(e, op, -EMSGSIZE, len, NULL);
			return;
		}
		uint32_t wflags = ke->wflags;

		ke->buf = NULL;
		ke->present = false;
		STAT_ADD(e->keys.present, (uint32_t)-1);
		keytable_put(&e->keys, ke);
		give_to_get(e, op, buf, len, wflags);
		if (wflags & WIRE_F_CHUNK)
			stream_chunk_taken(e, fullkey, (size_t)n, wflags);
		return;
	}
	if ((sqe->flags & FERRY_SQE_NOWAIT) && op->opcode != FERRY_OP_FETCH) {
		op_complete(e, op, -EAGAIN, 0, NULL);
		return;
	}
	ke = keytable_get(&e->keys, fullkey, (size_t)n, h);
	if (!ke) {
		op_complete(e, op, -ENOSPC, 0, NULL);
		return;
	}
	op->state = OP_PARKED;
	op->entry = ke;
	op_list_append(&ke->waiters, &ke->waiters_tail, op);
	op_arm_deadline(e, op, sqe->timeout_ns);
	if (unlikely(op->opcode == FERRY_OP_FETCH))
		directory_fetch(e, op, sqe); /* ask the holder */
}

static void do_cancel(struct ferry_engine *e, struct op *op, uint64_t target)
{
	int res = -ENOENT;

	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *t = &e->ops[i];

		if (t == op || t->user_data != target || (t->flags & OP_F_INTERNAL))
			continue; /* the engine's own ops are not the application's to cancel */
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
	[FERRY_OP_GET] = { "GET", FERRY_SQE_NOWAIT | FERRY_SQE_SEGS, do_get },
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
	/* The latency histogram samples one op in 16: the clock is not free. */
	op->start = (op->index & 15) == 0 ? reactor_now(e) : 0;
	op->cb = sqe->cb;
	op->cb_arg = sqe->cb_arg;
	op->peer = NULL;
	op->iov = sqe->iov;
	op->iovcnt = sqe->iovcnt;
	op->cq = cq->engine == e && !atomic_load_explicit(&cq->dead, memory_order_relaxed)
			 ? cq : &e->default_cq;
	STAT_ADD(op->cq->inflight, 1);

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
	if (op->flags & ~FERRY_SQE__ALL) {
		log_error("op %llx: unknown flags 0x%x", (unsigned long long)op->user_data,
			  op->flags & ~FERRY_SQE__ALL);
		op->flags &= FERRY_SQE__ALL;
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

/*
 * Take the entries of every ring. Each entry is copied out and its slot
 * given back before the op runs, so that an application that sees a
 * completion can always count on its entry's slot being free again.
 */
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
			memcpy(&local, slot, offsetof(struct ferry_sqe, key));
			memcpy(local.key, slot->key, klen);
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
/* Rounds, sleep and wake                                              */
/* ------------------------------------------------------------------ */

static void reap_ring(struct ferry_engine *e)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(&e->ring, head, cqe) {
		unsigned bi = (unsigned)(cqe->user_data >> 56);

		if (bi) {
			struct backend *b = &e->backends[bi - 1];

			if (bi <= e->nbackends && b->ops->on_cqe)
				b->ops->on_cqe(e, b, cqe->user_data & ((1ull << 56) - 1), cqe->res,
					       cqe->flags);
		} else if (cqe->user_data == TAG_DOORBELL)
			e->doorbell_armed = false;
		else if (cqe->user_data == TAG_TIMEOUT)
			e->timeout_armed_at = 0; /* re-arm at the next arm */
		n++;
	}
	if (n)
		io_uring_cq_advance(&e->ring, n);
}

static void arm_doorbell(struct ferry_engine *e)
{
	struct io_uring_sqe *sqe;

	if (e->doorbell_armed)
		return;
	sqe = io_uring_get_sqe(&e->ring);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, e->doorbell_fd, &e->doorbell_val, sizeof(e->doorbell_val), 0);
	io_uring_sqe_set_data64(sqe, TAG_DOORBELL);
	e->doorbell_armed = true;
}

/*
 * Overflowing CQs: rare, so they are found by walking the CQ list under the
 * engine lock, and only when the count of overflowing CQs says so.
 */
static unsigned flush_overflows(struct ferry_engine *e)
{
	unsigned n = 0;

	if (atomic_load_explicit(&e->default_cq.overflowing, memory_order_relaxed))
		n += cq_flush_overflow(&e->default_cq);
	if (atomic_load_explicit(&e->overflowing_cqs, memory_order_relaxed)) {
		pthread_mutex_lock(&e->lock);
		for (struct ferry_cq *cq = e->cqs; cq; cq = cq->next)
			if (atomic_load_explicit(&cq->overflowing, memory_order_relaxed))
				n += cq_flush_overflow(cq);
		pthread_mutex_unlock(&e->lock);
	}
	return n;
}

static bool overflow_can_move(struct ferry_engine *e)
{
	bool yes = false;

	if (atomic_load(&e->default_cq.overflowing) && cq_ring_has_room(&e->default_cq))
		return true;
	if (atomic_load_explicit(&e->overflowing_cqs, memory_order_relaxed)) {
		pthread_mutex_lock(&e->lock);
		for (struct ferry_cq *cq = e->cqs; cq && !yes; cq = cq->next)
			yes = atomic_load(&cq->overflowing) && cq_ring_has_room(cq);
		pthread_mutex_unlock(&e->lock);
	}
	return yes;
}

/*
 * CQs destroyed by the application wait here until no round can still
 * reach them: no op targets them, and a full round that drained every ring
 * has run since (entries submitted before the destroy were taken then).
 */
static void reap_dead_cqs(struct ferry_engine *e, bool drained)
{
	struct ferry_cq **pp, *cq, *gone = NULL;

	if (!atomic_load_explicit(&e->dead_cqs_pending, memory_order_relaxed))
		return;
	pthread_mutex_lock(&e->lock);
	for (pp = &e->dead_cqs; (cq = *pp);) {
		if (drained && cq->dead_round < e->rounds && !atomic_load(&cq->inflight) &&
		    !cq->overflow_head) {
			*pp = cq->next;
			atomic_fetch_sub(&e->dead_cqs_pending, 1);
			cq->next = gone;
			gone = cq;
		} else {
			pp = &cq->next;
		}
	}
	pthread_mutex_unlock(&e->lock);
	/*
	 * Outside the lock: cq_fini runs the callbacks of completions nobody
	 * polled, and a callback may call what takes e->lock (ferry_peer_open).
	 */
	while ((cq = gone)) {
		gone = cq->next;
		cq_fini(cq);
		free(cq);
	}
}

int reactor_run_once(struct ferry_engine *e)
{
	struct op *op;
	bool drained;
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
			reap_ring(e);
	}
	atomic_store_explicit(&e->rounds, e->rounds + 1, memory_order_relaxed);
	if (atomic_load_explicit(&e->default_cq.overflowing, memory_order_relaxed) ||
	    atomic_load_explicit(&e->overflowing_cqs, memory_order_relaxed))
		n += (int)flush_overflows(e);
	/*
	 * Submissions first: a PUT leaves before this round spends time on
	 * arrivals, and a GET submitted with it is waiting when they come.
	 */
	drained = drain_sqs(e, &n);
	if (n)
		for (unsigned i = 0; i < e->nbackends; i++)
			if (e->backends[i].ops->sqs_drained)
				e->backends[i].ops->sqs_drained(e, &e->backends[i]);
	for (unsigned i = 0; i < e->nbackends; i++)
		n += e->backends[i].ops->progress(e, &e->backends[i]);
	n += stream_round(e);
	if (unlikely(e->retry_at) && reactor_now(e) >= e->retry_at)
		n += retry_peers(e);
	while (e->timers.n && (op = timer_pop_expired(&e->timers, reactor_now(e)))) {
		op_complete(e, op, -ETIMEDOUT, 0, NULL);
		n++;
	}
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops->round_end)
			n += e->backends[i].ops->round_end(e, &e->backends[i]);
	cq_flush_wakeups(e);
	reap_dead_cqs(e, drained);
	return n;
}

/* The earliest of the op deadlines and a batched stream credit falling due. */
static uint64_t next_deadline(struct ferry_engine *e)
{
	uint64_t t = timer_next(&e->timers), s = stream_next_due(e);

	t = !t ? s : !s ? t : t < s ? t : s;
	if (unlikely(e->retry_at) && (!t || e->retry_at < t))
		t = e->retry_at; /* peers that PUTs wait for are tried again */
	return t;
}

bool reactor_has_work(struct ferry_engine *e)
{
	uint32_t nsqs = atomic_load_explicit(&e->nsqs, memory_order_acquire);

	for (uint32_t i = 0; i < nsqs; i++) {
		struct ferry_sq *sq = e->sqs[i];

		if (atomic_load_explicit(&sq->tail, memory_order_acquire) !=
		    atomic_load_explicit(&sq->head, memory_order_relaxed))
			return true;
	}
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops->has_work(e, &e->backends[i]))
			return true;
	if (overflow_can_move(e)) /* only worth a round if a consumer made room */
		return true;
	if (stream_has_work(e))
		return true;
	return next_deadline(e) && next_deadline(e) <= ferry__now_ns();
}

/*
 * The progress side announced its sleep (its wake page says so): each
 * transport's last word before it (prepare_sleep), then one more look.
 * True: work is there, the sleep is called off.
 */
static bool reactor_sleep_check(struct ferry_engine *e)
{
	bool work = false;

	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (b->ops->prepare_sleep && b->ops->prepare_sleep(e, b))
			work = true;
	}
	return work || reactor_has_work(e);
}

/* How long the sleeper may sleep: the next deadline or timeout_ns. */
static int64_t sleep_budget(struct ferry_engine *e, int64_t timeout_ns)
{
	uint64_t next = next_deadline(e);

	if (next) {
		uint64_t now = ferry__now_ns();
		int64_t left = next > now ? (int64_t)(next - now) : 0;

		if (timeout_ns < 0 || left < timeout_ns)
			timeout_ns = left;
	}
	return timeout_ns;
}

static void announce_sleep(struct ferry_engine *e)
{
	atomic_store_explicit(&e->wake->doorbell_rung, 0, memory_order_relaxed);
	atomic_store_explicit(&e->wake->sleeping, 1, memory_order_release);
	atomic_thread_fence(memory_order_seq_cst);
}

/*
 * The sleep used under valgrind, which keeps its thread lock across an
 * io_uring_enter wait (so one sleeping thread would stop the process):
 * ppoll on the doorbell, and on the ring fd when a doorbell read is queued
 * there (its completion then makes the ring readable).
 */
static void sleep_in_ppoll(struct ferry_engine *e, int64_t budget)
{
	struct pollfd fds[2] = {
		{ .fd = e->doorbell_fd, .events = POLLIN },
		{ .fd = e->ring.ring_fd, .events = POLLIN },
	};
	struct timespec ts, *tsp = NULL;
	uint64_t v;

	if (budget >= 0) {
		ts.tv_sec = budget / 1000000000;
		ts.tv_nsec = budget % 1000000000;
		tsp = &ts;
	}
	if (ppoll(fds, 2, tsp, NULL) > 0 && (fds[0].revents & POLLIN) && !e->doorbell_armed) {
		if (read(e->doorbell_fd, &v, sizeof(v)) < 0)
			log_debug("doorbell read: %s", ferry_strerror(-errno));
	}
}

void reactor_sleep(struct ferry_engine *e, int64_t timeout_ns)
{
	reactor_sleep_unless(e, timeout_ns, NULL, 0);
}

void reactor_sleep_unless(struct ferry_engine *e, int64_t timeout_ns, _Atomic uint32_t *word,
			  uint32_t val)
{
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe = NULL;
	int64_t budget;

	if (!e->sleep_in_ppoll)
		arm_doorbell(e);
	announce_sleep(e);
	if (reactor_sleep_check(e) || atomic_load(&e->stop) || (word && atomic_load(word) != val)) {
		atomic_store(&e->wake->sleeping, 0);
		io_uring_submit(&e->ring);
		return;
	}
	budget = sleep_budget(e, timeout_ns);
	if (e->sleep_in_ppoll) {
		io_uring_submit(&e->ring);
		if (budget != 0)
			sleep_in_ppoll(e, budget);
	} else if (budget < 0) {
		io_uring_submit_and_wait(&e->ring, 1);
	} else if (budget > 0) {
		ts.tv_sec = budget / 1000000000;
		ts.tv_nsec = budget % 1000000000;
		io_uring_submit_and_wait_timeout(&e->ring, &cqe, 1, &ts, NULL);
	} else {
		io_uring_submit(&e->ring);
	}
	atomic_store(&e->wake->sleeping, 0);
	reap_ring(e);
}

/*
 * MANUAL mode with ferry_cq_fd: arrange for the io_uring fd to become
 * readable when anything needs progress (doorbell, next deadline), and
 * announce the sleep. Returns 0, or -EBUSY if work is already there.
 */
int reactor_arm_manual(struct ferry_engine *e)
{
	uint64_t next = next_deadline(e);

	arm_doorbell(e);
	/*
	 * A TIMEOUT op makes the fd readable at the next deadline. Another is
	 * added only when this deadline is earlier than the one armed (extra
	 * ones just cause one spurious wake each).
	 */
	if (next && (!e->timeout_armed_at || next < e->timeout_armed_at)) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
		uint64_t now = ferry__now_ns(), rel = next > now ? next - now : 0;

		if (sqe) {
			e->arm_ts.tv_sec = (long long)(rel / 1000000000);
			e->arm_ts.tv_nsec = (long long)(rel % 1000000000);
			io_uring_prep_timeout(sqe, &e->arm_ts, 0, 0);
			io_uring_sqe_set_data64(sqe, TAG_TIMEOUT);
			e->timeout_armed_at = next;
		}
	}
	io_uring_submit(&e->ring);
	announce_sleep(e);
	if (reactor_sleep_check(e)) {
		atomic_store(&e->wake->sleeping, 0);
		return -EBUSY;
	}
	return 0;
}

void reactor_wake(struct ferry_engine *e)
{
	if (atomic_load_explicit(&e->wake->sleeping, memory_order_acquire) &&
	    !atomic_exchange(&e->wake->doorbell_rung, 1)) {
		uint64_t one = 1;

		if (write(e->doorbell_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			log_warn("engine %s: doorbell write: %s", e->name, ferry_strerror(-errno));
	}
}

void progress_unlock(struct ferry_engine *e)
{
	atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
	/* A MANUAL-mode waiter may be sleeping until the driver leaves. */
	atomic_thread_fence(memory_order_seq_cst);
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
	if (e->mode != FERRY_PROGRESS_MANUAL || !progress_try_lock(e))
		return 0;
	n = reactor_run_once(e);
	progress_unlock(e);
	return n;
}

/*
 * The reactor thread's wait for a completion (the doorbell read, a backend's
 * I/O) or budget_ns (< 0: none), entered without holding progress. It does
 * not touch the ring's memory, which the holder of progress may be using.
 */
static void wait_ring_unlocked(struct ferry_engine *e, int64_t budget_ns)
{
	struct __kernel_timespec ts;
	struct io_uring_getevents_arg arg = { .ts = (uint64_t)(uintptr_t)&ts };
	unsigned flags = IORING_ENTER_GETEVENTS;
	void *argp = NULL;
	size_t argsz = 0;

	if (budget_ns >= 0) {
		ts.tv_sec = budget_ns / 1000000000;
		ts.tv_nsec = budget_ns % 1000000000;
		flags |= IORING_ENTER_EXT_ARG;
		argp = &arg;
		argsz = sizeof(arg);
	}
	if (syscall(__NR_io_uring_enter, e->ring.ring_fd, 0, 1, flags, argp, argsz) < 0 &&
	    errno != ETIME && errno != EINTR && errno != EAGAIN && errno != EBUSY)
		log_debug("engine %s: io_uring wait: %s", e->name, ferry_strerror(-errno));
}

/*
 * THREAD mode: sleep like reactor_sleep, but park: progress is let go for
 * the wait, so that a caller that submits or waits meanwhile can run rounds
 * itself (reactor_stand_in) instead of waking this thread. Taken back after.
 */
static void reactor_thread_sleep(struct ferry_engine *e)
{
	/* Under valgrind: ppoll on the doorbell and the ring (see sleep_in_ppoll). */
	struct pollfd fds[2] = {
		{ .fd = e->doorbell_fd, .events = POLLIN },
		{ .fd = e->ring.ring_fd, .events = POLLIN },
	};
	int64_t budget;
	uint64_t spun = 0, t0 = 0;

	if (!e->sleep_in_ppoll && !(e->ring.features & IORING_FEAT_EXT_ARG)) {
		reactor_sleep(e, -1); /* an old kernel: no timed wait outside liburing, no parking */
		return;
	}
	if (!e->sleep_in_ppoll)
		arm_doorbell(e);
	announce_sleep(e);
	if (reactor_sleep_check(e) || atomic_load(&e->stop)) {
		atomic_store(&e->wake->sleeping, 0);
		io_uring_submit(&e->ring);
		return;
	}
	budget = sleep_budget(e, -1);
	io_uring_submit(&e->ring);
	if (budget == 0) {
		atomic_store(&e->wake->sleeping, 0);
		reap_ring(e);
		return;
	}
	e->parked_until = budget < 0 ? UINT64_MAX : ferry__now_ns() + (uint64_t)budget;
	atomic_store_explicit(&e->reactor_parked, REACTOR_ASLEEP, memory_order_relaxed);
	atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
	if (e->sleep_in_ppoll) {
		struct timespec ts, *tsp = NULL;

		if (budget >= 0) {
			ts.tv_sec = budget / 1000000000;
			ts.tv_nsec = budget % 1000000000;
			tsp = &ts;
		}
		if (ppoll(fds, 2, tsp, NULL) < 0)
			fds[0].revents = 0;
	} else {
		wait_ring_unlocked(e, budget);
	}
	/* A stand-in round may be running: it is short (it never sleeps). */
	while (!progress_try_lock(e)) {
		if (!t0)
			t0 = ferry__now_ns();
		else
			spun = ferry__now_ns() - t0;
		ferry__spin_step(spun);
	}
	atomic_store_explicit(&e->reactor_parked, REACTOR_RUNNING, memory_order_relaxed);
	atomic_store(&e->wake->sleeping, 0);
	if (e->sleep_in_ppoll && (fds[0].revents & POLLIN) && !e->doorbell_armed) {
		uint64_t v;

		/* ppoll saw it readable, and stand-ins never read it: no block. */
		if (read(e->doorbell_fd, &v, sizeof(v)) < 0)
			log_debug("doorbell read: %s", ferry_strerror(-errno));
	}
	reap_ring(e);
}

/* Ring our own doorbell for the parked reactor, unless someone already did. */
static void ring_parked(struct ferry_engine *e)
{
	uint64_t one = 1;

	if (!atomic_exchange(&e->wake->doorbell_rung, 1) &&
	    write(e->doorbell_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("engine %s: doorbell write: %s", e->name, ferry_strerror(-errno));
}

/*
 * Take progress from a parked reactor: true with progress held and the
 * reactor still parked with no CB_REACTOR op pending.
 */
static bool stand_in_lock(struct ferry_engine *e)
{
	if (e->mode != FERRY_PROGRESS_THREAD ||
	    !atomic_load_explicit(&e->reactor_parked, memory_order_acquire) ||
	    !progress_try_lock(e))
		return false;
	if (!atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) || e->reactor_cb_ops) {
		/* The reactor is back, or a callback of its own is pending. */
		progress_unlock(e);
		return false;
	}
	return true;
}

/*
 * One round in the parked reactor's place, progress held. Returns true if
 * the reactor must be woken for something a stand-in does not do: a
 * CB_REACTOR op, a deadline before its sleep ends.
 */
static bool stand_in_round(struct ferry_engine *e)
{
	uint64_t next;

	e->standing_in = true;
	e->stand_in_needs_reactor = false;
	reactor_run_once(e);
	e->standing_in = false;
	next = next_deadline(e);
	return e->stand_in_needs_reactor || e->reactor_cb_ops || (next && next < e->parked_until);
}

bool reactor_stand_in(struct ferry_engine *e)
{
	bool wake;

	if (!stand_in_lock(e))
		return false;
	wake = stand_in_round(e);
	/* Only a reactor asleep needs its doorbell; a yielding one comes back soon. */
	if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) == REACTOR_ASLEEP)
		wake = wake || reactor_sleep_check(e); /* the reactor sleeps meanwhile */
	else
		wake = false;
	progress_unlock(e);
	if (wake)
		ring_parked(e); /* its sleep is still announced */
	return true;
}

void reactor_watch(struct ferry_engine *e, bool *watching)
{
	bool wake;

	if (!*watching) {
		if (e->mode != FERRY_PROGRESS_THREAD ||
		    atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP)
			return;
		if (atomic_exchange(&e->watcher, 1)) {
			reactor_stand_in(e); /* another caller keeps watch */
			return;
		}
		if (!stand_in_lock(e)) {
			atomic_store(&e->watcher, 0);
			return;
		}
		if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP) {
			progress_unlock(e);
			atomic_store(&e->watcher, 0);
			return;
		}
		/* Suspend its announced sleep: we poll, nobody need ring. */
		atomic_store_explicit(&e->wake->sleeping, 0, memory_order_relaxed);
		*watching = true;
	} else if (!stand_in_lock(e)) {
		if (atomic_load_explicit(&e->reactor_parked, memory_order_acquire) != REACTOR_ASLEEP) {
			/* The reactor woke and took over (its sleep ended). */
			*watching = false;
			atomic_store(&e->watcher, 0);
		}
		return;
	}
	wake = stand_in_round(e) &&
	       atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) == REACTOR_ASLEEP;
	progress_unlock(e);
	if (wake) {
		reactor_unwatch(e, watching);
		ring_parked(e);
	}
}

void reactor_unwatch(struct ferry_engine *e, bool *watching)
{
	bool wake = false;

	if (!*watching)
		return;
	*watching = false;
	for (uint64_t t0 = ferry__now_ns();;) {
		if (atomic_load_explicit(&e->reactor_parked, memory_order_acquire) != REACTOR_ASLEEP)
			break; /* awake again: it announces its own sleeps */
		if (progress_try_lock(e)) {
			if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) ==
			    REACTOR_ASLEEP) {
				/* Announce its sleep again, then look (pairs with wake_peer). */
				atomic_store(&e->wake->sleeping, 1);
				atomic_thread_fence(memory_order_seq_cst);
				wake = reactor_has_work(e);
			}
			progress_unlock(e);
			break;
		}
		ferry__spin_step(ferry__now_ns() - t0); /* a submitter's stand-in round */
	}
	atomic_store(&e->watcher, 0);
	if (wake)
		ring_parked(e);
}

void *reactor_thread_main(void *arg)
{
	struct ferry_engine *e = arg;
	uint64_t last_work = ferry__now_ns();

	while (!atomic_load_explicit(&e->stop, memory_order_relaxed)) {
		if (reactor_run_once(e)) {
			last_work = reactor_now(e);
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
			 */
			e->parked_until = 0;
			atomic_store_explicit(&e->reactor_parked, REACTOR_YIELDING, memory_order_relaxed);
			atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
			sched_yield();
			while (!progress_try_lock(e))
				sched_yield(); /* a stand-in round: short */
			atomic_store_explicit(&e->reactor_parked, REACTOR_RUNNING, memory_order_relaxed);
			continue;
		}
		reactor_thread_sleep(e);
		last_work = ferry__now_ns();
	}
	return NULL;
}

static int wake_page_init(struct ferry_engine *e)
{
	void *m;

	e->wake_fd = memfd_create("ferry-wake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (e->wake_fd < 0 || ftruncate(e->wake_fd, 4096) < 0 ||
	    fcntl(e->wake_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int rc = -errno;

		log_error("engine %s: wake page: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, e->wake_fd, 0);
	if (m == MAP_FAILED) {
		int rc = -errno;

		log_error("engine %s: wake page mmap: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	e->wake = m;
	return 0;
}

int reactor_init(struct ferry_engine *e)
{
	int rc;

	rc = wake_page_init(e);
	if (rc)
		return rc;
	e->doorbell_fd = eventfd(0, EFD_CLOEXEC);
	if (e->doorbell_fd < 0) {
		rc = -errno;
		log_error("engine %s: eventfd: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	e->sleep_in_ppoll = RUNNING_ON_VALGRIND != 0;
	rc = io_uring_queue_init(64, &e->ring, 0);
	if (rc < 0) {
		log_error("engine %s: io_uring_queue_init: %s", e->name, ferry_strerror(rc));
		close(e->doorbell_fd);
		e->doorbell_fd = -1;
		return rc;
	}
	e->ops = calloc(e->max_ops, sizeof(*e->ops));
	if (!e->ops)
		return -ENOMEM;
	for (uint32_t i = e->max_ops; i-- > 0;) {
		e->ops[i].index = i;
		e->ops[i].heap_idx = NO_SLOT;
		e->ops[i].next = e->free_ops;
		e->free_ops = &e->ops[i];
	}
	rc = timer_init(&e->timers, e->max_ops);
	if (!rc)
		rc = keytable_init(&e->keys, e->max_keys, e->max_ops);
	if (!rc)
		rc = stream_init(e);
	return rc;
}

/*
 * At destroy, with progress held and the reactor thread gone: everything
 * still pending completes with -ECANCELED, its callback running here.
 */
void reactor_shutdown(struct ferry_engine *e)
{
	uint32_t nsqs = atomic_load(&e->nsqs);

	e->now_valid = false;
	/* Entries submitted but never taken. */
	for (uint32_t i = 0; i < nsqs; i++) {
		struct ferry_sq *sq = e->sqs[i];
		uint32_t tail = atomic_load(&sq->tail), head = atomic_load(&sq->head);

		for (; head != tail; head++) {
			struct ferry_sqe *sqe = &sq->sqes[head & sq->mask];
			struct ferry_cqe cqe = { .user_data = sqe->user_data, .res = -ECANCELED,
						 .opcode = sqe->opcode };

			if ((sqe->opcode == FERRY_OP_PUT || sqe->opcode == FERRY_OP_PUBLISH ||
			     sqe->opcode == FERRY_OP_STREAM_PUT) &&
			    sqe->buf && atomic_load(&sqe->buf->state) == POOL_BUF_LIVE)
				pool_free(sqe->buf);
			STAT_ADD(e->stats.cancelled, 1);
			if (sqe->cb)
				sqe->cb(&cqe, sqe->cb_arg);
		}
		atomic_store(&sq->head, tail);
	}
	/* Ops in flight. */
	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *op = &e->ops[i];

		if (op_state_pending(op->state))
			op_complete(e, op, -ECANCELED, 0, NULL);
	}
	stream_shutdown(e);
	/* Data that arrived and was never consumed. */
	for (uint32_t i = 0; i < e->keys.capacity; i++) {
		struct key_entry *ke = &e->keys.entries[i];

		if (ke->present && ke->buf) {
			pool_free(ke->buf);
			ke->buf = NULL;
			ke->present = false;
		}
	}
}

void reactor_fini(struct ferry_engine *e)
{
	stream_fini(e);
	keytable_fini(&e->keys);
	timer_fini(&e->timers);
	free(e->ops);
	e->ops = NULL;
	if (e->ring.ring_fd > 0)
		io_uring_queue_exit(&e->ring);
	if (e->doorbell_fd >= 0)
		close(e->doorbell_fd);
	if (e->wake)
		munmap(e->wake, 4096);
	if (e->wake_fd >= 0)
		close(e->wake_fd);
}

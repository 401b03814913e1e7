/*
 * backends/loop/loop.c - the loopback transport: engines of one process.
 *
 * Owns: the process-wide directory of engines by (namespace, name), one
 * endpoint per engine (an intrusive lock-free MPSC inbox, Vyukov's design),
 * and the messages that carry a PUT to its destination and its result back.
 *
 * A PUT becomes a message taken from the sender's own preallocated set,
 * holding the full key "{key}@{from}_{to}" the sender composed (its peer
 * handle's suffix), so the receiver composes nothing: it travels to the
 * destination's inbox, the destination's reactor hands it to
 * its key table (reactor_deliver), writes the result into it and sends it
 * home, where the sender's reactor completes the op. A pool buffer's data
 * never moves: the message carries the buffer, whose memory both engines
 * can read. A PUT of an iovec of at most LOOP_INLINE_MAX bytes takes no pool
 * block: its data is copied into the message (iov_put_max), and from there
 * into a waiting GET's iovec (reactor_deliver_copy), or into a block of the
 * destination's pool when none waits. An engine whose inbox stays empty
 * has its loop transport quiet (transport.h): its rounds skip it until a
 * sender wakes it (ferry__backend_wake in ep_send).
 *
 * Direct delivery: a PUT of such an iovec to an engine that drives its own
 * progress (FERRY_PROGRESS_MANUAL; FERRY_ENGINE_SINGLE_POLLER: only on its
 * poller's thread), is not doing so at this moment, has nothing in its
 * inbox and a GET waiting for the key (into an iovec, or for a buffer;
 * keytable_maybe_waiting says whether to look), is delivered by
 * the sender's reactor itself, under the destination's progress lock (taken
 * with a try: never waited for), as the destination's round would (its
 * CQ's wake-ups, its MANUAL waiters, its sleeper): no message travels and
 * none comes back; the PUT completes in a later round of the sender's, as
 * it would when its RESULT came home (so the round that delivered ends
 * sooner, and with it the GET's latency).
 * Anything else takes the inbox, so PUTs between two engines stay in order.
 *
 * Lifetimes: an endpoint is reference counted (its engine, every peer
 * handle resolved to it, every message away from home). Sending into an
 * endpoint is bracketed by a `senders` count; closing sets `closed` and
 * waits for senders to leave, so after close nothing enters its inbox and
 * its engine may go. Messages that come home to a closed endpoint are
 * dropped, and the last reference frees the endpoint and its messages.
 *
 * An engine that goes tells every other engine of its namespace in this
 * process (a GONE message, allocated then: destroy is not a hot path), as
 * the death of a peer process is noticed over shm and tcp: GETs waiting
 * for its keys and its streams end with -ECONNRESET, and peer handles
 * resolved to it are unresolved, so the next PUT finds a new engine of its
 * name. A PUT that still meets a closed endpoint looks the name up again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { MSG_PUT = 1, MSG_RESULT = 2, MSG_GONE = 3 /* home's engine went; malloc'd */ };

/*
 * Rounds in a row that find the inbox empty before the transport goes quiet:
 * an engine in a PUT/GET exchange gets a message every few rounds and stays
 * awake (going quiet costs both ends an atomic); an idle one stops paying.
 */
#define LOOP_QUIET_ROUNDS 64u

/* A PUT of an iovec up to this size travels in its message (iov_put_max). */
#define LOOP_INLINE_MAX 256u

struct loop_ep;

struct loop_msg {
	struct loop_msg *_Atomic next;
	int kind;
	int res;
	struct loop_ep *home;
	struct op *op;
	uint32_t gen;
	uint32_t flags;
	struct ferry_buf *buf;
	uint64_t len;
	uint64_t round; /* delivered directly: the sender's round it was in (take_done) */
	uint16_t key_len;
	bool inl; /* the data is in data[] (buf is NULL) */
	/* "{key}@{from}_{to}", composed by the sender (its peer handle's to_sfx). */
	char key[FULLKEY_MAX];
	struct loop_msg *free_next;
	unsigned char data[LOOP_INLINE_MAX];
};

struct loop_ep {
	_Atomic int refs;
	_Atomic int closed;
	_Atomic int senders;
	struct ferry_engine *engine; /* these two: valid while !closed, inside a send */
	struct backend *backend;
	bool manual;                 /* its engine's progress is FERRY_PROGRESS_MANUAL */
	char ns[FERRY_NAME_MAX];
	char name[FERRY_NAME_MAX];
	/* Inbox: producers swap tail; the owner's reactor pops at head. */
	struct loop_msg *_Atomic tail cacheline_aligned;
	struct loop_msg *head cacheline_aligned;
	struct loop_msg stub;
	/* Messages of this endpoint; the free list is the owner's alone. */
	struct loop_msg *msgs;
	struct loop_msg *free_msgs;
	/*
	 * The owner's: PUTs delivered directly (ep_send_put), in order, each
	 * completed in a later round than the one it was delivered in (as
	 * when its RESULT comes home): take_done.
	 */
	struct loop_msg *done_head, *done_tail;
	uint32_t empty_rounds; /* the owner's: rounds in a row that found the inbox empty */
	struct loop_ep *dir_next;
};

/* The directory of live endpoints: the one piece of process-wide state. */
static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loop_ep *dir_head;
static pthread_once_t dir_once = PTHREAD_ONCE_INIT;

/*
 * Engines do not survive fork(): the child has copies of its parent's
 * engines without their threads. Forget them in the child, so its own
 * engines never send to a ghost (the copies are unusable; they are left).
 */
static void dir_forget_after_fork(void)
{
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;

	dir_lock = fresh;
	dir_head = NULL;
}

static void dir_setup(void)
{
	pthread_atfork(NULL, NULL, dir_forget_after_fork);
}

static void ep_ref(struct loop_ep *ep)
{
	atomic_fetch_add_explicit(&ep->refs, 1, memory_order_relaxed);
}

static void ep_unref(struct loop_ep *ep)
{
	if (atomic_fetch_sub_explicit(&ep->refs, 1, memory_order_acq_rel) == 1) {
		free(ep->msgs);
		free(ep);
	}
}

static void inbox_push(struct loop_ep *ep, struct loop_msg *m)
{
	struct loop_msg *prev;

	atomic_store_explicit(&m->next, NULL, memory_order_relaxed);
	prev = atomic_exchange_explicit(&ep->tail, m, memory_order_acq_rel);
	atomic_store_explicit(&prev->next, m, memory_order_release);
}

static struct loop_msg *inbox_pop(struct loop_ep *ep)
{
	struct loop_msg *head = ep->head;
	struct loop_msg *next = atomic_load_explicit(&head->next, memory_order_acquire);

	if (head == &ep->stub) {
		if (!next)
			return NULL;
		ep->head = next;
		head = next;
		next = atomic_load_explicit(&next->next, memory_order_acquire);
	}
	if (next) {
		ep->head = next;
		return head;
	}
	if (atomic_load_explicit(&ep->tail, memory_order_acquire) != head)
		return NULL; /* a producer is between its swap and its link */
	inbox_push(ep, &ep->stub);
	next = atomic_load_explicit(&head->next, memory_order_acquire);
	if (next) {
		ep->head = next;
		return head;
	}
	return NULL;
}

static bool inbox_nonempty(struct loop_ep *ep)
{
	return ep->head != &ep->stub ||
	       atomic_load_explicit(&ep->stub.next, memory_order_acquire) ||
	       atomic_load_explicit(&ep->tail, memory_order_acquire) != &ep->stub;
}

/* Put m into ep's inbox unless ep is closed. Returns 0 or -ECONNRESET. */
static int ep_send(struct loop_ep *ep, struct loop_msg *m)
{
	int rc = 0;

	atomic_fetch_add(&ep->senders, 1); /* seq_cst: pairs with ep_close */
	if (atomic_load(&ep->closed)) {
		rc = -ECONNRESET;
	} else {
		inbox_push(ep, m);
		ferry__backend_wake(ep->engine, ep->backend); /* its progress may be quiet */
	}
	atomic_fetch_sub_explicit(&ep->senders, 1, memory_order_release);
	return rc;
}

static void ep_close(struct loop_ep *ep)
{
	atomic_store(&ep->closed, 1);
	while (atomic_load(&ep->senders))
		cpu_relax();
}

static struct loop_ep *dir_find_locked(const char *ns, const char *name)
{
	for (struct loop_ep *ep = dir_head; ep; ep = ep->dir_next)
		if (!atomic_load(&ep->closed) && strcmp(ep->ns, ns) == 0 &&
		    strcmp(ep->name, name) == 0)
			return ep;
	return NULL;
}

static int loop_init(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *ep = aligned_alloc(CACHELINE, sizeof(*ep));

	if (!ep)
		return -ENOMEM;
	memset(ep, 0, sizeof(*ep));
	ep->msgs = calloc(e->max_ops, sizeof(*ep->msgs));
	if (!ep->msgs) {
		free(ep);
		return -ENOMEM;
	}
	for (uint32_t i = e->max_ops; i-- > 0;) {
		ep->msgs[i].home = ep;
		ep->msgs[i].free_next = ep->free_msgs;
		ep->free_msgs = &ep->msgs[i];
	}
	atomic_init(&ep->refs, 1);
	ep->engine = e;
	ep->manual = e->mode == FERRY_PROGRESS_MANUAL;
	ep->backend = b;
	snprintf(ep->ns, sizeof(ep->ns), "%s", e->ns);
	snprintf(ep->name, sizeof(ep->name), "%s", e->name);
	ep->head = &ep->stub;
	atomic_init(&ep->tail, &ep->stub);

	pthread_once(&dir_once, dir_setup);
	pthread_mutex_lock(&dir_lock);
	if (dir_find_locked(e->ns, e->name)) {
		pthread_mutex_unlock(&dir_lock);
		log_error("engine name \"%s\" is already live in namespace \"%s\"", e->name,
			  e->ns);
		free(ep->msgs);
		free(ep);
		return -EADDRINUSE;
	}
	ep->dir_next = dir_head;
	dir_head = ep;
	pthread_mutex_unlock(&dir_lock);
	b->data = ep;
	return 0;
}

static int loop_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct loop_ep *ep;

	(void)b;
	pthread_mutex_lock(&dir_lock);
	ep = dir_find_locked(e->ns, peer->name);
	if (ep)
		ep_ref(ep);
	pthread_mutex_unlock(&dir_lock);
	if (!ep)
		return -EHOSTUNREACH;
	peer->transport = ep;
	return 0;
}

static void loop_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	(void)b;
	if (peer->transport)
		ep_unref(peer->transport);
	peer->transport = NULL;
}

/*
 * May this thread take de's progress for the direct path? A SINGLE_POLLER
 * engine's progress is its poller's alone (no lock guards it): only when
 * the sender runs on that thread (engines of one thread, driven in turn).
 */
static inline bool drives_here(struct ferry_engine *de)
{
	return !de->single_poller ||
	       atomic_load_explicit(&de->poller, memory_order_relaxed) == this_thread();
}

/*
 * Send PUT m (op's) to dst: the direct path (see the top) when it may be
 * taken, else into dst's inbox (a small PUT's data gathered into m then),
 * both inside one `senders` bracket. 1: delivered here, the PUT's result
 * is in m->res; 0: in the inbox; -ECONNRESET: dst is closed.
 */
static int ep_send_put(struct ferry_engine *e, struct loop_ep *self, struct loop_ep *dst,
		       struct op *op, struct loop_msg *m)
{
	bool gathered = !m->inl;
	struct ferry_engine *de;
	int rc = 0;

	atomic_fetch_add(&dst->senders, 1); /* seq_cst: pairs with ep_close */
	if (atomic_load(&dst->closed)) {
		rc = -ECONNRESET;
		goto out;
	}
	de = dst->engine;
	if (m->inl && dst->manual && de != e && keytable_maybe_waiting(&de->keys) &&
	    drives_here(de) && progress_try_lock(de)) {
		/* Its inbox first (it may hold an earlier PUT of ours): then not here. */
		if (!inbox_nonempty(dst)) {
			const void *src = m->data;

			if (op->iovcnt == 1 && !(op->flags & FERRY_SQE_SEGS)) {
				src = op->iov[0].iov_base; /* one plain iovec: read in place */
			} else {
				op_gather(op, m->data, op->len);
				gathered = true;
			}
			de->now_valid = false; /* its clock is read fresh, as in its round */
			if (reactor_deliver_waiting(de, m->key, m->key_len, src, op->len, m->flags,
						    true) > 0) {
				m->res = 0;
				rc = 1;
			}
			if (de->dirty_cqs)
				cq_flush_wakeups(de);
			/*
			 * Whoever sleeps on its fd wakes, as an arrival into its
			 * inbox would wake it (ferry__backend_wake): the CQE may be
			 * in a CQ other than the one it armed. (A MANUAL engine's
			 * sleep is announced under its progress lock, which we
			 * hold: no fence needed between the CQE and this look.)
			 */
			if (rc)
				reactor_wake(de);
		}
		progress_unlock(de);
		if (rc)
			goto out;
	}
	if (!gathered)
		op_gather(op, m->data, op->len);
	ep_ref(self); /* the message holds its home */
	inbox_push(dst, m);
	ferry__backend_wake(de, dst->backend); /* its progress may be quiet */
out:
	atomic_fetch_sub_explicit(&dst->senders, 1, memory_order_release);
	return rc;
}

/*
 * PUTs delivered directly: their results, in the order they were sent, up
 * to the first delivered in round `now` (UINT64_MAX: all of them).
 */
static int take_done(struct ferry_engine *e, struct loop_ep *self, uint64_t now)
{
	struct loop_msg *m;
	int n = 0;

	while ((m = self->done_head) && m->round != now) {
		self->done_head = m->free_next;
		reactor_put_done(e, m->op, m->gen, m->res);
		m->free_next = self->free_msgs;
		self->free_msgs = m;
		n++;
	}
	if (!self->done_head)
		self->done_tail = NULL;
	return n;
}

static int loop_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct loop_ep *self = b->data;
	struct loop_ep *dst = op->peer->transport;
	struct loop_msg *m;
	int rc;

	if (atomic_load_explicit(&dst->closed, memory_order_relaxed)) {
		/* Its engine went (its GONE may not have come yet): a new one of its name? */
		struct loop_ep *now;

		pthread_mutex_lock(&dir_lock);
		now = dir_find_locked(e->ns, op->peer->name);
		if (now)
			ep_ref(now);
		pthread_mutex_unlock(&dir_lock);
		if (!now)
			return -EHOSTUNREACH; /* the reactor asks again next time */
		ep_unref(dst);
		op->peer->transport = dst = now;
	}
	m = self->free_msgs;
	if (!m) {
		/*
		 * Every message is away: PUTs that timed out or were cancelled
		 * left theirs at a peer that does not answer (a MANUAL engine
		 * nobody drives). Refuse rather than wait without bound.
		 */
		log_limited(FERRY__LOG_WARN, "engine %s: %u PUTs still away at peers that do not "
			    "answer; refusing more", e->name, e->max_ops);
		return -ENOBUFS;
	}
	self->free_msgs = m->free_next;
	m->kind = MSG_PUT;
	m->res = 0;
	m->op = op;
	m->gen = op->gen;
	m->flags = op->flags & WIRE_F__ALL;
	m->buf = op->buf;
	m->len = op->len;
	m->inl = !op->buf; /* an iovec of at most iov_put_max bytes */
	rc = keytable_compose_sfx(m->key, op->key, op->key_len, &op->peer->to_sfx);
	if (rc < 0) {
		m->free_next = self->free_msgs;
		self->free_msgs = m;
		return rc;
	}
	m->key_len = (uint16_t)rc;
	rc = ep_send_put(e, self, dst, op, m);
	if (rc == 1) {
		m->free_next = NULL; /* its result waits for a later round (take_done) */
		m->round = atomic_load_explicit(&e->rounds, memory_order_relaxed);
		if (self->done_tail)
			self->done_tail->free_next = m;
		else
			self->done_head = m;
		self->done_tail = m;
		return 0;
	}
	if (rc) {
		m->free_next = self->free_msgs;
		self->free_msgs = m;
		return rc;
	}
	op->buf = NULL; /* the message owns the data now */
	return 0;
}

/*
 * A PUT whose data is in its message: into a waiting GET's iovec, or into a
 * block of our pool (a full pool refuses it with -ENOBUFS). Returns its res.
 */
static int take_inline(struct ferry_engine *e, struct loop_msg *m, const char *fullkey, size_t n)
{
	struct ferry_buf *buf;
	int rc = reactor_deliver_waiting(e, fullkey, n, m->data, m->len, m->flags, false);

	if (rc > 0)
		return 0;
	if (rc < 0 || pool_alloc(e->pool, m->len, &buf)) {
		log_limited(FERRY__LOG_WARN, "loop: engine %s: pool full, refusing a %llu-byte PUT "
			    "from %s", e->name, (unsigned long long)m->len, m->home->name);
		return -ENOBUFS;
	}
	ferry__payload_copy(buf->data, m->data, m->len);
	rc = reactor_deliver(e, NULL, fullkey, n, buf, m->len, m->flags);
	if (rc)
		pool_free(buf);
	return rc;
}

/* A message of another engine asks us to take a PUT. */
static void take_put(struct ferry_engine *e, struct loop_ep *self, struct loop_msg *m)
{
	int rc;

	if (m->inl)
		rc = take_inline(e, m, m->key, m->key_len);
	else
		rc = reactor_deliver(e, NULL, m->key, m->key_len, m->buf, m->len, m->flags);
	if (rc && m->buf)
		pool_free(m->buf); /* refused: the data dies here */
	m->buf = NULL;
	m->res = rc;
	m->kind = MSG_RESULT;
	if (m->home == self) {
		/* A PUT to ourselves: the result is already home. */
		inbox_push(m->home, m);
		return;
	}
	if (ep_send(m->home, m))
		ep_unref(m->home); /* home is gone: drop the message */
}

static void take_result(struct ferry_engine *e, struct loop_ep *self, struct loop_msg *m)
{
	reactor_put_done(e, m->op, m->gen, m->res);
	m->free_next = self->free_msgs;
	self->free_msgs = m;
	ep_unref(self);
}

/*
 * The engine of m->home went: its peer handles here let go of it, and,
 * unless that name is reached some other way (a tcp address, another
 * transport), GETs waiting for its keys and its streams end as after a
 * peer's death.
 */
static void take_gone(struct ferry_engine *e, struct backend *b, struct loop_msg *m)
{
	struct loop_ep *gone = m->home;
	bool ours = true;

	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next) {
		if (strcmp(p->name, gone->name) != 0)
			continue;
		if (p->backend == b && p->transport == gone)
			reactor_unresolve(e, p);
		else if (p->backend || atomic_load(&p->naddrs)) /* an address: not loop's */
			ours = false;
	}
	if (ours) {
		for (uint32_t i = 0; i < e->max_ops; i++) {
			struct op *op = &e->ops[i];

			if (op->state == OP_PARKED && op->peer &&
			    strcmp(op->peer->name, gone->name) == 0)
				op_complete(e, op, -ECONNRESET, 0, NULL);
		}
		ferry__peer_event(e, b, gone->name, PEER_LOST, -ECONNRESET); /* its streams */
	}
	ep_unref(gone);
	free(m);
}

static __attribute__((noinline)) int loop_take_inbox(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *self = b->data;
	struct loop_msg *m;
	int n = 0;

	self->empty_rounds = 0;
	while (n < 1024 && (m = inbox_pop(self))) {
		if (m->kind == MSG_PUT)
			take_put(e, self, m);
		else if (m->kind == MSG_RESULT)
			take_result(e, self, m);
		else
			take_gone(e, b, m);
		n++;
	}
	return n;
}

/* A round with PUTs delivered directly listed (out of loop_progress's frame). */
static __attribute__((noinline)) int loop_take_done(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *self = b->data;
	int n = take_done(e, self, atomic_load_explicit(&e->rounds, memory_order_relaxed));

	return n + (inbox_nonempty(self) ? loop_take_inbox(e, b) : 0);
}

static int loop_progress(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *self = b->data;

	if (self->done_head)
		return loop_take_done(e, b);

	/*
	 * An empty inbox (only its stub, unlinked) LOOP_QUIET_ROUNDS rounds in
	 * a row: the transport goes quiet, so rounds skip it until a sender's
	 * ferry__backend_wake. Quiet first, then one more look (a sender
	 * pushes, then looks at quiet): a message that came in between keeps
	 * it awake.
	 */
	if (self->head == &self->stub &&
	    !atomic_load_explicit(&self->stub.next, memory_order_acquire)) {
		if (++self->empty_rounds < LOOP_QUIET_ROUNDS)
			return 0;
		self->empty_rounds = 0;
		ferry__backend_quiet(b);
		if (inbox_nonempty(self))
			backend_busy(b);
		return 0;
	}
	return loop_take_inbox(e, b);
}

/*
 * Under dir_lock: tell every engine of self's namespace in this process that
 * it goes. Returns how many could not be told (no memory): the caller logs
 * that after the lock (a log sink may create an engine, which takes it).
 */
static unsigned tell_gone_locked(struct loop_ep *self)
{
	unsigned untold = 0;

	for (struct loop_ep *ep = dir_head; ep; ep = ep->dir_next) {
		struct loop_msg *m;

		if (ep == self || strcmp(ep->ns, self->ns) != 0)
			continue;
		m = calloc(1, sizeof(*m));
		if (!m) {
			untold++;
			continue;
		}
		m->kind = MSG_GONE;
		m->home = self;
		ep_ref(self); /* the message holds it: its name, its address for the handles */
		if (ep_send(ep, m)) {
			ep_unref(self);
			free(m);
		}
	}
	return untold;
}

static bool loop_has_work(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *self = b->data;

	(void)e;
	return self->done_head || inbox_nonempty(self);
}

static void loop_fini(struct ferry_engine *e, struct backend *b)
{
	struct loop_ep *self = b->data;
	struct loop_msg *m;
	unsigned untold;

	if (!self)
		return;
	pthread_mutex_lock(&dir_lock);
	for (struct loop_ep **pp = &dir_head; *pp; pp = &(*pp)->dir_next) {
		if (*pp == self) {
			*pp = self->dir_next;
			break;
		}
	}
	untold = tell_gone_locked(self);
	pthread_mutex_unlock(&dir_lock);
	if (untold)
		log_error("engine %s: no memory to tell %u engine(s) of its namespace that it goes",
			  self->name, untold);
	ep_close(self);
	take_done(e, self, UINT64_MAX); /* PUTs delivered directly: their results, not -ECANCELED */
	/* Nothing enters the inbox any more: answer what is in it. */
	while ((m = inbox_pop(self))) {
		if (m->kind == MSG_PUT && m->home != self) {
			if (m->buf)
				pool_free(m->buf);
			m->buf = NULL;
			m->res = -ECONNRESET;
			m->kind = MSG_RESULT;
			if (ep_send(m->home, m))
				ep_unref(m->home);
		} else if (m->kind == MSG_RESULT) {
			/* A result that made it home: report it as it is. */
			take_result(e, self, m);
		} else if (m->kind == MSG_GONE) {
			ep_unref(m->home);
			free(m);
		} else {
			if (m->buf)
				pool_free(m->buf); /* a PUT to ourselves, never taken */
			ep_unref(self);
		}
	}
	reactor_unresolve_all(e, b);
	b->data = NULL;
	ep_unref(self);
}

const struct backend_ops ferry__loop_backend = {
	.name = "loop",
	.rank = 20,
	.caps = TRANSPORT_CAP_SAME_PROCESS | TRANSPORT_CAP_ZERO_COPY | TRANSPORT_CAP_MEM_HOST,
	.init = loop_init,
	.fini = loop_fini,
	.resolve = loop_resolve,
	.unresolve = loop_unresolve,
	.put = loop_put,
	.iov_put_max = LOOP_INLINE_MAX,
	.progress = loop_progress,
	.has_work = loop_has_work,
	/* forget: nothing to do, a late result fails its generation check */
};

/*
 * engine/cq.c - completion queues.
 *
 * Owns: the bounded ring every completion goes through (one producer: the
 * thread holding progress; any number of consumer threads, Vyukov's
 * sequence-per-slot scheme), its overflow list (a full CQ never loses a
 * completion: the op holds it until there is room), callback dispatch on
 * the polling thread, and the three ways to wait: poll, wait (spin, then a
 * futex), and fd + arm for foreign event loops. For the reactor's round: the
 * flush of overflowed completions across CQs, and the reaping of CQs the
 * application destroyed once no round can reach them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

int cq_init(struct ferry_engine *e, struct ferry_cq *cq, uint32_t entries, bool is_default)
{
	uint64_t n = 1;

	while (n < entries)
		n <<= 1;
	memset(cq, 0, sizeof(*cq));
	cq->slots = aligned_alloc(CACHELINE, n * sizeof(*cq->slots));
	if (!cq->slots)
		return -ENOMEM;
	memset(cq->slots, 0, n * sizeof(*cq->slots));
	for (uint64_t i = 0; i < n; i++)
		atomic_init(&cq->slots[i].seq, i);
	cq->mask = n - 1;
	cq->engine = e;
	cq->single = e->single_poller;
	cq->is_default = is_default;
	cq->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cq->efd < 0) {
		int err = -errno;

		free(cq->slots);
		cq->slots = NULL;
		log_error("eventfd for a completion queue: %s", ferry_strerror(err));
		return err;
	}
	return 0;
}

/*
 * Take the head slot, if posted (with plain_only, only one without a
 * callback): 1 and the slot and its position, 0 when none is posted, -1
 * when plain_only met a callback. A SINGLE_POLLER engine's poller is the
 * one consumer: a store of the head, not a compare-and-swap. The callback
 * is read before the slot is taken: one we then take was nobody else's
 * meanwhile (head had not moved), so it held what we read. The caller
 * copies what it needs out of the slot, then gives it back (cq_slot_give).
 */
static inline __attribute__((always_inline)) int cq_slot_take(struct ferry_cq *cq, bool single,
							       bool plain_only,
							       struct cq_slot **slot,
							       uint64_t *at)
{
	uint64_t pos = atomic_load_explicit(&cq->head, memory_order_relaxed);

	for (;;) {
		struct cq_slot *s = &cq->slots[pos & cq->mask];
		int64_t diff = (int64_t)(atomic_load_explicit(&s->seq, memory_order_acquire) -
					 (pos + 1));

		if (diff < 0 || (single && diff > 0))
			return 0;
		if (diff > 0) {
			pos = atomic_load_explicit(&cq->head, memory_order_relaxed);
			continue; /* another consumer took it */
		}
		if (plain_only && s->cb)
			return -1;
		if (single)
			atomic_store_explicit(&cq->head, pos + 1, memory_order_relaxed);
		else if (!atomic_compare_exchange_weak_explicit(&cq->head, &pos, pos + 1,
								 memory_order_relaxed,
								 memory_order_relaxed))
			continue;
		*slot = s;
		*at = pos;
		return 1;
	}
}

/* The slot taken at pos is free for the producer's next lap. */
static inline void cq_slot_give(struct ferry_cq *cq, struct cq_slot *s, uint64_t pos)
{
	atomic_store_explicit(&s->seq, pos + cq->mask + 1, memory_order_release);
}

/*
 * Take the head entry, if posted: its CQE goes to *cqe, or, when it has a
 * callback, to *cb_cqe (the caller's own copy: a callback that polls the
 * same array again cannot overwrite the CQE it was given), with *cb and
 * *cb_arg. One copy of the CQE, not one into a slot and one out of it.
 */
static inline __attribute__((always_inline)) bool
cq_pop_as(struct ferry_cq *cq, struct ferry_cqe *cqe, struct ferry_cqe *cb_cqe,
	  ferry_complete_cb **cb, void **cb_arg, bool single)
{
	struct cq_slot *s;
	uint64_t pos;

	if (cq_slot_take(cq, single, false, &s, &pos) <= 0)
		return false;
	*cb = s->cb;
	*cb_arg = s->cb_arg;
	*(*cb ? cb_cqe : cqe) = s->cqe;
	cq_slot_give(cq, s, pos);
	return true;
}

/* The same, for any CQ (not a hot path). */
static bool cq_pop(struct ferry_cq *cq, struct ferry_cqe *cqe, struct ferry_cqe *cb_cqe,
		   ferry_complete_cb **cb, void **cb_arg)
{
	return cq_pop_as(cq, cqe, cb_cqe, cb, cb_arg, cq->single);
}

static void discard_cqe(const struct ferry_cqe *cqe, ferry_complete_cb *cb, void *arg)
{
	if (cb)
		cb(cqe, arg); /* every callback runs exactly once; it owns cqe->buf */
	else if ((cqe->flags & FERRY_CQE_F_BUF) && cqe->buf)
		pool_free(cqe->buf);
}

void cq_fini(struct ferry_cq *cq)
{
	struct ferry_cqe cqe;
	ferry_complete_cb *cb;
	void *cb_arg;

	if (!cq->slots)
		return;
	while (cq_pop(cq, &cqe, &cqe, &cb, &cb_arg))
		discard_cqe(&cqe, cb, cb_arg);
	for (struct op *op = cq->overflow_head; op; op = op->next)
		discard_cqe(&op->cqe, op->cb, op->cb_arg);
	cq->overflow_head = cq->overflow_tail = NULL;
	if (cq->efd >= 0)
		close(cq->efd);
	cq->efd = -1;
	free(cq->slots);
	cq->slots = NULL;
}

/* Is the entry at the head posted? (A consumer may still take it first.) */
static inline bool cq_slot_ready(struct ferry_cq *cq)
{
	uint64_t pos = atomic_load_explicit(&cq->head, memory_order_relaxed);

	return atomic_load_explicit(&cq->slots[pos & cq->mask].seq, memory_order_acquire) == pos + 1;
}

bool cq_has_entries(struct ferry_cq *cq)
{
	uint64_t pos = atomic_load_explicit(&cq->head, memory_order_acquire);
	struct cq_slot *s = &cq->slots[pos & cq->mask];

	return atomic_load_explicit(&s->seq, memory_order_acquire) == pos + 1 ||
	       atomic_load_explicit(&cq->overflowing, memory_order_relaxed);
}

bool cq_ring_has_room(struct ferry_cq *cq)
{
	struct cq_slot *s = &cq->slots[cq->tail & cq->mask];

	return atomic_load_explicit(&s->seq, memory_order_acquire) == cq->tail;
}

bool cq_has_space(struct ferry_cq *cq)
{
	struct cq_slot *s = &cq->slots[cq->tail & cq->mask];

	return !cq->overflow_head &&
	       atomic_load_explicit(&s->seq, memory_order_acquire) == cq->tail;
}

static bool try_push(struct ferry_cq *cq, const struct ferry_cqe *cqe, ferry_complete_cb *cb,
		     void *cb_arg)
{
	struct cq_slot *s = cq_slot_free(cq);

	if (!s)
		return false;
	s->cqe = *cqe;
	s->cb = cb;
	s->cb_arg = cb_arg;
	cq_slot_publish(cq, s);
	return true;
}

bool cq_post(struct ferry_cq *cq, const struct ferry_cqe *cqe, ferry_complete_cb *cb,
	     void *cb_arg, struct op *holder)
{
	if (likely(!cq->overflow_head) && try_push(cq, cqe, cb, cb_arg))
		return true;
	/* Full: the op keeps the completion until the consumers make room. */
	holder->cqe = *cqe;
	holder->cb = cb;
	holder->cb_arg = cb_arg;
	holder->state = OP_OVERFLOW;
	holder->next = NULL;
	if (cq->overflow_tail)
		cq->overflow_tail->next = holder;
	else
		cq->overflow_head = holder;
	cq->overflow_tail = holder;
	if (!atomic_exchange_explicit(&cq->overflowing, 1, memory_order_relaxed)) {
		atomic_fetch_add(&cq->engine->overflowing_cqs, 1);
		/*
		 * A BUSY_POLL engine: pairs with cq_reap's light fence. A consumer
		 * that made room either sees overflowing, or the next look for
		 * room (a stand-in round's reactor_sleep_check, the reactor's own
		 * after announce_sleep) sees the room. Rare: once per overflow.
		 * (A default engine's round fences fully in cq_flush_wakeups,
		 * which this CQ's mark sends it through, before any such look.)
		 */
		if (cq->engine->asym_fences)
			fence_heavy(true);
	}
	cq_mark_dirty(cq);
	return false;
}

unsigned cq_flush_overflow(struct ferry_cq *cq)
{
	unsigned n = 0;

	while (cq->overflow_head) {
		struct op *op = cq->overflow_head;

		if (!try_push(cq, &op->cqe, op->cb, op->cb_arg))
			break;
		cq->overflow_head = op->next;
		if (!cq->overflow_head)
			cq->overflow_tail = NULL;
		ferry__op_free(cq->engine, op);
		n++;
	}
	if (!cq->overflow_head &&
	    atomic_exchange_explicit(&cq->overflowing, 0, memory_order_relaxed))
		atomic_fetch_sub(&cq->engine->overflowing_cqs, 1);
	return n;
}

void cq_flush_wakeups(struct ferry_engine *e)
{
	struct ferry_cq *cq = e->dirty_cqs;

	if (!cq)
		return;
	e->dirty_cqs = NULL;
	/*
	 * The posts above before the loads of `armed` (pairs with ferry_cq_arm,
	 * futex_sleep: heavy). A SINGLE_POLLER engine's arm and waits are this
	 * thread's own: program order is enough.
	 */
	if (!e->single_poller)
		fence_light(e->asym_fences);
	for (; cq; cq = cq->next_dirty) {
		cq->dirty = false;
		if (atomic_load_explicit(&cq->armed, memory_order_relaxed) &&
		    atomic_exchange(&cq->armed, 0)) {
			/*
			 * THREAD mode: the CQ's eventfd. MANUAL mode: its fd is the
			 * io_uring fd, made readable by the doorbell read.
			 */
			int fd = e->mode == FERRY_PROGRESS_MANUAL ? e->doorbell_fd : cq->efd;
			uint64_t one = 1;

			if (write(fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				log_warn("cq eventfd write: %s", ferry_strerror(-errno));
		}
	}
	if (atomic_load_explicit(&e->cq_waiters, memory_order_relaxed)) {
		atomic_fetch_add(&e->cq_seq, 1);
		ferry__futex_wake_all(&e->cq_seq);
	}
}

/*
 * The head entry when it is posted without a callback: its CQE into *cqe,
 * taken (1); 0 when none is posted; -1 when it has a callback (left for
 * cq_pop_as). Calls nothing, so that a reap of plain CQEs needs no frame.
 */
static inline __attribute__((always_inline)) int cq_pop_plain_as(struct ferry_cq *cq,
								 struct ferry_cqe *cqe,
								 bool single)
{
	struct cq_slot *s;
	uint64_t pos;
	int got = cq_slot_take(cq, single, true, &s, &pos);

	if (got > 0) {
		*cqe = s->cqe;
		cq_slot_give(cq, s, pos);
	}
	return got;
}

/* A reap made room in cq: what a full CQ's poster and a sleeping reactor need to know. */
static inline __attribute__((always_inline)) void cq_reaped(struct ferry_cq *cq, bool single)
{
	/*
	 * Pairs with the reactor's announce before it sleeps (heavy), which on
	 * a single poller's engine is ours.
	 */
	if (!single)
		fence_light(cq->engine->asym_fences);
	if (atomic_load_explicit(&cq->overflowing, memory_order_relaxed))
		reactor_wake(cq->engine);
}

/*
 * cq_reap_as from the first entry with a callback on, n plain CQEs taken
 * before it: callbacks run here; the rest go to cqes. handled counts
 * both. Bounded so a stream of callbacks cannot hold the caller.
 */
static inline __attribute__((always_inline)) int
cq_reap_from(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max, unsigned n,
	     unsigned *handled, bool single)
{
	unsigned h = n, limit = max + 256;
	struct ferry_cqe cb_cqe;
	ferry_complete_cb *cb;
	void *cb_arg;

	while (n < max && h < limit && cq_pop_as(cq, &cqes[n], &cb_cqe, &cb, &cb_arg, single)) {
		h++;
		if (cb)
			cb(&cb_cqe, cb_arg);
		else
			n++;
	}
	if (h)
		cq_reaped(cq, single);
	*handled = h;
	return (int)n;
}

static __attribute__((noinline)) int cq_reap_from_shared(struct ferry_cq *cq,
							 struct ferry_cqe *cqes, unsigned max,
							 unsigned n, unsigned *handled)
{
	return cq_reap_from(cq, cqes, max, n, handled, false);
}

static __attribute__((noinline)) int cq_reap_from_single(struct ferry_cq *cq,
							 struct ferry_cqe *cqes, unsigned max,
							 unsigned n, unsigned *handled)
{
	return cq_reap_from(cq, cqes, max, n, handled, true);
}

/*
 * Take completions: callbacks run here; the rest go to cqes. handled
 * counts both. The plain CQEs at the head are taken here, without a call
 * (most reaps end there); from the first with a callback on, cq_reap_from.
 */
static inline __attribute__((always_inline)) int
cq_reap_as(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max, unsigned *handled,
	   bool single)
{
	unsigned n = 0;
	int got = 0;

	while (n < max && (got = cq_pop_plain_as(cq, &cqes[n], single)) > 0)
		n++;
	if (unlikely(got < 0))
		return single ? cq_reap_from_single(cq, cqes, max, n, handled) :
				cq_reap_from_shared(cq, cqes, max, n, handled);
	if (n)
		cq_reaped(cq, single);
	*handled = n;
	return (int)n;
}

static int cq_reap_shared(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max,
			  unsigned *handled)
{
	return cq_reap_as(cq, cqes, max, handled, false);
}

/* A SINGLE_POLLER engine's CQ, reaped by its poller: no compare-and-swap, no fence. */
static int cq_reap_single(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max,
			  unsigned *handled)
{
	return cq_reap_as(cq, cqes, max, handled, true);
}

static int cq_reap(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max, unsigned *handled)
{
	return cq->single ? cq_reap_single(cq, cqes, max, handled) :
			    cq_reap_shared(cq, cqes, max, handled);
}

/* Make the calling thread e's poller if it has none: is it (now)? */
static bool poller_take(struct ferry_engine *e)
{
	uintptr_t self = this_thread(), none = 0;

	return atomic_load_explicit(&e->poller, memory_order_relaxed) == self ||
	       atomic_compare_exchange_strong(&e->poller, &none, self) || none == self;
}

bool poller_claim(struct ferry_engine *e)
{
	if (poller_take(e))
		return true;
	if (atomic_fetch_add(&e->poller_refusals, 1) == 0)
		log_error("engine %s: polled from a thread that is not its poller "
			  "(FERRY_ENGINE_SINGLE_POLLER): -EPERM", e->name);
	return false;
}

int ferry_engine_claim_poller(struct ferry_engine *e)
{
	if (!e) {
		log_error("ferry_engine_claim_poller: NULL engine");
		return -EINVAL;
	}
	return !e->single_poller || poller_take(e) ? 0 : -EPERM;
}

/* MANUAL mode: a round, unless another thread drives progress now. */
static void manual_round(struct ferry_engine *e)
{
	if (progress_try_lock(e)) {
		reactor_run_once(e);
		progress_unlock(e);
	}
}

/*
 * ferry_cq_poll on a SINGLE_POLLER engine's CQ: its poller's round (unless
 * one of its own is under way: a callback polls) and reap, neither of
 * which another thread can enter; -EPERM from any other thread.
 */
static __attribute__((noinline)) int poll_single(struct ferry_cq *cq, struct ferry_cqe *cqes,
						 unsigned max)
{
	struct ferry_engine *e = cq->engine;
	unsigned handled;

	if (unlikely(!poller_ok(e)))
		return -EPERM;
	if (progress_try_lock_single(e)) {
		reactor_run_once(e);
		progress_unlock_single(e);
	}
	if (!cq_slot_ready(cq))
		return 0;
	return cq_reap_single(cq, cqes, max, &handled);
}

int ferry_cq_poll(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max)
{
	unsigned handled;

	if (unlikely(!cq || (!cqes && max))) {
		log_error("ferry_cq_poll: NULL %s", cq ? "cqes" : "cq");
		return -EINVAL;
	}
	if (cq->engine->mode == FERRY_PROGRESS_MANUAL) {
		if (cq->single)
			return poll_single(cq, cqes, max);
		if (progress_try_lock_shared(cq->engine)) {
			reactor_run_once(cq->engine);
			progress_unlock_shared(cq->engine);
		}
		if (!cq_slot_ready(cq))
			return 0; /* nothing posted: what cq_reap would find, without its frame */
	} else if (!cq_slot_ready(cq) && (!reactor_poll_watch(cq->engine) || !cq_slot_ready(cq))) {
		return 0; /* a poll loop runs the rounds: what its round posted is taken at once */
	}
	return cq_reap_shared(cq, cqes, max, &handled);
}

/*
 * Sleep on the engine's futex until a completion was posted, a wake, or (in
 * MANUAL mode) the thread driving progress left. Every condition is checked
 * after announcing ourselves (cq_waiters) and reading the futex word, and
 * each waker changes its condition before bumping the word, so no wake-up
 * falls between the check and the sleep.
 */
static void futex_sleep(struct ferry_engine *e, struct ferry_cq *cq, int64_t timeout_ns,
			uint32_t intr)
{
	uint32_t seq = atomic_load(&e->cq_seq);

	atomic_fetch_add(&e->cq_waiters, 1);
	fence_heavy(e->asym_fences); /* pairs with cq_flush_wakeups' and progress_unlock's light fences */
	if (!cq_has_entries(cq) && atomic_load(&cq->interrupts) == intr &&
	    !(e->mode == FERRY_PROGRESS_MANUAL && !atomic_load(&e->progress_busy)))
		ferry__futex_wait(&e->cq_seq, seq, timeout_ns);
	atomic_fetch_sub(&e->cq_waiters, 1);
}

int ferry_cq_wait(struct ferry_cq *cq, struct ferry_cqe *cqes, unsigned max, int64_t timeout_ns)
{
	struct ferry_engine *e;
	uint64_t start, deadline = 0, spin_until;
	bool watching = false; /* THREAD mode: we poll for the sleeping reactor */
	bool spinning = false; /* counted in cq_spinners: spun POLL_DENSE_NS (short waits do not park it) */
	bool stamped = false;  /* our first empty look stamped (reactor_poll_stamp) */
	uint32_t intr;
	int ret;

	if (unlikely(!cq || !cqes || !max)) {
		log_error("ferry_cq_wait: %s", !cq ? "NULL cq" : !cqes ? "NULL cqes" : "max 0");
		return -EINVAL;
	}
	e = cq->engine;
	if (e->mode == FERRY_PROGRESS_MANUAL && unlikely(!poller_ok(e)))
		return -EPERM;
	/* A wake that found nobody waiting is kept for the next wait. */
	intr = atomic_load(&cq->interrupts_seen);
	start = ferry__now_ns();
	if (timeout_ns >= 0)
		deadline = start + (uint64_t)timeout_ns;
	spin_until = start + e->spin_ns;
	if (e->mode == FERRY_PROGRESS_THREAD)
		reactor_lease_switch(e); /* a lease we kept on another engine ends */

	for (;;) {
		unsigned handled;
		int64_t left = -1;
		uint64_t now;
		int n;

		if (e->mode == FERRY_PROGRESS_MANUAL)
			manual_round(e);
		reactor_watch(e, &watching);
		n = cq_reap(cq, cqes, max, &handled);
		if (handled) {
			ret = n;
			break;
		}
		if (atomic_load(&cq->interrupts) != intr) {
			atomic_store(&cq->interrupts_seen, atomic_load(&cq->interrupts));
			ret = -EINTR;
			break;
		}
		now = ferry__now_ns();
		if (!stamped && e->mode == FERRY_PROGRESS_THREAD) {
			stamped = true; /* the first look found nothing: stamped as a poll */
			(void)reactor_poll_stamp(e, now);
		}
		/* (Once: after the spin, now < spin_until never holds again.) */
		if (!spinning && now - start >= POLL_DENSE_NS && now < spin_until &&
		    e->mode == FERRY_PROGRESS_THREAD) {
			spinning = true;
			atomic_fetch_add_explicit(&e->cq_spinners, 1, memory_order_relaxed);
		}
		if (deadline) {
			if (now >= deadline) {
				ret = -ETIMEDOUT;
				break;
			}
			left = (int64_t)(deadline - now);
		} else if (timeout_ns == 0) {
			ret = -ETIMEDOUT;
			break;
		}
		if (now < spin_until) {
			if (ferry__spin_wait_step(e, now - start))
				continue;
			spin_until = 0; /* a busy CPU: sleep (reactor_sleep.c) */
		}
		if (spinning) {
			spinning = false;
			atomic_fetch_sub_explicit(&e->cq_spinners, 1, memory_order_relaxed);
		}
		reactor_unwatch(e, &watching);
		if (e->mode == FERRY_PROGRESS_MANUAL && progress_try_lock(e)) {
			/* We drive progress: sleep where the engine sleeps. */
			if (!cq_has_entries(cq))
				reactor_sleep_unless(e, left, &cq->interrupts, intr);
			progress_unlock(e);
		} else {
			if (e->mode == FERRY_PROGRESS_THREAD)
				reactor_lease_end(e); /* nobody polls for the reactor while we sleep */
			futex_sleep(e, cq, left, intr);
		}
	}
	if (spinning)
		atomic_fetch_sub_explicit(&e->cq_spinners, 1, memory_order_relaxed);
	reactor_unwatch(e, &watching);
	return ret;
}

int ferry_cq_wake(struct ferry_cq *cq)
{
	struct ferry_engine *e;

	if (!cq)
		return -EINVAL;
	e = cq->engine;
	atomic_fetch_add(&cq->interrupts, 1);
	atomic_fetch_add(&e->cq_seq, 1);
	ferry__futex_wake_all(&e->cq_seq);
	reactor_wake(e);
	return 0;
}

int ferry_cq_fd(struct ferry_cq *cq)
{
	if (!cq)
		return -EINVAL;
	if (cq->engine->mode == FERRY_PROGRESS_MANUAL)
		return cq->engine->ring.ring_fd;
	return cq->efd;
}

int ferry_cq_arm(struct ferry_cq *cq)
{
	struct ferry_engine *e;
	uint64_t v;

	if (!cq)
		return -EINVAL;
	e = cq->engine;
	if (e->mode == FERRY_PROGRESS_MANUAL) {
		int rc;

		if (unlikely(!poller_ok(e)))
			return -EPERM;
		if (!progress_try_lock(e))
			return -EBUSY;
		reactor_run_once(e);
		atomic_store(&cq->armed, 1);
		rc = cq_has_entries(cq) ? -EBUSY : reactor_arm_manual(e);
		if (rc)
			atomic_store(&cq->armed, 0);
		progress_unlock(e);
		return rc;
	}
	while (read(cq->efd, &v, sizeof(v)) == sizeof(v))
		;
	atomic_store(&cq->armed, 1);
	fence_heavy(e->asym_fences); /* pairs with cq_flush_wakeups' light fence */
	if (cq_has_entries(cq)) {
		atomic_store(&cq->armed, 0);
		return -EBUSY;
	}
	return 0;
}

struct ferry_cq *ferry_cq_default(struct ferry_engine *e)
{
	return e ? &e->default_cq : NULL;
}

int ferry_cq_create(struct ferry_engine *e, const struct ferry_cq_params *p, struct ferry_cq **out)
{
	struct ferry_cq_params prm = FERRY_CQ_PARAMS_INIT;
	struct ferry_cq *cq;
	int rc;

	if (!e || !out) {
		log_error("ferry_cq_create: NULL %s", e ? "out" : "engine");
		return -EINVAL;
	}
	if (p) {
		if (p->size < offsetof(struct ferry_cq_params, flags) + sizeof(p->flags) ||
		    p->size > sizeof(prm)) {
			log_error("ferry_cq_create: params size %zu unknown (use "
				  "FERRY_CQ_PARAMS_INIT)", p->size);
			return -EINVAL;
		}
		memcpy(&prm, p, p->size);
	}
	if (prm.flags) {
		log_error("ferry_cq_create: unknown flags 0x%x", prm.flags);
		return -EINVAL;
	}
	if (prm.entries == 0)
		prm.entries = 4096;
	if (prm.entries > (1u << 24)) {
		log_error("ferry_cq_create: %u entries is more than 2^24", prm.entries);
		return -EINVAL;
	}
	cq = aligned_alloc(CACHELINE, sizeof(*cq));
	if (!cq)
		return -ENOMEM;
	rc = cq_init(e, cq, prm.entries, false);
	if (rc) {
		free(cq);
		return rc;
	}
	pthread_mutex_lock(&e->lock);
	cq->next = e->cqs;
	e->cqs = cq;
	pthread_mutex_unlock(&e->lock);
	*out = cq;
	return 0;
}

int ferry_cq_destroy(struct ferry_cq *cq)
{
	struct ferry_engine *e;
	struct ferry_cq **pp;
	int rc = -EINVAL;

	if (!cq)
		return -EINVAL;
	if (cq->is_default) {
		log_error("ferry_cq_destroy: the default CQ goes with its engine");
		return -EINVAL;
	}
	e = cq->engine;
	if (atomic_load(&cq->inflight) || atomic_load(&cq->overflowing)) {
		log_error("ferry_cq_destroy: ops in flight still target this CQ");
		return -EBUSY;
	}
	/*
	 * The reactor may still hold it (this round's wake-ups, entries not
	 * yet taken): it frees the CQ once no round can reach it any more.
	 */
	pthread_mutex_lock(&e->lock);
	for (pp = &e->cqs; *pp; pp = &(*pp)->next) {
		if (*pp == cq) {
			*pp = cq->next;
			atomic_store(&cq->dead, 1);
			cq->dead_round = atomic_load(&e->rounds) + 1;
			cq->next = e->dead_cqs;
			e->dead_cqs = cq;
			atomic_fetch_add(&e->dead_cqs_pending, 1);
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&e->lock);
	if (rc)
		log_error("ferry_cq_destroy: not a live CQ of its engine (destroyed twice?)");
	return rc;
}

/* ------------------------------------------------------------------ */
/* The reactor's side: overflowing and destroyed CQs                   */
/* ------------------------------------------------------------------ */

/*
 * Overflowing CQs other than the default one (counted by overflowing_cqs,
 * the default CQ included; only the progress side changes either).
 */
static bool extra_cqs_overflowing(struct ferry_engine *e)
{
	return atomic_load_explicit(&e->overflowing_cqs, memory_order_relaxed) >
	       (uint32_t)atomic_load_explicit(&e->default_cq.overflowing, memory_order_relaxed);
}

/*
 * Overflowing CQs: rare, so they are found by walking the CQ list under the
 * engine lock, and only when the count of overflowing CQs says so.
 */
unsigned cq_flush_overflows(struct ferry_engine *e)
{
	unsigned n = 0;

	if (atomic_load_explicit(&e->default_cq.overflowing, memory_order_relaxed))
		n += cq_flush_overflow(&e->default_cq);
	if (extra_cqs_overflowing(e)) {
		pthread_mutex_lock(&e->lock);
		for (struct ferry_cq *cq = e->cqs; cq; cq = cq->next)
			if (atomic_load_explicit(&cq->overflowing, memory_order_relaxed))
				n += cq_flush_overflow(cq);
		pthread_mutex_unlock(&e->lock);
	}
	return n;
}

bool cq_overflow_can_move(struct ferry_engine *e)
{
	bool yes = false;

	if (atomic_load(&e->default_cq.overflowing) && cq_ring_has_room(&e->default_cq))
		return true;
	if (extra_cqs_overflowing(e)) {
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
 * The round calls it while e->dead_cqs_pending says some wait.
 */
void cq_reap_dead(struct ferry_engine *e, bool drained)
{
	struct ferry_cq **pp, *cq, *gone = NULL;

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

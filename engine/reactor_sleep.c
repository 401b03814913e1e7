/*
 * engine/reactor_sleep.c - where the progress side sleeps and how it is woken.
 *
 * Owns: the one place the progress side sleeps (an io_uring wait on the
 * doorbell eventfd and the next deadline; ppoll under valgrind), whether a
 * round would find work (reactor_has_work) and when the next deadline falls,
 * the doorbell (reactor_wake), MANUAL mode's arm of the io_uring fd, the
 * THREAD-mode reactor thread's parked sleep (progress let go while it
 * sleeps), the stand-in rounds a caller runs in its place and the watch a
 * waiting caller keeps, and the futex wait and spin step of the idle loops
 * (ferry__futex_wake_all stays with progress_unlock in reactor.c).
 * The rounds themselves are reactor.c's.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "reactor_int.h"

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

void ferry__spin_step(uint64_t spun_ns)
{
	if (spun_ns < SPIN_PAUSE_NS)
		cpu_relax();
	else
		sched_yield();
}

/*
 * Spinning for work is a bet that it comes within microseconds and that
 * our CPU is ours meanwhile. On a busy machine the second half fails: a
 * sched_yield with another thread runnable on this CPU hands it a whole
 * time slice (3 ms and more here), during which the spinner neither polls
 * nor can be woken (it does not sleep, so nobody rings its doorbell), and
 * a spin yields again and again. A thread asleep is woken when its work
 * comes (behind a busy loop still a millisecond or two late, but once).
 * Measured under two busy loops on 2 CPUs, 20k channel messages to one
 * reader (test_channel's fanout_1, FERRY_CHAN_MSGS=20000): 10-12.5 s
 * spinning on, 2.7-3.8 s with what follows; 0.6 s on idle CPUs either way.
 * So a yield that was away longer than YIELD_LOST_NS ends the spin,
 * and for a while after it every spin of the engine sleeps at once: 1 ms
 * after a loss now and then (the pipeline's own threads outnumbering the
 * CPUs for a moment), doubled up to 50 ms while each loss comes within
 * 10 ms of the last window's end (a CPU hog: one lost slice per 50 ms).
 * Only short spins adapt (spin_ns under SPIN_ADAPT_MAX_NS, the default's
 * 50 us among them): an engine given a long one busy-polls a CPU its
 * owner means to spend on it, loaded or not (bench_shm's busy THREAD
 * mode under two busy loops: 0.53 us one way spinning on, 17-21 us when
 * its reactors slept instead).
 */
bool reactor_spin_contended(struct ferry_engine *e, uint64_t now)
{
	uint64_t lost = atomic_load_explicit(&e->yield_lost_at, memory_order_relaxed);

	return lost && now - lost < atomic_load_explicit(&e->contended_ns, memory_order_relaxed);
}

bool reactor_spin_yield(struct ferry_engine *e)
{
	uint64_t t0, t1, last, win;

	if (e->spin_ns >= SPIN_ADAPT_MAX_NS) {
		sched_yield(); /* a long spin was asked for: the CPU is meant to be ours */
		return true;
	}
	t0 = ferry__now_ns();
	sched_yield();
	t1 = ferry__now_ns();
	if (t1 - t0 <= YIELD_LOST_NS)
		return true;
	last = atomic_load_explicit(&e->yield_lost_at, memory_order_relaxed);
	win = atomic_load_explicit(&e->contended_ns, memory_order_relaxed);
	/* Lost again soon after the last window ended: a longer one. */
	win = last && t0 - last < win + CONTENDED_REGROW_NS
		      ? (2 * win < CONTENDED_MAX_NS ? 2 * win : CONTENDED_MAX_NS)
		      : CONTENDED_MIN_NS;
	atomic_store_explicit(&e->contended_ns, win, memory_order_relaxed);
	atomic_store_explicit(&e->yield_lost_at, t1, memory_order_relaxed);
	atomic_fetch_add_explicit(&e->yields_lost, 1, memory_order_relaxed);
	return false;
}

bool ferry__spin_wait_step(struct ferry_engine *e, uint64_t spun_ns)
{
	if (spun_ns < SPIN_PAUSE_NS) {
		cpu_relax();
		return true;
	}
	return !reactor_spin_contended(e, ferry__now_ns()) && reactor_spin_yield(e);
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
	if (sqs_pending(e))
		return true;
	for (unsigned i = 0; i < e->nbackends; i++)
		if (!backend_quiet(&e->backends[i]) && e->backends[i].ops->has_work(e, &e->backends[i]))
			return true;
	if (cq_overflow_can_move(e)) /* only worth a round if a consumer made room */
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
	fence_heavy(e->asym_fences); /* the busy sides' fences are light (engine/fence.h) */
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
	reactor_reap_ring(e);
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
void reactor_thread_sleep(struct ferry_engine *e, uint64_t lease_until)
{
	/* Under valgrind: ppoll on the doorbell and the ring (see sleep_in_ppoll). */
	struct pollfd fds[2] = {
		{ .fd = e->doorbell_fd, .events = POLLIN },
		{ .fd = e->ring.ring_fd, .events = POLLIN },
	};
	int64_t budget;
	uint64_t spun = 0, t0 = 0, now;

	if (!e->sleep_in_ppoll && !(e->ring.features & IORING_FEAT_EXT_ARG)) {
		reactor_sleep(e, -1); /* an old kernel: no timed wait outside liburing, no parking */
		return;
	}
	if (!e->sleep_in_ppoll)
		arm_doorbell(e);
	if (lease_until) {
		/*
		 * Leased: the pollers run the rounds; unannounced, so peers ring
		 * nobody. A stand-in that needs us (ring_parked) may ring: the
		 * mark of the last ring is cleared, as announce_sleep does.
		 */
		if (atomic_load(&e->stop)) {
			io_uring_submit(&e->ring);
			return;
		}
		atomic_store_explicit(&e->wake->doorbell_rung, 0, memory_order_relaxed);
		now = ferry__now_ns();
		budget = sleep_budget(e, lease_until > now ? (int64_t)(lease_until - now) : 0);
	} else {
		announce_sleep(e);
		if (reactor_sleep_check(e) || atomic_load(&e->stop)) {
			atomic_store(&e->wake->sleeping, 0);
			io_uring_submit(&e->ring);
			return;
		}
		budget = sleep_budget(e, -1);
	}
	io_uring_submit(&e->ring);
	if (budget == 0) {
		atomic_store(&e->wake->sleeping, 0);
		reactor_reap_ring(e);
		return;
	}
	e->parked_until = budget < 0 ? UINT64_MAX : ferry__now_ns() + (uint64_t)budget;
	if (lease_until) {
		/*
		 * Only under a lease that still stands: one ended since we chose
		 * it (reactor_lease_end), whose reactor_unwatch found us running
		 * and so announced nothing, is not slept under. Both sides store,
		 * then look (seq_cst): the end's unwatch sees us asleep, or we
		 * see the lease gone.
		 */
		atomic_store(&e->reactor_parked, REACTOR_ASLEEP);
		if (atomic_load(&e->watcher) != WATCH_LEASE) {
			atomic_store_explicit(&e->reactor_parked, REACTOR_RUNNING, memory_order_relaxed);
			reactor_reap_ring(e);
			return;
		}
		atomic_fetch_add_explicit(&e->poll_leases, 1, memory_order_relaxed); /* a leased sleep */
	} else {
		atomic_store_explicit(&e->reactor_parked, REACTOR_ASLEEP, memory_order_relaxed);
	}
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
	reactor_reap_ring(e);
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

/* reactor_stand_in (internal.h) once it saw the reactor parked. */
bool reactor_stand_in_parked(struct ferry_engine *e)
{
	bool wake;

	if (!stand_in_lock(e))
		return false;
	wake = stand_in_round(e);
	/*
	 * Only a reactor asleep needs its doorbell; a yielding one comes back
	 * soon. One asleep under a lease is not announced: its pollers' rounds
	 * find what is left, and it wakes by itself when the lease runs out.
	 */
	if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP)
		wake = false;
	else if (atomic_load_explicit(&e->watcher, memory_order_relaxed) != WATCH_LEASE)
		wake = wake || reactor_sleep_check(e); /* the reactor sleeps meanwhile */
	progress_unlock(e);
	if (wake)
		ring_parked(e); /* its sleep is still announced */
	return true;
}

#define LEASE_SLOTS 256
static struct {
	struct ferry_engine *_Atomic e;
	_Atomic uint32_t users;
} lease_slots[LEASE_SLOTS];
/* The engine this thread last kept a lease on: its slot and id (-1: none). */
static __thread int tls_lease_slot = -1;
static __thread uint64_t tls_lease_id;

void reactor_lease_slot_take(struct ferry_engine *e)
{
	e->lease_slot = -1;
	for (int i = 0; i < LEASE_SLOTS; i++) {
		struct ferry_engine *none = NULL;

		if (atomic_compare_exchange_strong(&lease_slots[i].e, &none, e)) {
			e->lease_slot = i;
			return;
		}
	}
	/* More engines than slots: this one's leases end when they run out. */
}

void reactor_lease_slot_give(struct ferry_engine *e)
{
	if (e->lease_slot < 0)
		return;
	atomic_store(&lease_slots[e->lease_slot].e, NULL);
	while (atomic_load(&lease_slots[e->lease_slot].users))
		sched_yield(); /* a thread ending its lease: short */
	e->lease_slot = -1;
}

/* This thread keeps (renews) e's lease. */
static inline void lease_mine(struct ferry_engine *e)
{
	tls_lease_slot = e->lease_slot;
	tls_lease_id = e->id;
}

void reactor_lease_switch(struct ferry_engine *e)
{
	int i = tls_lease_slot;
	struct ferry_engine *other;

	if (i < 0 || (i == e->lease_slot && tls_lease_id == e->id))
		return;
	tls_lease_slot = -1;
	atomic_fetch_add(&lease_slots[i].users, 1);
	other = atomic_load(&lease_slots[i].e);
	if (other && other->id == tls_lease_id)
		reactor_lease_end(other);
	atomic_fetch_sub(&lease_slots[i].users, 1);
}

/*
 * A poller's round in the place of the reactor parked under a lease,
 * which it renews (the store only once a microsecond: pollers share it).
 */
static bool lease_round(struct ferry_engine *e, uint64_t now)
{
	uint64_t until = atomic_load_explicit(&e->lease_until, memory_order_relaxed);

	if (now + POLL_LEASE_NS - until >= POLL_STAMP_NS)
		atomic_store_explicit(&e->lease_until, now + POLL_LEASE_NS, memory_order_relaxed);
	lease_mine(e);
	if (!stand_in_lock(e))
		return false; /* another poller's round, or the reactor is back */
	if (stand_in_round(e)) {
		progress_unlock(e);
		ring_parked(e); /* a CB_REACTOR op, or a deadline before its lease ends */
		return true;
	}
	progress_unlock(e);
	return true;
}

/*
 * The engine this thread looked at last (ferry_cq_poll, ferry_cq_wait): its
 * id, and how many looks in a row it took there, each within POLL_DENSE_NS
 * of the engine's last one.
 */
static __thread uint64_t tls_looked_id;
static __thread uint32_t tls_looks;

bool reactor_poll_stamp(struct ferry_engine *e, uint64_t now)
{
	uint64_t last = atomic_load_explicit(&e->polled_at, memory_order_relaxed);
	bool dense;

	/*
	 * Dense only for a thread that keeps looking at this engine, a few
	 * times running: one that goes from one engine to another (two stages
	 * of one thread) waits on each for what the other does, and a lease
	 * would leave that unseen; a handful of looks while a GET is taken is
	 * not a poll loop either.
	 */
	if (now - last < POLL_DENSE_NS && tls_looked_id == e->id) {
		if (tls_looks < POLL_DENSE_LOOKS)
			tls_looks++;
	} else {
		tls_looked_id = e->id;
		tls_looks = 0;
	}
	dense = tls_looks >= POLL_DENSE_LOOKS;

	if (now - last >= POLL_STAMP_NS) { /* a tight loop stamps once a microsecond */
		atomic_store_explicit(&e->polled_at, now, memory_order_relaxed);
		if (dense)
			atomic_store_explicit(&e->dense_poll_at, now, memory_order_relaxed);
	}
	return dense;
}

bool reactor_poll_watch(struct ferry_engine *e)
{
	uint64_t now = ferry__now_ns();
	bool dense = reactor_poll_stamp(e, now);
	if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP)
		return false; /* running: it sees the stamps after a round without work */
	switch (atomic_load_explicit(&e->watcher, memory_order_acquire)) {
	case WATCH_LEASE:
		return lease_round(e, now);
	case WATCH_NONE:
		/* Asleep, announced: dense polls wake it once, to park under a lease. */
		if (dense && e->spin_ns < SPIN_ADAPT_MAX_NS) {
			lease_mine(e);
			ring_parked(e);
		}
		return false;
	default:
		return false; /* a waiting caller runs the rounds */
	}
}

bool reactor_poll_lease(struct ferry_engine *e, uint64_t now, uint64_t *until)
{
	int w = atomic_load_explicit(&e->watcher, memory_order_relaxed);
	uint64_t u, d;
	bool fresh;

	if (e->reactor_cb_ops) {
		/* Callbacks of its own pending: no stand-in may run them, the reactor stays. */
		if (w == WATCH_LEASE)
			atomic_compare_exchange_strong(&e->watcher, &w, WATCH_NONE);
		return false;
	}
	if (w == WATCH_LEASE && (u = atomic_load_explicit(&e->lease_until, memory_order_relaxed)) > now) {
		*until = u;
		return true;
	}
	/*
	 * A dense poll stamped since the last look: a caller polls in a loop
	 * beside us (by stamp, not by clock: under valgrind the threads take
	 * turns of milliseconds, and a stamp is never that fresh).
	 */
	d = atomic_load_explicit(&e->dense_poll_at, memory_order_relaxed);
	if ((fresh = d != e->dense_seen))
		e->dense_seen = d;
	fresh = fresh && d != atomic_load_explicit(&e->dense_spent, memory_order_relaxed);
	/* Or a caller spins in ferry_cq_wait: it renews the lease as it looks (reactor_watch). */
	if (atomic_load_explicit(&e->cq_spinners, memory_order_relaxed))
		fresh = true;
	if (fresh && e->spin_ns < SPIN_ADAPT_MAX_NS) {
		int none = WATCH_NONE;

		if (w == WATCH_LEASE) {
			*until = now + POLL_LEASE_NS;
			atomic_store_explicit(&e->lease_until, *until, memory_order_relaxed);
			return true;
		}
		if (!atomic_compare_exchange_strong(&e->watcher, &none, WATCH_LEASE))
			return false; /* a waiting caller still holds its watch: it lets go soon */
		/*
		 * The NONE we replaced may be the one a lease's end wrote
		 * (reactor_unwatch): then the stamps and the mark stored before
		 * it are seen now, and if no poll stamped since the mark (the
		 * stamp read above may be older than both), that lease's polls
		 * start no other.
		 */
		if (atomic_load_explicit(&e->dense_poll_at, memory_order_relaxed) ==
			    atomic_load_explicit(&e->dense_spent, memory_order_relaxed) &&
		    !atomic_load_explicit(&e->cq_spinners, memory_order_relaxed)) {
			w = WATCH_LEASE;
			atomic_compare_exchange_strong(&e->watcher, &w, WATCH_NONE);
			return false;
		}
		*until = now + POLL_LEASE_NS;
		atomic_store_explicit(&e->lease_until, *until, memory_order_relaxed);
		return true;
	}
	if (w == WATCH_LEASE) /* run out, and the polls stopped: back to spinning, then announced sleeps */
		atomic_compare_exchange_strong(&e->watcher, &w, WATCH_NONE);
	return false;
}

void reactor_lease_end(struct ferry_engine *e)
{
	int lease = WATCH_LEASE;
	bool watching = true;

	/*
	 * Made our watch, then ended as one: its sleep announced again, woken
	 * if work is left. The polls that made the lease are spent (marked
	 * before the watch is let go, so the reactor that takes the NONE
	 * unwatch leaves sees the mark: reactor_poll_lease).
	 */
	if (atomic_load_explicit(&e->watcher, memory_order_relaxed) == WATCH_LEASE &&
	    atomic_compare_exchange_strong(&e->watcher, &lease, WATCH_WAIT)) {
		atomic_store_explicit(&e->dense_spent,
				      atomic_load_explicit(&e->dense_poll_at, memory_order_relaxed),
				      memory_order_relaxed);
		reactor_unwatch(e, &watching);
	}
}

void reactor_watch(struct ferry_engine *e, bool *watching)
{
	bool wake;

	if (!*watching) {
		if (e->mode != FERRY_PROGRESS_THREAD ||
		    atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP)
			return;
		int none = WATCH_NONE;

		if (!atomic_compare_exchange_strong(&e->watcher, &none, WATCH_WAIT)) {
			if (none == WATCH_LEASE)
				(void)lease_round(e, ferry__now_ns()); /* we poll like the lease's pollers */
			else
				reactor_stand_in(e); /* another caller keeps watch */
			return;
		}
		if (!stand_in_lock(e)) {
			atomic_store(&e->watcher, WATCH_NONE);
			return;
		}
		if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) != REACTOR_ASLEEP) {
			progress_unlock(e);
			atomic_store(&e->watcher, WATCH_NONE);
			return;
		}
		/* Suspend its announced sleep: we poll, nobody need ring. */
		atomic_store_explicit(&e->wake->sleeping, 0, memory_order_relaxed);
		*watching = true;
	} else if (!stand_in_lock(e)) {
		if (atomic_load_explicit(&e->reactor_parked, memory_order_acquire) != REACTOR_ASLEEP) {
			/* The reactor woke and took over (its sleep ended). */
			*watching = false;
			atomic_store(&e->watcher, WATCH_NONE);
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
		/* seq_cst: pairs with a leased sleep's look at watcher (reactor_thread_sleep). */
		if (atomic_load(&e->reactor_parked) != REACTOR_ASLEEP)
			break; /* awake again: it announces its own sleeps */
		if (progress_try_lock(e)) {
			if (atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) ==
			    REACTOR_ASLEEP) {
				/*
				 * Announce its sleep again, then look (pairs with
				 * wake_peer), each transport's last word included (rdma
				 * arms its CQs: none was armed while we polled).
				 */
				atomic_store(&e->wake->sleeping, 1);
				fence_heavy(e->asym_fences);
				wake = reactor_sleep_check(e);
			}
			progress_unlock(e);
			break;
		}
		ferry__spin_step(ferry__now_ns() - t0); /* a submitter's stand-in round */
	}
	atomic_store(&e->watcher, WATCH_NONE);
	if (wake)
		ring_parked(e);
}

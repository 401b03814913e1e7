/*
 * engine/sq.c - per-thread submission queues.
 *
 * Owns: the SPSC rings through which caller threads hand SQEs to the
 * reactor, and the thread-local cache that finds a thread's ring without a
 * lock. The producer fills entries in place (as with io_uring) and
 * publishes them with one release store; the doorbell is rung only when the
 * progress side announced that it sleeps (Dekker pattern: tail store,
 * full fence, load of `sleeping`, mirrored in reactor_sleep).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

/* ferry__sqe_init (ferry.h) zeroes an entry as 64 bytes, then the rest up to its key. */
_Static_assert(offsetof(struct ferry_sqe, key) >= 64, "ferry_sqe: 64 bytes before key");

#define TLS_SLOTS 4

static __thread struct {
	uint64_t engine_id;
	struct ferry_sq *sq;
} tls_sq[TLS_SLOTS];
static __thread unsigned tls_next;
static __thread int tls_tid;

static int this_tid(void)
{
	if (!tls_tid)
		tls_tid = (int)syscall(SYS_gettid);
	return tls_tid;
}

static struct ferry_sq *sq_new(struct ferry_engine *e, int tid)
{
	struct ferry_sq *sq = aligned_alloc(CACHELINE, sizeof(*sq));

	if (!sq)
		return NULL;
	memset(sq, 0, sizeof(*sq));
	sq->entries = e->sq_entries;
	sq->mask = e->sq_entries - 1;
	sq->engine = e;
	sq->sqes = aligned_alloc(CACHELINE, sizeof(struct ferry_sqe) * sq->entries);
	if (!sq->sqes) {
		free(sq);
		return NULL;
	}
	/* Touch the ring now: fresh pages are expensive on the hot path. */
	memset(sq->sqes, 0, sizeof(struct ferry_sqe) * sq->entries);
	atomic_store(&sq->owner_tid, tid);
	return sq;
}

int ferry_sq_get(struct ferry_engine *e, struct ferry_sq **out)
{
	int tid, rc = 0;
	struct ferry_sq *sq = NULL;
	uint32_t n;

	if (!e || !out) {
		log_error("ferry_sq_get: NULL %s", e ? "out" : "engine");
		return -EINVAL;
	}
	if (atomic_load(&e->closing))
		return -ESHUTDOWN;
	tid = this_tid();
	for (unsigned i = 0; i < TLS_SLOTS; i++) {
		if (tls_sq[i].engine_id == e->id && tls_sq[i].sq &&
		    atomic_load_explicit(&tls_sq[i].sq->owner_tid, memory_order_relaxed) == tid) {
			*out = tls_sq[i].sq;
			return 0;
		}
	}

	pthread_mutex_lock(&e->lock);
	n = atomic_load(&e->nsqs);
	for (uint32_t i = 0; i < n && !sq; i++)
		if (atomic_load(&e->sqs[i]->owner_tid) == tid)
			sq = e->sqs[i];
	for (uint32_t i = 0; i < n && !sq; i++) {
		int free_tid = 0;

		if (atomic_compare_exchange_strong(&e->sqs[i]->owner_tid, &free_tid, tid))
			sq = e->sqs[i];
	}
	if (!sq) {
		if (n == ENGINE_MAX_SQS) {
			rc = -EMFILE; /* logged after the lock: a log sink may take it */
		} else if (!(sq = sq_new(e, tid))) {
			rc = -ENOMEM;
		} else {
			e->sqs[n] = sq;
			atomic_store_explicit(&e->nsqs, n + 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&e->lock);
	if (rc == -EMFILE)
		log_error("engine %s: more than %d threads submit; give queues back "
			  "with ferry_sq_put", e->name, ENGINE_MAX_SQS);
	if (rc)
		return rc;
	tls_sq[tls_next].engine_id = e->id;
	tls_sq[tls_next].sq = sq;
	tls_next = (tls_next + 1) % TLS_SLOTS;
	*out = sq;
	return 0;
}

int ferry_sq_put(struct ferry_sq *sq)
{
	int tid;

	if (!sq)
		return -EINVAL;
	tid = this_tid();
	if (atomic_load(&sq->owner_tid) != tid) {
		log_error("ferry_sq_put: queue not owned by this thread");
		return -EPERM;
	}
	if (sq->tail_local != atomic_load(&sq->tail))
		ferry_sq_submit(sq);
	for (unsigned i = 0; i < TLS_SLOTS; i++)
		if (tls_sq[i].sq == sq)
			tls_sq[i].sq = NULL;
	atomic_store_explicit(&sq->owner_tid, 0, memory_order_release);
	return 0;
}

struct ferry_sqe *ferry_sq_get_sqe(struct ferry_sq *sq)
{
	struct ferry_sqe *sqe;
	const char *next;

	if (unlikely(!sq))
		return NULL;
	if (unlikely(sq->tail_local - sq->head_cache >= sq->entries)) {
		sq->head_cache = atomic_load_explicit(&sq->head, memory_order_acquire);
		if (sq->tail_local - sq->head_cache >= sq->entries)
			return NULL;
	}
	sqe = &sq->sqes[sq->tail_local++ & sq->mask];
	/*
	 * The next entry is written on the next call, maybe microseconds and
	 * a syscall or two from now: ask for its lines now (for writing), so
	 * that filling it does not wait for memory. A ring of a few hundred
	 * entries is larger than the L1 cache, and every entry is cold when
	 * its turn comes round again.
	 */
	next = (const char *)&sq->sqes[sq->tail_local & sq->mask];
	for (size_t off = 0; off < sizeof(*sqe); off += CACHELINE)
		__builtin_prefetch(next + off, 1, 3);
	__builtin_prefetch(next + sizeof(*sqe) - 1, 1, 3);
	return sqe;
}

unsigned ferry_sq_space(const struct ferry_sq *sq)
{
	if (!sq)
		return 0;
	return sq->entries -
	       (sq->tail_local - atomic_load_explicit(&sq->head, memory_order_acquire));
}

int ferry_sq_submit(struct ferry_sq *sq)
{
	uint32_t old;
	struct ferry_engine *e;

	if (unlikely(!sq))
		return -EINVAL;
	e = sq->engine;
	old = atomic_load_explicit(&sq->tail, memory_order_relaxed);
	if (old == sq->tail_local)
		return 0;
	atomic_store_explicit(&sq->tail, sq->tail_local, memory_order_release);
	fence_light(e->asym_fences); /* the tail, then the sleep word (pairs with announce_sleep's heavy fence) */
	/* A THREAD-mode reactor asleep or yielding: run its round here rather than wake it. */
	if (!reactor_stand_in(e) && atomic_load_explicit(&e->wake->sleeping, memory_order_relaxed))
		reactor_wake(e);
	return (int)(sq->tail_local - old);
}

void sq_free_all(struct ferry_engine *e)
{
	uint32_t n = atomic_load(&e->nsqs);

	for (uint32_t i = 0; i < n; i++) {
		free(e->sqs[i]->sqes);
		free(e->sqs[i]);
		e->sqs[i] = NULL;
	}
	atomic_store(&e->nsqs, 0);
}

/*
 * engine/internal.h - the engine's private types, shared by the engine sources and
 * the backends.
 *
 * Owns: the definitions of struct ferry_engine, ferry_sq, ferry_cq,
 * ferry_peer, the in-flight op, the deadline heap, the key table, the
 * backend ops table and the small atomics helpers they use. Data flows
 * caller -> ferry_sq ring -> reactor (reactor.c) -> key table / backend ->
 * peer -> completion (cq.c) -> caller; each step lives in its own file
 * (the reactor's: reactor.c, the op path and the rounds; reactor_sleep.c,
 * reactor_peer.c, reactor_setup.c).
 */
#ifndef FERRY_INTERNAL_H
#define FERRY_INTERNAL_H

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "fence.h"
#include "ferry.h"
#include "log.h"
#include "pool.h"
#include "directory.h"
#include "memory.h"
#include "transport.h"

#define CACHELINE 64
#define cacheline_aligned __attribute__((aligned(CACHELINE)))

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* "In no slot": an op's heap_idx out of the deadline heap, a table index of nothing. */
#define NO_SLOT UINT32_MAX

/* Keys as stored: "{key}@{from}_{to}" plus its NUL. */
#define FULLKEY_MAX (FERRY_KEY_MAX + 2 * FERRY_NAME_MAX + 2)

/* Most threads (submission queues) one engine serves. */
#define ENGINE_MAX_SQS 1024

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/*
 * One step of a bounded spin that has already lasted spun_ns: pause at
 * first; after a couple of microseconds yield the CPU, so that a thread just
 * woken on this CPU (the reactor, or the caller it completes for) runs
 * instead of waiting out our spin. Only idle loops call it.
 */
void ferry__spin_step(uint64_t spun_ns);

/*
 * One step of a spin that waits for work (the reactor thread's after its
 * last round, a caller's in ferry_cq_wait), already spun_ns long. False:
 * stop spinning and sleep, because a yield of this engine lost its CPU
 * lately (reactor_sleep.c: on a busy CPU a yield is a whole time slice of
 * another thread's, with nobody able to wake us).
 */
bool ferry__spin_wait_step(struct ferry_engine *e, uint64_t spun_ns);

/*
 * engine.c: is s a name ferry_engine_create and ferry_peer_open take (1 to
 * FERRY_NAME_MAX - 1 characters of [A-Za-z0-9._:-])? For names that come
 * from a peer: they end up in stored keys ("{key}@{from}_{to}") and logs.
 */
bool ferry__name_valid(const char *s);

/*
 * Counters written by one thread (the reactor of the moment) and read by
 * any (health, with relaxed loads): no locked add. On x86-64 one add to
 * memory (the compiler makes a relaxed load + add + store of three): its
 * store is one aligned write, never torn, and nobody else writes, so a
 * reader sees the old value or the new one. The asm keeps the compiler's
 * hands off the object as the atomics would. Elsewhere: relaxed load +
 * store. Counters are 64 or 32 bits wide (stat_t, and a few _Atomic
 * uint32_t).
 */
typedef _Atomic uint64_t stat_t;
#if defined(__x86_64__)
#define STAT_ADD(c, n) \
	do { \
		__typeof__(&(c)) stat_at_ = &(c); \
		_Static_assert(sizeof(*stat_at_) == 8 || sizeof(*stat_at_) == 4, "a counter"); \
		if (sizeof(*stat_at_) == 8) \
			__asm__ volatile("addq %1, %0" \
					 : "+m"(*(uint64_t *)(void *)stat_at_) \
					 : "er"((uint64_t)(n))); \
		else \
			__asm__ volatile("addl %1, %0" \
					 : "+m"(*(uint32_t *)(void *)stat_at_) \
					 : "er"((uint32_t)(n))); \
	} while (0)
#else
#define STAT_ADD(c, n) \
	atomic_store_explicit(&(c), atomic_load_explicit(&(c), memory_order_relaxed) + (n), \
			      memory_order_relaxed)
#endif
#define STAT_GET(c) atomic_load_explicit(&(c), memory_order_relaxed)

uint64_t ferry__now_ns(void);

/* ------------------------------------------------------------------ */
/* Submission queue: one SPSC ring per thread (sq.c)                   */
/* ------------------------------------------------------------------ */

struct ferry_sq {
	/* Producer side (the owning thread). */
	uint32_t tail_local cacheline_aligned; /* entries handed out */
	uint32_t head_cache;                   /* last head seen */
	_Atomic uint32_t tail cacheline_aligned; /* published to the reactor */
	/* Consumer side (the reactor). */
	_Atomic uint32_t head cacheline_aligned;
	uint32_t mask cacheline_aligned;
	uint32_t entries;
	struct ferry_engine *engine;
	_Atomic int owner_tid; /* 0: free for reuse */
	struct ferry_sqe *sqes;
};

/* ------------------------------------------------------------------ */
/* Completion queue (cq.c)                                             */
/* ------------------------------------------------------------------ */

struct cq_slot {
	_Atomic uint64_t seq;
	struct ferry_cqe cqe;
	ferry_complete_cb *cb;
	void *cb_arg;
};

struct op;

struct ferry_cq {
	_Atomic uint64_t head cacheline_aligned; /* consumers (CAS; the poller's store if single) */
	uint64_t tail cacheline_aligned;         /* the reactor */
	uint64_t mask;
	bool single;             /* its engine is FERRY_ENGINE_SINGLE_POLLER: one consumer */
	struct cq_slot *slots;
	struct ferry_engine *engine;
	int efd;                 /* ferry_cq_fd in THREAD mode */
	_Atomic int armed;
	_Atomic int overflowing; /* completions wait in the overflow list */
	struct op *overflow_head, *overflow_tail; /* reactor only */
	_Atomic uint32_t inflight; /* ops targeting this CQ (written by the reactor) */
	_Atomic uint32_t interrupts; /* ferry_cq_wake count */
	_Atomic uint32_t interrupts_seen; /* the count the last -EINTR reported */
	bool dirty;              /* posted this round (reactor only) */
	bool is_default;
	_Atomic int dead;        /* destroyed: waits in e->dead_cqs for the reactor */
	uint64_t dead_round;
	struct ferry_cq *next_dirty;
	struct ferry_cq *next;   /* engine's list */
};

/*
 * Post a completion; reactor only. Returns true when posted; false when the
 * CQ is full and the completion was parked in holder (which then stays in
 * use until cq_flush_overflow posts it). holder may be NULL only when the
 * caller checked cq_has_space.
 */
bool cq_post(struct ferry_cq *cq, const struct ferry_cqe *cqe, ferry_complete_cb *cb,
	     void *cb_arg, struct op *holder);
/* Move overflowed completions in; returns how many. Reactor only. */
unsigned cq_flush_overflow(struct ferry_cq *cq);
/* The same for every CQ with completions held back (the round). */
unsigned cq_flush_overflows(struct ferry_engine *e);
/* Could a round move overflowed completions in now (a consumer made room)? */
bool cq_overflow_can_move(struct ferry_engine *e);
/* Free the destroyed CQs no round can reach any more (drained: the round took every ring). */
void cq_reap_dead(struct ferry_engine *e, bool drained);
/* After a reactor round: wake waiters / arm fds of CQs posted to. */
void cq_flush_wakeups(struct ferry_engine *e);
int cq_init(struct ferry_engine *e, struct ferry_cq *cq, uint32_t entries, bool is_default);
/*
 * At destroy: run the callbacks of completions nobody polled, release the
 * buffers unread CQEs hold, then free the CQ's memory.
 */
void cq_fini(struct ferry_cq *cq);
bool cq_has_entries(struct ferry_cq *cq);
bool cq_has_space(struct ferry_cq *cq);
/* The ring itself has a free slot (overflow may still be pending). */
bool cq_ring_has_room(struct ferry_cq *cq);

/* ------------------------------------------------------------------ */
/* Ops in flight (reactor.c)                                           */
/* ------------------------------------------------------------------ */

enum op_state {
	OP_FREE = 0,
	OP_PARKED,   /* GET waiting for its key */
	OP_AWAY,     /* PUT handed to a transport, waiting for its ack */
	OP_OVERFLOW, /* completed, waiting for room in its CQ */
	OP_QUEUED,   /* STREAM_PUT waiting for credit (stream.c) */
	OP_STREAMING, /* STREAM_GET / STREAM_ACCEPT between two CQEs (stream.c) */
	/*
	 * A copy of device memory under way in the memory domain (device_put,
	 * device_get): not pending (no CANCEL, deadline or destroy ends it: the
	 * copy ends by itself and the domain then ends or continues the op).
	 */
	OP_DEVICE,
};


/* Waiting for something: a CANCEL, a deadline or the destroy can end it. */
static inline bool op_state_pending(uint8_t state)
{
	return state == OP_PARKED || state == OP_AWAY || state == OP_QUEUED ||
	       state == OP_STREAMING;
}

/*
 * op->flags above the SQE flags. The WIRE_F_* ones travel with a PUT to its
 * destination (transports carry op->flags & WIRE_F__ALL verbatim and refuse
 * anything else on arrival); OP_F_INTERNAL marks an op the engine made for
 * itself (no CQE).
 */
#define WIRE_F_REPLACE FERRY_SQE_REPLACE
#define WIRE_F_CHUNK (1u << 16)  /* a stream chunk: key "{stream}_{n}" */
#define WIRE_F_END (1u << 17)    /* ... its last one */
#define WIRE_F_ABORT (1u << 18)  /* ... the producer gave up; data = reason */
#define WIRE_F_CREDIT (1u << 19) /* consumer -> producer: key "{stream}", data = u64 released */
#define WIRE_F_WANT (1u << 20)   /* chunk: the producer nears its credit limit, credit soon */
/*
 * chunk: its credit returns with its block (the transport tells the
 * producer when the consumer releases it: shm's RELEASE), so the consumer
 * sends no CREDIT for it. Set by a transport, never by the stream layer.
 */
#define WIRE_F_RELCREDIT (1u << 21)
/*
 * The data is a CUDA IPC descriptor (backends/cuda), not the payload: the
 * receiver's memory domain copies from the sender's device memory, and the
 * sender's PUT ends when the receiver gives the block back (its RELEASE).
 * Only a transport with TRANSPORT_CAP_CUDA_IPC carries it (same host); it
 * is not in WIRE_F__ALL, so every other transport refuses it on arrival.
 */
#define WIRE_F_CUDA_IPC (1u << 22)
#define WIRE_F__ALL (WIRE_F_REPLACE | WIRE_F_CHUNK | WIRE_F_END | WIRE_F_ABORT | WIRE_F_CREDIT | \
		     WIRE_F_WANT | WIRE_F_RELCREDIT)
/*
 * Flags of an arrival that is not a plain PUT's data for a waiting GET (a
 * stream's chunk, credit or abort, a chunk whose credit rides its block, a
 * CUDA IPC descriptor): the arrival path's own rules decide what it is.
 */
#define WIRE_F_NOT_DATA (WIRE_F_CHUNK | WIRE_F_ABORT | WIRE_F_CREDIT | WIRE_F_RELCREDIT | \
			 WIRE_F_CUDA_IPC)
/*
 * A PUT of device segments (OP_F_DEVICE) that its transport sends from
 * where they are (backend_ops device_in_place: GPUDirect RDMA); the memory
 * domain staged nothing. Not a wire flag.
 */
#define OP_F_DEVICE_DIRECT (1u << 23)
/*
 * A staged device PUT handed to its transport while its block is still
 * being filled (pool_filled; only to a transport with sends_filling).
 * Not a wire flag.
 */
#define OP_F_FILLING (1u << 15)
/* The flags this file adds never take a bit an SQE flag has. */
_Static_assert(!(FERRY_SQE__ALL & (OP_F_FILLING | OP_F_DEVICE_DIRECT | WIRE_F_CUDA_IPC)),
	       "op flags overlap the SQE flags");
#define OP_F_INTERNAL (1u << 24)
#define OP_F_SENT (1u << 25)     /* STREAM_PUT: handed to the transport */
#define OP_F_REACTOR_CB (1u << 26) /* counted in e->reactor_cb_ops */
/* LOOKUP GET: its holder may remember the wish (FETCH sent, not answered otherwise): wish_seq, key */
#define OP_F_WISH (1u << 27)
/*
 * An AWAY PUT that waits in the engine, on its peer's wait list, for the
 * peer to be reached (a transport's reaching hook said a connection is
 * being made: the control plane's handshake); ferry__peer_reached sends it
 * on or fails it.
 */
#define OP_F_WAIT_PEER (1u << 28)
#define OP_F_PINNED (1u << 29) /* its segments' regions are pinned (memory_unpin at the end) */
#define OP_F_DEVICE (1u << 30) /* some of its segments are device memory (the memory domain copies) */
/*
 * An AWAY PUT of a CUDA IPC descriptor (WIRE_F_CUDA_IPC) whose receiver
 * holds the descriptor (its RESULT of 0 came: reactor_put_held): the
 * receiver may be copying from our device memory, so no deadline and no
 * CANCEL ends it; its RELEASE does (0), or the loss of the connection
 * (-ECONNRESET), or the engine's destroy.
 */
#define OP_F_HELD (1u << 31)

struct key_entry;

struct op {
	uint8_t opcode;
	uint8_t state;
	uint32_t flags;
	uint32_t gen;         /* bumped at every reuse: stale acks are ignored */
	uint32_t index;
	uint64_t user_data;
	uint64_t deadline;    /* absolute ns, 0 = none */
	uint64_t start;       /* ns, for the latency histogram */
	uint32_t heap_idx;    /* position in the deadline heap, NO_SLOT = none */
	struct ferry_cq *cq;
	ferry_complete_cb *cb;
	void *cb_arg;
	struct ferry_peer *peer;
	union {
		const struct iovec *iov;     /* the caller's iovec */
		const struct ferry_seg *segs; /* FERRY_SQE_SEGS: its segments instead */
	};
	uint32_t iovcnt;             /* entries; LOOKUP of every peer: answers still to come */
	struct ferry_buf *buf;       /* ... and its text so far, len bytes */
	uint64_t len;
	struct key_entry *entry;     /* PARKED: the key it waits on */
	struct op *next, *prev;      /* PARKED list / overflow list */
	struct ferry_cqe cqe;        /* OVERFLOW: the completion to post */
	struct stream *stream;       /* STREAM_*: its stream (stream.c) */
	uint64_t interval;           /* STREAM_*: the op's timeout (STREAM_GET: per gap) */
	uint32_t chunk;              /* STREAM_PUT: the index it was sent as; LOOKUP of every
					peer: the peers that hold the key */
	uint64_t wish_seq;           /* OP_F_WISH: the FETCH's seq; a wish parked here: its asker's */
	uint16_t key_len;            /* PUT: the key, for the transport; OP_F_WISH: the key asked */
	char key[FERRY_KEY_MAX];
};

/* A FIFO of ops linked through next/prev (parked GETs, queued STREAM_PUTs). */
static inline void op_list_append(struct op **head, struct op **tail, struct op *op)
{
	op->next = NULL;
	op->prev = *tail;
	if (*tail)
		(*tail)->next = op;
	else
		*head = op;
	*tail = op;
}

static inline void op_list_remove(struct op **head, struct op **tail, struct op *op)
{
	if (op->prev)
		op->prev->next = op->next;
	else
		*head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		*tail = op->prev;
	op->next = op->prev = NULL;
}

/* Complete an op: unpark, drop its deadline, post, free. Reactor only. */
void op_complete(struct ferry_engine *e, struct op *op, int res, uint64_t len,
		 struct ferry_buf *buf);

/* ------------------------------------------------------------------ */
/* Deadlines (timer.c): a binary min-heap, O(log n), no allocation      */
/* ------------------------------------------------------------------ */

struct timer_heap {
	struct op **ops;
	uint32_t n, cap;
};

int timer_init(struct timer_heap *h, uint32_t cap);
void timer_fini(struct timer_heap *h);
void timer_add(struct timer_heap *h, struct op *op);
void timer_del(struct timer_heap *h, struct op *op);
/* Earliest deadline, or 0 if none. */
static inline uint64_t timer_next(const struct timer_heap *h)
{
	return h->n ? h->ops[0]->deadline : 0;
}
/* Remove and return an op whose deadline is <= now, or NULL. */
struct op *timer_pop_expired(struct timer_heap *h, uint64_t now);

/* ------------------------------------------------------------------ */
/* Key table (keytable.c): arrived data and the GETs waiting for it    */
/* ------------------------------------------------------------------ */

struct key_entry {
	uint64_t hash;
	struct key_entry *chain;   /* bucket chain / free list */
	struct op *waiters;        /* parked GETs, FIFO (head) */
	struct op *waiters_tail;
	struct ferry_buf *buf;     /* arrived data (NULL if none) */
	uint64_t len;
	struct ferry_peer *from;   /* for per-peer stats */
	uint32_t wflags;           /* WIRE_F_* the data arrived with */
	bool present;
	uint16_t key_len;
	char key[FULLKEY_MAX];
};

struct key_table {
	struct key_entry **buckets;
	uint64_t mask;     /* buckets in use - 1: follows `used` (keytable.c) */
	uint64_t max_mask; /* buckets allocated - 1 */
	uint32_t frozen;   /* > 0: someone walks the buckets, no resizing */
	struct key_entry *entries;
	struct key_entry *free;
	uint32_t capacity;
	/*
	 * Entries in use (data or waiters). Written by the reactor of the
	 * moment only, read unlocked by keytable_maybe_waiting: relaxed atomic
	 * (a plain move on x86).
	 */
	_Atomic uint32_t used;
	_Atomic uint32_t present; /* entries holding data (health reads it unlocked) */
	uint32_t max_present;
};

/*
 * Any thread, no lock: might a GET wait for some key here (an entry without
 * data)? A hint for backends/loop's direct delivery: it may be stale either
 * way, so it only decides whether the progress lock is worth a try.
 */
static inline bool keytable_maybe_waiting(const struct key_table *t)
{
	return atomic_load_explicit(&t->used, memory_order_relaxed) !=
	       atomic_load_explicit(&t->present, memory_order_relaxed);
}

int keytable_init(struct key_table *t, uint32_t max_present, uint32_t max_waiting);
void keytable_fini(struct key_table *t);
uint64_t keytable_hash(const char *key, size_t len);
/* keytable_find (the entry of key, with hash h, or NULL): inline, below keys_equal. */
/* Find or create; NULL when the table is full. */
struct key_entry *keytable_get(struct key_table *t, const char *key, size_t len, uint64_t h);
/* Create an entry for a key that keytable_find just did not find; NULL when full. */
struct key_entry *keytable_insert(struct key_table *t, const char *key, size_t len, uint64_t h);
/* Drop the entry if it holds neither data nor waiters. */
void keytable_put(struct key_table *t, struct key_entry *ke);
/* Compose "{key}@{from}_{to}"; returns its length or -ENAMETOOLONG. */
int keytable_compose(char *out, const char *key, size_t key_len, const char *from,
		     const char *to);

/*
 * The "@{from}_{to}" of every key that arrives over one path (a peer handle,
 * a connection), made once when the path is made, so that composing a key
 * is two copies (keytable_compose_sfx) instead of a walk over both names.
 */
struct key_suffix {
	uint16_t len;
	char s[2 * FERRY_NAME_MAX + 2];
};

void key_suffix_make(struct key_suffix *sfx, const char *from, const char *to);

/*
 * Whether k[0..n) holds a NUL (a key from a caller or the wire must not):
 * eight bytes at a time, the last word overlapping, never a byte past n.
 * A word has a zero byte iff (w - 0x01..01) & ~w & 0x80..80 is non-zero.
 */
static inline bool key_has_nul(const char *k, size_t n)
{
	const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
	uint64_t w;

	if (n < 8) {
		uint32_t a, b;

		if (n < 4)
			return n && (!k[0] || !k[n / 2] || !k[n - 1]);
		memcpy(&a, k, 4);
		memcpy(&b, k + n - 4, 4);
		return (((a - 0x01010101u) & ~a) | ((b - 0x01010101u) & ~b)) & 0x80808080u;
	}
	for (size_t i = 0; i + 8 < n; i += 8) {
		memcpy(&w, k + i, 8);
		if ((w - ones) & ~w & highs)
			return true;
	}
	memcpy(&w, k + n - 8, 8);
	return ((w - ones) & ~w & highs) != 0;
}

/* A key as a transport read it from the wire: 1 to FERRY_KEY_MAX - 1 bytes, no NUL. */
static inline bool wire_key_ok(const uint8_t *key, uint16_t key_len)
{
	return key_len > 0 && key_len < FERRY_KEY_MAX && !key_has_nul((const char *)key, key_len);
}

/*
 * Whether a[0..n) and b[0..n) are the same bytes (a key looked up against a
 * stored one): eight bytes at a time like key_has_nul, no call to memcmp.
 */
static inline bool keys_equal(const char *a, const char *b, size_t n)
{
	uint64_t x, y, diff = 0;

	if (n < 8) {
		uint32_t p, q, r, t;

		if (n < 4)
			return n == 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1]);
		memcpy(&p, a, 4);
		memcpy(&q, b, 4);
		memcpy(&r, a + n - 4, 4);
		memcpy(&t, b + n - 4, 4);
		return ((p ^ q) | (r ^ t)) == 0;
	}
	for (size_t i = 0; i + 8 < n; i += 8) {
		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		diff |= x ^ y;
	}
	memcpy(&x, a + n - 8, 8);
	memcpy(&y, b + n - 8, 8);
	return (diff | (x ^ y)) == 0;
}

/* The entry of key (len bytes, hash h), or NULL. Inline: every GET and arrival asks. */
static inline struct key_entry *keytable_find(struct key_table *t, const char *key, size_t len,
					      uint64_t h)
{
	for (struct key_entry *ke = t->buckets[h & t->mask]; ke; ke = ke->chain)
		if (ke->hash == h && ke->key_len == len && keys_equal(ke->key, key, len))
			return ke;
	return NULL;
}

/* out holds a key of key_len bytes: append sfx; the full length or -ENAMETOOLONG. */
static inline int keytable_append_sfx(char *out, size_t key_len, const struct key_suffix *sfx)
{
	if (key_len + sfx->len >= FULLKEY_MAX)
		return -ENAMETOOLONG;
	copy_short(out + key_len, sfx->s, sfx->len + 1u);
	return (int)(key_len + sfx->len);
}

/* keytable_compose(out, key, key_len, from, to) with sfx made of from and to. */
static inline int keytable_compose_sfx(char *out, const char *key, size_t key_len,
				       const struct key_suffix *sfx)
{
	if (key_len >= FULLKEY_MAX)
		return -ENAMETOOLONG;
	copy_short(out, key, key_len);
	return keytable_append_sfx(out, key_len, sfx);
}

/* ------------------------------------------------------------------ */
/* Peers and transports                                                */
/* ------------------------------------------------------------------ */

struct peer_stats {
	stat_t puts, gets, bytes_out, bytes_in, errors;
};

struct ferry_peer {
	struct ferry_engine *engine;
	char name[FERRY_NAME_MAX];
	struct key_suffix from_sfx; /* "@{name}_{engine}": the keys a GET from it waits for */
	struct key_suffix to_sfx;   /* "@{engine}_{name}": the keys of our PUTs to it there */
	struct backend *backend;   /* the transport that reaches it, once resolved */
	void *transport;           /* that backend's state for this peer */
	struct peer_stats stats;
	/* Streams to this peer (stream.c; progress side only). */
	uint32_t stream_max_inflight, peer_max_inflight;
	uint32_t stream_inflight;        /* chunks sent, not yet released, all streams */
	struct stream *blocked;          /* producer streams waiting for peer credit */
	struct op *wait_head, *wait_tail; /* PUTs waiting for it to be reached (OP_F_WAIT_PEER) */
	struct ferry_peer *retry_next;   /* on e->retry_peers: its PUTs wait for it to be up */
	bool retrying;
	struct ferry_peer *next;
	/*
	 * Where the peer can be reached, one entry per transport (the URI
	 * scheme names it: "tcp://HOST:PORT"), filled by whoever learns one:
	 * ferry_peer_set_address, the control plane's handshake, later ones.
	 * Under e->lock (ferry__peer_addr_set / _get); naddrs is read unlocked
	 * as a hint.
	 */
	struct peer_addr addrs[PEER_MAX_ADDRS];
	_Atomic uint32_t naddrs;
};

/*
 * The engine's wake word, in a shared page (a memfd) so that peers in other
 * processes can read whether the progress side sleeps and ring its doorbell.
 */
struct wake_page {
	_Atomic int sleeping cacheline_aligned;
	_Atomic int doorbell_rung;
	/*
	 * WAKE_HEAVY_SLEEPS: this engine's sleeps announce themselves with the
	 * heavy fence (engine/fence.h), so a peer process may use the light one
	 * toward it. Written before the page is shared; 0 from older engines.
	 */
	_Atomic uint32_t heavy_sleeps cacheline_aligned;
};

#define WAKE_HEAVY_SLEEPS 0x68767931u

/* ------------------------------------------------------------------ */
/* Streams (stream.c)                                                  */
/* ------------------------------------------------------------------ */

struct stream;
struct stream_table;

int stream_init(struct ferry_engine *e);
/* At destroy: fail what waits, free what is held (progress held). */
void stream_shutdown(struct ferry_engine *e);
void stream_fini(struct ferry_engine *e);
void stream_do_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
void stream_do_get(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
void stream_do_abort(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
void stream_do_accept(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
/*
 * An op of the stream layer completes (called first thing by op_complete);
 * returns the res its CQE reports.
 */
int stream_op_ending(struct ferry_engine *e, struct op *op, int res);
/* A CREDIT arrived (reactor_deliver). Takes buf. */
int stream_credit_arrived(struct ferry_engine *e, const char *fullkey, size_t len,
			  struct ferry_buf *buf, uint64_t blen);
/*
 * A transport that reports the release of a chunk's block (and so sets
 * WIRE_F_RELCREDIT on it) keeps stream_credit_token(op) of the chunk's
 * STREAM_PUT (0: not a stream chunk) with the block, and hands it to
 * stream_chunk_released when the consumer's release comes back, and only
 * then (a refused or lost block is the op's error, not a credit).
 */
uint64_t stream_credit_token(const struct op *op);
void stream_chunk_released(struct ferry_engine *e, uint64_t token);
/* A chunk arrived that a STREAM_GET waits for exactly: true if it took buf. */
bool stream_chunk_direct(struct ferry_engine *e, const char *fullkey, size_t len,
			 struct ferry_buf *buf, uint64_t blen, uint32_t wflags);
/* A chunk entry now holds data: feed its stream (reactor_deliver). */
void stream_chunk_arrived(struct ferry_engine *e, struct key_entry *ke);
/* A plain GET took a chunk: its credit goes back at once. */
void stream_chunk_taken(struct ferry_engine *e, const char *fullkey, size_t len,
			uint32_t wflags);
/* Once per round: releases, credits, stalled streams. Returns events. */
int stream_round(struct ferry_engine *e);
bool stream_has_work(struct ferry_engine *e);
/* When a batched credit falls due (0: none waits): the reactor's sleep ends by then. */
uint64_t stream_next_due(struct ferry_engine *e);
/* Streams open now (health). */
uint32_t stream_count(struct ferry_engine *e);
void stream_peer_lost(struct ferry_engine *e, const char *name, int res);
/*
 * Drop the streams of request r (from peer `from`, or any): their STREAM_GETs
 * and queued STREAM_PUTs complete with -ECANCELED. Returns how many.
 */
int stream_cleanup(struct ferry_engine *e, const char *r, size_t rl,
		   const struct ferry_peer *from);
/*
 * Drop what this engine holds of request r whose stored key is
 * "{key}@{from}_{to}" (NULL: any name): arrived data, parked GETs. Returns
 * how many (engine/cleanup.c).
 */
int ferry__cleanup_keys(struct ferry_engine *e, const char *r, size_t rl, const char *from,
			const char *to);
/* Is the application key k (n bytes) request r's: r itself or r + one of "_:/#"? */
bool request_owns_key(const char *k, size_t n, const char *r, size_t rl);
/* Data handed to a STREAM_GET, or the key's data when none waits: op_fill. */
int op_fill(struct ferry_engine *e, struct op *op);
/* A PUT's source, an iovec or segments, gathered into dst (at most len bytes). */
static inline uint64_t op_gather(const struct op *op, void *dst, uint64_t len)
{
	return (op->flags & FERRY_SQE_SEGS) ? segs_gather(op->segs, op->iovcnt, dst, len)
					    : iov_gather(op->iov, op->iovcnt, dst, len);
}
/* Into a GET's destination, an iovec or segments. */
static inline void op_scatter(const struct op *op, const void *src, uint64_t len)
{
	if (op->flags & FERRY_SQE_SEGS)
		segs_scatter(op->segs, op->iovcnt, src, len);
	else
		iov_scatter(op->iov, op->iovcnt, src, len);
}
/* The bytes of an SQE's iovec or segments. */
static inline uint64_t sqe_payload_len(const struct ferry_sqe *sqe)
{
	return (sqe->flags & FERRY_SQE_SEGS) ? segs_total((const struct ferry_seg *)sqe->iov, sqe->iovcnt)
					     : iov_total(sqe->iov, sqe->iovcnt);
}
void op_arm_deadline(struct ferry_engine *e, struct op *op, uint64_t timeout_ns);
/*
 * The receiver holds the data of the AWAY PUT op (generation gen) and reads
 * it in place until it gives it back (a CUDA IPC descriptor: OP_F_HELD):
 * its deadline stops. A stale op is left alone. Reactor only.
 */
void reactor_put_held(struct ferry_engine *e, struct op *op, uint32_t gen);
/*
 * The receiver gave back the descriptor of the AWAY CUDA IPC PUT op
 * (generation gen) unread, asking for the data again (it cannot open the
 * handles): op is staged through the pool by the memory domain and sent
 * again as a plain PUT, with a fresh deadline; an error completes it. A
 * stale op is left alone. Reactor only.
 */
void reactor_put_restage(struct ferry_engine *e, struct op *op, uint32_t gen);
/* Check a PUT-like SQE and take its buffer: 0, or the op was completed. */
int op_take_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
/* Can a multishot op take one more CQE (flagged MORE) now? */
bool op_can_post_more(struct ferry_engine *e, struct op *op);
/* Post a CQE flagged MORE for a multishot op that stays pending (buf: FERRY_CQE_F_BUF). */
void op_post_more(struct ferry_engine *e, struct op *op, int res, uint64_t len,
		  struct ferry_buf *buf);
/* A free op for the engine's own use, or NULL. */
struct op *op_alloc_internal(struct ferry_engine *e);

/* ------------------------------------------------------------------ */
/* The engine                                                          */
/* ------------------------------------------------------------------ */

struct engine_stats {
	stat_t submitted, completed, failed, timeouts, cancelled;
	stat_t puts, gets, nops, bytes_put, bytes_got, copies, zero_copies;
	stat_t deliveries, refused;
	/*
	 * Every transport's and the control channel's door, as seen by the
	 * engine being called: peers that failed to prove the cluster secret
	 * (or refused our proof), and callers hung up on before they proved
	 * anything (silent past the handshake bound, or the oldest of too
	 * many waiting at once).
	 */
	stat_t peers_refused, handshakes_dropped;
	/* Connections held now that proved nothing yet: the data port's, the control port's. */
	_Atomic uint32_t unproved_data, unproved_control;
	stat_t lat_put[32], lat_get[32]; /* log2(ns) buckets */
};

struct ferry_engine {
	/* Written by submitters and peers, read by the reactor (shared page). */
	struct wake_page *wake;
	int wake_fd;
	/* Progress ownership (MANUAL mode, and the reactor thread). */
	_Atomic int progress_busy cacheline_aligned;
	/*
	 * THREAD mode: the reactor thread lets go progress while it sleeps
	 * (REACTOR_ASLEEP) or yields its CPU in its spin (REACTOR_YIELDING),
	 * so that a caller may run rounds in its place (reactor_stand_in).
	 */
	_Atomic int reactor_parked;
	/* Who runs the rounds of the parked reactor: WATCH_NONE, WATCH_WAIT or WATCH_LEASE. */
	_Atomic int watcher;
	/*
	 * Callers spinning in ferry_cq_wait for POLL_DENSE_NS or longer: while
	 * there are any, the reactor thread parks under a lease after a round
	 * without work (as for dense polls below; their looks renew it),
	 * instead of spinning beside them.
	 */
	_Atomic uint32_t cq_spinners;
	/*
	 * Callers polling in a loop (reactor_poll_stamp): when the last empty
	 * look was, and the last dense one (a thread's POLL_DENSE_LOOKS looks
	 * in a row here); a new dense stamp makes the reactor thread park
	 * unannounced under a lease (WATCH_LEASE) that each look renews, until
	 * lease_until. Their own cache line: pollers write it.
	 */
	_Atomic uint64_t polled_at cacheline_aligned;
	_Atomic uint64_t dense_poll_at;
	/*
	 * The dense stamp a poller's lease ended with (reactor_lease_end):
	 * spent, it starts no new lease when the reactor wakes and finds it.
	 */
	_Atomic uint64_t dense_spent;
	_Atomic uint64_t lease_until;
	/*
	 * When a spin's yield last lost its CPU (reactor_spin_yield), for how
	 * long after it spins sleep instead of yielding, and how often.
	 */
	_Atomic uint64_t yield_lost_at;
	_Atomic uint64_t contended_ns;
	_Atomic uint64_t yields_lost;
	_Atomic uint64_t poll_leases; /* the reactor thread's sleeps under a pollers' lease */
	/* CQ waiters sleep on this futex word. */
	_Atomic uint32_t cq_seq cacheline_aligned;
	_Atomic uint32_t cq_waiters;

	/* Read-mostly. */
	uint64_t id cacheline_aligned; /* unique in the process, for TLS caches */
	char name[FERRY_NAME_MAX];
	char ns[FERRY_NAME_MAX];
	enum ferry_progress_mode mode;
	bool asym_fences; /* FERRY_ENGINE_BUSY_POLL taken: engine/fence.h (every op reads it) */
	/*
	 * FERRY_ENGINE_SINGLE_POLLER (MANUAL mode): progress_busy is a flag
	 * against re-entry, not a lock, and the CQs are reaped by one thread;
	 * poller is that thread (this_thread, 0 until the first poll claims
	 * it: poller_ok), written once.
	 */
	bool single_poller;
	_Atomic uintptr_t poller;
	_Atomic int poller_refusals; /* calls from other threads refused (the first is logged) */
	uint64_t spin_ns;
	uint32_t sq_entries;
	uint64_t created_ns;
	_Atomic int closing;

	/* Submission queues: append-only array. */
	struct ferry_sq *sqs[ENGINE_MAX_SQS];
	_Atomic uint32_t nsqs;

	/* Everything below belongs to whoever holds progress_busy. */
	struct op *ops;
	uint32_t max_ops;
	uint32_t max_keys;
	uint32_t max_bufs;
	struct op *free_ops;
	_Atomic uint32_t ops_in_use; /* health reads it unlocked */
	struct timer_heap timers;
	struct key_table keys;
	struct ferry_cq *dirty_cqs;
	uint64_t now;   /* the clock, read at most once per round (reactor_now) */
	uint32_t lat_seq; /* ops taken: every 16th is timed for the latency histogram */
	bool now_valid;
	/* Stand-in rounds (reactor_sleep.c): a caller runs a round for the parked reactor. */
	bool standing_in;
	bool stand_in_needs_reactor; /* it left work only the reactor thread may do */
	uint64_t parked_until;       /* when the parked reactor wakes by itself (UINT64_MAX: never) */
	uint64_t dense_seen;         /* the reactor thread's last look at dense_poll_at */
	int lease_slot;              /* in the lease slot table (reactor_lease_slot_take), or -1 */
	uint32_t reactor_cb_ops;     /* pending ops whose callback runs on the reactor thread */

	/* The reactor's io_uring: doorbell reads and the sleep. */
	struct io_uring ring;
	int doorbell_fd;
	uint64_t doorbell_val;
	bool doorbell_armed;
	bool sleep_in_ppoll;          /* under valgrind: see reactor_sleep */
	uint64_t timeout_armed_at;    /* MANUAL arm: expiry of the TIMEOUT queued, 0 = none */
	struct __kernel_timespec arm_ts;
	pthread_t thread;
	bool thread_started;
	_Atomic int stop;

	struct pool *pool;
	struct ferry_cq default_cq;
	struct stream_table *streams;

	pthread_mutex_t lock; /* slow paths: peers, CQ lists, SQ creation */
	struct ferry_peer *peers;
	struct ferry_cq *cqs;
	struct ferry_cq *dead_cqs;        /* destroyed, not yet freed */
	_Atomic uint32_t dead_cqs_pending;
	_Atomic uint32_t overflowing_cqs; /* CQs with completions held back, default included */
	_Atomic uint64_t rounds;          /* reactor rounds run */

	struct backend backends[ENGINE_MAX_BACKENDS];
	unsigned nbackends;
	/*
	 * The round's hooks, by transport index (backends[]), made as
	 * transports are added (add_backend). A round walks the set bits of
	 * awake (the transports not quiet, transport.h) and of has_drained /
	 * has_end (those that have the hook), lowest index first: no test of a
	 * quiet transport, no NULL tests, no ops table loads.
	 */
	_Atomic uint32_t awake;
	uint32_t has_drained, has_end;
	int (*round_progress[ENGINE_MAX_BACKENDS])(struct ferry_engine *e, struct backend *b);
	int (*round_end[ENGINE_MAX_BACKENDS])(struct ferry_engine *e, struct backend *b);
	void (*round_drained[ENGINE_MAX_BACKENDS])(struct ferry_engine *e, struct backend *b);
	/* The creation parameters, valid only while backends init (NULL after). */
	const struct ferry_engine_params *create_params;

	uint64_t handshake_ns;   /* params.handshake_ms (default 3 s): every transport's bound */
	struct ferry_region *regions; /* registered regions (memory.c), under lock */
	void *pool_reg[ENGINE_MAX_BACKENDS]; /* each transport's registration of the pool */
	/* Peers whose FERRY_SQE_WAIT_PEER PUTs wait for them to come up (progress side). */
	struct ferry_peer *retry_peers;
	uint64_t retry_at, retry_ns;  /* the next try of them all, and the backoff */
	/* The directory service (directory.h), or NULL: its ops are -EOPNOTSUPP. */
	const struct directory_ops *dir;
	void *dir_svc;
	struct engine_stats stats;
};

/*
 * The reactor's post, in place: the CQ's next slot when it is free (else
 * NULL), to be filled and then published with cq_slot_publish. op_complete
 * writes its CQE straight into the slot (no CQE built beside it and
 * copied); cq_post (cq.c) goes through the same two steps.
 */
static inline struct cq_slot *cq_slot_free(struct ferry_cq *cq)
{
	struct cq_slot *s = &cq->slots[cq->tail & cq->mask];

	return atomic_load_explicit(&s->seq, memory_order_acquire) == cq->tail ? s : NULL;
}

/* cq got a completion this round: its waiters are woken at the round's end. */
static inline void cq_mark_dirty(struct ferry_cq *cq)
{
	if (!cq->dirty) {
		struct ferry_engine *e = cq->engine;

		cq->dirty = true;
		cq->next_dirty = e->dirty_cqs;
		e->dirty_cqs = cq;
	}
}

static inline void cq_slot_publish(struct ferry_cq *cq, struct cq_slot *s)
{
	atomic_store_explicit(&s->seq, cq->tail + 1, memory_order_release);
	cq->tail++;
	/*
	 * The next post reads and writes the next slot: fetch it now, while
	 * nobody waits (every slot is cold when its turn comes round again).
	 */
	__builtin_prefetch(&cq->slots[cq->tail & cq->mask], 1, 3);
	cq_mark_dirty(cq);
}

/*
 * The first of e's peers, for a walk of the list without e->lock (the
 * progress side: a round must not hold the lock while ops complete, since
 * callbacks and log sinks may call what takes it). ferry_peer_open adds a
 * peer at the head only, with a release store, and peers are freed only
 * with the engine: from this head on the list never changes (peers opened
 * after the load are not on it).
 */
static inline struct ferry_peer *ferry__peers_first(struct ferry_engine *e)
{
	return __atomic_load_n(&e->peers, __ATOMIC_ACQUIRE);
}

/* The round's clock: read on first use in a round (a read costs ~70 ns here). */
static inline uint64_t reactor_now(struct ferry_engine *e)
{
	if (!e->now_valid) {
		e->now = ferry__now_ns();
		e->now_valid = true;
	}
	return e->now;
}

/* One reactor round: returns events handled. Caller holds progress_busy. */
int reactor_run_once(struct ferry_engine *e);
/* True when a round would find work. */
bool reactor_has_work(struct ferry_engine *e);
/* Is transport b quiet (transport.h: its round hooks are skipped)? */
static inline bool backend_quiet(struct backend *b)
{
	return !(atomic_load_explicit(b->awake, memory_order_relaxed) & (1u << b->index));
}
/* The reactor is about to call another hook of b: its round hooks run again. */
static inline void backend_busy(struct backend *b)
{
	uint32_t bit = 1u << b->index;

	if (!(atomic_load_explicit(b->awake, memory_order_relaxed) & bit))
		atomic_fetch_or_explicit(b->awake, bit, memory_order_relaxed);
}
/*
 * The next transport at or above index `from` whose hook (a bit of hooks)
 * runs in this round: awake is read again each time, so that a hook that
 * wakes a later transport has it called in the same round. 0 = none left.
 */
static inline uint32_t round_hooks_from(struct ferry_engine *e, uint32_t hooks, unsigned from)
{
	return atomic_load_explicit(&e->awake, memory_order_relaxed) & hooks & ~((1u << from) - 1);
}
/* Sleep in the io_uring wait until the doorbell, the next deadline, or
 * timeout_ns (< 0 = none). Caller holds progress_busy. */
void reactor_sleep(struct ferry_engine *e, int64_t timeout_ns);
/* The same, but not if *word != val once the sleep is announced. */
void reactor_sleep_unless(struct ferry_engine *e, int64_t timeout_ns, _Atomic uint32_t *word,
			  uint32_t val);
int reactor_init(struct ferry_engine *e);
int reactor_arm_manual(struct ferry_engine *e);
/* Cancel everything at destroy. */
void reactor_shutdown(struct ferry_engine *e);
void reactor_fini(struct ferry_engine *e);
void *reactor_thread_main(void *arg);

/* Does any submission ring hold an entry? (Progress side: the rounds and has_work.) */
static inline bool sqs_pending(struct ferry_engine *e)
{
	uint32_t nsqs = atomic_load_explicit(&e->nsqs, memory_order_acquire);

	for (uint32_t i = 0; i < nsqs; i++)
		if (atomic_load_explicit(&e->sqs[i]->tail, memory_order_acquire) !=
		    atomic_load_explicit(&e->sqs[i]->head, memory_order_relaxed))
			return true;
	return false;
}

/* Progress, taken by one of the threads that may drive it (not a SINGLE_POLLER engine). */
static inline bool progress_try_lock_shared(struct ferry_engine *e)
{
	return atomic_load_explicit(&e->progress_busy, memory_order_relaxed) == 0 &&
	       atomic_exchange_explicit(&e->progress_busy, 1, memory_order_acquire) == 0;
}

/*
 * A SINGLE_POLLER engine's progress: only its poller takes it (poller_ok;
 * destroy once it stopped), so no exchange: a flag against a round inside
 * its own round (a callback that polls). Acquire: a destroying thread still
 * pairs with the poller's last release, as the exchange did.
 */
static inline bool progress_try_lock_single(struct ferry_engine *e)
{
	if (atomic_load_explicit(&e->progress_busy, memory_order_acquire))
		return false;
	atomic_store_explicit(&e->progress_busy, 1, memory_order_relaxed);
	return true;
}

/* Its end: no other thread waits for the poller to go (no fence, no futex). */
static inline void progress_unlock_single(struct ferry_engine *e)
{
	atomic_store_explicit(&e->progress_busy, 0, memory_order_release);
}

static inline bool progress_try_lock(struct ferry_engine *e)
{
	return e->single_poller ? progress_try_lock_single(e) : progress_try_lock_shared(e);
}

void progress_unlock_shared(struct ferry_engine *e);

static inline void progress_unlock(struct ferry_engine *e)
{
	if (e->single_poller)
		progress_unlock_single(e);
	else
		progress_unlock_shared(e);
}

/* The first call from a thread that is not a SINGLE_POLLER engine's poller (cq.c). */
bool poller_claim(struct ferry_engine *e) __attribute__((cold, noinline));

/*
 * The calling thread, as a number no other live thread has: its thread
 * pointer (one instruction: on x86-64 glibc what pthread_self returns).
 */
#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer)
#define FERRY_HAVE_THREAD_POINTER 1
#endif
#endif
#ifdef FERRY_HAVE_THREAD_POINTER
static inline uintptr_t this_thread(void)
{
	return (uintptr_t)__builtin_thread_pointer();
}
#else
static inline uintptr_t this_thread(void)
{
	return (uintptr_t)pthread_self();
}
#endif

/*
 * May the calling thread poll e, wait on its CQs or drive its progress?
 * Always, but on a FERRY_ENGINE_SINGLE_POLLER engine only its poller (the
 * first thread to ask); the callers answer -EPERM otherwise. MANUAL mode.
 */
static inline bool poller_ok(struct ferry_engine *e)
{
	return !e->single_poller ||
	       likely(atomic_load_explicit(&e->poller, memory_order_relaxed) == this_thread()) ||
	       poller_claim(e);
}

/*
 * THREAD mode, called by a submitter or a waiter: if the reactor thread is
 * parked in its sleep, run one round in its place (no CB_REACTOR callback
 * runs, the io_uring is left to the reactor) and wake it only if the round
 * left it something to do. Returns true if a round ran.
 */
enum { REACTOR_RUNNING = 0, REACTOR_ASLEEP = 1, REACTOR_YIELDING = 2 };
/*
 * e->watcher: nobody; a caller spinning in ferry_cq_wait that found the
 * reactor in an announced sleep (reactor_watch: that sleep suspended until
 * reactor_unwatch); or a lease taken for callers that poll in a loop or
 * spin in ferry_cq_wait (reactor_poll_lease), which the reactor thread
 * ends when it wakes and finds it run out, or a caller ends before it
 * sleeps (reactor_lease_end).
 */
enum { WATCH_NONE = 0, WATCH_WAIT = 1, WATCH_LEASE = 2 };
bool reactor_stand_in_parked(struct ferry_engine *e);
/* Inline: every ferry_sq_submit asks, and mostly the answer is "not parked". */
static inline bool reactor_stand_in(struct ferry_engine *e)
{
	return e->mode == FERRY_PROGRESS_THREAD &&
	       atomic_load_explicit(&e->reactor_parked, memory_order_relaxed) &&
	       reactor_stand_in_parked(e);
}
/*
 * THREAD mode, for a caller spinning in ferry_cq_wait: while the reactor
 * is parked, keep watch in its place: its sleep is suspended (peers and
 * submitters see it awake and ring no doorbell) and every call runs a
 * stand-in round. *watching says whether this caller keeps the watch;
 * reactor_unwatch ends it, announcing the reactor's sleep again (and
 * waking it if work is left), before the caller returns or sleeps.
 */
void reactor_watch(struct ferry_engine *e, bool *watching);
void reactor_unwatch(struct ferry_engine *e, bool *watching);
/*
 * THREAD mode, ferry_cq_poll found nothing: callers that poll in a loop
 * run the rounds while the reactor thread parks. Each empty poll is
 * stamped; a thread's POLL_DENSE_LOOKS polls in a row at one engine, each
 * within POLL_DENSE_NS of the last, are dense and make the reactor, after
 * a round without work, park under a lease (unannounced: peers ring no
 * doorbell) instead of spinning beside them. Each poll renews the
 * lease (POLL_LEASE_NS) and runs a round in the reactor's place; the
 * reactor's sleep ends when the lease runs out, so a poller that stops
 * leaves work unseen for at most POLL_LEASE_NS. A dense poller that finds
 * the reactor in an announced sleep rings it once, to park leased.
 */
#define POLL_DENSE_NS 20000ull
#define POLL_DENSE_LOOKS 8 /* looks in a row, each within POLL_DENSE_NS, before polls are dense */
#define POLL_LEASE_NS 200000ull
bool reactor_poll_watch(struct ferry_engine *e); /* true: it ran a round */
/*
 * Only the stamp (true: dense), for ferry_cq_wait's first look: calls that
 * wait a moment in a loop (a nowait GET each) poll as densely.
 */
bool reactor_poll_stamp(struct ferry_engine *e, uint64_t now);
/* A caller about to sleep ends the lease (its rounds stop): announced again, woken if work is left. */
void reactor_lease_end(struct ferry_engine *e);
/*
 * A thread that kept a lease on one engine and now waits on another
 * (ferry_cq_wait) ends the first one's lease: its polls stopped, and what
 * it waits for may need that engine (two stages of one thread: a PUT from
 * one into the other, which the first one's leased reactor would see only
 * when the lease ran out). The thread knows the engine by a slot of a
 * process-wide table (the engine may be gone): taken at create, given back
 * at destroy, which waits for a thread using the slot to let go of it.
 */
void reactor_lease_slot_take(struct ferry_engine *e);
void reactor_lease_slot_give(struct ferry_engine *e);
void reactor_lease_switch(struct ferry_engine *e);

/* futex helpers */
int ferry__futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns);
void ferry__futex_wake_all(_Atomic uint32_t *addr);

/* The sq.c side the reactor uses. */
struct ferry_sqe *sq_peek(struct ferry_sq *sq, uint32_t *avail);
void sq_advance(struct ferry_sq *sq, uint32_t n);
void sq_free_all(struct ferry_engine *e);

void ferry__op_free(struct ferry_engine *e, struct op *op);

/* FERRY_OP_CLEANUP (cleanup.c): run by the reactor; completes op. */
void ferry__do_cleanup(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);

#endif

/*
 * engine/stream_int.h - the stream layer's private types and the calls
 * between its files.
 *
 * Owns: the stream record, the release sink and the stream table, the
 * small helpers every stream file uses (static inline: they are on the
 * chunk path), and the calls from the chunk path (stream.c) to its cold
 * parts (stream_end.c, stream_accept.c) and back, and stream_round_due,
 * the one thing the reactor reads here. Everything here runs on the
 * progress side, except the release hook (see stream.c).
 */
#ifndef FERRY_STREAM_INT_H
#define FERRY_STREAM_INT_H

#include <stdlib.h>

#include "internal.h"

#define STREAM_DEFAULT_INFLIGHT 16u
#define PEER_DEFAULT_INFLIGHT 1024u
/*
 * Credits go back lazily: at once when the producer flagged that it reached
 * its limit (WIRE_F_WANT on its latest chunk), else once CREDIT_BATCH
 * chunks were released, or the oldest release waited CREDIT_DELAY_NS (so a
 * producer blocked by its per-peer limit on another stream is never stuck).
 */
#define CREDIT_BATCH 8u
#define CREDIT_DELAY_NS 50000u
#define CREDIT_SCAN 64u

enum { ROLE_PRODUCER = 1, ROLE_CONSUMER = 2 };

struct stream {
	uint64_t hash;
	struct stream *chain;       /* bucket chain / free list */
	uint32_t index, gen;
	uint8_t role;
	bool used;
	bool hashed;      /* findable by its key (a retired record settles unhashed) */
	bool ended;       /* producer: END or abort taken; consumer: END/abort reached */
	bool dirty;       /* consumer: on the credit list */
	bool stalled;     /* consumer: on the stalled list (CQ full, no op) */
	bool announce;    /* consumer: subscribers still to be told */
	bool blocked;     /* producer: on its peer's blocked list */
	bool credit_away; /* consumer: a CREDIT is on its way */
	bool want;        /* consumer: the latest chunk asked for credit soon */
	uint64_t dirty_since; /* consumer: when the oldest uncredited release happened */
	int err;          /* producer: the peer went away (sticky) */
	bool broken;      /* producer: failed before its END was delivered: kept, failed,
			     until a cleanup of its request (a later STREAM_PUT must not
			     start the key again at chunk 0, nor take a failed one's index) */
	bool cleaned;     /* producer: its request was cleaned up: over, never broken again */
	bool aborting;    /* producer: its queue is failed by a STREAM_ABORT (not broken) */
	struct ferry_peer *peer; /* producer: destination; consumer: source */
	uint32_t next;    /* producer: next index to send; consumer: next expected */
	uint64_t sent, lost, released; /* producer: chunk counts */
	uint64_t credit_seen;          /* producer: the last CREDIT's count */
	uint64_t taken, credited;      /* consumer: released so far, last credit sent */
	uint64_t credit_acked;         /* consumer: the last credit the producer took */
	uint32_t held;                 /* consumer: chunks the application holds */
	uint32_t parked;  /* consumer: chunks left in the key table (at most; 0: none) */
	uint32_t away;    /* producer: chunks at the transport */
	struct op *q_head, *q_tail;    /* producer: STREAM_PUTs waiting for credit */
	struct op *getter;             /* consumer: the STREAM_GET */
	struct ferry_buf *whole_head, *whole_tail; /* consumer: STREAM_WHOLE chunks */
	uint64_t whole_len;
	uint32_t whole_n;
	struct stream *next_dirty, *next_stalled, *next_blocked;
	uint16_t key_len;              /* the stream key */
	uint16_t full_len;             /* "{stream}@{from}_{to}" */
	char full[FULLKEY_MAX];
};

/*
 * Chunk buffers handed to the application are wrapped (pool_wrap) so that
 * their release comes here. The sink outlives the engine while wrapped
 * buffers are out: one reference for the engine, one per wrapped buffer.
 */
struct stream_sink {
	_Atomic uint32_t refs;
	_Atomic uint32_t users;  /* release hooks running right now */
	_Atomic int closed;      /* the engine is gone */
	struct ferry_engine *e;
	struct ferry_buf *_Atomic releases;
};

struct stream_table {
	struct stream **buckets;
	uint64_t mask;
	struct stream *recs;
	struct stream *free;
	uint32_t capacity;
	_Atomic uint32_t used; /* also read by ferry_engine_health, unlocked */
	struct stream *dirty, *stalled;
	bool credit_urgent;        /* a dirty record may send now: scan this round */
	bool peer_credit_freed;    /* per-peer credit came back outside a credit: re-pump */
	uint32_t nblocked;         /* producer records on a peer's blocked list */
	uint32_t nbroken;          /* producer records kept failed until a cleanup */
	uint32_t rounds_since_scan; /* else scan the dirty list every CREDIT_SCAN rounds */
	struct op *acceptors;       /* STREAM_ACCEPT ops */
	struct stream_sink *sink;
	/*
	 * The records of the last STREAM_PUT and the last chunk that arrived
	 * (rec_id; 0 = none): a stream's next chunk is matched against them
	 * before any parsing or hashing of its key (stream_hint_put,
	 * stream_chunk_direct).
	 */
	uint64_t hint_put, hint_get;
};

/*
 * Has stream_round anything to do this round: credit to re-pump, releases
 * to take, credits to scan, stalled records? The reactor asks before it
 * calls it (reactor.c includes this header for it alone), so a round with
 * no stream work costs a few loads, not a call.
 */
static inline bool stream_round_due(const struct ferry_engine *e)
{
	const struct stream_table *t = e->streams;

	return t->peer_credit_freed || t->dirty || t->stalled ||
	       atomic_load_explicit(&t->sink->releases, memory_order_relaxed);
}

static inline uint64_t rec_id(const struct stream *r)
{
	return ((uint64_t)r->index << 32) | r->gen;
}

static inline struct stream *rec_by_id(struct stream_table *t, uint64_t id)
{
	uint32_t index = (uint32_t)(id >> 32);
	struct stream *r;

	if (index >= t->capacity)
		return NULL;
	r = &t->recs[index];
	return r->used && r->gen == (uint32_t)id ? r : NULL;
}

static inline void stall(struct stream_table *t, struct stream *r)
{
	if (r->used && !r->stalled) {
		r->stalled = true;
		r->next_stalled = t->stalled;
		t->stalled = r;
	}
}

static inline void sink_unref(struct stream_sink *s)
{
	if (atomic_fetch_sub(&s->refs, 1) == 1)
		free(s);
}

static inline void finish_release(struct stream_sink *s, struct ferry_buf *w)
{
	struct ferry_buf *inner = (struct ferry_buf *)(uintptr_t)w->remote_cookie;

	pool_free(inner);
	pool_wrap_done(w);
	sink_unref(s);
}

static inline void whole_free(struct stream *r)
{
	struct ferry_buf *b = r->whole_head, *next;

	for (; b; b = next) {
		next = atomic_load_explicit(&b->release_next, memory_order_relaxed);
		pool_free(b);
	}
	r->whole_head = r->whole_tail = NULL;
	r->whole_len = 0;
	r->whole_n = 0;
}

/* stream.c: the record of "{stream}@{from}_{to}" in role, or NULL. */
struct stream *stream_rec_find(struct stream_table *t, uint8_t role, const char *full, size_t len);
/* stream.c: free r if nothing refers to it any more. */
void stream_rec_maybe_free(struct ferry_engine *e, struct stream *r);
/*
 * stream.c: the checks every stream op starts with; the record identity
 * into full (its length), or the op is completed and a negative errno.
 */
int stream_op_key(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe,
		  bool producer, char full[FULLKEY_MAX]);
/* stream_end.c: a producer's stream failed (see there). */
void stream_producer_fail(struct ferry_engine *e, struct stream *r, int err);
/* stream_accept.c: tell the STREAM_ACCEPTs about the new stream r (stalls r if no room). */
void stream_notify_acceptors(struct ferry_engine *e, struct stream *r);

#endif

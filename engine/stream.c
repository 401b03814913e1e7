/*
 * engine/stream.c - the chunk path of streams: STREAM_PUT and STREAM_GET,
 * and the credits that flow back from consumer to producer.
 *
 * Owns: the stream records (found by key, freed when nothing refers to
 * them), the producer side (chunk numbering, the queue of STREAM_PUTs
 * waiting for credit, per-stream and per-peer limits, the streams blocked
 * on their peer's limit, credits coming in), the consumer side (the
 * multishot STREAM_GET fed in order, straight from an arrival or from the
 * key table, the whole-stream mode, the gap deadline, credits going out),
 * the release sink through which chunk buffers the application releases
 * (on any thread) come back to the reactor as credits, the stream ops'
 * ending and the stream layer's part of a round. Everything a chunk goes
 * through is here, so the calls between them stay in one translation unit.
 *
 * Elsewhere: the table's creation and destroy (stream_table.c), streams
 * ended from outside: a producer broken, STREAM_ABORT, a peer lost, a
 * request cleaned up (stream_end.c), STREAM_ACCEPT (stream_accept.c).
 *
 * Data model. A chunk is an ordinary keyed PUT: key "{stream}_{n}", flags
 * WIRE_F_CHUNK (+ WIRE_F_END on the last, WIRE_F_ABORT for an abort whose
 * data is the reason). Transports carry it like any PUT; on arrival it goes
 * into the key table like any data (so a plain GET of one chunk works), and
 * the consumer's stream record, if a STREAM_GET waits, takes chunks out of
 * the table in order. A credit is a PUT the other way: key "{stream}",
 * flags WIRE_F_CREDIT, 8 bytes: the count of chunks the consumer released
 * so far (cumulative, so a lost or repeated credit does no harm). Credits
 * never enter the key table.
 *
 * Everything here runs on the progress side (the reactor), except the
 * release hook, which only pushes onto a lock-free list and rings the
 * doorbell.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "stream_int.h"

/* ------------------------------------------------------------------ */
/* Records                                                             */
/* ------------------------------------------------------------------ */

static uint64_t rec_hash(const char *full, size_t len, uint8_t role)
{
	return keytable_hash(full, len) ^ ((uint64_t)role * 0x9e3779b97f4a7c15ull);
}

struct stream *stream_rec_find(struct stream_table *t, uint8_t role, const char *full, size_t len)
{
	uint64_t h = rec_hash(full, len, role);

	for (struct stream *r = t->buckets[h & t->mask]; r; r = r->chain)
		if (r->hash == h && r->role == role && r->full_len == len &&
		    memcmp(r->full, full, len) == 0)
			return r;
	return NULL;
}

static struct stream *rec_new(struct ferry_engine *e, uint8_t role, const char *full, size_t len,
			      size_t key_len, struct ferry_peer *peer)
{
	struct stream_table *t = e->streams;
	struct stream *r = t->free;
	uint64_t h = rec_hash(full, len, role);
	uint32_t index, gen;

	if (!r) {
		log_limited(FERRY__LOG_WARN, "engine %s: stream table full (%u streams, %u of them "
			    "failed streams kept until their request is cleaned up)", e->name,
			    STAT_GET(t->used), t->nbroken);
		return NULL;
	}
	t->free = r->chain;
	index = r->index;
	gen = r->gen + 1;
	memset(r, 0, sizeof(*r));
	r->index = index;
	r->gen = gen;
	r->hash = h;
	r->role = role;
	r->used = true;
	r->peer = peer;
	r->key_len = (uint16_t)key_len;
	r->full_len = (uint16_t)len;
	memcpy(r->full, full, len);
	r->full[len] = '\0';
	r->chain = t->buckets[h & t->mask];
	t->buckets[h & t->mask] = r;
	r->hashed = true;
	STAT_ADD(t->used, 1);
	return r;
}

/*
 * Take an ended record off its hash chain: the key may start a new stream
 * (a new record) while this one settles its last credits.
 */
static void rec_unhash(struct stream_table *t, struct stream *r)
{
	struct stream **pp;

	if (!r->hashed)
		return;
	for (pp = &t->buckets[r->hash & t->mask]; *pp != r; pp = &(*pp)->chain)
		;
	*pp = r->chain;
	r->chain = NULL;
	r->hashed = false;
}

/* Free a record nothing refers to any more. */
static void rec_maybe_free(struct ferry_engine *e, struct stream *r)
{
	struct stream_table *t = e->streams;
	if (!r->used || r->dirty || r->stalled || r->blocked || r->credit_away || r->getter)
		return;
	if (r->role == ROLE_PRODUCER) {
		/* Over once the consumer released every chunk, or is gone. */
		if (r->broken || r->q_head || r->away || (!r->ended && !r->err) ||
		    (!r->err && r->sent - r->lost - r->released))
			return;
		if (r->sent - r->lost - r->released) {
			r->peer->stream_inflight -= (uint32_t)(r->sent - r->lost - r->released);
			t->peer_credit_freed = true; /* streams blocked on the peer may go */
		}
	} else if ((!r->ended && !r->err) || (r->held && !r->err)) {
		return; /* credits still to return */
	}
	rec_unhash(t, r);
	r->used = false;
	r->gen++;
	r->chain = t->free;
	t->free = r;
	STAT_ADD(t->used, (uint32_t)-1);
}

void stream_rec_maybe_free(struct ferry_engine *e, struct stream *r)
{
	rec_maybe_free(e, r);
}

/* ------------------------------------------------------------------ */
/* Parsing keys                                                        */
/* ------------------------------------------------------------------ */

/*
 * Split an arrived "{key}@{from}_{me}": *key_len and the from name (copied
 * into from, NUL-terminated). The names cannot hold '@', so the last '@'
 * ends the key. Returns 0 or -EINVAL.
 */
static int split_fullkey(struct ferry_engine *e, const char *full, size_t len, size_t *key_len,
			 char *from)
{
	size_t me = strlen(e->name), at, fl;

	for (at = len; at > 0 && full[at - 1] != '@'; at--)
		;
	if (at == 0 || len < at + me + 2 || full[len - me - 1] != '_' ||
	    memcmp(full + len - me, e->name, me) != 0)
		return -EINVAL;
	fl = len - me - 1 - at;
	if (fl == 0 || fl >= FERRY_NAME_MAX)
		return -EINVAL;
	memcpy(from, full + at, fl);
	from[fl] = '\0';
	*key_len = at - 1;
	return 0;
}

/* "{stream}_{n}" -> stream length and n. Returns 0 or -EINVAL. */
static int split_chunk_key(const char *key, size_t len, size_t *stream_len, uint32_t *n)
{
	size_t i = len;
	uint64_t v = 0, mul = 1;

	while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9' && len - i < 10) {
		v += (uint64_t)(key[i - 1] - '0') * mul;
		mul *= 10;
		i--;
	}
	if (i == len || i < 2 || key[i - 1] != '_' || v > UINT32_MAX)
		return -EINVAL;
	*stream_len = i - 1;
	*n = (uint32_t)v;
	return 0;
}

/* out = "{stream}_{n}{suffix}"; returns its length (out has FULLKEY_MAX bytes). */
static size_t chunk_key(char *out, const char *stream, size_t slen, uint32_t n, const char *suffix,
			size_t sfx_len)
{
	char digits[10];
	size_t nd = 0, len;

	do {
		digits[nd++] = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	memcpy(out, stream, slen);
	len = slen;
	out[len++] = '_';
	while (nd)
		out[len++] = digits[--nd];
	memcpy(out + len, suffix, sfx_len);
	len += sfx_len;
	out[len] = '\0';
	return len;
}

static struct ferry_peer *peer_by_name(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p = NULL;

	if (ferry_peer_open(e, name, &p) < 0)
		return NULL;
	return p;
}

static uint32_t limit_stream(const struct ferry_peer *p)
{
	uint32_t v = __atomic_load_n(&p->stream_max_inflight, __ATOMIC_RELAXED);

	return v ? v : STREAM_DEFAULT_INFLIGHT;
}

static uint32_t limit_peer(const struct ferry_peer *p)
{
	uint32_t v = __atomic_load_n(&p->peer_max_inflight, __ATOMIC_RELAXED);

	return v ? v : PEER_DEFAULT_INFLIGHT;
}

int ferry_peer_set_stream_limits(struct ferry_peer *p, uint32_t per_stream, uint32_t per_peer)
{
	if (!p) {
		log_error("ferry_peer_set_stream_limits: NULL peer");
		return -EINVAL;
	}
	if (per_stream)
		__atomic_store_n(&p->stream_max_inflight, per_stream, __ATOMIC_RELAXED);
	if (per_peer)
		__atomic_store_n(&p->peer_max_inflight, per_peer, __ATOMIC_RELAXED);
	return 0;
}

static int check_stream_key(const struct ferry_sqe *sqe)
{
	if (sqe->key_len > FERRY_STREAM_KEY_MAX) {
		log_error("op %llx: stream key of %u bytes (max %d)",
			  (unsigned long long)sqe->user_data, sqe->key_len, FERRY_STREAM_KEY_MAX);
		return -ENAMETOOLONG;
	}
	if (sqe->key_len == 0 || strnlen(sqe->key, FERRY_KEY_MAX) != sqe->key_len) {
		log_error("op %llx: empty or malformed stream key", (unsigned long long)sqe->user_data);
		return -EINVAL;
	}
	return 0;
}

/*
 * The checks every stream op starts with: a peer of this engine, a stream
 * key that fits. Writes the record identity "{stream}@{from}_{to}" (this
 * engine is `from` for a producer) into full and returns its length, or
 * completes the op and returns a negative errno.
 */
int stream_op_key(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe,
		  bool producer, char full[FULLKEY_MAX])
{
	int rc;

	if (!op->peer) {
		log_error("op %llx: a stream op needs a peer of this engine",
			  (unsigned long long)op->user_data);
		rc = -EINVAL;
	} else if (!(rc = check_stream_key(sqe))) {
		rc = producer ? keytable_compose(full, sqe->key, sqe->key_len, e->name, op->peer->name)
			      : keytable_compose(full, sqe->key, sqe->key_len, op->peer->name, e->name);
		if (rc > 0)
			return rc;
	}
	op_complete(e, op, rc, 0, NULL);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Credits due                                                         */
/* ------------------------------------------------------------------ */

static void mark_dirty(struct ferry_engine *e, struct stream *r)
{
	struct stream_table *t = e->streams;

	if (!r->used || r->err)
		return; /* over: no credit goes back any more */
	if (!r->dirty) {
		r->dirty = true;
		r->dirty_since = 0; /* stamped at the first scan that defers it */
		r->next_dirty = t->dirty;
		t->dirty = r;
	}
	if (r->want || r->ended || r->taken - r->credited >= CREDIT_BATCH)
		t->credit_urgent = true;
}

/* ------------------------------------------------------------------ */
/* Release sink: chunk buffers the application gives back               */
/* ------------------------------------------------------------------ */

static void release_hook(struct ferry_buf *w, void *ctx)
{
	struct stream_sink *s = ctx;

	atomic_fetch_add(&s->users, 1);
	if (atomic_load(&s->closed)) {
		atomic_fetch_sub(&s->users, 1);
		finish_release(s, w);
		return;
	}
	pool_release_push(&s->releases, w);
	atomic_thread_fence(memory_order_seq_cst); /* the push before the sleep check */
	reactor_wake(s->e);
	atomic_fetch_sub(&s->users, 1);
}

/* A chunk was released (or taken inside the engine): its credit is due. */
static void credit_due(struct ferry_engine *e, struct stream *r)
{
	r->taken++;
	mark_dirty(e, r);
}

/* Released chunks: free them, count the credit. */
static int take_releases(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;
	struct ferry_buf *w = atomic_exchange_explicit(&t->sink->releases, NULL,
						       memory_order_acquire);
	int n = 0;

	while (w) {
		struct ferry_buf *next = atomic_load_explicit(&w->release_next, memory_order_relaxed);
		struct stream *r = rec_by_id(t, w->offset);

		if (r && r->role == ROLE_CONSUMER) {
			r->held--;
			credit_due(e, r);
		}
		finish_release(t->sink, w);
		w = next;
		n++;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Consumer                                                            */
/* ------------------------------------------------------------------ */

/* STREAM_WHOLE: the END arrived; one buffer with everything. */
static void whole_finish(struct ferry_engine *e, struct stream *r, struct op *g)
{
	struct ferry_buf *out;
	uint32_t nchunks = r->whole_n;
	uint64_t total = r->whole_len;
	char *dst;
	int rc = pool_alloc(e->pool, total, &out);

	if (rc) {
		log_warn("engine %s: stream %.*s: no pool room for the whole %" PRIu64 " bytes",
			 e->name, (int)r->key_len, r->full, total);
		op_complete(e, g, rc, total, NULL);
		return;
	}
	dst = out->data;
	for (struct ferry_buf *b = r->whole_head; b;
	     b = atomic_load_explicit(&b->release_next, memory_order_relaxed)) {
		ferry__payload_copy(dst, b->data, b->len);
		dst += b->len;
	}
	out->len = total;
	STAT_ADD(e->stats.copies, 1);
	op_complete(e, g, (int)(nchunks > INT32_MAX ? INT32_MAX : nchunks), total, out);
}

/* The STREAM_GET's timeout is the gap between two chunks: start it again. */
static void rearm_gap(struct ferry_engine *e, struct op *g)
{
	if (g->interval) {
		if (g->heap_idx != NO_SLOT)
			timer_del(&e->timers, g);
		op_arm_deadline(e, g, g->interval);
	}
}

/*
 * Can r's STREAM_GET take a chunk with these flags now? Else r stalls.
 * Inline: on every chunk; without the keyword gcc stops inlining it once the
 * cold parts live in other files (the unit's inlining budget shrinks).
 */
static inline bool feed_ready(struct ferry_engine *e, struct stream *r, uint32_t wflags)
{
	struct op *g = r->getter;

	if ((g->flags & FERRY_SQE_STREAM_WHOLE) || (wflags & (WIRE_F_END | WIRE_F_ABORT)) ||
	    op_can_post_more(e, g))
		return true;
	stall(e->streams, r);
	return false;
}

/*
 * Hand chunk r->next (buf, len bytes, its wire flags; ours now) to r's
 * STREAM_GET, which feed_ready said can take it. Returns false when
 * pumping must stop (the op ended).
 */
static bool feed_one(struct ferry_engine *e, struct stream *r, struct ferry_buf *buf,
		     uint64_t len, uint32_t wflags)
{
	struct stream_table *t = e->streams;
	struct op *g = r->getter;
	bool whole = g->flags & FERRY_SQE_STREAM_WHOLE;
	struct ferry_buf *w;
	int n;

	buf->len = len;

	if (wflags & WIRE_F_ABORT) {
		r->ended = true;
		r->getter = NULL;
		g->stream = NULL;
		whole_free(r); /* chunks a STREAM_WHOLE kept */
		op_complete(e, g, -ECANCELED, len, buf);
		return false;
	}
	if (whole) {
		atomic_store_explicit(&buf->release_next, NULL, memory_order_relaxed);
		if (r->whole_tail)
			atomic_store_explicit(&r->whole_tail->release_next, buf, memory_order_relaxed);
		else
			r->whole_head = buf;
		r->whole_tail = buf;
		r->whole_len += len;
		r->whole_n++;
		r->next++;
		credit_due(e, r); /* held inside the engine: the producer may go on */
		if (wflags & WIRE_F_END) {
			r->ended = true;
			r->getter = NULL;
			g->stream = NULL;
			whole_finish(e, r, g);
			whole_free(r);
			return false;
		}
		rearm_gap(e, g);
		return true;
	}
	if (wflags & WIRE_F_RELCREDIT) {
		w = buf; /* its release returns the credit by itself */
	} else if (pool_wrap(e->pool, buf->data, len, rec_id(r), release_hook, t->sink, &w) == 0) {
		w->remote_cookie = (uint64_t)(uintptr_t)buf;
		atomic_fetch_add_explicit(&t->sink->refs, 1, memory_order_relaxed);
		r->held++;
	} else {
		/* No handle for the wrap: hand the chunk itself, credit it now. */
		log_limited(FERRY__LOG_WARN, "engine %s: no buffer handle to track a chunk "
			    "release; its credit returns at once", e->name);
		w = buf;
		credit_due(e, r);
	}
	n = (int)r->next++;
	STAT_ADD(e->stats.zero_copies, 1);
	if (wflags & WIRE_F_END) {
		r->ended = true;
		r->getter = NULL;
		g->stream = NULL;
		op_complete(e, g, n, len, w);
		return false;
	}
	STAT_ADD(e->stats.gets, 1);
	STAT_ADD(e->stats.bytes_got, len);
	STAT_ADD(r->peer->stats.gets, 1);
	STAT_ADD(r->peer->stats.bytes_in, len);
	op_post_more(e, g, n, len, w);
	rearm_gap(e, g);
	return true;
}

/*
 * Feed the STREAM_GET of r from the key table, in order. first: the entry
 * of chunk r->next when the caller has it already (an arrival), or NULL.
 */
static void pump_consumer(struct ferry_engine *e, struct stream *r, struct key_entry *first)
{
	const char *names = r->full + r->key_len; /* "@{from}_{me}" */
	size_t names_len = r->full_len - r->key_len;
	char key[FULLKEY_MAX];

	while (r->getter && !r->ended) {
		struct key_entry *ke = first;

		first = NULL;
		if (!ke) {
			size_t n = chunk_key(key, r->full, r->key_len, r->next, names, names_len);

			ke = keytable_find(&e->keys, key, n, keytable_hash(key, n));
		}
		if (!ke || !ke->present || !feed_ready(e, r, ke->wflags))
			break;
		{
			struct ferry_buf *buf = ke->buf;
			uint64_t len = ke->len;
			uint32_t wflags = ke->wflags;

			ke->buf = NULL;
			ke->present = false;
			STAT_ADD(e->keys.present, (uint32_t)-1);
			keytable_put(&e->keys, ke);
			if (r->parked)
				r->parked--;
			if (!feed_one(e, r, buf, len, wflags))
				break;
		}
	}
	rec_maybe_free(e, r);
}

/*
 * Is fullkey "{stream}_{r->next}@{from}_{me}", the next chunk of consumer
 * record r ("{stream}@{from}_{me}")? One pass over the key, no hashing.
 */
static bool is_next_chunk(const struct stream *r, const char *fullkey, size_t len)
{
	size_t names = r->full_len - r->key_len; /* "@{from}_{me}" */
	char digits[10];
	size_t nd = 0;
	uint32_t n = r->next;

	do {
		digits[nd++] = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	if (len != r->key_len + 1 + nd + names || memcmp(fullkey, r->full, r->key_len) != 0 ||
	    fullkey[r->key_len] != '_' ||
	    memcmp(fullkey + len - names, r->full + r->key_len, names) != 0)
		return false;
	for (size_t i = 0; i < nd; i++)
		if (fullkey[r->key_len + 1 + i] != digits[nd - 1 - i])
			return false;
	return true;
}

/*
 * An arrival that a STREAM_GET waits for exactly: hand it over without
 * passing through the key table (the common case of a stream being read).
 * Returns true when it took buf.
 */
bool stream_chunk_direct(struct ferry_engine *e, const char *fullkey, size_t len,
			 struct ferry_buf *buf, uint64_t blen, uint32_t wflags)
{
	char from[FERRY_NAME_MAX], full[FULLKEY_MAX];
	size_t key_len, stream_len;
	struct stream *r = rec_by_id(e->streams, e->streams->hint_get);
	uint32_t n;
	int fl;

	if (r && r->hashed && r->role == ROLE_CONSUMER && is_next_chunk(r, fullkey, len)) {
		n = r->next; /* the stream of the last arrival goes on */
	} else {
		if (split_fullkey(e, fullkey, len, &key_len, from) ||
		    split_chunk_key(fullkey, key_len, &stream_len, &n))
			return false; /* the key table path logs it */
		fl = keytable_compose(full, fullkey, stream_len, from, e->name);
		if (fl < 0 || !(r = stream_rec_find(e->streams, ROLE_CONSUMER, full, (size_t)fl)))
			return false;
		e->streams->hint_get = rec_id(r);
	}
	if (!r->getter || r->ended || r->err || r->stalled || n != r->next ||
	    !feed_ready(e, r, wflags))
		return false;
	r->want = wflags & WIRE_F_WANT;
	if (r->want && r->taken > r->credited)
		mark_dirty(e, r);
	if (!feed_one(e, r, buf, blen, wflags))
		rec_maybe_free(e, r);
	else if (r->parked)
		pump_consumer(e, r, NULL); /* later chunks wait in the key table */
	return true;
}

/* The consumer record of "{stream}@{from}_{me}", created if need be. */
static struct stream *consumer_get(struct ferry_engine *e, const char *full, size_t full_len,
				   size_t key_len, const char *from, struct ferry_peer *peer,
				   bool *created)
{
	struct stream *r = stream_rec_find(e->streams, ROLE_CONSUMER, full, full_len);

	*created = false;
	if (r && (r->ended || r->err)) {
		/* The key's last stream is over: this is a new one. */
		rec_unhash(e->streams, r);
		rec_maybe_free(e, r);
		r = NULL;
	}
	if (r)
		return r;
	if (!peer && !(peer = peer_by_name(e, from)))
		return NULL;
	r = rec_new(e, ROLE_CONSUMER, full, full_len, key_len, peer);
	*created = r != NULL;
	return r;
}

void stream_chunk_arrived(struct ferry_engine *e, struct key_entry *ke)
{
	char from[FERRY_NAME_MAX], full[FULLKEY_MAX];
	size_t key_len, stream_len;
	struct stream *r;
	bool created;
	uint32_t n;
	int fl;

	if (split_fullkey(e, ke->key, ke->key_len, &key_len, from) ||
	    split_chunk_key(ke->key, key_len, &stream_len, &n)) {
		log_limited(FERRY__LOG_WARN, "engine %s: chunk key \"%s\" is malformed; kept as a "
			    "plain key", e->name, ke->key);
		return;
	}
	fl = keytable_compose(full, ke->key, stream_len, from, e->name);
	if (fl < 0)
		return;
	r = consumer_get(e, full, (size_t)fl, stream_len, from, NULL, &created);
	if (!r)
		return; /* the data stays under its key */
	if (created && e->streams->acceptors)
		stream_notify_acceptors(e, r); /* a new stream starts at chunk 0, whichever came first */
	r->parked++; /* ke holds it now; a plain GET or a cleanup may take it unseen */
	r->want = ke->wflags & WIRE_F_WANT;
	if (r->want && r->taken > r->credited)
		mark_dirty(e, r); /* releases that waited for a reason to go back */
	if (r->getter)
		pump_consumer(e, r, n == r->next ? ke : NULL);
}

void stream_chunk_taken(struct ferry_engine *e, const char *fullkey, size_t len, uint32_t wflags)
{
	char from[FERRY_NAME_MAX], full[FULLKEY_MAX];
	size_t key_len, stream_len;
	struct stream *r;
	bool created;
	uint32_t n;
	int fl;

	if (split_fullkey(e, fullkey, len, &key_len, from) ||
	    split_chunk_key(fullkey, key_len, &stream_len, &n))
		return;
	fl = keytable_compose(full, fullkey, stream_len, from, e->name);
	if (fl < 0)
		return;
	r = consumer_get(e, full, (size_t)fl, stream_len, from, NULL, &created);
	if (!r)
		return;
	(void)created;
	if (r->next == n)
		r->next++; /* a STREAM_GET posted later goes on after it */
	if (wflags & (WIRE_F_END | WIRE_F_ABORT))
		r->ended = true;
	r->want = wflags & WIRE_F_WANT;
	if (!(wflags & WIRE_F_RELCREDIT))
		credit_due(e, r);
}

void stream_do_get(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	char full[FULLKEY_MAX];
	struct stream *r;
	bool created;
	int fl;

	if ((fl = stream_op_key(e, op, sqe, false, full)) < 0)
		return;
	r = consumer_get(e, full, (size_t)fl, sqe->key_len, NULL, op->peer, &created);
	if (!r) {
		op_complete(e, op, -ENOSPC, 0, NULL);
		return;
	}
	if (r->getter) {
		log_info("op %llx: stream %s already has a STREAM_GET",
			 (unsigned long long)op->user_data, full);
		op_complete(e, op, -EBUSY, 0, NULL);
		return;
	}
	op->stream = r;
	op->interval = sqe->timeout_ns;
	op->state = OP_STREAMING;
	r->getter = op;
	op_arm_deadline(e, op, sqe->timeout_ns);
	pump_consumer(e, r, NULL);
}

/* ------------------------------------------------------------------ */
/* Producer                                                            */
/* ------------------------------------------------------------------ */

static bool has_credit(const struct stream *r)
{
	return r->sent - r->lost - r->released < limit_stream(r->peer) &&
	       r->peer->stream_inflight < limit_peer(r->peer);
}

static void send_credit(struct ferry_engine *e, struct stream *r)
{
	struct op *op;
	uint64_t v = r->taken;
	int rc;

	if (!(op = op_alloc_internal(e)))
		return;
	if (pool_alloc(e->pool, sizeof(v), &op->buf)) {
		ferry__op_free(e, op);
		return;
	}
	memcpy(op->buf->data, &v, sizeof(v));
	op->len = sizeof(v);
	op->opcode = FERRY_OP_PUT;
	op->flags |= WIRE_F_CREDIT;
	op->peer = r->peer;
	op->stream = r;
	op->user_data = rec_id(r);
	op->key_len = r->key_len;
	memcpy(op->key, r->full, r->key_len);
	op->key[r->key_len] = '\0';
	r->credited = v;
	r->credit_away = true;
	op->state = OP_AWAY;
	rc = reactor_send(e, op);
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
	}
}

/* Send one STREAM_PUT as chunk r->next. */
static void send_chunk(struct ferry_engine *e, struct stream *r, struct op *op)
{
	int rc = op_fill(e, op);

	if (rc) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	op->key_len = (uint16_t)chunk_key(op->key, r->full, r->key_len, r->next, "", 0);
	op->chunk = r->next++;
	op->flags |= WIRE_F_CHUNK | OP_F_SENT |
		     ((op->flags & FERRY_SQE_STREAM_END) ? WIRE_F_END : 0);
	r->sent++;
	r->away++;
	r->peer->stream_inflight++;
	if (r->sent - r->lost - r->released >= limit_stream(r->peer) ||
	    r->peer->stream_inflight >= limit_peer(r->peer))
		op->flags |= WIRE_F_WANT; /* at the limit: credit at once, please */
	op->state = OP_AWAY;
	rc = reactor_send(e, op);
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	if (op->state == OP_AWAY && op->heap_idx == NO_SLOT)
		op_arm_deadline(e, op, op->interval);
}

static void block_on_peer(struct stream_table *t, struct stream *r)
{
	if (!r->blocked) {
		t->nblocked++;
		r->blocked = true;
		r->next_blocked = r->peer->blocked;
		r->peer->blocked = r;
	}
}

static void pump_producer(struct ferry_engine *e, struct stream *r)
{
	while (r->q_head && !r->err && has_credit(r)) {
		struct op *op = r->q_head;

		op_list_remove(&r->q_head, &r->q_tail, op);
		op->state = OP_FREE;
		send_chunk(e, r, op);
	}
	if (r->q_head && r->peer->stream_inflight >= limit_peer(r->peer))
		block_on_peer(e->streams, r);
}

/* Credit came back for peer: streams held by its limit go first. */
static void pump_blocked(struct ferry_engine *e, struct ferry_peer *p)
{
	struct stream *list = p->blocked;

	p->blocked = NULL;
	while (list) {
		struct stream *r = list;

		list = r->next_blocked;
		r->blocked = false;
		e->streams->nblocked--;
		pump_producer(e, r);
		rec_maybe_free(e, r);
	}
}

/*
 * The live producer record of the last STREAM_PUT if this one goes on the
 * same stream (same peer, same key), else NULL: the common case skips
 * composing, hashing and looking up the stream's full key.
 */
static struct stream *stream_hint_put(struct ferry_engine *e, const struct op *op,
				      const struct ferry_sqe *sqe)
{
	struct stream *r = rec_by_id(e->streams, e->streams->hint_put);

	if (!r || !r->hashed || r->role != ROLE_PRODUCER || r->peer != op->peer ||
	    !op->peer || r->key_len != sqe->key_len ||
	    memcmp(r->full, sqe->key, r->key_len) != 0)
		return NULL;
	return r;
}

void stream_do_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	char full[FULLKEY_MAX];
	struct stream *r;
	int fl;

	if (op_take_put(e, op, sqe))
		return;
	r = stream_hint_put(e, op, sqe);
	if (!r) {
		if ((fl = stream_op_key(e, op, sqe, true, full)) < 0)
			return;
		r = stream_rec_find(e->streams, ROLE_PRODUCER, full, (size_t)fl);
		if (!r && !(r = rec_new(e, ROLE_PRODUCER, full, (size_t)fl, sqe->key_len,
					op->peer))) {
			op_complete(e, op, -ENOSPC, 0, NULL);
			return;
		}
		e->streams->hint_put = rec_id(r);
	}
	if (r->err) {
		op_complete(e, op, r->err, 0, NULL);
		rec_maybe_free(e, r);
		return;
	}
	if (r->ended) {
		log_info("op %llx: chunk after the END of stream %s", (unsigned long long)op->user_data,
			 r->full);
		op_complete(e, op, -EPIPE, 0, NULL);
		return;
	}
	op->stream = r;
	op->interval = sqe->timeout_ns;
	if (sqe->flags & FERRY_SQE_STREAM_END)
		r->ended = true;
	if (!r->q_head && has_credit(r)) {
		send_chunk(e, r, op);
		return;
	}
	op->state = OP_QUEUED;
	op_list_append(&r->q_head, &r->q_tail, op);
	op_arm_deadline(e, op, sqe->timeout_ns);
	pump_producer(e, r); /* registers the peer block if that is the limit */
}

/*
 * n more chunks of r were released by the consumer (a CREDIT counts only
 * the chunks it credits; a transport reports the others one by one as
 * their blocks come back): the producer may send that many more.
 */
static void credit_back(struct ferry_engine *e, struct stream *r, uint64_t n)
{
	uint64_t out = r->sent - r->lost - r->released;

	if (n > out) /* a consumer cannot release what it never got */
		n = out;
	r->released += n;
	r->peer->stream_inflight -= (uint32_t)n;
	pump_producer(e, r);
	if (r->peer->blocked)
		pump_blocked(e, r->peer);
	rec_maybe_free(e, r);
}

int stream_credit_arrived(struct ferry_engine *e, const char *fullkey, size_t len,
			  struct ferry_buf *buf, uint64_t blen)
{
	char from[FERRY_NAME_MAX], full[FULLKEY_MAX];
	struct stream *r;
	size_t key_len;
	uint64_t v;
	int fl;

	if (blen != sizeof(v) || split_fullkey(e, fullkey, len, &key_len, from)) {
		log_limited(FERRY__LOG_WARN, "engine %s: malformed stream credit (%" PRIu64
			    " bytes) refused", e->name, blen);
		return -EINVAL; /* buf stays the transport's, as for any refused arrival */
	}
	memcpy(&v, buf->data, sizeof(v));
	pool_free(buf);
	fl = keytable_compose(full, fullkey, key_len, e->name, from);
	if (fl < 0 || !(r = stream_rec_find(e->streams, ROLE_PRODUCER, full, (size_t)fl)))
		return 0; /* a stream that is over: nothing waits for it */
	if (v > r->credit_seen) {
		credit_back(e, r, v - r->credit_seen);
		r->credit_seen = v;
	}
	return 0;
}

uint64_t stream_credit_token(const struct op *op)
{
	return (op->flags & WIRE_F_CHUNK) && op->stream ? rec_id(op->stream) : 0;
}

void stream_chunk_released(struct ferry_engine *e, uint64_t token)
{
	struct stream *r = rec_by_id(e->streams, token);

	if (r && r->role == ROLE_PRODUCER)
		credit_back(e, r, 1); /* a record over and reused: the gen differs */
}

/* ------------------------------------------------------------------ */
/* Ops ending, rounds, peers lost                                      */
/* ------------------------------------------------------------------ */

int stream_op_ending(struct ferry_engine *e, struct op *op, int res)
{
	struct stream_table *t = e->streams;
	struct stream *r = op->stream;

	if (op->flags & OP_F_INTERNAL) {
		/* A credit done: send the next one if more were released. */
		if (r && rec_id(r) == op->user_data) {
			r->credit_away = false;
			if (res == 0) {
				r->credit_acked = r->credited;
			} else {
				r->credited = r->credit_acked; /* it did not arrive: send it again */
				if (res == -ECONNRESET || res == -EHOSTUNREACH || res == -EPIPE)
					r->err = res; /* the producer is gone: nobody to credit */
			}
			if (r->taken > r->credited && !r->err)
				mark_dirty(e, r); /* releases since: their credit is due */
			rec_maybe_free(e, r);
		}
		op->stream = NULL;
		return res;
	}
	switch (op->opcode) {
	case FERRY_OP_STREAM_PUT:
		if (!r)
			return res;
		op->stream = NULL;
		if (!(op->flags & OP_F_SENT) && (op->flags & FERRY_SQE_STREAM_END))
			r->ended = false; /* the END never left: the stream may go on */
		if (op->state == OP_QUEUED) {
			op_list_remove(&r->q_head, &r->q_tail, op);
			if (res < 0 && !r->err && !r->aborting)
				stream_producer_fail(e, r, res); /* it waited for credit: no index taken */
		} else if (!(op->flags & OP_F_SENT)) {
			if (res < 0 && !r->err)
				stream_producer_fail(e, r, res); /* it failed before it left: no index */
		} else if (op->flags & OP_F_SENT) {
			r->away--;
			if (res < 0) {
				/*
				 * It never arrived (the transport said so), or we stop
				 * waiting for it (deadline, cancel): no credit will come
				 * for it either way. Should it arrive after all, its
				 * credit is clamped away (stream_credit_arrived).
				 */
				r->lost++;
				r->peer->stream_inflight--;
				t->peer_credit_freed = true;
				if (res == -ECONNRESET || res == -EHOSTUNREACH || res == -EPIPE) {
					stream_producer_fail(e, r, res);
				} else {
					stall(t, r); /* its queue may go now: next round */
				}
			} else {
				res = (int)(op->chunk > INT32_MAX ? INT32_MAX : op->chunk);
			}
		}
		rec_maybe_free(e, r);
		return res;
	case FERRY_OP_STREAM_GET:
		if (r && r->getter == op) {
			r->getter = NULL;
			whole_free(r);
			rec_maybe_free(e, r);
		}
		op->stream = NULL;
		return res;
	case FERRY_OP_STREAM_ACCEPT:
		if (op->state == OP_STREAMING) {
			if (op->prev)
				op->prev->next = op->next;
			else
				t->acceptors = op->next;
			if (op->next)
				op->next->prev = op->prev;
			op->next = op->prev = NULL;
		}
		return res;
	default:
		return res;
	}
}

int stream_round(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;
	struct stream *list;
	int n = 0;

	if (t->peer_credit_freed) {
		/* Per-peer credit came back without a credit message: re-pump. */
		t->peer_credit_freed = false;
		if (t->nblocked) {
			/*
			 * Without e->lock: chunks sent here may complete at once, and
			 * a CB_REACTOR callback (or a log sink) may take that lock.
			 */
			for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
				if (p->blocked && p->stream_inflight < limit_peer(p))
					pump_blocked(e, p);
		}
	}

	if (atomic_load_explicit(&t->sink->releases, memory_order_relaxed))
		n += take_releases(e);
	if (t->dirty && (t->credit_urgent || ++t->rounds_since_scan >= CREDIT_SCAN)) {
		list = t->dirty;
		t->dirty = NULL;
		t->credit_urgent = false;
		t->rounds_since_scan = 0;
		while (list) {
			struct stream *r = list;
			uint64_t since = r->dirty_since;

			list = r->next_dirty;
			r->dirty = false;
			if (r->err || r->credit_away || r->taken <= r->credited) {
				/* nothing to send (one credit at a time, cumulative) */
			} else if (r->want || r->ended || r->taken - r->credited >= CREDIT_BATCH ||
				   (since && reactor_now(e) - since >= CREDIT_DELAY_NS)) {
				send_credit(e, r);
				if (r->used && !r->credit_away)
					mark_dirty(e, r); /* no op or buffer free: next round */
				n++;
			} else {
				mark_dirty(e, r); /* not yet: batch it */
				r->dirty_since = since ? since : reactor_now(e);
			}
			rec_maybe_free(e, r);
		}
	}
	if (t->stalled) {
		list = t->stalled;
		t->stalled = NULL;
		while (list) {
			struct stream *r = list;

			list = r->next_stalled;
			r->stalled = false;
			if (r->role == ROLE_PRODUCER) {
				if (!r->err)
					pump_producer(e, r);
				rec_maybe_free(e, r);
				continue;
			}
			if (r->announce)
				stream_notify_acceptors(e, r);
			if (r->getter)
				pump_consumer(e, r, NULL);
			else
				rec_maybe_free(e, r);
		}
	}
	return n;
}

bool stream_has_work(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;

	/* Credits that may wait (batched) are not work: stream_next_due says when. */
	return atomic_load_explicit(&t->sink->releases, memory_order_relaxed) ||
	       t->peer_credit_freed || ((t->credit_urgent || t->stalled) && e->free_ops);
}

uint64_t stream_next_due(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;
	uint64_t due = 0;

	for (struct stream *r = t->dirty; r; r = r->next_dirty) {
		uint64_t d = (r->dirty_since ? r->dirty_since : ferry__now_ns()) + CREDIT_DELAY_NS;

		if (!due || d < due)
			due = d;
	}
	return due;
}

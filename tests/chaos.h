/*
 * tests/chaos.h - the workload of the chaos tests (test_chaos_shm.c: a
 * victim process killed with SIGKILL and restarted; test_chaos_tcp.c: the
 * link between two network namespaces cut and restored).
 *
 * Owns: the region the test's processes share (MAP_SHARED, made before
 * the forks: it survives a SIGKILL), the worker that each process runs
 * (PUT/GET and streams to and from every other worker, every byte
 * checked), and what a worker checks of itself at the end.
 *
 * Data you can check from its key alone. A PUT's key is "{tag}:p{seq}",
 * a stream's "{tag}:s{seq}" (tag: the sender's name, "v{incarnation}" for
 * the victim). The length, the bytes (a header with the key's hash or the
 * chunk's index, then position-dependent words), a stream's number of
 * chunks and each chunk's length are functions of the key (and index): a
 * payload under the wrong key, a chunk under the wrong index, a renumbered
 * or truncated chunk, a stream that ends early are all caught by the
 * receiver.
 *
 * The ledger. A receiver must know which keys to GET: for each ordered
 * pair of workers the sender writes, before it submits a PUT, an entry
 * {seq, incarnation, PENDING} into a ring in the shared region, and when
 * the PUT completes, its outcome (OK or FAILED). The receiver GETs each
 * announced key with a deadline well past the PUT's: a PUT that completed
 * with 0 means the receiver held the key, so its GET must not time out.
 * Streams need no ledger: the consumer learns of them with STREAM_ACCEPT.
 *
 * What counts as wrong (each is counted in the shared stats as "bad" and
 * printed at once, with the worker and the key): wrong data, length,
 * index or order; a chunk that arrives after its stream's END, a stream
 * announced twice; an error on a channel that has no reason to fail (two
 * survivors over shm: nothing may fail), or an error outside the set that
 * a dead peer or a cut link explains (ECONNRESET, EHOSTUNREACH, ETIMEDOUT,
 * and ECANCELED where an abort or a cleanup explains it); a STREAM_PUT
 * submitted after its stream failed with a sticky error (ECONNRESET,
 * EHOSTUNREACH, EPIPE) that succeeds (the docs say it fails at once); a
 * STREAM_PUT whose res is not the index the application sent it as; an
 * op still pending past its deadline plus a slack, or a completion for an
 * op that is not pending (twice, or never submitted); leftovers at the end
 * (ops, keys, stream records, pool blocks) and, for a survivor, file
 * descriptors or RSS that grew between the first half of the run and the
 * end.
 *
 * Phases (sh->phase, set by the test's parent): RUN, DRAIN (no new PUTs or
 * streams; streams under way finish; every pending op ends; a worker says
 * it is drained when nothing of its own or announced to it is left),
 * FINISH_VICTIM (the victim's last incarnation leaves cleanly), FINISH
 * (the survivors clean up, check and leave).
 */
#ifndef FERRY_TEST_CHAOS_H
#define FERRY_TEST_CHAOS_H

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#if defined(__SANITIZE_ADDRESS__)
size_t __sanitizer_get_current_allocated_bytes(void);
size_t __sanitizer_get_heap_size(void);
size_t __sanitizer_get_free_bytes(void);
const char *__asan_default_options(void);

/*
 * ASan keeps freed memory in a quarantine (256 MB by default), resident: a
 * process that frees and allocates as it goes (a tcp connection's receive
 * stage, every reconnect) grows in RSS by what it freed, up to that size.
 * The RSS check allows for this much (CH_ASAN_QUARANTINE); ASAN_OPTIONS
 * from the environment still wins.
 */
#define CH_ASAN_QUARANTINE (16ull << 20)
const char *__asan_default_options(void)
{
	return "quarantine_size_mb=16";
}
#else
#define CH_ASAN_QUARANTINE 0
#endif

#include "tcp_helpers.h"

#define CH_MAXW 3           /* workers */
#define CH_RING (1u << 15)  /* ledger entries per ordered pair */
#define CH_OPS 256          /* op records per worker */
#define CH_BUF (64u << 10)  /* each op record's own memory (iovecs) */
#define CH_PUT_WIN 8        /* PUTs pending per pair */
#define CH_GET_WIN 16       /* GETs pending per pair */
#define CH_ANNOUNCED_MAX 32 /* PUTs announced and not yet asked for, per pair */
#define CH_STREAMS 3        /* streams under way per pair */
#define CH_CHUNK_WIN 4      /* STREAM_PUTs pending per stream */
#define CH_CREDITS 2        /* the engine's per-stream credits: chunks wait for them */
#define CH_MAX_CHUNKS 24
#define CH_CSTREAMS 32 /* STREAM_GETs at once */
#define CH_BACKLOG 64  /* accepted streams waiting for a STREAM_GET slot */
#define CH_KEY 48
#define CH_SEEN 8 /* stream-key trackers (producer incarnations) */
#define CH_SEEN_BITS 4096
#define CH_INCS 64      /* victim incarnations tracked for their cleanup */
#define CH_PRINT_MAX 40 /* lines a worker prints about what went wrong */

enum { CH_RUN = 0, CH_DRAIN = 1, CH_FINISH_VICTIM = 2, CH_FINISH = 3 };
enum { CH_PENDING = 1, CH_OK = 2, CH_FAILED = 3 };
enum {
	CH_K_FREE = 0,
	CH_K_PUT,
	CH_K_GET,
	CH_K_SPUT,
	CH_K_SGET,
	CH_K_ACCEPT,
	CH_K_ABORT,
	CH_K_CLEANUP,
	CH_K_CANCEL,
};
/* What a CLEANUP was for. */
enum { CH_CL_PSTREAM = 1, CH_CL_CSTREAM, CH_CL_INC, CH_CL_FINAL };

/* Errors by kind, for the report. */
enum { CH_E_RESET, CH_E_UNREACH, CH_E_TIMEDOUT, CH_E_CANCELED, CH_E_PIPE, CH_E_OTHER, CH_E_N };

struct ch_chan {
	_Atomic uint64_t head;   /* entries written */
	_Atomic uint64_t tail;   /* entries the receiver took */
	_Atomic uint64_t closed; /* 1 + head once the sender stopped and all its PUTs ended */
	_Atomic uint64_t slot[CH_RING];
};

struct ch_stats {
	_Atomic uint64_t puts_ok, puts_failed, gets_ok, gets_failed;
	_Atomic uint64_t chunks_sent, chunks_failed, probes_failed, chunks_got;
	_Atomic uint64_t streams_sent, streams_failed_prod, streams_got, streams_failed_cons;
	_Atomic uint64_t whole_got, aborts, bytes_checked, leftovers, gets_after_reset, reannounced,
		busy_again;
	_Atomic uint64_t errs[CH_E_N];
	_Atomic uint64_t bad, late, printed;
	_Atomic uint64_t fds_base, fds_end, rss_base, rss_end, samples;
	_Atomic int64_t max_late_ns; /* worst completion past its deadline (not counted bad) */
};

struct ch_shared {
	_Atomic int phase;
	_Atomic int go; /* every first incarnation is up: work may start */
	int nworkers;
	int victim; /* the worker killed and restarted, -1: none */
	bool tcp;
	int64_t t0, run_ns, slack_ns, scale;
	uint64_t seed;
	_Atomic int ready[CH_MAXW], drained[CH_MAXW];
	_Atomic int inc[CH_MAXW]; /* the incarnation started last */
	_Atomic int addr_set[CH_MAXW];
	char addr[CH_MAXW][NETADDR_MAX];
	char name[CH_MAXW][16];
	char netns[CH_MAXW][32];  /* tcp: the namespace a worker enters */
	char listen[CH_MAXW][64]; /* tcp: where it listens */
	struct ch_stats st[CH_MAXW];
	struct ch_chan chan[CH_MAXW][CH_MAXW]; /* [from][to] */
};

static inline struct ch_shared *ch_shared_new(void)
{
	void *p = mmap(NULL, sizeof(struct ch_shared), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	memset(p, 0, sizeof(struct ch_shared));
	return p;
}

/* ------------------------------------------------------------------ */
/* Data derived from keys                                              */
/* ------------------------------------------------------------------ */

static inline uint64_t ch_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static inline uint64_t ch_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return ch_mix(h);
}

static inline uint64_t ch_rand(uint64_t *s)
{
	*s = ch_mix(*s);
	return *s;
}

/* [lo, hi] */
static inline int64_t ch_between(uint64_t *s, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(ch_rand(s) % (uint64_t)(hi - lo + 1));
}

/* A PUT's length: inline (<= 256), copied, and zero-copy sizes. */
static inline uint64_t ch_put_len(uint64_t h)
{
	unsigned r = (unsigned)(h % 100);
	uint64_t x = h >> 8;

	if (r < 40)
		return 16 + x % 241;
	if (r < 75)
		return 257 + x % (8192 - 256);
	if (r < 96)
		return 8193 + x % (CH_BUF - 8192);
	return CH_BUF + 1 + x % (512u << 10);
}

static inline uint32_t ch_nchunks(uint64_t h)
{
	return 1 + (uint32_t)((h >> 16) % CH_MAX_CHUNKS);
}

static inline uint64_t ch_chunk_seed(uint64_t h, uint32_t idx)
{
	return ch_mix(h ^ ((uint64_t)idx * 0xd1b54a32d192ed03ull));
}

static inline uint64_t ch_chunk_len(uint64_t h, uint32_t idx)
{
	uint64_t x = ch_chunk_seed(h, idx);

	return x % 100 < 30 ? 16 + (x >> 8) % 241 : 257 + (x >> 8) % (16384 - 256);
}

/* The first 8 bytes of a chunk: its index, recognisably. */
static inline uint64_t ch_chunk_tag(uint32_t idx)
{
	return 0xc4a05c4a00000000ull | idx;
}

/* len bytes: an 8-byte header, then words that depend on seed and position. */
static inline void ch_fill(uint8_t *p, uint64_t len, uint64_t header, uint64_t seed)
{
	uint64_t i;

	memcpy(p, &header, 8);
	for (i = 8; i + 8 <= len; i += 8) {
		uint64_t w = ch_mix(seed + i);

		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)(seed >> (i % 8 * 8)) ^ (uint8_t)i;
}

/* The offset of the first wrong byte, or -1 when p holds ch_fill's bytes. */
static inline int64_t ch_check(const uint8_t *p, uint64_t len, uint64_t header, uint64_t seed)
{
	uint64_t i, v;

	memcpy(&v, p, 8);
	if (v != header)
		return 0;
	for (i = 8; i + 8 <= len; i += 8) {
		uint64_t w = ch_mix(seed + i);

		memcpy(&v, p + i, 8);
		if (v != w)
			return (int64_t)i;
	}
	for (; i < len; i++)
		if (p[i] != ((uint8_t)(seed >> (i % 8 * 8)) ^ (uint8_t)i))
			return (int64_t)i;
	return -1;
}

static inline uint64_t ch_slot(uint64_t seq, unsigned inc, unsigned state)
{
	return (seq << 32) | ((uint64_t)(inc & 0xffffff) << 8) | state;
}

#define CH_SLOT_SEQ(v) ((v) >> 32)
#define CH_SLOT_INC(v) ((unsigned)(((v) >> 8) & 0xffffff))
#define CH_SLOT_STATE(v) ((unsigned)((v)&0xff))

/* ------------------------------------------------------------------ */
/* The worker                                                          */
/* ------------------------------------------------------------------ */

struct ch_op {
	uint8_t kind;   /* CH_K_* */
	uint8_t cl;     /* CLEANUP: CH_CL_* */
	uint8_t peer;   /* the other worker */
	bool probe;     /* STREAM_PUT submitted after its stream failed for good */
	bool reported;  /* its lateness was reported */
	bool cancelled; /* GET: we cancelled it (its PUT failed) */
	bool whole;     /* STREAM_GET with FERRY_SQE_STREAM_WHOLE */
	bool iov_mode;  /* GET into the record's memory */
	uint32_t gen;
	unsigned inc;                 /* GET, STREAM_GET: the sender's incarnation */
	uint64_t seq;                 /* PUT/GET: the ledger entry; STREAM_PUT: the chunk index */
	int stream;                   /* STREAM_PUT, ABORT, CLEANUP: the stream slot */
	int64_t t_sub, t_last, limit; /* submitted, last CQE, its timeout (0: none) */
	uint64_t len;
	char key[CH_KEY];
	struct iovec iov;
	uint8_t *mem;
};

/* A stream this worker produces. */
struct ch_pstream {
	bool used, failed, aborted, cleaning;
	int sticky; /* the sticky error that failed it (0: none) */
	int peer;
	char key[CH_KEY];
	uint64_t h;
	uint32_t n, next, pending, ok;
	int64_t pace_ns, next_at;
};

/* A stream this worker reads. */
struct ch_cstream {
	bool used, whole;
	bool again; /* tcp: its key was announced before (a STREAM_GET may read it already) */
	int peer;
	unsigned inc;
	char key[CH_KEY];
	uint64_t h;
	uint32_t n, next;
};

/* Which stream keys of one producer incarnation were announced already. */
struct ch_seen {
	bool used;
	int peer;
	unsigned inc;
	uint64_t lo;
	uint64_t bits[CH_SEEN_BITS / 64];
	int64_t last_use;
};

struct ch_w {
	struct ch_shared *sh;
	struct ch_stats *st;
	int me;
	unsigned inc;
	char tag[16];
	struct ferry_engine *e;
	struct ferry_sq *sq;
	struct ferry_cq *cq;
	struct ferry_peer *peer[CH_MAXW];
	uint64_t rng;
	struct ch_op ops[CH_OPS];
	int free_ops[CH_OPS];
	int nfree;
	unsigned puts_out[CH_MAXW], gets_out[CH_MAXW];
	uint64_t failed_from[CH_MAXW]; /* GETs and STREAM_GETs from each peer that failed */
	struct ch_pstream ps[CH_MAXW][CH_STREAMS];
	uint64_t stream_seq[CH_MAXW];
	struct ch_cstream cs[CH_CSTREAMS];
	char backlog[CH_BACKLOG][CH_KEY];
	bool backlog_again[CH_BACKLOG];
	int nbacklog;
	struct ch_seen seen[CH_SEEN];
	unsigned
		out_by_inc[CH_INCS]; /* GETs and STREAM_GETs pending from each victim incarnation */
	unsigned cleaned;            /* victim incarnations below this were cleaned up */
	int accept_op;
	int64_t busy_at, next_scan, next_sample, final_cleanups;
	int pending_sqes;
	uint64_t fds_base, rss_base;
	uint64_t fds_last; /* the fd count at the sample before (ch_sample) */
	bool sampled_end;
	int64_t end_sampled_at;
};

static inline bool ch_survivor(const struct ch_w *w)
{
	return w->sh->victim != w->me;
}

/* A pair where failures have a cause: a victim on either end, or tcp (cut link). */
static inline bool ch_lossy(const struct ch_w *w, int peer)
{
	return w->sh->tcp || w->sh->victim == w->me || w->sh->victim == peer;
}

static inline void ch_tag_of(const struct ch_w *w, int worker, unsigned inc, char *out, size_t n)
{
	if (worker == w->sh->victim)
		snprintf(out, n, "v%u", inc);
	else
		snprintf(out, n, "%s", w->sh->name[worker]);
}

/* The worker and incarnation a key's tag names; -1 when none. */
static inline int ch_tag_parse(const struct ch_w *w, const char *key, unsigned *inc)
{
	const char *colon = strchr(key, ':');
	size_t tl = colon ? (size_t)(colon - key) : 0;

	*inc = 0;
	if (!colon)
		return -1;
	for (int i = 0; i < w->sh->nworkers; i++) {
		if (i == w->sh->victim) {
			char *end;
			unsigned long v;

			if (key[0] != 'v' || tl < 2)
				continue;
			v = strtoul(key + 1, &end, 10);
			if (end != colon)
				continue;
			*inc = (unsigned)v;
			return i;
		}
		if (strlen(w->sh->name[i]) == tl && !memcmp(key, w->sh->name[i], tl))
			return i;
	}
	return -1;
}

static inline int ch_errkind(int res)
{
	switch (res) {
	case -ECONNRESET:
		return CH_E_RESET;
	case -EHOSTUNREACH:
		return CH_E_UNREACH;
	case -ETIMEDOUT:
		return CH_E_TIMEDOUT;
	case -ECANCELED:
		return CH_E_CANCELED;
	case -EPIPE:
		return CH_E_PIPE;
	default:
		return CH_E_OTHER;
	}
}

static inline bool ch_sticky(int res)
{
	return res == -ECONNRESET || res == -EHOSTUNREACH || res == -EPIPE;
}

static void ch_bad(struct ch_w *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void ch_bad(struct ch_w *w, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	atomic_fetch_add(&w->st->bad, 1);
	if (atomic_fetch_add(&w->st->printed, 1) >= CH_PRINT_MAX && !getenv("FERRY_CHAOS_VERBOSE"))
		return;
	n = snprintf(line, sizeof(line), "chaos: %s (%s, pid %d) BAD: ", w->sh->name[w->me], w->tag,
		     getpid());
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line);
}

static inline void ch_count_err(struct ch_w *w, int res)
{
	atomic_fetch_add(&w->st->errs[ch_errkind(res)], 1);
}

/* ------------------------------------------------------------------ */
/* Op records and submission                                           */
/* ------------------------------------------------------------------ */

static inline struct ch_op *ch_op_new(struct ch_w *w, int kind, int peer, int64_t limit)
{
	struct ch_op *o;

	if (!w->nfree)
		return NULL;
	o = &w->ops[w->free_ops[--w->nfree]];
	o->kind = (uint8_t)kind;
	o->cl = 0;
	o->peer = (uint8_t)peer;
	o->probe = o->reported = o->whole = o->iov_mode = o->cancelled = false;
	o->inc = 0;
	o->seq = 0;
	o->stream = -1;
	o->t_sub = o->t_last = t_now();
	o->limit = limit;
	o->len = 0;
	o->key[0] = '\0';
	return o;
}

static inline uint64_t ch_ud(const struct ch_w *w, const struct ch_op *o)
{
	return ((uint64_t)o->gen << 32) | (uint64_t)(o - w->ops);
}

static inline void ch_op_free(struct ch_w *w, struct ch_op *o)
{
	o->kind = CH_K_FREE;
	o->gen++;
	w->free_ops[w->nfree++] = (int)(o - w->ops);
}

static inline void ch_flush(struct ch_w *w)
{
	if (w->pending_sqes) {
		ferry_sq_submit(w->sq);
		w->pending_sqes = 0;
	}
}

/* An SQE; a full ring is submitted and waited on (bounded). */
static inline struct ferry_sqe *ch_sqe(struct ch_w *w)
{
	struct ferry_sqe *sqe;
	int64_t end = t_now() + 10 * SEC * w->sh->scale;

	while (!(sqe = ferry_sq_get_sqe(w->sq))) {
		ch_flush(w);
		if (t_now() > end) {
			ch_bad(w, "no SQE for 10 s: the submission ring does not drain");
			abort();
		}
		usleep(100);
	}
	w->pending_sqes++;
	return sqe;
}

static inline void ch_set_timeout(struct ferry_sqe *sqe, int64_t limit)
{
	if (limit)
		ferry_sqe_set_timeout(sqe, (uint64_t)limit);
}

/* Deadlines (times sh->scale). */
#define CH_D_PUT (2 * SEC)
#define CH_D_CHUNK (3 * SEC)
#define CH_D_GAP (5 * SEC)
#define CH_D_LOCAL (2 * SEC) /* what a local op (CLEANUP, CANCEL) may take */

static inline int64_t ch_d_get(const struct ch_w *w)
{
	/* Past the PUT's deadline and its slack, twice: a PUT done in time was held. */
	return CH_D_PUT * w->sh->scale + 2 * w->sh->slack_ns + SEC;
}

/* ------------------------------------------------------------------ */
/* PUT and GET                                                         */
/* ------------------------------------------------------------------ */

static void ch_put_one(struct ch_w *w, int p)
{
	struct ch_chan *ch = &w->sh->chan[w->me][p];
	uint64_t seq = atomic_load(&ch->head), h, len;
	struct ferry_buf *b = NULL;
	struct ferry_sqe *sqe;
	char key[CH_KEY];
	struct ch_op *o;

	snprintf(key, sizeof(key), "%s:p%" PRIu64, w->tag, seq);
	h = ch_hash(key);
	len = ch_put_len(h);
	/* Our pool full of PUTs still away: try again later. */
	if ((len > CH_BUF || (h >> 40) % 3 == 0) && ferry_buf_alloc(w->e, len, &b))
		return;
	o = ch_op_new(w, CH_K_PUT, p, CH_D_PUT * w->sh->scale);
	o->seq = seq;
	o->len = len;
	snprintf(o->key, sizeof(o->key), "%s", key);
	/* Announced before it is submitted: the receiver may GET it before it arrives. */
	atomic_store(&ch->slot[seq % CH_RING], ch_slot(seq, w->inc, CH_PENDING));
	atomic_store(&ch->head, seq + 1);
	sqe = ch_sqe(w);
	if (b) {
		ch_fill(ferry_buf_data(b), len, h, h);
		ferry_buf_set_len(b, len);
		ferry_prep_put_buf(sqe, w->peer[p], o->key, b, ch_ud(w, o));
	} else {
		ch_fill(o->mem, len, h, h);
		o->iov.iov_base = o->mem;
		o->iov.iov_len = len;
		ferry_prep_put(sqe, w->peer[p], o->key, &o->iov, 1, ch_ud(w, o));
	}
	ch_set_timeout(sqe, o->limit);
	w->puts_out[p]++;
}

static void ch_put_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	struct ch_chan *ch = &w->sh->chan[w->me][o->peer];
	unsigned state = CH_OK;

	w->puts_out[o->peer]--;
	if (c->res == 0 && c->len != o->len) {
		ch_bad(w, "PUT %s to %s: len %llu, sent %llu", o->key, w->sh->name[o->peer],
		       (unsigned long long)c->len, (unsigned long long)o->len);
	} else if (c->res == 0) {
		atomic_fetch_add(&w->st->puts_ok, 1);
	} else {
		state = CH_FAILED;
		atomic_fetch_add(&w->st->puts_failed, 1);
		ch_count_err(w, c->res);
		if (!ch_lossy(w, o->peer) ||
		    (c->res != -ECONNRESET && c->res != -EHOSTUNREACH && c->res != -ETIMEDOUT))
			ch_bad(w, "PUT %s to %s: %s", o->key, w->sh->name[o->peer],
			       ferry_err_name(c->res));
	}
	atomic_store(&ch->slot[o->seq % CH_RING], ch_slot(o->seq, w->inc, state));
}

/* GET the keys announced to us by worker p. */
static void ch_get_announced(struct ch_w *w, int p)
{
	struct ch_chan *ch = &w->sh->chan[p][w->me];
	uint64_t head = atomic_load(&ch->head), tail = atomic_load(&ch->tail);

	while (tail < head && w->gets_out[p] < CH_GET_WIN && w->nfree) {
		uint64_t v = atomic_load(&ch->slot[tail % CH_RING]), h;
		struct ch_op *o;
		struct ferry_sqe *sqe;
		char tag[16];

		if (CH_SLOT_SEQ(v) != tail) {
			ch_bad(w, "ledger from %s: entry %" PRIu64 " overwritten", w->sh->name[p],
			       tail);
			atomic_store(&ch->tail, ++tail);
			continue;
		}
		o = ch_op_new(w, CH_K_GET, p, ch_d_get(w));
		o->seq = tail;
		o->inc = CH_SLOT_INC(v);
		ch_tag_of(w, p, o->inc, tag, sizeof(tag));
		snprintf(o->key, sizeof(o->key), "%s:p%" PRIu64, tag, tail);
		h = ch_hash(o->key);
		o->len = ch_put_len(h);
		o->iov_mode = o->len <= CH_BUF && (h >> 44) & 1;
		sqe = ch_sqe(w);
		if (o->iov_mode) {
			o->iov.iov_base = o->mem;
			o->iov.iov_len = CH_BUF;
			ferry_prep_get(sqe, w->peer[p], o->key, &o->iov, 1, ch_ud(w, o));
		} else {
			ferry_prep_get(sqe, w->peer[p], o->key, NULL, 0, ch_ud(w, o));
		}
		ch_set_timeout(sqe, o->limit);
		w->gets_out[p]++;
		if (p == w->sh->victim)
			w->out_by_inc[o->inc % CH_INCS]++;
		atomic_store(&ch->tail, ++tail);
	}
}

static void ch_get_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	struct ch_chan *ch = &w->sh->chan[o->peer][w->me];
	uint64_t v = atomic_load(&ch->slot[o->seq % CH_RING]);
	unsigned state = CH_SLOT_SEQ(v) == o->seq ? CH_SLOT_STATE(v) : 0;

	w->gets_out[o->peer]--;
	if (o->peer == w->sh->victim)
		w->out_by_inc[o->inc % CH_INCS]--;
	if (c->res == 0) {
		const uint8_t *data = o->iov_mode ? o->mem : ferry_buf_data(c->buf);
		uint64_t h = ch_hash(o->key);
		int64_t at;

		if (o->iov_mode == !!(c->flags & FERRY_CQE_F_BUF))
			ch_bad(w, "GET %s: FERRY_CQE_F_BUF is %s for a GET %s an iovec", o->key,
			       o->iov_mode ? "set" : "clear", o->iov_mode ? "into" : "without");
		if (c->len != o->len || (!o->iov_mode && ferry_buf_len(c->buf) != o->len))
			ch_bad(w, "GET %s from %s: %llu bytes, its key says %llu", o->key,
			       w->sh->name[o->peer], (unsigned long long)c->len,
			       (unsigned long long)o->len);
		else if (data && (at = ch_check(data, o->len, h, h)) >= 0)
			ch_bad(w, "GET %s from %s: wrong data at byte %lld of %llu", o->key,
			       w->sh->name[o->peer], (long long)at, (unsigned long long)o->len);
		else if (!data)
			ch_bad(w, "GET %s: no data", o->key);
		else {
			atomic_fetch_add(&w->st->gets_ok, 1);
			atomic_fetch_add(&w->st->bytes_checked, o->len);
		}
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		return;
	}
	atomic_fetch_add(&w->st->gets_failed, 1);
	w->failed_from[o->peer]++;
	ch_count_err(w, c->res);
	if (c->flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c->buf);
	if (!ch_lossy(w, o->peer) || (c->res != -ETIMEDOUT && c->res != -ECONNRESET &&
				      !(c->res == -ECANCELED && o->cancelled))) {
		ch_bad(w, "GET %s from %s: %s", o->key, w->sh->name[o->peer],
		       ferry_err_name(c->res));
		return;
	}
	if (state == CH_OK) {
		/*
		 * The PUT completed with 0: we held the key before its deadline,
		 * which is well before ours. Over tcp a GET may still end with
		 * -ECONNRESET when this side declared the peer dead while the
		 * PUT went on a new connection (the docs say so): counted.
		 */
		if (w->sh->tcp && c->res == -ECONNRESET)
			atomic_fetch_add(&w->st->gets_after_reset, 1);
		else
			ch_bad(w, "GET %s from %s: %s, but its PUT completed with 0", o->key,
			       w->sh->name[o->peer], ferry_err_name(c->res));
	}
}

/* ------------------------------------------------------------------ */
/* Streams: producer                                                   */
/* ------------------------------------------------------------------ */

static void ch_stream_start(struct ch_w *w, int p, struct ch_pstream *s)
{
	memset(s, 0, sizeof(*s));
	s->used = true;
	s->peer = p;
	snprintf(s->key, sizeof(s->key), "%s:s%" PRIu64, w->tag, w->stream_seq[p]++);
	s->h = ch_hash(s->key);
	s->n = ch_nchunks(s->h);
	/* A quarter of the streams come at the pace of a slow producer. */
	s->pace_ns = (s->h >> 24) % 4 == 0 ? (int64_t)(20 + (s->h >> 28) % 100) * MS : 0;
	s->next_at = 0;
}

static void ch_chunk_one(struct ch_w *w, struct ch_pstream *s, int slot)
{
	uint32_t idx = s->next;
	uint64_t len = ch_chunk_len(s->h, idx), seed = ch_chunk_seed(s->h, idx);
	struct ch_op *o = ch_op_new(w, CH_K_SPUT, s->peer, CH_D_CHUNK * w->sh->scale);
	struct ferry_sqe *sqe;

	if (!o)
		return;
	o->seq = idx;
	o->stream = slot;
	o->len = len;
	o->probe = s->sticky != 0;
	snprintf(o->key, sizeof(o->key), "%s", s->key);
	sqe = ch_sqe(w);
	if ((seed >> 40) & 1) {
		struct ferry_buf *b;

		if (ferry_buf_alloc(w->e, len, &b) == 0) {
			ch_fill(ferry_buf_data(b), len, ch_chunk_tag(idx), seed);
			ferry_buf_set_len(b, len);
			ferry_prep_stream_put_buf(sqe, w->peer[s->peer], s->key, b, ch_ud(w, o));
			goto flags;
		}
	}
	ch_fill(o->mem, len, ch_chunk_tag(idx), seed);
	o->iov.iov_base = o->mem;
	o->iov.iov_len = len;
	ferry_prep_stream_put(sqe, w->peer[s->peer], s->key, &o->iov, 1, ch_ud(w, o));
flags:
	if (idx == s->n - 1)
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_END);
	ch_set_timeout(sqe, o->limit);
	s->next++;
	s->pending++;
	if (s->pace_ns)
		s->next_at = t_now() + s->pace_ns;
}

static void ch_stream_abort(struct ch_w *w, struct ch_pstream *s, int slot)
{
	struct ch_op *o = ch_op_new(w, CH_K_ABORT, s->peer, CH_D_PUT * w->sh->scale);
	struct ferry_sqe *sqe;

	if (!o)
		return;
	o->stream = slot;
	snprintf(o->key, sizeof(o->key), "%s", s->key);
	sqe = ch_sqe(w);
	ferry_prep_stream_abort(sqe, w->peer[s->peer], s->key, "chaos: a chunk failed",
				ch_ud(w, o));
	ch_set_timeout(sqe, o->limit);
	s->aborted = true;
	s->pending++;
	atomic_fetch_add(&w->st->aborts, 1);
}

/* CLEANUP of request req from peer (-1: from anyone, this worker's own). */
static void ch_cleanup(struct ch_w *w, int peer, const char *req, int cl, int slot)
{
	struct ch_op *o =
		ch_op_new(w, CH_K_CLEANUP, peer >= 0 ? peer : w->me, CH_D_LOCAL * w->sh->scale);
	struct ferry_sqe *sqe;

	if (!o) {
		ch_bad(w, "no op record for the cleanup of %s", req);
		return;
	}
	o->cl = (uint8_t)cl;
	o->stream = slot;
	snprintf(o->key, sizeof(o->key), "%s", req);
	sqe = ch_sqe(w);
	ferry_prep_cleanup(sqe, peer >= 0 ? w->peer[peer] : NULL, req, ch_ud(w, o));
}

/* Move one producer stream on: its next chunks, its abort and cleanup, its end. */
static void ch_stream_step(struct ch_w *w, int p, int i)
{
	struct ch_pstream *s = &w->ps[p][i];
	int slot = p * CH_STREAMS + i;
	int64_t now = t_now();

	while (s->next < s->n && s->pending < CH_CHUNK_WIN && w->nfree > 8 &&
	       (!s->next_at || now >= s->next_at)) {
		ch_chunk_one(w, s, slot);
		if (s->next_at)
			break;
	}
	if (s->next < s->n || s->pending || s->cleaning)
		return;
	if (!s->failed) {
		if (s->ok == s->n)
			atomic_fetch_add(&w->st->streams_sent, 1);
		s->used = false;
		return;
	}
	if (!s->aborted) {
		ch_stream_abort(w, s, slot);
		return;
	}
	/* A failed stream stays failed until its request is cleaned up: do it. */
	s->cleaning = true;
	ch_cleanup(w, p, s->key, CH_CL_PSTREAM, slot);
}

static void ch_sput_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	int p = o->stream / CH_STREAMS;
	struct ch_pstream *s = &w->ps[p][o->stream % CH_STREAMS];

	s->pending--;
	if (c->res >= 0) {
		if (c->res != (int)o->seq)
			ch_bad(w,
			       "STREAM_PUT %s to %s: chunk %" PRIu64 " completed as chunk %d "
			       "(renumbered)%s",
			       o->key, w->sh->name[p], o->seq, c->res,
			       s->failed ? ", after the stream failed" : "");
		if (o->probe)
			ch_bad(w,
			       "STREAM_PUT %s to %s: chunk %" PRIu64 " succeeded (res %d) after "
			       "the stream failed with %s",
			       o->key, w->sh->name[p], o->seq, c->res, ferry_err_name(s->sticky));
		if (c->len != o->len)
			ch_bad(w, "STREAM_PUT %s chunk %" PRIu64 ": len %llu, sent %llu", o->key,
			       o->seq, (unsigned long long)c->len, (unsigned long long)o->len);
		atomic_fetch_add(&w->st->chunks_sent, 1);
		s->ok++;
		return;
	}
	ch_count_err(w, c->res);
	if (o->probe)
		atomic_fetch_add(&w->st->probes_failed, 1);
	else
		atomic_fetch_add(&w->st->chunks_failed, 1);
	if (!s->failed)
		atomic_fetch_add(&w->st->streams_failed_prod, 1);
	s->failed = true;
	if (!s->sticky && ch_sticky(c->res))
		s->sticky = c->res;
	/* The application goes on producing at its pace, as it would. */
	if (!s->pace_ns)
		s->pace_ns = (int64_t)(50 + ch_rand(&w->rng) % 100) * MS;
	if (!ch_lossy(w, p) || (c->res != -ECONNRESET && c->res != -EHOSTUNREACH &&
				c->res != -ETIMEDOUT && !(o->probe && c->res == -EPIPE)))
		ch_bad(w, "STREAM_PUT %s to %s chunk %" PRIu64 ": %s", o->key, w->sh->name[p],
		       o->seq, ferry_err_name(c->res));
}

static void ch_abort_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	struct ch_pstream *s = &w->ps[o->stream / CH_STREAMS][o->stream % CH_STREAMS];

	s->pending--;
	if (c->res < 0)
		ch_count_err(w, c->res);
	if (c->res != 0 && c->res != -ECONNRESET && c->res != -EHOSTUNREACH &&
	    c->res != -ETIMEDOUT && c->res != -EPIPE)
		ch_bad(w, "STREAM_ABORT %s to %s: %s", o->key, w->sh->name[o->peer],
		       ferry_err_name(c->res));
}

/* ------------------------------------------------------------------ */
/* Streams: consumer                                                   */
/* ------------------------------------------------------------------ */

/* Mark a stream key seen; false when it was announced before. */
static bool ch_seen_once(struct ch_w *w, int peer, unsigned inc, uint64_t seq)
{
	struct ch_seen *sn = NULL, *oldest = &w->seen[0];

	for (int i = 0; i < CH_SEEN; i++) {
		struct ch_seen *x = &w->seen[i];

		if (x->used && x->peer == peer && x->inc == inc)
			sn = x;
		if (!x->used || (oldest->used && x->last_use < oldest->last_use))
			oldest = x;
	}
	if (!sn) {
		sn = oldest;
		memset(sn, 0, sizeof(*sn));
		sn->used = true;
		sn->peer = peer;
		sn->inc = inc;
	}
	sn->last_use = t_now();
	if (seq < sn->lo)
		return false; /* older than the window: announced long ago */
	while (seq >= sn->lo + CH_SEEN_BITS) {
		uint64_t b = sn->lo % CH_SEEN_BITS;

		sn->bits[b / 64] &= ~(1ull << (b % 64));
		sn->lo++;
	}
	{
		uint64_t b = seq % CH_SEEN_BITS;

		if (sn->bits[b / 64] & (1ull << (b % 64)))
			return false;
		sn->bits[b / 64] |= 1ull << (b % 64);
	}
	return true;
}

static bool ch_sget_post(struct ch_w *w, const char *key, bool again)
{
	struct ch_cstream *cs = NULL;
	struct ch_op *o;
	struct ferry_sqe *sqe;
	unsigned inc;
	int peer = ch_tag_parse(w, key, &inc), slot;

	for (slot = 0; slot < CH_CSTREAMS; slot++)
		if (!w->cs[slot].used) {
			cs = &w->cs[slot];
			break;
		}
	if (!cs || w->nfree < 4)
		return false;
	o = ch_op_new(w, CH_K_SGET, peer, CH_D_GAP * w->sh->scale);
	memset(cs, 0, sizeof(*cs));
	cs->used = true;
	cs->peer = peer;
	cs->inc = inc;
	snprintf(cs->key, sizeof(cs->key), "%s", key);
	cs->h = ch_hash(key);
	cs->n = ch_nchunks(cs->h);
	cs->whole = (cs->h >> 32) % 8 == 0;
	cs->again = again;
	o->stream = slot;
	o->inc = inc;
	o->whole = cs->whole;
	snprintf(o->key, sizeof(o->key), "%s", key);
	sqe = ch_sqe(w);
	ferry_prep_stream_get(sqe, w->peer[peer], key, ch_ud(w, o));
	if (cs->whole)
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_WHOLE);
	ch_set_timeout(sqe, o->limit); /* the gap between two chunks */
	if (cs->whole)
		o->limit *= cs->n; /* its one CQE comes after n gaps at most */
	if (peer == w->sh->victim)
		w->out_by_inc[inc % CH_INCS]++;
	return true;
}

static void ch_accept_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	char key[CH_KEY];
	const char *sp;
	unsigned inc;
	bool again;
	int peer;

	if (!(c->flags & FERRY_CQE_F_MORE)) {
		if (c->res != -ECANCELED || atomic_load(&w->sh->phase) < CH_FINISH_VICTIM)
			ch_bad(w, "STREAM_ACCEPT ended: %s", ferry_err_name(c->res));
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		w->accept_op = -1;
		ch_op_free(w, o);
		return;
	}
	if (c->res != 0 || !c->buf) {
		ch_bad(w, "STREAM_ACCEPT: res %s, buf %p", ferry_err_name(c->res), (void *)c->buf);
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		return;
	}
	snprintf(key, sizeof(key), "%.*s", (int)(c->len < CH_KEY - 1 ? c->len : CH_KEY - 1),
		 (const char *)ferry_buf_data(c->buf));
	ferry_buf_release(c->buf);
	peer = ch_tag_parse(w, key, &inc);
	sp = strchr(key, ':');
	if (peer < 0 || peer == w->me || !sp || sp[1] != 's') {
		ch_bad(w, "STREAM_ACCEPT: a stream key \"%s\" nobody sends", key);
		return;
	}
	again = !ch_seen_once(w, peer, inc, strtoull(sp + 2, NULL, 10));
	if (again) {
		/*
		 * Over shm a producer that is alive never loses its consumer:
		 * a stream is announced once. Over tcp, when this side declared
		 * the producer dead (and dropped the stream) while the producer
		 * went on, a later chunk or its abort starts the key anew here:
		 * read it again; its chunks must still be the right ones.
		 */
		if (!w->sh->tcp) {
			ch_bad(w, "STREAM_ACCEPT: stream %s announced again", key);
			return;
		}
		atomic_fetch_add(&w->st->reannounced, 1);
		if (getenv("FERRY_CHAOS_VERBOSE"))
			for (int i = 0; i < CH_CSTREAMS; i++)
				if (w->cs[i].used && !strcmp(w->cs[i].key, key))
					fprintf(stderr,
						"chaos: %s: stream %s announced again while "
						"our STREAM_GET of it waits, after chunk "
						"%u of %u\n",
						w->tag, key, w->cs[i].next, w->cs[i].n);
	}
	if (w->nbacklog || !ch_sget_post(w, key, again)) {
		if (w->nbacklog == CH_BACKLOG) {
			ch_bad(w, "STREAM_ACCEPT: more than %d streams wait for a STREAM_GET",
			       CH_BACKLOG);
			return;
		}
		w->backlog_again[w->nbacklog] = again;
		snprintf(w->backlog[w->nbacklog++], CH_KEY, "%s", key);
	}
}

static void ch_sget_end(struct ch_w *w, struct ch_op *o, struct ch_cstream *cs, bool ok, int res)
{
	if (cs->peer == w->sh->victim)
		w->out_by_inc[cs->inc % CH_INCS]--;
	if (ok) {
		atomic_fetch_add(&w->st->streams_got, 1);
	} else if (res == -EBUSY) {
		/* Announced again while an earlier STREAM_GET reads it (tcp): that one goes on. */
		atomic_fetch_add(&w->st->busy_again, 1);
	} else {
		atomic_fetch_add(&w->st->streams_failed_cons, 1);
		w->failed_from[cs->peer]++;
		if (res < 0)
			ch_count_err(w, res);
		/* Chunks that came after we stopped would stay under their keys. */
		ch_cleanup(w, cs->peer, cs->key, CH_CL_CSTREAM, -1);
	}
	cs->used = false;
	ch_op_free(w, o);
}

static void ch_sget_cqe(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	struct ch_cstream *cs = &w->cs[o->stream];
	bool more = c->flags & FERRY_CQE_F_MORE;
	const char *from = w->sh->name[cs->peer];

	o->t_last = t_now();
	if (c->res < 0) {
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		if (more)
			ch_bad(w, "STREAM_GET %s: an error (%s) flagged MORE", cs->key,
			       ferry_err_name(c->res));
		if ((!ch_lossy(w, cs->peer) ||
		     (c->res != -ETIMEDOUT && c->res != -ECONNRESET && c->res != -ECANCELED)) &&
		    !(c->res == -EBUSY && cs->again && cs->next == 0))
			ch_bad(w, "STREAM_GET %s from %s: %s after %u of %u chunks", cs->key, from,
			       ferry_err_name(c->res), cs->next, cs->n);
		if (!more)
			ch_sget_end(w, o, cs, false, c->res);
		return;
	}
	if (cs->whole) {
		const uint8_t *p = ferry_buf_data(c->buf);
		uint64_t total = 0, off = 0;
		bool good = true;

		for (uint32_t i = 0; i < cs->n; i++)
			total += ch_chunk_len(cs->h, i);
		if (more || c->res != (int)cs->n || c->len != total || !p) {
			ch_bad(w,
			       "STREAM_GET (whole) %s from %s: res %d len %llu%s, want %u chunks "
			       "of %llu bytes",
			       cs->key, from, c->res, (unsigned long long)c->len,
			       more ? " MORE" : "", cs->n, (unsigned long long)total);
			good = false;
		}
		for (uint32_t i = 0; good && i < cs->n; i++) {
			uint64_t len = ch_chunk_len(cs->h, i);
			int64_t at =
				ch_check(p + off, len, ch_chunk_tag(i), ch_chunk_seed(cs->h, i));

			if (at >= 0) {
				uint64_t hdr;

				memcpy(&hdr, p + off, 8);
				ch_bad(w,
				       "STREAM_GET (whole) %s from %s: chunk %u wrong at byte %lld "
				       "(its header says chunk %lld)",
				       cs->key, from, i, (long long)at, (long long)(uint32_t)hdr);
				good = false;
			}
			off += len;
		}
		if (good) {
			atomic_fetch_add(&w->st->whole_got, 1);
			atomic_fetch_add(&w->st->chunks_got, cs->n);
			atomic_fetch_add(&w->st->bytes_checked, total);
		}
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		if (!more)
			ch_sget_end(w, o, cs, good, 0);
		return;
	}
	{
		uint32_t idx = (uint32_t)c->res;
		const uint8_t *p = c->buf ? ferry_buf_data(c->buf) : NULL;
		uint64_t want = idx < CH_MAX_CHUNKS ? ch_chunk_len(cs->h, idx) : 0;
		int64_t at;
		bool good = true;

		if (idx != cs->next) {
			ch_bad(w, "STREAM_GET %s from %s: chunk %u arrived, %u was next", cs->key,
			       from, idx, cs->next);
			good = false;
		} else if (idx >= cs->n) {
			ch_bad(w, "STREAM_GET %s from %s: chunk %u of a stream of %u", cs->key,
			       from, idx, cs->n);
			good = false;
		} else if (!p || c->len != want) {
			uint64_t hdr = 0;

			if (p && c->len >= 8)
				memcpy(&hdr, p, 8);
			if ((hdr >> 32) == (ch_chunk_tag(0) >> 32))
				ch_bad(w,
				       "STREAM_GET %s from %s: chunk %u of %llu bytes, want "
				       "%llu: its header says chunk %u (a chunk under the wrong "
				       "index)",
				       cs->key, from, idx, (unsigned long long)c->len,
				       (unsigned long long)want, (uint32_t)hdr);
			else
				ch_bad(w,
				       "STREAM_GET %s from %s: chunk %u of %llu bytes, want "
				       "%llu",
				       cs->key, from, idx, (unsigned long long)c->len,
				       (unsigned long long)want);
			good = false;
		} else if ((at = ch_check(p, want, ch_chunk_tag(idx), ch_chunk_seed(cs->h, idx))) >=
			   0) {
			uint64_t hdr;
			bool is_chunk;

			memcpy(&hdr, p, 8);
			is_chunk = (hdr >> 32) == (ch_chunk_tag(0) >> 32);
			ch_bad(w,
			       "STREAM_GET %s from %s: chunk %u wrong at byte %lld (its "
			       "header: %s %u)",
			       cs->key, from, idx, (long long)at,
			       is_chunk ? "chunk" : "not a chunk's, low word", (uint32_t)hdr);
			good = false;
		}
		if (!more && idx != cs->n - 1) {
			ch_bad(w, "STREAM_GET %s from %s: ended at chunk %u, the stream has %u",
			       cs->key, from, idx, cs->n);
			good = false;
		}
		if (more && idx == cs->n - 1) {
			ch_bad(w, "STREAM_GET %s from %s: its END (chunk %u) flagged MORE", cs->key,
			       from, idx);
			good = false;
		}
		if (good) {
			atomic_fetch_add(&w->st->chunks_got, 1);
			atomic_fetch_add(&w->st->bytes_checked, want);
		}
		cs->next = idx + 1;
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		if (!more)
			ch_sget_end(w, o, cs, good, 0);
	}
}

/* ------------------------------------------------------------------ */
/* Completions                                                         */
/* ------------------------------------------------------------------ */

static void ch_cleanup_done(struct ch_w *w, struct ch_op *o, const struct ferry_cqe *c)
{
	if (c->res < 0) {
		ch_bad(w, "CLEANUP %s: %s", o->key, ferry_err_name(c->res));
	} else if (o->cl == CH_CL_PSTREAM) {
		w->ps[o->stream / CH_STREAMS][o->stream % CH_STREAMS].used = false;
	} else if (o->cl == CH_CL_CSTREAM || o->cl == CH_CL_INC) {
		atomic_fetch_add(&w->st->leftovers, (uint64_t)c->res);
	} else if (o->cl == CH_CL_FINAL) {
		/*
		 * What a peer's late data left: a key whose GET had given up, a
		 * chunk after its STREAM_GET ended (and the record it made):
		 * never more than what failed here from that peer.
		 */
		uint64_t could =
			o->peer == w->me || !ch_lossy(w, o->peer)
				? 0
				: 2 * (w->failed_from[o->peer] + (o->peer == w->sh->victim));

		atomic_fetch_add(&w->st->leftovers, (uint64_t)c->res);
		if ((uint64_t)c->res > could)
			ch_bad(w,
			       "CLEANUP %s at the end dropped %d things (%s; %llu failed ops "
			       "from it could explain %llu)",
			       o->key, c->res,
			       o->peer == w->me ? "our own stream records" : w->sh->name[o->peer],
			       (unsigned long long)w->failed_from[o->peer],
			       (unsigned long long)could);
		w->final_cleanups--;
	}
}

static void ch_cqe(struct ch_w *w, const struct ferry_cqe *c)
{
	uint32_t idx = (uint32_t)c->user_data, gen = (uint32_t)(c->user_data >> 32);
	struct ch_op *o = idx < CH_OPS ? &w->ops[idx] : NULL;
	int64_t now = t_now(), took;

	if (!o || o->kind == CH_K_FREE || o->gen != gen) {
		ch_bad(w, "a completion (user_data %llx, res %s, op %u) for no pending op",
		       (unsigned long long)c->user_data, ferry_err_name(c->res), c->opcode);
		if (c->flags & FERRY_CQE_F_BUF)
			ferry_buf_release(c->buf);
		return;
	}
	took = now - (o->kind == CH_K_SGET ? o->t_last : o->t_sub);
	if (o->limit && took > o->limit) {
		int64_t past = took - o->limit, max = atomic_load(&w->st->max_late_ns);

		if (past > max)
			atomic_store(&w->st->max_late_ns, past);
		if (past > w->sh->slack_ns && !o->reported) {
			atomic_fetch_add(&w->st->late, 1);
			ch_bad(w,
			       "op %s (kind %d, to/from %s) completed (%s) %lld ms after its "
			       "%lld ms deadline",
			       o->key, o->kind, w->sh->name[o->peer], ferry_err_name(c->res),
			       (long long)(past / MS), (long long)(o->limit / MS));
		}
	}
	w->busy_at = now;
	switch (o->kind) {
	case CH_K_PUT:
		ch_put_done(w, o, c);
		break;
	case CH_K_GET:
		ch_get_done(w, o, c);
		break;
	case CH_K_SPUT:
		ch_sput_done(w, o, c);
		break;
	case CH_K_SGET:
		ch_sget_cqe(w, o, c);
		return; /* multishot: frees its record at the end */
	case CH_K_ACCEPT:
		ch_accept_done(w, o, c);
		return;
	case CH_K_ABORT:
		ch_abort_done(w, o, c);
		break;
	case CH_K_CLEANUP:
		ch_cleanup_done(w, o, c);
		break;
	case CH_K_CANCEL:
		/* Of a GET: it may have ended meanwhile (-ENOENT, -EALREADY). */
		if (c->res != 0 && (o->peer == w->me || (c->res != -ENOENT && c->res != -EALREADY)))
			ch_bad(w, "CANCEL (%s): %s", o->key, ferry_err_name(c->res));
		break;
	}
	/* GET hands its buffer over itself; no other op should carry one. */
	if (o->kind != CH_K_GET && (c->flags & FERRY_CQE_F_BUF)) {
		ch_bad(w, "op %s (kind %d): a buffer came with its completion", o->key, o->kind);
		ferry_buf_release(c->buf);
	}
	ch_op_free(w, o);
}

/* Ops pending past their deadline and the slack: reported once each. */
static void ch_scan_late(struct ch_w *w)
{
	int64_t now = t_now();

	for (int i = 0; i < CH_OPS; i++) {
		struct ch_op *o = &w->ops[i];
		int64_t since;

		/* A GET whose PUT failed need not wait for its deadline: cancel it. */
		if (o->kind == CH_K_GET && !o->cancelled && w->nfree > 8) {
			uint64_t v =
				atomic_load(&w->sh->chan[o->peer][w->me].slot[o->seq % CH_RING]);

			if (CH_SLOT_SEQ(v) == o->seq && CH_SLOT_STATE(v) == CH_FAILED) {
				struct ch_op *x = ch_op_new(w, CH_K_CANCEL, o->peer,
							    CH_D_LOCAL * w->sh->scale);
				struct ferry_sqe *sqe = ch_sqe(w);

				snprintf(x->key, sizeof(x->key), "cancel %s", o->key);
				ferry_prep_cancel(sqe, ch_ud(w, o), ch_ud(w, x));
				o->cancelled = true;
			}
		}
		if (o->kind == CH_K_FREE || !o->limit || o->reported)
			continue;
		since = o->kind == CH_K_SGET ? o->t_last : o->t_sub;
		if (now - since > o->limit + w->sh->slack_ns) {
			o->reported = true;
			atomic_fetch_add(&w->st->late, 1);
			ch_bad(w,
			       "op %s (kind %d, to/from %s) still pending %lld ms after its "
			       "%lld ms deadline",
			       o->key, o->kind, w->sh->name[o->peer],
			       (long long)((now - since - o->limit) / MS),
			       (long long)(o->limit / MS));
		}
	}
}

static inline int ch_pending(const struct ch_w *w)
{
	return CH_OPS - w->nfree - (w->accept_op >= 0);
}

static void ch_poll(struct ch_w *w, int64_t timeout)
{
	struct ferry_cqe cqes[32];
	int n;

	ch_flush(w);
	n = ferry_cq_wait(w->cq, cqes, 32, timeout);
	for (int i = 0; i < n; i++)
		ch_cqe(w, &cqes[i]);
	if (t_now() >= w->next_scan) {
		ch_scan_late(w);
		w->next_scan = t_now() + 50 * MS;
	}
}

/* ------------------------------------------------------------------ */
/* The process's own resources                                         */
/* ------------------------------------------------------------------ */

static inline uint64_t ch_fds(void)
{
	int n = t_dir_entries("/proc/self/fd");

	return n > 0 ? (uint64_t)(n - 1) : 0; /* less the directory's own */
}

static inline uint64_t ch_rss(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long size = 0, rss = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/*
 * Every peer is carried by the transport of the test (tcp: the peers have
 * addresses; shm) or by none (between two calls): its engine's health says
 * which. Over tcp both "hosts" share one runtime directory, so a peer
 * handed to shm would find its engine there. Returns true when every
 * peer is carried right now (none between two calls).
 */
static bool ch_check_transport(struct ch_w *w)
{
	static char json[1 << 16];
	const char *want = w->sh->tcp ? "tcp" : "shm";
	int n = ferry_engine_health(w->e, json, sizeof(json));
	bool all_up = true;

	if (n <= 0 || (size_t)n >= sizeof(json))
		return false;
	for (int p = 0; p < w->sh->nworkers; p++) {
		char pat[64];
		const char *at, *tr;

		if (p == w->me)
			continue;
		snprintf(pat, sizeof(pat), "{\"name\":\"%s\",", w->sh->name[p]);
		if (!(at = strstr(json, pat))) {
			all_up = false;
			continue; /* not opened yet */
		}
		if (!(tr = strstr(at, "\"transport\":\""))) {
			ch_bad(w, "peer %s: no transport in the health JSON", w->sh->name[p]);
			continue;
		}
		tr += strlen("\"transport\":\"");
		if (!strncmp(tr, "none", 4))
			all_up = false;
		else if (strncmp(tr, want, 3))
			ch_bad(w, "peer %s is carried by %.*s, not %s", w->sh->name[p],
			       (int)strcspn(tr, "\""), tr, want);
	}
	return all_up;
}

/* A field of the tcp part of the engine's health JSON (0 when there is none). */
static unsigned ch_tcp_health(const char *json, const char *field)
{
	const char *tcp = strstr(json, "\"tcp\":{"), *at;
	char pat[64];

	snprintf(pat, sizeof(pat), "\"%s\":", field);
	if (!tcp || !(at = strstr(tcp, pat)))
		return 0;
	return (unsigned)strtoul(at + strlen(pat), NULL, 10);
}

/*
 * Over tcp: the whole mesh is up, as the engine's last tick counted it:
 * two links per peer (each side calls the other: the link it calls and the
 * one it accepted), every connection of each authenticated, and no other
 * socket open. The fds it holds now are those of a whole mesh, not of one
 * being made again after a cut (which may hold fewer, or more: a mesh with
 * one link of the two, whole in itself, holds 4 sockets fewer).
 */
static bool ch_tcp_settled(struct ch_w *w)
{
	static char json[1 << 16];
	unsigned ready;
	int n;

	if (!w->sh->tcp)
		return true;
	n = ferry_engine_health(w->e, json, sizeof(json));
	if (n <= 0 || (size_t)n >= sizeof(json))
		return false;
	ready = ch_tcp_health(json, "connections_ready");
	return ch_tcp_health(json, "links_up") == 2u * (unsigned)(w->sh->nworkers - 1) &&
	       ch_tcp_health(json, "links_other") == 0 &&
	       ready == ch_tcp_health(json, "connections_wanted") &&
	       ready == ch_tcp_health(json, "sockets");
}

/*
 * Every 200 ms: the peers' transports; and survivors sample fds and RSS
 * through the first half (after a warm-up), when every peer is carried
 * (a cut link holds fewer connections open), the whole tcp mesh is up, and
 * the fd count is the one the sample before saw: the baseline.
 */
static void ch_sample(struct ch_w *w)
{
	int64_t now = t_now(), since = now - w->sh->t0;
	bool all_up;
	uint64_t fds_now;

	if (now < w->next_sample)
		return;
	w->next_sample = now + 200 * MS;
	all_up = ch_check_transport(w);
	fds_now = ch_fds();
	if (fds_now != w->fds_last) {
		w->fds_last = fds_now; /* still moving: not yet a baseline */
		return;
	}
	/*
	 * The first half, or later while no baseline was taken yet (a link that
	 * was never whole then, on a slow machine: the check is weaker, not
	 * skipped).
	 */
	if (!ch_survivor(w) || !all_up || since < w->sh->run_ns / 5 ||
	    (since > w->sh->run_ns / 2 && (atomic_load(&w->st->samples) || since > w->sh->run_ns)) ||
	    !ch_tcp_settled(w))
		return;
	{
		uint64_t fds = fds_now, rss = ch_rss();

		if (fds > w->fds_base)
			w->fds_base = fds;
		if (rss > w->rss_base)
			w->rss_base = rss;
		atomic_store(&w->st->fds_base, w->fds_base);
		atomic_store(&w->st->rss_base, w->rss_base);
		atomic_fetch_add(&w->st->samples, 1);
#if defined(__SANITIZE_ADDRESS__)
		if (getenv("FERRY_CHAOS_VERBOSE"))
			fprintf(stderr,
				"chaos: %s: asan allocated %zu heap %zu free %zu rss %llu\n",
				w->tag, __sanitizer_get_current_allocated_bytes(),
				__sanitizer_get_heap_size(), __sanitizer_get_free_bytes(),
				(unsigned long long)rss);
#endif
	}
}

/* ------------------------------------------------------------------ */
/* The worker's loop                                                   */
/* ------------------------------------------------------------------ */

/* New work while the run goes on. */
static void ch_generate(struct ch_w *w)
{
	struct ch_shared *sh = w->sh;

	for (int p = 0; p < sh->nworkers; p++) {
		struct ch_chan *ch = &sh->chan[w->me][p];

		if (p == w->me)
			continue;
		/*
		 * A PUT completes once the receiver holds the key, not once it
		 * took it: the application's own flow control is how far the
		 * receiver's GETs lag behind (our blocks wait in its key table).
		 */
		while (w->puts_out[p] < CH_PUT_WIN && w->nfree > 16 &&
		       atomic_load(&ch->head) - atomic_load(&ch->tail) < CH_ANNOUNCED_MAX)
			ch_put_one(w, p);
		for (int i = 0; i < CH_STREAMS; i++)
			if (!w->ps[p][i].used && w->nfree > 16)
				ch_stream_start(w, p, &w->ps[p][i]);
	}
}

/*
 * Survivors: clean up what each dead victim incarnation left (chunks that
 * came after its STREAM_GET ended, keys whose GET gave up), once nothing
 * of it is pending here and every key it announced was asked for.
 * Incarnations count from 1; inc[victim] is the one started last, so every
 * one below it is dead.
 */
static void ch_clean_incarnations(struct ch_w *w)
{
	struct ch_shared *sh = w->sh;
	int v = sh->victim;
	unsigned cur;

	if (v < 0 || v == w->me)
		return;
	cur = (unsigned)atomic_load(&sh->inc[v]);
	while (w->cleaned + 1 < cur) {
		unsigned old = w->cleaned + 1;
		struct ch_chan *ch = &sh->chan[v][w->me];
		uint64_t tail = atomic_load(&ch->tail), head = atomic_load(&ch->head);
		char tag[16];

		if (w->out_by_inc[old % CH_INCS] || w->nfree < 8)
			return;
		if (tail < head && CH_SLOT_INC(atomic_load(&ch->slot[tail % CH_RING])) <= old)
			return;
		for (int i = 0; i < w->nbacklog; i++) {
			unsigned inc;

			if (ch_tag_parse(w, w->backlog[i], &inc) == v && inc <= old)
				return;
		}
		ch_tag_of(w, v, old, tag, sizeof(tag));
		ch_cleanup(w, v, tag, CH_CL_INC, -1);
		w->cleaned = old;
	}
}

static bool ch_drained(struct ch_w *w)
{
	struct ch_shared *sh = w->sh;

	if (ch_pending(w) || w->nbacklog)
		return false;
	for (int p = 0; p < sh->nworkers; p++) {
		struct ch_chan *in = &sh->chan[p][w->me];
		uint64_t closed;

		if (p == w->me)
			continue;
		for (int i = 0; i < CH_STREAMS; i++)
			if (w->ps[p][i].used)
				return false;
		if (!atomic_load(&sh->chan[w->me][p].closed))
			return false;
		closed = atomic_load(&in->closed);
		if (!closed || atomic_load(&in->tail) + 1 < closed)
			return false;
	}
	return t_now() - w->busy_at > 300 * MS;
}

/* One pass: completions, then the work the phase allows. */
static void ch_step(struct ch_w *w, int phase)
{
	struct ch_shared *sh = w->sh;

	ch_poll(w, 2 * MS);
	if (phase == CH_RUN && atomic_load(&sh->go))
		ch_generate(w);
	for (int p = 0; p < sh->nworkers; p++) {
		if (p == w->me)
			continue;
		ch_get_announced(w, p);
		for (int i = 0; i < CH_STREAMS; i++)
			if (w->ps[p][i].used)
				ch_stream_step(w, p, i);
		if (phase >= CH_DRAIN && !w->puts_out[p] &&
		    !atomic_load(&sh->chan[w->me][p].closed))
			atomic_store(&sh->chan[w->me][p].closed,
				     atomic_load(&sh->chan[w->me][p].head) + 1);
	}
	while (w->nbacklog && ch_sget_post(w, w->backlog[0], w->backlog_again[0])) {
		w->nbacklog--;
		memmove(w->backlog[0], w->backlog[1], (size_t)w->nbacklog * CH_KEY);
		memmove(w->backlog_again, w->backlog_again + 1, (size_t)w->nbacklog);
	}
	ch_clean_incarnations(w);
	ch_sample(w);
	if (phase == CH_DRAIN) {
		bool d = ch_drained(w);

		if (d && ch_survivor(w) && (!w->sampled_end || t_now() - w->end_sampled_at > 50 * MS)) {
			/*
			 * The end sample: quiet, every peer up; the lowest seen while
			 * drained, so that a connection still being closed (a cut
			 * link's, on a slow machine) is not taken for a leak, while
			 * one that leaked stays counted.
			 */
			uint64_t fds = ch_fds(), rss = ch_rss();

			if (!w->sampled_end || fds < atomic_load(&w->st->fds_end))
				atomic_store(&w->st->fds_end, fds);
			if (!w->sampled_end || rss < atomic_load(&w->st->rss_end))
				atomic_store(&w->st->rss_end, rss);
			w->end_sampled_at = t_now();
			w->sampled_end = true;
#if defined(__SANITIZE_ADDRESS__)
			if (getenv("FERRY_CHAOS_VERBOSE"))
				fprintf(stderr,
					"chaos: %s: asan allocated %zu heap %zu free %zu rss "
					"%llu\n",
					w->tag, __sanitizer_get_current_allocated_bytes(),
					__sanitizer_get_heap_size(), __sanitizer_get_free_bytes(),
					(unsigned long long)ch_rss());
#endif
		}
		if (!d)
			w->sampled_end = false;
		atomic_store(&sh->drained[w->me], d);
	}
}

/* Wait (bounded) until nothing of ours is pending; false when something stays. */
static bool ch_wait_idle(struct ch_w *w, int64_t timeout)
{
	int64_t end = t_now() + timeout;

	while (ch_pending(w) && t_now() < end)
		ch_poll(w, 5 * MS);
	return ch_pending(w) == 0;
}

/* The end of a worker: cancel the accept, clean up, and check that nothing is left. */
static int ch_finish(struct ch_w *w)
{
	struct ch_shared *sh = w->sh;
	struct ferry_engine *e = w->e;
	int64_t end;
	int rc = 0;

	if (ch_survivor(w)) {
		/* Whatever the victim's incarnations and the other side left. */
		for (int p = 0; p < sh->nworkers; p++) {
			unsigned last = p == sh->victim ? (unsigned)atomic_load(&sh->inc[p]) : 0;

			if (p == w->me)
				continue;
			for (unsigned inc = p == sh->victim ? w->cleaned + 1 : 0; inc <= last;
			     inc++) {
				char tag[16];

				if (p == sh->victim && inc == 0)
					continue;
				ch_tag_of(w, p, inc, tag, sizeof(tag));
				ch_cleanup(w, p, tag, CH_CL_FINAL, -1);
				w->final_cleanups++;
			}
		}
		ch_cleanup(w, -1, w->tag, CH_CL_FINAL, -1); /* ours: must find nothing */
		w->final_cleanups++;
	}
	if (w->accept_op >= 0) {
		struct ch_op *o = ch_op_new(w, CH_K_CANCEL, w->me, CH_D_LOCAL * sh->scale);
		struct ferry_sqe *sqe = ch_sqe(w);

		snprintf(o->key, sizeof(o->key), "cancel-accept");
		ferry_prep_cancel(sqe, ch_ud(w, &w->ops[w->accept_op]), ch_ud(w, o));
		w->ops[w->accept_op].limit = CH_D_LOCAL * sh->scale; /* it must end now */
		w->ops[w->accept_op].t_sub = t_now();
	}
	if (!ch_wait_idle(w, 10 * SEC * sh->scale) || w->accept_op >= 0) {
		ch_bad(w, "at the end: %d ops still pending", ch_pending(w));
		rc = 10;
	}
	if (!ch_survivor(w))
		return rc;
	/* Blocks our peers held come back with their releases; credits settle. */
	end = t_now() + 5 * SEC * sh->scale;
	while ((pool_in_use(e) || atomic_load(&e->ops_in_use) || stream_count(e)) && t_now() < end)
		usleep(10000);
	{
		struct pool_stats ps;
		uint32_t keys = atomic_load(&e->keys.present);

		pool_get_stats(e->pool, &ps);
		if (ps.blocks_in_use || ps.bad_frees || pool_check(e->pool)) {
			ch_bad(w, "at the end: pool blocks in use %llu, bad frees %llu, check %d",
			       (unsigned long long)ps.blocks_in_use,
			       (unsigned long long)ps.bad_frees, pool_check(e->pool));
			rc = 11;
		}
		if (keys || atomic_load(&e->ops_in_use) || stream_count(e)) {
			ch_bad(w, "at the end: %u keys, %u ops, %u stream records left", keys,
			       atomic_load(&e->ops_in_use), stream_count(e));
			rc = 12;
		}
	}
	return rc;
}

/*
 * A worker process: run until FINISH (the victim: until FINISH_VICTIM or
 * its SIGKILL). make() creates the engine (and sets the peers' addresses).
 */
static int ch_worker(struct ch_shared *sh, int me,
		     struct ferry_engine *(*make)(struct ch_shared *sh, int me))
{
	static struct ch_w w0;
	struct ch_w *w = &w0;
	int leave = me == sh->victim ? CH_FINISH_VICTIM : CH_FINISH, rc;
	static uint8_t *mem;

	memset(w, 0, sizeof(*w));
	w->sh = sh;
	w->st = &sh->st[me];
	w->me = me;
	w->inc = (unsigned)atomic_load(&sh->inc[me]);
	w->accept_op = -1;
	w->rng = ch_mix(sh->seed ^ ((uint64_t)me << 40) ^ w->inc);
	ch_tag_of(w, me, w->inc, w->tag, sizeof(w->tag));
	if (!mem)
		mem = malloc((size_t)CH_OPS * CH_BUF);
	if (!mem)
		return 2;
	for (int i = 0; i < CH_OPS; i++) {
		w->ops[i].mem = mem + (size_t)i * CH_BUF;
		w->free_ops[i] = CH_OPS - 1 - i;
	}
	w->nfree = CH_OPS;
	w->e = make(sh, me);
	if (!w->e) {
		ch_bad(w, "cannot create the engine");
		return 3;
	}
	if (ferry_sq_get(w->e, &w->sq))
		return 4;
	w->cq = ferry_cq_default(w->e);
	for (int p = 0; p < sh->nworkers; p++) {
		if (p == me)
			continue;
		if (ferry_peer_open(w->e, sh->name[p], &w->peer[p]))
			return 5;
		ferry_peer_set_stream_limits(w->peer[p], CH_CREDITS, 0);
		if (sh->tcp && ferry_peer_set_address(w->peer[p], sh->addr[p]))
			return 6;
		/* A new incarnation reads what is announced from now on. */
		atomic_store(&sh->chan[p][me].tail, atomic_load(&sh->chan[p][me].head));
		w->stream_seq[p] = 0;
	}
	if (me == sh->victim) {
		/* Its PUT keys go on from where the last incarnation stopped. */
		for (int p = 0; p < sh->nworkers; p++)
			atomic_store(&sh->chan[me][p].closed, 0);
	}
	{
		struct ch_op *o = ch_op_new(w, CH_K_ACCEPT, me, 0);
		struct ferry_sqe *sqe = ch_sqe(w);

		snprintf(o->key, sizeof(o->key), "accept");
		ferry_prep_stream_accept(sqe, NULL, ch_ud(w, o));
		w->accept_op = (int)(o - w->ops);
	}
	ch_flush(w);
	w->busy_at = t_now();
	atomic_store(&sh->ready[me], 1);
	for (;;) {
		int phase = atomic_load(&sh->phase);

		if (phase >= leave)
			break;
		ch_step(w, phase);
	}
	rc = ch_finish(w);
	ferry_engine_destroy(w->e);
	free(mem);
	mem = NULL;
	return rc;
}

/* ------------------------------------------------------------------ */
/* The parent: setting up, waiting, the report and the verdict          */
/* ------------------------------------------------------------------ */

#define CH_RSS_SLACK (8ull << 20) /* per unit of scale */
#define CH_FD_SLACK 2

/* How much slower this build runs: deadlines and bounds are multiplied by it. */
static inline int64_t ch_scale(void)
{
	if (t_under_valgrind())
		return 10;
#if defined(__SANITIZE_ADDRESS__)
	return 2;
#else
	return 1;
#endif
}

/*
 * The shared region for a run of FERRY_CHAOS_SECONDS (default_s when
 * unset) with FERRY_CHAOS_SEED (else one from the clock), printed.
 */
static inline struct ch_shared *ch_start(const char *what, int64_t default_s)
{
	const char *env_s = getenv("FERRY_CHAOS_SECONDS"), *env_seed = getenv("FERRY_CHAOS_SEED");
	int64_t seconds = env_s && atoi(env_s) > 0 ? atoi(env_s) : default_s;
	struct ch_shared *sh = ch_shared_new();

	sh->scale = ch_scale();
	sh->slack_ns = 1500 * MS * sh->scale;
	sh->seed = env_seed ? strtoull(env_seed, NULL, 0) : (uint64_t)t_now() ^ (uint64_t)getpid();
	sh->run_ns = seconds * SEC;
	sh->victim = -1;
	fprintf(stderr,
		"# chaos %s: seed %llu (FERRY_CHAOS_SEED=%llu repeats the schedule), %lld s "
		"(FERRY_CHAOS_SECONDS)\n",
		what, (unsigned long long)sh->seed, (unsigned long long)sh->seed,
		(long long)seconds);
	return sh;
}

/*
 * Fork worker me (it dies with the test process; close_fd, when >= 0, is
 * closed in it first), running ch_worker with make.
 */
static inline pid_t ch_spawn(struct ch_shared *sh, int me, int close_fd,
			     struct ferry_engine *(*make)(struct ch_shared *sh, int me))
{
	pid_t parent = getpid(), pid;

	fflush(NULL); /* the child exits through exit(): nothing buffered here twice */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(90);
		if (close_fd >= 0)
			close(close_fd);
		alarm((unsigned)(sh->run_ns / SEC + 120 * sh->scale));
		/* exit(), not _exit(): LeakSanitizer looks at what the worker left. */
		exit(ch_worker(sh, me, make));
	}
	return pid;
}

/* Entries of /dev/shm whose name says ferry (ferry uses memfds: there should be none). */
static inline int ch_shm_files(void)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (strstr(de->d_name, "ferry"))
			n++;
	closedir(d);
	return n;
}

/* waitpid, bounded: the status as t_reap gives it, or -1 after ms. */
static inline int ch_reap_within(pid_t pid, int64_t ms)
{
	int64_t end = t_now() + ms * MS;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
		if (r < 0 && errno != EINTR)
			return -1;
		if (t_now() > end)
			return -1;
		usleep(5000);
	}
}

static inline bool ch_wait_flag(_Atomic int *f, int64_t ms)
{
	int64_t end = t_now() + ms * MS;

	while (!atomic_load(f)) {
		if (t_now() > end)
			return false;
		usleep(2000);
	}
	return true;
}

static inline void ch_sleep(int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / SEC, .tv_nsec = ns % SEC};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static inline void ch_report(struct ch_shared *sh, const char *what, const char *events,
			     int64_t took)
{
	static const char *const en[CH_E_N] = {"ECONNRESET", "EHOSTUNREACH", "ETIMEDOUT",
					       "ECANCELED",  "EPIPE",        "other"};

	fprintf(stderr, "# chaos %s: seed %llu, %lld s of chaos, %.1f s in all; %s\n", what,
		(unsigned long long)sh->seed, (long long)(sh->run_ns / SEC), (double)took / SEC,
		events);
	for (int i = 0; i < sh->nworkers; i++) {
		struct ch_stats *s = &sh->st[i];
		char errs[200];
		int n = 0;

		errs[0] = '\0';
		for (int k = 0; k < CH_E_N; k++)
			if (s->errs[k])
				n += snprintf(errs + n, sizeof(errs) - (size_t)n, " %s %llu", en[k],
					      (unsigned long long)s->errs[k]);
		fprintf(stderr,
			"#   %s: PUT %llu ok, %llu failed; GET %llu verified, %llu failed (%llu "
			"after a reset, delivered); chunks sent %llu ok, %llu failed (+%llu failed "
			"after their stream had); chunks verified %llu; streams sent %llu, failed "
			"%llu; read %llu (%llu whole), failed %llu, announced again %llu (%llu read "
			"already); aborts %llu; %.1f MB verified; leftovers cleaned up %llu; "
			"errors:%s\n",
			sh->name[i], (unsigned long long)s->puts_ok,
			(unsigned long long)s->puts_failed, (unsigned long long)s->gets_ok,
			(unsigned long long)s->gets_failed, (unsigned long long)s->gets_after_reset,
			(unsigned long long)s->chunks_sent, (unsigned long long)s->chunks_failed,
			(unsigned long long)s->probes_failed, (unsigned long long)s->chunks_got,
			(unsigned long long)s->streams_sent,
			(unsigned long long)s->streams_failed_prod,
			(unsigned long long)s->streams_got, (unsigned long long)s->whole_got,
			(unsigned long long)s->streams_failed_cons,
			(unsigned long long)s->reannounced, (unsigned long long)s->busy_again,
			(unsigned long long)s->aborts, (double)s->bytes_checked / 1e6,
			(unsigned long long)s->leftovers, n ? errs : " none");
		if (i != sh->victim)
			fprintf(stderr,
				"#   %s: fds %llu (most in the first half), %llu at the end; RSS "
				"%.1f MB, "
				"%.1f MB; worst completion past its deadline %lld ms\n",
				sh->name[i], (unsigned long long)s->fds_base,
				(unsigned long long)s->fds_end, (double)s->rss_base / 1e6,
				(double)s->rss_end / 1e6, (long long)(s->max_late_ns / MS));
		fprintf(stderr, "#   %s: %llu wrong, %llu late\n", sh->name[i],
			(unsigned long long)s->bad, (unsigned long long)s->late);
	}
}

/* Start the drain and wait (bounded) until every worker says it is drained. */
static inline bool ch_drain(struct ch_shared *sh)
{
	int64_t end = t_now() + 30 * SEC * sh->scale, all_since = 0;

	atomic_store(&sh->phase, CH_DRAIN);
	for (;;) {
		bool all = true;

		for (int i = 0; i < sh->nworkers; i++)
			all = all && atomic_load(&sh->drained[i]);
		if (!all)
			all_since = 0;
		else if (!all_since)
			all_since = t_now();
		/* Quiet that long (end samples are taken meanwhile): valgrind reaps slower. */
		if (all_since && t_now() - all_since > (t_under_valgrind() ? 2000 : 300) * MS)
			return true;
		if (t_now() > end) {
			for (int i = 0; i < sh->nworkers; i++)
				fprintf(stderr, "chaos: %s %s drained\n", sh->name[i],
					atomic_load(&sh->drained[i]) ? "is" : "is NOT");
			return false;
		}
		usleep(10000);
	}
}

/* The verdict on the stats, once every worker is gone. */
static inline void ch_verdict(struct ch_shared *sh)
{
	for (int i = 0; i < sh->nworkers; i++) {
		struct ch_stats *s = &sh->st[i];

		if (s->bad || s->late)
			fail_msg("chaos: %s: %llu wrong, %llu late (seed %llu)", sh->name[i],
				 (unsigned long long)s->bad, (unsigned long long)s->late,
				 (unsigned long long)sh->seed);
		/* Each worker did verify things (a run that moved nothing proves nothing). */
		assert_true(s->gets_ok > 0 && s->chunks_got > 0 && s->streams_got > 0);
		if (i == sh->victim)
			continue;
		assert_true(s->samples > 0);
		if (s->fds_end > s->fds_base + CH_FD_SLACK)
			fail_msg("chaos: %s: %llu fds at the end, at most %llu in the first half",
				 sh->name[i], (unsigned long long)s->fds_end,
				 (unsigned long long)s->fds_base);
		if (s->rss_end > s->rss_base + CH_RSS_SLACK * (uint64_t)sh->scale + CH_ASAN_QUARANTINE)
			fail_msg("chaos: %s: RSS %.1f MB at the end, at most %.1f MB in the first "
				 "half",
				 sh->name[i], (double)s->rss_end / 1e6, (double)s->rss_base / 1e6);
	}
}

/*
 * The end of a chaos test: the two survivors (pids[0], pids[1]) finish and
 * are reaped within their bound, then the report and the verdict. A
 * survivor that ends badly fails the test with the report printed.
 */
static inline void ch_finish_survivors(struct ch_shared *sh, pid_t pids[2], const char *what,
				       const char *events, int64_t started)
{
	for (int i = 0; i < 2; i++) {
		int rc = ch_reap_within(pids[i], 30000 * sh->scale);

		pids[i] = 0;
		if (rc != 0) {
			ch_report(sh, what, events, t_now() - started);
			fail_msg("chaos %s: survivor %s ended with %d", what, sh->name[i], rc);
		}
	}
	alarm(0);
	ch_report(sh, what, events, t_now() - started);
	ch_verdict(sh);
}

#endif

/*
 * tests/conformance_ends.h - the two ends of the transport conformance suite
 * (tests/conformance.h) and the agent that runs each of them.
 *
 * Owns: the transport entry (struct cf_transport), the agent (one engine,
 * the ops it submitted, the check of everything that completes, the
 * buffers it holds), its commands, and the ends a case talks to. An end
 * is an agent either in this process (called directly) or in a child
 * process (the same agent behind a SOCK_SEQPACKET socketpair: one command
 * out, one reply back). So a case is written once against two ends, and the
 * transport decides where the far end lives: in this process for loop, in
 * another for shm and tcp.
 *
 * Every op an agent submits carries what its completion must show: the
 * length and seed of the data (cf_fill: 64-bit words that depend on the
 * seed and their position), so every GET, zero-copy GET and stream chunk is
 * checked byte for byte where it lands, and every iovec destination has a
 * guard that must stay untouched. Completions are queued per agent, in the
 * order they came, until a case asks for them (cf_wait, cf_seq, cf_none).
 *
 * Children are forked in the case's setup, before this process has an
 * engine (a fork of a process whose engine threads run may inherit a lock
 * held at that instant): one for the far end and a spare for a far end
 * that is killed and started again. Every wait is bounded.
 */
#ifndef FERRY_TEST_CONFORMANCE_ENDS_H
#define FERRY_TEST_CONFORMANCE_ENDS_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

#define CF_NS "conf"
#define CF_SECRET "conformance-suite-secret"
#define CF_KIB 1024ull
#define CF_MIB (1024ull * 1024ull)
#define CF_ADDR_MAX 160

/* ------------------------------------------------------------------ */
/* Transports                                                          */
/* ------------------------------------------------------------------ */

/* What a PUT into a receiver whose pool is full does (cf_transport.rx_full). */
enum cf_rx_full {
	CF_RX_TAKES = 1,   /* completes with 0: the data does not need the receiver's pool */
	CF_RX_REFUSES = 2, /* completes with -ENOBUFS at once */
	CF_RX_WAITS = 3,   /* waits (holding its block here) until the receiver has room */
};

/* The size classes of rx_full: a PUT of 100 B, of 4 KiB, of 256 KiB (from an iovec). */
enum { CF_SMALL, CF_MID, CF_LARGE, CF_NCLASS };
static const size_t cf_class_size[CF_NCLASS] = { 100, 4096, 256 * 1024 };

/*
 * A transport as the suite sees it: where the far end lives, how an engine
 * and a peer handle are set up for it, and the few things where transports
 * differ by design (documented in docs/api.md and docs/design.md). A new
 * transport joins the suite with one more of these (docs/design.md §18).
 */
struct cf_transport {
	const char *name;      /* as the health JSON names the transport of a peer */
	bool far_is_process;   /* the far end is another process (else: this one) */
	enum ferry_progress_mode progress; /* of both engines (a case may make one MANUAL) */
	/* Engine parameters: prev is the address the end had before a restart, or NULL. */
	void (*params)(struct ferry_engine_params *p, const char *prev);
	/*
	 * The address a peer is given to reach engine e, into buf like
	 * snprintf (NULL: ferry_engine_address, its tcp address).
	 */
	int (*address)(struct ferry_engine *e, char *buf, size_t len);
	/* Make peer handle p reach the end whose address (above) is addr ("" if none). */
	int (*link)(struct ferry_peer *p, const char *addr);
	/* Make peer handle p (of a name nobody holds) a peer that nobody answers. */
	int (*ghost)(struct ferry_peer *p);
	/* iovec PUTs of at most this many bytes take no block of the sender's pool. */
	size_t inline_max;
	/* The receiver's application holding a zero-copy GET holds the sender's block. */
	bool lends_blocks;
	/* A PUT of cf_class_size[c] into a receiver whose pool is full: enum cf_rx_full. */
	int rx_full[CF_NCLASS];
	/*
	 * A known difference, not a design choice (reported; true makes the
	 * suite assert what the transport does today, so a fix shows): a chunk
	 * buffer released after its consumer cleaned up the request still gives
	 * the producer a credit, and the next chunk goes, to be kept there as a
	 * plain key "{stream}_{n}" that nobody reads.
	 */
	bool credit_after_cleanup;
};

/* The transport under test (set by cf_main before the cases fork). */
static const struct cf_transport *cf_t;

/* How much slower than a plain build: bounds on time grow by this. */
static inline int64_t cf_slow(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return t_under_valgrind() ? 20 : 3;
#else
	return t_under_valgrind() ? 10 : 1;
#endif
}

/* ------------------------------------------------------------------ */
/* Data                                                                */
/* ------------------------------------------------------------------ */

static inline uint64_t cf_word(uint64_t seed, uint64_t i)
{
	uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xc2b2ae3d27d4eb4full;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 32;
	return x;
}

/* n bytes of seed's pattern: a byte moved, lost, stale or from another op shows. */
static inline void cf_fill(void *p, size_t n, uint64_t seed)
{
	uint8_t *b = p;
	uint64_t w;

	for (size_t i = 0; i < n / 8; i++) {
		w = cf_word(seed, i);
		memcpy(b + 8 * i, &w, 8);
	}
	w = cf_word(seed, n / 8);
	for (size_t i = n / 8 * 8; i < n; i++)
		b[i] = (uint8_t)(w >> (8 * (i % 8)));
}

static inline bool cf_check(const void *p, size_t n, uint64_t seed)
{
	const uint8_t *b = p;
	uint64_t w;

	if (n && !p)
		return false;
	for (size_t i = 0; i < n / 8; i++) {
		w = cf_word(seed, i);
		if (memcmp(b + 8 * i, &w, 8) != 0)
			return false;
	}
	w = cf_word(seed, n / 8);
	for (size_t i = n / 8 * 8; i < n; i++)
		if (b[i] != (uint8_t)(w >> (8 * (i % 8))))
			return false;
	return true;
}

/* Chunk i of a stream: its seed, and its length by the stream's spec. */
static inline uint64_t cf_chunk_seed(uint64_t seed, unsigned i)
{
	return seed * 1000003ull + i;
}

enum {
	CF_SPEC_WORD = 0,   /* every chunk 8 bytes */
	CF_SPEC_VARIED = 1, /* 1..700 bytes, the END chunk empty */
	CF_SPEC_MIXED = 2,  /* across the inline, eager and rendezvous sizes, some empty */
	CF_SPEC_WHOLE = 3,  /* 0..2999 bytes */
};

static inline size_t cf_chunk_len(unsigned spec, unsigned i, unsigned n)
{
	static const size_t mixed[] = { 1, 255, 256, 257, 4096, 0, 65537, 300000 };

	switch (spec) {
	case CF_SPEC_VARIED:
		return i + 1 == n ? 0 : 1 + (i * 37u) % 700u;
	case CF_SPEC_MIXED:
		return mixed[i % (sizeof(mixed) / sizeof(mixed[0]))];
	case CF_SPEC_WHOLE:
		return (i * 977u) % 3000u;
	default:
		return 8;
	}
}

/* The length of small item i of a run (cf_msg.n > 1, size 0): 1..300 bytes. */
static inline size_t cf_small_len(uint64_t i)
{
	return 1 + (size_t)(i * 53u % 300u);
}

/*
 * An iovec of four segments over mem with 16 guard bytes between them (the
 * second empty): lengths size/3, 0, size/3, the rest. mem holds size + 48.
 */
static inline unsigned cf_segments(uint8_t *mem, size_t size, struct iovec *iov)
{
	size_t a = size / 3, b = size / 3;

	iov[0] = (struct iovec){ mem, a };
	iov[1] = (struct iovec){ mem + a + 16, 0 };
	iov[2] = (struct iovec){ mem + a + 16, b };
	iov[3] = (struct iovec){ mem + a + b + 32, size - a - b };
	return 4;
}

/* ------------------------------------------------------------------ */
/* Commands                                                            */
/* ------------------------------------------------------------------ */

enum cf_op {
	CF_CREATE = 1, /* an engine: key = name, pool, max_keys, manual; text = listen before */
	CF_PEER,       /* peer slot: text = name, text2 = address, arg 1: ghost, limits */
	CF_PUT,        /* key, size, seed, mode, flags, timeout, ud; n > 1: a run (cf_run) */
	CF_GET,        /* key, size, seed (expected), mode, cap, flags, timeout, ud, hold; n > 1 */
	CF_SPUT,       /* a stream chunk: as PUT, flags may hold STREAM_END */
	CF_SGET,       /* a STREAM_GET: key, seed, spec, n chunks, flags, timeout (gap), hold */
	CF_SABORT,     /* key, text = reason, ud */
	CF_ACCEPT,     /* STREAM_ACCEPT from slot (-1: any), ud */
	CF_CANCEL,     /* arg = the ud to cancel, ud */
	CF_CLEANUP,    /* key = request, slot (-1: every peer), ud */
	CF_WAIT,       /* the first completion of ud (arg 1: of any op), within timeout */
	CF_SEQ,        /* n completions as mode says (enum cf_seq), within timeout */
	CF_NONE,       /* nothing completes within timeout: rc = how many did */
	CF_RELEASE,    /* n held buffers (0: all), oldest first: rc = how many */
	CF_VERIFY,     /* every held buffer checked again: rc = how many are wrong */
	CF_FILL,       /* the whole pool allocated and held: rc = buffers, num = largest free */
	CF_UNFILL,     /* those released */
	CF_HEALTH,     /* num = the number "text2" after "text" in the health JSON */
	CF_FREEZE,     /* stop driving the engine (MANUAL: nothing moves, no CQ is read) */
	CF_THAW,
	CF_CARRIER,    /* text = the transport that carries our peer named text */
	CF_DUMP,       /* dump = the agent's state, for a failing case's message */
	CF_DESTROY,    /* destroy the engine, then release what was held (an in-process death) */
	CF_EXIT,       /* release what is held, destroy the engine; a child then exits (0 unless
			* the agent saw a fault) */
};

/* PUT modes (mode of CF_PUT / CF_SPUT) and GET modes (mode of CF_GET). */
enum { CF_IOV = 0, CF_GATHER = 1, CF_BUF = 2 }; /* CF_IOV of 0 bytes: iov NULL, iovcnt 0 */
enum { CF_INTO = 0, CF_SCATTER = 1, CF_ZC = 2 };

/*
 * CF_SEQ modes. CF_SEQ_CHUNKS: n CQEs of op ud, the k-th with res arg + k and
 * FERRY_CQE_F_MORE (the last without it when flags is 1). CF_SEQ_ORDER: the
 * ops ud .. ud + n - 1 complete in that order, each with res expect.
 * CF_SEQ_ANY: the same in any order (expect CF_RES_INDEX: res = ud - arg).
 */
enum cf_seq { CF_SEQ_CHUNKS = 0, CF_SEQ_ORDER = 1, CF_SEQ_ANY = 2 };
#define CF_RES_INDEX 1000000

struct cf_msg {
	uint32_t op, mode;
	int32_t slot, expect;
	uint32_t flags, hold, spec, manual, max_keys, lim_stream, lim_peer, pad;
	uint64_t ud, size, seed, cap, timeout_ns, n, arg, pool;
	char key[FERRY_KEY_MAX];
	char text[CF_ADDR_MAX];
	char text2[CF_ADDR_MAX];
};

/* One completion as an agent saw it. ok: everything it carried was checked and right. */
struct cf_done {
	uint64_t ud;
	int32_t res;
	uint32_t flags;
	uint64_t len;
	int32_t ok;
	uint32_t opcode;
	int64_t at;      /* CLOCK_MONOTONIC when the agent took it (one clock per host) */
	char text[160];  /* an abort's reason, an accepted stream's key */
};

struct cf_rep {
	int32_t rc;
	int32_t broken; /* the agent saw a fault of its own (text says which) */
	int64_t num;
	struct cf_done d;
	char text[CF_ADDR_MAX];
	char dump[3072]; /* CF_DUMP: what the agent waits for, holds and logged last */
};

/* ------------------------------------------------------------------ */
/* The agent                                                           */
/* ------------------------------------------------------------------ */

#define CF_RECS 8192   /* ops in flight per agent */
#define CF_QUEUE 16384 /* completions not yet asked for */
#define CF_HELD 8192   /* buffers held */
#define CF_FILLS 65536
#define CF_SLOTS 4

/* An op in flight: what its completion must show. */
struct cf_rec {
	bool used;
	uint8_t op;        /* CF_PUT, CF_GET, CF_SPUT, CF_SGET, ... */
	uint32_t mode, spec, flags;
	bool hold;
	uint64_t ud, size, seed, cap;
	unsigned next, n;  /* a STREAM_GET: the index it waits for, the chunks it expects */
	uint8_t *mem;      /* PUT source or GET destination (with guards) */
	struct iovec iov[4];
	unsigned iovcnt;
};

struct cf_held {
	struct ferry_buf *b;
	uint64_t size, seed;
};

struct cf_agent {
	struct ferry_engine *e;
	struct ferry_peer *peer[CF_SLOTS];
	bool manual, frozen;
	struct cf_rec *recs;
	unsigned rec_hint;
	struct cf_done *q;
	unsigned qhead, qlen;
	struct cf_held held[CF_HELD];
	unsigned nheld;
	struct ferry_buf **fill;
	unsigned nfill;
	char addr[CF_ADDR_MAX];
	char broken[160];
};

/* The agents of this process: waiting on one drives them all (MANUAL mode). */
static struct cf_agent *cf_locals[4];

static inline void cf_fault(struct cf_agent *a, const char *what, uint64_t ud)
{
	if (!a->broken[0])
		snprintf(a->broken, sizeof(a->broken), "%s (op %llu)", what,
			 (unsigned long long)ud);
}

static inline struct cf_agent *cf_ag_new(void)
{
	struct cf_agent *a = calloc(1, sizeof(*a));

	assert_non_null(a);
	a->recs = calloc(CF_RECS, sizeof(*a->recs));
	a->q = calloc(CF_QUEUE, sizeof(*a->q));
	a->fill = calloc(CF_FILLS, sizeof(*a->fill));
	assert_true(a->recs && a->q && a->fill);
	return a;
}

static inline void cf_ag_local(struct cf_agent *a, bool add)
{
	for (unsigned i = 0; i < 4; i++) {
		if (add && !cf_locals[i]) {
			cf_locals[i] = a;
			return;
		}
		if (!add && cf_locals[i] == a) {
			cf_locals[i] = NULL;
			return;
		}
	}
	assert_false(add);
}

static inline void cf_rec_free(struct cf_rec *r)
{
	free(r->mem);
	memset(r, 0, sizeof(*r));
}

static inline struct cf_rec *cf_rec_new(struct cf_agent *a, uint8_t op, uint64_t ud)
{
	for (unsigned k = 0; k < CF_RECS; k++) {
		unsigned i = (a->rec_hint + k) % CF_RECS;
		struct cf_rec *r = &a->recs[i];

		if (!r->used) {
			memset(r, 0, sizeof(*r));
			r->used = true;
			r->op = op;
			r->ud = ud;
			a->rec_hint = i + 1;
			return r;
		}
	}
	cf_fault(a, "more ops in flight than the agent keeps", ud);
	return NULL;
}

static inline uint64_t cf_rec_token(struct cf_agent *a, struct cf_rec *r)
{
	return (uint64_t)(r - a->recs) + 1;
}

static inline void cf_hold(struct cf_agent *a, struct ferry_buf *b, uint64_t size, uint64_t seed)
{
	if (a->nheld == CF_HELD) {
		cf_fault(a, "too many buffers held", 0);
		ferry_buf_release(b);
		return;
	}
	a->held[a->nheld++] = (struct cf_held){ b, size, seed };
}

static inline void cf_push(struct cf_agent *a, const struct cf_done *d)
{
	if (a->qlen == CF_QUEUE) {
		cf_fault(a, "completion queue of the agent overflowed", d->ud);
		return;
	}
	a->q[(a->qhead + a->qlen++) % CF_QUEUE] = *d;
}

/* Is an iovec destination of r right: data where it belongs, every guard byte 0x5a? */
static inline bool cf_dest_ok(const struct cf_rec *r, uint64_t len)
{
	size_t total = r->cap + 48;
	uint8_t *copy;
	size_t at = 0;
	bool ok = true;

	if (len != r->size)
		return false;
	if (r->mode == CF_INTO) {
		for (size_t i = r->size; i < total; i++)
			if (r->mem[i] != 0x5a)
				return false;
		return cf_check(r->mem, r->size, r->seed);
	}
	/* Scattered: the segments in order hold the data, the gaps stay. */
	copy = malloc(r->size ? r->size : 1);
	if (!copy)
		return false;
	for (unsigned s = 0; s < r->iovcnt; s++) {
		size_t put = r->iov[s].iov_len;

		if (put > r->size - at)
			put = r->size - at;
		memcpy(copy + at, r->iov[s].iov_base, put);
		for (size_t k = put; k < r->iov[s].iov_len; k++)
			ok = ok && ((uint8_t *)r->iov[s].iov_base)[k] == 0x5a;
		at += put;
	}
	ok = ok && cf_check(copy, r->size, r->seed);
	free(copy);
	for (unsigned s = 0; s + 1 < r->iovcnt; s++) { /* the 16-byte gaps */
		uint8_t *end = (uint8_t *)r->iov[s].iov_base + r->iov[s].iov_len;

		for (unsigned k = 0; k < 16 && end + k < r->mem + total; k++)
			if (end + k < (uint8_t *)r->iov[s + 1].iov_base)
				ok = ok && end[k] == 0x5a;
	}
	return ok;
}

/* A completion of ours: check it against its op, queue it, free the op when it is over. */
static inline void cf_take(struct cf_agent *a, const struct ferry_cqe *c)
{
	struct cf_rec *r;
	struct cf_done d = { .res = c->res, .flags = c->flags, .len = c->len, .ok = 1,
			     .opcode = c->opcode, .at = t_now() };
	bool final = !(c->flags & FERRY_CQE_F_MORE), keep = false;

	if (c->user_data == 0 || c->user_data > CF_RECS || !a->recs[c->user_data - 1].used) {
		cf_fault(a, "a completion of no op of ours", c->user_data);
		if (c->buf)
			ferry_buf_release(c->buf);
		return;
	}
	r = &a->recs[c->user_data - 1];
	d.ud = r->ud;
	switch (r->op) {
	case CF_PUT:
		d.ok = c->res < 0 || c->len == r->size;
		break;
	case CF_SPUT:
		d.ok = c->res < 0 || c->len == r->size;
		break;
	case CF_GET:
		if (c->res == -EMSGSIZE) {
			d.ok = c->len == r->size && !c->buf;
		} else if (c->res < 0) {
			d.ok = !c->buf;
		} else if (r->mode == CF_ZC) {
			d.ok = (c->flags & FERRY_CQE_F_BUF) && c->buf && c->len == r->size &&
			       ferry_buf_len(c->buf) == r->size &&
			       cf_check(ferry_buf_data(c->buf), r->size, r->seed);
			keep = r->hold && c->buf;
		} else {
			d.ok = !c->buf && !(c->flags & FERRY_CQE_F_BUF) && cf_dest_ok(r, c->len);
		}
		if (keep)
			cf_hold(a, c->buf, r->size, r->seed);
		else if (c->buf)
			ferry_buf_release(c->buf);
		break;
	case CF_SGET:
		if (c->res < 0) {
			if (c->buf) { /* an abort's reason */
				size_t n = c->len < sizeof(d.text) ? c->len : sizeof(d.text) - 1;

				snprintf(d.text, sizeof(d.text), "%.*s", (int)n,
					 (const char *)ferry_buf_data(c->buf));
				ferry_buf_release(c->buf);
			}
			break;
		}
		if (r->flags & FERRY_SQE_STREAM_WHOLE) {
			const uint8_t *p = c->buf ? ferry_buf_data(c->buf) : NULL;
			uint64_t off = 0;

			d.ok = c->buf && (unsigned)c->res == r->n && final;
			for (unsigned i = 0; d.ok && i < r->n; i++) {
				size_t l = cf_chunk_len(r->spec, i, r->n);

				d.ok = off + l <= c->len &&
				       cf_check(p + off, l, cf_chunk_seed(r->seed, i));
				off += l;
			}
			d.ok = d.ok && off == c->len;
			if (c->buf)
				ferry_buf_release(c->buf);
			break;
		} else {
			unsigned i = (unsigned)c->res;
			size_t l = cf_chunk_len(r->spec, i, r->n);

			/* In order, as long as its spec says, its bytes; MORE until the END. */
			d.ok = i == r->next && c->buf && (c->flags & FERRY_CQE_F_BUF) &&
			       c->len == l && ferry_buf_len(c->buf) == l &&
			       cf_check(ferry_buf_data(c->buf), l, cf_chunk_seed(r->seed, i)) &&
			       (!r->n || i < r->n) && (!r->n || final == (i + 1 == r->n));
			r->next = i + 1;
			if (r->hold && c->buf)
				cf_hold(a, c->buf, l, cf_chunk_seed(r->seed, i));
			else if (c->buf)
				ferry_buf_release(c->buf);
		}
		break;
	case CF_ACCEPT:
		if (c->buf) {
			snprintf(d.text, sizeof(d.text), "%.*s",
				 (int)(c->len < sizeof(d.text) ? c->len : sizeof(d.text) - 1),
				 (const char *)ferry_buf_data(c->buf));
			ferry_buf_release(c->buf);
		}
		break;
	default: /* CANCEL, CLEANUP, ABORT: the result is all */
		if (c->buf)
			ferry_buf_release(c->buf);
		break;
	}
	cf_push(a, &d);
	if (final)
		cf_rec_free(r);
}

/* Take what a's CQ holds; in MANUAL mode this drives a. Nothing when frozen. */
static inline int cf_ag_pump(struct cf_agent *a, int64_t wait_ns)
{
	struct ferry_cqe cq[64];
	int n, got = 0;

	if (!a->e || a->frozen)
		return 0;
	n = wait_ns > 0 ? ferry_cq_wait(ferry_cq_default(a->e), cq, 64, wait_ns)
			: ferry_cq_poll(ferry_cq_default(a->e), cq, 64);
	while (n > 0) {
		for (int i = 0; i < n; i++)
			cf_take(a, &cq[i]);
		got += n;
		n = ferry_cq_poll(ferry_cq_default(a->e), cq, 64);
	}
	return got;
}

/* Drive a and every other agent of this process once, waiting a little on a. */
static inline void cf_pump_all(struct cf_agent *a)
{
	bool others = false;

	for (unsigned i = 0; i < 4; i++)
		if (cf_locals[i] && cf_locals[i] != a && cf_locals[i]->e) {
			others = true;
			cf_ag_pump(cf_locals[i], 0);
		}
	if (cf_ag_pump(a, 0) == 0) {
		if (a->e && !a->frozen && !(others && a->manual))
			cf_ag_pump(a, 1 * MS);
		else
			usleep(200);
	}
}

static inline struct ferry_sqe *cf_ag_sqe(struct cf_agent *a)
{
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;
	int64_t end = t_now() + 10 * SEC * cf_slow();

	if (ferry_sq_get(a->e, &sq))
		return NULL;
	while (!(sqe = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq);
		cf_pump_all(a);
		if (t_now() > end)
			return NULL;
	}
	return sqe;
}

static inline void cf_ag_submit(struct cf_agent *a)
{
	struct ferry_sq *sq = NULL;

	if (ferry_sq_get(a->e, &sq) == 0)
		ferry_sq_submit(sq);
}

/* The source of a PUT of r->size bytes of r->seed, as mode says; 0 or -ENOMEM. */
static inline int cf_put_source(struct cf_agent *a, struct cf_rec *r, struct ferry_buf **buf)
{
	*buf = NULL;
	if (r->mode == CF_BUF) {
		int rc = ferry_buf_alloc(a->e, r->size, buf);

		if (rc)
			return rc;
		cf_fill(ferry_buf_data(*buf), r->size, r->seed);
		return 0;
	}
	r->mem = malloc(r->size + 48);
	if (!r->mem)
		return -ENOMEM;
	memset(r->mem, 0x77, r->size + 48);
	if (r->mode == CF_GATHER) {
		uint8_t *tmp = malloc(r->size ? r->size : 1);
		size_t at = 0;

		if (!tmp)
			return -ENOMEM;
		cf_fill(tmp, r->size, r->seed);
		r->iovcnt = cf_segments(r->mem, r->size, r->iov);
		for (unsigned s = 0; s < r->iovcnt; s++) {
			memcpy(r->iov[s].iov_base, tmp + at, r->iov[s].iov_len);
			at += r->iov[s].iov_len;
		}
		free(tmp);
	} else if (r->size) {
		cf_fill(r->mem, r->size, r->seed);
		r->iov[0] = (struct iovec){ r->mem, r->size };
		r->iovcnt = 1;
	} /* else nothing: no iovec at all (NULL, 0), as an empty PUT may be */
	return 0;
}

static inline void cf_ag_put(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep,
			     bool stream)
{
	struct cf_rec *r = cf_rec_new(a, stream ? CF_SPUT : CF_PUT, m->ud);
	struct ferry_sqe *sqe;
	struct ferry_buf *buf;

	if (!r || m->slot < 0 || m->slot >= CF_SLOTS) {
		rep->rc = -EINVAL;
		return;
	}
	r->mode = m->mode;
	r->size = m->size;
	r->seed = m->seed;
	rep->rc = cf_put_source(a, r, &buf);
	if (rep->rc || !(sqe = cf_ag_sqe(a))) {
		if (buf)
			ferry_buf_release(buf);
		cf_rec_free(r);
		rep->rc = rep->rc ? rep->rc : -EBUSY;
		return;
	}
	if (stream && buf)
		ferry_prep_stream_put_buf(sqe, a->peer[m->slot], m->key, buf, cf_rec_token(a, r));
	else if (stream)
		ferry_prep_stream_put(sqe, a->peer[m->slot], m->key, r->iovcnt ? r->iov : NULL,
				      r->iovcnt, cf_rec_token(a, r));
	else if (buf)
		ferry_prep_put_buf(sqe, a->peer[m->slot], m->key, buf, cf_rec_token(a, r));
	else
		ferry_prep_put(sqe, a->peer[m->slot], m->key, r->iovcnt ? r->iov : NULL, r->iovcnt,
			       cf_rec_token(a, r));
	ferry_sqe_set_flags(sqe, m->flags);
	ferry_sqe_set_timeout(sqe, m->timeout_ns);
	cf_ag_submit(a);
}

static inline void cf_ag_get(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	struct cf_rec *r = cf_rec_new(a, CF_GET, m->ud);
	struct ferry_sqe *sqe;

	if (!r) {
		rep->rc = -EINVAL;
		return;
	}
	r->mode = m->mode;
	r->size = m->size;
	r->seed = m->seed;
	r->cap = m->cap;
	r->hold = m->hold;
	if (r->mode != CF_ZC) {
		r->mem = malloc(r->cap + 48);
		if (!r->mem) {
			cf_rec_free(r);
			rep->rc = -ENOMEM;
			return;
		}
		memset(r->mem, 0x5a, r->cap + 48);
		if (r->mode == CF_SCATTER) {
			r->iovcnt = cf_segments(r->mem, r->cap, r->iov);
		} else {
			r->iov[0] = (struct iovec){ r->mem, r->cap };
			r->iovcnt = 1;
		}
	}
	sqe = cf_ag_sqe(a);
	if (!sqe) {
		cf_rec_free(r);
		rep->rc = -EBUSY;
		return;
	}
	ferry_prep_get(sqe, a->peer[m->slot], m->key, r->iovcnt ? r->iov : NULL, r->iovcnt,
		       cf_rec_token(a, r));
	ferry_sqe_set_flags(sqe, m->flags);
	ferry_sqe_set_timeout(sqe, m->timeout_ns);
	cf_ag_submit(a);
}

/* STREAM_GET, STREAM_ACCEPT, STREAM_ABORT, CANCEL, CLEANUP. */
static inline void cf_ag_misc(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	struct cf_rec *r = cf_rec_new(a, (uint8_t)m->op, m->ud);
	struct ferry_peer *p = m->slot >= 0 && m->slot < CF_SLOTS ? a->peer[m->slot] : NULL;
	struct ferry_sqe *sqe;
	uint64_t target = 0;

	if (!r) {
		rep->rc = -EINVAL;
		return;
	}
	r->seed = m->seed;
	r->spec = m->spec;
	r->n = (unsigned)m->n;
	r->next = m->op == CF_SGET ? (unsigned)m->arg : 0; /* the first chunk it reads */
	r->hold = m->hold;
	r->flags = m->flags;
	if (m->op == CF_CANCEL) { /* the op of ours with that ud, the newest */
		for (unsigned i = 0; i < CF_RECS; i++)
			if (a->recs[i].used && &a->recs[i] != r && a->recs[i].ud == m->arg)
				target = i + 1;
		if (!target)
			target = 0xdead0000ull + m->arg; /* none: the engine says -ENOENT */
	}
	if (m->op == CF_SABORT) { /* the reason must outlive the SQE until it is taken */
		r->mem = (uint8_t *)strdup(m->text);
		if (!r->mem) {
			cf_rec_free(r);
			rep->rc = -ENOMEM;
			return;
		}
	}
	sqe = cf_ag_sqe(a);
	if (!sqe) {
		cf_rec_free(r);
		rep->rc = -EBUSY;
		return;
	}
	switch (m->op) {
	case CF_SGET:
		ferry_prep_stream_get(sqe, p, m->key, cf_rec_token(a, r));
		break;
	case CF_ACCEPT:
		ferry_prep_stream_accept(sqe, p, cf_rec_token(a, r));
		break;
	case CF_SABORT:
		ferry_prep_stream_abort(sqe, p, m->key, (const char *)r->mem, cf_rec_token(a, r));
		break;
	case CF_CANCEL:
		ferry_prep_cancel(sqe, target, cf_rec_token(a, r));
		break;
	default:
		ferry_prep_cleanup(sqe, p, m->key, cf_rec_token(a, r));
		break;
	}
	ferry_sqe_set_flags(sqe, m->flags);
	ferry_sqe_set_timeout(sqe, m->timeout_ns);
	cf_ag_submit(a);
}

static inline void cf_ag_release(struct cf_agent *a, uint64_t n, struct cf_rep *rep)
{
	unsigned k = n == 0 || n > a->nheld ? a->nheld : (unsigned)n;

	for (unsigned i = 0; i < k; i++)
		if (ferry_buf_release(a->held[i].b))
			cf_fault(a, "a held buffer could not be released", i);
	memmove(a->held, a->held + k, (a->nheld - k) * sizeof(a->held[0]));
	a->nheld -= k;
	rep->rc = (int)k;
}

static inline void cf_ag_unfill(struct cf_agent *a)
{
	while (a->nfill)
		ferry_buf_release(a->fill[--a->nfill]);
}

/*
 * The engine goes; ops still in flight are forgotten. Leaving cleanly, what
 * the application held is released first. Dying (in this process: a death
 * is the engine's destroy), the engine goes first, as if the process had:
 * no credit, no RELEASE reaches a peer from a stream record that is gone;
 * the buffers, which outlive their engine, are released after it.
 */
static inline int cf_ag_down(struct cf_agent *a, bool dying)
{
	struct cf_rep r;
	int rc = 0;

	if (!dying) {
		cf_ag_release(a, 0, &r);
		cf_ag_unfill(a);
	}
	if (a->e) {
		if (!dying) {
			a->frozen = false;
			cf_ag_pump(a, 0);
			cf_ag_release(a, 0, &r);
		}
		rc = ferry_engine_destroy(a->e);
	}
	a->e = NULL;
	cf_ag_release(a, 0, &r);
	cf_ag_unfill(a);
	for (unsigned i = 0; i < CF_RECS; i++)
		if (a->recs[i].used)
			cf_rec_free(&a->recs[i]);
	a->qhead = a->qlen = 0;
	memset(a->peer, 0, sizeof(a->peer));
	return rc;
}

static inline long long cf_ag_health(struct cf_agent *a, const char *section, const char *name)
{
	static char h[65536];
	char want[CF_ADDR_MAX + 8];
	const char *c, *v;

	if (!a->e || ferry_engine_health(a->e, h, sizeof(h)) >= (int)sizeof(h))
		return -1;
	c = strstr(h, section);
	snprintf(want, sizeof(want), "\"%s\":", name);
	v = c ? strstr(c, want) : NULL;
	return v ? atoll(v + strlen(want)) : -1;
}

/* The completion in a's queue at position k (0 = oldest), taken out. */
static inline struct cf_done cf_q_take(struct cf_agent *a, unsigned k)
{
	struct cf_done d = a->q[(a->qhead + k) % CF_QUEUE];

	for (unsigned i = k; i + 1 < a->qlen; i++)
		a->q[(a->qhead + i) % CF_QUEUE] = a->q[(a->qhead + i + 1) % CF_QUEUE];
	a->qlen--;
	return d;
}

/* Wait for the first queued completion that match(d) accepts; -1 after timeout. */
static inline int cf_q_find(struct cf_agent *a, uint64_t lo, uint64_t hi, int64_t timeout,
			    struct cf_done *out)
{
	int64_t end = t_now() + timeout;

	for (;;) {
		for (unsigned k = 0; k < a->qlen; k++) {
			const struct cf_done *d = &a->q[(a->qhead + k) % CF_QUEUE];

			if (d->ud >= lo && d->ud <= hi) {
				*out = cf_q_take(a, k);
				return 0;
			}
		}
		if (t_now() > end)
			return -1;
		cf_pump_all(a);
	}
}

static inline void cf_ag_seq(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	int64_t end = t_now() + (int64_t)m->timeout_ns;
	bool *seen = m->mode == CF_SEQ_ANY ? calloc(m->n ? m->n : 1, 1) : NULL;

	rep->rc = 0;
	for (uint64_t k = 0; k < m->n; k++) {
		struct cf_done d;
		uint64_t lo = m->ud;
		uint64_t hi = m->mode == CF_SEQ_CHUNKS ? m->ud : m->ud + m->n - 1;
		int64_t want;
		bool good;

		if (cf_q_find(a, lo, hi, end - t_now(), &d)) {
			snprintf(rep->text, sizeof(rep->text), "%llu of %llu completions came",
				 (unsigned long long)k, (unsigned long long)m->n);
			rep->rc = -ETIME;
			break;
		}
		switch (m->mode) {
		case CF_SEQ_CHUNKS:
			good = d.res == (int64_t)(m->arg + k) && d.ok &&
			       !!(d.flags & FERRY_CQE_F_MORE) == !(m->flags && k + 1 == m->n);
			break;
		case CF_SEQ_ORDER:
			good = d.ud == m->ud + k && d.res == m->expect && d.ok;
			break;
		default:
			want = m->expect == CF_RES_INDEX ? (int64_t)(d.ud - m->arg) : m->expect;
			good = !seen[d.ud - m->ud] && d.res == want && d.ok;
			seen[d.ud - m->ud] = true;
			break;
		}
		if (!good) {
			snprintf(rep->text, sizeof(rep->text),
				 "completion %llu: op %llu res %d (%s) len %llu flags %x ok %d",
				 (unsigned long long)k, (unsigned long long)d.ud, d.res,
				 ferry_err_name(d.res), (unsigned long long)d.len, d.flags, d.ok);
			rep->d = d;
			rep->rc = -EBADMSG;
			break;
		}
	}
	free(seen);
}

static inline void cf_ag_create(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;

	p.name = m->key;
	p.ns = CF_NS;
	p.pool_size = m->pool;
	p.max_keys = m->max_keys;
	p.spin_ns = 20000;
	p.handshake_ms = t_handshake_ms(); /* handshakes are not what the suite tests */
	p.progress = m->manual ? FERRY_PROGRESS_MANUAL : cf_t->progress;
	if (cf_t->params)
		cf_t->params(&p, m->text[0] ? m->text : NULL);
	a->manual = p.progress == FERRY_PROGRESS_MANUAL;
	a->frozen = false;
	rep->rc = ferry_engine_create(&p, &a->e);
	if (rep->rc) {
		a->e = NULL;
		return;
	}
	a->addr[0] = '\0';
	if ((cf_t->address ? cf_t->address : ferry_engine_address)(a->e, a->addr,
								   sizeof(a->addr)) < 0)
		a->addr[0] = '\0';
	snprintf(rep->text, sizeof(rep->text), "%s", a->addr);
}

static inline void cf_ag_peer(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	struct ferry_peer *p = NULL;

	if (m->slot < 0 || m->slot >= CF_SLOTS) {
		rep->rc = -EINVAL;
		return;
	}
	rep->rc = ferry_peer_open(a->e, m->text, &p);
	if (!rep->rc && m->arg == 1 && cf_t->ghost)
		rep->rc = cf_t->ghost(p);
	else if (!rep->rc && m->text2[0] && cf_t->link)
		rep->rc = cf_t->link(p, m->text2);
	if (!rep->rc && (m->lim_stream || m->lim_peer))
		rep->rc = ferry_peer_set_stream_limits(p, m->lim_stream, m->lim_peer);
	a->peer[m->slot] = p;
}

/*
 * A run of n PUTs or GETs in one command: item i has the key m->key
 * formatted with arg + i (one %u), user_data ud + i, seed seed + i and, when
 * size is 0, cf_small_len(arg + i) bytes (a GET then expects that much).
 */
static inline void cf_run(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	struct cf_msg one = *m;

	one.n = 1;
	for (uint64_t i = 0; i < m->n && rep->rc == 0; i++) {
		snprintf(one.key, sizeof(one.key), m->key, (unsigned)(m->arg + i));
		one.ud = m->ud + i;
		one.seed = m->seed + i;
		one.size = m->size ? m->size : cf_small_len(m->arg + i);
		one.cap = m->cap ? m->cap : one.size;
		if (m->op == CF_PUT)
			cf_ag_put(a, &one, rep, false);
		else
			cf_ag_get(a, &one, rep);
	}
}

/*
 * What a failing case prints of an agent: its ops in flight, the
 * completions nobody asked for yet, what it holds, and the end of what
 * ferry logged in its process (at INFO and above).
 */
static inline void cf_ag_dump(struct cf_agent *a, char *out, size_t len)
{
	size_t at = 0;
	unsigned shown = 0;

#define CF_PUTS(...)                                                                       \
	do {                                                                               \
		int w_ = snprintf(out + at, len - at, __VA_ARGS__);                        \
		at = w_ < 0 ? at : at + (size_t)w_ < len ? at + (size_t)w_ : len - 1;       \
	} while (0)
	CF_PUTS("engine %s; in flight:", a->e ? ferry_engine_name(a->e) : "(none)");
	for (unsigned i = 0; i < CF_RECS && shown < 24; i++)
		if (a->recs[i].used) {
			CF_PUTS(" %llu(%u)", (unsigned long long)a->recs[i].ud, a->recs[i].op);
			shown++;
		}
	CF_PUTS("; queued:");
	for (unsigned k = 0; k < a->qlen && k < 24; k++) {
		const struct cf_done *d = &a->q[(a->qhead + k) % CF_QUEUE];

		CF_PUTS(" %llu=%d", (unsigned long long)d->ud, d->res);
	}
	CF_PUTS("; held %u, filled %u", a->nheld, a->nfill);
	pthread_mutex_lock(&t_log_lock);
	if (t_log_len) {
		size_t from = t_log_len > 1800 ? t_log_len - 1800 : 0;

		CF_PUTS("\n  log: %.*s", (int)(t_log_len - from), t_log_buf + from);
	}
	pthread_mutex_unlock(&t_log_lock);
#undef CF_PUTS
}

/* Run one command on agent a. */
static inline void cf_ag_exec(struct cf_agent *a, const struct cf_msg *m, struct cf_rep *rep)
{
	memset(rep, 0, sizeof(*rep));
	if (!a->e && m->op != CF_CREATE && m->op != CF_EXIT && m->op != CF_DESTROY) {
		rep->rc = -ENODEV;
		return;
	}
	switch (m->op) {
	case CF_CREATE:
		cf_ag_create(a, m, rep);
		break;
	case CF_PEER:
		cf_ag_peer(a, m, rep);
		break;
	case CF_PUT:
	case CF_GET:
		if (m->n > 1) {
			cf_run(a, m, rep);
			break;
		}
		if (m->op == CF_PUT)
			cf_ag_put(a, m, rep, false);
		else
			cf_ag_get(a, m, rep);
		break;
	case CF_SPUT:
		cf_ag_put(a, m, rep, true);
		break;
	case CF_SGET:
	case CF_SABORT:
	case CF_ACCEPT:
	case CF_CANCEL:
	case CF_CLEANUP:
		cf_ag_misc(a, m, rep);
		break;
	case CF_WAIT:
		rep->rc = cf_q_find(a, m->arg ? 0 : m->ud, m->arg ? UINT64_MAX : m->ud,
				    (int64_t)m->timeout_ns, &rep->d);
		if (rep->rc)
			rep->rc = -ETIME;
		break;
	case CF_SEQ:
		cf_ag_seq(a, m, rep);
		break;
	case CF_NONE: {
		int64_t end = t_now() + (int64_t)m->timeout_ns;

		do
			cf_pump_all(a);
		while (t_now() < end && a->qlen == 0);
		rep->rc = (int)a->qlen;
		if (a->qlen)
			rep->d = a->q[a->qhead];
		break;
	}
	case CF_RELEASE:
		cf_ag_release(a, m->n, rep);
		break;
	case CF_VERIFY:
		for (unsigned i = 0; i < a->nheld; i++)
			rep->rc += !(ferry_buf_len(a->held[i].b) == a->held[i].size &&
				     cf_check(ferry_buf_data(a->held[i].b), a->held[i].size,
					      a->held[i].seed));
		rep->num = a->nheld;
		break;
	case CF_FILL:
		for (size_t sz = 64 * CF_KIB; sz >= 64; sz /= 4)
			while (a->nfill < CF_FILLS &&
			       ferry_buf_alloc(a->e, sz, &a->fill[a->nfill]) == 0)
				a->nfill++;
		rep->rc = (int)a->nfill;
		rep->num = cf_ag_health(a, "\"pool\":{", "largest_free");
		break;
	case CF_UNFILL:
		cf_ag_unfill(a);
		break;
	case CF_HEALTH:
		rep->num = cf_ag_health(a, m->text, m->text2);
		break;
	case CF_FREEZE:
		a->frozen = true;
		break;
	case CF_THAW:
		a->frozen = false;
		break;
	case CF_CARRIER: { /* the peer's entry, then the first "transport" in it */
		static char h[65536];
		char want[FERRY_NAME_MAX + 16];
		const char *at, *tr = NULL;
		size_t n;

		snprintf(want, sizeof(want), "{\"name\":\"%.63s\",", m->text);
		if (ferry_engine_health(a->e, h, sizeof(h)) < (int)sizeof(h) &&
		    (at = strstr(h, want)))
			tr = strstr(at, "\"transport\":\"");
		if (!tr) {
			rep->rc = -ENOENT;
			break;
		}
		tr += strlen("\"transport\":\"");
		n = strcspn(tr, "\"");
		snprintf(rep->text, sizeof(rep->text), "%.*s", (int)n, tr);
		break;
	}
	case CF_DUMP:
		cf_ag_dump(a, rep->dump, sizeof(rep->dump));
		break;
	case CF_DESTROY:
	case CF_EXIT:
		rep->rc = cf_ag_down(a, m->op == CF_DESTROY);
		break;
	default:
		rep->rc = -EINVAL;
		break;
	}
	rep->broken = a->broken[0] != '\0';
	if (rep->broken)
		snprintf(rep->text, sizeof(rep->text), "%s", a->broken);
}

/* A child's life: commands from sock until CF_EXIT or its end; between them, drive. */
static inline int cf_agent_main(int sock)
{
	struct cf_agent *a;
	bool broken;

	memset(cf_locals, 0, sizeof(cf_locals)); /* the parent's agents are not ours */
	t_log_capture(FERRY_LOG_INFO); /* for cf_ag_dump */
	a = cf_ag_new();
	cf_ag_local(a, true);
	for (;;) {
		struct pollfd pd = { .fd = sock, .events = POLLIN };
		struct cf_msg m;
		struct cf_rep rep;
		ssize_t n;

		if (t_poll(&pd, 1, a->e && !a->frozen ? 1 : 20) == 1) {
			n = t_recv(sock, &m, sizeof(m), 0);
			if (n != (ssize_t)sizeof(m))
				break; /* the test is gone */
			cf_ag_exec(a, &m, &rep);
			if (t_send(sock, &rep, sizeof(rep), MSG_NOSIGNAL) != (ssize_t)sizeof(rep))
				break;
			if (m.op == CF_EXIT)
				break;
		}
		cf_ag_pump(a, 0);
	}
	cf_ag_down(a, false);
	broken = a->broken[0] != '\0';
	if (broken)
		fprintf(stderr, "conformance agent: %s\n", a->broken);
	cf_ag_local(a, false);
	free(a->recs);
	free(a->q);
	free(a->fill);
	free(a);
	return broken ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* Ends                                                                */
/* ------------------------------------------------------------------ */

struct cf_end {
	const char *name;      /* its engine's name */
	bool remote;           /* its agent runs in a child */
	bool up;               /* its engine exists */
	bool killed;           /* it was killed (a child: SIGKILL; here: destroyed) */
	int sock;              /* remote: our side of the socketpair */
	pid_t pid;
	struct cf_agent *ag;   /* in this process */
	char addr[CF_ADDR_MAX]; /* its address (cf_transport.address), "" if none */
	char addr_before[CF_ADDR_MAX]; /* the address of the incarnation before */
};

/* Every socket of ours to an agent: a new child closes the others. */
static int cf_socks[8];
static unsigned cf_nsocks;

static inline void cf_fork_agent(struct cf_end *x, const char *name)
{
	int sv[2];

	memset(x, 0, sizeof(*x));
	x->name = name;
	x->remote = true;
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	fflush(stdout);
	fflush(stderr);
	x->pid = fork();
	assert_true(x->pid >= 0);
	if (x->pid == 0) {
		for (unsigned i = 0; i < cf_nsocks; i++)
			close(cf_socks[i]);
		close(sv[0]);
		alarm(t_under_valgrind() ? 1200 : 150);
		exit(cf_agent_main(sv[1])); /* exit(): LeakSanitizer looks at the child too */
	}
	close(sv[1]);
	x->sock = sv[0];
	assert_true(cf_nsocks < 8);
	cf_socks[cf_nsocks++] = sv[0];
}

static inline void cf_local_agent(struct cf_end *x, const char *name)
{
	memset(x, 0, sizeof(*x));
	x->name = name;
	x->ag = cf_ag_new();
	cf_ag_local(x->ag, true);
}

/*
 * Run command m at end x; wait_ns: how long the command itself may take.
 * A child that is gone, or a fault the agent saw, fails the case.
 */
static inline struct cf_rep cf_call_at(struct cf_end *x, struct cf_msg *m, int line)
{
	struct cf_rep rep;

	memset(&rep, 0, sizeof(rep));
	if (x->remote) {
		struct pollfd pd = { .fd = x->sock, .events = POLLIN };
		int64_t bound = (int64_t)m->timeout_ns + 30 * SEC * cf_slow();

		int64_t end = t_now() + bound;

		if (t_send(x->sock, m, sizeof(*m), MSG_NOSIGNAL) != (ssize_t)sizeof(*m))
			fail_msg("line %d: the %s agent is gone (%s)", line, x->name,
				 strerror(errno));
		/* Meanwhile our own agents take what comes (and release what they do not keep). */
		while (t_poll(&pd, 1, 1) != 1) {
			if (t_now() > end)
				fail_msg("line %d: no answer from the %s agent (command %u)", line,
					 x->name, m->op);
			for (unsigned i = 0; i < 4; i++)
				if (cf_locals[i])
					cf_ag_pump(cf_locals[i], 0);
		}
		if (t_recv(x->sock, &rep, sizeof(rep), 0) != (ssize_t)sizeof(rep))
			fail_msg("line %d: the %s agent is gone (command %u)", line, x->name,
				 m->op);
	} else {
		cf_ag_exec(x->ag, m, &rep);
	}
	if (rep.broken)
		fail_msg("line %d: the %s agent: %s", line, x->name, rep.text);
	return rep;
}
#define cf_call(x, m) cf_call_at(x, m, __LINE__)

/* End x makes its engine (name x->name); prev: the address of the incarnation before. */
static inline void cf_end_create(struct cf_end *x, size_t pool, uint32_t max_keys, bool manual,
				 const char *prev)
{
	struct cf_msg m = { .op = CF_CREATE, .pool = pool, .max_keys = max_keys, .manual = manual };
	struct cf_rep r;

	snprintf(m.key, sizeof(m.key), "%s", x->name);
	snprintf(m.text, sizeof(m.text), "%s", prev ? prev : "");
	r = cf_call(x, &m);
	if (r.rc)
		fail_msg("engine %s: %s", x->name, ferry_strerror(r.rc));
	snprintf(x->addr, sizeof(x->addr), "%s", r.text);
	x->up = true;
	x->killed = false;
}

/* Slot `slot` of end x: the peer handle of engine `name` at addr (or a ghost). */
static inline void cf_end_peer(struct cf_end *x, int slot, const char *name, const char *addr,
			       bool ghost, uint32_t lim_stream, uint32_t lim_peer)
{
	struct cf_msg m = { .op = CF_PEER, .slot = slot, .arg = ghost, .lim_stream = lim_stream,
			    .lim_peer = lim_peer };
	struct cf_rep r;

	snprintf(m.text, sizeof(m.text), "%s", name);
	snprintf(m.text2, sizeof(m.text2), "%s", addr ? addr : "");
	r = cf_call(x, &m);
	if (r.rc)
		fail_msg("peer %s of %s: %s", name, x->name, ferry_strerror(r.rc));
}

/* End x goes: a child is killed (SIGKILL), an agent here releases all and destroys. */
static inline void cf_end_kill(struct cf_end *x)
{
	if (x->remote) {
		assert_int_equal(kill(x->pid, SIGKILL), 0);
		assert_int_equal(t_reap(x->pid), 128 + SIGKILL);
		close(x->sock);
		x->sock = -1;
		x->pid = 0;
	} else {
		struct cf_msg m = { .op = CF_DESTROY };

		assert_int_equal(cf_call(x, &m).rc, 0);
	}
	x->up = false;
	x->killed = true;
}

/* End x leaves cleanly: its engine is destroyed, a child exits 0. */
static inline void cf_end_exit(struct cf_end *x)
{
	struct cf_msg m = { .op = CF_EXIT };

	if (x->remote && x->pid > 0) {
		struct cf_rep r = cf_call(x, &m);

		assert_int_equal(r.rc, 0);
		assert_int_equal(t_reap(x->pid), 0);
		close(x->sock);
		x->pid = 0;
	} else if (x->ag) {
		assert_int_equal(cf_call(x, &m).rc, 0);
		cf_ag_local(x->ag, false);
		free(x->ag->recs);
		free(x->ag->q);
		free(x->ag->fill);
		free(x->ag);
		x->ag = NULL;
	}
	x->up = false;
}

#endif

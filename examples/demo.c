/*
 * examples/demo.c - `./run demo`: a three-stage pipeline in three processes,
 * shaped like Qwen-Omni, and a Bagel-like KV-cache handoff.
 *
 *   thinker --(hidden states, ~1 MiB chunks)--> talker --(codec, 25 frames
 *   per chunk, a few KiB)--> code2wav
 *
 * N requests run at once. For each request the thinker opens a stream to
 * the talker ("{req}_0", chunks "{req}_0_{n}" like upstream) and sends its
 * hidden-state chunks from pool buffers (zero copy). The talker learns of
 * new requests with STREAM_ACCEPT (no polling), reads each with one
 * multishot STREAM_GET, checks every chunk, and turns each hidden chunk
 * into codec chunks on its own stream to code2wav ("{req}_1"); code2wav
 * does the same and checks everything. Credits bound what is in flight per
 * stream (--inflight). The pace of these streams is the simulated model's:
 * the thinker fills every chunk (its "model output") and sleeps --pace-us
 * after each round of requests; ferry's own part is measured beside it.
 *
 * Then two more processes, "ar" and "dit", hand over a 190 MB KV set as
 * 2 x 28 layer buffers, twice: the AR fills 56 pool buffers (before the
 * clock) and PUTs them, zero copy; the DiT's GETs, posted before the
 * clock, first take the buffers as they are (zero copy), then, for the
 * second set, copy each layer into DiT memory allocated and touched before
 * the clock. The clock runs from the AR's first PUT submit to the DiT's
 * last GET completion; every byte is checked afterwards.
 *
 * Clocks: every time is CLOCK_MONOTONIC, one clock for every process of a
 * host (the demo's processes all run on one host, tcp on loopback too), so
 * a time taken by one process may be subtracted from one taken by another.
 * Every chunk carries a header (request, index, send time, checksum of the
 * payload). A receiver notes when ferry_cq_wait returned each chunk, and
 * when its own work (checking chunks, making codec chunks) last ended: a
 * chunk submitted after that found the consumer with nothing to do but wait
 * for ferry, and its submit -> returned time is ferry's own latency (nothing
 * of the simulated model is in it); the other chunks also waited for the
 * consumer to finish earlier ones. A line of progress is printed while it
 * runs, then a table per part and a legend saying what each column measures.
 *
 * Usage: demo [--requests N] [--chunks M] [--inflight K] [--transport shm|tcp]
 *             [--kv-mib S] [--pace-us U] [--quiet] [--help]
 * Exit status: 0 if every byte arrived intact, 1 otherwise, 2 for bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ferry.h>

#define HIDDEN_BYTES (1u << 20)     /* one hidden-state chunk */
#define FRAMES_PER_CODEC 25
#define FRAME_BYTES 96              /* 16 codebooks x 3 bytes x 2 */
#define CODEC_PER_HIDDEN 4          /* codec chunks made from one hidden chunk */
#define KV_LAYERS 28                /* x 2 (K and V) layer buffers */
#define KV_BUFS (2 * KV_LAYERS)
#define MAGIC 0x6f6d6e6966657272ull /* "omniferr" */
#define SEC 1000000000ull
#define MAX_REQ 256
#define MAX_SAMPLES 65536

struct chunk_hdr {
	uint64_t magic;
	uint32_t req, index;
	uint64_t len;        /* payload bytes after the header */
	uint64_t sent_ns;    /* when the producer submitted it */
	uint64_t opened_ns;  /* when the producer opened the stream */
	uint64_t sum;        /* of the payload */
};

/* What one edge saw at its receiving end. */
struct edge_stats {
	_Atomic uint64_t chunks, bytes;
	uint64_t first_send_ns, last_recv_ns;
	uint32_t nlat, nttfc;
	uint32_t lat_ns[MAX_SAMPLES];     /* ferry's latency: chunks that found the consumer idle */
	uint32_t ttfc_us[MAX_REQ];        /* time to first chunk, per request */
	_Atomic uint32_t bad;
	_Atomic uint32_t streams_done;
	_Atomic int sender_done; /* every put of the sender completed (its results came back) */
};

/* The two rounds of the KV handoff: the same PUTs, two kinds of GET. */
enum { KV_ZC, KV_COPY, KV_ROUNDS };

struct kv_round {
	_Atomic int gets_posted; /* the DiT's 56 GETs are waiting */
	_Atomic int verified;    /* the DiT checked every byte (and released the buffers) */
	uint64_t submit_ns;      /* AR: just before the first PUT is submitted */
	uint64_t puts_done_ns;   /* AR: the last PUT's completion */
	uint64_t gets_done_ns;   /* DiT: ferry_cq_wait returned the last GET's completion */
	uint64_t bytes;          /* DiT: what its GETs received */
};

/* Shared by every process of the demo (an anonymous shared mapping). */
struct shared {
	struct edge_stats edge[2];        /* thinker->talker, talker->code2wav */
	_Atomic uint32_t failures;
	char fail_msg[256];
	struct kv_round kv[KV_ROUNDS];
	/* --transport tcp: where each receiving engine listens (talker, code2wav, dit). */
	char addr[3][128];
	_Atomic int addr_ready[3];
	/* Each receiving engine can take what is sent to it (see open_peer). */
	_Atomic int ready[3];
};

static struct {
	int requests, chunks, inflight, kv_mib, pace_us;
	bool quiet, tcp;
	char ns[64];
	struct shared *sh;
} cfg = { .requests = 8, .chunks = 16, .inflight = 4, .kv_mib = 190, .pace_us = 2000 };

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* A word-at-a-time checksum (the payload sizes are multiples of 8). */
static uint64_t checksum(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n / 8; i++)
		h = (h ^ w[i]) * 0x100000001b3ull;
	return h;
}

static void fill_payload(void *p, size_t n, uint64_t seed)
{
	uint64_t *w = p, x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[i] = x;
	}
}

/* Whether p holds exactly what fill_payload(p, n, seed) wrote: every byte checked. */
static bool payload_ok(const void *p, size_t n, uint64_t seed)
{
	const uint64_t *w = p;
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1, diff = 0;

	for (size_t i = 0; i < n / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		diff |= w[i] ^ x;
	}
	return diff == 0;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	if (atomic_fetch_add(&cfg.sh->failures, 1) == 0) {
		va_start(ap, fmt);
		vsnprintf(cfg.sh->fail_msg, sizeof(cfg.sh->fail_msg), fmt, ap);
		va_end(ap);
	}
}

/* The receiving engines, by the slot of their address in struct shared. */
static int addr_slot(const char *name)
{
	return !strcmp(name, "talker") ? 0 : !strcmp(name, "code2wav") ? 1 : !strcmp(name, "dit") ? 2
														 : -1;
}

static struct ferry_engine *make_engine(const char *name, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int slot = addr_slot(name), rc;

	p.name = name;
	p.ns = cfg.ns;
	p.pool_size = pool;
	if (cfg.tcp) {
		/* Receivers listen (the kernel picks the port); everyone proves the secret. */
		p.listen = slot >= 0 ? "tcp://127.0.0.1:0" : NULL;
		p.secret = "ferry-demo-cluster-secret";
	}
	rc = ferry_engine_create(&p, &e);
	if (rc) {
		fail("%s: ferry_engine_create: %s", name, ferry_strerror(rc));
		return NULL;
	}
	if (cfg.tcp && slot >= 0) {
		rc = ferry_engine_address(e, cfg.sh->addr[slot], sizeof(cfg.sh->addr[slot]));
		if (rc < 0 || (size_t)rc >= sizeof(cfg.sh->addr[slot])) {
			fail("%s: ferry_engine_address: %s", name, ferry_strerror(rc));
			ferry_engine_destroy(e);
			return NULL;
		}
		atomic_store(&cfg.sh->addr_ready[slot], 1);
	}
	return e;
}

/* A receiving engine says that it can take what is sent to it. */
static void say_ready(struct ferry_engine *e)
{
	atomic_store(&cfg.sh->ready[addr_slot(ferry_engine_name(e))], 1);
}

/* Wait (10 s at most) for flag, set by another process. */
static bool wait_flag(_Atomic int *flag)
{
	for (int i = 0; i < 10000 && !atomic_load(flag) && !atomic_load(&cfg.sh->failures); i++)
		usleep(1000);
	return atomic_load(flag);
}

/*
 * The peer `name`. to_send: we send to it, so first wait until it is ready
 * (say_ready): a PUT to a name that no engine holds yet fails at once with
 * -EHOSTUNREACH, and the processes start in no particular order.
 */
static struct ferry_peer *open_peer(struct ferry_engine *e, const char *name, bool to_send)
{
	struct ferry_peer *p = NULL;
	int slot = addr_slot(name), rc;

	if (ferry_peer_open(e, name, &p)) {
		fail("%s: peer %s", ferry_engine_name(e), name);
		return NULL;
	}
	ferry_peer_set_stream_limits(p, (uint32_t)cfg.inflight, 0);
	if (cfg.tcp && slot >= 0) {
		/* Reach a receiver at the address it published. */
		if (!wait_flag(&cfg.sh->addr_ready[slot]) ||
		    (rc = ferry_peer_set_address(p, cfg.sh->addr[slot])) < 0) {
			fail("%s: no tcp address for %s", ferry_engine_name(e), name);
			return NULL;
		}
	}
	if (to_send && slot >= 0 && !wait_flag(&cfg.sh->ready[slot])) {
		fail("%s: %s did not get ready within 10 s", ferry_engine_name(e), name);
		return NULL;
	}
	return p;
}

/* An SQE, waiting for room while completions are handled by cb. */
static struct ferry_sqe *get_sqe(struct ferry_engine *e)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;

	if (ferry_sq_get(e, &sq)) {
		fprintf(stderr, "demo: no submission queue\n");
		exit(1);
	}
	while (!(sqe = ferry_sq_get_sqe(sq))) {
		ferry_sq_submit(sq); /* the reactor thread takes them */
		usleep(50);
	}
	return sqe;
}

static void submit(struct ferry_engine *e)
{
	struct ferry_sq *sq;

	if (ferry_sq_get(e, &sq) == 0)
		ferry_sq_submit(sq);
}

/* ------------------------------------------------------------------ */
/* Receiving side bookkeeping                                          */
/* ------------------------------------------------------------------ */

struct rx_req {
	uint32_t next;     /* expected chunk index */
	bool seen_first;
	bool done;
};

/*
 * Check a chunk, count it on edge ei. got_ns is when ferry_cq_wait returned
 * it; idle_ns is when this process last finished work of its own (checking
 * chunks, making codec chunks) before that. Returns its header or NULL.
 */
static const struct chunk_hdr *rx_chunk(int ei, struct rx_req *rq, uint32_t req,
					const struct ferry_cqe *c, uint64_t idle_ns,
					uint64_t got_ns)
{
	struct edge_stats *es = &cfg.sh->edge[ei];
	const struct chunk_hdr *h = ferry_buf_data(c->buf);

	if (c->len < sizeof(*h) || h->magic != MAGIC || h->req != req ||
	    h->index != rq->next || c->len != sizeof(*h) + h->len ||
	    checksum(h + 1, h->len) != h->sum) {
		atomic_fetch_add(&es->bad, 1);
		fail("edge %d: request %u chunk %u (CQE res %d) arrived %s", ei, req, rq->next,
		     c->res,
		     c->len < sizeof(*h) || h->magic != MAGIC ? "without its header"
		     : h->req != req                          ? "under another request"
		     : h->index != rq->next                   ? "out of order"
		     : c->len != sizeof(*h) + h->len          ? "with a wrong length"
							      : "damaged (checksum)");
		return NULL;
	}
	rq->next++;
	if (!rq->seen_first) {
		rq->seen_first = true;
		if (es->nttfc < MAX_REQ)
			es->ttfc_us[es->nttfc++] = (uint32_t)((got_ns - h->opened_ns) / 1000);
		if (!es->first_send_ns || h->opened_ns < es->first_send_ns)
			es->first_send_ns = h->opened_ns;
	}
	/*
	 * Submitted when we had no work of our own left: from its submit until
	 * ferry_cq_wait returned it, this process only waited for ferry (and
	 * took the completions of its own PUTs), so the time is ferry's.
	 */
	if (h->sent_ns >= idle_ns && es->nlat < MAX_SAMPLES) {
		uint64_t d = got_ns - h->sent_ns;

		es->lat_ns[es->nlat++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
	}
	es->last_recv_ns = got_ns;
	atomic_fetch_add(&es->bytes, c->len);
	atomic_fetch_add(&es->chunks, 1);
	return h;
}

static int parse_req(const struct ferry_cqe *c, uint32_t *req)
{
	const char *key = ferry_buf_data(c->buf);

	return sscanf(key, "req%u_", req) == 1 && *req < MAX_REQ ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Stage producers                                                     */
/* ------------------------------------------------------------------ */

/* Send one chunk of stream `stream` (payload n bytes seeded by seed). */
static int send_chunk(struct ferry_engine *e, struct ferry_peer *to, const char *stream,
		      uint32_t req, uint32_t index, size_t n, uint64_t seed, uint64_t opened,
		      bool end)
{
	struct ferry_buf *b;
	struct chunk_hdr *h;
	struct ferry_sqe *sqe;
	int rc;

	/* The pool is full while the consumer holds chunks: wait for its releases. */
	for (int tries = 0; (rc = ferry_buf_alloc(e, sizeof(*h) + n, &b)) == -ENOMEM; tries++) {
		if (tries > 300000 || atomic_load(&cfg.sh->failures))
			return rc;
		usleep(100);
	}
	if (rc)
		return rc;
	h = ferry_buf_data(b);
	fill_payload(h + 1, n, seed);
	h->magic = MAGIC;
	h->req = req;
	h->index = index;
	h->len = n;
	h->opened_ns = opened;
	h->sum = checksum(h + 1, n);
	h->sent_ns = now_ns();
	sqe = get_sqe(e);
	ferry_prep_stream_put_buf(sqe, to, stream, b, ((uint64_t)req << 32) | index);
	ferry_sqe_set_flags(sqe, end ? FERRY_SQE_STREAM_END : 0);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	submit(e);
	return 0;
}

/* Completions of our STREAM_PUTs (waiting up to wait_ns): only failures matter. */
static void drain_puts(struct ferry_engine *e, const char *who, unsigned *done, int64_t wait_ns)
{
	struct ferry_cqe c[64];
	int n;

	while ((n = wait_ns ? ferry_cq_wait(ferry_cq_default(e), c, 64, wait_ns)
			    : ferry_cq_poll(ferry_cq_default(e), c, 64)) > 0) {
		wait_ns = 0;
		for (int i = 0; i < n; i++) {
			if (c[i].res < 0)
				fail("%s: chunk %" PRIu64 " of request %" PRIu64 ": %s", who,
				     c[i].user_data & 0xffffffff, c[i].user_data >> 32,
				     ferry_strerror(c[i].res));
			(*done)++;
		}
	}
}

static int run_thinker(void)
{
	struct ferry_engine *e = make_engine("thinker", 64u << 20);
	struct ferry_peer *to = e ? open_peer(e, "talker", true) : NULL;
	uint64_t opened[MAX_REQ];
	unsigned done = 0, total = (unsigned)(cfg.requests * cfg.chunks);
	char stream[32];

	if (!to)
		return 1;
	for (int r = 0; r < cfg.requests; r++)
		opened[r] = now_ns();
	/* Round robin over the requests: they all run at once. */
	for (int n = 0; n < cfg.chunks; n++) {
		for (int r = 0; r < cfg.requests; r++) {
			snprintf(stream, sizeof(stream), "req%d_0", r);
			if (send_chunk(e, to, stream, (uint32_t)r, (uint32_t)n, HIDDEN_BYTES,
				       ((uint64_t)r << 20) | (uint64_t)n, opened[r],
				       n == cfg.chunks - 1))
				fail("thinker: pool allocation failed");
			drain_puts(e, "thinker", &done, 0);
		}
		if (cfg.pace_us) /* a model makes its hidden states at its own pace */
			usleep((useconds_t)cfg.pace_us);
	}
	while (done < total && !atomic_load(&cfg.sh->failures))
		drain_puts(e, "thinker", &done, 10000000);
	atomic_store(&cfg.sh->edge[0].sender_done, 1);
	/* Stay until the talker released every chunk: they live in our pool. */
	while (atomic_load(&cfg.sh->edge[0].streams_done) < (uint32_t)cfg.requests &&
	       !atomic_load(&cfg.sh->failures))
		usleep(1000);
	ferry_engine_destroy(e);
	return 0;
}

/*
 * A stage that receives streams from `from` on edge ei and, if `to` is
 * set, sends CODEC_PER_HIDDEN codec chunks per chunk received to `to`.
 */
static int run_receiver(const char *name, const char *from_name, const char *to_name, int ei)
{
	struct ferry_engine *e = make_engine(name, 32u << 20);
	struct ferry_peer *from = e ? open_peer(e, from_name, false) : NULL;
	struct ferry_peer *to = e && to_name ? open_peer(e, to_name, true) : NULL;
	static struct rx_req rq[MAX_REQ];
	uint64_t opened[MAX_REQ] = { 0 };
	uint32_t out_next[MAX_REQ] = { 0 };
	struct ferry_sqe *sqe;
	unsigned finished = 0, puts_done = 0, puts_sent = 0;
	uint64_t idle_ns = 0; /* when our own work (checking, making codec chunks) last ended */
	char stream[32];

	if (!from || (to_name && !to))
		return 1;
	sqe = get_sqe(e);
	ferry_prep_stream_accept(sqe, from, 1ull << 63);
	submit(e);
	say_ready(e); /* we learn of every new stream from here on */
	while (finished < (unsigned)cfg.requests && !atomic_load(&cfg.sh->failures)) {
		struct ferry_cqe c[32];
		int n = ferry_cq_wait(ferry_cq_default(e), c, 32, 30 * SEC);
		uint64_t got_ns = now_ns();
		bool worked = false;

		if (n == -ETIMEDOUT) {
			fail("%s: nothing arrived for 30 s", name);
			break;
		}
		for (int i = 0; i < n; i++) {
			uint32_t req = (uint32_t)(c[i].user_data & 0xffffffff);

			if (c[i].user_data == (1ull << 63)) { /* a new request */
				if (c[i].res < 0 || parse_req(&c[i], &req)) {
					fail("%s: STREAM_ACCEPT: %s", name, ferry_strerror(c[i].res));
					continue;
				}
				sqe = get_sqe(e);
				ferry_prep_stream_get(sqe, from, ferry_buf_data(c[i].buf),
						      (1ull << 62) | req);
				ferry_sqe_set_timeout(sqe, 30 * SEC); /* gap between chunks */
				submit(e);
				ferry_buf_release(c[i].buf);
				opened[req] = now_ns();
				continue;
			}
			if (!(c[i].user_data & (1ull << 62))) { /* our own STREAM_PUT */
				if (c[i].res < 0)
					fail("%s: put: %s", name, ferry_strerror(c[i].res));
				puts_done++;
				continue;
			}
			if (c[i].res < 0) {
				fail("%s: request %u: %s", name, req, ferry_strerror(c[i].res));
				if (c[i].buf)
					ferry_buf_release(c[i].buf);
				continue;
			}
			worked = true;
			if (!rx_chunk(ei, &rq[req], req, &c[i], idle_ns, got_ns)) {
				ferry_buf_release(c[i].buf);
				continue;
			}
			if (to) {
				bool last = !(c[i].flags & FERRY_CQE_F_MORE);

				snprintf(stream, sizeof(stream), "req%u_1", req);
				for (int k = 0; k < CODEC_PER_HIDDEN; k++) {
					bool end = last && k == CODEC_PER_HIDDEN - 1;

					if (send_chunk(e, to, stream, req, out_next[req],
						       FRAMES_PER_CODEC * FRAME_BYTES,
						       ((uint64_t)req << 24) | out_next[req], opened[req],
						       end))
						fail("%s: pool allocation failed", name);
					out_next[req]++;
					puts_sent++;
				}
			}
			ferry_buf_release(c[i].buf); /* its credit goes back to the producer */
			if (!(c[i].flags & FERRY_CQE_F_MORE)) {
				finished++;
				atomic_fetch_add(&cfg.sh->edge[ei].streams_done, 1);
			}
		}
		if (worked)
			idle_ns = now_ns();
	}
	while (to && puts_done < puts_sent && !atomic_load(&cfg.sh->failures)) {
		struct ferry_cqe c;

		if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 30 * SEC) != 1) {
			fail("%s: puts did not complete", name);
			break;
		}
		if (c.res < 0)
			fail("%s: put: %s", name, ferry_strerror(c.res));
		if (!(c.user_data >> 62))
			puts_done++;
	}
	if (to)
		atomic_store(&cfg.sh->edge[ei + 1].sender_done, 1);
	while (to && atomic_load(&cfg.sh->edge[ei + 1].streams_done) < (uint32_t)cfg.requests &&
	       !atomic_load(&cfg.sh->failures))
		usleep(1000);
	/*
	 * Stay until our sender has every result: over tcp the last results
	 * (and credits) may still be on their way when the last chunk is read.
	 */
	for (int i = 0; i < 30000 && !atomic_load(&cfg.sh->edge[ei].sender_done) &&
			!atomic_load(&cfg.sh->failures); i++)
		usleep(1000);
	ferry_engine_destroy(e);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Bagel-like AR -> DiT KV handoff                                     */
/* ------------------------------------------------------------------ */

static size_t kv_layer_bytes(void)
{
	return ((size_t)cfg.kv_mib << 20) / KV_BUFS & ~(size_t)63;
}

/* A pool that holds the whole KV set (large blocks are runs of 4 KiB pages). */
static size_t kv_pool_bytes(void)
{
	return KV_BUFS * ((kv_layer_bytes() + 4095) & ~(size_t)4095) + (16u << 20);
}

static uint64_t kv_seed(int round, int layer)
{
	return 0x4b560000u + (uint64_t)round * 0x100 + (uint64_t)layer;
}

static void kv_key(char *out, size_t n, int round, int layer)
{
	snprintf(out, n, "req0_kv%d_L%02d", round, layer);
}

/* Wait for flag (set by the other process), 60 s at most. */
static bool kv_wait(_Atomic int *flag, const char *who, const char *what)
{
	for (int i = 0; i < 60000 && !atomic_load(flag); i++) {
		if (atomic_load(&cfg.sh->failures))
			return false;
		usleep(1000);
	}
	if (!atomic_load(flag))
		fail("%s: %s did not happen within 60 s", who, what);
	return atomic_load(flag);
}

/*
 * Collect n completions (user_data = layer) on e's default CQ into cqes;
 * returns when ferry_cq_wait handed over the last one (its time in *done_ns).
 */
static bool kv_collect(struct ferry_engine *e, const char *who, struct ferry_cqe *cqes, int n,
		       uint64_t *done_ns)
{
	struct ferry_cqe c[KV_BUFS];
	int got = 0;

	while (got < n) {
		int k = ferry_cq_wait(ferry_cq_default(e), c, KV_BUFS, 60 * SEC);

		*done_ns = now_ns();
		if (k < 0) {
			fail("%s: ferry_cq_wait: %s", who, ferry_strerror(k));
			return false;
		}
		for (int i = 0; i < k; i++) {
			if (c[i].user_data >= (uint64_t)n) {
				fail("%s: a completion nobody asked for", who);
				return false;
			}
			cqes[c[i].user_data] = c[i];
			got++;
		}
	}
	return true;
}

/*
 * Bytes of e's pool in use, from its health JSON (the "pool" object), or -1.
 * The AR waits on it for the blocks the DiT released to come home.
 */
static long long pool_in_use(struct ferry_engine *e)
{
	int n = ferry_engine_health(e, NULL, 0);
	char *json = n > 0 ? malloc((size_t)n + 1) : NULL;
	const char *p;
	long long v = -1;

	if (json && ferry_engine_health(e, json, (size_t)n + 1) == n &&
	    (p = strstr(json, "\"pool\":{")) && (p = strstr(p, "\"bytes_in_use\":")))
		v = strtoll(p + strlen("\"bytes_in_use\":"), NULL, 10);
	free(json);
	return v;
}

/* One small PUT before the clock, so that the connection is up, as in a running pipeline. */
static bool kv_hello(struct ferry_engine *e, struct ferry_peer *to)
{
	static uint64_t word = MAGIC;
	struct iovec iov = { &word, sizeof(word) };
	struct ferry_sqe *sqe = get_sqe(e);
	struct ferry_cqe c;
	int n;

	ferry_prep_put(sqe, to, "req0_kv_hello", &iov, 1, 0);
	ferry_sqe_set_timeout(sqe, 30 * SEC);
	submit(e);
	n = ferry_cq_wait(ferry_cq_default(e), &c, 1, 60 * SEC);
	if (n != 1 || c.res < 0) {
		fail("ar: first PUT to the DiT failed: %s", ferry_strerror(n < 0 ? n : c.res));
		return false;
	}
	return true;
}

static int run_ar(void)
{
	size_t lb = kv_layer_bytes();
	struct ferry_engine *e = make_engine("ar", kv_pool_bytes());
	struct ferry_peer *to = e ? open_peer(e, "dit", true) : NULL;
	struct ferry_buf *b[KV_BUFS];
	struct ferry_cqe c[KV_BUFS];
	char key[32];

	if (!to || !kv_hello(e, to))
		return 1;
	for (int r = 0; r < KV_ROUNDS; r++) {
		struct kv_round *kr = &cfg.sh->kv[r];

		/*
		 * The pool holds one KV set: the previous round's blocks come home
		 * as the DiT releases them (over shm it read them in place). Wait
		 * for all of them (nothing else lives in this pool), so that
		 * ferry_buf_alloc neither fails nor logs that the pool is full.
		 */
		if (r > 0) {
			long long used = -1;

			if (!kv_wait(&cfg.sh->kv[r - 1].verified, "ar", "the DiT's check"))
				return 1;
			for (int i = 0; i < 30000 && (used = pool_in_use(e)) != 0 &&
					!atomic_load(&cfg.sh->failures); i++)
				usleep(1000);
			if (used != 0) {
				fail("ar: the DiT's releases did not come home (%lld bytes in use)", used);
				return 1;
			}
		}
		/* Before the clock: the model writes its KV into pool buffers. */
		for (int i = 0; i < KV_BUFS; i++) {
			int rc = ferry_buf_alloc(e, lb, &b[i]);

			if (rc) {
				fail("ar: ferry_buf_alloc of a layer: %s", ferry_strerror(rc));
				return 1;
			}
			fill_payload(ferry_buf_data(b[i]), lb, kv_seed(r, i));
		}
		if (!kv_wait(&kr->gets_posted, "ar", "the DiT's GETs"))
			return 1;
		/* The clock: from here to the DiT's last GET completion. */
		kr->submit_ns = now_ns();
		for (int i = 0; i < KV_BUFS; i++) {
			struct ferry_sqe *sqe = get_sqe(e);

			kv_key(key, sizeof(key), r, i);
			ferry_prep_put_buf(sqe, to, key, b[i], (uint64_t)i); /* zero copy: it moves */
			ferry_sqe_set_timeout(sqe, 60 * SEC);
		}
		submit(e);
		if (!kv_collect(e, "ar", c, KV_BUFS, &kr->puts_done_ns))
			return 1;
		for (int i = 0; i < KV_BUFS; i++)
			if (c[i].res < 0) {
				fail("ar: KV layer %d PUT: %s", i, ferry_strerror(c[i].res));
				return 1;
			}
	}
	/* Over shm the DiT read our pool in place: stay until it let go of everything. */
	kv_wait(&cfg.sh->kv[KV_ROUNDS - 1].verified, "ar", "the DiT's check");
	ferry_engine_destroy(e);
	return 0;
}

/* Post the 56 GETs of round r (iov NULL: zero copy), say so once they wait. */
static void kv_post_gets(struct ferry_engine *e, struct ferry_peer *from, int r,
			 struct iovec *iov)
{
	char key[32];

	for (int i = 0; i < KV_BUFS; i++) {
		struct ferry_sqe *sqe = get_sqe(e);

		kv_key(key, sizeof(key), r, i);
		ferry_prep_get(sqe, from, key, iov ? &iov[i] : NULL, iov ? 1 : 0, (uint64_t)i);
		ferry_sqe_set_timeout(sqe, 60 * SEC);
	}
	submit(e);
	usleep(10000); /* the engine took them long ago: they wait, as a DiT waits for its KV */
	atomic_store(&cfg.sh->kv[r].gets_posted, 1);
}

static int run_dit(void)
{
	size_t lb = kv_layer_bytes();
	/* Over tcp the KV set lands in our pool (over shm we read the AR's in place). */
	struct ferry_engine *e = make_engine("dit", cfg.tcp ? kv_pool_bytes() : 16u << 20);
	struct ferry_peer *from = e ? open_peer(e, "ar", false) : NULL;
	struct iovec iov[KV_BUFS];
	struct ferry_cqe c[KV_BUFS];
	struct ferry_sqe *sqe;
	uint64_t word = 0;
	struct iovec hello = { &word, sizeof(word) };
	int n;

	if (!from)
		return 1;
	sqe = get_sqe(e);
	ferry_prep_get(sqe, from, "req0_kv_hello", &hello, 1, 0);
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	submit(e);
	say_ready(e);
	n = ferry_cq_wait(ferry_cq_default(e), c, 1, 60 * SEC);
	if (n != 1 || c[0].res < 0 || word != MAGIC) {
		fail("dit: the AR's first PUT: %s",
		     n < 0 ? ferry_strerror(n) : c[0].res < 0 ? ferry_strerror(c[0].res) : "damaged");
		return 1;
	}

	/* Round 1: zero copy. The GETs hand over the AR's pool buffers. */
	kv_post_gets(e, from, KV_ZC, NULL);
	if (!kv_collect(e, "dit", c, KV_BUFS, &cfg.sh->kv[KV_ZC].gets_done_ns))
		return 1;
	for (int i = 0; i < KV_BUFS; i++) { /* after the clock: check every byte */
		if (c[i].res < 0) {
			fail("dit: zero-copy GET of layer %d: %s", i, ferry_strerror(c[i].res));
			return 1;
		}
		cfg.sh->kv[KV_ZC].bytes += c[i].len;
		if (c[i].len != lb || !payload_ok(ferry_buf_data(c[i].buf), lb, kv_seed(KV_ZC, i)))
			fail("dit: zero-copy KV layer %d damaged", i);
		ferry_buf_release(c[i].buf); /* the block goes home to the AR */
	}
	atomic_store(&cfg.sh->kv[KV_ZC].verified, 1);

	/*
	 * Round 2: a copy into the DiT's own layer memory, allocated and touched
	 * first. Over shm the copy reads the AR's pool through our mapping of it,
	 * which is warm: the check above read those pages (the AR's allocator
	 * hands the same blocks out again), as in a pipeline that has run a while.
	 */
	for (int i = 0; i < KV_BUFS; i++) {
		iov[i].iov_base = malloc(lb);
		if (!iov[i].iov_base) {
			fail("dit: out of memory");
			return 1;
		}
		/* Not 0: the compiler may turn malloc + memset 0 into calloc, touching nothing. */
		memset(iov[i].iov_base, 0x5a, lb);
		iov[i].iov_len = lb;
	}
	kv_post_gets(e, from, KV_COPY, iov);
	if (!kv_collect(e, "dit", c, KV_BUFS, &cfg.sh->kv[KV_COPY].gets_done_ns))
		return 1;
	for (int i = 0; i < KV_BUFS; i++) {
		if (c[i].res < 0) {
			fail("dit: GET of layer %d into DiT memory: %s", i, ferry_strerror(c[i].res));
			return 1;
		}
		cfg.sh->kv[KV_COPY].bytes += c[i].len;
		if (c[i].len != lb || !payload_ok(iov[i].iov_base, lb, kv_seed(KV_COPY, i)))
			fail("dit: copied KV layer %d damaged", i);
		free(iov[i].iov_base);
	}
	atomic_store(&cfg.sh->kv[KV_COPY].verified, 1);
	ferry_engine_destroy(e);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Main: fork, watch, report                                           */
/* ------------------------------------------------------------------ */

static pid_t spawn(int (*fn)(void))
{
	pid_t pid = fork();

	if (pid == 0) {
		alarm(300);
		_exit(fn());
	}
	return pid;
}

static int run_talker(void)
{
	return run_receiver("talker", "thinker", "code2wav", 0);
}

static int run_code2wav(void)
{
	return run_receiver("code2wav", "talker", NULL, 1);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static double pct(uint32_t *v, uint32_t n, double p)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u32);
	return v[(uint32_t)((n - 1) * p + 0.5)];
}

static bool wait_all(pid_t *pids, int n, const char *phase)
{
	bool ok = true, tty = isatty(STDOUT_FILENO);
	int left = n;
	uint64_t last = 0;

	while (left > 0) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);

		if (p > 0) {
			for (int i = 0; i < n; i++)
				if (pids[i] == p && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
					ok = false;
					fail("a %s process ended with status %d", phase, st);
				}
			left--;
			continue;
		}
		if (atomic_load(&cfg.sh->failures)) {
			for (int i = 0; i < n; i++)
				kill(pids[i], SIGKILL);
		}
		if (!cfg.quiet && now_ns() - last > (tty ? SEC / 4 : SEC)) {
			struct edge_stats *a = &cfg.sh->edge[0], *b = &cfg.sh->edge[1];

			last = now_ns();
			if (n == 3)
				printf("%s  %s: thinker->talker %" PRIu64 "/%d chunks, "
				       "talker->code2wav %" PRIu64 "/%d chunks %s", tty ? "\r" : "",
				       phase, atomic_load(&a->chunks), cfg.requests * cfg.chunks,
				       atomic_load(&b->chunks),
				       cfg.requests * cfg.chunks * CODEC_PER_HIDDEN, tty ? "" : "\n");
			else
				printf("%s  %s: moving the KV set %s", tty ? "\r" : "", phase,
				       tty ? "" : "\n");
			fflush(stdout);
		}
		usleep(20000);
	}
	if (!cfg.quiet && tty)
		printf("\n");
	return ok;
}

static void print_edge(const char *name, struct edge_stats *es)
{
	double secs = es->last_recv_ns > es->first_send_ns
			      ? (double)(es->last_recv_ns - es->first_send_ns) / 1e9
			      : 0;
	uint64_t chunks = atomic_load(&es->chunks), bytes = atomic_load(&es->bytes);
	char n[32];

	snprintf(n, sizeof(n), "%u/%" PRIu64, es->nlat, chunks);
	printf("  %-17s %7" PRIu64 " %7.1f %8.1f %9.1f %9.1f %11s %9.0f %9.0f\n", name, chunks,
	       (double)bytes / 1e6, secs > 0 ? (double)bytes / 1e6 / secs : 0,
	       pct(es->lat_ns, es->nlat, 0.5) / 1e3, pct(es->lat_ns, es->nlat, 0.99) / 1e3, n,
	       pct(es->ttfc_us, es->nttfc, 0.5), pct(es->ttfc_us, es->nttfc, 0.99));
}

static void print_kv(const char *path, const struct kv_round *kr)
{
	double ns, put_ns;
	char rate[32];

	if (!atomic_load(&kr->verified) || !kr->gets_done_ns) {
		printf("  %-28s (did not complete)\n", path);
		return;
	}
	ns = (double)(kr->gets_done_ns - kr->submit_ns);
	put_ns = (double)(kr->puts_done_ns - kr->submit_ns);
	/* Over shm nothing is copied on the zero-copy path: a rate would be size / time. */
	if (kr == &cfg.sh->kv[KV_ZC] && !cfg.tcp)
		snprintf(rate, sizeof(rate), "-");
	else
		snprintf(rate, sizeof(rate), "%.0f", (double)kr->bytes / 1e6 / (ns / 1e9));
	printf("  %-28s %7.1f %12.1f %12.1f %9s\n", path, (double)kr->bytes / 1e6, ns / 1e3,
	       put_ns / 1e3, rate);
}

static void print_legend(void)
{
	printf("\n  streams: the chunks' pace is the simulated model's, not ferry's: the thinker\n"
	       "    fills each hidden chunk (its model output) and sleeps --pace-us %d us after\n"
	       "    each round of %d requests; the talker makes %d codec chunks per hidden chunk.\n"
	       "  MB/s      bytes / (first stream opened -> last chunk received): the model's pace\n"
	       "  ferry us  ferry's own latency per chunk: PUT submitted by the producer -> the\n"
	       "            chunk's CQE returned by the consumer's ferry_cq_wait, for the chunks\n"
	       "            submitted when the consumer had no work of its own left (sampled: how\n"
	       "            many); the others also waited for it to finish earlier chunks. When\n"
	       "            every CPU is busy (the model's own work uses them too) it is mostly\n"
	       "            the wait for a CPU after a wake-up: a larger --pace-us frees them\n"
	       "  ttfc us   time to first chunk: stream opened -> its first chunk received; it\n"
	       "            includes the model making that chunk (and the earlier requests')\n",
	       cfg.pace_us, cfg.requests, CODEC_PER_HIDDEN);
	printf("  KV: %d pool buffers filled before the clock and PUT zero copy (they move);\n"
	       "    the DiT's GETs wait before the clock starts. Checksums are checked after it.\n"
	       "  handoff us   AR submits the first PUT -> the DiT's ferry_cq_wait returns the\n"
	       "               last GET (CLOCK_MONOTONIC: one clock for all processes of a host)\n"
	       "  PUTs done us AR's clock alone: first PUT submitted -> its ferry_cq_wait returns\n"
	       "               the last PUT's completion (the DiT holds every layer and the results\n"
	       "               came back; it includes the AR's own wake-up)\n", KV_BUFS);
	if (cfg.tcp)
		printf("  zero-copy    tcp: the bytes cross the loopback socket (the kernel copies them\n"
		       "               from the AR's pool into the DiT's pool); the GETs hand those\n"
		       "               blocks over, no copy in user space. Over shm nothing moves.\n"
		       "  copy         the same, then each GET copies its layer out of the DiT's pool\n"
		       "               into DiT memory allocated and touched before the clock\n");
	else
		printf("  zero-copy    shm: the GETs hand over the AR's pool buffers, which the DiT\n"
		       "               reads in place: no byte is copied, so no MB/s is given\n"
		       "  copy         each GET copies its layer from the AR's pool into DiT memory\n"
		       "               allocated and touched before the clock: one %.0f MB memcpy\n",
		       (double)cfg.sh->kv[KV_COPY].bytes / 1e6);
}

static void usage(FILE *to)
{
	fprintf(to,
		"usage: demo [options]\n"
		"  --requests N         requests at once on the streams (1-%d, default 8)\n"
		"  --chunks M           hidden-state chunks of 1 MiB per request (default 16)\n"
		"  --inflight K         credits: chunks of one stream in flight (default 4)\n"
		"  --pace-us U          the simulated thinker sleeps U us after each round of\n"
		"                       chunks (default 2000; 0: as fast as it makes them)\n"
		"  --kv-mib S           the AR->DiT KV set, in MiB (1-4096, default 190)\n"
		"  --transport shm|tcp  shared memory (default) or tcp on loopback\n"
		"  --quiet              no progress lines\n"
		"  --help               this text\n"
		"Exit status: 0 if every byte arrived intact, 1 otherwise, 2 for bad usage.\n",
		MAX_REQ);
}

int main(int argc, char **argv)
{
	pid_t pids[3];
	bool ok;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(a, "--quiet")) {
			cfg.quiet = true;
			continue;
		}
		if (!v) {
			usage(stderr);
			return 2;
		}
		i++;
		if (!strcmp(a, "--requests"))
			cfg.requests = atoi(v);
		else if (!strcmp(a, "--chunks"))
			cfg.chunks = atoi(v);
		else if (!strcmp(a, "--inflight"))
			cfg.inflight = atoi(v);
		else if (!strcmp(a, "--pace-us"))
			cfg.pace_us = atoi(v);
		else if (!strcmp(a, "--kv-mib"))
			cfg.kv_mib = atoi(v);
		else if (!strcmp(a, "--transport") && (!strcmp(v, "shm") || !strcmp(v, "tcp")))
			cfg.tcp = !strcmp(v, "tcp");
		else {
			usage(stderr);
			return 2;
		}
	}
	if (cfg.requests < 1 || cfg.requests > MAX_REQ || cfg.chunks < 1 ||
	    (long)cfg.requests * cfg.chunks * CODEC_PER_HIDDEN > MAX_SAMPLES || cfg.inflight < 1 ||
	    cfg.kv_mib < 1 || cfg.kv_mib > 4096 || cfg.pace_us < 0) {
		usage(stderr);
		return 2;
	}
	snprintf(cfg.ns, sizeof(cfg.ns), "demo-%d", (int)getpid());
	cfg.sh = mmap(NULL, sizeof(*cfg.sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		      -1, 0);
	if (cfg.sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	printf("ferry demo: Qwen-Omni-like pipeline, %d requests x %d hidden chunks of %u KiB, "
	       "%d codec chunks of %d frames each per hidden chunk, credits %d per stream, "
	       "model pace --pace-us %d, transport %s\n", cfg.requests, cfg.chunks,
	       HIDDEN_BYTES >> 10, CODEC_PER_HIDDEN, FRAMES_PER_CODEC, cfg.inflight, cfg.pace_us,
	       cfg.tcp ? "tcp" : "shm");
	fflush(stdout);
	/* Each sender waits until its receiver is ready (open_peer). */
	pids[0] = spawn(run_code2wav);
	pids[1] = spawn(run_talker);
	pids[2] = spawn(run_thinker);
	ok = wait_all(pids, 3, "omni");

	if (ok && !atomic_load(&cfg.sh->failures)) {
		printf("Bagel-like handoff: AR -> DiT, %d MiB KV set as %d layer buffers, "
		       "zero copy, then copied into DiT memory\n", cfg.kv_mib, KV_BUFS);
		fflush(stdout);
		pids[0] = spawn(run_dit);
		pids[1] = spawn(run_ar);
		ok = wait_all(pids, 2, "bagel");
	}

	printf("\n  %-17s %7s %7s %8s %9s %9s %11s %9s %9s\n", "stream edge", "chunks", "MB",
	       "MB/s", "ferry p50", "ferry p99", "sampled", "ttfc p50", "ttfc p99");
	printf("  %-17s %7s %7s %8s %9s %9s %11s %9s %9s\n", "", "", "", "(model)", "us", "us",
	       "", "us", "us");
	print_edge("thinker->talker", &cfg.sh->edge[0]);
	print_edge("talker->code2wav", &cfg.sh->edge[1]);
	printf("\n  %-28s %7s %12s %12s %9s\n", "KV ar->dit, DiT's GETs", "MB", "handoff us",
	       "PUTs done us", "MB/s");
	print_kv(cfg.tcp ? "zero-copy: take the blocks" : "zero-copy: take the buffers",
		 &cfg.sh->kv[KV_ZC]);
	print_kv("copy into DiT memory", &cfg.sh->kv[KV_COPY]);
	print_legend();
	if (atomic_load(&cfg.sh->failures) || !ok) {
		printf("\nFAILED: %s\n", cfg.sh->fail_msg[0] ? cfg.sh->fail_msg : "see above");
		return 1;
	}
	printf("\nOK: every chunk arrived in order with a good checksum (%" PRIu64
	       " + %" PRIu64 " chunks), and both KV sets intact (every byte checked).\n",
	       atomic_load(&cfg.sh->edge[0].chunks), atomic_load(&cfg.sh->edge[1].chunks));
	return 0;
}

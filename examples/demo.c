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
 * stream (--inflight). Then two more processes, "ar" and "dit", hand over
 * a 190 MB KV set: 2 x 28 layer buffers in one vectored PUT, received
 * scattered into the DiT's own layer buffers, checksummed.
 *
 * Every chunk carries a header (request, index, send time, checksum of the
 * payload); CLOCK_MONOTONIC is shared by the processes, so each receiver
 * measures chunk latency (send -> received) and time to first chunk (stream
 * opened -> first chunk received). A line of progress is printed while it
 * runs, and a table per edge at the end.
 *
 * Usage: demo [--requests N] [--chunks M] [--inflight K] [--transport shm|tcp]
 *             [--kv-mib S] [--pace-us U] [--quiet]
 * --pace-us: the thinker makes one hidden chunk per request every U us
 * (default 2000), like a model decoding; 0 sends as fast as credits allow.
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
#define KV_LAYERS 28
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
	uint32_t lat_us[MAX_SAMPLES];     /* chunk latency samples */
	uint32_t ttfc_us[MAX_REQ];        /* time to first chunk, per request */
	_Atomic uint32_t bad;
	_Atomic uint32_t streams_done;
	_Atomic int sender_done; /* every put of the sender completed (its results came back) */
};

/* Shared by every process of the demo (an anonymous shared mapping). */
struct shared {
	struct edge_stats edge[2];        /* thinker->talker, talker->code2wav */
	_Atomic uint32_t failures;
	char fail_msg[256];
	/* KV handoff. */
	uint64_t kv_bytes, kv_put_ns, kv_done_ns;
	/* --transport tcp: where each receiving engine listens (talker, code2wav, dit). */
	char addr[3][128];
	_Atomic int addr_ready[3];
	_Atomic uint32_t kv_ok;
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

static struct ferry_peer *open_peer(struct ferry_engine *e, const char *name)
{
	struct ferry_peer *p = NULL;
	int slot = addr_slot(name), rc;

	if (ferry_peer_open(e, name, &p)) {
		fail("%s: peer %s", ferry_engine_name(e), name);
		return NULL;
	}
	ferry_peer_set_stream_limits(p, (uint32_t)cfg.inflight, 0);
	if (cfg.tcp && slot >= 0) {
		/* Reach a receiver at the address it published (10 s at most). */
		for (int i = 0; i < 10000 && !atomic_load(&cfg.sh->addr_ready[slot]); i++)
			usleep(1000);
		if (!atomic_load(&cfg.sh->addr_ready[slot]) ||
		    (rc = ferry_peer_set_address(p, cfg.sh->addr[slot])) < 0) {
			fail("%s: no tcp address for %s", ferry_engine_name(e), name);
			return NULL;
		}
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

/* Check a chunk, count it on edge ei. Returns its header or NULL. */
static const struct chunk_hdr *rx_chunk(int ei, struct rx_req *rq, uint32_t req,
					const struct ferry_cqe *c)
{
	struct edge_stats *es = &cfg.sh->edge[ei];
	const struct chunk_hdr *h = ferry_buf_data(c->buf);
	uint64_t now = now_ns();

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
			es->ttfc_us[es->nttfc++] = (uint32_t)((now - h->opened_ns) / 1000);
		if (!es->first_send_ns || h->opened_ns < es->first_send_ns)
			es->first_send_ns = h->opened_ns;
	}
	if (es->nlat < MAX_SAMPLES)
		es->lat_us[es->nlat++] = (uint32_t)((now - h->sent_ns) / 1000);
	es->last_recv_ns = now;
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
	struct ferry_peer *to = e ? open_peer(e, "talker") : NULL;
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
	struct ferry_peer *from = e ? open_peer(e, from_name) : NULL;
	struct ferry_peer *to = e && to_name ? open_peer(e, to_name) : NULL;
	static struct rx_req rq[MAX_REQ];
	uint64_t opened[MAX_REQ] = { 0 };
	uint32_t out_next[MAX_REQ] = { 0 };
	struct ferry_sqe *sqe;
	unsigned finished = 0, puts_done = 0, puts_sent = 0;
	char stream[32];

	if (!from || (to_name && !to))
		return 1;
	sqe = get_sqe(e);
	ferry_prep_stream_accept(sqe, from, 1ull << 63);
	submit(e);
	while (finished < (unsigned)cfg.requests && !atomic_load(&cfg.sh->failures)) {
		struct ferry_cqe c[32];
		int n = ferry_cq_wait(ferry_cq_default(e), c, 32, 30 * SEC);

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
			if (!rx_chunk(ei, &rq[req], req, &c[i])) {
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
	return ((size_t)cfg.kv_mib << 20) / (2 * KV_LAYERS) & ~(size_t)63;
}

static int run_ar(void)
{
	size_t lb = kv_layer_bytes();
	struct ferry_engine *e = make_engine("ar", 2 * KV_LAYERS * lb + (16u << 20));
	struct ferry_peer *to = e ? open_peer(e, "dit") : NULL;
	struct iovec iov[2 * KV_LAYERS];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	if (!to)
		return 1;
	for (int i = 0; i < 2 * KV_LAYERS; i++) {
		iov[i].iov_base = malloc(lb);
		if (!iov[i].iov_base)
			return 1;
		fill_payload(iov[i].iov_base, lb, 0x4b560000u + (unsigned)i);
		iov[i].iov_len = lb;
	}
	sqe = get_sqe(e);
	ferry_prep_put(sqe, to, "req0_kv", iov, 2 * KV_LAYERS, 1); /* no packing copy */
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	cfg.sh->kv_put_ns = now_ns();
	submit(e);
	if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 60 * SEC) != 1 || c.res < 0)
		fail("ar: KV put failed: %s", ferry_strerror(c.res));
	while (!atomic_load(&cfg.sh->kv_ok) && !atomic_load(&cfg.sh->failures))
		usleep(1000);
	for (int i = 0; i < 2 * KV_LAYERS; i++)
		free(iov[i].iov_base);
	ferry_engine_destroy(e);
	return 0;
}

static int run_dit(void)
{
	size_t lb = kv_layer_bytes();
	/* Over tcp the KV set lands in our pool (over shm we read the AR's in place). */
	struct ferry_engine *e = make_engine("dit", cfg.tcp ? 2 * KV_LAYERS * lb + (16u << 20)
							    : 16u << 20);
	struct ferry_peer *from = e ? open_peer(e, "ar") : NULL;
	struct iovec iov[2 * KV_LAYERS];
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	if (!from)
		return 1;
	for (int i = 0; i < 2 * KV_LAYERS; i++) {
		iov[i].iov_base = malloc(lb);
		if (!iov[i].iov_base)
			return 1;
		memset(iov[i].iov_base, 0, lb); /* the DiT's own layer buffers, touched */
		iov[i].iov_len = lb;
	}
	sqe = get_sqe(e);
	ferry_prep_get(sqe, from, "req0_kv", iov, 2 * KV_LAYERS, 1); /* scattered */
	ferry_sqe_set_timeout(sqe, 60 * SEC);
	submit(e);
	if (ferry_cq_wait(ferry_cq_default(e), &c, 1, 60 * SEC) != 1 || c.res < 0) {
		fail("dit: KV get failed: %s", ferry_strerror(c.res));
	} else {
		cfg.sh->kv_done_ns = now_ns();
		cfg.sh->kv_bytes = c.len;
		for (int i = 0; i < 2 * KV_LAYERS; i++) {
			uint64_t want;
			void *ref = malloc(lb);

			if (!ref)
				return 1;
			fill_payload(ref, lb, 0x4b560000u + (unsigned)i);
			want = checksum(ref, lb);
			free(ref);
			if (checksum(iov[i].iov_base, lb) != want)
				fail("dit: KV layer %d damaged", i);
		}
		if (!atomic_load(&cfg.sh->failures))
			atomic_store(&cfg.sh->kv_ok, 1);
	}
	for (int i = 0; i < 2 * KV_LAYERS; i++)
		free(iov[i].iov_base);
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

	printf("  %-18s %8" PRIu64 " %10.1f %10.1f %9.0f %9.0f %9.0f %9.0f\n", name, chunks,
	       (double)bytes / 1e6, secs > 0 ? (double)bytes / 1e6 / secs : 0,
	       pct(es->lat_us, es->nlat, 0.5), pct(es->lat_us, es->nlat, 0.99),
	       pct(es->ttfc_us, es->nttfc, 0.5), pct(es->ttfc_us, es->nttfc, 0.99));
}

static void usage(void)
{
	fprintf(stderr, "usage: demo [--requests N (1-%d)] [--chunks M] [--inflight K] "
			"[--transport shm|tcp] [--kv-mib S] [--pace-us U] [--quiet]\n", MAX_REQ);
}

int main(int argc, char **argv)
{
	pid_t pids[3];
	bool ok;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--quiet")) {
			cfg.quiet = true;
			continue;
		}
		if (!v) {
			usage();
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
			usage();
			return 2;
		}
	}
	if (cfg.requests < 1 || cfg.requests > MAX_REQ || cfg.chunks < 1 ||
	    (long)cfg.requests * cfg.chunks * CODEC_PER_HIDDEN > MAX_SAMPLES || cfg.inflight < 1 ||
	    cfg.kv_mib < 1 || cfg.kv_mib > 4096 || cfg.pace_us < 0) {
		usage();
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
	       "transport %s\n", cfg.requests, cfg.chunks, HIDDEN_BYTES >> 10, CODEC_PER_HIDDEN,
	       FRAMES_PER_CODEC, cfg.inflight, cfg.tcp ? "tcp" : "shm");
	fflush(stdout);
	/* Consumers first: they subscribe before the producers start. */
	pids[0] = spawn(run_code2wav);
	pids[1] = spawn(run_talker);
	usleep(50000);
	pids[2] = spawn(run_thinker);
	ok = wait_all(pids, 3, "omni");

	if (ok && !atomic_load(&cfg.sh->failures)) {
		printf("Bagel-like handoff: AR -> DiT, %d MiB KV set as %d layer buffers\n",
		       cfg.kv_mib, 2 * KV_LAYERS);
		fflush(stdout);
		pids[0] = spawn(run_dit);
		usleep(20000);
		pids[1] = spawn(run_ar);
		ok = wait_all(pids, 2, "bagel");
	}

	printf("\n  %-18s %8s %10s %10s %9s %9s %9s %9s\n", "edge", "chunks", "MB", "MB/s",
	       "lat p50", "lat p99", "ttfc p50", "ttfc p99");
	printf("  %-18s %8s %10s %10s %9s %9s %9s %9s\n", "", "", "", "", "us", "us", "us", "us");
	print_edge("thinker->talker", &cfg.sh->edge[0]);
	print_edge("talker->code2wav", &cfg.sh->edge[1]);
	if (cfg.sh->kv_bytes) {
		double ns = (double)(cfg.sh->kv_done_ns - cfg.sh->kv_put_ns);

		printf("  %-18s %8d %10.1f %10.1f %9.0f   (PUT submitted -> scattered GET done)\n",
		       "ar->dit (KV)", 1, (double)cfg.sh->kv_bytes / 1e6,
		       (double)cfg.sh->kv_bytes / 1e6 / (ns / 1e9), ns / 1e3);
	}
	if (atomic_load(&cfg.sh->failures) || !ok) {
		printf("\nFAILED: %s\n", cfg.sh->fail_msg[0] ? cfg.sh->fail_msg : "see above");
		return 1;
	}
	printf("\nOK: every chunk arrived in order with a good checksum (%" PRIu64
	       " + %" PRIu64 " chunks), and the KV set intact.\n",
	       atomic_load(&cfg.sh->edge[0].chunks), atomic_load(&cfg.sh->edge[1].chunks));
	return 0;
}

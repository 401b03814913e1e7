/*
 * stage/stage.c - the stage-level API: one rank of one stage of a pipeline
 * described by a stage YAML, with upstream's put/get/cleanup/health/close.
 *
 * Owns: opening a stage (load and check the YAML, create the engine
 * "stage<id>.rank<r>", one link per edge of this stage: its peer, transport
 * and role), the synchronous put/get calls built on PUT/GET ops, the
 * metadata blob put hands back, cleanup through FERRY_OP_CLEANUP, and the
 * stage's health JSON.
 *
 * Waiting: every calling thread gets its own completion queue (created on
 * its first call, found again through a thread-local cache without a lock)
 * so that a thread only ever sees its own completions; a call submits one
 * op with a deadline and waits for that op's CQE. The op always completes
 * (its deadline, a cancel, or the engine's destroy), so a call never
 * returns while the engine still points at its stack. Stage calls are not
 * the fast path: applications that want batching use the engine's SQ/CQ
 * API on ferry_stage_engine().
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "addresses.h"
#include "config.h"
#include "ferry/stage.h"
#include "stage_log.h"

#define STAGE_DEFAULT_TIMEOUT_MS 30000u
#define STAGE_CQ_ENTRIES 16
/* After an op's own deadline, how long we wait before cancelling it. */
#define STAGE_GRACE_NS (5ull * 1000000000ull)
#define META_MAGIC 0x4d545346u /* "FSTM" */
#define META_VERSION 1

struct stage_link {
	const struct stage_edge *edge; /* in the stage's graph */
	bool sending;                  /* this stage is the edge's `from` */
	struct ferry_peer *peer;
	uint64_t get_timeout_ns;       /* 0: the stage's */
};

struct stage_thread {
	int tid;
	struct ferry_cq *cq;
	struct stage_thread *next;
};

struct ferry_stage {
	uint64_t uid;
	struct stage_graph *graph;
	char id[STAGE_ID_MAX];
	unsigned rank;
	struct ferry_engine *e;
	struct stage_link *links;
	unsigned nlinks;
	uint64_t timeout_ns;
	pthread_mutex_t lock; /* threads (first call of a thread only) */
	struct stage_thread *threads;
	_Atomic uint64_t next_ud;
};

/* The metadata blob, as laid out in struct ferry_stage_meta. */
struct stage_meta_wire {
	uint32_t magic;
	uint8_t version;
	uint8_t transport;
	uint16_t flags;
	uint64_t len;
	uint64_t key_hash; /* of "{key}@{from engine}_{to engine}" */
	uint64_t put_ns;
	char from[STAGE_ID_MAX];
	char to[STAGE_ID_MAX];
};

_Static_assert(sizeof(struct stage_meta_wire) == FERRY_STAGE_META_SIZE, "metadata layout");

static _Atomic uint64_t next_stage_uid = 1;

static __thread struct {
	uint64_t uid;
	struct ferry_cq *cq;
} tls_cq[4];
static __thread unsigned tls_cq_next;

/* ------------------------------------------------------------------ */
/* Open and close                                                      */
/* ------------------------------------------------------------------ */

static uint64_t stage_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int link_edges(struct ferry_stage *s)
{
	const struct stage_graph *g = s->graph;
	unsigned n = 0;

	for (unsigned i = 0; i < g->nedges; i++)
		if (!strcmp(g->edges[i].from, s->id) || !strcmp(g->edges[i].to, s->id))
			n++;
	s->links = calloc(n ? n : 1, sizeof(*s->links));
	if (!s->links)
		return -ENOMEM;
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *edge = &g->edges[i];
		struct stage_link *l = &s->links[s->nlinks];
		const struct stage_def *other;
		char name[FERRY_NAME_MAX], uri[160];
		int rc;

		if (strcmp(edge->from, s->id) && strcmp(edge->to, s->id))
			continue;
		l->edge = edge;
		l->sending = !strcmp(edge->from, s->id);
		other = stage_graph_stage(g, l->sending ? edge->to : edge->from);
		rc = stage_engine_name(other->id, stage_peer_rank(s->rank, other->ranks), name,
				       sizeof(name));
		if (rc || (rc = ferry_peer_open(s->e, name, &l->peer)))
			return rc;
		/*
		 * The far end's address, when it is not found by name: a store-like
		 * edge's receiver calls the holder (ferry://, its data address
		 * comes in the handshake); a tcp or rdma edge's sender pushes to
		 * the receiver's data address (tcp://, rdma://).
		 */
		if ((rc = stage_edge_uri(g, edge, s->id, s->rank, l->sending, uri, sizeof(uri))))
			return rc;
		if (uri[0] && (rc = ferry_peer_connect_uri(l->peer, uri)))
			return rc;
		l->get_timeout_ns = (uint64_t)edge->get_timeout_ms * 1000000ull;
		/*
		 * Streams: max_inflight, when the file gives it, is the credit
		 * of each stream on the edge (chunks sent and not yet released);
		 * upstream's built-in 1 would make every stream stop-and-wait,
		 * so without it the engine's default holds. window_size -1
		 * asks a consumer for the whole stream at once: see
		 * ferry_stage_edge.
		 */
		if (l->sending && edge->inflight_from != STAGE_FROM_BUILTIN &&
		    edge->max_inflight > 0)
			ferry_peer_set_stream_limits(l->peer,
						     edge->max_inflight > UINT32_MAX
							     ? UINT32_MAX
							     : (uint32_t)edge->max_inflight,
						     0);
		log_debug("stage %s rank %u: edge %s->%s: %s %s over %s", s->id, s->rank,
			  edge->from, edge->to, l->sending ? "sends to" : "receives from", name,
			  stage_transport_name(edge->transport));
		s->nlinks++;
	}
	return 0;
}

static void stage_free(struct ferry_stage *s)
{
	if (s->e)
		ferry_engine_destroy(s->e);
	while (s->threads) {
		struct stage_thread *t = s->threads;

		s->threads = t->next;
		free(t); /* its CQ went with the engine */
	}
	free(s->links);
	stage_graph_free(s->graph);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

int ferry_stage_open(const struct ferry_stage_params *params, struct ferry_stage **out)
{
	static const size_t v0 = offsetof(struct ferry_stage_params, flags) + sizeof(uint32_t);
	struct ferry_engine_params ep = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_stage_params p;
	const struct stage_def *def;
	struct ferry_stage *s;
	char name[FERRY_NAME_MAX], listen[128], control[128], rdma[128];
	uint64_t pool = 0;
	int rc;

	if (!out) {
		log_error("ferry_stage_open: NULL out");
		return -EINVAL;
	}
	*out = NULL;
	if (!params || params->size < v0 || params->size > sizeof(p)) {
		log_error("ferry_stage_open: %s (use FERRY_STAGE_PARAMS_INIT)",
			  params ? "params size unknown" : "NULL params");
		return -EINVAL;
	}
	memset(&p, 0, sizeof(p));
	memcpy(&p, params, params->size);
	if (!p.config_path || !p.stage_id || p.flags ||
	    (unsigned)p.progress >= FERRY_PROGRESS__MAX) {
		log_error("ferry_stage_open: %s", !p.config_path ? "config_path is missing"
						  : !p.stage_id  ? "stage_id is missing"
						  : p.flags      ? "unknown flags"
								 : "unknown progress mode");
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	s->uid = atomic_fetch_add(&next_stage_uid, 1);
	s->rank = p.rank;
	s->timeout_ns = (uint64_t)(p.timeout_ms ? p.timeout_ms : STAGE_DEFAULT_TIMEOUT_MS) *
			1000000ull;
	rc = stage_graph_load(p.config_path, &s->graph);
	if (rc) {
		log_error("ferry_stage_open: %s: %u error(s) in the stage config; nothing started",
			  p.config_path, s->graph ? s->graph->nerrors + s->graph->errors_dropped : 0);
		goto fail;
	}
	def = stage_graph_stage(s->graph, p.stage_id);
	if (!def) {
		log_error("ferry_stage_open: stage_id %s is not defined in %s", p.stage_id,
			  p.config_path);
		rc = -EINVAL;
		goto fail;
	}
	if (p.rank >= def->ranks) {
		log_error("ferry_stage_open: stage %s has %u rank(s): no rank %u", def->id,
			  def->ranks, p.rank);
		rc = -EINVAL;
		goto fail;
	}
	snprintf(s->id, sizeof(s->id), "%s", def->id);
	for (unsigned i = 0; i < s->graph->nedges; i++) {
		const struct stage_edge *edge = &s->graph->edges[i];

		if ((!strcmp(edge->from, s->id) || !strcmp(edge->to, s->id)) &&
		    edge->memory_pool_size > pool)
			pool = edge->memory_pool_size;
	}
	if ((rc = stage_engine_name(s->id, s->rank, name, sizeof(name))))
		goto fail;
	ep.name = name;
	ep.ns = p.ns;
	ep.progress = p.progress;
	ep.pool_size = p.pool_size ? p.pool_size : (size_t)pool;
	if ((rc = stage_rank_endpoints(s->graph, s->id, s->rank, listen, sizeof(listen), control,
				       sizeof(control), rdma, sizeof(rdma))))
		goto fail;
	ep.listen = listen[0] ? listen : NULL;
	ep.control = control[0] ? control : NULL;
	ep.rdma_listen = rdma[0] ? rdma : NULL;
	if ((rc = ferry_engine_create(&ep, &s->e)) || (rc = link_edges(s)))
		goto fail;
	log_info("stage %s rank %u open as %s (%u edge(s))", s->id, s->rank, name, s->nlinks);
	*out = s;
	return 0;
fail:
	stage_free(s);
	return rc;
}

struct ferry_engine *ferry_stage_engine(struct ferry_stage *s)
{
	return s ? s->e : NULL;
}

int ferry_stage_close(struct ferry_stage **sp)
{
	if (!sp)
		return -EINVAL;
	if (!*sp)
		return 0;
	stage_free(*sp);
	*sp = NULL;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Calls                                                               */
/* ------------------------------------------------------------------ */

/* This thread's CQ on stage s. */
static int thread_cq(struct ferry_stage *s, struct ferry_cq **out)
{
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	struct stage_thread *t;
	int tid, rc = 0;

	for (unsigned i = 0; i < 4; i++) {
		if (tls_cq[i].uid == s->uid) {
			*out = tls_cq[i].cq;
			return 0;
		}
	}
	tid = (int)syscall(SYS_gettid);
	pthread_mutex_lock(&s->lock);
	for (t = s->threads; t; t = t->next)
		if (t->tid == tid)
			break;
	if (!t) {
		t = calloc(1, sizeof(*t));
		cp.entries = STAGE_CQ_ENTRIES;
		if (!t)
			rc = -ENOMEM;
		else if ((rc = ferry_cq_create(s->e, &cp, &t->cq)))
			free(t);
		if (!rc) {
			t->tid = tid;
			t->next = s->threads;
			s->threads = t;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return rc;
	tls_cq[tls_cq_next % 4].uid = s->uid;
	tls_cq[tls_cq_next % 4].cq = t->cq;
	tls_cq_next++;
	*out = t->cq;
	return 0;
}

/* A free entry of this thread's ring (another op of ours may fill it). */
static struct ferry_sqe *take_sqe(struct ferry_stage *s, struct ferry_sq **sq)
{
	struct ferry_sqe *sqe;

	if (ferry_sq_get(s->e, sq))
		return NULL;
	for (unsigned i = 0; !(sqe = ferry_sq_get_sqe(*sq)) && i < 100000; i++) {
		ferry_progress(s->e);
		sched_yield(); /* its ring is full: let the reactor take entries */
	}
	return sqe;
}

/*
 * Submit the op prepared in sqe (user_data ud, deadline timeout_ns or
 * none) and wait for its completion on cq.
 */
static int submit_wait(struct ferry_stage *s, struct ferry_sq *sq, struct ferry_cq *cq,
		       uint64_t ud, uint64_t timeout_ns, struct ferry_cqe *out)
{
	uint64_t cancel_at = timeout_ns ? stage_now_ns() + timeout_ns + STAGE_GRACE_NS : 0;
	bool cancelled = false;
	int rc;

	rc = ferry_sq_submit(sq);
	if (rc < 0)
		return rc;
	for (;;) {
		struct ferry_cqe cqe;

		rc = ferry_cq_wait(cq, &cqe, 1, 1000000000ll);
		if (rc == 1 && cqe.user_data == ud) {
			*out = cqe;
			return 0;
		}
		if (rc == 1) {
			/* Not ours (the CANCEL below): drop what it holds. */
			if (cqe.flags & FERRY_CQE_F_BUF)
				ferry_buf_release(cqe.buf);
			continue;
		}
		if (cancel_at && !cancelled && stage_now_ns() > cancel_at) {
			struct ferry_sqe *c = take_sqe(s, &sq);

			log_warn("stage %s: op %llx outlived its deadline by %llu ns: cancelling",
				 s->id, (unsigned long long)ud, (unsigned long long)STAGE_GRACE_NS);
			if (c) {
				ferry_prep_cancel(c, ud, ud | (1ull << 63));
				ferry_sqe_set_cq(c, cq);
				ferry_sq_submit(sq);
				cancelled = true;
			}
		}
	}
}

static struct stage_link *find_link(struct ferry_stage *s, const char *from, const char *to,
					  bool sending, const char *what)
{
	for (unsigned i = 0; i < s->nlinks; i++) {
		struct stage_link *l = &s->links[i];

		if (l->sending == sending && !strcmp(l->edge->from, from) &&
		    !strcmp(l->edge->to, to))
			return l;
	}
	log_error("stage %s: %s on %s->%s: not an %s edge of this stage", s->id, what, from, to,
		  sending ? "outgoing" : "incoming");
	return NULL;
}

int ferry_stage_edge(struct ferry_stage *s, const char *from, const char *to,
		     struct ferry_peer **peer, uint32_t *stream_get_flags)
{
	const struct stage_link *l = NULL;

	if (!s || !from || !to || !peer) {
		log_error("ferry_stage_edge: NULL %s", !s ? "stage" : !from ? "from" : !to ? "to"
										: "peer");
		return -EINVAL;
	}
	for (unsigned i = 0; i < s->nlinks && !l; i++)
		if (!strcmp(s->links[i].edge->from, from) && !strcmp(s->links[i].edge->to, to))
			l = &s->links[i];
	if (!l) {
		log_error("stage %s: %s->%s is not an edge of this stage", s->id, from, to);
		return -ENOENT;
	}
	*peer = l->peer;
	if (stream_get_flags)
		*stream_get_flags = l->edge->window_size < 0 && l->edge->window_from != STAGE_FROM_BUILTIN
					    ? FERRY_SQE_STREAM_WHOLE
					    : 0;
	return 0;
}

static int check_call(struct ferry_stage *s, const char *from, const char *to, const char *key,
		      const char *what)
{
	if (!s || !from || !to || !key) {
		log_error("%s: NULL %s", what, !s ? "stage" : !from ? "from" : !to ? "to" : "key");
		return -EINVAL;
	}
	if (!*key) {
		log_error("%s: empty key", what);
		return -EINVAL;
	}
	if (strlen(key) >= FERRY_KEY_MAX) {
		log_error("%s: key longer than %d bytes", what, FERRY_KEY_MAX - 1);
		return -ENAMETOOLONG;
	}
	return 0;
}

/* FNV-1a of "{key}@{from}_{to}": the metadata blob names the stored key. */
static uint64_t key_hash(const char *key, const char *from_engine, const char *to_engine)
{
	const char *parts[5] = { key, "@", from_engine, "_", to_engine };
	uint64_t h = 1469598103934665603ull;

	for (unsigned i = 0; i < 5; i++)
		for (const unsigned char *c = (const unsigned char *)parts[i]; *c; c++)
			h = (h ^ *c) * 1099511628211ull;
	return h;
}
/*
 * Stages start in any order: a put waits for the receiving stage's engine to
 * be up (FERRY_SQE_WAIT_PEER: the engine tries it again, within the put's
 * deadline), whatever the transport.
 */
static int do_put(struct ferry_stage *s, const char *from, const char *to, const char *key,
		  const struct iovec *iov, struct ferry_buf *buf, uint64_t *size,
		  struct ferry_stage_meta *meta)
{
	struct stage_link *l;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	struct ferry_sq *sq;
	struct ferry_cq *cq;
	uint64_t ud;
	int rc;

	if ((rc = check_call(s, from, to, key, "ferry_stage_put")))
		goto fail;
	if (!(l = find_link(s, from, to, true, "put"))) {
		rc = -EINVAL;
		goto fail;
	}
	if ((rc = thread_cq(s, &cq)))
		goto fail;
	if (!(sqe = take_sqe(s, &sq))) {
		rc = -EBUSY;
		goto fail;
	}
	ud = atomic_fetch_add(&s->next_ud, 1);
	/*
	 * Store-like edges keep the data here (PUBLISH: fetched by the gets);
	 * others wait for the receiving stage to be up, within the deadline.
	 */
	if (l->edge->key_lookup && buf)
		ferry_prep_publish_buf(sqe, l->peer, key, buf, ud);
	else if (l->edge->key_lookup)
		ferry_prep_publish(sqe, l->peer, key, iov, 1, ud);
	else if (buf)
		ferry_prep_put_buf(sqe, l->peer, key, buf, ud);
	else
		ferry_prep_put(sqe, l->peer, key, iov, 1, ud);
	buf = NULL; /* the SQE owns it now */
	if (!l->edge->key_lookup)
		ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_cq(sqe, cq);
	ferry_sqe_set_timeout(sqe, s->timeout_ns);
	if ((rc = submit_wait(s, sq, cq, ud, s->timeout_ns, &cqe)))
		return rc;
	if (cqe.res < 0) {
		if (cqe.res == -ETIMEDOUT)
			log_error("stage %s: put %s on %s->%s: %s did not take it within %llu ms "
				  "(is it running?)", s->id, key, from, to, ferry_peer_name(l->peer),
				  (unsigned long long)(s->timeout_ns / 1000000));
		return cqe.res;
	}
	if (size)
		*size = cqe.len;
	if (meta) {
		struct stage_meta_wire w = { .magic = META_MAGIC, .version = META_VERSION };

		w.transport = (uint8_t)l->edge->transport;
		w.len = cqe.len;
		w.key_hash = key_hash(key, ferry_engine_name(s->e), ferry_peer_name(l->peer));
		w.put_ns = stage_now_ns();
		snprintf(w.from, sizeof(w.from), "%s", from);
		snprintf(w.to, sizeof(w.to), "%s", to);
		memcpy(meta->opaque, &w, sizeof(w));
	}
	return 0;
fail:
	if (buf)
		ferry_buf_release(buf);
	return rc;
}

int ferry_stage_put(struct ferry_stage *s, const char *from, const char *to, const char *key,
		    const void *data, size_t len, uint64_t *size, struct ferry_stage_meta *meta)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };

	if (!data && len) {
		log_error("ferry_stage_put: NULL data of %zu bytes", len);
		return -EINVAL;
	}
	return do_put(s, from, to, key, &iov, NULL, size, meta);
}

int ferry_stage_put_buf(struct ferry_stage *s, const char *from, const char *to,
			const char *key, struct ferry_buf *buf, uint64_t *size,
			struct ferry_stage_meta *meta)
{
	if (!buf) {
		log_error("ferry_stage_put_buf: NULL buffer");
		return -EINVAL;
	}
	return do_put(s, from, to, key, NULL, buf, size, meta);
}

int ferry_stage_get(struct ferry_stage *s, const char *from, const char *to, const char *key,
		    const struct ferry_stage_meta *meta, int64_t timeout_ns, uint32_t flags,
		    struct ferry_buf **out)
{
	const struct stage_link *l;
	struct stage_meta_wire w;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	struct ferry_sq *sq;
	struct ferry_cq *cq;
	uint64_t ud, bound;
	int rc;

	if (out)
		*out = NULL;
	if ((rc = check_call(s, from, to, key, "ferry_stage_get")))
		return rc;
	if (!out || (flags & ~FERRY_STAGE_NOWAIT)) {
		log_error("ferry_stage_get: %s", out ? "unknown flags" : "NULL out");
		return -EINVAL;
	}
	if (!(l = find_link(s, from, to, false, "get")))
		return -EINVAL;
	if (meta) {
		memcpy(&w, meta->opaque, sizeof(w));
		if (w.magic != META_MAGIC || w.version != META_VERSION) {
			log_error("stage %s: get %s on %s->%s: the metadata is not ferry's (or of "
				  "another version)", s->id, key, from, to);
			return -EINVAL;
		}
		if (strncmp(w.from, from, sizeof(w.from)) || strncmp(w.to, to, sizeof(w.to)) ||
		    w.key_hash != key_hash(key, ferry_peer_name(l->peer), ferry_engine_name(s->e))) {
			log_error("stage %s: get %s on %s->%s: the metadata was made for another "
				  "key or edge", s->id, key, from, to);
			return -EINVAL;
		}
	}
	if ((rc = thread_cq(s, &cq)))
		return rc;
	if (!(sqe = take_sqe(s, &sq)))
		return -EBUSY;
	ud = atomic_fetch_add(&s->next_ud, 1);
	if (l->edge->key_lookup)
		ferry_prep_fetch(sqe, l->peer, key, NULL, 0, ud); /* ask the holder */
	else
		ferry_prep_get(sqe, l->peer, key, NULL, 0, ud);
	ferry_sqe_set_cq(sqe, cq);
	if (flags & FERRY_STAGE_NOWAIT)
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
	bound = timeout_ns > 0 ? (uint64_t)timeout_ns
	      : timeout_ns < 0 ? 0
	      : l->get_timeout_ns ? l->get_timeout_ns : s->timeout_ns;
	ferry_sqe_set_timeout(sqe, bound);
	if ((rc = submit_wait(s, sq, cq, ud, bound, &cqe)))
		return rc;
	if (cqe.res < 0) {
		if (cqe.flags & FERRY_CQE_F_BUF)
			ferry_buf_release(cqe.buf);
		return cqe.res;
	}
	if (meta && w.len != cqe.len)
		log_warn("stage %s: get %s on %s->%s: %llu bytes, the metadata said %llu", s->id,
			 key, from, to, (unsigned long long)cqe.len, (unsigned long long)w.len);
	*out = cqe.buf;
	return 0;
}

int ferry_stage_cleanup(struct ferry_stage *s, const char *request_id)
{
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	struct ferry_sq *sq;
	struct ferry_cq *cq;
	uint64_t ud;
	int rc;

	if (!s || !request_id || !*request_id) {
		log_error("ferry_stage_cleanup: %s", !s ? "NULL stage" : "empty request id");
		return -EINVAL;
	}
	if (strlen(request_id) >= FERRY_KEY_MAX) {
		log_error("ferry_stage_cleanup: request id longer than %d bytes", FERRY_KEY_MAX - 1);
		return -ENAMETOOLONG;
	}
	if ((rc = thread_cq(s, &cq)))
		return rc;
	if (!(sqe = take_sqe(s, &sq)))
		return -EBUSY;
	ud = atomic_fetch_add(&s->next_ud, 1);
	/* Every key of this engine came in on one of this stage's edges. */
	ferry_prep_cleanup(sqe, NULL, request_id, ud);
	ferry_sqe_set_cq(sqe, cq);
	if ((rc = submit_wait(s, sq, cq, ud, 0, &cqe)))
		return rc;
	return cqe.res;
}

/* ------------------------------------------------------------------ */
/* Health                                                              */
/* ------------------------------------------------------------------ */

struct out_text {
	char *p;
	size_t cap, len;
};

static void outf(struct out_text *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out_text *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(o->len < o->cap ? o->p + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0,
		      fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

int ferry_stage_health(struct ferry_stage *s, char *buf, size_t len)
{
	struct out_text o = { buf, len, 0 };
	int n;

	if (!s || (!buf && len)) {
		log_error("ferry_stage_health: NULL %s", s ? "buf" : "stage");
		return -EINVAL;
	}
	outf(&o, "{\"stage\":\"%s\",\"rank\":%u,\"config\":\"", s->id, s->rank);
	for (const char *c = s->graph->file; *c; c++)
		outf(&o, *c == '"' || *c == '\\' ? "\\%c" : (unsigned char)*c < 0x20 ? "?" : "%c", *c);
	outf(&o, "\",\"edges\":[");
	for (unsigned i = 0; i < s->nlinks; i++) {
		const struct stage_link *l = &s->links[i];
		const struct stage_edge *e = l->edge;

		outf(&o, "%s{\"from\":\"%s\",\"to\":\"%s\",\"role\":\"%s\",\"peer\":\"%s\","
			 "\"transport\":\"%s\",\"connector\":\"%s\",\"auto_filled\":%s,"
			 "\"window_size\":%lld,\"max_inflight\":%lld}",
		     i ? "," : "", e->from, e->to, l->sending ? "sender" : "receiver",
		     ferry_peer_name(l->peer), stage_transport_name(e->transport), e->connector_type,
		     e->auto_filled ? "true" : "false", (long long)e->window_size,
		     (long long)e->max_inflight);
	}
	outf(&o, "],\"engine\":");
	n = ferry_engine_health(s->e, o.len < o.cap ? o.p + o.len : NULL,
				o.len < o.cap ? o.cap - o.len : 0);
	if (n < 0)
		return n;
	o.len += (size_t)n;
	outf(&o, "}");
	if (buf && len && o.len >= len)
		buf[len - 1] = '\0';
	return o.len > (size_t)INT32_MAX ? INT32_MAX : (int)o.len;
}

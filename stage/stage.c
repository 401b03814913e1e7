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
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.h"
#include "ferry/stage.h"
#include "internal.h"
#include "shm_sock.h"

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
	_Atomic bool reached;          /* a put got through: the peer stage runs */
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

/*
 * Where the receiving rank `rank` of stage `to` listens for a tcp edge:
 * "tcp://HOST:PORT" with HOST the edge's `host` (127.0.0.1 when absent or
 * "auto") and PORT upstream's scheme, zmq_port + stage + 16 * rank (the
 * stage's number when its id is one, else 0), so that edges sharing a base
 * port and ranks of one stage do not collide. Both ends compute the same.
 * listen != 0 gives the address to bind instead ("*" for an "auto" host).
 */
static int tcp_endpoint(const struct stage_edge *edge, const char *to, unsigned rank,
			char *out, size_t len)
{
	const char *host = edge->host && *edge->host && strcmp(edge->host, "auto") ? edge->host
										   : NULL;
	char *end;
	unsigned long stage = strtoul(to, &end, 10);
	int port;

	if (*end || stage > 65535)
		stage = 0;
	if (!edge->port) {
		log_error("edge %s->%s: a tcp edge needs a port (zmq_port/port in its connector's "
			  "extra): the sending stage could not find port 0", edge->from, edge->to);
		return -EINVAL;
	}
	port = ferry_port_compat(edge->port, 0, (uint32_t)stage, rank);
	if (port < 0) {
		log_error("edge %s->%s: port %u + stage %lu + 16 * rank %u is not a port",
			  edge->from, edge->to, edge->port, stage, rank);
		return port;
	}
	snprintf(out, len, "tcp://%s:%d", host ? host : "127.0.0.1", port);
	return 0;
}

/*
 * The endpoint this stage's engine listens on: every tcp edge it receives
 * on must agree on it (an engine has one). "" when it receives no tcp edge.
 * With control: the control endpoint of a stage that holds the data of
 * key-lookup edges it sends on (the consumers call it there), computed by
 * the same scheme with the sending stage's number; all must agree too.
 * Key-lookup edges make their receiver listen on no fixed port.
 */
static int stage_listen(const struct stage_graph *g, const char *id, unsigned rank, bool control,
			char *out, size_t len)
{
	const struct stage_edge *first = NULL;

	out[0] = '\0';
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *edge = &g->edges[i];
		char ep[128];
		int rc;

		if (strcmp(control ? edge->from : edge->to, id) ||
		    edge->transport != STAGE_TRANSPORT_TCP || edge->key_lookup != control)
			continue;
		if ((rc = tcp_endpoint(edge, id, rank, ep, sizeof(ep))))
			return rc;
		if (!first) {
			first = edge;
			snprintf(out, len, "%s", ep);
		} else if (strcmp(out, ep)) {
			log_error("stage %s rank %u: %s edges %s->%s (%s:%d:%d) and %s->%s (%s:%d:%d) "
				  "ask it to listen on %s and %s; an engine listens on one",
				  id, rank, control ? "key-lookup" : "tcp", first->from, first->to,
				  g->file, first->line, first->column, edge->from, edge->to, g->file,
				  edge->line, edge->column, out, ep);
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * A stage that receives a key-lookup edge (MooncakeStoreConnector,
 * YuanrongConnector) and listens for no tcp data otherwise: where its data
 * path listens so the holder can send it what it asks for. Port 0 (the
 * control channel publishes the port); the edge's host when it is this
 * machine's loopback or absent, else every interface (the holder sends to
 * the address it saw the call come from).
 */
static void lookup_data_listen(const struct stage_graph *g, const char *id, char *out,
			       size_t len)
{
	out[0] = '\0';
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *edge = &g->edges[i];
		bool local;

		if (strcmp(edge->to, id) || !edge->key_lookup ||
		    edge->transport != STAGE_TRANSPORT_TCP)
			continue;
		local = !edge->host || !*edge->host || !strcmp(edge->host, "auto") ||
			!strncmp(edge->host, "127.", 4) || !strcmp(edge->host, "localhost");
		snprintf(out, len, "%s", local ? "tcp://127.0.0.1:0" : "tcp://*:0");
		return;
	}
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
		char name[FERRY_NAME_MAX];
		int rc;

		if (strcmp(edge->from, s->id) && strcmp(edge->to, s->id))
			continue;
		l->edge = edge;
		l->sending = !strcmp(edge->from, s->id);
		other = stage_graph_stage(g, l->sending ? edge->to : edge->from);
		if (edge->transport == STAGE_TRANSPORT_RDMA) {
			log_error("stage %s rank %u: edge %s->%s (%s, %s:%d:%d %s) needs the %s "
				  "transport, which this build does not have yet", s->id, s->rank,
				  edge->from, edge->to, edge->connector_type, g->file, edge->line,
				  edge->column, edge->where, stage_transport_name(edge->transport));
			return -EPROTONOSUPPORT;
		}
		rc = stage_engine_name(other->id, stage_peer_rank(s->rank, other->ranks), name,
				       sizeof(name));
		if (rc || (rc = ferry_peer_open(s->e, name, &l->peer)))
			return rc;
		if (edge->transport == STAGE_TRANSPORT_TCP && edge->key_lookup) {
			/*
			 * Store-like: the sender keeps what it puts (PUBLISH) and
			 * listens for control; the receiver calls it there, and its
			 * gets fetch from it. Data addresses travel in the handshake.
			 */
			char ep[128];

			if (!l->sending) {
				rc = tcp_endpoint(edge, other->id,
						  stage_peer_rank(s->rank, other->ranks), ep,
						  sizeof(ep));
				if (rc || (rc = ferry_peer_connect(l->peer, ep)))
					return rc;
			}
			atomic_store(&l->reached, true); /* a put publishes here */
		} else if (edge->transport == STAGE_TRANSPORT_TCP && l->sending) {
			/* We push to the receiving stage, which listens; its credits
			 * and results come back on our connection. */
			char ep[128];

			rc = tcp_endpoint(edge, other->id,
					  stage_peer_rank(s->rank, other->ranks), ep,
					  sizeof(ep));
			if (rc || (rc = ferry_peer_set_address(l->peer, ep)))
				return rc;
			/*
			 * Not reached until a PUT went through: nothing can be
			 * probed over tcp, so puts retry while the receiver is not
			 * up, and a buffer goes as a copy until then (a refused PUT
			 * of a buffer frees it).
			 */
		}
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
	char name[FERRY_NAME_MAX], listen[128], control[128];
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
	if ((rc = stage_listen(s->graph, s->id, s->rank, false, listen, sizeof(listen))) ||
	    (rc = stage_listen(s->graph, s->id, s->rank, true, control, sizeof(control))))
		goto fail;
	if (!listen[0] && !control[0])
		lookup_data_listen(s->graph, s->id, listen, sizeof(listen));
	ep.listen = listen[0] ? listen : NULL;
	ep.control = control[0] ? control : NULL;
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
		ferry__spin_step(i * 1000ull);
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
	uint64_t cancel_at = timeout_ns ? ferry__now_ns() + timeout_ns + STAGE_GRACE_NS : 0;
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
		if (cancel_at && !cancelled && ferry__now_ns() > cancel_at) {
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

static uint64_t key_hash(const char *key, const char *from_engine, const char *to_engine)
{
	char full[FULLKEY_MAX];
	int n = keytable_compose(full, key, strlen(key), from_engine, to_engine);

	return n < 0 ? 0 : keytable_hash(full, (size_t)n);
}

/*
 * Stages start in any order: before the first put on an edge, wait (up to
 * deadline) until the receiving stage's engine holds its name. The probe is
 * a health request on its shm name (any answer, even a cut or a late one,
 * says somebody listens); only "nobody holds the name" means wait.
 */
static int wait_peer(struct ferry_stage *s, struct stage_link *l, uint64_t deadline)
{
	unsigned pause_us = 1000;
	char probe[64];

	for (;;) {
		int rc = shm_health_query(s->e->ns, l->peer->name, probe, sizeof(probe), 200);

		if (rc != -EHOSTUNREACH) {
			atomic_store(&l->reached, true);
			return 0;
		}
		if (ferry__now_ns() + pause_us * 1000ull > deadline) {
			log_error("stage %s: put on %s->%s: %s is not running", s->id,
				  l->edge->from, l->edge->to, l->peer->name);
			return -EHOSTUNREACH;
		}
		usleep(pause_us);
		if (pause_us < 50000)
			pause_us *= 2;
	}
}

static int do_put(struct ferry_stage *s, const char *from, const char *to, const char *key,
		  const struct iovec *iov, struct ferry_buf *buf, uint64_t *size,
		  struct ferry_stage_meta *meta)
{
	struct stage_link *l;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	struct ferry_sq *sq;
	struct ferry_cq *cq;
	struct ferry_buf *kept = NULL; /* a buffer sent as a copy, released at the end */
	struct iovec copy;
	uint64_t ud, deadline;
	int rc;

	if ((rc = check_call(s, from, to, key, "ferry_stage_put")))
		goto fail;
	if (!(l = find_link(s, from, to, true, "put"))) {
		rc = -EINVAL;
		goto fail;
	}
	if (buf && l->edge->transport == STAGE_TRANSPORT_TCP && !l->edge->key_lookup &&
	    !atomic_load_explicit(&l->reached, memory_order_relaxed)) {
		/*
		 * Over tcp a stage that is not up yet refuses, and a refused PUT
		 * of a buffer frees it: until the edge has carried a PUT, send a
		 * copy (retried like any iovec) and keep the buffer.
		 */
		copy.iov_base = ferry_buf_data(buf);
		copy.iov_len = ferry_buf_len(buf);
		iov = &copy;
		kept = buf;
		buf = NULL;
	}
	if ((rc = thread_cq(s, &cq)))
		goto fail;
	deadline = ferry__now_ns() + s->timeout_ns;
	for (;;) {
		uint64_t now = ferry__now_ns();

		if (!atomic_load_explicit(&l->reached, memory_order_relaxed) &&
		    l->edge->transport != STAGE_TRANSPORT_TCP && (rc = wait_peer(s, l, deadline)))
			goto fail;
		if (!(sqe = take_sqe(s, &sq))) {
			rc = -EBUSY;
			goto fail;
		}
		ud = atomic_fetch_add(&s->next_ud, 1);
		if (buf)
			ferry_prep_put_buf(sqe, l->peer, key, buf, ud);
		else
			ferry_prep_put(sqe, l->peer, key, iov, 1, ud);
		buf = NULL; /* the SQE owns it now */
		if (l->edge->key_lookup)
			ferry_sqe_set_flags(sqe, FERRY_SQE_PUBLISH); /* held here, fetched by gets */
		ferry_sqe_set_cq(sqe, cq);
		ferry_sqe_set_timeout(sqe, deadline > now ? deadline - now : 1);
		if ((rc = submit_wait(s, sq, cq, ud, deadline > now ? deadline - now : 1, &cqe))) {
			if (kept)
				ferry_buf_release(kept); /* the submit failed: nothing reads it */
			return rc;
		}
		/* The peer went away (restarting?): an iovec can be sent again. */
		if (cqe.res == -EHOSTUNREACH && iov && ferry__now_ns() < deadline &&
		    l->edge->transport != STAGE_TRANSPORT_TCP) {
			atomic_store(&l->reached, false);
			continue;
		}
		/* Over tcp nothing can be probed: a stage not up yet refuses; retry. */
		if ((cqe.res == -ECONNREFUSED || cqe.res == -EHOSTUNREACH ||
		     cqe.res == -ECONNRESET) && iov && l->edge->transport == STAGE_TRANSPORT_TCP &&
		    ferry__now_ns() + 20000000ull < deadline) {
			usleep(20000);
			continue;
		}
		break;
	}
	if (kept)
		ferry_buf_release(kept);
	if (cqe.res < 0)
		return cqe.res;
	atomic_store_explicit(&l->reached, true, memory_order_relaxed);
	if (size)
		*size = cqe.len;
	if (meta) {
		struct stage_meta_wire w = { .magic = META_MAGIC, .version = META_VERSION };

		w.transport = (uint8_t)l->edge->transport;
		w.len = cqe.len;
		w.key_hash = key_hash(key, s->e->name, l->peer->name);
		w.put_ns = ferry__now_ns();
		snprintf(w.from, sizeof(w.from), "%s", from);
		snprintf(w.to, sizeof(w.to), "%s", to);
		memcpy(meta->opaque, &w, sizeof(w));
	}
	return 0;
fail:
	if (buf)
		ferry_buf_release(buf);
	if (kept)
		ferry_buf_release(kept);
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
		    w.key_hash != key_hash(key, l->peer->name, s->e->name)) {
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
	ferry_prep_get(sqe, l->peer, key, NULL, 0, ud);
	ferry_sqe_set_cq(sqe, cq);
	if (flags & FERRY_STAGE_NOWAIT)
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
	if (l->edge->key_lookup)
		ferry_sqe_set_flags(sqe, FERRY_SQE_LOOKUP); /* ask the holder */
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
		     l->peer->name, stage_transport_name(e->transport), e->connector_type,
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

/*
 * engine/engine.c - engine lifecycle, peers, buffers and health.
 *
 * Owns: checking and defaulting the creation parameters, building an engine
 * (pool, reactor, default CQ, transport, reactor thread) and tearing it down
 * in the order that lets every pending op complete; peer handles; the
 * public buffer calls (thin checks over pool/); the health JSON.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static _Atomic uint64_t next_engine_id = 1;

#define MIB (1024ull * 1024ull)

/* A character of an engine or peer name, or of a namespace. */
static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_' || c == ':';
}

bool ferry__name_valid(const char *s)
{
	size_t n = s ? strnlen(s, FERRY_NAME_MAX) : 0;

	if (n == 0 || n >= FERRY_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!name_char(s[i]))
			return false;
	return true;
}

static int check_name(const char *what, const char *s)
{
	size_t n;

	if (!s || !*s) {
		log_error("engine params: %s is missing", what);
		return -EINVAL;
	}
	n = strnlen(s, FERRY_NAME_MAX);
	if (n >= FERRY_NAME_MAX) {
		log_error("engine params: %s longer than %d bytes", what, FERRY_NAME_MAX - 1);
		return -ENAMETOOLONG;
	}
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!name_char(c)) {
			log_error("engine params: %s \"%s\" has '%c' (allowed: letters, digits, "
				  ". - _ :)", what, s, c);
			return -EINVAL;
		}
	}
	return 0;
}

static int take_params(const struct ferry_engine_params *in, struct ferry_engine_params *p)
{
	static const size_t v0 = offsetof(struct ferry_engine_params, flags) + sizeof(uint32_t);
	int rc;

	if (!in) {
		log_error("ferry_engine_create: NULL params");
		return -EINVAL;
	}
	if (in->size < v0 || in->size > sizeof(*p)) {
		log_error("ferry_engine_create: params size %zu unknown (use "
			  "FERRY_ENGINE_PARAMS_INIT)", in->size);
		return -EINVAL;
	}
	memset(p, 0, sizeof(*p));
	memcpy(p, in, in->size);
	if ((rc = check_name("name", p->name)))
		return rc;
	if (!p->ns)
		p->ns = "default";
	if ((rc = check_name("namespace", p->ns)))
		return rc;
	if (p->config_path) {
		log_error("ferry_engine_create: config_path is not read here: open a stage of a "
			  "YAML with ferry_stage_open(), which creates the engine and wires its "
			  "edges");
		return -EOPNOTSUPP;
	}
#ifndef FERRY_HAVE_RDMA_TRANSPORT
	if (p->rdma_listen) {
		log_error("ferry_engine_create: rdma_listen %s: this build has no rdma transport "
			  "(libibverbs and librdmacm were not found)", p->rdma_listen);
		return -EPROTONOSUPPORT;
	}
#endif
	if ((unsigned)p->progress >= FERRY_PROGRESS__MAX) {
		log_error("ferry_engine_create: unknown progress mode %d", (int)p->progress);
		return -EINVAL;
	}
	if (p->flags & ~(FERRY_ENGINE_NO_PREFAULT | FERRY_ENGINE_BUSY_POLL |
			 FERRY_ENGINE_SINGLE_POLLER)) {
		log_error("ferry_engine_create: unknown flags 0x%x", p->flags);
		return -EINVAL;
	}
	if ((p->flags & FERRY_ENGINE_SINGLE_POLLER) && p->progress != FERRY_PROGRESS_MANUAL) {
		log_error("ferry_engine_create: FERRY_ENGINE_SINGLE_POLLER needs "
			  "FERRY_PROGRESS_MANUAL (a THREAD engine's rounds are its reactor's)");
		return -EINVAL;
	}
	if (!p->pool_size)
		p->pool_size = 64 * MIB;
	if (p->pool_size > (1ull << 40)) {
		log_error("ferry_engine_create: pool of %zu bytes is more than 1 TiB", p->pool_size);
		return -EINVAL;
	}
	if (!p->spin_ns)
		p->spin_ns = 50000;
	if (!p->max_ops)
		p->max_ops = 4096;
	if (!p->sq_entries)
		p->sq_entries = 256;
	if (!p->cq_entries)
		p->cq_entries = 4096;
	if (!p->max_keys)
		p->max_keys = 16384;
	if (!p->max_bufs)
		p->max_bufs = 65536;
	if (p->max_ops > (1u << 20) || p->sq_entries > (1u << 16) || p->cq_entries > (1u << 24) ||
	    p->max_keys > (1u << 24)) {
		log_error("ferry_engine_create: a table size is out of range (max_ops <= 2^20, "
			  "sq_entries <= 2^16, cq_entries <= 2^24, max_keys <= 2^24)");
		return -EINVAL;
	}
	if (p->sq_entries & (p->sq_entries - 1)) {
		uint32_t n = 1;

		while (n < p->sq_entries)
			n <<= 1;
		p->sq_entries = n;
	}
	return 0;
}

static void engine_free(struct ferry_engine *e)
{
	struct ferry_cq *cq, *next;

	for (unsigned i = e->nbackends; i-- > 0;) {
		memory_transport_down(e, &e->backends[i]);
		if (e->backends[i].data)
			e->backends[i].ops->fini(e, &e->backends[i]);
	}
	for (cq = e->cqs; cq; cq = next) {
		next = cq->next;
		cq_fini(cq);
		free(cq);
	}
	for (cq = e->dead_cqs; cq; cq = next) {
		next = cq->next;
		cq_fini(cq);
		free(cq);
	}
	cq_fini(&e->default_cq);
	reactor_fini(e);
	while (e->peers) {
		struct ferry_peer *p = e->peers;

		e->peers = p->next;
		free(p);
	}
	sq_free_all(e);
	memory_fini(e);
	if (e->pool)
		pool_release_owner(e->pool);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

_Static_assert(ENGINE_MAX_BACKENDS <= 32, "a bit per transport in an engine's awake mask");

static int add_backend(struct ferry_engine *e, const struct backend_ops *ops)
{
	struct backend *b;
	int rc;

	if (e->nbackends >= ENGINE_MAX_BACKENDS) {
		log_error("engine %s: no room for transport %s (ENGINE_MAX_BACKENDS %d)", e->name,
			  ops->name, ENGINE_MAX_BACKENDS);
		return -ENOSPC;
	}
	b = &e->backends[e->nbackends];
	b->ops = ops;
	b->index = (uint8_t)e->nbackends;
	b->data = NULL;
	b->awake = &e->awake;
	atomic_fetch_or_explicit(&e->awake, 1u << b->index, memory_order_relaxed);
	rc = ops->init(e, b);
	if (!rc && (rc = memory_transport_up(e, b)))
		ops->fini(e, b);
	if (rc) {
		atomic_fetch_and_explicit(&e->awake, ~(1u << b->index), memory_order_relaxed);
		return rc;
	}
	e->nbackends++;
	e->round_progress[b->index] = ops->progress;
	if (ops->round_end) {
		e->round_end[b->index] = ops->round_end;
		e->has_end |= 1u << b->index;
	}
	if (ops->sqs_drained) {
		e->round_drained[b->index] = ops->sqs_drained;
		e->has_drained |= 1u << b->index;
	}
	return 0;
}

/* Every transport of the registry, in rank order (lowest first; ties: the table's order). */
static int add_transports(struct ferry_engine *e)
{
	const struct backend_ops *order[ENGINE_MAX_BACKENDS];
	unsigned n = 0;
	int rc = 0;

	for (unsigned i = 0; ferry__transports[i]; i++) {
		unsigned j = n;

		if (n == ENGINE_MAX_BACKENDS) {
			log_error("engine %s: more transports than ENGINE_MAX_BACKENDS (%d)", e->name,
				  ENGINE_MAX_BACKENDS);
			return -ENOSPC;
		}
		for (; j > 0 && order[j - 1]->rank > ferry__transports[i]->rank; j--)
			order[j] = order[j - 1];
		order[j] = ferry__transports[i];
		n++;
	}
	for (unsigned i = 0; !rc && i < n; i++)
		rc = add_backend(e, order[i]);
	return rc;
}

int ferry_engine_create(const struct ferry_engine_params *params, struct ferry_engine **out)
{
	struct ferry_engine_params p;
	struct pool_params pp = { 0 };
	char data_listen[160];
	struct ferry_engine *e;
	int rc;

	if (!out) {
		log_error("ferry_engine_create: NULL out");
		return -EINVAL;
	}
	*out = NULL;
	if ((rc = take_params(params, &p)))
		return rc;
	e = aligned_alloc(CACHELINE, sizeof(*e));
	if (!e)
		return -ENOMEM;
	memset(e, 0, sizeof(*e));
	pthread_mutex_init(&e->lock, NULL);
	e->id = atomic_fetch_add(&next_engine_id, 1);
	snprintf(e->name, sizeof(e->name), "%s", p.name);
	snprintf(e->ns, sizeof(e->ns), "%s", p.ns);
	e->mode = p.progress;
	e->asym_fences = fence_engine_asym(p.flags & FERRY_ENGINE_BUSY_POLL);
	e->single_poller = p.flags & FERRY_ENGINE_SINGLE_POLLER;
	e->spin_ns = p.spin_ns;
	e->sq_entries = p.sq_entries;
	e->max_ops = p.max_ops;
	e->max_keys = p.max_keys;
	e->max_bufs = p.max_bufs;
	e->handshake_ns = (p.size > offsetof(struct ferry_engine_params, handshake_ms) &&
			   p.handshake_ms ? p.handshake_ms : 3000) * 1000000ull;
	e->created_ns = ferry__now_ns();
	e->doorbell_fd = -1;
	e->ring.ring_fd = -1;
	e->wake_fd = -1;
	e->lease_slot = -1;

	pp.size = p.pool_size;
	pp.max_bufs = p.max_bufs;
	pp.name = e->name;
	pp.prefault = !(p.flags & FERRY_ENGINE_NO_PREFAULT);
	if ((rc = pool_create(&pp, &e->pool)) ||
	    (rc = cq_init(e, &e->default_cq, p.cq_entries, true)) ||
	    (rc = reactor_init(e)))
		goto fail;
	/*
	 * The transports of the registry, in rank order (engine/registry.c).
	 * With a control endpoint and no data endpoint, the data path listens
	 * on the control endpoint's host, port 0, and the control channel
	 * publishes it.
	 */
	e->create_params = &p;
	if (p.size > offsetof(struct ferry_engine_params, control) && p.control && !p.listen) {
		const char *colon = strrchr(p.control, ':');

		if (colon && (size_t)(colon - p.control) < sizeof(data_listen) - 3) {
			snprintf(data_listen, sizeof(data_listen), "%.*s:0",
				 (int)(colon - p.control), p.control);
			p.listen = data_listen;
		}
	}
	rc = add_transports(e);
	e->create_params = NULL;
	if (rc)
		goto fail;
	if (e->mode == FERRY_PROGRESS_THREAD) {
		atomic_store(&e->progress_busy, 1); /* the thread owns progress */
		rc = -pthread_create(&e->thread, NULL, reactor_thread_main, e);
		if (rc) {
			log_error("engine %s: reactor thread: %s", e->name, ferry_strerror(rc));
			goto fail;
		}
		e->thread_started = true;
		reactor_lease_slot_take(e);
	}
	log_debug("engine %s/%s created (%s mode, pool %zu bytes)", e->ns, e->name,
		  e->mode == FERRY_PROGRESS_THREAD ? "thread" : "manual", p.pool_size);
	*out = e;
	return 0;
fail:
	engine_free(e);
	return rc;
}

int ferry_engine_destroy(struct ferry_engine *e)
{
	if (!e) {
		log_error("ferry_engine_destroy: NULL engine");
		return -EINVAL;
	}
	atomic_store(&e->closing, 1);
	if (e->thread_started) {
		uint64_t one = 1;

		reactor_lease_slot_give(e); /* no thread ends a lease here any more */

		atomic_store(&e->stop, 1);
		if (write(e->doorbell_fd, &one, sizeof(one)) < 0)
			log_warn("engine %s: doorbell write: %s", e->name, ferry_strerror(-errno));
		pthread_join(e->thread, NULL);
	} else {
		while (!progress_try_lock(e))
			cpu_relax();
	}
	/* Stop arrivals first: what other engines sent us is answered. */
	for (unsigned i = e->nbackends; i-- > 0;) {
		memory_transport_down(e, &e->backends[i]);
		if (e->backends[i].data)
			e->backends[i].ops->fini(e, &e->backends[i]);
	}
	reactor_shutdown(e);
	engine_free(e);
	return 0;
}

const char *ferry_engine_name(const struct ferry_engine *e)
{
	return e ? e->name : NULL;
}

const char *ferry_engine_ns(const struct ferry_engine *e)
{
	return e ? e->ns : NULL;
}

/* ------------------------------------------------------------------ */
/* Peers                                                               */
/* ------------------------------------------------------------------ */

int ferry_peer_open(struct ferry_engine *e, const char *name, struct ferry_peer **out)
{
	struct ferry_peer *p;
	int rc;

	if (!e || !out) {
		log_error("ferry_peer_open: NULL %s", e ? "out" : "engine");
		return -EINVAL;
	}
	if ((rc = check_name("peer name", name)))
		return rc;
	pthread_mutex_lock(&e->lock);
	for (p = e->peers; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			break;
	if (!p && (p = calloc(1, sizeof(*p)))) {
		p->engine = e;
		snprintf(p->name, sizeof(p->name), "%s", name);
		key_suffix_make(&p->from_sfx, p->name, e->name);
		key_suffix_make(&p->to_sfx, e->name, p->name);
		p->next = e->peers;
		__atomic_store_n(&e->peers, p, __ATOMIC_RELEASE); /* ferry__peers_first */
	}
	pthread_mutex_unlock(&e->lock);
	if (!p)
		return -ENOMEM;
	*out = p;
	return 0;
}

const char *ferry_peer_name(const struct ferry_peer *p)
{
	return p ? p->name : NULL;
}

/* The scheme of uri ("tcp" of "tcp://..."): its length, or 0 when it has none. */
static size_t uri_scheme(const char *uri)
{
	const char *sep = uri ? strstr(uri, "://") : NULL;

	return sep && sep > uri && sep - uri < 16 ? (size_t)(sep - uri) : 0;
}

int ferry_peer_connect_uri(struct ferry_peer *p, const char *uri)
{
	struct ferry_engine *e;
	size_t n = uri_scheme(uri);

	if (!p || !uri || !n) {
		log_error("ferry_peer_connect_uri: %s", !p ? "NULL peer" : !uri ? "NULL uri"
							 : "no scheme:// in the uri");
		return -EINVAL;
	}
	e = p->engine;
	for (unsigned i = 0; i < e->nbackends; i++) {
		const struct backend_ops *o = e->backends[i].ops;

		if (o->scheme && o->connect && strlen(o->scheme) == n && !memcmp(o->scheme, uri, n))
			return o->connect(e, &e->backends[i], p, uri);
	}
	log_error("ferry_peer_connect_uri: %.*s: no transport of this build takes that scheme",
		  (int)n, uri);
	return -EPROTONOSUPPORT;
}

int ferry_engine_addresses(struct ferry_engine *e, char *buf, size_t len)
{
	size_t total = 0;

	if (!e || (!buf && len)) {
		log_error("ferry_engine_addresses: NULL %s", e ? "buf" : "engine");
		return -EINVAL;
	}
	if (len)
		buf[0] = '\0';
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];
		char one[PEER_ADDR_MAX];
		int m;

		if (!b->ops->address || !b->data ||
		    (m = b->ops->address(e, b, one, sizeof(one))) <= 0 || (size_t)m >= sizeof(one))
			continue;
		if (total && total + 1 < len)
			buf[total] = ' ';
		total += total ? 1 : 0;
		if (total < len)
			snprintf(buf + total, len - total, "%s", one);
		total += (size_t)m;
	}
	if (len && total >= len)
		buf[len - 1] = '\0';
	return total > INT32_MAX ? INT32_MAX : (int)total;
}

int ferry__peer_addr_set(struct ferry_peer *peer, const char *uri)
{
	struct ferry_engine *e = peer->engine;
	size_t n = uri_scheme(uri);
	uint32_t i, have;
	int rc = 0;

	if (!n || strlen(uri) >= PEER_ADDR_MAX)
		return -EINVAL;
	pthread_mutex_lock(&e->lock);
	have = atomic_load_explicit(&peer->naddrs, memory_order_relaxed);
	for (i = 0; i < have; i++)
		if (uri_scheme(peer->addrs[i].uri) == n && !memcmp(peer->addrs[i].uri, uri, n))
			break;
	if (i == PEER_MAX_ADDRS)
		rc = -ENOSPC;
	else
		snprintf(peer->addrs[i].uri, sizeof(peer->addrs[i].uri), "%s", uri);
	if (!rc && i == have)
		atomic_store_explicit(&peer->naddrs, have + 1, memory_order_release);
	pthread_mutex_unlock(&e->lock);
	return rc;
}

bool ferry__peer_addr_get(struct ferry_peer *peer, const char *scheme, char *out, size_t len)
{
	struct ferry_engine *e = peer->engine;
	size_t n = strlen(scheme);
	bool found = false;

	if (!atomic_load_explicit(&peer->naddrs, memory_order_acquire))
		return false; /* the common case: none at all */
	pthread_mutex_lock(&e->lock);
	for (uint32_t i = 0; i < atomic_load_explicit(&peer->naddrs, memory_order_relaxed); i++) {
		if (uri_scheme(peer->addrs[i].uri) == n && !memcmp(peer->addrs[i].uri, scheme, n)) {
			snprintf(out, len, "%s", peer->addrs[i].uri);
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&e->lock);
	return found;
}

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

int ferry_buf_alloc(struct ferry_engine *e, size_t len, struct ferry_buf **out)
{
	if (!e || !out) {
		log_error("ferry_buf_alloc: NULL %s", e ? "out" : "engine");
		return -EINVAL;
	}
	return pool_alloc(e->pool, len, out);
}

void *ferry_buf_data(const struct ferry_buf *b)
{
	return b ? b->data : NULL;
}

size_t ferry_buf_len(const struct ferry_buf *b)
{
	return b ? b->len : 0;
}

int ferry_buf_set_len(struct ferry_buf *b, size_t len)
{
	if (!b || atomic_load(&b->state) != POOL_BUF_LIVE) {
		log_error("ferry_buf_set_len: %s buffer", b ? "dead" : "NULL");
		return -EINVAL;
	}
	if (len > b->cap) {
		log_error("ferry_buf_set_len: %zu bytes exceed the capacity %llu", len,
			  (unsigned long long)b->cap);
		return -EMSGSIZE;
	}
	b->len = len;
	return 0;
}

int ferry_buf_release(struct ferry_buf *b)
{
	if (!b) {
		log_error("ferry_buf_release: NULL buffer");
		return -EINVAL;
	}
	return pool_free(b);
}

int ferry_buf_share(struct ferry_buf *b, uint32_t n, struct ferry_buf **out)
{
	return pool_share(b, n, out);
}

/* ------------------------------------------------------------------ */
/* Health                                                              */
/* ------------------------------------------------------------------ */

struct jbuf {
	char *p;
	size_t cap, len;
};

static void jprintf(struct jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jprintf(struct jbuf *j, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(j->len < j->cap ? j->p + j->len : NULL, j->len < j->cap ? j->cap - j->len : 0,
		      fmt, ap);
	va_end(ap);
	if (n > 0)
		j->len += (size_t)n;
}

static void jhist(struct jbuf *j, const char *name, stat_t *h)
{
	jprintf(j, "\"%s\":{", name);
	for (int i = 0, first = 1; i < 32; i++) {
		uint64_t v = STAT_GET(h[i]);

		if (!v)
			continue;
		jprintf(j, "%s\"%llu\":%llu", first ? "" : ",", 1ull << i, (unsigned long long)v);
		first = 0;
	}
	jprintf(j, "}");
}

int ferry_engine_health(struct ferry_engine *e, char *buf, size_t len)
{
	struct jbuf j = { buf, len, 0 };
	struct engine_stats *s;
	struct pool_stats ps;

	if (!e || (!buf && len)) {
		log_error("ferry_engine_health: NULL %s", e ? "buf" : "engine");
		return -EINVAL;
	}
	s = &e->stats;
	pool_get_stats(e->pool, &ps);
	jprintf(&j, "{\"engine\":\"%s\",\"namespace\":\"%s\",\"transports\":[", e->name, e->ns);
	for (unsigned i = 0; i < e->nbackends; i++)
		jprintf(&j, "%s\"%s\"", i ? "," : "", e->backends[i].ops->name);
	jprintf(&j, "],\"progress\":\"%s\",\"pollers\":\"%s\",\"fences\":\"%s\","
		"\"status\":\"%s\",\"uptime_ns\":%llu,",
		e->mode == FERRY_PROGRESS_THREAD ? "thread" : "manual",
		e->single_poller ? "single" : "any",
		e->asym_fences ? "membarrier" : "symmetric",
		atomic_load(&e->closing) ? "closing" : "ok",
		(unsigned long long)(ferry__now_ns() - e->created_ns));
#define J(name) jprintf(&j, "\"" #name "\":%llu,", (unsigned long long)STAT_GET(s->name))
	jprintf(&j, "\"ops\":{");
	J(submitted); J(completed); J(failed); J(timeouts); J(cancelled); J(nops); J(puts);
	J(gets); J(bytes_put); J(bytes_got); J(copies); J(zero_copies); J(deliveries);
	J(refused);
#undef J
	jprintf(&j, "\"in_flight\":%u,\"keys_held\":%u,\"streams_open\":%u,\"threads\":%u,"
		"\"yields_lost\":%llu,\"poll_leases\":%llu},",
		STAT_GET(e->ops_in_use), STAT_GET(e->keys.present), stream_count(e),
		atomic_load(&e->nsqs), (unsigned long long)STAT_GET(e->yields_lost),
		(unsigned long long)STAT_GET(e->poll_leases));
	jprintf(&j, "\"security\":{\"peers_refused\":%llu,\"handshakes_dropped\":%llu,"
		"\"unproved_connections\":%u},",
		(unsigned long long)STAT_GET(s->peers_refused),
		(unsigned long long)STAT_GET(s->handshakes_dropped),
		atomic_load_explicit(&s->unproved_data, memory_order_relaxed) +
			atomic_load_explicit(&s->unproved_control, memory_order_relaxed));
	jprintf(&j, "\"latency_ns\":{");
	jhist(&j, "put", s->lat_put);
	jprintf(&j, ",");
	jhist(&j, "get", s->lat_get);
	jprintf(&j, "},\"pool\":{\"size\":%llu,\"bytes_in_use\":%llu,\"blocks_in_use\":%llu,"
		"\"largest_free\":%llu,\"fragmentation\":%.4f,\"alloc_failures\":%llu,"
		"\"bad_frees\":%llu},",
		(unsigned long long)ps.size, (unsigned long long)ps.bytes_in_use,
		(unsigned long long)ps.blocks_in_use, (unsigned long long)ps.largest_free,
		ps.fragmentation, (unsigned long long)ps.alloc_failures,
		(unsigned long long)ps.bad_frees);
	jprintf(&j, "\"peers\":[");
	pthread_mutex_lock(&e->lock);
	for (struct ferry_peer *p = e->peers; p; p = p->next) {
		jprintf(&j, "{\"name\":\"%s\",\"addresses\":[", p->name);
		for (uint32_t i = 0; i < atomic_load(&p->naddrs); i++)
			jprintf(&j, "%s\"%s\"", i ? "," : "", p->addrs[i].uri);
		jprintf(&j, "],\"transport\":\"%s\",\"puts\":%llu,\"gets\":%llu,\"bytes_out\":%llu,"
			"\"bytes_in\":%llu,\"errors\":%llu}%s",
			p->backend ? p->backend->ops->name : "none",
			(unsigned long long)STAT_GET(p->stats.puts),
			(unsigned long long)STAT_GET(p->stats.gets),
			(unsigned long long)STAT_GET(p->stats.bytes_out),
			(unsigned long long)STAT_GET(p->stats.bytes_in),
			(unsigned long long)STAT_GET(p->stats.errors), p->next ? "," : "");
	}
	pthread_mutex_unlock(&e->lock);
	jprintf(&j, "]");
	for (unsigned i = 0; i < e->nbackends; i++) {
		char part[2048]; /* a transport's own part: its sessions and counters */
		struct backend *b = &e->backends[i];
		int n;

		if (!b->ops->health || !b->data || (n = b->ops->health(e, b, part, sizeof(part))) <= 0)
			continue;
		if ((size_t)n < sizeof(part))
			jprintf(&j, "%s", part);
		else /* said, not dropped: a part that outgrew its buffer is a bug to see */
			jprintf(&j, ",\"%s\":{\"truncated\":%d}", b->ops->name, n);
	}
	jprintf(&j, "}");
	return j.len > (size_t)INT32_MAX ? INT32_MAX : (int)j.len;
}

/*
 * stage/config.c - reading vLLM-Omni's stage YAML into a resolved graph.
 *
 * Owns: reading the file (at most STAGE_MAX_FILE_BYTES), telling the two
 * schemas apart (a file with both is refused), checking every field we read
 * for its type, resolving connector references, detecting two ends of an
 * edge that name different connector types, filling unconfigured edges
 * with shared memory, choosing a transport per edge from its connector
 * (config_map.c) and filling window_size / max_inflight from the edge, the
 * file's defaults or ours. The document itself (libyaml's events composed
 * with every node's line and column, the file-wide checks: one document,
 * nesting, node count, duplicate keys, merge keys) is config_doc.c's.
 * Every problem becomes one line "file:line:column: key: what" in
 * g->errors (and the log); keys are written as paths, e.g.
 * stage_args[1].input_connectors.from_stage_0. After STAGE_MAX_ERRORS
 * errors the loader stops reading.
 *
 * The two schemas (upstream's loader reads the second as the first):
 *   legacy: runtime: {connectors: {NAME: SPEC}, edges: [...], defaults: {...}}
 *           stage_args: [{stage_id, input_connectors: {from_stage_X: REF|SPEC},
 *                         output_connectors: {to_stage_X: REF|SPEC},
 *                         engine_input_source: [X, ...]}]
 *   deploy: connectors: {NAME: SPEC}, stages: [...same entries...],
 *           edges: [{from, to, window_size, max_inflight}], async_chunk: bool
 * SPEC = {name: TYPE, extra: {...}}; REF = the NAME of a defined SPEC. An
 * edge entry may also carry `connector: REF|SPEC` (ferry's addition).
 * Keys we do not read (engine_args, default_sampling_params, ...) belong to
 * vLLM and are left alone.
 *
 * Linear in the file: stages are found by a binary search over their ids
 * (sorted once, which also finds a stage defined twice), edges by a hash of
 * their two stage indices while loading and by a binary search after (they
 * end sorted), mapping keys through config_doc.c's sorted index. The counts
 * are bounded (config.h): stages, connectors, edges, extra keys; an edge
 * listed twice in edges, or a stage twice in one engine_input_source, is an
 * error, so the work per edge is bounded too.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "config_doc.h"
#include "config_map.h"
#include "stage_log.h"

const char *stage_transport_name(enum stage_transport t)
{
	switch (t) {
	case STAGE_TRANSPORT_SHM:
		return "shm";
	case STAGE_TRANSPORT_TCP:
		return "tcp";
	case STAGE_TRANSPORT_RDMA:
		return "rdma";
	default:
		return "?";
	}
}

int stage_engine_name(const char *id, unsigned rank, char *buf, size_t len)
{
	int n = snprintf(buf, len, "stage%s.rank%u", id, rank);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static bool all_digits(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

int stage_id_cmp(const char *a, const char *b)
{
	bool da = all_digits(a), db = all_digits(b);

	if (da != db)
		return da ? -1 : 1;
	if (da) {
		const char *pa = a, *pb = b;
		size_t la, lb;
		int c;

		while (*pa == '0' && pa[1])
			pa++;
		while (*pb == '0' && pb[1])
			pb++;
		la = strlen(pa);
		lb = strlen(pb);
		if (la != lb)
			return la < lb ? -1 : 1;
		if ((c = strcmp(pa, pb)))
			return c;
	}
	return strcmp(a, b);
}

const struct stage_def *stage_graph_stage(const struct stage_graph *g, const char *id)
{
	unsigned lo = 0, hi;

	if (!g || !id || !g->stage_order)
		return NULL;
	hi = g->nstages;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		const struct stage_def *d = &g->stages[g->stage_order[mid]];
		int c = stage_id_cmp(d->id, id);

		if (!c)
			return d;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int edge_cmp_ids(const struct stage_edge *e, const char *from, const char *to)
{
	int c = stage_id_cmp(e->from, from);

	return c ? c : stage_id_cmp(e->to, to);
}

const struct stage_edge *stage_graph_edge(const struct stage_graph *g, const char *from,
					  const char *to)
{
	unsigned lo = 0, hi;

	if (!g || !from || !to)
		return NULL;
	hi = g->nedges;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		int c = edge_cmp_ids(&g->edges[mid], from, to);

		if (!c)
			return &g->edges[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static void edge_free(struct stage_edge *e)
{
	free(e->connector);
	free(e->connector_type);
	free(e->host);
	free(e->memory_pool_device);
	free(e->device_name);
	free(e->note);
	free(e->where);
	for (unsigned i = 0; i < e->nextras; i++) {
		free(e->extras[i].key);
		free(e->extras[i].value);
	}
	free(e->extras);
}

void stage_graph_free(struct stage_graph *g)
{
	if (!g)
		return;
	for (unsigned i = 0; i < g->nedges; i++)
		edge_free(&g->edges[i]);
	free(g->edges);
	free(g->stages);
	free(g->stage_order);
	for (unsigned i = 0; i < g->nwarnings; i++)
		free(g->warnings[i]);
	free(g->warnings);
	for (unsigned i = 0; i < g->nerrors; i++)
		free(g->errors[i]);
	free(g->errors);
	free(g->file);
	free(g);
}

/* Room for element n of *p (n elements there now): capacities 4, 8, 16, ... */
bool config_grow(void **p, unsigned n, size_t elem)
{
	size_t cap;
	void *q;

	if (n && (n < 4 || (n & (n - 1))))
		return true;
	cap = n ? (size_t)n * 2 : 4;
	q = realloc(*p, cap * elem);
	if (!q)
		return false;
	*p = q;
	return true;
}

/* Append a formatted line to a list (at most STAGE_MAX_ERRORS); false on ENOMEM. */
static bool list_add(char ***list, unsigned *n, const char *fmt, va_list ap)
{
	char *line = NULL;

	if (vasprintf(&line, fmt, ap) < 0)
		return false;
	/* A referenced spec is read once per edge: say each thing once. */
	for (unsigned i = 0; i < *n; i++) {
		if (!strcmp((*list)[i], line)) {
			free(line);
			return true;
		}
	}
	if (!config_grow((void **)list, *n, sizeof(**list))) {
		free(line);
		return false;
	}
	(*list)[(*n)++] = line;
	return true;
}

/* Errors of the file as a whole (cannot read it, no libyaml). */
static void graph_error(struct stage_graph *g, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void graph_error(struct stage_graph *g, const char *fmt, ...)
{
	va_list ap;

	unsigned before = g->nerrors;

	va_start(ap, fmt);
	if (g->nerrors >= STAGE_MAX_ERRORS || !list_add(&g->errors, &g->nerrors, fmt, ap))
		g->errors_dropped++;
	else if (g->nerrors > before)
		log_error("%s", g->errors[g->nerrors - 1]);
	va_end(ap);
}

static bool warn_add(struct stage_graph *g, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), unused));
static bool warn_add(struct stage_graph *g, const char *fmt, ...)
{
	va_list ap;
	bool ok;

	va_start(ap, fmt);
	ok = list_add(&g->warnings, &g->nwarnings, fmt, ap);
	va_end(ap);
	return ok;
}

static int new_graph(const char *name, struct stage_graph **out)
{
	struct stage_graph *g;

	*out = g = calloc(1, sizeof(*g));
	if (!g || !(g->file = strdup(name))) {
		free(g);
		*out = NULL;
		return -ENOMEM;
	}
	return 0;
}

#ifndef FERRY_HAVE_YAML

bool stage_rdma_present(void)
{
	return config_rdma_present();
}

int stage_graph_load_mem(const char *name, const void *data, size_t len,
			 struct stage_graph **out)
{
	struct stage_graph *g;

	(void)data;
	(void)len;
	if (!name || !out)
		return -EINVAL;
	if (new_graph(name, out))
		return -ENOMEM;
	g = *out;
	graph_error(g, "%s: ferry was built without libyaml (yaml-0.1): stage YAML cannot be read",
		    name);
	return -EOPNOTSUPP;
}

int stage_graph_load(const char *path, struct stage_graph **out)
{
	return stage_graph_load_mem(path, NULL, 0, out);
}

#else

bool stage_rdma_present(void)
{
	return config_rdma_present();
}

/*
 * The file, at most STAGE_MAX_FILE_BYTES: -EFBIG past that (*size: its
 * size, or 0 when it is not a regular file and was cut short).
 */
static int read_file(const char *path, unsigned char **data, size_t *len, long long *size)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	size_t cap = 0, n = 0;
	struct stat st;

	*size = 0;
	if (!f)
		return -errno;
	if (!fstat(fileno(f), &st) && S_ISREG(st.st_mode) && st.st_size > STAGE_MAX_FILE_BYTES) {
		*size = (long long)st.st_size;
		fclose(f);
		return -EFBIG;
	}
	for (;;) {
		size_t got;

		if (n == cap) {
			unsigned char *grown;

			if (n > STAGE_MAX_FILE_BYTES) {
				free(buf);
				fclose(f);
				return -EFBIG;
			}
			cap = cap ? cap * 2 : 4096;
			if (cap > STAGE_MAX_FILE_BYTES + 1)
				cap = STAGE_MAX_FILE_BYTES + 1;
			grown = realloc(buf, cap);
			if (!grown) {
				free(buf);
				fclose(f);
				return -ENOMEM;
			}
			buf = grown;
		}
		got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0) {
			int bad = ferror(f);

			fclose(f);
			if (bad) {
				free(buf);
				return -EIO;
			}
			break;
		}
	}
	if (n > STAGE_MAX_FILE_BYTES) {
		free(buf);
		return -EFBIG;
	}
	*data = buf;
	*len = n;
	return 0;
}

/* What an edge needs while loading: its hash key, where edges listed it. */
struct edge_aux {
	uint64_t key; /* from stage index << 32 | to stage index */
	int listed_line, listed_column;
};

/* Where each stage was defined, until the stages are sorted. */
struct stage_aux {
	unsigned item;       /* index in the stages list */
	yaml_node_t *id;     /* its stage_id node */
};

struct loader {
	struct stage_graph *g;
	struct config_doc *D;
	bool rdma;
	yaml_node_t *connectors; /* the mapping of defined connector specs, or NULL */
	const char *connectors_path;
	bool oom;
	bool stop;               /* too many errors, or a count bound crossed */
	unsigned nextras;        /* extra keys kept over all edges */
	struct edge_aux *edge_aux;
	uint32_t *edge_table;    /* open addressing: edge index + 1, 0 empty */
	size_t edge_cap;         /* a power of two, or 0 */
	struct stage_aux *stage_aux;
	uint32_t *source_stamp;  /* per stage: the engine_input_source list that named it */
	uint32_t stamp;
};

static yaml_node_t *node_at(struct loader *L, int idx)
{
	return config_doc_node(L->D, idx);
}

void config_oom(struct loader *L)
{
	L->oom = true;
}

bool config_stopped(struct loader *L)
{
	return L->stop || L->oom;
}

/* One error line "file:line:column: key: text"; past STAGE_MAX_ERRORS only counted. */
static void error_at(struct loader *L, unsigned long line, unsigned long column, const char *key,
		     const char *fmt, va_list ap)
{
	struct stage_graph *g = L->g;
	char *text = NULL;

	if (g->nerrors >= STAGE_MAX_ERRORS) {
		g->errors_dropped++;
		L->stop = true;
		return;
	}
	if (vasprintf(&text, fmt, ap) < 0) {
		L->oom = true;
		return;
	}
	graph_error(g, "%s:%lu:%lu: %s: %s", g->file, line, column, key, text);
	free(text);
}

void config_error(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_at(L, n ? (unsigned long)n->start_mark.line + 1 : 1,
		 n ? (unsigned long)n->start_mark.column + 1 : 1, key, fmt, ap);
	va_end(ap);
}

void config_error_mark(struct loader *L, yaml_mark_t m, const char *key, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	error_at(L, (unsigned long)m.line + 1, (unsigned long)m.column + 1, key, fmt, ap);
	va_end(ap);
}

void config_warn(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
	struct stage_graph *g = L->g;
	unsigned before = g->nwarnings;
	char *text = NULL;
	va_list ap;

	if (g->nwarnings >= STAGE_MAX_ERRORS) {
		g->warnings_dropped++;
		return;
	}
	va_start(ap, fmt);
	if (vasprintf(&text, fmt, ap) < 0)
		text = NULL;
	va_end(ap);
	if (!text) {
		L->oom = true;
		return;
	}
	if (!warn_add(g, "%s:%lu:%lu: %s: %s", g->file,
		      n ? (unsigned long)n->start_mark.line + 1 : 1,
		      n ? (unsigned long)n->start_mark.column + 1 : 1, key, text))
		L->oom = true;
	else if (g->nwarnings > before)
		log_warn("%s", g->warnings[g->nwarnings - 1]);
	free(text);
}

bool config_extra_count(struct loader *L, const yaml_node_t *n, const char *key)
{
	if (L->nextras < STAGE_MAX_EXTRAS) {
		L->nextras++;
		return true;
	}
	config_error(L, n, key, "more than %d extra keys over all edges (a connector's keys "
		     "count once per edge that uses it)", STAGE_MAX_EXTRAS);
	L->stop = true;
	return false;
}

static const char *node_kind(const yaml_node_t *n)
{
	switch (n->type) {
	case YAML_SCALAR_NODE:
		return "a scalar";
	case YAML_SEQUENCE_NODE:
		return "a sequence";
	case YAML_MAPPING_NODE:
		return "a mapping";
	default:
		return "nothing";
	}
}

bool config_is_null(const yaml_node_t *n)
{
	const char *s;

	if (!n)
		return true;
	if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return false;
	s = (const char *)n->data.scalar.value;
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

const char *config_scalar(const yaml_node_t *n)
{
	return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

const char *config_more(const char *s)
{
	return strnlen(s, CONFIG_SHOWN + 1) > CONFIG_SHOWN ? "..." : "";
}

/* The value of key in mapping m (and its key node), or NULL. Merge keys apply. */
yaml_node_t *config_map_get(struct loader *L, yaml_node_t *m, const char *key,
			    yaml_node_t **key_node)
{
	return config_doc_get(L, L->D, m, key, strlen(key), key_node);
}

const struct config_pair *config_map_pairs(struct loader *L, yaml_node_t *m, unsigned *n)
{
	return config_doc_pairs(L, L->D, m, n);
}

bool config_want(struct loader *L, yaml_node_t *n, yaml_node_type_t type, const char *key)
{
	static const char *const names[] = {
		[YAML_SCALAR_NODE] = "a scalar",
		[YAML_SEQUENCE_NODE] = "a sequence",
		[YAML_MAPPING_NODE] = "a mapping",
	};

	if (n && n->type == type)
		return true;
	config_error(L, n, key, "must be %s, not %s", names[type],
		     n ? node_kind(n) : "missing");
	return false;
}

/* An integer scalar (decimal or 0x hex, optional sign). */
bool config_int(struct loader *L, yaml_node_t *n, const char *key, int64_t *out)
{
	const char *s = config_scalar(n);
	char *end;
	long long v;

	if (!s || !*s || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
		if (s)
			config_error(L, n, key, "must be an integer, not %s '%.*s%s'", node_kind(n),
				     CONFIG_SHOW(s));
		else
			config_error(L, n, key, "must be an integer, not %s",
				     n ? node_kind(n) : "missing");
		return false;
	}
	errno = 0;
	/* Longer than any int64 is not one (and strtoll would scan it all). */
	v = n->data.scalar.length <= 64 ? strtoll(s, &end, 0) : 0;
	if (n->data.scalar.length > 64 || errno || *end) {
		config_error(L, n, key, "must be an integer, not '%.*s%s'", CONFIG_SHOW(s));
		return false;
	}
	*out = v;
	return true;
}

bool config_bool(struct loader *L, yaml_node_t *n, const char *key, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on" }, *const no[] = { "false", "no",
										     "off" };
	const char *s = config_scalar(n);

	for (unsigned i = 0; s && i < 3; i++) {
		if (!strcasecmp(s, yes[i])) {
			*out = true;
			return true;
		}
		if (!strcasecmp(s, no[i])) {
			*out = false;
			return true;
		}
	}
	if (s)
		config_error(L, n, key, "must be true or false, not %s '%.*s%s'", node_kind(n),
			     CONFIG_SHOW(s));
	else
		config_error(L, n, key, "must be true or false, not %s",
			     n ? node_kind(n) : "missing");
	return false;
}

/* A non-empty string scalar of at most STAGE_MAX_STRING bytes, no NUL in it. */
bool config_str(struct loader *L, yaml_node_t *n, const char *key, const char **out)
{
	const char *s = config_scalar(n);

	if (!s || config_is_null(n)) {
		config_error(L, n, key, "must be a string, not %s",
			     n ? (s ? "empty" : node_kind(n)) : "missing");
		return false;
	}
	if (n->data.scalar.length > STAGE_MAX_STRING) {
		config_error(L, n, key, "a string of %zu bytes ('%.*s%s'): at most %d",
			     n->data.scalar.length, CONFIG_SHOW(s), STAGE_MAX_STRING);
		return false;
	}
	if (strlen(s) != n->data.scalar.length) {
		config_error(L, n, key, "must be a string without NUL bytes");
		return false;
	}
	*out = s;
	return true;
}

/* A stage id: a scalar of [A-Za-z0-9_-], 1..STAGE_ID_MAX-1 characters. */
static bool stage_id_of(struct loader *L, yaml_node_t *n, const char *key, char *out)
{
	const char *s;
	size_t len;

	if (!config_str(L, n, key, &s))
		return false;
	len = strlen(s);
	if (len >= STAGE_ID_MAX || strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
					    "0123456789_-") != len) {
		config_error(L, n, key, "'%.*s%s' is not a stage id (1..%d of [A-Za-z0-9_-])",
			     CONFIG_SHOW(s), STAGE_ID_MAX - 1);
		return false;
	}
	memcpy(out, s, len + 1);
	return true;
}

/* The stage_id of a stage entry as written, if it is one (else reported with the stage). */
static bool self_id(struct loader *L, yaml_node_t *s, char *out)
{
	yaml_node_t *id = config_map_get(L, s, "stage_id", NULL);
	const char *t = config_scalar(id);

	if (!t || id->data.scalar.length >= STAGE_ID_MAX || strlen(t) != id->data.scalar.length)
		return false;
	strcpy(out, t);
	return stage_graph_stage(L->g, out) != NULL;
}

/* "a.b" + ".c" / "[3]" into a fresh buffer (kept on the stack by callers). */
#define PATH_MAX_LEN 256
static const char *path_join(char *buf, const char *base, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static const char *path_join(char *buf, const char *base, const char *fmt, ...)
{
	int n = snprintf(buf, PATH_MAX_LEN, "%s", base);
	va_list ap;

	if (n < 0 || n >= PATH_MAX_LEN)
		return buf;
	va_start(ap, fmt);
	vsnprintf(buf + n, PATH_MAX_LEN - (size_t)n, fmt, ap);
	va_end(ap);
	return buf;
}

/* base + "." + a key's text (cut for the message). */
static const char *path_key(char *buf, const char *base, const char *key)
{
	const char *k = key ? key : "?";

	return path_join(buf, base, ".%.*s%s", CONFIG_SHOW(k));
}

/* ------------------------------------------------------------------ */
/* Flow control numbers                                                */
/* ------------------------------------------------------------------ */

static bool flow_value(struct loader *L, yaml_node_t *n, const char *key, int64_t *out)
{
	int64_t v;

	if (!config_int(L, n, key, &v))
		return false;
	if (v == 0 || v < -1) {
		config_error(L, n, key, "must be -1 (no limit) or a positive number, not %lld",
			     (long long)v);
		return false;
	}
	*out = v;
	return true;
}

static void read_defaults(struct loader *L, yaml_node_t *d, const char *path)
{
	struct stage_graph *g = L->g;
	char p[PATH_MAX_LEN];
	yaml_node_t *v;

	if (!d || config_is_null(d) || !config_want(L, d, YAML_MAPPING_NODE, path))
		return;
	if ((v = config_map_get(L, d, "window_size", NULL)) &&
	    flow_value(L, v, path_join(p, path, ".window_size"), &g->default_window_size))
		g->default_window_from = STAGE_FROM_DEFAULTS;
	if ((v = config_map_get(L, d, "max_inflight", NULL)) &&
	    flow_value(L, v, path_join(p, path, ".max_inflight"), &g->default_max_inflight))
		g->default_inflight_from = STAGE_FROM_DEFAULTS;
}

/* ------------------------------------------------------------------ */
/* Stages                                                              */
/* ------------------------------------------------------------------ */

static void read_stage(struct loader *L, yaml_node_t *s, const char *path, unsigned item)
{
	struct stage_graph *g = L->g;
	struct stage_def d = { .ranks = 1 };
	char p[PATH_MAX_LEN];
	yaml_node_t *id, *ea, *tp;
	int64_t ranks;

	if (!config_want(L, s, YAML_MAPPING_NODE, path))
		return;
	id = config_map_get(L, s, "stage_id", NULL);
	if (!id) {
		config_error(L, s, path, "has no stage_id");
		return;
	}
	if (!stage_id_of(L, id, path_join(p, path, ".stage_id"), d.id))
		return;
	d.line = (int)id->start_mark.line + 1;
	d.column = (int)id->start_mark.column + 1;
	ea = config_map_get(L, s, "engine_args", NULL);
	if (ea && !config_is_null(ea) &&
	    !config_want(L, ea, YAML_MAPPING_NODE, path_join(p, path, ".engine_args")))
		ea = NULL;
	tp = config_map_get(L, ea, "tensor_parallel_size", NULL);
	if (tp)
		path_join(p, path, ".engine_args.tensor_parallel_size");
	else if ((tp = config_map_get(L, s, "tensor_parallel_size", NULL)))
		path_join(p, path, ".tensor_parallel_size");
	if (tp && config_int(L, tp, p, &ranks)) {
		if (ranks < 1 || ranks > STAGE_MAX_RANKS)
			config_error(L, tp, p, "must be 1..%d, not %lld", STAGE_MAX_RANKS,
				     (long long)ranks);
		else
			d.ranks = (unsigned)ranks;
	}
	if (!config_grow((void **)&g->stages, g->nstages, sizeof(*g->stages)) ||
	    !config_grow((void **)&L->stage_aux, g->nstages, sizeof(*L->stage_aux))) {
		L->oom = true;
		return;
	}
	L->stage_aux[g->nstages] = (struct stage_aux){ item, id };
	g->stages[g->nstages++] = d;
}

struct stage_ref {
	const char *id;
	unsigned i;
};

static int stage_ref_cmp(const void *x, const void *y)
{
	const struct stage_ref *a = x, *b = y;
	int c = stage_id_cmp(a->id, b->id);

	return c ? c : (a->i > b->i) - (a->i < b->i);
}

/*
 * Sort the stages read by id: a stage defined twice is an error at the
 * second (the first stays), the rest get g->stage_order for lookups.
 */
static void index_stages(struct loader *L, const char *stages_key)
{
	struct stage_graph *g = L->g;
	struct stage_ref *r;
	unsigned n = g->nstages, kept = 0;
	bool *dup;

	if (!n)
		return;
	r = malloc(n * sizeof(*r));
	dup = calloc(n, sizeof(*dup));
	g->stage_order = malloc(n * sizeof(*g->stage_order));
	if (!r || !dup || !g->stage_order) {
		free(r);
		free(dup);
		L->oom = true;
		return;
	}
	for (unsigned i = 0; i < n; i++)
		r[i] = (struct stage_ref){ g->stages[i].id, i };
	qsort(r, n, sizeof(*r), stage_ref_cmp);
	for (unsigned k = 1; k < n; k++) {
		const struct stage_def *first;
		char p[PATH_MAX_LEN];

		if (strcmp(r[k].id, r[k - 1].id))
			continue;
		first = &g->stages[r[k - 1].i];
		while (k < n && !strcmp(r[k].id, first->id)) {
			unsigned i = r[k].i;

			dup[i] = true;
			config_error(L, L->stage_aux[i].id,
				     path_join(p, stages_key, "[%u].stage_id", L->stage_aux[i].item),
				     "stage %s is defined twice (first at line %d, column %d)",
				     g->stages[i].id, first->line, first->column);
			k++;
		}
	}
	free(r);
	for (unsigned i = 0; i < n; i++)
		if (!dup[i])
			g->stages[kept++] = g->stages[i];
	free(dup);
	g->nstages = kept;
	r = malloc(kept * sizeof(*r));
	if (!r) {
		L->oom = true;
		free(g->stage_order);
		g->stage_order = NULL;
		return;
	}
	for (unsigned i = 0; i < kept; i++)
		r[i] = (struct stage_ref){ g->stages[i].id, i };
	qsort(r, kept, sizeof(*r), stage_ref_cmp);
	for (unsigned i = 0; i < kept; i++)
		g->stage_order[i] = r[i].i;
	free(r);
	L->source_stamp = calloc(kept ? kept : 1, sizeof(*L->source_stamp));
	if (!L->source_stamp)
		L->oom = true;
}

/* ------------------------------------------------------------------ */
/* Edges                                                               */
/* ------------------------------------------------------------------ */

static uint64_t edge_key(struct loader *L, const char *from, const char *to)
{
	const struct stage_def *f = stage_graph_stage(L->g, from), *t = stage_graph_stage(L->g, to);

	/* Both are known stages (checked by the callers). */
	return (uint64_t)(f ? f - L->g->stages : 0) << 32 | (uint64_t)(t ? t - L->g->stages : 0);
}

static size_t edge_slot(struct loader *L, uint64_t key)
{
	uint64_t h = key * 0x9E3779B97F4A7C15ull;
	size_t mask = L->edge_cap - 1, i;

	h ^= h >> 31;
	for (i = (size_t)h & mask; L->edge_table[i]; i = (i + 1) & mask)
		if (L->edge_aux[L->edge_table[i] - 1].key == key)
			break;
	return i;
}

static struct stage_edge *edge_find(struct loader *L, const char *from, const char *to)
{
	size_t i;

	if (!L->edge_cap)
		return NULL;
	i = edge_slot(L, edge_key(L, from, to));
	return L->edge_table[i] ? &L->g->edges[L->edge_table[i] - 1] : NULL;
}

/* Keep the table at most half full. */
static bool edge_table_grow(struct loader *L)
{
	struct stage_graph *g = L->g;
	size_t cap = L->edge_cap ? L->edge_cap * 2 : 16;
	uint32_t *t;

	if ((g->nedges + 1) * 2 <= L->edge_cap)
		return true;
	t = calloc(cap, sizeof(*t));
	if (!t)
		return false;
	free(L->edge_table);
	L->edge_table = t;
	L->edge_cap = cap;
	for (unsigned k = 0; k < g->nedges; k++)
		t[edge_slot(L, L->edge_aux[k].key)] = k + 1;
	return true;
}

static struct stage_edge *edge_add(struct loader *L, const char *from, const char *to,
				   const yaml_node_t *where_node, const char *where)
{
	struct stage_graph *g = L->g;
	struct stage_edge *e;
	uint64_t key = edge_key(L, from, to);

	if (g->nedges >= STAGE_MAX_EDGES) {
		config_error(L, where_node, where, "edge %s->%s: more than %d edges", from, to,
			     STAGE_MAX_EDGES);
		L->stop = true;
		return NULL;
	}
	if (!config_grow((void **)&g->edges, g->nedges, sizeof(*g->edges)) ||
	    !config_grow((void **)&L->edge_aux, g->nedges, sizeof(*L->edge_aux)) ||
	    !edge_table_grow(L)) {
		L->oom = true;
		return NULL;
	}
	e = &g->edges[g->nedges];
	memset(e, 0, sizeof(*e));
	snprintf(e->from, sizeof(e->from), "%s", from);
	snprintf(e->to, sizeof(e->to), "%s", to);
	e->window_size = e->max_inflight = 0; /* filled at the end */
	e->where = strdup(where);
	if (!e->where) {
		L->oom = true;
		return NULL;
	}
	e->line = where_node ? (int)where_node->start_mark.line + 1 : 1;
	e->column = where_node ? (int)where_node->start_mark.column + 1 : 1;
	L->edge_aux[g->nedges] = (struct edge_aux){ key, 0, 0 };
	L->edge_table[edge_slot(L, key)] = g->nedges + 1;
	g->nedges++;
	return e;
}

static struct edge_aux *edge_aux_of(struct loader *L, const struct stage_edge *e)
{
	return &L->edge_aux[e - L->g->edges];
}

/*
 * The spec a connector reference or inline spec stands for. Returns the
 * spec mapping and sets *ref to the referenced name (NULL for inline), or
 * NULL after an error.
 */
static yaml_node_t *spec_of(struct loader *L, yaml_node_t *v, const char *path, const char **ref)
{
	*ref = NULL;
	if (v && v->type == YAML_SCALAR_NODE && !config_is_null(v)) {
		const char *name;
		yaml_node_t *spec;

		if (!config_str(L, v, path, &name))
			return NULL;
		spec = config_doc_get_node(L, L->D, L->connectors, v, NULL);
		if (!spec) {
			if (L->connectors)
				config_error(L, v, path, "undefined connector reference '%s' (not in %s)",
					     name, L->connectors_path);
			else
				config_error(L, v, path, "undefined connector reference '%s' (no "
					     "connectors are defined)", name);
			return NULL;
		}
		*ref = name;
		return spec;
	}
	if (v && v->type == YAML_MAPPING_NODE)
		return v;
	config_error(L, v, path, "must be a connector name or a connector spec (a mapping), not %s",
		     v ? node_kind(v) : "missing");
	return NULL;
}

/*
 * Give edge from -> to the connector written at v (a reference or a
 * spec). A second mention must name the same connector type.
 */
static void edge_connect(struct loader *L, const char *from, const char *to, yaml_node_t *v,
			 const char *path)
{
	const char *ref, *type;
	yaml_node_t *spec, *name;
	struct stage_edge *e;
	char p[PATH_MAX_LEN];

	spec = spec_of(L, v, path, &ref);
	if (!spec)
		return;
	name = config_map_get(L, spec, "name", NULL);
	if (!name) {
		if (!ref) /* a defined spec was reported with its definition */
			config_error(L, spec, path, "connector spec has no name");
		return;
	}
	if (!config_str(L, name, path_join(p, ref ? L->connectors_path : path, "%s%s.name",
					    ref ? "." : "", ref ? ref : ""), &type))
		return;
	e = edge_find(L, from, to);
	if (e && e->connector_type) {
		if (strcmp(e->connector_type, type) != 0)
			config_error(L, v, path,
				     "edge %s->%s: connector type %s here, but %s at %s:%d:%d (%s)",
				     from, to, type, e->connector_type, L->g->file, e->line,
				     e->column, e->where);
		return;
	}
	if (!e) {
		e = edge_add(L, from, to, v, path);
		if (!e)
			return;
	} else {
		/* Listed in edges first: the connector is named here. */
		free(e->where);
		e->where = strdup(path);
		e->line = (int)v->start_mark.line + 1;
		e->column = (int)v->start_mark.column + 1;
		if (!e->where)
			L->oom = true;
	}
	e->auto_filled = false;
	e->inline_spec = ref == NULL;
	e->connector = ref ? strdup(ref) : NULL;
	e->connector_type = strdup(type);
	if ((ref && !e->connector) || !e->connector_type) {
		L->oom = true;
		return;
	}
	config_resolve_spec(L, e, spec, ref ? L->connectors_path : path, ref, L->rdma);
}

/* "from_stage_3" -> "3" (prefix checked). */
static bool edge_key_stage(struct loader *L, yaml_node_t *k, const char *prefix,
			   const char *path, char *out)
{
	const char *s = config_scalar(k);
	size_t pl = strlen(prefix), len;

	if (!s || strncmp(s, prefix, pl) != 0 || !s[pl]) {
		const char *shown = s ? s : node_kind(k);

		config_error(L, k, path, "key must be %s<stage_id>, not '%.*s%s'", prefix,
			     CONFIG_SHOW(shown));
		return false;
	}
	len = strnlen(s + pl, STAGE_ID_MAX);
	if (len >= STAGE_ID_MAX || pl + len != k->data.scalar.length ||
	    strspn(s + pl, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
		    len) {
		config_error(L, k, path, "'%.*s%s' does not name a stage id", CONFIG_SHOW(s));
		return false;
	}
	strcpy(out, s + pl);
	return true;
}

static bool stage_known(struct loader *L, const char *id, yaml_node_t *n, const char *path)
{
	if (stage_graph_stage(L->g, id))
		return true;
	config_error(L, n, path, "undefined stage '%s'", id);
	return false;
}

/* input_connectors / output_connectors of one stage. */
static void read_stage_connectors(struct loader *L, yaml_node_t *s, const char *spath,
				  bool input)
{
	const char *field = input ? "input_connectors" : "output_connectors";
	const char *prefix = input ? "from_stage_" : "to_stage_";
	char p[PATH_MAX_LEN], q[PATH_MAX_LEN], self[STAGE_ID_MAX], other[STAGE_ID_MAX];
	const struct config_pair *pairs;
	yaml_node_t *m;
	unsigned npairs;

	m = config_map_get(L, s, field, NULL);
	path_join(p, spath, ".%s", field);
	if (!m || config_is_null(m) || !config_want(L, m, YAML_MAPPING_NODE, p))
		return;
	if (!self_id(L, s, self))
		return; /* reported with the stage */
	pairs = config_map_pairs(L, m, &npairs);
	for (unsigned pi = 0; pi < npairs && !config_stopped(L); pi++) {
		yaml_node_t *k = pairs[pi].key, *v = pairs[pi].value;

		path_key(q, p, config_scalar(k));
		if (!edge_key_stage(L, k, prefix, q, other) || !stage_known(L, other, k, q))
			continue;
		if (!strcmp(other, self)) {
			config_error(L, k, q, "an edge from stage %s to itself", self);
			continue;
		}
		if (input)
			edge_connect(L, other, self, v, q);
		else
			edge_connect(L, self, other, v, q);
	}
}

/* An edge that must exist: create it (auto-filled) if no connector named it. */
static struct stage_edge *edge_expect(struct loader *L, const char *from, const char *to,
				      yaml_node_t *n, const char *path)
{
	struct stage_edge *e = edge_find(L, from, to);

	if (e)
		return e;
	e = edge_add(L, from, to, n, path);
	if (e)
		e->auto_filled = true;
	return e;
}

/* runtime.edges / edges: [{from, to, window_size, max_inflight, connector}] */
static void read_edges(struct loader *L, yaml_node_t *list, const char *path)
{
	char p[PATH_MAX_LEN], q[PATH_MAX_LEN], from[STAGE_ID_MAX], to[STAGE_ID_MAX];
	int i = 0;

	if (!list || config_is_null(list) || !config_want(L, list, YAML_SEQUENCE_NODE, path))
		return;
	for (yaml_node_item_t *it = list->data.sequence.items.start;
	     it < list->data.sequence.items.top && !config_stopped(L); it++, i++) {
		yaml_node_t *n = node_at(L, *it), *f, *t, *v;
		struct stage_edge *e;
		struct edge_aux *aux;
		int64_t num;

		path_join(p, path, "[%d]", i);
		if (!config_want(L, n, YAML_MAPPING_NODE, p))
			continue;
		f = config_map_get(L, n, "from", NULL);
		t = config_map_get(L, n, "to", NULL);
		if (!f || !t) {
			config_error(L, n, p, "an edge needs both from and to");
			continue;
		}
		if (!stage_id_of(L, f, path_join(q, p, ".from"), from) ||
		    !stage_known(L, from, f, q) ||
		    !stage_id_of(L, t, path_join(q, p, ".to"), to) || !stage_known(L, to, t, q))
			continue;
		if (!strcmp(from, to)) {
			config_error(L, n, p, "an edge from stage %s to itself", from);
			continue;
		}
		if ((e = edge_find(L, from, to)) && edge_aux_of(L, e)->listed_line) {
			aux = edge_aux_of(L, e);
			config_error(L, n, p, "edge %s->%s is listed twice (first at %d:%d)", from,
				     to, aux->listed_line, aux->listed_column);
			continue;
		}
		if ((v = config_map_get(L, n, "connector", NULL)))
			edge_connect(L, from, to, v, path_join(q, p, ".connector"));
		e = edge_expect(L, from, to, n, p);
		if (!e)
			return;
		aux = edge_aux_of(L, e);
		aux->listed_line = (int)n->start_mark.line + 1;
		aux->listed_column = (int)n->start_mark.column + 1;
		if ((v = config_map_get(L, n, "window_size", NULL)) &&
		    flow_value(L, v, path_join(q, p, ".window_size"), &num)) {
			e->window_size = num;
			e->window_from = STAGE_FROM_EDGE;
		}
		if ((v = config_map_get(L, n, "max_inflight", NULL)) &&
		    flow_value(L, v, path_join(q, p, ".max_inflight"), &num)) {
			e->max_inflight = num;
			e->inflight_from = STAGE_FROM_EDGE;
		}
	}
}

static void read_input_sources(struct loader *L, yaml_node_t *s, const char *spath)
{
	char p[PATH_MAX_LEN], q[PATH_MAX_LEN], self[STAGE_ID_MAX], from[STAGE_ID_MAX];
	yaml_node_t *src = config_map_get(L, s, "engine_input_source", NULL);
	uint32_t stamp = ++L->stamp;
	int i = 0;

	path_join(p, spath, ".engine_input_source");
	if (!src || config_is_null(src) || !config_want(L, src, YAML_SEQUENCE_NODE, p))
		return;
	if (!self_id(L, s, self))
		return;
	for (yaml_node_item_t *it = src->data.sequence.items.start;
	     it < src->data.sequence.items.top && !config_stopped(L); it++, i++) {
		yaml_node_t *n = node_at(L, *it);
		const struct stage_def *d;

		path_join(q, p, "[%d]", i);
		if (!stage_id_of(L, n, q, from) || !stage_known(L, from, n, q))
			continue;
		if (!strcmp(from, self)) {
			config_error(L, n, q, "stage %s takes input from itself", self);
			continue;
		}
		d = stage_graph_stage(L->g, from);
		if (!L->source_stamp)
			return;
		if (L->source_stamp[d - L->g->stages] == stamp) {
			config_error(L, n, q, "stage %s is listed twice", from);
			continue;
		}
		L->source_stamp[d - L->g->stages] = stamp;
		if (!edge_expect(L, from, self, n, q))
			return;
	}
}

/* ------------------------------------------------------------------ */
/* The document                                                        */
/* ------------------------------------------------------------------ */

static int edge_cmp(const void *x, const void *y)
{
	const struct stage_edge *a = x, *b = y;

	return edge_cmp_ids(a, b->from, b->to);
}

/* A sequence the loader walks, at most max items. */
static bool seq_bounded(struct loader *L, yaml_node_t *n, const char *path, unsigned max,
			const char *what)
{
	size_t len = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);

	if (len <= max)
		return true;
	config_error(L, n, path, "%zu %s: at most %u", len, what, max);
	L->stop = true;
	return false;
}

static void read_connectors(struct loader *L)
{
	const struct config_pair *pairs;
	char p[PATH_MAX_LEN];
	unsigned npairs;

	/* Check every definition, used or not. */
	pairs = config_map_pairs(L, L->connectors, &npairs);
	if (npairs > STAGE_MAX_CONNECTORS) {
		config_error(L, L->connectors, L->connectors_path, "%u connectors: at most %d",
			     npairs, STAGE_MAX_CONNECTORS);
		L->stop = true;
		return;
	}
	for (unsigned pi = 0; pi < npairs && !config_stopped(L); pi++) {
		yaml_node_t *k = pairs[pi].key, *spec = pairs[pi].value, *n;
		const char *ks = config_scalar(k), *type;

		path_key(p, L->connectors_path, ks);
		if (!ks) {
			config_error(L, k, p, "a connector's name must be a string");
			continue;
		}
		if (k->data.scalar.length > STAGE_MAX_STRING) {
			config_error(L, k, p, "a connector's name of %zu bytes: at most %d",
				     k->data.scalar.length, STAGE_MAX_STRING);
			continue;
		}
		if (!config_want(L, spec, YAML_MAPPING_NODE, p))
			continue;
		n = config_map_get(L, spec, "name", NULL);
		if (!n) {
			config_error(L, spec, p, "connector spec has no name");
			continue;
		}
		if (config_str(L, n, path_join(p, L->connectors_path, ".%s.name", ks), &type) &&
		    !config_type_known(type))
			config_error(L, n, p, "unknown connector type '%s' (known: %s)", type,
				     config_known_types());
		n = config_map_get(L, spec, "extra", NULL);
		if (n && !config_is_null(n))
			config_want(L, n, YAML_MAPPING_NODE,
				    path_join(p, L->connectors_path, ".%s.extra", ks));
	}
}

static void read_document(struct loader *L, yaml_node_t *root)
{
	struct stage_graph *g = L->g;
	const char *stages_key;
	yaml_node_t *runtime, *stages, *v, *legacy_key = NULL, *deploy_key = NULL;
	char p[PATH_MAX_LEN];
	unsigned i;

	if (!root) {
		graph_error(g, "%s:1:1: (document): the file holds no YAML document", g->file);
		return;
	}
	if (!config_want(L, root, YAML_MAPPING_NODE, "(document)"))
		return;
	config_map_get(L, root, "stage_args", &legacy_key);
	config_map_get(L, root, "stages", &deploy_key);
	if (legacy_key && deploy_key) {
		yaml_node_t *later = legacy_key->start_mark.index > deploy_key->start_mark.index
					     ? legacy_key : deploy_key;

		config_error(L, later, later == legacy_key ? "stage_args" : "stages",
			     "both stage_args (legacy schema, line %lu) and stages (deploy schema, "
			     "line %lu): a file holds one schema (upstream would read it as the "
			     "legacy one)", (unsigned long)legacy_key->start_mark.line + 1,
			     (unsigned long)deploy_key->start_mark.line + 1);
		return;
	}
	if (legacy_key) {
		g->schema = STAGE_SCHEMA_LEGACY;
		stages_key = "stage_args";
	} else if (deploy_key) {
		g->schema = STAGE_SCHEMA_DEPLOY;
		stages_key = "stages";
	} else {
		config_error(L, root, "(document)",
			     "neither stage_args (legacy schema) nor stages (deploy schema) is "
			     "defined");
		return;
	}
	runtime = config_map_get(L, root, "runtime", NULL);
	if (runtime && !config_is_null(runtime) &&
	    !config_want(L, runtime, YAML_MAPPING_NODE, "runtime"))
		runtime = NULL;

	/* Connector definitions. */
	L->connectors_path = "runtime.connectors";
	v = config_map_get(L, runtime, "connectors", NULL);
	if (g->schema == STAGE_SCHEMA_DEPLOY && config_map_get(L, root, "connectors", NULL)) {
		v = config_map_get(L, root, "connectors", NULL);
		L->connectors_path = "connectors";
	}
	if (v && !config_is_null(v) && config_want(L, v, YAML_MAPPING_NODE, L->connectors_path))
		L->connectors = v;
	if (L->connectors)
		read_connectors(L);

	/* Defaults and async_chunk. */
	g->default_window_size = STAGE_DEFAULT_WINDOW_SIZE;
	g->default_max_inflight = STAGE_DEFAULT_MAX_INFLIGHT;
	read_defaults(L, config_map_get(L, runtime, "defaults", NULL), "runtime.defaults");
	if (g->schema == STAGE_SCHEMA_DEPLOY)
		read_defaults(L, config_map_get(L, root, "defaults", NULL), "defaults");
	if ((v = config_map_get(L, root, "async_chunk", NULL)))
		config_bool(L, v, "async_chunk", &g->async_chunk);

	/* Stages first: every edge refers to them. */
	stages = config_map_get(L, root, stages_key, NULL);
	if (config_stopped(L) || !config_want(L, stages, YAML_SEQUENCE_NODE, stages_key) ||
	    !seq_bounded(L, stages, stages_key, STAGE_MAX_STAGES, "stages"))
		return;
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top && !config_stopped(L); it++, i++)
		read_stage(L, node_at(L, *it), path_join(p, stages_key, "[%u]", i), i);
	index_stages(L, stages_key);
	if (!g->nstages && !g->nerrors)
		config_error(L, stages, stages_key, "no stages are defined");

	/* Named connectors, then listed edges, then engine_input_source. */
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top && !config_stopped(L); it++, i++) {
		yaml_node_t *s = node_at(L, *it);

		if (s->type != YAML_MAPPING_NODE)
			continue;
		path_join(p, stages_key, "[%u]", i);
		read_stage_connectors(L, s, p, false);
		read_stage_connectors(L, s, p, true);
	}
	if (config_stopped(L))
		return;
	if (g->schema == STAGE_SCHEMA_DEPLOY && config_map_get(L, root, "edges", NULL))
		read_edges(L, config_map_get(L, root, "edges", NULL), "edges");
	else
		read_edges(L, config_map_get(L, runtime, "edges", NULL), "runtime.edges");
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top && !config_stopped(L); it++, i++) {
		yaml_node_t *s = node_at(L, *it);

		if (s->type == YAML_MAPPING_NODE)
			read_input_sources(L, s, path_join(p, stages_key, "[%u]", i));
	}

	/* Auto-fill and defaults. */
	for (unsigned k = 0; k < g->nedges && !L->oom; k++) {
		struct stage_edge *e = &g->edges[k];

		if (e->auto_filled && !e->connector_type)
			config_autofill(L, e);
		if (e->window_from != STAGE_FROM_EDGE) {
			e->window_size = g->default_window_size;
			e->window_from = g->default_window_from;
		}
		if (e->inflight_from != STAGE_FROM_EDGE) {
			e->max_inflight = g->default_max_inflight;
			e->inflight_from = g->default_inflight_from;
		}
	}
}

static int load_bytes(struct stage_graph *g, const unsigned char *data, size_t len)
{
	static const unsigned char empty[1];
	struct loader L = { .g = g };

	if (len > STAGE_MAX_FILE_BYTES) {
		graph_error(g, "%s:1:1: (document): the file is %zu bytes: a stage file holds at "
			    "most %u (10 MiB)", g->file, len, STAGE_MAX_FILE_BYTES);
		return -EFBIG;
	}
	L.D = config_doc_load(&L, data ? data : empty, len);
	if (L.D) {
		L.rdma = stage_rdma_present();
		read_document(&L, config_doc_root(L.D));
	}
	/* Sorted even when reading stopped: lookups are binary searches. */
	if (g->nedges > 1)
		qsort(g->edges, g->nedges, sizeof(*g->edges), edge_cmp);
	config_doc_free(L.D);
	free(L.edge_aux);
	free(L.edge_table);
	free(L.stage_aux);
	free(L.source_stamp);
	if (L.oom)
		return -ENOMEM;
	return g->nerrors || g->errors_dropped ? -EINVAL : 0;
}

int stage_graph_load_mem(const char *name, const void *data, size_t len,
			 struct stage_graph **out)
{
	if (!name || !out || (!data && len)) {
		log_error("stage_graph_load_mem: NULL %s", !name ? "name" : !out ? "out" : "data");
		return -EINVAL;
	}
	if (new_graph(name, out))
		return -ENOMEM;
	return load_bytes(*out, data, len);
}

int stage_graph_load(const char *path, struct stage_graph **out)
{
	struct stage_graph *g;
	unsigned char *data = NULL;
	size_t len = 0;
	long long size;
	int rc;

	if (!path || !out) {
		log_error("stage_graph_load: NULL %s", path ? "out" : "path");
		return -EINVAL;
	}
	if (new_graph(path, out))
		return -ENOMEM;
	g = *out;
	rc = read_file(path, &data, &len, &size);
	if (rc == -EFBIG) {
		if (size)
			graph_error(g, "%s:1:1: (document): the file is %lld bytes: a stage file "
				    "holds at most %u (10 MiB)", path, size, STAGE_MAX_FILE_BYTES);
		else
			graph_error(g, "%s:1:1: (document): more than %u bytes: a stage file "
				    "holds at most that (10 MiB)", path, STAGE_MAX_FILE_BYTES);
		return rc;
	}
	if (rc) {
		graph_error(g, "%s: cannot read: %s", path, strerror(-rc));
		return rc;
	}
	rc = load_bytes(g, data, len);
	free(data);
	return rc;
}

#endif

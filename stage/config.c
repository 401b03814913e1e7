/*
 * stage/config.c - reading vLLM-Omni's stage YAML into a resolved graph.
 *
 * Owns: parsing the file with libyaml (its document API keeps each node's
 * line and column), telling the two schemas apart, checking every field we
 * read for its type, resolving connector references, detecting two ends of
 * an edge that name different connector types, filling unconfigured edges
 * with shared memory, choosing a transport per edge from its connector
 * (connector_map.c) and filling window_size / max_inflight from the edge,
 * the file's defaults or ours. Every problem becomes one line "file:line:
 * column: key: what" in g->errors (and the log); keys are written as paths,
 * e.g. stage_args[1].input_connectors.from_stage_0.
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
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_map.h"
#include "log.h"

#ifdef FERRY_HAVE_YAML
#include <yaml.h>
#endif

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

const struct stage_def *stage_graph_stage(const struct stage_graph *g, const char *id)
{
	for (unsigned i = 0; g && id && i < g->nstages; i++)
		if (strcmp(g->stages[i].id, id) == 0)
			return &g->stages[i];
	return NULL;
}

const struct stage_edge *stage_graph_edge(const struct stage_graph *g, const char *from,
					  const char *to)
{
	for (unsigned i = 0; g && from && to && i < g->nedges; i++)
		if (strcmp(g->edges[i].from, from) == 0 && strcmp(g->edges[i].to, to) == 0)
			return &g->edges[i];
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
	for (unsigned i = 0; i < g->nwarnings; i++)
		free(g->warnings[i]);
	free(g->warnings);
	for (unsigned i = 0; i < g->nerrors; i++)
		free(g->errors[i]);
	free(g->errors);
	free(g->file);
	free(g);
}

/* Append a formatted line to a list; false on ENOMEM. */
static bool list_add(char ***list, unsigned *n, const char *fmt, va_list ap)
{
	char *line = NULL, **grown;

	if (vasprintf(&line, fmt, ap) < 0)
		return false;
	/* A referenced spec is read once per edge: say each thing once. */
	for (unsigned i = 0; i < *n; i++) {
		if (!strcmp((*list)[i], line)) {
			free(line);
			return true;
		}
	}
	grown = realloc(*list, (*n + 1) * sizeof(**list));
	if (!grown) {
		free(line);
		return false;
	}
	*list = grown;
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

#ifndef FERRY_HAVE_YAML

bool stage_rdma_present(void)
{
	return config_rdma_present();
}

int stage_graph_load(const char *path, struct stage_graph **out)
{
	struct stage_graph *g;

	if (!path || !out)
		return -EINVAL;
	*out = g = calloc(1, sizeof(*g));
	if (!g || !(g->file = strdup(path)))
		return -ENOMEM;
	graph_error(g, "%s: ferry was built without libyaml (yaml-0.1): stage YAML cannot be read",
		    path);
	return -EOPNOTSUPP;
}

#else

bool stage_rdma_present(void)
{
	return config_rdma_present();
}

struct loader {
	struct stage_graph *g;
	yaml_document_t doc;
	bool rdma;
	yaml_node_t *connectors; /* the mapping of defined connector specs, or NULL */
	const char *connectors_path;
	bool oom;
};

static yaml_node_t *node_at(struct loader *L, int idx)
{
	return yaml_document_get_node(&L->doc, idx);
}

yaml_node_t *config_node(struct loader *L, int index)
{
	return node_at(L, index);
}

void config_oom(struct loader *L)
{
	L->oom = true;
}

static void loc_error(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt,
		      ...) __attribute__((format(printf, 4, 5)));
static void loc_error(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt,
		      ...)
{
	struct stage_graph *g = L->g;
	char *text = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&text, fmt, ap) < 0)
		text = NULL;
	va_end(ap);
	if (!text) {
		L->oom = true;
		return;
	}
	graph_error(g, "%s:%lu:%lu: %s: %s", g->file, n ? (unsigned long)n->start_mark.line + 1 : 1,
		    n ? (unsigned long)n->start_mark.column + 1 : 1, key, text);
	free(text);
}

void config_warn(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
	struct stage_graph *g = L->g;
	unsigned before = g->nwarnings;
	char *text = NULL;
	va_list ap;

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

void config_error(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
{
	char *text = NULL;
	va_list ap;

	va_start(ap, fmt);
	if (vasprintf(&text, fmt, ap) < 0)
		text = NULL;
	va_end(ap);
	if (!text) {
		L->oom = true;
		return;
	}
	loc_error(L, n, key, "%s", text);
	free(text);
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

static bool is_merge_key(const yaml_node_t *k)
{
	const char *ks = config_scalar(k);

	return ks && !strcmp(ks, "<<") && k->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* Merge keys nest at most this deep (an alias may point back at its own mapping). */
#define MERGE_DEPTH 8

static yaml_node_t *map_get(struct loader *L, yaml_node_t *m, const char *key,
			    yaml_node_t **key_node, int depth)
{
	if (!m || m->type != YAML_MAPPING_NODE || depth > MERGE_DEPTH)
		return NULL;
	for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
		yaml_node_t *k = node_at(L, p->key);
		const char *ks = config_scalar(k);

		if (ks && strcmp(ks, key) == 0 && !is_merge_key(k)) {
			if (key_node)
				*key_node = k;
			return node_at(L, p->value);
		}
	}
	/* YAML merge keys: `<<: *defaults` or `<<: [*a, *b]` (earlier wins). */
	for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
		yaml_node_t *v = node_at(L, p->value), *got = NULL;

		if (!is_merge_key(node_at(L, p->key)) || !v)
			continue;
		if (v->type == YAML_MAPPING_NODE) {
			got = map_get(L, v, key, key_node, depth + 1);
		} else if (v->type == YAML_SEQUENCE_NODE) {
			for (yaml_node_item_t *it = v->data.sequence.items.start;
			     !got && it < v->data.sequence.items.top; it++)
				got = map_get(L, node_at(L, *it), key, key_node, depth + 1);
		}
		if (got)
			return got;
	}
	return NULL;
}

/* The value of key in mapping m (and its key node), or NULL. Merge keys apply. */
yaml_node_t *config_map_get(struct loader *L, yaml_node_t *m, const char *key,
			    yaml_node_t **key_node)
{
	return map_get(L, m, key, key_node, 0);
}

static bool pairs_have(const struct config_pair *p, unsigned n, const char *key)
{
	for (unsigned i = 0; i < n; i++) {
		const char *ks = config_scalar(p[i].key);

		if (ks && !strcmp(ks, key))
			return true;
	}
	return false;
}

static bool collect_pairs(struct loader *L, yaml_node_t *m, struct config_pair **out, unsigned *n,
			  unsigned *cap, int depth, bool merged)
{
	if (!m || m->type != YAML_MAPPING_NODE || depth > MERGE_DEPTH)
		return true;
	for (int pass = 0; pass < 2; pass++) {
		for (yaml_node_pair_t *p = m->data.mapping.pairs.start;
		     p < m->data.mapping.pairs.top; p++) {
			yaml_node_t *k = node_at(L, p->key), *v = node_at(L, p->value);
			const char *ks = config_scalar(k);

			if (is_merge_key(k) != (pass == 1))
				continue;
			if (pass == 1) {
				if (v && v->type == YAML_SEQUENCE_NODE) {
					for (yaml_node_item_t *it = v->data.sequence.items.start;
					     it < v->data.sequence.items.top; it++)
						if (!collect_pairs(L, node_at(L, *it), out, n, cap,
								   depth + 1, true))
							return false;
				} else if (!collect_pairs(L, v, out, n, cap, depth + 1, true)) {
					return false;
				}
				continue;
			}
			/* Keys of a merged mapping give way to those already there. */
			if (merged && (!ks || pairs_have(*out, *n, ks)))
				continue;
			if (*n == *cap) {
				struct config_pair *grown;

				*cap = *cap ? *cap * 2 : 8;
				grown = realloc(*out, *cap * sizeof(*grown));
				if (!grown)
					return false;
				*out = grown;
			}
			(*out)[*n].key = k;
			(*out)[(*n)++].value = v;
		}
	}
	return true;
}

struct config_pair *config_map_pairs(struct loader *L, yaml_node_t *m, unsigned *n)
{
	struct config_pair *out = NULL;
	unsigned cap = 0;

	*n = 0;
	if (!collect_pairs(L, m, &out, n, &cap, 0, false)) {
		free(out);
		*n = 0;
		L->oom = true;
		return NULL;
	}
	return out;
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
		config_error(L, n, key, "must be an integer, not %s%s%s%s",
			     n ? node_kind(n) : "missing", s ? " '" : "", s ? s : "", s ? "'" : "");
		return false;
	}
	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || *end) {
		config_error(L, n, key, "must be an integer, not '%s'", s);
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
	config_error(L, n, key, "must be true or false, not %s%s%s%s",
		     n ? node_kind(n) : "missing", s ? " '" : "", s ? s : "", s ? "'" : "");
	return false;
}

/* A non-empty string scalar. */
bool config_str(struct loader *L, yaml_node_t *n, const char *key, const char **out)
{
	const char *s = config_scalar(n);

	if (!s || config_is_null(n)) {
		config_error(L, n, key, "must be a string, not %s",
			     n ? (s ? "empty" : node_kind(n)) : "missing");
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
		config_error(L, n, key, "'%s' is not a stage id (1..%d of [A-Za-z0-9_-])", s,
			     STAGE_ID_MAX - 1);
		return false;
	}
	memcpy(out, s, len + 1);
	return true;
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

static void read_stage(struct loader *L, yaml_node_t *s, const char *path)
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
	if (stage_graph_stage(g, d.id)) {
		config_error(L, id, p, "stage %s is defined twice", d.id);
		return;
	}
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
	{
		struct stage_def *grown = realloc(g->stages, (g->nstages + 1) * sizeof(*grown));

		if (!grown) {
			L->oom = true;
			return;
		}
		g->stages = grown;
		g->stages[g->nstages++] = d;
	}
}

/* ------------------------------------------------------------------ */
/* Edges                                                               */
/* ------------------------------------------------------------------ */

static struct stage_edge *edge_find(struct stage_graph *g, const char *from, const char *to)
{
	return (struct stage_edge *)stage_graph_edge(g, from, to);
}

static struct stage_edge *edge_add(struct loader *L, const char *from, const char *to,
				   const yaml_node_t *where_node, const char *where)
{
	struct stage_graph *g = L->g;
	struct stage_edge *grown, *e;

	grown = realloc(g->edges, (g->nedges + 1) * sizeof(*grown));
	if (!grown) {
		L->oom = true;
		return NULL;
	}
	g->edges = grown;
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
	g->nedges++;
	return e;
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
		const char *name = config_scalar(v);
		yaml_node_t *spec = config_map_get(L, L->connectors, name, NULL);

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
	e = edge_find(L->g, from, to);
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
	size_t pl = strlen(prefix);

	if (!s || strncmp(s, prefix, pl) != 0 || !s[pl]) {
		config_error(L, k, path, "key must be %s<stage_id>, not '%s'", prefix,
			     s ? s : node_kind(k));
		return false;
	}
	if (strlen(s + pl) >= STAGE_ID_MAX ||
	    strspn(s + pl, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
		    strlen(s + pl)) {
		config_error(L, k, path, "'%s' does not name a stage id", s);
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
	struct config_pair *pairs;
	yaml_node_t *m, *id;
	unsigned npairs;

	m = config_map_get(L, s, field, NULL);
	path_join(p, spath, ".%s", field);
	if (!m || config_is_null(m) || !config_want(L, m, YAML_MAPPING_NODE, p))
		return;
	id = config_map_get(L, s, "stage_id", NULL);
	if (!config_scalar(id) || strlen(config_scalar(id)) >= STAGE_ID_MAX)
		return; /* reported with the stage */
	strcpy(self, config_scalar(id));
	pairs = config_map_pairs(L, m, &npairs);
	for (unsigned pi = 0; pi < npairs; pi++) {
		yaml_node_t *k = pairs[pi].key, *v = pairs[pi].value;
		const char *ks = config_scalar(k);

		path_join(q, p, ".%s", ks ? ks : "?");
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
	free(pairs);
}

/* An edge that must exist: create it (auto-filled) if no connector named it. */
static struct stage_edge *edge_expect(struct loader *L, const char *from, const char *to,
				      yaml_node_t *n, const char *path)
{
	struct stage_edge *e = edge_find(L->g, from, to);

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
	     it < list->data.sequence.items.top; it++, i++) {
		yaml_node_t *n = node_at(L, *it), *f, *t, *v;
		struct stage_edge *e;
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
		if ((v = config_map_get(L, n, "connector", NULL)))
			edge_connect(L, from, to, v, path_join(q, p, ".connector"));
		e = edge_expect(L, from, to, n, p);
		if (!e)
			return;
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
	yaml_node_t *src = config_map_get(L, s, "engine_input_source", NULL), *id;
	int i = 0;

	path_join(p, spath, ".engine_input_source");
	if (!src || config_is_null(src) || !config_want(L, src, YAML_SEQUENCE_NODE, p))
		return;
	id = config_map_get(L, s, "stage_id", NULL);
	if (!config_scalar(id) || strlen(config_scalar(id)) >= STAGE_ID_MAX)
		return;
	strcpy(self, config_scalar(id));
	for (yaml_node_item_t *it = src->data.sequence.items.start;
	     it < src->data.sequence.items.top; it++, i++) {
		yaml_node_t *n = node_at(L, *it);

		path_join(q, p, "[%d]", i);
		if (!stage_id_of(L, n, q, from) || !stage_known(L, from, n, q))
			continue;
		if (!strcmp(from, self)) {
			config_error(L, n, q, "stage %s takes input from itself", self);
			continue;
		}
		if (!edge_expect(L, from, self, n, q))
			return;
	}
}

/* ------------------------------------------------------------------ */
/* The document                                                        */
/* ------------------------------------------------------------------ */

static int edge_cmp_id(const char *a, const char *b)
{
	char *ea, *eb;
	long la = strtol(a, &ea, 10), lb = strtol(b, &eb, 10);

	if (!*ea && !*eb && *a && *b && la != lb)
		return la < lb ? -1 : 1;
	return strcmp(a, b);
}

static int edge_cmp(const void *x, const void *y)
{
	const struct stage_edge *a = x, *b = y;
	int c = edge_cmp_id(a->from, b->from);

	return c ? c : edge_cmp_id(a->to, b->to);
}

static void read_document(struct loader *L, yaml_node_t *root)
{
	struct stage_graph *g = L->g;
	const char *stages_key;
	yaml_node_t *runtime, *stages, *v;
	char p[PATH_MAX_LEN];
	int i;

	if (!root) {
		graph_error(g, "%s:1:1: (document): the file holds no YAML document", g->file);
		return;
	}
	if (!config_want(L, root, YAML_MAPPING_NODE, "(document)"))
		return;
	if (config_map_get(L, root, "stage_args", NULL)) {
		g->schema = STAGE_SCHEMA_LEGACY;
		stages_key = "stage_args";
	} else if (config_map_get(L, root, "stages", NULL)) {
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
	if (L->connectors) {
		/* Check every definition, used or not. */
		unsigned npairs;
		struct config_pair *pairs = config_map_pairs(L, L->connectors, &npairs);

		for (unsigned pi = 0; pi < npairs; pi++) {
			yaml_node_t *k = pairs[pi].key, *spec = pairs[pi].value, *n;
			const char *ks = config_scalar(k), *type;

			path_join(p, L->connectors_path, ".%s", ks ? ks : "?");
			if (!ks) {
				config_error(L, k, p, "a connector's name must be a string");
				continue;
			}
			if (!config_want(L, spec, YAML_MAPPING_NODE, p))
				continue;
			n = config_map_get(L, spec, "name", NULL);
			if (!n) {
				config_error(L, spec, p, "connector spec has no name");
				continue;
			}
			if (config_str(L, n, path_join(p, L->connectors_path, ".%s.name", ks),
				       &type) &&
			    !config_type_known(type))
				config_error(L, n, p, "unknown connector type '%s' (known: %s)",
					     type, config_known_types());
			n = config_map_get(L, spec, "extra", NULL);
			if (n && !config_is_null(n))
				config_want(L, n, YAML_MAPPING_NODE,
					    path_join(p, L->connectors_path, ".%s.extra", ks));
		}
		free(pairs);
	}

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
	if (!config_want(L, stages, YAML_SEQUENCE_NODE, stages_key))
		return;
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top; it++, i++)
		read_stage(L, node_at(L, *it), path_join(p, stages_key, "[%d]", i));
	if (!g->nstages && !g->nerrors)
		config_error(L, stages, stages_key, "no stages are defined");

	/* Named connectors, then listed edges, then engine_input_source. */
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top; it++, i++) {
		yaml_node_t *s = node_at(L, *it);

		if (s->type != YAML_MAPPING_NODE)
			continue;
		path_join(p, stages_key, "[%d]", i);
		read_stage_connectors(L, s, p, false);
		read_stage_connectors(L, s, p, true);
	}
	if (g->schema == STAGE_SCHEMA_DEPLOY && config_map_get(L, root, "edges", NULL))
		read_edges(L, config_map_get(L, root, "edges", NULL), "edges");
	else
		read_edges(L, config_map_get(L, runtime, "edges", NULL), "runtime.edges");
	i = 0;
	for (yaml_node_item_t *it = stages->data.sequence.items.start;
	     it < stages->data.sequence.items.top; it++, i++) {
		yaml_node_t *s = node_at(L, *it);

		if (s->type == YAML_MAPPING_NODE)
			read_input_sources(L, s, path_join(p, stages_key, "[%d]", i));
	}

	/* Auto-fill and defaults. */
	for (unsigned k = 0; k < g->nedges; k++) {
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
	if (g->nedges > 1)
		qsort(g->edges, g->nedges, sizeof(*g->edges), edge_cmp);
}

static int read_file(const char *path, unsigned char **data, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	size_t cap = 0, n = 0;

	if (!f)
		return -errno;
	for (;;) {
		if (n == cap) {
			unsigned char *grown;

			if (cap >= (16u << 20)) {
				free(buf);
				fclose(f);
				return -EFBIG;
			}
			cap = cap ? cap * 2 : 4096;
			grown = realloc(buf, cap);
			if (!grown) {
				free(buf);
				fclose(f);
				return -ENOMEM;
			}
			buf = grown;
		}
		size_t got = fread(buf + n, 1, cap - n, f);

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
	*data = buf;
	*len = n;
	return 0;
}

int stage_graph_load(const char *path, struct stage_graph **out)
{
	struct loader L = { 0 };
	struct stage_graph *g;
	yaml_parser_t parser;
	unsigned char *data = NULL;
	size_t len = 0;
	int rc;

	if (!path || !out) {
		log_error("stage_graph_load: NULL %s", path ? "out" : "path");
		return -EINVAL;
	}
	*out = g = calloc(1, sizeof(*g));
	if (!g || !(g->file = strdup(path))) {
		free(g);
		*out = NULL;
		return -ENOMEM;
	}
	L.g = g;
	rc = read_file(path, &data, &len);
	if (rc) {
		graph_error(g, "%s: cannot read: %s", path, strerror(-rc));
		return rc;
	}
	if (!yaml_parser_initialize(&parser)) {
		free(data);
		return -ENOMEM;
	}
	yaml_parser_set_input_string(&parser, data, len);
	if (!yaml_parser_load(&parser, &L.doc)) {
		graph_error(g, "%s:%lu:%lu: (document): malformed YAML: %s%s%s", path,
			    (unsigned long)parser.problem_mark.line + 1,
			    (unsigned long)parser.problem_mark.column + 1,
			    parser.problem ? parser.problem : "parse error",
			    parser.context ? " " : "", parser.context ? parser.context : "");
		yaml_parser_delete(&parser);
		free(data);
		return -EINVAL;
	}
	L.rdma = stage_rdma_present();
	read_document(&L, yaml_document_get_root_node(&L.doc));
	yaml_document_delete(&L.doc);
	yaml_parser_delete(&parser);
	free(data);
	if (L.oom)
		return -ENOMEM;
	return g->nerrors || g->errors_dropped ? -EINVAL : 0;
}

#endif

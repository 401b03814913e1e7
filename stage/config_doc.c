/*
 * stage/config_doc.c - the stage file as one YAML document, bounded and
 * indexed for the loader (config.c).
 *
 * Owns: composing the document from libyaml's events rather than with
 * yaml_parser_load, which reads the first of several documents without a
 * word, lets the scanner run into deep flow nesting (its simple-key check
 * is quadratic in the depth: 100,000 `[` took 45 s) and looks up every
 * alias and anchor in a list (quadratic in the anchors). Here the bounds of
 * config.h are checked as the events come (one document, nesting depth,
 * node count), so a hostile file is refused after the few events that cross
 * a bound; anchors are resolved once at the end by sorting (an anchor
 * defined twice is refused, as PyYAML does). Then an index, made once: each
 * scalar's text gets a number (equal texts, equal numbers: comparisons are
 * O(1) whatever the length), each node its place (parent and slot, for key
 * paths in messages), and each mapping is checked once: duplicate keys
 * (PyYAML keeps the last, a first-match lookup the first: refused, both
 * places named), merge keys (`<<`) whose value is not a mapping or a list
 * of mappings, merges nested deeper than STAGE_MAX_MERGE_DEPTH or in a
 * cycle, more than STAGE_MAX_KEYS keys. Last, each mapping the loader reads
 * is made once with its merges applied (keys written in it win, then
 * earlier merges) and kept sorted by text number for O(log n) lookups;
 * merges may bring in STAGE_MAX_MERGED keys over the whole file. All of it
 * is linear in the file, or n log n for the sorts.
 */
#ifdef FERRY_HAVE_YAML

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_doc.h"

#define NONE UINT32_MAX
#define HEIGHT_INF 255
#define PATH_LEN 256

struct keyref {
	uint32_t text, pair;
};

/* A mapping with its merges applied. */
struct config_map {
	struct config_pair *pairs;
	unsigned n;
	struct keyref *keys; /* pairs with a scalar key, sorted by text number */
	unsigned nkeys;
};

struct config_doc {
	yaml_document_t doc;
	bool have_doc;
	uint32_t n;           /* nodes */
	uint32_t *parent;     /* per node: the collection it was written in, NONE for the root */
	uint32_t *slot;       /* its item index there, or pair index * 2 + (1 for a value) */
	uint32_t *text;       /* per node: its text number (scalars), else NONE */
	uint32_t *texts;      /* per text number: a node holding it; in (length, bytes) order */
	uint32_t ntexts;
	uint32_t *merge_key;  /* per mapping: the node of its `<<` key, else NONE */
	uint32_t *seen;       /* per text number: a stamp, for duplicate checks */
	uint32_t *first;      /* per text number: where it was seen first */
	uint32_t stamp;
	struct config_map **maps; /* per node, made on first use */
	unsigned merged;          /* keys brought in by merges so far */
	bool merge_refused;
};

struct anchor {
	char *name;
	uint32_t node; /* 0-based */
	uint32_t order;
	yaml_mark_t mark;
};

struct alias {
	char *name;
	uint32_t order;
	yaml_mark_t mark;
	uint32_t parent, slot; /* where it stands (parent NONE: the whole document) */
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return true;
	while (c < need)
		c *= 2;
	q = realloc(*p, c * elem);
	if (!q)
		return false;
	*p = q;
	*cap = c;
	return true;
}

static yaml_node_t *node_i(struct config_doc *D, uint32_t i)
{
	return &D->doc.nodes.start[i];
}

static uint32_t index_of(struct config_doc *D, const yaml_node_t *n)
{
	return (uint32_t)(n - D->doc.nodes.start);
}

/* Show at most this much of a name or key in a message. */
#define SHOW_MAX 64
#define SHOW(s, len) (int)((len) > SHOW_MAX ? SHOW_MAX : (len)), (const char *)(s), \
		     (len) > SHOW_MAX ? "..." : ""

/* "a.b[3].c" for the place (parent, slot); "(document)" for the root. */
static const char *path_at(struct config_doc *D, uint32_t parent, uint32_t slot, char *buf)
{
	uint32_t chain[2 * (STAGE_MAX_DEPTH + 2)], k = 0;
	size_t off = 0;

	if (parent == NONE)
		return strcpy(buf, "(document)");
	chain[k++] = parent;
	chain[k++] = slot;
	while (D->parent[parent] != NONE && k + 2 <= sizeof(chain) / sizeof(chain[0])) {
		chain[k++] = D->parent[parent];
		chain[k++] = D->slot[parent];
		parent = D->parent[parent];
	}
	buf[0] = 0;
	while (k && off < PATH_LEN - 1) {
		uint32_t s = chain[--k], p = chain[--k];
		yaml_node_t *pn = node_i(D, p);
		int w;

		if (pn->type == YAML_SEQUENCE_NODE) {
			w = snprintf(buf + off, PATH_LEN - off, "[%u]", s);
		} else {
			yaml_node_pair_t *pr = &pn->data.mapping.pairs.start[s / 2];
			yaml_node_t *kn = yaml_document_get_node(&D->doc, pr->key);

			if (kn && kn->type == YAML_SCALAR_NODE)
				w = snprintf(buf + off, PATH_LEN - off, "%s%.*s%s", off ? "." : "",
					     SHOW(kn->data.scalar.value, kn->data.scalar.length));
			else
				w = snprintf(buf + off, PATH_LEN - off, "%s?", off ? "." : "");
		}
		if (w < 0)
			break;
		off += (size_t)w;
	}
	return buf;
}

static const char *path_of(struct config_doc *D, uint32_t node, char *buf)
{
	return path_at(D, D->parent[node], D->slot[node], buf);
}

/* ------------------------------------------------------------------ */
/* Composing the document from events                                  */
/* ------------------------------------------------------------------ */

struct composer {
	struct loader *L;
	struct config_doc *D;
	size_t pcap;                  /* of D->parent, D->slot */
	struct anchor *anchors;
	size_t nanchors, acap;
	struct alias *aliases;
	size_t naliases, lcap;
	struct {
		uint32_t node; /* 1-based */
		int key;       /* a mapping's key waiting for its value (1-based), or 0 */
	} stack[STAGE_MAX_DEPTH];
	int depth;
};

/*
 * Put node id (1-based; for an alias, a stand-in patched later) in the open
 * collection; *parent, *slot say where.
 */
static bool attach(struct composer *C, int id, uint32_t *parent, uint32_t *slot)
{
	yaml_document_t *doc = &C->D->doc;
	yaml_node_t *p;
	int pid;

	*parent = NONE;
	*slot = 0;
	if (!C->depth)
		return true;
	pid = (int)C->stack[C->depth - 1].node;
	p = yaml_document_get_node(doc, pid);
	*parent = (uint32_t)pid - 1;
	if (p->type == YAML_SEQUENCE_NODE) {
		*slot = (uint32_t)(p->data.sequence.items.top - p->data.sequence.items.start);
		return yaml_document_append_sequence_item(doc, pid, id);
	}
	*slot = (uint32_t)(p->data.mapping.pairs.top - p->data.mapping.pairs.start) * 2;
	if (!C->stack[C->depth - 1].key) {
		C->stack[C->depth - 1].key = id;
		return true;
	}
	*slot += 1;
	if (!yaml_document_append_mapping_pair(doc, pid, C->stack[C->depth - 1].key, id))
		return false;
	C->stack[C->depth - 1].key = 0;
	return true;
}

/* A node of the event (scalar or collection start); false on ENOMEM. */
static bool add_node(struct composer *C, yaml_event_t *ev, uint32_t order)
{
	struct config_doc *D = C->D;
	yaml_char_t *anchor = NULL;
	uint32_t parent, slot;
	yaml_node_t *n;
	int id;

	switch (ev->type) {
	case YAML_SCALAR_EVENT:
		id = yaml_document_add_scalar(&D->doc, NULL, ev->data.scalar.value,
					      (int)ev->data.scalar.length, ev->data.scalar.style);
		anchor = ev->data.scalar.anchor;
		break;
	case YAML_SEQUENCE_START_EVENT:
		id = yaml_document_add_sequence(&D->doc, NULL, ev->data.sequence_start.style);
		anchor = ev->data.sequence_start.anchor;
		break;
	default:
		id = yaml_document_add_mapping(&D->doc, NULL, ev->data.mapping_start.style);
		anchor = ev->data.mapping_start.anchor;
		break;
	}
	if (!id)
		return false; /* the parser's scalars are valid UTF-8: out of memory */
	n = yaml_document_get_node(&D->doc, id);
	n->start_mark = ev->start_mark;
	n->end_mark = ev->end_mark;
	D->n = (uint32_t)id;
	if (D->n > C->pcap) {
		size_t cap = C->pcap ? C->pcap * 2 : 64;
		uint32_t *q;

		while (cap < D->n)
			cap *= 2;
		if (!(q = realloc(D->parent, cap * sizeof(*q))))
			return false;
		D->parent = q;
		if (!(q = realloc(D->slot, cap * sizeof(*q))))
			return false;
		D->slot = q;
		C->pcap = cap;
	}
	if (!attach(C, id, &parent, &slot))
		return false;
	D->parent[id - 1] = parent;
	D->slot[id - 1] = slot;
	if (anchor) {
		struct anchor *a;

		if (!grow((void **)&C->anchors, &C->acap, C->nanchors + 1, sizeof(*a)))
			return false;
		a = &C->anchors[C->nanchors];
		a->name = strdup((const char *)anchor);
		if (!a->name)
			return false;
		a->node = (uint32_t)id - 1;
		a->order = order;
		a->mark = ev->start_mark;
		C->nanchors++;
	}
	if (ev->type != YAML_SCALAR_EVENT) {
		C->stack[C->depth].node = (uint32_t)id;
		C->stack[C->depth].key = 0;
		C->depth++;
	}
	return true;
}

static bool add_alias(struct composer *C, yaml_event_t *ev, uint32_t order)
{
	struct alias *a;

	if (!grow((void **)&C->aliases, &C->lcap, C->naliases + 1, sizeof(*a)))
		return false;
	a = &C->aliases[C->naliases];
	a->name = strdup((const char *)ev->data.alias.anchor);
	if (!a->name)
		return false;
	a->order = order;
	a->mark = ev->start_mark;
	C->naliases++;
	/* The stand-in: node 1 exists once any collection is open. */
	return attach(C, 1, &a->parent, &a->slot);
}

static int anchor_cmp(const void *x, const void *y)
{
	const struct anchor *a = x, *b = y;
	int c = strcmp(a->name, b->name);

	return c ? c : (a->order > b->order) - (a->order < b->order);
}

/* Anchors sorted: refuse one defined twice, point every alias at its node. */
static bool resolve_aliases(struct composer *C)
{
	struct config_doc *D = C->D;
	char path[PATH_LEN];
	bool ok = true;

	if (C->nanchors > 1)
		qsort(C->anchors, C->nanchors, sizeof(*C->anchors), anchor_cmp);
	for (size_t i = 1; i < C->nanchors && !config_stopped(C->L); i++) {
		struct anchor *a = &C->anchors[i - 1], *b = &C->anchors[i];

		if (strcmp(a->name, b->name))
			continue;
		config_error_mark(C->L, b->mark, "(document)",
				  "anchor &%.*s%s is defined twice (first at line %lu, column "
				  "%lu): PyYAML refuses it; name each anchor once",
				  SHOW(b->name, strlen(b->name)), (unsigned long)a->mark.line + 1,
				  (unsigned long)a->mark.column + 1);
		ok = false;
	}
	for (size_t i = 0; ok && i < C->naliases && !config_stopped(C->L); i++) {
		struct alias *al = &C->aliases[i];
		size_t lo = 0, hi = C->nanchors;
		struct anchor *hit = NULL;
		yaml_node_t *p;

		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			int c = strcmp(C->anchors[mid].name, al->name);

			if (!c) {
				hit = &C->anchors[mid];
				break;
			}
			if (c < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (!hit || hit->order >= al->order || al->parent == NONE) {
			config_error_mark(C->L, al->mark, path_at(D, al->parent, al->slot, path),
					  "undefined alias *%.*s%s (no anchor &%.*s%s before it)",
					  SHOW(al->name, strlen(al->name)),
					  SHOW(al->name, strlen(al->name)));
			ok = false;
			continue;
		}
		p = node_i(D, al->parent);
		if (p->type == YAML_SEQUENCE_NODE)
			p->data.sequence.items.start[al->slot] = (yaml_node_item_t)hit->node + 1;
		else if (al->slot & 1)
			p->data.mapping.pairs.start[al->slot / 2].value = (int)hit->node + 1;
		else
			p->data.mapping.pairs.start[al->slot / 2].key = (int)hit->node + 1;
	}
	return ok;
}

static bool compose(struct loader *L, struct config_doc *D, const unsigned char *data,
		    size_t len, bool *refused)
{
	struct composer C = { .L = L, .D = D };
	yaml_parser_t P;
	yaml_event_t ev;
	unsigned docs = 0;
	uint32_t count = 0;
	bool ok = true, done = false;

	*refused = false;
	if (!yaml_parser_initialize(&P))
		return false;
	yaml_parser_set_input_string(&P, data, len);
	while (ok && !done && !*refused) {
		if (!yaml_parser_parse(&P, &ev)) {
			config_error_mark(L, P.problem_mark, "(document)", "malformed YAML: %s%s%s",
					  P.problem ? P.problem : "parse error",
					  P.context ? " " : "", P.context ? P.context : "");
			*refused = true;
			break;
		}
		switch (ev.type) {
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		case YAML_DOCUMENT_START_EVENT:
			if (++docs > 1) {
				config_error_mark(L, ev.start_mark, "(document)",
						  "a second YAML document starts here: a stage file "
						  "holds one (PyYAML's safe_load refuses it too)");
				*refused = true;
			} else if (!yaml_document_initialize(&D->doc, NULL, NULL, NULL, 1, 1)) {
				ok = false;
			} else {
				D->have_doc = true;
			}
			break;
		case YAML_ALIAS_EVENT:
		case YAML_SCALAR_EVENT:
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (++count > STAGE_MAX_NODES) {
				config_error_mark(L, ev.start_mark, "(document)",
						  "more than %u YAML nodes (scalars, sequences, "
						  "mappings and aliases): a stage file needs far fewer",
						  STAGE_MAX_NODES);
				*refused = true;
			} else if (ev.type == YAML_ALIAS_EVENT) {
				ok = add_alias(&C, &ev, count);
			} else if (ev.type != YAML_SCALAR_EVENT && C.depth == STAGE_MAX_DEPTH) {
				config_error_mark(L, ev.start_mark, "(document)",
						  "nested deeper than %d sequences and mappings",
						  STAGE_MAX_DEPTH);
				*refused = true;
			} else {
				ok = add_node(&C, &ev, count);
			}
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			if (C.depth > 0) {
				node_i(D, C.stack[C.depth - 1].node - 1)->end_mark = ev.end_mark;
				C.depth--;
			}
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&P);
	if (ok && !*refused && !resolve_aliases(&C))
		*refused = true;
	for (size_t i = 0; i < C.nanchors; i++)
		free(C.anchors[i].name);
	for (size_t i = 0; i < C.naliases; i++)
		free(C.aliases[i].name);
	free(C.anchors);
	free(C.aliases);
	return ok;
}

/* ------------------------------------------------------------------ */
/* The index                                                           */
/* ------------------------------------------------------------------ */

struct textref {
	const unsigned char *s;
	size_t len;
	uint32_t node;
};

static int text_cmp(const void *x, const void *y)
{
	const struct textref *a = x, *b = y;

	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp(a->s, b->s, a->len);
}

/* Number the scalar texts: one sort, O(total length * log n). */
static bool number_texts(struct config_doc *D)
{
	struct textref *t;
	uint32_t ns = 0;

	D->text = malloc((D->n ? D->n : 1) * sizeof(*D->text));
	t = malloc((D->n ? D->n : 1) * sizeof(*t));
	if (!D->text || !t) {
		free(t);
		return false;
	}
	for (uint32_t i = 0; i < D->n; i++) {
		yaml_node_t *n = node_i(D, i);

		D->text[i] = NONE;
		if (n->type == YAML_SCALAR_NODE) {
			t[ns].s = n->data.scalar.value;
			t[ns].len = n->data.scalar.length;
			t[ns++].node = i;
		}
	}
	if (ns > 1)
		qsort(t, ns, sizeof(*t), text_cmp);
	D->texts = malloc((ns ? ns : 1) * sizeof(*D->texts));
	if (!D->texts) {
		free(t);
		return false;
	}
	for (uint32_t i = 0; i < ns; i++) {
		if (!i || text_cmp(&t[i - 1], &t[i]))
			D->texts[D->ntexts++] = t[i].node;
		D->text[t[i].node] = D->ntexts - 1;
	}
	free(t);
	D->seen = calloc(D->ntexts ? D->ntexts : 1, sizeof(*D->seen));
	D->first = calloc(D->ntexts ? D->ntexts : 1, sizeof(*D->first));
	return D->seen && D->first;
}

/* The text number of len bytes at s, or NONE if no scalar holds it. */
static uint32_t find_text(struct config_doc *D, const char *s, size_t len)
{
	uint32_t lo = 0, hi = D->ntexts;
	struct textref want = { (const unsigned char *)s, len, 0 };

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		yaml_node_t *n = node_i(D, D->texts[mid]);
		struct textref have = { n->data.scalar.value, n->data.scalar.length, 0 };
		int c = text_cmp(&have, &want);

		if (!c)
			return mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NONE;
}

static bool is_merge_key(const yaml_node_t *k)
{
	return k && k->type == YAML_SCALAR_NODE && k->data.scalar.length == 2 &&
	       !memcmp(k->data.scalar.value, "<<", 2) &&
	       k->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static const char *kind_of(const yaml_node_t *n)
{
	switch (n ? n->type : YAML_NO_NODE) {
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

/* The `<<` value of mapping i (0-based), or NULL. */
static yaml_node_t *merge_value(struct config_doc *D, uint32_t i)
{
	yaml_node_t *m = node_i(D, i);

	if (D->merge_key[i] == NONE)
		return NULL;
	for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
	     p++)
		if ((uint32_t)p->key - 1 == D->merge_key[i])
			return yaml_document_get_node(&D->doc, p->value);
	return NULL;
}

/* Every mapping: key count, duplicate keys, the values of merge keys. */
static bool check_mappings(struct loader *L, struct config_doc *D)
{
	char path[PATH_LEN];
	bool ok = true;

	D->merge_key = malloc((D->n ? D->n : 1) * sizeof(*D->merge_key));
	if (!D->merge_key) {
		config_oom(L);
		return false;
	}
	for (uint32_t i = 0; i < D->n && !config_stopped(L); i++) {
		yaml_node_t *m = node_i(D, i);
		uint32_t j = 0, npairs;

		D->merge_key[i] = NONE;
		if (m->type != YAML_MAPPING_NODE)
			continue;
		npairs = (uint32_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
		if (npairs > STAGE_MAX_KEYS) {
			config_error(L, m, path_of(D, i, path), "a mapping of %u keys: at most %u",
				     npairs, STAGE_MAX_KEYS);
			ok = false;
			continue;
		}
		D->stamp++;
		for (yaml_node_pair_t *p = m->data.mapping.pairs.start;
		     p < m->data.mapping.pairs.top; p++, j++) {
			yaml_node_t *k = yaml_document_get_node(&D->doc, p->key);
			yaml_node_t *v = yaml_document_get_node(&D->doc, p->value);
			uint32_t t = D->text[p->key - 1];

			if (t != NONE) {
				if (D->seen[t] == D->stamp) {
					yaml_node_t *k1 = yaml_document_get_node(
						&D->doc, m->data.mapping.pairs.start[D->first[t]].key);

					config_error(L, k, path_at(D, i, j * 2, path),
						     "duplicate key: written at %lu:%lu and again at "
						     "%lu:%lu; PyYAML keeps the last, a first-match "
						     "reader the first: write it once",
						     (unsigned long)k1->start_mark.line + 1,
						     (unsigned long)k1->start_mark.column + 1,
						     (unsigned long)k->start_mark.line + 1,
						     (unsigned long)k->start_mark.column + 1);
					ok = false;
					continue;
				}
				D->seen[t] = D->stamp;
				D->first[t] = j;
			}
			if (!is_merge_key(k))
				continue;
			D->merge_key[i] = (uint32_t)p->key - 1;
			if (v->type == YAML_SEQUENCE_NODE) {
				unsigned ii = 0;

				for (yaml_node_item_t *it = v->data.sequence.items.start;
				     it < v->data.sequence.items.top; it++, ii++) {
					yaml_node_t *s = yaml_document_get_node(&D->doc, *it);
					char q[PATH_LEN + 16];

					if (s->type == YAML_MAPPING_NODE)
						continue;
					snprintf(q, sizeof(q), "%s[%u]", path_at(D, i, j * 2, path), ii);
					config_error(L, k, q, "a merge (<<) list holds mappings only, "
						     "not %s (PyYAML refuses it too)", kind_of(s));
					ok = false;
				}
			} else if (v->type != YAML_MAPPING_NODE) {
				config_error(L, k, path_at(D, i, j * 2, path),
					     "a merge (<<) takes a mapping or a list of mappings, not "
					     "%s (PyYAML refuses it too)", kind_of(v));
				ok = false;
			}
		}
	}
	return ok && !config_stopped(L);
}

/* The s-th mapping merged by merge value v (0-based node), or NONE past the end. */
static uint32_t merge_source(struct config_doc *D, yaml_node_t *v, uint32_t s)
{
	if (v->type == YAML_MAPPING_NODE)
		return s ? NONE : index_of(D, v);
	if (s >= (uint32_t)(v->data.sequence.items.top - v->data.sequence.items.start))
		return NONE;
	return (uint32_t)v->data.sequence.items.start[s] - 1;
}

/*
 * How deep merges nest under each mapping (0: it merges nothing; a merge
 * of one that merges nothing: 1), by a depth-first walk with an explicit
 * stack, each mapping once. Refuse a cycle (reported where it closes) and
 * more than STAGE_MAX_MERGE_DEPTH (reported at the mapping just past it).
 */
static bool check_merge_depth(struct loader *L, struct config_doc *D)
{
	enum { WHITE = 0, GRAY, BLACK };
	struct frame {
		uint32_t node, next;
		unsigned h;
	} *stack = NULL;
	size_t cap = 0, sp = 0;
	unsigned char *color = calloc(D->n ? D->n : 1, 1), *height = calloc(D->n ? D->n : 1, 1);
	char path[PATH_LEN];
	bool ok = true;

	if (!color || !height)
		goto oom;
	for (uint32_t i = 0; i < D->n && !config_stopped(L); i++) {
		if (D->merge_key[i] == NONE || color[i] != WHITE)
			continue;
		if (!grow((void **)&stack, &cap, 1, sizeof(*stack)))
			goto oom;
		stack[0] = (struct frame){ i, 0, 0 };
		sp = 1;
		color[i] = GRAY;
		while (sp && !config_stopped(L)) {
			struct frame *f = &stack[sp - 1];
			uint32_t s = merge_source(D, merge_value(D, f->node), f->next);
			unsigned h;

			if (s != NONE) {
				f->next++;
				if (color[s] == GRAY) {
					config_error(L, node_i(D, D->merge_key[f->node]),
						     path_of(D, D->merge_key[f->node], path),
						     "merges (<<) lead back into a mapping they are "
						     "merged into: a cycle");
					f->h = HEIGHT_INF;
					ok = false;
				} else if (color[s] == BLACK) {
					h = height[s] == HEIGHT_INF ? HEIGHT_INF : height[s] + 1u;
					if (h > f->h)
						f->h = h;
				} else if (D->merge_key[s] == NONE) {
					color[s] = BLACK;
					if (f->h < 1)
						f->h = 1;
				} else {
					if (!grow((void **)&stack, &cap, sp + 1, sizeof(*stack)))
						goto oom;
					stack[sp++] = (struct frame){ s, 0, 0 };
					color[s] = GRAY;
				}
				continue;
			}
			h = f->h;
			height[f->node] = (unsigned char)(h == HEIGHT_INF ? HEIGHT_INF
						: h > STAGE_MAX_MERGE_DEPTH + 1 ? STAGE_MAX_MERGE_DEPTH + 2 : h);
			color[f->node] = BLACK;
			if (h == STAGE_MAX_MERGE_DEPTH + 1) {
				config_error(L, node_i(D, D->merge_key[f->node]),
					     path_of(D, D->merge_key[f->node], path),
					     "merges (<<) nest %d deep from here: at most %d",
					     STAGE_MAX_MERGE_DEPTH + 1, STAGE_MAX_MERGE_DEPTH);
				ok = false;
			}
			sp--;
			if (sp) {
				f = &stack[sp - 1];
				h = height[stack[sp].node] == HEIGHT_INF ? HEIGHT_INF
									 : height[stack[sp].node] + 1u;
				if (h > f->h)
					f->h = h;
			}
		}
	}
	free(stack);
	free(color);
	free(height);
	return ok && !config_stopped(L);
oom:
	free(stack);
	free(color);
	free(height);
	config_oom(L);
	return false;
}

/* ------------------------------------------------------------------ */
/* Mappings with merges applied                                        */
/* ------------------------------------------------------------------ */

static int keyref_cmp(const void *x, const void *y)
{
	const struct keyref *a = x, *b = y;

	return (a->text > b->text) - (a->text < b->text);
}

/*
 * Mapping i (0-based) with its merges applied, made on first use. Merged
 * mappings are made first (their nesting is at most STAGE_MAX_MERGE_DEPTH,
 * checked at load), so the recursion is bounded.
 */
static struct config_map *doc_map(struct loader *L, struct config_doc *D, uint32_t i,
				  unsigned level)
{
	yaml_node_t *m = node_i(D, i), *mv = merge_value(D, i);
	struct config_map *cm;
	unsigned cap, own, stamp;
	char path[PATH_LEN];

	if (D->maps[i])
		return D->maps[i];
	if (level > STAGE_MAX_MERGE_DEPTH + 1)
		mv = NULL; /* cannot happen after check_merge_depth */
	for (uint32_t s = 0; mv; s++) {
		uint32_t src = merge_source(D, mv, s);

		if (src == NONE)
			break;
		if (!doc_map(L, D, src, level + 1))
			return NULL;
	}
	cm = calloc(1, sizeof(*cm));
	own = (unsigned)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
	cap = own;
	if (cm && cap)
		cm->pairs = malloc(cap * sizeof(*cm->pairs));
	if (!cm || (cap && !cm->pairs)) {
		free(cm);
		config_oom(L);
		return NULL;
	}
	stamp = ++D->stamp;
	for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
	     p++) {
		uint32_t t = D->text[p->key - 1];

		if ((uint32_t)p->key - 1 == D->merge_key[i])
			continue;
		if (t != NONE)
			D->seen[t] = stamp;
		cm->pairs[cm->n].key = yaml_document_get_node(&D->doc, p->key);
		cm->pairs[cm->n++].value = yaml_document_get_node(&D->doc, p->value);
	}
	for (uint32_t s = 0; mv; s++) {
		uint32_t src = merge_source(D, mv, s);
		struct config_map *sm;

		if (src == NONE)
			break;
		sm = D->maps[src];
		if (D->merged + sm->n > STAGE_MAX_MERGED) {
			if (!D->merge_refused)
				config_error(L, node_i(D, D->merge_key[i]),
					     path_of(D, D->merge_key[i], path),
					     "merges (<<) bring in more than %u keys over the file",
					     STAGE_MAX_MERGED);
			D->merge_refused = true;
			break;
		}
		D->merged += sm->n;
		for (unsigned k = 0; k < sm->n; k++) {
			uint32_t t = D->text[index_of(D, sm->pairs[k].key)];

			if (t != NONE && D->seen[t] == stamp)
				continue; /* written here, or merged earlier: that one wins */
			if (t != NONE)
				D->seen[t] = stamp;
			if (cm->n == cap) {
				struct config_pair *g;

				cap = cap ? cap * 2 : 8;
				g = realloc(cm->pairs, cap * sizeof(*g));
				if (!g) {
					free(cm->pairs);
					free(cm);
					config_oom(L);
					return NULL;
				}
				cm->pairs = g;
			}
			cm->pairs[cm->n++] = sm->pairs[k];
		}
	}
	if (cm->n > STAGE_MAX_KEYS) {
		config_error(L, m, path_of(D, i, path),
			     "a mapping of %u keys with its merges: at most %u", cm->n,
			     STAGE_MAX_KEYS);
		cm->n = STAGE_MAX_KEYS;
	}
	cm->keys = malloc((cm->n ? cm->n : 1) * sizeof(*cm->keys));
	if (!cm->keys) {
		free(cm->pairs);
		free(cm);
		config_oom(L);
		return NULL;
	}
	for (unsigned k = 0; k < cm->n; k++) {
		uint32_t t = D->text[index_of(D, cm->pairs[k].key)];

		if (t != NONE)
			cm->keys[cm->nkeys++] = (struct keyref){ t, k };
	}
	if (cm->nkeys > 1)
		qsort(cm->keys, cm->nkeys, sizeof(*cm->keys), keyref_cmp);
	D->maps[i] = cm;
	return cm;
}

static struct config_map *map_of(struct loader *L, struct config_doc *D, yaml_node_t *m)
{
	if (!D || !m || m->type != YAML_MAPPING_NODE)
		return NULL;
	return doc_map(L, D, index_of(D, m), 0);
}

static yaml_node_t *get_text(struct loader *L, struct config_doc *D, yaml_node_t *m, uint32_t t,
			     yaml_node_t **key_node)
{
	struct config_map *cm;
	unsigned lo = 0, hi;

	if (t == NONE || !(cm = map_of(L, D, m)))
		return NULL;
	hi = cm->nkeys;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (cm->keys[mid].text == t) {
			struct config_pair *p = &cm->pairs[cm->keys[mid].pair];

			if (key_node)
				*key_node = p->key;
			return p->value;
		}
		if (cm->keys[mid].text < t)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

yaml_node_t *config_doc_get(struct loader *L, struct config_doc *D, yaml_node_t *m,
			    const char *key, size_t len, yaml_node_t **key_node)
{
	if (!D || !m || m->type != YAML_MAPPING_NODE)
		return NULL;
	return get_text(L, D, m, find_text(D, key, len), key_node);
}

yaml_node_t *config_doc_get_node(struct loader *L, struct config_doc *D, yaml_node_t *m,
				 const yaml_node_t *k, yaml_node_t **key_node)
{
	if (!D || !m || !k || m->type != YAML_MAPPING_NODE)
		return NULL;
	return get_text(L, D, m, D->text[index_of(D, k)], key_node);
}

const struct config_pair *config_doc_pairs(struct loader *L, struct config_doc *D,
					   yaml_node_t *m, unsigned *n)
{
	struct config_map *cm = map_of(L, D, m);

	*n = cm ? cm->n : 0;
	return cm && cm->n ? cm->pairs : NULL;
}

/* ------------------------------------------------------------------ */
/* The document                                                        */
/* ------------------------------------------------------------------ */

yaml_node_t *config_doc_root(struct config_doc *D)
{
	return D && D->have_doc ? yaml_document_get_root_node(&D->doc) : NULL;
}

yaml_node_t *config_doc_node(struct config_doc *D, int index)
{
	return D && D->have_doc ? yaml_document_get_node(&D->doc, index) : NULL;
}

void config_doc_free(struct config_doc *D)
{
	if (!D)
		return;
	if (D->maps) {
		for (uint32_t i = 0; i < D->n; i++) {
			if (D->maps[i]) {
				free(D->maps[i]->pairs);
				free(D->maps[i]->keys);
				free(D->maps[i]);
			}
		}
	}
	free(D->maps);
	free(D->parent);
	free(D->slot);
	free(D->text);
	free(D->texts);
	free(D->merge_key);
	free(D->seen);
	free(D->first);
	if (D->have_doc)
		yaml_document_delete(&D->doc);
	free(D);
}

struct config_doc *config_doc_load(struct loader *L, const unsigned char *data, size_t len)
{
	struct config_doc *D = calloc(1, sizeof(*D));
	bool refused = false;

	if (!D) {
		config_oom(L);
		return NULL;
	}
	if (!compose(L, D, data, len, &refused)) {
		config_oom(L);
		config_doc_free(D);
		return NULL;
	}
	if (refused) {
		config_doc_free(D);
		return NULL;
	}
	if (!number_texts(D) || !(D->maps = calloc(D->n ? D->n : 1, sizeof(*D->maps)))) {
		config_oom(L);
		config_doc_free(D);
		return NULL;
	}
	if (!check_mappings(L, D) || !check_merge_depth(L, D)) {
		config_doc_free(D);
		return NULL;
	}
	return D;
}

#endif

/*
 * stage/config_map.h - what config.c and config_map.c share (private to
 * stage/).
 *
 * Owns: the YAML helpers of the loader (typed reads that report
 * "file:line:column: key: what" on a mismatch) and the connector side:
 * which connector types exist, which transport each maps to, and what each
 * `extra` key means here (config_map.c).
 */
#ifndef FERRY_STAGE_CONFIG_MAP_H
#define FERRY_STAGE_CONFIG_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config.h"

/* Room for element n of array *p (n elements there now), doubling; false on ENOMEM. */
bool config_grow(void **p, unsigned n, size_t elem);

#ifdef FERRY_HAVE_YAML
#include <yaml.h>

struct loader;

/*
 * Report "file:line:column: key: what" at node n (or mark m). Past
 * STAGE_MAX_ERRORS errors they are only counted and the loader stops
 * reading: loops check config_stopped().
 */
void config_error(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void config_error_mark(struct loader *L, yaml_mark_t m, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void config_warn(struct loader *L, const yaml_node_t *n, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
bool config_stopped(struct loader *L);

/*
 * A file's text in a message: at most CONFIG_SHOWN bytes of it, then
 * "...". Use as "%.*s%s", CONFIG_SHOW(s): the cost does not grow with the
 * text (a scalar may be megabytes, and an alias repeats it for free).
 */
#define CONFIG_SHOWN 64
#define CONFIG_SHOW(s) (int)strnlen((s), CONFIG_SHOWN), (s), config_more(s)
const char *config_more(const char *s);

bool config_is_null(const yaml_node_t *n);
const char *config_scalar(const yaml_node_t *n);
/* The value of key in mapping m with merges applied (O(log n)), or NULL. */
yaml_node_t *config_map_get(struct loader *L, yaml_node_t *m, const char *key,
			    yaml_node_t **key_node);
/*
 * The pairs of mapping m with YAML merge keys applied (`<<: *anchor` or a
 * sequence of them; keys written in m win, then earlier merges): *n pairs
 * kept by the document (not to be freed), NULL when empty.
 */
struct config_pair {
	yaml_node_t *key, *value;
};
const struct config_pair *config_map_pairs(struct loader *L, yaml_node_t *m, unsigned *n);
bool config_want(struct loader *L, yaml_node_t *n, yaml_node_type_t type, const char *key);
bool config_int(struct loader *L, yaml_node_t *n, const char *key, int64_t *out);
bool config_bool(struct loader *L, yaml_node_t *n, const char *key, bool *out);
/* A non-empty string of at most STAGE_MAX_STRING bytes without NUL. */
bool config_str(struct loader *L, yaml_node_t *n, const char *key, const char **out);
void config_oom(struct loader *L);
/*
 * Count one more extra key kept on an edge: false (with an error at n, and
 * the loader stopped) past STAGE_MAX_EXTRAS over the file.
 */
bool config_extra_count(struct loader *L, const yaml_node_t *n, const char *key);

/*
 * Fill e (its connector_type already set) from the spec mapping: the
 * transport, the honoured extra keys, the list of every extra key with what
 * happens to it. path is where the spec lives (for messages), ref its name
 * when it was referenced.
 */
void config_resolve_spec(struct loader *L, struct stage_edge *e, yaml_node_t *spec,
			 const char *path, const char *ref, bool rdma_present);
/* An edge nobody configured: SharedMemoryConnector, as upstream does. */
void config_autofill(struct loader *L, struct stage_edge *e);
#endif

bool config_type_known(const char *type);
/* "SharedMemoryConnector, ..." for messages. */
const char *config_known_types(void);
bool config_rdma_present(void);

#endif

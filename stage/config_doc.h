/*
 * stage/config_doc.h - the stage file as one bounded, indexed YAML document
 * (private to stage/; config_doc.c).
 *
 * Owns nothing the loader keeps: config.c loads a document, reads the
 * graph out of it through these lookups and frees it.
 */
#ifndef FERRY_STAGE_CONFIG_DOC_H
#define FERRY_STAGE_CONFIG_DOC_H

#ifdef FERRY_HAVE_YAML
#include <stddef.h>
#include <yaml.h>

#include "config_map.h"

struct config_doc;

/*
 * Parse len bytes into one YAML document within the bounds of config.h
 * and check it as a whole (one document, nesting, node count, anchors and
 * aliases, duplicate keys, merge keys). Returns the document, or NULL when
 * the file is refused (every reason reported through L) or memory ran out
 * (config_oom).
 */
struct config_doc *config_doc_load(struct loader *L, const unsigned char *data, size_t len);
void config_doc_free(struct config_doc *D);

/* The root node; NULL for a stream that holds no document. */
yaml_node_t *config_doc_root(struct config_doc *D);
/* Node by libyaml's index (1-based), or NULL. */
yaml_node_t *config_doc_node(struct config_doc *D, int index);

/*
 * The value of key (len bytes) in mapping m with merges applied, and its
 * key node; NULL if absent or m is not a mapping. O(log n).
 */
yaml_node_t *config_doc_get(struct loader *L, struct config_doc *D, yaml_node_t *m,
			    const char *key, size_t len, yaml_node_t **key_node);
/* The same, the key being the text of scalar node k. */
yaml_node_t *config_doc_get_node(struct loader *L, struct config_doc *D, yaml_node_t *m,
				 const yaml_node_t *k, yaml_node_t **key_node);
/*
 * The pairs of mapping m with merges applied (see config_map_pairs), kept
 * by the document: not to be freed. NULL with *n = 0 when empty.
 */
const struct config_pair *config_doc_pairs(struct loader *L, struct config_doc *D,
					   yaml_node_t *m, unsigned *n);
#endif

#endif

/*
 * stage/config.h - a pipeline as the stage YAML describes it, resolved
 * (private to the library, its tools and tests).
 *
 * Owns: the resolved graph of a vLLM-Omni stage YAML (both schemas): the
 * stages, and one struct stage_edge per pipeline edge with the transport
 * chosen for it, the connector it came from, the connector's `extra` keys
 * that mean something here, and the flow-control numbers (window_size,
 * max_inflight) with defaults filled in. config.c builds it; stage.c opens
 * a stage from it; tools/ferry.c prints it.
 *
 * For streams: an edge's flow-control numbers are in struct stage_edge:
 *   window_size   -1: a consumer takes each stream whole, in one
 *                 completion (FERRY_SQE_STREAM_WHOLE); otherwise chunk by
 *                 chunk. Upstream's default is -1.
 *   max_inflight  chunks of one stream sent and not yet released by the
 *                 consumer (the stream's credits). Upstream's default is 1.
 * Both come from the edge itself, else from the file's defaults
 * (runtime.defaults, or top-level defaults in the deploy schema), else
 * STAGE_DEFAULT_WINDOW_SIZE / STAGE_DEFAULT_MAX_INFLIGHT; `ferry check`
 * prints where each came from. stage.c applies them only when the file
 * gives them (window_from / inflight_from not STAGE_FROM_BUILTIN): the
 * built-in upstream values would make every stream whole and
 * stop-and-wait, so without them ferry's stream defaults hold.
 */
#ifndef FERRY_STAGE_CONFIG_H
#define FERRY_STAGE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

/* A stage_id as written in the file: [A-Za-z0-9_-], at most 15 characters. */
#define STAGE_ID_MAX 16
#define STAGE_MAX_RANKS 256
#define STAGE_DEFAULT_WINDOW_SIZE (-1)
#define STAGE_DEFAULT_MAX_INFLIGHT 1
/*
 * Errors kept per load, and warnings: the rest are counted, not kept. After
 * this many errors the loader stops reading (what follows is not looked at).
 */
#define STAGE_MAX_ERRORS 64

/*
 * The bounds of a stage file, far above any real pipeline (a few stages,
 * a few hundred YAML nodes). A file past one is refused with an error
 * "file:line:column: key: what" at the place it went past; loading takes
 * time linear in the file, so any file within STAGE_MAX_FILE_BYTES is
 * accepted or refused in well under a second.
 */
#define STAGE_MAX_FILE_BYTES (10u << 20) /* 10 MiB; larger: -EFBIG */
#define STAGE_MAX_DEPTH 64               /* sequences and mappings inside each other */
#define STAGE_MAX_NODES 262144           /* scalars, sequences, mappings and aliases */
#define STAGE_MAX_KEYS 4096              /* keys of one mapping, merged ones included */
#define STAGE_MAX_MERGE_DEPTH 8          /* merges (<<) of mappings that merge, nested */
#define STAGE_MAX_MERGED 65536           /* keys brought in by merges, over the file */
#define STAGE_MAX_STAGES 1024
#define STAGE_MAX_CONNECTORS 1024        /* defined connector specs */
#define STAGE_MAX_EDGES 4096
#define STAGE_MAX_EXTRAS 65536           /* extra keys over all edges (once per edge) */
#define STAGE_MAX_STRING 1024            /* bytes of a string the loader reads (names, hosts) */
#define STAGE_EXTRA_SHOWN 256            /* an extra key's or value's text is kept up to this */

enum stage_transport {
	STAGE_TRANSPORT_SHM = 0,
	STAGE_TRANSPORT_TCP,
	STAGE_TRANSPORT_RDMA,
	STAGE_TRANSPORT__MAX
};

enum stage_schema {
	STAGE_SCHEMA_LEGACY = 0, /* runtime.connectors + stage_args[] */
	STAGE_SCHEMA_DEPLOY,     /* top-level connectors + stages[] + edges[] */
};

/* Where a value came from. */
enum stage_origin {
	STAGE_FROM_BUILTIN = 0,
	STAGE_FROM_DEFAULTS,  /* the file's defaults */
	STAGE_FROM_EDGE,      /* the edge's own entry */
};

/* One key of a connector's `extra`, as written, and what ferry does with it. */
struct stage_extra {
	char *key;
	char *value;      /* scalar text; "<mapping>" / "<sequence>" otherwise */
	bool honoured;
	const char *note; /* static text: what it does here, or why it is ignored */
	int line, column; /* 1-based */
};

struct stage_edge {
	char from[STAGE_ID_MAX];
	char to[STAGE_ID_MAX];
	enum stage_transport transport;
	char *connector;      /* its name in the file; NULL when auto-filled */
	char *connector_type; /* SharedMemoryConnector, MooncakeStoreConnector, ... */
	bool auto_filled;     /* no connector named: shm by default */
	bool inline_spec;     /* the spec was written in place, not referenced */
	/*
	 * Store-style connectors (MooncakeStore, Yuanrong): a GET without
	 * metadata finds the key by asking the sender over the control
	 * channel rather than waiting for a push.
	 */
	bool key_lookup;
	int64_t window_size;
	int64_t max_inflight;
	enum stage_origin window_from, inflight_from;
	/* Honoured extra keys (0 / NULL = not given). */
	char *host;                /* host: address of the receiving side (tcp/rdma) */
	uint32_t port;             /* zmq_port / port: control endpoint port */
	uint64_t memory_pool_size; /* bytes of the registered pool the stage wants */
	char *memory_pool_device;  /* "cpu", or "cuda[:N]" (a host pool, pinned for CUDA's DMA) */
	char *device_name;         /* RDMA device(s) */
	uint64_t eager_max;        /* shm_threshold_bytes: tcp sends smaller ones eagerly */
	uint32_t get_timeout_ms;   /* get_sub_timeout_ms: bound of a GET on this edge */
	struct stage_extra *extras;
	unsigned nextras;
	char *note;          /* why this transport (a warning when it fell back) */
	bool fell_back;      /* e.g. rdma asked, no RDMA device: tcp */
	char *where;         /* key path where the connector was named (or the edge listed) */
	int line, column;    /* and its position, 1-based */
};

struct stage_def {
	char id[STAGE_ID_MAX];
	unsigned ranks;      /* engine_args.tensor_parallel_size, default 1 */
	int line, column;
};

struct stage_graph {
	char *file;
	enum stage_schema schema;
	bool async_chunk;
	int64_t default_window_size, default_max_inflight;
	enum stage_origin default_window_from, default_inflight_from;
	struct stage_def *stages; /* in file order */
	unsigned nstages;
	unsigned *stage_order;    /* indices of stages, sorted by id (for lookups) */
	struct stage_edge *edges; /* sorted by from, then to (numeric ids by value) */
	unsigned nedges;
	char **warnings;     /* "file:line:col: key: text" */
	unsigned nwarnings;  /* warnings kept (see warnings_dropped) */
	unsigned warnings_dropped;
	char **errors;       /* "file:line:col: key: text" */
	unsigned nerrors;    /* errors kept (see errors_dropped) */
	unsigned errors_dropped; /* counted until the loader stopped reading */
};

/*
 * Load and resolve the stage YAML at path. Always tries to return a graph
 * in *out (NULL only on -ENOMEM or bad arguments) so that its errors can be
 * printed; each error and warning is also logged. Returns 0 when the file
 * is valid, -EINVAL when g->errors holds the reasons (nothing should start
 * from such a graph), -EFBIG when the file is larger than
 * STAGE_MAX_FILE_BYTES, -ENOENT/-EACCES/... when the file cannot be read
 * (one error in g->errors), -EOPNOTSUPP when built without libyaml,
 * -ENOMEM.
 */
int stage_graph_load(const char *path, struct stage_graph **out);

/*
 * The same from len bytes in memory (they need no terminating NUL); name
 * stands for the file in messages. stage_graph_load reads the file and
 * calls this; the fuzz harness calls it directly.
 */
int stage_graph_load_mem(const char *name, const void *data, size_t len,
			 struct stage_graph **out);

/* Free a graph (NULL is fine). */
void stage_graph_free(struct stage_graph *g);

/* The stage with this id, or NULL (a binary search). */
const struct stage_def *stage_graph_stage(const struct stage_graph *g, const char *id);
/* The edge from -> to, or NULL (a binary search). */
const struct stage_edge *stage_graph_edge(const struct stage_graph *g, const char *from,
					  const char *to);

/*
 * The engine name of rank `rank` of stage `id`: "stage<id>.rank<rank>".
 * Returns 0 or -ENAMETOOLONG.
 */
int stage_engine_name(const char *id, unsigned rank, char *buf, size_t len);

/*
 * The rank of stage `other` (with other_ranks ranks) that rank `rank` of
 * this stage talks to on an edge: the same index if it exists, else 0.
 */
static inline unsigned stage_peer_rank(unsigned rank, unsigned other_ranks)
{
	return rank < other_ranks ? rank : 0;
}

const char *stage_transport_name(enum stage_transport t);

/*
 * The order of stage ids: ids of digits only first, by value (then by
 * text: "01" before "1"), then the others by strcmp. A total order.
 */
int stage_id_cmp(const char *a, const char *b);

/*
 * Is an RDMA device present? Looks at $FERRY_RDMA_SYSFS if set (tests),
 * else /sys/class/infiniband: true if it holds at least one entry.
 */
bool stage_rdma_present(void);

#endif

/*
 * ferry/stage.h - pipeline stages of a vLLM-Omni stage YAML on top of ferry
 * (the OmniConnector-style put/get/cleanup/health/close).
 *
 * The stage layer is built only on the public API of ferry.h (which this
 * header includes): a binding may wrap it alone, or ferry.h alone. Every
 * function here may be called from any thread; calls on one stage from
 * several threads are safe (each thread gets its own submission ring and
 * completion queue), but ferry_stage_close must be the last call on it.
 */
#ifndef FERRY_STAGE_H
#define FERRY_STAGE_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Stages: a pipeline stage opened from the stage YAML                 */
/* ------------------------------------------------------------------ */

/*
 * The OmniConnector-style surface. A stage YAML (vLLM-Omni's, either
 * schema) describes stages and the edges between them; ferry_stage_open
 * makes the engine of one rank of one stage and wires its edges: a peer per
 * edge, the transport the edge's connector maps to, the role (the `from`
 * stage sends, the `to` stage receives). Engine names are
 * "stage<id>.rank<r>"; keys are stored as "{key}@{from engine}_{to engine}".
 * put/get are synchronous calls in upstream's shape (put reports the size
 * and an opaque metadata blob, get works with or without it); under them
 * are ordinary PUT and GET ops, so the engine (ferry_stage_engine) can be
 * used with the SQ/CQ API at the same time. docs/api.md has a walk-through.
 */
struct ferry_stage;

struct ferry_stage_params {
	size_t size;             /* sizeof(struct ferry_stage_params) */
	const char *config_path; /* the stage YAML (required) */
	const char *stage_id;    /* this stage, as its stage_id is written ("1") */
	uint32_t rank;           /* this rank of the stage (< its tensor_parallel_size) */
	const char *ns;          /* namespace; NULL = "default" */
	enum ferry_progress_mode progress; /* THREAD (default) or MANUAL */
	size_t pool_size;        /* 0: the largest memory_pool_size of its edges, else 64 MiB */
	uint32_t timeout_ms;     /* bound of put and of a get without its own (0 = 30000) */
	uint32_t flags;          /* none yet: must be 0 */
};

#define FERRY_STAGE_PARAMS_INIT { .size = sizeof(struct ferry_stage_params) }

/* The metadata put hands back: opaque, fixed size, safe to copy as bytes. */
#define FERRY_STAGE_META_SIZE 64
struct ferry_stage_meta {
	uint8_t opaque[FERRY_STAGE_META_SIZE];
};

/* ferry_stage_get flags. */
#define FERRY_STAGE_NOWAIT (1u << 0) /* -EAGAIN at once when the key is not there yet */

/*
 * Load the YAML, check it (any error: -EINVAL, every problem logged as
 * "file:line:column: key: what", nothing started), create the engine
 * "stage<stage_id>.rank<rank>" and wire the edges of this stage. An edge
 * whose transport this build does not have (rdma today) fails the open
 * with -EPROTONOSUPPORT and a log line naming the edge; a store-like edge
 * in a build without libzmq with -EOPNOTSUPP. Returns 0 and
 * *out, or -EINVAL (params, config, unknown stage_id or rank),
 * -EOPNOTSUPP (built without libyaml), -ENOENT (no such file), -EFBIG
 * (a file over 10 MiB), the errors of ferry_engine_create, -ENOMEM.
 * Any thread.
 */
FERRY_API int ferry_stage_open(const struct ferry_stage_params *params,
			       struct ferry_stage **out);

/* The stage's engine (valid until ferry_stage_close), for the SQ/CQ API. Any thread. */
FERRY_API struct ferry_engine *ferry_stage_engine(struct ferry_stage *s);

/*
 * The edge from -> to of this stage (it is one end of it), for streams: the
 * peer to STREAM_PUT to (a sending edge: its credits are the edge's
 * max_inflight when the file sets one) or to STREAM_GET from, and in
 * *stream_get_flags (may be NULL) the SQE flags the edge asks of a
 * STREAM_GET: FERRY_SQE_STREAM_WHOLE when the file says window_size: -1.
 * Returns 0, -EINVAL, or -ENOENT when the stage is no end of from -> to.
 * Any thread.
 */
FERRY_API int ferry_stage_edge(struct ferry_stage *s, const char *from, const char *to,
			       struct ferry_peer **peer, uint32_t *stream_get_flags);

/*
 * Put len bytes of data under key on edge from -> to (stage ids; from must
 * be this stage). Waits until the receiving stage holds the key (or the
 * stage's timeout: -ETIMEDOUT); on a store-like edge (MooncakeStoreConnector,
 * MooncakeConnector, YuanrongConnector) the key is kept here instead and the
 * receiving stage's get fetches it through the control channel, so the put
 * returns once it is kept (-EEXIST: already kept here). On success returns 0, writes the payload
 * size to *size and the metadata to *meta (each may be NULL); the
 * metadata travels to the consumer by whatever control path the
 * application has, and may be handed to ferry_stage_get. Errors: -EINVAL
 * (arguments, or no such edge of this stage: logged), -EEXIST (key live at
 * the receiver), the PUT errors of ferry_prep_put. Data is copied once
 * into the pool. Any thread, several at once (each thread waits on a
 * completion queue of its own, made at its first call); it blocks, so a
 * binding releases its interpreter lock around it. No callback of the
 * caller's runs.
 */
FERRY_API int ferry_stage_put(struct ferry_stage *s, const char *from, const char *to,
			      const char *key, const void *data, size_t len, uint64_t *size,
			      struct ferry_stage_meta *meta);

/*
 * The same with a pool buffer (zero copy; ownership moves, whatever the
 * result). Any thread, several at once; it blocks, as ferry_stage_put.
 */
FERRY_API int ferry_stage_put_buf(struct ferry_stage *s, const char *from, const char *to,
				  const char *key, struct ferry_buf *buf, uint64_t *size,
				  struct ferry_stage_meta *meta);

/*
 * Get the data put under key on edge from -> to (to must be this stage).
 * meta is what the producer's put returned, or NULL (the key alone finds
 * the data); a meta that is not ferry's or was made for another key or
 * edge is refused with -EINVAL. Waits up to timeout_ns (0: the edge's
 * get_sub_timeout_ms, else the stage's timeout; < 0: forever) and returns
 * -ETIMEDOUT; with FERRY_STAGE_NOWAIT returns -EAGAIN at once when the key
 * is not there yet (upstream's "None: poll again"). On success returns 0
 * and *out, a buffer holding the data (zero copy: ferry_buf_data,
 * ferry_buf_len; release it with ferry_buf_release). A get consumes the
 * key. -ECANCELED when ferry_stage_cleanup dropped the request meanwhile.
 * Any thread, several at once (as ferry_stage_put); it blocks, so a
 * binding releases its interpreter lock around it.
 */
FERRY_API int ferry_stage_get(struct ferry_stage *s, const char *from, const char *to,
			      const char *key, const struct ferry_stage_meta *meta,
			      int64_t timeout_ns, uint32_t flags, struct ferry_buf **out);

/*
 * Free everything of one request on this stage's edges: data that arrived
 * for it and was never taken, and gets still waiting for it (they return
 * -ECANCELED). Keys match as for ferry_prep_cleanup. Returns the number of
 * keys and gets dropped, or -EINVAL / -ENAMETOOLONG / -ESHUTDOWN.
 * Any thread (it waits for the engine to have done it).
 */
FERRY_API int ferry_stage_cleanup(struct ferry_stage *s, const char *request_id);

/*
 * The stage's health as one JSON object: stage id, rank, its edges
 * (peer, transport, connector, role, window_size, max_inflight) and the
 * engine's health (see ferry_engine_health). Same length contract as
 * ferry_engine_health. Any thread.
 */
FERRY_API int ferry_stage_health(struct ferry_stage *s, char *buf, size_t len);

/*
 * Close the stage: destroy its engine (pending gets return -ECANCELED),
 * free the handle and set *s to NULL. Safe to call twice with the same
 * variable (the second call finds NULL and returns 0). Any thread, once
 * every other thread is done with the stage (it must not race with other
 * calls on it); it waits for the engine's reactor, so a binding releases
 * its interpreter lock around it.
 */
FERRY_API int ferry_stage_close(struct ferry_stage **s);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/directory.h - the engine's directory service: store-like keys and
 * the requests that ride another engine's control session.
 *
 * Owns: the interface through which the reactor hands a service what no
 * transport does: a PUT with FERRY_SQE_PUBLISH (kept here for a peer to
 * fetch), a GET with FERRY_SQE_LOOKUP (ask the holder for the key), the
 * end of such a GET without its data (the holder forgets the wish), and
 * the ops FERRY_OP_PEER_HEALTH / LOOKUP / REMOTE_CANCEL. The control plane
 * registers itself as the engine's service at its start
 * (ferry__directory_set); a later service (a Ray-backed directory, say)
 * implements the same table. Without one, these ops complete with
 * -EOPNOTSUPP. Every call runs on the progress side and may complete op.
 */
#ifndef FERRY_DIRECTORY_H
#define FERRY_DIRECTORY_H

struct ferry_engine;
struct ferry_sqe;
struct op;

struct directory_ops {
	const char *name;
	/* A PUT with FERRY_SQE_PUBLISH, data in op->buf, key in op->key: keep it. */
	void (*publish)(struct ferry_engine *e, void *svc, struct op *op);
	/* A GET with FERRY_SQE_LOOKUP, parked on its key (or NOWAIT): ask its holder. */
	void (*fetch)(struct ferry_engine *e, void *svc, struct op *op, const struct ferry_sqe *sqe);
	/* Such a GET ended without its data (OP_F_WISH): the holder forgets the wish. */
	void (*forget)(struct ferry_engine *e, void *svc, struct op *op);
	/* FERRY_OP_PEER_HEALTH, FERRY_OP_LOOKUP, FERRY_OP_REMOTE_CANCEL. */
	void (*do_op)(struct ferry_engine *e, void *svc, struct op *op, const struct ferry_sqe *sqe);
};

/* The service of e from now on (NULL: none); at engine create, before any op. */
void ferry__directory_set(struct ferry_engine *e, const struct directory_ops *ops, void *svc);

#endif

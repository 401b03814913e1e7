/*
 * backends/tcp/ctl.h - the control channel's hooks into the engine (private).
 *
 * Owns: the few calls the reactor, the engine and the data path make into
 * the control channel (ctl.c), and the one call the control channel makes
 * into the data path (tcp.c). Each caller marks its call as a control
 * channel hook. Built without libzmq, the hooks answer -EOPNOTSUPP.
 */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include "internal.h"

/* The control channel as a backend: it carries PUTs only until a peer's handshake is done. */
extern const struct backend_ops ferry__ctl_backend;

/* FERRY_OP_PEER_HEALTH, FERRY_OP_LOOKUP, FERRY_OP_REMOTE_CANCEL (reactor dispatch). */
void ferry__ctl_do_op(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);

/*
 * A PUT with FERRY_SQE_PUBLISH whose data is in op->buf and key in op->key:
 * keep it here under "{key}@{me}_{to}". Completes op.
 */
void ferry__ctl_publish(struct ferry_engine *e, struct op *op);

/*
 * A GET with FERRY_SQE_LOOKUP, just parked on its key (or NOWAIT, not
 * parked): ask its holder to send it. May complete op.
 */
void ferry__ctl_fetch(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);

/*
 * A LOOKUP GET whose holder remembers its wish (OP_F_WISH) ends without the
 * data (deadline, cancel): tell the holder to forget the wish, so that a
 * later publish stays there instead of landing here unclaimed.
 */
void ferry__ctl_forget(struct ferry_engine *e, struct op *op);

/*
 * Drop what this engine holds of request r whose stored key is
 * "{key}@{from}_{to}" (NULL: any name): arrived data, parked GETs. Returns
 * how many (engine/cleanup.c).
 */
int ferry__cleanup_keys(struct ferry_engine *e, const char *r, size_t rl, const char *from,
			const char *to);

/*
 * The control channel's part of the health JSON: `,"control":{...}` into
 * buf (snprintf-like), or 0 when the engine has none. Any thread.
 */
int ferry__ctl_health(struct ferry_engine *e, char *buf, size_t len);

/*
 * tcp.c: the control channel declared the engine `name` dead: fail the
 * data links to it as if they had gone silent (their ops fail with res).
 */
void ferry__tcp_peer_dead(struct ferry_engine *e, const char *name, int res);

#endif

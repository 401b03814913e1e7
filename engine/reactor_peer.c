/*
 * engine/reactor_peer.c - peers off the op path: waiting for one, and
 * what the transports tell the engine about them.
 *
 * Owns: the wait-for-peer op state (a PUT whose peer is being reached, or
 * a FERRY_SQE_WAIT_PEER PUT whose peer is not up, waits on the peer's wait
 * list: ferry__peer_reached sends it on or fails it), the retry of peers
 * such PUTs wait for (with its backoff), engine-wide peer events
 * (ferry__peer_event), unresolving a transport's peers, a transport's
 * backend by its ops and the directory service's registration.
 */
#include <errno.h>

#include "internal.h"
#include "reactor_int.h"

#define RETRY_FIRST_NS 5000000ull    /* a peer not up: tried again after 5 ms, */
#define RETRY_MAX_NS 200000000ull    /* then less and less often, at least every 200 ms */

/*
 * A FERRY_SQE_WAIT_PEER PUT met a peer that is not up (-EHOSTUNREACH, or
 * its address refused: nothing of it was delivered): it waits on the
 * peer's wait list instead of completing, and the peer is tried again
 * (retry_peers) until it is up or the PUT's deadline passes. False when the
 * op must complete after all (the engine is closing).
 */
bool reactor_wait_for_peer(struct ferry_engine *e, struct op *op)
{
	struct ferry_peer *peer = op->peer;

	if (atomic_load_explicit(&e->closing, memory_order_relaxed) ||
	    (op->flags & OP_F_WAIT_PEER))
		return false;
	if (op->state == OP_PARKED || op->state == OP_QUEUED)
		return false; /* not a PUT that was on its way */
	op->state = OP_AWAY;
	op->flags |= OP_F_WAIT_PEER;
	op_list_append(&peer->wait_head, &peer->wait_tail, op);
	if (op->heap_idx == NO_SLOT && op->interval)
		op_arm_deadline(e, op, op->interval);
	if (!peer->retrying) {
		peer->retrying = true;
		peer->retry_next = e->retry_peers;
		e->retry_peers = peer;
	}
	if (!e->retry_at) { /* retry_peers sets its own next time */
		if (!e->retry_ns)
			e->retry_ns = RETRY_FIRST_NS;
		e->retry_at = reactor_now(e) + e->retry_ns;
	}
	return true;
}

/* Try the peers that PUTs wait for again (due at e->retry_at): reactor_run_once. */
int reactor_retry_peers(struct ferry_engine *e)
{
	struct ferry_peer *list = e->retry_peers, *p;
	int n = 0;

	e->retry_peers = NULL;
	e->retry_at = UINT64_MAX; /* while they are tried: no new schedule */
	while ((p = list)) {
		list = p->retry_next;
		p->retrying = false;
		p->retry_next = NULL;
		if (p->wait_head) {
			ferry__peer_reached(e, p, 0); /* those that still cannot go wait again */
			n++;
		}
	}
	if (e->retry_peers) { /* still not up: less often */
		e->retry_ns = e->retry_ns * 2 > RETRY_MAX_NS ? RETRY_MAX_NS : e->retry_ns * 2;
		e->retry_at = reactor_now(e) + e->retry_ns;
	} else {
		e->retry_at = 0;
		e->retry_ns = 0; /* all up: the next wait starts soon again */
	}
	return n;
}

/* Off its peer's wait list (OP_F_WAIT_PEER): it ended there (deadline, cancel, destroy). */


void ferry__peer_reached(struct ferry_engine *e, struct ferry_peer *peer, int res)
{
	unsigned n = 0;

	/* The ones waiting now, once each: one that must wait again goes to the tail. */
	for (struct op *w = peer->wait_head; w; w = w->next)
		n++;
	while (n-- && peer->wait_head) {
		struct op *op = peer->wait_head;
		uint32_t gen = op->gen;
		int rc = res;

		reactor_peer_wait_remove(op);
		if (!rc)
			rc = reactor_send(e, op);
		if (rc)
			reactor_put_done(e, op, gen, rc);
	}
}

void ferry__peer_event(struct ferry_engine *e, const struct backend *from, const char *name,
		       enum peer_event ev, int res)
{
	if (ev == PEER_LOST)
		stream_peer_lost(e, name, res);
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (b != from && b->data && b->ops->peer_event) {
			backend_busy(b);
			b->ops->peer_event(e, b, name, ev, res);
		}
	}
}

void ferry__directory_set(struct ferry_engine *e, const struct directory_ops *ops, void *svc)
{
	e->dir = ops;
	e->dir_svc = svc;
}

struct backend *ferry__backend_of(struct ferry_engine *e, const struct backend_ops *ops)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if (e->backends[i].ops == ops)
			return &e->backends[i];
	return NULL;
}

void reactor_unresolve_all(struct ferry_engine *e, struct backend *b)
{
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next)
		if (p->backend == b)
			reactor_unresolve(e, p);
}

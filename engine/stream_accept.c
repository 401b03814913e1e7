/*
 * engine/stream_accept.c - STREAM_ACCEPT: the subscribers to new streams.
 *
 * Owns: the list of STREAM_ACCEPT ops (multishot), telling them of a stream
 * that starts (its key in a buffer, one CQE flagged MORE each), and of the
 * streams that arrived before and nobody reads yet; a stream that cannot be
 * told now (no room in the CQ) stalls and is told again next round.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "stream_int.h"

/* Tell one STREAM_ACCEPT about stream r. False when there is no room now. */
static bool announce_to(struct ferry_engine *e, struct op *a, struct stream *r)
{
	struct ferry_buf *kb;

	if (!op_can_post_more(e, a) || pool_alloc(e->pool, r->key_len + 1u, &kb))
		return false;
	memcpy(kb->data, r->full, r->key_len);
	((char *)kb->data)[r->key_len] = '\0';
	kb->len = r->key_len;
	op_post_more(e, a, 0, r->key_len, kb);
	return true;
}

void stream_notify_acceptors(struct ferry_engine *e, struct stream *r)
{
	struct stream_table *t = e->streams;

	r->announce = false;
	for (struct op *a = t->acceptors; a; a = a->next) {
		if (a->peer && a->peer != r->peer)
			continue;
		if (!announce_to(e, a, r)) {
			/* Try again next round; the ones told already are told again. */
			r->announce = true;
			stall(t, r);
			return;
		}
	}
}

void stream_do_accept(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	struct stream_table *t = e->streams;

	if (sqe->peer && !op->peer) {
		log_error("op %llx: STREAM_ACCEPT with a foreign peer",
			  (unsigned long long)op->user_data);
		op_complete(e, op, -EINVAL, 0, NULL);
		return;
	}
	op->state = OP_STREAMING;
	op->prev = NULL;
	op->next = t->acceptors;
	if (t->acceptors)
		t->acceptors->prev = op;
	t->acceptors = op;
	op_arm_deadline(e, op, sqe->timeout_ns);
	/* Streams that arrived before, and nobody reads yet, are news too. */
	for (uint32_t i = 0; i < t->capacity; i++) {
		struct stream *r = &t->recs[i];

		if (!r->used || r->role != ROLE_CONSUMER || r->getter || r->ended || r->err ||
		    (op->peer && op->peer != r->peer))
			continue;
		if (!announce_to(e, op, r))
			log_warn("engine %s: STREAM_ACCEPT %llx: no room to report stream %s",
				 e->name, (unsigned long long)op->user_data, r->full);
	}
}

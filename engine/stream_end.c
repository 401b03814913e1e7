/*
 * engine/stream_end.c - streams ended from outside the chunk path.
 *
 * Owns: a producer's stream broken (its peer went away, a chunk was lost
 * with it, a STREAM_PUT ended before it took an index): kept failed until a
 * cleanup of its request; STREAM_ABORT (an abort chunk carrying the
 * reason); a peer lost (every stream to or from it fails); a request
 * cleaned up (FERRY_OP_CLEANUP: its streams are dropped).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "stream_int.h"

#define REASON_MAX 1024u

static void fail_queue(struct ferry_engine *e, struct stream *r, int res)
{
	while (r->q_head) {
		struct op *op = r->q_head;

		op_complete(e, op, res, 0, NULL); /* unlinks it */
	}
}

/*
 * A producer's stream failed: its peer went away (or a chunk was lost with
 * it), or a STREAM_PUT ended before it was given an index (its copy into
 * the pool failed, or it timed out or was cancelled while it waited for
 * credit). Every later STREAM_PUT of it fails with err (the first error:
 * a peer's death noticed after a chunk already failed does not change it),
 * and its record is kept (numbering and all) until a cleanup of its request: the key cannot
 * silently start over at chunk 0 on a peer that restarted, and no later
 * chunk takes the index of one that never left (the consumer would get a
 * whole-looking stream with a chunk missing and the rest shifted). A
 * stream whose END was delivered and every chunk with it is complete, not
 * broken.
 */
void stream_producer_fail(struct ferry_engine *e, struct stream *r, int err)
{
	struct stream_table *t = e->streams;

	if (r->cleaned) { /* cleaned up already: over, not broken */
		fail_queue(e, r, err);
		return;
	}
	if (!r->broken || !r->err)
		r->err = err; /* a broken stream keeps the error it broke with */
	if (!r->broken && !(r->ended && !r->q_head && !r->away && !r->lost)) {
		r->broken = true;
		t->nbroken++;
	}
	fail_queue(e, r, r->err);
}

void stream_do_abort(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	char full[FULLKEY_MAX];
	const char *reason = sqe->reason ? sqe->reason : "";
	size_t rl = strnlen(reason, REASON_MAX);
	struct stream *r;
	uint32_t n = 0;
	int rc, fl;

	if ((fl = stream_op_key(e, op, sqe, true, full)) < 0)
		return;
	r = stream_rec_find(e->streams, ROLE_PRODUCER, full, (size_t)fl);
	if (r && r->broken && (r->err == -ECONNRESET || r->err == -EHOSTUNREACH ||
			       r->err == -EPIPE)) {
		/* Its consumer is gone: nobody to tell (a new engine of its name never saw it). */
		op_complete(e, op, r->err, 0, NULL);
		return;
	}
	if (r) {
		r->aborting = true;
		fail_queue(e, r, -ECANCELED); /* an END still queued goes too */
		r->aborting = false;
		if (r->ended) {
			/* The END (or an abort) left already: the consumer has it all. */
			log_info("op %llx: abort of stream %s after its END", (unsigned long long)op->user_data,
				 full);
			op_complete(e, op, -EPIPE, 0, NULL);
			stream_rec_maybe_free(e, r);
			return;
		}
		n = r->next++;
		r->ended = true;
	}
	rc = pool_alloc(e->pool, rl, &op->buf);
	if (rc) {
		op_complete(e, op, rc, 0, NULL);
		return;
	}
	memcpy(op->buf->data, reason, rl);
	op->buf->len = rl;
	op->len = rl;
	op->key_len = (uint16_t)snprintf(op->key, sizeof(op->key), "%.*s_%u", (int)sqe->key_len,
					 sqe->key, n);
	op->flags |= WIRE_F_CHUNK | WIRE_F_ABORT;
	op->state = OP_AWAY;
	rc = reactor_send(e, op);
	if (rc) {
		op->state = OP_FREE;
		op_complete(e, op, rc, 0, NULL);
	} else if (op->state == OP_AWAY) {
		op_arm_deadline(e, op, sqe->timeout_ns);
	}
	if (r)
		stream_rec_maybe_free(e, r);
}

void stream_peer_lost(struct ferry_engine *e, const char *name, int res)
{
	struct stream_table *t = e->streams;

	if (!t)
		return;
	for (struct ferry_peer *p = ferry__peers_first(e); p; p = p->next) {
		if (strcmp(p->name, name) != 0)
			continue;
		for (struct stream *r = p->blocked; r; r = r->next_blocked) {
			r->blocked = false;
			t->nblocked--;
		}
		p->blocked = NULL;
	}
	for (uint32_t i = 0; i < t->capacity; i++) {
		struct stream *r = &t->recs[i];

		if (!r->used || strcmp(r->peer->name, name) != 0)
			continue;
		if (r->role == ROLE_PRODUCER) {
			stream_producer_fail(e, r, res);
		} else {
			r->err = res;
			if (r->getter && !r->ended)
				op_complete(e, r->getter, res, 0, NULL);
		}
		stream_rec_maybe_free(e, r);
	}
}

int stream_cleanup(struct ferry_engine *e, const char *req, size_t rl,
		   const struct ferry_peer *from)
{
	struct stream_table *t = e->streams;
	int n = 0;

	for (uint32_t i = 0; i < t->capacity; i++) {
		struct stream *r = &t->recs[i];

		if (!r->used || (from && r->peer != from) ||
		    !request_owns_key(r->full, r->key_len, req, rl))
			continue;
		n++;
		r->err = -ECANCELED; /* over: credits no longer matter */
		r->cleaned = true;
		if (r->broken) { /* cleaned up: the key may start a new stream */
			r->broken = false;
			t->nbroken--;
		}
		if (r->role == ROLE_PRODUCER) {
			fail_queue(e, r, -ECANCELED);
			if (r->blocked) { /* off its peer's blocked list */
				struct stream **pp = &r->peer->blocked;

				while (*pp != r)
					pp = &(*pp)->next_blocked;
				*pp = r->next_blocked;
				r->blocked = false;
				t->nblocked--;
			}
		} else if (r->getter) {
			op_complete(e, r->getter, -ECANCELED, 0, NULL);
		}
		stream_rec_maybe_free(e, r);
	}
	return n;
}

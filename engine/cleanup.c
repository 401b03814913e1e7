/*
 * engine/cleanup.c - FERRY_OP_CLEANUP: drop what an engine holds for one
 * request.
 *
 * Owns: matching the keys of a request in the key table and freeing them:
 * data that arrived and was never taken (its buffer goes back to its pool,
 * or its RELEASE goes to the peer that lent it) and GETs parked on such
 * keys (completed with -ECANCELED), and the streams of the request
 * (stream.c: stream_cleanup). Runs on the reactor like every op, so
 * it needs no lock. It walks the bucket array (two pointers per key slot)
 * and only the chains hanging from it: a cleanup is per request, not per
 * chunk, so this is not on the hot path.
 *
 * A stored key is "{key}@{from}_{to}" with to = this engine's name; the
 * part before the last '@' is the application's key. It belongs to request
 * R when it is R or starts with R followed by one of "_:/#".
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

#define REQUEST_SEPARATORS "_:/#"

bool request_owns_key(const char *k, size_t n, const char *r, size_t rl)
{
	if (n < rl || memcmp(k, r, rl) != 0)
		return false;
	return n == rl || strchr(REQUEST_SEPARATORS, k[rl]);
}

/* Does stored key k (len n) belong to request r (len rl) from peer `from`? */
static bool key_matches(const struct ferry_engine *e, const char *k, size_t n, const char *r,
			size_t rl, const struct ferry_peer *from)
{
	const char *at = NULL;
	size_t user_len, nl = strlen(e->name);

	for (size_t i = n; i-- > 0;) {
		if (k[i] == '@') {
			at = k + i;
			break;
		}
	}
	if (!at)
		return false;
	user_len = (size_t)(at - k);
	if (!request_owns_key(k, user_len, r, rl))
		return false;
	if (from) {
		/* "@{from}_{to}": the part between '@' and "_{to}" */
		size_t rest = n - user_len - 1, fl = strlen(from->name);

		if (rest != fl + 1 + nl || memcmp(at + 1, from->name, fl) != 0 ||
		    at[1 + fl] != '_' || memcmp(at + 2 + fl, e->name, nl) != 0)
			return false;
	}
	return true;
}

void ferry__do_cleanup(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	struct key_table *t = &e->keys;
	const struct ferry_peer *from = sqe->peer;
	int dropped = 0;

	if (sqe->key_len >= FERRY_KEY_MAX) {
		log_error("cleanup %llx: request id of %u bytes (max %d)",
			  (unsigned long long)sqe->user_data, sqe->key_len, FERRY_KEY_MAX - 1);
		op_complete(e, op, -ENAMETOOLONG, 0, NULL);
		return;
	}
	if (sqe->key_len == 0 || (from && from->engine != e)) {
		log_error("cleanup %llx: %s", (unsigned long long)sqe->user_data,
			  sqe->key_len ? "peer of another engine" : "empty request id");
		op_complete(e, op, -EINVAL, 0, NULL);
		return;
	}
	for (uint64_t b = 0; b <= t->mask; b++) {
		struct key_entry *ke = t->buckets[b], *next;

		for (; ke; ke = next) {
			next = ke->chain; /* ke may go back to the free list below */
			if (!key_matches(e, ke->key, ke->key_len, sqe->key, sqe->key_len, from))
				continue;
			if (ke->present) {
				struct ferry_buf *buf = ke->buf;

				ke->buf = NULL;
				ke->present = false;
				t->present--;
				dropped++;
				keytable_put(t, ke);
				if (buf)
					pool_free(buf);
				continue;
			}
			/* The last unpark gives the entry back (keytable_put). */
			while (ke->waiters) {
				dropped++;
				op_complete(e, ke->waiters, -ECANCELED, 0, NULL);
			}
		}
	}
	dropped += stream_cleanup(e, sqe->key, sqe->key_len, from);
	log_debug("engine %s: cleanup of request %s dropped %d", e->name, sqe->key, dropped);
	op_complete(e, op, dropped, 0, NULL);
}

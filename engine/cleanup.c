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

/* Is "{from}_{to}" (either NULL: any) the tail "@{from}_{to}" of stored key k after at? */
static bool names_match(const char *at, size_t rest, const char *from, const char *to)
{
	size_t fl, tl;

	if (!from && !to)
		return true;
	if (from && to) {
		fl = strlen(from);
		tl = strlen(to);
		return rest == fl + 1 + tl && memcmp(at + 1, from, fl) == 0 && at[1 + fl] == '_' &&
		       memcmp(at + 2 + fl, to, tl) == 0;
	}
	if (from) {
		fl = strlen(from);
		return rest > fl + 1 && memcmp(at + 1, from, fl) == 0 && at[1 + fl] == '_';
	}
	tl = strlen(to);
	return rest > tl + 1 && memcmp(at + 1 + rest - tl, to, tl) == 0 && at[rest - tl] == '_';
}

/* Does stored key k (len n) belong to request r (len rl), stored as "@{from}_{to}"? */
static bool key_matches(const char *k, size_t n, const char *r, size_t rl, const char *from,
			const char *to)
{
	const char *at = NULL;
	size_t user_len;

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
	return names_match(at, n - user_len - 1, from, to);
}

int ferry__cleanup_keys(struct ferry_engine *e, const char *r, size_t rl, const char *from,
			const char *to)
{
	struct key_table *t = &e->keys;
	int dropped = 0;

	t->frozen++; /* entries leave below: the buckets must stay as they are */
	for (uint64_t b = 0; b <= t->mask; b++) {
		struct key_entry *ke = t->buckets[b], *next;

		for (; ke; ke = next) {
			next = ke->chain; /* ke may go back to the free list below */
			if (!key_matches(ke->key, ke->key_len, r, rl, from, to))
				continue;
			if (ke->present) {
				struct ferry_buf *buf = ke->buf;

				ke->buf = NULL;
				ke->present = false;
				STAT_ADD(t->present, (uint32_t)-1);
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
	t->frozen--;
	return dropped;
}

void ferry__do_cleanup(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
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
	dropped = ferry__cleanup_keys(e, sqe->key, sqe->key_len, from ? from->name : NULL,
				      from ? e->name : NULL);
	dropped += stream_cleanup(e, sqe->key, sqe->key_len, from);
	log_debug("engine %s: cleanup of request %s dropped %d", e->name, sqe->key, dropped);
	op_complete(e, op, dropped, 0, NULL);
}

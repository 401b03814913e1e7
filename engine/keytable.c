/*
 * engine/keytable.c - the stage-scoped keys an engine holds.
 *
 * Owns: a chained hash table from "{key}@{from}_{to}" to an entry holding
 * the data that arrived under that key (a pool buffer) and the FIFO of GETs
 * waiting for it, and the composing of those keys (keytable_compose, or
 * from a "@{from}_{to}" suffix made once per path: key_suffix_make). Entries come from an array sized at creation (the data
 * limit max_keys plus one per op that can wait), so inserting never
 * allocates. Only the thread that holds progress touches it.
 *
 * The bucket array is allocated for the largest table (two buckets per
 * entry), but only the first mask + 1 buckets are used: the active part
 * doubles when more than half as many keys as buckets are in use and
 * shrinks to a quarter when fewer than a sixteenth are (never below
 * KEYTABLE_MIN_BUCKETS). A hash of a fresh key lands on a random bucket;
 * with the whole array in use (512 KiB for the default limits) that was a
 * cache miss on every GET and arrival, ~0.3 us of the 64 B tcp round trip
 * on the test machine (docs/benchmarks.md). A resize rehashes what is in
 * use, O(buckets in use), a logarithmic number of times as the table grows.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define KEYTABLE_MIN_BUCKETS 64

int keytable_init(struct key_table *t, uint32_t max_present, uint32_t max_waiting)
{
	uint64_t nb = 16;

	memset(t, 0, sizeof(*t));
	t->capacity = max_present + max_waiting;
	t->max_present = max_present;
	while (nb < (uint64_t)t->capacity * 2)
		nb <<= 1;
	t->buckets = calloc(nb, sizeof(*t->buckets));
	t->entries = calloc(t->capacity, sizeof(*t->entries));
	if (!t->buckets || !t->entries) {
		keytable_fini(t);
		return -ENOMEM;
	}
	t->max_mask = nb - 1;
	t->mask = (nb < KEYTABLE_MIN_BUCKETS ? nb : KEYTABLE_MIN_BUCKETS) - 1;
	for (uint32_t i = t->capacity; i-- > 0;) {
		t->entries[i].chain = t->free;
		t->free = &t->entries[i];
	}
	return 0;
}

void keytable_fini(struct key_table *t)
{
	free(t->buckets);
	free(t->entries);
	memset(t, 0, sizeof(*t));
}

/*
 * FNV-1a, 8 bytes at a time folded with a multiply: keys are short. The
 * last 1-7 bytes of a key of 8 or more are one more word: the key's last 8
 * bytes, shifted so that only those not yet hashed stay (one load, not a
 * loop). The hash lives in this process only (never on the wire or in
 * shared memory), so byte order does not matter.
 */
uint64_t keytable_hash(const char *key, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull, w;
	const char *end = key + len;

	if (len < 8) {
		while (len--)
			h = (h ^ (uint8_t)*key++) * 0x100000001b3ull;
		return h ^ (h >> 32);
	}
	while (len >= 8) {
		memcpy(&w, key, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
		key += 8;
		len -= 8;
	}
	if (len) {
		memcpy(&w, end - 8, 8);
		w >>= 8 * (8 - len); /* little endian: the last len bytes */
		h = (h ^ w) * 0x100000001b3ull;
	}
	return h ^ (h >> 32);
}

/* Use buckets [0, new_mask]: every entry in use goes to its new bucket. */
static void rehash(struct key_table *t, uint64_t new_mask)
{
	struct key_entry *all = NULL, *ke, *next;

	for (uint64_t b = 0; b <= t->mask; b++) {
		for (ke = t->buckets[b]; ke; ke = next) {
			next = ke->chain;
			ke->chain = all;
			all = ke;
		}
		t->buckets[b] = NULL;
	}
	t->mask = new_mask;
	for (ke = all; ke; ke = next) {
		next = ke->chain;
		ke->chain = t->buckets[ke->hash & new_mask];
		t->buckets[ke->hash & new_mask] = ke;
	}
}

struct key_entry *keytable_get(struct key_table *t, const char *key, size_t len, uint64_t h)
{
	struct key_entry *ke = keytable_find(t, key, len, h);

	return ke ? ke : keytable_insert(t, key, len, h);
}

struct key_entry *keytable_insert(struct key_table *t, const char *key, size_t len, uint64_t h)
{
	struct key_entry *ke;

	if (!t->free || len >= FULLKEY_MAX)
		return NULL;
	if (atomic_load_explicit(&t->used, memory_order_relaxed) >= (t->mask + 1) / 2 &&
	    t->mask < t->max_mask && !t->frozen)
		rehash(t, t->mask * 2 + 1);
	ke = t->free;
	t->free = ke->chain;
	ke->hash = h;
	ke->key_len = (uint16_t)len;
	copy_short(ke->key, key, len);
	ke->key[len] = '\0';
	ke->waiters = ke->waiters_tail = NULL;
	ke->buf = NULL;
	ke->len = 0;
	ke->from = NULL;
	ke->present = false;
	ke->chain = t->buckets[h & t->mask];
	t->buckets[h & t->mask] = ke;
	STAT_ADD(t->used, 1);
	return ke;
}

void keytable_put(struct key_table *t, struct key_entry *ke)
{
	struct key_entry **pp;

	if (ke->present || ke->waiters)
		return;
	for (pp = &t->buckets[ke->hash & t->mask]; *pp; pp = &(*pp)->chain) {
		if (*pp == ke) {
			*pp = ke->chain;
			break;
		}
	}
	ke->chain = t->free;
	t->free = ke;
	STAT_ADD(t->used, (uint32_t)-1);
	if (atomic_load_explicit(&t->used, memory_order_relaxed) < (t->mask + 1) / 16 &&
	    t->mask + 1 > KEYTABLE_MIN_BUCKETS && !t->frozen)
		rehash(t, (t->mask + 1) / 4 - 1 < KEYTABLE_MIN_BUCKETS - 1 ? KEYTABLE_MIN_BUCKETS - 1
									  : (t->mask + 1) / 4 - 1);
}

int keytable_compose(char *out, const char *key, size_t key_len, const char *from,
		     const char *to)
{
	/* The NUL may go here at the latest (length < FULLKEY_MAX). */
	char *p, *last = out + FULLKEY_MAX - 1;

	if (key_len + 2 >= FULLKEY_MAX)
		return -ENAMETOOLONG;
	memcpy(out, key, key_len);
	p = out + key_len;
	*p++ = '@';
	/*
	 * Engine and peer names are short: copied a byte at a time, in one
	 * pass, instead of strlen + memcpy of each (this runs for every GET
	 * and every arrival).
	 */
	for (; *from; from++) {
		if (p == last)
			return -ENAMETOOLONG;
		*p++ = *from;
	}
	if (p == last)
		return -ENAMETOOLONG;
	*p++ = '_';
	for (; *to; to++) {
		if (p == last)
			return -ENAMETOOLONG;
		*p++ = *to;
	}
	*p = '\0';
	return (int)(p - out);
}

void key_suffix_make(struct key_suffix *sfx, const char *from, const char *to)
{
	size_t fl = strnlen(from, FERRY_NAME_MAX - 1), tl = strnlen(to, FERRY_NAME_MAX - 1);

	sfx->s[0] = '@';
	memcpy(sfx->s + 1, from, fl);
	sfx->s[1 + fl] = '_';
	memcpy(sfx->s + 2 + fl, to, tl);
	sfx->s[2 + fl + tl] = '\0';
	sfx->len = (uint16_t)(2 + fl + tl);
}

/*
 * tests/test_keytable.c - the key table (engine/keytable.c): lookups while
 * its active bucket range grows and shrinks with the keys in use, no
 * resize while someone walks the buckets (frozen), stored keys
 * "{key}@{from}_{to}" composed up to their length limit and refused past it,
 * the same composed from a suffix made once (key_suffix), and a hash that
 * every byte of a key changes.
 *
 * Every test arms an alarm (FERRY_TEST_TIMEOUT seconds, default 120).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "internal.h"

#define NKEYS 5000

static int setup(void **state)
{
	const char *t = getenv("FERRY_TEST_TIMEOUT");

	(void)state;
	alarm(t ? (unsigned)atoi(t) : 120);
	return 0;
}

static int key_of(char *out, size_t cap, unsigned i)
{
	return snprintf(out, cap, "k%u@a_b", i);
}

static struct key_entry *get(struct key_table *t, unsigned i)
{
	char k[32];
	int n = key_of(k, sizeof(k), i);

	return keytable_get(t, k, (size_t)n, keytable_hash(k, (size_t)n));
}

static struct key_entry *find(struct key_table *t, unsigned i)
{
	char k[32];
	int n = key_of(k, sizeof(k), i);

	return keytable_find(t, k, (size_t)n, keytable_hash(k, (size_t)n));
}

/* Mark an entry in use the way the reactor does (data arrived). */
static void hold(struct key_table *t, struct key_entry *ke)
{
	ke->present = true;
	t->present++;
}

static void drop(struct key_table *t, struct key_entry *ke)
{
	ke->present = false;
	t->present--;
	keytable_put(t, ke);
}

/* Every key in [lo, hi) is found, as its own entry; none outside. */
static void check_range(struct key_table *t, unsigned lo, unsigned hi)
{
	char k[32];

	for (unsigned i = 0; i < NKEYS; i++) {
		struct key_entry *ke = find(t, i);

		if (i >= lo && i < hi) {
			assert_non_null(ke);
			key_of(k, sizeof(k), i);
			assert_string_equal(ke->key, k);
		} else {
			assert_null(ke);
		}
	}
}

static void test_keytable_grows_and_shrinks(void **state)
{
	struct key_table t;
	struct key_entry *e[NKEYS];
	uint64_t start_mask;

	(void)state;
	assert_int_equal(keytable_init(&t, NKEYS, NKEYS), 0);
	start_mask = t.mask;
	assert_true(start_mask < t.max_mask);
	for (unsigned i = 0; i < NKEYS; i++) {
		e[i] = get(&t, i);
		assert_non_null(e[i]);
		hold(&t, e[i]);
		/* At most half as many keys as active buckets (plus the one just added). */
		assert_true(t.used <= (t.mask + 1) / 2 + 1);
		assert_true(t.mask <= t.max_mask);
	}
	assert_true(t.mask > start_mask);
	check_range(&t, 0, NKEYS);
	/* get of a present key finds it, it does not add a second one */
	assert_ptr_equal(get(&t, 17), e[17]);
	assert_int_equal(t.used, NKEYS);

	for (unsigned i = 0; i < NKEYS - 10; i++)
		drop(&t, e[i]);
	assert_int_equal(t.used, 10);
	assert_true(t.mask + 1 <= 16 * 10 || t.mask == start_mask);
	check_range(&t, NKEYS - 10, NKEYS);
	for (unsigned i = NKEYS - 10; i < NKEYS; i++)
		drop(&t, e[i]);
	assert_int_equal(t.used, 0);
	assert_int_equal(t.mask, start_mask);
	check_range(&t, 0, 0);
	keytable_fini(&t);
}

static void test_keytable_frozen_keeps_buckets(void **state)
{
	struct key_table t;
	struct key_entry *e[NKEYS];
	uint64_t mask;

	(void)state;
	assert_int_equal(keytable_init(&t, NKEYS, NKEYS), 0);
	for (unsigned i = 0; i < 2000; i++) {
		e[i] = get(&t, i);
		hold(&t, e[i]);
	}
	mask = t.mask;
	t.frozen++;
	for (unsigned i = 0; i < 1990; i++)
		drop(&t, e[i]);
	for (unsigned i = 2000; i < 3000; i++) {
		e[i] = get(&t, i);
		hold(&t, e[i]);
	}
	assert_int_equal(t.mask, mask); /* neither shrank nor grew */
	t.frozen--;
	for (unsigned i = 1990; i < 2000; i++)
		assert_ptr_equal(find(&t, i), e[i]);
	for (unsigned i = 2000; i < 3000; i++)
		assert_ptr_equal(find(&t, i), e[i]);
	assert_null(find(&t, 5));
	keytable_fini(&t);
}

/* A small table (fewer buckets than the minimum active range) works too. */
static void test_keytable_small(void **state)
{
	struct key_table t;
	struct key_entry *e[8];

	(void)state;
	assert_int_equal(keytable_init(&t, 3, 2), 0);
	assert_true(t.mask <= t.max_mask);
	for (unsigned i = 0; i < 5; i++) {
		e[i] = get(&t, i);
		assert_non_null(e[i]);
		hold(&t, e[i]);
	}
	assert_null(get(&t, 99)); /* full */
	check_range(&t, 0, 5);
	for (unsigned i = 0; i < 5; i++)
		drop(&t, e[i]);
	check_range(&t, 0, 0);
	keytable_fini(&t);
}

/* keytable_compose: the stored form, the longest that fits, one byte more refused. */
static void test_keytable_compose(void **state)
{
	char out[FULLKEY_MAX + 8], key[FULLKEY_MAX], from[FULLKEY_MAX], to[FULLKEY_MAX];
	size_t room = FULLKEY_MAX - 1; /* the longest composed key: its NUL is the last byte */

	(void)state;
	assert_int_equal(keytable_compose(out, "k17", 3, "tx", "rx"), 9);
	assert_string_equal(out, "k17@tx_rx");
	assert_int_equal(keytable_compose(out, "k", 1, "", ""), 3);
	assert_string_equal(out, "k@_");
	/* Split the room between key, from and to in every way; the limit holds for each. */
	for (size_t fl = 0; fl + 2 < room; fl += 37) {
		for (size_t tl = 0; fl + tl + 2 < room; tl += 41) {
			size_t kl = room - 2 - fl - tl;

			memset(key, 'k', kl);
			memset(from, 'f', fl);
			from[fl] = '\0';
			memset(to, 't', tl);
			to[tl] = '\0';
			memset(out, 'x', sizeof(out));
			assert_int_equal(keytable_compose(out, key, kl, from, to), (int)room);
			assert_int_equal(out[room], '\0');
			assert_int_equal(out[kl], '@');
			assert_int_equal(out[kl + 1 + fl], '_');
			assert_int_equal(out[room + 1], 'x');
			/* One byte more, wherever it is, does not fit. */
			key[kl] = 'k';
			assert_int_equal(keytable_compose(out, key, kl + 1, from, to), -ENAMETOOLONG);
			from[fl] = 'f';
			from[fl + 1] = '\0';
			assert_int_equal(keytable_compose(out, key, kl, from, to), -ENAMETOOLONG);
			from[fl] = '\0';
			to[tl] = 't';
			to[tl + 1] = '\0';
			assert_int_equal(keytable_compose(out, key, kl, from, to), -ENAMETOOLONG);
			assert_int_equal(out[room + 1], 'x');
		}
	}
}

/*
 * keytable_compose_sfx / keytable_append_sfx with a key_suffix made of the
 * two names: byte for byte what keytable_compose makes, the same length or
 * the same refusal, for names of every length and keys around the limit.
 */
static void test_keytable_compose_sfx(void **state)
{
	char a[FULLKEY_MAX + 8], b[FULLKEY_MAX + 8], key[FULLKEY_MAX + 2];
	char from[FERRY_NAME_MAX], to[FERRY_NAME_MAX];
	struct key_suffix sfx;
	unsigned checked = 0;

	(void)state;
	key_suffix_make(&sfx, "tx", "rx");
	assert_int_equal(sfx.len, 6);
	assert_string_equal(sfx.s, "@tx_rx");
	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (char)('A' + i % 53); /* no two neighbours alike: a misplaced byte shows */
	for (size_t fl = 0; fl < FERRY_NAME_MAX; fl += 3) {
		for (size_t tl = 0; tl < FERRY_NAME_MAX; tl += 5) {
			size_t edge = FULLKEY_MAX - 2 - fl - tl; /* the longest key that fits */
			size_t kls[] = { 1, 7, 8, 9, edge - 1, edge, edge + 1, edge + 2 };

			memset(from, 'f', fl);
			from[fl] = '\0';
			memset(to, 't', tl);
			to[tl] = '\0';
			key_suffix_make(&sfx, from, to);
			assert_int_equal(sfx.len, fl + tl + 2);
			for (size_t i = 0; i < sizeof(kls) / sizeof(kls[0]); i++) {
				int ra, rb, rc;

				memset(a, 'x', sizeof(a));
				memset(b, 'x', sizeof(b));
				ra = keytable_compose(a, key, kls[i], from, to);
				rb = keytable_compose_sfx(b, key, kls[i], &sfx);
				assert_int_equal(rb, ra);
				if (ra >= 0) {
					assert_memory_equal(a, b, (size_t)ra + 2); /* its NUL, then untouched */
					memset(b, 'x', sizeof(b));
					memcpy(b, key, kls[i]);
					rc = keytable_append_sfx(b, kls[i], &sfx);
					assert_int_equal(rc, ra);
					assert_memory_equal(a, b, (size_t)ra + 2);
				} else {
					assert_int_equal(ra, -ENAMETOOLONG);
					assert_int_equal(keytable_append_sfx(b, kls[i], &sfx), -ENAMETOOLONG);
					assert_int_equal(b[kls[i] < sizeof(b) ? kls[i] : 0], 'x');
				}
				checked++;
			}
		}
	}
	assert_true(checked > 1000);
}

/*
 * copy_short: every length up to past its longest branch, at every
 * alignment of both ends: the n bytes land in order, and not one byte
 * before or after them is written.
 */
static void test_copy_short(void **state)
{
	unsigned char src[256], dst[256 + 32];

	(void)state;
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (unsigned char)(i * 7u + 1u);
	for (size_t n = 0; n <= 160; n++) {
		for (size_t so = 0; so < 8; so++) {
			for (size_t d_o = 0; d_o < 8; d_o++) {
				memset(dst, 0xee, sizeof(dst));
				copy_short(dst + 16 + d_o, src + so, n);
				for (size_t i = 0; i < 16 + d_o; i++)
					assert_int_equal(dst[i], 0xee);
				assert_memory_equal(dst + 16 + d_o, src + so, n);
				for (size_t i = 16 + d_o + n; i < sizeof(dst); i++)
					assert_int_equal(dst[i], 0xee);
			}
		}
	}
}

/*
 * key_has_nul: for every length to 160, a NUL at each place inside is
 * found, one just past the end is not, and bytes with the high bit set
 * (0x80, 0xff, 0x01 after them) are not taken for one.
 */
static void test_key_has_nul(void **state)
{
	char k[192];

	(void)state;
	for (size_t n = 0; n <= 160; n++) {
		for (int fill = 0; fill < 3; fill++) {
			for (size_t i = 0; i < sizeof(k); i++)
				k[i] = (char)(fill == 0 ? 'a' + i % 26 : fill == 1 ? 0x80 | (i & 0x7f) : (i & 1) ? 0x01 : 0xff);
			k[n] = '\0';
			assert_false(key_has_nul(k, n));
			for (size_t p = 0; p < n; p++) {
				char was = k[p];

				k[p] = '\0';
				assert_true(key_has_nul(k, n));
				k[p] = was;
			}
		}
	}
}

/*
 * keys_equal: for every length to 160 and both alignments of either side,
 * equal bytes are equal, and one byte changed anywhere (a low bit or the
 * high bit) makes them differ; bytes past n do not count.
 */
static void test_keys_equal(void **state)
{
	char a[200], b[200];

	(void)state;
	for (size_t n = 0; n <= 160; n++) {
		for (size_t off = 0; off < 3; off++) {
			char *pa = a + off, *pb = b + 2 - off;

			for (size_t i = 0; i < n; i++)
				pa[i] = pb[i] = (char)('a' + (i * 5 + n) % 26);
			pa[n] = 'x';
			pb[n] = 'y';
			assert_true(keys_equal(pa, pb, n));
			for (size_t p = 0; p < n; p++) {
				char was = pb[p];

				pb[p] = (char)(was ^ 1);
				assert_false(keys_equal(pa, pb, n));
				pb[p] = (char)(was ^ 0x80);
				assert_false(keys_equal(pa, pb, n));
				pb[p] = was;
			}
		}
	}
}

/* Every byte of a key, at any length, changes its hash (the tail is one shifted load). */
static void test_keytable_hash_every_byte(void **state)
{
	char k[FULLKEY_MAX];

	(void)state;
	for (size_t len = 1; len < 80; len++) {
		for (size_t i = 0; i < len; i++)
			k[i] = (char)('a' + (i * 7 + len) % 26);
		uint64_t h = keytable_hash(k, len);

		assert_true(keytable_hash(k, len) == h);
		for (size_t i = 0; i < len; i++) {
			k[i] ^= 0x10;
			assert_true(keytable_hash(k, len) != h);
			k[i] ^= 0x10;
		}
		/* The bytes just past the key are not read into it. */
		k[len] = 'Z';
		assert_true(keytable_hash(k, len) == h);
	}
}

/* keytable_insert after a find that missed: found from then on, in the count. */
static void test_keytable_insert(void **state)
{
	struct key_table t;
	struct key_entry *ke;
	const char *k = "k1@a_b";
	uint64_t h = keytable_hash(k, strlen(k));

	(void)state;
	assert_int_equal(keytable_init(&t, 4, 4), 0);
	assert_null(keytable_find(&t, k, strlen(k), h));
	ke = keytable_insert(&t, k, strlen(k), h);
	assert_non_null(ke);
	assert_int_equal(t.used, 1);
	assert_ptr_equal(keytable_find(&t, k, strlen(k), h), ke);
	assert_ptr_equal(keytable_get(&t, k, strlen(k), h), ke);
	assert_int_equal(t.used, 1);
	assert_string_equal(ke->key, k);
	keytable_put(&t, ke);
	assert_int_equal(t.used, 0);
	assert_null(keytable_find(&t, k, strlen(k), h));
	keytable_fini(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_keytable_grows_and_shrinks, setup),
		cmocka_unit_test_setup(test_keytable_frozen_keeps_buckets, setup),
		cmocka_unit_test_setup(test_keytable_small, setup),
		cmocka_unit_test_setup(test_keytable_compose, setup),
		cmocka_unit_test_setup(test_keytable_compose_sfx, setup),
		cmocka_unit_test(test_copy_short),
		cmocka_unit_test(test_key_has_nul),
		cmocka_unit_test(test_keys_equal),
		cmocka_unit_test_setup(test_keytable_hash_every_byte, setup),
		cmocka_unit_test_setup(test_keytable_insert, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

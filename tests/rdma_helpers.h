/*
 * tests/rdma_helpers.h - what the guest's rdma test programs (test_rdma,
 * test_rdma_cuda) share: a peer connected to another engine's rdma://
 * address, the rdma part of an engine's health, and a byte pattern that
 * tells every byte's place (so a piece written at the wrong offset shows).
 */
#ifndef FERRY_TEST_RDMA_HELPERS_H
#define FERRY_TEST_RDMA_HELPERS_H

#include "helpers.h"

/*
 * The guest's two addresses (RDMA_IP0 on rxe0, RDMA_IP1 on rxe1, set only in
 * ferry's RDMA test guest) into ip0 / ip1 (len bytes each): true; false,
 * and a SKIP line for prog, anywhere else.
 */
static inline bool rdma_guest_ips(const char *prog, char *ip0, char *ip1, size_t len)
{
	const char *a = getenv("RDMA_IP0"), *z = getenv("RDMA_IP1");

	if (!a || !z) {
		printf("%s: SKIP (not in the RDMA test guest: RDMA_IP0/RDMA_IP1 unset, "
		       "tests/rdma-vm)\n", prog);
		return false;
	}
	snprintf(ip0, len, "%s", a);
	snprintf(ip1, len, "%s", z);
	return true;
}

/* The rdma:// address among e's addresses. */
static inline void rdma_addr_of(struct ferry_engine *e, char *out, size_t len)
{
	char all[512];
	const char *s;

	assert_true(ferry_engine_addresses(e, all, sizeof(all)) > 0);
	s = strstr(all, "rdma://");
	assert_non_null(s);
	snprintf(out, len, "%.*s", (int)strcspn(s, " "), s);
}

/* e's peer name, connected to engine at's rdma address. */
static inline struct ferry_peer *peer_at(struct ferry_engine *e, const char *name,
					 struct ferry_engine *at)
{
	char a[128];
	struct ferry_peer *p = t_peer(e, name);

	rdma_addr_of(at, a, sizeof(a));
	assert_int_equal(ferry_peer_connect_uri(p, a), 0);
	return p;
}

/* A number of the rdma part of e's health. */
static inline long long rh(struct ferry_engine *e, const char *name)
{
	return t_health_num(e, "\"rdma\":{", name);
}

static inline void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 11));
}

static inline bool pattern_ok(const uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i * 131u + seed * 7u + (i >> 11)))
			return false;
	return true;
}

#endif

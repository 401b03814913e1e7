/*
 * tests/test_conformance_rdma.c - the transport conformance suite
 * (tests/conformance.h) over rdma, on real verbs: it runs in ferry's RDMA
 * test guest (tests/rdma-vm/, two Soft-RoCE devices on a veth pair), where
 * $RDMA_IP0 and $RDMA_IP1 name their addresses; anywhere else (no rdma
 * transport in this build, no device, no such variables) it skips (77).
 * The far end is a child process listening on RDMA_IP0 (rxe0), the near
 * end listens on RDMA_IP1 (rxe1), so every PUT crosses the wire; both prove
 * the cluster secret; a far end started again listens at its old address;
 * a death is a SIGKILL.
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include "conformance.h"

static char cf_rdma_near[64], cf_rdma_far[64];

static void rdma_params(struct ferry_engine_params *p, const char *prev)
{
	p->rdma_listen = prev ? prev : strcmp(p->name, "near") == 0 ? cf_rdma_near : cf_rdma_far;
	p->secret = CF_SECRET;
}

/* The engine's rdma:// address, out of every address it has. */
static int rdma_address(struct ferry_engine *e, char *buf, size_t len)
{
	char all[512];
	const char *s, *end;
	int n = ferry_engine_addresses(e, all, sizeof(all));

	if (n < 0)
		return n;
	s = strstr(all, "rdma://");
	if (!s)
		return -ENOTCONN;
	end = strchr(s, ' ');
	return snprintf(buf, len, "%.*s", (int)(end ? end - s : (ptrdiff_t)strlen(s)), s);
}

static int rdma_link(struct ferry_peer *p, const char *addr)
{
	return addr[0] ? ferry_peer_connect_uri(p, addr) : 0;
}

/* A port of RDMA_IP0 that nobody listens on (rdma_cm rejects the call). */
static int rdma_ghost(struct ferry_peer *p)
{
	char addr[96];

	snprintf(addr, sizeof(addr), "rdma://%s:9", getenv("RDMA_IP0"));
	return ferry_peer_connect_uri(p, addr);
}

static const struct cf_transport cf_rdma = {
	.name = "rdma",
	.far_is_process = true,
	.progress = FERRY_PROGRESS_THREAD,
	.params = rdma_params,
	.address = rdma_address,
	.link = rdma_link,
	.ghost = rdma_ghost,
	/* An iovec of at most 256 bytes is copied into its SEND (design.md, rdma). */
	.inline_max = 256,
	/* The receiver READs the bytes into its own pool, then the sender's block is freed. */
	.lends_blocks = false,
	/* A receiver whose pool is full answers -ENOBUFS, eager or announced. */
	.rx_full = { CF_RX_REFUSES, CF_RX_REFUSES, CF_RX_REFUSES },
};

int main(void)
{
	const struct cf_transport *ts[] = { &cf_rdma };
	const char *ip0 = getenv("RDMA_IP0"), *ip1 = getenv("RDMA_IP1");

	if (!(ferry_features() & FERRY_FEATURE_RDMA) || !ip0 || !ip1) {
		printf("test_conformance_rdma: SKIP (%s)\n",
		       !(ferry_features() & FERRY_FEATURE_RDMA)
			       ? "this build has no rdma transport"
			       : "not in the RDMA test guest: RDMA_IP0/RDMA_IP1 unset (tests/rdma-vm)");
		return 77;
	}
	snprintf(cf_rdma_far, sizeof(cf_rdma_far), "rdma://%s:0", ip0);
	snprintf(cf_rdma_near, sizeof(cf_rdma_near), "rdma://%s:0", ip1);
	return cf_main(ts, 1);
}

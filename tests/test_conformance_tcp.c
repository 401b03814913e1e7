/*
 * tests/test_conformance_tcp.c - the transport conformance suite
 * (tests/conformance.h) over tcp on loopback: the far end is a child
 * process; both engines listen on a port the kernel picks and prove the
 * cluster secret, each peer handle is given the other's address (a far end
 * started again listens at its old one); a death is a SIGKILL.
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include "conformance.h"

static void tcp_params(struct ferry_engine_params *p, const char *prev)
{
	p->listen = prev ? prev : "tcp://127.0.0.1:0";
	p->secret = CF_SECRET;
}

static int tcp_link(struct ferry_peer *p, const char *addr)
{
	return addr[0] ? ferry_peer_set_address(p, addr) : 0;
}

/* A loopback port nobody listens on (bound, then closed). */
static int tcp_ghost(struct ferry_peer *p)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	char addr[64];
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(fd, (struct sockaddr *)&sa, &len)) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	close(fd);
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
	return ferry_peer_set_address(p, addr);
}

static const struct cf_transport cf_tcp = {
	.name = "tcp",
	.far_is_process = true,
	.progress = FERRY_PROGRESS_THREAD,
	.params = tcp_params,
	.link = tcp_link,
	.ghost = tcp_ghost,
	/* An iovec of at most 256 bytes is copied into its message (design.md §12). */
	.inline_max = 256,
	/* The bytes cross into the receiver's pool: the sender's block is free once sent. */
	.lends_blocks = false,
	/* Eager PUTs (up to 64 KiB) are refused when the receiver's pool is full; larger
	 * ones (rendezvous) wait there for room. */
	.rx_full = { CF_RX_REFUSES, CF_RX_REFUSES, CF_RX_WAITS },
};

int main(void)
{
	const struct cf_transport *ts[] = { &cf_tcp };

	return cf_main(ts, 1);
}

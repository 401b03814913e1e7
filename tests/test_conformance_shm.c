/*
 * tests/test_conformance_shm.c - the transport conformance suite
 * (tests/conformance.h) over shared memory: the far end is a child process
 * of the same host, found by name in the case's runtime directory; its
 * death is a SIGKILL.
 */
#include "conformance.h"

static const struct cf_transport cf_shm = {
	.name = "shm",
	.far_is_process = true,
	.progress = FERRY_PROGRESS_THREAD,
	/* PUTs of at most 256 bytes travel inside the descriptor (design.md §11). */
	.inline_max = 256,
	/* The receiver maps the sender's pool: a zero-copy GET holds the sender's block. */
	.lends_blocks = true,
	/* Only inline data is copied into the receiver's pool (-ENOBUFS when full). */
	.rx_full = { CF_RX_REFUSES, CF_RX_TAKES, CF_RX_TAKES },
	/* Credits ride on the chunks' block RELEASEs (design.md §16): known difference. */
	.credit_after_cleanup = true,
};

int main(void)
{
	const struct cf_transport *ts[] = { &cf_shm };

	return cf_main(ts, 1);
}

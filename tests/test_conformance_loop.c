/*
 * tests/test_conformance_loop.c - the transport conformance suite
 * (tests/conformance.h) over the in-process transport: both engines in this
 * process, in THREAD mode and again in MANUAL mode (every wait drives both
 * engines). The far end's death is its engine's destroy.
 */
#include "conformance.h"

static const struct cf_transport cf_loop = {
	.name = "loop",
	.far_is_process = false,
	.progress = FERRY_PROGRESS_THREAD,
	/*
	 * A pool buffer is handed over as is; an iovec of at most 256 B travels
	 * in its message (into a waiting GET's iovec, else a receiver's block).
	 */
	.inline_max = 256,
	.lends_blocks = true,
	.rx_full = { CF_RX_TAKES, CF_RX_TAKES, CF_RX_TAKES },
};

static const struct cf_transport cf_loop_manual = {
	.name = "loop",
	.far_is_process = false,
	.progress = FERRY_PROGRESS_MANUAL,
	.inline_max = 256,
	.lends_blocks = true,
	.rx_full = { CF_RX_TAKES, CF_RX_TAKES, CF_RX_TAKES },
};

int main(void)
{
	const struct cf_transport *ts[] = { &cf_loop, &cf_loop_manual };

	return cf_main(ts, 2);
}

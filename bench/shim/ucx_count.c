/*
 * bench/shim/ucx_count.c - an LD_PRELOAD library for ucx_perftest under
 * callgrind (bench/count.sh builds it; it is no part of libferry): it
 * switches callgrind's collection on for COUNT_N iterations of the timed
 * loop, from the COUNT_FROM-th call of ucp_tag_send_nbx (tag_lat) or
 * ucp_tag_send_sync_nbx (tag_sync_lat), and dumps them as
 * "ucx_window"; then it makes COUNT_IDLE calls of ucp_worker_progress that
 * can find nothing (just before a send, when the peer waits for us: in
 * tag_lat nothing is on its way to this side then) and dumps them as
 * "ucx_idle". On stderr: the progress calls inside the window and how many
 * of them returned 0 (idle), so that the busy-poll spin can be taken out:
 * per iteration = (window - idle_calls * idle_cost) / COUNT_N. Inside the
 * window an idle call sleeps COUNT_IDLE_SLEEP_US (100; uncounted), so that
 * there are few of them: what the caller's loop costs around each (not in
 * idle_cost) then weighs next to nothing.
 * Run valgrind with --collect-atstart=no.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <valgrind/callgrind.h>

typedef void *(*send_fn)(void *ep, const void *buf, size_t count, uint64_t tag, const void *param);
typedef unsigned (*progress_fn)(void *worker);

static send_fn real_send, real_send_sync;
static progress_fn real_progress;
static unsigned long sends, from = 300, n = 2000, idle_n = 2000;
static unsigned long calls, idle_calls, idle_measured, sleep_ns = 100000;
static int in_window, configured;
static void *last_worker;

static unsigned long env_or(const char *name, unsigned long dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoul(v, NULL, 10) : dflt;
}

static void setup(void)
{
	if (configured)
		return;
	configured = 1;
	real_send = (send_fn)dlsym(RTLD_NEXT, "ucp_tag_send_nbx");
	real_send_sync = (send_fn)dlsym(RTLD_NEXT, "ucp_tag_send_sync_nbx");
	real_progress = (progress_fn)dlsym(RTLD_NEXT, "ucp_worker_progress");
	from = env_or("COUNT_FROM", from);
	n = env_or("COUNT_N", n);
	idle_n = env_or("COUNT_IDLE", idle_n);
	sleep_ns = env_or("COUNT_IDLE_SLEEP_US", sleep_ns / 1000) * 1000;
}

/* The same path for every progress call, counted or not. */
__attribute__((noinline)) static unsigned progress_once(void *worker)
{
	unsigned r = real_progress(worker);

	calls++;
	idle_calls += r == 0;
	return r;
}

unsigned ucp_worker_progress(void *worker)
{
	unsigned r;

	setup();
	last_worker = worker;
	r = progress_once(worker);
	if (in_window && r == 0 && sleep_ns) {
		/* few idle spins, so that what they cost around the call is small */
		struct timespec ts = { 0, (long)sleep_ns };

		CALLGRIND_TOGGLE_COLLECT;
		nanosleep(&ts, NULL);
		CALLGRIND_TOGGLE_COLLECT;
	}
	return r;
}

/* Each send of the timed loop: the window opens at the COUNT_FROM-th and closes COUNT_N later. */
static void count_send(void)
{
	setup();
	sends++;
	if (sends == from) {
		calls = idle_calls = 0;
		CALLGRIND_ZERO_STATS;
		CALLGRIND_TOGGLE_COLLECT;
		in_window = 1;
	} else if (in_window && sends == from + n) {
		unsigned long wcalls = calls, widle = idle_calls;

		CALLGRIND_TOGGLE_COLLECT;
		CALLGRIND_DUMP_STATS_AT("ucx_window");
		in_window = 0;
		if (last_worker) {
			calls = idle_calls = 0;
			CALLGRIND_TOGGLE_COLLECT;
			for (unsigned long i = 0; i < idle_n; i++)
				progress_once(last_worker);
			CALLGRIND_TOGGLE_COLLECT;
			CALLGRIND_DUMP_STATS_AT("ucx_idle");
			idle_measured = idle_calls;
		}
		fprintf(stderr,
			"ucx_count: window ops=%lu progress_calls=%lu idle_calls=%lu; "
			"idle ops=%lu of which returned 0: %lu\n",
			n, wcalls, widle, idle_n, idle_measured);
	}
}

void *ucp_tag_send_nbx(void *ep, const void *buf, size_t count, uint64_t tag, const void *param)
{
	count_send();
	return real_send(ep, buf, count, tag, param);
}

/* tag_sync_lat's send: it completes once the receiver matched it (an acknowledgement comes back). */
void *ucp_tag_send_sync_nbx(void *ep, const void *buf, size_t count, uint64_t tag,
			    const void *param)
{
	count_send();
	return real_send_sync(ep, buf, count, tag, param);
}

/*
 * engine/log.c - the log sink and its threshold (see log.h).
 *
 * A line is one line: lines name what peers sent (names, namespaces, keys
 * of refused messages), so a control character in one (a newline, an
 * escape) is written as '?' rather than let a peer forge log lines.
 */
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"
#include "log.h"

static const char *const level_names[] = { "error", "warn", "info", "debug" };

/* -1: not read from the environment yet. */
static _Atomic int log_threshold = -1;
/*
 * The sink and its arg change together: ferry_log_set makes log_seq odd,
 * stores both, makes it even again; a line reads both between two equal
 * even values of log_seq, so a callback never gets another's arg.
 */
static _Atomic unsigned log_seq;
static _Atomic(ferry_log_cb *) log_sink;
static void *_Atomic log_sink_arg;

static int threshold_from_env(void)
{
	const char *v = getenv("FERRY_LOG");
	int t = FERRY__LOG_WARN;

	if (v) {
		for (int i = 0; i < 4; i++)
			if (strcmp(v, level_names[i]) == 0)
				t = i;
		if (strcmp(v, "none") == 0)
			t = -2;
	}
	return t;
}

void ferry_log_set(int level, ferry_log_cb cb, void *arg)
{
	unsigned seq = atomic_load(&log_seq);

	if (level > FERRY_LOG_DEBUG)
		level = FERRY_LOG_DEBUG;
	/* One setter at a time: from an even value to the odd one after it. */
	while ((seq & 1) || !atomic_compare_exchange_weak(&log_seq, &seq, seq + 1)) {
		if (seq & 1) {
			sched_yield();
			seq = atomic_load(&log_seq);
		}
	}
	atomic_store(&log_sink_arg, arg);
	atomic_store(&log_sink, cb);
	atomic_store(&log_seq, seq + 2);
	atomic_store(&log_threshold, level < 0 ? -2 : level);
}

/* The sink and its arg, as one ferry_log_set stored them. */
static ferry_log_cb *log_sink_get(void **arg)
{
	for (;;) {
		unsigned seq = atomic_load(&log_seq);
		ferry_log_cb *cb = atomic_load(&log_sink);

		*arg = atomic_load(&log_sink_arg);
		if (!(seq & 1) && atomic_load(&log_seq) == seq)
			return cb;
		sched_yield(); /* a setter is between its two stores */
	}
}

static void log_v(int level, const char *fmt, va_list ap)
{
	int t = atomic_load_explicit(&log_threshold, memory_order_relaxed);
	char line[512];
	ferry_log_cb *cb;
	void *arg;

	if (t == -1) {
		int env = threshold_from_env(), unread = -1;

		/* Unless a ferry_log_set came meanwhile: its level stands. */
		t = atomic_compare_exchange_strong(&log_threshold, &unread, env) ? env : unread;
	}
	if (level < 0 || level > 3 || level > t)
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	for (char *p = line; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	cb = log_sink_get(&arg);
	if (cb)
		cb(level, line, arg);
	else
		fprintf(stderr, "ferry %s: %s\n", level_names[level], line);
}

void ferry__log(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_v(level, fmt, ap);
	va_end(ap);
}

void ferry_log(int level, const char *fmt, ...)
{
	va_list ap;

	if (!fmt)
		return;
	va_start(ap, fmt);
	log_v(level, fmt, ap);
	va_end(ap);
}

int ferry__log_allow(struct ferry__log_limit *l, unsigned long long *held)
{
	struct timespec ts;
	unsigned long long now, last;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
	last = atomic_load_explicit(&l->last_ns, memory_order_relaxed);
	if ((last && now - last < 1000000000ull) ||
	    !atomic_compare_exchange_strong(&l->last_ns, &last, now)) {
		atomic_fetch_add_explicit(&l->held, 1, memory_order_relaxed);
		return 0;
	}
	*held = atomic_exchange(&l->held, 0);
	return 1;
}

/*
 * bench/bench_util.h - what the ferry benchmarks that write JSON share, beside
 * bench_base.h (dying on an error, CHECK, keys, pipes), which it includes:
 * progress lines, a watchdog, median/min/max of repetitions, percentiles, and
 * the JSON writer (one document, printed once at the end).
 *
 * Header-only on purpose: every benchmark source is its own program. A benchmark
 * sets `who` (its name, shown on stderr) before it prints anything.
 */
#ifndef FERRY_BENCH_UTIL_H
#define FERRY_BENCH_UTIL_H

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench_base.h"
#include "ferry.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The 1-minute load average: this machine is shared, so say how busy it was. */
static double loadavg1(void)
{
	FILE *f = fopen("/proc/loadavg", "r");
	double v = -1;

	if (f) {
		if (fscanf(f, "%lf", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: ", who);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static inline void watchdog_fired(int sig)
{
	static const char msg[] = ": did not finish in time (watchdog): killed\n";

	(void)sig;
	if (write(2, who, strlen(who)) < 0 || write(2, msg, sizeof(msg) - 1) < 0)
		_exit(124);
	_exit(124);
}

/*
 * A benchmark that hangs is a failure with a name, not a stuck job: exit
 * 124 with a line on stderr after `seconds` (children forked with
 * PR_SET_PDEATHSIG follow). Call once, early.
 */
static inline void bench_watchdog(unsigned seconds)
{
	signal(SIGALRM, watchdog_fired);
	alarm(seconds);
}

static inline void clobber(void *p)
{
	__asm__ __volatile__("" : : "r"(p) : "memory");
}


/* ------------------------------------------------------------------ */
/* Statistics and JSON                                                 */
/* ------------------------------------------------------------------ */

struct stat3 {
	double median, min, max;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static struct stat3 stat_of(const double *v, int n)
{
	double *s = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
	struct stat3 r = { 0, 0, 0 };

	if (n <= 0) {
		free(s);
		return r;
	}
	memcpy(s, v, sizeof(double) * (size_t)n);
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	r.min = s[0];
	r.max = s[n - 1];
	r.median = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	free(s);
	return r;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Percentile (0..100) of n samples, sorting them in place. */
static double pct(uint64_t *v, size_t n, double p)
{
	size_t i;

	qsort(v, n, sizeof(*v), cmp_u64);
	i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
	return (double)v[i < n ? i : n - 1];
}

static struct {
	char *p;
	size_t len, cap;
	bool need_comma;
} js;

static void jraw(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void jraw(const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(js.p + js.len, js.cap - js.len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < js.cap - js.len)
			break;
		js.cap = js.cap ? js.cap * 2 : 8192;
		js.p = realloc(js.p, js.cap);
		if (!js.p)
			die("realloc", -ENOMEM);
	}
	js.len += (size_t)n;
}

static void jkey(const char *k)
{
	jraw("%s\"%s\":", js.need_comma ? "," : "", k);
	js.need_comma = false;
}

static void jopen(const char *k)
{
	if (k)
		jkey(k);
	else if (js.need_comma)
		jraw(",");
	jraw("{");
	js.need_comma = false;
}

static void jclose(void)
{
	jraw("}");
	js.need_comma = true;
}

static void jnum(const char *k, double v)
{
	jkey(k);
	if (v == (double)(int64_t)v && v < 1e15 && v > -1e15)
		jraw("%lld", (long long)v);
	else
		jraw("%.6g", v);
	js.need_comma = true;
}

/* A number; null for one that JSON cannot hold (a ratio of a row not run: NaN, inf). */
static void jfix(const char *k, double v, int decimals)
{
	jkey(k);
	if (isfinite(v))
		jraw("%.*f", decimals, v);
	else
		jraw("null");
	js.need_comma = true;
}

static void jstr(const char *k, const char *v)
{
	jkey(k);
	jraw("\"%s\"", v);
	js.need_comma = true;
}

static void jbool(const char *k, bool v)
{
	jkey(k);
	jraw("%s", v ? "true" : "false");
	js.need_comma = true;
}

static void jstat(const char *k, struct stat3 s, int decimals)
{
	jopen(k);
	jfix("median", s.median, decimals);
	jfix("min", s.min, decimals);
	jfix("max", s.max, decimals);
	jclose();
}

/* Make text safe inside a JSON string: quotes, backslashes, controls -> ' '. */
static void json_safe(char *s)
{
	for (; *s; s++)
		if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
			*s = ' ';
}

/* The CPU's model name from /proc/cpuinfo ("unknown" if there is none). */
static void read_cpu_model(char *out, size_t len)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];

	snprintf(out, len, "unknown");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *c = strchr(line, ':');

		if (strncmp(line, "model name", 10) == 0 && c) {
			c += 2;
			c[strcspn(c, "\n")] = '\0';
			json_safe(c);
			snprintf(out, len, "%s", c);
			break;
		}
	}
	fclose(f);
}

/*
 * Open the document and write what every benchmark records first: its name,
 * ferry's version, the date, and the machine (kernel, CPUs, CPU model, the
 * load average at the start and now).
 */
static void jheader(const char *bench, time_t started, double load_start, double ncpu,
		    const char *cpu_model)
{
	char ver[32], date[64];
	struct utsname un;

	uname(&un);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&started));
	snprintf(ver, sizeof(ver), "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR,
		 FERRY_VERSION_PATCH);
	jopen(NULL);
	jstr("bench", bench);
	jstr("ferry_version", ver);
	jstr("date", date);
	jopen("machine");
	jstr("kernel", un.release);
	jnum("cpus", ncpu);
	jstr("cpu", cpu_model);
	jfix("loadavg1_start", load_start, 2);
	jfix("loadavg1_end", loadavg1(), 2);
	jclose();
}

#endif

/*
 * channel/chan_common.c - the pieces both ends of a broadcast channel use:
 * the clock, this host's id, names, the handle's parser, taking an SQE,
 * waiting for one CQE. Built on ferry.h only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chan_int.h"

int64_t chan_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

int64_t chan_deadline(int64_t timeout_ns)
{
	return timeout_ns < 0 ? -1 : chan_now() + timeout_ns;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *s = p;

	while (n--)
		h = (h ^ *s++) * 0x100000001b3ull;
	return h;
}

/*
 * Engines of one host find each other by name through the runtime
 * directory (shm): the id hashes the boot, the network namespace, the user
 * and the runtime directory's name (FERRY_RUNTIME_DIR, XDG_RUNTIME_DIR).
 */
uint64_t chan_host_id(void)
{
	uint64_t h = 0xcbf29ce484222325ull;
	char boot[64] = "";
	const char *env;
	struct stat st;
	uid_t uid = geteuid();
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = 0;
		fclose(f);
	}
	h = fnv(h, boot, strlen(boot));
	if (stat("/proc/self/ns/net", &st) == 0)
		h = fnv(h, &st.st_ino, sizeof(st.st_ino));
	h = fnv(h, &uid, sizeof(uid));
	env = getenv("FERRY_RUNTIME_DIR");
	if (env)
		h = fnv(h, env, strlen(env));
	h = fnv(h, "|", 1);
	env = getenv("XDG_RUNTIME_DIR");
	if (env)
		h = fnv(h, env, strlen(env));
	return h;
}

int chan_name_ok(const char *name)
{
	size_t i, n = name ? strlen(name) : 0;

	if (n == 0 || n >= FERRY_CHAN_NAME_MAX)
		return 0;
	for (i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

int chan_claim(struct ferry_engine *e, const char *who)
{
	int rc = ferry_engine_claim_poller(e);

	if (rc)
		ferry_log(FERRY_LOG_ERROR, "%s: engine %s is FERRY_ENGINE_SINGLE_POLLER and another "
			  "thread polls it: -EPERM", who, ferry_engine_name(e));
	return rc;
}

struct ferry_sqe *chan_sqe(struct ferry_engine *e, struct ferry_sq **sq)
{
	struct ferry_sqe *sqe;
	int i;

	if (!*sq && ferry_sq_get(e, sq))
		return NULL;
	for (i = 0; i < 100000; i++) {
		sqe = ferry_sq_get_sqe(*sq);
		if (sqe)
			return sqe;
		ferry_sq_submit(*sq);
		ferry_progress(e);
		if (i > 100)
			usleep(10);
	}
	ferry_log(FERRY_LOG_ERROR, "channel: the submission queue stays full");
	return NULL;
}

int chan_wait1(struct ferry_cq *cq, struct ferry_cqe *c, int64_t deadline)
{
	for (;;) {
		int64_t left = deadline < 0 ? -1 : deadline - chan_now();
		int n;

		if (deadline >= 0 && left < 0)
			left = 0;
		n = left == 0 ? ferry_cq_poll(cq, c, 1) : ferry_cq_wait(cq, c, 1, left);
		if (n == 1)
			return 1;
		if (n == -ETIMEDOUT || (n == 0 && left == 0))
			return 0;
		if (n < 0 && n != -EINTR)
			return n;
	}
}

/* "ferrychan1 writer=W chan=C readers=N host=H addrs=URI URI ..." */
int chan_handle_parse(const char *text, struct chan_handle *h)
{
	const char *p, *a;
	unsigned long long host;
	unsigned n;
	int used = 0;

	memset(h, 0, sizeof(*h));
	if (!text || strncmp(text, CHAN_HANDLE_TAG " ", sizeof(CHAN_HANDLE_TAG)) != 0)
		goto bad;
	p = text + sizeof(CHAN_HANDLE_TAG);
	if (sscanf(p, "writer=%63s chan=%31s readers=%u host=%llx%n", h->writer, h->chan, &n, &host,
		   &used) != 4 || used <= 0)
		goto bad;
	p += used;
	a = strstr(p, " addrs=");
	if (a) {
		a += 7;
		if (strlen(a) >= sizeof(h->addrs))
			goto bad;
		strcpy(h->addrs, a);
	}
	if (!chan_name_ok(h->chan) || n == 0 || n > FERRY_CHAN_READERS_MAX)
		goto bad;
	h->readers = n;
	h->host = host;
	return 0;
bad:
	ferry_log(FERRY_LOG_ERROR, "channel: not a channel handle");
	return -EINVAL;
}

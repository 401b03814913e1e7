/*
 * engine/fence.c - the process's membarrier registration (made by its first
 * FERRY_ENGINE_BUSY_POLL engine) and the sleeping side's heavy fence
 * (engine/fence.h).
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fence.h"
#include "log.h"

static bool registered;      /* this process registered for GLOBAL_EXPEDITED */
static pid_t registered_in;  /* by which process (a fork's child registers again) */
static pthread_mutex_t choice_lock = PTHREAD_MUTEX_INITIALIZER;

static int membarrier(int cmd)
{
	return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

/* FERRY_MEMBARRIER: "0" never, "1" every engine, unset or else: FERRY_ENGINE_BUSY_POLL ones. */
static int membarrier_env(void)
{
	const char *v = getenv("FERRY_MEMBARRIER");

	return !v ? -1 : !strcmp(v, "0") ? 0 : !strcmp(v, "1") ? 1 : -1;
}

bool fence_engine_asym(bool busy_poll)
{
	int env = membarrier_env();
	pid_t me = getpid();
	bool ok;

	if (!(env == 1 || (env != 0 && busy_poll)))
		return false;
	pthread_mutex_lock(&choice_lock);
	if (registered_in != me) {
		int q = membarrier(MEMBARRIER_CMD_QUERY);

		registered = q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
			     membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
		if (!registered)
			log_info("membarrier not available (%s): FERRY_ENGINE_BUSY_POLL keeps full fences",
				 q < 0 ? strerror(errno) : "not offered");
		registered_in = me;
	}
	ok = registered;
	pthread_mutex_unlock(&choice_lock);
	return ok;
}

bool fence_registered(void)
{
	bool ok;

	pthread_mutex_lock(&choice_lock);
	ok = registered && registered_in == getpid();
	pthread_mutex_unlock(&choice_lock);
	return ok;
}

void fence_heavy(bool asym)
{
	if (asym) {
		static atomic_bool said;
		int rc;

		do
			rc = membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED);
		while (rc < 0 && errno == EINTR);
		if (rc == 0)
			return;
		/* Registered, yet refused now: nothing in membarrier(2) allows it. */
		if (!atomic_exchange(&said, true))
			log_error("membarrier(GLOBAL_EXPEDITED) failed after registration: %s",
				  strerror(errno));
	}
	atomic_thread_fence(memory_order_seq_cst);
}

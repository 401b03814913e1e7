/*
 * engine/fence.c - the membarrier registration and the sleeping side's
 * heavy fence (engine/fence.h).
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

bool ferry__membarrier_ok;
static pid_t registered_in; /* the process that made the choice (0: none yet) */
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

void fence_setup(void)
{
	pid_t me = getpid();

	pthread_mutex_lock(&choice_lock);
	if (registered_in != me) {
		int q = membarrier_env() != 0 ? membarrier(MEMBARRIER_CMD_QUERY) : -1;
		bool ok = q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
			  membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;

		if (!ok && membarrier_env() != 0)
			log_debug("membarrier not available (%s): symmetric fences only",
				  q < 0 ? strerror(errno) : "not offered");
		ferry__membarrier_ok = ok;
		registered_in = me;
	}
	pthread_mutex_unlock(&choice_lock);
}

bool fence_engine_asym(bool busy_poll)
{
	int env = membarrier_env();

	return ferry__membarrier_ok && (env == 1 || (env != 0 && busy_poll));
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

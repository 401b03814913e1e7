/*
 * engine/fence.h - the fences between a busy side and a side going to sleep.
 *
 * Owns: the process's membarrier registration, and each engine's choice
 * between symmetric fences (a seq_cst fence on both sides of every "write,
 * then read the other's word" pair: the default) and asymmetric ones
 * (FERRY_ENGINE_BUSY_POLL), where the busy side's fence is only a compiler
 * barrier and the side about to sleep pays for both with
 * membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED): every running thread of
 * every registered process executes a full barrier before the call returns,
 * so a busy thread's write before its light fence is visible to the
 * sleeper's look after its heavy one, or the busy thread's read after its
 * light fence sees the sleeper's announcement (Dekker's pattern; membarrier(2)
 * documents this use).
 *
 * The busy side runs on every op (ferry_sq_submit, the end of a MANUAL
 * round, each reap and each round's CQ wake check, each shm PUT and round):
 * a locked instruction each. The heavy side runs before each sleep (the
 * reactor's, a ferry_cq_wait caller's futex, an armed CQ, an shm sender
 * waiting for ring room): an interrupt of every CPU that runs a registered
 * process's thread at that moment, which on a virtual machine costs 5-17 us
 * when the peer process runs. Hence an opt-in, for engines whose callers
 * poll and rarely sleep. In THREAD mode a caller that kept watch for a
 * parked reactor announces its sleep again as its ferry_cq_wait returns: a
 * heavy fence there too.
 *
 * Pairs, light side -> heavy side (both of one engine):
 *   ferry_sq_submit (SQ tail, then the engine's sleep word) -> announce_sleep
 *   progress_unlock (progress_busy, then cq_waiters) -> a ferry_cq_wait futex sleep
 *   cq_flush_wakeups (posted CQEs, then armed / cq_waiters) -> the same, ferry_cq_arm
 *   cq_reap (room made, then overflowing) -> cq_post setting overflowing (a
 *     stand-in round then looks for room for its parked reactor) and announce_sleep
 * and across processes, shm's wake_peer and conn_progress (entries, heads, then
 * the peer's sleep word and want_room) -> the peer's announce_sleep and
 * room_appeared: light only toward a peer engine whose wake page says its sleeps
 * are heavy (WAKE_HEAVY_SLEEPS), and only in a process that registered (so the
 * peer's membarrier reaches its threads).
 */
#ifndef FERRY_FENCE_H
#define FERRY_FENCE_H

#include <stdatomic.h>
#include <stdbool.h>

/*
 * Does an engine created with busy_poll take the asymmetric fences? The
 * first that does registers the process for membarrier (again in a fork's
 * child); FERRY_MEMBARRIER=0 in the environment: none does, =1: every one.
 */
bool fence_engine_asym(bool busy_poll);

/*
 * Is this process registered (so a peer process's membarrier reaches its
 * threads)? Registration only ever turns on; a connection reads it once,
 * when it is made (not a hot path: a lock and getpid).
 */
bool fence_registered(void);

/* The busy side's fence: light when asym (the engine's, or the peer's sleeps heavy). */
static inline void fence_light(bool asym)
{
	if (asym)
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
}

/* The sleeping side's fence (after its announcement, before its last look). */
void fence_heavy(bool asym);

#endif

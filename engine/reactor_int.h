/*
 * engine/reactor_int.h - the calls between the reactor's files.
 *
 * Owns: what reactor.c (the op path and the rounds), reactor_sleep.c (sleep,
 * wake, stand-in rounds), reactor_peer.c (waiting for a peer, peer events)
 * and reactor_setup.c (create and destroy) share and nobody else needs:
 * the io_uring tags of the reactor's own requests and the calls between
 * those files. Everything here runs on the progress side.
 */
#ifndef FERRY_REACTOR_INT_H
#define FERRY_REACTOR_INT_H

#include "internal.h"
/* user_data of the reactor's own io_uring requests (a backend's carry its index in the top byte). */
#define TAG_DOORBELL 1ull
#define TAG_TIMEOUT 2ull
/* How long an idle spin pauses before it starts to yield its CPU. */
#define SPIN_PAUSE_NS 2000
/*
 * A spin's yield that was away longer than this lost its CPU to another
 * thread's time slice (a busy CPU: such a yield is away 3 ms or more
 * here, one that hands the CPU to a thread of the pipeline for its short
 * work far less); then, for a while (CONTENDED_MIN_NS, doubled up to
 * CONTENDED_MAX_NS while each loss comes within CONTENDED_REGROW_NS of the
 * last window's end), this engine's spins sleep at once instead of
 * yielding (reactor_spin_yield).
 */
#define YIELD_LOST_NS 1000000ull
#define CONTENDED_MIN_NS 1000000ull
#define CONTENDED_MAX_NS 50000000ull
#define CONTENDED_REGROW_NS 10000000ull
/* Spins of spin_ns this long or longer never adapt: their owner wants the CPU polled. */
#define SPIN_ADAPT_MAX_NS 1000000ull

/* Should a spin of e sleep now rather than yield (a yield lost its CPU lately)? */
bool reactor_spin_contended(struct ferry_engine *e, uint64_t now);
/* A spin's sched_yield, timed: false when it lost the CPU (then spins stop yielding a while). */
bool reactor_spin_yield(struct ferry_engine *e);

/* Handle the io_uring's completions: doorbell reads, the MANUAL arm's TIMEOUT, backends' I/O. */
void reactor_reap_ring(struct ferry_engine *e);
/*
 * THREAD mode (reactor_sleep.c): sleep like reactor_sleep, but park: progress
 * is let go for the wait, so that a caller that submits or waits meanwhile
 * can run rounds itself (reactor_stand_in). Taken back after.
 */
void reactor_thread_sleep(struct ferry_engine *e, uint64_t lease_until);
/*
 * After a round without work: should the reactor thread park under a
 * pollers' lease (reactor_poll_watch)? Then *until is when the lease ends.
 * A lease run out with the polls stopped is ended here.
 */
bool reactor_poll_lease(struct ferry_engine *e, uint64_t now, uint64_t *until);
/* How often a tight poll loop writes its stamps (they share a cache line). */
#define POLL_STAMP_NS 1000ull

/*
 * reactor_peer.c: a FERRY_SQE_WAIT_PEER PUT met a peer that is not up: it
 * waits on the peer's wait list instead of completing. False when the op
 * must complete after all.
 */
bool reactor_wait_for_peer(struct ferry_engine *e, struct op *op);
/* Try the peers that PUTs wait for again (due at e->retry_at). Returns events. */
int reactor_retry_peers(struct ferry_engine *e);

/* Off its peer's wait list (OP_F_WAIT_PEER): it ended there (deadline, cancel, destroy). */
static inline void reactor_peer_wait_remove(struct op *op)
{
	op_list_remove(&op->peer->wait_head, &op->peer->wait_tail, op);
	op->flags &= ~OP_F_WAIT_PEER;
}

#endif

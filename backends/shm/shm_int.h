/*
 * backends/shm/shm_int.h - what the shm transport's files share (private to
 * backends/shm/).
 *
 * Owns: the state of one engine's shm backend and of each connection to a
 * peer engine, their limits, the io_uring cookies of its sockets and timer,
 * and the calls its files make into each other: shm.c (the backend's entry
 * points and the data path), shm_conn.c (connections: lifetime, faults),
 * shm_handshake.c (calling, accepting, the hello's checks). The data path's
 * per-op functions are static in shm.c; what is declared here is called
 * only to set a connection up or take it down (shm_conn_unref's common
 * case is inline).
 */
#ifndef FERRY_SHM_INT_H
#define FERRY_SHM_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"
#include "shm_sock.h"

#define SHM_MAX_CONNS 256u
/* Accepted callers whose hello has not come yet; beyond, the oldest is hung up on. */
#define SHM_HALF_OPEN_MAX 64u

/*
 * io_uring cookies (below backend_tag's byte): the listener, a connection
 * (gen << 16 | id + 1), a half-open accept (gen << 16 |
 * SHM_COOKIE_HALF_OPEN + slot), the handshake timer.
 */
#define SHM_COOKIE_LISTENER 0u
#define SHM_COOKIE_HALF_OPEN 0x1000u
#define SHM_COOKIE_TICK 0xffffu
#define SHM_LENT_IPC (1ull << 63)

struct shm_state;

struct shm_conn {
	_Atomic int refs;    /* the table, each peer resolved to it, each wrapped block */
	_Atomic int closed;  /* release hooks stop queueing */
	_Atomic int users;   /* release hooks inside */
	uint32_t id;
	uint32_t gen;        /* tells its io_uring poll from a former one's */
	bool dead;
	bool up;             /* handshake done, in st->live (else: we are calling) */
	bool connect_again;  /* calling: the peer's accept queue was full */
	int sock;            /* -1 while connect_again */
	struct shm_state *st;
	char peer_name[FERRY_NAME_MAX];
	struct key_suffix arrive_sfx; /* "@{peer_name}_{engine}": the keys of its PUTs */
	struct shm_rings *rings;
	struct shm_dir *tx, *rx;
	const uint8_t *peer_pool;
	uint64_t peer_pool_size;
	int peer_doorbell;
	struct wake_page *peer_wake;
	/* Its sleeps take the heavy fence, and we registered (engine/fence.h): ours toward it are light. */
	bool peer_sleeps_heavy;
	struct op *pending_head, *pending_tail; /* PUTs waiting for ring room */
	uint64_t puts_sent, puts_taken;
	/*
	 * peer_pool pinned here for device copies out of it: 0 not tried, 1
	 * pinned (unpinned by shm_conn_free, before the unmap), -1 refused.
	 * Set on the reactor; read by shm_conn_free (the last reference).
	 */
	_Atomic int dma_pin;
	/*
	 * Our ends of the rings, kept here: the shared words are only read
	 * where the peer writes them (its heads of our rings, the sequence
	 * words of its entries), so what it scribbles over ours cannot
	 * mislead us. The peer's heads are read again only when the copy says
	 * a ring is full.
	 */
	uint32_t put_tail, put_head_seen;   /* tx PUT ring */
	uint32_t ctrl_tail, ctrl_head_seen; /* tx control ring */
	uint32_t ctrl_published;            /* ctrl_tail at the last wake check */
	uint32_t rx_put_head, rx_ctrl_head; /* rx rings */
	bool peer_takes_result_free;        /* its hello had SHM_CAP_RESULT_FREE */
	/* Calling (cold: the data path never looks). */
	int ring_fd;         /* the rings' memfd, until our hello is sent */
	uint64_t hs_deadline; /* the handshake's bound */
};

struct shm_state {
	struct ferry_engine *engine;
	struct backend *b;
	struct shm_listener lis;
	uint32_t next_gen;
	/* Accepted callers whose hello has not come yet (fd -1: free slot). */
	struct shm_half_open {
		int fd;
		uint32_t gen;
		uint64_t deadline;
	} half_open[SHM_HALF_OPEN_MAX];
	uint32_t nhalf_open;
	uint32_t nconnecting;    /* connections we started, not up nor failed yet */
	bool tick_armed;
	struct __kernel_timespec tick_ts;
	struct shm_conn *conns[SHM_MAX_CONNS]; /* by slot (the id peers' cookies name) */
	struct shm_conn *live[SHM_MAX_CONNS];  /* the same, packed: what rounds walk */
	uint32_t nlive;
	struct ferry_buf **lent;  /* by handle index: blocks a peer holds */
	uint16_t *lent_conn;      /* conn id + 1 */
	uint64_t *lent_credit;    /* stream_credit_token of a lent chunk (0: none) */
	/*
	 * A lent CUDA IPC descriptor's PUT (WIRE_F_CUDA_IPC): SHM_LENT_IPC |
	 * index << 32 | gen, ended at the block's RELEASE (the receiver's copy
	 * from our device memory is done), not at its RESULT; 0: none.
	 */
	uint64_t *lent_ipc;
	uint32_t max_bufs;
	struct ferry_buf *_Atomic releases; /* foreign blocks released, any thread */
	stat_t dma_pins;      /* peers' pools pinned here for device copies (shm_dma_source) */
	stat_t dma_refusals;  /* ... and refused by the runtime */
	uint32_t calls_again; /* calls made again after the callee hung up unanswered */
	_Atomic int fault_hangups; /* tests (ferry__shm_fault_hangup): accepted callers to drop */
};

/*
 * Fault injection (tests): the next n callers this engine accepts are hung
 * up on at once, unread, as if their hello had come too late. 0 or -ENODEV.
 */
int ferry__shm_fault_hangup(struct ferry_engine *e, int n);

/* shm_conn.c: connections */
/* The last reference went: unmap and close what the connection held, free it. */
void shm_conn_free(struct shm_conn *c);

static inline void shm_conn_unref(struct shm_conn *c)
{
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
		shm_conn_free(c);
}

/* A connection not yet up, in a free slot; NULL (logged) when none is free. */
struct shm_conn *shm_conn_new(struct ferry_engine *e, struct shm_state *st, int sock,
			      const char *peer_name);
/* Out of the table and the live list; drops the table's reference. */
void shm_conn_reap(struct shm_state *st, struct shm_conn *c);
/*
 * The connection that carries PUTs to the engine called name, with a
 * reference for the caller (calling it if need be). 0, or -EHOSTUNREACH.
 */
int shm_conn_for(struct ferry_engine *e, struct backend *b, const char *name,
		 struct shm_conn **out);
/*
 * The peer is gone or broke the protocol (why: logged, NULL: not): its ops
 * fail with res, the blocks it held come back. c stays in the table until
 * shm_conn_reap.
 */
void shm_conn_fail(struct ferry_engine *e, struct shm_conn *c, const char *why, int res);
/* Poll fd once on the reactor's io_uring, its completion tagged with cookie. */
void shm_arm_poll(struct ferry_engine *e, struct backend *b, int fd, uint64_t cookie);

/* shm_handshake.c: handshakes */
/* Call the engine called name; *out is not up yet (its PUTs queue). */
int shm_call_start(struct ferry_engine *e, struct backend *b, const char *name,
		   struct shm_conn **out);
/* The socket of a call under way woke up: true when the connection came up. */
bool shm_call_answered(struct ferry_engine *e, struct backend *b, struct shm_conn *c, int res);
/* The listener woke up: accept every caller waiting. */
void shm_accept_all(struct ferry_engine *e, struct backend *b);
/* The socket of half-open slot i woke up (res: the poll's revents or an error). */
void shm_half_open_cqe(struct ferry_engine *e, struct backend *b, uint32_t i, uint32_t gen,
		       int res);
void shm_half_open_close(struct shm_state *st, uint32_t i);
/* While any handshake is under way, look at the bounds every SHM_TICK_MS. */
void shm_arm_tick(struct ferry_engine *e, struct backend *b);
/* The timer: bounds of half-open accepts and of calls, calls to try again. */
void shm_handshakes_check(struct ferry_engine *e, struct backend *b);

/* shm.c: the data path */
/* The connection is gone: every block still lent through it is ours again. */
void shm_lent_drop(struct shm_state *st, struct shm_conn *c);

#endif

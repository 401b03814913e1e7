/*
 * backends/shm/shm_wire.h - the layout of the shared memory two shm
 * engines talk through (private to the transport and its tests).
 *
 * Owns: the descriptor formats and the ring layout of one connection. The
 * connecting side creates one memfd of SHM_RINGS_BYTES holding both
 * directions: dir[0] carries connector -> acceptor, dir[1] the way back.
 * Each direction has a PUT ring and a control ring (RESULT, RELEASE), each
 * a single-producer single-consumer ring of fixed entries at free-running
 * 32-bit positions: each entry says itself when it is ready (its seq), and
 * the consumer publishes how far it took (head) so the producer knows its
 * room. Nothing read from it is trusted: see shm.c.
 */
#ifndef FERRY_SHM_WIRE_H
#define FERRY_SHM_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define SHM_PUT_ENTRIES 1024u
#define SHM_CTRL_ENTRIES 4096u
#define SHM_PUT_SLOT 512u /* bytes of one PUT entry */
/*
 * A PUT of at most this many bytes travels inside its entry, after the key
 * (SHM_D_PUT_INLINE): no block is lent, and the receiver reads one entry.
 */
#define SHM_INLINE_MAX 256u

/*
 * SHM_C_RESULT_FREE: a RESULT (res 0) and a RELEASE in one entry, for a PUT
 * the receiver copied out at once; sent only to a peer whose hello had
 * SHM_CAP_RESULT_FREE. SHM_C_RESULT_INLINE: the RESULT of an inline PUT
 * (no block to account for).
 */
/*
 * The res of a RELEASE: 0, or SHM_RELEASE_RESEND: the block was given back
 * unread and its data is wanted again (a CUDA IPC descriptor whose handles
 * the receiver could not open: the sender sends the data staged).
 */
#define SHM_RELEASE_RESEND 1

enum {
	SHM_D_PUT = 1,
	SHM_C_RESULT = 2,
	SHM_C_RELEASE = 3,
	SHM_C_RESULT_FREE = 4,
	SHM_D_PUT_INLINE = 5,
	SHM_C_RESULT_INLINE = 6,
};

/*
 * Every entry starts with `seq`, stored last with release order: an entry
 * at ring position p is ready when its seq is p + 1 (32-bit, wrapping). The
 * consumer polls the entry it wants next, so one cache line carries both
 * "there is something" and the thing (no separate tail index to read).
 */
struct shm_put_desc {
	_Atomic uint32_t seq;
	uint16_t type;
	uint16_t key_len;
	uint32_t flags;
	uint32_t resv;
	uint64_t op_cookie;  /* the sender's op: index << 32 | generation */
	uint64_t buf_cookie; /* SHM_D_PUT: the sender's handle index of the block */
	uint64_t offset, len;
	/* The key and its NUL; SHM_D_PUT_INLINE: then the data, at shm_inline_at(). */
	char body[SHM_PUT_SLOT - 48];
};

/* Where an inline PUT's data starts in body: after the key's NUL, 8-aligned. */
static inline uint32_t shm_inline_at(uint32_t key_len)
{
	return (key_len + 1u + 7u) & ~7u;
}

struct shm_ctrl_desc {
	_Atomic uint32_t seq;
	uint16_t type;
	uint16_t resv0;
	int32_t res;
	uint32_t resv1;
	uint64_t op_cookie;
	uint64_t buf_cookie;
	uint64_t offset;
	uint8_t pad[24]; /* one entry per cache line */
};

struct shm_ring_ctl {
	_Atomic uint32_t head __attribute__((aligned(64))); /* consumer: what it took */
	/* The producer sleeps until the consumer makes room: ring its doorbell. */
	_Atomic uint32_t want_room __attribute__((aligned(64)));
};

/* One direction of a connection. */
struct shm_dir {
	struct shm_ring_ctl put;
	struct shm_put_desc puts[SHM_PUT_ENTRIES] __attribute__((aligned(64)));
	struct shm_ring_ctl ctrl;
	struct shm_ctrl_desc ctrls[SHM_CTRL_ENTRIES] __attribute__((aligned(64)));
};

_Static_assert(sizeof(struct shm_put_desc) == SHM_PUT_SLOT, "PUT entry size");
_Static_assert(sizeof(struct shm_ctrl_desc) == 64, "control entry size");
_Static_assert(FERRY_KEY_MAX + SHM_INLINE_MAX <= sizeof(((struct shm_put_desc *)0)->body),
	       "an inline PUT with the longest key fits");

/* The shared memory of a connection: [0] connector -> acceptor, [1] back. */
struct shm_rings {
	struct shm_dir dir[2];
};

#define SHM_RINGS_BYTES ((sizeof(struct shm_rings) + 4095) & ~(size_t)4095)

#endif

/*
 * backends/shm/shm_wire.h - the layout of the shared memory two shm
 * engines talk through (private to the transport and its tests).
 *
 * Owns: the descriptor formats and the ring layout of one connection. The
 * connecting side creates one memfd of SHM_RINGS_BYTES holding both
 * directions: dir[0] carries connector -> acceptor, dir[1] the way back.
 * Each direction has a PUT ring and a control ring (RESULT, RELEASE), each
 * a single-producer single-consumer ring of fixed entries indexed by free-
 * running 32-bit head (consumer) and tail (producer) counters. Nothing read
 * from it is trusted: see shm.c.
 */
#ifndef FERRY_SHM_WIRE_H
#define FERRY_SHM_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define SHM_PUT_ENTRIES 1024u
#define SHM_CTRL_ENTRIES 4096u

/*
 * SHM_C_RESULT_FREE: a RESULT (res 0) and a RELEASE in one entry, for a PUT
 * the receiver copied out at once; sent only to a peer whose hello had
 * SHM_CAP_RESULT_FREE.
 */
enum { SHM_D_PUT = 1, SHM_C_RESULT = 2, SHM_C_RELEASE = 3, SHM_C_RESULT_FREE = 4 };

struct shm_put_desc {
	uint32_t type;
	uint32_t flags;
	uint64_t op_cookie;  /* the sender's op: index << 32 | generation */
	uint64_t buf_cookie; /* the sender's handle index of the block */
	uint64_t offset, len;
	uint16_t key_len;
	uint8_t pad[6];
	char key[FERRY_KEY_MAX];
	uint8_t resv[16];
};

struct shm_ctrl_desc {
	uint32_t type;
	int32_t res;
	uint64_t op_cookie;
	uint64_t buf_cookie;
	uint64_t offset;
};

struct shm_ring_ctl {
	_Atomic uint32_t head __attribute__((aligned(64))); /* consumer */
	_Atomic uint32_t tail __attribute__((aligned(64))); /* producer */
	/* The producer sleeps until the consumer makes room: ring its doorbell. */
	_Atomic uint32_t want_room __attribute__((aligned(64)));
};

/* One direction of a connection. */
struct shm_dir {
	struct shm_ring_ctl put;
	struct shm_put_desc puts[SHM_PUT_ENTRIES];
	struct shm_ring_ctl ctrl;
	struct shm_ctrl_desc ctrls[SHM_CTRL_ENTRIES];
};

/* The shared memory of a connection: [0] connector -> acceptor, [1] back. */
struct shm_rings {
	struct shm_dir dir[2];
};

#define SHM_RINGS_BYTES ((sizeof(struct shm_rings) + 4095) & ~(size_t)4095)

#endif

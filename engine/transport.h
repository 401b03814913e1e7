/*
 * engine/transport.h - the contract between the engine and its transports.
 *
 * Owns: the ops table every transport fills (struct backend_ops: its name,
 * rank and capabilities, and the hooks the reactor calls), the registry of
 * transports the engine is built with (engine/registry.c, the one place
 * that names them), the engine-wide peer events every layer subscribes to,
 * and the calls a transport makes into the engine (arrivals, PUTs done,
 * wake-ups, peer events). Nothing here names a transport: a new one is a
 * folder under backends/ with one of these tables, plus a line in the
 * registry (docs/design.md, "Adding a transport").
 *
 * Data flows one way: the reactor hands a transport PUTs (already holding
 * their data in a pool buffer, or an iovec up to iov_put_max); the
 * transport delivers them and later calls reactor_put_done(); what arrives
 * from peers goes through reactor_deliver(). Every hook runs on the
 * progress side (progress held), except where noted.
 */
#ifndef FERRY_TRANSPORT_H
#define FERRY_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

struct ferry_engine;
struct ferry_peer;
struct ferry_buf;
struct op;
struct backend;

/* A peer's address for one transport: a URI whose scheme names the transport. */
#define PEER_MAX_ADDRS 4
#define PEER_ADDR_MAX 128
struct peer_addr {
	char uri[PEER_ADDR_MAX]; /* e.g. "tcp://10.0.0.2:4100" */
};

/*
 * Set peer's address for the transport its scheme names (replacing the one
 * it had there); 0, -EINVAL (no "scheme://"), -ENOSPC (PEER_MAX_ADDRS
 * transports already). Any thread.
 */
int ferry__peer_addr_set(struct ferry_peer *peer, const char *uri);
/* Copy peer's address for transport scheme into out: true, or false when it has none. */
bool ferry__peer_addr_get(struct ferry_peer *peer, const char *scheme, char *out, size_t len);

/* What a transport can do: its entry's caps (the registry and health show them). */
enum transport_cap {
	TRANSPORT_CAP_SAME_PROCESS = 1u << 0, /* reaches engines of this process */
	TRANSPORT_CAP_SAME_HOST = 1u << 1,    /* reaches engines of this host */
	TRANSPORT_CAP_REMOTE = 1u << 2,       /* reaches engines on other hosts */
	TRANSPORT_CAP_ZERO_COPY = 1u << 3,    /* a pool buffer reaches the peer unread */
	TRANSPORT_CAP_ONE_SIDED = 1u << 4,    /* the receiver reads the sender's memory */
	TRANSPORT_CAP_HOLDS = 1u << 5,        /* holds PUTs while a peer is being reached */
	TRANSPORT_CAP_MEM_HOST = 1u << 8,     /* moves host memory */
	/*
	 * The memory domain of CUDA device memory (backends/cuda: a service,
	 * it carries no PUT): it vets device regions (mem_register) and copies
	 * device memory for the engine (device_put, device_get).
	 */
	TRANSPORT_CAP_MEM_CUDA = 1u << 9,
	/*
	 * Carries CUDA IPC descriptors (WIRE_F_CUDA_IPC: same host, other
	 * process): such a PUT ends when the receiver releases its block, not
	 * at its RESULT, and fails with -ECONNRESET if the peer goes first.
	 */
	TRANSPORT_CAP_CUDA_IPC = 1u << 10,
};

/*
 * Engine-wide peer events (ferry__peer_event): a transport or the control
 * plane learned something about the engine called name; the stream layer
 * and every other transport hear it.
 *   PEER_LOST  the connection that transport `from` had to it is gone:
 *              streams to and from it fail (res).
 *   PEER_DEAD  the engine is gone (the control plane's verdict, from its
 *              heartbeats): every transport drops what it has to it, as if
 *              it had gone silent there.
 */
enum peer_event { PEER_LOST = 1, PEER_DEAD = 2 };

struct backend_ops {
	const char *name;
	/*
	 * Where it stands in the order a peer is resolved in (lower first):
	 * the registry sorts by it. A transport that a peer names (an address)
	 * comes before those that find peers by name.
	 */
	unsigned rank;
	uint32_t caps; /* enum transport_cap */
	int (*init)(struct ferry_engine *e, struct backend *b);
	/* Shut down: stop accepting, answer what is pending with -ECONNRESET. */
	void (*fini)(struct ferry_engine *e, struct backend *b);
	/*
	 * Can this transport reach peer? 0 (and peer->transport set),
	 * -EHOSTUNREACH (not this one: the next is asked), or -ENETUNREACH
	 * (the peer is this transport's, e.g. it has a tcp address, and
	 * cannot be reached now: no other transport may carry it). Transports
	 * are asked in rank order; the first that can reach a peer carries it
	 * until a PUT reports the peer gone.
	 */
	int (*resolve)(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer);
	/* The peer's transport state is being dropped (re-resolve, destroy). */
	void (*unresolve)(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer);
	/*
	 * Optional, asked before any resolve: is a connection to peer being
	 * made (the control plane's handshake, which will tell how to reach
	 * it)? 1: its PUTs wait in the engine until ferry__peer_reached; 0:
	 * no; a negative errno: PUTs to it fail so (-EACCES: it refused us).
	 * A service without resolve (the control plane) carries no PUT itself.
	 */
	int (*reaching)(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer);
	/*
	 * Send op (PUT, data in op->buf) to op->peer. 0, or a negative errno.
	 * A PUT of an iovec of at most iov_put_max bytes comes with op->buf
	 * NULL and its data still in op->iov / op->iovcnt (valid until its
	 * completion, by the API's contract): the transport copies it once
	 * where it goes, and no pool block is taken for it. iov_put_max 0: the
	 * transport takes no iovec at all (every PUT comes with op->buf, also
	 * a 0-byte one: a 0-byte payload is a 0-byte buffer everywhere).
	 * A PUT that fails before any of it left (its peer never came up)
	 * has its op->buf back when it completes: a FERRY_SQE_WAIT_PEER PUT
	 * is then sent again.
	 */
	int (*put)(struct ferry_engine *e, struct backend *b, struct op *op);
	uint64_t iov_put_max;
	/*
	 * true: a PUT of segments of registered regions (FERRY_SQE_SEGS) of
	 * more than iov_put_max bytes also comes with op->buf NULL, its
	 * segments in op->segs / op->iovcnt (pinned until the op ends): the
	 * transport sends them from where they are (rdma: announced for the
	 * receiver to READ). Until nothing can read them any more the op must
	 * stay AWAY and held (reactor_put_held: its deadline stops, a CANCEL is
	 * refused); it may instead stage them into the pool itself (op_fill).
	 * reactor_send stages an op whose transport does not take it so.
	 */
	bool segs_in_place;
	/* Make progress; returns events handled. */
	int (*progress)(struct ferry_engine *e, struct backend *b);
	/*
	 * True if progress() has work right now. Pure: it looks, and changes
	 * nothing (any thread that holds progress may ask, any number of times).
	 */
	bool (*has_work)(struct ferry_engine *e, struct backend *b);
	/*
	 * Optional: the progress side is about to sleep (it said so in its wake
	 * page): tell the peers whose moves would end that sleep to ring (for
	 * instance: ask for a doorbell when ring room appears; send what was
	 * held back while spinning), then look once more. True if work is
	 * there now (the sleep is called off).
	 */
	bool (*prepare_sleep)(struct ferry_engine *e, struct backend *b);
	/*
	 * Optional: the round took entries from the SQs (before the backends'
	 * progress): send what they made now, so that a PUT leaves before the
	 * round spends time elsewhere. round_end still sends the rest.
	 */
	void (*sqs_drained)(struct ferry_engine *e, struct backend *b);
	/*
	 * Optional: the round is over (after the SQs were drained): send what
	 * it made (and poll what is polled); returns events handled.
	 */
	int (*round_end)(struct ferry_engine *e, struct backend *b);
	/* An op that is AWAY was cancelled or timed out. */
	void (*forget)(struct ferry_engine *e, struct backend *b, struct op *op);
	/* A completion of the engine's io_uring tagged for this backend. */
	void (*on_cqe)(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
		       uint32_t flags);
	/*
	 * Optional: its part of the engine's health JSON, `,"name":{...}`,
	 * written into buf like snprintf (0: nothing to say). Any thread: only
	 * what may be read unlocked.
	 */
	int (*health)(struct ferry_engine *e, struct backend *b, char *buf, size_t len);
	/*
	 * Optional, for a transport peers can be given an address for: the URI
	 * scheme it takes ("tcp"; the control plane's is "ferry"), connect
	 * (ferry_peer_connect_uri: peer is to be reached at uri; any thread),
	 * and its own address (ferry_engine_addresses: its URI into buf like
	 * snprintf, 0 when it listens on none; any thread).
	 */
	const char *scheme;
	int (*connect)(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
		       const char *uri);
	int (*address)(struct ferry_engine *e, struct backend *b, char *buf, size_t len);
	/* Optional: a peer event of another layer (see enum peer_event). */
	void (*peer_event)(struct ferry_engine *e, struct backend *b, const char *name,
			   enum peer_event ev, int res);
	/*
	 * Optional, for a transport that must know memory before it moves it
	 * (RDMA registers it with its device, CUDA pins host memory for DMA):
	 * register len bytes at addr, of memory type mem (device: its CUDA
	 * ordinal), keeping what it needs in *handle (a memory region, say).
	 * The engine keeps the handle for it, per memory, and finds it again
	 * for an op (engine/memory.h: ferry__buf_reg for a block of the pool,
	 * ferry__region_reg for a registered region). It is called for the
	 * engine's pool once, right after init (an error fails the engine's
	 * creation), and for every ferry_region_register (any thread, while
	 * progress runs; an error fails that call, logged). mem_deregister
	 * gets each handle back once: at ferry_region_release (any thread), and
	 * for the pool and every region still registered just before fini.
	 */
	int (*mem_register)(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
			    enum ferry_mem_type mem, int device, void **handle);
	void (*mem_deregister)(struct ferry_engine *e, struct backend *b, void *handle);
	/*
	 * Optional, for the memory domain (TRANSPORT_CAP_MEM_CUDA), reactor
	 * only. device_put: a PUT or PUBLISH whose segments hold device memory
	 * (OP_F_DEVICE): copy them, after the caller's wait the SQE names
	 * (ferry_sqe_set_cuda_wait), into a pool buffer of ours (op->buf,
	 * op->len), without waiting; 0: op is OP_DEVICE until it calls
	 * reactor_put_staged(e, op, res); a negative errno: nothing is under
	 * way (the engine completes the op). device_get: a GET into device
	 * segments takes buf (len bytes, fits): copy it there, then give buf
	 * back and complete op; 0: op is OP_DEVICE until then; a negative
	 * errno: nothing was done, buf is still the caller's. With
	 * WIRE_F_CUDA_IPC in wflags buf is a CUDA IPC descriptor (len: its
	 * size) and op any GET into an iovec or segments, host or device: the
	 * domain checks the real length against op->len and copies from the
	 * sender's device memory; MEMORY_DEVICE_RESEND: the handles cannot be
	 * opened here and the sender stages on request, nothing was done, buf
	 * is still the caller's (the engine gives it back with
	 * POOL_BUF_F_RESEND and parks op again). device_restage: an IPC PUT
	 * whose receiver asked for it again (reactor_put_restage; op's
	 * WIRE_F_CUDA_IPC cleared, its caller's wait already met), or a PUT
	 * left in place (OP_F_DEVICE_DIRECT, still set: the domain clears it)
	 * whose peer's transport no longer takes it so (reactor_send): stage
	 * it as device_put would, with the same answers.
	 */
	int (*device_put)(struct ferry_engine *e, struct backend *b, struct op *op,
			  const struct ferry_sqe *sqe);
	int (*device_get)(struct ferry_engine *e, struct backend *b, struct op *op,
			  struct ferry_buf *buf, uint64_t len, uint32_t wflags);
	int (*device_restage)(struct ferry_engine *e, struct backend *b, struct op *op);
	/*
	 * Optional, reactor only: a device copy is about to read buf
	 * (memory_dma_source). A transport that mapped buf's memory from
	 * another process pins that mapping for DMA (memory_dma_pin), once,
	 * and unpins it before unmapping it; any other buf is not its business.
	 */
	void (*dma_source)(struct ferry_engine *e, struct backend *b, struct ferry_buf *buf);
	/*
	 * Optional, for the memory domain, any thread: a dma-buf file
	 * descriptor of the device memory [addr, addr + len) of device (a
	 * region being registered: the domain's own mem_register, which vets
	 * it, may come after the asking transport's) in *fd (the caller closes it), and in *offset
	 * where addr lies in it; 0, or a negative errno with *why saying why
	 * in a sentence (not logged: the caller says what it gives up).
	 * A transport registers device memory with its NIC through it
	 * (GPUDirect RDMA: memory_device_dmabuf).
	 */
	int (*device_dmabuf)(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
			     int device, int *fd, uint64_t *offset, const char **why);
	/*
	 * Optional, for the memory domain, any thread: the allocation that
	 * holds device memory addr of device: its base, size and an id the
	 * driver never gives two allocations of the process (a registration
	 * of it made earlier is of the same memory while the id matches). 0,
	 * or a negative errno. memory_device_allocation.
	 */
	int (*device_allocation)(struct ferry_engine *e, struct backend *b, void *addr, int device,
				 uint64_t *base, uint64_t *size, uint64_t *id);
	/*
	 * Optional, for a transport that moves device memory itself (rdma:
	 * regions registered for GPUDirect), reactor only: can it send op's
	 * device segments from where they are (segs_in_place, its NIC reading
	 * them; no CPU touches them)? The domain then stages nothing and
	 * hands op on (OP_F_DEVICE_DIRECT) once the caller's wait is met. The
	 * transport must then never copy those segments with the CPU: a PUT it
	 * cannot send in place after all fails (-EIO), it is not staged.
	 */
	bool (*device_in_place)(struct ferry_engine *e, struct backend *b, const struct op *op);
	/*
	 * Optional (tcp, rdma): the transport sends a block while it is still being
	 * filled (pipelined staging: the memory domain copies a large device
	 * PUT into the pool piece by piece and hands it on after the first
	 * pieces, OP_F_FILLING). It sends no byte past pool_filled(buf);
	 * staged_more (reactor only) says that some such block has more, or
	 * that its filling failed (POOL_FILL_FAILED: the transport must not
	 * deliver that PUT; tcp fails the link that carries it).
	 */
	bool sends_filling;
	void (*staged_more)(struct ferry_engine *e, struct backend *b);
	/*
	 * Optional, for the memory domain, reactor only: op (OP_F_FILLING) is
	 * ending with res and len (its transport already forgot it) while the
	 * domain's copies may still read its device memory: true, the domain
	 * keeps it (OP_DEVICE) and calls op_complete(e, op, res, len, NULL)
	 * when they end; false (and OP_F_FILLING cleared): it ends now.
	 */
	bool (*device_defer)(struct ferry_engine *e, struct backend *b, struct op *op, int res,
			     uint64_t len);
};

struct backend {
	const struct backend_ops *ops;
	void *data;
	uint8_t index;
	/*
	 * Optional, the transport's "nothing to do here": while it is set, a
	 * round calls none of the transport's progress, sqs_drained and
	 * round_end, and reactor_has_work does not ask its has_work (a round
	 * then costs nothing for a transport that carries nothing). Only the
	 * transport sets it (progress side, from its own hooks), when those
	 * hooks would do nothing until it is called for something else. It is
	 * cleared again (the hooks run from the next round on):
	 *   - by the reactor, before it calls any other hook of the transport
	 *     (put, forget, on_cqe, resolve, unresolve, reaching, peer_event);
	 *   - by ferry__backend_wake(), which any thread calls after it changed
	 *     what those hooks look at (a release, a connect queued from the
	 *     application's thread): the transport calls it from its own
	 *     any-thread entry points.
	 * A transport that sets quiet makes it race-free: set it, then look
	 * once more at what other threads write (they write, then wake), and
	 * clear it if something came. A transport that never sets it (the
	 * default) has its hooks run every round.
	 *
	 * Quiet is b's bit (1 << index) clear in the engine's mask *awake, so
	 * that a round visits the transports whose bits are set and no other
	 * (one load, then a walk over set bits).
	 */
	_Atomic uint32_t *awake;
};

/* Ring the engine's doorbell if its progress side sleeps. Any thread. */
void reactor_wake(struct ferry_engine *e);
/*
 * Any thread: b's round hooks run again (its quiet is cleared), and the
 * engine's progress side is woken if it sleeps. Inline: the loop transport
 * calls it for every message it sends.
 */
static inline void ferry__backend_wake(struct ferry_engine *e, struct backend *b)
{
	uint32_t bit = 1u << b->index;

	atomic_thread_fence(memory_order_seq_cst); /* what the caller wrote, then quiet */
	if (!(atomic_load_explicit(b->awake, memory_order_relaxed) & bit))
		atomic_fetch_or_explicit(b->awake, bit, memory_order_seq_cst);
	reactor_wake(e);
}
/* Progress side, a transport in its own hook: nothing to do until called (see quiet). */
static inline void ferry__backend_quiet(struct backend *b)
{
	atomic_fetch_and_explicit(b->awake, ~(1u << b->index), memory_order_seq_cst);
}

#define ENGINE_MAX_BACKENDS 8 /* at most 32: a bit each in an engine's awake mask */

/*
 * An SQE of the engine's io_uring (progress side), for a transport to arm
 * what the reactor's wait watches: when the ring is full, what is queued is
 * submitted first. NULL only when it is still full (the caller logs).
 */
struct io_uring_sqe *ferry__ring_sqe(struct ferry_engine *e);

/* io_uring user_data for a backend's SQE: its index in the top byte. */
static inline uint64_t backend_tag(const struct backend *b, uint64_t cookie)
{
	return ((uint64_t)(b->index + 1) << 56) | (cookie & ((1ull << 56) - 1));
}

/*
 * The registry (engine/registry.c): the transports this build has, in rank
 * order, NULL-terminated. An engine runs one of each.
 */
extern const struct backend_ops *const ferry__transports[];

/* The running transport of e with this ops table, or NULL. */
struct backend *ferry__backend_of(struct ferry_engine *e, const struct backend_ops *ops);

/*
 * A PUT arrived for this engine: fullkey, data in buf. On 0 the engine owns
 * buf; on an error (-EEXIST, -ENOSPC, -EINVAL for a malformed stream credit)
 * it stays the caller's, who frees it and reports the error to the sender.
 */
int reactor_deliver(struct ferry_engine *e, struct ferry_peer *from, const char *fullkey,
		    size_t fullkey_len, struct ferry_buf *buf, uint64_t len, uint32_t flags);
/*
 * A PUT arrived whose data the transport can read in place (src, len):
 * if a GET into an iovec already waits for fullkey, copy into it and
 * complete it, and return true (the transport keeps its block, which may go
 * back to its owner at once). false: nothing was done; reactor_deliver
 * takes it. Stream traffic always goes through reactor_deliver.
 */
bool reactor_deliver_copy(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			  const void *src, uint64_t len, uint32_t flags);
/*
 * A PUT whose data the transport can read in place (src, len) for the
 * first GET waiting under fullkey, whatever it takes: copied into its
 * iovec, or into a new block of e's pool handed to it (a GET for a
 * buffer); one key lookup for both. 1: it has the data; 0: nothing was
 * done (none waits, a GET that is too small, a device GET): reactor_deliver
 * takes it; -ENOBUFS: a GET for a buffer waits but e's pool has no block
 * (counted and logged by the pool once: do not ask it again). elsewhere:
 * the caller holds e's progress lock but is not e's reactor (backends/loop's
 * direct delivery): a GET whose callback is the reactor's
 * (FERRY_SQE_CB_REACTOR) is left alone.
 */
int reactor_deliver_waiting(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			    const void *src, uint64_t len, uint32_t flags, bool elsewhere);
/*
 * A PUT of len bytes arrives under fullkey that the transport can write
 * into its destination itself (rdma: READ straight into a GET's segments):
 * the first GET parked for it if that GET takes segments of registered
 * regions (FERRY_SQE_SEGS) with room for len bytes and the data is a plain
 * PUT (flags: no stream traffic). Its segments may be device memory
 * (OP_F_DEVICE): only a transport that writes device memory itself
 * (GPUDirect RDMA) may claim it so. Nothing changes: the transport checks
 * what it needs of the segments (op->segs, op->iovcnt), then claims it or
 * leaves it. NULL: none such.
 */
struct op *reactor_parked_get(struct ferry_engine *e, const char *fullkey, size_t fullkey_len,
			      uint64_t len, uint32_t flags);
/*
 * Take op (just returned by reactor_parked_get) off its key: it is held
 * (its deadline stops, a CANCEL answers -EALREADY) while the transport
 * writes into its memory, until reactor_claimed_get_done, which the
 * transport calls exactly once: res 0 and len when the data is there, or
 * a negative errno (the destination's contents are then undefined).
 */
void reactor_claim_get(struct ferry_engine *e, struct op *op);
void reactor_claimed_get_done(struct ferry_engine *e, struct op *op, int res, uint64_t len);
/* Drop the transport state of a peer (so the next PUT resolves it again). */
void reactor_unresolve(struct ferry_engine *e, struct ferry_peer *peer);
/* The same for every peer that transport b carries (at its shutdown). */
void reactor_unresolve_all(struct ferry_engine *e, struct backend *b);
/* Hand a PUT to the transport that reaches op->peer (resolving it first). */
int reactor_send(struct ferry_engine *e, struct op *op);
/*
 * The connection being made to peer (see reaching) is done: res 0, the PUTs
 * that waited go to the transport that now reaches it, in order; else they
 * fail with res. Progress side only.
 */
void ferry__peer_reached(struct ferry_engine *e, struct ferry_peer *peer, int res);
/* device_get: the CUDA IPC handles do not open here; ask the sender to stage it. */
#define MEMORY_DEVICE_RESEND 1
/*
 * The memory domain's device_put is done (res 0: op->buf holds the data):
 * the PUT goes on as any other (to its transport, with its deadline); on
 * an error it completes with it. Reactor only.
 */
void reactor_put_staged(struct ferry_engine *e, struct op *op, int res);
/* The transport finished a PUT (res 0 or negative errno). */
void reactor_put_done(struct ferry_engine *e, struct op *op, uint32_t gen, int res);
/*
 * A peer event (enum peer_event) about the engine called name, from
 * transport `from` (NULL: the control plane): the stream layer and every
 * transport but `from` hear it. Progress side only.
 */
void ferry__peer_event(struct ferry_engine *e, const struct backend *from, const char *name,
		       enum peer_event ev, int res);

#endif

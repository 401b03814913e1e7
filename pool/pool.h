/*
 * pool/pool.h - the registered memory pool (private to libferry).
 *
 * Owns: one memory region backed by a memfd, faulted in once at creation
 * (huge pages where madvise allows), and the allocator that carves it into
 * blocks. Later transports share the memfd between processes and register
 * the region with io_uring, verbs and CUDA; nothing in here knows about them.
 *
 * Allocator shape:
 *  - Small blocks (<= POOL_SMALL_MAX bytes) come from size-class slabs
 *    (64 B .. 2 KiB, powers of two), 64 B aligned. Each slab is a run of
 *    pages taken from the page allocator; a per-slab bitmap records which
 *    objects are live, so a double free is detected, never honoured. A slab
 *    that becomes empty goes back to the page allocator. Each class has its
 *    own spinlock: threads allocating different sizes never meet.
 *  - Large blocks are runs of 4 KiB pages (4 KiB aligned) managed by a
 *    segregated-fit allocator with out-of-band boundary tags (one entry per
 *    page, outside the region): O(1) allocation (bitmap of non-empty bins),
 *    O(1) free with coalescing of both free neighbours.
 *  - Magazines: each size class keeps up to 16 freed blocks together with
 *    their handles, so that freeing a small block and allocating one of the
 *    same class again costs one class lock and no atomics on shared lists
 *    (the zero-copy PUT/GET path allocates and frees a small block per op).
 *    A kept block counts as free in the stats; it goes back to its slab
 *    when the owner lets go of the pool, and on the way to -ENOMEM.
 *  - Metadata never lives inside the region, so nothing a user or a peer
 *    writes into a block can corrupt the allocator.
 *
 * Buffer handles (struct ferry_buf) come from a preallocated descriptor
 * table with a lock-free free list; allocating a handle never calls malloc.
 A block can be shared by several handles (pool_share); a shared
 * block's root can say that it is still being filled, and how far
 * (POOL_BUF_F_FILLING, pool_filled): whoever fills it moves that on.
 *
 * Errors: negative errno, never abort. A double free, a free of a foreign
 * handle, or a free that points into a free block returns -EINVAL, logs one
 * line and bumps a counter in the stats.
 *
 * Lifetime: the pool is reference counted. The owner (an engine) holds one
 * reference and every live block holds one, so a buffer handed to another
 * engine of the same process stays valid after its owner was destroyed; the
 * region is unmapped when the last reference goes.
 */
#ifndef FERRY_POOL_H
#define FERRY_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_PAGE_SIZE 4096u
#define POOL_SMALL_MIN 64u   /* smallest class, and the small alignment */
#define POOL_SMALL_MAX 2048u /* largest size served by slabs */

struct pool;

struct pool_params {
	size_t size;        /* region size in bytes, rounded up to pages */
	uint32_t max_bufs;  /* descriptor table size (0 = default) */
	const char *name;   /* memfd name, for /proc/self/fd and debugging */
	int prefault;       /* nonzero: touch every page at creation */
};

struct pool_stats {
	uint64_t size;            /* region size */
	uint64_t bytes_in_use;    /* sum of live block capacities */
	uint64_t bytes_requested; /* sum of live block lengths */
	uint64_t largest_free;    /* largest block the page allocator could give */
	uint64_t free_bytes;      /* bytes in free page runs (slab slack excluded) */
	uint64_t blocks_in_use;
	uint64_t allocs;          /* successful allocations since creation */
	uint64_t frees;
	uint64_t alloc_failures;  /* -ENOMEM returned */
	uint64_t bad_frees;       /* double frees, foreign or overlapping frees */
	double fragmentation;     /* 1 - largest_free / free_bytes (0 if none free) */
};

/*
 * The handle of a block. Public code sees it as the opaque struct ferry_buf
 * of api/ferry.h; this is its definition.
 */
struct ferry_buf;
typedef void pool_release_fn(struct ferry_buf *buf, void *ctx);

struct ferry_buf {
	struct pool *pool;
	void *data;        /* pool base + offset */
	uint64_t offset;   /* offset of the block in the region */
	uint64_t len;      /* length asked for (ferry_buf_len) */
	uint64_t cap;      /* capacity of the block */
	uint32_t index;    /* position in the descriptor table */
	_Atomic uint32_t state; /* POOL_BUF_FREE / POOL_BUF_LIVE */
	uint32_t next_free;     /* descriptor free list link */
	uint32_t flags;         /* POOL_BUF_F_* */
	pool_release_fn *release_fn; /* foreign handles: who takes the release */
	void *release_ctx;
	uint64_t remote_cookie;      /* foreign handles: the owner's name for it */
	struct ferry_buf *_Atomic release_next; /* foreign handles: release queue link */
	struct ferry_buf *share_root;  /* one of several handles of one block (pool_share):
					the root that holds the block; else NULL */
	_Atomic uint32_t share_refs;   /* a share root: live shared handles */
	uint64_t filled;               /* a share root with POOL_BUF_F_FILLING: see pool_filled */
	int32_t device;                /* POOL_BUF_F_DEVICE: the CUDA device ordinal of data */
	uint32_t slab, obj;            /* a small block: its slab and place there (pool.c) */
};

/* The handle names memory that is not this pool's (see pool_wrap). */
#define POOL_BUF_F_FOREIGN (1u << 0)
/*
 * A foreign handle freed with this set asks its owner to send the data
 * again (shm: its RELEASE says so; a CUDA IPC descriptor the receiver
 * could not open is then sent staged). Set only just before pool_free.
 */
#define POOL_BUF_F_RESEND (1u << 1)
/*
 * A share root whose block is still being filled while one of its handles
 * is already sent (pipelined staging of device memory: backends/cuda);
 * its filled says how far (pool_filled). Set and moved on by whoever
 * fills it, on the reactor's thread; read there.
 */
#define POOL_BUF_F_FILLING (1u << 2)
/*
 * A foreign handle whose data is CUDA device memory (another process's,
 * opened here by IPC: backends/cuda hands it out for a GET with
 * FERRY_SQE_DEVICE_BUF); device says which. The CPU never reads it.
 */
#define POOL_BUF_F_DEVICE (1u << 3)
#define POOL_FILL_FAILED UINT64_MAX
/*
 * A share root (POOL_BUF_ROOT) is the hidden handle that holds a shared
 * block while shared handles are live; it is neither free nor a buffer
 * anyone may free.
 */
/*
 * A cached handle (POOL_BUF_CACHED) was freed and waits, still pointing at
 * its block, in its size class's magazine for the next allocation of that
 * class (see "Magazines" above); it is not live, and freeing it is refused.
 */
enum { POOL_BUF_FREE = 0, POOL_BUF_LIVE = 0x11fe, POOL_BUF_ROOT = 0x5007, POOL_BUF_CACHED = 0xcac4 };

/*
 * How many bytes of buf, from its start, hold data: buf->len for every
 * block but a shared one still being filled (POOL_BUF_F_FILLING on its
 * root: the root's filled), or POOL_FILL_FAILED when that filling failed
 * (the rest of the data never comes). Reactor only.
 */
static inline uint64_t pool_filled(const struct ferry_buf *buf)
{
	const struct ferry_buf *r = buf->share_root;

	return r && (r->flags & POOL_BUF_F_FILLING) ? r->filled : buf->len;
}

/* Create a pool. Returns 0 and *out, or -EINVAL/-ENOMEM/-errno of memfd. */
int pool_create(const struct pool_params *p, struct pool **out);

/*
 * Drop the owner's reference. Live blocks keep the region mapped until they
 * are freed. Returns the number of blocks still live (>= 0).
 */
int64_t pool_release_owner(struct pool *pool);

/*
 * Allocate a block of at least len bytes (len may be 0: a zero-length
 * block still has a handle). Returns 0 and *out, or -ENOMEM when the region
 * or the descriptor table is exhausted, -EINVAL for a NULL argument.
 */
int pool_alloc(struct pool *pool, size_t len, struct ferry_buf **out);

/*
 * Free a block. Returns 0, or -EINVAL (logged, counted) for a handle that is
 * not live: a double free, a handle from nowhere, or one whose block is free.
 * Thread-safe; may unmap the region if this was the last reference.
 */
int pool_free(struct ferry_buf *buf);

/*
 * A handle for memory that is not a block of this pool: a peer's block
 * mapped read-only, for a zero-copy GET. remote_offset is kept in
 * buf->offset for the owner's sake. pool_free on it marks it free and calls
 * fn(buf, ctx) on the freeing thread (any thread); fn must later call
 * pool_wrap_done(buf) exactly once, which gives the handle back. The handle
 * holds a reference on the pool like a block does.
 * Returns 0 and *out, -ENOMEM when no handle is free, -EINVAL.
 */
int pool_wrap(struct pool *pool, void *data, uint64_t len, uint64_t remote_offset,
	      pool_release_fn *fn, void *ctx, struct ferry_buf **out);
void pool_wrap_done(struct ferry_buf *buf);

/*
 * Foreign handles released on any thread wait for their owner's progress
 * on a lock-free list through release_next: push buf onto *list (any
 * thread); the owner takes the whole list with an acquire exchange.
 */
static inline void pool_release_push(struct ferry_buf *_Atomic *list, struct ferry_buf *buf)
{
	struct ferry_buf *head = atomic_load_explicit(list, memory_order_relaxed);

	do {
		atomic_store_explicit(&buf->release_next, head, memory_order_relaxed);
	} while (!atomic_compare_exchange_weak_explicit(list, &head, buf, memory_order_release,
							memory_order_relaxed));
}
/* Drop a live foreign handle without running its hook (nobody saw it). */
void pool_wrap_cancel(struct ferry_buf *buf);

/*
 * Share a block: buf (a live block of this pool, not a foreign handle, not
 * already shared) becomes n handles of the same memory, out[0..n-1], each
 * freed on its own with pool_free; the block goes back to the pool when
 * the last of them is freed. buf itself is no longer the caller's (its
 * handle becomes the hidden root). n == 0 frees buf. Each handle has buf's
 * data and length. Returns 0, -EINVAL (logged: a handle that is not a live
 * own unshared block, NULL out with n > 0), -ENOMEM when the descriptor
 * table has not n free handles (buf is then untouched). Any thread.
 */
int pool_share(struct ferry_buf *buf, uint32_t n, struct ferry_buf **out);

/*
 * The lower level the handles sit on, exposed for transports that return
 * blocks by offset (a peer handing back what it read) and for tests.
 */
int pool_block_alloc(struct pool *pool, size_t len, uint64_t *offset, uint64_t *cap);
int pool_block_free(struct pool *pool, uint64_t offset);

void pool_get_stats(struct pool *pool, struct pool_stats *st);

void *pool_base(const struct pool *pool);
size_t pool_size(const struct pool *pool);
int pool_fd(const struct pool *pool);

/* Check every internal invariant (tests only). Returns 0 or -EFAULT. */
int pool_check(struct pool *pool);

#endif

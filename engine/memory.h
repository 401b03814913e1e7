/*
 * engine/memory.h - where payload bytes live, and the one way they are copied.
 *
 * Owns: the copy every payload byte ferry copies goes through
 * (ferry__payload_copy: host memory, memcpy), gathering a PUT's source and
 * scattering into a GET's destination whether they are an iovec or segments
 * of registered regions (FERRY_SQE_SEGS), the registered regions
 * themselves (engine/memory.c: ferry_region_register / release, pins while
 * an op names them), and the memory types of buffers. Device memory never
 * goes through these copies: an op with device segments (OP_F_DEVICE) has
 * its copies made by the memory domain (memory_device_put / _get).
 */
#ifndef FERRY_MEMORY_H
#define FERRY_MEMORY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "ferry.h"
#include "transport.h"

struct ferry_engine;
struct op;

struct ferry_region {
	struct ferry_engine *engine;
	void *addr;
	size_t len;
	enum ferry_mem_type mem;
	int device;
	_Atomic uint32_t pins;     /* ops in flight that name one of its segments */
	_Atomic int released;
	struct ferry_region *next; /* the engine's regions (under e->lock) */
	/* Each transport's registration of it (its mem_register; NULL: none). */
	void *reg[ENGINE_MAX_BACKENDS];
};

/* Transport b's registration of region r (what its mem_register gave), or NULL. */
static inline void *ferry__region_reg(const struct ferry_region *r, const struct backend *b)
{
	return r->reg[b->index];
}

/*
 * Transport b's registration of the memory under buf, and in *offset where
 * buf's bytes start in it: for a block of e's own pool. NULL for any other
 * buffer (a peer's block mapped here, another engine's pool), or when b
 * registers nothing: the transport then moves it as it moves unregistered
 * memory.
 */
void *ferry__buf_reg(struct ferry_engine *e, const struct backend *b, const struct ferry_buf *buf,
		     uint64_t *offset);

/*
 * Copy n bytes (a key, a small payload): up to 64 as two overlapping
 * unaligned moves of 1 to 32 bytes, longer by memcpy. A memcpy of a
 * variable length into a bounded buffer is otherwise expanded by gcc
 * (x86-64, generic tuning) into `rep movsq`, whose start-up costs more than
 * the copy of a short key, and a small payload's memcpy is a call. As for
 * memcpy, dst and src must not overlap (the second move may read what the
 * first wrote).
 */
static inline void copy_short(void *dst, const void *src, size_t n)
{
	char *d = (char *)dst;
	const char *s = (const char *)src;

	if (n <= 16) {
		if (n >= 8) {
			memcpy(d, s, 8);
			memcpy(d + n - 8, s + n - 8, 8);
		} else if (n >= 4) {
			memcpy(d, s, 4);
			memcpy(d + n - 4, s + n - 4, 4);
		} else if (n) {
			d[0] = s[0];
			d[n / 2] = s[n / 2];
			d[n - 1] = s[n - 1];
		}
	} else if (n <= 32) {
		memcpy(d, s, 16);
		memcpy(d + n - 16, s + n - 16, 16);
	} else if (n <= 64) {
		memcpy(d, s, 32);
		memcpy(d + n - 32, s + n - 32, 32);
	} else {
		memcpy(d, s, n);
	}
}

/* Every payload copy: dst and src are host memory (the one memory type moved now). */
static inline void ferry__payload_copy(void *dst, const void *src, size_t len)
{
	copy_short(dst, src, len);
}

static inline uint64_t iov_total(const struct iovec *iov, uint32_t n)
{
	uint64_t t = 0;

	for (uint32_t i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/*
 * Copy at most len bytes of iov[0..n) to dst, in order; returns the bytes
 * copied. A PUT passes op->len, summed at submission, so an iovec the
 * caller changed since cannot overrun dst.
 */
static inline uint64_t iov_gather(const struct iovec *iov, uint32_t n, void *dst, uint64_t len)
{
	char *p = dst;

	for (uint32_t i = 0; i < n && len; i++) {
		size_t c = iov[i].iov_len < len ? iov[i].iov_len : len;

		ferry__payload_copy(p, iov[i].iov_base, c);
		p += c;
		len -= c;
	}
	return (uint64_t)(p - (char *)dst);
}

/* Copy len bytes of src into iov[0..n), in order, as far as it holds. */
static inline void iov_scatter(const struct iovec *iov, uint32_t n, const void *src, uint64_t len)
{
	const char *s = src;

	for (uint32_t i = 0; i < n && len; i++) {
		uint64_t c = iov[i].iov_len < len ? iov[i].iov_len : len;

		ferry__payload_copy(iov[i].iov_base, s, c);
		s += c;
		len -= c;
	}
}

static inline uint64_t segs_total(const struct ferry_seg *seg, uint32_t n)
{
	uint64_t t = 0;

	for (uint32_t i = 0; i < n; i++)
		t += seg[i].len;
	return t;
}

static inline uint64_t segs_gather(const struct ferry_seg *seg, uint32_t n, void *dst, uint64_t len)
{
	char *p = dst;

	for (uint32_t i = 0; i < n && len; i++) {
		uint64_t c = seg[i].len < len ? seg[i].len : len;

		ferry__payload_copy(p, (const char *)seg[i].region->addr + seg[i].offset, c);
		p += c;
		len -= c;
	}
	return (uint64_t)(p - (char *)dst);
}

static inline void segs_scatter(const struct ferry_seg *seg, uint32_t n, const void *src,
				uint64_t len)
{
	const char *s = src;

	for (uint32_t i = 0; i < n && len; i++) {
		uint64_t c = seg[i].len < len ? seg[i].len : len;

		ferry__payload_copy((char *)seg[i].region->addr + seg[i].offset, s, c);
		s += c;
		len -= c;
	}
}

/*
 * An SQE's segments (FERRY_SQE_SEGS): each of a live region of e, within
 * it. 0 (host memory only) or 1 (some segment is CUDA device memory: the
 * memory domain must copy it), or -EINVAL (logged). On >= 0 every region
 * named is pinned (memory_unpin at the op's end).
 */
int memory_check_pin(struct ferry_engine *e, const struct ferry_sqe *sqe);
/*
 * An op with device segments (OP_F_DEVICE), handed to the memory domain
 * (struct backend_ops device_put / device_get, which say what 0 means),
 * and any GET of a CUDA IPC descriptor (wflags & WIRE_F_CUDA_IPC);
 * -EOPNOTSUPP without one. memory_device_get drops the GET's deadline
 * first (the data is here; the copy ends it). Reactor only.
 */
int memory_device_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe);
int memory_device_get(struct ferry_engine *e, struct op *op, struct ferry_buf *buf, uint64_t len,
		      uint32_t wflags);
/*
 * A CUDA IPC PUT whose receiver asked for the data again (reactor_put_restage),
 * or a PUT left in place (OP_F_DEVICE_DIRECT) whose peer is now reached by a
 * transport that does not read device memory: the domain's device_restage.
 * 0 or a negative errno (-EOPNOTSUPP without one).
 */
int memory_device_restage(struct ferry_engine *e, struct op *op);
/*
 * A dma-buf of the device memory [addr, addr + len) of device, for a
 * transport's mem_register to register it with a NIC (GPUDirect RDMA):
 * the domain's device_dmabuf (struct backend_ops says what it returns);
 * -EOPNOTSUPP without one. *fd is -1 on an error. Any thread.
 */
int memory_device_dmabuf(struct ferry_engine *e, void *addr, size_t len, int device, int *fd,
			 uint64_t *offset, const char **why);
/*
 * The allocation holding device memory addr (the domain's device_allocation:
 * base, size, an id never given twice); -EOPNOTSUPP without one. Any thread.
 */
int memory_device_allocation(struct ferry_engine *e, void *addr, int device, uint64_t *base,
			     uint64_t *size, uint64_t *id);
/*
 * op_complete of a PUT handed on while its block is filled (OP_F_FILLING):
 * true when the domain's copies still read its device memory (the domain
 * completes it with res and len when they end: device_defer); false: it
 * ends now (the flag is cleared). Reactor only.
 */
bool memory_device_defer(struct ferry_engine *e, struct op *op, int res, uint64_t len);
/* The op's end: its segments' regions are unpinned. */
void memory_unpin(const struct ferry_seg *seg, uint32_t n);
/*
 * Device copies out of host memory that a transport mapped from another
 * process (a peer's pool, mapped read-only by shm) run at pinned speed only
 * when that mapping is pinned in this process too (only this process's own
 * pool is pinned by the memory domain). memory_dma_source (reactor): a
 * device copy is about to read buf; each transport with a dma_source hook
 * is told, and the one whose mapping holds buf pins that mapping, once.
 * memory_dma_pin / memory_dma_unpin: the pin, process-wide (through the
 * process's one CUDA runtime; a pin outlives engines: whoever unmaps the
 * memory unpins it first, from any thread). memory_dma_pin: 0; -ENODEV when
 * this process has not loaded a CUDA runtime (it never loads one); -EIO
 * when the runtime refuses (*why says how).
 */
void memory_dma_source(struct ferry_engine *e, struct ferry_buf *buf);
int memory_dma_pin(const void *addr, size_t len, const char **why);
void memory_dma_unpin(const void *addr);

/*
 * Transport b is up (after its init): its mem_register, if it has one, is
 * given the engine's pool. 0 or its error (logged).
 */
int memory_transport_up(struct ferry_engine *e, struct backend *b);
/*
 * Transport b is about to stop (before its fini; the engine is being
 * destroyed): every handle it registered, the pool's and the regions',
 * goes back to its mem_deregister. Once only: a second call does nothing.
 */
void memory_transport_down(struct ferry_engine *e, struct backend *b);
/* At engine destroy: every region left is released. */
void memory_fini(struct ferry_engine *e);

#endif

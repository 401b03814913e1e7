/*
 * pool/pool.c - the registered memory pool (see pool.h for the design).
 *
 * Owns: the memfd-backed region and its mapping; the page allocator (runs of
 * 4 KiB pages, segregated free lists, out-of-band boundary tags); the slabs
 * that carve pages into 64 B .. 2 KiB objects and the magazines that keep a
 * few freed ones per class with their handles; the descriptor table of
 * struct ferry_buf with its lock-free free list; the pool's reference count,
 * stats and self-check; and the process-wide registry of descriptor tables
 * that lets pool_free() recognise a handle from nowhere without touching it.
 *
 * Locking: one spinlock per size class (C11 atomics, so sanitizers see it),
 * one mutex for the page allocator.
 * Order: class lock before page lock; never two class locks, except
 * pool_check() which takes them all in index order. Handles need no lock.
 *
 * Metadata: all of it lives outside the region (calloc'ed at creation and
 * faulted in then). The only allocation after creation is the per-slab array
 * of requested lengths, made once the first time a slab descriptor is used.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ck_pr.h>

#include "log.h"
#include "pool.h"

#define POOL_PAGE_SHIFT 12
#define POOL_NCLASSES 6			/* 64, 128, ..., 2048 */
#define POOL_SLAB_PAGES 16		/* 64 KiB per slab (fewer in tiny pools) */
#define POOL_SLAB_MAX_OBJS (POOL_SLAB_PAGES * POOL_PAGE_SIZE / POOL_SMALL_MIN)
#define POOL_SLAB_WORDS (POOL_SLAB_MAX_OBJS / 64)
#define POOL_NBINS 32			/* bin b: runs of [2^b, 2^(b+1)) pages */
#define POOL_NONE UINT32_MAX
#define POOL_MAX_SIZE (1ull << 40)	/* 1 TiB: anything larger is refused */
#define POOL_MAX_BUFS (1u << 24)
#define POOL_DEFAULT_BUFS 65536u
#define POOL_REGISTRY_MAX 1024		/* live pools per process */
#define POOL_MAG_DEPTH 16		/* freed small blocks a class keeps with their handles */
#define POOL_LEN_CACHED UINT16_MAX	/* a slab object's lens: kept in its class's magazine */

/* Page tag flags: only the first and last page of a run carry any. */
#define TAG_HEAD 1u
#define TAG_TAIL 2u
#define TAG_USED 4u
#define TAG_SLAB 8u			/* head of a run that is a slab */

struct pool_tag {
	uint32_t npages;		/* run length, at head and tail */
	uint32_t flags;
	union {
		struct {
			uint32_t prev, next;
		} link;			/* free run head: bin list */
		uint64_t len;		/* used large run head: length asked for */
	} u;
};

struct pool_slab {
	uint32_t page;			/* first page of the run */
	_Atomic uint32_t cls;		/* class index, POOL_NONE when not carved */
	uint32_t nfree;
	uint32_t prev, next;		/* class list, or (next) the spare stack */
	uint32_t hint;			/* every map word below is full */
	bool listed;			/* on its class list (nfree > 0) */
	uint16_t *lens;			/* length asked for, per object */
	uint64_t map[POOL_SLAB_WORDS];	/* live objects */
};

struct pool_class {
	atomic_bool lock;		/* test-and-test-and-set spinlock */
	_Atomic uint32_t mag_n;		/* entries in mag (written under the lock) */
	uint32_t size;
	uint32_t nobjs;			/* objects per slab */
	uint32_t head, tail;		/* slabs with a free object, empty ones last */
	uint32_t nslabs;
	uint32_t nempty;		/* at most one: the cached empty slab */
	uint64_t live;
	uint64_t bytes_req;
	uint64_t allocs, frees;
	uint32_t mag[POOL_MAG_DEPTH];	/* handles of kept blocks (POOL_BUF_CACHED) */
} __attribute__((aligned(64)));

struct pool {
	_Atomic int64_t refs;		/* 1 (owner) + live blocks */
	atomic_int owner_gone;
	int fd;
	uint8_t *base;
	size_t size;
	uint32_t npages;
	uint32_t slab_pages;
	uint32_t nslabs_max;
	uint32_t reg_slot;
	char name[64];

	struct ferry_buf *bufs;
	uint32_t max_bufs;
	_Atomic uint64_t buf_top __attribute__((aligned(64))); /* ABA tag << 32 | index */

	struct pool_class cls[POOL_NCLASSES];

	/* Page allocator, under page_lock (page_slab is also read without it). */
	pthread_mutex_t page_lock __attribute__((aligned(64)));
	struct pool_tag *tags;		/* one per page */
	_Atomic uint32_t *page_slab;	/* one per page: slab index + 1, or 0 */
	struct pool_slab *slabs;	/* one per possible slab (class lock once carved) */
	uint32_t slab_spare;		/* stack of unused slab descriptors */
	uint32_t bin_map;		/* bit b: bin b not empty */
	uint32_t bin_head[POOL_NBINS];
	uint64_t free_pages;
	uint64_t large_live, large_pages, large_bytes_req, large_allocs, large_frees;

	/* Bumped outside every lock. */
	_Atomic uint64_t alloc_failures;
	_Atomic uint64_t bad_frees;
};

/*
 * The registry of live descriptor tables, so that pool_free() can tell a
 * foreign pointer by its address alone. The one piece of global state.
 */
struct pool_reg {
	_Atomic uintptr_t lo, hi;
	struct pool *_Atomic pool;
};

static struct pool_reg pool_registry[POOL_REGISTRY_MAX];
static _Atomic uint32_t pool_registry_hwm;

static inline unsigned int floor_log2(uint32_t n)
{
	return 31u - (unsigned int)__builtin_clz(n);
}

static inline unsigned int ceil_log2(uint32_t n)
{
	return n <= 1 ? 0 : 32u - (unsigned int)__builtin_clz(n - 1);
}

static inline uint64_t page_off(uint32_t page)
{
	return (uint64_t)page << POOL_PAGE_SHIFT;
}

/* ------------------------------------------------------------------ */
/* Locks                                                               */
/* ------------------------------------------------------------------ */

static void __attribute__((noinline)) class_lock_slow(struct pool_class *c)
{
	unsigned int spins = 0;

	while (atomic_exchange_explicit(&c->lock, true, memory_order_acquire)) {
		while (atomic_load_explicit(&c->lock, memory_order_relaxed)) {
			if (++spins < 256) {
				ck_pr_stall();
			} else {
				sched_yield(); /* the holder may be off-CPU */
				spins = 0;
			}
		}
	}
}

/* Taken at once when free (the common case, inline); else spun for. */
static inline void class_lock(struct pool_class *c)
{
	if (__builtin_expect(atomic_exchange_explicit(&c->lock, true, memory_order_acquire), 0))
		class_lock_slow(c);
}

static void class_unlock(struct pool_class *c)
{
	atomic_store_explicit(&c->lock, false, memory_order_release);
}

static void page_lock(struct pool *p)
{
	pthread_mutex_lock(&p->page_lock);
}

static void page_unlock(struct pool *p)
{
	pthread_mutex_unlock(&p->page_lock);
}

/* ------------------------------------------------------------------ */
/* Page allocator (page_lock held)                                     */
/* ------------------------------------------------------------------ */

static void run_set(struct pool *p, uint32_t h, uint32_t n, uint32_t state)
{
	struct pool_tag *head = &p->tags[h], *tail = &p->tags[h + n - 1];

	head->npages = n;
	head->flags = TAG_HEAD | state | (n == 1 ? TAG_TAIL : 0);
	if (n > 1) {
		tail->npages = n;
		tail->flags = TAG_TAIL | state;
	}
}

static void run_clear(struct pool *p, uint32_t h, uint32_t n)
{
	memset(&p->tags[h], 0, sizeof(p->tags[h]));
	memset(&p->tags[h + n - 1], 0, sizeof(p->tags[h]));
}

static void bin_insert(struct pool *p, uint32_t h)
{
	unsigned int b = floor_log2(p->tags[h].npages);
	uint32_t first = p->bin_head[b];

	p->tags[h].u.link.prev = POOL_NONE;
	p->tags[h].u.link.next = first;
	if (first != POOL_NONE)
		p->tags[first].u.link.prev = h;
	p->bin_head[b] = h;
	p->bin_map |= 1u << b;
}

static void bin_remove(struct pool *p, uint32_t h)
{
	unsigned int b = floor_log2(p->tags[h].npages);
	uint32_t prev = p->tags[h].u.link.prev, next = p->tags[h].u.link.next;

	if (prev != POOL_NONE)
		p->tags[prev].u.link.next = next;
	else
		p->bin_head[b] = next;
	if (next != POOL_NONE)
		p->tags[next].u.link.prev = prev;
	if (p->bin_head[b] == POOL_NONE)
		p->bin_map &= ~(1u << b);
}

/*
 * Take a run of n pages. Good fit in O(1): the first non-empty bin whose
 * every run is >= n. Only when that fails (the pool is about to say
 * -ENOMEM) is the bin holding n itself searched, so a fit is never missed.
 */
static uint32_t page_alloc_locked(struct pool *p, uint32_t n)
{
	unsigned int need = ceil_log2(n), fb = floor_log2(n);
	uint32_t h = POOL_NONE, total;

	if (need < POOL_NBINS) {
		uint32_t m = p->bin_map & ~((1u << need) - 1);

		if (m)
			h = p->bin_head[__builtin_ctz(m)];
	}
	if (h == POOL_NONE && fb != need) {
		for (h = p->bin_head[fb]; h != POOL_NONE; h = p->tags[h].u.link.next)
			if (p->tags[h].npages >= n)
				break;
	}
	if (h == POOL_NONE)
		return POOL_NONE;

	total = p->tags[h].npages;
	bin_remove(p, h);
	if (total > n) {
		run_set(p, h + n, total - n, 0);
		bin_insert(p, h + n);
	}
	run_set(p, h, n, TAG_USED);
	p->free_pages -= n;
	return h;
}

/* Give back the used run at h, merging with free neighbours in O(1). */
static void page_free_locked(struct pool *p, uint32_t h)
{
	uint32_t n = p->tags[h].npages, start = h, cnt = n;

	run_clear(p, h, n);
	if (h > 0 && (p->tags[h - 1].flags & (TAG_TAIL | TAG_USED)) == TAG_TAIL) {
		uint32_t ln = p->tags[h - 1].npages, lh = h - ln;

		bin_remove(p, lh);
		run_clear(p, lh, ln);
		start = lh;
		cnt += ln;
	}
	if (h + n < p->npages &&
	    (p->tags[h + n].flags & (TAG_HEAD | TAG_USED)) == TAG_HEAD) {
		uint32_t rh = h + n, rn = p->tags[rh].npages;

		bin_remove(p, rh);
		run_clear(p, rh, rn);
		cnt += rn;
	}
	run_set(p, start, cnt, 0);
	bin_insert(p, start);
	p->free_pages += n;
}

static uint64_t largest_free_locked(struct pool *p)
{
	uint32_t best = 0, h;

	if (!p->bin_map)
		return 0;
	for (h = p->bin_head[floor_log2(p->bin_map)]; h != POOL_NONE;
	     h = p->tags[h].u.link.next)
		if (p->tags[h].npages > best)
			best = p->tags[h].npages;
	return page_off(best);
}

/* ------------------------------------------------------------------ */
/* Slabs (class lock held)                                             */
/* ------------------------------------------------------------------ */

static unsigned int class_index(size_t len)
{
	return len <= POOL_SMALL_MIN ? 0 : ceil_log2((uint32_t)len) - 6;
}

static void class_link(struct pool *p, struct pool_class *c, uint32_t si, bool at_tail)
{
	struct pool_slab *s = &p->slabs[si];

	if (at_tail) {
		s->next = POOL_NONE;
		s->prev = c->tail;
		if (c->tail != POOL_NONE)
			p->slabs[c->tail].next = si;
		else
			c->head = si;
		c->tail = si;
	} else {
		s->prev = POOL_NONE;
		s->next = c->head;
		if (c->head != POOL_NONE)
			p->slabs[c->head].prev = si;
		else
			c->tail = si;
		c->head = si;
	}
	s->listed = true;
}

static void class_unlink(struct pool *p, struct pool_class *c, uint32_t si)
{
	struct pool_slab *s = &p->slabs[si];

	if (s->prev != POOL_NONE)
		p->slabs[s->prev].next = s->next;
	else
		c->head = s->next;
	if (s->next != POOL_NONE)
		p->slabs[s->next].prev = s->prev;
	else
		c->tail = s->prev;
	s->prev = s->next = POOL_NONE;
	s->listed = false;
}

/* Carve a new (empty) slab for class ci and put it first on the list. */
static int slab_carve(struct pool *p, unsigned int ci)
{
	struct pool_class *c = &p->cls[ci];
	struct pool_slab *s;
	uint32_t h, si, i;

	page_lock(p);
	h = page_alloc_locked(p, p->slab_pages);
	if (h == POOL_NONE) {
		page_unlock(p);
		return -ENOMEM;
	}
	si = p->slab_spare;
	s = si == POOL_NONE ? NULL : &p->slabs[si];
	if (s && !s->lens)
		s->lens = malloc(POOL_SLAB_MAX_OBJS * sizeof(*s->lens));
	if (!s || !s->lens) {
		page_free_locked(p, h);
		page_unlock(p);
		return -ENOMEM;
	}
	p->slab_spare = s->next;
	p->tags[h].flags |= TAG_SLAB;
	s->page = h;
	s->nfree = c->nobjs;
	s->hint = 0;
	memset(s->map, 0, sizeof(s->map));
	atomic_store_explicit(&s->cls, ci, memory_order_release);
	for (i = 0; i < p->slab_pages; i++)
		atomic_store_explicit(&p->page_slab[h + i], si + 1, memory_order_release);
	page_unlock(p);

	c->nslabs++;
	c->nempty++;
	class_link(p, c, si, false);
	return 0;
}

/* Give an empty slab back to the page allocator. */
static void slab_release(struct pool *p, unsigned int ci, uint32_t si)
{
	struct pool_class *c = &p->cls[ci];
	struct pool_slab *s = &p->slabs[si];
	uint32_t i;

	if (s->listed)
		class_unlink(p, c, si);
	c->nslabs--;
	c->nempty--;
	page_lock(p);
	for (i = 0; i < p->slab_pages; i++)
		atomic_store_explicit(&p->page_slab[s->page + i], 0, memory_order_release);
	p->tags[s->page].flags &= ~TAG_SLAB;
	page_free_locked(p, s->page);
	atomic_store_explicit(&s->cls, POOL_NONE, memory_order_release);
	s->next = p->slab_spare;
	p->slab_spare = si;
	page_unlock(p);
}

static uint32_t slab_take(struct pool_slab *s, uint32_t nobjs)
{
	uint32_t words = (nobjs + 63) / 64, w;

	for (w = s->hint; w < words; w++) {
		uint64_t avail = ~s->map[w];

		if (w == words - 1 && (nobjs & 63))
			avail &= (1ull << (nobjs & 63)) - 1;
		if (avail) {
			unsigned int b = (unsigned int)__builtin_ctzll(avail);

			s->map[w] |= 1ull << b;
			s->hint = w;
			return w * 64 + b;
		}
	}
	return POOL_NONE;
}

static unsigned int mag_flush(struct pool *p, bool all);

/*
 * Return every cached empty slab to the page allocator (no lock held).
 * Used only on the way to -ENOMEM. Returns how many went back.
 */
static unsigned int reclaim_empty_slabs(struct pool *p)
{
	unsigned int ci, n = 0;

	for (ci = 0; ci < POOL_NCLASSES; ci++) {
		struct pool_class *c = &p->cls[ci];
		uint32_t si, prev;

		class_lock(c);
		for (si = c->tail; si != POOL_NONE && c->nempty; si = prev) {
			prev = p->slabs[si].prev;
			if (p->slabs[si].nfree == c->nobjs) {
				slab_release(p, ci, si);
				n++;
			}
		}
		class_unlock(c);
	}
	return n;
}

/*
 * On the way to -ENOMEM: the magazines first (what they give back may
 * empty a slab), then the empty slabs. Returns whether anything came back.
 */
static bool reclaim(struct pool *p)
{
	unsigned int kept = mag_flush(p, false);

	return reclaim_empty_slabs(p) + kept != 0;
}

static int small_alloc(struct pool *p, size_t len, uint64_t *off, uint64_t *cap)
{
	unsigned int ci = class_index(len);
	struct pool_class *c = &p->cls[ci];
	bool reclaimed = false;
	struct pool_slab *s;
	uint32_t si, idx;

	class_lock(c);
	while ((si = c->head) == POOL_NONE) {
		if (slab_carve(p, ci) == 0)
			continue;
		class_unlock(c);
		if (reclaimed || !reclaim(p))
			return -ENOMEM;
		reclaimed = true;
		class_lock(c);
	}
	s = &p->slabs[si];
	if (s->nfree == c->nobjs)
		c->nempty--;
	idx = slab_take(s, c->nobjs);
	if (--s->nfree == 0)
		class_unlink(p, c, si);
	s->lens[idx] = (uint16_t)len;
	c->live++;
	c->bytes_req += len;
	c->allocs++;
	*off = page_off(s->page) + (uint64_t)idx * c->size;
	*cap = c->size;
	class_unlock(c);
	return 0;
}

/*
 * Give object idx (map word w, bit) of slab si back to its slab, the class
 * lock held: the bitmap, the slab's free count and its place on the class
 * list; the caller has done the class's counters.
 */
static void slab_put_locked(struct pool *p, unsigned int ci, uint32_t si, uint32_t w, uint64_t bit)
{
	struct pool_class *c = &p->cls[ci];
	struct pool_slab *s = &p->slabs[si];
	bool was_full;

	s->map[w] &= ~bit;
	if (w < s->hint)
		s->hint = w;
	was_full = s->nfree++ == 0;
	if (s->nfree == c->nobjs) {
		c->nempty++;
		if (c->nempty > 1) {
			slab_release(p, ci, si);
		} else if (!s->listed || c->tail != si) {
			/* To the tail (already there: a block taken and freed in turn). */
			if (s->listed)
				class_unlink(p, c, si);
			class_link(p, c, si, true);
		}
	} else if (was_full) {
		class_link(p, c, si, false);
	}
}

/*
 * The live object at off, in the slab its page says: its class (locked on
 * return 0), slab and index. -EAGAIN: the slab changed, look again;
 * -EINVAL: off is not a live object (free, kept in the magazine, or not the
 * start of one). Locks nothing on an error.
 */
static int small_find_locked(struct pool *p, uint64_t off, unsigned int *cip, uint32_t *sip,
			     uint32_t *idxp)
{
	uint32_t page = (uint32_t)(off >> POOL_PAGE_SHIFT), si1, idx;
	struct pool_class *c;
	struct pool_slab *s;
	unsigned int ci;
	uint64_t rel;

	si1 = atomic_load_explicit(&p->page_slab[page], memory_order_acquire);
	if (!si1)
		return -EAGAIN;
	s = &p->slabs[si1 - 1];
	ci = atomic_load_explicit(&s->cls, memory_order_acquire);
	if (ci >= POOL_NCLASSES)
		return -EAGAIN;
	c = &p->cls[ci];
	class_lock(c);
	if (atomic_load_explicit(&p->page_slab[page], memory_order_acquire) != si1 ||
	    atomic_load_explicit(&s->cls, memory_order_relaxed) != ci) {
		class_unlock(c);
		return -EAGAIN;
	}
	rel = off - page_off(s->page);
	idx = (uint32_t)(rel / c->size);
	if (rel % c->size || idx >= c->nobjs || !(s->map[idx / 64] & (1ull << (idx % 64))) ||
	    s->lens[idx] == POOL_LEN_CACHED) {
		class_unlock(c);
		return -EINVAL;
	}
	*cip = ci;
	*sip = si1 - 1;
	*idxp = idx;
	return 0;
}

/* Free the object at off in slab si; -EAGAIN: the slab changed, look again. */
static int small_free(struct pool *p, uint64_t off, uint64_t *cap, uint64_t *len)
{
	struct pool_class *c;
	unsigned int ci;
	uint32_t si, idx;
	int err = small_find_locked(p, off, &ci, &si, &idx);

	if (err)
		return err;
	c = &p->cls[ci];
	*cap = c->size;
	*len = p->slabs[si].lens[idx];
	c->live--;
	c->bytes_req -= *len;
	c->frees++;
	slab_put_locked(p, ci, si, idx / 64, 1ull << (idx % 64));
	class_unlock(c);
	return 0;
}

/* ------------------------------------------------------------------ */
/* The magazines                                                       */
/* ------------------------------------------------------------------ */

/*
 * Each size class keeps up to POOL_MAG_DEPTH freed blocks with their
 * handles, under its own lock: the next pool_alloc of the class takes one
 * back (a handle already pointing at its block) instead of a descriptor
 * from the lock-free list, a slab bit and a pool reference. A kept block
 * is not in use: the class's counters (stats, pool_check) leave it out, its
 * handle's state is POOL_BUF_CACHED (so a second free is refused) and its
 * slab says so in lens (so a free by offset is refused), but it keeps its
 * bit and its pool reference until the magazine gives it back: when the
 * owner goes (pool_release_owner), and on the way to -ENOMEM for a block
 * or a handle. Only plain blocks go in (not shared, not foreign, no flags).
 */

/* A kept block of len's class made live again, or NULL. */
static struct ferry_buf *mag_take(struct pool *p, size_t len)
{
	struct pool_class *c = &p->cls[class_index(len)];
	struct ferry_buf *b;
	uint32_t n;

	if (!atomic_load_explicit(&c->mag_n, memory_order_relaxed))
		return NULL;
	class_lock(c);
	n = atomic_load_explicit(&c->mag_n, memory_order_relaxed);
	if (!n) {
		class_unlock(c);
		return NULL;
	}
	b = &p->bufs[c->mag[n - 1]];
	atomic_store_explicit(&c->mag_n, n - 1, memory_order_relaxed);
	p->slabs[b->slab].lens[b->obj] = (uint16_t)len;
	c->live++;
	c->bytes_req += len;
	c->allocs++;
	class_unlock(c);
	b->len = len;
	atomic_store_explicit(&b->state, POOL_BUF_LIVE, memory_order_release);
	return b;
}

/*
 * Keep buf (a plain small block, just taken from LIVE) in its class's
 * magazine; false: full, the owner is gone, or the handle's block is not a
 * live object of its slab (block_free then says why). The handle says
 * where its block is (slab, obj: set at pool_alloc), checked here against
 * the slab under the class lock.
 */
static bool mag_put(struct pool *p, struct ferry_buf *buf)
{
	unsigned int ci = (unsigned int)__builtin_ctzll(buf->cap) - 6; /* cap: 64 .. 2048 */
	struct pool_class *c;
	struct pool_slab *s;
	uint32_t n, obj = buf->obj;

	if (buf->slab >= p->nslabs_max || ci >= POOL_NCLASSES)
		return false;
	c = &p->cls[ci];
	s = &p->slabs[buf->slab];
	class_lock(c);
	n = atomic_load_explicit(&c->mag_n, memory_order_relaxed);
	if (n == POOL_MAG_DEPTH || atomic_load_explicit(&p->owner_gone, memory_order_relaxed) ||
	    atomic_load_explicit(&s->cls, memory_order_relaxed) != ci || obj >= c->nobjs ||
	    page_off(s->page) + (uint64_t)obj * c->size != buf->offset ||
	    !(s->map[obj / 64] & (1ull << (obj % 64))) || s->lens[obj] == POOL_LEN_CACHED) {
		class_unlock(c);
		return false;
	}
	c->live--;
	c->bytes_req -= s->lens[obj];
	c->frees++;
	s->lens[obj] = POOL_LEN_CACHED;
	c->mag[n] = buf->index;
	atomic_store_explicit(&buf->state, POOL_BUF_CACHED, memory_order_relaxed);
	atomic_store_explicit(&c->mag_n, n + 1, memory_order_relaxed);
	class_unlock(c);
	return true;
}

static void buf_push(struct pool *p, uint32_t idx);
static void pool_put(struct pool *p);

/*
 * Give every kept block back to its slab, its handle to the free list and
 * its reference to the pool. Returns how many. all: every class's lock is
 * taken, also where the magazine looks empty (pool_release_owner: a
 * mag_put that read owner_gone as 0 under the lock has finished by then,
 * so nothing is kept after this); otherwise an empty-looking magazine is
 * skipped. The references are dropped last, when nothing of the pool is
 * touched any more (the last one may destroy it).
 */
static unsigned int mag_flush(struct pool *p, bool all)
{
	uint32_t bufs[POOL_MAG_DEPTH * POOL_NCLASSES];
	unsigned int ci, i, n, total = 0;

	for (ci = 0; ci < POOL_NCLASSES; ci++) {
		struct pool_class *c = &p->cls[ci];

		if (!all && !atomic_load_explicit(&c->mag_n, memory_order_relaxed))
			continue;
		class_lock(c);
		n = atomic_load_explicit(&c->mag_n, memory_order_relaxed);
		for (i = 0; i < n; i++) {
			const struct ferry_buf *b = &p->bufs[c->mag[i]];

			p->slabs[b->slab].lens[b->obj] = 0;
			slab_put_locked(p, ci, b->slab, b->obj / 64, 1ull << (b->obj % 64));
			bufs[total++] = c->mag[i];
		}
		atomic_store_explicit(&c->mag_n, 0, memory_order_relaxed);
		class_unlock(c);
	}
	for (i = 0; i < total; i++) {
		atomic_store_explicit(&p->bufs[bufs[i]].state, POOL_BUF_FREE, memory_order_release);
		buf_push(p, bufs[i]);
	}
	for (i = 0; i < total; i++)
		pool_put(p);
	return total;
}

/* ------------------------------------------------------------------ */
/* Blocks                                                              */
/* ------------------------------------------------------------------ */

static int large_alloc(struct pool *p, size_t len, uint64_t *off, uint64_t *cap)
{
	uint32_t n = (uint32_t)((len + POOL_PAGE_SIZE - 1) >> POOL_PAGE_SHIFT), h;
	bool reclaimed = false;

	for (;;) {
		page_lock(p);
		h = page_alloc_locked(p, n);
		if (h != POOL_NONE)
			break;
		page_unlock(p);
		if (reclaimed || !reclaim(p))
			return -ENOMEM;
		reclaimed = true;
	}
	p->tags[h].u.len = len;
	p->large_live++;
	p->large_pages += n;
	p->large_bytes_req += len;
	p->large_allocs++;
	page_unlock(p);
	*off = page_off(h);
	*cap = page_off(n);
	return 0;
}

/* -EAGAIN: the page became part of a slab meanwhile, look again. */
static int large_free(struct pool *p, uint32_t page, uint64_t off, uint64_t *cap,
		      uint64_t *len)
{
	struct pool_tag *t = &p->tags[page];

	if (off & (POOL_PAGE_SIZE - 1))
		return -EINVAL;
	page_lock(p);
	if (atomic_load_explicit(&p->page_slab[page], memory_order_relaxed)) {
		page_unlock(p);
		return -EAGAIN;
	}
	if ((t->flags & (TAG_HEAD | TAG_USED | TAG_SLAB)) != (TAG_HEAD | TAG_USED)) {
		page_unlock(p);
		return -EINVAL;
	}
	*cap = page_off(t->npages);
	*len = t->u.len;
	p->large_live--;
	p->large_pages -= t->npages;
	p->large_bytes_req -= t->u.len;
	p->large_frees++;
	page_free_locked(p, page);
	page_unlock(p);
	return 0;
}

static int block_alloc(struct pool *p, size_t len, uint64_t *off, uint64_t *cap)
{
	int err;

	if (len > p->size)
		err = -ENOMEM;
	else if (len <= POOL_SMALL_MAX)
		err = small_alloc(p, len, off, cap);
	else
		err = large_alloc(p, len, off, cap);
	if (err) {
		atomic_fetch_add_explicit(&p->alloc_failures, 1, memory_order_relaxed);
		log_limited(FERRY__LOG_WARN, "pool %s: no room for a block of %zu bytes",
			    p->name, len);
		return err;
	}
	atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
	return 0;
}

/* Free the block at off; does not drop its reference. Logs and counts errors. */
static int block_free(struct pool *p, uint64_t off)
{
	uint64_t cap, len;
	uint32_t page;
	int err;

	if (off >= p->size) {
		err = -EINVAL;
		goto bad;
	}
	page = (uint32_t)(off >> POOL_PAGE_SHIFT);
	do {
		if (atomic_load_explicit(&p->page_slab[page], memory_order_acquire))
			err = small_free(p, off, &cap, &len);
		else
			err = large_free(p, page, off, &cap, &len);
	} while (err == -EAGAIN);
	if (!err)
		return 0;
bad:
	atomic_fetch_add_explicit(&p->bad_frees, 1, memory_order_relaxed);
	log_error("pool %s: free of offset %#llx that is not a live block "
		  "(double free, or not the start of a block)",
		  p->name, (unsigned long long)off);
	return err;
}

/* ------------------------------------------------------------------ */
/* Lifetime                                                            */
/* ------------------------------------------------------------------ */

static void *meta_calloc(size_t n, size_t size)
{
	uint8_t *m = calloc(n ? n : 1, size);
	size_t i;

	/* Fault the metadata in now, not on the first alloc/free that needs it. */
	if (m)
		for (i = 0; i < n * size; i += POOL_PAGE_SIZE)
			((volatile uint8_t *)m)[i] = 0;
	return m;
}

static void registry_remove(struct pool *p)
{
	struct pool_reg *r;

	if (p->reg_slot == POOL_NONE)
		return;
	r = &pool_registry[p->reg_slot];
	atomic_store_explicit(&r->lo, 0, memory_order_release);
	atomic_store_explicit(&r->hi, 0, memory_order_release);
	atomic_store_explicit(&r->pool, NULL, memory_order_release);
	p->reg_slot = POOL_NONE;
}

static int registry_add(struct pool *p)
{
	uint32_t i, hwm;

	for (i = 0; i < POOL_REGISTRY_MAX; i++) {
		struct pool_reg *r = &pool_registry[i];
		struct pool *none = NULL;

		if (!atomic_compare_exchange_strong(&r->pool, &none, p))
			continue;
		atomic_store_explicit(&r->hi, (uintptr_t)(p->bufs + p->max_bufs),
				      memory_order_relaxed);
		atomic_store_explicit(&r->lo, (uintptr_t)p->bufs, memory_order_release);
		p->reg_slot = i;
		hwm = atomic_load(&pool_registry_hwm);
		while (hwm < i + 1 &&
		       !atomic_compare_exchange_weak(&pool_registry_hwm, &hwm, i + 1))
			;
		return 0;
	}
	return -ENOMEM;
}

/*
 * The pool whose descriptor table holds b, found without dereferencing b;
 * *aligned says whether b is the start of a descriptor.
 */
static struct pool *registry_lookup(const struct ferry_buf *b, bool *aligned)
{
	uint32_t i, hwm = atomic_load_explicit(&pool_registry_hwm, memory_order_acquire);
	uintptr_t a = (uintptr_t)b;

	for (i = 0; i < hwm; i++) {
		struct pool_reg *r = &pool_registry[i];
		uintptr_t lo = atomic_load_explicit(&r->lo, memory_order_acquire);

		if (!lo || a < lo)
			continue;
		if (a >= atomic_load_explicit(&r->hi, memory_order_relaxed))
			continue;
		*aligned = (a - lo) % sizeof(struct ferry_buf) == 0;
		return atomic_load_explicit(&r->pool, memory_order_relaxed);
	}
	return NULL;
}

static void pool_destroy(struct pool *p)
{
	uint32_t i;

	registry_remove(p);
	if (p->base)
		munmap(p->base, p->size);
	if (p->fd >= 0)
		close(p->fd);
	if (p->slabs)
		for (i = 0; i < p->nslabs_max; i++)
			free(p->slabs[i].lens);
	free(p->slabs);
	free(p->tags);
	free(p->page_slab);
	free(p->bufs);
	pthread_mutex_destroy(&p->page_lock);
	free(p);
}

static void pool_put(struct pool *p)
{
	if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
		pool_destroy(p);
}

int pool_create(const struct pool_params *prm, struct pool **out)
{
	const char *name;
	struct pool *p;
	uint32_t i;
	size_t size;
	int err;

	if (!prm || !out) {
		log_error("pool_create: NULL %s", prm ? "out" : "params");
		return -EINVAL;
	}
	if (prm->size == 0 || prm->size > POOL_MAX_SIZE) {
		log_error("pool_create: size %zu out of range (1 B .. 1 TiB)", prm->size);
		return -EINVAL;
	}
	if (prm->max_bufs > POOL_MAX_BUFS) {
		log_error("pool_create: max_bufs %u above %u", prm->max_bufs,
			  POOL_MAX_BUFS);
		return -EINVAL;
	}
	size = (prm->size + POOL_PAGE_SIZE - 1) & ~(size_t)(POOL_PAGE_SIZE - 1);
	name = prm->name ? prm->name : "ferry-pool";

	p = aligned_alloc(64, (sizeof(*p) + 63) & ~(size_t)63);
	if (!p) {
		log_error("pool_create: out of memory");
		return -ENOMEM;
	}
	memset(p, 0, sizeof(*p));
	p->fd = -1;
	p->reg_slot = POOL_NONE;
	p->size = size;
	p->npages = (uint32_t)(size >> POOL_PAGE_SHIFT);
	snprintf(p->name, sizeof(p->name), "%s", name);
	pthread_mutex_init(&p->page_lock, NULL);

	p->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (p->fd < 0) {
		err = -errno;
		log_error("pool %s: memfd_create: %s", p->name, strerror(-err));
		goto fail;
	}
	if (ftruncate(p->fd, (off_t)size) < 0) {
		err = -errno;
		log_error("pool %s: ftruncate %zu: %s", p->name, size, strerror(-err));
		goto fail;
	}
	/*
	 * Its size is final: peers that map it can rely on that (a region that
	 * shrank under a mapping would fault on access).
	 */
	if (fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		err = -errno;
		log_error("pool %s: sealing its memfd: %s", p->name, strerror(-err));
		goto fail;
	}
	p->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
	if (p->base == MAP_FAILED) {
		err = -errno;
		p->base = NULL;
		log_error("pool %s: mmap %zu: %s", p->name, size, strerror(-err));
		goto fail;
	}
	(void)madvise(p->base, size, MADV_HUGEPAGE); /* best effort */
	if (prm->prefault)
		for (i = 0; i < p->npages; i++)
			((volatile uint8_t *)p->base)[page_off(i)] = 0;

	p->slab_pages = POOL_SLAB_PAGES;
	while (p->slab_pages > p->npages)
		p->slab_pages /= 2;
	p->nslabs_max = p->npages / p->slab_pages;
	p->max_bufs = prm->max_bufs ? prm->max_bufs : POOL_DEFAULT_BUFS;
	p->tags = meta_calloc(p->npages, sizeof(*p->tags));
	p->page_slab = meta_calloc(p->npages, sizeof(*p->page_slab));
	p->slabs = meta_calloc(p->nslabs_max, sizeof(*p->slabs));
	p->bufs = meta_calloc(p->max_bufs, sizeof(*p->bufs));
	if (!p->tags || !p->page_slab || !p->slabs || !p->bufs) {
		err = -ENOMEM;
		log_error("pool %s: out of memory for metadata", p->name);
		goto fail;
	}

	for (i = 0; i < p->nslabs_max; i++) {
		atomic_init(&p->slabs[i].cls, POOL_NONE);
		p->slabs[i].next = i + 1 < p->nslabs_max ? i + 1 : POOL_NONE;
	}
	p->slab_spare = p->nslabs_max ? 0 : POOL_NONE;
	for (i = 0; i < POOL_NCLASSES; i++) {
		struct pool_class *c = &p->cls[i];

		atomic_init(&c->lock, false);
		c->size = POOL_SMALL_MIN << i;
		c->nobjs = p->slab_pages * POOL_PAGE_SIZE / c->size;
		c->head = c->tail = POOL_NONE;
	}
	for (i = 0; i < p->max_bufs; i++) {
		p->bufs[i].index = i;
		p->bufs[i].next_free = i + 1 < p->max_bufs ? i + 1 : POOL_NONE;
		atomic_init(&p->bufs[i].state, POOL_BUF_FREE);
	}
	atomic_init(&p->buf_top, 0);
	for (i = 0; i < POOL_NBINS; i++)
		p->bin_head[i] = POOL_NONE;
	run_set(p, 0, p->npages, 0);
	bin_insert(p, 0);
	p->free_pages = p->npages;
	atomic_init(&p->refs, 1);

	if (registry_add(p)) {
		err = -ENOMEM;
		log_error("pool %s: more than %d live pools", p->name, POOL_REGISTRY_MAX);
		goto fail;
	}
	*out = p;
	return 0;
fail:
	pool_destroy(p);
	return err;
}

int64_t pool_release_owner(struct pool *pool)
{
	int64_t old;

	if (!pool) {
		log_error("pool_release_owner: NULL pool");
		return -EINVAL;
	}
	if (atomic_exchange(&pool->owner_gone, 1)) {
		log_error("pool %s: owner reference released twice", pool->name);
		return -EINVAL;
	}
	mag_flush(pool, true); /* nothing is kept from here on (mag_put) */
	old = atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel);
	if (old == 1)
		pool_destroy(pool);
	return old - 1;
}

/* ------------------------------------------------------------------ */
/* Handles                                                             */
/* ------------------------------------------------------------------ */

static uint32_t buf_pop(struct pool *p)
{
	uint64_t old = atomic_load_explicit(&p->buf_top, memory_order_acquire), nw;
	uint32_t idx;

	do {
		idx = (uint32_t)old;
		if (idx == POOL_NONE)
			return POOL_NONE;
		nw = (((old >> 32) + 1) << 32) |
		     __atomic_load_n(&p->bufs[idx].next_free, __ATOMIC_RELAXED);
	} while (!atomic_compare_exchange_weak_explicit(&p->buf_top, &old, nw,
							memory_order_acquire,
							memory_order_acquire));
	return idx;
}

static void buf_push(struct pool *p, uint32_t idx)
{
	uint64_t old = atomic_load_explicit(&p->buf_top, memory_order_relaxed), nw;

	do {
		__atomic_store_n(&p->bufs[idx].next_free, (uint32_t)old, __ATOMIC_RELAXED);
		nw = (((old >> 32) + 1) << 32) | idx;
	} while (!atomic_compare_exchange_weak_explicit(&p->buf_top, &old, nw,
							memory_order_release,
							memory_order_relaxed));
}

/* A free handle's index, or POOL_NONE (counted, logged at most once a second). */
static uint32_t take_handle(struct pool *pool)
{
	uint32_t idx = buf_pop(pool);

	if (idx == POOL_NONE && mag_flush(pool, false))
		idx = buf_pop(pool); /* the magazines held the last ones */
	if (idx == POOL_NONE) {
		atomic_fetch_add_explicit(&pool->alloc_failures, 1, memory_order_relaxed);
		log_limited(FERRY__LOG_WARN, "pool %s: all %u buffer handles in use",
			    pool->name, pool->max_bufs);
	}
	return idx;
}

/*
 * A descriptor taken from the free list made live: pointing at [data, data +
 * cap) of the region (offset off), len bytes in use, no flags or release
 * callback; share_root is the block it shares (pool_share) or NULL. Published
 * LIVE last (release), for pool_free's check from another thread.
 */
static inline void buf_set_live(struct ferry_buf *b, struct pool *pool, void *data,
				uint64_t off, uint64_t len, uint64_t cap, struct ferry_buf *share_root)
{
	b->pool = pool;
	b->data = data;
	b->offset = off;
	b->len = len;
	b->cap = cap;
	b->flags = 0;
	b->release_fn = NULL;
	b->release_ctx = NULL;
	b->share_root = share_root;
	atomic_store_explicit(&b->state, POOL_BUF_LIVE, memory_order_release);
}

int pool_alloc(struct pool *pool, size_t len, struct ferry_buf **out)
{
	struct ferry_buf *b;
	uint64_t off, cap;
	uint32_t idx;
	int err;

	if (!pool || !out) {
		log_error("pool_alloc: NULL %s", pool ? "out" : "pool");
		return -EINVAL;
	}
	if (len <= POOL_SMALL_MAX && (b = mag_take(pool, len))) {
		*out = b;
		return 0;
	}
	idx = take_handle(pool);
	if (idx == POOL_NONE)
		return -ENOMEM;
	err = block_alloc(pool, len, &off, &cap);
	if (err) {
		buf_push(pool, idx);
		return err;
	}
	b = &pool->bufs[idx];
	if (cap <= POOL_SMALL_MAX) { /* where it is, for mag_put */
		b->slab = atomic_load_explicit(&pool->page_slab[off >> POOL_PAGE_SHIFT],
					       memory_order_relaxed) - 1;
		b->obj = (uint32_t)((off - page_off(pool->slabs[b->slab].page)) / cap);
	}
	buf_set_live(b, pool, pool->base + off, off, len, cap, NULL);
	*out = b;
	return 0;
}

int pool_wrap(struct pool *pool, void *data, uint64_t len, uint64_t remote_offset,
	      pool_release_fn *fn, void *ctx, struct ferry_buf **out)
{
	struct ferry_buf *b;
	uint32_t idx;

	if (!pool || !out || !fn || (!data && len)) {
		log_error("pool_wrap: NULL argument");
		return -EINVAL;
	}
	idx = take_handle(pool);
	if (idx == POOL_NONE)
		return -ENOMEM;
	b = &pool->bufs[idx];
	b->pool = pool;
	b->data = data;
	b->offset = remote_offset;
	b->len = len;
	b->cap = len;
	b->flags = POOL_BUF_F_FOREIGN;
	b->share_root = NULL;
	b->release_fn = fn;
	b->release_ctx = ctx;
	atomic_fetch_add_explicit(&pool->refs, 1, memory_order_relaxed);
	atomic_store_explicit(&b->state, POOL_BUF_LIVE, memory_order_release);
	*out = b;
	return 0;
}

void pool_wrap_cancel(struct ferry_buf *buf)
{
	atomic_store_explicit(&buf->state, POOL_BUF_FREE, memory_order_release);
	pool_wrap_done(buf);
}

void pool_wrap_done(struct ferry_buf *buf)
{
	struct pool *p = buf->pool;

	buf->flags = 0;
	buf->release_fn = NULL;
	buf_push(p, buf->index);
	pool_put(p);
}

int pool_free(struct ferry_buf *buf)
{
	uint32_t live = POOL_BUF_LIVE;
	struct pool *p;
	bool aligned;
	int err;

	if (!buf) {
		log_error("pool_free: NULL buffer");
		return -EINVAL;
	}
	p = registry_lookup(buf, &aligned);
	if (!p) {
		log_error("pool_free: %p is not a buffer handle of any pool", (void *)buf);
		return -EINVAL;
	}
	if (!aligned) {
		atomic_fetch_add_explicit(&p->bad_frees, 1, memory_order_relaxed);
		log_error("pool %s: free of %p, inside the handle table but not a handle",
			  p->name, (void *)buf);
		return -EINVAL;
	}
	if (!atomic_compare_exchange_strong_explicit(&buf->state, &live, POOL_BUF_FREE,
						     memory_order_acq_rel,
						     memory_order_relaxed)) {
		atomic_fetch_add_explicit(&p->bad_frees, 1, memory_order_relaxed);
		log_error("pool %s: free of buffer #%u that is not live (double free?)",
			  p->name, (unsigned int)(buf - p->bufs));
		return -EINVAL;
	}
	if (buf->flags & POOL_BUF_F_FOREIGN) {
		buf->release_fn(buf, buf->release_ctx); /* it calls pool_wrap_done */
		return 0;
	}
	if (!buf->share_root && !buf->flags && buf->cap <= POOL_SMALL_MAX && mag_put(p, buf))
		return 0;
	if (buf->share_root) {
		struct ferry_buf *root = buf->share_root;

		buf->share_root = NULL;
		buf_push(p, buf->index);
		if (atomic_fetch_sub_explicit(&root->share_refs, 1, memory_order_acq_rel) != 1)
			return 0;
		buf = root; /* the last handle: the block goes back */
		atomic_store_explicit(&buf->state, POOL_BUF_FREE, memory_order_release);
	}
	err = block_free(p, buf->offset);
	buf_push(p, buf->index);
	if (!err)
		pool_put(p);
	return err;
}

int pool_share(struct ferry_buf *buf, uint32_t n, struct ferry_buf **out)
{
	struct pool *p;
	bool aligned;
	uint32_t i, idx;

	if (!buf || (n && !out)) {
		log_error("pool_share: NULL %s", buf ? "out" : "buffer");
		return -EINVAL;
	}
	p = registry_lookup(buf, &aligned);
	if (!p || !aligned || atomic_load_explicit(&buf->state, memory_order_acquire) != POOL_BUF_LIVE ||
	    (buf->flags & POOL_BUF_F_FOREIGN) || buf->share_root) {
		log_error("pool_share: %p is not a live unshared block of a pool", (void *)buf);
		return -EINVAL;
	}
	if (n == 0)
		return pool_free(buf);
	for (i = 0; i < n; i++) {
		idx = take_handle(p);
		if (idx == POOL_NONE) {
			while (i-- > 0)
				buf_push(p, out[i]->index);
			return -ENOMEM;
		}
		out[i] = &p->bufs[idx];
	}
	atomic_store_explicit(&buf->share_refs, n, memory_order_relaxed);
	atomic_store_explicit(&buf->state, POOL_BUF_ROOT, memory_order_release);
	for (i = 0; i < n; i++) {
		buf_set_live(out[i], p, buf->data, buf->offset, buf->len, buf->cap, buf);
	}
	return 0;
}

int pool_block_alloc(struct pool *pool, size_t len, uint64_t *offset, uint64_t *cap)
{
	uint64_t off, c;
	int err;

	if (!pool || !offset) {
		log_error("pool_block_alloc: NULL %s", pool ? "offset" : "pool");
		return -EINVAL;
	}
	err = block_alloc(pool, len, &off, &c);
	if (err)
		return err;
	*offset = off;
	if (cap)
		*cap = c;
	return 0;
}

int pool_block_free(struct pool *pool, uint64_t offset)
{
	int err;

	if (!pool) {
		log_error("pool_block_free: NULL pool");
		return -EINVAL;
	}
	err = block_free(pool, offset);
	if (!err)
		pool_put(pool);
	return err;
}

/* ------------------------------------------------------------------ */
/* Introspection                                                       */
/* ------------------------------------------------------------------ */

void pool_get_stats(struct pool *pool, struct pool_stats *st)
{
	unsigned int i;

	if (!st)
		return;
	memset(st, 0, sizeof(*st));
	if (!pool)
		return;
	st->size = pool->size;
	for (i = 0; i < POOL_NCLASSES; i++) {
		struct pool_class *c = &pool->cls[i];

		class_lock(c);
		st->blocks_in_use += c->live;
		st->bytes_in_use += c->live * c->size;
		st->bytes_requested += c->bytes_req;
		st->allocs += c->allocs;
		st->frees += c->frees;
		class_unlock(c);
	}
	page_lock(pool);
	st->blocks_in_use += pool->large_live;
	st->bytes_in_use += pool->large_pages << POOL_PAGE_SHIFT;
	st->bytes_requested += pool->large_bytes_req;
	st->allocs += pool->large_allocs;
	st->frees += pool->large_frees;
	st->free_bytes = pool->free_pages << POOL_PAGE_SHIFT;
	st->largest_free = largest_free_locked(pool);
	page_unlock(pool);
	st->alloc_failures = atomic_load(&pool->alloc_failures);
	st->bad_frees = atomic_load(&pool->bad_frees);
	st->fragmentation = st->free_bytes ?
		1.0 - (double)st->largest_free / (double)st->free_bytes : 0.0;
}

void *pool_base(const struct pool *pool)
{
	return pool ? pool->base : NULL;
}

size_t pool_size(const struct pool *pool)
{
	return pool ? pool->size : 0;
}

int pool_fd(const struct pool *pool)
{
	return pool ? pool->fd : -EINVAL;
}

#define CHECK(cond, ...)						\
	do {								\
		if (!(cond)) {						\
			log_error("pool check: " __VA_ARGS__);		\
			err = -EFAULT;					\
			goto out;					\
		}							\
	} while (0)

static int check_pages(struct pool *p, uint64_t *free_runs)
{
	uint64_t free_pages = 0, large_live = 0, large_pages = 0, large_req = 0;
	bool prev_free = false;
	uint32_t i, j, n;
	int err = 0;

	*free_runs = 0;
	for (i = 0; i < p->npages; i += n) {
		struct pool_tag *t = &p->tags[i], *e;
		uint32_t used, si1;

		CHECK(t->flags & TAG_HEAD, "page %u: expected a run head", i);
		n = t->npages;
		CHECK(n >= 1 && n <= p->npages - i, "page %u: bad run length %u", i, n);
		e = &p->tags[i + n - 1];
		used = t->flags & TAG_USED;
		CHECK((e->flags & TAG_TAIL) && e->npages == n &&
		      (e->flags & TAG_USED) == used,
		      "run %u+%u: tail tag does not match head", i, n);
		CHECK(n == 1 ||
		      (!(t->flags & TAG_TAIL) && !(e->flags & (TAG_HEAD | TAG_SLAB))),
		      "run %u+%u: stray head/tail flags", i, n);
		for (j = i + 1; j + 1 < i + n; j++)
			CHECK(p->tags[j].flags == 0, "page %u: interior page has flags", j);
		si1 = atomic_load(&p->page_slab[i]);
		for (j = i; j < i + n; j++)
			CHECK(atomic_load(&p->page_slab[j]) == si1,
			      "page %u: slab map differs within run %u", j, i);
		if (!used) {
			CHECK(!prev_free, "run %u: two adjacent free runs", i);
			CHECK(!(t->flags & TAG_SLAB) && !si1,
			      "run %u: free run is a slab", i);
			free_pages += n;
			(*free_runs)++;
		} else if (t->flags & TAG_SLAB) {
			struct pool_slab *s;

			CHECK(n == p->slab_pages && si1 && si1 <= p->nslabs_max,
			      "run %u: bad slab run", i);
			s = &p->slabs[si1 - 1];
			CHECK(s->page == i && atomic_load(&s->cls) < POOL_NCLASSES,
			      "run %u: slab %u does not point back", i, si1 - 1);
		} else {
			CHECK(!si1, "run %u: large block in the slab map", i);
			large_live++;
			large_pages += n;
			large_req += t->u.len;
			CHECK(t->u.len <= page_off(n) &&
			      t->u.len > (n > 1 ? page_off(n - 1) : POOL_SMALL_MAX),
			      "run %u: length %llu does not fit %u pages", i,
			      (unsigned long long)t->u.len, n);
		}
		prev_free = !used;
	}
	CHECK(free_pages == p->free_pages, "free pages %llu, counted %llu",
	      (unsigned long long)p->free_pages, (unsigned long long)free_pages);
	CHECK(large_live == p->large_live && large_pages == p->large_pages &&
	      large_req == p->large_bytes_req, "large block counters do not match tags");
out:
	return err;
}

static int check_bins(struct pool *p, uint64_t free_runs)
{
	uint64_t runs = 0, pages = 0;
	unsigned int b;
	int err = 0;

	for (b = 0; b < POOL_NBINS; b++) {
		uint32_t h = p->bin_head[b], prev = POOL_NONE;

		CHECK(!!(p->bin_map & (1u << b)) == (h != POOL_NONE),
		      "bin %u: bitmap bit disagrees with list", b);
		for (; h != POOL_NONE; prev = h, h = p->tags[h].u.link.next) {
			struct pool_tag *t;

			CHECK(h < p->npages && runs < free_runs,
			      "bin %u: list runs away", b);
			t = &p->tags[h];
			CHECK((t->flags & (TAG_HEAD | TAG_USED)) == TAG_HEAD,
			      "bin %u: page %u is not a free head", b, h);
			CHECK(floor_log2(t->npages) == b, "bin %u: run %u+%u in wrong bin",
			      b, h, t->npages);
			CHECK(t->u.link.prev == prev, "bin %u: bad back link at %u", b, h);
			runs++;
			pages += t->npages;
		}
	}
	CHECK(runs == free_runs && pages == p->free_pages,
	      "free lists hold %llu runs / %llu pages, tags say %llu / %llu",
	      (unsigned long long)runs, (unsigned long long)pages,
	      (unsigned long long)free_runs, (unsigned long long)p->free_pages);
out:
	return err;
}

static int check_slabs(struct pool *p)
{
	uint32_t used_slabs = 0, spare = 0, si, ci;
	int err = 0;

	for (ci = 0; ci < POOL_NCLASSES; ci++) {
		struct pool_class *c = &p->cls[ci];
		uint32_t nslabs = 0, listed = 0, empty = 0, prev = POOL_NONE, n, m;
		uint64_t live = 0, req = 0, cached = 0;

		for (si = c->head; si != POOL_NONE; prev = si, si = p->slabs[si].next) {
			struct pool_slab *s;

			CHECK(si < p->nslabs_max && listed <= p->nslabs_max,
			      "class %u: list runs away", ci);
			s = &p->slabs[si];
			CHECK(s->listed && s->prev == prev && atomic_load(&s->cls) == ci &&
			      s->nfree > 0, "class %u: bad list entry %u", ci, si);
			if (s->nfree == c->nobjs)
				empty++;
			listed++;
		}
		CHECK(c->tail == prev, "class %u: tail is wrong", ci);
		CHECK(empty == c->nempty && empty <= 1,
		      "class %u: %u empty slabs, counter %u", ci, empty, c->nempty);
		for (si = 0; si < p->nslabs_max; si++) {
			struct pool_slab *s = &p->slabs[si];
			uint32_t bits = 0, i;

			if (atomic_load(&s->cls) != ci)
				continue;
			CHECK(atomic_load(&p->page_slab[s->page]) == si + 1 &&
			      (p->tags[s->page].flags & TAG_SLAB),
			      "slab %u: pages not marked", si);
			for (i = 0; i < POOL_SLAB_WORDS; i++)
				bits += (uint32_t)__builtin_popcountll(s->map[i]);
			for (i = 0; i < c->nobjs; i++) {
				if (!(s->map[i / 64] & (1ull << (i % 64))))
					continue;
				if (s->lens[i] == POOL_LEN_CACHED)
					cached++;
				else
					req += s->lens[i];
			}
			for (i = 0; i < s->hint; i++)
				CHECK(s->map[i] == ~0ull,
				      "slab %u: hint past a free object", si);
			CHECK(bits + s->nfree == c->nobjs, "slab %u: bitmap has %u live, "
			      "nfree %u of %u", si, bits, s->nfree, c->nobjs);
			CHECK(s->listed == (s->nfree > 0),
			      "slab %u: listed %d with %u free", si, s->listed, s->nfree);
			live += bits;
			nslabs++;
		}
		n = atomic_load(&c->mag_n);
		CHECK(nslabs == c->nslabs && live == c->live + n && req == c->bytes_req &&
		      cached == n && n <= POOL_MAG_DEPTH,
		      "class %u: counters do not match slabs", ci);
		for (m = 0; m < n; m++) {
			const struct ferry_buf *b = c->mag[m] < p->max_bufs ? &p->bufs[c->mag[m]] : NULL;

			CHECK(b && b->slab < p->nslabs_max && atomic_load(&p->slabs[b->slab].cls) == ci &&
			      b->obj < c->nobjs && p->slabs[b->slab].lens[b->obj] == POOL_LEN_CACHED &&
			      atomic_load(&b->state) == POOL_BUF_CACHED &&
			      b->offset == page_off(p->slabs[b->slab].page) + (uint64_t)b->obj * c->size,
			      "class %u: magazine entry %u is wrong", ci, m);
		}
		used_slabs += nslabs;
	}
	for (si = p->slab_spare; si != POOL_NONE; si = p->slabs[si].next) {
		CHECK(si < p->nslabs_max && spare < p->nslabs_max,
		      "spare slab list runs away");
		CHECK(atomic_load(&p->slabs[si].cls) == POOL_NONE,
		      "spare slab %u in use", si);
		spare++;
	}
	CHECK(spare + used_slabs == p->nslabs_max, "%u spare + %u used slabs != %u",
	      spare, used_slabs, p->nslabs_max);
out:
	return err;
}

static int check_handles(struct pool *p, uint64_t blocks)
{
	uint64_t top = atomic_load(&p->buf_top), live = 0, spare = 0, shared = 0;
	uint32_t i;
	int err = 0;

	for (i = 0; i < p->max_bufs; i++) {
		uint32_t st = atomic_load(&p->bufs[i].state);

		CHECK(st == POOL_BUF_FREE || st == POOL_BUF_LIVE || st == POOL_BUF_ROOT ||
		      st == POOL_BUF_CACHED, "handle %u: state %#x", i, st);
		CHECK(p->bufs[i].index == i, "handle %u: wrong index", i);
		/* A shared block counts once: by its root. */
		live += st == POOL_BUF_ROOT || st == POOL_BUF_CACHED ||
			(st == POOL_BUF_LIVE && !p->bufs[i].share_root);
		shared += st == POOL_BUF_LIVE && p->bufs[i].share_root;
	}
	for (i = (uint32_t)top; i != POOL_NONE; i = p->bufs[i].next_free) {
		CHECK(i < p->max_bufs && spare < p->max_bufs, "handle free list runs away");
		CHECK(atomic_load(&p->bufs[i].state) == POOL_BUF_FREE,
		      "handle %u: live but on the free list", i);
		spare++;
	}
	CHECK(live + shared + spare == p->max_bufs && live <= blocks,
	      "%llu live + %llu spare handles of %u, %llu blocks",
	      (unsigned long long)live, (unsigned long long)spare, p->max_bufs,
	      (unsigned long long)blocks);
out:
	return err;
}

/* Call only while no other thread uses the pool: the counters are compared. */
int pool_check(struct pool *pool)
{
	uint64_t free_runs, blocks;
	int64_t refs;
	unsigned int i;
	int err;

	if (!pool) {
		log_error("pool_check: NULL pool");
		return -EINVAL;
	}
	for (i = 0; i < POOL_NCLASSES; i++)
		class_lock(&pool->cls[i]);
	page_lock(pool);
	err = check_pages(pool, &free_runs);
	if (!err)
		err = check_bins(pool, free_runs);
	if (!err)
		err = check_slabs(pool);
	blocks = pool->large_live; /* those the pool holds a reference for: */
	for (i = 0; i < POOL_NCLASSES; i++)
		blocks += pool->cls[i].live + atomic_load(&pool->cls[i].mag_n);
	if (!err)
		err = check_handles(pool, blocks);
	refs = atomic_load(&pool->refs);
	if (!err)
		CHECK(refs == (int64_t)blocks + !atomic_load(&pool->owner_gone),
		      "refs %lld for %llu blocks", (long long)refs,
		      (unsigned long long)blocks);
out:
	page_unlock(pool);
	for (i = POOL_NCLASSES; i-- > 0;)
		class_unlock(&pool->cls[i]);
	return err;
}

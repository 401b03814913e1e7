/*
 * engine/memory.c - memory types and registered regions.
 *
 * Owns: ferry_buf_alloc_params / ferry_buf_mem (a buffer's memory type),
 * ferry_region_register / ferry_region_release (application memory
 * announced once, with the engine's list of its regions under e->lock),
 * and the checks of an op's segments: each names a live region of this
 * engine, lies within it, and is of a memory type this build moves; the
 * regions are pinned while the op is in flight so that a release then is
 * refused (-EBUSY) instead of pulling memory from under a transfer.
 *
 * Host memory is the only type this build moves: CUDA device memory is
 * refused with -EOPNOTSUPP until its memory domain is built.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

static int mem_supported(const char *what, enum ferry_mem_type mem)
{
	if (mem == FERRY_MEM_HOST)
		return 0;
	if (mem == FERRY_MEM_CUDA)
		log_error("%s: CUDA device memory: this build has no CUDA memory domain "
			  "(FERRY_FEATURE_CUDA is not set)", what);
	else
		log_error("%s: unknown memory type %d", what, (int)mem);
	return mem == FERRY_MEM_CUDA ? -EOPNOTSUPP : -EINVAL;
}

int ferry_buf_alloc_params(struct ferry_engine *e, const struct ferry_buf_params *p,
			   struct ferry_buf **out)
{
	struct ferry_buf_params prm = FERRY_BUF_PARAMS_INIT;
	int rc;

	if (!e || !p || !out) {
		log_error("ferry_buf_alloc_params: NULL %s", !e ? "engine" : !p ? "params" : "out");
		return -EINVAL;
	}
	*out = NULL;
	if (p->size < offsetof(struct ferry_buf_params, mem) || p->size > sizeof(prm)) {
		log_error("ferry_buf_alloc_params: params.size %zu (this library knows %zu)",
			  p->size, sizeof(prm));
		return -EINVAL;
	}
	memcpy(&prm, p, p->size);
	if (prm.flags) {
		log_error("ferry_buf_alloc_params: unknown flags 0x%x", prm.flags);
		return -EINVAL;
	}
	if ((rc = mem_supported("ferry_buf_alloc_params", prm.mem)))
		return rc;
	return ferry_buf_alloc(e, prm.len, out);
}

enum ferry_mem_type ferry_buf_mem(const struct ferry_buf *b)
{
	(void)b; /* every buffer is host memory in this build */
	return FERRY_MEM_HOST;
}

int ferry_region_register(struct ferry_engine *e, const struct ferry_region_params *p,
			  struct ferry_region **out)
{
	struct ferry_region_params prm = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r;
	int rc;

	if (!e || !p || !out) {
		log_error("ferry_region_register: NULL %s", !e ? "engine" : !p ? "params" : "out");
		return -EINVAL;
	}
	*out = NULL;
	if (p->size < offsetof(struct ferry_region_params, mem) || p->size > sizeof(prm)) {
		log_error("ferry_region_register: params.size %zu (this library knows %zu)",
			  p->size, sizeof(prm));
		return -EINVAL;
	}
	memcpy(&prm, p, p->size);
	if (!prm.addr || !prm.len || (uintptr_t)prm.addr + prm.len < (uintptr_t)prm.addr) {
		log_error("ferry_region_register: %s region", !prm.addr ? "NULL" : "empty or wrapping");
		return -EINVAL;
	}
	if ((rc = mem_supported("ferry_region_register", prm.mem)))
		return rc;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->engine = e;
	r->addr = prm.addr;
	r->len = prm.len;
	r->mem = prm.mem;
	r->device = prm.device;
	pthread_mutex_lock(&e->lock);
	r->next = e->regions;
	e->regions = r;
	pthread_mutex_unlock(&e->lock);
	*out = r;
	return 0;
}

/* Off the engine's list and freed; e->lock held. */
static void region_free_locked(struct ferry_engine *e, struct ferry_region *r)
{
	for (struct ferry_region **pp = &e->regions; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	}
	free(r);
}

int ferry_region_release(struct ferry_region **rp)
{
	struct ferry_region *r = rp ? *rp : NULL;
	struct ferry_engine *e;

	if (!r) {
		log_error("ferry_region_release: NULL region");
		return -EINVAL;
	}
	e = r->engine;
	pthread_mutex_lock(&e->lock);
	/* Marked first: no op pins it from now on; one in flight keeps it. */
	atomic_store(&r->released, 1);
	if (atomic_load(&r->pins)) {
		atomic_store(&r->released, 0);
		pthread_mutex_unlock(&e->lock);
		log_info("ferry_region_release: %u op(s) in flight name the region",
			 atomic_load(&r->pins));
		return -EBUSY;
	}
	region_free_locked(e, r);
	pthread_mutex_unlock(&e->lock);
	*rp = NULL;
	return 0;
}

/* Is r one of e's live regions? e->lock held. */
static bool region_known(struct ferry_engine *e, const struct ferry_region *r)
{
	for (const struct ferry_region *k = e->regions; r && k; k = k->next)
		if (k == r)
			return !atomic_load(&k->released);
	return false;
}

void memory_unpin(const struct ferry_seg *seg, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		atomic_fetch_sub(&seg[i].region->pins, 1);
}

int memory_check_pin(struct ferry_engine *e, const struct ferry_sqe *sqe)
{
	const struct ferry_seg *seg = (const struct ferry_seg *)sqe->iov;
	uint32_t i;
	size_t region_len = 0; /* read under the lock: the region may go after it */
	int why = 0, rc;

	/*
	 * Under the lock a release and a pin cannot pass each other. A region
	 * is known by being on this engine's list: a pointer to a released
	 * (freed) region, or to another engine's, is never followed.
	 */
	pthread_mutex_lock(&e->lock);
	for (i = 0; i < sqe->iovcnt; i++) {
		const struct ferry_region *r = seg[i].region;

		if (!region_known(e, r)) {
			why = !r ? 1 : 2;
			break;
		}
		if (seg[i].offset > r->len || seg[i].len > r->len - seg[i].offset) {
			region_len = r->len;
			why = 3;
			break;
		}
		atomic_fetch_add(&seg[i].region->pins, 1);
	}
	pthread_mutex_unlock(&e->lock);
	/* Logged after the lock: a log sink may call what takes it. */
	if (why == 1 || why == 2)
		log_error("op %llx: segment %u: %s region", (unsigned long long)sqe->user_data, i,
			  why == 1 ? "no" : "not a live region of this engine (released, or another "
					    "engine's)");
	else if (why == 3)
		log_error("op %llx: segment %u: %llu bytes at %llu of a %zu-byte region",
			  (unsigned long long)sqe->user_data, i, (unsigned long long)seg[i].len,
			  (unsigned long long)seg[i].offset, region_len);
	rc = why ? -EINVAL : 0;
	if (rc)
		memory_unpin(seg, i); /* the ones pinned before the bad one */
	return rc;
}

void memory_fini(struct ferry_engine *e)
{
	while (e->regions) {
		struct ferry_region *r = e->regions;

		e->regions = r->next;
		free(r);
	}
}

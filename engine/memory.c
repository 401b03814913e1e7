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
 * Also each transport's registration of memory (struct backend_ops
 * mem_register / mem_deregister: what RDMA's memory regions and CUDA's
 * host pinning need): the engine's pool is registered with a transport
 * once, when it comes up, and every region when it is registered; the
 * handles are kept here, per transport, and found again for an op
 * (ferry__buf_reg, ferry__region_reg).
 *
 * CUDA device memory is the memory domain's (TRANSPORT_CAP_MEM_CUDA:
 * backends/cuda): a device region is vetted by its mem_register (-ENODEV
 * when the CUDA runtime or a device is missing), and an op whose segments
 * hold device memory (OP_F_DEVICE) has its copies made there
 * (memory_device_put / memory_device_get). ferry allocates no device
 * buffers (ferry_buf_alloc_params: -EOPNOTSUPP): device memory is the
 * application's, registered as regions; the one device buffer there is, a
 * sender's memory handed out to a GET with FERRY_SQE_DEVICE_BUF, is the
 * domain's foreign handle (POOL_BUF_F_DEVICE), which ferry_buf_mem and
 * ferry_buf_device read here.
 */
#include <errno.h>
#include <stdlib.h>

#include "cuda_rt.h"
#include "internal.h"

/* The running memory domain of device memory, or NULL (a registry without one). */
static struct backend *device_domain(struct ferry_engine *e)
{
	for (unsigned i = 0; i < e->nbackends; i++)
		if ((e->backends[i].ops->caps & TRANSPORT_CAP_MEM_CUDA) && e->backends[i].data)
			return &e->backends[i];
	return NULL;
}

static int mem_supported(struct ferry_engine *e, const char *what, enum ferry_mem_type mem)
{
	if (mem == FERRY_MEM_HOST)
		return 0;
	if (mem == FERRY_MEM_CUDA && device_domain(e))
		return 0; /* its mem_register vets it (runtime, device, pointer) */
	if (mem == FERRY_MEM_CUDA)
		log_error("%s: CUDA device memory: this engine has no CUDA memory domain", what);
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
	if ((rc = mem_supported(e, "ferry_buf_alloc_params", prm.mem)))
		return rc;
	if (prm.mem == FERRY_MEM_CUDA) {
		log_error("ferry_buf_alloc_params: ferry gives no device buffers: register device "
			  "memory of your own as a region (ferry_region_register)");
		return -EOPNOTSUPP;
	}
	return ferry_buf_alloc(e, prm.len, out);
}

enum ferry_mem_type ferry_buf_mem(const struct ferry_buf *b)
{
	return b && (b->flags & POOL_BUF_F_DEVICE) ? FERRY_MEM_CUDA : FERRY_MEM_HOST;
}

int ferry_buf_device(const struct ferry_buf *b)
{
	return b && (b->flags & POOL_BUF_F_DEVICE) ? b->device : -1;
}

/* Every registration of r goes back to its transport (each once). */
static void region_deregister_transports(struct ferry_engine *e, struct ferry_region *r)
{
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (r->reg[b->index] && b->ops->mem_deregister)
			b->ops->mem_deregister(e, b, r->reg[b->index]);
		r->reg[b->index] = NULL;
	}
}

/*
 * Every transport that registers memory registers r. On an error the ones
 * done are undone, and it is returned (logged).
 */
static int region_register_transports(struct ferry_engine *e, struct ferry_region *r)
{
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];
		int rc;

		if (!b->ops->mem_register)
			continue;
		rc = b->ops->mem_register(e, b, r->addr, r->len, r->mem, r->device,
					  &r->reg[b->index]);
		if (rc < 0) {
			r->reg[b->index] = NULL;
			log_error("ferry_region_register: transport %s could not register %zu bytes "
				  "at %p: %s", b->ops->name, r->len, r->addr, ferry_strerror(rc));
			region_deregister_transports(e, r);
			return rc;
		}
	}
	return 0;
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
	if ((rc = mem_supported(e, "ferry_region_register", prm.mem)))
		return rc;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->engine = e;
	r->addr = prm.addr;
	r->len = prm.len;
	r->mem = prm.mem;
	r->device = prm.device;
	if ((rc = region_register_transports(e, r))) {
		free(r);
		return rc;
	}
	pthread_mutex_lock(&e->lock);
	r->next = e->regions;
	e->regions = r;
	pthread_mutex_unlock(&e->lock);
	*out = r;
	return 0;
}

/* Off the engine's list; e->lock held. */
static void region_unlink_locked(struct ferry_engine *e, struct ferry_region *r)
{
	for (struct ferry_region **pp = &e->regions; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	}
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
	region_unlink_locked(e, r);
	pthread_mutex_unlock(&e->lock);
	/* Off the list, no op pins it: its registrations go, outside the lock. */
	region_deregister_transports(e, r);
	free(r);
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
	int why = 0, rc, device = 0;

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
		device |= r->mem == FERRY_MEM_CUDA;
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
	rc = why ? -EINVAL : device;
	if (rc < 0)
		memory_unpin(seg, i); /* the ones pinned before the bad one */
	return rc;
}

int memory_device_put(struct ferry_engine *e, struct op *op, const struct ferry_sqe *sqe)
{
	struct backend *b = device_domain(e);

	if (!b || !b->ops->device_put)
		return -EOPNOTSUPP; /* not reached: its regions could not be registered */
	return b->ops->device_put(e, b, op, sqe);
}

int memory_device_get(struct ferry_engine *e, struct op *op, struct ferry_buf *buf, uint64_t len,
		      uint32_t wflags)
{
	struct backend *b = device_domain(e);

	if (!b || !b->ops->device_get)
		return -EOPNOTSUPP;
	if (op->heap_idx != NO_SLOT)
		timer_del(&e->timers, op); /* the data is here: the copy ends it, not its deadline */
	return b->ops->device_get(e, b, op, buf, len, wflags);
}

int memory_device_restage(struct ferry_engine *e, struct op *op)
{
	struct backend *b = device_domain(e);

	if (!b || !b->ops->device_restage)
		return -EOPNOTSUPP; /* not reached: no IPC PUT without the domain */
	return b->ops->device_restage(e, b, op);
}

bool memory_device_defer(struct ferry_engine *e, struct op *op, int res, uint64_t len)
{
	struct backend *b = device_domain(e);

	if (!b || !b->ops->device_defer) {
		op->flags &= ~OP_F_FILLING;
		return false;
	}
	return b->ops->device_defer(e, b, op, res, len);
}

int memory_device_allocation(struct ferry_engine *e, void *addr, int device, uint64_t *base,
			     uint64_t *size, uint64_t *id)
{
	struct backend *b = device_domain(e);

	if (!b || !b->ops->device_allocation)
		return -EOPNOTSUPP;
	return b->ops->device_allocation(e, b, addr, device, base, size, id);
}

int memory_device_dmabuf(struct ferry_engine *e, void *addr, size_t len, int device, int *fd,
			 uint64_t *offset, const char **why)
{
	struct backend *b = device_domain(e);

	*fd = -1;
	if (!b || !b->ops->device_dmabuf) {
		*why = "this engine has no memory domain that exports dma-bufs";
		return -EOPNOTSUPP;
	}
	return b->ops->device_dmabuf(e, b, addr, len, device, fd, offset, why);
}

void memory_dma_source(struct ferry_engine *e, struct ferry_buf *buf)
{
	for (unsigned i = 0; i < e->nbackends; i++) {
		struct backend *b = &e->backends[i];

		if (b->ops->dma_source && b->data)
			b->ops->dma_source(e, b, buf);
	}
}

int memory_dma_pin(const void *addr, size_t len, const char **why)
{
	const struct cuda_rt *rt = cuda_rt_loaded();
	cuda_err_t err;

	if (!rt) {
		*why = "no CUDA runtime is loaded in this process";
		return -ENODEV;
	}
	err = rt->HostRegister((void *)(uintptr_t)addr, len,
			       CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_READ_ONLY);
	if (err != CUDA_OK) {
		*why = cuda_rt_strerror(err);
		rt->GetLastError();
		return -EIO;
	}
	return 0;
}

void memory_dma_unpin(const void *addr)
{
	const struct cuda_rt *rt = cuda_rt_loaded();
	cuda_err_t err;

	if (rt && (err = rt->HostUnregister((void *)(uintptr_t)addr)) != CUDA_OK) {
		log_warn("cudaHostUnregister of %p: %s", addr, cuda_rt_strerror(err));
		rt->GetLastError();
	}
}

int memory_transport_up(struct ferry_engine *e, struct backend *b)
{
	int rc;

	if (!b->ops->mem_register)
		return 0;
	rc = b->ops->mem_register(e, b, pool_base(e->pool), pool_size(e->pool), FERRY_MEM_HOST, 0,
				  &e->pool_reg[b->index]);
	if (rc < 0) {
		e->pool_reg[b->index] = NULL;
		log_error("engine %s: transport %s could not register the pool (%zu bytes): %s",
			  e->name, b->ops->name, pool_size(e->pool), ferry_strerror(rc));
		return rc;
	}
	return 0;
}

void memory_transport_down(struct ferry_engine *e, struct backend *b)
{
	void *h;

	if (!b->ops->mem_deregister)
		return;
	/* The engine is being destroyed: no other thread uses it, no lock needed. */
	for (struct ferry_region *r = e->regions; r; r = r->next) {
		if ((h = r->reg[b->index]))
			b->ops->mem_deregister(e, b, h);
		r->reg[b->index] = NULL;
	}
	if ((h = e->pool_reg[b->index]))
		b->ops->mem_deregister(e, b, h);
	e->pool_reg[b->index] = NULL;
}

void *ferry__buf_reg(struct ferry_engine *e, const struct backend *b, const struct ferry_buf *buf,
		     uint64_t *offset)
{
	if (!buf || buf->pool != e->pool || (buf->flags & POOL_BUF_F_FOREIGN))
		return NULL;
	*offset = buf->offset;
	return e->pool_reg[b->index];
}

void memory_fini(struct ferry_engine *e)
{
	while (e->regions) {
		struct ferry_region *r = e->regions;

		e->regions = r->next;
		free(r);
	}
}

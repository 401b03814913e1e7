/*
 * backends/cuda/cuda.c - the memory domain of CUDA device memory.
 *
 * Owns: a service in the registry (it carries no PUT, resolves no peer)
 * with TRANSPORT_CAP_MEM_CUDA, through which the engine handles device
 * memory: it vets device regions (mem_register: the runtime is there, and
 * knows the pointer as memory of that device; -ENODEV without a runtime or
 * a device, logged), pins the engine's pool for DMA (cudaHostRegister, on
 * the first device region), and makes every copy of device memory ferry
 * makes (device_put: device segments into a pool buffer that the PUT then
 * carries, through any transport; device_get: a received buffer into a
 * GET's device segments).
 *
 * A large staged PUT to a transport that sends a block while it is filled
 * (tcp, rdma) is pipelined: marks behind its pieces, the op handed on at
 * the first (the block shared with the job until its copies end, and an op
 * that ends before they do completed only then: fill_begin, job_marks,
 * cuda_device_defer).
 *
 * Every copy runs on ferry's own stream of the device (non-blocking,
 * created on the first use), cut into pieces of CUDA_PIECE bytes; a copy
 * after the caller's wait (ferry_sqe_set_cuda_wait) waits on the GPU
 * (cudaStreamWaitEvent). Each job (one op's copies) ends with an event
 * recorded behind its pieces: while the reactor spins it sees the job end
 * by cudaEventQuery (has_work, progress); before it sleeps with jobs out,
 * each of their streams gets a host function (cudaLaunchHostFunc) behind
 * its last job that rings the engine's doorbell (prepare_sleep; none while
 * it spins: a host function holds its stream until a CPU thread ran it).
 * No thread of ours, no synchronize on the reactor's rounds (the
 * streams are synchronized only at teardown, before the pool is unpinned).
 * Jobs come from a fixed table (CUDA_JOBS, events made once per slot): no
 * allocation per op; with every job in flight an op waits, in order, for one
 * to end (linked through the op itself).
 *
 * Same host, other process (CUDA IPC): a device region gets its
 * allocation's IPC handle once, at mem_register. A PUT of device segments
 * only, to a peer whose transport carries IPC (TRANSPORT_CAP_CUDA_IPC:
 * shm), is sent as a descriptor (struct ipc_desc: our pid and name, per
 * segment the handle, the offset in its allocation, the length) with
 * WIRE_F_CUDA_IPC instead of being staged; the transport ends it when the
 * receiver gives the descriptor's block back. The receiver's GET (device
 * or host destination) opens each handle once (a cache per engine, by
 * sender pid and handle, closed when the sender's connection is lost, when
 * the cache needs the slot, or at teardown) and copies from the sender's
 * device memory on its own stream; the job's end gives the block back.
 * A handle that does not open here is no error for a sender that says it
 * restages (IPC_F_RESTAGE): the engine gives the descriptor back asking
 * for the data (MEMORY_DEVICE_RESEND), and the sender's domain stages that
 * PUT through the pool (device_restage) and sends it again.
 * Another host, over a transport that moves device memory itself
 * (device_in_place: rdma with GPUDirect RDMA, regions registered with the
 * NIC through the dma-buf this domain exports, device_dmabuf): nothing is
 * staged; the PUT (OP_F_DEVICE_DIRECT) goes on after the caller's wait and
 * the peer's NIC reads the GPU's memory.
 * Staging stays for everything else (another host over tcp, host segments
 * in the PUT, a runtime without IPC or without the driver's address range,
 * a region whose handle could not be had).
 *
 * The runtime is loaded on the first device region (engine/cuda_rt.h), not
 * at engine creation: an engine that never sees device memory never loads
 * libcudart. Health: "cuda" says whether it is available and why not.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_rt.h"
#include "internal.h"

#define CUDA_JOBS 256
#define CUDA_PIECE (8ull << 20)
/*
 * Pipelined staging: a PUT of at least two pieces to a transport that
 * sends a block while it is being filled (sends_filling: tcp, rdma) gets up
 * to CUDA_MARKS - 1 events behind its pieces (its end is the job's own), about evenly spaced; the transport
 * has the op after the first and is told of each next (staged_more).
 */
#define CUDA_MARKS 8
#define CUDA_MAX_DEV 16
#define IPC_SEGS 16     /* device segments a descriptor names at most (more: staged) */
#define IPC_CACHE 64    /* handles of other processes open at once */
#define CUDA_HANDOUTS 256 /* device buffers handed out at once (FERRY_SQE_DEVICE_BUF) */
#define IPC_MAGIC 0x43495046u
#define IPC_VERSION 1
/* ipc_desc.flags: the sender sends the data again, staged, when the receiver's RELEASE asks. */
#define IPC_F_RESTAGE 1u
/* put_issue's kind for a restaged IPC PUT: no wait (the caller's was met), not a new PUT. */
#define CUDA_WAIT_RESTAGE 0xffu

/* One segment of an IPC descriptor: where in which allocation of the sender. */
struct ipc_seg {
	struct cuda_ipc_handle h;
	uint64_t off, len;
	int32_t dev;
	uint32_t resv;
};

/* The data of a WIRE_F_CUDA_IPC PUT: it names the sender's device memory. */
struct ipc_desc {
	uint32_t magic;
	uint16_t version;
	uint16_t nseg;
	int32_t pid;
	uint32_t flags;     /* IPC_F_* */
	uint64_t total;
	char sender[FERRY_NAME_MAX];
	struct ipc_seg seg[];
};

/* A handle of another process, open here. */
struct ipc_open {
	bool used, stale;     /* stale: its sender is gone; closed when no copy uses it */
	int32_t pid;
	int refs;             /* jobs copying from it, and device buffers handed out of it */
	int handout_refs;     /* ... of which handed out (a slot they hold counts in hslots) */
	void *ptr;
	uint64_t size;        /* the allocation's (UINT64_MAX: the runtime cannot say) */
	uint64_t last;        /* when last used (the slot to give up when all are taken) */
	struct cuda_ipc_handle h;
	char peer[FERRY_NAME_MAX];
};

enum job_kind { JOB_PUT = 1, JOB_GET = 2 };

struct cuda_job {
	struct op *op;
	uint32_t gen;            /* op->gen when it began */
	uint8_t kind;            /* enum job_kind */
	uint8_t dev;             /* the device whose stream it runs on */
	int res;                 /* an error met while issuing (the job still ends by its event) */
	struct ferry_buf *buf;   /* JOB_GET: the received block, held until the copy is done */
	uint64_t len;
	cuda_event_t done;       /* recorded behind the job's copies */
	cuda_event_t wait;       /* FERRY_CUDA_WAIT_STREAM: recorded on the caller's stream */
	uint64_t issued;         /* when its copies were queued (ferry__now_ns) */
	uint8_t nipc;            /* an IPC GET: the cache slots it copies from */
	uint8_t ipc[IPC_SEGS];
	/*
	 * Pipelined staging (JOB_PUT): fill, the job's own handle of the op's
	 * block (pool_share: the op has the other), held until its copies
	 * end; events behind the pieces up to mark_at[i] bytes (made on first
	 * use, kept with the slot), marks_seen of them seen done; handed: the
	 * op went to its transport after the first (an op that ends before
	 * its copies do is kept until then: deferred, cuda_device_defer).
	 */
	struct ferry_buf *fill;
	bool handed;
	bool deferred;           /* the op ended meanwhile: op_complete when the copies end */
	int deferred_res;
	uint64_t deferred_len;
	uint8_t nmarks, marks_seen;
	uint64_t mark_step, mark_next;
	uint64_t mark_at[CUDA_MARKS];
	cuda_event_t marks[CUDA_MARKS];
	struct cuda_job *next;
};

struct cuda_svc {
	struct ferry_engine *e;
	struct backend *b;
	const struct cuda_rt *_Atomic rt; /* set once a device region found the runtime */
	pthread_mutex_t lock;    /* loading the runtime, pinning the pool */
	void *pool_addr;         /* the pool, to pin */
	size_t pool_len;
	_Atomic int pool_pinned;
	int cur_dev;             /* the device current on the reactor's thread (-1: unknown) */
	cuda_stream_t stream[CUDA_MAX_DEV];
	/*
	 * Per stream: jobs issued on it, and how many of them the last host
	 * function queued (cuda_prepare_sleep) is behind. Progress side only.
	 */
	uint64_t issued[CUDA_MAX_DEV], rung_for[CUDA_MAX_DEV];
	struct cuda_job jobs[CUDA_JOBS];
	struct cuda_job *free;
	struct cuda_job *busy, *busy_tail; /* in the order issued */
	struct op *wait_head, *wait_tail;  /* ops waiting for a free job, in order */
	_Atomic uint32_t inflight, waiting;
	_Atomic uint32_t regions;
	stat_t puts, gets, bytes_d2h, bytes_h2d, errors;
	stat_t ipc_puts, staged_puts, ipc_gets, ipc_bytes, ipc_opens, ipc_closes;
	stat_t ipc_resends;  /* receiver: descriptors given back unread, the data asked again staged */
	stat_t ipc_restaged; /* sender: IPC PUTs sent again staged, at their receiver's request */
	stat_t direct_puts;  /* PUTs whose transport read the device memory in place (GPUDirect) */
	stat_t direct_restaged; /* ... chosen so, then staged: their peer's transport changed */
	stat_t pipelined_puts;  /* staged PUTs handed to their transport while still filled */
	stat_t jobs_ended, job_ns; /* jobs seen done, and their time from queued to seen done */
	_Atomic uint32_t ipc_regions, ipc_cached;
	_Atomic uint64_t callbacks;
	bool ipc_open_warned;
	uint64_t ipc_clock;
	struct ipc_open ipc_cache[IPC_CACHE];
	/*
	 * Device buffers handed out (a GET with FERRY_SQE_DEVICE_BUF: the
	 * sender's memory itself, opened here): each holds its cache slot open
	 * and its descriptor's block (the sender's PUT ends when that goes back).
	 * A release (any thread) queues the buffer on `released` for progress;
	 * after fini (`closed`) it ends the handout itself, under `lock`. The
	 * service lives while its engine or any handout does (`refs`).
	 */
	struct handout {
		struct ferry_buf *desc; /* NULL: free */
		uint8_t slot;
	} handouts[CUDA_HANDOUTS];
	uint32_t handouts_free[CUDA_HANDOUTS], nhandouts_free;
	uint32_t hslots; /* cache slots that handouts hold: at most IPC_CACHE - IPC_SEGS */
	struct ferry_buf *_Atomic released;
	_Atomic int closed, rel_users, refs;
	_Atomic uint32_t handouts_live;
	stat_t ipc_handouts;  /* device buffers handed out (zero copy) */
};

/* A device region's registration: what the runtime said of it. */
struct cuda_reg {
	int device;
	int type;
	bool ipc;                 /* h names its allocation; the region starts base_off into it */
	uint64_t base_off;
	struct cuda_ipc_handle h;
};

/* The host function behind each job: ring the doorbell if the reactor sleeps. Any thread. */
static void cuda_ring(void *arg)
{
	struct cuda_svc *s = arg;

	atomic_fetch_add_explicit(&s->callbacks, 1, memory_order_relaxed);
	reactor_wake(s->e);
}

static int cuda_init(struct ferry_engine *e, struct backend *b)
{
	struct cuda_svc *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->e = e;
	s->b = b;
	s->cur_dev = -1;
	pthread_mutex_init(&s->lock, NULL);
	for (unsigned i = 0; i < CUDA_JOBS; i++) {
		s->jobs[i].next = s->free;
		s->free = &s->jobs[i];
	}
	for (unsigned i = 0; i < CUDA_HANDOUTS; i++)
		s->handouts_free[s->nhandouts_free++] = CUDA_HANDOUTS - 1 - i;
	atomic_init(&s->refs, 1); /* the engine's */
	b->data = s;
	return 0;
}

/* The last reference (the engine's, or the last handout's after fini) frees s. */
static void svc_unref(struct cuda_svc *s)
{
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
		pthread_mutex_destroy(&s->lock);
		free(s);
	}
}

/* The runtime, loaded by the first device region (any thread), or NULL and why. */
static const struct cuda_rt *svc_runtime(struct cuda_svc *s, const char **why)
{
	const struct cuda_rt *rt = atomic_load(&s->rt);
	cuda_err_t err;

	if (rt)
		return rt;
	if (!(rt = cuda_rt_get(why)))
		return NULL;
	pthread_mutex_lock(&s->lock);
	if (!atomic_load(&s->pool_pinned) && s->pool_addr) {
		/* DMA from pinned memory: the pool is registered once, for all devices. */
		err = rt->HostRegister(s->pool_addr, s->pool_len, CUDA_HOST_REGISTER_PORTABLE);
		if (err == CUDA_OK)
			atomic_store(&s->pool_pinned, 1);
		else
			log_warn("cuda: engine %s: the pool (%zu bytes) could not be pinned: %s "
				 "(copies go through pageable memory)", s->e->name, s->pool_len,
				 cuda_rt_strerror(err));
		rt->GetLastError();
	}
	atomic_store(&s->rt, rt);
	pthread_mutex_unlock(&s->lock);
	return rt;
}

/*
 * The IPC handle of the allocation that holds a device region, once (the
 * handle names an allocation, not a pointer: the region's offset in it
 * goes with it). Without one the region's PUTs are staged; logged once.
 */
static void reg_ipc(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_reg *r, void *addr,
		    size_t len)
{
	static _Atomic int told;
	unsigned long long base = 0;
	size_t size = 0;
	const char *why = NULL, *env = getenv("FERRY_CUDA_IPC");
	cuda_err_t err;

	if (env && !strcmp(env, "0"))
		why = "FERRY_CUDA_IPC=0 (read at each device region's registration)";
	else if (!rt->IpcGetMemHandle || !rt->IpcOpenMemHandle || !rt->IpcCloseMemHandle)
		why = "the runtime has no CUDA IPC";
	else if (!rt->MemGetAddressRange)
		why = "the driver's cuMemGetAddressRange_v2 is not there";
	else if (r->type != CUDA_MEM_TYPE_DEVICE)
		why = "managed memory has no IPC handle";
	else if (rt->MemGetAddressRange(&base, &size, (uintptr_t)addr) != 0 ||
		 (uintptr_t)addr < base || (uintptr_t)addr - base + len > size)
		why = "its allocation's range is not known";
	else if ((err = rt->IpcGetMemHandle(&r->h, (void *)(uintptr_t)base)) != CUDA_OK)
		why = cuda_rt_strerror(err);
	rt->GetLastError();
	if (why) {
		if (!atomic_exchange(&told, 1))
			log_info("cuda: engine %s: device memory goes to other processes staged "
				 "through the pool, not by CUDA IPC: %s", s->e->name, why);
		return;
	}
	r->ipc = true;
	r->base_off = (uintptr_t)addr - base;
	atomic_fetch_add(&s->ipc_regions, 1);
}

static int cuda_mem_register(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
			     enum ferry_mem_type mem, int device, void **handle)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt;
	struct cuda_ptr_attr a, z;
	struct cuda_reg *r;
	const char *why = "";
	cuda_err_t err;

	*handle = NULL;
	if (mem == FERRY_MEM_HOST) {
		if (addr == pool_base(e->pool) && !s->pool_addr) {
			s->pool_addr = addr; /* pinned when device memory first appears */
			s->pool_len = len;
		}
		return 0;
	}
	if (mem != FERRY_MEM_CUDA)
		return 0;
	if (!(rt = svc_runtime(s, &why))) {
		log_error("cuda: engine %s: CUDA device memory is not available: %s", e->name, why);
		return -ENODEV;
	}
	if (device < 0 || device >= rt->devices || device >= CUDA_MAX_DEV) {
		log_error("cuda: engine %s: device %d does not exist (%d device(s))", e->name, device,
			  rt->devices);
		return -EINVAL;
	}
	memset(&a, 0, sizeof(a));
	memset(&z, 0, sizeof(z));
	err = rt->PointerGetAttributes(&a, addr);
	if (err == CUDA_OK)
		err = rt->PointerGetAttributes(&z, (const char *)addr + len - 1);
	if (err != CUDA_OK || (a.type != CUDA_MEM_TYPE_DEVICE && a.type != CUDA_MEM_TYPE_MANAGED) ||
	    a.device != device || z.type != a.type || z.device != a.device) {
		rt->GetLastError();
		log_error("cuda: engine %s: %zu bytes at %p are not memory of CUDA device %d (%s)",
			  e->name, len, addr, device,
			  err != CUDA_OK ? cuda_rt_strerror(err)
					 : a.type != CUDA_MEM_TYPE_DEVICE && a.type != CUDA_MEM_TYPE_MANAGED
						   ? "not device memory"
						   : "another device's, or not all of it");
		return -EINVAL;
	}
	if (!(r = malloc(sizeof(*r))))
		return -ENOMEM;
	r->device = device;
	r->type = a.type;
	r->ipc = false;
	reg_ipc(s, rt, r, addr, len);
	atomic_fetch_add(&s->regions, 1);
	*handle = r;
	return 0;
}

static void cuda_mem_deregister(struct ferry_engine *e, struct backend *b, void *handle)
{
	struct cuda_svc *s = b->data;
	struct cuda_reg *r = handle;

	(void)e;
	if (r && r->ipc)
		atomic_fetch_sub(&s->ipc_regions, 1);
	atomic_fetch_sub(&s->regions, 1);
	free(handle);
}

/* Ferry's stream of device dev, made current on this thread; NULL on an error (logged). */
static cuda_stream_t svc_stream(struct cuda_svc *s, const struct cuda_rt *rt, int dev)
{
	cuda_err_t err;

	if (s->cur_dev != dev) {
		if ((err = rt->SetDevice(dev)) != CUDA_OK) {
			log_error("cuda: engine %s: cudaSetDevice(%d): %s", s->e->name, dev,
				  cuda_rt_strerror(err));
			return NULL;
		}
		s->cur_dev = dev;
	}
	if (!s->stream[dev] &&
	    (err = rt->StreamCreateWithFlags(&s->stream[dev], CUDA_STREAM_NON_BLOCKING)) != CUDA_OK) {
		log_error("cuda: engine %s: no stream on device %d: %s", s->e->name, dev,
			  cuda_rt_strerror(err));
		s->stream[dev] = NULL;
		return NULL;
	}
	return s->stream[dev];
}

/* A free job, its event made: 0, -EAGAIN (all CUDA_JOBS in flight) or -EIO. */
static int job_take(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job **out)
{
	struct cuda_job *j = s->free;
	cuda_err_t err;

	if (!j)
		return -EAGAIN;
	if (!j->done && (err = rt->EventCreateWithFlags(&j->done, CUDA_EVENT_DISABLE_TIMING))) {
		log_error("cuda: engine %s: no event: %s", s->e->name, cuda_rt_strerror(err));
		j->done = NULL;
		return -EIO;
	}
	s->free = j->next;
	j->next = NULL;
	j->res = 0;
	j->buf = NULL;
	j->fill = NULL;
	j->handed = false;
	j->deferred = false;
	j->nmarks = j->marks_seen = 0;
	*out = j;
	return 0;
}

static void job_give_back(struct cuda_svc *s, struct cuda_job *j)
{
	j->op = NULL;
	j->next = s->free;
	s->free = j;
}

/* The first device segment's device: the stream the job runs on. */
static int op_device(const struct op *op)
{
	for (uint32_t i = 0; i < op->iovcnt; i++)
		if (op->segs[i].region->mem == FERRY_MEM_CUDA)
			return op->segs[i].region->device;
	return 0;
}

/*
 * A pipelined PUT's copies queued up to byte at of its block: a mark
 * behind them when at has passed the next one (not at the end: the job's
 * own event is that one), with a host function that rings the doorbell
 * when it passes (the reactor may sleep through the transfer). A mark
 * that cannot be made is skipped: the transport then waits for the next.
 */
static void job_mark(struct cuda_svc *s, const struct cuda_rt *rt, cuda_stream_t st,
		     struct cuda_job *j, uint64_t at)
{
	cuda_event_t *ev = &j->marks[j->nmarks];

	if (at < j->mark_next || at >= j->len || j->nmarks == CUDA_MARKS)
		return;
	j->mark_next = at + j->mark_step;
	if ((!*ev && rt->EventCreateWithFlags(ev, CUDA_EVENT_DISABLE_TIMING) != CUDA_OK) ||
	    rt->EventRecord(*ev, st) != CUDA_OK) {
		rt->GetLastError();
		return;
	}
	if (rt->LaunchHostFunc(st, cuda_ring, s) != CUDA_OK)
		rt->GetLastError(); /* (the job's own host function, before a sleep, still comes) */
	j->mark_at[j->nmarks++] = at;
}

/*
 * Queue len bytes, src to dst, in pieces (*queued: one was); marks of a
 * pipelined PUT's job pj (NULL: none) behind them. 0 or the runtime's error.
 */
static cuda_err_t copy_pieces(struct cuda_svc *s, const struct cuda_rt *rt, cuda_stream_t st,
			      struct cuda_job *pj, char *dst, const char *src, uint64_t len,
			      bool *queued)
{
	cuda_err_t err = CUDA_OK;

	while (len && err == CUDA_OK) {
		uint64_t n = len < CUDA_PIECE ? len : CUDA_PIECE;

		if ((err = rt->MemcpyAsync(dst, src, n, CUDA_MEMCPY_DEFAULT, st)) == CUDA_OK) {
			*queued = true;
			if (pj)
				job_mark(s, rt, st, pj, (uint64_t)(dst + n - (char *)pj->fill->data));
		}
		dst += n;
		src += n;
		len -= n;
	}
	return err;
}

/*
 * The job's copies are queued (err: the first error met; some may be):
 * its event behind them, and it joins the busy list (a host function
 * comes only before a sleep: cuda_prepare_sleep).
 * Returns 0: it ends by its event (with err, if any, as its result);
 * or the error when nothing was queued. An event that cannot be recorded
 * behind queued copies leaves one way to know they are done: the stream
 * is synchronized (an error path only).
 */
static int job_issue(struct cuda_svc *s, const struct cuda_rt *rt, cuda_stream_t st,
		     struct cuda_job *j, cuda_err_t err, bool queued)
{
	cuda_err_t e2;

	if (err != CUDA_OK) {
		log_error("cuda: engine %s: op %llx: a device copy could not be queued: %s",
			  s->e->name, (unsigned long long)j->op->user_data, cuda_rt_strerror(err));
		rt->GetLastError();
		STAT_ADD(s->errors, 1);
		if (!queued)
			return -EIO;
		j->res = -EIO;
	}
	if ((e2 = rt->EventRecord(j->done, st)) != CUDA_OK) {
		log_error("cuda: engine %s: op %llx: cudaEventRecord: %s", s->e->name,
			  (unsigned long long)j->op->user_data, cuda_rt_strerror(e2));
		rt->GetLastError();
		STAT_ADD(s->errors, 1);
		if (queued)
			rt->StreamSynchronize(st); /* the copies must not outlive their memory */
		return -EIO;
	}
	s->issued[j->dev]++; /* (its host function, if any, comes when the reactor sleeps) */
	j->op->state = OP_DEVICE;
	j->gen = j->op->gen;
	j->issued = ferry__now_ns();
	if (s->busy_tail)
		s->busy_tail->next = j;
	else
		s->busy = j;
	s->busy_tail = j;
	backend_busy(s->b); /* cuda_progress polls it from the next round on */
	atomic_fetch_add(&s->inflight, 1);
	return 0;
}

static struct backend *peer_transport(struct ferry_engine *e, struct ferry_peer *peer);

/*
 * Pipelined staging for a PUT of total bytes into op->buf (just taken)?
 * At least two pieces, a plain PUT, a peer whose transport sends a block
 * while it is filled: the block is shared between op (op->buf) and j
 * (j->fill), its root marked POOL_BUF_F_FILLING with nothing filled yet;
 * true. false: staged whole, as always.
 */
static bool fill_begin(struct cuda_svc *s, struct cuda_job *j, struct op *op, uint64_t total)
{
	struct backend *t;
	struct ferry_buf *h[2];

	if (total < 2 * CUDA_PIECE || op->opcode != FERRY_OP_PUT ||
	    !(t = peer_transport(s->e, op->peer)) || !t->ops->sends_filling ||
	    pool_share(op->buf, 2, h))
		return false;
	op->buf = h[0];
	j->fill = h[1];
	h[0]->share_root->flags |= POOL_BUF_F_FILLING;
	h[0]->share_root->filled = 0;
	j->mark_step = (total / CUDA_MARKS + CUDA_PIECE - 1) / CUDA_PIECE * CUDA_PIECE;
	j->mark_next = j->mark_step;
	return true;
}

/*
 * A PUT's copies into a pool block, after the caller's wait (kind, handle),
 * on job j: 0 (it runs), or the error (j given back; nothing runs; op->buf,
 * if taken, is freed with the op). An IPC PUT (its descriptor already in
 * op->buf) and a PUT its transport reads in place (OP_F_DEVICE_DIRECT)
 * have no copies: the job is the caller's wait alone. A large one to a
 * transport that sends a block while it is filled is pipelined (fill_begin).
 */
static int put_issue(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j,
		     struct op *op, unsigned kind, uint64_t handle)
{
	cuda_stream_t st = svc_stream(s, rt, op_device(op));
	cuda_err_t err = CUDA_OK;
	uint64_t total = segs_total(op->segs, op->iovcnt), at = 0;
	bool queued = false, ipc = op->flags & WIRE_F_CUDA_IPC;
	bool direct = op->flags & OP_F_DEVICE_DIRECT, nocopy = ipc || direct;
	int rc;

	if (!st) {
		job_give_back(s, j);
		return -EIO;
	}
	if (!nocopy && (rc = pool_alloc(s->e->pool, total, &op->buf))) {
		log_info("op %llx: pool exhausted for %llu bytes of device memory",
			 (unsigned long long)op->user_data, (unsigned long long)total);
		job_give_back(s, j);
		return rc;
	}
	j->op = op;
	j->kind = JOB_PUT;
	j->dev = (uint8_t)op_device(op);
	j->len = total;
	if (!nocopy)
		fill_begin(s, j, op, total);
	if (kind == FERRY_CUDA_WAIT_STREAM) {
		/* The caller's stream's work so far, as an event ferry's stream waits for. */
		if (!j->wait)
			err = rt->EventCreateWithFlags(&j->wait, CUDA_EVENT_DISABLE_TIMING);
		if (err == CUDA_OK)
			err = rt->EventRecord(j->wait, (cuda_stream_t)(uintptr_t)handle);
		if (err == CUDA_OK)
			err = rt->StreamWaitEvent(st, j->wait, 0);
	} else if (kind == FERRY_CUDA_WAIT_EVENT) {
		err = rt->StreamWaitEvent(st, (cuda_event_t)(uintptr_t)handle, 0);
	}
	for (uint32_t i = 0; i < op->iovcnt && err == CUDA_OK && !nocopy; i++) {
		const struct ferry_seg *g = &op->segs[i];

		err = copy_pieces(s, rt, st, j->fill ? j : NULL, (char *)op->buf->data + at,
				  (const char *)g->region->addr + g->offset, g->len, &queued);
		at += g->len;
	}
	if (!ipc)
		op->len = total;
	if ((rc = job_issue(s, rt, st, j, err, queued))) {
		if (j->fill)
			pool_free(j->fill); /* (the block goes with the op's handle) */
		j->fill = NULL;
		job_give_back(s, j);
		return rc;
	}
	if (kind != CUDA_WAIT_RESTAGE)
		STAT_ADD(s->puts, 1); /* (a restaged one was counted when it went by IPC) */
	if (ipc) {
		STAT_ADD(s->ipc_puts, 1);
	} else if (direct) {
		STAT_ADD(s->direct_puts, 1);
	} else {
		STAT_ADD(s->staged_puts, 1);
		STAT_ADD(s->bytes_d2h, total);
	}
	return 0;
}

/* A GET's copies of buf (len bytes) into its segments, on job j: 0, or the error (j given back). */
static int get_issue(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j,
		     struct op *op, struct ferry_buf *buf, uint64_t len)
{
	cuda_stream_t st = svc_stream(s, rt, op_device(op));
	const char *src = buf->data;
	cuda_err_t err = CUDA_OK;
	uint64_t left = len;
	bool queued = false;
	int rc;

	if (!st) {
		job_give_back(s, j);
		return -EIO;
	}
	if (buf->flags & POOL_BUF_F_FOREIGN)
		memory_dma_source(s->e, buf); /* a peer's block: its mapping pinned here, once */
	j->op = op;
	j->kind = JOB_GET;
	j->dev = (uint8_t)op_device(op);
	j->len = len;
	for (uint32_t i = 0; i < op->iovcnt && left && err == CUDA_OK; i++) {
		const struct ferry_seg *g = &op->segs[i];
		uint64_t n = g->len < left ? g->len : left;

		err = copy_pieces(s, rt, st, NULL, (char *)g->region->addr + g->offset, src, n,
				  &queued);
		src += n;
		left -= n;
	}
	if ((rc = job_issue(s, rt, st, j, err, queued))) {
		job_give_back(s, j);
		return rc;
	}
	j->buf = buf; /* ours until the copy is done */
	STAT_ADD(s->gets, 1);
	STAT_ADD(s->bytes_h2d, len);
	return 0;
}

/*
 * Every job in flight: the op waits in order for one to end (OP_DEVICE; a
 * PUT keeps its wait in chunk / wish_seq, unused by PUTs, a GET its block in
 * buf and its length in len).
 */
static void op_wait_for_job(struct cuda_svc *s, struct op *op)
{
	op->state = OP_DEVICE;
	op_list_append(&s->wait_head, &s->wait_tail, op);
	atomic_fetch_add(&s->waiting, 1);
}

static bool op_is_put(const struct op *op)
{
	return op->opcode == FERRY_OP_PUT || op->opcode == FERRY_OP_PUBLISH;
}

static int ipc_issue(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j,
		     struct op *op, struct ferry_buf *buf);

/* Jobs free again: the ops that waited for one start, in order (or end, on an error). */
static void svc_start_waiting(struct cuda_svc *s)
{
	const struct cuda_rt *rt = atomic_load(&s->rt);

	while (s->free && s->wait_head) {
		struct op *op = s->wait_head;
		struct cuda_job *j = NULL;
		int rc;

		op_list_remove(&s->wait_head, &s->wait_tail, op);
		atomic_fetch_sub(&s->waiting, 1);
		rc = job_take(s, rt, &j);
		if (op_is_put(op)) {
			if (!rc)
				rc = put_issue(s, rt, j, op, op->chunk, op->wish_seq);
			if (rc)
				reactor_put_staged(s->e, op, rc);
		} else {
			struct ferry_buf *buf = op->buf;

			op->buf = NULL;
			if (!rc)
				rc = (op->flags & WIRE_F_CUDA_IPC) ? ipc_issue(s, rt, j, op, buf)
								   : get_issue(s, rt, j, op, buf, op->len);
			if (rc) {
				pool_free(buf); /* taken when it waited: this GET's data is lost */
				op->state = OP_FREE;
				op_complete(s->e, op, rc, 0, NULL);
			}
		}
	}
}

/*
 * The transport the PUT's peer goes through, or NULL. An unresolved peer
 * is resolved here as reactor_send would (the first that reaches it, in
 * rank order); a peer being reached by the control plane is not (NULL: it
 * is staged, its transport is not known yet).
 */
static struct backend *peer_transport(struct ferry_engine *e, struct ferry_peer *peer)
{
	if (!peer->backend) {
		for (unsigned i = 0; i < e->nbackends; i++) {
			struct backend *b = &e->backends[i];

			if (b->ops->reaching && b->data && b->ops->reaching(e, b, peer))
				return NULL;
		}
		for (unsigned i = 0; i < e->nbackends; i++) {
			struct backend *b = &e->backends[i];
			int rc;

			if (!b->ops->resolve)
				continue;
			if ((rc = b->ops->resolve(e, b, peer)) == 0) {
				peer->backend = b;
				break;
			}
			if (rc != -EHOSTUNREACH)
				return NULL;
		}
	}
	return peer->backend;
}

static bool peer_takes_ipc(struct ferry_engine *e, struct ferry_peer *peer)
{
	struct backend *t = peer_transport(e, peer);

	return t && (t->ops->caps & TRANSPORT_CAP_CUDA_IPC);
}

/*
 * A PUT of device segments whose peer's transport sends them from where
 * they are (device_in_place: GPUDirect RDMA, the NIC reads the GPU's
 * memory): OP_F_DEVICE_DIRECT, nothing staged; true. false: staged.
 */
static bool direct_describe(struct cuda_svc *s, struct op *op)
{
	struct backend *t;

	if (op->opcode != FERRY_OP_PUT || !(t = peer_transport(s->e, op->peer)) ||
	    !t->ops->device_in_place || !t->ops->device_in_place(s->e, t, op))
		return false;
	op->len = segs_total(op->segs, op->iovcnt);
	op->flags |= OP_F_DEVICE_DIRECT;
	return true;
}

/*
 * A PUT that can go by IPC (device segments only, each with its handle,
 * to a peer that takes IPC): its descriptor in op->buf, WIRE_F_CUDA_IPC
 * set (op->len: the data it names; the block's len: its own); 0. 1: it is
 * staged instead. A negative errno: no block for it.
 */
static int ipc_describe(struct cuda_svc *s, struct op *op)
{
	struct ipc_desc *d;
	uint64_t total = 0;
	size_t n;
	int rc;

	if (op->opcode != FERRY_OP_PUT || !op->iovcnt || op->iovcnt > IPC_SEGS)
		return 1;
	for (uint32_t i = 0; i < op->iovcnt; i++) {
		const struct ferry_seg *g = &op->segs[i];
		const struct cuda_reg *r;

		if (g->region->mem != FERRY_MEM_CUDA || !(r = ferry__region_reg(g->region, s->b)) ||
		    !r->ipc)
			return 1;
	}
	if (!peer_takes_ipc(s->e, op->peer))
		return 1;
	n = sizeof(*d) + op->iovcnt * sizeof(d->seg[0]);
	if ((rc = pool_alloc(s->e->pool, n, &op->buf))) {
		log_info("op %llx: pool exhausted for a CUDA IPC descriptor",
			 (unsigned long long)op->user_data);
		return rc;
	}
	d = op->buf->data;
	memset(d, 0, n);
	d->magic = IPC_MAGIC;
	d->version = IPC_VERSION;
	d->nseg = (uint16_t)op->iovcnt;
	d->pid = (int32_t)getpid();
	d->flags = IPC_F_RESTAGE;
	snprintf(d->sender, sizeof(d->sender), "%s", s->e->name);
	for (uint32_t i = 0; i < op->iovcnt; i++) {
		const struct ferry_seg *g = &op->segs[i];
		const struct cuda_reg *r = ferry__region_reg(g->region, s->b);

		d->seg[i].h = r->h;
		d->seg[i].off = r->base_off + g->offset;
		d->seg[i].len = g->len;
		d->seg[i].dev = g->region->device;
		total += g->len;
	}
	d->total = total;
	op->len = total; /* what the PUT moves (its completion's len); the block is n bytes */
	op->flags |= WIRE_F_CUDA_IPC;
	return 0;
}

static int cuda_device_put(struct ferry_engine *e, struct backend *b, struct op *op,
			   const struct ferry_sqe *sqe)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);
	struct cuda_job *j = NULL;
	int rc;

	if (!rt)
		return -ENODEV; /* not reached: no device region without the runtime */
	if (sqe->cuda_wait_kind > FERRY_CUDA_WAIT_STREAM ||
	    (sqe->cuda_wait_kind == FERRY_CUDA_WAIT_EVENT && !sqe->cuda_wait)) {
		log_error("op %llx: CUDA wait of kind %u on %#llx", (unsigned long long)op->user_data,
			  sqe->cuda_wait_kind, (unsigned long long)sqe->cuda_wait);
		return -EINVAL;
	}
	if ((rc = ipc_describe(s, op)) < 0)
		return rc;
	if (rc == 1 && direct_describe(s, op))
		rc = 0;
	if (rc == 0 && !sqe->cuda_wait_kind) {
		/* Nothing to wait for on the GPU: the descriptor, or the segments, go now. */
		STAT_ADD(s->puts, 1);
		if (op->flags & OP_F_DEVICE_DIRECT)
			STAT_ADD(s->direct_puts, 1);
		else
			STAT_ADD(s->ipc_puts, 1);
		reactor_put_staged(e, op, 0);
		return 0;
	}
	if (s->wait_head || (rc = job_take(s, rt, &j)) == -EAGAIN) {
		op->chunk = sqe->cuda_wait_kind;
		op->wish_seq = sqe->cuda_wait;
		op_wait_for_job(s, op);
		return 0;
	}
	return rc ? rc : put_issue(s, rt, j, op, sqe->cuda_wait_kind, sqe->cuda_wait);
}

/* A cache slot no copy uses is closed. */
static void ipc_close(struct cuda_svc *s, const struct cuda_rt *rt, struct ipc_open *o)
{
	cuda_err_t err = rt->IpcCloseMemHandle(o->ptr);

	if (err != CUDA_OK) {
		log_limited(FERRY__LOG_WARN, "cuda: engine %s: cudaIpcCloseMemHandle (of %s): %s",
			    s->e->name, o->peer, cuda_rt_strerror(err));
		rt->GetLastError();
	}
	o->used = false;
	STAT_ADD(s->ipc_closes, 1);
	atomic_fetch_sub(&s->ipc_cached, 1);
}

/*
 * The sender's allocation named by g, open here (from the cache, or opened
 * now: once per sender and allocation): its slot, or a negative errno
 * (logged; an open that fails is said once per engine).
 */
static int ipc_slot(struct cuda_svc *s, const struct cuda_rt *rt, const struct ipc_desc *d,
		    const struct ipc_seg *g)
{
	struct ipc_open *o, *victim = NULL, *free_slot = NULL;
	unsigned long long base = 0;
	size_t size = 0;
	cuda_err_t err;
	void *p = NULL;

	for (unsigned i = 0; i < IPC_CACHE; i++) {
		o = &s->ipc_cache[i];
		if (!o->used) {
			if (!free_slot)
				free_slot = o;
			continue;
		}
		if (!o->stale && o->pid == d->pid && !strcmp(o->peer, d->sender) &&
		    !memcmp(&o->h, &g->h, sizeof(o->h))) {
			o->last = ++s->ipc_clock;
			return (int)i;
		}
		if (!o->refs && (!victim || o->last < victim->last))
			victim = o;
	}
	if (!free_slot && !victim) {
		log_limited(FERRY__LOG_WARN, "cuda: engine %s: %u handles of other processes in "
			    "use at once: a GET of %s's device memory waits for no slot, it fails",
			    s->e->name, IPC_CACHE, d->sender);
		return -ENOBUFS;
	}
	if ((err = rt->IpcOpenMemHandle(&p, g->h, CUDA_IPC_LAZY_PEER_ACCESS)) != CUDA_OK) {
		if (!s->ipc_open_warned) {
			s->ipc_open_warned = true;
			log_warn("cuda: engine %s: the CUDA IPC handle of %s (pid %d) could not be "
				 "opened: %s (its data is asked again, staged through its pool; a "
				 "sender that cannot fails the GET with -EIO; said once)", s->e->name,
				 d->sender, (int)d->pid, cuda_rt_strerror(err));
		}
		rt->GetLastError();
		STAT_ADD(s->errors, 1);
		return -EIO;
	}
	if (!free_slot) {
		ipc_close(s, rt, victim);
		free_slot = victim;
	}
	o = free_slot;
	memset(o, 0, sizeof(*o));
	o->used = true;
	o->pid = d->pid;
	o->ptr = p;
	o->h = g->h;
	o->size = UINT64_MAX;
	if (rt->MemGetAddressRange && rt->MemGetAddressRange(&base, &size, (uintptr_t)p) == 0)
		o->size = size;
	snprintf(o->peer, sizeof(o->peer), "%s", d->sender);
	o->last = ++s->ipc_clock;
	STAT_ADD(s->ipc_opens, 1);
	atomic_fetch_add(&s->ipc_cached, 1);
	return (int)(o - s->ipc_cache);
}

/* The job's hold on the cache ends; slots of a sender that is gone close. */
static void ipc_unhold(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j)
{
	for (unsigned k = 0; k < j->nipc; k++) {
		struct ipc_open *o = &s->ipc_cache[j->ipc[k]];

		if (--o->refs == 0 && o->stale)
			ipc_close(s, rt, o);
	}
	j->nipc = 0;
}

/*
 * The descriptor in buf, copied out of the peer's memory and checked:
 * 0, or -EPROTO (logged). *d's segments go into seg.
 */
static int ipc_read(struct cuda_svc *s, const struct op *op, const struct ferry_buf *buf,
		    struct ipc_desc *d, struct ipc_seg *seg)
{
	uint64_t total = 0;

	if (buf->len < sizeof(*d))
		goto bad;
	memcpy(d, buf->data, sizeof(*d));
	if (d->magic != IPC_MAGIC || d->version != IPC_VERSION || !d->nseg || d->nseg > IPC_SEGS ||
	    buf->len != sizeof(*d) + d->nseg * sizeof(*seg) || !memchr(d->sender, 0, sizeof(d->sender)))
		goto bad;
	memcpy(seg, (const char *)buf->data + sizeof(*d), d->nseg * sizeof(*seg));
	for (unsigned i = 0; i < d->nseg; i++) {
		if (seg[i].len > UINT64_MAX - total || seg[i].off > UINT64_MAX - seg[i].len)
			goto bad;
		total += seg[i].len;
	}
	if (total != d->total)
		goto bad;
	return 0;
bad:
	log_error("cuda: engine %s: GET %llx: a malformed CUDA IPC descriptor (%llu bytes)",
		  s->e->name, (unsigned long long)op->user_data, (unsigned long long)buf->len);
	return -EPROTO;
}

/* Destination i of a GET (segments or iovec): where and how long. */
static void op_dst(const struct op *op, uint32_t i, char **p, uint64_t *n)
{
	if (op->flags & FERRY_SQE_SEGS) {
		*p = (char *)op->segs[i].region->addr + op->segs[i].offset;
		*n = op->segs[i].len;
	} else {
		*p = op->iov[i].iov_base;
		*n = op->iov[i].iov_len;
	}
}

/*
 * A GET of another process's device memory (buf: its descriptor), on job
 * j: the copies from the opened handles into the GET's destination, host
 * or device. 0 (buf is held until they are done, then given back: the
 * sender's PUT ends), or the error (j given back, nothing runs).
 */
static int ipc_issue(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j,
		     struct op *op, struct ferry_buf *buf)
{
	struct ipc_desc d;
	struct ipc_seg seg[IPC_SEGS];
	cuda_stream_t st;
	cuda_err_t err = CUDA_OK;
	char *dst = NULL;
	uint64_t dleft = 0;
	uint32_t di = 0;
	bool queued = false;
	int rc, dev;

	j->nipc = 0;
	if ((rc = ipc_read(s, op, buf, &d, seg))) /* (its length was checked by ipc_probe) */
		goto out;
	dev = (op->flags & OP_F_DEVICE) ? op_device(op) : seg[0].dev;
	if (dev < 0 || dev >= CUDA_MAX_DEV || dev >= rt->devices)
		dev = 0;
	if (!(st = svc_stream(s, rt, dev))) {
		rc = -EIO;
		goto out;
	}
	for (unsigned i = 0; i < d.nseg; i++) {
		int slot = ipc_slot(s, rt, &d, &seg[i]);

		if (slot < 0) {
			rc = slot;
			goto out;
		}
		if (seg[i].off > s->ipc_cache[slot].size ||
		    seg[i].len > s->ipc_cache[slot].size - seg[i].off) {
			log_error("cuda: engine %s: GET %llx: a CUDA IPC descriptor of %s reaches "
				  "past its allocation", s->e->name,
				  (unsigned long long)op->user_data, d.sender);
			rc = -EPROTO;
			goto out;
		}
		s->ipc_cache[slot].refs++;
		j->ipc[j->nipc++] = (uint8_t)slot;
	}
	for (unsigned i = 0; i < d.nseg && err == CUDA_OK; i++) {
		const char *src = (const char *)s->ipc_cache[j->ipc[i]].ptr + seg[i].off;
		uint64_t left = seg[i].len;

		while (left && err == CUDA_OK) {
			uint64_t n;

			while (!dleft && di < op->iovcnt)
				op_dst(op, di++, &dst, &dleft);
			if (!dleft)
				break; /* not reached: the total fits (ipc_probe checked it) */
			n = left < dleft ? left : dleft;
			err = copy_pieces(s, rt, st, NULL, dst, src, n, &queued);
			src += n;
			dst += n;
			dleft -= n;
			left -= n;
		}
	}
	j->op = op;
	j->kind = JOB_GET;
	j->dev = (uint8_t)dev;
	j->len = d.total;
	if ((rc = job_issue(s, rt, st, j, err, queued)))
		goto out;
	j->buf = buf; /* until the copies are done: then the sender's PUT ends */
	STAT_ADD(s->ipc_gets, 1);
	STAT_ADD(s->ipc_bytes, d.total);
	return 0;
out:
	ipc_unhold(s, rt, j);
	job_give_back(s, j);
	return rc;
}

/*
 * A descriptor checked, and its handles opened (or found in the cache), as
 * it reaches its GET, before the GET takes a job or waits for one: 0;
 * -EPROTO (malformed, logged) or -EMSGSIZE (the data does not fit the GET:
 * op->len says its length), the data staying for another GET;
 * MEMORY_DEVICE_RESEND when a handle does not open here and its sender
 * restages on request (IPC_F_RESTAGE: the engine gives the descriptor back
 * asking for the data staged, and the GET waits for it). A handle that does
 * not open otherwise is left to ipc_issue, which says it.
 */
static int ipc_probe(struct cuda_svc *s, const struct cuda_rt *rt, struct op *op,
		     const struct ferry_buf *buf)
{
	struct ipc_desc d;
	struct ipc_seg seg[IPC_SEGS];
	int rc;

	if ((rc = ipc_read(s, op, buf, &d, seg)))
		return rc;
	if (d.total > op->len) {
		log_info("GET %llx: %llu bytes do not fit its %llu-byte destination",
			 (unsigned long long)op->user_data, (unsigned long long)d.total,
			 (unsigned long long)op->len);
		op->len = d.total; /* the CQE says what would fit, as for host data */
		return -EMSGSIZE;
	}
	if (!(d.flags & IPC_F_RESTAGE))
		return 0;
	for (unsigned i = 0; i < d.nseg; i++) {
		if (ipc_slot(s, rt, &d, &seg[i]) != -EIO)
			continue;
		STAT_ADD(s->ipc_resends, 1);
		log_limited(FERRY__LOG_WARN, "cuda: engine %s: GET %llx: the CUDA IPC handle of %s "
			    "does not open here: its data is asked again, staged through its pool",
			    s->e->name, (unsigned long long)op->user_data, d.sender);
		return MEMORY_DEVICE_RESEND;
	}
	return 0;
}

/*
 * A GET that cannot copy from a descriptor's handles (why): MEMORY_DEVICE_RESEND
 * when its sender restages on request (the data comes again through its
 * pool, as host memory any GET takes); else the error, logged.
 */
static int ipc_restage_or(struct cuda_svc *s, const struct op *op, const struct ferry_buf *buf,
			  int err, const char *why)
{
	struct ipc_desc d;
	struct ipc_seg seg[IPC_SEGS];

	if (ipc_read(s, op, buf, &d, seg) == 0 && (d.flags & IPC_F_RESTAGE)) {
		STAT_ADD(s->ipc_resends, 1);
		log_limited(FERRY__LOG_INFO, "cuda: engine %s: GET %llx: %s's data is in its CUDA "
			    "device memory and %s: asked again, staged through its pool", s->e->name,
			    (unsigned long long)op->user_data, d.sender, why);
		return MEMORY_DEVICE_RESEND;
	}
	log_error("cuda: engine %s: GET %llx: the data is another process's CUDA device memory "
		  "and %s", s->e->name, (unsigned long long)op->user_data, why);
	return err;
}

static void handout_release(struct ferry_buf *buf, void *ctx);

/*
 * A GET for a buffer that welcomes device memory (FERRY_SQE_DEVICE_BUF), of
 * a descriptor of one segment: the sender's allocation opened here (the
 * cache), and a foreign handle over the segment handed out in the CQE, no
 * copy at all. The handle holds the slot and the descriptor's block until
 * it is released (handouts_flush): then the block goes back and the
 * sender's PUT ends. A descriptor of several segments (one buffer is one
 * piece of memory), or no room for another handout, comes staged instead.
 * 0: the GET is completed.
 */
static int ipc_hand_out(struct cuda_svc *s, const struct cuda_rt *rt, struct op *op,
			struct ferry_buf *buf)
{
	struct cuda_ptr_attr a;
	struct ipc_desc d;
	struct ipc_seg seg[IPC_SEGS];
	struct ferry_buf *out;
	struct ipc_open *o;
	uint32_t h;
	int rc, slot, dev;

	if ((rc = ipc_read(s, op, buf, &d, seg)))
		return rc;
	if (d.nseg != 1)
		return ipc_restage_or(s, op, buf, -EOPNOTSUPP,
				      "it names several device segments, and a device buffer is one "
				      "piece of memory");
	if (!s->nhandouts_free)
		return ipc_restage_or(s, op, buf, -ENOBUFS, "256 device buffers are out already");
	dev = seg[0].dev >= 0 && seg[0].dev < CUDA_MAX_DEV && seg[0].dev < rt->devices ? seg[0].dev
										       : 0;
	if (!svc_stream(s, rt, dev)) /* (its device current here, as for a copy: the mapping's) */
		return ipc_restage_or(s, op, buf, -EIO, "its device cannot be made current here");
	if ((slot = ipc_slot(s, rt, &d, &seg[0])) < 0)
		return ipc_restage_or(s, op, buf, slot,
				      slot == -EIO ? "its handle does not open here"
						   : "every handle slot is in use");
	o = &s->ipc_cache[slot];
	if (!o->handout_refs && s->hslots >= IPC_CACHE - IPC_SEGS)
		/* The rest stay for copies: a GET of IPC_SEGS segments must find its slots. */
		return ipc_restage_or(s, op, buf, -ENOBUFS, "device buffers out hold 48 of the 64 "
				      "handle slots");
	if (seg[0].off > o->size || seg[0].len > o->size - seg[0].off) {
		log_error("cuda: engine %s: GET %llx: a CUDA IPC descriptor of %s reaches past its "
			  "allocation", s->e->name, (unsigned long long)op->user_data, d.sender);
		return -EPROTO;
	}
	if ((rc = pool_wrap(s->e->pool, (char *)o->ptr + seg[0].off, seg[0].len, 0,
			    handout_release, s, &out)))
		return ipc_restage_or(s, op, buf, rc, "no buffer handle is free in its pool");
	h = s->handouts_free[--s->nhandouts_free];
	s->handouts[h].desc = buf;
	s->handouts[h].slot = (uint8_t)slot;
	o->refs++;
	if (o->handout_refs++ == 0)
		s->hslots++;
	out->remote_cookie = h;
	out->device = seg[0].dev;
	memset(&a, 0, sizeof(a));
	if (rt->PointerGetAttributes && rt->PointerGetAttributes(&a, out->data) == CUDA_OK &&
	    a.type == CUDA_MEM_TYPE_DEVICE)
		out->device = a.device; /* its ordinal in this process */
	else
		rt->GetLastError();
	out->flags |= POOL_BUF_F_DEVICE;
	atomic_fetch_add(&s->refs, 1);
	atomic_fetch_add(&s->handouts_live, 1);
	STAT_ADD(s->ipc_handouts, 1);
	STAT_ADD(s->ipc_bytes, d.total);
	op_complete(s->e, op, 0, d.total, out);
	return 0;
}

/* A handout ends (progress, or a release after fini under s->lock): slot, block, handle. */
static void handout_end(struct cuda_svc *s, const struct cuda_rt *rt, struct ferry_buf *out,
			bool closed)
{
	struct handout *h = &s->handouts[out->remote_cookie];
	struct ipc_open *o = &s->ipc_cache[h->slot];
	struct ferry_buf *desc = h->desc;

	if (--o->handout_refs == 0)
		s->hslots--;
	if (--o->refs == 0 && (o->stale || closed)) {
		if (closed) { /* (the engine is gone: no name to log with) */
			if (rt->IpcCloseMemHandle(o->ptr) != CUDA_OK)
				rt->GetLastError();
			o->used = false;
		} else {
			ipc_close(s, rt, o);
		}
	}
	h->desc = NULL;
	s->handouts_free[s->nhandouts_free++] = (uint32_t)(h - s->handouts);
	atomic_fetch_sub(&s->handouts_live, 1);
	out->flags &= ~POOL_BUF_F_DEVICE;
	pool_wrap_done(out);
	pool_free(desc); /* the sender's block goes back: its PUT ends */
}

/* Any thread: a device buffer handed out was released. */
static void handout_release(struct ferry_buf *buf, void *ctx)
{
	struct cuda_svc *s = ctx;

	atomic_fetch_add(&s->rel_users, 1);
	if (atomic_load(&s->closed)) {
		atomic_fetch_sub(&s->rel_users, 1);
		pthread_mutex_lock(&s->lock);
		handout_end(s, atomic_load(&s->rt), buf, true);
		pthread_mutex_unlock(&s->lock);
		svc_unref(s);
		return;
	}
	pool_release_push(&s->released, buf);
	ferry__backend_wake(s->e, s->b); /* handouts_flush runs in a round */
	atomic_fetch_sub(&s->rel_users, 1);
}

/* Progress: the handouts released since the last round end. */
static int handouts_flush(struct cuda_svc *s)
{
	struct ferry_buf *list = atomic_exchange_explicit(&s->released, NULL, memory_order_acquire);
	const struct cuda_rt *rt = atomic_load(&s->rt);
	int n = 0;

	while (list) {
		struct ferry_buf *buf = list;

		list = atomic_load_explicit(&buf->release_next, memory_order_relaxed);
		handout_end(s, rt, buf, false);
		svc_unref(s); /* (the engine's reference stays: never the last here) */
		n++;
	}
	return n;
}

/* A GET of a CUDA IPC descriptor: the runtime is loaded here if it is not yet. */
static int ipc_get(struct cuda_svc *s, struct op *op, struct ferry_buf *buf)
{
	const char *why = "";
	const struct cuda_rt *rt = svc_runtime(s, &why);
	struct cuda_job *j = NULL;
	int rc;

	if (!op->iovcnt && !(op->flags & FERRY_SQE_DEVICE_BUF))
		return ipc_restage_or(s, op, buf, -EOPNOTSUPP,
				      "a GET for a buffer takes host memory from a pool "
				      "(FERRY_SQE_DEVICE_BUF takes the device memory itself)");
	if (!rt)
		return ipc_restage_or(s, op, buf, -ENODEV, why);
	if (!rt->IpcOpenMemHandle || !rt->IpcCloseMemHandle)
		return ipc_restage_or(s, op, buf, -EOPNOTSUPP, "the runtime here has no CUDA IPC");
	if (!op->iovcnt)
		return ipc_hand_out(s, rt, op, buf);
	if ((rc = ipc_probe(s, rt, op, buf)))
		return rc;
	if (s->wait_head || (rc = job_take(s, rt, &j)) == -EAGAIN) {
		op->buf = buf;
		op->flags |= WIRE_F_CUDA_IPC; /* (a GET's flags never travel) */
		op_wait_for_job(s, op);
		return 0;
	}
	return rc ? rc : ipc_issue(s, rt, j, op, buf);
}

static int cuda_device_get(struct ferry_engine *e, struct backend *b, struct op *op,
			   struct ferry_buf *buf, uint64_t len, uint32_t wflags)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);
	struct cuda_job *j = NULL;
	int rc;

	(void)e;
	if (wflags & WIRE_F_CUDA_IPC)
		return ipc_get(s, op, buf);
	if (!rt)
		return -ENODEV;
	if (s->wait_head || (rc = job_take(s, rt, &j)) == -EAGAIN) {
		op->buf = buf;
		op->len = len; /* its capacity was checked: from now on what came */
		op_wait_for_job(s, op);
		return 0;
	}
	return rc ? rc : get_issue(s, rt, j, op, buf, len);
}

/*
 * An IPC PUT whose receiver could not open our handles (its RELEASE asked
 * for the data again): staged now, with no wait (the caller's was met
 * before the descriptor went), then sent as a plain PUT.
 */
static int cuda_device_restage(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);
	struct cuda_job *j = NULL;
	int rc;

	if (!rt)
		return -ENODEV; /* not reached: the PUT's regions found the runtime */
	if (op->flags & OP_F_DEVICE_DIRECT) {
		op->flags &= ~OP_F_DEVICE_DIRECT;
		STAT_ADD(s->direct_restaged, 1);
		log_info("cuda: engine %s: PUT %llx: %s is now reached by a transport that does not "
			 "read device memory in place: staged through the pool", e->name,
			 (unsigned long long)op->user_data, op->peer ? op->peer->name : "?");
	} else {
		STAT_ADD(s->ipc_restaged, 1);
		log_info("cuda: engine %s: PUT %llx: %s could not open our CUDA IPC handle: sent "
			 "again, staged through the pool", e->name, (unsigned long long)op->user_data,
			 op->peer ? op->peer->name : "?");
	}
	if (s->wait_head || (rc = job_take(s, rt, &j)) == -EAGAIN) {
		op->chunk = CUDA_WAIT_RESTAGE;
		op->wish_seq = 0;
		op_wait_for_job(s, op);
		return 0;
	}
	return rc ? rc : put_issue(s, rt, j, op, CUDA_WAIT_RESTAGE, 0);
}

/* A block being filled has more, or failed: every transport that sends such blocks looks. */
static void tell_filling(struct cuda_svc *s)
{
	for (unsigned i = 0; i < s->e->nbackends; i++) {
		struct backend *t = &s->e->backends[i];

		if (t->data && t->ops->sends_filling && t->ops->staged_more) {
			backend_busy(t);
			t->ops->staged_more(s->e, t);
		}
	}
}

/* A job whose event says it is done (res: its result): the op goes on, or ends. */
static void job_end(struct cuda_svc *s, struct cuda_job *j, int res)
{
	struct op *op = j->op;
	struct ferry_buf *buf = j->buf;
	uint64_t len = j->len;
	uint32_t gen = j->gen; /* read before j is given back: a waiting op may take it at once */
	enum job_kind kind = j->kind;
	bool handed = j->handed, deferred = j->deferred;
	int deferred_res = j->deferred_res;
	uint64_t deferred_len = j->deferred_len;

	atomic_fetch_sub(&s->inflight, 1);
	STAT_ADD(s->jobs_ended, 1);
	STAT_ADD(s->job_ns, ferry__now_ns() - j->issued);
	if (j->nipc)
		ipc_unhold(s, atomic_load(&s->rt), j);
	if (j->fill) {
		/* Pipelined: the block is filled, or never will be; our handle goes. */
		struct ferry_buf *root = j->fill->share_root;

		root->filled = res ? POOL_FILL_FAILED : root->len;
		pool_free(j->fill);
		j->fill = NULL;
	}
	job_give_back(s, j);
	svc_start_waiting(s); /* before this op goes on: the ones waiting keep their order */
	if (handed) {
		/* The op is its transport's (or ended, kept for now): it sends the rest or gives up. */
		if (res)
			log_error("cuda: engine %s: a PUT's device copy failed while its first part "
				  "was being sent: its transport drops it", s->e->name);
		tell_filling(s);
		if (op->gen == gen && (op->flags & OP_F_FILLING)) {
			/*
			 * Its device memory is not read any more. A failed one keeps
			 * the flag: its block, if it is ever given back to be sent
			 * again, is refused (reactor_send).
			 */
			if (deferred) {
				op->flags &= ~OP_F_FILLING;
				op->state = OP_FREE;
				op_complete(s->e, op, deferred_res, deferred_len, NULL);
			} else if (!res) {
				op->flags &= ~OP_F_FILLING;
			}
		}
		return;
	}
	if (op->state != OP_DEVICE || op->gen != gen) {
		log_error("cuda: engine %s: a device copy ended for an op that moved on", s->e->name);
		if (buf)
			pool_free(buf);
		return;
	}
	if (kind == JOB_PUT) {
		reactor_put_staged(s->e, op, res);
		return;
	}
	pool_free(buf); /* back to its owner (a peer's block: the peer's pool) */
	op->state = OP_FREE;
	op_complete(s->e, op, res, res ? 0 : len, NULL);
}

/*
 * A pipelined PUT's marks seen passed: its block is filled that far, and
 * its transport has the op from the first on (taken again for the peer
 * now: one that no longer sends a block while it is filled gets it whole,
 * at the job's end) and is told of each next. Returns the marks seen.
 */
static int job_marks(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j)
{
	struct op *op = j->op;
	struct backend *t;
	int n = 0;

	while (j->marks_seen < j->nmarks && !j->res) {
		cuda_err_t err = rt->EventQuery(j->marks[j->marks_seen]);

		if (err == CUDA_ERR_NOT_READY)
			break;
		if (err != CUDA_OK) {
			/* A piece before it failed: the block is never whole (the job ends so). */
			log_error("cuda: engine %s: op %llx: a device copy failed: %s", s->e->name,
				  (unsigned long long)op->user_data, cuda_rt_strerror(err));
			rt->GetLastError();
			STAT_ADD(s->errors, 1);
			j->res = -EIO;
			break;
		}
		j->fill->share_root->filled = j->mark_at[j->marks_seen++];
		n++;
	}
	if (!n)
		return 0;
	if (j->handed) {
		tell_filling(s); /* (the op may have moved to another transport since) */
		return n;
	}
	if (op->state != OP_DEVICE || op->gen != j->gen || !(t = peer_transport(s->e, op->peer)) ||
	    !t->ops->sends_filling)
		return n;
	j->handed = true;
	op->flags |= OP_F_FILLING;
	STAT_ADD(s->pipelined_puts, 1);
	reactor_put_staged(s->e, op, 0); /* its deadline runs from now, as for any staged PUT */
	return n;
}

/*
 * A pipelined PUT ends (a CANCEL, its deadline, its link lost) while its
 * copies still read the caller's device memory: kept (OP_DEVICE), and
 * completed with res when they end (job_end), so that the caller never
 * frees or writes memory that is still read. Its pins stay until then.
 */
static bool cuda_device_defer(struct ferry_engine *e, struct backend *b, struct op *op, int res,
			      uint64_t len)
{
	struct cuda_svc *s = b->data;

	(void)e;
	for (struct cuda_job *j = s ? s->busy : NULL; j; j = j->next) {
		if (j->op != op || j->gen != op->gen || !j->handed || j->deferred)
			continue;
		j->deferred = true;
		j->deferred_res = res;
		j->deferred_len = len;
		op->state = OP_DEVICE;
		return true;
	}
	op->flags &= ~OP_F_FILLING;
	return false;
}

/* The result of a job whose event completed, or 1 while it runs. */
static int job_poll(struct cuda_svc *s, const struct cuda_rt *rt, struct cuda_job *j)
{
	cuda_err_t err = rt->EventQuery(j->done);

	if (err == CUDA_ERR_NOT_READY)
		return 1;
	if (err != CUDA_OK) {
		log_error("cuda: engine %s: op %llx: its device copy failed: %s", s->e->name,
			  (unsigned long long)j->op->user_data, cuda_rt_strerror(err));
		rt->GetLastError();
		STAT_ADD(s->errors, 1);
		return -EIO;
	}
	return j->res;
}

static int cuda_progress(struct ferry_engine *e, struct backend *b)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt;
	struct cuda_job *j, *next, *prev = NULL;
	uint32_t blocked = 0; /* devices whose stream has a job still running */
	int n = 0, res;

	(void)e;
	if (atomic_load_explicit(&s->released, memory_order_relaxed))
		n += handouts_flush(s);
	if (!s->busy) {
		/*
		 * No job out: nothing to poll until one is issued (jobs are
		 * issued only on the progress side: job_issue clears quiet) or a
		 * device buffer is released (its hook wakes us): skip the rounds,
		 * then look once more.
		 */
		ferry__backend_quiet(b);
		if (atomic_load(&s->released))
			backend_busy(b);
		return n;
	}
	rt = atomic_load(&s->rt);
	for (j = s->busy; j; j = next) {
		next = j->next;
		/*
		 * Behind a running job of its stream a job is not asked: it may have
		 * ended between the two queries, and jobs of a stream end in order.
		 */
		if ((blocked & (1u << j->dev)) || (res = job_poll(s, rt, j)) == 1) {
			if (!(blocked & (1u << j->dev)) && j->marks_seen < j->nmarks)
				n += job_marks(s, rt, j);
			blocked |= 1u << j->dev;
			prev = j;
			continue;
		}
		if (prev)
			prev->next = next;
		else
			s->busy = next;
		if (s->busy_tail == j)
			s->busy_tail = prev;
		job_end(s, j, res); /* may issue new jobs: they join behind the tail */
		n++;
	}
	return n;
}

static bool cuda_has_work(struct ferry_engine *e, struct backend *b)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt;

	(void)e;
	if (s && atomic_load_explicit(&s->released, memory_order_relaxed))
		return true;
	if (!s || !s->busy)
		return false;
	rt = atomic_load(&s->rt);
	for (struct cuda_job *j = s->busy; j; j = j->next)
		if (rt->EventQuery(j->done) != CUDA_ERR_NOT_READY ||
		    (j->marks_seen < j->nmarks &&
		     rt->EventQuery(j->marks[j->marks_seen]) != CUDA_ERR_NOT_READY))
			return true;
	return false;
}

/*
 * Before a sleep: each stream with a job out gets a host function behind
 * its last job (cuda_ring: the doorbell), unless the last one queued is
 * already behind it; then one more look. While the reactor spins it sees
 * jobs end by cudaEventQuery alone: a host function in a stream holds that
 * stream until a CPU thread of the runtime has run it, and with two
 * processes on one GPU that cost every copy of the other side (an H200: a
 * 64 B copy out of another process's memory seen done ~200 us after it was
 * queued with one behind every job, against ~10 us with none). A host
 * function that cannot be queued calls the sleep off (the reactor spins on).
 */
static bool cuda_prepare_sleep(struct ferry_engine *e, struct backend *b)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt;
	uint32_t devs = 0;
	cuda_err_t err;

	if (!s || !s->busy)
		return false;
	rt = atomic_load(&s->rt);
	for (struct cuda_job *j = s->busy; j; j = j->next)
		devs |= 1u << j->dev;
	for (int d = 0; d < CUDA_MAX_DEV; d++) {
		if (!(devs & (1u << d)) || s->rung_for[d] == s->issued[d])
			continue;
		if ((err = rt->LaunchHostFunc(s->stream[d], cuda_ring, s)) != CUDA_OK) {
			log_limited(FERRY__LOG_WARN, "cuda: engine %s: cudaLaunchHostFunc: %s (the "
				    "reactor spins until its copies end)", e->name, cuda_rt_strerror(err));
			rt->GetLastError();
			return true;
		}
		s->rung_for[d] = s->issued[d];
	}
	return cuda_has_work(e, b);
}

/*
 * Teardown: the streams are synchronized (the pool and the ops' memory
 * must outlive every copy), every job ends as its copy did (a staged PUT
 * with -ECONNRESET: the engine is going), the pool is unpinned.
 */
static void cuda_fini(struct ferry_engine *e, struct backend *b)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);

	(void)e;
	while (s->wait_head) { /* never started: they end here */
		struct op *op = s->wait_head;

		op_list_remove(&s->wait_head, &s->wait_tail, op);
		if (op_is_put(op)) {
			reactor_put_staged(s->e, op, -ECONNRESET);
		} else {
			pool_free(op->buf);
			op->buf = NULL;
			op->state = OP_FREE;
			op_complete(s->e, op, -ECONNRESET, 0, NULL);
		}
	}
	if (rt) {
		for (int d = 0; d < CUDA_MAX_DEV; d++)
			if (s->stream[d])
				rt->StreamSynchronize(s->stream[d]);
		while (s->busy) {
			struct cuda_job *j = s->busy;
			int res = job_poll(s, rt, j);

			s->busy = j->next;
			if (j->kind == JOB_PUT && res == 0)
				res = -ECONNRESET;
			job_end(s, j, res);
		}
		s->busy_tail = NULL;
		for (unsigned i = 0; i < CUDA_JOBS; i++) {
			if (s->jobs[i].done)
				rt->EventDestroy(s->jobs[i].done);
			if (s->jobs[i].wait)
				rt->EventDestroy(s->jobs[i].wait);
			for (unsigned k = 0; k < CUDA_MARKS; k++)
				if (s->jobs[i].marks[k])
					rt->EventDestroy(s->jobs[i].marks[k]);
		}
		/*
		 * Device buffers still out keep their slots open: their releases
		 * (any thread, later) end them and close the slots (closed).
		 */
		atomic_store(&s->closed, 1);
		while (atomic_load(&s->rel_users))
			cpu_relax();
		pthread_mutex_lock(&s->lock); /* releases from now on end their handouts under it */
		handouts_flush(s);
		if (atomic_load(&s->handouts_live))
			log_warn("cuda: engine %s destroyed with %u device buffers still out: their "
				 "senders' PUTs end now (-ECONNRESET, with the connections), and what "
				 "the buffers read from now on is the senders' to change; release them",
				 s->e->name, atomic_load(&s->handouts_live));
		for (unsigned i = 0; i < IPC_CACHE; i++)
			if (s->ipc_cache[i].used && !s->ipc_cache[i].refs)
				ipc_close(s, rt, &s->ipc_cache[i]);
		pthread_mutex_unlock(&s->lock);
		for (int d = 0; d < CUDA_MAX_DEV; d++)
			if (s->stream[d])
				rt->StreamDestroy(s->stream[d]);
		if (atomic_load(&s->pool_pinned))
			rt->HostUnregister(s->pool_addr);
		rt->GetLastError();
	}
	atomic_store(&s->closed, 1); /* (without a runtime, no handout was made) */
	b->data = NULL;
	svc_unref(s); /* the engine's: the last one unless device buffers are still out */
}

/*
 * A sender's connection is lost, or the engine is dead: its handles close
 * here (now, or when the last copy from them ends); a sender that comes
 * back is a new process, whose handles are opened anew.
 */
static void cuda_peer_event(struct ferry_engine *e, struct backend *b, const char *name,
			    enum peer_event ev, int res)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);

	(void)e;
	(void)ev;
	(void)res;
	if (!rt)
		return;
	for (unsigned i = 0; i < IPC_CACHE; i++) {
		struct ipc_open *o = &s->ipc_cache[i];

		if (!o->used || o->stale || strcmp(o->peer, name))
			continue;
		o->stale = true;
		if (!o->refs)
			ipc_close(s, rt, o);
	}
}

/*
 * The driver asks the calling thread's current context: the device's
 * primary one (the runtime's) is pushed for a driver call (ctx_enter) and
 * popped after (ctx_leave), so the thread is given back as it was (no
 * context, or its own). *cudev: the device pushed, -1 when none was.
 */
static void ctx_enter(const struct cuda_rt *rt, int device, int *cudev)
{
	void *ctx = NULL;
	int d;

	*cudev = -1;
	if (!rt->DeviceGet || !rt->DevicePrimaryCtxRetain || !rt->CtxPushCurrent ||
	    !rt->CtxPopCurrent || !rt->DevicePrimaryCtxRelease || rt->DeviceGet(&d, device) != 0 ||
	    rt->DevicePrimaryCtxRetain(&ctx, d) != 0)
		return;
	if (rt->CtxPushCurrent(ctx) == 0)
		*cudev = d;
	else
		rt->DevicePrimaryCtxRelease(d);
}

static void ctx_leave(const struct cuda_rt *rt, int cudev)
{
	void *was;

	if (cudev < 0)
		return;
	rt->CtxPopCurrent(&was);
	rt->DevicePrimaryCtxRelease(cudev);
}

/*
 * The allocation that holds device memory at addr: its base and size, and
 * the driver's id of it (CU_POINTER_ATTRIBUTE_BUFFER_ID: never the same for
 * two allocations of a process), by which a registration of it made before
 * is known to be of the same memory still. 0, or a negative errno.
 */
static int cuda_device_allocation(struct ferry_engine *e, struct backend *b, void *addr,
				  int device, uint64_t *base, uint64_t *size, uint64_t *id)
{
	struct cuda_svc *s = b->data;
	const char *why = "";
	const struct cuda_rt *rt = svc_runtime(s, &why);
	unsigned long long bs = 0, bid = 0;
	size_t sz = 0;
	int cudev, err;

	(void)e;
	if (!rt)
		return -ENODEV;
	if (!rt->MemGetAddressRange || !rt->PointerGetAttribute)
		return -EOPNOTSUPP;
	ctx_enter(rt, device, &cudev);
	err = rt->MemGetAddressRange(&bs, &sz, (uintptr_t)addr);
	if (!err)
		err = rt->PointerGetAttribute(&bid, CUDA_POINTER_ATTR_BUFFER_ID, (uintptr_t)addr);
	ctx_leave(rt, cudev);
	if (err)
		return -EIO;
	*base = bs;
	*size = sz;
	*id = bid;
	return 0;
}

/*
 * GPUDirect RDMA: a dma-buf of the device memory [addr, addr + len), for a
 * NIC's registration. The driver exports whole host pages: the range asked
 * for is [addr, addr + len) widened to them (a device allocation is
 * aligned far beyond a page, so the widened range stays inside it). It is
 * asked on the calling thread (the one registering the region; the other
 * transports' mem_register runs before this domain's vets the region: a
 * pointer that is no device memory fails here too, and then there), with
 * the region's device's primary context (the runtime's, where the
 * application's allocator runs) pushed for the call and popped after.
 */
static int cuda_device_dmabuf(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
			      int device, int *fd, uint64_t *offset, const char **why)
{
	static __thread char text[160];
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = svc_runtime(s, why);
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start, end;
	int h = -1, err, cudev = -1;

	(void)e;
	*fd = -1;
	if (!rt)
		return -ENODEV;
	if (!rt->MemGetHandleForAddressRange) {
		*why = "the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7 on)";
		return -EOPNOTSUPP;
	}
	start = (uintptr_t)addr & ~(page - 1);
	end = ((uintptr_t)addr + len + page - 1) & ~(page - 1);
	ctx_enter(rt, device, &cudev);
	err = rt->MemGetHandleForAddressRange(&h, start, (size_t)(end - start),
					      CUDA_RANGE_DMA_BUF_FD, 0);
	ctx_leave(rt, cudev);
	if (err != 0 || h < 0) {
		/* A CUresult, not a cudaError_t: 801 is CUDA_ERROR_NOT_SUPPORTED. */
		snprintf(text, sizeof(text), "cuMemGetHandleForAddressRange: CUresult %d%s", err,
			 err == 801 ? " (not supported: the driver or the kernel has no dma-buf "
				      "export)" : "");
		*why = text;
		return err == 801 ? -EOPNOTSUPP : -EIO;
	}
	*fd = h;
	*offset = (uintptr_t)addr - start;
	return 0;
}

static int cuda_health(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct cuda_svc *s = b->data;
	const struct cuda_rt *rt = atomic_load(&s->rt);

	(void)e;
	/* Not loaded yet is said as such: health never loads the runtime. */
	return snprintf(buf, len,
			",\"cuda\":{\"available\":%s,\"why\":\"%s\",\"devices\":%d,"
			"\"pool_pinned\":%s,\"regions\":%u,\"in_flight\":%u,\"waiting\":%u,\"puts\":%llu,"
			"\"gets\":%llu,\"bytes_d2h\":%llu,\"bytes_h2d\":%llu,\"callbacks\":%llu,"
			"\"errors\":%llu,\"ipc_regions\":%u,\"ipc_puts\":%llu,\"staged_puts\":%llu,"
			"\"ipc_gets\":%llu,\"ipc_bytes\":%llu,\"ipc_opens\":%llu,\"ipc_closes\":%llu,"
			"\"ipc_open\":%u,\"ipc_resends\":%llu,\"ipc_restaged\":%llu,\"jobs_ended\":%llu,"
			"\"job_ns\":%llu,\"direct_puts\":%llu,\"direct_restaged\":%llu,"
			"\"pipelined_puts\":%llu,\"ipc_handouts\":%llu,\"handouts_out\":%u}",
			rt ? "true" : "false", rt ? "" : cuda_rt_why(),
			rt ? rt->devices : 0, atomic_load(&s->pool_pinned) ? "true" : "false",
			atomic_load(&s->regions), atomic_load(&s->inflight), atomic_load(&s->waiting),
			(unsigned long long)STAT_GET(s->puts), (unsigned long long)STAT_GET(s->gets),
			(unsigned long long)STAT_GET(s->bytes_d2h),
			(unsigned long long)STAT_GET(s->bytes_h2d),
			(unsigned long long)atomic_load(&s->callbacks),
			(unsigned long long)STAT_GET(s->errors), atomic_load(&s->ipc_regions),
			(unsigned long long)STAT_GET(s->ipc_puts),
			(unsigned long long)STAT_GET(s->staged_puts),
			(unsigned long long)STAT_GET(s->ipc_gets),
			(unsigned long long)STAT_GET(s->ipc_bytes),
			(unsigned long long)STAT_GET(s->ipc_opens),
			(unsigned long long)STAT_GET(s->ipc_closes), atomic_load(&s->ipc_cached),
			(unsigned long long)STAT_GET(s->ipc_resends),
			(unsigned long long)STAT_GET(s->ipc_restaged),
			(unsigned long long)STAT_GET(s->jobs_ended),
			(unsigned long long)STAT_GET(s->job_ns),
			(unsigned long long)STAT_GET(s->direct_puts),
			(unsigned long long)STAT_GET(s->direct_restaged),
			(unsigned long long)STAT_GET(s->pipelined_puts),
			(unsigned long long)STAT_GET(s->ipc_handouts), atomic_load(&s->handouts_live));
}

const struct backend_ops ferry__cuda_backend = {
	.name = "cuda",
	.rank = 90,
	.caps = TRANSPORT_CAP_MEM_CUDA,
	.init = cuda_init,
	.fini = cuda_fini,
	.progress = cuda_progress,
	.has_work = cuda_has_work,
	.prepare_sleep = cuda_prepare_sleep,
	.health = cuda_health,
	.peer_event = cuda_peer_event,
	.mem_register = cuda_mem_register,
	.mem_deregister = cuda_mem_deregister,
	.device_put = cuda_device_put,
	.device_get = cuda_device_get,
	.device_restage = cuda_device_restage,
	.device_dmabuf = cuda_device_dmabuf,
	.device_allocation = cuda_device_allocation,
	.device_defer = cuda_device_defer,
};

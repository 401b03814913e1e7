/*
 * backends/rdma/rdma.c - the rdma transport: engines on other hosts over
 * RDMA reliable-connected queue pairs (libibverbs), set up through rdma_cm
 * (librdmacm). Built only when both libraries are found; an engine on a
 * machine without an RDMA device has the transport but it reaches nobody
 * (resolve says -EHOSTUNREACH, so tcp carries the peer), and its health
 * says why.
 *
 * Owns (this file): the transport's table, the devices (each opened once
 * per engine: a protection domain, one completion queue for every QP of
 * the device, its completion channel), the memory hooks (the pool and every
 * registered region get one memory region per device, once, never per
 * transfer; a CUDA device region through its dma-buf, for GPUDirect RDMA,
 * and device_in_place, which tells the memory domain its PUTs need no
 * staging), the reactor's wait on verbs, the round, health and addresses.
 *
 * Waiting on verbs: the reactor has one wait, its io_uring. Each device's
 * completion channel fd and the rdma_cm event channel fd are non-blocking
 * and watched there by a multishot poll tagged for this transport. A
 * completion queue is armed (ibv_req_notify_cq) before every sleep the
 * peers are told of (prepare_sleep: armed, then polled once more), so a
 * completion while the reactor sleeps wakes it like a socket would. on_cqe
 * only notes which fd spoke; progress drains that channel and polls the CQ
 * until it is empty, without arming it: while the reactor spins, or parks
 * while callers run its rounds (engine/reactor_sleep.c), completions are
 * seen by polling, without a wake-up per completion.
 *
 * Data path and wire (rdma_data.c): eager SENDs into receives posted in
 * advance, with credits; larger PUTs announced ({address, rkey, length}
 * segments of the sender's registered pool block) and pulled by the
 * receiver with RDMA READ into its own pool; RESULT releases the block.
 * Connections and trust (rdma_conn.c): a QP is of no use to a peer until
 * it proved the cluster secret; only a caller's QP ever allows remote reads,
 * and only once the callee proved the secret to it.
 */
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <unistd.h>

#include "netaddr.h"
#include "rdma_int.h"

/* ------------------------------------------------------------------ */
/* Devices                                                            */
/* ------------------------------------------------------------------ */

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

bool rdma_arm_fd(struct rdma_state *st, int fd, uint64_t cookie)
{
	struct ferry_engine *e = st->engine;
	struct io_uring_sqe *sqe = ferry__ring_sqe(e);

	if (!sqe) {
		log_error("rdma: engine %s: the reactor's io_uring is full", e->name);
		return false;
	}
	io_uring_prep_poll_multishot(sqe, fd, POLLIN);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, cookie));
	io_uring_submit(&e->ring);
	return true;
}

/*
 * While connections exist, a TIMEOUT on the reactor's ring wakes a sleeping
 * reactor for the time checks (handshake deadlines, heartbeats) at least
 * every half heartbeat (and RDMA_TICK_MAX_NS).
 */
static void arm_tick(struct rdma_state *st)
{
	struct ferry_engine *e = st->engine;
	struct io_uring_sqe *sqe;
	uint64_t ns = st->heartbeat_ns / 2;

	if (st->tick_armed || (!st->conn_list && !st->listen_lost && !st->uev_recheck_until))
		return;
	if (ns > RDMA_TICK_MAX_NS)
		ns = RDMA_TICK_MAX_NS;
	if (st->listen_lost && ns > RDMA_RELISTEN_NS)
		ns = RDMA_RELISTEN_NS;
	sqe = ferry__ring_sqe(e);
	if (!sqe)
		return; /* the next round tries again */
	st->tick_ts.tv_sec = (long long)(ns / 1000000000);
	st->tick_ts.tv_nsec = (long long)(ns % 1000000000);
	io_uring_prep_timeout(sqe, &st->tick_ts, 0, 0);
	io_uring_sqe_set_data64(sqe, backend_tag(st->b, K_TICK));
	io_uring_submit(&e->ring);
	st->tick_armed = true;
}

/* GPUDirect RDMA's registration of a device region on d (a dma-buf): NULL and errno on failure. */
static struct ibv_mr *reg_dmabuf(struct rdma_dev *d, struct rdma_mem *m)
{
#ifdef FERRY_HAVE_IBV_DMABUF
	return ibv_reg_dmabuf_mr(d->pd, m->dmabuf_off, m->len, (uintptr_t)m->addr, m->dmabuf_fd,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
#else
	(void)d;
	(void)m;
	errno = ENOSYS;
	return NULL;
#endif
}

/*
 * Why GPUDirect is not used (health; under why_lock, which nothing holds
 * while it logs or takes another lock): true when that is news, to be told
 * (gpudirect_tell) once mem_lock, if held, is let go.
 */
static bool gpudirect_refused(struct rdma_state *st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static bool gpudirect_refused(struct rdma_state *st, const char *fmt, ...)
{
	char why[sizeof(st->gpudirect_why)];
	va_list ap;

	bool news;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&st->why_lock);
	news = strcmp(why, st->gpudirect_why) != 0;
	if (news)
		memcpy(st->gpudirect_why, why, sizeof(why));
	pthread_mutex_unlock(&st->why_lock);
	return news;
}

/* Log why GPUDirect is not used (mem_lock not held). */
static void gpudirect_tell(struct rdma_state *st)
{
	char why[sizeof(st->gpudirect_why)];

	pthread_mutex_lock(&st->why_lock);
	memcpy(why, st->gpudirect_why, sizeof(why));
	pthread_mutex_unlock(&st->why_lock);
	log_info("rdma: engine %s: device memory goes staged through the pool, not by GPUDirect "
		 "RDMA: %s", st->engine->name, why);
}

/*
 * m registered on d (mem_lock held): host memory with ibv_reg_mr, device
 * memory through its dma-buf (GPUDirect RDMA; addresses in work requests
 * are its device addresses). A failure leaves mr NULL: logged for host
 * memory (an error); for device memory (it is staged instead) noted, and
 * true when the caller must tell it (gpudirect_tell, after the lock).
 */
static bool mem_reg_on(struct rdma_state *st, struct rdma_dev *d, struct rdma_mem *m)
{
	if (m->mr[d->idx])
		return false;
	if (m->dmabuf_fd >= 0) {
		if (!(m->mr[d->idx] = reg_dmabuf(d, m))) {
			int err = errno;

			if (err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT)
				atomic_store(&st->gpudirect_off, 1); /* that device never will */
			return gpudirect_refused(st, "%s: ibv_reg_dmabuf_mr: %s", d->name,
						 err == ENOSYS ? "this build's libibverbs has none "
								 "(rdma-core 34 on has it)"
							       : strerror(err));
		}
		return false;
	}
	m->mr[d->idx] = ibv_reg_mr(d->pd, m->addr, m->len,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!m->mr[d->idx])
		log_error("rdma: engine %s: ibv_reg_mr of %zu bytes on %s: %s", st->engine->name,
			  m->len, d->name, strerror(errno));
	return false;
}

/* d's slot cleared but for its index and generation (under mem_lock: the hooks read live). */
static void dev_clear(struct rdma_state *st, struct rdma_dev *d, unsigned idx, uint32_t gen)
{
	pthread_mutex_lock(&st->mem_lock);
	memset(d, 0, sizeof(*d));
	d->idx = idx;
	d->gen = gen;
	pthread_mutex_unlock(&st->mem_lock);
}

void rdma_dev_close(struct rdma_state *st, struct rdma_dev *d)
{
	if (d->cq && ibv_destroy_cq(d->cq))
		log_warn("rdma: %s: ibv_destroy_cq: %s", d->name, strerror(errno));
	if (d->ch && ibv_destroy_comp_channel(d->ch))
		log_warn("rdma: %s: ibv_destroy_comp_channel: %s", d->name, strerror(errno));
	if (d->pd && ibv_dealloc_pd(d->pd))
		log_warn("rdma: %s: ibv_dealloc_pd: %s", d->name, strerror(errno));
	dev_clear(st, d, d->idx, d->gen);
}

/*
 * librdmacm's reference to ctx, kept in st->dev_list while the engine has
 * the device open (a device opened after probe, from a connection's id, is
 * in no list yet: without it librdmacm could close the context under us
 * once the device is removed and its ids go). -ENODEV: the device is gone.
 */
static int dev_hold(struct rdma_state *st, struct ibv_context *ctx)
{
	struct ibv_context **fresh, **grown;
	unsigned n = 0, k = 0;
	bool found = false;
	int nf = 0;

	for (; st->dev_list && st->dev_list[n]; n++)
		if (st->dev_list[n] == ctx)
			return 0;
	if (!(fresh = rdma_get_devices(&nf)))
		return -ENODEV;
	if (!(grown = realloc(st->dev_list, (n + 2) * sizeof(*grown)))) {
		rdma_free_devices(fresh);
		return -ENOMEM;
	}
	grown[n] = NULL;
	st->dev_list = grown;
	for (unsigned i = 0; fresh[i]; i++) {
		if (fresh[i] == ctx)
			found = true;
		else
			fresh[k++] = fresh[i];
	}
	fresh[k] = NULL;
	if (found) { /* its reference moves to our list; the others' go back */
		grown[n] = ctx;
		grown[n + 1] = NULL;
	}
	rdma_free_devices(fresh);
	return found ? 0 : -ENODEV;
}

struct rdma_dev *rdma_dev_of(struct rdma_state *st, struct ibv_context *ctx)
{
	for (unsigned i = 0; i < st->ndevs; i++)
		if (st->devs[i].live && st->devs[i].ctx == ctx)
			return &st->devs[i];
	return NULL;
}

/*
 * The device of ctx, opened on first use: PD, channel, CQ, every
 * registration. It takes the slot of a device removed earlier, if any.
 */
int rdma_dev_for(struct rdma_state *st, struct ibv_context *ctx, struct rdma_dev **out)
{
	struct ibv_device_attr attr;
	struct rdma_dev *d = NULL;
	bool tell = false, append;
	unsigned idx;
	uint32_t gen;
	int rc;

	if ((*out = rdma_dev_of(st, ctx)))
		return 0;
	if ((rc = dev_hold(st, ctx))) {
		log_error("rdma: engine %s: device %s: %s", st->engine->name,
			  ibv_get_device_name(ctx->device),
			  rc == -ENODEV ? "no longer there" : ferry_strerror(rc));
		return rc;
	}
	for (unsigned i = 0; i < st->ndevs && !d; i++)
		if (!st->devs[i].live)
			d = &st->devs[i];
	append = !d;
	if (append && st->ndevs == RDMA_MAX_DEV)
		return -ENOSPC;
	if (append)
		d = &st->devs[st->ndevs];
	idx = append ? st->ndevs : d->idx;
	gen = d->gen + 1;
	dev_clear(st, d, idx, gen);
	d->ctx = ctx;
	snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(ctx->device));
	if (ibv_query_device(ctx, &attr) || !(d->pd = ibv_alloc_pd(ctx)) ||
	    !(d->ch = ibv_create_comp_channel(ctx)) ||
	    !(d->cq = ibv_create_cq(ctx, RDMA_CQ_DEPTH < attr.max_cqe ? RDMA_CQ_DEPTH : attr.max_cqe,
				    NULL, d->ch, 0)) ||
	    set_nonblock(d->ch->fd) || ibv_req_notify_cq(d->cq, 0)) {
		rc = errno ? -errno : -EIO;
		log_error("rdma: engine %s: cannot open device %s: %s", st->engine->name, d->name,
			  ferry_strerror(rc));
		rdma_dev_close(st, d);
		return rc;
	}
	d->max_sge = (uint32_t)attr.max_sge;
	d->max_rd = (uint32_t)(attr.max_qp_rd_atom < attr.max_qp_init_rd_atom ?
				       attr.max_qp_rd_atom : attr.max_qp_init_rd_atom);
	d->notify_armed = true;
	if (st->b)
		backend_busy(st->b); /* rdma_progress polls it from the next round on */
	d->poll_armed = rdma_arm_fd(st, d->ch->fd,
				    K_CH | ((uint64_t)d->idx << 8) | ((uint64_t)d->gen << 16));
	/* Live under mem_lock: the memory hooks (any thread) register on the live devs[0..ndevs). */
	pthread_mutex_lock(&st->mem_lock);
	d->live = true;
	st->nlive++;
	if (append)
		st->ndevs++;
	for (int pass = 0; pass < 2; pass++) {
		/* Owners first, then the regions that borrow a GPUDirect entry's registrations. */
		for (struct rdma_mem *m = st->mems; m; m = m->next) {
			if (!pass && !m->gd)
				tell |= mem_reg_on(st, d, m);
			else if (pass && m->gd)
				m->mr[d->idx] = m->gd->mr[d->idx];
			else
				continue;
			if (m->gpudirect && !m->mr[d->idx]) {
				/* Not on this device: its PUTs are staged from now on (device_in_place). */
				m->gpudirect = false;
				atomic_fetch_sub_explicit(&st->h_gpudirect_regions, 1,
							  memory_order_relaxed);
			}
		}
	}
	pthread_mutex_unlock(&st->mem_lock);
	if (tell)
		gpudirect_tell(st);
	*out = d;
	return 0;
}

/* The local key of buf's bytes on d (and the remote key): 0 when not registered there. */
uint32_t rdma_lkey(struct rdma_state *st, struct rdma_dev *d, const struct ferry_buf *buf,
		   uint32_t *rkey)
{
	uint64_t off;
	struct rdma_mem *m = ferry__buf_reg(st->engine, st->b, buf, &off);

	if (!m || !m->mr[d->idx])
		return 0;
	if (rkey)
		*rkey = m->mr[d->idx]->rkey;
	return m->mr[d->idx]->lkey;
}

static bool sysfs_has_device(void)
{
	const char *dir = getenv("FERRY_RDMA_SYSFS");
	struct dirent *ent;
	bool found = false;
	DIR *D = opendir(dir && *dir ? dir : "/sys/class/infiniband");

	if (!D)
		return false;
	while (!found && (ent = readdir(D)))
		found = ent->d_name[0] != '.';
	closedir(D);
	return found;
}

/* Look for devices and open them all; no device is no error (st->why says it). */
static int probe(struct rdma_state *st)
{
	int n = 0;

	if (!sysfs_has_device()) {
		snprintf(st->why, sizeof(st->why), "no RDMA device (/sys/class/infiniband is empty)");
		return 0;
	}
	st->ec = rdma_create_event_channel();
	if (!st->ec) {
		snprintf(st->why, sizeof(st->why), "rdma_create_event_channel: %s",
			 strerror(errno));
		return 0;
	}
	if (set_nonblock(st->ec->fd)) {
		snprintf(st->why, sizeof(st->why), "rdma_cm channel: %s", strerror(errno));
		rdma_destroy_event_channel(st->ec);
		st->ec = NULL;
		return 0;
	}
	st->dev_list = rdma_get_devices(&n);
	if (!st->dev_list || n <= 0) {
		snprintf(st->why, sizeof(st->why), "rdma_get_devices found none");
		if (st->dev_list)
			rdma_free_devices(st->dev_list);
		st->dev_list = NULL;
		rdma_destroy_event_channel(st->ec);
		st->ec = NULL;
		return 0;
	}
	st->nsys_devs = (unsigned)n;
	for (int i = 0; i < n; i++) {
		struct rdma_dev *d;

		rdma_dev_for(st, st->dev_list[i], &d);
	}
	if (!st->ndevs) {
		snprintf(st->why, sizeof(st->why), "no RDMA device could be opened");
		return 0;
	}
	st->ec_armed = rdma_arm_fd(st, st->ec->fd, K_EC);
	rdma_uevent_open(st);
	return 0;
}

/* "rdma://IPV4:PORT" (or [IPV6]) into ss. 0 or -EINVAL (logged). */
int rdma_parse_uri(const char *uri, struct sockaddr_storage *ss)
{
	char text[NETADDR_MAX];
	socklen_t len;

	if (!uri || strncmp(uri, "rdma://", 7) != 0 || strlen(uri) + 1 > sizeof(text)) {
		log_error("rdma: \"%s\" is not rdma://HOST:PORT", uri ? uri : "(null)");
		return -EINVAL;
	}
	snprintf(text, sizeof(text), "tcp://%s", uri + 7);
	return netaddr_parse(text, true, ss, &len);
}

/* ------------------------------------------------------------------ */
/* The memory hooks                                                   */
/* ------------------------------------------------------------------ */

/*
 * m's memory regions deregistered and m freed: under mem_lock, so that a
 * device being removed (rdma_dev_gone) finds every registration on it
 * either in st->mems or already gone.
 */
static void mem_free(struct rdma_mem *m)
{
	for (unsigned i = 0; i < RDMA_MAX_DEV; i++)
		if (m->mr[i])
			ibv_dereg_mr(m->mr[i]);
	if (m->dmabuf_fd >= 0)
		close(m->dmabuf_fd);
	free(m);
}

/*
 * Device memory for GPUDirect RDMA: its dma-buf from the memory domain
 * (kept in m), or 1 when it has none (told; the region is staged).
 */
static int device_dmabuf(struct rdma_state *st, struct rdma_mem *m, int device)
{
	const char *why = "";
	int rc;

	if (atomic_load(&st->gpudirect_off))
		return 1; /* refused for good before (said then): not asked again */
#ifndef FERRY_HAVE_IBV_DMABUF
	(void)device;
	(void)why;
	atomic_store(&st->gpudirect_off, 1);
	rc = gpudirect_refused(st, "this build's libibverbs has no ibv_reg_dmabuf_mr (rdma-core "
				   "34 on has it)");
#else
	if (!(rc = memory_device_dmabuf(st->engine, m->addr, m->len, device, &m->dmabuf_fd,
					&m->dmabuf_off, &why)))
		return 0;
	if (rc == -EOPNOTSUPP)
		atomic_store(&st->gpudirect_off, 1); /* the driver has no dma-buf export */
	rc = gpudirect_refused(st, "no dma-buf of CUDA device %d's memory: %s", device, why);
#endif
	if (rc)
		gpudirect_tell(st);
	return 1;
}

/* An entry unlinked from st->mems (mem_lock held) and freed: its MRs, its dma-buf. */
static void gd_drop(struct rdma_state *st, struct rdma_mem *ent)
{
	for (struct rdma_mem **pp = &st->mems; *pp; pp = &(*pp)->next) {
		if (*pp == ent) {
			*pp = ent->next;
			break;
		}
	}
	atomic_fetch_sub_explicit(&st->gd_entries, 1, memory_order_relaxed);
	mem_free(ent);
}

void rdma_gd_sweep(struct rdma_state *st, uint64_t now)
{
	struct rdma_mem *m, *next;

	if (!atomic_load_explicit(&st->gd_entries, memory_order_relaxed))
		return;
	pthread_mutex_lock(&st->mem_lock);
	for (m = st->mems; m; m = next) {
		next = m->next;
		if (m->gd_entry && !m->gd_refs && now > m->gd_idle_since &&
		    now - m->gd_idle_since >= RDMA_GD_IDLE_NS)
			gd_drop(st, m);
	}
	pthread_mutex_unlock(&st->mem_lock);
}

/*
 * m (device memory at addr, len bytes) borrows ent's registrations (mem_lock
 * held): linked, counted, its region's PUTs read in place.
 */
static void gd_borrow(struct rdma_state *st, struct rdma_mem *m, struct rdma_mem *ent)
{
	ent->gd_refs++;
	m->gd = ent;
	for (unsigned i = 0; i < RDMA_MAX_DEV; i++)
		m->mr[i] = ent->mr[i];
	m->gpudirect = true;
	m->next = st->mems;
	st->mems = m;
	atomic_fetch_add_explicit(&st->h_gpudirect_regions, 1, memory_order_relaxed);
}

/*
 * An entry of the allocation (device, base, size, id) registered on every
 * device, or NULL (mem_lock held). On the way an entry of the same base
 * whose allocation is gone (another id) and no region uses is dropped.
 */
static struct rdma_mem *gd_find(struct rdma_state *st, int device, uint64_t base, uint64_t size,
				uint64_t id)
{
	struct rdma_mem *m, *next;

	for (m = st->mems; m; m = next) {
		next = m->next;
		if (!m->gd_entry || m->gd_device != device || (uintptr_t)m->addr != base)
			continue;
		if (m->gd_id == id && m->len == size) {
			for (unsigned i = 0; i < st->ndevs; i++)
				if (st->devs[i].live && !m->mr[i])
					return NULL;
			return m;
		}
		if (!m->gd_refs)
			gd_drop(st, m); /* freed and its address given out again */
	}
	return NULL;
}

/* Room for one more entry (mem_lock held): the one idle longest goes if all are taken. */
static bool gd_room(struct rdma_state *st)
{
	struct rdma_mem *oldest = NULL;

	if (atomic_load_explicit(&st->gd_entries, memory_order_relaxed) < RDMA_GD_ENTRIES)
		return true;
	for (struct rdma_mem *m = st->mems; m; m = m->next)
		if (m->gd_entry && !m->gd_refs && (!oldest || m->gd_idle_since < oldest->gd_idle_since))
			oldest = m;
	if (oldest)
		gd_drop(st, oldest);
	return oldest != NULL;
}

/*
 * A device region through GPUDirect's registration of its whole allocation
 * (made once, kept while regions use it and a while after: a region
 * registered for each op, as pyferry's are, costs no dma-buf and no memory
 * registration after the first). 0: m is registered (it borrows); 1: no
 * entry for it (the domain cannot say its allocation, the table is full of
 * busy ones, or the whole allocation could not be exported or registered
 * where the region alone may be): the caller registers the region alone;
 * 2: GPUDirect refused for good (said): staged. The rkey of an entry
 * covers its whole allocation: a peer that proved the cluster secret may
 * READ any of it, not only the region announced.
 */
static int gd_register(struct rdma_state *st, struct rdma_mem *m, int device)
{
	struct rdma_mem *ent, *found;
	uint64_t base, size, id;
	bool tell = false, all = true;

	if (memory_device_allocation(st->engine, m->addr, device, &base, &size, &id) ||
	    (uintptr_t)m->addr < base || (uintptr_t)m->addr + m->len > base + size)
		return 1;
	pthread_mutex_lock(&st->mem_lock);
	if ((found = gd_find(st, device, base, size, id))) {
		gd_borrow(st, m, found);
		pthread_mutex_unlock(&st->mem_lock);
		return 0;
	}
	pthread_mutex_unlock(&st->mem_lock);
	if (!(ent = calloc(1, sizeof(*ent))))
		return 1;
	ent->addr = (void *)(uintptr_t)base;
	ent->len = size;
	ent->dmabuf_fd = -1;
	ent->gd_entry = true;
	ent->gd_device = device;
	ent->gd_id = id;
	if (device_dmabuf(st, ent, device)) {
		free(ent);
		return atomic_load(&st->gpudirect_off) ? 2 : 1; /* (the region alone may do) */
	}
	pthread_mutex_lock(&st->mem_lock);
	if ((found = gd_find(st, device, base, size, id))) {
		/* Another thread made it meanwhile: that one is used. */
		gd_borrow(st, m, found);
		mem_free(ent);
		pthread_mutex_unlock(&st->mem_lock);
		return 0;
	}
	for (unsigned i = 0; i < st->ndevs; i++)
		if (st->devs[i].live)
			tell |= mem_reg_on(st, &st->devs[i], ent);
	for (unsigned i = 0; i < st->ndevs; i++)
		all = all && (!st->devs[i].live || ent->mr[i]);
	if (!all || !gd_room(st)) {
		/* A device refused it (staged), or every entry is in use (the region alone). */
		mem_free(ent);
		pthread_mutex_unlock(&st->mem_lock);
		if (tell)
			gpudirect_tell(st);
		return all || !atomic_load(&st->gpudirect_off) ? 1 : 2;
	}
	ent->next = st->mems;
	st->mems = ent;
	atomic_fetch_add_explicit(&st->gd_entries, 1, memory_order_relaxed);
	gd_borrow(st, m, ent);
	pthread_mutex_unlock(&st->mem_lock);
	return 0;
}

static int rdma_mem_register(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
			     enum ferry_mem_type mem, int device, void **handle)
{
	struct rdma_state *st = b->data;
	struct rdma_mem *m;
	bool tell = false;

	(void)e;
	*handle = NULL;
	if (mem != FERRY_MEM_HOST && mem != FERRY_MEM_CUDA)
		return 0; /* not ours to move: it goes as unregistered memory */
	rdma_gd_sweep(st, ferry__now_ns());
	if (!st->ndevs)
		return 0; /* no device: nothing to register with */
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->addr = addr;
	m->len = len;
	m->dmabuf_fd = -1;
	if (mem == FERRY_MEM_CUDA && !atomic_load(&st->gpudirect_off)) {
		int rc = gd_register(st, m, device);

		if (rc == 0) {
			*handle = m;
			return 0;
		}
		if (rc == 2) {
			free(m);
			return 0; /* staged by the memory domain, as without rdma */
		}
	}
	if (mem == FERRY_MEM_CUDA && device_dmabuf(st, m, device)) {
		free(m);
		return 0; /* staged by the memory domain, as without rdma */
	}
	pthread_mutex_lock(&st->mem_lock);
	for (unsigned i = 0; i < st->ndevs; i++)
		if (st->devs[i].live)
			tell |= mem_reg_on(st, &st->devs[i], m);
	for (unsigned i = 0; i < st->ndevs; i++) {
		if (st->devs[i].live && !m->mr[i]) {
			mem_free(m);
			pthread_mutex_unlock(&st->mem_lock);
			if (tell)
				gpudirect_tell(st);
			/* Device memory the NIC cannot take is staged; host memory it cannot is an error. */
			return mem == FERRY_MEM_CUDA ? 0 : -ENOMEM;
		}
	}
	m->next = st->mems;
	st->mems = m;
	if (mem == FERRY_MEM_CUDA) {
		m->gpudirect = true;
		atomic_fetch_add_explicit(&st->h_gpudirect_regions, 1, memory_order_relaxed);
	}
	pthread_mutex_unlock(&st->mem_lock);
	*handle = m;
	return 0;
}

static void rdma_mem_deregister(struct ferry_engine *e, struct backend *b, void *handle)
{
	struct rdma_state *st = b->data;
	struct rdma_mem *m = handle;

	(void)e;
	if (!m)
		return;
	pthread_mutex_lock(&st->mem_lock);
	for (struct rdma_mem **pp = &st->mems; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	if (m->gpudirect)
		atomic_fetch_sub_explicit(&st->h_gpudirect_regions, 1, memory_order_relaxed);
	if (m->gd) {
		/* Borrowed: its entry stays a while for the next region of that allocation. */
		if (!--m->gd->gd_refs)
			m->gd->gd_idle_since = ferry__now_ns();
		memset(m->mr, 0, sizeof(m->mr));
	} else if (m->gd_entry) {
		atomic_fetch_sub_explicit(&st->gd_entries, 1, memory_order_relaxed);
	}
	mem_free(m);
	pthread_mutex_unlock(&st->mem_lock);
	rdma_gd_sweep(st, ferry__now_ns());
}

/* A block being filled has more (or failed): its receivers are told (rdma_conn_pump). */
static void rdma_staged_more(struct ferry_engine *e, struct backend *b)
{
	struct rdma_state *st = b->data;

	(void)e;
	if (!st)
		return;
	for (struct rdma_conn *c = st->conn_list; c; c = c->next)
		if (c->nfilling)
			rdma_conn_pump(st, c);
}

/*
 * Device segments sent where they are (GPUDirect RDMA): each non-empty one
 * of a region registered through its dma-buf on every device, and no more
 * than one announcement takes.
 */
static bool rdma_device_in_place(struct ferry_engine *e, struct backend *b, const struct op *op)
{
	struct rdma_state *st = b->data;
	uint32_t k = 0;

	(void)e;
	if (!(op->flags & FERRY_SQE_SEGS))
		return false;
	for (uint32_t i = 0; i < op->iovcnt; i++) {
		const struct rdma_mem *m;

		if (!op->segs[i].len)
			continue;
		m = ferry__region_reg(op->segs[i].region, b);
		if (++k > RDMA_MAX_SEG || !m)
			return false;
		for (unsigned d = 0; d < st->ndevs; d++)
			if (st->devs[d].live && !m->mr[d])
				return false;
	}
	return true;
}

/* ------------------------------------------------------------------ */
/* The round                                                          */
/* ------------------------------------------------------------------ */

int rdma_poll_dev(struct rdma_state *st, struct rdma_dev *d, bool arm)
{
	struct ibv_wc wc[32];
	int n, total = 0;

	if (!d->live)
		return 0;
	if (d->event) {
		struct ibv_cq *cq;
		void *ctx;
		unsigned got = 0;

		d->event = false;
		while (ibv_get_cq_event(d->ch, &cq, &ctx) == 0)
			got++;
		if (got)
			ibv_ack_cq_events(d->cq, got);
		d->notify_armed = false;
	}
	if (arm && !d->notify_armed && ibv_req_notify_cq(d->cq, 0) == 0)
		d->notify_armed = true; /* armed, then polled: nothing falls between */
	do {
		n = ibv_poll_cq(d->cq, 32, wc);
		for (int i = 0; i < n; i++)
			rdma_on_wc(st, &wc[i]);
		total += n > 0 ? n : 0;
	} while (n == 32);
	return total;
}

/* e's rdma transport (its state set up), or NULL. */
static struct backend *rdma_backend_of(struct ferry_engine *e)
{
	for (unsigned i = 0; e && i < e->nbackends; i++)
		if (strcmp(e->backends[i].ops->name, "rdma") == 0 && e->backends[i].data)
			return &e->backends[i];
	return NULL;
}

int ferry__rdma_fault_qp_error(struct ferry_engine *e)
{
	struct backend *b = rdma_backend_of(e);

	if (!b)
		return -ENODEV;
	atomic_store(&((struct rdma_state *)b->data)->fault_qp_error, 1);
	ferry__backend_wake(e, b);
	return 0;
}

int ferry__rdma_fault_uevents_lost(struct ferry_engine *e)
{
	struct backend *b = rdma_backend_of(e);

	if (!b)
		return -ENODEV;
	atomic_store(&((struct rdma_state *)b->data)->fault_uev_lost, 1);
	return 0;
}

/* The fault asked for: each ready QP to the error state; returns how many. */
static int fault_qp_error(struct rdma_state *st)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int n = 0;

	atomic_store(&st->fault_qp_error, 0);
	for (struct rdma_conn *c = st->conn_list; c; c = c->next) {
		if (c->state != RC_READY || !c->qp_made)
			continue;
		log_warn("rdma: engine %s: fault injected: the queue pair %s %s goes to the error "
			 "state", st->engine->name, c->caller ? "to" : "from", c->peer_name);
		if (ibv_modify_qp(c->id->qp, &a, IBV_QP_STATE))
			log_warn("rdma: engine %s: ibv_modify_qp (error state): %s", st->engine->name,
				 strerror(errno));
		n++;
	}
	return n;
}

static int rdma_progress(struct ferry_engine *e, struct backend *b)
{
	struct rdma_state *st = b->data;
	int n = 0;

	(void)e;
	if (!st->ndevs) {
		/* No device: nothing here ever has work (rdma_dev_for clears quiet). */
		ferry__backend_quiet(b);
		return 0;
	}
	if (st->ec_event) {
		st->ec_event = false;
		rdma_cm_events(st);
		n++;
	}
	if (unlikely(st->uev_event)) {
		st->uev_event = false;
		rdma_uevents(st);
		n++;
	}
	if (unlikely(atomic_load_explicit(&st->fault_qp_error, memory_order_relaxed)))
		n += fault_qp_error(st);
	for (unsigned i = 0; i < st->ndevs; i++)
		n += rdma_poll_dev(st, &st->devs[i], false);
	if ((st->conn_list || st->listen_lost || st->uev_recheck_until) &&
	    (st->tick_due || reactor_now(e) >= st->next_check)) {
		st->tick_due = false;
		st->next_check = reactor_now(e) + 10000000ull;
		rdma_check_time(st);
		if (unlikely(st->listen_lost))
			rdma_relisten(st);
		if (unlikely(st->uev_recheck_until))
			rdma_uev_recheck(st, reactor_now(e));
	}
	arm_tick(st);
	if (st->ndead)
		rdma_sweep(st);
	return n;
}

/*
 * Work now: a channel spoke, something waits to be posted, or work requests
 * are out (their completions are polled while the reactor spins; when it
 * sleeps, the armed CQ wakes it).
 */
static bool rdma_has_work(struct ferry_engine *e, struct backend *b)
{
	struct rdma_state *st = b->data;

	(void)e;
	if (!st->ndevs)
		return false;
	if (st->ec_event || st->uev_event || st->ndead ||
	    atomic_load_explicit(&st->fault_qp_error, memory_order_relaxed))
		return true;
	for (unsigned i = 0; i < st->ndevs; i++)
		if (st->devs[i].event)
			return true;
	return false;
}

/* Before the sleep: one last look at each CQ (armed: what comes after wakes us). */
static bool rdma_prepare_sleep(struct ferry_engine *e, struct backend *b)
{
	struct rdma_state *st = b->data;
	int n = 0;

	if (!st->ndevs)
		return false;
	for (unsigned i = 0; i < st->ndevs; i++)
		n += rdma_poll_dev(st, &st->devs[i], true);
	return n > 0 || rdma_has_work(e, b);
}

static void rdma_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t cookie, int res,
			uint32_t flags)
{
	struct rdma_state *st = b->data;
	unsigned kind = cookie & 0xff, idx = (unsigned)(cookie >> 8) & 0xff;

	(void)e;
	if (!st)
		return;
	if (kind == K_TICK) {
		st->tick_armed = false;
		st->tick_due = true;
	} else if (kind == K_EC) {
		st->ec_event = true;
		if (!(flags & IORING_CQE_F_MORE) || res < 0)
			st->ec_armed = st->ec && rdma_arm_fd(st, st->ec->fd, K_EC);
	} else if (kind == K_CH && idx < st->ndevs) {
		struct rdma_dev *d = &st->devs[idx];

		if (!d->live || d->gen != (uint32_t)(cookie >> 16))
			return; /* the poll of a device removed since (cancelled) */
		d->event = true;
		if (!(flags & IORING_CQE_F_MORE) || res < 0)
			d->poll_armed = d->ch && rdma_arm_fd(st, d->ch->fd, cookie);
	} else if (kind == K_UEV) {
		st->uev_event = true;
		if (!(flags & IORING_CQE_F_MORE) || res < 0)
			st->uev_armed = st->uev_fd >= 0 && rdma_arm_fd(st, st->uev_fd, K_UEV);
	}
}

/* ------------------------------------------------------------------ */
/* The backend                                                        */
/* ------------------------------------------------------------------ */

static int rdma_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	struct rdma_state *st = b->data;
	char address[PEER_ADDR_MAX];
	struct rdma_conn *c = NULL;
	int rc;

	(void)e;
	if (!st->nlive || !ferry__peer_addr_get(peer, "rdma", address, sizeof(address)))
		return -EHOSTUNREACH; /* no device here, or no rdma address: tcp may reach it */
	for (struct rdma_conn *x = st->conn_list; x; x = x->next) {
		if (x->caller && x->state != RC_DEAD && strcmp(x->peer_name, peer->name) == 0) {
			c = x;
			break;
		}
	}
	if (!c) {
		rc = rdma_conn_call(st, peer, &c);
		if (rc)
			return -ENETUNREACH; /* its address is rdma's: nobody else carries it */
	}
	c->refs++;
	peer->transport = c;
	return 0;
}

static void rdma_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer)
{
	(void)e;
	if (peer->transport)
		rdma_conn_unref(b->data, peer->transport);
	peer->transport = NULL;
}

static void rdma_forget(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct ferry_peer *peer = op->peer;

	/*
	 * A message posted finishes on its own; a late result fails its
	 * generation check. One not posted yet (no credit, no room) may still
	 * point at the op's memory (an inline iovec, segments in place): it
	 * goes now, before that memory is the caller's again.
	 */
	(void)e;
	if (peer && peer->backend == b && peer->transport)
		rdma_msg_forget(b->data, peer->transport, op);
}

static void tables_free(struct rdma_state *st)
{
	free(st->msgs);
	free(st->rxs);
	st->msgs = NULL;
	st->rxs = NULL;
}

static void rdma_fini(struct ferry_engine *e, struct backend *b);

static int rdma_init(struct ferry_engine *e, struct backend *b)
{
	const struct ferry_engine_params *p = e->create_params;
	struct rdma_state *st = calloc(1, sizeof(*st));
	uint64_t hb, to;
	int rc;

	if (!st)
		return -ENOMEM;
	st->engine = e;
	st->b = b;
	st->uev_fd = -1;
	b->data = st;
	pthread_mutex_init(&st->mem_lock, NULL);
	pthread_mutex_init(&st->why_lock, NULL);
	if (p && p->size > offsetof(struct ferry_engine_params, rdma_listen) && p->rdma_listen) {
		struct sockaddr_storage ss;

		if (strlen(p->rdma_listen) >= sizeof(st->listen_text) ||
		    rdma_parse_uri(p->rdma_listen, &ss)) {
			log_error("ferry_engine_create: rdma_listen \"%s\" is not rdma://ADDRESS:PORT",
				  p->rdma_listen);
			rc = -EINVAL;
			goto fail;
		}
		snprintf(st->listen_text, sizeof(st->listen_text), "%s", p->rdma_listen);
	}
	rc = sec_engine_params(p, &st->secret, &hb, &to);
	if (rc)
		goto fail;
	st->hs_ns = p && p->handshake_ms ? (uint64_t)p->handshake_ms * 1000000ull : RDMA_HS_NS;
	st->heartbeat_ns = hb;
	st->peer_timeout_ns = to;
	st->ack_timeout = rdma_ack_timeout_for(to);
	st->nmsgs = 2 * e->max_ops;
	st->nrxs = 2 * e->max_ops;
	st->msgs = calloc(st->nmsgs, sizeof(*st->msgs));
	st->rxs = calloc(st->nrxs, sizeof(*st->rxs));
	if (!st->msgs || !st->rxs) {
		rc = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = st->nmsgs; i-- > 0;) {
		st->msgs[i].id = i;
		st->msgs[i].next = st->free_msgs;
		st->free_msgs = &st->msgs[i];
	}
	for (uint32_t i = st->nrxs; i-- > 0;) {
		st->rxs[i].next = st->free_rxs;
		st->free_rxs = &st->rxs[i];
	}
	probe(st);
	if (st->listen_text[0]) {
		if (!st->ndevs) {
			log_error("ferry_engine_create: rdma_listen %s: %s", st->listen_text, st->why);
			rc = -EADDRNOTAVAIL;
			goto fail;
		}
		if ((rc = rdma_listen_start(st)))
			goto fail;
	}
	return 0;
fail:
	rdma_fini(e, b);
	return rc;
}

static void rdma_fini(struct ferry_engine *e, struct backend *b)
{
	struct rdma_state *st = b->data;

	if (!st)
		return;
	if (st->listen_id) {
		rdma_destroy_id(st->listen_id);
		st->listen_id = NULL;
	}
	for (struct rdma_conn *c = st->conn_list; c; c = c->next)
		rdma_conn_fail(st, c, -ECANCELED, NULL);
	/* The flushed work requests of every dead QP come back before its buffers go. */
	for (int tries = 0; tries < 200 && st->ndead; tries++) {
		for (unsigned i = 0; i < st->ndevs; i++) {
			st->devs[i].event = true;
			rdma_poll_dev(st, &st->devs[i], false);
		}
		rdma_sweep(st);
		if (st->ndead)
			usleep(1000);
	}
	reactor_unresolve_all(e, b);
	if (st->ndead)
		log_warn("rdma: engine %s: %u connections did not drain", e->name, st->ndead);
	/* Registrations the engine did not give back (it gives them all back first). */
	for (;;) { /* (from the head each time: a deregistration may drop idle entries) */
		struct rdma_mem *m = st->mems;

		while (m && m->gd_entry)
			m = m->next;
		if (!m)
			break;
		rdma_mem_deregister(e, b, m);
	}
	while (st->mems) /* the GPUDirect entries, once no region borrows from them */
		rdma_mem_deregister(e, b, st->mems);
	for (unsigned i = 0; i < st->ndevs; i++)
		rdma_dev_close(st, &st->devs[i]);
	rdma_uevent_close(st);
	if (st->dev_list)
		rdma_free_devices(st->dev_list);
	if (st->ec)
		rdma_destroy_event_channel(st->ec);
	tables_free(st);
	pthread_mutex_destroy(&st->mem_lock);
	pthread_mutex_destroy(&st->why_lock);
	free(st);
	b->data = NULL;
}

/* The control plane declared `name` dead: its connections go too. */
static void rdma_peer_event(struct ferry_engine *e, struct backend *b, const char *name,
			    enum peer_event ev, int res)
{
	struct rdma_state *st = b->data;

	(void)e;
	if (ev != PEER_DEAD)
		return;
	for (struct rdma_conn *c = st->conn_list; c; c = c->next)
		if (c->state != RC_DEAD && strcmp(c->peer_name, name) == 0)
			rdma_conn_fail(st, c, res, "the control channel declared it dead");
}

static int rdma_tr_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *peer,
			const char *uri)
{
	struct rdma_state *st = b->data;
	struct sockaddr_storage ss;
	int rc;

	(void)e;
	if ((rc = rdma_parse_uri(uri, &ss)))
		return rc;
	if (!sec_peer_allowed(&st->secret, (struct sockaddr *)&ss)) {
		log_error("ferry_peer_connect_uri: %s for %s is not a loopback address and engine "
			  "%s has no cluster secret", uri, peer->name, st->engine->name);
		return -EACCES;
	}
	return ferry__peer_addr_set(peer, uri);
}

static int rdma_address(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct rdma_state *st = b->data;

	(void)e;
	return st->bound[0] ? snprintf(buf, len, "%s", st->bound) : 0;
}

static int rdma_health(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	struct rdma_state *st = b->data;
	char devs[RDMA_MAX_DEV * 66 + 4] = "";
	char gd_why[sizeof(st->gpudirect_why)];
	size_t o = 0;

	(void)e;
	if (!st->ndevs)
		return snprintf(buf, len, ",\"rdma\":{\"devices\":[],\"why\":\"%s\"}", st->why);
	pthread_mutex_lock(&st->why_lock);
	snprintf(gd_why, sizeof(gd_why), "%s", st->gpudirect_why);
	pthread_mutex_unlock(&st->why_lock);
	for (char *p = gd_why; *p; p++) /* a JSON string: nothing that would end it */
		if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
			*p = '?';
	pthread_mutex_lock(&st->mem_lock); /* (a device removed goes not live under it) */
	for (unsigned i = 0; i < st->ndevs && o < sizeof(devs); i++)
		if (st->devs[i].live)
			o += (size_t)snprintf(devs + o, sizeof(devs) - o, "%s\"%s\"", o ? "," : "",
					      st->devs[i].name);
	pthread_mutex_unlock(&st->mem_lock);
	return snprintf(buf, len,
			",\"rdma\":{\"devices\":[%s],\"address\":\"%s\",\"connections_ready\":%u,"
			"\"connections_other\":%u,\"peers_refused\":%u,\"malformed\":%u,"
			"\"reads\":%llu,\"read_bytes\":%llu,\"eager\":%llu,\"announced_in_place\":%llu,"
			"\"read_into_get\":%llu,\"inline_sends\":%llu,\"heartbeats\":%llu,"
			"\"gpudirect_regions\":%u,\"gpudirect_cached\":%u,\"gpudirect_puts\":%llu,"
			"\"gpudirect_why\":\"%s\",\"devices_removed\":%u}",
			devs, st->bound, atomic_load_explicit(&st->h_ready, memory_order_relaxed),
			atomic_load_explicit(&st->h_other, memory_order_relaxed),
			atomic_load_explicit(&st->h_refused, memory_order_relaxed),
			atomic_load_explicit(&st->h_malformed, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_reads, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_read_bytes,
								 memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_eager, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_inplace, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_into_get, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_inline, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_heartbeats,
								 memory_order_relaxed),
			atomic_load_explicit(&st->h_gpudirect_regions, memory_order_relaxed),
			atomic_load_explicit(&st->gd_entries, memory_order_relaxed),
			(unsigned long long)atomic_load_explicit(&st->h_gpudirect_puts,
								 memory_order_relaxed),
			gd_why, atomic_load_explicit(&st->h_devices_removed, memory_order_relaxed));
}

const struct backend_ops ferry__rdma_backend = {
	.name = "rdma",
	.rank = 5,
	.caps = TRANSPORT_CAP_REMOTE | TRANSPORT_CAP_SAME_HOST | TRANSPORT_CAP_ONE_SIDED |
		TRANSPORT_CAP_MEM_HOST,
	.init = rdma_init,
	.fini = rdma_fini,
	.resolve = rdma_resolve,
	.unresolve = rdma_unresolve,
	.put = rdma_put,
	.iov_put_max = RDMA_INLINE_MAX,
	.segs_in_place = true,
	.progress = rdma_progress,
	.has_work = rdma_has_work,
	.prepare_sleep = rdma_prepare_sleep,
	.forget = rdma_forget,
	.on_cqe = rdma_on_cqe,
	.health = rdma_health,
	.scheme = "rdma",
	.connect = rdma_tr_connect,
	.address = rdma_address,
	.peer_event = rdma_peer_event,
	.mem_register = rdma_mem_register,
	.mem_deregister = rdma_mem_deregister,
	.device_in_place = rdma_device_in_place,
	.sends_filling = true,
	.staged_more = rdma_staged_more,
};

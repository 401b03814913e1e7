/*
 * backends/rdma/rdma_hotplug.c - RDMA devices removed under a running
 * engine, and their return.
 *
 * Owns: releasing a removed device (rdma_dev_gone), the engine's watch on
 * the kernel's device events (a NETLINK_KOBJECT_UEVENT socket on the
 * reactor's ring), and listening again once the listener's device is back.
 *
 * Why it matters: the kernel removes an RDMA device (a NIC unplugged or
 * reset, its driver unloaded, `rdma link delete`) only once every process
 * has closed what it opened on it. A driver that cannot take a process's
 * objects away from it (Soft-RoCE among them) makes the removal wait for
 * that, so an engine that kept its PD, CQ, MRs and QPs would hold the
 * device (and whoever removes it) until it ends.
 *
 * How an engine hears of it: rdma_cm's DEVICE_REMOVAL on any of its ids on
 * the device (the listener, a connection), or, for an engine that only
 * opened the device (every engine opens every device, to register its
 * pool), the kernel's "remove" event of the device's verbs node
 * (infiniband_verbs/uverbsN), which comes before the kernel waits for the
 * device's users. Then, at once: every connection on the device ends with
 * -ECONNRESET (GETs parked for its peers end, the peer handles resolved to
 * it resolve again on their next PUT) and its QP and id are destroyed
 * without waiting for their flushes; every memory registration on the
 * device, its CQ, completion channel and PD go; librdmacm's reference,
 * taken by rdma_get_devices, is given back after a sync that marks the
 * device dead (rdma_get_devices), so librdmacm closes its context. A device
 * that comes back is opened like any other, when a connection first runs
 * on it (rdma_dev_for registers every memory region on it then); a
 * listener that was on it is made again at the same address and port,
 * tried every tick until the address has a device again.
 */
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdma_int.h"

#define UEV_BUF 8192
#define UEV_PER_ROUND 64

/*
 * librdmacm's hold on ctx (a device removed) given back. Its device list is
 * synced first (rdma_get_devices, the list freed again: nothing of it is
 * dead), which marks a device that is gone dead; dropping the last
 * reference of a dead one closes it. The reference goes through a list of
 * its own: a list whose device is freed while rdma_free_devices walks it
 * would be read after the free.
 */
static void cma_let_go(struct rdma_state *st, struct ibv_context *ctx)
{
	struct ibv_context **fresh, **one;
	unsigned k = 0;
	int n = 0;

	if ((fresh = rdma_get_devices(&n)))
		rdma_free_devices(fresh);
	if (!st->dev_list || !ctx)
		return;
	for (unsigned i = 0; st->dev_list[i]; i++)
		if (st->dev_list[i] != ctx)
			st->dev_list[k++] = st->dev_list[i];
	if (!st->dev_list[k]) /* ctx was not in the list: no reference of ours */
		return;
	st->dev_list[k] = NULL;
	one = calloc(2, sizeof(*one));
	if (!one) {
		log_error("rdma: engine %s: out of memory: librdmacm keeps its context of a "
			  "removed device", st->engine->name);
		return;
	}
	one[0] = ctx;
	rdma_free_devices(one); /* (frees one) */
}

void rdma_listener_lost(struct rdma_state *st)
{
	if (!st->listen_id)
		return;
	log_warn("rdma: engine %s: the device of its listener %s was removed: it listens again "
		 "there once the address has a device", st->engine->name, st->bound);
	rdma_destroy_id(st->listen_id);
	st->listen_id = NULL;
	st->listen_lost = true;
	st->relisten_told = false;
	st->relisten_at = ferry__now_ns() + RDMA_RELISTEN_NS;
}

void rdma_dev_gone(struct rdma_state *st, struct rdma_dev *d, const char *how)
{
	struct ferry_engine *e = st->engine;
	struct ibv_context *ctx = d->ctx;
	unsigned idx = d->idx;

	if (!d->live)
		return;
	log_warn("rdma: engine %s: device %s was removed (%s): its connections end, and ferry "
		 "lets go of everything it held on it", e->name, d->name, how);
	atomic_fetch_add_explicit(&st->h_devices_removed, 1, memory_order_relaxed);
	rdma_poll_dev(st, d, false); /* what completed before */
	for (struct rdma_conn *c = st->conn_list; c; c = c->next) {
		if (c->dev != d && !(c->id && c->id->verbs == ctx))
			continue;
		c->drop_now = true;
		rdma_conn_fail(st, c, -ECONNRESET, "its device was removed");
	}
	rdma_sweep(st); /* their QPs, buffers and ids: now */
	if (st->listen_id && st->listen_id->verbs == ctx)
		rdma_listener_lost(st);
	if (d->ch) {
		struct io_uring_sqe *sqe = ferry__ring_sqe(e);

		/* The ring's poll holds the channel's file (and the device) until cancelled. */
		if (sqe) {
			io_uring_prep_cancel_fd(sqe, d->ch->fd, IORING_ASYNC_CANCEL_ALL);
			io_uring_sqe_set_data64(sqe, backend_tag(st->b, K_NONE));
			io_uring_submit(&e->ring);
		} else {
			log_error("rdma: engine %s: the reactor's io_uring is full: the poll of "
				  "%s's channel stays until the engine ends", e->name, d->name);
		}
	}
	pthread_mutex_lock(&st->mem_lock);
	d->live = false; /* the memory hooks skip it from now on */
	st->nlive--;
	for (struct rdma_mem *m = st->mems; m; m = m->next) {
		if (!m->mr[idx])
			continue;
		if (!m->gd && ibv_dereg_mr(m->mr[idx])) /* (a borrower's is its entry's) */
			log_warn("rdma: engine %s: ibv_dereg_mr on %s: %s", e->name, d->name,
				 strerror(errno));
		m->mr[idx] = NULL;
	}
	pthread_mutex_unlock(&st->mem_lock);
	rdma_dev_close(st, d);
	cma_let_go(st, ctx);
}

/* ------------------------------------------------------------------ */
/* The kernel's device events                                          */
/* ------------------------------------------------------------------ */

void rdma_uevent_open(struct rdma_state *st)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK, .nl_groups = 1 /* the kernel's */ };
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
			NETLINK_KOBJECT_UEVENT);

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		log_info("rdma: engine %s: no watch on the kernel's device events (%s): a device "
			 "removed is let go of when rdma_cm tells one of its ids",
			 st->engine->name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	st->uev_fd = fd;
	st->uev_armed = rdma_arm_fd(st, fd, K_UEV);
}

void rdma_uevent_close(struct rdma_state *st)
{
	if (st->uev_fd >= 0)
		close(st->uev_fd); /* (the ring's poll goes with the ring) */
	st->uev_fd = -1;
}

/* The value of KEY= in a uevent's NUL-separated fields, or NULL. */
static const char *uev_field(const char *msg, size_t len, const char *key)
{
	size_t kl = strlen(key);

	for (size_t o = 0; o < len;) {
		const char *f = msg + o;
		size_t fl = strnlen(f, len - o);

		if (fl > kl && memcmp(f, key, kl) == 0 && f[kl] == '=')
			return f + kl + 1;
		o += fl + 1;
	}
	return NULL;
}

/* One event from the kernel: a removed device of ours goes; a new one wakes the listener. */
static void uev_one(struct rdma_state *st, const char *msg, size_t len)
{
	const char *action = uev_field(msg, len, "ACTION");
	const char *subsys = uev_field(msg, len, "SUBSYSTEM");
	const char *path = uev_field(msg, len, "DEVPATH");
	const char *base;
	bool verbs;

	if (!action || !subsys || !path)
		return;
	verbs = strcmp(subsys, "infiniband_verbs") == 0;
	if (!verbs && strcmp(subsys, "infiniband") != 0)
		return;
	if (strcmp(action, "add") == 0 && st->listen_lost) {
		st->relisten_at = 0; /* try at the next tick */
		return;
	}
	if (strcmp(action, "remove") != 0)
		return;
	base = strrchr(path, '/');
	base = base ? base + 1 : path;
	for (unsigned i = 0; i < st->ndevs; i++) {
		struct rdma_dev *d = &st->devs[i];
		const char *name;

		if (!d->live)
			continue;
		name = verbs ? d->ctx->device->dev_name : d->ctx->device->name;
		if (strcmp(name, base) == 0)
			rdma_dev_gone(st, d, "the kernel said so");
	}
	cma_let_go(st, NULL); /* librdmacm's sync: a device it holds for nobody is closed */
}

/*
 * Events were lost (the socket overran): a device whose verbs node is gone
 * was removed. Asked again on every tick for a while (rdma_uev_recheck):
 * the kernel sends a removal's event before the node goes.
 */
static void uev_lost(struct rdma_state *st)
{
	for (unsigned i = 0; i < st->ndevs; i++) {
		struct rdma_dev *d = &st->devs[i];

		if (d->live && access(d->ctx->device->dev_path, F_OK) && errno == ENOENT)
			rdma_dev_gone(st, d, "its node is gone");
	}
}

void rdma_uevents(struct rdma_state *st)
{
	bool drop = atomic_load_explicit(&st->fault_uev_lost, memory_order_relaxed), dropped = false;
	int n;

	for (n = 0; n < UEV_PER_ROUND && st->uev_fd >= 0; n++) {
		char msg[UEV_BUF];
		struct sockaddr_nl from;
		struct iovec iov = { msg, sizeof(msg) - 1 };
		struct msghdr mh = { .msg_name = &from, .msg_namelen = sizeof(from),
				     .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t r = recvmsg(st->uev_fd, &mh, MSG_DONTWAIT);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ENOBUFS) {
				dropped = true;
				continue;
			}
			break; /* EAGAIN: all read */
		}
		if (mh.msg_namelen != sizeof(from) || from.nl_pid != 0 || (mh.msg_flags & MSG_TRUNC))
			continue; /* only the kernel's, whole */
		if (unlikely(drop)) {
			dropped = true; /* (a test: as if the socket had overrun) */
			continue;
		}
		msg[r] = '\0';
		uev_one(st, msg, (size_t)r);
	}
	if (dropped) {
		uev_lost(st);
		st->uev_recheck_until = ferry__now_ns() + RDMA_UEV_RECHECK_NS;
	}
	if (n == UEV_PER_ROUND)
		st->uev_event = true; /* more: the next round */
}

void rdma_uev_recheck(struct rdma_state *st, uint64_t now)
{
	if (now >= st->uev_recheck_until)
		st->uev_recheck_until = 0;
	else
		uev_lost(st);
}

/* ------------------------------------------------------------------ */
/* The listener again                                                 */
/* ------------------------------------------------------------------ */

void rdma_relisten(struct rdma_state *st)
{
	struct rdma_cm_id *id = NULL;
	uint64_t now = ferry__now_ns();

	if (!st->listen_lost || now < st->relisten_at)
		return;
	st->relisten_at = now + RDMA_RELISTEN_NS;
	if (rdma_create_id(st->ec, &id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(id, (struct sockaddr *)&st->bound_sa) || rdma_listen(id, 128)) {
		if (!st->relisten_told) {
			st->relisten_told = true;
			log_info("rdma: engine %s: not listening at %s yet (%s): tried again every "
				 "%llu ms", st->engine->name, st->bound, strerror(errno),
				 (unsigned long long)(RDMA_RELISTEN_NS / 1000000));
		}
		if (id)
			rdma_destroy_id(id); /* no device has the address yet */
		return;
	}
	st->listen_id = id;
	st->listen_lost = false;
	log_info("rdma: engine %s: listening at %s again", st->engine->name, st->bound);
}

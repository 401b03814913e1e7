/*
 * backends/shm/shm_conn.c - the shm transport's connections to peer engines:
 * their lifetime and their end.
 *
 * Owns: a connection's slot in the table (st->conns) and its place among
 * the live ones (st->live), its references (the table, each peer resolved
 * to it, each block of the peer's wrapped for the application) and what is
 * freed with the last one (the mappings, the fds), finding the connection
 * that carries PUTs to an engine by name (else calling it: shm_handshake.c),
 * the io_uring polls on the sockets, and what happens when a peer dies or
 * breaks the protocol (its ops fail, the blocks it held come back, GETs
 * waiting on it give up, its streams hear of it). Cold code: the data path
 * (shm.c) calls here only when a connection fails or a dead one is called
 * again.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"
#include "shm_int.h"
#include "shm_wire.h"

/* ------------------------------------------------------------------ */
/* Connections: lifetime                                               */
/* ------------------------------------------------------------------ */

/* The last reference went (shm_conn_unref): unmap and close what it held. */
void shm_conn_free(struct shm_conn *c)
{
	if (c->rings)
		munmap(c->rings, SHM_RINGS_BYTES);
	if (c->peer_pool && atomic_load(&c->dma_pin) == 1)
		memory_dma_unpin(c->peer_pool); /* any thread: the pin is the process's */
	if (c->peer_pool)
		munmap((void *)c->peer_pool, c->peer_pool_size);
	if (c->peer_wake)
		munmap(c->peer_wake, 4096);
	if (c->peer_doorbell >= 0)
		close(c->peer_doorbell);
	if (c->ring_fd >= 0)
		close(c->ring_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c);
}

/* A connection not yet up, in a free slot; NULL (logged) when none is free. */
struct shm_conn *shm_conn_new(struct ferry_engine *e, struct shm_state *st, int sock,
			      const char *peer_name)
{
	struct shm_conn *c;
	uint32_t slot;

	for (slot = 0; slot < SHM_MAX_CONNS && st->conns[slot]; slot++)
		;
	if (slot == SHM_MAX_CONNS) {
		log_error("shm: engine %s: more than %u connections", e->name, SHM_MAX_CONNS);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		log_error("shm: engine %s: out of memory for a connection", e->name);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	c->id = slot;
	c->st = st;
	c->sock = sock;
	c->ring_fd = -1;
	c->peer_doorbell = -1;
	snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer_name);
	key_suffix_make(&c->arrive_sfx, c->peer_name, e->name);
	c->gen = ++st->next_gen;
	st->conns[slot] = c;
	return c;
}

void shm_conn_reap(struct shm_state *st, struct shm_conn *c)
{
	for (uint32_t i = 0; i < st->nlive; i++) {
		if (st->live[i] == c) {
			st->live[i] = st->live[--st->nlive];
			break;
		}
	}
	st->conns[c->id] = NULL;
	shm_conn_unref(c); /* the table's reference */
}

/* ------------------------------------------------------------------ */
/* Polls on the reactor's io_uring                                     */
/* ------------------------------------------------------------------ */

void shm_arm_poll(struct ferry_engine *e, struct backend *b, int fd, uint64_t cookie)
{
	struct io_uring_sqe *sqe = ferry__ring_sqe(e);

	if (!sqe) {
		log_error("shm: io_uring full, cannot watch fd %d", fd);
		return;
	}
	io_uring_prep_poll_add(sqe, fd, POLLIN | POLLRDHUP | POLLHUP | POLLERR);
	io_uring_sqe_set_data64(sqe, backend_tag(b, cookie));
	io_uring_submit(&e->ring); /* a busy reactor may not sleep for long */
}

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

static bool other_live_conn(struct shm_state *st, struct shm_conn *c)
{
	for (uint32_t i = 0; i < st->nlive; i++) {
		struct shm_conn *o = st->live[i];

		if (o != c && !o->dead && strcmp(o->peer_name, c->peer_name) == 0)
			return true;
	}
	return false;
}

/*
 * The peer is gone (or broke the protocol): its ops fail, the blocks it
 * held come back, GETs waiting on it give up. Blocks it lent us stay
 * mapped until the application releases them.
 */
void shm_conn_fail(struct ferry_engine *e, struct shm_conn *c, const char *why, int res)
{
	struct shm_state *st = c->st;
	bool others;

	if (c->dead)
		return;
	c->dead = true;
	if (why)
		log_warn("shm: engine %s: disconnecting %s: %s", e->name, c->peer_name, why);
	while (c->pending_head) {
		struct op *op = c->pending_head;

		op_list_remove(&c->pending_head, &c->pending_tail, op);
		op->state = OP_FREE;
		op_complete(e, op, res, 0, NULL);
	}
	if (!c->up) {
		/*
		 * A call that never got its answer: only the PUTs queued on it
		 * knew of it (no block was lent, nothing arrived through it).
		 */
		st->nconnecting--;
		if (c->sock >= 0)
			shutdown(c->sock, SHUT_RDWR); /* ends its poll */
		atomic_store(&c->closed, 1);
		return;
	}
	others = other_live_conn(st, c);
	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *op = &e->ops[i];

		if (op->state == OP_AWAY && op->peer && op->peer->transport == c) {
			op->state = OP_FREE;
			op_complete(e, op, res, 0, NULL);
		} else if (op->state == OP_PARKED && !others && op->peer &&
			   strcmp(op->peer->name, c->peer_name) == 0) {
			op_complete(e, op, res, 0, NULL);
		}
	}
	if (!others)
		ferry__peer_event(e, st->b, c->peer_name, PEER_LOST, res); /* its streams */
	shm_lent_drop(st, c); /* shm.c keeps the accounting */
	atomic_store(&c->closed, 1);
	while (atomic_load(&c->users))
		cpu_relax();
	/*
	 * Tell the peer now: the socket may outlive this (blocks it lent us
	 * keep the connection's memory), but the conversation is over.
	 */
	shutdown(c->sock, SHUT_RDWR);
	/* The table keeps its reference until shm_conn_reap: callers still use c. */
}

/* ------------------------------------------------------------------ */
/* Finding the connection to a peer                                    */
/* ------------------------------------------------------------------ */

/*
 * The connection that carries PUTs to the engine called name, with a
 * reference for the caller: one up, else a call under way (its PUTs
 * queue), else a new call. Up first, since both engines may have called
 * each other. 0, or -EHOSTUNREACH.
 */
int shm_conn_for(struct ferry_engine *e, struct backend *b, const char *name,
		 struct shm_conn **out)
{
	struct shm_state *st = b->data;
	struct shm_conn *c = NULL;

	for (uint32_t i = 0; i < SHM_MAX_CONNS && !(c && c->up); i++) {
		struct shm_conn *o = st->conns[i];

		if (o && !o->dead && strcmp(o->peer_name, name) == 0 && (!c || o->up))
			c = o;
	}
	if (!c && shm_call_start(e, b, name, &c) != 0)
		return -EHOSTUNREACH;
	atomic_fetch_add(&c->refs, 1);
	*out = c;
	return 0;
}

/*
 * engine/reactor_setup.c - the reactor's state made and unmade.
 *
 * Owns: what reactor_init makes at ferry_engine_create (the wake page, the
 * doorbell eventfd, the io_uring, the op table, the deadline heap, the key
 * table, the stream table) and reactor_fini frees, and reactor_shutdown:
 * at destroy, everything still pending (entries never taken, ops in flight,
 * data never consumed) ends here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "reactor_int.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

static int wake_page_init(struct ferry_engine *e)
{
	void *m;

	e->wake_fd = memfd_create("ferry-wake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (e->wake_fd < 0 || ftruncate(e->wake_fd, 4096) < 0 ||
	    fcntl(e->wake_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int rc = -errno;

		log_error("engine %s: wake page: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, e->wake_fd, 0);
	if (m == MAP_FAILED) {
		int rc = -errno;

		log_error("engine %s: wake page mmap: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	e->wake = m;
	/* Its peers' fences toward it may be light if its sleeps are heavy. */
	atomic_store(&e->wake->heavy_sleeps, e->asym_fences ? WAKE_HEAVY_SLEEPS : 0);
	return 0;
}

int reactor_init(struct ferry_engine *e)
{
	int rc;

	rc = wake_page_init(e);
	if (rc)
		return rc;
	e->doorbell_fd = eventfd(0, EFD_CLOEXEC);
	if (e->doorbell_fd < 0) {
		rc = -errno;
		log_error("engine %s: eventfd: %s", e->name, ferry_strerror(rc));
		return rc;
	}
	e->sleep_in_ppoll = RUNNING_ON_VALGRIND != 0;
	rc = io_uring_queue_init(64, &e->ring, 0);
	if (rc < 0) {
		log_error("engine %s: io_uring_queue_init: %s", e->name, ferry_strerror(rc));
		close(e->doorbell_fd);
		e->doorbell_fd = -1;
		return rc;
	}
	e->ops = calloc(e->max_ops, sizeof(*e->ops));
	if (!e->ops)
		return -ENOMEM;
	for (uint32_t i = e->max_ops; i-- > 0;) {
		e->ops[i].index = i;
		e->ops[i].heap_idx = NO_SLOT;
		e->ops[i].next = e->free_ops;
		e->free_ops = &e->ops[i];
	}
	rc = timer_init(&e->timers, e->max_ops);
	if (!rc)
		rc = keytable_init(&e->keys, e->max_keys, e->max_ops);
	if (!rc)
		rc = stream_init(e);
	return rc;
}

/*
 * At destroy, with progress held and the reactor thread gone: everything
 * still pending completes with -ECANCELED, its callback running here.
 */
void reactor_shutdown(struct ferry_engine *e)
{
	uint32_t nsqs = atomic_load(&e->nsqs);

	e->now_valid = false;
	/* Entries submitted but never taken. */
	for (uint32_t i = 0; i < nsqs; i++) {
		struct ferry_sq *sq = e->sqs[i];
		uint32_t tail = atomic_load(&sq->tail), head = atomic_load(&sq->head);

		for (; head != tail; head++) {
			struct ferry_sqe *sqe = &sq->sqes[head & sq->mask];
			struct ferry_cqe cqe = { .user_data = sqe->user_data, .res = -ECANCELED,
						 .opcode = sqe->opcode };

			if ((sqe->opcode == FERRY_OP_PUT || sqe->opcode == FERRY_OP_PUBLISH ||
			     sqe->opcode == FERRY_OP_STREAM_PUT) &&
			    sqe->buf && atomic_load(&sqe->buf->state) == POOL_BUF_LIVE)
				pool_free(sqe->buf);
			STAT_ADD(e->stats.cancelled, 1);
			if (sqe->cb)
				sqe->cb(&cqe, sqe->cb_arg);
		}
		atomic_store(&sq->head, tail);
	}
	/* Ops in flight. */
	for (uint32_t i = 0; i < e->max_ops; i++) {
		struct op *op = &e->ops[i];

		if (op_state_pending(op->state))
			op_complete(e, op, -ECANCELED, 0, NULL);
	}
	stream_shutdown(e);
	/* Data that arrived and was never consumed. */
	for (uint32_t i = 0; i < e->keys.capacity; i++) {
		struct key_entry *ke = &e->keys.entries[i];

		if (ke->present && ke->buf) {
			pool_free(ke->buf);
			ke->buf = NULL;
			ke->present = false;
		}
	}
}

void reactor_fini(struct ferry_engine *e)
{
	stream_fini(e);
	keytable_fini(&e->keys);
	timer_fini(&e->timers);
	free(e->ops);
	e->ops = NULL;
	if (e->ring.ring_fd > 0)
		io_uring_queue_exit(&e->ring);
	if (e->doorbell_fd >= 0)
		close(e->doorbell_fd);
	if (e->wake)
		munmap(e->wake, 4096);
	if (e->wake_fd >= 0)
		close(e->wake_fd);
}

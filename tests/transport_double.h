/*
 * tests/transport_double.h - a TEST DOUBLE of a transport, for the tests of
 * the engine's side of the transport contract (engine/transport.h): its
 * hooks carry no PUT and reach no peer (resolve: -EHOSTUNREACH), so the
 * real transports do the work; a test fills in what it observes (memory
 * registration, a URI scheme and address). A test program that uses one
 * defines the registry itself (TD_REGISTRY: the library's transports, then
 * its doubles), so the library's engine/registry.c is not linked in.
 */
#ifndef FERRY_TESTS_TRANSPORT_DOUBLE_H
#define FERRY_TESTS_TRANSPORT_DOUBLE_H

#include <errno.h>

#include "internal.h"

extern const struct backend_ops ferry__ctl_backend;
extern const struct backend_ops ferry__tcp_backend;
extern const struct backend_ops ferry__loop_backend;
extern const struct backend_ops ferry__shm_backend;
extern const struct backend_ops ferry__cuda_backend;

static inline int td_init(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	b->data = (void *)b->ops; /* non-NULL: up */
	return 0;
}

static void td_fini(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	b->data = NULL;
}

static int td_resolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *p)
{
	(void)e, (void)b, (void)p;
	return -EHOSTUNREACH;
}

static void td_unresolve(struct ferry_engine *e, struct backend *b, struct ferry_peer *p)
{
	(void)e, (void)b, (void)p;
}

static int td_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	(void)e, (void)b, (void)op;
	return -EHOSTUNREACH;
}

static int td_progress(struct ferry_engine *e, struct backend *b)
{
	(void)e, (void)b;
	return 0;
}

static bool td_has_work(struct ferry_engine *e, struct backend *b)
{
	(void)e, (void)b;
	return false;
}

static void td_forget(struct ferry_engine *e, struct backend *b, struct op *op)
{
	(void)e, (void)b, (void)op;
}

static void td_on_cqe(struct ferry_engine *e, struct backend *b, uint64_t c, int res, uint32_t f)
{
	(void)e, (void)b, (void)c, (void)res, (void)f;
}

/* The hooks every double has but init (td_init, or the test's); a test adds its own. */
#define TD_HOOKS(name_, rank_)                                                                 \
	.name = (name_), .rank = (rank_), .caps = TRANSPORT_CAP_MEM_HOST, .fini = td_fini,     \
	.resolve = td_resolve, .unresolve = td_unresolve, .put = td_put,                       \
	.progress = td_progress, .has_work = td_has_work, .forget = td_forget,                 \
	.on_cqe = td_on_cqe

/* This program's registry: the library's transports, then the doubles named. */
#define TD_REGISTRY(...)                                                                       \
	const struct backend_ops *const ferry__transports[] = {                                \
		&ferry__ctl_backend, &ferry__tcp_backend, &ferry__loop_backend,                \
		&ferry__shm_backend, &ferry__cuda_backend, __VA_ARGS__, NULL,                                        \
	}

#endif

/*
 * tests/test_memory_reg.c - each transport's registration of memory
 * (struct backend_ops mem_register / mem_deregister, engine/memory.c): the
 * engine's pool is registered once when a transport comes up, every region
 * when it is registered, and each handle goes back exactly once (at the
 * region's release, or before the transport stops); the handles are found
 * again for a block of the pool (ferry__buf_reg, with the block's offset)
 * and for a region (ferry__region_reg); a registration that fails fails
 * the call (the region, or the engine's creation) and undoes the others.
 *
 * The transports that register here are TEST DOUBLES (tests/transport_double.h):
 * this program has its own registry with the real transports and two
 * recording doubles that carry no PUT (they reach no peer). No transport
 * of this build registers memory yet (RDMA and CUDA will).
 */
#include "helpers.h"
#include "transport_double.h"

/* What a double saw; which registration of it is to fail (0: none). */
struct reg_double {
	int registers, deregisters;
	int fail_at;  /* the fail_at-th mem_register returns fail_rc */
	int fail_rc;
	void *addr[16];
	size_t len[16];
	int live[16]; /* handle i+1 is registered */
};

static struct reg_double dbl[2];

static int d_register(struct ferry_engine *e, struct backend *b, void *addr, size_t len,
		      enum ferry_mem_type mem, int device, void **handle)
{
	struct reg_double *d = b->data;
	int i = d->registers++;

	(void)e;
	if (mem != FERRY_MEM_HOST || device != 0 || i >= 16)
		return -EINVAL;
	if (d->fail_at && d->registers == d->fail_at)
		return d->fail_rc;
	d->addr[i] = addr;
	d->len[i] = len;
	d->live[i] = 1;
	*handle = (void *)(uintptr_t)(i + 1);
	return 0;
}

static void d_deregister(struct ferry_engine *e, struct backend *b, void *handle)
{
	struct reg_double *d = b->data;
	uintptr_t i = (uintptr_t)handle - 1;

	(void)e;
	d->deregisters++;
	assert_true(i < 16);
	assert_int_equal(d->live[i], 1); /* each handle back once */
	d->live[i] = 0;
}

static int d_init(struct ferry_engine *e, struct backend *b)
{
	(void)e;
	b->data = &dbl[b->ops->rank == 90 ? 0 : 1];
	return 0;
}

#define DOUBLE(rank_)                                                                          \
	{                                                                                      \
		TD_HOOKS("regdouble", rank_), .init = d_init, .mem_register = d_register,      \
		.mem_deregister = d_deregister,                                                \
	}

static const struct backend_ops double_a = DOUBLE(90), double_b = DOUBLE(91);

/* This program's registry: the library's transports, then the two doubles. */
TD_REGISTRY(&double_a, &double_b);

static int setup(void **state)
{
	(void)state;
	memset(dbl, 0, sizeof(dbl));
	return 0;
}

static int live(const struct reg_double *d)
{
	int n = 0;

	for (int i = 0; i < 16; i++)
		n += d->live[i];
	return n;
}

static void test_pool_registered_once(void **state)
{
	struct ferry_engine *e = t_engine("reg-pool", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct backend *a = ferry__backend_of(e, &double_a);
	struct ferry_buf *buf;
	uint64_t off = ~0ull;
	void *h;

	(void)state;
	assert_non_null(a);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(dbl[k].registers, 1);
		assert_int_equal(live(&dbl[k]), 1);
		assert_true(dbl[k].len[0] >= (1u << 20));
	}
	assert_int_equal(ferry_buf_alloc(e, 5000, &buf), 0);
	h = ferry__buf_reg(e, a, buf, &off);
	assert_ptr_equal(h, (void *)1);
	/* The block lies where its offset says, inside what was registered. */
	assert_ptr_equal((char *)dbl[0].addr[0] + off, ferry_buf_data(buf));
	assert_true(off + 5000 <= dbl[0].len[0]);
	assert_null(ferry__buf_reg(e, a, NULL, &off));
	ferry_buf_release(buf);
	assert_int_equal(ferry_engine_destroy(e), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(dbl[k].deregisters, 1);
		assert_int_equal(live(&dbl[k]), 0);
	}
}

static void test_region_registered_and_released(void **state)
{
	struct ferry_engine *e = t_engine("reg-region", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_region_params p = FERRY_REGION_PARAMS_INIT;
	struct backend *a = ferry__backend_of(e, &double_a), *b = ferry__backend_of(e, &double_b);
	struct ferry_region *r1 = NULL, *r2 = NULL;
	static char m1[4096], m2[100];

	(void)state;
	p.addr = m1;
	p.len = sizeof(m1);
	assert_int_equal(ferry_region_register(e, &p, &r1), 0);
	p.addr = m2;
	p.len = sizeof(m2);
	assert_int_equal(ferry_region_register(e, &p, &r2), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(dbl[k].registers, 3); /* the pool, r1, r2 */
		assert_ptr_equal(dbl[k].addr[1], m1);
		assert_int_equal(dbl[k].len[1], sizeof(m1));
		assert_ptr_equal(dbl[k].addr[2], m2);
	}
	assert_ptr_equal(ferry__region_reg(r1, a), (void *)2);
	assert_ptr_equal(ferry__region_reg(r2, b), (void *)3);
	assert_int_equal(ferry_region_release(&r1), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(dbl[k].deregisters, 1);
		assert_int_equal(dbl[k].live[1], 0); /* r1's handle, not another */
		assert_int_equal(live(&dbl[k]), 2);
	}
	/* r2 is left registered: the destroy gives its handle back, and the pool's. */
	assert_int_equal(ferry_engine_destroy(e), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(dbl[k].deregisters, 3);
		assert_int_equal(live(&dbl[k]), 0);
	}
}

static void test_region_registration_fails(void **state)
{
	struct ferry_engine *e = t_engine("reg-fail", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_region_params p = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;
	static char m[512];

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	dbl[1].fail_at = 2; /* the second double refuses the region */
	dbl[1].fail_rc = -ENOMEM;
	p.addr = m;
	p.len = sizeof(m);
	assert_int_equal(ferry_region_register(e, &p, &r), -ENOMEM);
	assert_null(r);
	/* The first double had registered it: that is undone. */
	assert_int_equal(dbl[0].registers, 2);
	assert_int_equal(dbl[0].deregisters, 1);
	assert_int_equal(live(&dbl[0]), 1); /* the pool only */
	assert_int_equal(live(&dbl[1]), 1);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	assert_int_equal(ferry_engine_destroy(e), 0);
	for (int k = 0; k < 2; k++)
		assert_int_equal(live(&dbl[k]), 0);
}

static void test_pool_registration_fails(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	dbl[1].fail_at = 1; /* the second double refuses the pool */
	dbl[1].fail_rc = -EFAULT;
	p.name = "reg-pool-fails";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 1u << 20;
	assert_int_equal(ferry_engine_create(&p, &e), -EFAULT);
	assert_null(e);
	assert_int_equal(dbl[0].registers, 1);
	assert_int_equal(live(&dbl[0]), 0); /* the first double's pool handle came back */
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	/* The name is free again: nothing of the failed engine is left. */
	dbl[1].fail_at = 0;
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	assert_int_equal(ferry_engine_destroy(e), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_pool_registered_once, setup),
		cmocka_unit_test_setup(test_region_registered_and_released, setup),
		cmocka_unit_test_setup(test_region_registration_fails, setup),
		cmocka_unit_test_setup(test_pool_registration_fails, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

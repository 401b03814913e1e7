/*
 * tests/test_memory.c - memory types and registered regions: buffers with
 * parameters (host memory; ferry gives no CUDA buffers: -EOPNOTSUPP; a
 * CUDA region without a runtime is -ENODEV: tests/helpers.h turns CUDA off),
 * regions registered and released (refused while an op names them), and
 * PUT / GET / STREAM_PUT with segments of regions where an iovec stands,
 * over the in-process transport and over tcp (small PUTs copied straight
 * from the segments into the frame, large ones through the pool), every
 * byte checked, and every bad segment refused with -EINVAL.
 */
#include "tcp_helpers.h"

static struct ferry_region *reg(struct ferry_engine *e, void *addr, size_t len)
{
	struct ferry_region_params p = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;

	p.addr = addr;
	p.len = len;
	assert_int_equal(ferry_region_register(e, &p, &r), 0);
	assert_non_null(r);
	return r;
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7);
}

static void test_buf_params(void **state)
{
	struct ferry_engine *e = t_engine("mem", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_buf_params p = FERRY_BUF_PARAMS_INIT;
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;
	struct ferry_buf *b = NULL;
	static char mem[64];

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	p.len = 1000;
	assert_int_equal(ferry_buf_alloc_params(e, &p, &b), 0);
	assert_int_equal(ferry_buf_len(b), 1000);
	assert_int_equal(ferry_buf_mem(b), FERRY_MEM_HOST);
	memset(ferry_buf_data(b), 1, 1000);
	ferry_buf_release(b);
	p.mem = FERRY_MEM_CUDA; /* ferry gives no device buffers */
	assert_int_equal(ferry_buf_alloc_params(e, &p, &b), -EOPNOTSUPP);
	assert_null(b);
	p.mem = (enum ferry_mem_type)7;
	assert_int_equal(ferry_buf_alloc_params(e, &p, &b), -EINVAL);
	p.mem = FERRY_MEM_HOST;
	p.flags = 1;
	assert_int_equal(ferry_buf_alloc_params(e, &p, &b), -EINVAL);
	p.flags = 0;
	p.size = 3;
	assert_int_equal(ferry_buf_alloc_params(e, &p, &b), -EINVAL);
	assert_int_equal(ferry_buf_alloc_params(NULL, &p, &b), -EINVAL);
	assert_int_equal(ferry_region_register(e, &rp, &r), -EINVAL); /* NULL addr */
	rp.addr = mem;
	assert_int_equal(ferry_region_register(e, &rp, &r), -EINVAL); /* empty */
	rp.len = sizeof(mem);
	rp.mem = FERRY_MEM_CUDA; /* no CUDA runtime (FERRY_CUDA_RUNTIME=none) */
	assert_int_equal(ferry_region_register(e, &rp, &r), -ENODEV);
	rp.mem = FERRY_MEM_HOST;
	assert_int_equal(ferry_region_register(e, &rp, &r), 0);
	assert_int_equal(ferry_region_release(&r), 0);
	assert_null(r);
	assert_int_equal(ferry_region_release(&r), -EINVAL);
	assert_int_equal(ferry_engine_destroy(e), 0);
}

/* Segments of two regions put, taken into segments of a third, and zero copy. */
static void test_segments_loop(void **state)
{
	struct ferry_engine *a = t_engine("sa", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_engine *b = t_engine("sb", FERRY_PROGRESS_THREAD, 4u << 20);
	struct ferry_peer *to = t_peer(a, "sb"), *from = t_peer(b, "sa");
	static uint8_t m1[300000], m2[5000], dst[400000], want[305000];
	struct ferry_region *r1 = reg(a, m1, sizeof(m1)), *r2 = reg(a, m2, sizeof(m2));
	struct ferry_region *rd = reg(b, dst, sizeof(dst));
	struct ferry_seg src[3] = { { r1, 100, 200000 }, { r2, 0, 5000 }, { r1, 250000, 50000 } };
	struct ferry_seg out[2] = { { rd, 0, 100000 }, { rd, 200000, 200000 } };
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	(void)state;
	pattern(m1, sizeof(m1), 1);
	pattern(m2, sizeof(m2), 2);
	memcpy(want, m1 + 100, 200000);
	memcpy(want + 200000, m2, 5000);
	memcpy(want + 205000, m1 + 250000, 50000);
	sqe = t_sqe(a);
	ferry_prep_put_segs(sqe, to, "k", src, 3, 1);
	t_submit(a);
	t_expect(a, NULL, 1, 0, &c);
	assert_int_equal(c.len, 255000);
	sqe = t_sqe(b);
	ferry_prep_get_segs(sqe, from, "k", out, 2, 2);
	t_submit(b);
	t_expect(b, NULL, 2, 0, &c);
	assert_int_equal(c.len, 255000);
	assert_memory_equal(dst, want, 100000);
	assert_memory_equal(dst + 200000, want + 100000, 155000);
	/* Zero copy of a PUT of segments; a STREAM_PUT of segments. */
	sqe = t_sqe(a);
	ferry_prep_put_segs(sqe, to, "k2", src + 1, 1, 3);
	t_submit(a);
	t_expect(a, NULL, 3, 0, NULL);
	t_get(b, from, "k2", NULL, 0, 4, 0, 0);
	t_expect(b, NULL, 4, 0, &c);
	assert_int_equal(c.len, 5000);
	assert_memory_equal(ferry_buf_data(c.buf), m2, 5000);
	ferry_buf_release(c.buf);
	sqe = t_sqe(b);
	ferry_prep_stream_get(sqe, from, "st", 5);
	t_submit(b);
	sqe = t_sqe(a);
	ferry_prep_stream_put_segs(sqe, to, "st", src + 1, 1, 6);
	ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_END);
	t_submit(a);
	t_expect(a, NULL, 6, 0, NULL);
	t_expect(b, NULL, 5, 0, &c);
	assert_memory_equal(ferry_buf_data(c.buf), m2, 5000);
	ferry_buf_release(c.buf);
	/* A GET into segments that waits pins its region: no release under it. */
	sqe = t_sqe(b);
	ferry_prep_get_segs(sqe, from, "later", out, 1, 7);
	t_submit(b);
	t_expect_none(b, NULL, 50);
	assert_int_equal(ferry_region_release(&rd), -EBUSY);
	assert_non_null(rd);
	t_put(a, to, "later", "xyz", 3, 8, 0);
	t_expect(a, NULL, 8, 0, NULL);
	t_expect(b, NULL, 7, 0, &c);
	assert_memory_equal(dst, "xyz", 3);
	assert_int_equal(ferry_region_release(&rd), 0);
	assert_int_equal(ferry_region_release(&r2), 0);
	/* r1 is left to ferry_engine_destroy. */
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(ferry_engine_destroy(b), 0);
}

static void test_bad_segments(void **state)
{
	struct ferry_engine *a = t_engine("ba", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_engine *b = t_engine("bb", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *to = t_peer(a, "bb");
	static uint8_t m[1000], other[100];
	struct ferry_region *r = reg(a, m, sizeof(m)), *foreign = reg(b, other, sizeof(other));
	struct ferry_region *gone = reg(a, other, sizeof(other));
	struct ferry_seg bad[][2] = {
		{ { r, 999, 2 } },                /* past the end */
		{ { r, 1001, 0 } },               /* starts past the end */
		{ { r, 0, UINT64_MAX } },         /* wraps */
		{ { NULL, 0, 1 } },               /* no region */
		{ { foreign, 0, 10 } },           /* another engine's */
		{ { r, 0, 10 }, { gone, 0, 1 } }, /* released (the good one before it is let go) */
	};
	struct ferry_sqe *sqe;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	assert_int_equal(ferry_region_release(&gone), 0); /* bad[5] keeps its old address */
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sqe = t_sqe(a);
		ferry_prep_put_segs(sqe, to, "k", bad[i], i == 5 ? 2 : 1, i);
		t_submit(a);
		t_expect(a, b, i, -EINVAL, NULL);
	}
	/* Nothing stayed pinned: the good region of the last one goes. */
	assert_int_equal(ferry_region_release(&r), 0);
	assert_int_equal(ferry_region_release(&foreign), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(ferry_engine_destroy(b), 0);
}

/* Over tcp: small PUTs are copied from the segments straight into the frame. */
static void test_segments_tcp(void **state)
{
	struct mk ma = { .name = "ta", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct mk mb = { .name = "tb", .listen = "tcp://127.0.0.1:0", .secret = SECRET };
	struct ferry_engine *a = mk_engine(&ma), *b = mk_engine(&mb);
	struct ferry_peer *to = t_peer(a, "tb"), *from = t_peer(b, "ta");
	static uint8_t m[200000], dst[200000];
	struct ferry_region *r = reg(a, m, sizeof(m)), *rd = reg(b, dst, sizeof(dst));
	char addr[NETADDR_MAX];
	const size_t sizes[] = { 0, 1, 100, 256, 257, 150000 };
	struct ferry_cqe c;

	(void)state;
	engine_addr(b, addr, sizeof(addr));
	assert_int_equal(ferry_peer_set_address(to, addr), 0);
	pattern(m, sizeof(m), 3);
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		struct ferry_seg s[2] = { { r, 7, sizes[i] / 2 }, { r, 100000, sizes[i] - sizes[i] / 2 } };
		struct ferry_seg d = { rd, 0, sizeof(dst) };
		struct ferry_sqe *sqe = t_sqe(a);
		char key[16];

		snprintf(key, sizeof(key), "k%u", i);
		ferry_prep_put_segs(sqe, to, key, s, 2, i);
		t_submit(a);
		t_expect(a, NULL, i, 0, NULL);
		memset(dst, 0, sizeof(dst));
		sqe = t_sqe(b);
		ferry_prep_get_segs(sqe, from, key, &d, 1, 100 + i);
		t_submit(b);
		t_expect(b, NULL, 100 + i, 0, &c);
		assert_int_equal(c.len, sizes[i]);
		if (sizes[i]) {
			assert_memory_equal(dst, m + 7, sizes[i] / 2);
			assert_memory_equal(dst + sizes[i] / 2, m + 100000, sizes[i] - sizes[i] / 2);
		}
	}
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buf_params),
		cmocka_unit_test(test_segments_loop),
		cmocka_unit_test(test_bad_segments),
		cmocka_unit_test(test_segments_tcp),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

/*
 * tests/test_cuda_runtime.c - the CUDA runtime loader (engine/cuda_rt.c)
 * on this machine as it is, with no double: a runtime that is not there
 * (a path that does not load), and the machine's own libcudart (on a
 * machine without a GPU: it loads and sees no device). Either way device
 * memory is refused with -ENODEV, logged, health says why, and host
 * transfers are unchanged. On a machine with a GPU the second case checks
 * that a host pointer is not taken for device memory instead.
 */
#include <dlfcn.h>

#include "helpers.h"

static void host_unchanged(struct ferry_engine *a, struct ferry_engine *b, const char *an,
			   const char *bn)
{
	struct ferry_peer *to = t_peer(a, bn), *from = t_peer(b, an);
	static uint8_t got[16];

	t_put(a, to, "k", "unchanged", 9, 1, 0);
	t_expect(a, NULL, 1, 0, NULL);
	t_get(b, from, "k", t_iov_of(got, sizeof(got)), 1, 2, 0, 0);
	t_expect(b, NULL, 2, 0, NULL);
	assert_memory_equal(got, "unchanged", 9);
}

static int region_cuda(struct ferry_engine *e, void *p, size_t len)
{
	struct ferry_region_params rp = FERRY_REGION_PARAMS_INIT;
	struct ferry_region *r = NULL;

	rp.addr = p;
	rp.len = len;
	rp.mem = FERRY_MEM_CUDA;
	return ferry_region_register(e, &rp, &r);
}

static void test_runtime_missing(void **state)
{
	struct ferry_engine *a, *b;
	static char h[65536], mem[64];

	(void)state;
	setenv("FERRY_CUDA_RUNTIME", "/nonexistent/libcudart.so.13", 1);
	t_log_capture(FERRY_LOG_INFO);
	a = t_engine("ma", FERRY_PROGRESS_THREAD, 1u << 20);
	b = t_engine("mb", FERRY_PROGRESS_THREAD, 1u << 20);
	assert_true(ferry_engine_health(a, h, sizeof(h)) < (int)sizeof(h));
	assert_non_null(strstr(h, "\"why\":\"not loaded yet")); /* health never loads it */
	assert_int_equal(region_cuda(a, mem, sizeof(mem)), -ENODEV);
	assert_true(t_log_seen(FERRY_LOG_ERROR, "CUDA device memory is not available",
			       "FERRY_CUDA_RUNTIME"));
	assert_true(ferry_engine_health(a, h, sizeof(h)) < (int)sizeof(h));
	assert_non_null(strstr(h, "\"available\":false,\"why\":\"the CUDA runtime named by "
				  "FERRY_CUDA_RUNTIME"));
	assert_false(ferry_features() & FERRY_FEATURE_CUDA);
	host_unchanged(a, b, "ma", "mb");
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_runtime_of_this_machine(void **state)
{
	struct ferry_engine *a, *b;
	static char h[65536], mem[64];
	void *lib = NULL;
	const char *names[] = { "libcudart.so.13", "libcudart.so.12", "libcudart.so" };

	(void)state;
	unsetenv("FERRY_CUDA_RUNTIME");
	for (unsigned i = 0; i < 3 && !lib; i++)
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	a = t_engine("oa", FERRY_PROGRESS_THREAD, 1u << 20);
	b = t_engine("ob", FERRY_PROGRESS_THREAD, 1u << 20);
	if (ferry_features() & FERRY_FEATURE_CUDA) {
		/* A GPU: host memory is not taken for device memory. */
		print_message("this machine has a CUDA device: the refusal of host memory is checked\n");
		assert_int_equal(region_cuda(a, mem, sizeof(mem)), -EINVAL);
	} else {
		assert_int_equal(region_cuda(a, mem, sizeof(mem)), -ENODEV);
		assert_true(ferry_engine_health(a, h, sizeof(h)) < (int)sizeof(h));
		print_message("%s: %s\n", lib ? "libcudart is here" : "no libcudart",
			      strstr(h, "\"cuda\":{"));
		assert_non_null(strstr(h, lib ? "sees no device" : "no CUDA runtime on this machine"));
	}
	host_unchanged(a, b, "oa", "ob");
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_runtime_missing),
		cmocka_unit_test(test_runtime_of_this_machine),
	};

	signal(SIGPIPE, SIG_IGN);
	return t_run_group_apart(tests, NULL, NULL);
}

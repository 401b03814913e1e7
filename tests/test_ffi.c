/*
 * tests/test_ffi.c - what a binding that cannot call inline functions sees:
 * libferry.so opened with dlopen, as cffi or ctypes would, exports every SQE
 * helper (ferry_prep_*, ferry_sqe_set_*) out of line, and each fills an SQE
 * byte for byte as the inline one of ferry.h does; ferry_version and
 * ferry_features answer; and a PUT/GET round trip made only of functions
 * looked up by name works.
 */
#include <dlfcn.h>

#include "helpers.h"

static void *lib;

static void *sym(const char *name)
{
	void *f = dlsym(lib, name);

	if (!f)
		fail_msg("libferry.so does not export %s", name);
	return f;
}

static int setup(void **state)
{
	(void)state;
	lib = dlopen(FERRY_TEST_BINDIR "/libferry.so", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		fail_msg("dlopen: %s", dlerror());
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	dlclose(lib);
	return 0;
}

/* Two SQEs filled alike, one by the inline helper, one by the exported one. */
static void same(const struct ferry_sqe *a, const struct ferry_sqe *b, const char *what)
{
	if (memcmp(a, b, sizeof(*a)) != 0)
		fail_msg("%s: the exported helper fills the SQE otherwise than the inline one", what);
}

static void test_helpers_out_of_line(void **state)
{
	static struct ferry_sqe a, b;
	struct ferry_peer *peer = (struct ferry_peer *)0x1000; /* never dereferenced */
	struct ferry_buf *buf = (struct ferry_buf *)0x2000;
	struct ferry_cq *cq = (struct ferry_cq *)0x3000;
	struct iovec iov[2] = { { "ab", 2 }, { "cd", 2 } };

	(void)state;
#define TWICE(what, call_inline, call_lib)                                                   \
	do {                                                                                 \
		memset(&a, 0x5a, sizeof(a));                                                 \
		memset(&b, 0x5a, sizeof(b));                                                 \
		call_inline;                                                                 \
		call_lib;                                                                    \
		same(&a, &b, what);                                                          \
	} while (0)
	void (*nop)(struct ferry_sqe *, uint64_t) = sym("ferry_prep_nop");
	TWICE("nop", ferry_prep_nop(&a, 7), nop(&b, 7));
	void (*put)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
		    unsigned, uint64_t) = sym("ferry_prep_put");
	TWICE("put", ferry_prep_put(&a, peer, "key", iov, 2, 8), put(&b, peer, "key", iov, 2, 8));
	void (*put_buf)(struct ferry_sqe *, struct ferry_peer *, const char *, struct ferry_buf *,
			uint64_t) = sym("ferry_prep_put_buf");
	TWICE("put_buf", ferry_prep_put_buf(&a, peer, "k", buf, 9), put_buf(&b, peer, "k", buf, 9));
	void (*get)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
		    unsigned, uint64_t) = sym("ferry_prep_get");
	TWICE("get", ferry_prep_get(&a, peer, "key", iov, 1, 10), get(&b, peer, "key", iov, 1, 10));
	void (*cancel)(struct ferry_sqe *, uint64_t, uint64_t) = sym("ferry_prep_cancel");
	TWICE("cancel", ferry_prep_cancel(&a, 3, 11), cancel(&b, 3, 11));
	void (*cleanup)(struct ferry_sqe *, struct ferry_peer *, const char *, uint64_t) =
		sym("ferry_prep_cleanup");
	TWICE("cleanup", ferry_prep_cleanup(&a, peer, "req", 12), cleanup(&b, peer, "req", 12));
	void (*health)(struct ferry_sqe *, struct ferry_peer *, uint64_t) =
		sym("ferry_prep_peer_health");
	TWICE("peer_health", ferry_prep_peer_health(&a, peer, 13), health(&b, peer, 13));
	void (*lookup)(struct ferry_sqe *, struct ferry_peer *, const char *, uint64_t) =
		sym("ferry_prep_lookup");
	TWICE("lookup", ferry_prep_lookup(&a, peer, "k", 14), lookup(&b, peer, "k", 14));
	void (*rcancel)(struct ferry_sqe *, struct ferry_peer *, const char *, uint64_t) =
		sym("ferry_prep_remote_cancel");
	TWICE("remote_cancel", ferry_prep_remote_cancel(&a, peer, "r", 15), rcancel(&b, peer, "r", 15));
	void (*sput)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
		     unsigned, uint64_t) = sym("ferry_prep_stream_put");
	TWICE("stream_put", ferry_prep_stream_put(&a, peer, "s", iov, 2, 16),
	      sput(&b, peer, "s", iov, 2, 16));
	void (*sput_buf)(struct ferry_sqe *, struct ferry_peer *, const char *, struct ferry_buf *,
			 uint64_t) = sym("ferry_prep_stream_put_buf");
	TWICE("stream_put_buf", ferry_prep_stream_put_buf(&a, peer, "s", buf, 17),
	      sput_buf(&b, peer, "s", buf, 17));
	void (*sget)(struct ferry_sqe *, struct ferry_peer *, const char *, uint64_t) =
		sym("ferry_prep_stream_get");
	TWICE("stream_get", ferry_prep_stream_get(&a, peer, "s", 18), sget(&b, peer, "s", 18));
	void (*sabort)(struct ferry_sqe *, struct ferry_peer *, const char *, const char *, uint64_t) =
		sym("ferry_prep_stream_abort");
	TWICE("stream_abort", ferry_prep_stream_abort(&a, peer, "s", "why", 19),
	      sabort(&b, peer, "s", "why", 19));
	void (*saccept)(struct ferry_sqe *, struct ferry_peer *, uint64_t) =
		sym("ferry_prep_stream_accept");
	TWICE("stream_accept", ferry_prep_stream_accept(&a, peer, 20), saccept(&b, peer, 20));
	void (*publish)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
			unsigned, uint64_t) = sym("ferry_prep_publish");
	TWICE("publish", ferry_prep_publish(&a, peer, "k", iov, 2, 21), publish(&b, peer, "k", iov, 2, 21));
	void (*publish_buf)(struct ferry_sqe *, struct ferry_peer *, const char *, struct ferry_buf *,
			    uint64_t) = sym("ferry_prep_publish_buf");
	TWICE("publish_buf", ferry_prep_publish_buf(&a, peer, "k", buf, 22),
	      publish_buf(&b, peer, "k", buf, 22));
	void (*fetch)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
		      unsigned, uint64_t) = sym("ferry_prep_fetch");
	TWICE("fetch", ferry_prep_fetch(&a, peer, "k", iov, 1, 23), fetch(&b, peer, "k", iov, 1, 23));
	{
		struct ferry_seg segs[2] = { { (struct ferry_region *)0x5000, 1, 2 },
					     { (struct ferry_region *)0x6000, 3, 4 } };
		void (*put_segs)(struct ferry_sqe *, struct ferry_peer *, const char *,
				 const struct ferry_seg *, unsigned, uint64_t) = sym("ferry_prep_put_segs");
		void (*get_segs)(struct ferry_sqe *, struct ferry_peer *, const char *,
				 const struct ferry_seg *, unsigned, uint64_t) = sym("ferry_prep_get_segs");
		void (*sput_segs)(struct ferry_sqe *, struct ferry_peer *, const char *,
				  const struct ferry_seg *, unsigned, uint64_t) =
			sym("ferry_prep_stream_put_segs");

		TWICE("put_segs", ferry_prep_put_segs(&a, peer, "k", segs, 2, 24),
		      put_segs(&b, peer, "k", segs, 2, 24));
		TWICE("get_segs", ferry_prep_get_segs(&a, peer, "k", segs, 2, 25),
		      get_segs(&b, peer, "k", segs, 2, 25));
		TWICE("stream_put_segs", ferry_prep_stream_put_segs(&a, peer, "s", segs, 2, 26),
		      sput_segs(&b, peer, "s", segs, 2, 26));
	}
	/* The setters, on an SQE prepared alike. */
	void (*flags)(struct ferry_sqe *, uint32_t) = sym("ferry_sqe_set_flags");
	TWICE("set_flags", (ferry_prep_nop(&a, 1), ferry_sqe_set_flags(&a, 3)),
	      (nop(&b, 1), flags(&b, 3)));
	void (*timeout)(struct ferry_sqe *, uint64_t) = sym("ferry_sqe_set_timeout");
	TWICE("set_timeout", (ferry_prep_nop(&a, 1), ferry_sqe_set_timeout(&a, 12345)),
	      (nop(&b, 1), timeout(&b, 12345)));
	void (*callback)(struct ferry_sqe *, ferry_complete_cb *, void *) =
		sym("ferry_sqe_set_callback");
	TWICE("set_callback",
	      (ferry_prep_nop(&a, 1), ferry_sqe_set_callback(&a, (ferry_complete_cb *)0x4000, buf)),
	      (nop(&b, 1), callback(&b, (ferry_complete_cb *)0x4000, buf)));
	void (*setcq)(struct ferry_sqe *, struct ferry_cq *) = sym("ferry_sqe_set_cq");
	TWICE("set_cq", (ferry_prep_nop(&a, 1), ferry_sqe_set_cq(&a, cq)), (nop(&b, 1), setcq(&b, cq)));
#undef TWICE
	int (*version)(void) = sym("ferry_version");
	uint32_t (*features)(void) = sym("ferry_features");

	assert_int_equal(version(), FERRY_VERSION_NUMBER);
	assert_int_equal(ferry_version(), FERRY_VERSION_NUMBER);
	assert_true(features() & FERRY_FEATURE_SHM);
	assert_int_equal(features(), ferry_features());
}

/* A PUT and a GET between two engines, made only of functions looked up by name. */
static void test_round_trip_by_name(void **state)
{
	int (*create)(const struct ferry_engine_params *, struct ferry_engine **) =
		sym("ferry_engine_create");
	int (*destroy)(struct ferry_engine *) = sym("ferry_engine_destroy");
	int (*peer_open)(struct ferry_engine *, const char *, struct ferry_peer **) =
		sym("ferry_peer_open");
	int (*sq_get)(struct ferry_engine *, struct ferry_sq **) = sym("ferry_sq_get");
	struct ferry_sqe *(*get_sqe)(struct ferry_sq *) = sym("ferry_sq_get_sqe");
	int (*submit)(struct ferry_sq *) = sym("ferry_sq_submit");
	struct ferry_cq *(*cq_default)(struct ferry_engine *) = sym("ferry_cq_default");
	int (*cq_wait)(struct ferry_cq *, struct ferry_cqe *, unsigned, int64_t) =
		sym("ferry_cq_wait");
	void (*prep_put)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
			 unsigned, uint64_t) = sym("ferry_prep_put");
	void (*prep_get)(struct ferry_sqe *, struct ferry_peer *, const char *, const struct iovec *,
			 unsigned, uint64_t) = sym("ferry_prep_get");
	struct ferry_engine_params pa = FERRY_ENGINE_PARAMS_INIT, pb = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *a, *b;
	struct ferry_peer *to_b, *from_a;
	struct ferry_sq *sq;
	struct ferry_cqe c;
	char out[8] = "";
	struct iovec in = { "hello", 5 }, dst = { out, sizeof(out) };

	(void)state;
	pa.name = "ffi-a";
	pb.name = "ffi-b";
	pa.ns = pb.ns = "ffi";
	pa.pool_size = pb.pool_size = 1u << 20;
	assert_int_equal(create(&pa, &a), 0);
	assert_int_equal(create(&pb, &b), 0);
	assert_int_equal(peer_open(a, "ffi-b", &to_b), 0);
	assert_int_equal(peer_open(b, "ffi-a", &from_a), 0);
	assert_int_equal(sq_get(a, &sq), 0);
	prep_put(get_sqe(sq), to_b, "k", &in, 1, 1);
	assert_int_equal(submit(sq), 1);
	assert_int_equal(cq_wait(cq_default(a), &c, 1, 5 * SEC), 1);
	assert_int_equal(c.res, 0);
	assert_int_equal(sq_get(b, &sq), 0);
	prep_get(get_sqe(sq), from_a, "k", &dst, 1, 2);
	assert_int_equal(submit(sq), 1);
	assert_int_equal(cq_wait(cq_default(b), &c, 1, 5 * SEC), 1);
	assert_int_equal(c.res, 0);
	assert_int_equal(c.len, 5);
	assert_memory_equal(out, "hello", 5);
	assert_int_equal(destroy(a), 0);
	assert_int_equal(destroy(b), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_helpers_out_of_line),
		cmocka_unit_test(test_round_trip_by_name),
	};

	return t_run_group_apart(tests, setup, teardown);
}

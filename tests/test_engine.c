/*
 * tests/test_engine.c - the public API's contract at its edges: engine
 * lifecycle and parameters, the error path of every public function (NULL,
 * zero length, oversized key, unknown opcode, shut-down engine), submission
 * backpressure, CQ overflow, strerror, health.
 */
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <unistd.h>

#include "helpers.h"

static void quiet_logs(void)
{
	/* The error paths log by design; keep test output readable. */
	ferry_log_set(-1, NULL, NULL);
}

static void test_create_params(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = (void *)0x1;
	char longname[FERRY_NAME_MAX + 8];

	(void)state;
	quiet_logs();
	assert_int_equal(ferry_engine_create(NULL, &e), -EINVAL);
	assert_null(e); /* *out is cleared on failure */
	p.name = "x";
	assert_int_equal(ferry_engine_create(&p, NULL), -EINVAL);

	p.size = 8; /* an unknown (too small) params version */
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.size = sizeof(p) + 8; /* from a newer header we do not know */
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.size = sizeof(p);

	p.name = NULL;
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.name = "";
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.name = "has space";
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	memset(longname, 'a', sizeof(longname));
	longname[sizeof(longname) - 1] = '\0';
	p.name = longname;
	assert_int_equal(ferry_engine_create(&p, &e), -ENAMETOOLONG);
	p.name = "ok";
	p.ns = longname;
	assert_int_equal(ferry_engine_create(&p, &e), -ENAMETOOLONG);
	p.ns = NULL;
	p.progress = (enum ferry_progress_mode)7;
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.progress = FERRY_PROGRESS_MANUAL;
	p.flags = 0x80;
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.flags = 0;
	p.max_ops = (1u << 20) + 1;
	assert_int_equal(ferry_engine_create(&p, &e), -EINVAL);
	p.max_ops = 0;
	p.config_path = "stages.yaml";
	assert_int_equal(ferry_engine_create(&p, &e), -EOPNOTSUPP);
	p.config_path = NULL;
	p.pool_size = 1u << 20;
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	assert_string_equal(ferry_engine_name(e), "ok");
	assert_int_equal(ferry_engine_destroy(e), 0);
	assert_int_equal(ferry_engine_destroy(NULL), -EINVAL);
}

static void test_name_clash(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *a, *b, *c;

	(void)state;
	quiet_logs();
	p.name = "twin";
	p.ns = "clash";
	p.pool_size = 1u << 20;
	p.progress = FERRY_PROGRESS_MANUAL;
	assert_int_equal(ferry_engine_create(&p, &a), 0);
	assert_int_equal(ferry_engine_create(&p, &b), -EADDRINUSE);
	p.ns = "other"; /* namespaces isolate */
	assert_int_equal(ferry_engine_create(&p, &c), 0);
	assert_int_equal(ferry_engine_destroy(a), 0);
	p.ns = "clash"; /* the name is free again once its engine is gone */
	assert_int_equal(ferry_engine_create(&p, &b), 0);
	ferry_engine_destroy(b);
	ferry_engine_destroy(c);
}

static void test_null_arguments(void **state)
{
	struct ferry_engine *e = t_engine("nulls", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_cqe cqe;
	struct ferry_sq *sq;
	struct ferry_peer *p;
	struct ferry_buf *b;
	struct ferry_cq *cq;
	char buf[8];

	(void)state;
	quiet_logs();
	assert_int_equal(ferry_sq_get(NULL, &sq), -EINVAL);
	assert_int_equal(ferry_sq_get(e, NULL), -EINVAL);
	assert_int_equal(ferry_sq_submit(NULL), -EINVAL);
	assert_null(ferry_sq_get_sqe(NULL));
	assert_int_equal(ferry_sq_space(NULL), 0);
	assert_int_equal(ferry_sq_put(NULL), -EINVAL);
	assert_int_equal(ferry_peer_open(NULL, "x", &p), -EINVAL);
	assert_int_equal(ferry_peer_open(e, NULL, &p), -EINVAL);
	assert_int_equal(ferry_peer_open(e, "x", NULL), -EINVAL);
	assert_int_equal(ferry_peer_open(e, "", &p), -EINVAL);
	assert_null(ferry_peer_name(NULL));
	assert_int_equal(ferry_buf_alloc(NULL, 8, &b), -EINVAL);
	assert_int_equal(ferry_buf_alloc(e, 8, NULL), -EINVAL);
	assert_int_equal(ferry_buf_release(NULL), -EINVAL);
	assert_null(ferry_buf_data(NULL));
	assert_int_equal(ferry_buf_len(NULL), 0);
	assert_int_equal(ferry_buf_set_len(NULL, 1), -EINVAL);
	assert_int_equal(ferry_cq_poll(NULL, &cqe, 1), -EINVAL);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), NULL, 1), -EINVAL);
	assert_int_equal(ferry_cq_poll(ferry_cq_default(e), NULL, 0), 0);
	assert_int_equal(ferry_cq_wait(NULL, &cqe, 1, 0), -EINVAL);
	assert_int_equal(ferry_cq_wait(ferry_cq_default(e), NULL, 1, 0), -EINVAL);
	assert_int_equal(ferry_cq_wait(ferry_cq_default(e), &cqe, 0, 0), -EINVAL);
	assert_int_equal(ferry_cq_wake(NULL), -EINVAL);
	assert_int_equal(ferry_cq_fd(NULL), -EINVAL);
	assert_int_equal(ferry_cq_arm(NULL), -EINVAL);
	assert_null(ferry_cq_default(NULL));
	assert_int_equal(ferry_cq_create(NULL, NULL, &cq), -EINVAL);
	assert_int_equal(ferry_cq_create(e, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_cq_destroy(NULL), -EINVAL);
	assert_int_equal(ferry_cq_destroy(ferry_cq_default(e)), -EINVAL);
	assert_int_equal(ferry_progress(NULL), -EINVAL);
	assert_int_equal(ferry_engine_health(NULL, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(ferry_engine_health(e, NULL, 8), -EINVAL);
	assert_null(ferry_engine_name(NULL));
	ferry_engine_destroy(e);
}

static void test_cq_params(void **state)
{
	struct ferry_engine *e = t_engine("cqparams", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_cq_params p = FERRY_CQ_PARAMS_INIT;
	struct ferry_cq *cq;

	(void)state;
	quiet_logs();
	p.flags = 1;
	assert_int_equal(ferry_cq_create(e, &p, &cq), -EINVAL);
	p.flags = 0;
	p.entries = (1u << 24) + 1;
	assert_int_equal(ferry_cq_create(e, &p, &cq), -EINVAL);
	p.entries = 3;
	p.size = 2;
	assert_int_equal(ferry_cq_create(e, &p, &cq), -EINVAL);
	p.size = sizeof(p);
	assert_int_equal(ferry_cq_create(e, &p, &cq), 0);
	assert_true(ferry_cq_fd(cq) >= 0);
	assert_int_equal(ferry_cq_destroy(cq), 0);
	assert_int_equal(ferry_cq_create(e, NULL, &cq), 0); /* NULL params: defaults */
	ferry_engine_destroy(e); /* extra CQs go with the engine */
}

static void test_strerror(void **state)
{
	(void)state;
	assert_string_equal(ferry_err_name(-EAGAIN), "EAGAIN");
	assert_string_equal(ferry_err_name(ETIMEDOUT), "ETIMEDOUT");
	assert_string_equal(ferry_err_name(0), "OK");
	assert_string_equal(ferry_err_name(-99999), "UNKNOWN");
	assert_string_equal(ferry_strerror(0), "success");
	assert_string_equal(ferry_strerror(-EEXIST),
			    "key already live at the destination (use REPLACE)");
	assert_non_null(strstr(ferry_strerror(-ECANCELED), "cancel"));
	assert_string_equal(ferry_strerror(-99999), "unknown error");
	/* The extremes are codes like any other (no -INT_MIN overflow). */
	assert_string_equal(ferry_strerror(INT_MIN), "unknown error");
	assert_string_equal(ferry_err_name(INT_MIN), "UNKNOWN");
	assert_string_equal(ferry_err_name(INT_MAX), "UNKNOWN");
	/* An errno ferry never gives itself: the C library's name. */
	assert_string_equal(ferry_err_name(-EXDEV), "EXDEV");
}

/*
 * Every error code api/ferry.h (and docs/api.md) documents, read from the
 * files themselves: each has its own text and its own name (ENOTCONN,
 * EACCES, EPROTONOSUPPORT, ERANGE once had "unknown error" / "UNKNOWN").
 */
static void test_strerror_every_documented_code(void **state)
{
	static const char *const files[] = { FERRY_TEST_SRCDIR "/../api/ferry.h",
					     FERRY_TEST_SRCDIR "/../docs/api.md" };
	static const struct {
		const char *name;
		int code;
	} known[] = {
#define K(c) { #c, c }
		K(EPERM), K(ENOENT), K(EINTR), K(EIO), K(EBADF), K(EAGAIN), K(ENOMEM),
		K(EACCES), K(EFAULT), K(EFBIG), K(EBUSY), K(EEXIST), K(EINVAL), K(EMFILE), K(ENOBUFS),
		K(ENOSPC), K(EPIPE), K(ERANGE), K(ENAMETOOLONG), K(ENOSYS), K(EBADMSG),
		K(EOPNOTSUPP), K(ENODEV), K(EMSGSIZE), K(EPROTO), K(EPROTONOSUPPORT), K(EADDRINUSE),
		K(EADDRNOTAVAIL), K(ENETDOWN), K(ENETUNREACH), K(ECONNABORTED), K(ECONNRESET), K(ENOTCONN),
		K(ESHUTDOWN), K(ETIMEDOUT), K(ECONNREFUSED), K(EHOSTUNREACH), K(EALREADY),
		K(ECANCELED), K(ETIME), K(EWOULDBLOCK),
#undef K
	};
	unsigned found = 0;

	(void)state;
	for (unsigned f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
		FILE *in = fopen(files[f], "r");
		char line[4096];

		assert_non_null(in);
		while (fgets(line, sizeof(line), in)) {
			for (char *p = strstr(line, "-E"); p; p = strstr(p + 2, "-E")) {
				char name[32];
				unsigned n = 0;
				int code = 0;

				if (p > line && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
					continue;
				while (n + 1 < sizeof(name) && (isupper((unsigned char)p[1 + n]) ||
								isdigit((unsigned char)p[1 + n])))
					name[n] = p[1 + n], n++;
				name[n] = '\0';
				if (n < 3)
					continue;
				for (unsigned k = 0; k < sizeof(known) / sizeof(known[0]); k++)
					if (strcmp(known[k].name, name) == 0)
						code = known[k].code;
				if (!code)
					fail_msg("%s documents -%s: add it to this test's table and to "
						 "engine/errors.c", files[f], name);
				if (!strcmp(ferry_strerror(-code), "unknown error") ||
				    !strcmp(ferry_err_name(-code), "UNKNOWN"))
					fail_msg("-%s (documented in %s) has no text", name, files[f]);
				if (strcmp(ferry_err_name(-code), name) != 0 && code != EWOULDBLOCK)
					fail_msg("ferry_err_name(-%s) is %s", name, ferry_err_name(-code));
				found++;
			}
		}
		fclose(in);
	}
	assert_true(found > 100); /* the files were read */
	/* And every code of ferry's own list says what ferry means by it. */
	for (unsigned k = 0; k < sizeof(known) / sizeof(known[0]); k++)
		assert_string_not_equal(ferry_strerror(-known[k].code), "unknown error");
}

/* Malformed SQEs complete with a negative errno in their CQE, never silently. */
/*
 * Each op takes only its own flags (and CB_REACTOR): any other is -EINVAL,
 * as ferry.h says; a PUT of a buffer refused so frees the buffer. These
 * were accepted silently (a GET with PUBLISH|STREAM_END|REPLACE, a NOP with
 * LOOKUP).
 */
static void test_flags_per_op(void **state)
{
	struct ferry_engine *e = t_engine("flags", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_engine *other = t_engine("flags2", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *p = t_peer(e, "flags2");
	static const struct {
		uint8_t opcode;
		uint32_t bad;
	} cases[] = {
		{ FERRY_OP_NOP, FERRY_SQE_WAIT_PEER },
		{ FERRY_OP_NOP, FERRY_SQE_NOWAIT },
		{ FERRY_OP_GET, FERRY_SQE_STREAM_END | FERRY_SQE_REPLACE | FERRY_SQE_WAIT_PEER },
		{ FERRY_OP_GET, FERRY_SQE_STREAM_WHOLE },
		{ FERRY_OP_PUT, FERRY_SQE_NOWAIT },
		{ FERRY_OP_PUT, FERRY_SQE_STREAM_WHOLE },
		{ FERRY_OP_PUBLISH, FERRY_SQE_WAIT_PEER },
		{ FERRY_OP_FETCH, FERRY_SQE_REPLACE },
		{ FERRY_OP_PUT, FERRY_SQE_STREAM_END },
		{ FERRY_OP_STREAM_PUT, FERRY_SQE_REPLACE },
		{ FERRY_OP_STREAM_PUT, FERRY_SQE_NOWAIT },
		{ FERRY_OP_STREAM_GET, FERRY_SQE_STREAM_END },
		{ FERRY_OP_STREAM_ABORT, FERRY_SQE_STREAM_END },
		{ FERRY_OP_STREAM_ACCEPT, FERRY_SQE_NOWAIT },
		{ FERRY_OP_CLEANUP, FERRY_SQE_REPLACE },
		{ FERRY_OP_CANCEL, FERRY_SQE_NOWAIT },
		{ FERRY_OP_LOOKUP, FERRY_SQE_NOWAIT },
		{ FERRY_OP_GET, 1u << 5 }, /* the old PUBLISH/LOOKUP bits: no flag any more */
		{ FERRY_OP_PUT, 1u << 6 },
	};
	struct iovec iov = { "data", 4 };
	struct ferry_buf *b;
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	(void)state;
	quiet_logs();
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		sqe = t_sqe(e);
		switch (cases[i].opcode) {
		case FERRY_OP_PUT:
			ferry_prep_put(sqe, p, "k", &iov, 1, i);
			break;
		case FERRY_OP_GET:
			ferry_prep_get(sqe, p, "k", NULL, 0, i);
			break;
		case FERRY_OP_STREAM_PUT:
			ferry_prep_stream_put(sqe, p, "s", &iov, 1, i);
			break;
		case FERRY_OP_STREAM_GET:
			ferry_prep_stream_get(sqe, p, "s", i);
			break;
		case FERRY_OP_STREAM_ABORT:
			ferry_prep_stream_abort(sqe, p, "s", "why", i);
			break;
		case FERRY_OP_STREAM_ACCEPT:
			ferry_prep_stream_accept(sqe, p, i);
			break;
		case FERRY_OP_CLEANUP:
			ferry_prep_cleanup(sqe, NULL, "r", i);
			break;
		case FERRY_OP_CANCEL:
			ferry_prep_cancel(sqe, 12345, i);
			break;
		case FERRY_OP_LOOKUP:
			ferry_prep_lookup(sqe, p, "k", i);
			break;
		case FERRY_OP_PUBLISH:
			ferry_prep_publish(sqe, p, "k", &iov, 1, i);
			break;
		case FERRY_OP_FETCH:
			ferry_prep_fetch(sqe, p, "k", NULL, 0, i);
			break;
		default:
			ferry_prep_nop(sqe, i);
			break;
		}
		ferry_sqe_set_flags(sqe, cases[i].bad);
		t_submit(e);
		t_expect(e, other, i, -EINVAL, NULL);
	}
	/* A PUT of a pool buffer refused for its flags gives the buffer back. */
	assert_int_equal(ferry_buf_alloc(e, 100, &b), 0);
	sqe = t_sqe(e);
	ferry_prep_put_buf(sqe, p, "k", b, 99);
	ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
	t_submit(e);
	t_expect(e, other, 99, -EINVAL, NULL);
	assert_int_equal(t_health_num(e, "\"pool\":{", "blocks_in_use"), 0);
	/* The flags an op does take still work (CB_REACTOR aside). */
	sqe = t_sqe(e);
	ferry_prep_get(sqe, p, "absent", NULL, 0, 100);
	ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
	t_submit(e);
	t_expect(e, other, 100, -EAGAIN, &c);
	ferry_engine_destroy(e);
	ferry_engine_destroy(other);
}

static void test_bad_sqes(void **state)
{
	struct ferry_engine *e = t_engine("bad", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_engine *other = t_engine("bad2", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *p = t_peer(e, "bad2");
	struct ferry_peer *foreign = t_peer(other, "bad");
	struct ferry_cq *foreign_cq = ferry_cq_default(other);
	char longkey[FERRY_KEY_MAX + 10];
	struct iovec iov = { longkey, 4 };
	struct ferry_sqe *sqe;

	(void)state;
	quiet_logs();
	memset(longkey, 'k', sizeof(longkey));
	longkey[sizeof(longkey) - 1] = '\0';

	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 1);
	sqe->opcode = 200; /* unknown opcode */
	t_submit(e);
	t_expect(e, NULL, 1, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, longkey, &iov, 1, 2); /* oversized key */
	t_submit(e);
	t_expect(e, NULL, 2, -ENAMETOOLONG, NULL);

	sqe = t_sqe(e);
	ferry_prep_get(sqe, p, longkey, NULL, 0, 3);
	t_submit(e);
	t_expect(e, NULL, 3, -ENAMETOOLONG, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "", &iov, 1, 4); /* empty key */
	t_submit(e);
	t_expect(e, NULL, 4, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, NULL, "k", &iov, 1, 5); /* no peer */
	t_submit(e);
	t_expect(e, NULL, 5, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, foreign, "k", &iov, 1, 6); /* another engine's peer */
	t_submit(e);
	t_expect(e, NULL, 6, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "k", NULL, 3, 7); /* iovcnt without iov */
	t_submit(e);
	t_expect(e, NULL, 7, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "k", &iov, 1, 8);
	ferry_sqe_set_flags(sqe, 1u << 30); /* unknown flag */
	t_submit(e);
	t_expect(e, NULL, 8, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 9);
	ferry_sqe_set_cq(sqe, foreign_cq); /* CQ of another engine: CQE comes to ours */
	t_submit(e);
	t_expect(e, NULL, 9, -EINVAL, NULL);

	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 10);
	ferry_sqe_set_flags(sqe, FERRY_SQE_CB_REACTOR); /* ... without a callback */
	t_submit(e);
	t_expect(e, NULL, 10, -EINVAL, NULL);

	/*
	 * Bits above FERRY_SQE__ALL with a foreign CQ (the first error found):
	 * the engine's own flags (1 << 24 marks its internal ops, which end
	 * without a CQE) must not reach the op's end as the op's.
	 */
	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 20);
	ferry_sqe_set_cq(sqe, foreign_cq);
	ferry_sqe_set_flags(sqe, 1u << 24);
	t_submit(e);
	t_expect(e, NULL, 20, -EINVAL, NULL);
	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "k", &iov, 1, 21);
	ferry_sqe_set_cq(sqe, foreign_cq);
	ferry_sqe_set_flags(sqe, (1u << 24) | (1u << 26) | (1u << 27));
	t_submit(e);
	t_expect(e, NULL, 21, -EINVAL, NULL);

	/* iovec lengths that add up past 2^64. */
	static struct iovec wrap[2];

	wrap[0] = (struct iovec){ longkey, SIZE_MAX };
	wrap[1] = (struct iovec){ longkey, 2 };
	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "k", wrap, 2, 22);
	t_submit(e);
	t_expect(e, NULL, 22, -EINVAL, NULL);
	sqe = t_sqe(e);
	ferry_prep_get(sqe, p, "k", wrap, 2, 23);
	t_submit(e);
	t_expect(e, NULL, 23, -EINVAL, NULL);

	/* A PUT to a name nobody holds. */
	sqe = t_sqe(e);
	ferry_prep_put(sqe, t_peer(e, "nobody"), "k", &iov, 1, 11);
	t_submit(e);
	t_expect(e, NULL, 11, -EHOSTUNREACH, NULL);

	/* Cancel of an unknown op. */
	sqe = t_sqe(e);
	ferry_prep_cancel(sqe, 12345, 12);
	t_submit(e);
	t_expect(e, NULL, 12, -ENOENT, NULL);

	/* A good NOP still works after all that. */
	sqe = t_sqe(e);
	ferry_prep_nop(sqe, 13);
	t_submit(e);
	t_expect(e, NULL, 13, 0, NULL);
	ferry_engine_destroy(other);
	ferry_engine_destroy(e);
}

/*
 * Bad entries for a peer whose transport is known (the round takes plain
 * PUTs and GETs to such a peer straight from their ring slots): each is
 * refused with its error, as for a peer not resolved yet (test_bad_sqes),
 * and nothing of them reaches the peer.
 */
static void test_bad_sqes_resolved_peer(void **state)
{
	struct ferry_engine *e = t_engine("badr", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_engine *other = t_engine("badr2", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *p = t_peer(e, "badr2"), *back = t_peer(other, "badr");
	struct ferry_cq *foreign_cq = ferry_cq_default(other);
	static char data[8] = "payload", in[8];
	static struct iovec iov = { data, 4 }, null_iov = { NULL, 4 }, in_iov = { in, sizeof(in) };
	static struct iovec many[1025];
	struct ferry_sqe *sqe;

	(void)state;
	quiet_logs();
	for (unsigned i = 0; i < 1025; i++)
		many[i] = (struct iovec){ data, 0 };
	/* Resolved: a good PUT went (and one GET of its key takes it). */
	t_put(e, p, "warm", data, 4, 1, 0);
	t_expect(e, other, 1, 0, NULL);

	/* Each refused with its error (its CQE to e's default CQ). */
	static char longkey[FERRY_KEY_MAX + 10];
	static struct iovec wrap[2];

	memset(longkey, 'k', sizeof(longkey));
	longkey[sizeof(longkey) - 1] = '\0';
	wrap[0] = (struct iovec){ data, SIZE_MAX };
	wrap[1] = (struct iovec){ data, 2 };
	const struct {
		bool get;
		struct ferry_peer *peer;
		const char *key;
		const struct iovec *iov;
		unsigned n;
		int key_len;   /* >= 0: written over the key's length */
		uint32_t flags;
		bool foreign_cq;
		int want;
	} bad[] = {
		{ false, p, "ab", &iov, 1, 3, 0, false, -EINVAL },   /* a NUL inside the key's length */
		{ false, p, "k1", &null_iov, 1, -1, 0, false, -EINVAL }, /* a NULL base with a length */
		{ false, p, "k2", many, 1025, -1, 0, false, -EINVAL },  /* more entries than allowed */
		{ false, p, "k3", &iov, 1, -1, 0, true, -EINVAL },      /* another engine's CQ */
		{ false, p, "k4", &iov, 1, -1, FERRY_SQE_NOWAIT, false, -EINVAL }, /* a GET's flag */
		{ false, p, longkey, &iov, 1, -1, 0, false, -ENAMETOOLONG },
		{ true, p, longkey, &in_iov, 1, -1, 0, false, -ENAMETOOLONG },
		{ false, back, "k11", &iov, 1, -1, 0, false, -EINVAL }, /* the other engine's peer */
		{ true, back, "k11", &in_iov, 1, -1, 0, false, -EINVAL },
		{ false, p, "k12", &iov, 1, -1, 1u << 24, false, -EINVAL }, /* an engine-only bit */
		{ false, p, "k13", wrap, 2, -1, 0, false, -EINVAL },    /* lengths past 2^64 */
		{ true, p, "k13", wrap, 2, -1, 0, false, -EINVAL },
		{ true, p, "ab", &in_iov, 1, 3, 0, false, -EINVAL },
		{ true, p, "k5", &null_iov, 1, -1, 0, false, -EINVAL },
		{ true, p, "k6", NULL, 2, -1, 0, false, -EINVAL },      /* entries without an iovec */
		{ true, p, "k7", &in_iov, 1, -1, FERRY_SQE_REPLACE, false, -EINVAL }, /* a PUT's flag */
	};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sqe = t_sqe(e);
		if (bad[i].get)
			ferry_prep_get(sqe, bad[i].peer, bad[i].key, bad[i].iov, bad[i].n, 200 + i);
		else
			ferry_prep_put(sqe, bad[i].peer, bad[i].key, bad[i].iov, bad[i].n, 200 + i);
		if (bad[i].key_len >= 0)
			sqe->key_len = (uint16_t)bad[i].key_len;
		ferry_sqe_set_flags(sqe, bad[i].flags);
		if (bad[i].foreign_cq)
			ferry_sqe_set_cq(sqe, foreign_cq);
		t_submit(e);
		t_expect(e, other, 200 + i, bad[i].want, NULL);
	}

	/* A pool buffer released before its PUT, and one given with an iovec too. */
	struct ferry_buf *fb;

	assert_int_equal(ferry_buf_alloc(e, 8, &fb), 0);
	assert_int_equal(ferry_buf_release(fb), 0);
	sqe = t_sqe(e);
	ferry_prep_put_buf(sqe, p, "k9", fb, 13);
	t_submit(e);
	t_expect(e, other, 13, -EINVAL, NULL);
	assert_int_equal(ferry_buf_alloc(e, 8, &fb), 0);
	sqe = t_sqe(e);
	ferry_prep_put_buf(sqe, p, "k10", fb, 14);
	sqe->iov = &iov;
	sqe->iovcnt = 1;
	t_submit(e);
	t_expect(e, other, 14, -EINVAL, NULL); /* (the buffer is freed with it) */

	/* None of the refused PUTs reached the peer: it holds "warm" only. */
	for (unsigned i = 0; i < 10; i++) {
		static const char *const keys[] = { "ab", "k1", "k2", "k3", "k4", "k9", "k10",
						    "k12", "k13", "warm" };

		sqe = t_sqe(other);
		ferry_prep_get(sqe, back, keys[i], &in_iov, 1, 100 + i);
		ferry_sqe_set_flags(sqe, FERRY_SQE_NOWAIT);
		t_submit(other);
		t_expect(other, e, 100 + i, i < 9 ? -EAGAIN : 0, NULL);
	}
	/* And good ones still go both ways. */
	sqe = t_sqe(other);
	ferry_prep_get(sqe, back, "k8", &in_iov, 1, 11);
	t_submit(other);
	ferry_progress(other);
	t_put(e, p, "k8", data, 8, 12, 0);
	t_expect(e, other, 12, 0, NULL);
	t_expect(other, e, 11, 0, NULL);
	assert_memory_equal(in, data, 8);

	/* Good entries the round leaves to the general path still work: WAIT_PEER, a large iovec. */
	static char big[4096];
	static char big_in[4096];
	static struct iovec big_iov = { big, sizeof(big) }, big_in_iov = { big_in, sizeof(big_in) };

	for (unsigned i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7);
	sqe = t_sqe(other);
	ferry_prep_get(sqe, back, "big", &big_in_iov, 1, 40);
	t_submit(other);
	ferry_progress(other);
	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "big", &big_iov, 1, 41); /* past the loop's iov_put_max: a pool block */
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, 5ull * 1000000000);
	t_submit(e);
	t_expect(e, other, 41, 0, NULL);
	t_expect(other, e, 40, 0, NULL);
	assert_memory_equal(big_in, big, sizeof(big));

	/* A plain PUT's deadline: the peer's engine is not driven, so no answer comes. */
	sqe = t_sqe(e);
	ferry_prep_put(sqe, p, "late", &iov, 1, 42);
	ferry_sqe_set_timeout(sqe, 50ull * 1000000);
	t_submit(e);
	t_expect(e, NULL, 42, -ETIMEDOUT, NULL);
	ferry_progress(other); /* it took the key; its answer is stale now */
	ferry_progress(e);
	/* A plain GET parked, then cancelled. */
	sqe = t_sqe(e);
	ferry_prep_get(sqe, p, "never", &in_iov, 1, 43);
	t_submit(e);
	ferry_progress(e);
	sqe = t_sqe(e);
	ferry_prep_cancel(sqe, 43, 44);
	t_submit(e);
	t_expect(e, NULL, 43, -ECANCELED, NULL);
	t_expect(e, NULL, 44, 0, NULL);
	/* Nothing of e is in flight any more, and its counters add up. */
	assert_int_equal(t_health_num(e, "\"ops\":{", "in_flight"), 0);
	assert_int_equal(t_health_num(e, "\"ops\":{", "submitted"),
			 t_health_num(e, "\"ops\":{", "completed"));
	/* Every block of e's pool came home (the refused PUTs' too). */
	assert_int_equal(t_health_num(e, "\"pool\":{", "blocks_in_use"), 0);
	ferry_engine_destroy(other);
	ferry_engine_destroy(e);
}

/* The ring refuses entries when full (backpressure), never overwrites. */
static void test_sq_backpressure(void **state)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e;
	struct ferry_cqe cqes[64];
	struct ferry_sq *sq;
	unsigned got = 0;

	(void)state;
	p.name = "bp";
	p.ns = "test";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 1u << 20;
	p.sq_entries = 9; /* rounded up to 16 */
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	assert_int_equal(ferry_sq_get(e, &sq), 0);
	assert_int_equal(ferry_sq_space(sq), 16);
	for (unsigned i = 0; i < 16; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		assert_non_null(sqe);
		ferry_prep_nop(sqe, i);
	}
	assert_null(ferry_sq_get_sqe(sq));
	assert_int_equal(ferry_sq_space(sq), 0);
	assert_int_equal(ferry_sq_submit(sq), 16);
	assert_int_equal(ferry_sq_submit(sq), 0); /* nothing new */
	assert_null(ferry_sq_get_sqe(sq));        /* not yet drained */
	while (got < 16) {
		int n = ferry_cq_poll(ferry_cq_default(e), cqes, 64);

		assert_true(n >= 0);
		for (int i = 0; i < n; i++)
			assert_int_equal(cqes[i].user_data, got + (unsigned)i);
		got += (unsigned)n;
	}
	assert_int_equal(ferry_sq_space(sq), 16);
	assert_non_null(ferry_sq_get_sqe(sq));
	ferry_engine_destroy(e);
}

/* A full CQ never loses a completion: more NOPs than CQ slots, then poll. */
static void test_cq_overflow(void **state)
{
	struct ferry_engine *e = t_engine("ovf", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_cq_params cp = FERRY_CQ_PARAMS_INIT;
	struct ferry_cqe cqes[8];
	struct ferry_cq *cq;
	struct ferry_sq *sq;
	uint64_t next = 0;

	(void)state;
	cp.entries = 8;
	assert_int_equal(ferry_cq_create(e, &cp, &cq), 0);
	assert_int_equal(ferry_sq_get(e, &sq), 0);
	for (unsigned i = 0; i < 100; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		if (!sqe) {
			ferry_sq_submit(sq);
			ferry_progress(e); /* no polling: the CQ overflows */
			sqe = ferry_sq_get_sqe(sq);
		}
		assert_non_null(sqe);
		ferry_prep_nop(sqe, i);
		ferry_sqe_set_cq(sqe, cq);
	}
	ferry_sq_submit(sq);
	ferry_progress(e);
	assert_int_equal(ferry_cq_destroy(cq), -EBUSY); /* completions still held */
	while (next < 100) {
		int n = ferry_cq_poll(cq, cqes, 8);

		assert_true(n >= 0 && n <= 8);
		for (int i = 0; i < n; i++)
			assert_int_equal(cqes[i].user_data, next++); /* in order, none lost */
		if (n == 0)
			ferry_progress(e);
	}
	assert_int_equal(ferry_cq_poll(cq, cqes, 8), 0);
	assert_int_equal(ferry_cq_destroy(cq), 0);
	ferry_engine_destroy(e);
}

/* What a reap met, in order: a returned CQE's user_data, or 100 + a callback's. */
struct reap_log {
	uint64_t seen[16];
	unsigned n;
};

static void log_cb(const struct ferry_cqe *cqe, void *arg)
{
	struct reap_log *l = arg;

	assert_true(l->n < 16);
	l->seen[l->n++] = 100 + cqe->user_data;
}

/*
 * NOPs of kinds ('c': with a callback, 'p': plain) completed in one round,
 * then polls of max CQEs each: how many each returned (per_poll, a 0 last)
 * and the log (want) must match.
 */
static void reap_mixed(uint32_t flags, const char *kinds, unsigned max, const int *per_poll,
		       const uint64_t *want, unsigned nwant)
{
	struct ferry_engine *e = t_engine_flags("reap", FERRY_PROGRESS_MANUAL, 1u << 20, flags);
	struct reap_log log = { .n = 0 };
	struct ferry_cqe cqes[8];
	struct ferry_sq *sq;

	assert_true(max <= 8);
	assert_int_equal(ferry_sq_get(e, &sq), 0);
	for (unsigned i = 0; kinds[i]; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq);

		ferry_prep_nop(sqe, i);
		if (kinds[i] == 'c')
			ferry_sqe_set_callback(sqe, log_cb, &log);
	}
	ferry_sq_submit(sq);
	assert_true(ferry_progress(e) > 0); /* every NOP completes in this round */
	for (unsigned k = 0;; k++) {
		int n = ferry_cq_poll(ferry_cq_default(e), cqes, max);

		assert_int_equal(n, per_poll[k]);
		for (int i = 0; i < n; i++) {
			assert_int_equal(cqes[i].res, 0);
			log.seen[log.n++] = cqes[i].user_data;
		}
		if (!n)
			break;
	}
	assert_int_equal(log.n, nwant);
	for (unsigned i = 0; i < log.n; i++)
		assert_int_equal(log.seen[i], want[i]);
	ferry_engine_destroy(e);
}

/*
 * CQEs with and without callbacks side by side in one CQ: the plain ones
 * come back in order, each callback runs once, in order, inside the poll
 * that goes past it (the log has a poll's callbacks before the CQEs it
 * returned); a poll stops at max without running the callback after it,
 * and goes on past callbacks while it has room. Shared and single-poller
 * CQs (their reaps differ: a compare-and-swap or a store per entry).
 */
static void test_reap_plain_and_callbacks(void **state)
{
	/* Two at a time: stopped at max before callback 2; then 2, 4, 5 run for 3 and 6. */
	static const int polls_a[] = { 2, 2, 1, 0 };
	static const uint64_t want_a[] = { 0, 1, 102, 104, 105, 3, 6, 7 };
	/* Room for all: plain CQEs taken before callback 1, and after it, then callback 4. */
	static const int polls_b[] = { 3, 0 };
	static const uint64_t want_b[] = { 101, 104, 0, 2, 3 };
	static const uint32_t flags[] = { 0, FERRY_ENGINE_SINGLE_POLLER };

	(void)state;
	for (unsigned f = 0; f < 2; f++) {
		reap_mixed(flags[f], "ppcpccpp", 2, polls_a, want_a, 8);
		reap_mixed(flags[f], "pcppc", 8, polls_b, want_b, 5);
	}
}

static void test_health_json(void **state)
{
	struct ferry_engine *e = t_engine("health", FERRY_PROGRESS_MANUAL, 1u << 20);
	char small[16], big[8192];
	int n, m;

	(void)state;
	t_peer(e, "somebody");
	n = ferry_engine_health(e, NULL, 0);
	assert_true(n > 100);
	/*
	 * Cut, like snprintf: the full length is returned. Between two calls
	 * only uptime_ns changes, and it may gain a digit (a slow machine), so
	 * each length is at least the one before, by at most a digit or two.
	 */
	m = ferry_engine_health(e, small, sizeof(small));
	assert_true(m >= n && m <= n + 2);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	n = m;
	m = ferry_engine_health(e, big, sizeof(big));
	assert_true(m >= n && m <= n + 2);
	n = m;
	assert_int_equal(strlen(big), (size_t)n);
	assert_non_null(strstr(big, "\"engine\":\"health\""));
	assert_non_null(strstr(big, "\"pool\":{\"size\":1048576"));
	assert_non_null(strstr(big, "\"name\":\"somebody\""));
	assert_int_equal(big[0], '{');
	assert_int_equal(big[n - 1], '}');
	ferry_engine_destroy(e);
}

/* The health's latency histogram: the sum of a histogram's buckets. */
static unsigned long long hist_total(const char *json, const char *name)
{
	char pat[32];
	const char *at, *end;
	unsigned long long total = 0;

	snprintf(pat, sizeof(pat), "\"%s\":{", name);
	at = strstr(strstr(json, "\"latency_ns\":{"), pat);
	assert_non_null(at);
	at += strlen(pat);
	end = strchr(at, '}');
	for (const char *p = strchr(at, ':'); p && p < end; p = strchr(p + 1, ':'))
		total += strtoull(p + 1, NULL, 10);
	return total;
}

/*
 * One PUT and one GET in 16 are timed for the histogram, whichever op slot
 * they take (the free list hands out the same one each time: sampled by
 * slot, every op was timed).
 */
static void test_latency_sampled(void **state)
{
	struct ferry_engine *a = t_engine("lat-a", FERRY_PROGRESS_THREAD, 1u << 20);
	struct ferry_engine *b = t_engine("lat-b", FERRY_PROGRESS_THREAD, 1u << 20);
	struct ferry_peer *to = t_peer(a, "lat-b"), *from = t_peer(b, "lat-a");
	static char json[8192];
	char x[8] = "payload", key[16];
	struct ferry_cqe c;
	unsigned long long puts, gets;

	(void)state;
	for (int i = 0; i < 320; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		t_put(a, to, key, x, sizeof(x), (uint64_t)i, 0);
		assert_int_equal(t_wait_one(a, &c, 5 * SEC), 0);
		t_get(b, from, key, NULL, 0, (uint64_t)i, 0, 5 * SEC);
		assert_int_equal(t_wait_one(b, &c, 5 * SEC), 0);
		ferry_buf_release(c.buf);
	}
	assert_true(ferry_engine_health(a, json, sizeof(json)) < (int)sizeof(json));
	puts = hist_total(json, "put");
	assert_true(ferry_engine_health(b, json, sizeof(json)) < (int)sizeof(json));
	gets = hist_total(json, "get");
	/* 320 of each, one in 16 timed (the engines' first ops, a NOP or so, may shift it by one). */
	if (puts < 19 || puts > 21 || gets < 19 || gets > 21)
		fail_msg("%llu PUTs and %llu GETs of 320 each in the histogram, not 20", puts, gets);
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
}

static void test_peer_handles(void **state)
{
	struct ferry_engine *e = t_engine("peers", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_peer *a = t_peer(e, "x"), *b = t_peer(e, "x"), *c = t_peer(e, "y");

	(void)state;
	assert_ptr_equal(a, b);
	assert_ptr_not_equal(a, c);
	assert_string_equal(ferry_peer_name(c), "y");
	ferry_engine_destroy(e);
}

static void test_buffers(void **state)
{
	struct ferry_engine *e = t_engine("bufs", FERRY_PROGRESS_MANUAL, 1u << 20);
	struct ferry_buf *b, *big;

	(void)state;
	quiet_logs();
	assert_int_equal(ferry_buf_alloc(e, 100, &b), 0);
	assert_int_equal(ferry_buf_len(b), 100);
	assert_int_equal((uintptr_t)ferry_buf_data(b) % 64, 0);
	memset(ferry_buf_data(b), 0xab, 100);
	assert_int_equal(ferry_buf_set_len(b, 64), 0);
	assert_int_equal(ferry_buf_len(b), 64);
	assert_int_equal(ferry_buf_set_len(b, 1u << 20), -EMSGSIZE);
	assert_int_equal(ferry_buf_release(b), 0);
	assert_int_equal(ferry_buf_release(b), -EINVAL); /* double release: refused */
	assert_int_equal(ferry_buf_set_len(b, 1), -EINVAL);
	assert_int_equal(ferry_buf_alloc(e, 64u << 20, &big), -ENOMEM); /* more than the pool */
	assert_int_equal(ferry_buf_alloc(e, 0, &b), 0); /* zero length is a buffer too */
	assert_int_equal(ferry_buf_len(b), 0);
	assert_int_equal(ferry_buf_release(b), 0);
	ferry_engine_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_params),
		cmocka_unit_test(test_name_clash),
		cmocka_unit_test(test_null_arguments),
		cmocka_unit_test(test_cq_params),
		cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_strerror_every_documented_code),
		cmocka_unit_test(test_bad_sqes),
		cmocka_unit_test(test_bad_sqes_resolved_peer),
		cmocka_unit_test(test_flags_per_op),
		cmocka_unit_test(test_sq_backpressure),
		cmocka_unit_test(test_cq_overflow),
		cmocka_unit_test(test_reap_plain_and_callbacks),
		cmocka_unit_test(test_health_json),
		cmocka_unit_test(test_latency_sampled),
		cmocka_unit_test(test_peer_handles),
		cmocka_unit_test(test_buffers),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

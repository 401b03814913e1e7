/*
 * tests/test_stage.c - the stage API (stage/stage.c), FERRY_OP_CLEANUP
 * (engine/cleanup.c) and the health request of the shm transport
 * (backends/shm/shm_health.c, `ferry health`).
 *
 * The pipeline test runs the three stages of tests/fixtures/stages/
 * pipeline3.yaml (0 -> 1 on a named SharedMemoryConnector, 1 -> 2
 * auto-filled) as three processes: stage 0 produces chunks of four
 * requests, stage 1 takes them (request 0 with the metadata stage 0 sent
 * it over a pipe, the others without), transforms them and passes them on,
 * stage 2 checks every byte. Children report through their exit status.
 */
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "config.h"
#include "ferry/stage.h"
#include "shm_sock.h"

#define FIX FERRY_TEST_SRCDIR "/fixtures/stages/"

static char rundir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-stage-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-test", 1);
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL);
	alarm(t_under_valgrind() ? 600 : 120);
	return 0;
}

static int teardown(void **state)
{
	char cmd[300];

	(void)state;
	alarm(0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rundir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* FERRY_OP_CLEANUP                                                    */
/* ------------------------------------------------------------------ */

static void cleanup_op(struct ferry_engine *e, struct ferry_peer *from, const char *req,
		       uint64_t ud, int want)
{
	struct ferry_sqe *sqe = t_sqe(e);

	ferry_prep_cleanup(sqe, from, req, ud);
	t_submit(e);
	t_expect(e, NULL, ud, want, NULL);
}

static void get_nowait(struct ferry_engine *e, struct ferry_peer *from, const char *key,
		       uint64_t ud, int want)
{
	struct ferry_cqe c;

	t_get(e, from, key, NULL, 0, ud, FERRY_SQE_NOWAIT, 0);
	t_expect(e, NULL, ud, want, &c);
	if (c.flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c.buf);
}

static void test_stage_cleanup_op(void **state)
{
	struct ferry_engine *a = t_engine("A", FERRY_PROGRESS_THREAD, 0);
	struct ferry_engine *b = t_engine("B", FERRY_PROGRESS_THREAD, 0);
	struct ferry_engine *c = t_engine("C", FERRY_PROGRESS_THREAD, 0);
	struct ferry_peer *ab = t_peer(a, "B"), *cb = t_peer(c, "B");
	struct ferry_peer *ba = t_peer(b, "A"), *bc = t_peer(b, "C");
	static const char *const keys[] = { "r1_0_0", "r1_0_1", "r1:kv", "r10_0_0", "r2_0_0",
					    "r1x" };
	char health[8192];
	uint64_t ud = 1;

	(void)state;
	for (unsigned i = 0; i < 6; i++) {
		t_put(a, ab, keys[i], "payload", 7, ud, 0);
		t_expect(a, NULL, ud++, 0, NULL);
	}
	t_put(c, cb, "r1_0_0", "from C", 6, ud, 0); /* same key from another peer */
	t_expect(c, NULL, ud++, 0, NULL);
	/* Parked GETs: one of the request, one of another. */
	t_get(b, ba, "r1_0_5", NULL, 0, 100, 0, 0);
	t_get(b, ba, "r2_0_9", NULL, 0, 101, 0, 0);
	t_expect_none(b, NULL, 50);

	/* Only from C: its one key. */
	cleanup_op(b, bc, "r1", 200, 1);
	get_nowait(b, bc, "r1_0_0", ud++, -EAGAIN);
	/* From everyone: r1_0_0, r1_0_1, r1:kv and the parked r1_0_5. */
	ferry_prep_cleanup(t_sqe(b), NULL, "r1", 201);
	t_submit(b);
	{
		struct ferry_cqe got[2];
		int n = 0;

		while (n < 2) {
			struct ferry_cqe x;

			if (!t_wait_cqe(b, NULL, &x, 5 * SEC))
				fail_msg("cleanup: missing completions");
			got[n++] = x;
		}
		for (int i = 0; i < 2; i++) {
			if (got[i].user_data == 100)
				assert_int_equal(got[i].res, -ECANCELED);
			else if (got[i].user_data == 201)
				assert_int_equal(got[i].res, 4);
			else
				fail_msg("unexpected completion %llu",
					 (unsigned long long)got[i].user_data);
		}
	}
	get_nowait(b, ba, "r1_0_0", ud++, -EAGAIN);
	get_nowait(b, ba, "r1:kv", ud++, -EAGAIN);
	/* Not of request r1: "r10_..." and "r1x" go on living. */
	get_nowait(b, ba, "r10_0_0", ud++, 0);
	get_nowait(b, ba, "r1x", ud++, 0);
	assert_true(ferry_engine_health(b, health, sizeof(health)) < (int)sizeof(health));
	assert_non_null(strstr(health, "\"keys_held\":1,")); /* r2_0_0 */
	/* Nothing of it left: 0. The other parked GET is untouched. */
	cleanup_op(b, NULL, "r1", 202, 0);
	t_expect_none(b, NULL, 20);
	/* r2_0_0 and the GET parked on r2_0_9: the GET completes first. */
	ferry_prep_cleanup(t_sqe(b), NULL, "r2", 203);
	t_submit(b);
	t_expect(b, NULL, 101, -ECANCELED, NULL);
	t_expect(b, NULL, 203, 2, NULL);

	/* Bad requests. */
	cleanup_op(b, NULL, "", 300, -EINVAL);
	{
		char longid[FERRY_KEY_MAX + 8];

		memset(longid, 'x', sizeof(longid) - 1);
		longid[sizeof(longid) - 1] = '\0';
		cleanup_op(b, NULL, longid, 301, -ENAMETOOLONG);
	}
	cleanup_op(b, ab /* A's peer handle, not B's */, "r1", 302, -EINVAL);
	assert_int_equal(ferry_engine_destroy(a), 0);
	assert_int_equal(ferry_engine_destroy(b), 0);
	assert_int_equal(ferry_engine_destroy(c), 0);
}

/* Cleanup of data lent by a peer in another process gives it back. */
static void test_stage_cleanup_releases_shm(void **state)
{
	int go[2], done[2];
	pid_t pid;
	char byte;

	(void)state;
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(done), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
		struct ferry_engine *e = NULL;
		struct ferry_sq *sq;
		struct ferry_cqe cqe;
		char health[8192];
		int rc = 0;

		close(go[1]);
		close(done[0]);
		if (t_read(go[0], &byte, 1) != 1)
			_exit(2);
		p.name = "producer";
		p.ns = "test";
		p.pool_size = 4u << 20;
		if (ferry_engine_create(&p, &e))
			_exit(3);
		for (int i = 0; i < 3 && !rc; i++) {
			struct ferry_peer *peer;
			struct ferry_sqe *sqe;
			char key[32];
			static char data[100000];

			snprintf(key, sizeof(key), "req7_0_%d", i);
			ferry_peer_open(e, "consumer", &peer);
			ferry_sq_get(e, &sq);
			sqe = ferry_sq_get_sqe(sq);
			{
				static struct iovec iov;

				iov.iov_base = data;
				iov.iov_len = sizeof(data);
				ferry_prep_put(sqe, peer, key, &iov, 1, (uint64_t)i);
			}
			ferry_sqe_set_timeout(sqe, 5 * SEC);
			ferry_sq_submit(sq);
			if (ferry_cq_wait(ferry_cq_default(e), &cqe, 1, 5 * SEC) != 1 || cqe.res)
				rc = 4;
		}
		if (t_write(done[1], "x", 1) != 1)
			rc = 5;
		/* Wait until the consumer's cleanup released our blocks. */
		for (int i = 0; i < 500 && !rc; i++) {
			ferry_engine_health(e, health, sizeof(health));
			if (strstr(health, "\"bytes_in_use\":0,"))
				break;
			usleep(10000);
			if (i == 499)
				rc = 6;
		}
		if (t_read(go[0], &byte, 1) != 0) /* EOF: the parent is done */
			rc = 7;
		ferry_engine_destroy(e);
		_exit(rc);
	}
	close(go[0]);
	close(done[1]);
	{
		struct ferry_engine *e = t_engine("consumer", FERRY_PROGRESS_THREAD, 0);
		struct ferry_peer *from = t_peer(e, "producer");

		assert_int_equal(t_write(go[1], "x", 1), 1);
		assert_int_equal(t_read(done[0], &byte, 1), 1);
		cleanup_op(e, from, "req7", 1, 3);
		get_nowait(e, from, "req7_0_0", 2, -EAGAIN);
		close(go[1]);
		{
			int st = 0;

			assert_int_equal(t_waitpid(pid, &st, 0), pid);
			assert_true(WIFEXITED(st));
			assert_int_equal(WEXITSTATUS(st), 0);
		}
		assert_int_equal(ferry_engine_destroy(e), 0);
	}
	close(done[0]);
}

/* ------------------------------------------------------------------ */
/* Health over the engine's shm name                                   */
/* ------------------------------------------------------------------ */

static void test_stage_health_query(void **state)
{
	struct ferry_engine *e = t_engine("hq", FERRY_PROGRESS_THREAD, 0);
	char buf[16384], cmd[512], small[16];
	FILE *f;
	size_t n;
	int rc;

	(void)state;
	rc = shm_health_query("test", "hq", buf, sizeof(buf), 2000);
	assert_true(rc > 0);
	assert_int_equal((size_t)rc, strlen(buf));
	assert_non_null(strstr(buf, "{\"engine\":\"hq\",\"namespace\":\"test\""));
	assert_non_null(strstr(buf, "\"pool\":{"));
	assert_int_equal(buf[rc - 1], '}');
	assert_int_equal(shm_health_query("test", "nobody", buf, sizeof(buf), 500),
			 -EHOSTUNREACH);
	assert_int_equal(shm_health_query("test", "hq", small, sizeof(small), 2000), -EMSGSIZE);
	assert_int_equal(shm_health_query("test", "hq", NULL, 0, 2000), -EINVAL);
	assert_int_equal(shm_health_query("bad/ns", "hq", buf, sizeof(buf), 500), -EINVAL);
	/* The engine still serves peers after answering. */
	{
		struct ferry_peer *self = t_peer(e, "hq");

		t_put(e, self, "k", "v", 1, 1, 0);
		t_expect(e, NULL, 1, 0, NULL);
	}

	/* The command line: `ferry health` and `ferry list`. */
	snprintf(cmd, sizeof(cmd), "%s/tools/ferry health -n test hq", FERRY_TEST_BINDIR);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	assert_int_equal(pclose(f), 0);
	assert_non_null(strstr(buf, "{\"engine\":\"hq\""));
	snprintf(cmd, sizeof(cmd), "%s/tools/ferry health test/hq", FERRY_TEST_BINDIR);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	assert_int_equal(pclose(f), 0);
	assert_non_null(strstr(buf, "{\"engine\":\"hq\",\"namespace\":\"test\""));
	snprintf(cmd, sizeof(cmd), "%s/tools/ferry list -n test", FERRY_TEST_BINDIR);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	assert_int_equal(pclose(f), 0);
	assert_string_equal(buf, "hq\n");
	snprintf(cmd, sizeof(cmd), "%s/tools/ferry health -n test nobody 2>/dev/null",
		 FERRY_TEST_BINDIR);
	rc = system(cmd);
	assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
	assert_int_equal(ferry_engine_destroy(e), 0);
}

/* `ferry check`: the resolved graph, or the errors and exit 1. */
static void test_stage_check_command(void **state)
{
	char cmd[512], out[16384];
	FILE *f;
	size_t n;
	int rc;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s/tools/ferry check %slegacy_ref.yaml", FERRY_TEST_BINDIR,
		 FIX);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	assert_int_equal(pclose(f), 0);
	assert_non_null(strstr(out, "legacy (runtime.connectors, stage_args) schema, 3 stage(s), "
				    "2 edge(s)"));
	assert_non_null(strstr(out, "defaults: window_size unlimited (runtime.defaults), "
				    "max_inflight 4 (runtime.defaults)"));
	assert_non_null(strstr(out, "  1    ranks 2, engines stage1.rank0 stage1.rank1\n"));
	assert_non_null(strstr(out, "  0 -> 1  shm  SharedMemoryConnector "
				    "'connector_of_shared_memory'"));
	assert_non_null(strstr(out, "  1 -> 2  tcp  MooncakeTransferEngineConnector "
				    "'rdma_connector'"));
	assert_non_null(strstr(out, "window_size 8 (edge), max_inflight 4 (runtime.defaults)"));
	assert_non_null(strstr(out, "extra metadata_server: http://10.0.0.1:8080/metadata  "
				    "ignored (not used by ferry)"));
	assert_non_null(strstr(out, "extra zmq_port: 50051  honoured"));
	assert_non_null(strstr(out, "\nok\n"));

	snprintf(cmd, sizeof(cmd), "%s/tools/ferry check %serr_mismatch.yaml 2>&1",
		 FERRY_TEST_BINDIR, FIX);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	rc = pclose(f);
	assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
	assert_non_null(strstr(out, "err_mismatch.yaml:7:21: stage_args[1].input_connectors."
				    "from_stage_0: edge 0->1: connector type"));
	assert_non_null(strstr(out, "1 error(s): nothing would start"));

	/* More errors than the loader keeps: it says it stopped, and "or more". */
	{
		char path[] = "/tmp/ferry-check-XXXXXX";
		int fd = mkstemp(path);
		FILE *y;

		assert_true(fd >= 0);
		y = fdopen(fd, "w");
		assert_non_null(y);
		fprintf(y, "stages:\n  - stage_id: 0\n    output_connectors:\n");
		for (int i = 0; i < 100; i++)
			fprintf(y, "      bad_%d: x\n", i);
		fclose(y);
		snprintf(cmd, sizeof(cmd), "%s/tools/ferry check %s 2>&1", FERRY_TEST_BINDIR, path);
		f = popen(cmd, "r");
		assert_non_null(f);
		n = fread(out, 1, sizeof(out) - 1, f);
		out[n] = '\0';
		rc = pclose(f);
		unlink(path);
		assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
		assert_non_null(strstr(out, ":4:7: stages[0].output_connectors.bad_0: key must be "
					    "to_stage_<stage_id>"));
		assert_non_null(strstr(out, "not shown; the loader stops reading after 64)\n"));
		assert_non_null(strstr(out, " or more error(s): nothing would start"));
	}
}

/* ------------------------------------------------------------------ */
/* The stage API in one process                                        */
/* ------------------------------------------------------------------ */

static struct ferry_stage *open_stage(const char *yaml, const char *id, unsigned rank, int want)
{
	struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
	struct ferry_stage *s = NULL;
	char path[512];

	snprintf(path, sizeof(path), FIX "%s", yaml);
	p.config_path = path;
	p.stage_id = id;
	p.rank = rank;
	p.ns = "test";
	p.pool_size = 4u << 20;
	p.timeout_ms = 5000;
	assert_int_equal(ferry_stage_open(&p, &s), want);
	if (want)
		assert_null(s);
	else
		assert_non_null(s);
	return s;
}

static void test_stage_api(void **state)
{
	struct ferry_stage *s0, *s1, *s2;
	struct ferry_stage_meta meta, other;
	struct ferry_buf *b = NULL;
	char health[16384];
	uint64_t size = 0;
	int64_t t0;

	(void)state;
	/* Refusals: nothing starts. */
	open_stage("err_mismatch.yaml", "0", 0, -EINVAL);
	open_stage("pipeline3.yaml", "7", 0, -EINVAL);
	open_stage("pipeline3.yaml", "0", 1, -EINVAL);
	open_stage("no-such.yaml", "0", 0, -ENOENT);
	/* Its tcp edge has zmq_port 0: the sending stage could not find it. */
	open_stage("pipeline3_tcp.yaml", "1", 0, -EINVAL);
	open_stage("pipeline3_tcp.yaml", "2", 0, -EINVAL);
	{
		struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
		struct ferry_stage *s = NULL;
		struct ferry_engine_params ep = FERRY_ENGINE_PARAMS_INIT;
		struct ferry_engine *e = NULL;

		assert_int_equal(ferry_stage_open(&p, &s), -EINVAL); /* no path */
		assert_int_equal(ferry_stage_open(NULL, &s), -EINVAL);
		p.size = 8;
		assert_int_equal(ferry_stage_open(&p, &s), -EINVAL);
		ep.name = "x";
		ep.config_path = FIX "pipeline3.yaml";
		assert_int_equal(ferry_engine_create(&ep, &e), -EOPNOTSUPP);
	}

	s0 = open_stage("pipeline3.yaml", "0", 0, 0);
	s1 = open_stage("pipeline3.yaml", "1", 0, 0);
	s2 = open_stage("pipeline3.yaml", "2", 0, 0);
	/* Stage 0 of the tcp variant only has its shm edge: it opens. */
	{
		struct ferry_stage *t = NULL;
		struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;

		p.config_path = FIX "pipeline3_tcp.yaml";
		p.stage_id = "0";
		p.ns = "other";
		p.pool_size = 1u << 20;
		assert_int_equal(ferry_stage_open(&p, &t), 0);
		assert_int_equal(ferry_stage_close(&t), 0);
		assert_null(t);
	}
	assert_string_equal(ferry_engine_name(ferry_stage_engine(s1)), "stage1.rank0");

	/* put with metadata, get with it. */
	assert_int_equal(ferry_stage_put(s0, "0", "1", "req1_0_0", "hello", 5, &size, &meta), 0);
	assert_int_equal(size, 5);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req1_0_0", &meta, 0, 0, &b), 0);
	assert_int_equal(ferry_buf_len(b), 5);
	assert_memory_equal(ferry_buf_data(b), "hello", 5);
	ferry_buf_release(b);
	/* A get consumes: now it is not there. */
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req1_0_0", NULL, 0, FERRY_STAGE_NOWAIT,
					 &b), -EAGAIN);
	assert_null(b);
	/* Without metadata; and a get that waits for a put made later. */
	assert_int_equal(ferry_stage_put(s1, "1", "2", "req1_1_0", "abc", 3, NULL, NULL), 0);
	assert_int_equal(ferry_stage_get(s2, "1", "2", "req1_1_0", NULL, 0, 0, &b), 0);
	assert_memory_equal(ferry_buf_data(b), "abc", 3);
	ferry_buf_release(b);
	/* Timeout. */
	t0 = t_now();
	assert_int_equal(ferry_stage_get(s2, "1", "2", "never", NULL, 50 * MS, 0, &b),
			 -ETIMEDOUT);
	assert_true(t_now() - t0 >= 40 * MS);
	/* Metadata of another key, or not ferry's. */
	assert_int_equal(ferry_stage_put(s0, "0", "1", "req2_0_0", "x", 1, NULL, &other), 0);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req2_0_1", &other, 0, 0, &b), -EINVAL);
	memset(&meta, 0x5a, sizeof(meta));
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req2_0_0", &meta, 0, 0, &b), -EINVAL);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req2_0_0", &other, 0, 0, &b), 0);
	ferry_buf_release(b);
	/* Wrong edges and arguments. */
	assert_int_equal(ferry_stage_put(s0, "1", "2", "k", "x", 1, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_stage_put(s0, "0", "2", "k", "x", 1, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_stage_get(s0, "0", "1", "k", NULL, 0, 0, &b), -EINVAL);
	assert_int_equal(ferry_stage_put(s0, "0", "1", "", "x", 1, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_stage_put(s0, "0", "1", "k", NULL, 1, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_stage_put(NULL, "0", "1", "k", "x", 1, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "k", NULL, 0, 0x80, &b), -EINVAL);
	/* A key that is live at the receiver: -EEXIST. */
	assert_int_equal(ferry_stage_put(s0, "0", "1", "dup", "1", 1, NULL, NULL), 0);
	assert_int_equal(ferry_stage_put(s0, "0", "1", "dup", "2", 1, NULL, NULL), -EEXIST);
	/* Zero copy put of a pool buffer. */
	assert_int_equal(ferry_buf_alloc(ferry_stage_engine(s0), 4096, &b), 0);
	memset(ferry_buf_data(b), 7, 4096);
	assert_int_equal(ferry_stage_put_buf(s0, "0", "1", "req3_0_0", b, &size, NULL), 0);
	assert_int_equal(size, 4096);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req3_0_0", NULL, 0, 0, &b), 0);
	assert_int_equal(((uint8_t *)ferry_buf_data(b))[4095], 7);
	ferry_buf_release(b);

	/* cleanup: what arrived for req4, and a get waiting for it. */
	assert_int_equal(ferry_stage_put(s0, "0", "1", "req4_0_0", "a", 1, NULL, NULL), 0);
	assert_int_equal(ferry_stage_put(s0, "0", "1", "req4_0_1", "b", 1, NULL, NULL), 0);
	assert_int_equal(ferry_stage_cleanup(s1, "req4"), 2);
	assert_int_equal(ferry_stage_get(s1, "0", "1", "req4_0_0", NULL, 0, FERRY_STAGE_NOWAIT,
					 &b), -EAGAIN);
	assert_int_equal(ferry_stage_cleanup(s1, "req4"), 0);
	assert_int_equal(ferry_stage_cleanup(s1, ""), -EINVAL);
	assert_int_equal(ferry_stage_cleanup(NULL, "x"), -EINVAL);

	/* health */
	assert_true(ferry_stage_health(s1, health, sizeof(health)) < (int)sizeof(health));
	assert_non_null(strstr(health, "{\"stage\":\"1\",\"rank\":0,"));
	assert_non_null(strstr(health, "{\"from\":\"0\",\"to\":\"1\",\"role\":\"receiver\","
				       "\"peer\":\"stage0.rank0\",\"transport\":\"shm\","
				       "\"connector\":\"SharedMemoryConnector\",\"auto_filled\":"
				       "false,\"window_size\":4,\"max_inflight\":1}"));
	assert_non_null(strstr(health, "\"role\":\"sender\",\"peer\":\"stage2.rank0\""));
	assert_non_null(strstr(health, "\"engine\":{\"engine\":\"stage1.rank0\""));
	assert_true(ferry_stage_health(s1, NULL, 0) > 100);
	assert_int_equal(health[strlen(health) - 1], '}');

	/* close: twice is fine. */
	assert_int_equal(ferry_stage_close(&s0), 0);
	assert_null(s0);
	assert_int_equal(ferry_stage_close(&s0), 0);
	assert_int_equal(ferry_stage_close(&s1), 0);
	assert_int_equal(ferry_stage_close(&s2), 0);
	assert_int_equal(ferry_stage_close(NULL), -EINVAL);
}

/* A get blocked in one thread returns -ECANCELED when cleanup drops its request. */
struct blocked {
	struct ferry_stage *s;
	int rc;
};

static void *blocked_get(void *arg)
{
	struct blocked *b = arg;
	struct ferry_buf *buf = NULL;

	b->rc = ferry_stage_get(b->s, "0", "1", "req5_0_0", NULL, 5 * SEC, 0, &buf);
	if (buf)
		ferry_buf_release(buf);
	return NULL;
}

static void test_stage_cleanup_wakes_get(void **state)
{
	struct ferry_stage *s1 = open_stage("pipeline3.yaml", "1", 0, 0);
	struct blocked b = { s1, 1 };
	pthread_t th;
	int n = 0;

	(void)state;
	assert_int_equal(pthread_create(&th, NULL, blocked_get, &b), 0);
	/* Until the GET is parked, the cleanup finds nothing. */
	for (int i = 0; i < 500 && n == 0; i++) {
		n = ferry_stage_cleanup(s1, "req5");
		if (n == 0)
			usleep(2000);
	}
	assert_int_equal(n, 1);
	pthread_join(th, NULL);
	assert_int_equal(b.rc, -ECANCELED);
	assert_int_equal(ferry_stage_close(&s1), 0);
}

/* MANUAL progress: each call drives its own stage's engine. */
struct manual_get {
	struct ferry_stage *s;
	int rc;
	char data[16];
};

static void *manual_getter(void *arg)
{
	struct manual_get *m = arg;
	struct ferry_buf *b = NULL;

	m->rc = ferry_stage_get(m->s, "0", "1", "m_0_0", NULL, 5 * SEC, 0, &b);
	if (!m->rc) {
		snprintf(m->data, sizeof(m->data), "%.*s", (int)ferry_buf_len(b),
			 (char *)ferry_buf_data(b));
		ferry_buf_release(b);
	}
	return NULL;
}

static void test_stage_manual_progress(void **state)
{
	struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
	struct ferry_stage *s0 = NULL, *s1 = NULL;
	struct manual_get m = { 0 };
	pthread_t th;

	(void)state;
	p.config_path = FIX "pipeline3.yaml";
	p.ns = "manual";
	p.progress = FERRY_PROGRESS_MANUAL;
	p.pool_size = 1u << 20;
	p.timeout_ms = 5000;
	p.stage_id = "0";
	assert_int_equal(ferry_stage_open(&p, &s0), 0);
	p.stage_id = "1";
	assert_int_equal(ferry_stage_open(&p, &s1), 0);
	m.s = s1;
	assert_int_equal(pthread_create(&th, NULL, manual_getter, &m), 0);
	assert_int_equal(ferry_stage_put(s0, "0", "1", "m_0_0", "manual", 6, NULL, NULL), 0);
	pthread_join(th, NULL);
	assert_int_equal(m.rc, 0);
	assert_string_equal(m.data, "manual");
	assert_int_equal(ferry_stage_get(s1, "0", "1", "m_0_1", NULL, 0, FERRY_STAGE_NOWAIT,
					 &(struct ferry_buf *){ NULL }), -EAGAIN);
	assert_int_equal(ferry_stage_close(&s0), 0);
	assert_int_equal(ferry_stage_close(&s1), 0);
}

/* ------------------------------------------------------------------ */
/* Three processes                                                     */
/* ------------------------------------------------------------------ */

#define NREQ 4
#define NCHUNK 8

struct pipeline {
	const char *yaml;
	const char *ns;
	int meta_pipe[2];  /* stage 0 -> stage 1: metadata of request 0 */
	int done_pipe[2];  /* held by stage 2 only: EOF when it is done */
	int late_ms;       /* stage 2 opens this much later than the others */
};

static size_t chunk_len(int r, int n)
{
	return (size_t)(1 + ((r * 7919 + n * 104729) % 200000));
}

static uint8_t chunk_byte(int r, int n, size_t i)
{
	return (uint8_t)(r * 31 + n * 7 + i * 13);
}

static int stage_child(struct pipeline *pl, const char *id)
{
	struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
	struct ferry_stage *s = NULL;
	char path[512], key[64];
	int rc;

	snprintf(path, sizeof(path), "%s%s", pl->yaml[0] == '/' ? "" : FIX, pl->yaml);
	p.config_path = path;
	p.stage_id = id;
	p.ns = pl->ns;
	p.pool_size = 16u << 20;
	p.timeout_ms = 20000;
	if (!strcmp(id, "2") && pl->late_ms)
		usleep((useconds_t)pl->late_ms * 1000u);
	rc = ferry_stage_open(&p, &s);
	if (rc) {
		fprintf(stderr, "stage %s: open: %s\n", id, ferry_strerror(rc));
		return 10;
	}
	if (!strcmp(id, "0")) {
		static uint8_t data[200001];

		close(pl->meta_pipe[0]);
		/* Request 9 is never taken: stage 1 cleans it up. */
		for (int n = 0; n < 2; n++) {
			snprintf(key, sizeof(key), "req9_0_%d", n);
			if ((rc = ferry_stage_put(s, "0", "1", key, "junk", 4, NULL, NULL)))
				return 11;
		}
		for (int r = 0; r < NREQ; r++) {
			for (int n = 0; n < NCHUNK; n++) {
				struct ferry_stage_meta meta;
				size_t len = chunk_len(r, n);
				uint64_t size = 0;

				for (size_t i = 0; i < len; i++)
					data[i] = chunk_byte(r, n, i);
				snprintf(key, sizeof(key), "req%d_0_%d", r, n);
				rc = ferry_stage_put(s, "0", "1", key, data, len, &size, &meta);
				if (rc || size != len) {
					fprintf(stderr, "stage 0: put %s: %s\n", key,
						ferry_strerror(rc));
					return 12;
				}
				if (r == 0 && t_write(pl->meta_pipe[1], &meta, sizeof(meta)) !=
						      (ssize_t)sizeof(meta))
					return 13;
			}
		}
		close(pl->meta_pipe[1]);
	} else if (!strcmp(id, "1")) {
		close(pl->meta_pipe[1]);
		for (int r = 0; r < NREQ; r++) {
			for (int n = 0; n < NCHUNK; n++) {
				struct ferry_stage_meta meta, *mp = NULL;
				struct ferry_buf *b = NULL;
				uint8_t *d;

				if (r == 0) {
					if (t_read(pl->meta_pipe[0], &meta, sizeof(meta)) !=
					    (ssize_t)sizeof(meta))
						return 20;
					mp = &meta;
				}
				snprintf(key, sizeof(key), "req%d_0_%d", r, n);
				rc = ferry_stage_get(s, "0", "1", key, mp, 10 * SEC, 0, &b);
				if (rc || ferry_buf_len(b) != chunk_len(r, n)) {
					fprintf(stderr, "stage 1: get %s: %s\n", key,
						ferry_strerror(rc));
					return 21;
				}
				/* Transform in place? The block is the producer's (read
				 * only): copy into our own buffer, then put that. */
				{
					struct ferry_buf *out = NULL;

					if (ferry_buf_alloc(ferry_stage_engine(s), ferry_buf_len(b),
							    &out))
						return 22;
					d = ferry_buf_data(out);
					memcpy(d, ferry_buf_data(b), ferry_buf_len(b));
					for (size_t i = 0; i < ferry_buf_len(b); i++)
						d[i] ^= 0xa5;
					ferry_buf_release(b);
					snprintf(key, sizeof(key), "req%d_1_%d", r, n);
					rc = ferry_stage_put_buf(s, "1", "2", key, out, NULL, NULL);
					if (rc) {
						fprintf(stderr, "stage 1: put %s: %s\n", key,
							ferry_strerror(rc));
						return 23;
					}
				}
			}
		}
		/*
		 * Request 9 arrived before everything else, nobody takes it. On a
		 * store edge a put of it is kept here, and the cleanup frees it too.
		 */
		if (strstr(pl->yaml, "store") &&
		    ferry_stage_put(s, "1", "2", "req9_1_0", "kept", 4, NULL, NULL))
			return 25;
		rc = ferry_stage_cleanup(s, "req9");
		if (rc != (strstr(pl->yaml, "store") ? 3 : 2)) {
			fprintf(stderr, "stage 1: cleanup req9: %d\n", rc);
			return 24;
		}
	} else {
		char health[16384];

		for (int r = NREQ - 1; r >= 0; r--) { /* any order: keys find their data */
			for (int n = 0; n < NCHUNK; n++) {
				struct ferry_buf *b = NULL;
				const uint8_t *d;

				snprintf(key, sizeof(key), "req%d_1_%d", r, n);
				rc = ferry_stage_get(s, "1", "2", key, NULL, 15 * SEC, 0, &b);
				if (rc || ferry_buf_len(b) != chunk_len(r, n)) {
					fprintf(stderr, "stage 2: get %s: %s\n", key,
						ferry_strerror(rc));
					return 30;
				}
				d = ferry_buf_data(b);
				for (size_t i = 0; i < ferry_buf_len(b); i++) {
					if (d[i] != (uint8_t)(chunk_byte(r, n, i) ^ 0xa5)) {
						fprintf(stderr, "stage 2: %s byte %zu wrong\n", key,
							i);
						return 31;
					}
				}
				ferry_buf_release(b);
			}
		}
		rc = ferry_stage_get(s, "1", "2", "req0_1_99", NULL, 0, FERRY_STAGE_NOWAIT,
				     &(struct ferry_buf *){ NULL });
		if (rc != -EAGAIN)
			return 32;
		ferry_stage_health(s, health, sizeof(health));
		if (!strstr(health, "\"gets\":32,") ||
		    !strstr(health, strstr(pl->yaml, "tcp") ? "\"transport\":\"tcp\""
							    : "\"transport\":\"shm\""))
			return 33; /* the edge 1 -> 2 ran on the transport it asked for */
		close(pl->done_pipe[1]);
	}
	/* Stay until stage 2 is done: its data may be our pool's blocks. */
	if (strcmp(id, "2")) {
		char c;

		close(pl->done_pipe[1]);
		if (t_read(pl->done_pipe[0], &c, 1) != 0)
			return 40;
	}
	ferry_stage_close(&s);
	ferry_stage_close(&s);
	return 0;
}

static void run_pipeline_late(const char *yaml, const char *ns, int late_ms)
{
	struct pipeline pl = { .yaml = yaml, .ns = ns, .late_ms = late_ms };
	static const char *const ids[] = { "0", "1", "2" };
	pid_t pids[3];

	assert_int_equal(pipe(pl.meta_pipe), 0);
	assert_int_equal(pipe(pl.done_pipe), 0);
	/* No engine lives in this process while it forks. */
	for (int i = 0; i < 3; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			alarm(t_under_valgrind() ? 600 : 100);
			if (i != 2)
				close(pl.done_pipe[1]);
			_exit(stage_child(&pl, ids[i]));
		}
	}
	close(pl.meta_pipe[0]);
	close(pl.meta_pipe[1]);
	close(pl.done_pipe[0]);
	close(pl.done_pipe[1]);
	for (int i = 0; i < 3; i++) {
		int st = 0;

		assert_int_equal(t_waitpid(pids[i], &st, 0), pids[i]);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fail_msg("stage %s: %s %d", ids[i],
				 WIFEXITED(st) ? "exit" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
}

static void run_pipeline(const char *yaml, const char *ns)
{
	run_pipeline_late(yaml, ns, 0);
}

static void test_stage_three_processes_shm(void **state)
{
	(void)state;
	run_pipeline("pipeline3.yaml", "pipe-shm");
}

/*
 * Copy the fixture with its "zmq_port: 0" set so that the stage listening
 * on zmq_port + offset finds its port free; returns the new file's path in
 * path (a mkstemps template ending in ".yaml").
 */
static void fixture_with_port(const char *fixture, int offset, char *path)
{
	char text[4096];
	FILE *in = fopen(fixture, "r");
	size_t n;
	char *at;
	int fd;

	assert_non_null(in);
	n = fread(text, 1, sizeof(text) - 64, in);
	fclose(in);
	text[n] = '\0';
	at = strstr(text, "zmq_port: 0");
	assert_non_null(at);
	fd = mkstemps(path, 5);
	assert_true(fd >= 0);
	assert_true(dprintf(fd, "%.*szmq_port: %d%s", (int)(at - text), text,
			    t_free_tcp_port() - offset, at + strlen("zmq_port: 0")) > 0);
	close(fd);
}

/*
 * The same pipeline with 1 -> 2 on tcp (pipeline3_tcp.yaml, with a port
 * free right now written in): three processes, one edge on shm, one on tcp.
 */
static void test_stage_three_processes_tcp(void **state)
{
	char path[] = "/tmp/ferry-test-pipeline3-tcp-XXXXXX.yaml";

	(void)state;
	/* Stage 2 rank 0 listens on zmq_port + 2 (upstream's scheme). */
	fixture_with_port(FIX "pipeline3_tcp.yaml", 2, path);
	run_pipeline(path, "pipe-tcp");
	unlink(path);
}

/*
 * The same with stage 2 up 1 s after stage 1 starts putting pool buffers to
 * it over tcp: its first puts are refused and must be tried again (a
 * buffer PUT refused once was lost: "no engine of that name is
 * reachable", seen on a loaded machine).
 */
static void test_stage_three_processes_tcp_late(void **state)
{
	char path[] = "/tmp/ferry-test-pipeline3-tcp-XXXXXX.yaml";

	(void)state;
	fixture_with_port(FIX "pipeline3_tcp.yaml", 2, path);
	run_pipeline_late(path, "pipe-tcp", 1000);
	unlink(path);
}

/*
 * The same pipeline with 1 -> 2 a MooncakeStoreConnector edge: stage 1 keeps
 * what it puts and listens for control on zmq_port + 1 (its stage number);
 * stage 2 calls it there, learns its data address, and each get without
 * metadata fetches the key from stage 1 (in reverse order: most gets wait
 * at the holder for a key not yet put).
 */
static void test_stage_three_processes_store(void **state)
{
	char path[] = "/tmp/ferry-test-pipeline3-store-tcp-XXXXXX.yaml";

	(void)state;
#ifndef FERRY_HAVE_ZMQ
	skip(); /* the control channel needs libzmq */
#endif
	/* The holder, stage 1 rank 0, listens on zmq_port + 1. */
	fixture_with_port(FIX "pipeline3_store.yaml", 1, path);
	run_pipeline(path, "pipe-store");
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		/* Forking tests first, while no engine thread exists in this process. */
		cmocka_unit_test_setup_teardown(test_stage_three_processes_shm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_three_processes_tcp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_three_processes_tcp_late, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_three_processes_store, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_cleanup_releases_shm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_cleanup_op, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_health_query, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_check_command, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_api, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_cleanup_wakes_get, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage_manual_progress, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

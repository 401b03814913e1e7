/*
 * tests/test_stage_rdma.c - stages of a stage YAML whose edges ask for rdma
 * (MooncakeTransferEngineConnector, protocol: rdma): stage/addresses.c's
 * rdma endpoints, params.rdma_listen of a stage's engine.
 *
 * The YAML (written with a port free right now): stages 1 and 2, an edge
 * each way, 1 -> 2 with host H2 (stage 2's address), 2 -> 1 with host H1.
 *
 *   no device (anywhere; FERRY_RDMA_SYSFS names an empty place): both edges
 *     fall back to tcp with a warning logged, the stages open and transfer
 *     both ways over tcp, no engine listens on rdma.
 *   in ferry's RDMA test guest (tests/rdma-vm: $RDMA_IP0 on rxe0, $RDMA_IP1
 *     on rxe1; skipped elsewhere): H2 = RDMA_IP0, H1 = RDMA_IP1; the stages
 *     listen on rdma://H:PORT, every byte goes over rdma (eager and READ
 *     counters move, tcp made no connection), both ways.
 */
#include <errno.h>

#include "helpers.h"
#include "ferry/stage.h"

#define SECRET "stage-rdma-test-secret"
#define MIB (1024ull * 1024ull)

static char yaml[64];
static int base_port;

/* The YAML with hosts h1 (stage 1's) and h2 (stage 2's). */
static void write_yaml(const char *h1, const char *h2)
{
	int fd;

	snprintf(yaml, sizeof(yaml), "/tmp/ferry-test-stage-rdma-XXXXXX.yaml");
	fd = mkstemps(yaml, 5);
	assert_true(fd >= 0);
	base_port = t_free_tcp_port() - 2;
	assert_true(dprintf(fd,
			    "stage_args:\n"
			    "  - stage_id: 1\n"
			    "    output_connectors:\n"
			    "      to_stage_2: to2\n"
			    "    input_connectors:\n"
			    "      from_stage_2: to1\n"
			    "  - stage_id: 2\n"
			    "    input_connectors:\n"
			    "      from_stage_1: to2\n"
			    "    output_connectors:\n"
			    "      to_stage_1: to1\n"
			    "runtime:\n"
			    "  connectors:\n"
			    "    to2:\n"
			    "      name: MooncakeTransferEngineConnector\n"
			    "      extra:\n"
			    "        protocol: rdma\n"
			    "        host: %s\n"
			    "        zmq_port: %d\n"
			    "    to1:\n"
			    "      name: MooncakeTransferEngineConnector\n"
			    "      extra:\n"
			    "        protocol: rdma\n"
			    "        host: %s\n"
			    "        zmq_port: %d\n",
			    h2, base_port, h1, base_port) > 0);
	close(fd);
}

static struct ferry_stage *open_stage(const char *id)
{
	struct ferry_stage_params p = FERRY_STAGE_PARAMS_INIT;
	struct ferry_stage *s = NULL;
	int rc;

	p.config_path = yaml;
	p.stage_id = id;
	p.ns = "stagerdma";
	p.pool_size = 16 * MIB;
	p.timeout_ms = (uint32_t)(t_handshake_ms() * 4);
	rc = ferry_stage_open(&p, &s);
	if (rc)
		fail_msg("stage %s: %s", id, ferry_strerror(rc));
	return s;
}

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 11));
}

/* put n bytes from stage `from` (s) to `to` (r) under key, get and check them. */
static void put_get(struct ferry_stage *s, const char *from, struct ferry_stage *r, const char *to,
		    const char *key, size_t n, unsigned seed)
{
	uint8_t *data = malloc(n), *want = malloc(n);
	struct ferry_buf *b = NULL;
	uint64_t size = 0;
	int rc;

	assert_non_null(data);
	assert_non_null(want);
	pattern(data, n, seed);
	memcpy(want, data, n);
	rc = ferry_stage_put(s, from, to, key, data, n, &size, NULL);
	if (rc)
		fail_msg("put %s %s->%s: %s", key, from, to, ferry_strerror(rc));
	assert_int_equal(size, n);
	assert_int_equal(ferry_stage_get(r, from, to, key, NULL, 0, 0, &b), 0);
	assert_int_equal(ferry_buf_len(b), n);
	assert_memory_equal(ferry_buf_data(b), want, n);
	ferry_buf_release(b);
	free(data);
	free(want);
}

static bool health_has(struct ferry_stage *s, const char *text)
{
	static char h[65536];

	assert_true(ferry_stage_health(s, h, sizeof(h)) < (int)sizeof(h));
	return strstr(h, text) != NULL;
}

static bool listens_rdma(struct ferry_stage *s)
{
	char all[512];

	assert_true(ferry_engine_addresses(ferry_stage_engine(s), all, sizeof(all)) >= 0);
	return strstr(all, "rdma://") != NULL;
}

/* tcp's health counts links each tick: wait for one up (3 s at most). */
static long long tcp_links_up(struct ferry_engine *e)
{
	int64_t until = t_now() + 3 * SEC;
	long long n;

	while ((n = t_health_num(e, "\"tcp\":{", "links_up")) < 1 && t_now() < until)
		usleep(10000);
	return n;
}

/* No RDMA device: both edges are tcp, said so, and carry the data. */
static void test_stage_rdma_falls_back(void **state)
{
	struct ferry_stage *s1, *s2;

	(void)state;
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-test-stage-rdma", 1);
	write_yaml("127.0.0.1", "127.0.0.1");
	t_log_capture(FERRY_LOG_INFO);
	s1 = open_stage("1");
	s2 = open_stage("2");
	assert_true(t_log_seen(FERRY_LOG_WARN, "edge 1->2: protocol rdma but no RDMA device",
			       "tcp instead"));
	assert_true(t_log_seen(FERRY_LOG_WARN, "edge 2->1: protocol rdma but no RDMA device",
			       "tcp instead"));
	assert_true(health_has(s1, "\"from\":\"1\",\"to\":\"2\",\"role\":\"sender\","
				   "\"peer\":\"stage2.rank0\",\"transport\":\"tcp\""));
	assert_true(health_has(s2, "\"from\":\"2\",\"to\":\"1\",\"role\":\"sender\","
				   "\"peer\":\"stage1.rank0\",\"transport\":\"tcp\""));
	assert_false(listens_rdma(s1));
	assert_false(listens_rdma(s2));
	put_get(s1, "1", s2, "2", "r1_small", 100, 1);
	put_get(s1, "1", s2, "2", "r1_large", 1 * MIB, 2);
	put_get(s2, "2", s1, "1", "r2_back", 70000, 3);
	assert_true(tcp_links_up(ferry_stage_engine(s1)) >= 1);
	assert_true(tcp_links_up(ferry_stage_engine(s2)) >= 1);
	if (ferry_features() & FERRY_FEATURE_RDMA)
		assert_true(health_has(s1, "\"rdma\":{\"devices\":[],"));
	assert_int_equal(ferry_stage_close(&s1), 0);
	assert_int_equal(ferry_stage_close(&s2), 0);
	unlink(yaml);
	unsetenv("FERRY_RDMA_SYSFS");
}

/* In the guest: both edges are rdma and every byte goes over it. */
static void test_stage_rdma_in_guest(void **state)
{
	const char *ip0 = getenv("RDMA_IP0"), *ip1 = getenv("RDMA_IP1");
	struct ferry_engine *e1, *e2;
	struct ferry_stage *s1, *s2;
	char want[128], all[512];

	(void)state;
	if (!ip0 || !ip1 || !(ferry_features() & FERRY_FEATURE_RDMA)) {
		print_message("not in the RDMA test guest (RDMA_IP0/RDMA_IP1 unset, "
			      "tests/rdma-vm) or no rdma transport: skipped\n");
		skip();
	}
	unsetenv("FERRY_RDMA_SYSFS");
	setenv("FERRY_SECRET", SECRET, 1); /* the guest's addresses are not loopback */
	write_yaml(ip1, ip0);
	t_log_capture(FERRY_LOG_INFO);
	s1 = open_stage("1");
	s2 = open_stage("2");
	e1 = ferry_stage_engine(s1);
	e2 = ferry_stage_engine(s2);
	assert_false(t_log_seen(FERRY_LOG_WARN, "protocol rdma but no RDMA device", NULL));
	assert_true(health_has(s1, "\"from\":\"1\",\"to\":\"2\",\"role\":\"sender\","
				   "\"peer\":\"stage2.rank0\",\"transport\":\"rdma\""));
	assert_true(health_has(s2, "\"from\":\"2\",\"to\":\"1\",\"role\":\"sender\","
				   "\"peer\":\"stage1.rank0\",\"transport\":\"rdma\""));
	/* Each listens where the YAML says: its host, zmq_port + stage. */
	assert_true(ferry_engine_addresses(e1, all, sizeof(all)) > 0);
	snprintf(want, sizeof(want), "rdma://%s:%d", ip1, base_port + 1);
	assert_non_null(strstr(all, want));
	assert_true(ferry_engine_addresses(e2, all, sizeof(all)) > 0);
	snprintf(want, sizeof(want), "rdma://%s:%d", ip0, base_port + 2);
	assert_non_null(strstr(all, want));

	put_get(s1, "1", s2, "2", "r1_small", 100, 1);
	assert_true(t_health_num(e1, "\"rdma\":{", "eager") >= 1);
	put_get(s1, "1", s2, "2", "r1_large", 1 * MIB, 2);
	assert_true(t_health_num(e2, "\"rdma\":{", "reads") >= 4); /* 1 MiB in 256 KiB READs */
	assert_true(t_health_num(e2, "\"rdma\":{", "read_bytes") >= (long long)MIB);
	put_get(s2, "2", s1, "1", "r2_back", 70000, 3);
	assert_true(t_health_num(e1, "\"rdma\":{", "reads") >= 1);
	assert_true(t_health_num(e1, "\"rdma\":{", "connections_ready") >= 1);
	assert_true(t_health_num(e2, "\"rdma\":{", "connections_ready") >= 1);
	assert_int_equal(t_health_num(e1, "\"rdma\":{", "malformed"), 0);
	assert_int_equal(t_health_num(e2, "\"rdma\":{", "malformed"), 0);
	/* tcp carried nothing: it never had a link. */
	assert_int_equal(t_health_num(e1, "\"tcp\":{", "links_up"), 0);
	assert_int_equal(t_health_num(e2, "\"tcp\":{", "links_up"), 0);
	assert_int_equal(ferry_stage_close(&s1), 0);
	assert_int_equal(ferry_stage_close(&s2), 0);
	unlink(yaml);
	unsetenv("FERRY_SECRET");
}

int main(void)
{
	static const struct CMUnitTest cases[] = {
		cmocka_unit_test(test_stage_rdma_falls_back),
		cmocka_unit_test(test_stage_rdma_in_guest),
	};

	return t_run_cases_apart("test_stage_rdma", cases, sizeof(cases) / sizeof(cases[0]), NULL,
				 NULL);
}

/*
 * tests/test_stage_config.c - the stage YAML loader (stage/config.c) on the
 * fixtures in tests/fixtures/stages/: both schemas, connectors by
 * reference and inline, auto-filled edges, defaults, the transport of each
 * connector type, the extra keys honoured and ignored, and every error with
 * its file:line:column and key.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "config.h"

#define FIX FERRY_TEST_SRCDIR "/fixtures/stages/"

static struct stage_graph *load_ok(const char *name)
{
	struct stage_graph *g = NULL;
	char path[512];
	int rc;

	snprintf(path, sizeof(path), FIX "%s", name);
	rc = stage_graph_load(path, &g);
	assert_non_null(g);
	if (rc) {
		for (unsigned i = 0; i < g->nerrors; i++)
			print_message("%s\n", g->errors[i]);
		fail_msg("%s: %d", name, rc);
	}
	assert_int_equal(g->nerrors, 0);
	return g;
}

/* Load a fixture that must fail; returns the graph holding the errors. */
static struct stage_graph *load_bad(const char *name, int want)
{
	struct stage_graph *g = NULL;
	char path[512];

	snprintf(path, sizeof(path), FIX "%s", name);
	assert_int_equal(stage_graph_load(path, &g), want);
	assert_non_null(g);
	assert_true(g->nerrors > 0);
	return g;
}

/* The graph holds an error starting "<fixture path>:<where>" and containing text. */
static void expect_error(const struct stage_graph *g, const char *name, const char *where,
			 const char *text)
{
	char prefix[512];

	snprintf(prefix, sizeof(prefix), FIX "%s:%s", name, where);
	for (unsigned i = 0; i < g->nerrors; i++)
		if (!strncmp(g->errors[i], prefix, strlen(prefix)) && strstr(g->errors[i], text))
			return;
	for (unsigned i = 0; i < g->nerrors; i++)
		print_message("have: %s\n", g->errors[i]);
	fail_msg("no error \"%s ... %s\"", prefix, text);
}

static const struct stage_extra *extra_of(const struct stage_edge *e, const char *key)
{
	for (unsigned i = 0; i < e->nextras; i++)
		if (!strcmp(e->extras[i].key, key))
			return &e->extras[i];
	fail_msg("edge %s->%s has no extra %s", e->from, e->to, key);
	return NULL;
}

static void test_stage_config_legacy_ref(void **state)
{
	struct stage_graph *g = load_ok("legacy_ref.yaml");
	const struct stage_edge *e;

	(void)state;
	assert_int_equal(g->schema, STAGE_SCHEMA_LEGACY);
	assert_int_equal(g->nstages, 3);
	assert_int_equal(stage_graph_stage(g, "1")->ranks, 2);
	assert_int_equal(stage_graph_stage(g, "2")->ranks, 1);
	assert_int_equal(g->nedges, 2);
	assert_int_equal(g->default_window_size, -1);
	assert_int_equal(g->default_max_inflight, 4);

	e = stage_graph_edge(g, "0", "1");
	assert_non_null(e);
	assert_int_equal(e->transport, STAGE_TRANSPORT_SHM);
	assert_string_equal(e->connector, "connector_of_shared_memory");
	assert_string_equal(e->connector_type, "SharedMemoryConnector");
	assert_false(e->auto_filled);
	assert_false(e->inline_spec);
	assert_int_equal(e->window_size, 8); /* from runtime.edges */
	assert_int_equal(e->window_from, STAGE_FROM_EDGE);
	assert_int_equal(e->max_inflight, 4); /* from runtime.defaults */
	assert_int_equal(e->inflight_from, STAGE_FROM_DEFAULTS);
	assert_false(extra_of(e, "shm_threshold_bytes")->honoured);
	assert_int_equal(e->line, 13);
	assert_int_equal(e->column, 19);

	/* protocol rdma, but this test sees no RDMA device (see below). */
	e = stage_graph_edge(g, "1", "2");
	assert_non_null(e);
	if (!stage_rdma_present()) {
		assert_int_equal(e->transport, STAGE_TRANSPORT_TCP);
		assert_true(e->fell_back);
		assert_int_equal(g->nwarnings, 1);
		assert_non_null(strstr(g->warnings[0], "legacy_ref.yaml:45:19: "
						      "runtime.connectors.rdma_connector.extra."
						      "protocol: edge 1->2: protocol rdma but no "
						      "RDMA device"));
	}
	assert_string_equal(e->host, "10.0.0.2");
	assert_int_equal(e->port, 50051);
	assert_int_equal(e->memory_pool_size, 268435456);
	assert_string_equal(e->memory_pool_device, "cpu");
	assert_true(extra_of(e, "host")->honoured);
	assert_true(extra_of(e, "protocol")->honoured);
	assert_false(extra_of(e, "metadata_server")->honoured);
	assert_int_equal(e->window_size, -1);
	assert_int_equal(e->window_from, STAGE_FROM_DEFAULTS);
	assert_null(stage_graph_edge(g, "0", "2"));
	stage_graph_free(g);
}

/* With an RDMA device (a fake sysfs directory), protocol: rdma means rdma. */
static void test_stage_config_rdma_present(void **state)
{
	char dir[] = "/tmp/ferry-rdma-XXXXXX", dev[64];
	struct stage_graph *g;
	const struct stage_edge *e;

	(void)state;
	assert_non_null(mkdtemp(dir));
	setenv("FERRY_RDMA_SYSFS", dir, 1);
	assert_false(stage_rdma_present());
	snprintf(dev, sizeof(dev), "%s/mlx5_0", dir);
	assert_int_equal(mkdir(dev, 0700), 0);
	assert_true(stage_rdma_present());
	g = load_ok("legacy_ref.yaml");
	e = stage_graph_edge(g, "1", "2");
	assert_int_equal(e->transport, STAGE_TRANSPORT_RDMA);
	assert_false(e->fell_back);
	assert_string_equal(e->device_name, "mlx5_0");
	assert_true(extra_of(e, "device_name")->honoured);
	assert_int_equal(g->nwarnings, 0);
	stage_graph_free(g);
	/* FerryConnector auto with a remote host: rdma now. */
	g = load_ok("deploy.yaml");
	assert_int_equal(stage_graph_edge(g, "1", "2")->transport, STAGE_TRANSPORT_RDMA);
	stage_graph_free(g);
	rmdir(dev);
	rmdir(dir);
	unsetenv("FERRY_RDMA_SYSFS");
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-test", 1);
	assert_false(stage_rdma_present());
}

static void test_stage_config_legacy_inline(void **state)
{
	struct stage_graph *g = load_ok("legacy_inline.yaml");
	const struct stage_edge *e = stage_graph_edge(g, "0", "1");

	(void)state;
	assert_int_equal(g->nedges, 1); /* both ends name it: one edge */
	assert_non_null(e);
	assert_true(e->inline_spec);
	assert_null(e->connector);
	assert_string_equal(e->connector_type, "MooncakeStoreConnector");
	assert_int_equal(e->transport, STAGE_TRANSPORT_TCP);
	assert_true(e->key_lookup);
	assert_string_equal(e->host, "10.0.0.7");
	assert_false(extra_of(e, "master")->honoured);
	assert_false(extra_of(e, "segment")->honoured);
	assert_int_equal(e->window_size, -1);
	assert_int_equal(e->window_from, STAGE_FROM_BUILTIN);
	assert_int_equal(e->max_inflight, STAGE_DEFAULT_MAX_INFLIGHT);
	stage_graph_free(g);
}

static void test_stage_config_deploy(void **state)
{
	struct stage_graph *g = load_ok("deploy.yaml");
	const struct stage_edge *e;

	(void)state;
	assert_int_equal(g->schema, STAGE_SCHEMA_DEPLOY);
	assert_true(g->async_chunk);
	assert_int_equal(g->nstages, 4);
	assert_int_equal(g->nedges, 3);

	e = stage_graph_edge(g, "0", "1");
	assert_string_equal(e->connector_type, "YuanrongConnector");
	assert_int_equal(e->transport, STAGE_TRANSPORT_TCP);
	assert_true(e->key_lookup);
	assert_int_equal(e->port, 31501);
	assert_int_equal(e->get_timeout_ms, 1000);
	assert_int_equal(e->window_size, -1);
	assert_int_equal(e->window_from, STAGE_FROM_EDGE);
	assert_int_equal(e->max_inflight, 1);
	assert_int_equal(e->inflight_from, STAGE_FROM_EDGE);

	e = stage_graph_edge(g, "1", "2");
	assert_string_equal(e->connector_type, "FerryConnector");
	if (!stage_rdma_present())
		assert_int_equal(e->transport, STAGE_TRANSPORT_TCP);
	assert_int_equal(e->eager_max, 4096);
	assert_true(extra_of(e, "shm_threshold_bytes")->honoured);
	assert_int_equal(e->window_size, 16);

	e = stage_graph_edge(g, "2", "3"); /* listed in edges, no connector */
	assert_true(e->auto_filled);
	assert_int_equal(e->transport, STAGE_TRANSPORT_SHM);
	assert_string_equal(e->connector_type, "SharedMemoryConnector");
	stage_graph_free(g);
}

static void test_stage_config_autofill(void **state)
{
	struct stage_graph *g = load_ok("autofill.yaml");
	static const char *const want[][2] = { { "0", "1" }, { "0", "2" }, { "1", "2" } };

	(void)state;
	assert_int_equal(g->nedges, 3);
	for (unsigned i = 0; i < 3; i++) {
		const struct stage_edge *e = &g->edges[i]; /* sorted by from, to */

		assert_string_equal(e->from, want[i][0]);
		assert_string_equal(e->to, want[i][1]);
		assert_true(e->auto_filled);
		assert_int_equal(e->transport, STAGE_TRANSPORT_SHM);
		assert_null(e->connector);
		assert_int_equal(e->window_size, STAGE_DEFAULT_WINDOW_SIZE);
	}
	assert_int_equal(stage_graph_edge(g, "1", "2")->max_inflight, 2);
	assert_int_equal(stage_graph_edge(g, "0", "1")->max_inflight, STAGE_DEFAULT_MAX_INFLIGHT);
	stage_graph_free(g);
}

static void test_stage_config_pipelines(void **state)
{
	struct stage_graph *g = load_ok("pipeline3.yaml");
	char name[FERRY_NAME_MAX];

	(void)state;
	assert_int_equal(g->nedges, 2);
	assert_int_equal(stage_graph_edge(g, "0", "1")->transport, STAGE_TRANSPORT_SHM);
	assert_true(stage_graph_edge(g, "1", "2")->auto_filled);
	assert_int_equal(stage_graph_edge(g, "1", "2")->window_size, 4);
	assert_int_equal(stage_engine_name("1", 0, name, sizeof(name)), 0);
	assert_string_equal(name, "stage1.rank0");
	assert_int_equal(stage_peer_rank(1, 2), 1);
	assert_int_equal(stage_peer_rank(1, 1), 0);
	stage_graph_free(g);

	g = load_ok("pipeline3_tcp.yaml");
	assert_int_equal(stage_graph_edge(g, "1", "2")->transport, STAGE_TRANSPORT_TCP);
	assert_string_equal(stage_graph_edge(g, "1", "2")->host, "127.0.0.1");
	assert_int_equal(stage_graph_edge(g, "1", "2")->port, 0);
	stage_graph_free(g);
}

/* Anchors, aliases and merge keys (`<<`): keys written in place win. */
static void test_stage_config_anchors(void **state)
{
	struct stage_graph *g = load_ok("anchors.yaml");
	const struct stage_edge *e = stage_graph_edge(g, "0", "1");

	(void)state;
	assert_non_null(e);
	assert_string_equal(e->connector_type, "MooncakeTransferEngineConnector");
	assert_int_equal(e->transport, STAGE_TRANSPORT_TCP);
	assert_string_equal(e->host, "10.0.0.9");
	assert_int_equal(e->port, 6001);
	assert_int_equal(e->nextras, 3); /* zmq_port once: the merged one gave way */
	e = stage_graph_edge(g, "1", "2");
	assert_non_null(e);
	assert_int_equal(e->transport, STAGE_TRANSPORT_SHM);
	stage_graph_free(g);
}

static void test_stage_config_err_undefined_ref(void **state)
{
	struct stage_graph *g = load_bad("err_undefined_ref.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 1);
	expect_error(g, "err_undefined_ref.yaml", "4:19: stage_args[0].output_connectors.to_stage_1: ",
		     "undefined connector reference 'connector_of_nothing'");
	stage_graph_free(g);
}

static void test_stage_config_err_mismatch(void **state)
{
	struct stage_graph *g = load_bad("err_mismatch.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 1);
	expect_error(g, "err_mismatch.yaml", "7:21: stage_args[1].input_connectors.from_stage_0: ",
		     "connector type MooncakeStoreConnector here, but SharedMemoryConnector at");
	expect_error(g, "err_mismatch.yaml", "7:21:", "err_mismatch.yaml:4:19");
	stage_graph_free(g);
}

static void test_stage_config_err_malformed(void **state)
{
	struct stage_graph *g = load_bad("err_malformed.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 1);
	expect_error(g, "err_malformed.yaml", "4:13: (document): ", "malformed YAML");
	assert_int_equal(g->nstages, 0);
	stage_graph_free(g);
}

static void test_stage_config_err_types(void **state)
{
	struct stage_graph *g = load_bad("err_types.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 5);
	expect_error(g, "err_types.yaml", "4:7: stage_args[0].input_connectors: ",
		     "must be a mapping, not a sequence");
	expect_error(g, "err_types.yaml", "5:15: stage_args[1].stage_id: ", "not a mapping");
	expect_error(g, "err_types.yaml", "8:29: stage_args[2].engine_args.tensor_parallel_size: ",
		     "must be an integer, not 'two'");
	expect_error(g, "err_types.yaml", "11:18: runtime.defaults.window_size: ",
		     "must be an integer, not 'lots'");
	expect_error(g, "err_types.yaml", "15:21: runtime.edges[0].max_inflight: ",
		     "must be -1 (no limit) or a positive number, not 0");
	stage_graph_free(g);
}

static void test_stage_config_err_undefined_stage(void **state)
{
	struct stage_graph *g = load_bad("err_undefined_stage.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 3);
	expect_error(g, "err_undefined_stage.yaml", "7:7: stages[0].output_connectors.to_stage_9: ",
		     "undefined stage '9'");
	expect_error(g, "err_undefined_stage.yaml", "9:27: stages[1].engine_input_source[0]: ",
		     "undefined stage '7'");
	expect_error(g, "err_undefined_stage.yaml", "12:9: edges[0].to: ", "undefined stage '5'");
	stage_graph_free(g);
}

static void test_stage_config_err_values(void **state)
{
	struct stage_graph *g = load_bad("err_values.yaml", -EINVAL);

	(void)state;
	assert_int_equal(g->nerrors, 4);
	expect_error(g, "err_values.yaml", "3:11: connectors.pigeon.name: ",
		     "unknown connector type 'CarrierPigeonConnector'");
	expect_error(g, "err_values.yaml", "7:17: connectors.te.extra.protocol: ",
		     "must be rdma or tcp, not 'carrier-pigeon'");
	expect_error(g, "err_values.yaml", "8:17: connectors.te.extra.zmq_port: ",
		     "must be a port 0..65535, not 70000");
	expect_error(g, "err_values.yaml", "14:15: stages[2].stage_id: ", "defined twice");
	stage_graph_free(g);
}

/* Documents written on the fly: empty, not a mapping, no schema, bad file. */
static void load_text(const char *text, int want, const char *expect)
{
	char path[] = "/tmp/ferry-yaml-XXXXXX";
	struct stage_graph *g = NULL;
	int fd = mkstemp(path);
	bool found = false;

	assert_true(fd >= 0);
	assert_int_equal(t_write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	assert_int_equal(stage_graph_load(path, &g), want);
	assert_non_null(g);
	for (unsigned i = 0; expect && i < g->nerrors; i++)
		found |= strstr(g->errors[i], expect) != NULL;
	if (expect && !found)
		fail_msg("no error containing \"%s\" (%u errors)", expect, g->nerrors);
	stage_graph_free(g);
	unlink(path);
}

static void test_stage_config_err_documents(void **state)
{
	struct stage_graph *g = NULL;

	(void)state;
	load_text("", -EINVAL, ":1:1: (document): the file holds no YAML document");
	load_text("- 1\n- 2\n", -EINVAL, ":1:1: (document): must be a mapping, not a sequence");
	load_text("model: x\n", -EINVAL, "neither stage_args (legacy schema) nor stages");
	load_text("stages: []\n", -EINVAL, ":1:9: stages: no stages are defined");
	load_text("stage_args:\n  - stage_id: 0\n    output_connectors:\n      elsewhere: x\n",
		  -EINVAL, ":4:7: stage_args[0].output_connectors.elsewhere: key must be "
			   "to_stage_<stage_id>");
	load_text("stage_args:\n  - stage_id: 0\n    engine_input_source: [0]\n", -EINVAL,
		  "stage 0 takes input from itself");
	load_text("stage_args:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
		  "      from_stage_0: {extra: {}}\n",
		  -EINVAL, ":5:21: stage_args[1].input_connectors.from_stage_0: connector spec has "
			   "no name");
	load_text("stage_args: [{stage_id: a/b}]\n", -EINVAL, "'a/b' is not a stage id");
	load_text("stage_args: [{stage_id: 0}]\nasync_chunk: maybe\n", -EINVAL,
		  ":2:14: async_chunk: must be true or false, not a scalar 'maybe'");
	/* An alias that points back at its own mapping: bounded, no hang. */
	load_text("stage_args:\n  - &s\n    stage_id: 0\n    engine_args: {<<: *s}\n"
		  "    output_connectors: &o\n      <<: *o\n", 0, NULL);
	assert_int_equal(stage_graph_load(FIX "no-such-file.yaml", &g), -ENOENT);
	assert_non_null(g);
	assert_int_equal(g->nerrors, 1);
	assert_non_null(strstr(g->errors[0], "no-such-file.yaml: cannot read"));
	stage_graph_free(g);
	assert_int_equal(stage_graph_load(NULL, &g), -EINVAL);
	stage_graph_free(NULL);
}

/*
 * Hostile files: every prefix of each fixture (a file cut anywhere) and
 * copies with one byte changed. Each load returns 0, or an error with its
 * reasons in the graph; never a crash (ASan, valgrind), never a leak.
 */
static void test_stage_config_truncated_and_garbled(void **state)
{
	static const char *const names[] = { "legacy_ref.yaml", "deploy.yaml",
					     "legacy_inline.yaml", "autofill.yaml", "anchors.yaml" };
	static const char garble[] = { ':', '-', '[', '{', '&', '*', '\n', '"', '\0', 'x' };
	unsigned step = t_under_valgrind() ? 29 : 3, loads = 0;
	char path[] = "/tmp/ferry-yaml-XXXXXX";
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	close(fd);
	for (unsigned f = 0; f < 5; f++) {
		char src[512], *text;
		FILE *in;
		long len;

		snprintf(src, sizeof(src), FIX "%s", names[f]);
		in = fopen(src, "rb");
		assert_non_null(in);
		fseek(in, 0, SEEK_END);
		len = ftell(in);
		rewind(in);
		text = malloc((size_t)len + 1);
		assert_int_equal(fread(text, 1, (size_t)len, in), (size_t)len);
		fclose(in);
		for (long cut = 0; cut <= len; cut += step) {
			for (int g = -1; g < (int)sizeof(garble); g++) {
				struct stage_graph *gr = NULL;
				char keep = cut < len ? text[cut] : 0;
				FILE *out = fopen(path, "wb");
				int rc;

				assert_non_null(out);
				if (g >= 0) {
					if (cut >= len)
						break;
					text[cut] = garble[g]; /* one byte changed */
					fwrite(text, 1, (size_t)len, out);
					text[cut] = keep;
				} else {
					fwrite(text, 1, (size_t)cut, out); /* cut here */
				}
				fclose(out);
				rc = stage_graph_load(path, &gr);
				assert_non_null(gr);
				if (rc)
					assert_true(gr->nerrors > 0);
				else
					assert_int_equal(gr->nerrors, 0);
				stage_graph_free(gr);
				loads++;
			}
		}
		free(text);
	}
	unlink(path);
	assert_true(loads > 40);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stage_config_legacy_ref),
		cmocka_unit_test(test_stage_config_rdma_present),
		cmocka_unit_test(test_stage_config_legacy_inline),
		cmocka_unit_test(test_stage_config_deploy),
		cmocka_unit_test(test_stage_config_autofill),
		cmocka_unit_test(test_stage_config_pipelines),
		cmocka_unit_test(test_stage_config_anchors),
		cmocka_unit_test(test_stage_config_err_undefined_ref),
		cmocka_unit_test(test_stage_config_err_mismatch),
		cmocka_unit_test(test_stage_config_err_malformed),
		cmocka_unit_test(test_stage_config_err_types),
		cmocka_unit_test(test_stage_config_err_undefined_stage),
		cmocka_unit_test(test_stage_config_err_values),
		cmocka_unit_test(test_stage_config_err_documents),
		cmocka_unit_test(test_stage_config_truncated_and_garbled),
	};

	/* These tests expect errors: keep the log quiet unless asked. */
	if (!getenv("FERRY_LOG"))
		ferry_log_set(-1, NULL, NULL);
	/* No RDMA device unless a test makes one. */
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-test", 1);
	return t_run_group_apart(tests, NULL, NULL);
}

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
	assert_true(extra_of(e, "memory_pool_device")->honoured); /* a host pool, pinned for CUDA */
	assert_string_equal(e->memory_pool_device, "cuda:0");
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
	/* A merge of the mapping that holds it (an alias back to an ancestor): fine. */
	load_text("stage_args:\n  - &s\n    stage_id: 0\n    engine_args: {<<: *s}\n", 0, NULL);
	/* A mapping that merges itself: a cycle, refused (it used to be cut silently). */
	load_text("stage_args:\n  - &s\n    stage_id: 0\n    engine_args: {<<: *s}\n"
		  "    output_connectors: &o\n      <<: *o\n",
		  -EINVAL, ":6:7: stage_args[0].output_connectors.<<: merges (<<) lead back into a "
			   "mapping they are merged into: a cycle");
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

/* ------------------------------------------------------------------ */
/* Hostile files: refused with file:line:column, in linear time        */
/* ------------------------------------------------------------------ */

/* Text built at run time (hostile files are never committed). */
struct text {
	char *buf;
	size_t len;
	FILE *f;
};

static void text_begin(struct text *t)
{
	t->buf = NULL;
	t->len = 0;
	t->f = open_memstream(&t->buf, &t->len);
	assert_non_null(t->f);
}

static void text_end(struct text *t)
{
	assert_int_equal(fclose(t->f), 0);
	t->f = NULL;
}

/* The graph holds an error containing every one of the given texts. */
static bool has_error(const struct stage_graph *g, const char *a, const char *b)
{
	for (unsigned i = 0; i < g->nerrors; i++)
		if (strstr(g->errors[i], a) && (!b || strstr(g->errors[i], b)))
			return true;
	return false;
}

static void show_errors(const struct stage_graph *g)
{
	for (unsigned i = 0; i < g->nerrors && i < 8; i++)
		print_message("have: %s\n", g->errors[i]);
}

/*
 * Load len bytes from memory (named "mem.yaml"), print how long it took,
 * expect rc and (if given) an error with both texts. Not timed: the time is
 * printed for the report, the bound is ctest's timeout.
 */
static struct stage_graph *load_mem(const char *what, const char *buf, size_t len, int want,
				    const char *a, const char *b)
{
	struct stage_graph *g = NULL;
	int64_t t0 = t_now();
	int rc = stage_graph_load_mem("mem.yaml", buf, len, &g);
	int64_t dt = t_now() - t0;

	print_message("  %-34s %9zu bytes: %s in %7.1f ms\n", what, len,
		      rc ? "refused" : "accepted", (double)dt / 1e6);
	assert_non_null(g);
	if (rc != want || (a && !has_error(g, a, b))) {
		show_errors(g);
		fail_msg("%s: rc %d (want %d), no error \"%s\" ... \"%s\"", what, rc, want,
			 a ? a : "", b ? b : "");
	}
	return g;
}

static void load_mem_free(const char *what, const char *buf, size_t len, int want,
			  const char *a, const char *b)
{
	stage_graph_free(load_mem(what, buf, len, want, a, b));
}

#define LOAD(what, text, want, a, b) load_mem_free(what, text, strlen(text), want, a, b)

/* A file of several documents was read as its first one. */
static void test_stage_config_err_several_documents(void **state)
{
	(void)state;
	LOAD("two documents", "stage_args:\n  - stage_id: 0\n---\nstages:\n  - stage_id: 1\n",
	     -EINVAL, "mem.yaml:3:1: (document): a second YAML document starts here", NULL);
	LOAD("an empty second document", "---\nstages: [{stage_id: 0}]\n---\n", -EINVAL,
	     "mem.yaml:3:1: (document): a second YAML document", NULL);
	/* One document, explicitly started and ended, is fine. */
	LOAD("one explicit document", "---\nstages: [{stage_id: 0}]\n...\n", 0, NULL, NULL);
}

/* Duplicate keys: PyYAML keeps the last, the old loader the first. Refused, both named. */
static void test_stage_config_err_duplicate_keys(void **state)
{
	(void)state;
	LOAD("duplicate stage_id", "stage_args:\n  - stage_id: 0\n    stage_id: 1\n", -EINVAL,
	     "mem.yaml:3:5: stage_args[0].stage_id: duplicate key: written at 2:5 and again at 3:5",
	     NULL);
	/* Same text, other quoting: the same key to PyYAML. */
	LOAD("duplicate, quoted", "stages:\n  - {stage_id: 0, \"stage_id\": 1}\n", -EINVAL,
	     "mem.yaml:2:19: stages[0].stage_id: duplicate key: written at 2:6", NULL);
	/* Anywhere in the file, also where ferry reads nothing (vLLM does). */
	LOAD("duplicate in engine_args",
	     "stages:\n  - stage_id: 0\n    engine_args:\n      model: a\n      model: b\n", -EINVAL,
	     "mem.yaml:5:7: stages[0].engine_args.model: duplicate key: written at 4:7 and again "
	     "at 5:7", NULL);
	LOAD("duplicate top-level key", "stages: [{stage_id: 0}]\nstages: [{stage_id: 1}]\n",
	     -EINVAL, "mem.yaml:2:1: stages: duplicate key", NULL);
	/* Two merge keys in one mapping: which wins is a matter of reader. */
	LOAD("two merge keys",
	     "a: &a {x: 1}\nb: &b {x: 2}\nstages:\n  - {stage_id: 0, <<: *a, <<: *b}\n", -EINVAL,
	     "mem.yaml:4:27: stages[0].<<: duplicate key: written at 4:19", NULL);
	/* A key merged in and written again is an override, not a duplicate. */
	LOAD("override of a merged key",
	     "a: &a {stage_id: 9}\nstages:\n  - {<<: *a, stage_id: 0}\n", 0, NULL, NULL);
}

/* `<<` takes a mapping or a list of mappings, nothing else (PyYAML agrees). */
static void test_stage_config_err_merge_values(void **state)
{
	(void)state;
	LOAD("merge of a scalar", "stage_args:\n  - stage_id: 0\n    <<: 5\n", -EINVAL,
	     "mem.yaml:3:5: stage_args[0].<<: a merge (<<) takes a mapping or a list of mappings, "
	     "not a scalar", NULL);
	LOAD("merge of null", "stages:\n  - {stage_id: 0, <<: }\n", -EINVAL,
	     "stages[0].<<: a merge (<<) takes a mapping or a list of mappings, not a scalar",
	     NULL);
	LOAD("merge of a list with a scalar",
	     "a: &a {x: 1}\nstages:\n  - {stage_id: 0, <<: [*a, 5]}\n", -EINVAL,
	     "mem.yaml:3:19: stages[0].<<[1]: a merge (<<) list holds mappings only, not a scalar",
	     NULL);
	LOAD("merge of a list with a list", "stages:\n  - {stage_id: 0, <<: [[]]}\n", -EINVAL,
	     "stages[0].<<[0]: a merge (<<) list holds mappings only, not a sequence", NULL);
	/* Quoted, "<<" is an ordinary key. */
	LOAD("quoted <<", "stages:\n  - {stage_id: 0, \"<<\": 5}\n", 0, NULL, NULL);
}

/* x0 <- x1 <- ... merges nested `depth` deep under the stage's engine_args. */
static struct stage_graph *merge_chain(unsigned depth, int want, const char *a)
{
	struct text t;
	struct stage_graph *g;

	text_begin(&t);
	fprintf(t.f, "x0: &a0 {tensor_parallel_size: 2}\n");
	for (unsigned i = 1; i < depth; i++)
		fprintf(t.f, "x%u: &a%u {<<: *a%u}\n", i, i, i - 1);
	fprintf(t.f, "stage_args:\n  - stage_id: 0\n    engine_args:\n      <<: *a%u\n", depth - 1);
	text_end(&t);
	g = load_mem(depth > STAGE_MAX_MERGE_DEPTH ? "merge chain past the bound"
						   : "merge chain at the bound",
		     t.buf, t.len, want, a, NULL);
	free(t.buf);
	return g;
}

/* Merge chains deeper than 8 were cut silently: now an error. Cycles too. */
static void test_stage_config_err_merge_depth(void **state)
{
	struct stage_graph *g;
	char where[128];

	(void)state;
	g = merge_chain(STAGE_MAX_MERGE_DEPTH, 0, NULL);
	assert_int_equal(g->stages[0].ranks, 2); /* read through all 8 */
	stage_graph_free(g);
	snprintf(where, sizeof(where), ":%d:7: stage_args[0].engine_args.<<: merges (<<) nest 9 "
		 "deep from here: at most 8", STAGE_MAX_MERGE_DEPTH + 1 + 4);
	stage_graph_free(merge_chain(STAGE_MAX_MERGE_DEPTH + 1, -EINVAL, where));
	stage_graph_free(merge_chain(200, -EINVAL, "merges (<<) nest 9 deep from here"));
	LOAD("one mapping merged twice", "a: &a {x: 1}\nb: &b {<<: *a}\nc: {<<: [*a, *b]}\n"
	     "stages: [{stage_id: 0}]\n", 0, NULL, NULL);
	/* A mapping cannot merge one that merges it (nor itself: see err_documents). */
	LOAD("merge cycle", "a: &a\n  x: 1\n  <<: {<<: *a}\nstages: [{stage_id: 0}]\n", -EINVAL,
	     "a cycle", NULL);
}

/* A file with both schemas was read as the legacy one. */
static void test_stage_config_err_both_schemas(void **state)
{
	(void)state;
	LOAD("both schemas", "stage_args:\n  - stage_id: 0\nstages:\n  - stage_id: 1\n", -EINVAL,
	     "mem.yaml:3:1: stages: both stage_args (legacy schema, line 1) and stages (deploy "
	     "schema, line 3)", NULL);
	LOAD("both schemas, deploy first", "stages: []\nstage_args: []\n", -EINVAL,
	     "mem.yaml:2:1: stage_args: both stage_args", NULL);
}

/* Anchors: one defined twice (PyYAML refuses it), an alias before its anchor. */
static void test_stage_config_err_anchors(void **state)
{
	(void)state;
	LOAD("anchor defined twice", "a: &x 1\nb: &x 2\nstages: [{stage_id: *x}]\n", -EINVAL,
	     "mem.yaml:2:4: (document): anchor &x is defined twice (first at line 1, column 4)",
	     NULL);
	LOAD("undefined alias", "stages: [{stage_id: *nothing}]\n", -EINVAL,
	     "mem.yaml:1:21: stages[0].stage_id: undefined alias *nothing", NULL);
	LOAD("alias before its anchor", "a: *x\nb: &x 1\nstages: [{stage_id: 0}]\n", -EINVAL,
	     "mem.yaml:1:4: a: undefined alias *x", NULL);
	LOAD("alias as a key", "k: &k stage_id\nstages: [{*k : 3}]\n", 0, NULL, NULL);
}

/*
 * 100,000 nested `[` (200 KB) took 45 s inside libyaml: refused at the 65th,
 * before the parser goes deep.
 */
static void test_stage_config_err_depth(void **state)
{
	size_t n = 100000;
	char *buf = malloc(2 * n + 1);
	struct text t;

	(void)state;
	memset(buf, '[', n);
	memset(buf + n, ']', n);
	buf[2 * n] = '\n';
	load_mem_free("100,000 nested [", buf, 2 * n + 1, -EINVAL,
		      "mem.yaml:1:65: (document): nested deeper than 64", NULL);
	memset(buf, '{', n);
	memset(buf + n, '}', n);
	load_mem_free("100,000 nested {", buf, 2 * n + 1, -EINVAL, "nested deeper than 64", NULL);
	free(buf);
	/* Block style, one level a line. */
	text_begin(&t);
	for (unsigned i = 0; i < 1000; i++)
		fprintf(t.f, "%*sk:\n", (int)i, "");
	text_end(&t);
	load_mem_free("1,000 nested block mappings", t.buf, t.len, -EINVAL,
		      "mem.yaml:65:", "nested deeper than 64");
	free(t.buf);
	/* 64 deep is fine (the root mapping is one). */
	text_begin(&t);
	fprintf(t.f, "stages: [{stage_id: 0}]\nx: ");
	for (unsigned i = 0; i < STAGE_MAX_DEPTH - 1; i++)
		fputc('[', t.f);
	for (unsigned i = 0; i < STAGE_MAX_DEPTH - 1; i++)
		fputc(']', t.f);
	fputc('\n', t.f);
	text_end(&t);
	load_mem_free("64 deep", t.buf, t.len, 0, NULL, NULL);
	free(t.buf);
}

/* 100,000 stages took 68 s (linear lookups): refused by the node bound, at once. */
static void test_stage_config_err_many_stages(void **state)
{
	struct text t;

	(void)state;
	text_begin(&t);
	fprintf(t.f, "stage_args:\n");
	for (unsigned i = 0; i < 100000; i++) {
		fprintf(t.f, "  - stage_id: %u\n", i);
		if (i)
			fprintf(t.f, "    engine_input_source: [%u]\n", i - 1);
	}
	text_end(&t);
	load_mem_free("100,000 stages", t.buf, t.len, -EINVAL, "(document): more than 262144 YAML "
		      "nodes", NULL);
	free(t.buf);
	/* Within the node bound, the stage bound. */
	text_begin(&t);
	fprintf(t.f, "stages:\n");
	for (unsigned i = 0; i <= STAGE_MAX_STAGES; i++)
		fprintf(t.f, "  - stage_id: %u\n", i);
	text_end(&t);
	load_mem_free("1,025 stages", t.buf, t.len, -EINVAL, "mem.yaml:2:3: stages: 1025 stages: "
		      "at most 1024", NULL);
	free(t.buf);
}

/*
 * The largest pipeline the bounds allow, every lookup exercised: 1,024
 * stages (ids out of order), 4 outputs each through one connector with
 * 16 extra keys (4,096 edges, 65,536 extras), each edge named at both ends
 * and in edges, each stage fed by its engine_input_source. Loads in time
 * linear in the file.
 */
static void write_big_pipeline(struct text *t, unsigned outs, unsigned extras)
{
	unsigned n = STAGE_MAX_STAGES;

	fprintf(t->f, "connectors:\n  c:\n    name: MooncakeStoreConnector\n    extra:\n");
	for (unsigned j = 0; j < extras; j++)
		fprintf(t->f, "      k%u: v%u\n", j, j);
	fprintf(t->f, "stages:\n");
	for (unsigned k = 0; k < n; k++) {
		unsigned i = (k * 7919) % n; /* out of order */

		fprintf(t->f, "  - stage_id: %u\n    output_connectors: {", i);
		for (unsigned d = 1; d <= outs; d++)
			fprintf(t->f, "%sto_stage_%u: c", d > 1 ? ", " : "", (i + d) % n);
		fprintf(t->f, "}\n    input_connectors: {");
		for (unsigned d = 1; d <= outs; d++)
			fprintf(t->f, "%sfrom_stage_%u: c", d > 1 ? ", " : "", (i + n - d) % n);
		fprintf(t->f, "}\n    engine_input_source: [%u]\n", (i + n - 1) % n);
	}
	fprintf(t->f, "edges:\n");
	for (unsigned i = 0; i < n; i++)
		fprintf(t->f, "  - {from: %u, to: %u, window_size: 4}\n", i, (i + 1) % n);
}

static void test_stage_config_big_pipeline(void **state)
{
	struct stage_graph *g;
	struct text t;
	char a[16], b[16];

	(void)state;
	text_begin(&t);
	write_big_pipeline(&t, 4, 16);
	text_end(&t);
	g = load_mem("1,024 stages, 4,096 edges", t.buf, t.len, 0, NULL, NULL);
	free(t.buf);
	assert_int_equal(g->nstages, STAGE_MAX_STAGES);
	assert_int_equal(g->nedges, STAGE_MAX_EDGES);
	for (unsigned i = 0; i < STAGE_MAX_STAGES; i++) {
		const struct stage_edge *e;

		snprintf(a, sizeof(a), "%u", i);
		assert_non_null(stage_graph_stage(g, a));
		assert_string_equal(stage_graph_stage(g, a)->id, a);
		for (unsigned d = 1; d <= 4; d++) {
			snprintf(b, sizeof(b), "%u", (i + d) % STAGE_MAX_STAGES);
			e = stage_graph_edge(g, a, b);
			assert_non_null(e);
			assert_int_equal(e->nextras, 16);
			assert_int_equal(e->window_size, d == 1 ? 4 : -1);
			assert_null(stage_graph_edge(g, b, a));
		}
	}
	for (unsigned k = 1; k < g->nedges; k++) /* sorted, numerically */
		assert_true(stage_id_cmp(g->edges[k - 1].from, g->edges[k].from) < 0 ||
			    (!strcmp(g->edges[k - 1].from, g->edges[k].from) &&
			     stage_id_cmp(g->edges[k - 1].to, g->edges[k].to) < 0));
	assert_null(stage_graph_stage(g, "1024"));
	stage_graph_free(g);

	/* One output more: past the edge bound. */
	text_begin(&t);
	write_big_pipeline(&t, 5, 1);
	text_end(&t);
	load_mem_free("1,024 stages, 5,120 edges", t.buf, t.len, -EINVAL, "more than 4096 edges",
		      NULL);
	free(t.buf);
	/* One extra key more: past the extras bound. */
	text_begin(&t);
	write_big_pipeline(&t, 4, 17);
	text_end(&t);
	load_mem_free("4,096 edges x 17 extra keys", t.buf, t.len, -EINVAL,
		      "more than 65536 extra keys over all edges", NULL);
	free(t.buf);
}

/* Stage ids of digits sort by value, the others after: a total order for the searches. */
static void test_stage_config_lookup_order(void **state)
{
	static const char *const ids[] = { "10", "1a", "2", "01", "1", "b-1", "a", "_", "-x", "0" };
	struct stage_graph *g;
	struct text t;
	unsigned n = sizeof(ids) / sizeof(ids[0]);

	(void)state;
	text_begin(&t);
	fprintf(t.f, "stages:\n");
	for (unsigned i = 0; i < n; i++)
		fprintf(t.f, "  - stage_id: '%s'\n", ids[i]);
	fprintf(t.f, "edges:\n");
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < n; j++)
			if (i != j)
				fprintf(t.f, "  - {from: '%s', to: '%s'}\n", ids[i], ids[j]);
	text_end(&t);
	g = load_mem("every edge of 10 ids", t.buf, t.len, 0, NULL, NULL);
	free(t.buf);
	assert_int_equal(g->nedges, n * (n - 1));
	for (unsigned i = 0; i < n; i++) {
		assert_non_null(stage_graph_stage(g, ids[i]));
		for (unsigned j = 0; j < n; j++)
			if (i != j)
				assert_non_null(stage_graph_edge(g, ids[i], ids[j]));
	}
	assert_null(stage_graph_stage(g, "001"));
	assert_null(stage_graph_edge(g, "1", "1"));
	assert_true(stage_id_cmp("2", "10") < 0);
	assert_true(stage_id_cmp("10", "1a") < 0);
	assert_true(stage_id_cmp("1a", "2") > 0);
	assert_true(stage_id_cmp("01", "1") < 0 && stage_id_cmp("1", "2") < 0);
	assert_int_equal(stage_id_cmp("99999999999999999", "99999999999999999"), 0);
	assert_true(stage_id_cmp("99999999999999999", "100000000000000000") < 0);
	assert_string_equal(g->edges[0].from, "0");
	assert_string_equal(g->edges[g->nedges - 1].from, "b-1");
	stage_graph_free(g);
}

/* An edge listed twice, a stage twice in one engine_input_source: errors. */
static void test_stage_config_err_listed_twice(void **state)
{
	(void)state;
	LOAD("edge listed twice", "stages: [{stage_id: 0}, {stage_id: 1}]\nedges:\n"
	     "  - {from: 0, to: 1, window_size: 2}\n  - {from: 0, to: 1, window_size: 8}\n",
	     -EINVAL, "mem.yaml:4:5: edges[1]: edge 0->1 is listed twice (first at 3:5)", NULL);
	LOAD("input source twice", "stages:\n  - stage_id: 0\n  - {stage_id: 1, "
	     "engine_input_source: [0, 0]}\n", -EINVAL,
	     "mem.yaml:3:44: stages[1].engine_input_source[1]: stage 0 is listed twice", NULL);
}

/* Counts and sizes: each bound refused with its place. */
static void test_stage_config_err_bounds(void **state)
{
	struct stage_graph *g;
	struct text t;

	(void)state;
	/* Keys of one mapping. */
	text_begin(&t);
	fprintf(t.f, "stages: [{stage_id: 0}]\nx:\n");
	for (unsigned i = 0; i <= STAGE_MAX_KEYS; i++)
		fprintf(t.f, "  k%u: 1\n", i);
	text_end(&t);
	load_mem_free("4,097 keys", t.buf, t.len, -EINVAL, "mem.yaml:3:3: x: a mapping of 4097 "
		      "keys: at most 4096", NULL);
	free(t.buf);
	/* Keys brought in by merges, over the file. */
	text_begin(&t);
	fprintf(t.f, "a: &a {");
	for (unsigned i = 0; i < 4000; i++)
		fprintf(t.f, "%sk%u: 1", i ? ", " : "", i);
	fprintf(t.f, "}\nstages:\n");
	for (unsigned i = 0; i < 20; i++)
		fprintf(t.f, "  - {<<: *a, stage_id: %u}\n", i);
	text_end(&t);
	load_mem_free("20 x 4,000 merged keys", t.buf, t.len, -EINVAL,
		      "stages[16].<<: merges (<<) bring in more than 65536 keys", NULL);
	free(t.buf);
	/* Connectors. */
	text_begin(&t);
	fprintf(t.f, "stages: [{stage_id: 0}]\nconnectors:\n");
	for (unsigned i = 0; i <= STAGE_MAX_CONNECTORS; i++)
		fprintf(t.f, "  c%u: {name: SharedMemoryConnector}\n", i);
	text_end(&t);
	load_mem_free("1,025 connectors", t.buf, t.len, -EINVAL,
		      "mem.yaml:3:3: connectors: 1025 connectors: at most 1024", NULL);
	free(t.buf);
	/* Nodes: a flat list of 10 MB. */
	text_begin(&t);
	fprintf(t.f, "stages: [{stage_id: 0}]\nx: [");
	while (t.len < STAGE_MAX_FILE_BYTES - 16) {
		fputs("a,a,a,a,a,a,a,a,", t.f);
		fflush(t.f);
	}
	fputs("a]\n", t.f);
	text_end(&t);
	load_mem_free("a flat list of 10 MB", t.buf, t.len, -EINVAL,
		      "(document): more than 262144 YAML nodes", NULL);
	/* Aliases count as nodes: each costs a walk. */
	memcpy(t.buf, "stages: [{stage_id: 0}]\ny: &y a\nx: [", 36);
	for (size_t i = 36; i + 4 < t.len; i += 4)
		memcpy(t.buf + i, "*y, ", 4);
	memcpy(t.buf + t.len - 4, "*y]\n", 4);
	load_mem_free("a list of 2.6 M aliases", t.buf, t.len, -EINVAL,
		      "(document): more than 262144 YAML nodes", NULL);
	free(t.buf);
	/* One scalar of 10 MB, and aliased into 16 extras of 4,096 edges: cut, no copies. */
	text_begin(&t);
	fprintf(t.f, "big: &big ");
	for (unsigned i = 0; i < (4u << 20) / 64; i++)
		fputs("yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy", t.f);
	fputc('\n', t.f);
	{
		/* The big pipeline with every extra value the big scalar. */
		struct text p;
		char *at, *v;

		text_begin(&p);
		write_big_pipeline(&p, 4, 16);
		text_end(&p);
		for (at = p.buf; (v = strstr(at, ": v")) && v < strstr(p.buf, "stages:"); at = v + 1) {
			char *eol = strchr(v, '\n');

			fwrite(at, 1, (size_t)(v - at), t.f);
			fputs(": *big", t.f);
			v = eol - 1;
			at = eol;
		}
		fputs(at, t.f);
		free(p.buf);
	}
	text_end(&t);
	g = load_mem("a 4 MB scalar in 65,536 extras", t.buf, t.len, 0, NULL, NULL);
	assert_int_equal(strlen(g->edges[0].extras[0].value), STAGE_EXTRA_SHOWN + 3);
	stage_graph_free(g);
	free(t.buf);
	/* A string the loader keeps: at most 1,024 bytes. */
	text_begin(&t);
	fprintf(t.f, "stages:\n  - stage_id: 0\n    output_connectors:\n      to_stage_1:\n"
		"        name: FerryConnector\n        extra: {transport: tcp, host: ");
	for (unsigned i = 0; i <= STAGE_MAX_STRING; i++)
		fputc('h', t.f);
	fprintf(t.f, "}\n  - stage_id: 1\n");
	text_end(&t);
	load_mem_free("a host of 1,025 bytes", t.buf, t.len, -EINVAL,
		      "mem.yaml:6:39: stages[0].output_connectors.to_stage_1.extra.host: a string "
		      "of 1025 bytes", "at most 1024");
	free(t.buf);
	/* An integer of 4 MB digits, aliased: refused without reading it all. */
	text_begin(&t);
	fprintf(t.f, "n: &n ");
	for (unsigned i = 0; i < (4u << 20) / 8; i++)
		fputs("99999999", t.f);
	fprintf(t.f, "\nstages: [{stage_id: 0}, {stage_id: 1}]\nedges:\n");
	fprintf(t.f, "  - {from: 0, to: 1, window_size: *n, max_inflight: *n}\n");
	text_end(&t);
	load_mem_free("a 4 MB integer", t.buf, t.len, -EINVAL,
		      "edges[0].window_size: must be an integer, not '9999", "...'");
	free(t.buf);
}

/* After STAGE_MAX_ERRORS errors the loader stops: many bad keys cost nothing more. */
static void test_stage_config_err_many_errors(void **state)
{
	struct stage_graph *g;
	struct text t;

	(void)state;
	text_begin(&t);
	fprintf(t.f, "o: &o {");
	for (unsigned i = 0; i < 4000; i++)
		fprintf(t.f, "%sbad_%u: c", i ? ", " : "", i);
	fprintf(t.f, "}\nstages:\n");
	for (unsigned i = 0; i < STAGE_MAX_STAGES; i++)
		fprintf(t.f, "  - {stage_id: %u, output_connectors: *o}\n", i);
	text_end(&t);
	g = load_mem("1,024 x 4,000 bad keys", t.buf, t.len, -EINVAL,
		     "stages[0].output_connectors.bad_0: key must be to_stage_<stage_id>", NULL);
	assert_int_equal(g->nerrors, STAGE_MAX_ERRORS);
	assert_true(g->errors_dropped >= 1);
	stage_graph_free(g);
	free(t.buf);
}

/* A file over 10 MiB is refused before it is read; exactly 10 MiB is fine. */
static void test_stage_config_err_file_size(void **state)
{
	char path[] = "/tmp/ferry-yaml-XXXXXX";
	static const char head[] = "stages: [{stage_id: 0}]\n";
	struct stage_graph *g = NULL;
	char line[4096];
	size_t left = STAGE_MAX_FILE_BYTES - (sizeof(head) - 1);
	int fd = mkstemp(path), rc;
	int64_t t0;

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(t_write(fd, head, sizeof(head) - 1), (ssize_t)sizeof(head) - 1);
	memset(line, 'c', sizeof(line));
	line[0] = '#';
	line[sizeof(line) - 1] = '\n';
	while (left) {
		size_t n = left < sizeof(line) ? left : sizeof(line);

		if (n < sizeof(line))
			line[n - 1] = '\n';
		assert_int_equal(t_write(fd, line, n), (ssize_t)n);
		left -= n;
	}
	t0 = t_now();
	rc = stage_graph_load(path, &g);
	print_message("  %-34s %9u bytes: %s in %7.1f ms\n", "a file of 10 MiB", STAGE_MAX_FILE_BYTES,
		      rc ? "refused" : "accepted", (double)(t_now() - t0) / 1e6);
	assert_int_equal(rc, 0);
	stage_graph_free(g);
	assert_int_equal(t_write(fd, "\n", 1), 1);
	close(fd);
	rc = stage_graph_load(path, &g);
	assert_int_equal(rc, -EFBIG);
	assert_non_null(g);
	assert_int_equal(g->nerrors, 1);
	assert_non_null(strstr(g->errors[0], ":1:1: (document): the file is 10485761 bytes: a "
					     "stage file holds at most 10485760"));
	stage_graph_free(g);
	unlink(path);
	/* From memory too. */
	assert_int_equal(stage_graph_load_mem("mem.yaml", "", STAGE_MAX_FILE_BYTES + 1ul, &g),
			 -EFBIG);
	stage_graph_free(g);
	assert_int_equal(stage_graph_load_mem("mem.yaml", NULL, 0, &g), -EINVAL);
	assert_true(has_error(g, "mem.yaml:1:1: (document): the file holds no YAML document", NULL));
	stage_graph_free(g);
	assert_int_equal(stage_graph_load_mem("mem.yaml", NULL, 1, &g), -EINVAL);
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
		cmocka_unit_test(test_stage_config_err_several_documents),
		cmocka_unit_test(test_stage_config_err_duplicate_keys),
		cmocka_unit_test(test_stage_config_err_merge_values),
		cmocka_unit_test(test_stage_config_err_merge_depth),
		cmocka_unit_test(test_stage_config_err_both_schemas),
		cmocka_unit_test(test_stage_config_err_anchors),
		cmocka_unit_test(test_stage_config_err_depth),
		cmocka_unit_test(test_stage_config_err_many_stages),
		cmocka_unit_test(test_stage_config_big_pipeline),
		cmocka_unit_test(test_stage_config_lookup_order),
		cmocka_unit_test(test_stage_config_err_listed_twice),
		cmocka_unit_test(test_stage_config_err_bounds),
		cmocka_unit_test(test_stage_config_err_many_errors),
		cmocka_unit_test(test_stage_config_err_file_size),
	};

	/* These tests expect errors: keep the log quiet unless asked. */
	if (!getenv("FERRY_LOG"))
		ferry_log_set(-1, NULL, NULL);
	/* No RDMA device unless a test makes one. */
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-test", 1);
	return t_run_group_apart(tests, NULL, NULL);
}

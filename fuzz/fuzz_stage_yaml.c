/*
 * fuzz/fuzz_stage_yaml.c - libFuzzer harness for the stage YAML loader
 * (stage/config.c, stage/config_doc.c, stage/config_map.c).
 *
 * Owns: one input = one stage file, loaded from memory with
 * stage_graph_load_mem. The loader must return 0 with no errors, or a
 * negative errno with its reasons in the graph (a graph is always returned
 * unless memory ran out); never crash, leak, or take long (libFuzzer's
 * -timeout catches a superlinear path). A graph is then walked: every
 * stage and edge is found again by its lookup, every string is read, so
 * that what the loader left there passes under ASan/UBSan.
 * Seeds: fuzz/corpus/stage_yaml/ (fixtures of both schemas, anchors and
 * merges, and inputs the fuzzer once broke the loader with).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ferry.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ferry_log_set(-1, NULL, NULL); /* every input has errors: no log */
	setenv("FERRY_RDMA_SYSFS", "/nonexistent/ferry-fuzz", 1);
	return 0;
}

static size_t walk_strings(const struct stage_edge *e)
{
	size_t n = strlen(e->from) + strlen(e->to) + strlen(e->where);

	n += e->connector ? strlen(e->connector) : 0;
	n += e->connector_type ? strlen(e->connector_type) : 0;
	n += e->host ? strlen(e->host) : 0;
	n += e->note ? strlen(e->note) : 0;
	for (unsigned k = 0; k < e->nextras; k++)
		n += strlen(e->extras[k].key) + strlen(e->extras[k].value) +
		     strlen(e->extras[k].note);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct stage_graph *g = NULL;
	int rc = stage_graph_load_mem("fuzz.yaml", data, size, &g);
	volatile size_t sink = 0;

	if (!g) {
		if (rc != -ENOMEM)
			abort(); /* a graph comes back unless memory ran out */
		return 0;
	}
	if (rc == 0 && (g->nerrors || g->errors_dropped))
		abort(); /* accepted, yet errors */
	if (rc != 0 && rc != -ENOMEM && !g->nerrors)
		abort(); /* refused without a reason */
	if (g->nerrors > STAGE_MAX_ERRORS || g->nwarnings > STAGE_MAX_ERRORS)
		abort();
	for (unsigned i = 0; i < g->nerrors; i++)
		sink += strlen(g->errors[i]);
	for (unsigned i = 0; i < g->nwarnings; i++)
		sink += strlen(g->warnings[i]);
	if (rc == 0) {
		for (unsigned i = 0; i < g->nstages; i++)
			if (stage_graph_stage(g, g->stages[i].id) != &g->stages[i])
				abort();
		for (unsigned i = 0; i < g->nedges; i++) {
			const struct stage_edge *e = &g->edges[i];

			if (stage_graph_edge(g, e->from, e->to) != e ||
			    !stage_graph_stage(g, e->from) || !stage_graph_stage(g, e->to))
				abort();
			if (i && stage_id_cmp(g->edges[i - 1].from, e->from) > 0)
				abort(); /* edges are sorted */
			sink += walk_strings(e);
		}
	}
	(void)sink;
	stage_graph_free(g);
	return 0;
}

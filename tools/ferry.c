/*
 * tools/ferry.c - the `ferry` command.
 *
 *   ferry check STAGES.yaml          print the resolved pipeline (stages,
 *                                    edges, transport per edge, defaults
 *                                    filled in, extra keys honoured or
 *                                    ignored), or the errors; exit 1 on errors
 *   ferry health [-n NS] ENGINE      print the health JSON of a running
 *   ferry health NS/ENGINE           (the same)
 *                                    engine of this host (asked through its
 *                                    shm name); exit 1 if it cannot be asked
 *   ferry health [-n NS] -c tcp://HOST:PORT ENGINE
 *                                    the same, asked over the control
 *                                    channel at that endpoint (any host;
 *                                    the secret from $FERRY_SECRET)
 *   ferry list [-n NS]               the live engines of a namespace
 *
 * Owns: the command line and the printing; the work is done by
 * stage/config.c and backends/shm/shm_health.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "ferry.h"
#include "ferry/stage.h"
#include "shm_sock.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: ferry check STAGES.yaml\n"
		   "       ferry health [-n NAMESPACE] [-t TIMEOUT_MS] ENGINE | NAMESPACE/ENGINE\n"
		   "       ferry health [-n NAMESPACE] [-t TIMEOUT_MS] -c tcp://HOST:PORT ENGINE\n"
		   "       ferry list [-n NAMESPACE]\n");
	return f == stderr ? 2 : 0;
}

static const char *origin(enum stage_origin o, const struct stage_graph *g)
{
	switch (o) {
	case STAGE_FROM_EDGE:
		return "edge";
	case STAGE_FROM_DEFAULTS:
		return g->schema == STAGE_SCHEMA_DEPLOY ? "defaults" : "runtime.defaults";
	default:
		return "built-in";
	}
}

static void print_limit(const char *what, int64_t v, enum stage_origin o,
			const struct stage_graph *g)
{
	if (v < 0)
		printf("%s unlimited (%s)", what, origin(o, g));
	else
		printf("%s %lld (%s)", what, (long long)v, origin(o, g));
}

static int cmd_check(const char *path)
{
	struct stage_graph *g = NULL;
	int rc = stage_graph_load(path, &g);

	if (!g) {
		fprintf(stderr, "ferry: %s: %s\n", path, ferry_strerror(rc));
		return 1;
	}
	if (rc) {
		for (unsigned i = 0; i < g->nerrors; i++)
			fprintf(stderr, "%s\n", g->errors[i]);
		/* The loader stops reading after STAGE_MAX_ERRORS: there may be more. */
		if (g->errors_dropped)
			fprintf(stderr, "(%u more error(s) not shown; the loader stops reading "
					"after %d)\n", g->errors_dropped, STAGE_MAX_ERRORS);
		fprintf(stderr, "%s: %u%s error(s): nothing would start\n", path,
			g->nerrors + g->errors_dropped, g->errors_dropped ? " or more" : "");
		stage_graph_free(g);
		return 1;
	}
	printf("%s: %s schema, %u stage(s), %u edge(s), async_chunk %s\n", path,
	       g->schema == STAGE_SCHEMA_DEPLOY ? "deploy (connectors, stages, edges)"
						: "legacy (runtime.connectors, stage_args)",
	       g->nstages, g->nedges, g->async_chunk ? "true" : "false");
	printf("defaults: ");
	print_limit("window_size", g->default_window_size, g->default_window_from, g);
	printf(", ");
	print_limit("max_inflight", g->default_max_inflight, g->default_inflight_from, g);
	printf("\nstages:\n");
	for (unsigned i = 0; i < g->nstages; i++) {
		const struct stage_def *s = &g->stages[i];
		char name[FERRY_NAME_MAX];

		printf("  %-4s ranks %u, engines", s->id, s->ranks);
		for (unsigned r = 0; r < s->ranks && r < 8; r++) {
			stage_engine_name(s->id, r, name, sizeof(name));
			printf(" %s", name);
		}
		printf("%s\n", s->ranks > 8 ? " ..." : "");
	}
	printf("edges:\n");
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *e = &g->edges[i];

		printf("  %s -> %s  %s  %s", e->from, e->to, stage_transport_name(e->transport),
		       e->connector_type);
		if (e->auto_filled)
			printf(" (auto-filled, %s:%d:%d %s)\n", g->file, e->line, e->column,
			       e->where);
		else
			printf(" %s%s%s (%s:%d:%d %s)\n", e->connector ? "'" : "(inline)",
			       e->connector ? e->connector : "", e->connector ? "'" : "", g->file,
			       e->line, e->column, e->where);
		printf("      ");
		print_limit("window_size", e->window_size, e->window_from, g);
		printf(", ");
		print_limit("max_inflight", e->max_inflight, e->inflight_from, g);
		printf("\n      why: %s%s\n", e->note ? e->note : "-",
		       e->key_lookup ? "; GET without metadata looks the key up" : "");
		for (unsigned k = 0; k < e->nextras; k++) {
			const struct stage_extra *x = &e->extras[k];

			printf("      extra %s: %s  %s (%s)\n", x->key, x->value,
			       x->honoured ? "honoured" : "ignored", x->note);
		}
	}
	if (g->nwarnings) {
		printf("warnings:\n");
		for (unsigned i = 0; i < g->nwarnings; i++)
			printf("  %s\n", g->warnings[i]);
		if (g->warnings_dropped)
			printf("  (%u more warning(s) not shown)\n", g->warnings_dropped);
	}
	printf("ok\n");
	stage_graph_free(g);
	return 0;
}

static int cmd_health(const char *ns, const char *name, int timeout_ms)
{
	char *buf = malloc(SHM_HEALTH_MAX);
	int rc;

	if (!buf)
		return 1;
	rc = shm_health_query(ns, name, buf, SHM_HEALTH_MAX, timeout_ms);
	if (rc < 0) {
		fprintf(stderr, "ferry: health of %s in namespace %s: %s\n", name, ns,
			rc == -EHOSTUNREACH ? "no such engine is running" : ferry_strerror(rc));
		free(buf);
		return 1;
	}
	printf("%s\n", buf);
	free(buf);
	return 0;
}

/*
 * Ask over the control channel: a short-lived engine of our own calls the
 * control endpoint, proves the secret and sends one PEER_HEALTH.
 */
static int cmd_health_control(const char *ns, const char *endpoint, const char *name,
			      int timeout_ms)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	struct ferry_peer *peer = NULL;
	struct ferry_sq *sq = NULL;
	struct ferry_sqe *sqe;
	struct ferry_cqe cqe;
	char me[FERRY_NAME_MAX];
	int rc;

	snprintf(me, sizeof(me), "ferry-health.%d", (int)getpid());
	p.name = me;
	p.ns = ns;
	p.pool_size = 1u << 20;
	p.flags = FERRY_ENGINE_NO_PREFAULT;
	if ((rc = ferry_engine_create(&p, &e)) || (rc = ferry_peer_open(e, name, &peer)) ||
	    (rc = ferry_peer_connect(peer, endpoint)) || (rc = ferry_sq_get(e, &sq)))
		goto out;
	sqe = ferry_sq_get_sqe(sq);
	ferry_prep_peer_health(sqe, peer, 1);
	ferry_sqe_set_timeout(sqe, (uint64_t)(timeout_ms > 0 ? timeout_ms : 1000) * 1000000ull);
	ferry_sq_submit(sq);
	rc = ferry_cq_wait(ferry_cq_default(e), &cqe, 1, -1);
	if (rc == 1) {
		rc = cqe.res < 0 ? cqe.res : 0;
		if (cqe.res >= 0)
			printf("%s\n", (const char *)ferry_buf_data(cqe.buf));
		if (cqe.flags & FERRY_CQE_F_BUF)
			ferry_buf_release(cqe.buf);
	}
out:
	if (rc < 0)
		fprintf(stderr, "ferry: health of %s at %s: %s\n", name, endpoint,
			ferry_strerror(rc));
	if (e)
		ferry_engine_destroy(e);
	return rc < 0 ? 1 : 0;
}

static int cmd_list(const char *ns, int timeout_ms)
{
	char dir[SHM_PATH_MAX], path[SHM_PATH_MAX * 2];
	struct dirent *d;
	DIR *D;
	int rc, n = 0;

	rc = shm_sock_runtime_dir(dir, sizeof(dir), 0);
	if (rc == -ENOENT)
		return 0;
	if (rc < 0 || snprintf(path, sizeof(path), "%s/%s", dir, ns) >= (int)sizeof(path)) {
		fprintf(stderr, "ferry: runtime directory: %s\n", ferry_strerror(rc ? rc : -1));
		return 1;
	}
	D = opendir(path);
	if (!D)
		return 0;
	while ((d = readdir(D))) {
		size_t l = strlen(d->d_name);
		char name[FERRY_NAME_MAX], probe[64];

		if (l < 6 || l - 5 >= sizeof(name) || strcmp(d->d_name + l - 5, ".sock"))
			continue;
		memcpy(name, d->d_name, l - 5);
		name[l - 5] = '\0';
		/*
		 * Live if it answers: a health request (cut short) rather than
		 * a peek at its lock, which could make an engine taking the
		 * name at that instant believe it is taken.
		 */
		if (shm_health_query(ns, name, probe, sizeof(probe), timeout_ms) != -EHOSTUNREACH) {
			printf("%s\n", name);
			n++;
		}
	}
	closedir(D);
	return 0;
}

int main(int argc, char **argv)
{
	const char *ns = "default", *control = NULL;
	int timeout_ms = 2000, i;

	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))
		return usage(stdout);
	/* Only the commands' own output on stdout; the library's warnings stay quiet. */
	if (!getenv("FERRY_LOG"))
		ferry_log_set(-1, NULL, NULL);
	if (!strcmp(argv[1], "check"))
		return argc == 3 ? cmd_check(argv[2]) : usage(stderr);
	for (i = 2; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			ns = argv[++i];
		else if (!strcmp(argv[i], "-t") && i + 1 < argc)
			timeout_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-c") && i + 1 < argc)
			control = argv[++i];
		else
			return usage(stderr);
	}
	if (!strcmp(argv[1], "health")) {
		char both[2 * FERRY_NAME_MAX], *slash;

		if (i + 1 != argc)
			return usage(stderr);
		if (control)
			return cmd_health_control(ns, control, argv[i], timeout_ms);
		/* NS/NAME names both at once. */
		snprintf(both, sizeof(both), "%s", argv[i]);
		slash = strchr(both, '/');
		if (!slash)
			return cmd_health(ns, argv[i], timeout_ms);
		*slash = '\0';
		return cmd_health(both, slash + 1, timeout_ms);
	}
	if (!strcmp(argv[1], "list"))
		return i == argc ? cmd_list(ns, timeout_ms) : usage(stderr);
	return usage(stderr);
}

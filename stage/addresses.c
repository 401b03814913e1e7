/*
 * stage/addresses.c - the URIs of a stage file's engines and edges (see
 * addresses.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addresses.h"
#include "ferry.h"
#include "stage_log.h"

/*
 * Where the receiving rank `rank` of stage `to` listens for a tcp or rdma
 * edge: "tcp://HOST:PORT" or "rdma://HOST:PORT" with HOST the edge's `host`
 * and PORT upstream's scheme, zmq_port + stage + 16 * rank (the stage's
 * number when its id is one, else 0), so that edges sharing a base port and
 * ranks of one stage do not collide. Both ends compute the same. A tcp
 * edge without a host (or "auto") is on 127.0.0.1; an rdma edge needs one:
 * the receiving stage's address on an RDMA device's interface, which it
 * binds and its sender calls (rdma_cm has its own port space, so an rdma
 * and a tcp edge may share the number).
 */
static int edge_endpoint(const struct stage_edge *edge, const char *to, unsigned rank,
			 char *out, size_t len)
{
	bool rdma = edge->transport == STAGE_TRANSPORT_RDMA;
	const char *host = edge->host && *edge->host && strcmp(edge->host, "auto") ? edge->host
										   : NULL;
	char *end;
	unsigned long stage = strtoul(to, &end, 10);
	int port;

	if (*end || stage > 65535)
		stage = 0;
	if (!edge->port) {
		log_error("edge %s->%s: a %s edge needs a port (zmq_port/port in its connector's "
			  "extra): the sending stage could not find port 0", edge->from, edge->to,
			  rdma ? "rdma" : "tcp");
		return -EINVAL;
	}
	if (rdma && !host) {
		log_error("edge %s->%s: an rdma edge needs a host (its connector's extra.host: the "
			  "receiving stage's address on an RDMA device's interface)", edge->from,
			  edge->to);
		return -EINVAL;
	}
	port = ferry_port_compat(edge->port, 0, (uint32_t)stage, rank);
	if (port < 0) {
		log_error("edge %s->%s: port %u + stage %lu + 16 * rank %u is not a port",
			  edge->from, edge->to, edge->port, stage, rank);
		return port;
	}
	snprintf(out, len, "%s://%s:%d", rdma ? "rdma" : "tcp", host ? host : "127.0.0.1", port);
	return 0;
}

/*
 * The endpoint this stage's engine listens on for `transport` (tcp or
 * rdma): every edge of it that it receives on must agree on it (an engine
 * has one of each). "" when it receives no such edge.
 * With control: the control endpoint of a stage that holds the data of
 * key-lookup edges it sends on (the consumers call it there), computed by
 * the same scheme with the sending stage's number; all must agree too.
 * Key-lookup edges make their receiver listen on no fixed port.
 */
static int stage_listen(const struct stage_graph *g, const char *id, unsigned rank, bool control,
			enum stage_transport transport, char *out, size_t len)
{
	const struct stage_edge *first = NULL;

	out[0] = '\0';
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *edge = &g->edges[i];
		char ep[128];
		int rc;

		if (strcmp(control ? edge->from : edge->to, id) ||
		    edge->transport != transport || edge->key_lookup != control)
			continue;
		if ((rc = edge_endpoint(edge, id, rank, ep, sizeof(ep))))
			return rc;
		if (!first) {
			first = edge;
			snprintf(out, len, "%s", ep);
		} else if (strcmp(out, ep)) {
			log_error("stage %s rank %u: %s edges %s->%s (%s:%d:%d) and %s->%s (%s:%d:%d) "
				  "ask it to listen on %s and %s; an engine listens on one",
				  id, rank, control ? "key-lookup" : stage_transport_name(transport),
				  first->from, first->to,
				  g->file, first->line, first->column, edge->from, edge->to, g->file,
				  edge->line, edge->column, out, ep);
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * A stage that receives a key-lookup edge (MooncakeStoreConnector,
 * YuanrongConnector) and listens for no tcp data otherwise: where its data
 * path listens so the holder can send it what it asks for. Port 0 (the
 * control channel publishes the port); the edge's host when it is this
 * machine's loopback or absent, else every interface (the holder sends to
 * the address it saw the call come from).
 */
static void lookup_data_listen(const struct stage_graph *g, const char *id, char *out,
			       size_t len)
{
	out[0] = '\0';
	for (unsigned i = 0; i < g->nedges; i++) {
		const struct stage_edge *edge = &g->edges[i];
		bool local;

		if (strcmp(edge->to, id) || !edge->key_lookup ||
		    edge->transport != STAGE_TRANSPORT_TCP)
			continue;
		local = !edge->host || !*edge->host || !strcmp(edge->host, "auto") ||
			!strncmp(edge->host, "127.", 4) || !strcmp(edge->host, "localhost");
		snprintf(out, len, "%s", local ? "tcp://127.0.0.1:0" : "tcp://*:0");
		return;
	}
}

int stage_rank_endpoints(const struct stage_graph *g, const char *id, unsigned rank,
			 char *listen, size_t llen, char *control, size_t clen, char *rdma,
			 size_t rlen)
{
	int rc;

	if ((rc = stage_listen(g, id, rank, false, STAGE_TRANSPORT_TCP, listen, llen)) ||
	    (rc = stage_listen(g, id, rank, true, STAGE_TRANSPORT_TCP, control, clen)) ||
	    (rc = stage_listen(g, id, rank, false, STAGE_TRANSPORT_RDMA, rdma, rlen)))
		return rc;
	if (!listen[0] && !control[0])
		lookup_data_listen(g, id, listen, llen);
	return 0;
}

int stage_edge_uri(const struct stage_graph *g, const struct stage_edge *edge, const char *self,
		   unsigned rank, bool sending, char *out, size_t len)
{
	const struct stage_def *other = stage_graph_stage(g, sending ? edge->to : edge->from);
	char ep[128];
	int rc;

	out[0] = '\0';
	if (edge->transport == STAGE_TRANSPORT_RDMA && !(ferry_features() & FERRY_FEATURE_RDMA)) {
		log_error("stage %s rank %u: edge %s->%s (%s, %s:%d:%d %s) needs the %s "
			  "transport, which this build does not have", self, rank, edge->from,
			  edge->to, edge->connector_type, g->file, edge->line, edge->column,
			  edge->where, stage_transport_name(edge->transport));
		return -EPROTONOSUPPORT;
	}
	if ((edge->transport != STAGE_TRANSPORT_TCP && edge->transport != STAGE_TRANSPORT_RDMA) ||
	    (sending == edge->key_lookup))
		return 0; /* found by name; or the end that is called */
	rc = edge_endpoint(edge, other->id, stage_peer_rank(rank, other->ranks), ep, sizeof(ep));
	if (rc)
		return rc;
	/*
	 * A store-like edge: the receiver calls the holder's control endpoint
	 * (its data address comes in the handshake); else the sender pushes
	 * to the receiver's data address.
	 */
	if (edge->key_lookup)
		snprintf(out, len, "ferry://%s", ep + strlen("tcp://"));
	else
		snprintf(out, len, "%s", ep);
	return 0;
}

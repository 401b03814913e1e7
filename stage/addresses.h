/*
 * stage/addresses.h - where the engines of a stage file listen, and how one
 * end of an edge reaches the other, as URIs (private to the stage layer).
 *
 * Owns: turning an edge's connector (its transport, host and port, upstream's
 * port arithmetic) into the listen and control endpoints of a stage's rank
 * and into the URI a sending (or, for a store-like edge, receiving) rank
 * hands ferry_peer_connect_uri. The stage layer itself then needs no
 * transport of its own: it opens the engine with these and connects peers
 * by URI; an edge whose far end is found by name (shared memory) has none.
 */
#ifndef FERRY_STAGE_ADDRESSES_H
#define FERRY_STAGE_ADDRESSES_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/*
 * The endpoints the engine of rank `rank` of stage `id` listens on: data
 * (params.listen), control (params.control) and rdma (params.rdma_listen,
 * "rdma://HOST:PORT" of the rdma edges it receives on), "" for none. 0, or
 * a negative errno (edges that disagree on them, an rdma edge without a
 * host; logged).
 */
int stage_rank_endpoints(const struct stage_graph *g, const char *id, unsigned rank,
			 char *listen, size_t llen, char *control, size_t clen, char *rdma,
			 size_t rlen);

/*
 * How rank `rank` of stage `self` reaches the other end of edge: a URI for
 * ferry_peer_connect_uri into out, or "" when the peer is found by its name
 * (same host): a tcp edge's sender gets the receiver's tcp:// address, an
 * rdma edge's its rdma:// address. 0; -EPROTONOSUPPORT for an edge on a
 * transport this build has not; -EINVAL (a port that does not fit, an rdma
 * edge without a host; logged).
 */
int stage_edge_uri(const struct stage_graph *g, const struct stage_edge *edge, const char *self,
		   unsigned rank, bool sending, char *out, size_t len);

#endif

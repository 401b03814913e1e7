/*
 * backends/tcp/tcp_wire.c - the tcp hello message to and from its wire
 * form (little-endian, names NUL-terminated on the way in).
 *
 * Owns: the byte order of struct tcp_hello (tcp_wire.h), shared by the
 * transport, its tests and its fuzzers.
 */
#include <endian.h>

#include "tcp_wire.h"

void tcp_hello_to_wire(struct tcp_hello *h)
{
	h->magic = htole64(h->magic);
	h->version = htole16(h->version);
	h->type = htole16(h->type);
	h->caps = htole32(h->caps);
	h->status = htole32(h->status);
	h->conn_index = htole16(h->conn_index);
	h->nconns = htole16(h->nconns);
	h->link_id = htole64(h->link_id);
}

void tcp_hello_from_wire(struct tcp_hello *h)
{
	h->magic = le64toh(h->magic);
	h->version = le16toh(h->version);
	h->type = le16toh(h->type);
	h->caps = le32toh(h->caps);
	h->status = le32toh(h->status);
	h->conn_index = le16toh(h->conn_index);
	h->nconns = le16toh(h->nconns);
	h->link_id = le64toh(h->link_id);
	h->ns[FERRY_NAME_MAX - 1] = '\0';
	h->name[FERRY_NAME_MAX - 1] = '\0';
}

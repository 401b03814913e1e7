/*
 * backends/tcp/tcp_wire.h - what two tcp engines say to each other (private
 * to the transport and its tests).
 *
 * Owns: the handshake message and the data frame formats. Every field is
 * little-endian on the wire; nothing read off a socket is trusted (tcp_recv.c
 * checks every length, offset and id before using it).
 *
 * A connection starts with the handshake (four struct tcp_hello messages,
 * see security.h), then carries frames: a fixed 32-byte header, then
 * `len` bytes (a key, then data, as the type says).
 */
#ifndef FERRY_TCP_WIRE_H
#define FERRY_TCP_WIRE_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#include "ferry.h"

#define TCP_PROTO_VERSION 1
#define TCP_HELLO_MAGIC 0x4f4c4c4548595246ull /* "FRYHELLO" */
#define TCP_FRAME_MAGIC 0x31595246u           /* "FRY1" */

/* Capabilities a peer announces in its hello (bits). */
#define TCP_CAP_RENDEZVOUS (1u << 0)
#define TCP_CAP_HEARTBEAT (1u << 1)
#define TCP_CAPS (TCP_CAP_RENDEZVOUS | TCP_CAP_HEARTBEAT)

#define TCP_NONCE_BYTES 32
#define TCP_MAC_BYTES 32
#define TCP_MAX_CONNS 16 /* connections of one link (one peer) */

enum tcp_hello_type {
	TCP_H_HELLO = 1, /* caller -> callee: who I am, my nonce */
	TCP_H_PROOF = 2, /* callee -> caller: who I am, my nonce, my proof */
	TCP_H_AUTH = 3,  /* caller -> callee: my proof */
	TCP_H_OK = 4,    /* callee -> caller: accepted */
	TCP_H_NO = 5,    /* refused, `status` says why (errno): callee -> caller, or caller ->
			    callee when the callee's proof was wrong (EACCES) */
};

struct tcp_hello {
	uint64_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t caps;
	uint32_t status;      /* TCP_H_NO: a positive errno */
	uint16_t conn_index;  /* HELLO: this connection's place in its link */
	uint16_t nconns;      /* HELLO: connections the caller opens */
	uint64_t link_id;     /* HELLO: the caller's link, shared by its connections */
	uint8_t nonce[TCP_NONCE_BYTES];
	uint8_t mac[TCP_MAC_BYTES];
	char ns[FERRY_NAME_MAX];
	char name[FERRY_NAME_MAX];
};

/* The hello to and from its wire form, in place (tcp_wire.c); from_wire NUL-terminates names. */
void tcp_hello_to_wire(struct tcp_hello *h);
void tcp_hello_from_wire(struct tcp_hello *h);

enum tcp_frame_type {
	/* Eager PUT: key, then data. cookie: the sender's message; arg: data bytes. */
	TCP_F_PUT = 1,
	/* Rendezvous offer: key only. cookie: the sender's message; arg: data bytes. */
	TCP_F_RTS = 2,
	/* Clear to send: cookie: the sender's message; arg: the receiver's slot. */
	TCP_F_CTS = 3,
	/* Rendezvous data: len bytes. cookie: the receiver's slot; arg: offset. */
	TCP_F_DATA = 4,
	/* Outcome of a PUT: cookie: the sender's message; arg: 0 or a negative errno. */
	TCP_F_RESULT = 5,
	/* Liveness: answered with PONG (cookie copied). */
	TCP_F_PING = 6,
	TCP_F_PONG = 7,
	TCP_F__MAX
};

/* Frame flags: the WIRE_F_* flags of a PUT, one byte on the wire. */
#define TCP_FRAME_F_REPLACE (1u << 0)
#define TCP_FRAME_F_CHUNK (1u << 1)  /* a stream chunk */
#define TCP_FRAME_F_END (1u << 2)    /* its last */
#define TCP_FRAME_F_ABORT (1u << 3)  /* an abort, the data is the reason */
#define TCP_FRAME_F_CREDIT (1u << 4) /* a stream credit */
#define TCP_FRAME_F_WANT (1u << 5)   /* the producer reached its credit limit */
#define TCP_FRAME_F__ALL ((1u << 6) - 1)

#define TCP_FRAME_BYTES 32

struct tcp_frame {
	uint32_t magic;
	uint8_t type;
	uint8_t flags;
	uint16_t key_len;
	uint32_t len;   /* bytes after the header */
	uint32_t resv;  /* 0 */
	uint64_t cookie;
	uint64_t arg;
};

_Static_assert(sizeof(struct tcp_frame) == TCP_FRAME_BYTES, "frame header is 32 bytes");

static inline void tcp_frame_pack(uint8_t out[TCP_FRAME_BYTES], uint8_t type, uint8_t flags,
				  uint16_t key_len, uint32_t len, uint64_t cookie, uint64_t arg)
{
	struct tcp_frame f = {
		.magic = htole32(TCP_FRAME_MAGIC), .type = type, .flags = flags,
		.key_len = htole16(key_len), .len = htole32(len), .resv = 0,
		.cookie = htole64(cookie), .arg = htole64(arg),
	};

	memcpy(out, &f, sizeof(f));
}

static inline void tcp_frame_unpack(const uint8_t in[TCP_FRAME_BYTES], struct tcp_frame *f)
{
	memcpy(f, in, sizeof(*f));
	f->magic = le32toh(f->magic);
	f->key_len = le16toh(f->key_len);
	f->len = le32toh(f->len);
	f->resv = le32toh(f->resv);
	f->cookie = le64toh(f->cookie);
	f->arg = le64toh(f->arg);
}

#endif

/*
 * control/ctl_wire.h - what two engines say on the control channel
 * (private to the channel's files in control/ and its tests).
 *
 * Owns: the control message format. Every message is one ZeroMQ frame (on
 * the callee's ROUTER socket preceded by the routing id frame ZeroMQ adds):
 * a fixed 24-byte header, then exactly `len` bytes of body whose layout the
 * type fixes. Every integer is little-endian. Nothing read is trusted:
 * ctl_hdr_check() checks magic, version, type, reserved bits and that the
 * frame is exactly header + len, and ctl_hello.c and ctl_session.c check
 * each body's length against its type (fixed sizes, or a key of
 * 1..FERRY_KEY_MAX-1 bytes without NUL) before reading a field. A message that fails a check is logged and
 * dropped; one that breaks the handshake ends the session.
 *
 * The handshake (the data path's, see security.h, with its own HMAC roles):
 *   caller -> callee  HELLO  caps, namespace, caller name, callee name, nonce Nc
 *   callee -> caller  PROOF  caps, callee name, nonce Ns,
 *                            HMAC(K, "ferry-ctl-callee" | Nc | Ns | names | ns)
 *   caller -> callee  AUTH   HMAC(K, "ferry-ctl-caller" | ...), caller's data address
 *   callee -> caller  OK     callee's data address (or NO with an errno)
 * Nothing else is answered or acted on before the session is READY.
 */
#ifndef FERRY_CTL_WIRE_H
#define FERRY_CTL_WIRE_H

#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "ferry.h"
#include "security.h"

#define CTL_MAGIC 0x4c544346u /* "FCTL" */
#define CTL_VERSION 1
#define CTL_HDR_BYTES 24
#define CTL_MAX_MSG (256u * 1024u) /* ZMQ_MAXMSGSIZE: larger frames end the connection */
#define CTL_ADDR_BYTES 128         /* a data address "tcp://HOST:PORT", NUL-padded */

/* Capabilities (bits of HELLO / PROOF). */
#define CTL_CAP_DIRECTORY (1u << 0) /* LOOKUP and FETCH */
#define CTL_CAP_CANCEL (1u << 1)    /* CANCEL */
#define CTL_CAP_HEALTH (1u << 2)    /* HEALTH_REQ */
#define CTL_CAP_FORGET (1u << 3)    /* FORGET: sent only to a peer that has it */
#define CTL_CAPS (CTL_CAP_DIRECTORY | CTL_CAP_CANCEL | CTL_CAP_HEALTH | CTL_CAP_FORGET)

enum ctl_type {
	CTL_HELLO = 1,
	CTL_PROOF = 2,
	CTL_AUTH = 3,
	CTL_OK = 4,
	CTL_NO = 5,         /* refused: body ctl_answer, res = -errno */
	CTL_PING = 6,       /* empty; answered by PONG with the same seq */
	CTL_PONG = 7,
	CTL_HEALTH_REQ = 8, /* empty */
	CTL_HEALTH = 9,     /* body: ctl_answer, then the JSON text (no NUL) */
	CTL_LOOKUP = 10,    /* body: ctl_key; answer LOOKUP_ANS */
	CTL_LOOKUP_ANS = 11, /* ctl_answer: res 1 published for you, 2 arrived from you, 0 none */
	CTL_FETCH = 12,     /* ctl_key; answer FETCH_ANS */
	CTL_FETCH_ANS = 13, /* ctl_answer: 0 sent, 1 remembered, < 0 -errno */
	CTL_CANCEL = 14,    /* ctl_key: the request id; answer CANCEL_ANS */
	CTL_CANCEL_ANS = 15, /* ctl_answer: res = things dropped */
	CTL_BYE = 16,       /* empty: the sender closes the session */
	/*
	 * ctl_key: the key of a FETCH (answered 1, remembered, or not answered
	 * yet) whose GET ended without its data; seq = that FETCH's seq. The
	 * holder drops that wish (nothing if it was served meanwhile, or never
	 * remembered). No answer.
	 */
	CTL_FORGET = 17,
	CTL__MAX
};

struct ctl_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t len;   /* body bytes after the header */
	uint32_t resv;  /* 0 */
	uint64_t seq;   /* a request's number; its answer carries the same */
};

struct ctl_hello {
	uint32_t caps;
	uint32_t resv;
	char ns[FERRY_NAME_MAX];
	char caller[FERRY_NAME_MAX];
	char callee[FERRY_NAME_MAX]; /* the engine the caller means to reach */
	uint8_t nonce[SEC_NONCE_BYTES];
};

struct ctl_proof {
	uint32_t caps;
	uint32_t resv;
	char name[FERRY_NAME_MAX];
	uint8_t nonce[SEC_NONCE_BYTES];
	uint8_t mac[SEC_MAC_BYTES];
};

struct ctl_auth {
	uint8_t mac[SEC_MAC_BYTES];
	char data_addr[CTL_ADDR_BYTES]; /* "" when it listens for no data */
};

struct ctl_ok {
	char data_addr[CTL_ADDR_BYTES];
};

struct ctl_answer {
	int32_t res;
	uint32_t resv;
	uint64_t len;
};

/* A key (LOOKUP, FETCH) or a request id (CANCEL): this, then key_len bytes. */
struct ctl_key {
	uint32_t flags;      /* FETCH: CTL_FETCH_NOWAIT */
	uint32_t timeout_ms; /* FETCH: how long the requester waits (0 = the holder's bound) */
	uint16_t key_len;    /* 1..FERRY_KEY_MAX-1, no NUL among the bytes */
	uint16_t resv;
	uint32_t resv2;
};

#define CTL_FETCH_NOWAIT (1u << 0)
#define CTL_KEY_BYTES 16 /* sizeof(struct ctl_key) on the wire */

_Static_assert(sizeof(struct ctl_hdr) == CTL_HDR_BYTES, "ctl_hdr layout");
_Static_assert(sizeof(struct ctl_key) == CTL_KEY_BYTES, "ctl_key layout");
_Static_assert(sizeof(struct ctl_answer) == 16, "ctl_answer layout");

static inline void ctl_hdr_pack(uint8_t *out, uint16_t type, uint32_t len, uint64_t seq)
{
	struct ctl_hdr h = {
		.magic = htole32(CTL_MAGIC),
		.version = htole16(CTL_VERSION),
		.type = htole16(type),
		.len = htole32(len),
		.resv = 0,
		.seq = htole64(seq),
	};

	memcpy(out, &h, sizeof(h));
}

/*
 * Check a received frame of n bytes and unpack its header. Returns 0, or
 * -EPROTO (not ours, a reserved field set, a wrong length), -EPROTONOSUPPORT
 * (another version), -EBADMSG (an unknown type).
 */
static inline int ctl_hdr_check(const void *frame, size_t n, struct ctl_hdr *h)
{
	if (n < CTL_HDR_BYTES)
		return -EPROTO;
	memcpy(h, frame, sizeof(*h));
	h->magic = le32toh(h->magic);
	h->version = le16toh(h->version);
	h->type = le16toh(h->type);
	h->len = le32toh(h->len);
	h->resv = le32toh(h->resv);
	h->seq = le64toh(h->seq);
	if (h->magic != CTL_MAGIC || h->resv)
		return -EPROTO;
	if (h->version != CTL_VERSION)
		return -EPROTONOSUPPORT;
	if (h->type == 0 || h->type >= CTL__MAX)
		return -EBADMSG;
	if ((uint64_t)h->len != (uint64_t)n - CTL_HDR_BYTES)
		return -EPROTO;
	return 0;
}

#endif

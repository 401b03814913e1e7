/*
 * control/ctl_int.h - the control channel's own types (private to the
 * channel's files in control/; built with libzmq only).
 *
 * Owns: the state of one engine's control channel (sockets, sessions, the
 * table of requests waiting for answers, the ferry_peer_connect mailbox),
 * its limits, and the calls its files make into each other: ctl.c is the
 * backend (init, fini, rounds, the tick); ctl_sock.c runs the sockets
 * (sending, receiving); ctl_session.c the sessions, their state machine and
 * their time; ctl_hello.c the handshake; ctl_connect.c ferry_peer_connect's
 * mailbox and the public calls; ctl_req.c the requests that ride a READY
 * session (asked and answered) and the reactor's op hooks; ctl_gate.c the
 * control port's door.
 */
#ifndef FERRY_CTL_INT_H
#define FERRY_CTL_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ctl.h"
#include "ctl_wire.h"
#include "netaddr.h"
#include "security.h"

#define CTL_MAX_SESSIONS 64
#define CTL_MAX_REQS 1024
#define CTL_ID_MAX 256
#define CTL_FETCH_MAX_NS (3600ull * 1000000000ull)
#define CTL_DRAIN_MAX 256 /* messages taken from one socket per round */
/* ctl_gate.c: connections at the control port that proved nothing, at most, at once */
#define CTL_GATE_PREAUTH_MAX 64
#define CTL_GATE_MAX (CTL_MAX_SESSIONS + CTL_GATE_PREAUTH_MAX)
#define CTL_GATE_SLOT (CTL_MAX_SESSIONS + 1) /* the monitor socket's poll slot */
#define ROLE_CALLER "ferry-ctl-caller"
#define ROLE_CALLEE "ferry-ctl-callee"

/* io_uring cookies: kind in the low 4 bits, socket slot, generation. */
enum { CK_POLL = 1, CK_TICK = 2, CK_CANCEL = 3 };

static inline uint64_t ck(unsigned kind, uint32_t slot, uint32_t gen)
{
	return ((uint64_t)gen << 20) | ((uint64_t)(slot & 0xffff) << 4) | kind;
}

struct ctl_sock {
	void *z;
	int fd;
	uint32_t gen;
	bool armed;
	bool dirty;
};

enum { CS_FREE = 0, CS_BACKOFF, CS_WAIT_PROOF, CS_WAIT_OK, CS_WAIT_AUTH, CS_READY };

struct ctl_session {
	uint8_t state;
	bool caller;            /* we called: our DEALER */
	bool refused;           /* the peer refused us (or proved nothing) */
	uint32_t slot;          /* its DEALER polls as socket slot + 1 */
	struct ctl_sock sock;
	uint8_t id[CTL_ID_MAX]; /* callee: the routing id at our ROUTER */
	uint32_t id_len;
	char peer_name[FERRY_NAME_MAX];
	struct ferry_peer *peer;
	char endpoint[NETADDR_MAX]; /* caller: the control endpoint we call */
	char seen_host[INET6_ADDRSTRLEN]; /* where the peer was seen (a wildcard data address) */
	uint8_t nonce_me[SEC_NONCE_BYTES], nonce_peer[SEC_NONCE_BYTES];
	uint32_t peer_caps;
	uint64_t hs_deadline, last_rx, last_ping, retry_at;
	int fd;                 /* callee: the connection its HELLO came on (ZMQ_SRCFD), or -1 */
};

/* A connection accepted at the control port (ctl_gate.c). */
struct ctl_door {
	int fd;                 /* libzmq's socket; -1: a free entry */
	bool proved;            /* a session on it proved the cluster secret */
	bool hung;              /* hung up on; its DISCONNECTED follows */
	uint64_t since;         /* accepted at */
	struct sockaddr_storage peer; /* as seen at ACCEPTED: is fd still it? */
	socklen_t peer_len;
};

struct ctl_gate {
	struct ctl_sock mon;    /* PAIR: the ROUTER's monitor events */
	bool srcfd;             /* libzmq tells a message's connection (ZMQ_SRCFD) */
	uint32_t nopen;
	uint32_t npreauth; /* open, not proved, not hung up on */
	struct ctl_door doors[CTL_GATE_MAX];
};

/* A request of ours waiting for its answer (or for its session to be READY). */
struct ctl_req {
	uint8_t type; /* CTL_HEALTH_REQ / LOOKUP / FETCH / CANCEL; 0 = free */
	bool sent;
	bool all;     /* LOOKUP of every peer: one peer's part of op's answer */
	uint32_t sess; /* sent: over st->sessions[sess - 1] */
	uint64_t seq;
	struct op *op;
	uint32_t op_gen;
	char peer[FERRY_NAME_MAX];
	uint32_t flags, timeout_ms;
	uint16_t key_len;
	char key[FERRY_KEY_MAX];
};

struct ctl_connect {
	struct ferry_peer *peer;
	char endpoint[NETADDR_MAX];
};

struct ctl_state {
	struct ferry_engine *e;
	struct backend *b;
	void *zctx;
	struct ctl_sock router;
	char bound[NETADDR_MAX];
	struct sec_secret secret;
	uint64_t heartbeat_ns, peer_timeout_ns;
	bool any_dirty;
	bool need_arm;         /* a socket may want its poll armed again */
	bool tick_armed, tick_due;
	struct __kernel_timespec tick_ts;
	uint32_t nsessions;
	/* For the health JSON (written by the reactor, read by anyone). */
	stat_t ready, declared_dead, dropped, auth_failed;
	struct ctl_session sessions[CTL_MAX_SESSIONS];
	struct ctl_gate gate;
	uint32_t nreqs;
	uint64_t next_seq;
	struct ctl_req reqs[CTL_MAX_REQS];
	/* ferry_peer_connect's mailbox (any thread -> the reactor). */
	pthread_mutex_t lock;
	_Atomic int connects_pending;
	uint32_t nconnects;
	struct ctl_connect connects[CTL_MAX_SESSIONS];
};

/* Log a message dropped (or a peer that failed to prove the secret) and count it. */
#define CTL_DROP(st, ...)                            \
	do {                                         \
		STAT_ADD((st)->dropped, 1);          \
		log_warn(__VA_ARGS__);               \
	} while (0)
#define CTL_REFUSE(st, ...)                          \
	do {                                         \
		STAT_ADD((st)->auth_failed, 1);          \
		log_warn(__VA_ARGS__);               \
	} while (0)

/* ctl.c: the backend */
struct ctl_state *ctl_state_of(struct ferry_engine *e);

/* ctl_sock.c: sockets, sending, receiving */
/* An SQE of the reactor's io_uring (submitting to make room), or NULL (logged). */
struct io_uring_sqe *ctl_ring_sqe(struct ctl_state *st);
/* A socket of type with our options, its ZMQ_FD polled as slot (ctl_sock_arm). */
int ctl_sock_open(struct ctl_state *st, struct ctl_sock *s, int type, const char *endpoint);
void ctl_sock_arm(struct ctl_state *st, struct ctl_sock *s, uint32_t slot);
void ctl_sock_close(struct ctl_state *st, struct ctl_sock *s, uint32_t slot);
/* ZMQ_EVENTS says a message waits. */
bool ctl_sock_readable(void *z);
/* "tcp://HOST:0" -> "tcp://HOST:*" (ZeroMQ's way to ask for any port). */
void ctl_zmq_endpoint(const char *in, char *out, size_t len);
const char *ctl_type_name(unsigned t);
/*
 * Send one message to a session: header, body, then extra (a key or text).
 * Returns 0, or a negative errno (the message is dropped; logged).
 */
int ctl_send_msg(struct ctl_state *st, struct ctl_session *s, uint16_t type, uint64_t seq,
		 const void *body, size_t blen, const void *extra, size_t elen);
int ctl_send_answer(struct ctl_state *st, struct ctl_session *s, uint16_t type, uint64_t seq,
		    int32_t res, uint64_t len);
/* Take what the sockets that said so hold (the gate's events first); returns how many. */
int ctl_drain(struct ctl_state *st);

/* ctl_session.c: sessions */
/* A free session, zeroed (its socket's generation moved on), or NULL. */
struct ctl_session *ctl_session_new(struct ctl_state *st);
void ctl_session_free(struct ctl_state *st, struct ctl_session *s);
/* The best session to peer `name`: a READY one, else (!ready) one in the making. */
struct ctl_session *ctl_session_for(struct ctl_state *st, const char *name, bool ready);
/* The callee session of a routing id at our ROUTER, or NULL. */
struct ctl_session *ctl_session_by_id(struct ctl_state *st, const void *id, size_t n);
/* Our call is through (res 0) or failed: the PUTs that waited for it go or fail. */
void ctl_waiters_go(struct ctl_state *st, struct ctl_session *s, int res);
/* The session ended (why: logged, NULL: not): a caller backs off, a callee is freed. */
void ctl_session_dead(struct ctl_state *st, struct ctl_session *s, int res, const char *why);
/* The handshake is done: note the peer's data address, let what waited go. */
void ctl_session_ready(struct ctl_state *st, struct ctl_session *s, const char *data_addr);
/* A message of a READY session (checked header h, its body). */
void ctl_on_ready_msg(struct ctl_state *st, struct ctl_session *s, const struct ctl_hdr *h,
		      const uint8_t *body);
/* The tick: heartbeats, verdicts, handshake deadlines, retries; returns the work done. */
int ctl_check_time(struct ctl_state *st);

/* ctl_hello.c: the handshake */
/* Call the peer of caller session s: a fresh DEALER, then HELLO. */
void ctl_call_start(struct ctl_state *st, struct ctl_session *s);
/*
 * Take one received message: what ctl_sock.c's recv_router hands over from
 * the ROUTER (routing id of 1..CTL_ID_MAX bytes, the frame of n bytes, the
 * address ZeroMQ saw it from or NULL, the fd of its connection or -1:
 * ctl_gate_srcfd) and recv_dealer from caller session s's DEALER: every
 * check and answer is here. fuzz/fuzz_ctl.c calls them without a socket.
 */
void ctl_take_router_msg(struct ctl_state *st, const void *id, size_t id_len,
			 const uint8_t *frame, size_t n, const char *peer_addr, int fd);
void ctl_take_dealer_msg(struct ctl_state *st, struct ctl_session *s, const uint8_t *frame,
			 size_t n);

/* ctl_connect.c: ferry_peer_connect's mailbox */
/* Take ferry_peer_connect calls still in the mailbox (an op may need them now). */
void ctl_connects_first(struct ctl_state *st);
/* Take the mailbox's calls and start them; returns how many were taken. */
int ctl_take_connects(struct ctl_state *st);

/* ctl_gate.c: the control port's door */
int ctl_gate_open(struct ctl_state *st);  /* after the ROUTER's bind */
void ctl_gate_close(struct ctl_state *st); /* before the ROUTER closes */
int ctl_gate_drain(struct ctl_state *st);  /* monitor events: connections come and go */
int ctl_gate_tick(struct ctl_state *st);   /* hang up on connections past the bound */
/* The connection a received message (a zmq_msg_t *) came on, or -1. */
int ctl_gate_srcfd(struct ctl_state *st, const void *msg);
/* A session on connection fd proved the cluster secret: it stays. */
void ctl_gate_proved(struct ctl_state *st, int fd);

/* ctl_req.c: the engine's directory service, registered by ctl_init */
extern const struct directory_ops ctl_directory;

/* ctl_req.c: our requests */
void ctl_req_free(struct ctl_state *st, struct ctl_req *r);
/* Complete a request's op with res (unless it ended meanwhile), then free it. */
void ctl_req_finish(struct ctl_state *st, struct ctl_req *r, int res, uint64_t len,
		    struct ferry_buf *buf);
void ctl_req_send(struct ctl_state *st, struct ctl_session *s, struct ctl_req *r);
/* An answer (HEALTH, LOOKUP_ANS, FETCH_ANS, CANCEL_ANS) of a READY session. */
void ctl_on_answer(struct ctl_state *st, struct ctl_session *s, const struct ctl_hdr *h,
		   const uint8_t *body);
/* The peer `name` is gone: fail the GETs that asked it through the channel. */
void ctl_fail_lookup_gets(struct ctl_state *st, const char *name, int res);

/* ctl_req.c: requests of the peer, answered here */
/* Parse a ctl_key body: 0 and the key (NUL-terminated) or -EPROTO. */
int ctl_key_parse(const uint8_t *body, size_t blen, struct ctl_key *k, char *key);
int ctl_on_fetch(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		 const char *key, uint64_t seq);
/* FORGET: drop the wish the peer's FETCH seq left on key here, if it is still parked. */
void ctl_on_forget(struct ctl_state *st, struct ctl_session *s, const char *key,
		   uint16_t key_len, uint64_t seq);
int ctl_on_lookup(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		  const char *key, uint64_t *len);
int ctl_on_cancel(struct ctl_state *st, struct ctl_session *s, const struct ctl_key *k,
		  const char *r);
void ctl_on_health_req(struct ctl_state *st, struct ctl_session *s, uint64_t seq);

#endif

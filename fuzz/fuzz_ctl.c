/*
 * fuzz/fuzz_ctl.c - the control channel's message parser: what an engine
 * does with each message its ZeroMQ sockets bring (control/ctl_hello.c
 * on_callee_msg / on_caller_msg, the handshake, ctl_session.c's
 * ctl_on_ready_msg, and the bodies parsed in ctl_req.c: ctl_key_parse, the peer's requests, the
 * answers to ours), with the engine's real sessions and requests.
 *
 * Why not through the sockets: ZeroMQ moves a message on its own I/O
 * threads, so when the engine would have taken it is unknown, and many
 * bad messages get no answer to wait for. The harness hands each message
 * to ctl_take_router_msg / ctl_take_dealer_msg (ctl_int.h), which run what
 * recv_router / recv_dealer (ctl_sock.c) hand a received frame to, on one
 * long-lived engine ("fzc", MANUAL progress, its control ROUTER bound on loopback).
 * The engine's answers do go out through its sockets: two DEALERs of the
 * harness (routing ids "fzA-id", "fzB-id") are connected to its ROUTER, so
 * that the callers the input speaks for exist there (the ROUTER refuses to
 * send to an unknown id); each proved the secret once through the sockets
 * (ctl_gate.c would hang up on a connection that never did), and their
 * inbound queues are emptied after each input. The engine's own call goes
 * to peer "fzC" at one of two loopback ports where nobody listens; after
 * an input that moved it on, it is called anew (ferry_peer_connect to the
 * other port), which puts that session back to waiting for a PROOF.
 *
 * Input: one options byte, then records until the input ends.
 *   option bit 0  clear: messages come from callers (to our ROUTER);
 *                 set: they answer our call to fzC (to its DEALER)
 *   option bit 1  shake hands right first (callee: HELLO and AUTH from
 *                 "fzA"; caller: PROOF and OK from "fzC"), so that the
 *                 records meet a READY session
 *   record byte r, r % 4 != 3: a message; r >> 2 bit 0: from routing id
 *                 fzB-id instead of fzA-id, bit 1: no peer address (else
 *                 127.0.0.1); then a 16-bit length (little-endian) and that
 *                 many bytes (fewer when the input ends): the frame
 *   record byte r, r % 4 == 3: an op of ours that asks the peer (fzA, or
 *                 fzC): (r >> 2) % 6 = PEER_HEALTH, LOOKUP, LOOKUP of every
 *                 peer, REMOTE_CANCEL, a LOOKUP GET, a NOWAIT LOOKUP GET
 * Fix-ups, so that the fuzzer gets past what it cannot know: an AUTH from
 * a caller named fzA or fzB, or a PROOF, whose mac is all zero bytes gets
 * the right proof for the session's nonces; an answer (HEALTH, LOOKUP_ANS,
 * FETCH_ANS, CANCEL_ANS) whose seq k is below 8 gets the seq of the k-th
 * request the engine sent over that session (in the order of its table). After the
 * input: our ops are cancelled, callee sessions are ended (a BYE from each
 * routing id), our call starts again, and the engine must hold no callee
 * session and no pool block (FZ_FAIL).
 *
 * libzmq allocates and frees on its own threads, so inputs seldom end with
 * as many frees as mallocs, and libFuzzer would scan the heap for a leak
 * after nearly each (seven times the input's cost): that per-input check
 * is off, LeakSanitizer checks the whole run at its exit instead.
 * libFuzzer flags: -detect_leaks=0
 */
#include "harness.h"

#ifdef FERRY_HAVE_ZMQ
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zmq.h>

#include "ctl_int.h"

#define FZ_ENGINE "fzc"
#define MAX_OPS_ASKED 16

static const char *const ids[2] = { "fzA-id", "fzB-id" };
static struct ferry_engine *eng;
static struct ctl_state *cst;
static struct ferry_peer *peer_a, *peer_c;
static void *zctx, *dealers[2];
static int dead_fd[2] = { -1, -1 };
static char dead_ep[2][NETADDR_MAX];
static unsigned which_ep;
static struct fz_idle idle;
static uint64_t op_seq;

static struct ctl_session *callee_session(const char *id)
{
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &cst->sessions[i];

		if (s->state != CS_FREE && !s->caller && s->id_len == strlen(id) &&
		    memcmp(s->id, id, s->id_len) == 0)
			return s;
	}
	return NULL;
}

static struct ctl_session *our_call(void)
{
	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++) {
		struct ctl_session *s = &cst->sessions[i];

		if (s->state != CS_FREE && s->caller && strcmp(s->peer_name, "fzC") == 0)
			return s;
	}
	return NULL;
}

static unsigned callee_sessions(void)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < CTL_MAX_SESSIONS; i++)
		n += cst->sessions[i].state != CS_FREE && !cst->sessions[i].caller;
	return n;
}

static void drain_dealers(void)
{
	char buf[512];

	for (int i = 0; i < 2; i++)
		while (zmq_recv(dealers[i], buf, sizeof(buf), ZMQ_DONTWAIT) >= 0)
			;
}

static void to_router(unsigned id, const void *frame, size_t n, const char *addr)
{
	/* fd -1: the connection is not known (the harness's own DEALERs proved theirs). */
	ctl_take_router_msg(cst, ids[id], strlen(ids[id]), frame, n, addr, -1);
}

static void bye_from(unsigned id)
{
	uint8_t h[CTL_HDR_BYTES];

	ctl_hdr_pack(h, CTL_BYE, 0, 0);
	to_router(id, h, sizeof(h), "127.0.0.1");
}

/* A HELLO as caller `name` to this engine, into m (CTL_HDR_BYTES + its body). */
static size_t hello_msg(uint8_t *m, const char *name)
{
	struct ctl_hello h;

	memset(&h, 0, sizeof(h));
	h.caps = htole32(CTL_CAPS);
	snprintf(h.ns, sizeof(h.ns), "%s", FZ_NS);
	snprintf(h.caller, sizeof(h.caller), "%s", name);
	snprintf(h.callee, sizeof(h.callee), "%s", FZ_ENGINE);
	memset(h.nonce, 0x33, sizeof(h.nonce));
	ctl_hdr_pack(m, CTL_HELLO, sizeof(h), 0);
	memcpy(m + CTL_HDR_BYTES, &h, sizeof(h));
	return CTL_HDR_BYTES + sizeof(h);
}

/* A HELLO from routing id `id`, as caller `name`, to this engine. */
static void hello_from(unsigned id, const char *name)
{
	uint8_t m[CTL_HDR_BYTES + sizeof(struct ctl_hello)];

	to_router(id, m, hello_msg(m, name), "127.0.0.1");
}

/* The next message the engine sends DEALER i, of type `type`; aborts after a while. */
static void await_msg(unsigned i, uint16_t type, void *body, size_t blen)
{
	uint8_t buf[1024];
	struct ctl_hdr h;

	for (int tries = 0; tries < 10000; tries++) {
		int n = zmq_recv(dealers[i], buf, sizeof(buf), ZMQ_DONTWAIT);

		if (n >= 0 && ctl_hdr_check(buf, (size_t)n, &h) == 0 && h.type == type &&
		    h.len == blen) {
			memcpy(body, buf + CTL_HDR_BYTES, blen);
			return;
		}
		if (n < 0) {
			fz_settle(eng, 8);
			usleep(500);
		}
	}
	FZ_FAIL("no %s from the engine on %s", ctl_type_name(type), ids[i]);
}

/*
 * DEALER i proves the secret through the sockets, as a caller "fzA"
 * would: ctl_gate.c then counts its connection as proved and never hangs
 * up on it. The session it made ends with a BYE.
 */
static void dealer_proves(unsigned i)
{
	uint8_t m[CTL_HDR_BYTES + sizeof(struct ctl_hello) + sizeof(struct ctl_auth)];
	uint8_t nc[SEC_NONCE_BYTES];
	struct ctl_hello *hp = (struct ctl_hello *)(m + CTL_HDR_BYTES);
	struct ctl_proof p;
	struct ctl_auth a;
	struct ctl_ok ok;
	size_t n = hello_msg(m, "fzA");

	memcpy(nc, hp->nonce, sizeof(nc));
	if (zmq_send(dealers[i], m, n, 0) != (int)n)
		FZ_FAIL("zmq_send HELLO");
	await_msg(i, CTL_PROOF, &p, sizeof(p));
	memset(&a, 0, sizeof(a));
	sec_proof(&cst->secret, ROLE_CALLER, nc, p.nonce, "fzA", FZ_ENGINE, FZ_NS, 0, 0, a.mac);
	ctl_hdr_pack(m, CTL_AUTH, sizeof(a), 0);
	memcpy(m + CTL_HDR_BYTES, &a, sizeof(a));
	n = CTL_HDR_BYTES + sizeof(a);
	if (zmq_send(dealers[i], m, n, 0) != (int)n)
		FZ_FAIL("zmq_send AUTH");
	await_msg(i, CTL_OK, &ok, sizeof(ok));
	bye_from(i);
}

/* A port on loopback where nobody listens (bound, never listening). */
static int dead_port(char *ep, size_t len)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl))
		FZ_FAIL("a dead port: %s", strerror(errno));
	snprintf(ep, len, "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
	return fd;
}

/*
 * Our call to fzC back to waiting for a PROOF: called anew (the other
 * port) unless it still waits. A new call is a new ZeroMQ socket, and the
 * context frees closed ones on its own thread: should it lag behind (the
 * engine logs "zmq_socket: Too many open files" and backs off), wait.
 */
static void call_c_again(void)
{
	for (int tries = 0; !our_call() || our_call()->state != CS_WAIT_PROOF; tries++) {
		if (tries == 2000)
			FZ_FAIL("our call to fzC does not wait for a PROOF (state %d)",
				our_call() ? our_call()->state : -1);
		if (tries)
			usleep(1000);
		which_ep ^= 1;
		if (ferry_peer_connect(peer_c, dead_ep[which_ep]))
			FZ_FAIL("ferry_peer_connect");
		fz_settle(eng, 64);
	}
}

static void setup(void)
{
	struct fz_engine_opts o = { .name = FZ_ENGINE, .control = "tcp://127.0.0.1:0" };
	char ctl_addr[NETADDR_MAX];

	eng = fz_engine(&o);
	cst = ctl_state_of(eng);
	if (!cst || ferry_engine_control_address(eng, ctl_addr, sizeof(ctl_addr)) <= 0)
		FZ_FAIL("no control channel");
	peer_a = fz_peer(eng, "fzA");
	peer_c = fz_peer(eng, "fzC");
	zctx = zmq_ctx_new();
	for (int i = 0; i < 2; i++) {
		int zero = 0;

		dealers[i] = zmq_socket(zctx, ZMQ_DEALER);
		zmq_setsockopt(dealers[i], ZMQ_LINGER, &zero, sizeof(zero));
		zmq_setsockopt(dealers[i], ZMQ_ROUTING_ID, ids[i], strlen(ids[i]));
		if (zmq_connect(dealers[i], ctl_addr))
			FZ_FAIL("zmq_connect %s", ctl_addr);
		dead_fd[i] = dead_port(dead_ep[i], sizeof(dead_ep[i]));
	}
	for (unsigned i = 0; i < 2; i++)
		dealer_proves(i);
	call_c_again();
	fz_settle(eng, 64);
	drain_dealers();
	fz_idle_take(eng, &idle, false); /* ZeroMQ opens and closes its own */
}

static void teardown(void)
{
	if (eng)
		ferry_engine_destroy(eng);
	eng = NULL;
	for (int i = 0; i < 2; i++) {
		if (dealers[i])
			zmq_close(dealers[i]);
		if (dead_fd[i] >= 0)
			close(dead_fd[i]);
	}
	if (zctx)
		zmq_ctx_term(zctx);
}

FZ_INITIALIZE(setup, teardown)

/* The seq of the k-th request of ours sent to peer `name` (table order), or k. */
static uint64_t req_seq(uint64_t k, const char *name)
{
	for (uint32_t i = 0; i < CTL_MAX_REQS; i++) {
		const struct ctl_req *r = &cst->reqs[i];

		if (r->type && r->sent && strcmp(r->peer, name) == 0 && k-- == 0)
			return r->seq;
	}
	return k;
}

static bool mac_zero(const uint8_t *mac)
{
	for (int i = 0; i < SEC_MAC_BYTES; i++)
		if (mac[i])
			return false;
	return true;
}

static void fix_up(uint8_t *m, size_t n, bool caller, unsigned id)
{
	struct ctl_hdr h;
	const struct sec_secret *sec = &cst->secret;

	struct ctl_session *sess = caller ? our_call() : callee_session(ids[id]);

	if (ctl_hdr_check(m, n, &h))
		return;
	if (h.seq < 8 && sess &&
	    (h.type == CTL_HEALTH || h.type == CTL_LOOKUP_ANS || h.type == CTL_FETCH_ANS ||
	     h.type == CTL_CANCEL_ANS)) {
		uint64_t seq = htole64(req_seq(h.seq, sess->peer_name));

		memcpy(m + offsetof(struct ctl_hdr, seq), &seq, sizeof(seq));
	}
	if (!caller && h.type == CTL_AUTH && h.len == sizeof(struct ctl_auth)) {
		struct ctl_session *s = callee_session(ids[id]);
		struct ctl_auth *a = (struct ctl_auth *)(m + CTL_HDR_BYTES);

		if (s && s->state == CS_WAIT_AUTH && mac_zero(a->mac) &&
		    (strcmp(s->peer_name, "fzA") == 0 || strcmp(s->peer_name, "fzB") == 0))
			sec_proof(sec, ROLE_CALLER, s->nonce_peer, s->nonce_me, s->peer_name,
				  FZ_ENGINE, FZ_NS, 0, 0, a->mac);
	}
	if (caller && h.type == CTL_PROOF && h.len == sizeof(struct ctl_proof)) {
		struct ctl_session *s = our_call();
		struct ctl_proof *p = (struct ctl_proof *)(m + CTL_HDR_BYTES);

		if (s && s->state == CS_WAIT_PROOF && mac_zero(p->mac))
			sec_proof(sec, ROLE_CALLEE, s->nonce_me, p->nonce, FZ_ENGINE, s->peer_name,
				  FZ_NS, 0, 0, p->mac);
	}
}

static void deliver(uint8_t *m, size_t n, bool caller, unsigned id, const char *addr)
{
	fix_up(m, n, caller, id);
	if (caller) {
		struct ctl_session *s = our_call();

		if (s && s->sock.z) /* BACKOFF after a refusal: its DEALER is closed */
			ctl_take_dealer_msg(cst, s, m, n);
	} else {
		to_router(id, m, n, addr);
	}
	fz_settle(eng, 16);
}

/* The right handshake first (option bit 1). */
static void shake_hands(bool caller)
{
	uint8_t m[CTL_HDR_BYTES + sizeof(struct ctl_proof) + sizeof(struct ctl_auth)];

	memset(m, 0, sizeof(m));
	if (!caller) {
		hello_from(0, "fzA");
		fz_settle(eng, 16);
		ctl_hdr_pack(m, CTL_AUTH, sizeof(struct ctl_auth), 0);
		deliver(m, CTL_HDR_BYTES + sizeof(struct ctl_auth), false, 0, "127.0.0.1");
	} else {
		struct ctl_proof *p = (struct ctl_proof *)(m + CTL_HDR_BYTES);

		ctl_hdr_pack(m, CTL_PROOF, sizeof(*p), 0);
		snprintf(p->name, sizeof(p->name), "fzC");
		p->caps = htole32(CTL_CAPS);
		memset(p->nonce, 0x44, sizeof(p->nonce));
		deliver(m, CTL_HDR_BYTES + sizeof(*p), true, 0, NULL);
		memset(m, 0, sizeof(m));
		ctl_hdr_pack(m, CTL_OK, sizeof(struct ctl_ok), 0);
		deliver(m, CTL_HDR_BYTES + sizeof(struct ctl_ok), true, 0, NULL);
	}
}

static void ask(unsigned what, bool caller, uint64_t *asked, unsigned *nasked)
{
	struct ferry_peer *to = caller ? peer_c : peer_a;
	struct ferry_sq *sq;
	struct ferry_sqe *sqe;
	uint64_t ud = ++op_seq;

	if (*nasked == MAX_OPS_ASKED)
		return;
	sqe = fz_sqe(eng, &sq);
	switch (what) {
	case 0:
		ferry_prep_peer_health(sqe, to, ud);
		break;
	case 1:
		ferry_prep_lookup(sqe, to, "k1", ud);
		break;
	case 2:
		ferry_prep_lookup(sqe, NULL, "k1", ud);
		break;
	case 3:
		ferry_prep_remote_cancel(sqe, to, "req1", ud);
		break;
	default:
		ferry_prep_fetch(sqe, to, "k1", NULL, 0, ud);
		ferry_sqe_set_flags(sqe, what == 5 ? FERRY_SQE_NOWAIT : 0);
		break;
	}
	ferry_sqe_set_timeout(sqe, 5ull * 1000000000ull);
	ferry_sq_submit(sq);
	asked[(*nasked)++] = ud;
	fz_settle(eng, 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_in in = { data, size };
	uint8_t opt = fz_u8(&in);
	bool caller = opt & 1;
	uint64_t asked[MAX_OPS_ASKED];
	unsigned nasked = 0;

	if (opt & 2)
		shake_hands(caller);
	while (fz_left(&in)) {
		uint8_t r = fz_u8(&in);

		if (r % 4 == 3) {
			ask((unsigned)(r >> 2) % 6, caller, asked, &nasked);
		} else {
			uint16_t len = fz_u16(&in);
			uint8_t *m = malloc(len ? len : 1);
			size_t got = fz_bytes(&in, m, len);

			deliver(m, got, caller, (r >> 2) & 1, (r & 8) ? NULL : "127.0.0.1");
			free(m);
		}
	}
	/* Put everything back as it was. */
	for (unsigned i = 0; i < nasked; i++) {
		struct ferry_sq *sq;
		struct ferry_sqe *sqe = fz_sqe(eng, &sq);

		ferry_prep_cancel(sqe, asked[i], 0);
		ferry_sq_submit(sq);
	}
	bye_from(0);
	bye_from(1);
	call_c_again();
	drain_dealers();
	if (callee_sessions())
		FZ_FAIL("%u callee sessions outlived their BYE", callee_sessions());
	fz_engine_clean(eng, NULL, "", &idle);
	return 0;
}

#else /* !FERRY_HAVE_ZMQ */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "fuzz_ctl: built without libzmq: no control channel to fuzz\n");
	exit(77);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)data;
	(void)size;
	return 0;
}

#endif

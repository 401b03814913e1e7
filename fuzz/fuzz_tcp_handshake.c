/*
 * fuzz/fuzz_tcp_handshake.c - the tcp data path's handshake, both ends:
 * hello_recv, callee_hello, callee_auth, caller_proof and caller_ok in
 * backends/tcp/tcp_handshake.c, with tcp_hello_from_wire and the proofs of
 * control/security.c, fed the hello messages of a peer under the fuzzer's control.
 *
 * Like fuzz_tcp_frames (and for the same reasons) this drives one
 * long-lived engine ("fzh", MANUAL progress) through real loopback
 * connections rather than a function of its own: what a hello may do
 * depends on the state of the connection it arrives on, and the two ends
 * run different code. Each input is one connection:
 *
 *   byte 0, bit 0 clear: we call the engine. Message 1 is our HELLO, then
 *     the engine's answer (PROOF, or NO and a hang-up) is read; message 2 is
 *     our AUTH; if the engine said OK, message 3 goes as data frames.
 *   byte 0, bit 0 set: the engine calls us (a PUT of its to peer "up",
 *     whose address is our listener). Its HELLO is read; message 1 is our
 *     PROOF; its AUTH is read; message 2 is our OK (or NO, or anything);
 *     message 3 goes as data frames.
 *
 * Messages are sizeof(struct tcp_hello) bytes of the input each, sent as
 * they are (wire order is little-endian, as on the machines this runs on);
 * the last may be short, and then the stream ends there. Fix-up, so that
 * the fuzzer gets past the proof: a PROOF or AUTH whose mac is all zero
 * bytes gets the right proof, computed from the nonces and the names and
 * ids the messages carry (the engine's checks of those names are what is
 * fuzzed). After the input the harness hangs up, waits for the engine to
 * hang up too, drops any key the frames stored, and checks that the
 * engine holds no pool block and the process no fd more than before.
 *
 * As in fuzz_tcp_frames, links are freed at the engine's next tick: the
 * per-input leak check is off, LeakSanitizer checks the run at its exit.
 * libFuzzer flags: -detect_leaks=0
 */
#include "tcp_peer.h"

#define FZ_ENGINE "fzh"
#define FZ_UP "up"
#define HELLO_BYTES sizeof(struct tcp_hello)

static struct ferry_engine *eng;
static struct ferry_peer *up;
static char eng_addr[NETADDR_MAX];
static int lfd = -1;
static struct fz_idle idle;
static uint64_t put_seq;

static void setup(void)
{
	struct fz_engine_opts o = { .name = FZ_ENGINE, .listen = "tcp://127.0.0.1:0" };
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	char addr[NETADDR_MAX];

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* One connection per link: the engine calling us opens no more after the first. */
	setenv("FERRY_TCP_CONNS", "1", 1);
	eng = fz_engine(&o);
	if (ferry_engine_address(eng, eng_addr, sizeof(eng_addr)) <= 0)
		FZ_FAIL("no address");
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 16) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &len))
		FZ_FAIL("listener: %s", strerror(errno));
	snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", ntohs(sa.sin_port));
	up = fz_peer(eng, FZ_UP);
	if (ferry_peer_set_address(up, addr))
		FZ_FAIL("address of %s", FZ_UP);
	fz_idle_take(eng, &idle, true);
}

static void teardown(void)
{
	if (eng)
		ferry_engine_destroy(eng);
	eng = NULL;
	if (lfd >= 0)
		close(lfd);
}

FZ_INITIALIZE(setup, teardown)

static bool mac_zero(const struct tcp_hello *h)
{
	for (size_t i = 0; i < sizeof(h->mac); i++)
		if (h->mac[i])
			return false;
	return true;
}

/* The next message of the input (*got: how many bytes of it the input had). */
static void next_msg(struct fz_in *in, struct tcp_hello *h, size_t *got)
{
	*got = fz_bytes(in, h, HELLO_BYTES);
}

/* Read one hello from the engine into h (wire order kept); false if it hung up. */
static bool read_hello(int fd, struct tcp_hello *h)
{
	return fz_recv_all(eng, fd, h, HELLO_BYTES) == 0;
}

/* Add the keys of PUT/RTS frames in p[0..n) to keys. */
static void frame_keys(const uint8_t *p, size_t n, struct fz_keys *keys)
{
	while (n >= TCP_FRAME_BYTES) {
		struct tcp_frame f;

		tcp_frame_unpack(p, &f);
		p += TCP_FRAME_BYTES;
		n -= TCP_FRAME_BYTES;
		if ((f.type == TCP_F_PUT || f.type == TCP_F_RTS) && f.key_len <= n)
			fz_keys_add(keys, p, f.key_len);
		if (f.len > n)
			break;
		p += f.len;
		n -= f.len;
	}
}

/* We call: HELLO, AUTH, frames. Returns the socket (to hang up). */
static int we_call(struct fz_in *in)
{
	struct tcp_hello hello, auth, ans;
	int fd = fz_tcp_connect(eng_addr);
	size_t got;

	next_msg(in, &hello, &got);
	if (fz_send_all(eng, fd, &hello, got) || got < HELLO_BYTES || !read_hello(fd, &ans))
		return fd;
	next_msg(in, &auth, &got);
	if (got == HELLO_BYTES && mac_zero(&auth)) {
		struct tcp_hello h = hello, a = ans;

		tcp_hello_from_wire(&h);
		tcp_hello_from_wire(&a);
		sec_proof(fz_secret(), "ferry-caller", h.nonce, a.nonce, h.name, FZ_ENGINE, h.ns,
			  h.link_id, h.conn_index, auth.mac);
	}
	if (fz_send_all(eng, fd, &auth, got) == 0 && got == HELLO_BYTES)
		read_hello(fd, &ans); /* OK, or NO and a hang-up */
	return fd;
}

/* The engine calls: its HELLO, our PROOF, its AUTH, our OK. Returns our socket, or -1. */
static int it_calls(struct fz_in *in)
{
	struct tcp_hello hello, proof, ans, ok;
	int fd = -1;
	size_t got;

	fz_put(eng, up, "hs", 100, ++put_seq);
	for (int i = 0; i < FZ_ROUNDS && fd < 0; i++) {
		ferry_progress(eng);
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	}
	if (fd < 0)
		FZ_FAIL("the engine did not call");
	if (!read_hello(fd, &hello))
		return fd;
	next_msg(in, &proof, &got);
	if (got == HELLO_BYTES && mac_zero(&proof)) {
		struct tcp_hello h = hello, p = proof;

		tcp_hello_from_wire(&h);
		tcp_hello_from_wire(&p);
		sec_proof(fz_secret(), "ferry-callee", h.nonce, p.nonce, h.name, p.name, h.ns,
			  h.link_id, h.conn_index, proof.mac);
	}
	if (fz_send_all(eng, fd, &proof, got) || got < HELLO_BYTES || !read_hello(fd, &ans))
		return fd;
	next_msg(in, &ok, &got);
	fz_send_all(eng, fd, &ok, got);
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_in in = { data, size };
	struct fz_keys keys;
	uint8_t opt = fz_u8(&in);
	int fd;

	fz_idle_fds(&idle);
	keys.len = 0;
	keys.buf[0] = '\0';
	fd = (opt & 1) ? it_calls(&in) : we_call(&in);
	/* Message 3: data frames, whatever the engine made of the handshake. */
	if (fz_left(&in)) {
		frame_keys(in.p, in.n, &keys);
		if (fz_send_all(eng, fd, in.p, in.n) == 0)
			fz_settle(eng, FZ_ROUNDS);
	}
	if (fz_tcp_hangup(eng, fd))
		FZ_FAIL("the engine did not hang up after our end of the stream");
	fz_engine_clean(eng, NULL, keys.buf, &idle);
	return 0;
}

/*
 * fuzz/fuzz_tcp_frames.c - the tcp data path's frame parser: take_frame()
 * in backends/tcp/tcp_recv.c and the receive path around it (staging, data
 * received straight into a block, stalls, the answers), fed by a peer that
 * proved the cluster secret.
 *
 * Why the real path and not a function of its own: take_frame's checks
 * that matter most are stateful (a CTS must answer an offer of ours, a
 * DATA must lie inside an offer we granted, a RESULT must answer a PUT),
 * and they live in the engine's tables. So each input is one connection
 * to one long-lived engine ("fzt", MANUAL progress, listening on
 * loopback): a real handshake (fuzz/tcp_peer.h), then the input's frames
 * through the socket, as the engine's io_uring receives them. Then the
 * harness hangs up, drops every key the frames may have stored, and checks
 * that the engine hung up too and holds no pool block (FZ_FAIL otherwise).
 * A new engine per input would be cleaner, but costs ~20 ms (45 inputs a
 * second); a connection costs well under a millisecond.
 *
 * Input: one options byte, then frames in wire form (tcp_wire.h): a
 * 32-byte header, then as many body bytes as its len says (fewer when the
 * input ends: the engine waits for the rest and then sees the stream end).
 *   bit 0  the engine first PUTs 100 bytes to us (an eager PUT frame)
 *   bit 1  ... and 100,000 bytes (an offer, RTS; its data follows our CTS)
 *   bit 2  every frame in one send (else frame by frame, the engine driven
 *          until quiet and its frames read after each)
 * Fix-ups, so that the fuzzer can reach the stateful rules: a CTS or
 * RESULT whose cookie is below 8 gets the cookie of the engine's PUT or
 * RTS of that index on this connection, a DATA whose cookie is below 8
 * the receiver slot the engine granted our offer of that index (its CTS).
 * Any other cookie goes as it is.
 *
 * A connection's link is freed at the engine's next tick (250 ms), so
 * nearly every input ends with more mallocs than frees, and libFuzzer then
 * scans the heap for a leak after it (ten times the input's own cost):
 * that per-input check is off, and LeakSanitizer checks the whole run at
 * its exit instead, the engine destroyed (the pool-block and fd checks
 * above still run after every input).
 * libFuzzer flags: -detect_leaks=0
 */
#include "tcp_peer.h"

#define FZ_PEER "fz"
#define FZ_ENGINE "fzt"
#define FZ_EAGER_LEN 100u
#define FZ_RDV_LEN 100000u
#define FZ_COOKIES 8

static struct ferry_engine *eng;
static struct ferry_peer *peer;
static char eng_addr[NETADDR_MAX];
static uint64_t link_seq;
static struct fz_idle idle;

/* What the engine sent us on this connection, parsed as it comes. */
struct from_engine {
	uint8_t hdr[TCP_FRAME_BYTES];
	uint32_t have;     /* bytes of hdr */
	uint64_t skip;     /* body bytes still to skip */
	uint64_t msgs[FZ_COOKIES];  /* its PUTs and RTSs, in order */
	unsigned nmsgs;
	uint64_t slots[FZ_COOKIES]; /* the slots its CTSs granted our offers */
	unsigned nslots;
	bool broken;       /* it sent something that is not a frame */
};

static void from_engine_take(struct from_engine *r, const uint8_t *p, size_t n)
{
	while (n && !r->broken) {
		if (r->skip) {
			size_t k = r->skip < n ? (size_t)r->skip : n;

			r->skip -= k;
			p += k;
			n -= k;
			continue;
		}
		{
			size_t k = TCP_FRAME_BYTES - r->have;

			if (k > n)
				k = n;
			memcpy(r->hdr + r->have, p, k);
			r->have += (uint32_t)k;
			p += k;
			n -= k;
		}
		if (r->have == TCP_FRAME_BYTES) {
			struct tcp_frame f;

			tcp_frame_unpack(r->hdr, &f);
			r->have = 0;
			if (f.magic != TCP_FRAME_MAGIC) {
				r->broken = true;
				break;
			}
			r->skip = f.len;
			if ((f.type == TCP_F_PUT || f.type == TCP_F_RTS) && r->nmsgs < FZ_COOKIES)
				r->msgs[r->nmsgs++] = f.cookie;
			if (f.type == TCP_F_CTS && r->nslots < FZ_COOKIES)
				r->slots[r->nslots++] = f.arg;
		}
	}
}

/* Read what the engine sent (non-blocking). Returns false once it hung up. */
static bool from_engine_read(struct from_engine *r, int fd)
{
	uint8_t buf[16384];

	for (;;) {
		ssize_t k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (k > 0) {
			from_engine_take(r, buf, (size_t)k);
			continue;
		}
		return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
	}
}

static void settle_and_read(struct from_engine *r, int fd)
{
	for (int i = 0; i < 4; i++) {
		fz_settle(eng, FZ_ROUNDS);
		if (!from_engine_read(r, fd))
			return;
	}
}

static void setup(void)
{
	struct fz_engine_opts o = { .name = FZ_ENGINE, .listen = "tcp://127.0.0.1:0" };

	eng = fz_engine(&o);
	peer = fz_peer(eng, FZ_PEER);
	if (ferry_engine_address(eng, eng_addr, sizeof(eng_addr)) <= 0)
		FZ_FAIL("no address");
	fz_idle_take(eng, &idle, true);
}

static void teardown(void)
{
	if (eng)
		ferry_engine_destroy(eng);
	eng = NULL;
}

FZ_INITIALIZE(setup, teardown)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_in in = { data, size };
	struct from_engine r;
	struct fz_keys keys;
	uint8_t opt = fz_u8(&in);
	uint8_t *stream = NULL;
	size_t slen = 0;
	unsigned want_msgs = 0;
	bool alive = true;
	int fd;

	fz_idle_fds(&idle);
	memset(&r, 0, sizeof(r));
	keys.len = 0;
	keys.buf[0] = '\0';
	fd = fz_tcp_call(eng, eng_addr, FZ_PEER, FZ_ENGINE, ++link_seq);
	if (fd < 0)
		FZ_FAIL("the engine refused a caller that proved the secret");
	if (opt & 1) {
		fz_put(eng, peer, "eager", FZ_EAGER_LEN, 1);
		want_msgs++;
	}
	if (opt & 2) {
		fz_put(eng, peer, "offer", FZ_RDV_LEN, 2);
		want_msgs++;
	}
	for (int i = 0; i < 8 && r.nmsgs < want_msgs && alive; i++) {
		fz_settle(eng, FZ_ROUNDS);
		alive = from_engine_read(&r, fd);
	}
	if (opt & 4)
		stream = malloc(size);
	while (fz_left(&in) && alive) {
		uint8_t hdr[TCP_FRAME_BYTES];
		size_t got = fz_bytes(&in, hdr, sizeof(hdr));
		size_t body = 0;

		if (got == sizeof(hdr)) {
			struct tcp_frame f;

			tcp_frame_unpack(hdr, &f);
			if ((f.type == TCP_F_CTS || f.type == TCP_F_RESULT) && f.cookie < r.nmsgs)
				f.cookie = r.msgs[f.cookie];
			else if (f.type == TCP_F_DATA && f.cookie < r.nslots)
				f.cookie = r.slots[f.cookie];
			tcp_frame_pack(hdr, f.type, f.flags, f.key_len, f.len, f.cookie, f.arg);
			/* The pack writes resv as 0: keep the input's (the engine refuses it). */
			memcpy(hdr + 12, in.p - TCP_FRAME_BYTES + 12, 4);
			body = f.len < in.n ? f.len : in.n;
			if ((f.type == TCP_F_PUT || f.type == TCP_F_RTS) && f.key_len <= body)
				fz_keys_add(&keys, in.p, f.key_len);
		}
		if (stream) {
			memcpy(stream + slen, hdr, got);
			memcpy(stream + slen + got, in.p, body);
			slen += got + body;
		} else {
			alive = fz_send_all(eng, fd, hdr, got) == 0 &&
				fz_send_all(eng, fd, in.p, body) == 0;
			if (alive)
				settle_and_read(&r, fd);
		}
		in.p += body;
		in.n -= body;
	}
	if (stream) {
		if (alive && fz_send_all(eng, fd, stream, slen) == 0)
			settle_and_read(&r, fd);
		free(stream);
	}
	if (fz_tcp_hangup(eng, fd))
		FZ_FAIL("the engine did not hang up after our end of the stream");
	fz_engine_clean(eng, peer, keys.buf, &idle);
	return 0;
}

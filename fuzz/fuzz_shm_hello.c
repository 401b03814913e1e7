/*
 * fuzz/fuzz_shm_hello.c - the shm handshake: the hello message and the
 * descriptors attached to it (backends/shm/shm_sock.c recv_hello, then
 * backends/shm/shm_handshake.c accept_hello / shm_call_answered and conn_attach: sizes,
 * seals and kinds of the fds, the pool and ring sizes announced), at both
 * ends of a connection.
 *
 * The harness is a peer of one long-lived engine ("fzh", MANUAL progress)
 * over real unix sockets, the hello sent as raw bytes with the fds the
 * input asks for; each input is one connection:
 *   byte 0, bit 0 clear: we call the engine; our message is the caller's
 *     hello (accept path), and when the engine answers with its own, the
 *     connection is up and we hang up.
 *   byte 0, bit 0 set: the engine calls us (a PUT of its to "fzhl", the
 *     name the harness listens on for this input); its hello is read and
 *     our message answers it (call_answered).
 * Then: a 16-bit length (little-endian, at most 512) and that many bytes:
 * the message, sent as it is (struct shm_hello is 200 bytes); a count byte
 * (% 8: fds to attach, more than SHM_MAX_FDS allowed), and for each fd a
 * kind byte: kind % 8 = a sealed memfd, an unsealed memfd, an eventfd,
 * /dev/null, a pipe, a unix socket, a sealed memfd mapped by the harness
 * (as a pool is), a memfd sealed against growing only; (kind >> 3) % 6
 * picks a memfd's size among 0, 4 KiB, 64 KiB, 1 MiB, the rings' size,
 * 2 MiB. After the input the harness hangs up and checks that the engine
 * holds no pool block and the process no descriptor more than before (every
 * fd of a refused hello closed, every fd of a connection that ended closed).
 */
#include <sys/un.h>

#include "shm_peer.h"

#define FZ_ENGINE "fzh"
#define FZ_LISTEN "fzhl"
#define MSG_MAX 512
#define FDS_MAX 8

static struct ferry_engine *eng;
static struct ferry_peer *peer_l;
static struct fz_idle idle;
static uint64_t op_seq;

static void setup(void)
{
	struct fz_engine_opts o = { .name = FZ_ENGINE, .pool = 4u << 20 };

	eng = fz_engine(&o);
	peer_l = fz_peer(eng, FZ_LISTEN);
	fz_settle(eng, 16);
	fz_idle_take(eng, &idle, true);
}

static void teardown(void)
{
	if (eng)
		ferry_engine_destroy(eng);
	eng = NULL;
}

FZ_INITIALIZE(setup, teardown)

static const size_t sizes[6] = { 0, 4096, 65536, 1u << 20, SHM_RINGS_BYTES, 2u << 20 };

/* One fd of the kind the input names; *extra: a second fd to close after (pipe, socket). */
static int make_fd(uint8_t kind, int *extra)
{
	size_t size = sizes[(kind >> 3) % 6];
	int fd = -1, pair[2];

	*extra = -1;
	switch (kind % 8) {
	case 0:
		return fz_memfd("fz-hello", size, true);
	case 1:
		return fz_memfd("fz-hello", size, false);
	case 2:
		return eventfd(0, EFD_CLOEXEC);
	case 3:
		return open("/dev/null", O_RDONLY | O_CLOEXEC);
	case 4:
		if (pipe2(pair, O_CLOEXEC))
			return -1;
		*extra = pair[1];
		return pair[0];
	case 5:
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair))
			return -1;
		*extra = pair[1];
		return pair[0];
	case 6: {
		void *p;

		fd = fz_memfd("fz-hello-pool", size, true);
		if (size) {
			p = fz_map(fd, size);
			memset(p, 0x5c, size < 65536 ? size : 65536);
			munmap(p, size);
		}
		return fd;
	}
	default:
		fd = memfd_create("fz-hello", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd >= 0 && (ftruncate(fd, (off_t)size) || fcntl(fd, F_ADD_SEALS, F_SEAL_GROW)))
			FZ_FAIL("memfd: %s", strerror(errno));
		return fd;
	}
}

/* Wait, driving the engine, for a connection on the listener. */
static int accept_call(int lfd)
{
	int fd = -EAGAIN;

	for (int i = 0; i < FZ_SHM_ROUNDS && fd == -EAGAIN; i++) {
		ferry_progress(eng);
		fd = shm_sock_accept(lfd);
	}
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_in in = { data, size };
	uint8_t opt = fz_u8(&in), msg[MSG_MAX];
	uint16_t len = fz_u16(&in);
	unsigned nfds;
	int fds[FDS_MAX], extra[FDS_MAX], sock = -1;
	struct shm_listener lis;
	struct shm_hello back;
	bool called = opt & 1;

	fz_idle_fds(&idle);
	if (len > MSG_MAX)
		len = MSG_MAX;
	len = (uint16_t)fz_bytes(&in, msg, len);
	nfds = fz_u8(&in) % FDS_MAX;
	for (unsigned i = 0; i < nfds; i++) {
		fds[i] = make_fd(fz_u8(&in), &extra[i]);
		if (fds[i] < 0)
			FZ_FAIL("fd of kind %u: %s", i, strerror(errno));
	}

	memset(&lis, 0, sizeof(lis));
	if (!called) {
		sock = shm_sock_connect(FZ_NS, FZ_ENGINE);
		if (sock < 0)
			FZ_FAIL("connect to %s: %s", FZ_ENGINE, ferry_strerror(sock));
	} else {
		int lfd = shm_sock_listen(FZ_NS, FZ_LISTEN, &lis);

		if (lfd < 0)
			FZ_FAIL("listen as %s: %s", FZ_LISTEN, ferry_strerror(lfd));
		fz_put(eng, peer_l, "hello", 100, ++op_seq);
		sock = accept_call(lfd);
		if (sock < 0)
			FZ_FAIL("the engine did not call %s: %s", FZ_LISTEN, ferry_strerror(sock));
		if (fz_shm_await_hello(eng, sock, &back))
			FZ_FAIL("the engine's call came without its hello");
	}
	/* Our message; the kernel gave the engine its own copies of the fds. */
	if (fz_send_msg(sock, msg, len, fds, nfds) == 0) {
		if (!called)
			fz_shm_await_hello(eng, sock, &back); /* up, or refused: either way */
		fz_settle(eng, FZ_SHM_ROUNDS);
	}
	for (unsigned i = 0; i < nfds; i++) {
		close(fds[i]);
		if (extra[i] >= 0)
			close(extra[i]);
	}
	close(sock);
	if (called) {
		/*
		 * The engine's peer fzhl keeps the connection it resolved to until
		 * the next PUT there finds it dead: with nobody listening now, make
		 * that PUT (it fails), so that what the connection held is let go.
		 */
		fz_settle(eng, FZ_SHM_ROUNDS);
		shm_sock_unlisten(&lis);
		fz_put(eng, peer_l, "again", 8, ++op_seq);
	}
	fz_engine_clean(eng, NULL, "", &idle);
	return 0;
}

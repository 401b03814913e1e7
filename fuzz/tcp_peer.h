/*
 * fuzz/tcp_peer.h - the far end of a real tcp connection to a harness's
 * engine (private to fuzz/).
 *
 * Owns: connecting to the engine's listener on loopback, sending and
 * receiving with the engine driven in between (the engine runs MANUAL on
 * the harness's thread, so a wait for its answer is a loop of rounds and
 * non-blocking reads, bounded), and the handshake of security.h done right
 * (HELLO, the engine's PROOF, AUTH with the proof computed from the cluster
 * secret, OK), so that a harness can hand the engine frames from a peer
 * that proved the secret, as the data path sees them.
 */
#ifndef FERRY_FUZZ_TCP_PEER_H
#define FERRY_FUZZ_TCP_PEER_H

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "harness.h"
#include "netaddr.h"
#include "security.h"
#include "tcp_wire.h"

#define FZ_ROUNDS 256 /* engine rounds a wait for an answer may take */

/* A connected, non-blocking socket to endpoint addr; aborts if it cannot be made. */
static inline int fz_tcp_connect(const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, one = 1;

	if (netaddr_parse(addr, true, &ss, &len))
		FZ_FAIL("address %s", addr);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		FZ_FAIL("socket: %s", strerror(errno));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/*
	 * The listener's backlog takes it at once: the engine accepts later.
	 * Ports in TIME_WAIT (one per input) are reused on loopback; should
	 * none be free for a moment, wait.
	 */
	for (int tries = 0; connect(fd, (struct sockaddr *)&ss, len) < 0; tries++) {
		if ((errno != EADDRNOTAVAIL && errno != EINTR) || tries == 5000)
			FZ_FAIL("connect %s: %s", addr, strerror(errno));
		usleep(1000);
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

/*
 * Send all n bytes, driving e while the socket is full. Returns 0, or -1
 * when the engine hung up or stopped reading (FZ_ROUNDS rounds without room).
 */
static inline int fz_send_all(struct ferry_engine *e, int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	int stuck = 0;

	while (n) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k > 0) {
			b += k;
			n -= (size_t)k;
			stuck = 0;
			continue;
		}
		if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -1;
		if (++stuck > FZ_ROUNDS)
			return -1;
		ferry_progress(e);
	}
	return 0;
}

/*
 * Read exactly n bytes, driving e until they come. Returns 0, or -1 when
 * the engine hung up or said nothing for FZ_ROUNDS rounds.
 */
static inline int fz_recv_all(struct ferry_engine *e, int fd, void *p, size_t n)
{
	uint8_t *b = p;
	int idle = 0;

	while (n) {
		ssize_t k = recv(fd, b, n, MSG_DONTWAIT);

		if (k > 0) {
			b += k;
			n -= (size_t)k;
			idle = 0;
			continue;
		}
		if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			return -1;
		if (++idle > FZ_ROUNDS)
			return -1;
		ferry_progress(e);
	}
	return 0;
}

static inline void fz_hello_init(struct tcp_hello *h, uint16_t type, const char *name)
{
	memset(h, 0, sizeof(*h));
	h->magic = TCP_HELLO_MAGIC;
	h->version = TCP_PROTO_VERSION;
	h->type = type;
	h->caps = TCP_CAPS;
	snprintf(h->ns, sizeof(h->ns), "%s", FZ_NS);
	snprintf(h->name, sizeof(h->name), "%s", name);
}

/* The secret every harness engine holds (sec_secret_load is cheap, but once is enough). */
static inline const struct sec_secret *fz_secret(void)
{
	static struct sec_secret s;

	if (!s.set && sec_secret_load(&s, FZ_SECRET, NULL))
		FZ_FAIL("secret");
	return &s;
}

/*
 * Call engine e (named callee, listening at addr) as `name`, connection 0
 * of 1 of link link_id, and prove the secret. Returns the connected socket
 * (non-blocking), or -1 if the engine refused (it should not).
 */
static inline int fz_tcp_call(struct ferry_engine *e, const char *addr, const char *name,
			      const char *callee, uint64_t link_id)
{
	uint8_t nc[TCP_NONCE_BYTES];
	struct tcp_hello h, in;
	int fd = fz_tcp_connect(addr);

	memset(nc, 0x17, sizeof(nc)); /* any nonce does: the callee's is fresh */
	fz_hello_init(&h, TCP_H_HELLO, name);
	h.nconns = 1;
	h.link_id = link_id;
	memcpy(h.nonce, nc, sizeof(nc));
	tcp_hello_to_wire(&h);
	if (fz_send_all(e, fd, &h, sizeof(h)) || fz_recv_all(e, fd, &in, sizeof(in)))
		goto refused;
	tcp_hello_from_wire(&in);
	if (in.type != TCP_H_PROOF)
		goto refused;
	fz_hello_init(&h, TCP_H_AUTH, name);
	sec_proof(fz_secret(), "ferry-caller", nc, in.nonce, name, callee, FZ_NS, link_id, 0,
		  h.mac);
	tcp_hello_to_wire(&h);
	if (fz_send_all(e, fd, &h, sizeof(h)) || fz_recv_all(e, fd, &in, sizeof(in)))
		goto refused;
	tcp_hello_from_wire(&in);
	if (in.type != TCP_H_OK)
		goto refused;
	return fd;
refused:
	close(fd);
	return -1;
}

/*
 * Hang up: our end first, then the engine must see it and hang up too
 * (its end of the stream comes, within FZ_ROUNDS * 8 rounds), then close.
 * Returns 0, or -1 if the engine kept the connection open.
 */
static inline int fz_tcp_hangup(struct ferry_engine *e, int fd)
{
	uint8_t sink[4096];
	int rounds = 0, rc = -1;

	shutdown(fd, SHUT_WR);
	while (rounds < FZ_ROUNDS * 8) {
		ssize_t k = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);

		bool ended = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
					errno != EINTR);

		if (ended) {
			rc = 0;
			break;
		}
		if (k < 0) {
			ferry_progress(e);
			rounds++;
		}
	}
	close(fd);
	return rc;
}

#endif

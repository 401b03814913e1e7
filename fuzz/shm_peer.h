/*
 * fuzz/shm_peer.h - the far end of a shm connection to a harness's engine
 * (private to fuzz/), written by hand as tests/test_shm_hostile.c does:
 * the memory a peer hands over (a pool memfd, a wake page, a doorbell
 * eventfd, the rings), sending a hello as raw bytes with any fds attached,
 * and waiting, the engine driven, for the engine's hello on a socket.
 */
#ifndef FERRY_FUZZ_SHM_PEER_H
#define FERRY_FUZZ_SHM_PEER_H

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "harness.h"
#include "shm_sock.h"
#include "shm_wire.h"

#define FZ_SHM_ROUNDS 256 /* engine rounds a wait for the engine's hello may take */

/* A memfd of size bytes, sealed against shrinking and growing when sealed. */
static inline int fz_memfd(const char *name, size_t size, bool sealed)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
	    (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0))
		FZ_FAIL("memfd %s of %zu bytes: %s", name, size, strerror(errno));
	return fd;
}

static inline void *fz_map(int fd, size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		FZ_FAIL("mmap of %zu bytes: %s", size, strerror(errno));
	return p;
}

/* Send n bytes as one message with fds[0..nfds) attached (SCM_RIGHTS). 0 or -errno. */
static inline int fz_send_msg(int sock, const void *p, size_t n, const int *fds, unsigned nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)p, .iov_len = n };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > 16)
		nfds = 16;
	if (nfds) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	return sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 ? -errno : 0;
}

/*
 * Wait, driving e, for a hello on sock (fds received are closed). Returns
 * 0 and *h, or the error of shm_sock_try_recv_hello (-EAGAIN: none came).
 */
static inline int fz_shm_await_hello(struct ferry_engine *e, int sock, struct shm_hello *h)
{
	int fds[SHM_MAX_FDS], rc = -EAGAIN;
	unsigned nfds = 0;

	for (int i = 0; i < FZ_SHM_ROUNDS && rc == -EAGAIN; i++) {
		ferry_progress(e);
		nfds = SHM_MAX_FDS;
		rc = shm_sock_try_recv_hello(sock, h, fds, &nfds);
	}
	for (unsigned i = 0; rc == 0 && i < nfds; i++)
		close(fds[i]);
	return rc;
}

#endif

/*
 * engine/errors.c - result codes to text: ferry_strerror and ferry_err_name.
 *
 * Owns: the one list (an X-macro) of the errno values ferry returns, with
 * the meaning ferry gives each (every code api/ferry.h documents is in it;
 * test_engine checks that against the header). Other errno values fall
 * back to the C library's text and name; anything else (INT_MIN too) is
 * "unknown error" / "UNKNOWN".
 */
#include <errno.h>
#include <string.h>

#include "ferry.h"

#define FERRY_ERRNO_MAP(X)                                                              \
	X(EPERM, "operation not permitted")                                             \
	X(ENOENT, "no such op or key")                                                  \
	X(EINTR, "interrupted (woken by ferry_cq_wake)")                                \
	X(EIO, "input/output error")                                                    \
	X(EBADF, "bad file descriptor")                                                 \
	X(EAGAIN, "not there yet (NOWAIT), try again")                                  \
	X(ENOMEM, "out of memory: the pool or a fixed-size table is exhausted")         \
	X(EACCES, "refused: the peer did not prove the cluster secret (or we did not "  \
		  "prove ours)")                                                        \
	X(EFAULT, "internal consistency check failed")                                  \
	X(EFBIG, "file too large (a stage file over 10 MiB)")                           \
	X(EBUSY, "busy: poll again, or the object is still in use")                     \
	X(EEXIST, "key already live at the destination (use REPLACE)")                  \
	X(EINVAL, "invalid argument")                                                   \
	X(EMFILE, "too many open files")                                                \
	X(ENOBUFS, "no buffer room: the receiver's pool is full, or too many PUTs away") \
	X(ENOSPC, "no room: the destination's key table is full")                       \
	X(EPIPE, "peer went away")                                                      \
	X(ERANGE, "value out of range")                                                 \
	X(ENAMETOOLONG, "name or key too long")                                         \
	X(ENOSYS, "not implemented")                                                    \
	X(EBADMSG, "malformed message")                                                 \
	X(EOPNOTSUPP, "operation not supported")                                        \
	X(ENODEV, "no such device: no CUDA runtime or GPU (health says why)")           \
	X(EMSGSIZE, "payload larger than the destination buffer")                       \
	X(EPROTO, "protocol error")                                                     \
	X(EPROTONOSUPPORT, "transport or protocol not supported (not built, or another " \
			   "protocol version)")                                         \
	X(EADDRINUSE, "name already live in this namespace")                            \
	X(EADDRNOTAVAIL, "address not available on this host")                          \
	X(ENETDOWN, "network is down")                                                  \
	X(ENETUNREACH, "network unreachable")                                           \
	X(ECONNABORTED, "connection aborted")                                           \
	X(ECONNRESET, "peer went away (connection reset)")                              \
	X(ENOTCONN, "no session with that peer (connect it first)")                     \
	X(ESHUTDOWN, "engine is shutting down")                                         \
	X(ETIMEDOUT, "deadline passed")                                                 \
	X(ECONNREFUSED, "connection refused")                                           \
	X(EHOSTUNREACH, "no engine of that name is reachable")                          \
	X(EALREADY, "operation already in progress")                                    \
	X(ECANCELED, "cancelled")

/* |err| without the overflow of -INT_MIN. */
static unsigned err_abs(int err)
{
	return err < 0 ? 0u - (unsigned)err : (unsigned)err;
}

const char *ferry_strerror(int err)
{
	unsigned code = err_abs(err);
	const char *libc;

	if (code == 0)
		return "success";
	switch (code) {
#define X(c, text) case c: return text;
		FERRY_ERRNO_MAP(X)
#undef X
	default:
		/* glibc's own text for any other errno: a constant, thread-safe. */
		libc = code <= 4095 ? strerrordesc_np((int)code) : NULL;
		return libc ? libc : "unknown error";
	}
}

const char *ferry_err_name(int err)
{
	unsigned code = err_abs(err);
	const char *libc;

	if (code == 0)
		return "OK";
	switch (code) {
#define X(c, text) case c: return #c;
		FERRY_ERRNO_MAP(X)
#undef X
	default:
		libc = code <= 4095 ? strerrorname_np((int)code) : NULL;
		return libc ? libc : "UNKNOWN";
	}
}

/*
 * engine/errors.c - result codes to text: ferry_strerror and ferry_err_name.
 *
 * Owns: the one list (an X-macro) of the errno values ferry returns, with
 * the meaning ferry gives each. Codes outside the list fall back to the C
 * library's text.
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
	X(EFAULT, "internal consistency check failed")                                  \
	X(EBUSY, "busy: poll again, or the object is still in use")                     \
	X(EEXIST, "key already live at the destination (use REPLACE)")                  \
	X(EINVAL, "invalid argument")                                                   \
	X(EMFILE, "too many open files")                                                \
	X(ENOBUFS, "no buffer room: the receiver's pool is full, or too many PUTs away") \
	X(ENOSPC, "no room: the destination's key table is full")                       \
	X(EPIPE, "peer went away")                                                      \
	X(ENAMETOOLONG, "name or key too long")                                         \
	X(ENOSYS, "not implemented")                                                    \
	X(EOPNOTSUPP, "operation not supported")                                        \
	X(EMSGSIZE, "payload larger than the destination buffer")                       \
	X(EPROTO, "protocol error")                                                     \
	X(EADDRINUSE, "name already live in this namespace")                            \
	X(ENETDOWN, "network is down")                                                  \
	X(ECONNRESET, "peer went away (connection reset)")                              \
	X(ESHUTDOWN, "engine is shutting down")                                         \
	X(ETIMEDOUT, "deadline passed")                                                 \
	X(EHOSTUNREACH, "no engine of that name is reachable")                          \
	X(EALREADY, "operation already in progress")                                    \
	X(ECANCELED, "cancelled")

const char *ferry_strerror(int err)
{
	if (err == 0)
		return "success";
	if (err < 0)
		err = -err;
	switch (err) {
#define X(code, text) case code: return text;
		FERRY_ERRNO_MAP(X)
#undef X
	default:
		return "unknown error";
	}
}

const char *ferry_err_name(int err)
{
	if (err == 0)
		return "OK";
	if (err < 0)
		err = -err;
	switch (err) {
#define X(code, text) case code: return #code;
		FERRY_ERRNO_MAP(X)
#undef X
	default:
		return "UNKNOWN";
	}
}

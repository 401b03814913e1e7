/*
 * backends/tcp/netaddr.h - endpoints as users write them (private to the
 * tcp transport).
 *
 * Owns: parsing "tcp://HOST:PORT" (HOST an IPv4 address, a bracketed IPv6
 * address, a host name, or * for every interface) into a socket address,
 * and writing a socket address back in that form.
 */
#ifndef FERRY_NETADDR_H
#define FERRY_NETADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* The longest endpoint text, incl. NUL. */
#define NETADDR_MAX 128

/*
 * Parse endpoint into *ss / *len. numeric: refuse host names (no DNS: the
 * reactor must not block). Returns 0, or -EINVAL (logged) for anything
 * that is not tcp://HOST:PORT with PORT in 0..65535.
 */
int netaddr_parse(const char *endpoint, bool numeric, struct sockaddr_storage *ss,
		   socklen_t *len);
/*
 * A peer's endpoint, for caller (a public function's name, for the log):
 * netaddr_parse (names looked up), and a port is required. 0 or -EINVAL
 * (logged).
 */
int netaddr_parse_peer(const char *caller, const char *endpoint, struct sockaddr_storage *ss,
			socklen_t *len);

/* "tcp://HOST:PORT" of sa into buf; snprintf-like return. */
int netaddr_format(const struct sockaddr *sa, char *buf, size_t len);

/* Is this address a loopback one (127/8, ::1, v4-mapped 127/8)? */
bool netaddr_is_loopback(const struct sockaddr *sa);

#endif

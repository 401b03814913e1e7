/*
 * backends/tcp/tcp_addr.h - endpoints as users write them (private to the
 * tcp transport).
 *
 * Owns: parsing "tcp://HOST:PORT" (HOST an IPv4 address, a bracketed IPv6
 * address, a host name, or * for every interface) into a socket address,
 * and writing a socket address back in that form.
 */
#ifndef FERRY_TCP_ADDR_H
#define FERRY_TCP_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* The longest endpoint text, incl. NUL. */
#define TCP_ADDR_MAX 128

/*
 * Parse endpoint into *ss / *len. numeric: refuse host names (no DNS: the
 * reactor must not block). Returns 0, or -EINVAL (logged) for anything
 * that is not tcp://HOST:PORT with PORT in 0..65535.
 */
int tcp_addr_parse(const char *endpoint, bool numeric, struct sockaddr_storage *ss,
		   socklen_t *len);
/*
 * A peer's endpoint, for caller (a public function's name, for the log):
 * tcp_addr_parse (names looked up), and a port is required. 0 or -EINVAL
 * (logged).
 */
int tcp_addr_parse_peer(const char *caller, const char *endpoint, struct sockaddr_storage *ss,
			socklen_t *len);

/* "tcp://HOST:PORT" of sa into buf; snprintf-like return. */
int tcp_addr_format(const struct sockaddr *sa, char *buf, size_t len);

#endif

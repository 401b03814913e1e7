/*
 * backends/tcp/tcp_auth.h - the cluster secret and the proofs of holding it
 * (private to the tcp transport).
 *
 * Owns: finding the secret (parameter, $FERRY_SECRET, a file), fresh nonces,
 * the HMAC-SHA256 proofs both sides of a handshake exchange, their
 * constant-time check, the byte order of the hello message, and the rule
 * for engines without a secret (loopback peers only).
 *
 * The handshake (tcp.c drives it over non-blocking sockets):
 *   caller -> callee  HELLO  names, namespace, link, nonce Nc
 *   callee -> caller  PROOF  names, nonce Ns, HMAC(K, "ferry-callee" | Nc | Ns | ids)
 *   caller -> callee  AUTH   HMAC(K, "ferry-caller" | Nc | Ns | ids)
 *   callee -> caller  OK, or NO with an errno
 * where ids = caller name, callee name, namespace, link id, connection
 * index. Each side checks the other's proof before it sends or takes a
 * key or a byte of data; the caller checks the callee's proof before it
 * shows its own. Nonces are 32 fresh random bytes per connection, so a
 * recorded proof is worth nothing later.
 */
#ifndef FERRY_TCP_AUTH_H
#define FERRY_TCP_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "tcp_wire.h"

#define TCP_SECRET_MAX 4096

struct tcp_secret {
	bool set;     /* false: no secret, loopback peers only */
	size_t len;
	uint8_t key[TCP_SECRET_MAX];
	char source[64]; /* where it came from, for the logs */
};

/*
 * Find the secret: param, else $FERRY_SECRET, else the file at path (its
 * content, one trailing newline dropped), else none. Returns 0, or a
 * negative errno (an unreadable or empty file, one larger than
 * TCP_SECRET_MAX), logged.
 */
int tcp_secret_load(struct tcp_secret *s, const char *param, const char *path);

/* Fill n bytes with fresh random bytes. 0 or -EIO. */
int tcp_nonce(uint8_t *out, size_t n);

/* The proof a side sends: role "ferry-caller" or "ferry-callee". */
void tcp_proof(const struct tcp_secret *s, const char *role, const uint8_t nc[TCP_NONCE_BYTES],
	       const uint8_t ns[TCP_NONCE_BYTES], const char *caller, const char *callee,
	       const char *ns_name, uint64_t link_id, uint16_t conn_index,
	       uint8_t out[TCP_MAC_BYTES]);

/* Constant-time comparison of two proofs. */
bool tcp_proof_equal(const uint8_t a[TCP_MAC_BYTES], const uint8_t b[TCP_MAC_BYTES]);

/* Hello to and from its wire form (in place); from_wire also NUL-terminates names. */
void tcp_hello_to_wire(struct tcp_hello *h);
void tcp_hello_from_wire(struct tcp_hello *h);

/* Is this address a loopback one (127/8, ::1, v4-mapped 127/8)? */
bool tcp_addr_is_loopback(const struct sockaddr *sa);

#endif

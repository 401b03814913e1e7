/*
 * control/security.h - the one security policy of every engine: the cluster
 * secret, the proofs of holding it, and the rule without one.
 *
 * Owns: finding the secret (parameter, $FERRY_SECRET, a file), fresh nonces,
 * the HMAC-SHA256 proofs both sides of a handshake exchange (the data path's
 * and the control channel's, each with roles of its own), their
 * constant-time check, and the rule for engines without a secret: loopback
 * peers only, served and called (sec_peer_allowed). The tcp transport, the
 * control channel and every later transport take their trust from here.
 *
 * A handshake (tcp_handshake.c and ctl_hello.c drive theirs over non-blocking sockets):
 *   caller -> callee  HELLO  names, namespace, link, nonce Nc
 *   callee -> caller  PROOF  names, nonce Ns, HMAC(K, role-callee | Nc | Ns | ids)
 *   caller -> callee  AUTH   HMAC(K, role-caller | Nc | Ns | ids)
 *   callee -> caller  OK, or NO with an errno (a caller that found the
 *                     callee's proof wrong says NO too, before it hangs up)
 * where ids = caller name, callee name, namespace, link id, connection
 * index. Each side checks the other's proof before it sends or takes a
 * key or a byte of data; the caller checks the callee's proof before it
 * shows its own. Nonces are 32 fresh random bytes per connection, so a
 * recorded proof is worth nothing later.
 */
#ifndef FERRY_SECURITY_H
#define FERRY_SECURITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define SEC_SECRET_MAX 4096
#define SEC_NONCE_BYTES 32
#define SEC_MAC_BYTES 32 /* HMAC-SHA256 */

struct sec_secret {
	bool set;     /* false: no secret, loopback peers only */
	size_t len;
	uint8_t key[SEC_SECRET_MAX];
	char source[64]; /* where it came from, for the logs */
};

/*
 * Find the secret: param, else $FERRY_SECRET, else the file at path (its
 * content, one trailing newline dropped), else none. Returns 0, or a
 * negative errno (an unreadable or empty file, one larger than
 * SEC_SECRET_MAX), logged.
 */
int sec_secret_load(struct sec_secret *s, const char *param, const char *path);

/* The liveness bounds when the engine's parameters leave them 0. */
#define SEC_DEFAULT_HEARTBEAT_MS 1000
#define SEC_DEFAULT_PEER_TIMEOUT_MS 10000

struct ferry_engine_params;

/*
 * What every layer that calls peers takes from the engine's parameters
 * (p may be NULL, or older than these fields): the cluster secret
 * (params.secret, $FERRY_SECRET, params.secret_file: sec_secret_load) and
 * the liveness bounds, in ns (params.heartbeat_ms and peer_timeout_ms, 0:
 * the defaults above). 0, or the error of sec_secret_load (logged).
 */
int sec_engine_params(const struct ferry_engine_params *p, struct sec_secret *s,
		      uint64_t *heartbeat_ns, uint64_t *peer_timeout_ns);

/* Fill n bytes with fresh random bytes. 0 or -EIO. */
int sec_nonce(uint8_t *out, size_t n);

/* The proof a side sends, for its role (each channel has its own pair). */
void sec_proof(const struct sec_secret *s, const char *role, const uint8_t nc[SEC_NONCE_BYTES],
	       const uint8_t ns[SEC_NONCE_BYTES], const char *caller, const char *callee,
	       const char *ns_name, uint64_t link_id, uint16_t conn_index,
	       uint8_t out[SEC_MAC_BYTES]);

/* Constant-time comparison of two proofs. */
bool sec_proof_equal(const uint8_t a[SEC_MAC_BYTES], const uint8_t b[SEC_MAC_BYTES]);

/*
 * The rule without a secret: may an engine with secret s serve or call the
 * peer at sa (NULL: an address not known)? Yes if it has a secret, else
 * only a loopback address. Every place that accepts, calls, listens or is
 * given an address asks this.
 */
bool sec_peer_allowed(const struct sec_secret *s, const struct sockaddr *sa);

/* Warn (once per call) that engine has no secret, when s has none. */
void sec_note_no_secret(const struct sec_secret *s, const char *engine);

#endif

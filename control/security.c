/*
 * control/security.c - the cluster secret, the handshake proofs, and the
 * rule for engines without a secret.
 *
 * Owns: what security.h declares. HMAC-SHA256, the random nonces and the
 * constant-time compare come from OpenSSL's libcrypto (HMAC, RAND_bytes,
 * CRYPTO_memcmp): no cryptography is written here.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "ferry.h"
#include "log.h"
#include "netaddr.h"
#include "security.h"

static int secret_from_file(struct sec_secret *s, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	size_t got = 0;

	if (fd < 0) {
		int rc = -errno;

		log_error("secret file %s: %s", path, strerror(-rc));
		return rc;
	}
	while (got < sizeof(s->key) && (n = read(fd, s->key + got, sizeof(s->key) - got)) > 0)
		got += (size_t)n;
	/* One more byte means the file is too large. */
	{
		uint8_t extra;

		n = got == sizeof(s->key) ? read(fd, &extra, 1) : 0;
	}
	close(fd);
	if (n > 0) {
		log_error("secret file %s is larger than %d bytes", path, SEC_SECRET_MAX);
		return -EFBIG;
	}
	if (got && s->key[got - 1] == '\n')
		got--;
	if (!got) {
		log_error("secret file %s is empty", path);
		return -EINVAL;
	}
	s->len = got;
	s->set = true;
	snprintf(s->source, sizeof(s->source), "file");
	return 0;
}

int sec_secret_load(struct sec_secret *s, const char *param, const char *path)
{
	const char *env = getenv("FERRY_SECRET");
	const char *text = NULL;

	memset(s, 0, sizeof(*s));
	if (param) {
		text = param;
		snprintf(s->source, sizeof(s->source), "parameters");
	} else if (env && *env) {
		text = env;
		snprintf(s->source, sizeof(s->source), "FERRY_SECRET");
	} else if (path) {
		return secret_from_file(s, path);
	} else {
		snprintf(s->source, sizeof(s->source), "none");
		return 0;
	}
	s->len = strlen(text);
	if (s->len == 0 || s->len > sizeof(s->key)) {
		log_error("tcp: the secret from %s is %s", s->source,
			  s->len ? "longer than 4096 bytes" : "empty");
		return -EINVAL;
	}
	memcpy(s->key, text, s->len);
	s->set = true;
	return 0;
}

int sec_engine_params(const struct ferry_engine_params *p, struct sec_secret *s,
		      uint64_t *heartbeat_ns, uint64_t *peer_timeout_ns)
{
	bool has = p && p->size > offsetof(struct ferry_engine_params, listen);
	uint64_t hb = has ? p->heartbeat_ms : 0, to = has ? p->peer_timeout_ms : 0;

	*heartbeat_ns = (hb ? hb : SEC_DEFAULT_HEARTBEAT_MS) * 1000000ull;
	*peer_timeout_ns = (to ? to : SEC_DEFAULT_PEER_TIMEOUT_MS) * 1000000ull;
	return sec_secret_load(s, has ? p->secret : NULL, has ? p->secret_file : NULL);
}

int sec_nonce(uint8_t *out, size_t n)
{
	if (RAND_bytes(out, (int)n) != 1) {
		log_error("tcp: no random bytes for a nonce");
		return -EIO;
	}
	return 0;
}

void sec_proof(const struct sec_secret *s, const char *role, const uint8_t nc[SEC_NONCE_BYTES],
	       const uint8_t ns[SEC_NONCE_BYTES], const char *caller, const char *callee,
	       const char *ns_name, uint64_t link_id, uint16_t conn_index,
	       uint8_t out[SEC_MAC_BYTES])
{
	/* Fixed-width fields: no two different inputs serialize the same. */
	uint8_t msg[16 + 2 * SEC_NONCE_BYTES + 3 * FERRY_NAME_MAX + 8 + 2];
	uint64_t lid = htole64(link_id);
	uint16_t ci = htole16(conn_index);
	unsigned int mdlen = SEC_MAC_BYTES;
	size_t o = 0;

	memset(msg, 0, sizeof(msg));
	strncpy((char *)msg, role, 16);
	o = 16;
	memcpy(msg + o, nc, SEC_NONCE_BYTES);
	o += SEC_NONCE_BYTES;
	memcpy(msg + o, ns, SEC_NONCE_BYTES);
	o += SEC_NONCE_BYTES;
	strncpy((char *)msg + o, caller, FERRY_NAME_MAX);
	o += FERRY_NAME_MAX;
	strncpy((char *)msg + o, callee, FERRY_NAME_MAX);
	o += FERRY_NAME_MAX;
	strncpy((char *)msg + o, ns_name, FERRY_NAME_MAX);
	o += FERRY_NAME_MAX;
	memcpy(msg + o, &lid, 8);
	o += 8;
	memcpy(msg + o, &ci, 2);
	if (!HMAC(EVP_sha256(), s->key, (int)s->len, msg, sizeof(msg), out, &mdlen))
		memset(out, 0, SEC_MAC_BYTES); /* never matches a real proof by chance */
}

bool sec_proof_equal(const uint8_t a[SEC_MAC_BYTES], const uint8_t b[SEC_MAC_BYTES])
{
	return CRYPTO_memcmp(a, b, SEC_MAC_BYTES) == 0;
}

bool sec_peer_allowed(const struct sec_secret *s, const struct sockaddr *sa)
{
	return s->set || (sa && netaddr_is_loopback(sa));
}

void sec_note_no_secret(const struct sec_secret *s, const char *engine)
{
	if (!s->set)
		log_warn("engine %s has no cluster secret: peers prove nothing (loopback only; set "
			 "params.secret, FERRY_SECRET or params.secret_file)", engine);
}

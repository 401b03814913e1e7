/*
 * backends/tcp/tcp_auth.c - the cluster secret and the handshake proofs.
 *
 * Owns: what tcp_auth.h declares. HMAC-SHA256, the random nonces and the
 * constant-time compare come from OpenSSL's libcrypto (HMAC, RAND_bytes,
 * CRYPTO_memcmp): no cryptography is written here.
 */
#include <endian.h>
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

#include "log.h"
#include "tcp_auth.h"

static int secret_from_file(struct tcp_secret *s, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	size_t got = 0;

	if (fd < 0) {
		int rc = -errno;

		log_error("tcp: secret file %s: %s", path, strerror(-rc));
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
		log_error("tcp: secret file %s is larger than %d bytes", path, TCP_SECRET_MAX);
		return -EFBIG;
	}
	if (got && s->key[got - 1] == '\n')
		got--;
	if (!got) {
		log_error("tcp: secret file %s is empty", path);
		return -EINVAL;
	}
	s->len = got;
	s->set = true;
	snprintf(s->source, sizeof(s->source), "file");
	return 0;
}

int tcp_secret_load(struct tcp_secret *s, const char *param, const char *path)
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

int tcp_nonce(uint8_t *out, size_t n)
{
	if (RAND_bytes(out, (int)n) != 1) {
		log_error("tcp: no random bytes for a nonce");
		return -EIO;
	}
	return 0;
}

void tcp_proof(const struct tcp_secret *s, const char *role, const uint8_t nc[TCP_NONCE_BYTES],
	       const uint8_t ns[TCP_NONCE_BYTES], const char *caller, const char *callee,
	       const char *ns_name, uint64_t link_id, uint16_t conn_index,
	       uint8_t out[TCP_MAC_BYTES])
{
	/* Fixed-width fields: no two different inputs serialize the same. */
	uint8_t msg[16 + 2 * TCP_NONCE_BYTES + 3 * FERRY_NAME_MAX + 8 + 2];
	uint64_t lid = htole64(link_id);
	uint16_t ci = htole16(conn_index);
	unsigned int mdlen = TCP_MAC_BYTES;
	size_t o = 0;

	memset(msg, 0, sizeof(msg));
	strncpy((char *)msg, role, 16);
	o = 16;
	memcpy(msg + o, nc, TCP_NONCE_BYTES);
	o += TCP_NONCE_BYTES;
	memcpy(msg + o, ns, TCP_NONCE_BYTES);
	o += TCP_NONCE_BYTES;
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
		memset(out, 0, TCP_MAC_BYTES); /* never matches a real proof by chance */
}

bool tcp_proof_equal(const uint8_t a[TCP_MAC_BYTES], const uint8_t b[TCP_MAC_BYTES])
{
	return CRYPTO_memcmp(a, b, TCP_MAC_BYTES) == 0;
}

void tcp_hello_to_wire(struct tcp_hello *h)
{
	h->magic = htole64(h->magic);
	h->version = htole16(h->version);
	h->type = htole16(h->type);
	h->caps = htole32(h->caps);
	h->status = htole32(h->status);
	h->conn_index = htole16(h->conn_index);
	h->nconns = htole16(h->nconns);
	h->link_id = htole64(h->link_id);
}

void tcp_hello_from_wire(struct tcp_hello *h)
{
	h->magic = le64toh(h->magic);
	h->version = le16toh(h->version);
	h->type = le16toh(h->type);
	h->caps = le32toh(h->caps);
	h->status = le32toh(h->status);
	h->conn_index = le16toh(h->conn_index);
	h->nconns = le16toh(h->nconns);
	h->link_id = le64toh(h->link_id);
	h->ns[FERRY_NAME_MAX - 1] = '\0';
	h->name[FERRY_NAME_MAX - 1] = '\0';
}

bool tcp_addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			return true;
		return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
	}
	return false;
}

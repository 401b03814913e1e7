/*
 * control/netaddr.c - network endpoints: "tcp://HOST:PORT" to socket
 * addresses and back, loopback or not, and the upstream port arithmetic
 * kept for compatibility (ferry_port_compat).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "log.h"
#include "netaddr.h"

int netaddr_parse(const char *endpoint, bool numeric, struct sockaddr_storage *ss,
		   socklen_t *len)
{
	char host[NETADDR_MAX], *end;
	const char *h, *colon;
	struct addrinfo hints = { 0 }, *res = NULL;
	unsigned long port;
	size_t hl;
	int rc;

	if (!endpoint || strncmp(endpoint, "tcp://", 6) != 0 ||
	    strnlen(endpoint, NETADDR_MAX) >= NETADDR_MAX) {
		log_error("tcp: endpoint \"%s\" is not tcp://HOST:PORT", endpoint ? endpoint : "(null)");
		return -EINVAL;
	}
	h = endpoint + 6;
	if (*h == '[') {
		const char *close = strchr(h, ']');

		if (!close || close[1] != ':')
			goto bad;
		hl = (size_t)(close - h - 1);
		memcpy(host, h + 1, hl);
		colon = close + 1;
	} else {
		colon = strrchr(h, ':');
		if (!colon)
			goto bad;
		hl = (size_t)(colon - h);
		memcpy(host, h, hl);
	}
	host[hl] = '\0';
	if (!hl || !colon[1])
		goto bad;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || port > 65535 || colon[1] == '-' || colon[1] == '+')
		goto bad;
	memset(ss, 0, sizeof(*ss));
	if (strcmp(host, "*") == 0) {
		struct sockaddr_in *in = (void *)ss;

		in->sin_family = AF_INET;
		in->sin_addr.s_addr = htonl(INADDR_ANY);
		in->sin_port = htons((uint16_t)port);
		*len = sizeof(*in);
		return 0;
	}
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | (numeric ? AI_NUMERICHOST : 0);
	rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc || !res) {
		log_error("tcp: endpoint \"%s\": %s", endpoint,
			  rc ? gai_strerror(rc) : "no address");
		return -EINVAL;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
bad:
	log_error("tcp: endpoint \"%s\" is not tcp://HOST:PORT", endpoint);
	return -EINVAL;
}

int netaddr_format(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		return snprintf(buf, len, "tcp://%s:%u", host, ntohs(in->sin_port));
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		return snprintf(buf, len, "tcp://[%s]:%u", host, ntohs(in6->sin6_port));
	}
	return -EAFNOSUPPORT;
}

int ferry_port_compat(uint32_t base, uint32_t purpose_offset, uint32_t stage, uint32_t rank)
{
	uint64_t port = (uint64_t)base + purpose_offset + stage + 16ull * rank;

	if (port == 0 || port > 65535) {
		log_error("ferry_port_compat: %u + %u + %u + 16*%u = %llu is not a port", base,
			  purpose_offset, stage, rank, (unsigned long long)port);
		return -ERANGE;
	}
	return (int)port;
}

int netaddr_parse_peer(const char *caller, const char *endpoint, struct sockaddr_storage *ss,
			socklen_t *len)
{
	int rc = netaddr_parse(endpoint, false, ss, len);

	if (rc)
		return rc;
	/* sin6_port sits where sin_port does */
	if (((struct sockaddr_in *)ss)->sin_port == 0) {
		log_error("%s: %s has no port", caller, endpoint);
		return -EINVAL;
	}
	return 0;
}

bool netaddr_is_loopback(const struct sockaddr *sa)
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

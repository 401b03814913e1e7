/*
 * tests/test_ctl_addrs.c - the control handshake publishes a peer's whole
 * address set: every data address of each side (each transport's that
 * peers can be given one for) reaches the other side's peer handle, under
 * the transport its scheme names, and a wildcard tcp host is taken as
 * "where I found you". The second transport here is a TEST DOUBLE
 * (tests/transport_double.h) with a URI scheme of its own ("dbl") and an
 * address made from its engine's name; it carries nothing, so the PUT
 * that proves the session goes over tcp.
 */
#include "helpers.h"
#include "transport_double.h"

static int dbl_address(struct ferry_engine *e, struct backend *b, char *buf, size_t len)
{
	(void)b;
	return snprintf(buf, len, "dbl://%s.example:7", e->name);
}

static int dbl_connect(struct ferry_engine *e, struct backend *b, struct ferry_peer *p,
		       const char *uri)
{
	(void)e, (void)b;
	return ferry__peer_addr_set(p, uri);
}

static const struct backend_ops dbl = {
	TD_HOOKS("dbl", 90), .init = td_init, .scheme = "dbl", .address = dbl_address,
	.connect = dbl_connect,
};

TD_REGISTRY(&dbl);

static struct ferry_engine *mk(const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "addrs";
	p.pool_size = 8u << 20;
	p.control = "tcp://127.0.0.1:0"; /* data: 127.0.0.1, port 0, published */
	p.handshake_ms = t_handshake_ms();
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	return e;
}

/* Does e's health list, for peer name, an address that starts with prefix? */
static bool peer_has_addr(struct ferry_engine *e, const char *name, const char *prefix)
{
	static char json[1 << 14];
	char pat[96];
	const char *at, *end;

	assert_true(ferry_engine_health(e, json, sizeof(json)) > 0);
	snprintf(pat, sizeof(pat), "{\"name\":\"%s\",\"addresses\":[", name);
	if (!(at = strstr(json, pat)))
		return false;
	at += strlen(pat);
	end = strchr(at, ']');
	snprintf(pat, sizeof(pat), "\"%s", prefix);
	for (const char *p = strstr(at, pat); p && p < end; p = strstr(p + 1, pat))
		return true;
	return false;
}

static bool wait_addr(struct ferry_engine *e, const char *name, const char *prefix)
{
	int64_t end = t_now() + (t_under_valgrind() ? 60 : 10) * SEC;

	while (!peer_has_addr(e, name, prefix)) {
		if (t_now() > end)
			return false;
		usleep(5000);
	}
	return true;
}

static void test_address_set_published(void **state)
{
	struct ferry_engine *a, *b;
	struct ferry_peer *to_b;
	char addrs[512], ctl[128], tcp_b[128];
	const char x[] = "x";
	struct ferry_cqe c;

	(void)state;
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL); /* loopback, no secret: no warnings */
	a = mk("addr-a");
	b = mk("addr-b");
	/* Each engine's own set: its control endpoint, tcp, and the double's. */
	assert_true(ferry_engine_addresses(b, addrs, sizeof(addrs)) > 0);
	assert_non_null(strstr(addrs, "ferry://"));
	assert_non_null(strstr(addrs, "tcp://"));
	assert_non_null(strstr(addrs, "dbl://addr-b.example:7"));
	assert_true(ferry_engine_control_address(b, ctl, sizeof(ctl)) > 0);
	assert_true(ferry_engine_address(b, tcp_b, sizeof(tcp_b)) > 0);
	/* a knows only b's control endpoint. */
	to_b = t_peer(a, "addr-b");
	snprintf(addrs, sizeof(addrs), "ferry://%s", ctl + strlen("tcp://"));
	assert_int_equal(ferry_peer_connect_uri(to_b, addrs), 0);
	t_put(a, to_b, "k", x, 1, 1, 0);
	assert_int_equal(t_wait_one(a, &c, 10 * SEC), 0);
	/* The handshake gave a b's whole set: tcp (where b listens), and dbl. */
	assert_true(wait_addr(a, "addr-b", tcp_b));
	assert_true(wait_addr(a, "addr-b", "dbl://addr-b.example:7"));
	/* And b learned a's (the caller publishes its own in AUTH). */
	assert_true(wait_addr(b, "addr-a", "tcp://127.0.0.1:"));
	assert_true(wait_addr(b, "addr-a", "dbl://addr-a.example:7"));
	ferry_engine_destroy(a);
	ferry_engine_destroy(b);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_address_set_published),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

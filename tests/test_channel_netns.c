/*
 * tests/test_channel_netns.c - a broadcast channel across two "hosts": the
 * writer and 2 readers in network namespace A, 4 readers in namespace B
 * (its own runtime directory, so shm cannot join them), a veth pair
 * between, a cluster secret. Every reader gets every message in order with
 * its bytes checked; the writer sends each message 3 times (its 2 local
 * readers, and once to B's relay, which gives it to B's 4 readers), not 6;
 * then the writer is killed and B's readers see -ECONNRESET through their
 * relay within their dequeue's deadline. Root only: elsewhere it exits 77
 * (skipped) and says why. The namespaces go with the test (a janitor).
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "ferry/channel.h"
#include "chan_helpers.h"
#include "helpers.h"
#include "netns.h"

#define LOCAL_READERS 2
#define REMOTE_READERS 4
#define MSGS 120

static char ns_a[32], ns_b[32], dir_a[128], dir_b[128], handle_path[160], ip_a[32], ip_b[32];
static int net, janitor = -1;

/* Message k: 0..64 KiB, one in 8 up to 1 MiB; its words from k. */
static size_t msg_len(uint64_t k)
{
	uint64_t r = t_mix(k * 31 + 5);

	return (size_t)((r >> 8) % ((r % 8 == 0 ? (1u << 20) : (64u << 10)) + 1));
}

static void msg_fill(uint64_t k, uint8_t *p, size_t len)
{
	uint64_t w = t_mix(k);
	size_t i;

	for (i = 0; i < len; i++) {
		if (i % 8 == 0)
			w = w * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (uint8_t)(w >> (8 * (i % 8)));
	}
}

static int msg_check(uint64_t k, const uint8_t *p, size_t len)
{
	uint64_t w = t_mix(k);
	size_t i;

	if (len != msg_len(k))
		return -1;
	for (i = 0; i < len; i++) {
		if (i % 8 == 0)
			w = w * 6364136223846793005ull + 1442695040888963407ull;
		if (p[i] != (uint8_t)(w >> (8 * (i % 8))))
			return -1;
	}
	return 0;
}

static void net_down(void)
{
	ns_sh("ip netns del %s 2>/dev/null", ns_a);
	ns_sh("ip netns del %s 2>/dev/null", ns_b);
}

static struct ferry_engine *engine(const char *name, const char *ip, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	char ctl[64];

	snprintf(ctl, sizeof(ctl), "tcp://%s:0", ip);
	p.name = name;
	p.ns = "chan";
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = pool;
	p.control = ctl;
	p.handshake_ms = t_handshake_ms();
	if (ferry_engine_create(&p, &e))
		return NULL;
	return e;
}

enum { RD_ALL, RD_FOLLOWER, RD_RELAY };

struct rd {
	int id;
	int remote;
	int mode;            /* RD_ALL: every message, then a reset (the writer killed);
			      * RD_FOLLOWER: in order until a reset (its relay killed);
			      * RD_RELAY: runs the relay (opened first), killed */
	struct t_gate *done; /* opened once every message came (RD_ALL), or once open (RD_RELAY) */
};

static int reader_main(void *arg)
{
	struct rd *a = arg;
	char name[32], h[FERRY_CHAN_HANDLE_MAX];
	struct ferry_chan_reader *r = NULL;
	struct ferry_engine *e;
	unsigned got = 0;
	int64_t n;

	close(janitor);
	if (ns_enter(a->remote ? ns_b : ns_a))
		return 20;
	setenv("FERRY_RUNTIME_DIR", a->remote ? dir_b : dir_a, 1);
	snprintf(name, sizeof(name), "%s%d", a->remote ? "far" : "near", a->id);
	e = engine(name, a->remote ? ip_b : ip_a, 16u << 20);
	if (!e || t_chan_handle_from_file(handle_path, h, sizeof(h), 30000))
		return 21;
	if (ferry_chan_open(e, h, NULL, &r))
		return 22;
	if (a->mode == RD_RELAY)
		t_gate_open(a->done);
	for (;;) {
		struct ferry_buf *b = NULL;
		uint64_t seq;

		n = ferry_chan_dequeue(r, 30 * SEC, &b, &seq);
		if (n < 0)
			break;
		if (seq != got || msg_check(seq, ferry_buf_data(b), (size_t)n)) {
			fprintf(stderr, "%s: message %" PRIu64 " (want %u) is wrong\n", name, seq, got);
			return 23;
		}
		ferry_buf_release(b);
		if (++got == MSGS && a->mode == RD_ALL)
			t_gate_open(a->done);
	}
	if (a->mode == RD_FOLLOWER && n == -ECONNRESET && got < MSGS) {
		printf("%s: %u messages, then its relay's end: %s\n", name, got,
		       ferry_strerror((int)n));
		ferry_chan_reader_close(r);
		ferry_engine_destroy(e);
		return 0;
	}
	if (got != MSGS) {
		fprintf(stderr, "%s: %u messages, then %s\n", name, got, ferry_strerror((int)n));
		return 24;
	}
	/* The writer is killed after all came: through the relay too, a reset. */
	if (n != -ECONNRESET) {
		fprintf(stderr, "%s: the end is %s, want a reset\n", name, ferry_strerror((int)n));
		return 25;
	}
	ferry_chan_reader_close(r);
	ferry_engine_destroy(e);
	return 0;
}

struct wr {
	struct t_gate *sent, *half, *go; /* half, go: the relay killed after 20 messages */
};

static int writer_main(void *arg)
{
	struct wr *wa = arg;
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	struct ferry_chan_writer *w;
	struct ferry_chan_stats st;
	struct ferry_engine *e;
	char h[FERRY_CHAN_HANDLE_MAX];
	uint8_t *scratch = malloc(1u << 20);
	unsigned i;

	close(janitor);
	if (ns_enter(ns_a))
		return 30;
	setenv("FERRY_RUNTIME_DIR", dir_a, 1);
	e = engine("writer", ip_a, 64u << 20);
	p.readers = LOCAL_READERS + REMOTE_READERS;
	p.max_outstanding = 8;
	if (!e || !scratch || ferry_chan_create(e, "bus", &p, &w))
		return 31;
	if (t_chan_handle_to_file(w, handle_path, h, sizeof(h)))
		return 32;
	if (ferry_chan_wait_ready(w, 60 * SEC)) {
		ferry_chan_stats(w, &st);
		fprintf(stderr, "writer: %u of %u readers attached\n", st.attached, st.readers);
		return 33;
	}
	for (i = 0; i < MSGS; i++) {
		struct iovec iov = { scratch, msg_len(i) };

		if (wa->half && i == 20) {
			t_gate_open(wa->half);
			if (t_gate_wait(wa->go, 60000))
				return 37;
		}
		msg_fill(i, scratch, iov.iov_len);
		if (ferry_chan_write(w, &iov, 1, 30 * SEC) != i)
			return 34;
	}
	if (ferry_chan_flush(w, 30 * SEC))
		return 35;
	ferry_chan_stats(w, &st);
	printf("writer: %" PRIu64 " sends for %u messages to %u readers (%u live)\n", st.delivered,
	       MSGS, st.attached, st.live);
	if (wa->half) {
		/* The other host's relay died: its 4 readers are dead, the 2 here went on. */
		int64_t t0 = t_now();

		while (st.dead < REMOTE_READERS && t_now() - t0 < 30 * SEC) {
			usleep(10000);
			ferry_chan_stats(w, &st);
		}
		printf("writer: %u dead, %u live\n", st.dead, st.live);
		if (st.dead != REMOTE_READERS || st.live != LOCAL_READERS)
			return 38;
	} else if (st.delivered != (uint64_t)MSGS * (LOCAL_READERS + 1) || st.live != p.readers) {
		/* Once per local reader and once for the other host, not once per reader. */
		return 36;
	}
	t_gate_open(wa->sent);
	pause(); /* killed here */
	return 0;
}

static void test_two_hosts(void **state)
{
	struct t_gate sent, done;
	struct rd a[LOCAL_READERS + REMOTE_READERS];
	pid_t writer, pids[LOCAL_READERS + REMOTE_READERS];
	int i, n = LOCAL_READERS + REMOTE_READERS;

	(void)state;
	struct wr wa = { .sent = &sent };

	t_gate_init(&sent);
	t_gate_init(&done);
	writer = t_fork(writer_main, &wa);
	for (i = 0; i < n; i++) {
		a[i] = (struct rd){ .id = i, .remote = i >= LOCAL_READERS, .done = &done };
		pids[i] = t_fork(reader_main, &a[i]);
	}
	for (i = 0; i < n; i++)
		assert_int_equal(t_gate_wait(&done, 60000), 0);
	assert_int_equal(t_gate_wait(&sent, 60000), 0);
	kill(writer, SIGKILL);
	assert_int_equal(t_reap(writer), 128 + SIGKILL);
	for (i = 0; i < n; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	t_gate_close(&sent);
	t_gate_close(&done);
	unlink(handle_path);
}

static int group_setup(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr, "test_channel_netns: skipped: needs root (network namespaces)\n");
		exit(77);
	}
	net = 100 + getpid() % 100;
	snprintf(ns_a, sizeof(ns_a), "fch%da", getpid());
	snprintf(ns_b, sizeof(ns_b), "fch%db", getpid());
	snprintf(ip_a, sizeof(ip_a), "10.%d.7.1", net);
	snprintf(ip_b, sizeof(ip_b), "10.%d.7.2", net);
	janitor = ns_janitor(net_down);
	if (janitor < 0 || ns_sh("ip netns add %s", ns_a) || ns_sh("ip netns add %s", ns_b) ||
	    ns_sh("ip link add fcha%d netns %s type veth peer name fchb%d netns %s", net, ns_a,
		  net, ns_b) ||
	    ns_sh("ip -n %s addr add %s/24 dev fcha%d", ns_a, ip_a, net) ||
	    ns_sh("ip -n %s addr add %s/24 dev fchb%d", ns_b, ip_b, net) ||
	    ns_sh("ip -n %s link set fcha%d up", ns_a, net) ||
	    ns_sh("ip -n %s link set fchb%d up", ns_b, net) ||
	    ns_sh("ip -n %s link set lo up", ns_a) || ns_sh("ip -n %s link set lo up", ns_b)) {
		net_down();
		fprintf(stderr, "test_channel_netns: skipped: cannot create namespaces and a veth "
				"pair here\n");
		exit(77);
	}
	snprintf(dir_a, sizeof(dir_a), "%s/a", getenv("FERRY_RUNTIME_DIR"));
	snprintf(dir_b, sizeof(dir_b), "%s/b", getenv("FERRY_RUNTIME_DIR"));
	mkdir(dir_a, 0700);
	mkdir(dir_b, 0700);
	snprintf(handle_path, sizeof(handle_path), "%s/handle", getenv("FERRY_RUNTIME_DIR"));
	setenv("FERRY_SECRET", "channel-netns-test", 1);
	alarm(t_under_valgrind() ? 900 : 150);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	unlink(handle_path);
	ns_sh("rm -rf %s %s", dir_a, dir_b);
	net_down();
	close(janitor);
	return 0;
}

/*
 * The reader that runs B's relay is killed after 20 messages: B's other
 * readers end with -ECONNRESET (their messages in order until then), the
 * writer counts B's 4 readers dead and goes on with its own 2, which get
 * every message.
 */
static void test_relay_killed(void **state)
{
	struct t_gate sent, done, opened, half, go;
	struct rd a[LOCAL_READERS + REMOTE_READERS];
	pid_t writer, pids[LOCAL_READERS + REMOTE_READERS];
	struct wr wa = { .sent = &sent, .half = &half, .go = &go };
	int i, n = LOCAL_READERS + REMOTE_READERS;

	(void)state;
	t_gate_init(&sent);
	t_gate_init(&done);
	t_gate_init(&opened);
	t_gate_init(&half);
	t_gate_init(&go);
	writer = t_fork(writer_main, &wa);
	for (i = 0; i < n; i++) {
		int remote = i >= LOCAL_READERS;

		a[i] = (struct rd){ .id = i, .remote = remote,
				    .mode = !remote ? RD_ALL : i == LOCAL_READERS ? RD_RELAY
										  : RD_FOLLOWER,
				    .done = i == LOCAL_READERS ? &opened : &done };
		pids[i] = t_fork(reader_main, &a[i]);
		if (a[i].mode == RD_RELAY) /* it makes the relay: the others follow it */
			assert_int_equal(t_gate_wait(&opened, 60000), 0);
	}
	assert_int_equal(t_gate_wait(&half, 60000), 0);
	kill(pids[LOCAL_READERS], SIGKILL);
	assert_int_equal(t_reap(pids[LOCAL_READERS]), 128 + SIGKILL);
	t_gate_open(&go);
	for (i = LOCAL_READERS + 1; i < n; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	for (i = 0; i < LOCAL_READERS; i++)
		assert_int_equal(t_gate_wait(&done, 60000), 0);
	assert_int_equal(t_gate_wait(&sent, 60000), 0);
	kill(writer, SIGKILL);
	assert_int_equal(t_reap(writer), 128 + SIGKILL);
	for (i = 0; i < LOCAL_READERS; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	t_gate_close(&sent);
	t_gate_close(&done);
	t_gate_close(&opened);
	t_gate_close(&half);
	t_gate_close(&go);
	unlink(handle_path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_hosts),
		cmocka_unit_test(test_relay_killed),
	};

	setvbuf(stdout, NULL, _IONBF, 0);
	return cmocka_run_group_tests_name("channel_netns", tests, group_setup, group_teardown);
}

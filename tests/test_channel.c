/*
 * tests/test_channel.c - broadcast channels (api/ferry/channel.h) between
 * real processes of one host (over shm): one writer to 1, 4 and 16 readers
 * with every message checked (order, exactly once, its bytes), the handle
 * passed through a file; one copy however many readers (the writer's copy
 * count, its pool back to empty); a slow reader holding the writer back
 * only max_outstanding messages; a reader killed (reported, the others go
 * on); the writer killed (-ECONNRESET within the dequeue's deadline); the
 * barrier's deadline; messages as CQEs on a CQ of the caller's and through
 * a callback; every engine in MANUAL mode; bad input.
 *
 * Each fan-out test writes FAN_MSGS (100k) messages, every one checked
 * by every reader, whose sizes are random 0..16 KiB with one in 16 of them
 * 0..4 MiB (1..4 readers) or 0..512 KiB (16 readers), seeded and printed:
 * ~6,250 large ones, ~12 GB checked per reader, 3-8 s a case here (ASan
 * too). FERRY_CHAN_MSGS sets another count. Under valgrind: 40 messages,
 * none over 256 KiB.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ferry.h"
#include "ferry/channel.h"
#include "chan_helpers.h"
#include "helpers.h"

#define FAN_MSGS 100000
#define FAN_BOUND_S 400 /* a fan-out case and its readers, on a loaded machine */

static char handle_path[256];

static uint64_t seed;
static size_t big_max;

/* Message k: its size, and its bytes (a word per 8 bytes from k and the seed). */
static size_t msg_len(uint64_t k)
{
	uint64_t r = t_mix(seed ^ (k * 7919));

	if (r % 16 == 0)
		return (size_t)((r >> 8) % (big_max + 1));
	return (size_t)((r >> 8) % (16384 + 1));
}

static void msg_fill(uint64_t k, uint8_t *p, size_t len)
{
	uint64_t w = t_mix(seed + k);
	size_t i;

	for (i = 0; i + 8 <= len; i += 8) {
		w = w * 6364136223846793005ull + 1442695040888963407ull;
		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)(k + i);
}

static int msg_check(uint64_t k, const uint8_t *p, size_t len)
{
	uint64_t w = t_mix(seed + k), v;
	size_t i;

	if (len != msg_len(k))
		return -1;
	for (i = 0; i + 8 <= len; i += 8) {
		w = w * 6364136223846793005ull + 1442695040888963407ull;
		memcpy(&v, p + i, 8);
		if (v != w)
			return -1;
	}
	for (; i < len; i++)
		if (p[i] != (uint8_t)(k + i))
			return -1;
	return 0;
}

static unsigned fan_msgs(void)
{
	const char *s = getenv("FERRY_CHAN_MSGS");

	return s && atoi(s) > 0 ? (unsigned)atoi(s) : (t_under_valgrind() ? 40 : FAN_MSGS);
}

static void handle_to_file(struct ferry_chan_writer *w)
{
	char h[FERRY_CHAN_HANDLE_MAX];

	assert_int_equal(t_chan_handle_to_file(w, handle_path, h, sizeof(h)), 0);
	assert_non_null(strstr(h, "ferrychan1 "));
}

static enum ferry_progress_mode mode = FERRY_PROGRESS_THREAD;

static struct ferry_engine *engine(const char *name, size_t pool)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "chan";
	p.progress = mode;
	p.pool_size = pool ? pool : (8u << 20);
	p.spin_ns = 20000;
	if (ferry_engine_create(&p, &e))
		return NULL;
	return e;
}

/* ------------------------------------------------------------------ */
/* Readers in child processes                                         */
/* ------------------------------------------------------------------ */

struct rd_args {
	int id;
	unsigned expect;   /* messages it must see, then the end (-EPIPE) */
	int hold_gate;     /* slow: wait for gate before reading */
	struct t_gate *gate;
	struct t_gate *progress; /* opened after `expect_before` messages */
	unsigned expect_before;
};

static int reader_main(void *arg)
{
	struct rd_args *a = arg;
	char name[32], h[FERRY_CHAN_HANDLE_MAX];
	struct ferry_chan_reader *r = NULL;
	struct ferry_engine *e;
	unsigned got = 0;
	int rc = 0;

	alarm(t_under_valgrind() ? 600 : FAN_BOUND_S);
	snprintf(name, sizeof(name), "reader%d", a->id);
	e = engine(name, 0);
	if (!e || t_chan_handle_from_file(handle_path, h, sizeof(h), 20000)) {
		fprintf(stderr, "reader%d: no engine or no handle\n", a->id);
		return 10;
	}
	if ((rc = ferry_chan_open(e, h, NULL, &r))) {
		fprintf(stderr, "reader%d: ferry_chan_open: %s\n", a->id, ferry_strerror(rc));
		return 11;
	}
	if ((rc = ferry_chan_reader_wait_ready(r, 20 * SEC))) {
		fprintf(stderr, "reader%d: ferry_chan_reader_wait_ready: %s\n", a->id,
			ferry_strerror(rc));
		return 12;
	}
	if (a->hold_gate && t_gate_wait(a->gate, 30000))
		return 13;
	for (;;) {
		struct ferry_buf *b = NULL;
		uint64_t seq = 0;
		int64_t n = ferry_chan_dequeue(r, 30 * SEC, &b, &seq);

		if (n == -EPIPE)
			break;
		if (n < 0) {
			fprintf(stderr, "reader%d: dequeue: %s after %u\n", a->id,
				ferry_strerror((int)n), got);
			rc = 14;
			break;
		}
		if (seq != got || msg_check(seq, ferry_buf_data(b), (size_t)n)) {
			fprintf(stderr, "reader%d: message %" PRIu64 " (want %u, %lld bytes) is wrong\n",
				a->id, seq, got, (long long)n);
			rc = 15;
			ferry_buf_release(b);
			break;
		}
		ferry_buf_release(b);
		got++;
		if (a->progress && got == a->expect_before)
			t_gate_open(a->progress);
	}
	if (!rc && got != a->expect) {
		fprintf(stderr, "reader%d: %u messages, want %u\n", a->id, got, a->expect);
		rc = 16;
	}
	ferry_chan_reader_close(r);
	ferry_engine_destroy(e);
	return rc;
}

static struct ferry_chan_writer *make_writer(struct ferry_engine *e, uint32_t n, uint32_t window,
					     ferry_chan_event_cb *cb, void *arg)
{
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	struct ferry_chan_writer *w = NULL;

	p.readers = n;
	p.max_outstanding = window;
	p.on_event = cb;
	p.event_arg = arg;
	assert_int_equal(ferry_chan_create(e, "bus", &p, &w), 0);
	handle_to_file(w);
	return w;
}

static void write_msg(struct ferry_chan_writer *w, uint64_t k, uint8_t *scratch)
{
	size_t len = msg_len(k);
	struct iovec iov = { scratch, len };

	msg_fill(k, scratch, len);
	assert_int_equal(ferry_chan_write(w, &iov, 1, 30 * SEC), (int64_t)k);
}

static long long copies(struct ferry_engine *e)
{
	return t_health_num(e, "\"ops\"", "copies");
}

static long long zero_copies(struct ferry_engine *e)
{
	return t_health_num(e, "\"ops\"", "zero_copies");
}

static void fanout(unsigned n, size_t bigmax)
{
	struct ferry_engine *e;
	struct ferry_chan_writer *w;
	struct ferry_chan_stats st;
	struct rd_args args[16];
	pid_t pids[16];
	unsigned i, msgs = fan_msgs();
	uint8_t *scratch = malloc(4u << 20);
	long long c0, z0;
	uint64_t bytes = 0;
	int64_t t0;

	alarm(t_under_valgrind() ? 600 : FAN_BOUND_S + 30);
	seed = (uint64_t)t_now();
	big_max = t_under_valgrind() && bigmax > (256u << 10) ? 256u << 10 : bigmax;
	printf("fanout: %u readers, %u messages, seed %" PRIu64 "\n", n, msgs, seed);
	for (i = 0; i < n; i++) {
		args[i] = (struct rd_args){ .id = (int)i, .expect = msgs };
		pids[i] = t_fork(reader_main, &args[i]);
	}
	e = engine("writer", 96u << 20); /* after the forks (t_fork) */
	assert_non_null(e);
	w = make_writer(e, n, 8, NULL, NULL);
	assert_int_equal(ferry_chan_wait_ready(w, 30 * SEC), 0);
	c0 = copies(e);
	z0 = zero_copies(e);
	t0 = t_now();
	for (i = 0; i < msgs; i++) {
		write_msg(w, i, scratch);
		bytes += msg_len(i);
	}
	assert_int_equal(ferry_chan_flush(w, 30 * SEC), 0);
	printf("fanout: %u readers: %.1f ms\n", n, (double)(t_now() - t0) / 1e6);
	/*
	 * One copy per message, however many readers: the channel's own (into
	 * the pool), then every reader's STREAM_PUT lends the shared block.
	 */
	assert_int_equal(ferry_chan_stats(w, &st), 0);
	assert_int_equal(st.bytes_copied, bytes);
	assert_int_equal(copies(e) - c0, 0);
	assert_true(zero_copies(e) - z0 >= (long long)msgs * n);
	assert_true(zero_copies(e) - z0 <= (long long)(msgs + 1) * n);
	assert_int_equal(st.attached, n);
	assert_int_equal(st.live, n);
	assert_int_equal(st.written, msgs);
	assert_int_equal(st.delivered, (uint64_t)msgs * n);
	assert_int_equal(ferry_chan_close(w), 0);
	for (i = 0; i < n; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	/*
	 * Every shared block goes back once the last reader released it: the
	 * readers' last RELEASEs may still be on their way when they exit (and
	 * a MANUAL engine handles them only when driven), so wait, bounded.
	 */
	for (i = 0; i < 20000 && t_health_num(e, "\"pool\"", "blocks_in_use") != 0; i++) {
		if (mode == FERRY_PROGRESS_MANUAL)
			ferry_progress(e);
		usleep(1000);
	}
	assert_int_equal(t_health_num(e, "\"pool\"", "blocks_in_use"), 0);
	ferry_engine_destroy(e);
	free(scratch);
	unlink(handle_path);
}

static void test_fanout_1(void **state)
{
	(void)state;
	fanout(1, 4u << 20);
}

static void test_fanout_4(void **state)
{
	(void)state;
	fanout(4, 4u << 20);
}

static void test_fanout_16(void **state)
{
	(void)state;
	fanout(16, 512u << 10);
}

/* Every engine in MANUAL mode: the channel's calls drive them while they wait. */
static void test_fanout_manual(void **state)
{
	(void)state;
	mode = FERRY_PROGRESS_MANUAL;
	fanout(3, 1u << 20);
	mode = FERRY_PROGRESS_THREAD;
}

/* ------------------------------------------------------------------ */
/* Flow control and faults                                            */
/* ------------------------------------------------------------------ */

struct ev_log {
	int attached, ready, left, dead, last_err;
};

static void on_event(enum ferry_chan_event ev, int slot, const char *reader, int err, void *arg)
{
	struct ev_log *l = arg;

	(void)slot;
	(void)reader;
	switch (ev) {
	case FERRY_CHAN_EV_ATTACHED: l->attached++; break;
	case FERRY_CHAN_EV_READY: l->ready++; break;
	case FERRY_CHAN_EV_READER_LEFT: l->left++; break;
	case FERRY_CHAN_EV_READER_DEAD: l->dead++; l->last_err = err; break;
	}
}

/* A reader that does not read holds the writer back by a bounded number of messages. */
static void test_slow_reader(void **state)
{
	struct ferry_engine *e;
	struct ferry_chan_writer *w;
	struct ferry_chan_stats st;
	struct t_gate gate;
	struct rd_args a[2];
	pid_t pids[2];
	uint8_t scratch[16384];
	unsigned i, ok = 0, total = 64;
	int64_t rc = 0, t0;
	struct ev_log ev = { 0 };

	(void)state;
	seed = 42;
	big_max = 0;
	t_gate_init(&gate);
	a[0] = (struct rd_args){ .id = 0, .expect = total };
	a[1] = (struct rd_args){ .id = 1, .expect = total, .hold_gate = 1, .gate = &gate };
	for (i = 0; i < 2; i++)
		pids[i] = t_fork(reader_main, &a[i]);
	e = engine("writer", 32u << 20); /* after the forks (t_fork) */
	assert_non_null(e);
	w = make_writer(e, 2, 4, on_event, &ev);
	assert_int_equal(ferry_chan_wait_ready(w, 30 * SEC), 0);
	assert_int_equal(ev.attached, 2);
	assert_int_equal(ev.ready, 1);
	/* Without waiting: the window (4) plus the slow reader's credits (4), then -EAGAIN. */
	for (i = 0; i < total; i++) {
		struct iovec iov = { scratch, msg_len(i) };

		msg_fill(i, scratch, iov.iov_len);
		rc = ferry_chan_write(w, &iov, 1, 0);
		if (rc == -EAGAIN) {
			/* Give the engine time to show it is really stuck. */
			usleep(50000);
			rc = ferry_chan_write(w, &iov, 1, 0);
			if (rc == -EAGAIN)
				break;
		}
		assert_int_equal(rc, (int64_t)i);
		ok++;
	}
	printf("slow reader: %u writes before -EAGAIN (window 4)\n", ok);
	assert_int_equal(rc, -EAGAIN);
	assert_true(ok >= 4 && ok <= 12);
	t0 = t_now();
	{
		struct iovec iov = { scratch, msg_len(ok) };

		msg_fill(ok, scratch, iov.iov_len);
		assert_int_equal(ferry_chan_write(w, &iov, 1, 200 * MS), -ETIMEDOUT);
		assert_true(t_now() - t0 >= 190 * MS);
	}
	assert_int_equal(ferry_chan_stats(w, &st), 0);
	assert_true(st.write_waits >= 2);
	assert_true(st.outstanding <= 4);
	t_gate_open(&gate);
	for (i = ok; i < total; i++)
		write_msg(w, i, scratch);
	assert_int_equal(ferry_chan_flush(w, 30 * SEC), 0);
	assert_int_equal(ferry_chan_close(w), 0);
	for (i = 0; i < 2; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	assert_int_equal(ev.dead, 0);
	ferry_engine_destroy(e);
	t_gate_close(&gate);
	unlink(handle_path);
}

/* A reader killed: reported to the writer, and the others get every message. */
static void test_reader_killed(void **state)
{
	struct ferry_engine *e;
	struct ferry_chan_writer *w;
	struct ferry_chan_stats st;
	struct t_gate prog;
	struct rd_args a[3];
	pid_t pids[3];
	uint8_t scratch[16384];
	unsigned i, total = 200;
	struct ev_log ev = { 0 };
	int64_t t0;

	(void)state;
	seed = 7;
	big_max = 0;
	t_gate_init(&prog);
	a[0] = (struct rd_args){ .id = 0, .expect = total };
	a[1] = (struct rd_args){ .id = 1, .expect = total };
	a[2] = (struct rd_args){ .id = 2, .expect = total, .progress = &prog, .expect_before = 10 };
	for (i = 0; i < 3; i++)
		pids[i] = t_fork(reader_main, &a[i]);
	e = engine("writer", 32u << 20); /* after the forks (t_fork) */
	assert_non_null(e);
	w = make_writer(e, 3, 8, on_event, &ev);
	assert_int_equal(ferry_chan_wait_ready(w, 30 * SEC), 0);
	for (i = 0; i < 20; i++)
		write_msg(w, i, scratch);
	assert_int_equal(t_gate_wait(&prog, 30000), 0);
	kill(pids[2], SIGKILL);
	assert_int_equal(t_reap(pids[2]), 128 + SIGKILL);
	t0 = t_now();
	for (; i < total; i++)
		write_msg(w, i, scratch);
	assert_int_equal(ferry_chan_flush(w, 30 * SEC), 0);
	/* The death is seen even with nothing more to send to it. */
	while (ev.dead == 0 && t_now() - t0 < 10 * SEC) {
		assert_int_equal(ferry_chan_stats(w, &st), 0);
		usleep(10000);
	}
	assert_int_equal(ferry_chan_stats(w, &st), 0);
	assert_int_equal(ev.dead, 1);
	assert_int_equal(st.dead, 1);
	assert_int_equal(st.live, 2);
	assert_true(ev.last_err < 0);
	assert_int_equal(ferry_chan_close(w), 0);
	for (i = 0; i < 2; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	assert_int_equal(ev.left, 0);
	ferry_engine_destroy(e);
	t_gate_close(&prog);
	unlink(handle_path);
}

static struct t_gate wk_written;

static int writer_main(void *arg)
{
	struct ferry_engine *e = engine("writer", 16u << 20);
	struct ferry_chan_writer *w;
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	uint8_t scratch[16384];
	unsigned i;

	(void)arg;
	p.readers = 1;
	if (!e || ferry_chan_create(e, "bus", &p, &w))
		return 10;
	handle_to_file(w);
	if (ferry_chan_wait_ready(w, 30 * SEC))
		return 11;
	for (i = 0; i < 10; i++) {
		struct iovec iov = { scratch, msg_len(i) };

		msg_fill(i, scratch, iov.iov_len);
		if (ferry_chan_write(w, &iov, 1, 10 * SEC) != i)
			return 12;
	}
	t_gate_open(&wk_written);
	pause(); /* killed here */
	return 0;
}

/* The writer killed: the reader's dequeue ends with -ECONNRESET, well within its deadline. */
static void test_writer_killed(void **state)
{
	struct ferry_engine *e;
	struct ferry_chan_reader *r = NULL;
	char h[FERRY_CHAN_HANDLE_MAX];
	struct ferry_buf *b;
	uint64_t seq;
	unsigned i;
	int64_t n, t0;
	pid_t pid;

	(void)state;
	seed = 9;
	big_max = 0;
	t_gate_init(&wk_written);
	pid = t_fork(writer_main, NULL);
	e = engine("reader0", 0); /* after the fork (t_fork) */
	assert_non_null(e);
	assert_int_equal(t_chan_handle_from_file(handle_path, h, sizeof(h), 20000), 0);
	assert_int_equal(ferry_chan_open(e, h, NULL, &r), 0);
	for (i = 0; i < 10; i++) {
		n = ferry_chan_dequeue(r, 20 * SEC, &b, &seq);
		assert_true(n >= 0);
		assert_int_equal(seq, i);
		assert_int_equal(msg_check(seq, ferry_buf_data(b), (size_t)n), 0);
		ferry_buf_release(b);
	}
	assert_int_equal(t_gate_wait(&wk_written, 20000), 0);
	assert_int_equal(ferry_chan_dequeue(r, 50 * MS, &b, &seq), -ETIMEDOUT);
	kill(pid, SIGKILL);
	assert_int_equal(t_reap(pid), 128 + SIGKILL);
	t0 = t_now();
	assert_int_equal(ferry_chan_dequeue(r, 10 * SEC, &b, &seq), -ECONNRESET);
	printf("writer killed: -ECONNRESET after %.1f ms\n", (double)(t_now() - t0) / 1e6);
	assert_true(t_now() - t0 < 5 * SEC);
	assert_int_equal(ferry_chan_dequeue(r, 0, &b, &seq), -ECONNRESET); /* it stays so */
	assert_int_equal(ferry_chan_reader_close(r), 0);
	ferry_engine_destroy(e);
	t_gate_close(&wk_written);
	unlink(handle_path);
}

/* The barrier waits until its deadline for a reader that never comes. */
static void test_barrier_deadline(void **state)
{
	struct ferry_engine *e;
	struct ferry_chan_writer *w;
	struct ferry_chan_stats st;
	struct t_gate go;
	struct rd_args a[2];
	pid_t pids[2];
	unsigned i;
	int64_t t0;
	char x = 1;
	struct iovec iov = { &x, 1 };

	(void)state;
	seed = 3;
	big_max = 0;
	t_gate_init(&go);
	for (i = 0; i < 2; i++) {
		a[i] = (struct rd_args){ .id = (int)i, .expect = 0 };
		pids[i] = t_fork(reader_main, &a[i]);
	}
	e = engine("writer", 0); /* after the forks (t_fork) */
	assert_non_null(e);
	w = make_writer(e, 3, 0, NULL, NULL);
	assert_int_equal(ferry_chan_write(w, &iov, 1, 0), -ENOTCONN); /* before the barrier */
	t0 = t_now();
	assert_int_equal(ferry_chan_wait_ready(w, 2 * SEC), -ETIMEDOUT);
	assert_true(t_now() - t0 >= 2 * SEC - 10 * MS);
	assert_true(t_now() - t0 < 4 * SEC);
	assert_int_equal(ferry_chan_stats(w, &st), 0);
	assert_int_equal(st.attached, 2);
	assert_int_equal(ferry_chan_write(w, &iov, 1, 0), -ENOTCONN);
	assert_int_equal(ferry_chan_close(w), 0); /* the two readers see the end */
	for (i = 0; i < 2; i++)
		assert_int_equal(t_reap(pids[i]), 0);
	ferry_engine_destroy(e);
	t_gate_close(&go);
	unlink(handle_path);
}

struct cb_log {
	int calls, ended;
	uint64_t next;
	int bad;
};

static void on_msg(const struct ferry_cqe *c, void *arg)
{
	struct cb_log *l = arg;

	l->calls++;
	if (!(c->flags & FERRY_CQE_F_MORE))
		l->ended = 1;
	else if (c->res != (int)l->next++ || c->user_data != 78)
		l->bad++;
	if (c->flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c->buf);
}

/*
 * Readers whose messages complete on a CQ of the caller's, one as CQEs
 * (and its fd), one through a callback (one process, three engines).
 */
static void test_reader_cq(void **state)
{
	struct ferry_engine *we = engine("writer", 0), *re = engine("reader0", 0);
	struct ferry_engine *re2 = engine("reader1", 0);
	struct ferry_chan_open_params op2 = FERRY_CHAN_OPEN_PARAMS_INIT;
	struct ferry_chan_reader *r2;
	struct ferry_cq *cq2;
	struct cb_log log = { 0 };
	int64_t t0;
	struct ferry_chan_open_params op = FERRY_CHAN_OPEN_PARAMS_INIT;
	struct ferry_cq_params cqp = FERRY_CQ_PARAMS_INIT;
	struct ferry_chan_writer *w;
	struct ferry_chan_reader *r;
	char h[FERRY_CHAN_HANDLE_MAX];
	struct ferry_cq *cq;
	struct ferry_cqe c;
	struct ferry_buf *b;
	struct pollfd pfd;
	unsigned i;

	(void)state;
	w = make_writer(we, 2, 0, NULL, NULL);
	assert_true(ferry_chan_handle(w, h, sizeof(h)) > 0);
	assert_int_equal(ferry_cq_create(re, &cqp, &cq), 0);
	op.cq = cq;
	op.user_data = 77;
	assert_int_equal(ferry_chan_open(re, h, &op, &r), 0);
	assert_ptr_equal(ferry_chan_reader_cq(r), cq);
	assert_int_equal(ferry_cq_create(re2, &cqp, &cq2), 0);
	op2.cq = cq2;
	op2.user_data = 78;
	op2.cb = on_msg;
	op2.cb_arg = &log;
	assert_int_equal(ferry_chan_open(re2, h, &op2, &r2), 0);
	assert_int_equal(ferry_chan_wait_ready(w, 10 * SEC), 0);
	assert_int_equal(ferry_chan_reader_wait_ready(r, 10 * SEC), 0);
	assert_int_equal(ferry_chan_dequeue(r, 0, &b, NULL), -EINVAL); /* not in this mode */
	for (i = 0; i < 5; i++) {
		char msg[16];
		struct iovec iov = { msg, (size_t)snprintf(msg, sizeof(msg), "m%u", i) };

		assert_int_equal(ferry_chan_write(w, &iov, 1, SEC), i);
	}
	/* The CQ's fd says when there is something. */
	pfd.fd = ferry_cq_fd(cq);
	pfd.events = POLLIN;
	for (i = 0; i < 5; i++) {
		char want[16];

		while (ferry_cq_poll(cq, &c, 1) != 1) {
			if (ferry_cq_arm(cq) == 0)
				assert_int_equal(t_poll(&pfd, 1, 10000), 1);
		}
		assert_int_equal(c.user_data, 77);
		assert_int_equal(c.res, (int)i);
		assert_true(c.flags & FERRY_CQE_F_MORE);
		assert_true(c.flags & FERRY_CQE_F_BUF);
		snprintf(want, sizeof(want), "m%u", i);
		assert_int_equal(c.len, strlen(want));
		assert_memory_equal(ferry_buf_data(c.buf), want, c.len);
		ferry_buf_release(c.buf);
	}
	/* The other reader's callbacks run inside the polls of its CQ, in order. */
	t0 = t_now();
	while (log.calls < 5 && t_now() - t0 < 10 * SEC)
		if (ferry_cq_poll(cq2, &c, 1) == 0)
			usleep(1000);
	assert_int_equal(log.calls, 5);
	assert_int_equal(log.bad, 0);
	assert_int_equal(ferry_chan_close(w), 0);
	while (!log.ended && t_now() - t0 < 10 * SEC)
		if (ferry_cq_poll(cq2, &c, 1) == 0)
			usleep(1000);
	assert_int_equal(log.ended, 1);
	assert_int_equal(ferry_chan_reader_close(r2), 0);
	assert_int_equal(ferry_cq_destroy(cq2), 0);
	ferry_engine_destroy(re2);
	/* The end: a last CQE without MORE. */
	while (ferry_cq_wait(cq, &c, 1, 10 * SEC) != 1)
		;
	assert_false(c.flags & FERRY_CQE_F_MORE);
	assert_true(c.res >= 0);
	if (c.flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c.buf);
	assert_int_equal(ferry_chan_reader_close(r), 0);
	assert_int_equal(ferry_cq_destroy(cq), 0);
	ferry_engine_destroy(re);
	ferry_engine_destroy(we);
}

static void test_bad_input(void **state)
{
	struct ferry_engine *e = engine("writer", 0);
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	struct ferry_chan_writer *w = NULL, *w2 = NULL;
	struct ferry_chan_reader *r = NULL;
	char h[FERRY_CHAN_HANDLE_MAX];

	(void)state;
	assert_int_equal(ferry_chan_create(e, "bus", &p, &w), -EINVAL); /* 0 readers */
	p.readers = 2;
	assert_int_equal(ferry_chan_create(e, "bad name", &p, &w), -EINVAL);
	assert_int_equal(ferry_chan_create(e, "", &p, &w), -EINVAL);
	assert_int_equal(ferry_chan_create(NULL, "bus", &p, &w), -EINVAL);
	p.max_outstanding = 100000;
	assert_int_equal(ferry_chan_create(e, "bus", &p, &w), -EINVAL);
	p.max_outstanding = 0;
	assert_int_equal(ferry_chan_create(e, "bus", &p, &w), 0);
	assert_int_equal(ferry_chan_handle(w, NULL, 0) > 0, 1);
	assert_int_equal(ferry_chan_handle(w, h, 8), ferry_chan_handle(w, NULL, 0));
	assert_int_equal(strlen(h), 7);
	assert_int_equal(ferry_chan_open(e, "not a handle", NULL, &r), -EINVAL);
	assert_int_equal(ferry_chan_open(e, "ferrychan1 writer=x chan=c readers=0 host=1", NULL, &r),
			 -EINVAL);
	assert_int_equal(ferry_chan_open(e, NULL, NULL, &r), -EINVAL);
	assert_int_equal(ferry_chan_dequeue(NULL, 0, NULL, NULL), -EINVAL);
	assert_int_equal(ferry_chan_write(NULL, NULL, 0, 0), -EINVAL);
	assert_int_equal(ferry_chan_wait_ready(w, 0), -ETIMEDOUT);
	assert_int_equal(ferry_chan_close(NULL), -EINVAL);
	assert_int_equal(ferry_chan_reader_close(NULL), -EINVAL);
	(void)w2;
	assert_int_equal(ferry_chan_close(w), 0);
	ferry_engine_destroy(e);
}

struct other_calls {
	struct ferry_chan_writer *w;
	int wait_ready, flush, close;
	int64_t write;
};

static void *calls_elsewhere(void *arg)
{
	struct other_calls *o = arg;
	struct iovec iov = { (void *)"x", 1 };

	o->wait_ready = ferry_chan_wait_ready(o->w, 0);
	o->write = ferry_chan_write(o->w, &iov, 1, 0);
	o->flush = ferry_chan_flush(o->w, 0);
	o->close = ferry_chan_close(o->w);
	return NULL;
}

/*
 * A FERRY_ENGINE_SINGLE_POLLER engine: its channel calls are its poller's;
 * from another thread they return -EPERM having done nothing (a close
 * there leaves the writer whole, to be closed on the poller's thread).
 */
static void test_single_poller_engine(void **state)
{
	struct ferry_engine_params ep = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;
	struct other_calls o = { 0 };
	struct ferry_engine *e = NULL;
	pthread_t t;

	(void)state;
	ferry_log_set(-1, NULL, NULL);
	ep.name = "sp-writer";
	ep.ns = "test";
	ep.progress = FERRY_PROGRESS_MANUAL;
	ep.pool_size = 4u << 20;
	ep.flags = FERRY_ENGINE_SINGLE_POLLER;
	assert_int_equal(ferry_engine_create(&ep, &e), 0);
	p.readers = 1;
	assert_int_equal(ferry_chan_create(e, "bus", &p, &o.w), 0); /* this thread: the poller */
	assert_int_equal(pthread_create(&t, NULL, calls_elsewhere, &o), 0);
	pthread_join(t, NULL);
	assert_int_equal(o.wait_ready, -EPERM);
	assert_int_equal(o.write, -EPERM);
	assert_int_equal(o.flush, -EPERM);
	assert_int_equal(o.close, -EPERM);
	assert_int_equal(ferry_chan_wait_ready(o.w, 0), -ETIMEDOUT); /* no reader came */
	assert_int_equal(ferry_chan_close(o.w), 0);
	assert_int_equal(t_health_num(e, "\"ops\":{", "in_flight"), 0);
	ferry_engine_destroy(e);
}

static int setup(void **state)
{
	(void)state;
	snprintf(handle_path, sizeof(handle_path), "%s-handle", getenv("FERRY_RUNTIME_DIR"));
	unlink(handle_path);
	alarm(t_under_valgrind() ? 600 : 120); /* each test's bound (children have their own) */
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_bad_input, setup),
		cmocka_unit_test_setup(test_single_poller_engine, setup),
		cmocka_unit_test_setup(test_reader_cq, setup),
		cmocka_unit_test_setup(test_fanout_1, setup),
		cmocka_unit_test_setup(test_fanout_4, setup),
		cmocka_unit_test_setup(test_fanout_16, setup),
		cmocka_unit_test_setup(test_fanout_manual, setup),
		cmocka_unit_test_setup(test_slow_reader, setup),
		cmocka_unit_test_setup(test_reader_killed, setup),
		cmocka_unit_test_setup(test_writer_killed, setup),
		cmocka_unit_test_setup(test_barrier_deadline, setup),
	};

	setvbuf(stdout, NULL, _IONBF, 0);
	return t_run_group_apart(tests, NULL, NULL); /* a failed case cannot fail the next */
}

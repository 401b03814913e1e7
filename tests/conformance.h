/*
 * tests/conformance.h - the transport conformance suite: what every
 * transport must show, written once, run over each transport by a
 * program that names it (tests/test_conformance_<transport>.c).
 *
 * Owns: the cases and the pair of ends they run on. A case talks to two
 * ends, NEAR (an agent in the case's process) and FAR (in this process for
 * loop, in a child for shm and tcp: struct cf_transport says which), through
 * the commands of tests/conformance_ends.h; so one case body checks every
 * transport. Every case runs in a process of its own (t_run_cases_apart),
 * in a runtime directory of its own, bounds its time, checks every payload
 * byte for byte where it lands, and ends with cf_finish: both peers were
 * carried by the transport under test, the far end leaves cleanly, and the
 * near end's pool has every block back.
 *
 * Where transports differ by design (the receiver's pool: does data need
 * it; does a receiver holding data hold the sender's block; which small
 * PUTs skip the sender's pool), the transport entry says what to expect;
 * everything else is one contract. docs/design.md §18 has the case list
 * and how a transport joins.
 */
#ifndef FERRY_TEST_CONFORMANCE_H
#define FERRY_TEST_CONFORMANCE_H

#include "conformance_ends.h"

/* ------------------------------------------------------------------ */
/* The pair                                                            */
/* ------------------------------------------------------------------ */

struct cf_cfg {
	size_t near_pool, far_pool; /* 0: 8 MiB */
	uint32_t far_max_keys;      /* 0: the default */
	bool far_manual;            /* the far engine in MANUAL mode (cf_freeze can stop it) */
	bool far_later;             /* cf_open makes only the near end; cf_open_far the far */
};

static struct {
	struct cf_end near, far, spare;
	struct cf_cfg cfg;
	char rundir[256];
	bool killed; /* some end was killed: its files may stay behind */
} P;

#define NEAR (&P.near)
#define FAR (&P.far)
#define CF_SEC ((uint64_t)SEC)
#define CF_WAIT_NS (5 * SEC * cf_slow())

static int cf_setup(void **state)
{
	(void)state;
	memset(&P, 0, sizeof(P));
	cf_nsocks = 0;
	t_log_capture(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : FERRY_LOG_INFO); /* for cf_explain */
	unsetenv("FERRY_SECRET");
	if (t_test_rundir(P.rundir, sizeof(P.rundir), "conf", 120))
		return -1;
	/* Children first: this process has no engine yet. */
	if (cf_t->far_is_process) {
		cf_fork_agent(&P.far, "far");
		cf_fork_agent(&P.spare, "far");
	} else {
		cf_local_agent(&P.far, "far");
	}
	cf_local_agent(&P.near, "near");
	return 0;
}

/* After the case (which ended with cf_finish, or failed): nothing may stay. */
static int cf_teardown(void **state)
{
	char cmd[300];

	(void)state;
	if (P.far.remote && P.far.pid > 0)
		kill(P.far.pid, SIGKILL);
	if (P.spare.pid > 0)
		kill(P.spare.pid, SIGKILL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", P.rundir);
	alarm(0);
	return system(cmd) == 0 ? 0 : -1;
}

static void cf_open_far(void)
{
	cf_end_create(FAR, P.cfg.far_pool ? P.cfg.far_pool : 8 * CF_MIB, P.cfg.far_max_keys,
		      P.cfg.far_manual, NULL);
	cf_end_peer(FAR, 0, "near", NEAR->addr, false, 0, 0);
	cf_end_peer(FAR, 1, "ghost", NULL, true, 0, 0);
	cf_end_peer(NEAR, 0, "far", FAR->addr, false, 0, 0);
}

/* The two engines, each with slot 0 the other and slot 1 a peer nobody answers. */
static void cf_open(const struct cf_cfg *c)
{
	P.cfg = *c;
	cf_end_create(NEAR, c->near_pool ? c->near_pool : 8 * CF_MIB, 0, false, NULL);
	cf_end_peer(NEAR, 0, "far", NULL, false, 0, 0);
	cf_end_peer(NEAR, 1, "ghost", NULL, true, 0, 0);
	if (!c->far_later)
		cf_open_far();
}

/* The far end dies: SIGKILL for a child, the engine's destroy in this process. */
static void cf_kill_far(void)
{
	snprintf(FAR->addr_before, sizeof(FAR->addr_before), "%s", FAR->addr);
	cf_end_kill(FAR);
	P.killed = true;
}

/* A new engine of the far end's name (at its old address): the spare child, or a new agent. */
static void cf_restart_far(void)
{
	char prev[CF_ADDR_MAX];

	assert_true(FAR->killed);
	snprintf(prev, sizeof(prev), "%s", FAR->addr_before);
	if (FAR->remote) {
		assert_true(P.spare.pid > 0); /* one restart per case */
		P.far = P.spare;
		memset(&P.spare, 0, sizeof(P.spare));
	} else {
		cf_end_exit(FAR);
		cf_local_agent(FAR, "far");
	}
	cf_end_create(FAR, P.cfg.far_pool ? P.cfg.far_pool : 8 * CF_MIB, P.cfg.far_max_keys,
		      P.cfg.far_manual, prev[0] ? prev : NULL);
	cf_end_peer(FAR, 0, "near", NEAR->addr, false, 0, 0);
}

/* ------------------------------------------------------------------ */
/* One-line commands                                                   */
/* ------------------------------------------------------------------ */

/* Before a case fails: what each end still waits for, holds and logged. */
static inline void cf_explain(void)
{
	struct cf_end *ends[2] = { &P.near, &P.far };

	for (int i = 0; i < 2; i++) {
		struct cf_msg m = { .op = CF_DUMP };
		struct cf_rep r;

		if (!ends[i]->up || (!ends[i]->ag && ends[i]->pid <= 0))
			continue;
		r = cf_call(ends[i], &m);
		fprintf(stderr, "%s: %s\n", ends[i]->name, r.dump);
	}
}
#define cf_fail(...)                          \
	do {                                  \
		cf_explain();                 \
		fail_msg(__VA_ARGS__);        \
	} while (0)

static inline int cf_put_to(struct cf_end *x, int slot, const char *key, size_t size,
			    uint64_t seed, int mode, uint32_t flags, uint64_t timeout, uint64_t ud)
{
	struct cf_msg m = { .op = CF_PUT, .slot = slot, .mode = (uint32_t)mode, .size = size,
			    .seed = seed, .flags = flags, .timeout_ns = timeout, .ud = ud };

	snprintf(m.key, sizeof(m.key), "%s", key);
	return cf_call(x, &m).rc;
}

#define cf_put(x, key, size, seed, mode, flags, timeout, ud) \
	cf_put_to(x, 0, key, size, seed, mode, flags, timeout, ud)

/* A GET of key, expecting size bytes of seed; cap: the iovec's room (INTO, SCATTER). */
static inline void cf_get(struct cf_end *x, const char *key, size_t size, uint64_t seed,
			  int mode, size_t cap, uint32_t flags, uint64_t timeout, uint64_t ud,
			  bool hold)
{
	struct cf_msg m = { .op = CF_GET, .slot = 0, .mode = (uint32_t)mode, .size = size,
			    .seed = seed, .cap = cap, .flags = flags, .timeout_ns = timeout,
			    .ud = ud, .hold = hold };

	snprintf(m.key, sizeof(m.key), "%s", key);
	assert_int_equal(cf_call(x, &m).rc, 0);
}

/* A run: n PUTs (or GETs) "fmt % (first + i)", ud + i, seed + i, cf_small_len bytes. */
static inline void cf_run_of(struct cf_end *x, uint32_t op, const char *fmt, uint64_t first,
			     uint64_t n, uint64_t seed, int mode, uint64_t timeout, uint64_t ud)
{
	struct cf_msg m = { .op = op, .slot = 0, .mode = (uint32_t)mode, .seed = seed,
			    .timeout_ns = timeout, .ud = ud, .n = n, .arg = first };

	snprintf(m.key, sizeof(m.key), "%s", fmt);
	assert_int_equal(cf_call(x, &m).rc, 0);
}

static inline int cf_sput(struct cf_end *x, const char *key, size_t size, uint64_t seed,
			  int mode, uint32_t flags, uint64_t timeout, uint64_t ud)
{
	struct cf_msg m = { .op = CF_SPUT, .slot = 0, .mode = (uint32_t)mode, .size = size,
			    .seed = seed, .flags = flags, .timeout_ns = timeout, .ud = ud };

	snprintf(m.key, sizeof(m.key), "%s", key);
	return cf_call(x, &m).rc;
}

/*
 * Chunks [from, to) of stream key (of n chunks: chunk n - 1 is the END; n 0:
 * none is), as spec and seed say, from an iovec, a pool buffer and a
 * gathered iovec in turn (or all from mode when mode >= 0); chunk i is op ud + i.
 */
static inline void cf_chunks(struct cf_end *x, const char *key, uint64_t seed, unsigned spec,
			     unsigned from, unsigned to, unsigned n, int mode, uint64_t ud)
{
	static const int modes[3] = { CF_IOV, CF_BUF, CF_GATHER };

	for (unsigned i = from; i < to; i++)
		assert_int_equal(cf_sput(x, key, cf_chunk_len(spec, i, n), cf_chunk_seed(seed, i),
					 mode >= 0 ? mode : modes[i % 3],
					 n && i + 1 == n ? FERRY_SQE_STREAM_END : 0, 60 * CF_SEC,
					 ud + i),
				 0);
}

/* A STREAM_GET of key: chunks from index first on, by spec and seed, n of them (0: unknown). */
static inline void cf_sget(struct cf_end *x, const char *key, uint64_t seed, unsigned spec,
			   unsigned first, unsigned n, uint32_t flags, uint64_t gap, uint64_t ud,
			   bool hold)
{
	struct cf_msg m = { .op = CF_SGET, .slot = 0, .seed = seed, .spec = spec, .n = n,
			    .arg = first, .flags = flags, .timeout_ns = gap, .ud = ud,
			    .hold = hold };

	snprintf(m.key, sizeof(m.key), "%s", key);
	assert_int_equal(cf_call(x, &m).rc, 0);
}

static inline void cf_op(struct cf_end *x, uint32_t op, int slot, const char *key,
			 const char *text, uint64_t arg, uint64_t ud)
{
	struct cf_msg m = { .op = op, .slot = slot, .arg = arg, .ud = ud };

	snprintf(m.key, sizeof(m.key), "%s", key ? key : "");
	snprintf(m.text, sizeof(m.text), "%s", text ? text : "");
	assert_int_equal(cf_call(x, &m).rc, 0);
}

#define cf_abort(x, key, reason, ud) cf_op(x, CF_SABORT, 0, key, reason, 0, ud)
#define cf_accept(x, ud) cf_op(x, CF_ACCEPT, 0, NULL, NULL, 0, ud)
#define cf_cancel(x, target, ud) cf_op(x, CF_CANCEL, 0, "-", NULL, target, ud)
#define cf_cleanup(x, req, ud) cf_op(x, CF_CLEANUP, -1, req, NULL, 0, ud)

/* The first completion of op ud (any op: ud UINT64_MAX) within timeout; res -ETIME if none. */
static inline struct cf_done cf_wait_for(struct cf_end *x, uint64_t ud, int64_t timeout)
{
	struct cf_msg m = { .op = CF_WAIT, .ud = ud, .arg = ud == UINT64_MAX,
			    .timeout_ns = (uint64_t)timeout };
	struct cf_rep r = cf_call(x, &m);

	if (r.rc)
		r.d.res = -ETIME;
	return r.d;
}

/* Op ud completes with res, everything it carried right, within 5 s. */
static inline struct cf_done cf_expect_at(struct cf_end *x, uint64_t ud, int res, int line)
{
	struct cf_done d = cf_wait_for(x, ud, CF_WAIT_NS);

	if (d.res == -ETIME)
		cf_fail("line %d: %s: op %llu did not complete", line, x->name,
			 (unsigned long long)ud);
	if (d.res != res)
		cf_fail("line %d: %s: op %llu: %d (%s), want %d (%s)", line, x->name,
			 (unsigned long long)ud, d.res, ferry_err_name(d.res), res,
			 ferry_err_name(res));
	if (!d.ok)
		cf_fail("line %d: %s: op %llu completed with wrong data (len %llu, flags %x)",
			 line, x->name, (unsigned long long)ud, (unsigned long long)d.len, d.flags);
	return d;
}
#define cf_expect(x, ud, res) cf_expect_at(x, ud, res, __LINE__)

/* n completions as mode says (enum cf_seq), each with its data right. */
static inline void cf_seq_at(struct cf_end *x, uint32_t mode, uint64_t ud, uint64_t n,
			     int expect, uint64_t arg, bool last_final, int line)
{
	struct cf_msg m = { .op = CF_SEQ, .mode = mode, .ud = ud, .n = n, .expect = expect,
			    .arg = arg, .flags = last_final,
			    .timeout_ns = (uint64_t)(CF_WAIT_NS + (int64_t)n * MS * cf_slow()) };
	struct cf_rep r = cf_call(x, &m);

	if (r.rc)
		cf_fail("line %d: %s: %s", line, x->name, r.text);
}
/* Ops ud .. ud + n - 1 complete (any order) with res = their index (ud - base) or `expect`. */
#define cf_all(x, ud, n, base) cf_seq_at(x, CF_SEQ_ANY, ud, n, CF_RES_INDEX, base, false, __LINE__)
#define cf_all_res(x, ud, n, res) cf_seq_at(x, CF_SEQ_ANY, ud, n, res, 0, false, __LINE__)
/* Ops ud .. ud + n - 1 complete in that order, with res. */
#define cf_in_order(x, ud, n, res) cf_seq_at(x, CF_SEQ_ORDER, ud, n, res, 0, false, __LINE__)
/* STREAM_GET ud gives n chunks, indexes first.., the last one the END when end. */
#define cf_chunks_in(x, ud, first, n, end) \
	cf_seq_at(x, CF_SEQ_CHUNKS, ud, n, 0, first, end, __LINE__)

/* Nothing completes at x within ms. */
static inline void cf_none_at(struct cf_end *x, int ms, int line)
{
	struct cf_msg m = { .op = CF_NONE, .timeout_ns = (uint64_t)ms * MS };
	struct cf_rep r = cf_call(x, &m);

	if (r.rc)
		cf_fail("line %d: %s: op %llu completed (res %d%s%s, len %llu), nothing should",
			line, x->name, (unsigned long long)r.d.ud, r.d.res, r.d.res < 0 ? " " : "",
			 r.d.res < 0 ? ferry_err_name(r.d.res) : "", (unsigned long long)r.d.len);
}
#define cf_none(x, ms) cf_none_at(x, ms, __LINE__)

static inline int cf_simple(struct cf_end *x, uint32_t op, uint64_t n, int64_t *num)
{
	struct cf_msg m = { .op = op, .n = n };
	struct cf_rep r = cf_call(x, &m);

	if (num)
		*num = r.num;
	return r.rc;
}

#define cf_release(x, n) cf_simple(x, CF_RELEASE, n, NULL)
#define cf_freeze(x) assert_int_equal(cf_simple(x, CF_FREEZE, 0, NULL), 0)
#define cf_thaw(x) assert_int_equal(cf_simple(x, CF_THAW, 0, NULL), 0)
#define cf_unfill(x) assert_int_equal(cf_simple(x, CF_UNFILL, 0, NULL), 0)

/* x's whole pool allocated and held: it has no free byte left. */
static inline void cf_fill_pool(struct cf_end *x)
{
	int64_t largest = -1;

	assert_true(cf_simple(x, CF_FILL, 0, &largest) > 0);
	assert_int_equal(largest, 0);
}

static inline long long cf_health(struct cf_end *x, const char *section, const char *name)
{
	struct cf_msg m = { .op = CF_HEALTH };

	snprintf(m.text, sizeof(m.text), "%s", section);
	snprintf(m.text2, sizeof(m.text2), "%s", name);
	return cf_call(x, &m).num;
}

static inline long long cf_blocks(struct cf_end *x)
{
	return cf_health(x, "\"pool\":{", "blocks_in_use");
}

/* x's pool comes down to `want` blocks in use within 2 s (they come home asynchronously). */
static inline void cf_blocks_settle_at(struct cf_end *x, long long want, int line)
{
	int64_t end = t_now() + 2 * SEC * cf_slow();
	long long n;

	while ((n = cf_blocks(x)) != want && t_now() < end)
		usleep(2000);
	if (n != want)
		cf_fail("line %d: %s holds %lld pool blocks, want %lld", line, x->name, n, want);
}
#define cf_blocks_settle(x, want) cf_blocks_settle_at(x, want, __LINE__)

/*
 * x has no op in flight within 2 s. (Read once, right after the blocks
 * settled, the count was 1 in one run of stream_producer_death over the
 * loop transport in THREAD mode under two busy loops, and 0 in the next 12
 * runs so loaded: the op was not identified. An op that never ends still
 * fails here.)
 */
static inline void cf_in_flight_settle_at(struct cf_end *x, int line)
{
	int64_t end = t_now() + 2 * SEC * cf_slow();
	long long n;

	while ((n = cf_health(x, "\"ops\":{", "in_flight")) != 0 && t_now() < end)
		usleep(2000);
	if (n != 0)
		cf_fail("line %d: %s has %lld ops in flight at the end", line, x->name, n);
}
#define cf_in_flight_settle(x) cf_in_flight_settle_at(x, __LINE__)

/* The transport that carries x's peer `name`: the one under test, or none yet. */
static inline void cf_carrier(struct cf_end *x, const char *name)
{
	struct cf_msg m = { .op = CF_CARRIER };
	struct cf_rep r;

	snprintf(m.text, sizeof(m.text), "%s", name);
	r = cf_call(x, &m);
	assert_int_equal(r.rc, 0);
	if (strcmp(r.text, cf_t->name) != 0 && strcmp(r.text, "none") != 0)
		fail_msg("%s's peer %s is carried by %s, not %s", x->name, name, r.text,
			 cf_t->name);
}

/*
 * The end of every case: the peers went over the transport under test;
 * the far end leaves cleanly (a child exits 0); then the near end holds
 * nothing (what it lent came home, what it kept it releases) and leaves.
 */
static void cf_finish(void)
{
	if (FAR->up) {
		cf_carrier(FAR, "near");
		cf_end_exit(FAR);
	}
	if (P.spare.pid > 0)
		cf_end_exit(&P.spare);
	if (NEAR->up) {
		cf_carrier(NEAR, "far");
		cf_release(NEAR, 0);
		cf_unfill(NEAR);
		cf_blocks_settle(NEAR, 0);
		cf_in_flight_settle(NEAR);
	}
	cf_end_exit(NEAR);
	if (!FAR->remote)
		cf_end_exit(FAR);
	if (!P.killed)
		assert_int_equal(t_count_files(P.rundir), 0); /* every engine took its files */
}

/* ------------------------------------------------------------------ */
/* PUT and GET                                                         */
/* ------------------------------------------------------------------ */

#define CF_BARRIER 999999999ull

/* Every GET x was given before this is in the engine: a NOWAIT GET behind them answers. */
static void cf_barrier(struct cf_end *x)
{
	cf_get(x, "cf-barrier", 0, 0, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, CF_BARRIER, false);
	cf_expect(x, CF_BARRIER, -EAGAIN);
}

/*
 * Many small PUTs of one sender to one receiver arrive in the order they
 * were submitted: the receiver's GETs all wait (in order) before the PUTs
 * leave, so each completes as its PUT arrives; sizes 1..300 bytes mix PUTs
 * inside the descriptor and in blocks. Bytes checked, every one.
 */
static void cf_order(void **state)
{
	unsigned total = t_under_valgrind() ? 2000 : 100000;
	unsigned round = t_under_valgrind() ? 500 : 2000;

	(void)state;
	cf_open(&(struct cf_cfg){ .far_pool = 16 * CF_MIB, .near_pool = 16 * CF_MIB });
	for (unsigned base = 0; base < total; base += round) {
		cf_run_of(FAR, CF_GET, "o%u", base, round, base, CF_ZC, 60 * CF_SEC, base + 1);
		cf_barrier(FAR);
		cf_run_of(NEAR, CF_PUT, "o%u", base, round, base, CF_IOV, 60 * CF_SEC, base + 1);
		cf_all_res(NEAR, base + 1, round, 0);
		cf_in_order(FAR, base + 1, round, 0);
	}
	cf_finish();
}

static const size_t cf_sizes[] = { 0, 1, 63, 64, 255, 256, 257, 4095, 4096, 65535, 65536,
				   65537, 200000, 1 << 20, (3 << 20) + 5, 4 << 20, 0 };

/*
 * Every size from 0 to 4 MiB (and 0 again once the peer is resolved), each
 * PUT from an iovec, a gathered iovec (four pieces, one empty, with gaps)
 * and a pool buffer; each taken four ways: a GET into an iovec that waited
 * for it, a zero-copy GET that waited, a zero-copy GET and a GET scattered
 * over four pieces after it arrived. Guards around every destination.
 */
static void cf_sizes_between(struct cf_end *src, struct cf_end *dst)
{
	size_t max = t_under_valgrind() ? (1u << 20) : (4u << 20);

	cf_open(&(struct cf_cfg){ .near_pool = 16 * max, .far_pool = 16 * max });
	for (unsigned si = 0; si < sizeof(cf_sizes) / sizeof(cf_sizes[0]); si++) {
		size_t s = cf_sizes[si];
		uint64_t base = 1000ull * (si + 1);
		char key[32];

		if (s > max)
			continue;
		for (int pm = 0; pm < 3; pm++) {
			snprintf(key, sizeof(key), "s%u_%d_0", si, pm);
			cf_get(dst, key, s, base + 4 * pm, CF_INTO, s, 0, 60 * CF_SEC,
			       base + 4 * pm, false);
			snprintf(key, sizeof(key), "s%u_%d_1", si, pm);
			cf_get(dst, key, s, base + 4 * pm + 1, CF_ZC, 0, 0, 60 * CF_SEC,
			       base + 4 * pm + 1, 0);
		}
		cf_barrier(dst);
		for (int pm = 0; pm < 3; pm++)
			for (int v = 0; v < 4; v++) {
				snprintf(key, sizeof(key), "s%u_%d_%d", si, pm, v);
				assert_int_equal(cf_put(src, key, s, base + 4 * pm + v, pm, 0,
							60 * CF_SEC, base + 4 * pm + v),
						 0);
			}
		cf_all_res(src, base, 12, 0); /* each once the receiver holds it */
		for (int pm = 0; pm < 3; pm++) {
			cf_expect(dst, base + 4 * pm, 0);
			cf_expect(dst, base + 4 * pm + 1, 0);
			snprintf(key, sizeof(key), "s%u_%d_2", si, pm);
			cf_get(dst, key, s, base + 4 * pm + 2, CF_ZC, 0, FERRY_SQE_NOWAIT, 0,
			       base + 4 * pm + 2, 0);
			cf_expect(dst, base + 4 * pm + 2, 0);
			snprintf(key, sizeof(key), "s%u_%d_3", si, pm);
			cf_get(dst, key, s, base + 4 * pm + 3, CF_SCATTER, s, FERRY_SQE_NOWAIT, 0,
			       base + 4 * pm + 3, 0);
			cf_expect(dst, base + 4 * pm + 3, 0);
		}
	}
	cf_finish();
}

static void cf_sizes_near_to_far(void **state)
{
	(void)state;
	cf_sizes_between(NEAR, FAR);
}

static void cf_sizes_far_to_near(void **state)
{
	(void)state;
	cf_sizes_between(FAR, NEAR);
}

/*
 * A GET posted before its PUT waits for it: first before the sender even
 * exists (NOWAIT says -EAGAIN, a waiting GET sees nothing), then on a pair
 * that already talks, zero copy.
 */
static void cf_get_before_put(void **state)
{
	(void)state;
	cf_open(&(struct cf_cfg){ .far_later = true });
	cf_get(NEAR, "early", 1000, 1, CF_INTO, 1000, FERRY_SQE_NOWAIT, 0, 1, false);
	cf_expect(NEAR, 1, -EAGAIN);
	cf_get(NEAR, "early", 1000, 2, CF_INTO, 1000, 0, 30 * CF_SEC, 2, false);
	cf_none(NEAR, 100);
	cf_open_far();
	cf_none(NEAR, 50);
	assert_int_equal(cf_put(FAR, "early", 1000, 2, CF_IOV, 0, 30 * CF_SEC, 3), 0);
	cf_expect(NEAR, 2, 0);
	cf_expect(FAR, 3, 0);

	cf_get(NEAR, "later", 70000, 4, CF_ZC, 0, 0, 30 * CF_SEC, 4, false);
	cf_get(FAR, "later", 5000, 5, CF_ZC, 0, 0, 30 * CF_SEC, 5, false);
	cf_none(NEAR, 50);
	cf_none(FAR, 1);
	assert_int_equal(cf_put(FAR, "later", 70000, 4, CF_BUF, 0, 30 * CF_SEC, 6), 0);
	assert_int_equal(cf_put(NEAR, "later", 5000, 5, CF_GATHER, 0, 30 * CF_SEC, 7), 0);
	cf_expect(NEAR, 4, 0);
	cf_expect(FAR, 5, 0);
	cf_expect(FAR, 6, 0);
	cf_expect(NEAR, 7, 0);
	cf_finish();
}

/* NOWAIT: -EAGAIN while the key is absent; a GET consumes it. */
static void cf_nowait(void **state)
{
	static const size_t sizes[] = { 100, 100000 };

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	for (unsigned i = 0; i < 2; i++) {
		uint64_t u = 10 * i;

		cf_get(FAR, "k", sizes[i], u, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, u + 1, false);
		cf_expect(FAR, u + 1, -EAGAIN);
		assert_int_equal(cf_put(NEAR, "k", sizes[i], u, CF_IOV, 0, 10 * CF_SEC, u + 2), 0);
		cf_expect(NEAR, u + 2, 0);
		cf_get(FAR, "k", sizes[i], u, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, u + 3, false);
		cf_expect(FAR, u + 3, 0);
		cf_get(FAR, "k", sizes[i], u, CF_INTO, sizes[i], FERRY_SQE_NOWAIT, 0, u + 4, false);
		cf_expect(FAR, u + 4, -EAGAIN); /* consumed */
	}
	cf_finish();
}

/* A GET's deadline: -ETIMEDOUT, not early; the key that comes later is kept for the next GET. */
static void cf_get_deadline(void **state)
{
	struct cf_done d;
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	t0 = t_now();
	cf_get(FAR, "never", 64, 1, CF_ZC, 0, 0, 100 * MS, 1, false);
	d = cf_expect(FAR, 1, -ETIMEDOUT);
	assert_true(d.at - t0 >= 100 * MS);
	assert_true(d.at - t0 < 2 * SEC * cf_slow());
	t0 = t_now();
	cf_get(NEAR, "never", 64, 1, CF_INTO, 64, 0, 100 * MS, 2, false);
	d = cf_expect(NEAR, 2, -ETIMEDOUT);
	assert_true(d.at - t0 >= 100 * MS);
	/* The key arrives after the GET gave up: held, not given to it. */
	assert_int_equal(cf_put(NEAR, "never", 64, 3, CF_IOV, 0, 10 * CF_SEC, 3), 0);
	cf_expect(NEAR, 3, 0);
	cf_none(FAR, 20);
	cf_get(FAR, "never", 64, 3, CF_INTO, 64, FERRY_SQE_NOWAIT, 0, 4, false);
	cf_expect(FAR, 4, 0);
	cf_finish();
}

/*
 * A PUT's deadline: a receiver that does not run (a MANUAL engine nobody
 * drives) makes a PUT with a short deadline end with -ETIMEDOUT, not early;
 * one with a long deadline completes once it runs again. Nothing leaks.
 */
static void cf_put_deadline(void **state)
{
	struct cf_done d;
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ .far_manual = true });
	assert_int_equal(cf_put(NEAR, "warm", 100, 1, CF_IOV, 0, 10 * CF_SEC, 1), 0);
	cf_expect(NEAR, 1, 0); /* connected, and a generous deadline did not fire */
	cf_get(FAR, "warm", 100, 1, CF_INTO, 100, FERRY_SQE_NOWAIT, 0, 2, false);
	cf_expect(FAR, 2, 0);
	cf_freeze(FAR);
	t0 = t_now();
	assert_int_equal(cf_put(NEAR, "late", 4096, 3, CF_IOV, 0, 200 * MS, 3), 0);
	assert_int_equal(cf_put(NEAR, "slow", 5000, 4, CF_BUF, 0, 60 * CF_SEC, 4), 0);
	d = cf_expect(NEAR, 3, -ETIMEDOUT);
	assert_true(d.at - t0 >= 200 * MS);
	assert_true(d.at - t0 < 2 * SEC * cf_slow());
	cf_none(NEAR, 200); /* the other one still waits */
	cf_thaw(FAR);
	cf_expect(NEAR, 4, 0);
	cf_get(FAR, "slow", 5000, 4, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, 5, false);
	cf_expect(FAR, 5, 0);
	/* The PUT that timed out may still have arrived: then its data is right. */
	cf_get(FAR, "late", 4096, 3, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, 6, false);
	d = cf_wait_for(FAR, 6, CF_WAIT_NS);
	assert_true((d.res == 0 || d.res == -EAGAIN) && d.ok);
	cf_finish();
}

/* A PUT to a name nobody answers completes with -EHOSTUNREACH, soon; its block comes back. */
static void cf_put_to_nobody(void **state)
{
	struct cf_done d;
	int64_t t0 = t_now();

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	assert_int_equal(cf_put_to(NEAR, 1, "x", 100, 1, CF_IOV, 0, 30 * CF_SEC, 1), 0);
	assert_int_equal(cf_put_to(NEAR, 1, "y", 100000, 2, CF_BUF, 0, 30 * CF_SEC, 2), 0);
	d = cf_expect(NEAR, 1, -EHOSTUNREACH);
	assert_true(d.at - t0 < 3 * SEC * cf_slow());
	cf_expect(NEAR, 2, -EHOSTUNREACH);
	cf_blocks_settle(NEAR, 0);
	cf_finish();
}

/* CANCEL of a waiting GET: it ends -ECANCELED; the data that comes later is kept, not given. */
static void cf_cancel_waiting_get(void **state)
{
	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_get(FAR, "c", 300, 1, CF_ZC, 0, 0, 30 * CF_SEC, 1, false);
	cf_none(FAR, 20);
	cf_cancel(FAR, 1, 2);
	cf_expect(FAR, 2, 0);
	cf_expect(FAR, 1, -ECANCELED);
	cf_cancel(FAR, 1, 3);
	cf_expect(FAR, 3, -ENOENT); /* nothing of that name pending any more */
	assert_int_equal(cf_put(NEAR, "c", 300, 4, CF_IOV, 0, 10 * CF_SEC, 4), 0);
	cf_expect(NEAR, 4, 0);
	cf_none(FAR, 20);
	cf_get(FAR, "c", 300, 4, CF_SCATTER, 300, FERRY_SQE_NOWAIT, 0, 5, false);
	cf_expect(FAR, 5, 0);
	cf_finish();
}

/*
 * A PUT of a live key fails with -EEXIST and leaves the first data as it
 * was; with REPLACE it replaces it, once: small, block and large sizes.
 */
static void cf_exists_and_replace(void **state)
{
	static const size_t sizes[] = { 16, 4096, 300000 };

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	for (unsigned i = 0; i < 3; i++) {
		size_t s = sizes[i];
		uint64_t u = 100 * (i + 1);

		assert_int_equal(cf_put(NEAR, "dup", s, u + 1, CF_IOV, 0, 10 * CF_SEC, u + 1), 0);
		cf_expect(NEAR, u + 1, 0);
		assert_int_equal(cf_put(NEAR, "dup", s, u + 2, CF_BUF, 0, 10 * CF_SEC, u + 2), 0);
		cf_expect(NEAR, u + 2, -EEXIST);
		cf_get(FAR, "dup", s, u + 1, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, u + 3, false);
		cf_expect(FAR, u + 3, 0); /* the first one, untouched */
		assert_int_equal(cf_put(NEAR, "dup", s, u + 4, CF_GATHER, 0, 10 * CF_SEC, u + 4),
				 0);
		cf_expect(NEAR, u + 4, 0);
		assert_int_equal(cf_put(NEAR, "dup", s, u + 5, CF_IOV, FERRY_SQE_REPLACE,
					10 * CF_SEC, u + 5),
				 0);
		cf_expect(NEAR, u + 5, 0);
		cf_get(FAR, "dup", s, u + 5, CF_INTO, s, FERRY_SQE_NOWAIT, 0, u + 6, false);
		cf_expect(FAR, u + 6, 0); /* the replacement */
		cf_get(FAR, "dup", s, u + 5, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, u + 7, false);
		cf_expect(FAR, u + 7, -EAGAIN); /* and only it */
	}
	cf_blocks_settle(NEAR, 0); /* the replaced data went back */
	cf_finish();
}

/*
 * A GET whose iovec is too small fails with -EMSGSIZE, says how much is
 * needed, and leaves the key for the next GET: when the data was there
 * first, and when the GET waited for it.
 */
static void cf_msgsize_keeps_key(void **state)
{
	static const size_t sizes[] = { 1, 100, 4096, 300000 };

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	for (unsigned i = 0; i < 4; i++) {
		size_t s = sizes[i];
		uint64_t u = 100 * (i + 1);

		assert_int_equal(cf_put(NEAR, "m", s, u, CF_IOV, 0, 10 * CF_SEC, u + 1), 0);
		cf_expect(NEAR, u + 1, 0);
		cf_get(FAR, "m", s, u, CF_INTO, s - 1, 0, 10 * CF_SEC, u + 2, false);
		cf_expect(FAR, u + 2, -EMSGSIZE); /* len == s: checked by the agent */
		cf_get(FAR, "m", s, u, CF_SCATTER, s, 0, 10 * CF_SEC, u + 3, false);
		cf_expect(FAR, u + 3, 0);

		cf_get(FAR, "m2", s, u + 50, CF_INTO, s - 1, 0, 10 * CF_SEC, u + 4, false);
		cf_barrier(FAR);
		assert_int_equal(cf_put(NEAR, "m2", s, u + 50, CF_BUF, 0, 10 * CF_SEC, u + 5), 0);
		cf_expect(FAR, u + 4, -EMSGSIZE);
		cf_expect(NEAR, u + 5, 0);
		cf_get(FAR, "m2", s, u + 50, CF_INTO, s, FERRY_SQE_NOWAIT, 0, u + 6, false);
		cf_expect(FAR, u + 6, 0);
	}
	cf_finish();
}

/* A receiver that holds max_keys keys refuses the next with -ENOSPC; after a GET it takes it. */
static void cf_key_table_full(void **state)
{
	static const size_t sizes[] = { 100, 300000, 4096, 100 };
	char key[16];

	(void)state;
	cf_open(&(struct cf_cfg){ .far_max_keys = 4 });
	for (unsigned i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		assert_int_equal(cf_put(NEAR, key, sizes[i], i, CF_IOV, 0, 10 * CF_SEC, i + 1), 0);
		cf_expect(NEAR, i + 1, 0);
	}
	for (unsigned i = 0; i < 3; i++) {
		assert_int_equal(cf_put(NEAR, "k4", sizes[i], 4, i ? CF_BUF : CF_IOV, 0,
					10 * CF_SEC, 10 + i),
				 0);
		cf_expect(NEAR, 10 + i, -ENOSPC);
	}
	cf_get(FAR, "k0", sizes[0], 0, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, 20, false);
	cf_expect(FAR, 20, 0);
	assert_int_equal(cf_put(NEAR, "k4", 300000, 4, CF_IOV, 0, 10 * CF_SEC, 21), 0);
	cf_expect(NEAR, 21, 0);
	for (unsigned i = 1; i < 5; i++) {
		snprintf(key, sizeof(key), "k%u", i);
		cf_get(FAR, key, i == 4 ? 300000 : sizes[i], i, CF_ZC, 0, FERRY_SQE_NOWAIT, 0,
		       30 + i, false);
		cf_expect(FAR, 30 + i, 0);
	}
	cf_finish();
}

/*
 * The receiver's application holds its whole pool. A PUT of each size
 * class does what the transport says (cf_transport.rx_full: taken, refused
 * with -ENOBUFS, or waiting while it holds its block at the sender, until
 * the sender's own pool runs dry: -ENOMEM). Once the receiver lets go, the
 * waiting ones complete, the refused ones go when sent again, and every
 * byte arrives once.
 */
static void cf_receiver_pool_full(void **state)
{
	char key[16];
	unsigned waiting = 0, dry = 0;
	bool waits = false;

	(void)state;
	cf_open(&(struct cf_cfg){ .near_pool = 1 * CF_MIB, .far_pool = 2 * CF_MIB });
	cf_fill_pool(FAR);
	for (int c = 0; c < CF_NCLASS; c++) {
		snprintf(key, sizeof(key), "rx%d", c);
		assert_int_equal(cf_put(NEAR, key, cf_class_size[c], (uint64_t)c, CF_IOV, 0,
					60 * CF_SEC, (uint64_t)c + 1),
				 0);
	}
	for (int c = 0; c < CF_NCLASS; c++) {
		if (cf_t->rx_full[c] == CF_RX_TAKES)
			cf_expect(NEAR, (uint64_t)c + 1, 0);
		else if (cf_t->rx_full[c] == CF_RX_REFUSES)
			cf_expect(NEAR, (uint64_t)c + 1, -ENOBUFS);
		else
			waits = true;
	}
	if (waits) {
		cf_none(NEAR, 300);
		waiting = 1; /* the large one */
		/* More wait, each holding its block here, until our pool is dry. */
		for (unsigned k = 0; k < 8 && !dry; k++) {
			struct cf_done d;

			snprintf(key, sizeof(key), "rxw%u", k);
			assert_int_equal(cf_put(NEAR, key, cf_class_size[CF_LARGE], 10 + k,
						CF_IOV, 0, 60 * CF_SEC, 10 + k),
					 0);
			d = cf_wait_for(NEAR, UINT64_MAX, 300 * MS * cf_slow());
			if (d.res == -ETIME) {
				waiting++;
				continue;
			}
			assert_int_equal(d.ud, 10 + k);
			assert_int_equal(d.res, -ENOMEM);
			dry = k + 1;
		}
		assert_true(dry > 0);
		assert_int_equal(cf_blocks(NEAR), waiting);
	}
	cf_unfill(FAR);
	for (int c = 0; c < CF_NCLASS; c++) {
		snprintf(key, sizeof(key), "rx%d", c);
		if (cf_t->rx_full[c] == CF_RX_WAITS) {
			cf_expect(NEAR, (uint64_t)c + 1, 0);
		} else if (cf_t->rx_full[c] == CF_RX_REFUSES) {
			assert_int_equal(cf_put(NEAR, key, cf_class_size[c], (uint64_t)c, CF_IOV, 0,
						60 * CF_SEC, (uint64_t)c + 1),
					 0);
			cf_expect(NEAR, (uint64_t)c + 1, 0);
		}
		cf_get(FAR, key, cf_class_size[c], (uint64_t)c, CF_ZC, 0, FERRY_SQE_NOWAIT, 0,
		       100 + (uint64_t)c, false);
		cf_expect(FAR, 100 + (uint64_t)c, 0);
	}
	for (unsigned k = 0; k + 1 < waiting + (dry ? 1 : 0); k++) {
		snprintf(key, sizeof(key), "rxw%u", k);
		if (k + 1 == dry) { /* the one refused for lack of our own room: again */
			assert_int_equal(cf_put(NEAR, key, cf_class_size[CF_LARGE], 10 + k,
						CF_IOV, 0, 60 * CF_SEC, 10 + k),
					 0);
		}
		cf_expect(NEAR, 10 + k, 0);
		cf_get(FAR, key, cf_class_size[CF_LARGE], 10 + k, CF_ZC, 0, FERRY_SQE_NOWAIT, 0,
		       200 + k, false);
		cf_expect(FAR, 200 + k, 0);
	}
	cf_finish();
}

/*
 * The sender's pool exhausted: a PUT that needs a block of it fails with
 * -ENOMEM (never an abort), one larger than the whole pool too, and the
 * pool works again once there is room. Where the receiver holding data
 * holds the sender's block (cf_transport.lends_blocks), a receiver that
 * keeps what it gets runs the sender dry the same way.
 */
static void cf_sender_pool_full(void **state)
{
	unsigned ok = 0, enomem = 0;
	char key[16];

	(void)state;
	cf_open(&(struct cf_cfg){ .near_pool = 1 * CF_MIB });
	/* The peer resolved first: the first PUT to a peer takes a block, however small. */
	assert_int_equal(cf_put(NEAR, "w", 8, 9, CF_IOV, 0, 10 * CF_SEC, 9), 0);
	cf_expect(NEAR, 9, 0);
	cf_get(FAR, "w", 8, 9, CF_INTO, 8, FERRY_SQE_NOWAIT, 0, 9, false);
	cf_expect(FAR, 9, 0);
	cf_blocks_settle(NEAR, 0);
	cf_fill_pool(NEAR);
	assert_int_equal(cf_put(NEAR, "a", 4096, 1, CF_IOV, 0, 10 * CF_SEC, 1), 0);
	cf_expect(NEAR, 1, -ENOMEM);
	assert_int_equal(cf_put(NEAR, "b", 100, 2, CF_GATHER, 0, 10 * CF_SEC, 2), 0);
	cf_expect(NEAR, 2, 100 <= cf_t->inline_max ? 0 : -ENOMEM);
	assert_int_equal(cf_put(NEAR, "c", 2 * CF_MIB, 3, CF_IOV, 0, 10 * CF_SEC, 3), 0);
	cf_expect(NEAR, 3, -ENOMEM);
	cf_unfill(NEAR);
	assert_int_equal(cf_put(NEAR, "c", 2 * CF_MIB, 3, CF_IOV, 0, 10 * CF_SEC, 4), 0);
	cf_expect(NEAR, 4, -ENOMEM); /* larger than the pool: never */
	assert_int_equal(cf_put(NEAR, "a", 4096, 1, CF_IOV, 0, 10 * CF_SEC, 5), 0);
	cf_expect(NEAR, 5, 0);
	cf_get(FAR, "a", 4096, 1, CF_INTO, 4096, FERRY_SQE_NOWAIT, 0, 6, false);
	cf_expect(FAR, 6, 0);
	if (100 <= cf_t->inline_max) {
		cf_get(FAR, "b", 100, 2, CF_INTO, 100, FERRY_SQE_NOWAIT, 0, 7, false);
		cf_expect(FAR, 7, 0);
	}
	cf_blocks_settle(NEAR, 0);

	/* The receiver keeps seven 200 kB items (zero copy) as they come. */
	for (unsigned i = 0; i < 7; i++) {
		snprintf(key, sizeof(key), "h%u", i);
		cf_get(FAR, key, 200000, 10 + i, CF_ZC, 0, 0, 30 * CF_SEC, 10 + i, true);
	}
	cf_barrier(FAR);
	for (unsigned i = 0; i < 7; i++) {
		struct cf_done d;

		snprintf(key, sizeof(key), "h%u", i);
		assert_int_equal(cf_put(NEAR, key, 200000, 10 + i, CF_IOV, 0, 10 * CF_SEC, 20 + i),
				 0);
		d = cf_wait_for(NEAR, 20 + i, CF_WAIT_NS);
		if (d.res == 0) {
			ok++;
			cf_expect(FAR, 10 + i, 0);
		} else {
			assert_int_equal(d.res, -ENOMEM);
			enomem++;
		}
	}
	/* 1 MiB, 200 kB blocks lent to a receiver that keeps them: the sixth does not fit. */
	assert_int_equal(ok, cf_t->lends_blocks ? 5 : 7);
	assert_int_equal(enomem, cf_t->lends_blocks ? 2 : 0);
	assert_int_equal(cf_release(FAR, 0), (int)ok);
	cf_blocks_settle(NEAR, 0); /* released: every block came home */
	for (unsigned i = ok; i < 7; i++) {
		snprintf(key, sizeof(key), "h%u", i);
		assert_int_equal(cf_put(NEAR, key, 200000, 10 + i, CF_IOV, 0, 10 * CF_SEC, 30 + i),
				 0);
		cf_expect(NEAR, 30 + i, 0);
		cf_expect(FAR, 10 + i, 0);
	}
	cf_finish();
}

/*
 * The far end dies (a child: SIGKILL) in the middle of everything: GETs
 * and a STREAM_GET waiting on it end with -ECONNRESET within a second, not
 * at their deadline; what it sent before stays readable here; a PUT to it
 * fails; the blocks it held of ours come home; and a new engine of its
 * name is served as before, both ways.
 */
static void cf_peer_death(void **state)
{
	struct cf_done d;
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	for (unsigned i = 0; i < 3; i++) { /* the far end keeps three of ours */
		char key[8];

		snprintf(key, sizeof(key), "d%u", i);
		cf_get(FAR, key, 100000, i, CF_ZC, 0, 0, 30 * CF_SEC, 1 + i, true);
		assert_int_equal(cf_put(NEAR, key, 100000, i, CF_IOV, 0, 10 * CF_SEC, 1 + i), 0);
		cf_expect(NEAR, 1 + i, 0);
		cf_expect(FAR, 1 + i, 0);
	}
	for (unsigned i = 0; i < 2; i++) { /* and we keep two of its */
		char key[8];

		snprintf(key, sizeof(key), "h%u", i);
		cf_get(NEAR, key, 5000, 10 + i, CF_ZC, 0, 0, 30 * CF_SEC, 10 + i, true);
		assert_int_equal(cf_put(FAR, key, 5000, 10 + i, CF_BUF, 0, 10 * CF_SEC, 10 + i), 0);
		cf_expect(FAR, 10 + i, 0);
		cf_expect(NEAR, 10 + i, 0);
	}
	cf_get(NEAR, "never", 100, 20, CF_ZC, 0, 0, 60 * CF_SEC, 20, false);
	cf_sget(NEAR, "ds_0", 21, CF_SPEC_WORD, 0, 0, 0, 60 * CF_SEC, 21, false);
	cf_chunks(FAR, "ds_0", 21, CF_SPEC_WORD, 0, 2, 0, CF_IOV, 100);
	cf_all(FAR, 100, 2, 100);
	cf_chunks_in(NEAR, 21, 0, 2, false);
	cf_none(NEAR, 20);

	t0 = t_now();
	cf_kill_far();
	d = cf_expect(NEAR, 20, -ECONNRESET);
	assert_true(d.at - t0 < 1 * SEC * cf_slow());
	d = cf_expect(NEAR, 21, -ECONNRESET);
	assert_false(d.flags & FERRY_CQE_F_MORE);
	assert_true(d.at - t0 < 1 * SEC * cf_slow());
	assert_int_equal(cf_simple(NEAR, CF_VERIFY, 0, NULL), 0); /* its data, still ours */
	assert_int_equal(cf_release(NEAR, 0), 2);
	assert_int_equal(cf_put(NEAR, "after", 100, 30, CF_IOV, 0, 10 * CF_SEC, 30), 0);
	d = cf_wait_for(NEAR, 30, CF_WAIT_NS);
	assert_true(d.res == -ECONNRESET || d.res == -EHOSTUNREACH);
	assert_true(d.at - t0 < 3 * SEC * cf_slow());
	cf_blocks_settle(NEAR, 0); /* what it held of ours came home */

	cf_restart_far();
	cf_get(FAR, "again", 3000, 31, CF_INTO, 3000, 0, 10 * CF_SEC, 31, false);
	assert_int_equal(cf_put(NEAR, "again", 3000, 31, CF_BUF, 0, 10 * CF_SEC, 31), 0);
	cf_expect(NEAR, 31, 0);
	cf_expect(FAR, 31, 0);
	assert_int_equal(cf_put(FAR, "back", 3000, 32, CF_IOV, 0, 10 * CF_SEC, 32), 0);
	cf_expect(FAR, 32, 0);
	cf_get(NEAR, "back", 3000, 32, CF_ZC, 0, 0, 10 * CF_SEC, 32, false);
	cf_expect(NEAR, 32, 0);
	cf_finish();
}

/*
 * The far end dies in the middle of large transfers both ways: a PUT of
 * ours it is taking, and a PUT of its own that a GET of ours waits for.
 * Each ends whole or with an error, never with part of the data: the GET
 * with all its bytes right (they arrived before the death) or
 * -ECONNRESET, our PUT with 0 or -ECONNRESET / -EHOSTUNREACH, within
 * seconds of the death (their deadlines are a minute away); the blocks
 * they took come home, and a new far end is served as before.
 */
static void cf_peer_death_mid_transfer(void **state)
{
	const size_t big = 12 * CF_MIB;
	struct cf_done d;
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ .near_pool = 32 * CF_MIB, .far_pool = 32 * CF_MIB });
	/* Both ends know each other first (a peer that dies before it was ever seen is
	 * one that has not come yet: a GET for its keys waits for its deadline). */
	cf_get(FAR, "hello", 100, 5, CF_ZC, 0, 0, 10 * CF_SEC, 5, false);
	assert_int_equal(cf_put(NEAR, "hello", 100, 5, CF_IOV, 0, 10 * CF_SEC, 5), 0);
	cf_expect(NEAR, 5, 0);
	cf_expect(FAR, 5, 0);
	cf_get(NEAR, "hello_back", 100, 6, CF_ZC, 0, 0, 10 * CF_SEC, 6, false);
	assert_int_equal(cf_put(FAR, "hello_back", 100, 6, CF_IOV, 0, 10 * CF_SEC, 6), 0);
	cf_expect(FAR, 6, 0);
	cf_expect(NEAR, 6, 0);
	cf_get(NEAR, "from_far", big, 1, CF_ZC, 0, 0, 60 * CF_SEC, 1, false);
	assert_int_equal(cf_put(NEAR, "to_far", big, 2, CF_BUF, 0, 60 * CF_SEC, 2), 0);
	assert_int_equal(cf_put(FAR, "from_far", big, 1, CF_BUF, 0, 60 * CF_SEC, 3), 0);
	t0 = t_now();
	cf_kill_far();
	d = cf_wait_for(NEAR, 1, CF_WAIT_NS);
	if ((d.res != 0 && d.res != -ECONNRESET) || (d.res == 0 && (!d.ok || d.len != big)))
		cf_fail("the GET of a dying peer's PUT: %d (%s), %llu bytes, %s", d.res,
			ferry_err_name(d.res), (unsigned long long)d.len,
			d.ok ? "right" : "wrong");
	assert_true(d.at - t0 < 3 * SEC * cf_slow());
	fprintf(stderr, "peer_death_mid_transfer: the GET: %s\n", ferry_err_name(d.res));
	d = cf_wait_for(NEAR, 2, CF_WAIT_NS);
	fprintf(stderr, "peer_death_mid_transfer: the PUT: %s\n", ferry_err_name(d.res));
	if (d.res != 0 && d.res != -ECONNRESET && d.res != -EHOSTUNREACH)
		cf_fail("a PUT to a dying peer: %d (%s)", d.res, ferry_err_name(d.res));
	assert_true(d.at - t0 < 3 * SEC * cf_slow());
	cf_blocks_settle(NEAR, 0); /* what the transfers took came home */

	cf_restart_far();
	cf_get(FAR, "again", big, 4, CF_ZC, 0, 0, 30 * CF_SEC, 4, false);
	assert_int_equal(cf_put(NEAR, "again", big, 4, CF_BUF, 0, 30 * CF_SEC, 4), 0);
	cf_expect(NEAR, 4, 0);
	cf_expect(FAR, 4, 0);
	cf_finish();
}

/*
 * A peer that dies holding our block gives it back; a new engine of its
 * name is reached by the very next PUT (not one that fails on the old
 * connection first).
 */
static void cf_peer_restart(void **state)
{
	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_get(FAR, "a0", 1000, 1, CF_ZC, 0, 0, 10 * CF_SEC, 1, true);
	assert_int_equal(cf_put(NEAR, "a0", 1000, 1, CF_IOV, 0, 10 * CF_SEC, 1), 0);
	cf_expect(NEAR, 1, 0);
	cf_expect(FAR, 1, 0);
	cf_kill_far();
	cf_blocks_settle(NEAR, 0);
	cf_restart_far();
	cf_get(FAR, "b1", 1000, 2, CF_INTO, 1000, 0, 10 * CF_SEC, 2, false);
	cf_barrier(FAR);
	assert_int_equal(cf_put(NEAR, "b1", 1000, 2, CF_IOV, 0, 10 * CF_SEC, 2), 0);
	cf_expect(NEAR, 2, 0);
	cf_expect(FAR, 2, 0);
	cf_finish();
}

/* ------------------------------------------------------------------ */
/* Streams                                                             */
/* ------------------------------------------------------------------ */

static inline void cf_limits(struct cf_end *x, uint32_t per_stream, uint32_t per_peer)
{
	cf_end_peer(x, 0, x == NEAR ? "far" : "near", NULL, false, per_stream, per_peer);
}

/*
 * A stream's chunks arrive in order, every length and byte right (the END
 * an empty chunk), FERRY_CQE_F_MORE on all but the last, each STREAM_PUT
 * completing with its index; then eight streams at once, interleaved,
 * sizes across the transports' paths, each in its own order.
 */
static void cf_stream_order(void **state)
{
	unsigned n = t_under_valgrind() ? 300 : 5000, per = t_under_valgrind() ? 16 : 100;

	(void)state;
	cf_open(&(struct cf_cfg){ .near_pool = 64 * CF_MIB, .far_pool = 64 * CF_MIB });
	cf_sget(FAR, "so_0", 7, CF_SPEC_VARIED, 0, n, 0, 20 * CF_SEC, 1, false);
	for (unsigned w = 0; w < n; w += 500) {
		unsigned to = w + 500 < n ? w + 500 : n;

		cf_chunks(NEAR, "so_0", 7, CF_SPEC_VARIED, w, to, n, -1, 1000);
		cf_all(NEAR, 1000 + w, to - w, 1000);
	}
	cf_chunks_in(FAR, 1, 0, n, true);

	for (unsigned s = 0; s < 8; s++) {
		char key[16];

		snprintf(key, sizeof(key), "si%u_0", s);
		cf_sget(FAR, key, 100 + s, CF_SPEC_MIXED, 0, per, 0, 20 * CF_SEC, 10 + s, false);
	}
	for (unsigned i = 0; i < per; i++)
		for (unsigned s = 0; s < 8; s++) {
			char key[16];

			snprintf(key, sizeof(key), "si%u_0", s);
			cf_chunks(NEAR, key, 100 + s, CF_SPEC_MIXED, i, i + 1, per, -1,
				  100000 + 1000 * s);
		}
	for (unsigned s = 0; s < 8; s++) {
		cf_all(NEAR, 100000 + 1000 * s, per, 100000 + 1000 * s);
		cf_chunks_in(FAR, 10 + s, 0, per, true);
	}
	cf_finish();
}

/*
 * Credits: with the consumer holding every chunk, exactly per_stream of a
 * stream arrive and no more; each release lets exactly one more come.
 * per_peer bounds all streams to one peer together. A whole-stream read
 * with fewer credits than chunks still completes (credits flow while it
 * collects).
 */
static void cf_stream_credits(void **state)
{
	enum { N = 64, L = 4 };

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_limits(NEAR, L, 0);
	cf_sget(FAR, "cr_0", 1, CF_SPEC_WORD, 0, N, 0, 20 * CF_SEC, 1, true);
	cf_chunks(NEAR, "cr_0", 1, CF_SPEC_WORD, 0, N, N, -1, 100);
	cf_chunks_in(FAR, 1, 0, L, false);
	cf_none(FAR, 200 * (int)cf_slow()); /* the limit holds: nothing more comes */
	cf_all(NEAR, 100, L, 100);
	cf_none(NEAR, 20);
	for (unsigned i = L; i < N; i++) {
		assert_int_equal(cf_release(FAR, 1), 1);
		cf_chunks_in(FAR, 1, i, 1, i + 1 == N);
		if (i < 12)
			cf_none(FAR, 50); /* one release, one chunk */
		cf_all(NEAR, 100 + i, 1, 100);
	}
	assert_int_equal(cf_release(FAR, 0), L);

	/* The per-peer limit: 3 chunks out over four streams. */
	cf_limits(NEAR, 8, 3);
	for (unsigned s = 0; s < 4; s++) {
		char key[16];

		snprintf(key, sizeof(key), "pl%u_0", s);
		cf_sget(FAR, key, 20 + s, CF_SPEC_WORD, 0, 2, 0, 20 * CF_SEC, 20 + s, true);
		cf_chunks(NEAR, key, 20 + s, CF_SPEC_WORD, 0, 2, 2, -1, 200 + 10 * s);
	}
	for (unsigned k = 0; k < 3; k++)
		assert_int_equal(cf_wait_for(FAR, UINT64_MAX, CF_WAIT_NS).ok, 1);
	cf_none(FAR, 200 * (int)cf_slow());
	for (unsigned k = 3; k < 8; k++) {
		assert_int_equal(cf_release(FAR, 1), 1);
		assert_int_equal(cf_wait_for(FAR, UINT64_MAX, CF_WAIT_NS).ok, 1);
		cf_none(FAR, 20);
	}
	assert_int_equal(cf_release(FAR, 0), 3);
	for (unsigned s = 0; s < 4; s++)
		cf_all(NEAR, 200 + 10 * s, 2, 200 + 10 * s);

	/* Whole: one CQE with all 40 chunks, through 2 credits. */
	cf_limits(NEAR, 2, 0);
	cf_sget(FAR, "wh_0", 30, CF_SPEC_WHOLE, 0, 40, FERRY_SQE_STREAM_WHOLE, 20 * CF_SEC, 30,
		false);
	cf_chunks(NEAR, "wh_0", 30, CF_SPEC_WHOLE, 0, 40, 40, -1, 300);
	cf_expect(FAR, 30, 40);
	cf_all(NEAR, 300, 40, 300);
	cf_finish();
}

/*
 * Chunks that arrive before any STREAM_GET wait under their keys
 * "{stream}_{n}": a plain GET takes one, a STREAM_GET then reads on from
 * the next. Plain GETs of every chunk give back their credits.
 */
static void cf_stream_plain_get(void **state)
{
	char key[32];

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_chunks(NEAR, "pg_0", 5, CF_SPEC_VARIED, 0, 5, 5, -1, 100);
	cf_all(NEAR, 100, 5, 100);
	cf_get(FAR, "pg_0_0", cf_chunk_len(CF_SPEC_VARIED, 0, 5), cf_chunk_seed(5, 0), CF_INTO,
	       700, FERRY_SQE_NOWAIT, 0, 1, false);
	cf_expect(FAR, 1, 0);
	cf_sget(FAR, "pg_0", 5, CF_SPEC_VARIED, 1, 5, 0, 10 * CF_SEC, 2, false);
	cf_chunks_in(FAR, 2, 1, 4, true);

	cf_limits(NEAR, 4, 0);
	cf_chunks(NEAR, "pq_0", 6, CF_SPEC_WORD, 0, 12, 12, -1, 200);
	for (unsigned i = 0; i < 12; i++) {
		snprintf(key, sizeof(key), "pq_0_%u", i);
		cf_get(FAR, key, 8, cf_chunk_seed(6, i), CF_INTO, 8, 0, 10 * CF_SEC, 10 + i, false);
		cf_expect(FAR, 10 + i, 0);
	}
	cf_all(NEAR, 200, 12, 200);
	cf_finish();
}

/* An END chunk may be empty, and a stream may be nothing but one; no chunk after the END. */
static void cf_stream_empty_end(void **state)
{
	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_sget(FAR, "ee_0", 3, CF_SPEC_VARIED, 0, 4, 0, 10 * CF_SEC, 1, false);
	cf_chunks(NEAR, "ee_0", 3, CF_SPEC_VARIED, 0, 4, 4, -1, 100);
	cf_all(NEAR, 100, 4, 100);
	cf_chunks_in(FAR, 1, 0, 4, true);
	for (int mode = 0; mode < 3; mode++) {
		char key[16];
		uint64_t u = 10 * (uint64_t)(mode + 1);

		snprintf(key, sizeof(key), "eo%d_0", mode);
		assert_int_equal(cf_sput(NEAR, key, 0, cf_chunk_seed(u, 0), mode,
					 FERRY_SQE_STREAM_END, 10 * CF_SEC, u),
				 0);
		cf_expect(NEAR, u, 0);
		assert_int_equal(cf_sput(NEAR, key, 8, 1, CF_IOV, 0, 10 * CF_SEC, u + 1), 0);
		cf_expect(NEAR, u + 1, -EPIPE); /* after the END */
		cf_sget(FAR, key, u, CF_SPEC_VARIED, 0, 1, 0, 10 * CF_SEC, u + 2, false);
		cf_chunks_in(FAR, u + 2, 0, 1, true);
	}
	cf_finish();
}

/*
 * Abort: chunks waiting for credit end with -ECANCELED, the abort
 * completes once the consumer knows, and the consumer's STREAM_GET ends
 * after the chunks that came with -ECANCELED and the reason. An abort
 * after the END has nothing to abort: -EPIPE.
 */
static void cf_stream_abort(void **state)
{
	static const char reason[] = "talker crashed: OOM";
	struct cf_done d;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_limits(NEAR, 2, 0);
	cf_chunks(NEAR, "ab_0", 1, CF_SPEC_WORD, 0, 6, 0, -1, 100);
	cf_all(NEAR, 100, 2, 100); /* two went, four wait for credit */
	cf_none(NEAR, 20);
	cf_abort(NEAR, "ab_0", reason, 50);
	cf_expect(NEAR, 50, 0);
	cf_all_res(NEAR, 102, 4, -ECANCELED);
	cf_sget(FAR, "ab_0", 1, CF_SPEC_WORD, 0, 0, 0, 10 * CF_SEC, 1, false);
	cf_chunks_in(FAR, 1, 0, 2, false);
	d = cf_expect(FAR, 1, -ECANCELED);
	assert_false(d.flags & FERRY_CQE_F_MORE);
	assert_int_equal(d.len, strlen(reason));
	assert_string_equal(d.text, reason);

	cf_chunks(NEAR, "ae_0", 2, CF_SPEC_WORD, 0, 1, 1, CF_IOV, 200);
	cf_expect(NEAR, 200, 0);
	cf_abort(NEAR, "ae_0", "late", 201);
	cf_expect(NEAR, 201, -EPIPE);
	cf_sget(FAR, "ae_0", 2, CF_SPEC_WORD, 0, 1, 0, 10 * CF_SEC, 2, false);
	cf_chunks_in(FAR, 2, 0, 1, true);
	cf_finish();
}

/* A STREAM_GET's deadline is a gap: re-armed at every chunk, -ETIMEDOUT when one is late. */
static void cf_stream_gap_deadline(void **state)
{
	int64_t gap = 300 * MS * cf_slow(), last = 0;
	struct cf_done d;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	/* Connected first: the gap before chunk 0 is not a handshake's (slow under valgrind). */
	assert_int_equal(cf_put(NEAR, "warm", 8, 1, CF_IOV, 0, 10 * CF_SEC, 1), 0);
	cf_expect(NEAR, 1, 0);
	cf_sget(FAR, "gap_0", 9, CF_SPEC_WORD, 0, 0, 0, (uint64_t)gap, 1, false);
	for (unsigned i = 0; i < 3; i++) {
		usleep((useconds_t)(gap * 2 / 5 / 1000)); /* each gap shorter, the sum longer */
		cf_chunks(NEAR, "gap_0", 9, CF_SPEC_WORD, i, i + 1, 0, CF_IOV, 100);
		d = cf_wait_for(FAR, 1, CF_WAIT_NS);
		assert_int_equal(d.res, (int)i);
		assert_true(d.ok && (d.flags & FERRY_CQE_F_MORE));
		last = d.at;
	}
	d = cf_expect(FAR, 1, -ETIMEDOUT);
	assert_false(d.flags & FERRY_CQE_F_MORE);
	assert_true(d.at - last >= gap / 2); /* from the last chunk on, not from the first */
	assert_true(d.at - last < 2 * SEC * cf_slow());
	cf_all(NEAR, 100, 3, 100);
	cf_finish();
}

/* STREAM_ACCEPT: one CQE per new stream from the peer, with its key; none for a later chunk. */
static void cf_stream_accept(void **state)
{
	bool seen[3] = { false };

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_accept(FAR, 5);
	cf_barrier(FAR);
	cf_chunks(NEAR, "acc0_0", 1, CF_SPEC_WORD, 0, 1, 0, CF_IOV, 100);
	cf_chunks(NEAR, "acc1_0", 2, CF_SPEC_WORD, 0, 1, 0, CF_BUF, 110);
	cf_chunks(NEAR, "acc0_0", 1, CF_SPEC_WORD, 1, 2, 0, CF_IOV, 100); /* not new */
	cf_chunks(NEAR, "acc2_0", 3, CF_SPEC_WORD, 0, 1, 1, CF_IOV, 120);
	for (unsigned i = 0; i < 3; i++) {
		struct cf_done d = cf_expect(FAR, 5, 0);

		assert_true(d.flags & FERRY_CQE_F_MORE);
		assert_int_equal(d.len, 6);
		assert_true(strncmp(d.text, "acc", 3) == 0 && d.text[3] >= '0' && d.text[3] <= '2');
		assert_string_equal(d.text + 4, "_0");
		assert_false(seen[d.text[3] - '0']);
		seen[d.text[3] - '0'] = true;
	}
	cf_none(FAR, 50);
	cf_cancel(FAR, 5, 6);
	cf_expect(FAR, 6, 0);
	cf_expect(FAR, 5, -ECANCELED);
	cf_all(NEAR, 100, 2, 100);
	cf_all(NEAR, 110, 1, 110);
	cf_all(NEAR, 120, 1, 120);
	cf_sget(FAR, "acc0_0", 1, CF_SPEC_WORD, 0, 0, 0, 10 * CF_SEC, 7, false);
	cf_chunks_in(FAR, 7, 0, 2, false);
	cf_finish();
}

/* The producer dies: the consumer's STREAM_GET ends with -ECONNRESET within a second. */
static void cf_stream_producer_death(void **state)
{
	struct cf_done d;
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_sget(NEAR, "pd_0", 4, CF_SPEC_WORD, 0, 0, 0, 30 * CF_SEC, 1, false);
	cf_chunks(FAR, "pd_0", 4, CF_SPEC_WORD, 0, 3, 0, -1, 100);
	cf_all(FAR, 100, 3, 100);
	cf_chunks_in(NEAR, 1, 0, 3, false);
	t0 = t_now();
	cf_kill_far();
	d = cf_expect(NEAR, 1, -ECONNRESET); /* the death, not the deadline */
	assert_false(d.flags & FERRY_CQE_F_MORE);
	assert_true(d.at - t0 < 1 * SEC * cf_slow());
	cf_finish();
}

/*
 * The consumer dies holding its credits: the producer's chunks that wait
 * for credit fail at once, and later ones fail fast.
 */
static void cf_stream_consumer_death(void **state)
{
	int64_t t0;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_limits(NEAR, 2, 0);
	cf_sget(FAR, "cd_0", 5, CF_SPEC_WORD, 0, 0, 0, 30 * CF_SEC, 1, true);
	cf_chunks(NEAR, "cd_0", 5, CF_SPEC_WORD, 0, 6, 0, -1, 100);
	cf_all(NEAR, 100, 2, 100);
	cf_chunks_in(FAR, 1, 0, 2, false);
	cf_none(NEAR, 50);
	t0 = t_now();
	cf_kill_far();
	for (unsigned i = 2; i < 7; i++) {
		struct cf_done d;

		if (i == 6) /* a later chunk fails fast too */
			cf_chunks(NEAR, "cd_0", 5, CF_SPEC_WORD, 6, 7, 0, CF_IOV, 100);
		d = cf_wait_for(NEAR, 100 + i, CF_WAIT_NS);
		if (d.res != -ECONNRESET && d.res != -EPIPE && d.res != -EHOSTUNREACH)
			fail_msg("chunk %u: %d (%s)", i, d.res, ferry_err_name(d.res));
		assert_true(d.at - t0 < (i == 6 ? 3 : 1) * SEC * cf_slow());
	}
	cf_finish();
}

/*
 * A stream whose consumer died stays failed, also once a new engine of its
 * name is up: every later STREAM_PUT fails with the stream's error and the
 * new consumer sees nothing (no chunk, no new stream, no abort) until the
 * producer cleans its request up; then the key starts a new stream at
 * chunk 0.
 */
static void cf_stream_failed_stays_failed(void **state)
{
	struct cf_done d;
	int err;

	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	cf_sget(FAR, "ff_0", 6, CF_SPEC_WORD, 0, 0, 0, 5 * CF_SEC, 1, false);
	cf_chunks(NEAR, "ff_0", 6, CF_SPEC_WORD, 0, 1, 0, CF_IOV, 100);
	cf_all(NEAR, 100, 1, 100);
	cf_chunks_in(FAR, 1, 0, 1, false);
	cf_kill_far();
	cf_chunks(NEAR, "ff_0", 6, CF_SPEC_WORD, 1, 2, 0, CF_IOV, 100);
	d = cf_wait_for(NEAR, 101, CF_WAIT_NS);
	assert_true(d.res < 0 && d.res != -ETIME);
	err = d.res;

	cf_restart_far();
	cf_accept(FAR, 9);
	cf_sget(FAR, "ff_0", 6, CF_SPEC_WORD, 0, 0, 0, 300 * MS * cf_slow(), 2, false);
	cf_barrier(FAR);
	cf_chunks(NEAR, "ff_0", 6, CF_SPEC_WORD, 2, 5, 5, -1, 100);
	cf_all_res(NEAR, 102, 3, err); /* still failed, not chunk 0 of a new stream */
	cf_abort(NEAR, "ff_0", "gone", 110);
	cf_expect(NEAR, 110, err); /* not sent: the new consumer never saw the stream */
	cf_expect(FAR, 2, -ETIMEDOUT);
	cf_none(FAR, 50);

	cf_cleanup(NEAR, "ff", 111);
	cf_expect(NEAR, 111, 1);
	cf_sget(FAR, "ff_0", 7, CF_SPEC_WORD, 0, 1, 0, 10 * CF_SEC, 3, false);
	cf_chunks(NEAR, "ff_0", 7, CF_SPEC_WORD, 0, 1, 1, CF_BUF, 120);
	cf_all(NEAR, 120, 1, 120);
	cf_chunks_in(FAR, 3, 0, 1, true);
	cf_cancel(FAR, 9, 10); /* the acceptor heard of no stream (its STREAM_GETs came first) */
	cf_expect(FAR, 10, 0);
	cf_expect(FAR, 9, -ECANCELED);
	cf_finish();
}

/*
 * CLEANUP of a request on the consumer: its keys that came and were not
 * taken are dropped (their blocks go home), its waiting GETs and its
 * STREAM_GET end with -ECANCELED; another request's keys and streams are
 * untouched. On the producer: its stream ends, chunks waiting for credit
 * fail with -ECANCELED.
 */
static void cf_cleanup_request(void **state)
{
	(void)state;
	cf_open(&(struct cf_cfg){ 0 });
	assert_int_equal(cf_put(NEAR, "req7_a", 100, 1, CF_IOV, 0, 10 * CF_SEC, 1), 0);
	assert_int_equal(cf_put(NEAR, "req7:b", 300000, 2, CF_BUF, 0, 10 * CF_SEC, 2), 0);
	assert_int_equal(cf_put(NEAR, "req8_a", 100, 3, CF_IOV, 0, 10 * CF_SEC, 3), 0);
	assert_int_equal(cf_put(NEAR, "req70", 100, 4, CF_IOV, 0, 10 * CF_SEC, 4), 0);
	cf_all_res(NEAR, 1, 4, 0);
	cf_get(FAR, "req7_c", 10, 5, CF_ZC, 0, 0, 30 * CF_SEC, 5, false);
	cf_limits(NEAR, 1, 0);
	cf_sget(FAR, "req7_0", 6, CF_SPEC_WORD, 0, 0, 0, 30 * CF_SEC, 6, true);
	cf_sget(FAR, "req8_0", 7, CF_SPEC_WORD, 0, 0, 0, 30 * CF_SEC, 7, false);
	cf_chunks(NEAR, "req7_0", 6, CF_SPEC_WORD, 0, 4, 0, CF_IOV, 100);
	cf_all(NEAR, 100, 1, 100);
	cf_chunks_in(FAR, 6, 0, 1, false); /* held: chunks 1..3 wait for credit */
	cf_none(NEAR, 20);

	cf_cleanup(FAR, "req7", 8);
	cf_expect(FAR, 8, 4); /* two keys, one waiting GET, one stream */
	cf_expect(FAR, 5, -ECANCELED);
	cf_expect(FAR, 6, -ECANCELED);
	assert_int_equal(cf_release(FAR, 0), 1);
	cf_get(FAR, "req7_a", 100, 1, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, 9, false);
	cf_expect(FAR, 9, -EAGAIN);
	cf_get(FAR, "req7:b", 300000, 2, CF_ZC, 0, FERRY_SQE_NOWAIT, 0, 10, false);
	cf_expect(FAR, 10, -EAGAIN);
	cf_get(FAR, "req8_a", 100, 3, CF_INTO, 100, FERRY_SQE_NOWAIT, 0, 11, false);
	cf_expect(FAR, 11, 0);
	cf_get(FAR, "req70", 100, 4, CF_INTO, 100, FERRY_SQE_NOWAIT, 0, 12, false);
	cf_expect(FAR, 12, 0); /* another request, though its name starts alike */
	cf_none(FAR, 50); /* req8's STREAM_GET still waits */
	if (cf_t->credit_after_cleanup)
		cf_all(NEAR, 101, 1, 100); /* the release gave a credit: chunk 1 went */
	cf_none(NEAR, 100); /* no (more) credit for a stream the consumer dropped */
	/* It waits there as a plain key (taking it would give the next credit). */
	assert_int_equal(cf_health(FAR, "\"ops\":{", "keys_held"), cf_t->credit_after_cleanup);
	/* The dropped data went home; waiting chunks hold no block. */
	cf_blocks_settle(NEAR, cf_t->credit_after_cleanup);

	cf_cleanup(NEAR, "req7", 13);
	cf_expect(NEAR, 13, 1); /* its stream */
	cf_all_res(NEAR, 101 + cf_t->credit_after_cleanup, 3 - cf_t->credit_after_cleanup,
		   -ECANCELED);
	cf_cancel(FAR, 7, 14);
	cf_expect(FAR, 14, 0);
	cf_expect(FAR, 7, -ECANCELED);
	cf_finish();
}

/* ------------------------------------------------------------------ */
/* The program                                                         */
/* ------------------------------------------------------------------ */

#define CF_CASE(name) { #name, cf_##name, cf_setup, cf_teardown, NULL }

/* Run every case over each transport of ts (n of them), each case apart. */
static inline int cf_main(const struct cf_transport *const *ts, unsigned n)
{
	static const struct CMUnitTest cases[] = {
		CF_CASE(order),
		CF_CASE(sizes_near_to_far),
		CF_CASE(sizes_far_to_near),
		CF_CASE(get_before_put),
		CF_CASE(nowait),
		CF_CASE(get_deadline),
		CF_CASE(put_deadline),
		CF_CASE(put_to_nobody),
		CF_CASE(cancel_waiting_get),
		CF_CASE(exists_and_replace),
		CF_CASE(msgsize_keeps_key),
		CF_CASE(key_table_full),
		CF_CASE(receiver_pool_full),
		CF_CASE(sender_pool_full),
		CF_CASE(peer_death),
		CF_CASE(peer_death_mid_transfer),
		CF_CASE(peer_restart),
		CF_CASE(stream_order),
		CF_CASE(stream_credits),
		CF_CASE(stream_plain_get),
		CF_CASE(stream_empty_end),
		CF_CASE(stream_abort),
		CF_CASE(stream_gap_deadline),
		CF_CASE(stream_accept),
		CF_CASE(stream_producer_death),
		CF_CASE(stream_consumer_death),
		CF_CASE(stream_failed_stays_failed),
		CF_CASE(cleanup_request),
	};
	int failed = 0, skipped = 0;

	for (unsigned i = 0; i < n; i++) {
		char group[128];
		int rc;

		cf_t = ts[i];
		snprintf(group, sizeof(group), "%s/%s%s", program_invocation_short_name,
			 ts[i]->name, ts[i]->progress == FERRY_PROGRESS_MANUAL ? "-manual" : "");
		rc = t_run_cases_apart(group, cases, sizeof(cases) / sizeof(cases[0]), NULL, NULL);
		if (rc == 77)
			skipped++;
		else
			failed += rc;
	}
	return failed ? failed : skipped == (int)n ? 77 : 0;
}

#endif

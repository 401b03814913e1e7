/*
 * fuzz/fuzz_shm_ring.c - the shm transport's descriptor parser: what
 * backends/shm/shm.c (conn_progress, take_put, take_inline, take_ctrl,
 * ring_room) makes of the entries and the words a peer writes into the
 * shared rings (shm_wire.h), with the engine's real accounting of the
 * blocks it lent.
 *
 * The rings are memory, read by the engine's rounds: the harness is the
 * peer, as tests/test_shm_hostile.c is. One long-lived engine ("fzs",
 * MANUAL progress); each input is one connection to it: the harness calls
 * it as "fzevil" over its unix socket with a hello carrying its pool (one
 * 1 MiB memfd, the same for every input), doorbell, wake page and a fresh
 * rings memfd, waits for the engine's hello, writes the input's entries,
 * and drives the engine after each. Then it hangs up, drops every key the
 * entries may have stored, and checks that the GETs waiting on us gave up,
 * that the engine gave back every block (the ones it lent us included) and
 * that it closed every descriptor we handed over (FZ_FAIL otherwise).
 *
 * Input: one options byte, then records until the input ends.
 *   option bits 0, 1  the engine PUTs one, or two, 4 KiB pool blocks to us
 *                     first (lent: SHM_D_PUT); bit 2: and 100 bytes (inline)
 *   option bit 3      our hello lacks SHM_CAP_RESULT_FREE
 *   option bit 4      a GET of "k1" from us into 512 bytes waits at the
 *                     engine; bit 5: a zero-copy GET of "k2"
 *   record byte r, r % 4 == 0: a PUT entry: its 44 bytes after seq (type,
 *     key_len, flags, resv, op_cookie, buf_cookie, offset, len, as in
 *     struct shm_put_desc), then a body length byte and that many body
 *     bytes (key, inline data); the rest of the body zero
 *   r % 4 == 1: a control entry: its 36 bytes after seq (type, resv0, res,
 *     resv1, op_cookie, buf_cookie, offset)
 *   r % 4 == 2: a 32-bit value written into a word the engine reads:
 *     (r >> 2) % 6 = our heads of its PUT and control rings, the want_room
 *     words of ours, our wake page's sleeping and doorbell_rung
 *   r % 4 == 3: drive the engine until it is quiet (entries are published
 *     one by one, each driven a few rounds, anyway)
 * An entry's seq is its position + 1 (ready), unless (r >> 2) bit 0 is
 * set: then a 32-bit seq follows the record byte (entries only). Fix-up for control
 * entries, so that the fuzzer can name what the engine lent: with
 * (r >> 2) bit 1 set, op_cookie, buf_cookie and offset come from the
 * engine's PUT of index buf_cookie % 8 as we received it.
 */
#include "shm_peer.h"

#define FZ_ENGINE "fzs"
#define FZ_EVIL "fzevil"
#define EVIL_POOL (1u << 20)
#define FZ_LENT 8

static struct ferry_engine *eng;
static struct ferry_peer *evil;
static int evil_pool_fd = -1, wake_fd = -1, bell_fd = -1;
static uint8_t *evil_pool;
static struct wake_page *evil_wake;
static struct fz_idle idle;
static uint64_t op_seq;

/* The engine's PUTs to us, as read from its ring. */
struct seen {
	uint64_t op_cookie, buf_cookie, offset;
};

static void setup(void)
{
	struct fz_engine_opts o = { .name = FZ_ENGINE, .pool = 4u << 20 };

	eng = fz_engine(&o);
	evil = fz_peer(eng, FZ_EVIL);
	evil_pool_fd = fz_memfd("fz-evil-pool", EVIL_POOL, true);
	wake_fd = fz_memfd("fz-evil-wake", 4096, true);
	bell_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (bell_fd < 0)
		FZ_FAIL("eventfd");
	evil_pool = fz_map(evil_pool_fd, EVIL_POOL);
	memset(evil_pool, 0x6b, EVIL_POOL);
	evil_wake = fz_map(wake_fd, 4096);
	fz_settle(eng, 16);
	fz_idle_take(eng, &idle, true);
}

static void teardown(void)
{
	if (eng)
		ferry_engine_destroy(eng);
	eng = NULL;
}

FZ_INITIALIZE(setup, teardown)

static uint8_t get_into[512];
static struct iovec get_iov = { get_into, sizeof(get_into) };

/* A GET of key from us, into get_into or (!into) zero copy. */
static void get(const char *key, bool into)
{
	struct ferry_sq *sq;
	struct ferry_sqe *sqe = fz_sqe(eng, &sq);

	ferry_prep_get(sqe, evil, key, into ? &get_iov : NULL, into ? 1 : 0, ++op_seq);
	ferry_sqe_set_timeout(sqe, 5ull * 1000000000ull);
	ferry_sq_submit(sq);
}

/* The engine's new PUT entries in its ring to us (dir[1]). */
static void read_engine_puts(struct shm_dir *rx, uint32_t *head, struct seen *seen,
			     unsigned *nseen)
{
	for (;;) {
		const struct shm_put_desc *d = &rx->puts[*head % SHM_PUT_ENTRIES];

		if (atomic_load(&d->seq) != *head + 1)
			return;
		if (*nseen < FZ_LENT) {
			seen[*nseen].op_cookie = d->op_cookie;
			seen[*nseen].buf_cookie = d->buf_cookie;
			seen[*nseen].offset = d->offset;
			(*nseen)++;
		}
		(*head)++;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_in in = { data, size };
	uint8_t opt = fz_u8(&in);
	struct shm_hello h, back;
	struct shm_rings *rings;
	struct shm_dir *tx, *rx;
	struct seen seen[FZ_LENT];
	struct fz_keys keys;
	uint32_t put_tail = 0, ctrl_tail = 0, rx_head = 0;
	unsigned nseen = 0, gets = 0;
	int ring_fd, sock, fds[4];

	fz_idle_fds(&idle);
	keys.len = 0;
	keys.buf[0] = '\0';
	ring_fd = fz_memfd("fz-evil-rings", SHM_RINGS_BYTES, true);
	rings = fz_map(ring_fd, SHM_RINGS_BYTES);
	tx = &rings->dir[0];
	rx = &rings->dir[1];
	memset(evil_wake, 0, 4096);
	sock = shm_sock_connect(FZ_NS, FZ_ENGINE);
	if (sock < 0)
		FZ_FAIL("connect to %s: %s", FZ_ENGINE, ferry_strerror(sock));
	memset(&h, 0, sizeof(h));
	snprintf(h.ns, sizeof(h.ns), "%s", FZ_NS);
	snprintf(h.name, sizeof(h.name), "%s", FZ_EVIL);
	h.pool_size = EVIL_POOL;
	h.ring_entries = SHM_PUT_ENTRIES;
	h.ring_bytes = (uint32_t)SHM_RINGS_BYTES;
	h.caps = (opt & 8) ? 0 : SHM_CAP_RESULT_FREE;
	fds[0] = evil_pool_fd;
	fds[1] = bell_fd;
	fds[2] = wake_fd;
	fds[3] = ring_fd;
	if (shm_sock_send_hello(sock, &h, fds, 4) || fz_shm_await_hello(eng, sock, &back))
		FZ_FAIL("the engine did not answer a right hello");
	if (opt & 1)
		fz_put(eng, evil, "v0", 4096, ++op_seq);
	if (opt & 2)
		fz_put(eng, evil, "v1", 4096, ++op_seq);
	if (opt & 4)
		fz_put(eng, evil, "v2", 100, ++op_seq);
	if (opt & 16)
		get("k1", true);
	if (opt & 32)
		get("k2", false);
	gets = !!(opt & 16) + !!(opt & 32);
	fz_settle(eng, 64);
	read_engine_puts(rx, &rx_head, seen, &nseen);

	while (fz_left(&in)) {
		uint8_t r = fz_u8(&in), sub = r >> 2;
		bool raw_seq = r % 4 < 2 && (sub & 1);
		uint32_t seq = raw_seq ? fz_u32(&in) : 0;

		switch (r % 4) {
		case 0: {
			struct shm_put_desc *d = &tx->puts[put_tail % SHM_PUT_ENTRIES];
			uint8_t body_len;

			fz_bytes(&in, (uint8_t *)d + 4, 44);
			body_len = fz_u8(&in);
			memset(d->body, 0, sizeof(d->body));
			fz_bytes(&in, d->body, body_len);
			if (d->key_len && d->key_len < FERRY_KEY_MAX)
				fz_keys_add(&keys, d->body, strnlen(d->body, d->key_len));
			atomic_store(&d->seq, raw_seq ? seq : put_tail + 1);
			put_tail++;
			break;
		}
		case 1: {
			struct shm_ctrl_desc *d = &tx->ctrls[ctrl_tail % SHM_CTRL_ENTRIES];

			fz_bytes(&in, (uint8_t *)d + 4, 36);
			if ((sub & 2) && nseen) {
				const struct seen *s = &seen[d->buf_cookie % nseen];

				d->op_cookie = s->op_cookie;
				d->buf_cookie = s->buf_cookie;
				d->offset = s->offset;
			}
			atomic_store(&d->seq, raw_seq ? seq : ctrl_tail + 1);
			ctrl_tail++;
			break;
		}
		case 2: {
			_Atomic uint32_t *words[4] = { &rx->put.head, &rx->ctrl.head,
						       &tx->put.want_room, &tx->ctrl.want_room };
			uint32_t v = fz_u32(&in);
			unsigned w = (unsigned)sub % 6;

			if (w < 4)
				atomic_store(words[w], v);
			else if (w == 4)
				atomic_store(&evil_wake->sleeping, (int)v);
			else
				atomic_store(&evil_wake->doorbell_rung, (int)v);
			break;
		}
		default:
			break;
		}
		fz_settle(eng, r % 4 == 3 ? FZ_SHM_ROUNDS : 8);
		read_engine_puts(rx, &rx_head, seen, &nseen);
	}
	fz_settle(eng, FZ_SHM_ROUNDS);

	/* Hang up; the engine fails what rode the connection and lets go of our memory. */
	close(sock);
	munmap(rings, SHM_RINGS_BYTES);
	close(ring_fd);
	fz_keys_add(&keys, "k1", 2);
	fz_keys_add(&keys, "k2", 2);
	/* GETs waiting on a peer that hung up give up (or were served before). */
	for (int round = 0; gets && round < 8 * FZ_SHM_ROUNDS; round++) {
		struct ferry_cqe c[16];
		int n;

		ferry_progress(eng);
		while ((n = ferry_cq_poll(ferry_cq_default(eng), c, 16)) > 0)
			for (int i = 0; i < n; i++) {
				gets -= c[i].opcode == FERRY_OP_GET;
				if (c[i].buf)
					ferry_buf_release(c[i].buf);
			}
	}
	if (gets)
		FZ_FAIL("%u GETs still wait on a peer that hung up", gets);
	/*
	 * Our PUTs resolved peer fzevil to the connection: it keeps it (its
	 * mappings, our doorbell and its socket) until the next PUT to fzevil
	 * finds it dead and lets go. Make that PUT (it fails: nobody of that
	 * name listens), so that the descriptors can be counted.
	 */
	if (opt & 7)
		fz_put(eng, evil, "again", 8, ++op_seq);
	fz_engine_clean(eng, evil, keys.buf, &idle);
	/* eventfd counter: keep it from filling up over a long run. */
	{
		uint64_t v;

		while (read(bell_fd, &v, sizeof(v)) == sizeof(v))
			;
	}
	return 0;
}

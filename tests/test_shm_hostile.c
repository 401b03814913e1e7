/*
 * tests/test_shm_hostile.c - a peer that breaks the shm protocol.
 *
 * The "evil" side here is not an engine: it shakes hands with a real
 * engine through shm_sock like a peer would, then writes what it likes into
 * the shared rings. The engine must disconnect it, never read or write out
 * of bounds (ASan/valgrind watch), keep what was delivered correctly, and
 * go on serving everyone else.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "shm_sock.h"
#include "shm_wire.h"

#define EVIL_POOL (1u << 20)

static char rundir[256];

struct evil {
	int sock;
	int fds[4]; /* pool, doorbell, wake, rings */
	uint8_t *pool;
	struct shm_rings *rings;
	struct shm_dir *tx, *rx;
	int peer_fds[SHM_MAX_FDS];
	unsigned npeer;
	uint32_t put_tail, ctrl_tail; /* our positions in our rings */
};

static int setup(void **state)
{
	(void)state;
	snprintf(rundir, sizeof(rundir), "/tmp/ferry-test-hostile-XXXXXX");
	if (!mkdtemp(rundir))
		return -1;
	setenv("FERRY_RUNTIME_DIR", rundir, 1);
	ferry_log_set(getenv("FERRY_LOG") ? FERRY_LOG_DEBUG : -1, NULL, NULL); /* the disconnects log by design */
	alarm(t_under_valgrind() ? 600 : 60);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	alarm(0);
	rmdir(rundir);
	return 0;
}

static struct ferry_engine *engine_h(const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;

	p.name = name;
	p.ns = "h";
	p.pool_size = 4u << 20;
	assert_int_equal(ferry_engine_create(&p, &e), 0);
	return e;
}

static struct ferry_engine *victim(void)
{
	return engine_h("victim");
}

static void seal(int fd)
{
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
}

/* Send our hello as `name` with our memory, sealed or not. */
static void evil_hello(struct evil *v, const char *name, int sealed)
{
	struct shm_hello h;

	memset(v, 0, sizeof(*v));
	v->sock = shm_sock_connect("h", "victim");
	assert_true(v->sock >= 0);
	v->fds[0] = memfd_create("evil-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	v->fds[1] = eventfd(0, EFD_CLOEXEC);
	v->fds[2] = memfd_create("evil-wake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	v->fds[3] = memfd_create("evil-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(ftruncate(v->fds[0], EVIL_POOL), 0);
	assert_int_equal(ftruncate(v->fds[2], 4096), 0);
	assert_int_equal(ftruncate(v->fds[3], (off_t)SHM_RINGS_BYTES), 0);
	if (sealed) {
		seal(v->fds[0]);
		seal(v->fds[2]);
		seal(v->fds[3]);
	}
	v->pool = mmap(NULL, EVIL_POOL, PROT_READ | PROT_WRITE, MAP_SHARED, v->fds[0], 0);
	v->rings = mmap(NULL, SHM_RINGS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, v->fds[3], 0);
	assert_true(v->pool != MAP_FAILED && v->rings != MAP_FAILED);
	v->tx = &v->rings->dir[0];
	v->rx = &v->rings->dir[1];
	memset(&h, 0, sizeof(h));
	snprintf(h.ns, sizeof(h.ns), "h");
	snprintf(h.name, sizeof(h.name), "%s", name);
	h.pool_size = EVIL_POOL;
	h.ring_entries = SHM_PUT_ENTRIES;
	h.ring_bytes = (uint32_t)SHM_RINGS_BYTES;
	assert_int_equal(shm_sock_send_hello(v->sock, &h, v->fds, 4), 0);
}

/* Shake hands with the victim as "evil" (a name of our choosing). */
static void evil_connect(struct evil *v, const char *name)
{
	struct shm_hello back;

	evil_hello(v, name, 1);
	v->npeer = SHM_MAX_FDS;
	assert_int_equal(shm_sock_recv_hello(v->sock, &back, v->peer_fds, &v->npeer, 5000), 0);
	assert_string_equal(back.name, "victim");
	assert_int_equal(v->npeer, 3);
}

static void evil_close(struct evil *v)
{
	munmap(v->pool, EVIL_POOL);
	munmap(v->rings, SHM_RINGS_BYTES);
	for (int i = 0; i < 4; i++)
		close(v->fds[i]);
	for (unsigned i = 0; i < v->npeer; i++)
		close(v->peer_fds[i]);
	close(v->sock);
}

/*
 * Put one PUT descriptor into the ring and ring the victim's doorbell;
 * data (when not NULL) goes inside the entry, as an inline PUT's does.
 */
static void evil_put_type(struct evil *v, uint32_t type, const char *key, uint64_t offset,
			  uint64_t len, uint64_t buf_cookie, const void *data)
{
	uint32_t tail = v->put_tail++;
	struct shm_put_desc *d = &v->tx->puts[tail % SHM_PUT_ENTRIES];
	uint64_t one = 1;

	memset(d, 0, sizeof(*d));
	d->type = (uint16_t)type;
	d->op_cookie = 7;
	d->buf_cookie = buf_cookie;
	d->offset = offset;
	d->len = len;
	d->key_len = (uint16_t)strlen(key);
	memcpy(d->body, key, d->key_len + 1u);
	if (data)
		memcpy(d->body + shm_inline_at(d->key_len), data, len);
	atomic_store(&d->seq, tail + 1);
	if (t_write(v->peer_fds[1], &one, sizeof(one)) != sizeof(one))
		fail_msg("doorbell");
}

/* Wait for the victim's first control entry (its answer to our first PUT). */
static const struct shm_ctrl_desc *evil_first_answer(struct evil *v)
{
	int64_t end = t_now() + 5 * SEC;

	while (atomic_load(&v->rx->ctrls[0].seq) == 0 && t_now() < end)
		usleep(1000);
	assert_int_equal(atomic_load(&v->rx->ctrls[0].seq), 1);
	return &v->rx->ctrls[0];
}

/* Put one control entry into the ring and ring the victim's doorbell. */
static void evil_ctrl(struct evil *v, uint16_t type, int32_t res, uint64_t op_cookie,
		      uint64_t buf_cookie)
{
	uint32_t tail = v->ctrl_tail++;
	struct shm_ctrl_desc *d = &v->tx->ctrls[tail % SHM_CTRL_ENTRIES];
	uint64_t one = 1;

	d->type = type;
	d->res = res;
	d->op_cookie = op_cookie;
	d->buf_cookie = buf_cookie;
	d->offset = 0;
	atomic_store(&d->seq, tail + 1);
	if (t_write(v->peer_fds[1], &one, sizeof(one)) != sizeof(one))
		fail_msg("doorbell");
}

static void evil_put(struct evil *v, const char *key, uint64_t offset, uint64_t len,
		     uint64_t buf_cookie)
{
	evil_put_type(v, SHM_D_PUT, key, offset, len, buf_cookie, NULL);
}

/* Wait for the victim to hang up on us. Returns 1 if it did. */
static int evil_dropped(struct evil *v, int ms)
{
	struct pollfd p = { .fd = v->sock, .events = POLLIN | POLLRDHUP };
	int64_t end = t_now() + ms * MS;

	while (t_now() < end) {
		if (t_poll(&p, 1, 50) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
			return 1;
	}
	return 0;
}

/* The victim answers a well-formed PUT, and still serves a normal peer. */
static void victim_still_serves(struct ferry_engine *e)
{
	struct ferry_engine *friend = engine_h("friend");
	struct ferry_cqe c;

	t_put(friend, t_peer(friend, "victim"), "hello", "hi", 3, 1, 0);
	t_expect(friend, NULL, 1, 0, NULL);
	t_get(e, t_peer(e, "friend"), "hello", NULL, 0, 2, 0, 5 * SEC);
	t_expect(e, NULL, 2, 0, &c);
	assert_string_equal(ferry_buf_data(c.buf), "hi");
	ferry_buf_release(c.buf);
	ferry_engine_destroy(friend);
}

static void test_well_formed_then_out_of_bounds(void **state)
{
	struct ferry_engine *e = victim();
	struct ferry_peer *from = t_peer(e, "evil");
	struct ferry_cqe c;
	struct evil v;
	const struct shm_ctrl_desc *answer;

	(void)state;
	evil_connect(&v, "evil");
	/* A correct PUT first: it is delivered and answered. */
	memcpy(v.pool + 4096, "fine data", 10);
	evil_put(&v, "ok", 4096, 10, 1);
	answer = evil_first_answer(&v);
	assert_int_equal(answer->type, SHM_C_RESULT);
	assert_int_equal(answer->res, 0);
	/* Now a descriptor pointing past the end of our pool. */
	evil_put(&v, "bad", EVIL_POOL - 8, 4096, 2);
	assert_true(evil_dropped(&v, 5000));
	/* What arrived before is still there and intact. */
	t_get(e, from, "ok", NULL, 0, 3, FERRY_SQE_NOWAIT, 0);
	t_expect(e, NULL, 3, 0, &c);
	assert_string_equal(ferry_buf_data(c.buf), "fine data");
	ferry_buf_release(c.buf);
	evil_close(&v);
	victim_still_serves(e);
	ferry_engine_destroy(e);
}

static void test_garbage_indices_and_descriptors(void **state)
{
	struct ferry_engine *e = victim();
	struct evil v;

	(void)state;
	/* An entry whose sequence word is neither ready nor the last lap's. */
	evil_connect(&v, "evil1");
	atomic_store(&v.tx->puts[0].seq, 1u << 30);
	{
		uint64_t one = 1;

		assert_int_equal(t_write(v.peer_fds[1], &one, sizeof(one)), sizeof(one));
	}
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	/* An unknown descriptor type. */
	evil_connect(&v, "evil2");
	evil_put_type(&v, 99, "x", 0, 1, 1, NULL);
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	/* A key that is not terminated where it says. */
	evil_connect(&v, "evil3");
	{
		uint32_t tail = v.put_tail++;
		struct shm_put_desc *d = &v.tx->puts[tail % SHM_PUT_ENTRIES];
		uint64_t one = 1;

		memset(d, 'A', sizeof(*d));
		d->type = SHM_D_PUT;
		d->flags = 0;
		d->offset = 0;
		d->len = 1;
		d->key_len = 5;
		atomic_store(&d->seq, tail + 1);
		assert_int_equal(t_write(v.peer_fds[1], &one, sizeof(one)), sizeof(one));
	}
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	/* A RELEASE of a block it was never lent, and a RESULT for nothing. */
	evil_connect(&v, "evil4");
	evil_ctrl(&v, SHM_C_RELEASE, 0, 0, 12345);
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	evil_connect(&v, "evil5");
	evil_ctrl(&v, SHM_C_RESULT, 0, ~0ull, ~0ull);
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	/* An inline PUT longer than an inline PUT may be. */
	evil_connect(&v, "evil6");
	evil_put_type(&v, SHM_D_PUT_INLINE, "big", 0, SHM_INLINE_MAX + 1, 0, NULL);
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	/* The RESULT of an inline PUT naming an op the victim cannot have. */
	evil_connect(&v, "evil7");
	evil_ctrl(&v, SHM_C_RESULT_INLINE, 0, ~0ull, 0);
	assert_true(evil_dropped(&v, 5000));
	evil_close(&v);

	victim_still_serves(e);
	ferry_engine_destroy(e);
}

/* A well-formed inline PUT is delivered and answered with RESULT_INLINE. */
static void test_inline_put_delivered(void **state)
{
	struct ferry_engine *e = victim();
	struct ferry_cqe c;
	struct evil v;
	const struct shm_ctrl_desc *answer;

	(void)state;
	evil_connect(&v, "evil");
	evil_put_type(&v, SHM_D_PUT_INLINE, "in", 0, 6, 0, "small");
	answer = evil_first_answer(&v);
	assert_int_equal(answer->type, SHM_C_RESULT_INLINE);
	assert_int_equal(answer->res, 0);
	assert_int_equal(answer->op_cookie, 7);
	t_get(e, t_peer(e, "evil"), "in", NULL, 0, 3, FERRY_SQE_NOWAIT, 0);
	t_expect(e, NULL, 3, 0, &c);
	assert_string_equal(ferry_buf_data(c.buf), "small");
	ferry_buf_release(c.buf);
	evil_close(&v);
	ferry_engine_destroy(e);
}

/*
 * Memory a peer could shrink under our mapping (a memfd not sealed against
 * shrinking) is refused at the handshake: reading it later would fault.
 */
static void test_unsealed_memory_refused(void **state)
{
	struct ferry_engine *e = victim();
	struct evil v;

	(void)state;
	evil_hello(&v, "loose", 0);
	assert_true(evil_dropped(&v, 5000)); /* no answer, just a hang-up */
	evil_close(&v);
	victim_still_serves(e);
	ferry_engine_destroy(e);
}

/* A caller that connects and never says hello costs little and gets nothing. */
static void test_silent_caller(void **state)
{
	struct ferry_engine *e = victim();
	int s = shm_sock_connect("h", "victim");
	int64_t t0;

	(void)state;
	assert_true(s >= 0);
	t0 = t_now();
	victim_still_serves(e);
	assert_true(t_now() - t0 < 5 * SEC);
	close(s);
	ferry_engine_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_well_formed_then_out_of_bounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage_indices_and_descriptors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inline_put_delivered, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unsealed_memory_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_silent_caller, setup, teardown),
	};

	return t_run_group_apart(tests, NULL, NULL);
}

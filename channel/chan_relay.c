/*
 * channel/chan_relay.c - the relay of one host for a channel whose writer
 * is on another host: one message crosses the network once per host, and
 * the relay gives it to the readers of its host as a writer of that host
 * does (one copy into its pool, shared by every reader over shm).
 *
 * The first reader of a host to open the channel creates the relay: an
 * engine of its own, "fcr.<channel>.<hash of the writer>.<host id>", in
 * that reader's process (its name is the election: a second engine of that
 * name on the host is refused with -EADDRINUSE, and that reader follows the
 * relay instead). The relay is a reader of the writer (its attach says
 * "relay=1"; it counts as no reader) and a writer without a barrier to the
 * readers of its host, whose attaches and ends it tells the writer
 * ("member=NAME", "gone=NAME err=E" on its attach stream): the writer's
 * barrier counts the readers behind relays like its own. One thread runs
 * it: it takes each message from the writer, writes it to its readers
 * (waiting while their window is full, so the writer's credits hold the
 * writer back), and ends its readers' channel as the writer's ended (END,
 * or an abort: -ECONNRESET). The relay lives as long as the reader that
 * made it: when that reader closes, the host's other readers see the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/file.h>
#include <unistd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"

#define RELAY_POOL (256ull << 20)
#define RELAY_POLL_NS (20ll * 1000000ll)

struct chan_relay {
	struct ferry_engine *e;
	struct ferry_chan_reader *up;
	struct ferry_chan_writer *down;
	pthread_t thread;
	atomic_int stop;
	bool running;
	int lock_fd;            /* the relay's lock file (see relay_lock), or -1 */
	char lock_path[512];
};

/*
 * Before the engine-name election, a lock file beside the engines' names
 * ("<runtime dir>/<ns>/<relay>.relay", the directory shm uses): a reader
 * that finds it locked follows at once, without an engine create that shm
 * would refuse with an error line. The name stays the arbiter (a lost
 * race only costs that line). Returns the locked fd, -1 when another
 * holds it, -2 when there is no such file to lock (then the name decides).
 */
static int relay_lock(const char *ns, const char *name, char *path, size_t len)
{
	const char *env = getenv("FERRY_RUNTIME_DIR"), *xdg = getenv("XDG_RUNTIME_DIR");
	int fd, n;

	if (env && env[0])
		n = snprintf(path, len, "%s/%s/%s.relay", env, ns, name);
	else if (xdg && xdg[0])
		n = snprintf(path, len, "%s/ferry/%s/%s.relay", xdg, ns, name);
	else
		n = snprintf(path, len, "/tmp/ferry-%u/%s/%s.relay", (unsigned)geteuid(), ns, name);
	if (n < 0 || (size_t)n >= len)
		return -2;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -2;
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return fd;
	close(fd);
	return errno == EWOULDBLOCK ? -1 : -2;
}

static void relay_unlock(struct chan_relay *rl)
{
	if (rl->lock_fd >= 0) {
		unlink(rl->lock_path);
		close(rl->lock_fd);
		rl->lock_fd = -1;
	}
}

static void relay_event(enum ferry_chan_event ev, int slot, const char *reader, int err,
			void *arg)
{
	struct chan_relay *rl = arg;
	char text[FERRY_NAME_MAX + 32];

	(void)slot;
	if (ev == FERRY_CHAN_EV_ATTACHED)
		snprintf(text, sizeof(text), "member=%s", reader);
	else if (ev == FERRY_CHAN_EV_READER_LEFT || ev == FERRY_CHAN_EV_READER_DEAD)
		snprintf(text, sizeof(text), "gone=%s err=%d", reader, err);
	else
		return;
	if (chan_reader_notify(rl->up, text))
		ferry_log(FERRY_LOG_WARN, "channel relay %s: could not tell the writer \"%s\"",
			  ferry_engine_name(rl->e), text);
}

static void *relay_main(void *arg)
{
	struct chan_relay *rl = arg;
	int64_t n = 0;

	while (!atomic_load(&rl->stop)) {
		struct ferry_buf *b = NULL;
		uint64_t seq;
		struct iovec iov;
		int64_t rc;

		chan_writer_poll(rl->down);
		n = ferry_chan_dequeue(rl->up, RELAY_POLL_NS, &b, &seq);
		if (n == -ETIMEDOUT)
			continue;
		if (n < 0)
			break;
		iov.iov_base = ferry_buf_data(b);
		iov.iov_len = (size_t)n;
		do
			rc = ferry_chan_write(rl->down, &iov, 1, 100ll * 1000000ll);
		while (rc == -ETIMEDOUT && !atomic_load(&rl->stop));
		if (rc < 0 && rc != -ENOTCONN)
			ferry_log(FERRY_LOG_WARN, "channel relay %s: message %" PRIu64 " lost: %s",
				  ferry_engine_name(rl->e), seq, ferry_strerror((int)rc));
		ferry_buf_release(b);
	}
	if (n == -EPIPE) {
		/* The writer closed: so does the relay, after what its readers did not take. */
		ferry_chan_close(rl->down);
		rl->down = NULL;
	} else if (n < 0) {
		chan_writer_abort_all(rl->down, (int)n);
	}
	while (rl->down && !atomic_load(&rl->stop)) {
		chan_writer_poll(rl->down);
		struct timespec ts = { 0, RELAY_POLL_NS };

		nanosleep(&ts, NULL);
	}
	return NULL;
}

static uint32_t hash32(const char *s)
{
	uint32_t h = 2166136261u;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

int chan_relay_get(struct ferry_engine *e, const struct chan_handle *h, const char *handle,
		   const struct ferry_chan_open_params *p, struct chan_relay **out,
		   char name[FERRY_NAME_MAX])
{
	struct ferry_engine_params ep = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_chan_open_params up = FERRY_CHAN_OPEN_PARAMS_INIT;
	char addr[128], ctl[160];
	struct chan_relay *rl;
	char *colon;
	int rc;

	*out = NULL;
	snprintf(name, FERRY_NAME_MAX, "fcr.%s.%08" PRIx32 ".%016" PRIx64, h->chan,
		 hash32(h->writer), chan_host_id());
	rc = ferry_engine_control_address(e, addr, sizeof(addr));
	if (rc < 0 || rc >= (int)sizeof(addr) || !(colon = strrchr(addr, ':'))) {
		ferry_log(FERRY_LOG_ERROR, "channel %s: the writer is on another host: this "
			  "reader's engine needs params.control (the relay listens beside it)",
			  h->chan);
		return -EHOSTUNREACH;
	}
	*colon = 0;
	snprintf(ctl, sizeof(ctl), "%s:0", addr);
	ep.name = name;
	ep.ns = ferry_engine_ns(e);
	ep.progress = FERRY_PROGRESS_THREAD;
	ep.pool_size = RELAY_POOL;
	ep.flags = FERRY_ENGINE_NO_PREFAULT;
	ep.control = ctl;
	rl = calloc(1, sizeof(*rl));
	if (!rl)
		return -ENOMEM;
	rl->lock_fd = relay_lock(ep.ns, name, rl->lock_path, sizeof(rl->lock_path));
	if (rl->lock_fd == -1) {
		free(rl); /* another reader of this host relays */
		return 0;
	}
	rc = ferry_engine_create(&ep, &rl->e);
	if (rc == -EADDRINUSE) {
		/* Another reader of this host relays: follow it. */
		relay_unlock(rl);
		free(rl);
		return 0;
	}
	if (rc)
		goto fail;
	up.attach_timeout_ns = p->attach_timeout_ns;
	rc = chan_reader_open(rl->e, handle, &up, true, &rl->up);
	if (rc)
		goto fail_engine;
	rc = chan_writer_create_open(rl->e, h->chan, 0, relay_event, rl, &rl->down);
	if (rc)
		goto fail_up;
	rc = -pthread_create(&rl->thread, NULL, relay_main, rl);
	if (rc)
		goto fail_down;
	rl->running = true;
	*out = rl;
	return 0;
fail_down:
	ferry_chan_close(rl->down);
fail_up:
	ferry_chan_reader_close(rl->up);
fail_engine:
	ferry_engine_destroy(rl->e);
fail:
	relay_unlock(rl);
	free(rl);
	return rc;
}

void chan_relay_stop(struct chan_relay *rl)
{
	atomic_store(&rl->stop, 1);
	if (rl->running)
		pthread_join(rl->thread, NULL);
	if (rl->down)
		ferry_chan_close(rl->down);
	if (rl->up)
		ferry_chan_reader_close(rl->up);
	ferry_engine_destroy(rl->e);
	relay_unlock(rl);
	free(rl);
}

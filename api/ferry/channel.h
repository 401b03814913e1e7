/*
 * ferry/channel.h - broadcast channels: one writer, N readers, every
 * message to every reader, in order, exactly once (the shape of vLLM's
 * shm_broadcast.MessageQueue, which executors use to send every worker the
 * same call).
 *
 * Built on ferry.h only (channel/): a channel is one stream per reader from
 * the writer's engine to the reader's, plus one stream back per reader
 * that carries its attach and tells the writer when it goes. A message is
 * copied once into the writer's pool (none with ferry_chan_write_buf) and
 * that one block is shared (ferry_buf_share) by every reader: over shm each
 * reader of the writer's host reads the same memory in place, and the
 * block goes back to the pool after the last reader released it. Readers
 * on another host are reached over tcp through the control channel (both
 * engines need params.control; the reader connects to the address the
 * handle names).
 *
 *   writer: ferry_chan_create ─ ferry_chan_handle (bytes, to every reader:
 *           a file, an environment variable, an actor's arguments) ─
 *           ferry_chan_wait_ready (all N attached, or -ETIMEDOUT) ─
 *           ferry_chan_write ... ─ ferry_chan_close
 *   reader: ferry_chan_open(handle) ─ ferry_chan_dequeue ... (or CQEs on
 *           a CQ of its own, a callback, the CQ's fd) ─ ferry_chan_reader_close
 *
 * Flow control: at most max_outstanding messages are written and not yet
 * taken by every live reader (the readers' credits are max_outstanding too);
 * then a write waits up to its timeout (-ETIMEDOUT; 0: -EAGAIN at once).
 * Memory stays bounded however slow a reader is. (The window is set as the
 * writer engine's stream credits to each reader's engine,
 * ferry_peer_set_stream_limits per_stream: other streams of the same
 * engines to those peers get it too.) A reader that dies (or
 * closes) is reported to the writer (params.on_event, and the counters of
 * ferry_chan_stats) and is skipped from then on: it blocks nobody. A writer
 * that dies ends every reader's dequeue with -ECONNRESET (on one host at
 * once; over tcp when the control channel declares it dead, peer_timeout_ms).
 *
 * Threads: a writer or reader object is used by one thread at a time (the
 * thread that calls it; calls on two objects, also of one engine, may run
 * at once). Callbacks (on_event) run inside the writer's calls, on their
 * thread. The engine may be in THREAD or MANUAL mode. A
 * FERRY_ENGINE_SINGLE_POLLER engine's channels are its poller's: from any
 * other thread every call here that polls or waits (all but
 * ferry_chan_handle and ferry_chan_reader_cq) returns -EPERM, logged, having
 * done nothing (a close too: close on the poller's thread).
 */
#ifndef FERRY_CHANNEL_H
#define FERRY_CHANNEL_H

#include <ferry.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_CHAN_NAME_MAX 32  /* channel names, incl. NUL */
#define FERRY_CHAN_HANDLE_MAX 1024 /* the longest handle ferry_chan_handle writes */
#define FERRY_CHAN_READERS_MAX 1024

struct ferry_chan_writer;
struct ferry_chan_reader;

enum ferry_chan_event {
	FERRY_CHAN_EV_ATTACHED = 1, /* a reader attached (slot, name) */
	FERRY_CHAN_EV_READY,        /* all readers attached */
	FERRY_CHAN_EV_READER_LEFT,  /* a reader closed its end (err 0) */
	FERRY_CHAN_EV_READER_DEAD,  /* a reader died (err: how the writer learnt it) */
};

/*
 * A writer's event: what happened, to which reader (slot in attach order,
 * its engine's name; -1 and "" for READY), and an errno for DEAD. It runs
 * on the thread that called into the writer (ferry_chan_wait_ready,
 * ferry_chan_write, ferry_chan_flush, ferry_chan_stats, ferry_chan_close);
 * it must not call into the same writer.
 */
typedef void ferry_chan_event_cb(enum ferry_chan_event ev, int slot, const char *reader,
				 int err, void *arg);

struct ferry_chan_params {
	size_t size;              /* sizeof(struct ferry_chan_params) */
	uint32_t readers;         /* N: readers the barrier waits for (1..1024, required) */
	uint32_t max_outstanding; /* messages written and not yet taken by every live
				   * reader (0 = 16; at most 4096) */
	ferry_chan_event_cb *on_event; /* optional */
	void *event_arg;
};
#define FERRY_CHAN_PARAMS_INIT { .size = sizeof(struct ferry_chan_params) }

struct ferry_chan_stats {
	uint32_t readers;     /* N */
	uint32_t attached;    /* readers that attached so far */
	uint32_t live;        /* attached and neither dead nor gone */
	uint32_t dead;        /* readers that died */
	uint32_t left;        /* readers that closed their end */
	uint64_t written;     /* messages written */
	uint64_t outstanding; /* of them not yet taken by every live reader */
	uint64_t delivered;   /* deliveries (message x reader) the readers hold */
	uint64_t write_waits; /* writes that found max_outstanding reached */
	uint64_t bytes_copied; /* bytes ferry_chan_write copied into the pool: once per
				* message, whatever the number of readers */
};

/*
 * Create the channel name (at most FERRY_CHAN_NAME_MAX - 1 bytes of
 * [A-Za-z0-9._-]) on engine e, for p->readers readers. One writer per name
 * and engine. Returns 0 and *out; -EINVAL (NULL, bad params, bad name;
 * logged), -EEXIST (a live channel of that name on e), -ENOMEM, or the
 * error of submitting ferry's ops. Any thread (the writer is then that
 * caller's: see "Threads" above).
 */
FERRY_API int ferry_chan_create(struct ferry_engine *e, const char *name,
				const struct ferry_chan_params *p,
				struct ferry_chan_writer **out);

/*
 * The channel's handle: opaque text (NUL-terminated, printable, no
 * newline) that ferry_chan_open takes on another engine. It names the
 * writer's engine, its namespace, the channel, its host and its addresses.
 * Writes at most len bytes incl. the NUL; returns the full length (like
 * snprintf) or -EINVAL. The writer's thread (see "Threads" above).
 */
FERRY_API int ferry_chan_handle(struct ferry_chan_writer *w, char *buf, size_t len);

/*
 * The barrier: wait until every one of the N readers has attached, up to
 * timeout_ns (< 0: forever). Returns 0 (also when some of them died since:
 * they count as attached), -ETIMEDOUT (ferry_chan_stats says how many
 * came), -EINVAL. The writer's thread (see "Threads" above); it blocks.
 */
FERRY_API int ferry_chan_wait_ready(struct ferry_chan_writer *w, int64_t timeout_ns);

/*
 * Write one message (the iovec's bytes, copied once into the engine's
 * pool; 0 bytes are a message too) to every live reader. Returns the
 * message's sequence number (0, 1, ...: what readers see as cqe->res);
 * -ENOTCONN before the barrier was reached or when no reader is live;
 * -EAGAIN (timeout_ns 0) or -ETIMEDOUT when max_outstanding messages are
 * still out that long (timeout_ns < 0: wait forever); -ENOMEM when the pool
 * has no room; -EINVAL. The writer's thread (see "Threads" above).
 */
FERRY_API int64_t ferry_chan_write(struct ferry_chan_writer *w, const struct iovec *iov,
				   unsigned iovcnt, int64_t timeout_ns);

/*
 * Write a buffer of the writer's engine's pool (ferry_buf_alloc, filled,
 * ferry_buf_set_len): no copy at all. Ownership of buf moves to the
 * channel when the call returns >= 0; on an error it stays the caller's.
 * Otherwise as ferry_chan_write. The writer's thread (see "Threads" above).
 */
FERRY_API int64_t ferry_chan_write_buf(struct ferry_chan_writer *w, struct ferry_buf *buf,
				       int64_t timeout_ns);

/*
 * Wait until every message written so far was taken by every live reader
 * (or the reader died). Returns 0, -ETIMEDOUT, -EINVAL. The writer's thread
 * (see "Threads" above); it blocks.
 */
FERRY_API int ferry_chan_flush(struct ferry_chan_writer *w, int64_t timeout_ns);

/* Counters of the channel (see struct ferry_chan_stats). The writer's thread (see "Threads" above). */
FERRY_API int ferry_chan_stats(struct ferry_chan_writer *w, struct ferry_chan_stats *st);

/*
 * End the channel: every live reader gets the end after the messages it
 * has not read yet (ferry_chan_dequeue: -EPIPE), waiting up to 1 s for the
 * messages still out; the object is freed. Returns 0 or -EINVAL. The
 * writer's thread (see "Threads" above); call it before destroying the
 * engine.
 */
FERRY_API int ferry_chan_close(struct ferry_chan_writer *w);

struct ferry_chan_open_params {
	size_t size;          /* sizeof(struct ferry_chan_open_params) */
	/*
	 * Where messages complete. NULL: a CQ of the reader's own, read with
	 * ferry_chan_dequeue (ferry_chan_reader_cq gives it, for its fd). A CQ
	 * of the caller: every message is a CQE there (and no dequeue): res =
	 * the sequence number, len its bytes, buf the message (zero copy,
	 * FERRY_CQE_F_BUF: release it), FERRY_CQE_F_MORE, user_data below; the
	 * last CQE, without MORE, is the end: res >= 0 and an empty buffer
	 * when the writer closed, or -ECONNRESET when it died (-ECANCELED
	 * after ferry_chan_reader_close: that CQE comes after the close, on
	 * this CQ). user_data should be unique among the engine's ops (the
	 * close cancels the op that carries it).
	 */
	struct ferry_cq *cq;
	ferry_complete_cb *cb; /* with cq: run it instead of returning the CQE */
	void *cb_arg;
	uint64_t user_data;
	int64_t attach_timeout_ns; /* how long to wait for the writer's engine (0 = 30 s) */
	int remote;                /* 1: reach the writer through its address even when
				    * the handle says it is on this host */
};
#define FERRY_CHAN_OPEN_PARAMS_INIT { .size = sizeof(struct ferry_chan_open_params) }

/*
 * Open the channel a handle names, on engine e (in the writer's namespace;
 * a reader on another host needs params.control on e). Attaching goes on
 * in the background: messages come once the writer's barrier was reached.
 * Returns 0 and *out; -EINVAL (NULL, a handle that is not one: logged),
 * -EXDEV (e is in another namespace than the writer), -ENOMEM, or the
 * error of reaching the writer's address. Any thread (the reader is then
 * that caller's: see "Threads" above).
 */
FERRY_API int ferry_chan_open(struct ferry_engine *e, const char *handle,
			      const struct ferry_chan_open_params *p,
			      struct ferry_chan_reader **out);

/*
 * Wait until the writer holds this reader's attach (up to timeout_ns, < 0:
 * forever). Returns 0, -ETIMEDOUT, or the error that ended the attach
 * (-EHOSTUNREACH: no writer came). The reader's thread (see "Threads" above).
 */
FERRY_API int ferry_chan_reader_wait_ready(struct ferry_chan_reader *r, int64_t timeout_ns);

/*
 * The next message, zero copy: *out is the message (the writer's block
 * itself on its host: release it with ferry_buf_release), *seq (may be
 * NULL) its sequence number. Waits up to timeout_ns (< 0: forever).
 * Returns its length; -ETIMEDOUT; -EPIPE once the writer closed (and every
 * message before was taken); -ECONNRESET when the writer died; -EINVAL
 * (also for a reader opened with a CQ of the caller's). The reader's
 * thread (see "Threads" above); it blocks.
 */
FERRY_API int64_t ferry_chan_dequeue(struct ferry_chan_reader *r, int64_t timeout_ns,
				     struct ferry_buf **out, uint64_t *seq);

/*
 * The next message copied into an iovec: returns its length, or
 * -EMSGSIZE when it does not fit (the message is then lost to this
 * reader: size the iovec for the largest message); otherwise as
 * ferry_chan_dequeue. The reader's thread (see "Threads" above).
 */
FERRY_API int64_t ferry_chan_dequeue_iov(struct ferry_chan_reader *r, const struct iovec *iov,
					 unsigned iovcnt, int64_t timeout_ns, uint64_t *seq);

/*
 * The CQ messages complete on (the caller's, or the reader's own: poll it,
 * or sleep on ferry_cq_fd). The reader's thread (see "Threads" above).
 */
FERRY_API struct ferry_cq *ferry_chan_reader_cq(struct ferry_chan_reader *r);

/*
 * Leave the channel (the writer is told: READER_LEFT) and free the
 * reader; messages not taken go back to the writer. Returns 0 or -EINVAL.
 * The reader's thread (see "Threads" above); call it before destroying the
 * engine.
 */
FERRY_API int ferry_chan_reader_close(struct ferry_chan_reader *r);

#ifdef __cplusplus
}
#endif
#endif

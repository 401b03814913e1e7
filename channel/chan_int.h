/*
 * channel/chan_int.h - what the broadcast channel's two ends share: the
 * stream keys a channel uses, the handle's text form, the tags of the
 * internal ops' user_data, small waits on a CQ. Built on ferry.h only.
 *
 * Streams of channel C between writer W and reader R:
 *   "fc/C/a/R"  R -> W: the attach (chunk 0: "host=<id>"), then nothing
 *               until R closes (END) or dies (W's STREAM_GET fails)
 *   "fc/C/m"    W -> R: message k is chunk k; the END chunk closes
 */
#ifndef FERRY_CHAN_INT_H
#define FERRY_CHAN_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ferry.h"
#include "ferry/channel.h"

#define CHAN_HANDLE_TAG "ferrychan1"
#define CHAN_DEFAULT_OUTSTANDING 16u
#define CHAN_MAX_OUTSTANDING 4096u
#define CHAN_ATTACH_DEFAULT_NS (30ll * 1000000000ll)
#define CHAN_CLOSE_NS (1000ll * 1000000ll)

/* user_data of internal ops: kind << 56 | slot << 32 | seq (32 bits). */
enum chan_ud {
	CHAN_UD_ACCEPT = 1, /* writer: STREAM_ACCEPT */
	CHAN_UD_ATTACH,     /* writer: STREAM_GET of a reader's attach stream */
	CHAN_UD_PUT,        /* writer: STREAM_PUT of a message */
	CHAN_UD_ABORT,      /* writer: STREAM_ABORT to a reader gone */
	CHAN_UD_END,        /* writer: the END chunk; reader: its attach END */
	CHAN_UD_HELLO,      /* reader: the attach chunk */
	CHAN_UD_MSGS,       /* reader: the STREAM_GET of messages */
	CHAN_UD_CANCEL,     /* either: a CANCEL */
};

static inline uint64_t chan_ud(enum chan_ud kind, uint32_t slot, uint64_t seq)
{
	return ((uint64_t)kind << 56) | ((uint64_t)(slot & 0xffffff) << 32) | (seq & 0xffffffffu);
}

static inline enum chan_ud chan_ud_kind(uint64_t ud)
{
	return (enum chan_ud)(ud >> 56);
}

static inline uint32_t chan_ud_slot(uint64_t ud)
{
	return (uint32_t)(ud >> 32) & 0xffffff;
}

static inline uint32_t chan_ud_seq(uint64_t ud)
{
	return (uint32_t)ud;
}

/* chan_common.c */
int64_t chan_now(void);
/* This host as the channel sees it: shm reaches the engines of one id. */
uint64_t chan_host_id(void);
/* A name of [A-Za-z0-9._-], 1..FERRY_CHAN_NAME_MAX-1 bytes. */
int chan_name_ok(const char *name);
/*
 * May this thread drive e (a FERRY_ENGINE_SINGLE_POLLER engine: its poller,
 * claimed now if it has none)? 0, or -EPERM, logged as who's. Every public
 * call that polls or waits asks first, so none is refused halfway.
 */
int chan_claim(struct ferry_engine *e, const char *who);
/* Take an SQE of e's queue of this thread, submitting and retrying while full (bounded). */
struct ferry_sqe *chan_sqe(struct ferry_engine *e, struct ferry_sq **sq);
/* Wait for one CQE on cq until the absolute deadline (< 0: forever): 1, 0 (timed out), < 0. */
int chan_wait1(struct ferry_cq *cq, struct ferry_cqe *c, int64_t deadline);
/* The deadline of a relative timeout (< 0: none, -1). */
int64_t chan_deadline(int64_t timeout_ns);

struct chan_handle {
	char writer[FERRY_NAME_MAX];
	char chan[FERRY_CHAN_NAME_MAX];
	uint32_t readers;
	uint64_t host;
	char addrs[FERRY_CHAN_HANDLE_MAX];
};
int chan_handle_parse(const char *text, struct chan_handle *h);

/* chan_writer.c: a relay's writer (no barrier: readers come and go), its round, its end. */
int chan_writer_create_open(struct ferry_engine *e, const char *name, uint32_t window,
			    ferry_chan_event_cb *cb, void *arg, struct ferry_chan_writer **out);
void chan_writer_poll(struct ferry_chan_writer *w);
/* The upstream writer died: every reader's stream aborted (they see -ECONNRESET). */
void chan_writer_abort_all(struct ferry_chan_writer *w, int err);

/* chan_reader.c: open, as a relay (its attach says so) or not. */
int chan_reader_open(struct ferry_engine *e, const char *handle,
		     const struct ferry_chan_open_params *p, bool relay,
		     struct ferry_chan_reader **out);
/* A relay's notice to its writer, on its attach stream ("member=NAME", "gone=NAME err=E"). */
int chan_reader_notify(struct ferry_chan_reader *r, const char *text);

/* chan_relay.c: the relay of this host for a channel on another host. */
struct chan_relay;
/*
 * The relay's engine name for this host; *created: 1 when this call made
 * it (this process relays), 0 when another engine holds the name.
 */
int chan_relay_get(struct ferry_engine *e, const struct chan_handle *h, const char *handle,
		   const struct ferry_chan_open_params *p, struct chan_relay **out,
		   char name[FERRY_NAME_MAX]);
void chan_relay_stop(struct chan_relay *rl);

#endif

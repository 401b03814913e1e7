/*
 * channel/chan_reader.c - a reader's end of a broadcast channel: opening
 * it from a handle (reaching the writer by name on its host, through its
 * address elsewhere), the attach stream (its first chunk, then its END at
 * close), the one multishot STREAM_GET that receives every message, and
 * dequeue on the reader's own CQ. Built on ferry.h only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"

struct ferry_chan_reader {
	struct ferry_engine *e;
	struct ferry_sq *sq;
	struct ferry_peer *writer;
	struct ferry_cq *ctl;  /* the reader's internal ops */
	struct ferry_cq *msgs; /* where messages complete */
	bool own_msgs;         /* msgs is ours (dequeue mode) */
	int attach_rc;         /* 1: on its way; 0: the writer holds it; < 0: failed */
	int ended;             /* 0, or what every later dequeue returns */
	uint32_t ctl_inflight;
	uint64_t msg_ud;       /* the message STREAM_GET's user_data */
	char hello[64];        /* the attach chunk (sent once the writer is up) */
	struct chan_relay *relay; /* the relay of this host, when this process runs it */
	struct iovec hello_iov;
	char chan[FERRY_CHAN_NAME_MAX];
	char mstream[FERRY_STREAM_KEY_MAX];
	char astream[FERRY_STREAM_KEY_MAX];
};

static void ctl_handle(struct ferry_chan_reader *r, const struct ferry_cqe *c)
{
	if (chan_ud_kind(c->user_data) == CHAN_UD_HELLO) {
		r->attach_rc = c->res < 0 ? c->res : 0;
		if (c->res < 0)
			ferry_log(FERRY_LOG_WARN, "channel %s: attach failed: %s", r->chan,
				  ferry_strerror(c->res));
	}
	if (c->flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c->buf);
	if (!(c->flags & FERRY_CQE_F_MORE) && r->ctl_inflight)
		r->ctl_inflight--;
}

static int ctl_drain(struct ferry_chan_reader *r, int64_t deadline, int (*cond)(struct ferry_chan_reader *))
{
	struct ferry_cqe c;
	int rc;

	for (;;) {
		while (ferry_cq_poll(r->ctl, &c, 1) == 1)
			ctl_handle(r, &c);
		if (!cond || cond(r))
			return 0;
		rc = chan_wait1(r->ctl, &c, deadline);
		if (rc == 1)
			ctl_handle(r, &c);
		else
			return rc == 0 ? -ETIMEDOUT : rc;
	}
}

static int attached(struct ferry_chan_reader *r)
{
	return r->attach_rc <= 0;
}

static int ctl_done(struct ferry_chan_reader *r)
{
	return r->ctl_inflight == 0;
}

static void reader_free(struct ferry_chan_reader *r)
{
	if (r->relay)
		chan_relay_stop(r->relay);
	if (r->own_msgs && r->msgs)
		ferry_cq_destroy(r->msgs);
	if (r->ctl)
		ferry_cq_destroy(r->ctl);
	free(r);
}

/*
 * A reader on another host than the writer's reads from its host's relay
 * (chan_relay.c: an engine of its own in the process of the host's first
 * reader), which it reaches like a writer of this host: open the relay's
 * channel of the same name instead.
 */
static int open_behind_relay(struct ferry_engine *e, const struct chan_handle *h,
			     const char *handle, const struct ferry_chan_open_params *p,
			     struct ferry_chan_reader **out)
{
	struct ferry_chan_open_params lp = *p;
	char name[FERRY_NAME_MAX], local[FERRY_CHAN_HANDLE_MAX];
	struct chan_relay *rl = NULL;
	int rc;

	rc = chan_relay_get(e, h, handle, p, &rl, name);
	if (rc)
		return rc;
	snprintf(local, sizeof(local), CHAN_HANDLE_TAG " writer=%s chan=%s readers=%u host=%016" PRIx64,
		 name, h->chan, h->readers, chan_host_id());
	lp.remote = 0;
	rc = chan_reader_open(e, local, &lp, false, out);
	if (rc) {
		if (rl)
			chan_relay_stop(rl);
		return rc;
	}
	(*out)->relay = rl;
	return 0;
}

int ferry_chan_open(struct ferry_engine *e, const char *handle,
		    const struct ferry_chan_open_params *p, struct ferry_chan_reader **out)
{
	return chan_reader_open(e, handle, p, false, out);
}

int chan_reader_open(struct ferry_engine *e, const char *handle,
		     const struct ferry_chan_open_params *p, bool relay,
		     struct ferry_chan_reader **out)
{
	static const struct ferry_chan_open_params defaults = FERRY_CHAN_OPEN_PARAMS_INIT;
	struct ferry_cq_params cqp = FERRY_CQ_PARAMS_INIT;
	struct chan_handle h;
	struct ferry_chan_reader *r;
	struct ferry_sqe *sqe;
	int64_t attach_ns;
	int rc;

	if (!e || !handle || !out || (p && p->size < sizeof(*p))) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_open: NULL argument or bad params");
		return -EINVAL;
	}
	if ((rc = chan_claim(e, "ferry_chan_open")))
		return rc;
	if (!p)
		p = &defaults;
	rc = chan_handle_parse(handle, &h);
	if (rc)
		return rc;
	if (!relay && p->remote != 2 && (p->remote == 1 || h.host != chan_host_id()))
		return open_behind_relay(e, &h, handle, p, out);
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->e = e;
	r->attach_rc = 1;
	strcpy(r->chan, h.chan);
	snprintf(r->mstream, sizeof(r->mstream), "fc/%s/m", h.chan);
	if (snprintf(r->astream, sizeof(r->astream), "fc/%s/a/%s", h.chan, ferry_engine_name(e)) >=
	    (int)sizeof(r->astream)) {
		rc = -ENAMETOOLONG;
		goto fail;
	}
	cqp.entries = 64;
	rc = ferry_cq_create(e, &cqp, &r->ctl);
	if (rc)
		goto fail;
	if (p->cq) {
		r->msgs = p->cq;
	} else {
		cqp.entries = 1024;
		rc = ferry_cq_create(e, &cqp, &r->msgs);
		if (rc)
			goto fail;
		r->own_msgs = true;
	}
	rc = ferry_peer_open(e, h.writer, &r->writer);
	if (rc)
		goto fail;
	if (relay || p->remote || h.host != chan_host_id()) {
		/* Another host: through the writer's control channel (its first ferry:// URI). */
		char uri[FERRY_CHAN_HANDLE_MAX];
		const char *a = strstr(h.addrs, "ferry://");
		size_t n;

		if (!a) {
			ferry_log(FERRY_LOG_ERROR, "channel %s: the writer is on another host and the "
				  "handle names no ferry:// address (create its engine with "
				  "params.control)", h.chan);
			rc = -EHOSTUNREACH;
			goto fail;
		}
		n = strcspn(a, " ");
		memcpy(uri, a, n);
		uri[n] = 0;
		rc = ferry_peer_connect_uri(r->writer, uri);
		if (rc)
			goto fail;
	}
	/* Messages first, then the attach: no message can come before its GET. */
	sqe = chan_sqe(e, &r->sq);
	if (!sqe) {
		rc = -ENOMEM;
		goto fail;
	}
	r->msg_ud = p->cq ? p->user_data : chan_ud(CHAN_UD_MSGS, 0, 0);
	ferry_prep_stream_get(sqe, r->writer, r->mstream, r->msg_ud);
	ferry_sqe_set_cq(sqe, r->msgs);
	if (p->cq && p->cb)
		ferry_sqe_set_callback(sqe, p->cb, p->cb_arg);
	sqe = chan_sqe(e, &r->sq);
	if (!sqe) {
		rc = -ENOMEM;
		goto fail;
	}
	snprintf(r->hello, sizeof(r->hello), "host=%016" PRIx64 "%s", chan_host_id(),
		 relay ? " relay=1" : "");
	r->hello_iov.iov_base = r->hello;
	r->hello_iov.iov_len = strlen(r->hello);
	attach_ns = p->attach_timeout_ns > 0 ? p->attach_timeout_ns : CHAN_ATTACH_DEFAULT_NS;
	ferry_prep_stream_put(sqe, r->writer, r->astream, &r->hello_iov, 1,
			      chan_ud(CHAN_UD_HELLO, 0, 0));
	ferry_sqe_set_flags(sqe, FERRY_SQE_WAIT_PEER);
	ferry_sqe_set_timeout(sqe, (uint64_t)attach_ns);
	ferry_sqe_set_cq(sqe, r->ctl);
	r->ctl_inflight = 1;
	rc = ferry_sq_submit(r->sq);
	if (rc < 0)
		goto fail;
	*out = r;
	return 0;
fail:
	reader_free(r);
	return rc;
}

int chan_reader_notify(struct ferry_chan_reader *r, const char *text)
{
	struct ferry_sqe *sqe;
	struct ferry_buf *b;
	size_t n = strlen(text);
	int rc = ferry_buf_alloc(r->e, n, &b);

	if (rc)
		return rc;
	memcpy(ferry_buf_data(b), text, n);
	sqe = chan_sqe(r->e, &r->sq);
	if (!sqe) {
		ferry_buf_release(b);
		return -EBUSY;
	}
	ferry_prep_stream_put_buf(sqe, r->writer, r->astream, b, chan_ud(CHAN_UD_END, 1, 0));
	ferry_sqe_set_cq(sqe, r->ctl);
	r->ctl_inflight++;
	rc = ferry_sq_submit(r->sq);
	ctl_drain(r, 0, NULL);
	return rc < 0 ? rc : 0;
}

int ferry_chan_reader_wait_ready(struct ferry_chan_reader *r, int64_t timeout_ns)
{
	int rc;

	if (!r) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_reader_wait_ready: NULL reader");
		return -EINVAL;
	}
	if ((rc = chan_claim(r->e, "ferry_chan_reader_wait_ready")))
		return rc;
	rc = ctl_drain(r, chan_deadline(timeout_ns), attached);
	return rc ? rc : r->attach_rc;
}

static int64_t next_msg(struct ferry_chan_reader *r, int64_t timeout_ns, struct ferry_cqe *c)
{
	int rc;

	if (!r || !r->own_msgs) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_dequeue: %s", r ? "the reader's messages go "
			  "to a CQ of the caller" : "NULL reader");
		return -EINVAL;
	}
	if (chan_claim(r->e, "ferry_chan_dequeue"))
		return -EPERM;
	if (r->ended)
		return r->ended;
	ctl_drain(r, 0, NULL);
	rc = chan_wait1(r->msgs, c, chan_deadline(timeout_ns));
	if (rc == 0)
		return -ETIMEDOUT;
	if (rc < 0)
		return rc;
	if (c->flags & FERRY_CQE_F_MORE)
		return 0;
	/* The last CQE: the END chunk (the writer closed), or how the stream failed. */
	if (c->flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c->buf);
	r->ended = c->res >= 0 ? -EPIPE : c->res == -ECANCELED ? -ECONNRESET : c->res;
	return r->ended;
}

int64_t ferry_chan_dequeue(struct ferry_chan_reader *r, int64_t timeout_ns, struct ferry_buf **out,
			   uint64_t *seq)
{
	struct ferry_cqe c;
	int64_t rc;

	if (!out) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_dequeue: NULL out");
		return -EINVAL;
	}
	rc = next_msg(r, timeout_ns, &c);
	if (rc)
		return rc;
	*out = c.buf;
	if (seq)
		*seq = (uint32_t)c.res;
	return (int64_t)c.len;
}

int64_t ferry_chan_dequeue_iov(struct ferry_chan_reader *r, const struct iovec *iov,
			       unsigned iovcnt, int64_t timeout_ns, uint64_t *seq)
{
	struct ferry_cqe c;
	size_t cap = 0, off = 0, len;
	const char *src;
	int64_t rc;
	unsigned i;

	if (iovcnt && !iov) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_dequeue_iov: NULL iovec");
		return -EINVAL;
	}
	for (i = 0; i < iovcnt; i++)
		cap += iov[i].iov_len;
	rc = next_msg(r, timeout_ns, &c);
	if (rc)
		return rc;
	if (seq)
		*seq = (uint32_t)c.res;
	len = (size_t)c.len;
	if (len > cap) {
		ferry_log(FERRY_LOG_WARN, "channel %s: message %d of %zu bytes into %zu: dropped",
			  r->chan, c.res, len, cap);
		ferry_buf_release(c.buf);
		return -EMSGSIZE;
	}
	src = ferry_buf_data(c.buf);
	for (i = 0; i < iovcnt && off < len; i++) {
		size_t k = iov[i].iov_len < len - off ? iov[i].iov_len : len - off;

		memcpy(iov[i].iov_base, src + off, k);
		off += k;
	}
	ferry_buf_release(c.buf);
	return (int64_t)len;
}

struct ferry_cq *ferry_chan_reader_cq(struct ferry_chan_reader *r)
{
	return r ? r->msgs : NULL;
}

int ferry_chan_reader_close(struct ferry_chan_reader *r)
{
	struct ferry_sqe *sqe;
	struct ferry_cqe c;

	if (!r) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_reader_close: NULL reader");
		return -EINVAL;
	}
	if (chan_claim(r->e, "ferry_chan_reader_close"))
		return -EPERM; /* nothing done: close it on the engine's poller thread */
	ctl_drain(r, chan_deadline(CHAN_CLOSE_NS), attached);
	if (r->attach_rc == 0 && (sqe = chan_sqe(r->e, &r->sq))) {
		/* The END of its attach stream tells the writer it left. */
		ferry_prep_stream_put(sqe, r->writer, r->astream, NULL, 0, chan_ud(CHAN_UD_END, 0, 0));
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_END);
		ferry_sqe_set_timeout(sqe, (uint64_t)CHAN_CLOSE_NS);
		ferry_sqe_set_cq(sqe, r->ctl);
		r->ctl_inflight++;
	}
	if (!r->ended && (sqe = chan_sqe(r->e, &r->sq))) {
		ferry_prep_cancel(sqe, r->msg_ud, chan_ud(CHAN_UD_CANCEL, 0, 0));
		ferry_sqe_set_cq(sqe, r->ctl);
		r->ctl_inflight++;
	}
	ferry_sq_submit(r->sq);
	ctl_drain(r, chan_deadline(CHAN_CLOSE_NS), ctl_done);
	if (r->own_msgs) {
		/* Give back what came and was not taken, up to the GET's last CQE. */
		int64_t deadline = chan_deadline(CHAN_CLOSE_NS);

		while (!r->ended && chan_wait1(r->msgs, &c, deadline) == 1) {
			if (c.flags & FERRY_CQE_F_BUF)
				ferry_buf_release(c.buf);
			if (!(c.flags & FERRY_CQE_F_MORE))
				break;
		}
		while (ferry_cq_poll(r->msgs, &c, 1) == 1)
			if (c.flags & FERRY_CQE_F_BUF)
				ferry_buf_release(c.buf);
	}
	reader_free(r);
	return 0;
}

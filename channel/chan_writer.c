/*
 * channel/chan_writer.c - the writer's end of a broadcast channel: the
 * attach of readers (a STREAM_ACCEPT for their attach streams, the
 * barrier), writing a message once into the pool and sharing its block with
 * every live reader (one STREAM_PUT of a share per reader), the window of
 * outstanding messages, readers that leave or die, the end. Every op of the
 * writer completes on a CQ of its own, read inside the writer's calls (so
 * the writer is one thread's at a time). Built on ferry.h only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"

enum { SLOT_PENDING, SLOT_DIRECT, SLOT_RELAY, SLOT_MEMBER };

/*
 * A peer that attached (DIRECT: a reader; RELAY: another host's relay,
 * sent to like a reader but not counted: its MEMBERs are, the readers it
 * feeds, which have no stream of ours) or is attaching (PENDING: its first
 * chunk, which says which, has not come).
 */
struct chan_slot {
	char name[FERRY_NAME_MAX];
	struct ferry_peer *peer;
	uint8_t kind;
	uint32_t relay;  /* MEMBER: its relay's slot */
	bool live;     /* attached, neither dead nor gone */
	bool gone;     /* left or died: its stream was aborted */
	bool attach_end; /* its attach STREAM_GET ended */
};

struct ferry_chan_writer {
	struct ferry_engine *e;
	struct ferry_cq *cq;
	struct ferry_sq *sq;
	struct ferry_chan_params p;
	char name[FERRY_CHAN_NAME_MAX];
	char mstream[FERRY_STREAM_KEY_MAX];
	char aprefix[FERRY_STREAM_KEY_MAX];
	size_t aprefix_len;
	struct chan_slot *slots;
	uint32_t nslots, cap;      /* slots used, allocated */
	uint32_t ntargets;         /* live DIRECT and RELAY slots: a write's sends */
	bool open;                 /* a relay's: readers come and go, no barrier */
	struct ferry_buf **shares; /* N: the shares of the message being written */
	uint32_t *pending;         /* max_outstanding: STREAM_PUTs out per message */
	uint64_t next_seq, low;    /* low: the oldest message with a STREAM_PUT out */
	uint32_t inflight;         /* internal ops not yet at their last CQE */
	bool ready, closing;
	struct ferry_chan_stats st;
};

static void event(struct ferry_chan_writer *w, enum ferry_chan_event ev, int slot, int err)
{
	if (w->p.on_event)
		w->p.on_event(ev, slot, slot >= 0 ? w->slots[slot].name : "", err, w->p.event_arg);
}

static int submit(struct ferry_chan_writer *w)
{
	int rc = ferry_sq_submit(w->sq);

	return rc < 0 ? rc : 0;
}

/* A reader is gone (left: err 0, or died): skipped from now on, its stream aborted. */
static void slot_gone(struct ferry_chan_writer *w, uint32_t i, int err)
{
	struct chan_slot *s = &w->slots[i];
	struct ferry_sqe *sqe;

	if (s->gone)
		return;
	s->gone = true;
	if (s->kind == SLOT_RELAY) {
		uint32_t k;

		for (k = 0; k < w->nslots; k++)
			if (w->slots[k].kind == SLOT_MEMBER && w->slots[k].relay == i)
				slot_gone(w, k, err ? err : -ECONNRESET);
	}
	if (!s->live)
		goto stream;
	s->live = false;
	if (s->kind == SLOT_RELAY) {
		w->ntargets--;
		ferry_log(FERRY_LOG_WARN, "channel %s: relay %s went (%s)", w->name, s->name,
			  ferry_strerror(err));
		goto stream;
	}
	if (s->kind == SLOT_DIRECT)
		w->ntargets--;
	w->st.live--;
	if (err) {
		w->st.dead++;
		ferry_log(FERRY_LOG_WARN, "channel %s: reader %s died (%s)", w->name, s->name,
			  ferry_strerror(err));
	} else {
		w->st.left++;
	}
	event(w, err ? FERRY_CHAN_EV_READER_DEAD : FERRY_CHAN_EV_READER_LEFT, (int)i, err);
stream:
	if (!s->peer)
		return; /* a member: its relay's stream goes on */
	/* Messages still waiting for its credit complete now (-ECANCELED). */
	sqe = chan_sqe(w->e, &w->sq);
	if (!sqe)
		return;
	ferry_prep_stream_abort(sqe, s->peer, w->mstream, err ? "reader died" : "reader left",
				chan_ud(CHAN_UD_ABORT, i, 0));
	ferry_sqe_set_cq(sqe, w->cq);
	ferry_sqe_set_timeout(sqe, 2000ll * 1000000ll);
	w->inflight++;
	submit(w);
}

static int slot_find(struct ferry_chan_writer *w, const char *name)
{
	uint32_t i;

	for (i = 0; i < w->nslots; i++)
		if (strcmp(w->slots[i].name, name) == 0)
			return (int)i;
	return -1;
}

static int slot_new(struct ferry_chan_writer *w, const char *name)
{
	struct chan_slot *s;

	if (strlen(name) >= sizeof(s->name)) {
		ferry_log(FERRY_LOG_WARN, "channel %s: reader name too long: ignored", w->name);
		return -1;
	}
	if (w->nslots == w->cap) {
		ferry_log(FERRY_LOG_WARN, "channel %s: %u peers attached: %s ignored", w->name,
			  w->cap, name);
		return -1;
	}
	s = &w->slots[w->nslots];
	memset(s, 0, sizeof(*s));
	strcpy(s->name, name);
	return (int)w->nslots++;
}

/* A reader (direct, or a member behind a relay) counts toward the barrier. */
static void count_reader(struct ferry_chan_writer *w, uint32_t i)
{
	struct chan_slot *s = &w->slots[i];

	if (!w->open && w->st.attached == w->p.readers) {
		ferry_log(FERRY_LOG_WARN, "channel %s: reader %s comes after all %u: ignored",
			  w->name, s->name, w->p.readers);
		s->gone = true;
		return;
	}
	s->live = true;
	if (s->kind == SLOT_DIRECT)
		w->ntargets++;
	w->st.attached++;
	w->st.live++;
	event(w, FERRY_CHAN_EV_ATTACHED, (int)i, 0);
	if (!w->open && w->st.attached == w->p.readers) {
		w->ready = true;
		event(w, FERRY_CHAN_EV_READY, -1, 0);
	}
}

/* A new attach stream "fc/C/a/NAME": read it (its first chunk says what NAME is). */
static void attach(struct ferry_chan_writer *w, const char *key)
{
	const char *rname = key + w->aprefix_len;
	struct ferry_sqe *sqe;
	struct chan_slot *s;
	int i;

	if (slot_find(w, rname) >= 0) {
		ferry_log(FERRY_LOG_WARN, "channel %s: reader %s attached twice: ignored", w->name,
			  rname);
		return;
	}
	if (w->closing || (i = slot_new(w, rname)) < 0)
		return;
	s = &w->slots[i];
	if (ferry_peer_open(w->e, rname, &s->peer)) {
		ferry_log(FERRY_LOG_WARN, "channel %s: bad reader name %s", w->name, rname);
		w->nslots--;
		return;
	}
	ferry_peer_set_stream_limits(s->peer, w->p.max_outstanding, 0);
	sqe = chan_sqe(w->e, &w->sq);
	if (!sqe) {
		w->nslots--;
		return;
	}
	/* Its attach stream stays open while the reader lives: its end says it went. */
	ferry_prep_stream_get(sqe, s->peer, key, chan_ud(CHAN_UD_ATTACH, (uint32_t)i, 0));
	ferry_sqe_set_cq(sqe, w->cq);
	w->inflight++;
	submit(w);
	s->kind = SLOT_PENDING;
}

/*
 * A chunk of slot i's attach stream: the first says what it is ("host=H",
 * "host=H relay=1"); a relay's later ones name its members ("member=NAME",
 * "gone=NAME err=E").
 */
static void attach_chunk(struct ferry_chan_writer *w, uint32_t i, const struct ferry_cqe *c)
{
	struct chan_slot *s = &w->slots[i];
	char text[FERRY_NAME_MAX + 32], name[FERRY_NAME_MAX];
	size_t n = c->len < sizeof(text) - 1 ? (size_t)c->len : sizeof(text) - 1;
	int k, err = 0;

	memcpy(text, ferry_buf_data(c->buf), n);
	text[n] = 0;
	if (s->kind == SLOT_PENDING) {
		s->kind = strstr(text, " relay=1") ? SLOT_RELAY : SLOT_DIRECT;
		if (s->kind == SLOT_RELAY) {
			s->live = true;
			w->ntargets++;
		} else {
			count_reader(w, i);
		}
		return;
	}
	if (s->kind != SLOT_RELAY)
		return;
	if (sscanf(text, "member=%63s", name) == 1) {
		if (slot_find(w, name) >= 0 || (k = slot_new(w, name)) < 0)
			return;
		w->slots[k].kind = SLOT_MEMBER;
		w->slots[k].relay = i;
		count_reader(w, (uint32_t)k);
	} else if (sscanf(text, "gone=%63s err=%d", name, &err) == 2) {
		k = slot_find(w, name);
		if (k >= 0 && w->slots[k].kind == SLOT_MEMBER)
			slot_gone(w, (uint32_t)k, err);
	}
}

static void advance(struct ferry_chan_writer *w)
{
	while (w->low < w->next_seq && w->pending[w->low % w->p.max_outstanding] == 0)
		w->low++;
}

static void handle(struct ferry_chan_writer *w, const struct ferry_cqe *c)
{
	uint32_t slot = chan_ud_slot(c->user_data);
	bool last = !(c->flags & FERRY_CQE_F_MORE);

	switch (chan_ud_kind(c->user_data)) {
	case CHAN_UD_ACCEPT:
		if (c->res >= 0 && c->buf) {
			const char *key = ferry_buf_data(c->buf);

			if (strncmp(key, w->aprefix, w->aprefix_len) == 0 && key[w->aprefix_len])
				attach(w, key);
		} else if (c->res < 0 && c->res != -ECANCELED) {
			ferry_log(FERRY_LOG_ERROR, "channel %s: STREAM_ACCEPT ended: %s", w->name,
				  ferry_strerror(c->res));
		}
		break;
	case CHAN_UD_ATTACH:
		if (!last && c->res >= 0 && c->buf && slot < w->nslots)
			attach_chunk(w, slot, c);
		if (last && slot < w->nslots) {
			w->slots[slot].attach_end = true;
			/* END: the reader closed; an error: it died (or we cancelled). */
			if (c->res != -ECANCELED || !w->closing)
				slot_gone(w, slot, c->res >= 0 ? 0 : c->res);
		}
		break;
	case CHAN_UD_PUT: {
		uint32_t i = chan_ud_seq(c->user_data) % w->p.max_outstanding;

		if (w->pending[i])
			w->pending[i]--;
		if (c->res >= 0)
			w->st.delivered++;
		else if (slot < w->nslots && w->slots[slot].live)
			slot_gone(w, slot, c->res);
		advance(w);
		break;
	}
	default:
		break;
	}
	if (c->flags & FERRY_CQE_F_BUF)
		ferry_buf_release(c->buf);
	if (last && chan_ud_kind(c->user_data) != CHAN_UD_PUT && w->inflight)
		w->inflight--;
}

/* Handle what is there, then wait until cond or the deadline. Returns 0 or -ETIMEDOUT. */
static int drain(struct ferry_chan_writer *w, int64_t deadline,
		 bool (*cond)(struct ferry_chan_writer *))
{
	struct ferry_cqe c[32];
	int n, i, rc;

	for (;;) {
		while ((n = ferry_cq_poll(w->cq, c, 32)) > 0)
			for (i = 0; i < n; i++)
				handle(w, &c[i]);
		if (!cond || cond(w))
			return 0;
		rc = chan_wait1(w->cq, c, deadline);
		if (rc == 1)
			handle(w, c);
		else if (rc == 0)
			return -ETIMEDOUT;
		else
			return rc;
	}
}

static bool is_ready(struct ferry_chan_writer *w)
{
	return w->ready;
}

static bool has_room(struct ferry_chan_writer *w)
{
	return w->next_seq - w->low < w->p.max_outstanding || w->ntargets == 0;
}

static bool all_out(struct ferry_chan_writer *w)
{
	return w->low == w->next_seq;
}

static bool ops_done(struct ferry_chan_writer *w)
{
	return w->inflight == 0 && all_out(w);
}

static int create(struct ferry_engine *e, const char *name, const struct ferry_chan_params *p,
		  bool open, struct ferry_chan_writer **out)
{
	struct ferry_cq_params cqp = FERRY_CQ_PARAMS_INIT;
	struct ferry_chan_writer *w;
	struct ferry_sqe *sqe;
	int rc;

	if (!e || !p || !out || p->size < sizeof(*p) || !chan_name_ok(name) ||
	    (p->readers == 0 && !open) || p->readers > FERRY_CHAN_READERS_MAX ||
	    p->max_outstanding > CHAN_MAX_OUTSTANDING) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_create: bad arguments (NULL, a name not of "
			  "1..31 [A-Za-z0-9._-], readers not 1..%u, max_outstanding over %u)",
			  FERRY_CHAN_READERS_MAX, CHAN_MAX_OUTSTANDING);
		return -EINVAL;
	}
	if ((rc = chan_claim(e, "ferry_chan_create")))
		return rc;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->e = e;
	w->p = *p;
	if (!w->p.max_outstanding)
		w->p.max_outstanding = CHAN_DEFAULT_OUTSTANDING;
	strcpy(w->name, name);
	snprintf(w->mstream, sizeof(w->mstream), "fc/%s/m", name);
	w->aprefix_len = (size_t)snprintf(w->aprefix, sizeof(w->aprefix), "fc/%s/a/", name);
	w->open = open;
	w->ready = open;
	/* Every reader may sit behind a relay of its own: N readers, N relays at most. */
	w->cap = open ? FERRY_CHAN_READERS_MAX : 2 * p->readers;
	w->slots = calloc(w->cap, sizeof(*w->slots));
	w->shares = calloc(w->cap, sizeof(*w->shares));
	w->pending = calloc(w->p.max_outstanding, sizeof(*w->pending));
	w->st.readers = p->readers;
	cqp.entries = 1024;
	rc = (!w->slots || !w->shares || !w->pending) ? -ENOMEM : ferry_cq_create(e, &cqp, &w->cq);
	if (rc)
		goto fail;
	sqe = chan_sqe(e, &w->sq);
	if (!sqe) {
		rc = -ENOMEM;
		goto fail_cq;
	}
	ferry_prep_stream_accept(sqe, NULL, chan_ud(CHAN_UD_ACCEPT, 0, 0));
	ferry_sqe_set_cq(sqe, w->cq);
	w->inflight++;
	rc = submit(w);
	if (rc)
		goto fail_cq;
	*out = w;
	return 0;
fail_cq:
	ferry_cq_destroy(w->cq);
fail:
	free(w->slots);
	free(w->shares);
	free(w->pending);
	free(w);
	return rc;
}

int ferry_chan_create(struct ferry_engine *e, const char *name, const struct ferry_chan_params *p,
		      struct ferry_chan_writer **out)
{
	return create(e, name, p, false, out);
}

int chan_writer_create_open(struct ferry_engine *e, const char *name, uint32_t window,
			    ferry_chan_event_cb *cb, void *arg, struct ferry_chan_writer **out)
{
	struct ferry_chan_params p = FERRY_CHAN_PARAMS_INIT;

	p.max_outstanding = window;
	p.on_event = cb;
	p.event_arg = arg;
	return create(e, name, &p, true, out);
}

void chan_writer_poll(struct ferry_chan_writer *w)
{
	drain(w, 0, NULL);
}

void chan_writer_abort_all(struct ferry_chan_writer *w, int err)
{
	uint32_t i;

	for (i = 0; i < w->nslots; i++)
		if (w->slots[i].peer && !w->slots[i].gone) {
			/* Not a death of theirs: no event, no count. */
			w->slots[i].gone = true;
			if (w->slots[i].live && w->slots[i].kind != SLOT_MEMBER) {
				struct ferry_sqe *sqe = chan_sqe(w->e, &w->sq);

				if (!sqe)
					break;
				ferry_prep_stream_abort(sqe, w->slots[i].peer, w->mstream,
							ferry_strerror(err), chan_ud(CHAN_UD_ABORT, i, 0));
				ferry_sqe_set_cq(sqe, w->cq);
				w->inflight++;
			}
			w->slots[i].live = false;
		}
	w->ntargets = 0;
	submit(w);
}

int ferry_chan_handle(struct ferry_chan_writer *w, char *buf, size_t len)
{
	char addrs[FERRY_CHAN_HANDLE_MAX - 256];
	int n;

	if (!w || (!buf && len)) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_handle: NULL argument");
		return -EINVAL;
	}
	n = ferry_engine_addresses(w->e, addrs, sizeof(addrs));
	if (n < 0 || (size_t)n >= sizeof(addrs))
		addrs[0] = 0;
	return snprintf(buf, len, CHAN_HANDLE_TAG " writer=%s chan=%s readers=%u host=%016" PRIx64
			"%s%s", ferry_engine_name(w->e), w->name, w->p.readers, chan_host_id(),
			addrs[0] ? " addrs=" : "", addrs);
}

int ferry_chan_wait_ready(struct ferry_chan_writer *w, int64_t timeout_ns)
{
	if (!w) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_wait_ready: NULL writer");
		return -EINVAL;
	}
	if (chan_claim(w->e, "ferry_chan_wait_ready"))
		return -EPERM;
	return drain(w, chan_deadline(timeout_ns), is_ready);
}

static int64_t write_buf(struct ferry_chan_writer *w, struct ferry_buf *buf, int64_t timeout_ns)
{
	uint32_t i, k = 0, live;
	uint64_t seq;
	int rc;

	if (!has_room(w)) {
		w->st.write_waits++;
		if (timeout_ns == 0)
			return -EAGAIN;
		rc = drain(w, chan_deadline(timeout_ns), has_room);
		if (rc)
			return rc;
	}
	live = w->ntargets;
	if (live == 0)
		return -ENOTCONN;
	if (live == 1) {
		w->shares[0] = buf;
	} else if ((rc = ferry_buf_share(buf, live, w->shares))) {
		return rc;
	}
	seq = w->next_seq++;
	w->pending[seq % w->p.max_outstanding] = live;
	for (i = 0; i < w->nslots && k < live; i++) {
		struct ferry_sqe *sqe;

		if (!w->slots[i].live || w->slots[i].kind == SLOT_MEMBER)
			continue;
		sqe = chan_sqe(w->e, &w->sq);
		if (!sqe) {
			/* Cannot happen short of a wedged engine: count it lost for that reader. */
			ferry_buf_release(w->shares[k++]);
			w->pending[seq % w->p.max_outstanding]--;
			continue;
		}
		ferry_prep_stream_put_buf(sqe, w->slots[i].peer, w->mstream, w->shares[k++],
					  chan_ud(CHAN_UD_PUT, i, seq));
		ferry_sqe_set_cq(sqe, w->cq);
	}
	submit(w);
	w->st.written++;
	advance(w);
	return (int64_t)seq;
}

static int64_t write_check(struct ferry_chan_writer *w, const char *who)
{
	if (!w) {
		ferry_log(FERRY_LOG_ERROR, "%s: NULL writer", who);
		return -EINVAL;
	}
	if (chan_claim(w->e, who))
		return -EPERM;
	drain(w, 0, NULL);
	if (!w->ready || w->closing) {
		ferry_log(FERRY_LOG_INFO, "channel %s: write before the barrier (%u of %u attached)",
			  w->name, w->st.attached, w->p.readers);
		return -ENOTCONN;
	}
	return 0;
}

int64_t ferry_chan_write(struct ferry_chan_writer *w, const struct iovec *iov, unsigned iovcnt,
			 int64_t timeout_ns)
{
	struct ferry_buf *buf;
	size_t total = 0, off = 0;
	int64_t rc = write_check(w, "ferry_chan_write");
	unsigned i;

	if (rc)
		return rc;
	if (iovcnt && !iov) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_write: NULL iovec");
		return -EINVAL;
	}
	for (i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	if (!has_room(w) && timeout_ns == 0) {
		w->st.write_waits++;
		return -EAGAIN;
	}
	rc = ferry_buf_alloc(w->e, total, &buf);
	if (rc)
		return rc;
	for (i = 0; i < iovcnt; i++) {
		memcpy((char *)ferry_buf_data(buf) + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	rc = write_buf(w, buf, timeout_ns);
	if (rc < 0)
		ferry_buf_release(buf);
	else
		w->st.bytes_copied += total;
	return rc;
}

int64_t ferry_chan_write_buf(struct ferry_chan_writer *w, struct ferry_buf *buf,
			     int64_t timeout_ns)
{
	int64_t rc = write_check(w, "ferry_chan_write_buf");

	if (rc)
		return rc;
	if (!buf) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_write_buf: NULL buffer");
		return -EINVAL;
	}
	return write_buf(w, buf, timeout_ns);
}

int ferry_chan_flush(struct ferry_chan_writer *w, int64_t timeout_ns)
{
	if (!w) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_flush: NULL writer");
		return -EINVAL;
	}
	if (chan_claim(w->e, "ferry_chan_flush"))
		return -EPERM;
	return drain(w, chan_deadline(timeout_ns), all_out);
}

int ferry_chan_stats(struct ferry_chan_writer *w, struct ferry_chan_stats *st)
{
	if (!w || !st) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_stats: NULL argument");
		return -EINVAL;
	}
	if (chan_claim(w->e, "ferry_chan_stats"))
		return -EPERM;
	drain(w, 0, NULL);
	*st = w->st;
	st->outstanding = w->next_seq - w->low;
	return 0;
}

int ferry_chan_close(struct ferry_chan_writer *w)
{
	int64_t deadline = chan_deadline(CHAN_CLOSE_NS);
	struct ferry_sqe *sqe;
	uint32_t i;
	int rc;

	if (!w) {
		ferry_log(FERRY_LOG_ERROR, "ferry_chan_close: NULL writer");
		return -EINVAL;
	}
	if (chan_claim(w->e, "ferry_chan_close"))
		return -EPERM; /* nothing done: close it on the engine's poller thread */
	drain(w, deadline, all_out);
	w->closing = true;
	for (i = 0; i < w->nslots; i++) {
		if (!w->slots[i].live || w->slots[i].kind == SLOT_MEMBER)
			continue;
		sqe = chan_sqe(w->e, &w->sq);
		if (!sqe)
			break;
		ferry_prep_stream_put(sqe, w->slots[i].peer, w->mstream, NULL, 0,
				      chan_ud(CHAN_UD_END, i, 0));
		ferry_sqe_set_flags(sqe, FERRY_SQE_STREAM_END);
		ferry_sqe_set_cq(sqe, w->cq);
		ferry_sqe_set_timeout(sqe, (uint64_t)CHAN_CLOSE_NS);
		w->inflight++;
	}
	/* The acceptor and the attach streams still read: cancel them. */
	sqe = chan_sqe(w->e, &w->sq);
	if (sqe) {
		ferry_prep_cancel(sqe, chan_ud(CHAN_UD_ACCEPT, 0, 0), chan_ud(CHAN_UD_CANCEL, 0, 0));
		ferry_sqe_set_cq(sqe, w->cq);
		w->inflight++;
	}
	for (i = 0; i < w->nslots; i++) {
		if (w->slots[i].attach_end || !w->slots[i].peer)
			continue;
		sqe = chan_sqe(w->e, &w->sq);
		if (!sqe)
			break;
		ferry_prep_cancel(sqe, chan_ud(CHAN_UD_ATTACH, i, 0), chan_ud(CHAN_UD_CANCEL, i, 0));
		ferry_sqe_set_cq(sqe, w->cq);
		w->inflight++;
	}
	submit(w);
	drain(w, chan_deadline(2 * CHAN_CLOSE_NS), ops_done);
	rc = ferry_cq_destroy(w->cq);
	if (rc)
		ferry_log(FERRY_LOG_WARN, "channel %s: its CQ stays (%s): ops still out", w->name,
			  ferry_strerror(rc));
	free(w->slots);
	free(w->shares);
	free(w->pending);
	free(w);
	return 0;
}

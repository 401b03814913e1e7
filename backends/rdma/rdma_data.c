/*
 * backends/rdma/rdma_data.c - the data path of the rdma transport.
 *
 * Owns: PUTs going out (queued per connection in order, posted as SENDs
 * when a send buffer and a credit are there), messages coming in (every
 * field validated before use), the RDMA READs that pull announced data,
 * delivery in arrival order, RESULTs, and credits.
 *
 * Messages (rdma_int.h): a 32-byte header, then the body. Each end posts
 * RDMA_RECVS receives of RDMA_SLOT bytes and the other end starts with as
 * many credits: a message costs one, and every message carries back the
 * receives its sender posted again since its last one (a CREDIT message
 * alone when half of them wait to be told and nothing else goes). A data
 * message (EAGER, ANNOUNCE, RESULT, FILLED) needs two credits, so the last one is
 * always left for a CREDIT: two ends that both ran out still tell each
 * other, and a receiver is never sent more than it posted.
 *
 * A PUT of at most RDMA_EAGER_MAX bytes is copied into its SEND (from the
 * iovec, or from its pool block, which goes back to the pool then); the
 * receiver copies it into a block of its pool. A larger one is announced
 * (and a PUT of device memory registered for GPUDirect RDMA, whatever its
 * size, OP_F_DEVICE_DIRECT: no CPU copies device memory):
 * {address, rkey, length} of its registered pool block (a block that is
 * not of this engine's registered pool is first copied into one); the
 * receiver takes a block of its own pool and pulls the bytes with RDMA
 * READs (pieces of at most RDMA_READ_PIECE, at most RDMA_READS_MAX in
 * flight per connection) and answers RESULT, which frees the sender's
 * block: no CPU of the sender touches the bytes. A receiver whose pool is
 * full answers -ENOBUFS at once (eager and announced alike).
 *
 * A block still being filled (pipelined staging of device memory:
 * pool_filled) is announced with RDMA_HF_FILLING, then RM_FILLED says how
 * far it holds data (fill_tell) or that it never will (-EIO); the receiver
 * READs it into its pool no further than that (limit, on_filled).
 *
 * Order: incoming PUTs are delivered in the order they arrived on the QP
 * (an eager PUT behind an announced one waits for its READs), and answered
 * in that order.
 *
 * Validation: a message is checked against what it may hold before any of
 * it is used: magic, type, reserved fields, credits (never more than this
 * end posted), key length and termination, the body length exactly, the
 * payload length against the limits and against its segments (each
 * non-empty, their sum the payload, no overflow), the RESULT's message id
 * and generation against a PUT of ours posted on that very connection. The
 * READ itself is checked by the hardware against the sender's memory
 * region (an rkey or range it did not register fails the READ, which ends
 * the connection; a GPUDirect registration covers its whole CUDA
 * allocation, not only the region: see gd_register). A peer that breaks a
 * rule is disconnected; nobody else notices.
 */
#include "rdma_int.h"

#define RDMA_ALL_WIRE 0x7fu /* the flag bits rdma_wire_byte can set */

static inline uint8_t *recv_slot(struct rdma_conn *c, uint32_t i)
{
	return c->slab + (size_t)i * RDMA_SLOT;
}

static inline uint8_t *send_slot(struct rdma_conn *c, uint32_t i)
{
	return c->slab + (size_t)(RDMA_RECVS + i) * RDMA_SLOT;
}

static void post_recv(struct rdma_state *st, struct rdma_conn *c, uint32_t i)
{
	struct ibv_sge sge = { (uintptr_t)recv_slot(c, i), RDMA_SLOT, c->slab_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = rdma_wr_id(c->slot, c->gen, WR_RECV, i),
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(c->id->qp, &wr, &bad)) {
		rdma_conn_fail(st, c, -EIO, "ibv_post_recv failed");
		return;
	}
	c->recv_out++;
}

void rdma_post_recvs(struct rdma_state *st, struct rdma_conn *c)
{
	for (uint32_t i = 0; i < RDMA_RECVS && c->state != RC_DEAD; i++)
		post_recv(st, c, i);
}

int rdma_post_msg(struct rdma_state *st, struct rdma_conn *c, struct rdma_hdr *h,
		  const void *key, uint16_t key_len, const void *body, uint32_t body_len,
		  const struct iovec *iov, uint32_t iovcnt, bool reserve)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	uint32_t s, total;
	uint8_t *p;

	if (c->state == RC_DEAD || !c->nsend_free || c->credits < (reserve ? 2u : 1u) ||
	    c->wr_out >= RDMA_SQ_DEPTH)
		return -EAGAIN;
	s = c->send_free[--c->nsend_free];
	p = send_slot(c, s);
	h->magic = RDMA_MAGIC;
	h->key_len = key_len;
	h->credits = (uint16_t)c->owed;
	memcpy(p, h, sizeof(*h));
	total = sizeof(*h);
	if (key_len)
		memcpy(p + total, key, key_len);
	total += key_len;
	if (body_len)
		memcpy(p + total, body, body_len);
	total += body_len;
	if (iov) {
		if (h->type == RM_EAGER && iovcnt & 0x80000000u)
			total += (uint32_t)segs_gather((const struct ferry_seg *)iov,
						       iovcnt & 0x7fffffffu, p + total, h->len);
		else
			total += (uint32_t)iov_gather(iov, iovcnt, p + total, h->len);
	}
	sge.addr = (uintptr_t)p;
	sge.length = total;
	sge.lkey = c->slab_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = rdma_wr_id(c->slot, c->gen, WR_SEND, s);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (total <= c->max_inline) {
		wr.send_flags |= IBV_SEND_INLINE; /* copied into the WQE: no DMA read of the slot */
		atomic_fetch_add_explicit(&st->h_inline, 1, memory_order_relaxed);
	}
	if (ibv_post_send(c->id->qp, &wr, &bad)) {
		c->send_free[c->nsend_free++] = s;
		rdma_conn_fail(st, c, -ECONNRESET, "ibv_post_send failed");
		return -EIO;
	}
	c->owed = 0;
	c->credits--;
	c->wr_out++;
	c->last_tx_ns = reactor_now(st->engine);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Outgoing PUTs                                                      */
/* ------------------------------------------------------------------ */

static void msg_free(struct rdma_state *st, struct rdma_msg *m)
{
	struct rdma_conn *c = m->c;

	if (m->filling)
		c->nfilling--;
	m->filling = false;
	if (m->buf)
		pool_free(m->buf);
	m->buf = NULL;
	if (m->lprev)
		m->lprev->lnext = m->lnext;
	else
		c->msgs = m->lnext;
	if (m->lnext)
		m->lnext->lprev = m->lprev;
	m->lnext = m->lprev = NULL;
	m->live = false;
	m->c = NULL;
	m->op = NULL;
	m->next = st->free_msgs;
	st->free_msgs = m;
	rdma_conn_unref(st, c);
}

static void msg_result(struct rdma_state *st, struct rdma_msg *m, int res)
{
	if (m->resulted)
		return;
	m->resulted = true;
	if (m->op)
		reactor_put_done(st->engine, m->op, m->op_gen, res);
	m->op = NULL;
	msg_free(st, m);
}

int rdma_put(struct ferry_engine *e, struct backend *b, struct op *op)
{
	struct rdma_state *st = b->data;
	struct rdma_conn *c = op->peer->transport;
	struct rdma_msg *m;

	(void)e;
	if (!c || c->state == RC_DEAD)
		return -ECONNRESET;
	m = st->free_msgs;
	if (!m) {
		log_limited(FERRY__LOG_WARN, "rdma: engine %s: %u PUTs in flight already",
			    st->engine->name, st->nmsgs);
		return -ENOBUFS;
	}
	st->free_msgs = m->next;
	m->next = NULL;
	m->live = true;
	m->posted = false;
	m->resulted = false;
	m->inplace = false;
	m->filling = false;
	m->device = (op->flags & OP_F_DEVICE_DIRECT) != 0;
	m->gen++;
	m->op = op;
	m->op_gen = op->gen;
	m->c = c;
	c->refs++;
	m->len = op->len;
	m->flags = op->flags & WIRE_F__ALL;
	m->key_len = op->key_len;
	memcpy(m->key, op->key, op->key_len + 1u);
	m->buf = op->buf;
	op->buf = NULL;
	m->iov = NULL;
	m->iovcnt = 0;
	if (!m->buf) {
		/* Straight from the caller's memory (valid until it completes): small, or segments. */
		m->iov = op->iov;
		m->iovcnt = op->iovcnt | ((op->flags & FERRY_SQE_SEGS) ? 0x80000000u : 0);
	}
	m->lprev = NULL;
	m->lnext = c->msgs;
	if (c->msgs)
		c->msgs->lprev = m;
	c->msgs = m;
	if (c->q_tail)
		c->q_tail->next = m;
	else
		c->q_head = m;
	c->q_tail = m;
	rdma_conn_pump(st, c);
	return 0;
}

static int msg_post(struct rdma_state *st, struct rdma_conn *c, struct rdma_msg *m);

/*
 * A PUT of segments of registered regions (segs_in_place): one announcement
 * of the segments where they are, each with its region's rkey on c's
 * device, for the receiver to READ as a batch; the op is held from then on
 * (rdma_conn_pump). More segments than an announcement takes, or a region
 * not registered on the device: staged into a block of the pool first.
 */
static int announce_in_place(struct rdma_state *st, struct rdma_conn *c, struct rdma_msg *m,
			     struct rdma_hdr *h)
{
	const struct ferry_seg *segs = (const struct ferry_seg *)m->iov;
	uint32_t n = m->iovcnt & 0x7fffffffu, k = 0;
	struct rdma_seg_wire w[RDMA_MAX_SEG];
	uint64_t sum = 0;
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		struct rdma_mem *mem;

		if (!segs[i].len)
			continue; /* the receiver takes no empty segment */
		mem = ferry__region_reg(segs[i].region, st->b);
		if (k == RDMA_MAX_SEG || !mem || !mem->mr[c->dev->idx])
			goto stage;
		w[k].addr = (uintptr_t)segs[i].region->addr + segs[i].offset;
		w[k].rkey = mem->mr[c->dev->idx]->rkey;
		w[k].rsvd = 0;
		w[k].len = segs[i].len;
		sum += segs[i].len;
		k++;
	}
	if (sum != m->len)
		goto stage;
	h->type = RM_ANNOUNCE;
	h->nseg = (uint16_t)k;
	rc = rdma_post_msg(st, c, h, m->key, m->key_len, w, k * (uint32_t)sizeof(w[0]), NULL, 0,
			   true);
	if (rc == 0) {
		m->inplace = true;
		atomic_fetch_add_explicit(&st->h_inplace, 1, memory_order_relaxed);
		if (m->device)
			atomic_fetch_add_explicit(&st->h_gpudirect_puts, 1, memory_order_relaxed);
	}
	return rc;
stage:
	if (m->device) {
		/* Device memory registered on another device than c's, say: no CPU may copy it. */
		log_error("rdma: engine %s: a PUT of device memory to %s cannot be read in place "
			  "(a region not registered with %s for GPUDirect, or more than %u segments)",
			  st->engine->name, c->peer_name, c->dev->name, RDMA_MAX_SEG);
		return -EIO;
	}
	if (pool_alloc(st->engine->pool, m->len, &m->buf))
		return -ENOBUFS;
	segs_gather(segs, n, m->buf->data, m->len);
	m->iov = NULL;
	m->iovcnt = 0;
	return msg_post(st, c, m);
}

/* Post m (the head of c's queue): 0, or -EAGAIN (no room now). */
static int msg_post(struct rdma_state *st, struct rdma_conn *c, struct rdma_msg *m)
{
	struct rdma_hdr h = { .flags = rdma_wire_byte(m->flags), .id = m->id, .gen = m->gen,
			      .len = m->len };
	int rc;

	if (m->len <= RDMA_EAGER_MAX && !(m->device && m->len)) {
		/* (Device memory is never copied by the CPU: announced, however small.) */
		const void *data = m->buf ? m->buf->data : NULL;

		h.type = RM_EAGER;
		rc = rdma_post_msg(st, c, &h, m->key, m->key_len, data, m->buf ? (uint32_t)m->len : 0,
				   m->buf ? NULL : m->iov, m->iovcnt, true);
		if (rc)
			return rc;
		if (m->buf) {
			pool_free(m->buf); /* copied: the block goes back now */
			m->buf = NULL;
		}
		m->iov = NULL;
		atomic_fetch_add_explicit(&st->h_eager, 1, memory_order_relaxed);
		return 0;
	} else if (!m->buf) {
		return announce_in_place(st, c, m, &h);
	} else {
		struct rdma_seg_wire seg = { .len = m->len };
		uint32_t rkey = 0;

		if (!rdma_lkey(st, c->dev, m->buf, &rkey)) {
			/* Not of our registered pool (a peer's block, say): into one of ours. */
			struct ferry_buf *nb;

			if (pool_filled(m->buf) != m->len) {
				/* Still being filled: a copy now would send what is not there yet. */
				log_error("rdma: engine %s: a block still being filled is not "
					  "registered with %s", st->engine->name, c->dev->name);
				return -EIO;
			}

			if (pool_alloc(st->engine->pool, m->len, &nb))
				return -ENOBUFS;
			ferry__payload_copy(nb->data, m->buf->data, m->len);
			pool_free(m->buf);
			m->buf = nb;
			if (!rdma_lkey(st, c->dev, m->buf, &rkey))
				return -EIO;
		}
		seg.addr = (uintptr_t)m->buf->data;
		seg.rkey = rkey;
		h.type = RM_ANNOUNCE;
		h.nseg = 1;
		if (pool_filled(m->buf) != m->len)
			h.flags |= RDMA_HF_FILLING; /* READ only what RM_FILLED says */
		rc = rdma_post_msg(st, c, &h, m->key, m->key_len, &seg, sizeof(seg), NULL, 0, true);
		if (!rc && (h.flags & RDMA_HF_FILLING)) {
			m->filling = true;
			m->told = 0;
			c->nfilling++;
		}
		return rc;
	}
}

/* ------------------------------------------------------------------ */
/* Incoming PUTs                                                      */
/* ------------------------------------------------------------------ */

static void rx_free(struct rdma_state *st, struct rdma_rx *r)
{
	if (r->buf)
		pool_free(r->buf);
	r->buf = NULL;
	if (r->get) {
		/* Its READs are all back (or were never posted): the GET ends unfilled. */
		reactor_claimed_get_done(st->engine, r->get, -ECONNRESET, 0);
		r->get = NULL;
	}
	r->state = RX_FREE;
	r->c = NULL;
	r->next = st->free_rxs;
	st->free_rxs = r;
}

/*
 * Where the next READ of at most piece bytes writes: into r's block, or
 * into the claimed GET's current segment (shortened to what it has left).
 */
static void read_dst(struct rdma_state *st, struct rdma_conn *c, struct rdma_rx *r,
		     uint32_t pool_lkey, uint64_t *piece, struct ibv_sge *sge)
{
	const struct ferry_seg *g;
	struct rdma_mem *mem;

	if (!r->get) {
		sge->addr = (uintptr_t)r->buf->data + r->dst_off;
		sge->lkey = pool_lkey;
		return;
	}
	g = &r->get->segs[r->gseg];
	while (r->goff == g->len) { /* checked by direct_get: the segments hold r->len */
		r->gseg++;
		r->goff = 0;
		g++;
	}
	if (*piece > g->len - r->goff)
		*piece = g->len - r->goff;
	mem = ferry__region_reg(g->region, st->b);
	sge->addr = (uintptr_t)g->region->addr + g->offset + r->goff;
	sge->lkey = mem->mr[c->dev->idx]->lkey;
	r->goff += *piece;
}

static void post_reads(struct rdma_state *st, struct rdma_conn *c, struct rdma_rx *r)
{
	uint32_t lkey = r->get ? 0 : rdma_lkey(st, c->dev, r->buf, NULL);

	while (r->seg_next < r->nseg && r->dst_off < r->limit && c->reads_out < RDMA_READS_MAX &&
	       c->wr_out < RDMA_SQ_DEPTH) {
		struct rdma_seg_wire *s = &r->segs[r->seg_next];
		uint64_t piece = s->len - r->seg_off;
		struct ibv_sge sge;
		struct ibv_send_wr wr, *bad;

		if (piece > RDMA_READ_PIECE)
			piece = RDMA_READ_PIECE;
		if (piece > r->limit - r->dst_off)
			piece = r->limit - r->dst_off; /* (a block still being filled) */
		read_dst(st, c, r, lkey, &piece, &sge);
		sge.length = (uint32_t)piece;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = rdma_wr_id(c->slot, c->gen, WR_READ, (uint32_t)(r - st->rxs));
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = s->addr + r->seg_off;
		wr.wr.rdma.rkey = s->rkey;
		if (ibv_post_send(c->id->qp, &wr, &bad)) {
			rdma_conn_fail(st, c, -ECONNRESET, "ibv_post_send (READ) failed");
			return;
		}
		c->reads_out++;
		c->wr_out++;
		r->reads_left++;
		r->dst_off += piece;
		r->seg_off += piece;
		if (r->seg_off == s->len) {
			r->seg_next++;
			r->seg_off = 0;
		}
		atomic_fetch_add_explicit(&st->h_reads, 1, memory_order_relaxed);
	}
}

static int deliver(struct rdma_state *st, struct rdma_conn *c, struct rdma_rx *r)
{
	struct ferry_engine *e = st->engine;
	char fullkey[FULLKEY_MAX];
	int n, rc;

	if (r->get) {
		/* READ into the GET's own memory: it has the data now. */
		reactor_claimed_get_done(e, r->get, 0, r->len);
		r->get = NULL;
		return 0;
	}
	n = keytable_compose(fullkey, r->key, r->key_len, c->peer_name, e->name);
	rc = n < 0 ? n : reactor_deliver(e, NULL, fullkey, (size_t)n, r->buf, r->len, r->flags);
	if (rc)
		pool_free(r->buf);
	r->buf = NULL;
	return rc;
}

/*
 * c's PUTs announced while their blocks are filled: each receiver is told
 * how far its block holds data now (RM_FILLED), or that the rest never
 * comes (the block's filling failed: res -EIO), as far as credits allow.
 */
static void fill_tell(struct rdma_state *st, struct rdma_conn *c)
{
	for (struct rdma_msg *m = c->msgs; m && c->nfilling; m = m->lnext) {
		struct rdma_hdr h = { .type = RM_FILLED, .id = m->id, .gen = m->gen };
		uint64_t filled;

		if (!m->filling || !m->posted)
			continue;
		filled = pool_filled(m->buf);
		if (filled == POOL_FILL_FAILED)
			h.res = -EIO;
		else if (filled <= m->told)
			continue;
		h.len = filled == POOL_FILL_FAILED ? m->told : filled;
		if (rdma_post_msg(st, c, &h, NULL, 0, NULL, 0, NULL, 0, true))
			return; /* no room now: the next pump */
		m->told = h.len;
		if (h.res || filled == m->len) {
			m->filling = false;
			c->nfilling--;
		}
	}
}

/* Everything c can do now: READs, deliveries and RESULTs in order, PUTs, credits. */
void rdma_conn_pump(struct rdma_state *st, struct rdma_conn *c)
{
	if (c->state != RC_READY)
		return;
	for (struct rdma_rx *r = c->rx_head; r && c->state == RC_READY; r = r->next)
		if (r->state == RX_READING && r->seg_next < r->nseg)
			post_reads(st, c, r);
	for (struct rdma_rx *r = c->rx_head; r && r->state != RX_READING; r = r->next) {
		if (r->state == RX_READY) {
			if (!r->res)
				r->res = deliver(st, c, r);
			r->state = RX_ANSWER;
		}
	}
	while (c->rx_head && c->rx_head->state == RX_ANSWER && c->state == RC_READY) {
		struct rdma_rx *r = c->rx_head;
		struct rdma_hdr h = { .type = RM_RESULT, .id = r->id, .gen = r->gen, .res = r->res };

		if (rdma_post_msg(st, c, &h, NULL, 0, NULL, 0, NULL, 0, true))
			break;
		c->rx_head = r->next;
		if (!c->rx_head)
			c->rx_tail = NULL;
		rx_free(st, r);
	}
	while (c->q_head && c->state == RC_READY) {
		struct rdma_msg *m = c->q_head;
		int rc = msg_post(st, c, m);

		if (rc == -EAGAIN)
			break;
		c->q_head = m->next;
		if (!c->q_head)
			c->q_tail = NULL;
		m->next = NULL;
		if (rc) {
			msg_result(st, m, rc);
			continue;
		}
		m->posted = true;
		if (m->inplace && m->op)
			reactor_put_held(st->engine, m->op, m->op_gen); /* read in place from now on */
	}
	if (unlikely(c->nfilling) && c->state == RC_READY)
		fill_tell(st, c);
	if (c->state == RC_READY && c->owed >= RDMA_RECVS / 2) {
		struct rdma_hdr h = { .type = RM_CREDIT };

		rdma_post_msg(st, c, &h, NULL, 0, NULL, 0, NULL, 0, false);
	}
}

/* A peer broke a rule: it goes, and only it. */
static void malformed(struct rdma_state *st, struct rdma_conn *c, const char *why)
{
	atomic_fetch_add_explicit(&st->h_malformed, 1, memory_order_relaxed);
	log_warn("rdma: engine %s: %s sent a malformed message (%s): disconnected",
		 st->engine->name, c->peer_name, why);
	rdma_conn_fail(st, c, -ECONNRESET, NULL);
}

static struct rdma_rx *rx_take(struct rdma_state *st, struct rdma_conn *c,
			       const struct rdma_hdr *h, const uint8_t *key)
{
	struct rdma_rx *r = st->free_rxs;

	if (!r) {
		malformed(st, c, "more PUTs in flight than this engine holds");
		return NULL;
	}
	st->free_rxs = r->next;
	memset(r, 0, offsetof(struct rdma_rx, segs));
	r->c = c;
	r->id = h->id;
	r->gen = h->gen;
	r->len = h->len;
	r->flags = rdma_wire_flags(h->flags);
	r->key_len = h->key_len;
	memcpy(r->key, key, h->key_len);
	r->key[h->key_len] = '\0';
	r->next = NULL;
	if (c->rx_tail)
		c->rx_tail->next = r;
	else
		c->rx_head = r;
	c->rx_tail = r;
	return r;
}

/*
 * A GET parked for r's key that takes it into segments of regions
 * registered on c's device: claimed, r READs straight into them (no block
 * of the pool, no copy). Its deadline stops until r ends (reactor_claim_get).
 * Device segments too, when their regions are registered for GPUDirect
 * RDMA: the NIC writes the GPU's memory; else the data goes through a
 * block, and the memory domain copies it to the device.
 */
static bool direct_get(struct rdma_state *st, struct rdma_conn *c, struct rdma_rx *r)
{
	struct ferry_engine *e = st->engine;
	char fullkey[FULLKEY_MAX];
	struct op *op;
	int n = keytable_compose(fullkey, r->key, r->key_len, c->peer_name, e->name);

	if (n < 0 || !(op = reactor_parked_get(e, fullkey, (size_t)n, r->len, r->flags)))
		return false;
	for (uint32_t i = 0; i < op->iovcnt; i++) {
		struct rdma_mem *mem;

		if (!op->segs[i].len)
			continue;
		mem = ferry__region_reg(op->segs[i].region, st->b);
		if (!mem || !mem->mr[c->dev->idx])
			return false; /* not registered on this device: through a block */
	}
	reactor_claim_get(e, op);
	r->get = op;
	r->gseg = 0;
	r->goff = 0;
	return true;
}

/*
 * RM_FILLED: the sender's block of an announcement with RDMA_HF_FILLING
 * holds more (READ on up to h->len), or never will (res < 0: it is
 * answered -EIO once its READs are back, nothing delivered). One for a PUT
 * no longer read here (answered already: -ENOBUFS, say, while the sender
 * was telling) changes nothing and is let go; one for a PUT being read
 * must say more than before, within it.
 */
static void on_filled(struct rdma_state *st, struct rdma_conn *c, const struct rdma_hdr *h,
		      uint32_t blen)
{
	struct rdma_rx *r = c->rx_head;

	if (h->key_len || blen || h->nseg || h->res > 0 || (h->res && h->res != -EIO)) {
		malformed(st, c, "bad FILLED");
		return;
	}
	while (r && (r->id != h->id || r->gen != h->gen))
		r = r->next;
	if (!r || r->state != RX_READING || r->res)
		return; /* (refused meanwhile: -ETIMEDOUT, its READs still out) */
	if (r->limit == r->len || (!h->res && (h->len <= r->limit || h->len > r->len))) {
		malformed(st, c, "a FILLED that does not follow its announcement");
		return;
	}
	if (h->res) {
		rdma_rx_unfilled(r, -EIO);
		return;
	}
	r->limit = h->len;
	r->fill_ns = ferry__now_ns();
}

void rdma_rx_unfilled(struct rdma_rx *r, int res)
{
	r->res = res;
	r->limit = r->len; /* (nothing more comes) */
	r->seg_next = r->nseg;
	if (!r->reads_left)
		r->state = RX_READY;
}

static void on_message(struct rdma_state *st, struct rdma_conn *c, const uint8_t *p,
		       uint32_t n)
{
	struct rdma_hdr h;
	const uint8_t *body;
	uint32_t blen;
	struct rdma_rx *r;

	if (n < sizeof(h)) {
		malformed(st, c, "shorter than a header");
		return;
	}
	memcpy(&h, p, sizeof(h));
	body = p + sizeof(h);
	blen = n - (uint32_t)sizeof(h);
	if (h.magic != RDMA_MAGIC || h.type == 0 || h.type >= RM__MAX || h.rsvd ||
	    (h.flags & ~(RDMA_ALL_WIRE | (h.type == RM_ANNOUNCE ? RDMA_HF_FILLING : 0))) ||
	    h.key_len > blen) {
		malformed(st, c, "bad header");
		return;
	}
	if (h.credits > RDMA_RECVS || c->credits + h.credits > RDMA_RECVS) {
		malformed(st, c, "more credits than receives");
		return;
	}
	c->credits += h.credits;
	if (c->state != RC_READY) {
		if (h.type > RM_AUTH) {
			/*
			 * The handshake comes first; nothing else is read before
			 * it but a CREDIT (the other end may be READY already
			 * and send a heartbeat).
			 */
			if (h.type == RM_CREDIT && !h.key_len && !blen &&
			    (c->caller ? c->state == RC_WAIT_PROOF : c->state == RC_WAIT_AUTH))
				return;
			malformed(st, c, "data before the handshake");
			return;
		}
		rdma_hs_message(st, c, &h, body, blen);
		return;
	}
	switch (h.type) {
	case RM_EAGER:
		if (!wire_key_ok(body, h.key_len) || h.nseg || h.len > RDMA_EAGER_MAX ||
		    blen != h.key_len + h.len) {
			malformed(st, c, "bad eager PUT");
			return;
		}
		if (!(r = rx_take(st, c, &h, body)))
			return;
		if (pool_alloc(st->engine->pool, h.len, &r->buf)) {
			r->res = -ENOBUFS;
		} else {
			ferry__payload_copy(r->buf->data, body + h.key_len, h.len);
		}
		r->state = RX_READY;
		return;
	case RM_ANNOUNCE: {
		uint64_t sum = 0;

		/* (Small ones too: device memory is announced whatever its size.) */
		if (!wire_key_ok(body, h.key_len) || h.nseg == 0 || h.nseg > RDMA_MAX_SEG ||
		    blen != h.key_len + h.nseg * sizeof(struct rdma_seg_wire) || h.len == 0) {
			malformed(st, c, "bad announcement");
			return;
		}
		if (!(r = rx_take(st, c, &h, body)))
			return;
		memcpy(r->segs, body + h.key_len, h.nseg * sizeof(struct rdma_seg_wire));
		for (uint32_t i = 0; i < h.nseg; i++) {
			if (!r->segs[i].len || r->segs[i].rsvd || r->segs[i].len > h.len - sum ||
			    r->segs[i].addr + r->segs[i].len < r->segs[i].addr) {
				malformed(st, c, "bad segment in an announcement");
				return;
			}
			sum += r->segs[i].len;
		}
		if (sum != h.len) {
			malformed(st, c, "announced segments do not add up to its length");
			return;
		}
		r->nseg = h.nseg;
		/* A block still being filled: READ as RM_FILLED says, into a block of ours. */
		r->limit = (h.flags & RDMA_HF_FILLING) ? 0 : h.len;
		if (!r->limit) {
			r->fill_ns = ferry__now_ns();
			if (pool_alloc(st->engine->pool, h.len, &r->buf)) {
				r->res = -ENOBUFS;
				r->state = RX_READY;
			} else {
				r->state = RX_READING;
				atomic_fetch_add_explicit(&st->h_read_bytes, h.len, memory_order_relaxed);
			}
		} else if (direct_get(st, c, r)) {
			r->state = RX_READING;
			atomic_fetch_add_explicit(&st->h_read_bytes, h.len, memory_order_relaxed);
			atomic_fetch_add_explicit(&st->h_into_get, 1, memory_order_relaxed);
		} else if (pool_alloc(st->engine->pool, h.len, &r->buf)) {
			r->res = -ENOBUFS;
			r->state = RX_READY;
		} else {
			r->state = RX_READING;
			atomic_fetch_add_explicit(&st->h_read_bytes, h.len, memory_order_relaxed);
		}
		return;
	}
	case RM_RESULT: {
		struct rdma_msg *m = h.id < st->nmsgs ? &st->msgs[h.id] : NULL;

		if (h.key_len || blen || !m || !m->live || m->gen != h.gen || m->c != c ||
		    !m->posted || h.res > 0 || h.res < -4095) {
			malformed(st, c, "a RESULT for no PUT of ours");
			return;
		}
		msg_result(st, m, h.res);
		return;
	}
	case RM_CREDIT:
		if (h.key_len || blen)
			malformed(st, c, "bad credit");
		return;
	case RM_FILLED:
		on_filled(st, c, &h, blen);
		return;
	default:
		malformed(st, c, "a handshake message after the handshake");
		return;
	}
}

void rdma_on_wc(struct rdma_state *st, const struct ibv_wc *wc)
{
	struct rdma_conn *c = rdma_conn_of(st, wc->wr_id);
	unsigned kind = (unsigned)(wc->wr_id >> 16) & 0xf;
	uint32_t idx = (uint32_t)wc->wr_id & 0xffff;

	if (!c)
		return; /* a connection already gone */
	switch (kind) {
	case WR_RECV:
		c->recv_out--;
		if (c->state == RC_DEAD)
			return;
		if (wc->status != IBV_WC_SUCCESS) {
			rdma_conn_fail(st, c, -ECONNRESET, ibv_wc_status_str(wc->status));
			return;
		}
		on_message(st, c, recv_slot(c, idx), wc->byte_len);
		if (c->state == RC_DEAD)
			return;
		post_recv(st, c, idx);
		c->owed++;
		break;
	case WR_SEND:
		c->wr_out--;
		c->send_free[c->nsend_free++] = idx;
		if (c->state != RC_DEAD && wc->status != IBV_WC_SUCCESS) {
			rdma_conn_fail(st, c, -ECONNRESET, ibv_wc_status_str(wc->status));
			return;
		}
		break;
	case WR_READ: {
		struct rdma_rx *r = idx < st->nrxs ? &st->rxs[idx] : NULL;

		c->wr_out--;
		c->reads_out--;
		if (!r || r->c != c)
			return;
		r->reads_left--;
		if (c->state == RC_DEAD)
			return;
		if (wc->status != IBV_WC_SUCCESS) {
			/* The sender's announcement named memory it did not register, or it died. */
			rdma_conn_fail(st, c, -ECONNRESET, ibv_wc_status_str(wc->status));
			return;
		}
		if (!r->reads_left && r->seg_next == r->nseg)
			r->state = RX_READY;
		break;
	}
	default:
		return;
	}
	rdma_conn_pump(st, c);
}

/*
 * c died: PUTs on it end (those that never left get their block back, as
 * any PUT whose peer never came up), incoming PUTs go, except those whose
 * READs are still out (their block is written until the flush comes back;
 * rdma_sweep calls again then).
 */
void rdma_conn_drop_data(struct rdma_state *st, struct rdma_conn *c, int res)
{
	int unsent = res == -ECANCELED || res == -EACCES ? res : -EHOSTUNREACH;

	c->refs++;
	for (struct rdma_msg *m = c->q_head; m; m = m->next) {
		if (m->op && m->buf && m->op->gen == m->op_gen) {
			m->op->buf = m->buf;
			m->buf = NULL;
		}
	}
	c->q_head = c->q_tail = NULL;
	while (c->msgs) {
		struct rdma_msg *m = c->msgs;

		msg_result(st, m, m->posted ? (res == -ECANCELED ? res : -ECONNRESET) : unsent);
	}
	for (struct rdma_rx **pp = &c->rx_head, *r; (r = *pp);) {
		if (r->reads_left && c->wr_out) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		rx_free(st, r);
	}
	c->rx_tail = NULL;
	for (struct rdma_rx *r = c->rx_head; r; r = r->next)
		c->rx_tail = r;
	rdma_conn_unref(st, c);
}

void rdma_msg_forget(struct rdma_state *st, struct rdma_conn *c, struct op *op)
{
	struct rdma_msg **pp, *m, *prev = NULL;

	for (pp = &c->q_head; (m = *pp); prev = m, pp = &m->next) {
		if (m->op != op || m->op_gen != op->gen || m->resulted)
			continue;
		*pp = m->next;
		if (c->q_tail == m)
			c->q_tail = prev;
		m->next = NULL;
		m->op = NULL;
		m->resulted = true;
		msg_free(st, m);
		return;
	}
}

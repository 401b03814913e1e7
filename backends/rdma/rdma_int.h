/*
 * backends/rdma/rdma_int.h - what the pieces of the rdma transport share
 * (private to backends/rdma/ and its tests).
 *
 * Owns: the transport's limits, the wire format of its messages, the types
 * (devices, memory registrations, connections, outgoing messages, incoming
 * PUTs, the transport's state) and the functions each file offers the
 * others. The transport itself is described in rdma.c's header comment.
 *
 *   rdma.c       the table, devices, the memory hooks, the reactor's wait
 *                on the completion channels and the rdma_cm channel, the
 *                round, health, addresses
 *   rdma_conn.c  connections: rdma_cm events, the authenticated handshake,
 *                faults and teardown
 *   rdma_data.c  the data path: PUTs out (eager SEND, announcements),
 *                messages in (validation, RDMA READ, ordered delivery),
 *                RESULTs, credits
 *   rdma_hotplug.c  devices removed under the engine (released at once),
 *                the kernel's device events, listening again
 */
#ifndef FERRY_RDMA_INT_H
#define FERRY_RDMA_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "internal.h"
#include "memory.h"
#include "security.h"

#define RDMA_MAX_DEV 8        /* devices of one engine */
#define RDMA_MAX_CONNS 256    /* connections of one engine */
#define RDMA_PREAUTH_MAX 32   /* callees that proved nothing yet, at once */
#define RDMA_SLOT 8192u       /* one message buffer (send or receive) */
#define RDMA_RECVS 64u        /* receives posted per connection: the peer's credits */
#define RDMA_SENDS 96u        /* send buffers per connection */
#define RDMA_READS_MAX 8u     /* RDMA READs in flight per connection */
#define RDMA_READ_PIECE (256u << 10) /* one READ moves at most this much */
#define RDMA_SQ_DEPTH (RDMA_SENDS + RDMA_READS_MAX + 8u)
#define RDMA_CQ_DEPTH 4096
#define RDMA_EAGER_MAX 4096u  /* payloads up to this go inside the SEND */
#define RDMA_INLINE_MAX 256u  /* iovec PUTs up to this are copied into the message */
/*
 * Messages up to this many bytes (header, key and body) are posted with
 * IBV_SEND_INLINE: the device takes them from the work request, no DMA read
 * of the send buffer. Asked of each QP; a device that grants less gets less.
 */
#define RDMA_SEND_INLINE 256u
#define RDMA_MAX_SEG 64u      /* segments of one announcement */
#define RDMA_HS_NS 3000000000ull /* a handshake not done by then is dropped (params.handshake_ms) */
#define RDMA_CONNECT_MS 2000  /* rdma_resolve_addr / _route */
#define RDMA_TICK_MAX_NS 250000000ull /* the transport's timer ticks at least this often */
#define RDMA_RELISTEN_NS 100000000ull /* a listener lost with its device: tried again this often */
#define RDMA_UEV_RECHECK_NS 2000000000ull /* device events lost: devices looked for this long */
#define RDMA_RETRIES 6        /* a QP's retries of an unacknowledged message (retry_cnt) */

/* ------------------------------------------------------------------ */
/* Wire: every message is a header, then its type's body              */
/* ------------------------------------------------------------------ */

#define RDMA_MAGIC 0xfe
#define RDMA_CM_MAGIC 0x4652444du /* "FRDM": rdma_cm private data of a connect */
/*
 * 2: RM_FILLED and RDMA_HF_FILLING, announcements of any non-zero length (a
 * peer of version 1 would call them malformed mid-transfer: refused at the
 * connect instead).
 */
#define RDMA_VERSION 2

enum {
	RM_HELLO = 1, /* caller: key = its name, body = its nonce */
	RM_PROOF,     /* callee: body = its nonce, its proof */
	RM_AUTH,      /* caller: body = its proof */
	RM_EAGER,     /* key, then len bytes of data */
	RM_ANNOUNCE,  /* key, then nseg segments (struct rdma_seg_wire) of len bytes in all */
	RM_RESULT,    /* id, gen: which PUT; res: its result; the sender may free its block */
	RM_CREDIT,    /* only the credits */
	/*
	 * id, gen: an ANNOUNCE with RDMA_HF_FILLING; len: its bytes from the
	 * start that hold data now (more than it said before, at most the
	 * PUT's); res < 0: the rest never comes (the receiver answers it so)
	 */
	RM_FILLED,
	RM__MAX
};
/*
 * ANNOUNCE: the block is still being filled (pipelined staging of device
 * memory): READ no byte past what RM_FILLED says, none before the first.
 */
#define RDMA_HF_FILLING 0x80u

struct rdma_hdr {
	uint8_t magic;
	uint8_t type;
	uint8_t flags;    /* a PUT's wire flags (rdma_wire_flags) */
	uint8_t nseg;     /* ANNOUNCE */
	uint16_t key_len; /* EAGER, ANNOUNCE, HELLO: bytes of key after the header */
	uint16_t credits; /* receives the sender posted again since its last message */
	uint32_t id, gen; /* EAGER, ANNOUNCE, RESULT: the sender's message */
	int32_t res;      /* RESULT */
	uint32_t rsvd;    /* 0 */
	uint64_t len;     /* EAGER, ANNOUNCE: payload bytes */
};

struct rdma_seg_wire {
	uint64_t addr;
	uint32_t rkey;
	uint32_t rsvd;
	uint64_t len;
};

struct rdma_cm_pdata {
	uint32_t magic;
	uint16_t version;
	uint16_t rsvd;
};

_Static_assert(sizeof(struct rdma_hdr) == 32, "rdma_hdr is 32 bytes on the wire");
_Static_assert(RDMA_SLOT >= sizeof(struct rdma_hdr) + FERRY_KEY_MAX + RDMA_EAGER_MAX,
	       "an eager message fits a slot");
_Static_assert(RDMA_SLOT >= sizeof(struct rdma_hdr) + FERRY_KEY_MAX +
				    RDMA_MAX_SEG * sizeof(struct rdma_seg_wire),
	       "an announcement fits a slot");

/* A PUT's WIRE_F_* flags <-> the byte on the wire. */
static const uint32_t rdma_flag_bits[] = { WIRE_F_REPLACE, WIRE_F_CHUNK, WIRE_F_END,
					   WIRE_F_ABORT,   WIRE_F_CREDIT, WIRE_F_WANT,
					   WIRE_F_RELCREDIT };

static inline uint8_t rdma_wire_byte(uint32_t f)
{
	uint8_t b = 0;

	for (unsigned i = 0; i < sizeof(rdma_flag_bits) / sizeof(rdma_flag_bits[0]); i++)
		if (f & rdma_flag_bits[i])
			b |= (uint8_t)(1u << i);
	return b;
}

static inline uint32_t rdma_wire_flags(uint8_t b)
{
	uint32_t f = 0;

	for (unsigned i = 0; i < sizeof(rdma_flag_bits) / sizeof(rdma_flag_bits[0]); i++)
		if (b & (1u << i))
			f |= rdma_flag_bits[i];
	return f;
}

/* ------------------------------------------------------------------ */
/* Types                                                              */
/* ------------------------------------------------------------------ */

/* wr_id: connection slot and generation, kind, index. */
enum { WR_RECV = 1, WR_SEND = 2, WR_READ = 3 };

static inline uint64_t rdma_wr_id(uint32_t slot, uint32_t gen, unsigned kind, uint32_t idx)
{
	return ((uint64_t)gen << 32) | ((uint64_t)slot << 20) | ((uint64_t)kind << 16) | idx;
}

/*
 * A device this engine opened: its protection domain, completion queue and
 * channel. A slot of devs[] whose device was removed is not live (every
 * loop over devs[0..ndevs) skips it; set under mem_lock, which the memory
 * hooks hold) until a device opened later takes it again; gen tells the
 * reactor's completions of its channel poll from those of the slot's
 * earlier device.
 */
struct rdma_dev {
	bool live;
	uint32_t gen;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	unsigned idx;
	bool poll_armed;   /* the reactor's ring polls ch->fd */
	bool notify_armed; /* ibv_req_notify_cq asked for the next completion */
	bool event;        /* the channel signalled: drain it */
	uint32_t max_sge, max_rd;
	char name[64];
};

/* One memory registration (the pool, a region): its MR on each device. */
struct rdma_mem {
	void *addr;
	size_t len;
	struct ibv_mr *mr[RDMA_MAX_DEV];
	/*
	 * CUDA device memory registered for GPUDirect RDMA: its dma-buf (kept
	 * open for devices opened later) and where addr lies in it; -1: host
	 * memory.
	 */
	int dmabuf_fd;
	uint64_t dmabuf_off;
	bool gpudirect;  /* counted in h_gpudirect_regions: registered on every device (mem_lock) */
	/*
	 * GPUDirect's registrations by allocation (under mem_lock): an entry
	 * (gd_entry) registers a whole CUDA allocation of gd_device, known by
	 * the driver's id of it (gd_id), once; the regions within it borrow its
	 * memory regions (gd: their entry; they own none), gd_refs of them. An
	 * entry no region uses is kept RDMA_GD_IDLE_NS (gd_idle_since), then
	 * dropped (rdma_gd_sweep); at most RDMA_GD_ENTRIES of them.
	 */
	struct rdma_mem *gd;
	bool gd_entry;
	int gd_device;
	uint64_t gd_id;
	uint32_t gd_refs;
	uint64_t gd_idle_since;
	struct rdma_mem *next;
};

enum {
	RC_RESOLVING = 1, /* caller: address, then route */
	RC_CONNECTING,    /* caller: rdma_connect sent */
	RC_ACCEPTING,     /* callee: rdma_accept sent */
	RC_WAIT_PROOF,    /* caller: HELLO sent */
	RC_WAIT_HELLO,    /* callee: established */
	RC_WAIT_AUTH,     /* callee: PROOF sent */
	RC_READY,
	RC_DEAD,
};

/* An outgoing PUT. */
struct rdma_msg {
	struct op *op;
	uint32_t op_gen;
	uint32_t id, gen;
	bool live;
	bool posted;       /* its SEND went on the QP */
	bool send_done;    /* ... and completed */
	bool resulted;
	bool inplace;      /* announced from the caller's segments (its op is held) */
	bool device;       /* its segments are device memory (OP_F_DEVICE_DIRECT): never CPU-copied */
	bool filling;      /* announced while its block is filled (RDMA_HF_FILLING): told goes on */
	uint64_t told;     /* ... the bytes the receiver was told hold data (RM_FILLED) */
	struct rdma_conn *c;
	struct ferry_buf *buf; /* its data (announced, or NULL: copied into its SEND) */
	/*
	 * buf NULL: the caller's memory (valid until the op ends): an inline
	 * PUT's iovec until it is posted, or segments (the 0x80000000 bit of
	 * iovcnt) copied into the SEND or announced where they are.
	 */
	const struct iovec *iov;
	uint32_t iovcnt;
	uint64_t len;
	uint32_t flags;
	uint16_t key_len;
	char key[FERRY_KEY_MAX];
	struct rdma_msg *next; /* the connection's queue to post, or the free list */
	struct rdma_msg *lnext, *lprev; /* the connection's messages */
};

enum { RX_FREE = 0, RX_READING, RX_READY, RX_ANSWER };

/* An incoming PUT, from its arrival until its RESULT is posted. */
struct rdma_rx {
	uint8_t state;
	int res;
	struct rdma_conn *c;
	uint32_t id, gen;    /* the sender's message */
	struct ferry_buf *buf;
	uint64_t len;
	uint32_t reads_left; /* READs posted or to post */
	uint32_t nseg, seg_next;
	uint64_t seg_off;    /* into the current segment */
	uint64_t dst_off;    /* into buf */
	uint64_t limit;      /* READ no byte past it (RDMA_HF_FILLING: what RM_FILLED said) */
	uint64_t fill_ns;    /* ... when the sender last said more (rdma_check_time) */
	/* READ straight into a parked GET's segments (reactor_claim_get), not into buf: */
	struct op *get;
	uint32_t gseg;       /* its segment the next READ writes into */
	uint64_t goff;       /* and where in it */
	struct rdma_seg_wire segs[RDMA_MAX_SEG];
	uint32_t flags;
	uint16_t key_len;
	char key[FERRY_KEY_MAX];
	struct rdma_rx *next; /* the connection's in-order queue, or the free list */
};

struct rdma_conn {
	struct rdma_state *st;
	struct rdma_cm_id *id;
	struct rdma_dev *dev;
	uint32_t slot, gen;
	uint8_t state;
	bool caller;
	bool qp_made;
	bool established;
	uint64_t dead_ns;    /* when it died (its QP is destroyed once drained) */
	bool drop_now;       /* its device is gone: destroyed at the next sweep, drained or not */
	int refs;            /* the table, each peer resolved to it */
	int fail_res;        /* why it died, for PUTs still waiting */
	uint64_t hs_deadline;
	uint64_t last_tx_ns; /* when a message was last posted on it (the heartbeat's clock) */
	char peer_name[FERRY_NAME_MAX];
	struct sockaddr_storage peer_sa;
	uint8_t nonce_me[SEC_NONCE_BYTES], nonce_peer[SEC_NONCE_BYTES];
	/* Buffers: RDMA_RECVS receive slots, then RDMA_SENDS send slots. */
	uint8_t *slab;
	struct ibv_mr *slab_mr;
	uint32_t send_free[RDMA_SENDS];
	uint32_t nsend_free;
	uint32_t wr_out;     /* work requests posted, not completed (sends, READs) */
	uint32_t recv_out;   /* receives posted */
	uint32_t credits;    /* messages we may still send: the peer's posted receives */
	uint32_t max_inline; /* bytes its QP sends inline (what the device granted; 0: none) */
	uint32_t owed;       /* receives posted again, not yet told to the peer */
	uint32_t nfilling;   /* its messages with filling set */
	uint32_t reads_out;
	/* Outgoing PUTs: those to post, in order; every live one. */
	struct rdma_msg *q_head, *q_tail;
	struct rdma_msg *msgs;
	/* Incoming PUTs in arrival order: delivered, then answered, from the head. */
	struct rdma_rx *rx_head, *rx_tail;
	struct rdma_conn *next; /* the state's list */
};

struct rdma_state {
	struct ferry_engine *engine;
	struct backend *b;
	bool probed;            /* devices looked for */
	char why[160];          /* no rdma here: why (health) */
	struct rdma_event_channel *ec;
	bool ec_armed;
	struct rdma_cm_id *listen_id;
	bool listen_lost;       /* its device was removed: listened again at bound_sa (rdma_relisten) */
	bool relisten_told;     /* the first failed try of this loss was logged */
	uint64_t relisten_at;   /* not before */
	struct sockaddr_storage bound_sa; /* where the listener is bound (its scope id too) */
	char listen_text[PEER_ADDR_MAX];
	char bound[PEER_ADDR_MAX];
	struct sec_secret secret;
	uint64_t hs_ns;         /* a handshake's bound (params.handshake_ms, 0: RDMA_HS_NS) */
	/*
	 * Heartbeat (params.heartbeat_ms / peer_timeout_ms): a READY
	 * connection that posted nothing for heartbeat_ns posts a CREDIT, and
	 * its QP gives up on a message the peer's device does not acknowledge
	 * after RDMA_RETRIES + 1 = 7 tries of 4.096 us << ack_timeout each
	 * (rdma_cm's ACK_TIMEOUT option, the largest that keeps the 7 within
	 * peer_timeout_ms).
	 */
	uint64_t heartbeat_ns;
	uint64_t peer_timeout_ns; /* also: a block being filled that says nothing more for it fails */
	uint8_t ack_timeout;
	bool ack_timeout_warned;
	bool tick_armed;        /* a TIMEOUT of ours is on the reactor's ring */
	bool tick_due;          /* it fired: the time checks run this round */
	struct __kernel_timespec tick_ts;
	struct rdma_dev devs[RDMA_MAX_DEV];
	unsigned ndevs;
	unsigned nlive;         /* of devs[0..ndevs): those live (under mem_lock) */
	unsigned nsys_devs;     /* devices the system has (rdma_get_devices) */
	struct ibv_context **dev_list;
	/*
	 * The kernel's device events (a NETLINK_KOBJECT_UEVENT socket, -1 when
	 * it cannot be had): how an engine hears of a device removed that none
	 * of its rdma_cm ids is on (rdma_hotplug.c).
	 */
	int uev_fd;
	bool uev_armed, uev_event;
	/*
	 * Events were lost: until then every tick looks for the verbs node of
	 * each device (a removal's event comes before its node goes).
	 */
	uint64_t uev_recheck_until;
	_Atomic uint32_t h_devices_removed;
	/* Registrations: the memory hooks may run on any thread. */
	pthread_mutex_t mem_lock;
	struct rdma_mem *mems;
	/* Tables. */
	struct rdma_conn *conns[RDMA_MAX_CONNS];
	struct rdma_conn *conn_list;
	uint32_t next_gen;
	struct rdma_msg *msgs;
	uint32_t nmsgs;
	struct rdma_msg *free_msgs;
	struct rdma_rx *rxs;
	uint32_t nrxs;
	struct rdma_rx *free_rxs;
	uint32_t ndead;
	uint32_t npreauth;      /* callees not READY yet */
	bool ec_event;          /* the rdma_cm channel spoke */
	uint64_t next_check;    /* when handshake deadlines are looked at next */
	/* Fault injection (ferry__rdma_fault_qp_error; tests): ready QPs to error next round. */
	_Atomic int fault_qp_error;
	/* (ferry__rdma_fault_uevents_lost; tests): the kernel's device events read as lost. */
	_Atomic int fault_uev_lost;
	/* Health (any thread reads). */
	_Atomic uint32_t h_ready, h_other, h_refused, h_malformed;
	_Atomic uint64_t h_reads, h_read_bytes, h_eager, h_inplace, h_into_get;
	_Atomic uint64_t h_inline; /* messages sent inline (IBV_SEND_INLINE) */
	_Atomic uint64_t h_heartbeats; /* CREDITs posted because a connection was idle */
	/*
	 * GPUDirect RDMA: device regions registered with every device (their
	 * PUTs read in place by the peer's NIC, their GETs written by ours),
	 * and why the last one that could not be is staged instead (under
	 * why_lock, held only to copy it; "" while none failed).
	 */
	pthread_mutex_t why_lock;
	_Atomic uint32_t h_gpudirect_regions;
	/*
	 * GPUDirect refused for good (a device without dma-buf MRs, a driver
	 * without export, a libibverbs without the call): later device regions
	 * are staged without asking again (no dma-buf made per registration).
	 */
	_Atomic int gpudirect_off;
	_Atomic uint32_t gd_entries; /* GPUDirect registrations of whole allocations (rdma_mem) */
	_Atomic uint64_t h_gpudirect_puts;
	char gpudirect_why[200];
};

/* ------------------------------------------------------------------ */
/* What each piece offers the others                                  */
/* ------------------------------------------------------------------ */

/* rdma.c */
/* What the transport's io_uring cookies say (bits 0-7; K_CH: the slot in 8-15, its gen above). */
enum { K_NONE = 0, K_EC = 1, K_CH = 2, K_TICK = 3, K_UEV = 4 };
#define RDMA_GD_ENTRIES 16
#define RDMA_GD_IDLE_NS (1000ull * 1000 * 1000)
/* GPUDirect registrations no region has used for RDMA_GD_IDLE_NS go (reactor). */
void rdma_gd_sweep(struct rdma_state *st, uint64_t now);
/*
 * Fault injection for tests, any thread: in e's next round every ready
 * queue pair of its rdma transport is moved to the error state (what a NIC
 * fault or a failed work request does), and the transport finds out as it
 * would then, from the flushed completions. -ENODEV: e has no rdma transport.
 */
int ferry__rdma_fault_qp_error(struct ferry_engine *e);
/*
 * Fault injection for tests, any thread: from now on every kernel device
 * event e's rdma transport reads is dropped as if its socket had overrun
 * (ENOBUFS), so it must find removed devices by looking (uev_lost).
 * -ENODEV: e has no rdma transport.
 */
int ferry__rdma_fault_uevents_lost(struct ferry_engine *e);
int rdma_dev_for(struct rdma_state *st, struct ibv_context *ctx, struct rdma_dev **out);
/* The live device of ctx, or NULL. */
struct rdma_dev *rdma_dev_of(struct rdma_state *st, struct ibv_context *ctx);
/* d's CQ, channel and PD destroyed; the slot left not live (its gen kept). */
void rdma_dev_close(struct rdma_state *st, struct rdma_dev *d);
/* Watch fd from the reactor's ring (a multishot poll tagged cookie). */
bool rdma_arm_fd(struct rdma_state *st, int fd, uint64_t cookie);
/*
 * Drain d's channel and poll its CQ: the completions handled. With arm,
 * the CQ is armed first (before a sleep the peers may not ring: its next
 * completion wakes the reactor); a round polls without arming, so that a
 * reactor parked while callers run its rounds is not woken per completion.
 */
int rdma_poll_dev(struct rdma_state *st, struct rdma_dev *d, bool arm);
uint32_t rdma_lkey(struct rdma_state *st, struct rdma_dev *d, const struct ferry_buf *buf,
		   uint32_t *rkey);
int rdma_parse_uri(const char *uri, struct sockaddr_storage *ss);

/* rdma_conn.c */
void rdma_cm_events(struct rdma_state *st);
int rdma_conn_call(struct rdma_state *st, struct ferry_peer *peer, struct rdma_conn **out);
void rdma_conn_fail(struct rdma_state *st, struct rdma_conn *c, int res, const char *why);
void rdma_conn_unref(struct rdma_state *st, struct rdma_conn *c);
void rdma_sweep(struct rdma_state *st);
void rdma_check_time(struct rdma_state *st);
/* The ACK_TIMEOUT exponent for a peer_timeout (see rdma_state.ack_timeout). */
uint8_t rdma_ack_timeout_for(uint64_t peer_timeout_ns);
int rdma_listen_start(struct rdma_state *st);
/* A handshake message arrived (the connection is not READY yet). */
void rdma_hs_message(struct rdma_state *st, struct rdma_conn *c, const struct rdma_hdr *h,
		     const uint8_t *body, uint32_t body_len);
int rdma_send_ctl(struct rdma_state *st, struct rdma_conn *c, uint8_t type, const void *key,
		  uint16_t key_len, const void *body, uint32_t body_len);

/* rdma_hotplug.c */
/*
 * d was removed (how: what said so): every connection on it ends
 * (-ECONNRESET) and goes at once, with its QP and id; the listener, if it
 * was on d, goes and is made again once d's address has a device again;
 * every memory registration on d, its CQ, channel and PD go; librdmacm's
 * hold on it is given back. The kernel's removal, which waits for every
 * user of the device, can then complete.
 */
void rdma_dev_gone(struct rdma_state *st, struct rdma_dev *d, const char *how);
/* The kernel's device events: the socket made and watched (no error: -1 without it). */
void rdma_uevent_open(struct rdma_state *st);
void rdma_uevent_close(struct rdma_state *st);
/* What the socket has: each removed device of this engine gone (rdma_dev_gone). */
void rdma_uevents(struct rdma_state *st);
/* The listener's device was removed: it goes, and is made again (rdma_relisten). */
void rdma_listener_lost(struct rdma_state *st);
/* The listener lost with its device, made again at the same address when it can be. */
void rdma_relisten(struct rdma_state *st);
/* After lost device events: each device whose verbs node is gone goes (rdma_dev_gone). */
void rdma_uev_recheck(struct rdma_state *st, uint64_t now);

/* rdma_data.c */
int rdma_put(struct ferry_engine *e, struct backend *b, struct op *op);
/* op ends (forget): its message on c goes if it was not posted yet. */
void rdma_msg_forget(struct rdma_state *st, struct rdma_conn *c, struct op *op);
void rdma_on_wc(struct rdma_state *st, const struct ibv_wc *wc);
void rdma_post_recvs(struct rdma_state *st, struct rdma_conn *c);
void rdma_conn_pump(struct rdma_state *st, struct rdma_conn *c);
/*
 * An incoming PUT of a block being filled whose filling failed (res -EIO:
 * its sender said so) or stopped (-ETIMEDOUT: nothing more said for
 * peer_timeout_ns): nothing more is READ, and it is answered res, nothing
 * delivered, once its READs are back.
 */
void rdma_rx_unfilled(struct rdma_rx *r, int res);
void rdma_conn_drop_data(struct rdma_state *st, struct rdma_conn *c, int res);
/* Post one message buffer: 0, or -EAGAIN (no slot, no credit), -EIO. */
int rdma_post_msg(struct rdma_state *st, struct rdma_conn *c, struct rdma_hdr *h,
		  const void *key, uint16_t key_len, const void *body, uint32_t body_len,
		  const struct iovec *iov, uint32_t iovcnt, bool reserve);

static inline struct rdma_conn *rdma_conn_of(struct rdma_state *st, uint64_t wr_id)
{
	uint32_t slot = (uint32_t)(wr_id >> 20) & 0xfffu, gen = (uint32_t)(wr_id >> 32);
	struct rdma_conn *c = slot < RDMA_MAX_CONNS ? st->conns[slot] : NULL;

	return c && c->gen == gen ? c : NULL;
}

#endif

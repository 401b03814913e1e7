/*
 * bench/rdma_raw.c - the floor under bench_rdma's figures: bare verbs
 * between the same two addresses, no ferry in it, timed with
 * CLOCK_MONOTONIC. perftest (ib_read_bw, ib_send_lat) times itself with the
 * CPU's cycle counter against /proc/cpuinfo's MHz, which an emulated guest
 * does not keep, so under TCG its figures are not usable; this program
 * measures the same two things with the clock bench_rdma uses:
 *
 *   read_bw    SIZE bytes at a time pulled by RDMA READ from a registered
 *              buffer of the server (its address and rkey in the accept's
 *              private data), in READs of at most 256 KiB with 8 in flight:
 *              the pattern of ferry's transport (RDMA_READ_PIECE,
 *              RDMA_READS_MAX), without ferry; GB/s from the first post to
 *              the last completion. (Whole 4 MiB READs, 4 in flight, moved
 *              0.0018 GB/s on the emulated guest against 0.04 in pieces.)
 *   send_lat   64 B SEND ping-pong (inline where the device allows), the
 *              receives posted in advance; one-way = RTT / 2, p50 and p99
 *
 * One process, one thread: the server's id is bound on --ip0 (default
 * $RDMA_IP0), the client's on --ip1 ($RDMA_IP1), so every packet crosses
 * from the client's device to the server's; this thread polls both ends'
 * completion queues busily (no wake-up is ever waited for). Prints one JSON
 * object on stdout; bench/rdma_guest.sh runs it beside bench_rdma and
 * perftest and takes ferry's ratios against it.
 *
 *   rdma_raw [--quick] [--ip0 A] [--ip1 B]   (--quick: 64 KiB and 4 MiB;
 *                                             else also 190 MB)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(FERRY_HAVE_IBVERBS) && defined(FERRY_HAVE_RDMACM)
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define LAT_SIZE 64u
#define LAT_ITERS 2000u
#define WINDOW 8u             /* READs in flight */
#define PIECE (256u * 1024u)   /* bytes of one READ at most */

struct end {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf;
	bool established;
};

/* What the server tells the client in its accept. */
struct offer {
	uint64_t addr;
	uint32_t rkey;
	uint32_t rsvd;
};

static size_t buf_len;
static struct offer peer_offer;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "rdma_raw: %s: %s\n", what, errno ? strerror(errno) : "failed");
	exit(1);
}

/* The next rdma_cm event: its type and id (acked); an offer in its private data is kept. */
static enum rdma_cm_event_type next_event(struct rdma_event_channel *ec, struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type type;

	if (rdma_get_cm_event(ec, &ev))
		die("rdma_get_cm_event");
	type = ev->event;
	*id = ev->id;
	if (type == RDMA_CM_EVENT_ESTABLISHED && ev->param.conn.private_data &&
	    ev->param.conn.private_data_len >= sizeof(peer_offer))
		memcpy(&peer_offer, ev->param.conn.private_data, sizeof(peer_offer));
	if (ev->status)
		fprintf(stderr, "rdma_raw: %s (status %d)\n", rdma_event_str(type), ev->status);
	rdma_ack_cm_event(ev);
	return type;
}

/* PD, CQ, QP and buffer of an end whose id has a device. */
static void end_setup(struct end *x, int access)
{
	struct ibv_qp_init_attr qa;

	if (!(x->pd = ibv_alloc_pd(x->id->verbs)) ||
	    !(x->cq = ibv_create_cq(x->id->verbs, 256, NULL, NULL, 0)))
		die("ibv_alloc_pd / ibv_create_cq");
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = qa.recv_cq = x->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 64;
	qa.cap.max_recv_wr = 64;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = LAT_SIZE;
	if (rdma_create_qp(x->id, x->pd, &qa)) {
		qa.cap.max_inline_data = 0; /* a device without inline sends */
		if (rdma_create_qp(x->id, x->pd, &qa))
			die("rdma_create_qp");
	}
	x->buf = aligned_alloc(4096, buf_len);
	if (!x->buf)
		die("aligned_alloc");
	memset(x->buf, 0x5a, buf_len);
	if (!(x->mr = ibv_reg_mr(x->pd, x->buf, buf_len, IBV_ACCESS_LOCAL_WRITE | access)))
		die("ibv_reg_mr");
}

static void conn_param(struct rdma_conn_param *p, const void *pdata, uint8_t plen)
{
	memset(p, 0, sizeof(*p));
	p->initiator_depth = p->responder_resources = WINDOW;
	p->retry_count = 6;
	p->rnr_retry_count = 7;
	p->private_data = pdata;
	p->private_data_len = plen;
}

static void addr_of(const char *ip, struct sockaddr_in *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	if (inet_pton(AF_INET, ip, &sa->sin_addr) != 1) {
		errno = EINVAL;
		die(ip);
	}
}

/* The server listening on ip0, the client connected from ip1: both established. */
static void connect_ends(const char *ip0, const char *ip1, struct end *srv, struct end *cli)
{
	struct rdma_event_channel *ec = rdma_create_event_channel();
	struct rdma_cm_id *lid, *id;
	struct sockaddr_in a0, a1;
	struct rdma_conn_param p;
	struct offer mine;

	if (!ec)
		die("rdma_create_event_channel");
	addr_of(ip0, &a0);
	addr_of(ip1, &a1);
	if (rdma_create_id(ec, &lid, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(lid, (struct sockaddr *)&a0) || rdma_listen(lid, 1))
		die("listen");
	a0.sin_port = rdma_get_src_port(lid);
	if (rdma_create_id(ec, &cli->id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(cli->id, (struct sockaddr *)&a1, (struct sockaddr *)&a0, 5000))
		die("rdma_resolve_addr");
	while (!srv->established || !cli->established) {
		switch (next_event(ec, &id)) {
		case RDMA_CM_EVENT_ADDR_RESOLVED:
			if (rdma_resolve_route(id, 5000))
				die("rdma_resolve_route");
			break;
		case RDMA_CM_EVENT_ROUTE_RESOLVED:
			end_setup(cli, 0);
			conn_param(&p, NULL, 0);
			if (rdma_connect(id, &p))
				die("rdma_connect");
			break;
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			srv->id = id;
			end_setup(srv, IBV_ACCESS_REMOTE_READ);
			mine.addr = (uintptr_t)srv->buf;
			mine.rkey = srv->mr->rkey;
			mine.rsvd = 0;
			conn_param(&p, &mine, sizeof(mine));
			if (rdma_accept(id, &p))
				die("rdma_accept");
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			if (id == cli->id)
				cli->established = true;
			else
				srv->established = true;
			break;
		default:
			errno = EPROTO;
			die("an rdma_cm event that ends the connection");
		}
	}
}

static void poll1(struct end *x, struct ibv_wc *wc)
{
	int n;

	while ((n = ibv_poll_cq(x->cq, 1, wc)) == 0)
		;
	if (n < 0 || wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "rdma_raw: work completion: %s\n",
			n < 0 ? "poll failed" : ibv_wc_status_str(wc->status));
		exit(1);
	}
}

static void post_read(struct end *cli, size_t off, size_t size)
{
	struct ibv_sge sge = { (uintptr_t)cli->buf + off, (uint32_t)size, cli->mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = peer_offer.addr + off;
	wr.wr.rdma.rkey = peer_offer.rkey;
	if (ibv_post_send(cli->id->qp, &wr, &bad))
		die("ibv_post_send (READ)");
}

/* GB/s of n transfers of size bytes, each in READs of PIECE, WINDOW in flight. */
static double read_bw(struct end *cli, size_t size, unsigned n)
{
	size_t per = (size + PIECE - 1) / PIECE, total = per * n, posted = 0, done = 0;
	struct ibv_wc wc;
	uint64_t t0 = now_ns();

	while (done < total) {
		while (posted < total && posted - done < WINDOW) {
			size_t off = (posted % per) * PIECE;

			post_read(cli, off, size - off < PIECE ? size - off : PIECE);
			posted++;
		}
		poll1(cli, &wc);
		done++;
	}
	return (double)size * n / (double)(now_ns() - t0);
}

static void post_recv(struct end *x)
{
	struct ibv_sge sge = { (uintptr_t)x->buf + LAT_SIZE, LAT_SIZE, x->mr->lkey };
	struct ibv_recv_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(x->id->qp, &wr, &bad))
		die("ibv_post_recv");
}

static void post_send(struct end *x)
{
	struct ibv_sge sge = { (uintptr_t)x->buf, LAT_SIZE, x->mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	if (ibv_post_send(x->id->qp, &wr, &bad)) {
		wr.send_flags = IBV_SEND_SIGNALED; /* no inline on this QP */
		if (ibv_post_send(x->id->qp, &wr, &bad))
			die("ibv_post_send (SEND)");
	}
}

/* One SEND from `from` received at `to` (whose next receive is posted again). */
static void hop(struct end *from, struct end *to)
{
	struct ibv_wc wc;
	bool sent = false, got = false;

	post_send(from);
	while (!sent || !got) {
		if (!sent && ibv_poll_cq(from->cq, 1, &wc) == 1) {
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND)
				die("SEND completion");
			sent = true;
		}
		if (!got && ibv_poll_cq(to->cq, 1, &wc) == 1) {
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
				die("RECV completion");
			got = true;
		}
	}
	post_recv(to);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *ip0 = getenv("RDMA_IP0"), *ip1 = getenv("RDMA_IP1");
	static const size_t sizes[] = { 64 * 1024, 4 * 1024 * 1024, 199229440 };
	static const unsigned counts[] = { 2000, 200, 4 };
	bool quick = false;
	struct end srv = { 0 }, cli = { 0 };
	uint64_t *rtt;
	unsigned nsizes;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--ip0") && i + 1 < argc)
			ip0 = argv[++i];
		else if (!strcmp(argv[i], "--ip1") && i + 1 < argc)
			ip1 = argv[++i];
		else {
			fprintf(stderr, "usage: rdma_raw [--quick] [--ip0 A] [--ip1 B]\n");
			return 2;
		}
	}
	if (!ip0 || !ip1) {
		fprintf(stderr, "rdma_raw: no addresses (--ip0/--ip1, or RDMA_IP0/RDMA_IP1 of "
				"ferry's RDMA test guest)\n");
		return 2;
	}
	nsizes = quick ? 2 : 3;
	buf_len = sizes[nsizes - 1];
	connect_ends(ip0, ip1, &srv, &cli);
	printf("{\"tool\":\"rdma_raw (bare verbs, CLOCK_MONOTONIC)\",\"window\":%u", WINDOW);
	for (unsigned i = 0; i < nsizes; i++) {
		unsigned n = quick ? (counts[i] + 3) / 4 : counts[i];
		double gbps;

		read_bw(&cli, sizes[i], n > 8 ? 8 : 1); /* warm */
		gbps = read_bw(&cli, sizes[i], n);
		printf(",\"read_bw_%zu_GBps\":%.4f", sizes[i], gbps);
		fprintf(stderr, "rdma_raw: READ %zu B: %.4f GB/s\n", sizes[i], gbps);
	}
	rtt = calloc(LAT_ITERS, sizeof(*rtt));
	if (!rtt)
		die("calloc");
	post_recv(&srv);
	post_recv(&cli);
	for (unsigned i = 0; i < LAT_ITERS + 100; i++) {
		uint64_t t0 = now_ns();

		hop(&cli, &srv);
		hop(&srv, &cli);
		if (i >= 100)
			rtt[i - 100] = now_ns() - t0;
	}
	qsort(rtt, LAT_ITERS, sizeof(*rtt), cmp_u64);
	printf(",\"send_lat_64B_us\":{\"p50\":%.2f,\"p99\":%.2f}}\n", rtt[LAT_ITERS / 2] / 2e3,
	       rtt[LAT_ITERS * 99 / 100] / 2e3);
	fprintf(stderr, "rdma_raw: SEND 64 B one way p50 %.2f us\n", rtt[LAT_ITERS / 2] / 2e3);
	free(rtt);
	rdma_disconnect(cli.id);
	return 0;
}

#else

int main(void)
{
	fprintf(stderr, "rdma_raw: this build has no libibverbs/librdmacm\n");
	return 77;
}

#endif

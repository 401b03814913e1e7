/*
 * examples/producer_consumer.c - the smallest useful ferry program.
 *
 * Two engines in one process: "producer" puts ITEMS buffers, "consumer"
 * gets them. Both run in THREAD mode (a reactor thread each), and both
 * sides learn about completions through callbacks, which run inside
 * ferry_cq_wait on the thread that waits. Build against the installed
 * library with:  gcc producer_consumer.c $(pkg-config --cflags --libs ferry)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <ferry.h>

#define ITEMS 16
#define ITEM_SIZE (64 * 1024)
#define DEADLINE_NS (5ull * 1000 * 1000 * 1000) /* give up after 5 s */

struct tally {
	int done, failed;
};

/* Runs on the producer thread, inside its ferry_cq_wait. */
static void on_put(const struct ferry_cqe *cqe, void *arg)
{
	struct tally *t = arg;

	t->done++;
	if (cqe->res < 0) {
		t->failed++;
		fprintf(stderr, "put %llu: %s\n", (unsigned long long)cqe->user_data,
			ferry_strerror(cqe->res));
	}
	/* The pool buffer was handed over at submit: nothing to free here. */
}

/* Runs on the main thread, inside its ferry_cq_wait. */
static void on_get(const struct ferry_cqe *cqe, void *arg)
{
	struct tally *t = arg;
	const unsigned char *data = ferry_buf_data(cqe->buf);

	t->done++;
	if (cqe->res < 0) {
		t->failed++;
		fprintf(stderr, "get %llu: %s\n", (unsigned long long)cqe->user_data,
			ferry_strerror(cqe->res));
		return;
	}
	if (cqe->len != ITEM_SIZE || data[0] != (unsigned char)cqe->user_data ||
	    data[ITEM_SIZE - 1] != (unsigned char)cqe->user_data)
		t->failed++;
	ferry_buf_release(cqe->buf); /* zero-copy GET: the buffer is ours now */
}

static void *producer(void *arg)
{
	struct ferry_engine *e = arg;
	struct ferry_peer *to;
	struct ferry_sq *sq;
	struct ferry_cqe cqes[8];
	struct tally t = { 0, 0 };

	ferry_peer_open(e, "consumer", &to); /* where the data goes */
	ferry_sq_get(e, &sq);                /* this thread's submission queue */
	for (int i = 0; i < ITEMS; i++) {
		struct ferry_buf *buf;
		struct ferry_sqe *sqe;
		char key[32];

		/* A pool buffer: PUTting it moves it without a copy. */
		if (ferry_buf_alloc(e, ITEM_SIZE, &buf) < 0)
			break;
		memset(ferry_buf_data(buf), i, ITEM_SIZE);
		while (!(sqe = ferry_sq_get_sqe(sq))) /* ring full: let work drain */
			ferry_cq_wait(ferry_cq_default(e), cqes, 8, 1000000);
		snprintf(key, sizeof(key), "item-%d", i);
		ferry_prep_put_buf(sqe, to, key, buf, (uint64_t)i);
		ferry_sqe_set_callback(sqe, on_put, &t);
		ferry_sqe_set_timeout(sqe, DEADLINE_NS);
		ferry_sq_submit(sq);
	}
	while (t.done < ITEMS) /* callbacks run in here */
		if (ferry_cq_wait(ferry_cq_default(e), cqes, 8, DEADLINE_NS) == -ETIMEDOUT)
			break;
	printf("producer: %d puts completed, %d failed\n", t.done, t.failed);
	ferry_sq_put(sq); /* give the queue back before the thread ends */
	return NULL;
}

static struct ferry_engine *make_engine(const char *name)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	p.name = name;
	p.progress = FERRY_PROGRESS_THREAD;
	p.pool_size = 16 << 20;
	rc = ferry_engine_create(&p, &e);
	if (rc < 0)
		fprintf(stderr, "engine %s: %s\n", name, ferry_strerror(rc));
	return e;
}

int main(void)
{
	struct ferry_engine *prod = make_engine("producer");
	struct ferry_engine *cons = make_engine("consumer");
	struct ferry_peer *from;
	struct ferry_sq *sq;
	struct ferry_cqe cqes[8];
	struct tally t = { 0, 0 };
	pthread_t thr;

	if (!prod || !cons)
		return 1;
	/* GETs may be posted before the data exists: they wait for it. */
	ferry_peer_open(cons, "producer", &from);
	ferry_sq_get(cons, &sq);
	for (int i = 0; i < ITEMS; i++) {
		struct ferry_sqe *sqe = ferry_sq_get_sqe(sq); /* 256 entries: room for all */
		char key[32];

		snprintf(key, sizeof(key), "item-%d", i);
		ferry_prep_get(sqe, from, key, NULL, 0, (uint64_t)i); /* NULL iov: zero copy */
		ferry_sqe_set_callback(sqe, on_get, &t);
		ferry_sqe_set_timeout(sqe, DEADLINE_NS);
	}
	ferry_sq_submit(sq); /* one submit for the whole batch */

	pthread_create(&thr, NULL, producer, prod);
	while (t.done < ITEMS)
		if (ferry_cq_wait(ferry_cq_default(cons), cqes, 8, DEADLINE_NS) == -ETIMEDOUT)
			break;
	pthread_join(thr, NULL);
	printf("consumer: %d gets completed, %d failed\n", t.done, t.failed);

	ferry_engine_destroy(cons);
	ferry_engine_destroy(prod);
	return t.done == ITEMS && t.failed == 0 ? 0 : 1;
}

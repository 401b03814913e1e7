/*
 * engine/stream_table.c - the stream table made and unmade.
 *
 * Owns: the stream table's creation at ferry_engine_create (the records,
 * from an array sized at creation, their hash buckets, the release sink),
 * what is freed at destroy (chunks a STREAM_WHOLE kept, the table; the sink
 * is closed, and outlives the engine while wrapped chunk buffers are out),
 * and the count of streams open (health).
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "stream_int.h"

int stream_init(struct ferry_engine *e)
{
	struct stream_table *t = calloc(1, sizeof(*t));
	uint64_t nb = 16;

	if (!t)
		return -ENOMEM;
	t->capacity = e->max_keys;
	while (nb < (uint64_t)t->capacity * 2)
		nb <<= 1;
	t->buckets = calloc(nb, sizeof(*t->buckets));
	t->recs = calloc(t->capacity, sizeof(*t->recs));
	t->sink = calloc(1, sizeof(*t->sink));
	if (!t->buckets || !t->recs || !t->sink) {
		free(t->buckets);
		free(t->recs);
		free(t->sink);
		free(t);
		return -ENOMEM;
	}
	t->mask = nb - 1;
	for (uint32_t i = t->capacity; i-- > 0;) {
		t->recs[i].index = i;
		t->recs[i].chain = t->free;
		t->free = &t->recs[i];
	}
	atomic_store(&t->sink->refs, 1);
	t->sink->e = e;
	e->streams = t;
	return 0;
}

void stream_shutdown(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;

	if (!t)
		return;
	for (uint32_t i = 0; i < t->capacity; i++)
		whole_free(&t->recs[i]);
}

void stream_fini(struct ferry_engine *e)
{
	struct stream_table *t = e->streams;
	struct stream_sink *s;
	struct ferry_buf *w;

	if (!t)
		return;
	s = t->sink;
	atomic_store(&s->closed, 1);
	while (atomic_load(&s->users))
		cpu_relax();
	w = atomic_exchange(&s->releases, NULL);
	while (w) {
		struct ferry_buf *next = atomic_load(&w->release_next);

		finish_release(s, w);
		w = next;
	}
	sink_unref(s);
	free(t->buckets);
	free(t->recs);
	free(t);
	e->streams = NULL;
}

uint32_t stream_count(struct ferry_engine *e)
{
	return e->streams ? STAT_GET(e->streams->used) : 0;
}

/*
 * engine/timer.c - deadlines of ops in flight.
 *
 * Owns: a binary min-heap of ops keyed by absolute deadline. Insert and
 * removal are O(log n), the earliest deadline is O(1); the heap array is
 * sized for every op at creation, so adding a deadline never allocates.
 * Each op remembers its position (heap_idx) so completing an op before its
 * deadline removes it without a search.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int timer_init(struct timer_heap *h, uint32_t cap)
{
	h->ops = calloc(cap ? cap : 1, sizeof(*h->ops));
	if (!h->ops)
		return -ENOMEM;
	h->n = 0;
	h->cap = cap;
	return 0;
}

void timer_fini(struct timer_heap *h)
{
	free(h->ops);
	h->ops = NULL;
	h->n = h->cap = 0;
}

static void place(struct timer_heap *h, uint32_t i, struct op *op)
{
	h->ops[i] = op;
	op->heap_idx = i;
}

static void sift_up(struct timer_heap *h, uint32_t i)
{
	struct op *op = h->ops[i];

	while (i > 0) {
		uint32_t parent = (i - 1) / 2;

		if (h->ops[parent]->deadline <= op->deadline)
			break;
		place(h, i, h->ops[parent]);
		i = parent;
	}
	place(h, i, op);
}

static void sift_down(struct timer_heap *h, uint32_t i)
{
	struct op *op = h->ops[i];

	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;
		uint64_t best = op->deadline;

		if (l < h->n && h->ops[l]->deadline < best) {
			m = l;
			best = h->ops[l]->deadline;
		}
		if (r < h->n && h->ops[r]->deadline < best)
			m = r;
		if (m == i)
			break;
		place(h, i, h->ops[m]);
		i = m;
	}
	place(h, i, op);
}

void timer_add(struct timer_heap *h, struct op *op)
{
	/* The heap holds one slot per op, so it cannot be full. */
	place(h, h->n, op);
	h->n++;
	sift_up(h, h->n - 1);
}

void timer_del(struct timer_heap *h, struct op *op)
{
	uint32_t i = op->heap_idx;

	if (i == NO_SLOT || i >= h->n || h->ops[i] != op)
		return;
	op->heap_idx = NO_SLOT;
	h->n--;
	if (i == h->n)
		return;
	place(h, i, h->ops[h->n]);
	if (i > 0 && h->ops[(i - 1) / 2]->deadline > h->ops[i]->deadline)
		sift_up(h, i);
	else
		sift_down(h, i);
}

struct op *timer_pop_expired(struct timer_heap *h, uint64_t now)
{
	struct op *op;

	if (h->n == 0 || h->ops[0]->deadline > now)
		return NULL;
	op = h->ops[0];
	timer_del(h, op);
	return op;
}

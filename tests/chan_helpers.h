/*
 * tests/chan_helpers.h - what the broadcast channel tests (test_channel.c,
 * test_channel_netns.c) share beside helpers.h: the mixer their message
 * contents are derived from, and passing a writer's handle to readers in
 * other processes through a file (written whole, read back bounded in
 * time, a handle counted only once it is all there).
 */
#ifndef FERRY_TEST_CHAN_HELPERS_H
#define FERRY_TEST_CHAN_HELPERS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ferry.h"
#include "ferry/channel.h"
#include "helpers.h"

/* splitmix64's finaliser: a well-mixed word from x. */
static inline uint64_t t_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/*
 * w's handle into h (len bytes) and into the file at path: 0, or -1 when
 * the handle does not fit or the file cannot be written.
 */
static inline int t_chan_handle_to_file(struct ferry_chan_writer *w, const char *path, char *h,
					size_t len)
{
	int n = ferry_chan_handle(w, h, len);
	FILE *f;

	if (n <= 0 || (size_t)n >= len)
		return -1;
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(h, f);
	return fclose(f) ? -1 : 0;
}

/* The handle in the file at path, into h: 0, or -1 when none was there within ms. */
static inline int t_chan_handle_from_file(const char *path, char *h, size_t len, int ms)
{
	int64_t end = t_now() + ms * MS;

	while (t_now() < end) {
		FILE *f = fopen(path, "r");

		if (f) {
			size_t n = fread(h, 1, len - 1, f);

			fclose(f);
			h[n] = 0;
			if (n > 0 && !strchr(h, '\n'))
				return 0;
		}
		usleep(5000);
	}
	return -1;
}

#endif

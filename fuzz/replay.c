/*
 * fuzz/replay.c - runs a fuzz harness over files, without libFuzzer.
 *
 * Owns: the main() that the builds without FERRY_FUZZ link with each
 * fuzz/fuzz_<name>.c (CMakeLists.txt makes it the test
 * fuzz_replay_<name>): every argument is a file, or a directory whose
 * regular files are taken in name order; each file is handed once to
 * LLVMFuzzerTestOneInput (after LLVMFuzzerInitialize, when the harness has
 * one), as libFuzzer would run it. A crash or a sanitizer report ends the
 * program with a failure; an argument that cannot be read is a failure
 * too, and so is a directory without inputs (a corpus lost by mistake).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

#define REPLAY_MAX_BYTES (16u << 20)

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	size_t n;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	buf = malloc(REPLAY_MAX_BYTES);
	if (!buf) {
		fclose(f);
		return -1;
	}
	n = fread(buf, 1, REPLAY_MAX_BYTES, f);
	fclose(f);
	/* A private copy of exactly n bytes, so ASan sees a read past the input. */
	{
		uint8_t *in = malloc(n ? n : 1);

		if (!in) {
			free(buf);
			return -1;
		}
		memcpy(in, buf, n);
		free(buf);
		fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
		LLVMFuzzerTestOneInput(in, n);
		free(in);
	}
	return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_dir(const char *dir, unsigned *count)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, by_name), rc = 0;

	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat sb;

		int pn = snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);

		if (ents[i]->d_name[0] != '.' && pn < (int)sizeof(path) && stat(path, &sb) == 0 &&
		    S_ISREG(sb.st_mode)) {
			if (run_file(path))
				rc = -1;
			else
				(*count)++;
		}
		free(ents[i]);
	}
	free(ents);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned count = 0;
	int rc = 0;

	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		struct stat sb;
		unsigned before = count;

		if (stat(argv[i], &sb)) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			rc = 1;
		} else if (S_ISDIR(sb.st_mode)) {
			if (run_dir(argv[i], &count))
				rc = 1;
			if (count == before) {
				fprintf(stderr, "replay: %s holds no input\n", argv[i]);
				rc = 1;
			}
		} else if (run_file(argv[i])) {
			rc = 1;
		} else {
			count++;
		}
	}
	printf("replay: %u inputs run%s\n", count, rc ? ", with errors" : "");
	return rc;
}

/*
 * tests/install_consumer/main.c - the smallest program built against an
 * installed ferry, through find_package(ferry) and through pkg-config.
 */
#include <ferry.h>
#include <ferry/stage.h>
#include <errno.h>
#include <stdio.h>

int main(void)
{
	struct ferry_engine_params p = FERRY_ENGINE_PARAMS_INIT;
	struct ferry_engine *e = NULL;
	int rc;

	printf("ferry_strerror(-11): %s\n", ferry_strerror(-11));

	p.name = "x";
	rc = ferry_engine_create(&p, &e);
	if (rc < 0) {
		fprintf(stderr, "ferry_engine_create: %s\n", ferry_strerror(rc));
		return 1;
	}
	rc = ferry_engine_destroy(e);
	if (rc < 0) {
		fprintf(stderr, "ferry_engine_destroy: %s\n", ferry_strerror(rc));
		return 1;
	}
	printf("engine created and destroyed\n");
	/* The stage API's header installed beside it: a stage needs its file. */
	if (ferry_stage_open(NULL, NULL) != -EINVAL) {
		fprintf(stderr, "ferry_stage_open(NULL, NULL) is not -EINVAL\n");
		return 1;
	}
	printf("ferry %d, features 0x%x\n", ferry_version(), (unsigned)ferry_features());
	return 0;
}

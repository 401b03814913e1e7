/*
 * engine/prep.c - the SQE helpers of api/ferry.h (ferry_prep_*,
 * ferry_sqe_set_*), exported out of line for foreign-function interfaces.
 *
 * Owns: nothing of its own: it compiles the header's inline bodies once
 * more as exported functions (FERRY_INLINE_EXPORT), so a binding calls
 * exactly what C code inlines. C programs keep the inline ones.
 */
#define FERRY_INLINE_EXPORT 1
#include "ferry.h"

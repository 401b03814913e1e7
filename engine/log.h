/*
 * engine/log.h - the library's one log facility (private).
 *
 * Owns: formatting a line and handing it to the sink the application chose
 * with ferry_log_set() (stderr by default, threshold from FERRY_LOG=
 * error|warn|info|debug, default warn). Every error path that returns a
 * negative errno for a reason the caller may not see logs one line here.
 */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

enum {
	FERRY__LOG_ERROR = 0,
	FERRY__LOG_WARN = 1,
	FERRY__LOG_INFO = 2,
	FERRY__LOG_DEBUG = 3,
};

void ferry__log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_error(...) ferry__log(FERRY__LOG_ERROR, __VA_ARGS__)
#define log_warn(...) ferry__log(FERRY__LOG_WARN, __VA_ARGS__)
#define log_info(...) ferry__log(FERRY__LOG_INFO, __VA_ARGS__)
#define log_debug(...) ferry__log(FERRY__LOG_DEBUG, __VA_ARGS__)

#endif

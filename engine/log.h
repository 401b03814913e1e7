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

/*
 * Per call site, at most one line a second: for conditions a busy engine
 * can hit once per op (a full table, an exhausted pool). The next line that
 * passes says how many were held back.
 */
struct ferry__log_limit {
	_Atomic unsigned long long last_ns;
	_Atomic unsigned long long held;
};
int ferry__log_allow(struct ferry__log_limit *l, unsigned long long *held);

#define log_limited(level, fmt, ...)                                               \
	do {                                                                       \
		static struct ferry__log_limit lim_;                               \
		unsigned long long held_;                                          \
		if (ferry__log_allow(&lim_, &held_))                               \
			ferry__log(level, fmt " (%llu similar lines held back)",   \
				   ##__VA_ARGS__, held_);                          \
	} while (0)

#define log_error(...) ferry__log(FERRY__LOG_ERROR, __VA_ARGS__)
#define log_warn(...) ferry__log(FERRY__LOG_WARN, __VA_ARGS__)
#define log_info(...) ferry__log(FERRY__LOG_INFO, __VA_ARGS__)
#define log_debug(...) ferry__log(FERRY__LOG_DEBUG, __VA_ARGS__)

#endif

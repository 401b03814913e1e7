/*
 * stage/stage_log.h - the stage layer's log lines, through the public
 * ferry_log (the stage layer is built on api/ headers only).
 */
#ifndef FERRY_STAGE_LOG_H
#define FERRY_STAGE_LOG_H

#include "ferry.h"

#define log_error(...) ferry_log(FERRY_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) ferry_log(FERRY_LOG_WARN, __VA_ARGS__)
#define log_info(...) ferry_log(FERRY_LOG_INFO, __VA_ARGS__)
#define log_debug(...) ferry_log(FERRY_LOG_DEBUG, __VA_ARGS__)

#endif

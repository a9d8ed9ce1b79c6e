// Leveled logging to stderr (data goes to stdout, logs never do). Thread-safe.
#pragma once

#include <cstdarg>

namespace specrpc {

enum class LogLevel { DEBUG = 0, INFO = 1, WARN = 2, ERROR = 3, NONE = 4 };

void     log_set_level(LogLevel level);  // default INFO; env SPECRPC_LOG=debug|info|warn|error|none
LogLevel log_get_level();
void     log_printf(LogLevel level, const char * fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace specrpc

#define SPR_LOG_DEBUG(...) ::specrpc::log_printf(::specrpc::LogLevel::DEBUG, __VA_ARGS__)
#define SPR_LOG_INFO(...)  ::specrpc::log_printf(::specrpc::LogLevel::INFO, __VA_ARGS__)
#define SPR_LOG_WARN(...)  ::specrpc::log_printf(::specrpc::LogLevel::WARN, __VA_ARGS__)
#define SPR_LOG_ERROR(...) ::specrpc::log_printf(::specrpc::LogLevel::ERROR, __VA_ARGS__)

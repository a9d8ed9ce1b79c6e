#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace specrpc {

static LogLevel level_from_env() {
    const char * e = std::getenv("SPECRPC_LOG");
    if (!e) return LogLevel::INFO;
    if (!std::strcmp(e, "debug")) return LogLevel::DEBUG;
    if (!std::strcmp(e, "warn")) return LogLevel::WARN;
    if (!std::strcmp(e, "error")) return LogLevel::ERROR;
    if (!std::strcmp(e, "none")) return LogLevel::NONE;
    return LogLevel::INFO;
}

static std::atomic<int> g_level{static_cast<int>(level_from_env())};
static std::mutex       g_mutex;

void     log_set_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_get_level() { return static_cast<LogLevel>(g_level.load()); }

void log_printf(LogLevel level, const char * fmt, ...) {
    if (static_cast<int>(level) < g_level.load()) return;
    static const char * names[] = {"D", "I", "W", "E"};
    char    buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lock(g_mutex);
    std::fprintf(stderr, "[specrpc %s] %s\n", names[static_cast<int>(level)], buf);
}

}  // namespace specrpc

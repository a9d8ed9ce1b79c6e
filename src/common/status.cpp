#include "common/status.h"

namespace specrpc {

const char * error_code_name(ErrorCode code) {
    switch (code) {
        case ErrorCode::OK:               return "ok";
        case ErrorCode::INVALID_ARGUMENT: return "invalid_argument";
        case ErrorCode::NOT_FOUND:        return "not_found";
        case ErrorCode::LOAD_FAILED:      return "load_failed";
        case ErrorCode::VOCAB_MISMATCH:   return "vocab_mismatch";
        case ErrorCode::CONTEXT_EXCEEDED: return "context_exceeded";
        case ErrorCode::UNAVAILABLE:      return "unavailable";
        case ErrorCode::OVERLOADED:       return "overloaded";
        case ErrorCode::CANCELLED:        return "cancelled";
        case ErrorCode::INTERNAL:         return "internal";
        case ErrorCode::UNSUPPORTED:      return "unsupported";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (is_ok()) return "ok";
    std::string s = error_code_name(code_);
    s += ": ";
    s += message_;
    return s;
}

}  // namespace specrpc

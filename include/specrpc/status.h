// Errors as values (LevelDB-style). A Status is ok or carries a code and a message; Result<T>
// is a value or a Status. Nothing inside specrpc throws across module boundaries: functions that
// can fail return one of these, and the C ABI turns them into error JSON.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace specrpc {

enum class ErrorCode {
    OK = 0,
    INVALID_ARGUMENT,   // bad request field or value (JSON-RPC -32602)
    NOT_FOUND,          // file, slot or request id does not exist
    LOAD_FAILED,        // model or file could not be loaded
    VOCAB_MISMATCH,     // draft and target vocabularies differ
    CONTEXT_EXCEEDED,   // prompt (or prompt + n_predict) does not fit the context
    UNAVAILABLE,        // engine not initialised / still loading
    OVERLOADED,         // queue full
    CANCELLED,          // request was cancelled
    INTERNAL,           // llama.cpp or an invariant failed
    UNSUPPORTED,        // valid but not supported with these options
};

const char * error_code_name(ErrorCode code);

class Status {
  public:
    Status() = default;  // ok
    Status(ErrorCode code, std::string message, std::string param = {})
        : code_(code), message_(std::move(message)), param_(std::move(param)) {}

    static Status ok() { return {}; }
    bool is_ok() const { return code_ == ErrorCode::OK; }
    explicit operator bool() const { return is_ok(); }
    ErrorCode code() const { return code_; }
    const std::string & message() const { return message_; }
    const std::string & param() const { return param_; }  // offending request field, if any
    std::string to_string() const;

  private:
    ErrorCode   code_ = ErrorCode::OK;
    std::string message_;
    std::string param_;
};

inline Status invalid_arg(std::string msg, std::string param = {}) {
    return Status(ErrorCode::INVALID_ARGUMENT, std::move(msg), std::move(param));
}

template <typename T> class Result {
  public:
    Result(T value) : v_(std::move(value)) {}             // NOLINT: implicit by design
    Result(Status status) : v_(std::move(status)) {}      // NOLINT: must not be ok
    bool is_ok() const { return std::holds_alternative<T>(v_); }
    explicit operator bool() const { return is_ok(); }
    T &       value() & { return std::get<T>(v_); }
    const T & value() const & { return std::get<T>(v_); }
    T &&      value() && { return std::get<T>(std::move(v_)); }
    T *       operator->() { return &std::get<T>(v_); }
    const T * operator->() const { return &std::get<T>(v_); }
    T &       operator*() { return value(); }
    const Status & status() const {
        static const Status ok_status;
        return is_ok() ? ok_status : std::get<Status>(v_);
    }

  private:
    std::variant<T, Status> v_;
};

}  // namespace specrpc

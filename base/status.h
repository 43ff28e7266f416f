// Status and Result<T>: errors as values at module boundaries.
//
// A Status is ok or carries a code and a message that names the input that was wrong and
// what was expected ("model/config.json: field 'n_group' = 0, expected >= 1"). Result<T>
// holds either a T or a non-ok Status (std::expected is C++23; this is its small subset).
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace peerserve {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input: flags, request fields, config values
  kNotFound,         // missing file, tensor, route, model
  kAlreadyExists,
  kOutOfRange,         // index or length beyond a limit (e.g. prompt longer than context)
  kDataLoss,           // truncated or corrupt file
  kUnimplemented,      // valid input that this build does not support
  kResourceExhausted,  // queue full, out of KV blocks, body too large
  kUnavailable,        // peer down, server shutting down
  kCancelled,          // client went away
  kIoError,
  kInternal,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>"
  std::string to_string() const;

  // Returns a copy with "context: " prepended to the message (e.g. a file name).
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() {
  return {};
}
Status invalid_argument(std::string message);
Status not_found(std::string message);
Status out_of_range(std::string message);
Status data_loss(std::string message);
Status unimplemented(std::string message);
Status resource_exhausted(std::string message);
Status unavailable(std::string message);
Status cancelled(std::string message);
Status io_error(std::string message);
Status internal_error(std::string message);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit like std::expected
  Result(Status status) : data_(std::move(status)) {  // NOLINT
    PS_CHECK(!std::get<Status>(data_).ok()) << "Result built from an ok Status";
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    PS_CHECK(ok()) << status().to_string();
    return std::get<T>(data_);
  }
  const T& value() const& {
    PS_CHECK(ok()) << status().to_string();
    return std::get<T>(data_);
  }
  T&& value() && {
    PS_CHECK(ok()) << status().to_string();
    return std::get<T>(std::move(data_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace peerserve

#define PS_CONCAT_INNER(a, b) a##b
#define PS_CONCAT(a, b) PS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define PS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::peerserve::Status ps_status_ = (expr); \
    if (!ps_status_.ok()) return ps_status_; \
  } while (0)

// PS_ASSIGN_OR_RETURN(auto x, make_x()): unwraps a Result or returns its Status.
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL(PS_CONCAT(ps_result_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

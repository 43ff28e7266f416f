#include "base/status.h"

namespace peerserve {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
Status not_found(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
Status out_of_range(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
Status data_loss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
Status unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
Status unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
Status cancelled(std::string m) {
  return {StatusCode::kCancelled, std::move(m)};
}
Status io_error(std::string m) {
  return {StatusCode::kIoError, std::move(m)};
}
Status internal_error(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

}  // namespace peerserve

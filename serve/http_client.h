// A small blocking HTTP/1.1 client (Boost.Beast) for calls between peerserve processes: the
// decode role triggering prefills and checking its prefill instances. Every call is bounded
// by one deadline covering resolve, connect, write and read; a peer that is down, silent or
// sends garbage is an error naming it, never a hang.
//
// Thread-safety: http_call may be called from many threads at once (one connection each).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace peerserve {

struct HttpCallResult {
  int status = 0;
  std::string body;
};

// The largest reply http_call reads by default.
inline constexpr uint64_t kHttpCallMaxReplyBytes = 16u << 20;

// `endpoint` is "host:port"; `target` the path ("/v1/completions"). A body is sent as
// application/json when non-empty; `api_key`, when not empty, as 'Authorization: Bearer'
// (peers of one deployment share its --api-key). Errors: Unavailable (connect, I/O,
// timeout, malformed reply), InvalidArgument (a bad endpoint), ResourceExhausted (a reply
// over max_body_bytes).
Result<HttpCallResult> http_call(const std::string& endpoint, const std::string& method,
                                 const std::string& target, const std::string& body,
                                 std::chrono::milliseconds timeout,
                                 uint64_t max_body_bytes = kHttpCallMaxReplyBytes,
                                 const std::string& api_key = {});

}  // namespace peerserve

// "HOST:PORT" endpoints as flags and peers name them: one check, so that a port outside
// 1..65535 (99999 listened on 34463, its value modulo 65536) or a name without a port is an
// error naming the flag, wherever an endpoint is read.
#pragma once

#include <charconv>
#include <string>
#include <string_view>

#include "base/status.h"

namespace peerserve {

// OK when `endpoint` is HOST:PORT with a non-empty HOST (a name, an IPv4 address, or an IPv6
// address in brackets) and PORT a decimal number in [min_port, 65535]; `what` names the flag
// or list in the error.
inline Status check_host_port(std::string_view endpoint, std::string_view what, int min_port = 1) {
  const size_t colon = endpoint.rfind(':');
  const auto bad = [&](const std::string& why) {
    return invalid_argument(std::string(what) + ": '" + std::string(endpoint) + "' " + why +
                            ", expected HOST:PORT");
  };
  if (colon == std::string_view::npos) return bad("has no port");
  if (colon == 0) return bad("has no host");
  const std::string_view host = endpoint.substr(0, colon);
  if (host.front() == '[') {
    // "[::1]" has no port ("has port '1]'" before); "[]" no host.
    if (host.back() != ']') return bad("has no port after its bracketed address");
    if (host.size() == 2) return bad("has no host");
  } else if (host.find(':') != std::string_view::npos) {
    return bad("has an IPv6 address without brackets (write [ADDRESS]:PORT)");
  }
  if (host.find_first_of(" \t\r\n") != std::string_view::npos) {
    return bad("has a space in its host");
  }
  const std::string_view port = endpoint.substr(colon + 1);
  int value = -1;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || error != std::errc() || end != port.data() + port.size() ||
      value < min_port || value > 65535) {
    return bad("has port '" + std::string(port) + "', not a number in [" +
               std::to_string(min_port) + ", 65535]");
  }
  return ok_status();
}

}  // namespace peerserve

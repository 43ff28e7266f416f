#include "serve/bearer_auth.h"

#include <algorithm>
#include <string_view>

namespace peerserve {
namespace {

// Compares in time that depends only on the lengths, so the key cannot be guessed byte by
// byte from response times.
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    difference |= static_cast<unsigned char>(x ^ y);
  }
  return difference == 0;
}

}  // namespace

bool bearer_token_matches(const HttpRequest& request, const std::string& api_key) {
  const std::string* auth = request.header("authorization");
  return auth != nullptr && constant_time_equal(*auth, "Bearer " + api_key);
}

ApiError missing_api_key_error() {
  ApiError e;
  e.status = 401;
  e.message = "Incorrect or missing API key; send it as 'Authorization: Bearer <key>'.";
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  return e;
}

}  // namespace peerserve

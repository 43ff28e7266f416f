#include "serve/http_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace peerserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Result<HttpCallResult> http_call(const std::string& endpoint, const std::string& method,
                                 const std::string& target, const std::string& body,
                                 std::chrono::milliseconds timeout, uint64_t max_body_bytes) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
    return invalid_argument("endpoint '" + endpoint + "': expected HOST:PORT");
  }
  const std::string host = endpoint.substr(0, colon);
  const std::string port = endpoint.substr(colon + 1);
  const http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) return invalid_argument("HTTP method '" + method + "'");
  auto fail = [&](const std::string& what, const beast::error_code& ec) {
    return unavailable(method + " http://" + endpoint + target + ": " + what + ": " +
                       (ec == beast::error::timeout
                            ? "no answer within " + std::to_string(timeout.count()) + " ms"
                            : ec.message()));
  };
  try {
    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    beast::error_code ec;
    // Resolving a literal address is immediate; names go through the system resolver,
    // which the deadline below cannot interrupt (peers are addressed by IP in practice).
    auto endpoints = resolver.resolve(host, port, ec);
    if (ec) return fail("resolve", ec);
    stream.expires_after(timeout);
    stream.connect(endpoints, ec);
    if (ec) return fail("connect", ec);
    http::request<http::string_body> request(verb, target, 11);
    request.set(http::field::host, host);
    request.set(http::field::user_agent, "peerserve");
    if (!body.empty()) {
      request.set(http::field::content_type, "application/json");
      request.body() = body;
    }
    request.prepare_payload();
    http::write(stream, request, ec);
    if (ec) return fail("write", ec);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(max_body_bytes);
    http::read(stream, buffer, parser, ec);
    if (ec == http::error::body_limit) {
      return resource_exhausted(method + " http://" + endpoint + target + ": reply over " +
                                std::to_string(max_body_bytes) + " bytes");
    }
    if (ec) return fail("read", ec);
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    HttpCallResult result;
    result.status = static_cast<int>(parser.get().result_int());
    result.body = std::move(parser.get().body());
    return result;
  } catch (const std::exception& e) {
    return unavailable(method + " http://" + endpoint + target + ": " + e.what());
  }
}

}  // namespace peerserve

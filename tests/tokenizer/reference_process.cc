#include "tests/tokenizer/reference_process.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace peerserve::testing {

std::filesystem::path source_dir() {
  if (const char* dir = std::getenv("PEERSERVE_SOURCE_DIR")) return dir;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

std::optional<std::filesystem::path> js_node_modules() {
  const auto dir = source_dir() / "tests" / "js" / "node_modules";
  if (!std::filesystem::exists(dir / "@lenml" / "tokenizer-deepseek_v3")) return std::nullopt;
  return dir;
}

std::optional<std::filesystem::path> deepseek_v3_tokenizer_dir() {
  const auto modules = js_node_modules();
  if (!modules) return std::nullopt;
  return *modules / "@lenml" / "tokenizer-deepseek_v3" / "models";
}

std::string shell_quote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::optional<nlohmann::json> run_json_tool(const std::string& command_prefix,
                                            const nlohmann::ordered_json& request,
                                            std::string& error) {
  static std::atomic<int> counter{0};
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("peerserve_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  const auto request_path = dir / "request.json";
  const auto response_path = dir / "response.json";
  const auto stderr_path = dir / "stderr.txt";
  {
    std::ofstream out(request_path, std::ios::binary);
    out << request.dump();
  }
  const std::string command = command_prefix + " " + shell_quote(request_path.string()) + " " +
                              shell_quote(response_path.string()) + " 2>" +
                              shell_quote(stderr_path.string());
  const int status = std::system(command.c_str());
  std::optional<nlohmann::json> response;
  if (status != 0) {
    std::ifstream err(stderr_path);
    std::stringstream text;
    text << err.rdbuf();
    std::string tail = text.str();
    if (tail.size() > 2000) tail = tail.substr(tail.size() - 2000);
    error = "command failed (status " + std::to_string(status) + "): " + command + "\n" + tail;
  } else {
    std::ifstream in(response_path, std::ios::binary);
    response = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (response->is_discarded()) {
      error = "reference tool wrote invalid JSON: " + command;
      response.reset();
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return response;
}

std::string base64_encode(const std::string& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v =
        (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

}  // namespace peerserve::testing

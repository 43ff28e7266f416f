// Test helpers for end-to-end server tests: start `peerserve serve` as a child process on a
// free loopback port, talk plain HTTP/1.1 to it with blocking sockets, and stop it. Every
// wait is bounded.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace peerserve::testing {

inline std::string binary_dir() {
  const char* dir = std::getenv("PEERSERVE_BINARY_DIR");
  return dir ? dir : "build";
}
inline std::string source_dir() {
  const char* dir = std::getenv("PEERSERVE_SOURCE_DIR");
  return dir ? dir : ".";
}

struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;  // de-chunked
  bool ok = false;   // a complete response was read
};

// One blocking HTTP/1.1 exchange on a fresh connection ("Connection: close").
inline HttpResponse http_request(uint16_t port, const std::string& method, const std::string& path,
                                 const std::string& body = "",
                                 const std::vector<std::string>& extra_headers = {},
                                 int timeout_s = 60) {
  HttpResponse r;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const std::string& h : extra_headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[8192];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, head_end);
  std::string rest = raw.substr(head_end + 4);
  if (r.headers.find("Transfer-Encoding: chunked") != std::string::npos) {
    while (true) {
      const size_t eol = rest.find("\r\n");
      if (eol == std::string::npos) return r;
      const size_t len = std::stoul(rest.substr(0, eol), nullptr, 16);
      if (len == 0) break;
      if (rest.size() < eol + 2 + len) return r;
      r.body += rest.substr(eol + 2, len);
      rest.erase(0, eol + 2 + len + 2);
    }
  } else {
    r.body = rest;
  }
  r.ok = true;
  return r;
}

// The value of an unlabelled-or-labelled sample "name{...} value" in Prometheus text.
inline std::optional<double> metric_value(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

// Sum of every sample of a family whose label set contains `label_fragment`.
inline double metric_sum(const std::string& text, const std::string& name,
                         const std::string& label_fragment) {
  std::istringstream lines(text);
  std::string line;
  double total = 0;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0 || line.find(label_fragment) == std::string::npos) continue;
    total += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return total;
}

class ServerProcess {
 public:
  // Starts `peerserve serve --model DIR --port 0 ARGS...`; waits (bounded) until it listens.
  bool start(const std::string& model_dir, const std::vector<std::string>& args,
             int timeout_s = 120) {
    log_path_ =
        std::filesystem::temp_directory_path() / ("peerserve_serve_" + std::to_string(::getpid()) +
                                                  "_" + std::to_string(counter()++) + ".log");
    std::vector<std::string> argv = {binary_dir() + "/apps/peerserve",
                                     "serve",
                                     "--model",
                                     model_dir,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string log = read_log();
      const std::string marker = "on http://127.0.0.1:";
      const size_t at = log.find(marker);
      if (at != std::string::npos) {
        port_ = static_cast<uint16_t>(std::stoi(log.substr(at + marker.size())));
        return true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // SIGTERM, then SIGKILL after 20 s. Returns the exit status (or -1).
  int stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 400; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }

  ~ServerProcess() {
    stop();
    std::error_code ec;
    if (!log_path_.empty()) std::filesystem::remove(log_path_, ec);
  }

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string read_log() const {
    std::ifstream in(log_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Resident set size in KiB (VmRSS), or -1.
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::filesystem::path log_path_;
};

}  // namespace peerserve::testing

// Test helper: a real `peerserve cache-server` child process on a loopback port. Every wait
// is bounded; the destructor kills the process.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace peerserve::testing {

inline std::string peerserve_binary() {
  const char* dir = std::getenv("PEERSERVE_BINARY_DIR");
  return std::string(dir ? dir : "build") + "/apps/peerserve";
}

class CacheServerProcess {
 public:
  CacheServerProcess() = default;
  CacheServerProcess(const CacheServerProcess&) = delete;
  CacheServerProcess& operator=(const CacheServerProcess&) = delete;
  ~CacheServerProcess() {
    kill_hard();
    std::error_code ignored;
    if (!log_path_.empty()) std::filesystem::remove(log_path_, ignored);
  }

  // Starts `peerserve cache-server --listen 127.0.0.1:<port> ARGS...` (port 0: any) and waits
  // up to `timeout` for it to print its address. False if it did not come up.
  bool start(const std::vector<std::string>& args, int port = 0,
             std::chrono::seconds timeout = std::chrono::seconds(30)) {
    static int counter = 0;
    log_path_ = std::filesystem::temp_directory_path() /
                ("peerserve_cache_server_" + std::to_string(::getpid()) + "_" +
                 std::to_string(counter++) + ".log");
    std::vector<std::string> argv = {peerserve_binary(), "cache-server", "--listen",
                                     "127.0.0.1:" + std::to_string(port)};
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
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < give_up) {
      const std::string text = log();
      const std::string marker = "listening on 127.0.0.1:";
      const size_t at = text.find(marker);
      if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port_ = std::stoi(text.substr(at + marker.size()));
        return true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  void kill_hard() { stop(SIGKILL); }
  // SIGTERM, then the exit status (or -1).
  int terminate() { return stop(SIGTERM); }
  // SIGSTOP, then waits until the kernel reports every thread stopped: the signal is
  // asynchronous, and a thread running on another core may still answer a request meanwhile.
  void pause() {
    ::kill(pid_, SIGSTOP);
    auto all_stopped = [&] {
      std::error_code ec;
      for (const auto& task :
           std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
        std::ifstream in(task.path() / "stat");
        std::string line;
        std::getline(in, line);
        const size_t close = line.rfind(')');  // the state follows the command name
        if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T') {
          return false;
        }
      }
      return !ec;
    };
    for (int i = 0; i < 2000 && !all_stopped(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void resume() { ::kill(pid_, SIGCONT); }

 private:
  int stop(int sig) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    int status = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path log_path_;
};

}  // namespace peerserve::testing

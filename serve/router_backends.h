// RouterBackends: the decode instances behind `serve --role router`, their health and load
// (and, in a second set, the prefill instances the router suggests to them).
//
// Choice is stateless and load-aware: the instance that is up with the fewest requests the
// router has in flight there (ties: the one chosen least recently), never one already tried
// for the same request. No cache-locality routing: with a caching pool every instance reads
// the same KV, so any instance is as good as another (paper 000 §4.1).
//
// Health: a thread asks every instance's GET /health every `interval` (each call bounded
// by `timeout`). An instance is up after a 200, down after anything else or a failed
// request; down instances leave the rotation and come back at their next good check. The
// first time an instance answers, its /v1/models card (model id and KV namespace identity)
// must equal the others'; a mismatched instance is left out for good and logged.
//
// Thread-safety: every method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"

namespace peerserve {

struct RouterBackendStats {
  std::string endpoint;
  bool up = false;
  bool mismatched = false;  // serves another model or KV namespace: left out
  int64_t in_flight = 0;
  int64_t requests = 0;  // requests sent there
  int64_t failures = 0;  // requests that failed there (connect, reset, timeout)
};

class RouterBackends {
 public:
  // `members`: "host:port,host:port,..." (InvalidArgument when malformed or repeated);
  // `role` names them in errors and logs ("decode instance", "prefill instance"), `flag` is
  // the option they came from; `api_key` (the router's --api-key, shared by the deployment)
  // is sent with the card checks, none when empty.
  static Result<std::unique_ptr<RouterBackends>> create(const std::string& members,
                                                        std::chrono::milliseconds interval,
                                                        std::chrono::milliseconds timeout,
                                                        std::string role = "decode instance",
                                                        const std::string& flag = "--decode",
                                                        std::string api_key = {});
  ~RouterBackends();

  // Checks every instance now (health and card). InvalidArgument naming two instances that
  // serve different models; instances that do not answer go to `unreachable` (they join
  // when they do).
  Status check(std::vector<std::string>* unreachable);
  // Starts the periodic health checks; stop() ends them (the destructor too). Sets that share
  // an identity must all be stopped before either is destroyed.
  void start();
  void stop();
  // Another set whose instances must serve the same model and KV namespace as these (the
  // prefill instances of the decode instances' router): the first card either set sees is
  // the one both compare against. Before check(); `other` must outlive this set.
  void share_identity_with(RouterBackends* other);

  // An instance that is up, not in `tried`, with the fewest requests in flight; its in-flight
  // count is raised (pair with release()). -1 when there is none.
  int acquire(const std::vector<int>& tried);
  // The request at `index` ended; `failed`: the instance did not answer properly (it is
  // marked down until its next good health check).
  void release(int index, bool failed, const std::string& why);
  bool any_up() const;
  const std::string& endpoint(int index) const { return endpoints_[static_cast<size_t>(index)]; }
  int size() const { return static_cast<int>(endpoints_.size()); }
  std::vector<RouterBackendStats> stats() const;

 private:
  struct State {
    bool up = false;
    bool verified = false;  // its card was compared
    bool mismatched = false;
    int64_t in_flight = 0, requests = 0, failures = 0;
    uint64_t last_chosen = 0;
  };
  RouterBackends(std::vector<std::string> endpoints, std::chrono::milliseconds interval,
                 std::chrono::milliseconds timeout, std::string role, std::string api_key);
  // One health check (and the card comparison when not verified yet). Not under mutex_.
  Status probe(size_t index);
  void set_up(size_t index, bool up, const std::string& why);
  void health_loop();

  // The identity both sets compare against, and where it was first seen ("" when not yet).
  std::pair<std::string, std::string> identity() const;

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds interval_, timeout_;
  const std::string role_;
  const std::string api_key_;
  RouterBackends* peer_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<State> states_;
  std::string identity_;  // the first card seen: "model id | KV namespace"
  std::string identity_source_;
  uint64_t choices_ = 0;
  bool stopping_ = false;
  std::thread health_thread_;
};

}  // namespace peerserve

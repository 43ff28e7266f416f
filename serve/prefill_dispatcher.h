// PrefillDispatcher: the decode role's side of prefill/decode disaggregation (paper 000
// §4.3.3). A decode instance that misses a prompt's KV in the caching pool hands the prompt
// to a prefill instance (`serve --role prefill`, an OpenAI server over the same pool): one
// `POST /v1/completions` with the prompt's token ids and max_tokens 1. The prefill instance
// computes the prompt, pushes its full blocks straight into the blocks the decode instance
// reserved for them (peerserve_kv_push; runtime/kv_handoff_receiver.h) and stores them in
// the pool, where a decode instance without a receiver reads them
// (runtime/kv_pool_connector.h); the decode instance computes the last prompt token itself,
// so its first token is exactly what a single server would produce.
//
// Choice: the request's hint when it names one of the instances and that one is up (the
// router's load-aware choice, `serve --role router --prefill`), else the preferred instance
// when it is up (a decode DP rank's own prefill instance under the §4.3.3 mapping,
// plan/analytic/connection_mapping.h), else the healthy instance with the
// fewest prefills in flight (ties: list order). A failed call (refused, timed out, an error answer)
// marks the instance down for a back-off (1 s doubling to 16 s) and the next instance is tried;
// when none is left the call fails and the decode instance prefills locally.
//
// Handshake: before its first use, each instance's /v1/models card must report the same KV
// namespace identity (tenant, model id, KV layout: layers, widths, block size, dtype, layout
// version) as this instance. A mismatch excludes the instance for good and is logged; at
// start-up, check() reports it as an error so a mismatched pair refuses to start.
//
// Thread-safety: every method from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/request.h"
#include "runtime/sampler.h"

namespace peerserve {

struct PrefillDispatcherCounters {
  int64_t calls = 0;
  int64_t failures = 0;  // calls that found no working instance
  int64_t retries = 0;   // instances that failed a call (then the next was tried)
};

class PrefillDispatcher {
 public:
  // `members`: "host:port,host:port,..."; `kv_identity`: this instance's
  // KvNamespace::canonical_identity(). InvalidArgument on a malformed list.
  // `api_key`: sent to the instances as a bearer token (this instance's --api-key; the
  // instances of one deployment share it), none when empty.
  static Result<std::unique_ptr<PrefillDispatcher>> create(const std::string& members,
                                                           std::string kv_identity,
                                                           std::chrono::milliseconds timeout,
                                                           std::string api_key = {});

  // Tries instance `index` (list order) first whenever it is up; -1: no preference.
  void set_preferred(int index);
  int size() const { return static_cast<int>(instances_.size()); }

  // Handshakes with every instance now. InvalidArgument naming an instance whose KV namespace
  // differs; instances that do not answer are only reported in `unreachable` (they are tried
  // again when needed).
  Status check(std::vector<std::string>* unreachable);

  // Has a prefill instance compute `prompt`; see the class comment. With `push`, the instance
  // also pushes the prompt's KV blocks to that hand-off receiver (peerserve_kv_push).
  // `hint` ("host:port", a router's choice): tried first when it is one of this dispatcher's
  // instances and up, before the preferred one; any other value is ignored (a request cannot
  // make this instance call a host it was not configured with). A non-empty `cache_salt`
  // (EngineRequest::cache_salt) goes along, so the prefill instance hashes the blocks as the
  // decode instance expects them.
  Status prefill(std::span<const TokenId> prompt, const KvPushTarget* push = nullptr,
                 const std::string& hint = {}, const std::string& cache_salt = {});

  PrefillDispatcherCounters counters() const;

  struct InstanceStats {
    std::string endpoint;
    bool up = false;  // usable now (not excluded, not backing off)
    int in_flight = 0;
    int64_t calls = 0;     // prefills sent there
    int64_t failures = 0;  // of them, failed (then the next instance was tried)
    double seconds = 0;    // time spent in its calls
  };
  std::vector<InstanceStats> instance_stats() const;
  // Prometheus text of instance_stats(): the decode role's per-link figures.
  std::string render_metrics(const std::string& model_name) const;

 private:
  struct Instance {
    std::string endpoint;
    std::string model_name;  // from its /v1/models card
    bool verified = false;
    bool excluded = false;  // KV namespace mismatch
    int in_flight = 0;
    int64_t calls = 0, failures = 0;
    double seconds = 0;
    std::chrono::steady_clock::time_point down_until{};
    std::chrono::milliseconds backoff{0};
  };
  PrefillDispatcher(std::vector<Instance> instances, std::string kv_identity,
                    std::chrono::milliseconds timeout, std::string api_key)
      : instances_(std::move(instances)),
        kv_identity_(std::move(kv_identity)),
        timeout_(timeout),
        api_key_(std::move(api_key)) {}

  // Fetches and compares the instance's card; fills model_name. Not under mutex_.
  Status handshake(const std::string& endpoint, std::string* model_name) const;
  void mark_down(size_t index);
  // After a 4xx answer: whether instance `index` no longer passes the handshake (then it is
  // left out, or handshaken again later when it did not answer).
  bool instance_changed(const std::string& endpoint, size_t index);

  mutable std::mutex mutex_;
  std::vector<Instance> instances_;
  const std::string kv_identity_;
  const std::chrono::milliseconds timeout_;
  const std::string api_key_;
  PrefillDispatcherCounters counters_;
  int preferred_ = -1;
};

}  // namespace peerserve

#include "serve/prefill_dispatcher.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "serve/endpoint_list.h"
#include "serve/http_client.h"
#include "serve/prometheus_text.h"

namespace peerserve {

using json = nlohmann::json;

Result<std::unique_ptr<PrefillDispatcher>> PrefillDispatcher::create(
    const std::string& members, std::string kv_identity, std::chrono::milliseconds timeout,
    std::string api_key) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
                      parse_endpoint_list(members, "--prefill"));
  std::vector<Instance> instances(endpoints.size());
  for (size_t k = 0; k < endpoints.size(); ++k) instances[k].endpoint = std::move(endpoints[k]);
  return std::unique_ptr<PrefillDispatcher>(new PrefillDispatcher(
      std::move(instances), std::move(kv_identity), timeout, std::move(api_key)));
}

Status PrefillDispatcher::handshake(const std::string& endpoint, std::string* model_name) const {
  PS_ASSIGN_OR_RETURN(HttpCallResult reply,
                      http_call(endpoint, "GET", "/v1/models", "",
                                std::min(timeout_, std::chrono::milliseconds(5000)),
                                kHttpCallMaxReplyBytes, api_key_));
  if (reply.status == 401) {
    // Configuration, not a passing failure: say which key to fix.
    return invalid_argument("prefill instance " + endpoint +
                            " refused this instance's API key (401): give both the same "
                            "--api-key");
  }
  if (reply.status != 200) {
    return unavailable("prefill instance " + endpoint + ": /v1/models answered " +
                       std::to_string(reply.status));
  }
  const json card = json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (!card.is_object() || !card.contains("data") || !card["data"].is_array() ||
      card["data"].empty() || !card["data"][0].is_object() || !card["data"][0].contains("id") ||
      !card["data"][0]["id"].is_string()) {
    return unavailable("prefill instance " + endpoint + ": malformed /v1/models answer");
  }
  const json& model = card["data"][0];
  std::string identity;
  if (model.contains("peerserve") && model["peerserve"].is_object() &&
      model["peerserve"].contains("kv_namespace") &&
      model["peerserve"]["kv_namespace"].is_string()) {
    identity = model["peerserve"]["kv_namespace"].get<std::string>();
  }
  if (identity != kv_identity_) {
    return invalid_argument(
        "prefill instance " + endpoint +
        " computes KV this instance cannot use: its KV namespace is '" +
        (identity.empty() ? std::string("(none: is it serving with --kv-pool?)") : identity) +
        "', this instance's is '" + kv_identity_ +
        "' (must agree: model, --kv-namespace, --block-size, KV dtype, --speculative and "
        "the drafter's precision, --quantize, --fp32, --ep-dispatch-dtype and "
        "--attention-form)");
  }
  *model_name = model["id"].get<std::string>();
  return ok_status();
}

Status PrefillDispatcher::check(std::vector<std::string>* unreachable) {
  std::vector<std::string> endpoints;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Instance& i : instances_) endpoints.push_back(i.endpoint);
  }
  for (size_t k = 0; k < endpoints.size(); ++k) {
    std::string name;
    Status s = handshake(endpoints[k], &name);
    std::lock_guard<std::mutex> lock(mutex_);
    if (s.ok()) {
      instances_[k].verified = true;
      instances_[k].model_name = name;
    } else if (s.code() == StatusCode::kInvalidArgument) {
      instances_[k].excluded = true;
      return s;
    } else if (unreachable != nullptr) {
      unreachable->push_back(endpoints[k] + " (" + s.message() + ")");
    }
  }
  return ok_status();
}

bool PrefillDispatcher::instance_changed(const std::string& endpoint, size_t index) {
  // A refusal can also be the instance's: restarted with another model name, API key, KV
  // namespace or role. Its card tells: if it no longer matches, it is left out (and the next
  // instance tried) instead of the prompt being taken for bad.
  std::string model_name;
  const Status again = handshake(endpoint, &model_name);
  if (again.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    instances_[index].model_name = model_name;
    return false;
  }
  const bool mismatch = again.code() == StatusCode::kInvalidArgument;
  std::fprintf(stderr, "error: %s; %s\n", again.message().c_str(),
               mismatch ? "leaving it out" : "it is tried again after a back-off");
  std::lock_guard<std::mutex> lock(mutex_);
  instances_[index].verified = false;
  if (mismatch) instances_[index].excluded = true;
  return true;
}

void PrefillDispatcher::mark_down(size_t index) {
  Instance& i = instances_[index];
  i.backoff = i.backoff.count() == 0 ? std::chrono::milliseconds(1000)
                                     : std::min(i.backoff * 2, std::chrono::milliseconds(16000));
  i.down_until = std::chrono::steady_clock::now() + i.backoff;
  ++counters_.retries;
}

Status PrefillDispatcher::prefill(std::span<const TokenId> prompt, const KvPushTarget* push,
                                  const std::string& hint, const std::string& cache_salt) {
  json ids = json::array();
  for (TokenId t : prompt) ids.push_back(t);
  std::vector<size_t> tried;
  Status last = unavailable("no prefill instance is up");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.calls;
  }
  while (true) {
    size_t pick = instances_.size();
    std::string endpoint, model_name;
    bool verified = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto now = std::chrono::steady_clock::now();
      auto usable = [&](size_t k) {
        const Instance& i = instances_[k];
        return !i.excluded && i.down_until <= now &&
               std::find(tried.begin(), tried.end(), k) == tried.end();
      };
      for (size_t k = 0; k < instances_.size() && !hint.empty(); ++k) {
        if (instances_[k].endpoint == hint && usable(k)) pick = k;
      }
      if (pick == instances_.size() && preferred_ >= 0 &&
          static_cast<size_t>(preferred_) < instances_.size() &&
          usable(static_cast<size_t>(preferred_))) {
        pick = static_cast<size_t>(preferred_);
      }
      for (size_t k = 0; k < instances_.size() && pick == instances_.size(); ++k) {
        if (!usable(k)) continue;
        size_t best = k;
        for (size_t j = k + 1; j < instances_.size(); ++j) {
          if (usable(j) && instances_[j].in_flight < instances_[best].in_flight) best = j;
        }
        pick = best;
      }
      if (pick == instances_.size()) {
        ++counters_.failures;
        return last;
      }
      tried.push_back(pick);
      ++instances_[pick].in_flight;
      endpoint = instances_[pick].endpoint;
      model_name = instances_[pick].model_name;
      verified = instances_[pick].verified;
    }
    const auto call_started = std::chrono::steady_clock::now();
    Status status = ok_status();
    if (!verified) {
      status = handshake(endpoint, &model_name);
      std::lock_guard<std::mutex> lock(mutex_);
      if (status.ok()) {
        instances_[pick].verified = true;
        instances_[pick].model_name = model_name;
      } else if (status.code() == StatusCode::kInvalidArgument) {
        instances_[pick].excluded = true;
        std::fprintf(stderr, "error: %s; leaving it out\n", status.message().c_str());
      }
    }
    if (status.ok()) {
      json body = {{"model", model_name},
                   {"prompt", ids},
                   {"max_tokens", 1},
                   {"temperature", 0},
                   // Checked on every call: a restarted instance may compute other KV now.
                   {"peerserve_kv_namespace", kv_identity_}};
      if (!cache_salt.empty()) body["cache_salt"] = cache_salt;
      if (push != nullptr) {
        body["peerserve_kv_push"] = {{"endpoint", push->endpoint},
                                     {"transfer", push->transfer},
                                     {"first_block", push->first_block},
                                     {"tail", push->tail}};
      }
      Result<HttpCallResult> reply = http_call(endpoint, "POST", "/v1/completions", body.dump(),
                                               timeout_, kHttpCallMaxReplyBytes, api_key_);
      if (!reply.ok()) {
        status = reply.status();
      } else if (reply->status >= 400 && reply->status < 500 && reply->status != 429 &&
                 !instance_changed(endpoint, pick)) {
        // The request, not the instance: the others would refuse it too. (429 is the
        // instance: its queue is full, so it backs off like one that failed and the next is
        // tried.)
        std::lock_guard<std::mutex> lock(mutex_);
        --instances_[pick].in_flight;
        ++instances_[pick].calls;
        ++counters_.failures;
        return invalid_argument("prefill instance " + endpoint + " refused the prompt (" +
                                std::to_string(reply->status) + "): " + reply->body.substr(0, 300));
      } else if (reply->status != 200) {
        status = unavailable("prefill instance " + endpoint + " answered " +
                             std::to_string(reply->status) + ": " + reply->body.substr(0, 300));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    --instances_[pick].in_flight;
    ++instances_[pick].calls;
    instances_[pick].seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - call_started).count();
    if (!status.ok()) ++instances_[pick].failures;
    if (status.ok()) {
      instances_[pick].backoff = std::chrono::milliseconds(0);
      return ok_status();
    }
    if (!instances_[pick].excluded) mark_down(pick);
    last = status;
  }
}

void PrefillDispatcher::set_preferred(int index) {
  std::lock_guard<std::mutex> lock(mutex_);
  preferred_ = index;
}

PrefillDispatcherCounters PrefillDispatcher::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

std::vector<PrefillDispatcher::InstanceStats> PrefillDispatcher::instance_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<InstanceStats> out;
  const auto now = std::chrono::steady_clock::now();
  for (const Instance& i : instances_) {
    out.push_back({i.endpoint, !i.excluded && i.down_until <= now, i.in_flight, i.calls, i.failures,
                   i.seconds});
  }
  return out;
}

std::string PrefillDispatcher::render_metrics(const std::string& model_name) const {
  const std::vector<InstanceStats> stats = instance_stats();
  PrometheusText out;
  auto family = [&](const char* name, const char* help, const char* type, auto value) {
    out.family(name, help, type);
    for (const InstanceStats& s : stats) {
      out.sample(name, {{"model_name", model_name}, {"instance", s.endpoint}},
                 static_cast<double>(value(s)));
    }
  };
  family("peerserve:prefill_instance_up", "Whether the prefill instance is usable now.", "gauge",
         [](const InstanceStats& s) { return s.up ? 1 : 0; });
  family("peerserve:prefill_instance_in_flight", "Prefills in flight at the instance.", "gauge",
         [](const InstanceStats& s) { return s.in_flight; });
  family("peerserve:prefill_instance_calls_total", "Prefills sent to the instance.", "counter",
         [](const InstanceStats& s) { return s.calls; });
  family("peerserve:prefill_instance_failures_total",
         "Prefills the instance failed (the next instance was tried).", "counter",
         [](const InstanceStats& s) { return s.failures; });
  family("peerserve:prefill_instance_seconds_total", "Time spent in prefill calls to it.",
         "counter", [](const InstanceStats& s) { return s.seconds; });
  return out.text();
}

}  // namespace peerserve

#include "serve/router_backends.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "serve/endpoint_list.h"
#include "serve/http_client.h"

namespace peerserve {

using json = nlohmann::json;

Result<std::unique_ptr<RouterBackends>> RouterBackends::create(const std::string& members,
                                                               std::chrono::milliseconds interval,
                                                               std::chrono::milliseconds timeout,
                                                               std::string role,
                                                               const std::string& flag,
                                                               std::string api_key) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> endpoints, parse_endpoint_list(members, flag));
  if (interval.count() < 1 || timeout.count() < 1) {
    return invalid_argument("router health checks: interval and timeout must be >= 1 ms");
  }
  return std::unique_ptr<RouterBackends>(new RouterBackends(std::move(endpoints), interval, timeout,
                                                            std::move(role), std::move(api_key)));
}

RouterBackends::RouterBackends(std::vector<std::string> endpoints,
                               std::chrono::milliseconds interval,
                               std::chrono::milliseconds timeout, std::string role,
                               std::string api_key)
    : endpoints_(std::move(endpoints)),
      interval_(interval),
      timeout_(timeout),
      role_(std::move(role)),
      api_key_(std::move(api_key)),
      states_(endpoints_.size()) {}

void RouterBackends::share_identity_with(RouterBackends* other) {
  peer_ = other;
  other->peer_ = this;
}

std::pair<std::string, std::string> RouterBackends::identity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {identity_, identity_source_};
}

RouterBackends::~RouterBackends() {
  stop();
}

void RouterBackends::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

Status RouterBackends::probe(size_t index) {
  const std::string& endpoint = endpoints_[index];
  PS_ASSIGN_OR_RETURN(HttpCallResult health, http_call(endpoint, "GET", "/health", "", timeout_));
  if (health.status != 200) {
    return unavailable("/health answered " + std::to_string(health.status));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (states_[index].verified) return ok_status();
  }
  PS_ASSIGN_OR_RETURN(HttpCallResult reply, http_call(endpoint, "GET", "/v1/models", "", timeout_,
                                                      kHttpCallMaxReplyBytes, api_key_));
  if (reply.status == 401) {
    return unavailable(
        "/v1/models answered 401: it refuses the router's API key (give the "
        "router and its instances the same --api-key)");
  }
  const json card = json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (reply.status != 200 || !card.is_object() || !card.contains("data") ||
      !card["data"].is_array() || card["data"].empty() || !card["data"][0].is_object() ||
      !card["data"][0].contains("id") || !card["data"][0]["id"].is_string()) {
    return unavailable("/v1/models answered " + std::to_string(reply.status) +
                       " without a model card");
  }
  const json& model = card["data"][0];
  std::string identity = model["id"].get<std::string>();
  if (model.contains("peerserve") && model["peerserve"].is_object() &&
      model["peerserve"].contains("kv_namespace") &&
      model["peerserve"]["kv_namespace"].is_string()) {
    identity += " | KV namespace " + model["peerserve"]["kv_namespace"].get<std::string>();
  }
  // The other set's identity, read before taking this set's lock (never both at once).
  const auto [peer_identity, peer_source] =
      peer_ != nullptr ? peer_->identity() : std::pair<std::string, std::string>{};
  std::lock_guard<std::mutex> lock(mutex_);
  if (identity_.empty() && !peer_identity.empty()) {
    identity_ = peer_identity;
    identity_source_ = peer_source;
  }
  if (identity_.empty()) {
    identity_ = identity;
    identity_source_ = endpoint;
  } else if (identity != identity_) {
    states_[index].mismatched = true;
    return invalid_argument(role_ + " " + endpoint + " serves '" + identity + "', but " +
                            identity_source_ + " serves '" + identity_ +
                            "' (every instance behind a router must serve the same model)");
  }
  states_[index].verified = true;
  return ok_status();
}

void RouterBackends::set_up(size_t index, bool up, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  State& s = states_[index];
  if (s.mismatched) up = false;
  // Down may mean restarted, with another model or namespace: read its card again when it is
  // back (its first good health check).
  if (!up) s.verified = false;
  if (s.up != up) {
    std::fprintf(stderr, "router: %s %s is %s%s%s\n", role_.c_str(), endpoints_[index].c_str(),
                 up ? "up" : "down", why.empty() ? "" : ": ", why.c_str());
    std::fflush(stderr);
  }
  s.up = up;
}

Status RouterBackends::check(std::vector<std::string>* unreachable) {
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const Status s = probe(k);
    if (s.code() == StatusCode::kInvalidArgument) return s;
    set_up(k, s.ok(), s.ok() ? "" : s.message());
    if (!s.ok() && unreachable != nullptr) {
      unreachable->push_back(endpoints_[k] + " (" + s.message() + ")");
    }
  }
  return ok_status();
}

void RouterBackends::start() {
  health_thread_ = std::thread([this] { health_loop(); });
}

void RouterBackends::health_loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) return;
    }
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
        if (states_[k].mismatched) continue;
      }
      const Status s = probe(k);
      if (s.code() == StatusCode::kInvalidArgument) {
        std::fprintf(stderr, "router: error: %s; leaving it out\n", s.message().c_str());
      }
      set_up(k, s.ok(), s.ok() ? "" : s.message());
    }
  }
}

int RouterBackends::acquire(const std::vector<int>& tried) {
  std::lock_guard<std::mutex> lock(mutex_);
  int pick = -1;
  for (size_t k = 0; k < states_.size(); ++k) {
    const State& s = states_[k];
    if (!s.up || std::find(tried.begin(), tried.end(), static_cast<int>(k)) != tried.end()) {
      continue;
    }
    if (pick < 0) {
      pick = static_cast<int>(k);
      continue;
    }
    const State& best = states_[static_cast<size_t>(pick)];
    if (s.in_flight < best.in_flight ||
        (s.in_flight == best.in_flight && s.last_chosen < best.last_chosen)) {
      pick = static_cast<int>(k);
    }
  }
  if (pick >= 0) {
    State& s = states_[static_cast<size_t>(pick)];
    ++s.in_flight;
    ++s.requests;
    s.last_chosen = ++choices_;
  }
  return pick;
}

void RouterBackends::release(int index, bool failed, const std::string& why) {
  if (index < 0 || static_cast<size_t>(index) >= states_.size()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    State& s = states_[static_cast<size_t>(index)];
    --s.in_flight;
    if (!failed) return;
    ++s.failures;
  }
  set_up(static_cast<size_t>(index), false, why);
}

bool RouterBackends::any_up() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(states_.begin(), states_.end(), [](const State& s) { return s.up; });
}

std::vector<RouterBackendStats> RouterBackends::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RouterBackendStats> out;
  for (size_t k = 0; k < states_.size(); ++k) {
    const State& s = states_[k];
    out.push_back({endpoints_[k], s.up, s.mismatched, s.in_flight, s.requests, s.failures});
  }
  return out;
}

}  // namespace peerserve

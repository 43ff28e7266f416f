#include "apps/serve_router_role.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "apps/command_registry.h"
#include "apps/server_signals.h"
#include "serve/openai_router.h"
#include "serve/router_backends.h"

namespace peerserve {

int run_router_role(const RouterRoleOptions& options) {
  const sigset_t signals = block_server_signals();
  StartupSignalExit startup_exit(signals);  // until it serves, a signal ends it at once
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return kExitFailure;
  };
  if (options.decode_instances.empty()) {
    return fail(invalid_argument("--role router needs --decode HOST:PORT,..."));
  }
  if (options.connect_timeout_ms < 1 || options.read_timeout_s < 1 ||
      options.health_interval_ms < 1) {
    return fail(invalid_argument(
        "--router-connect-timeout-ms, --router-read-timeout-s and --health-check-interval-ms "
        "must be >= 1"));
  }
  // A health check waits at most one interval (and never more than 2 s).
  const auto interval = std::chrono::milliseconds(options.health_interval_ms);
  const std::string api_key = options.api_key.value_or("");
  auto backends = RouterBackends::create(options.decode_instances, interval,
                                         std::min(interval, std::chrono::milliseconds(2000)),
                                         "decode instance", "--decode", api_key);
  if (!backends.ok()) return fail(backends.status());
  std::shared_ptr<RouterBackends> shared = std::move(backends).value();
  std::shared_ptr<RouterBackends> prefill;
  if (!options.prefill_instances.empty()) {
    auto created = RouterBackends::create(options.prefill_instances, interval,
                                          std::min(interval, std::chrono::milliseconds(2000)),
                                          "prefill instance", "--prefill", api_key);
    if (!created.ok()) return fail(created.status());
    prefill = std::move(created).value();
    prefill->share_identity_with(shared.get());  // same model and KV namespace as the decoders
  }
  std::vector<std::string> unreachable;
  if (Status s = shared->check(&unreachable); !s.ok()) return fail(s);
  for (const std::string& u : unreachable) {
    std::fprintf(stderr, "warning: decode instance %s is not up yet; it joins when it is\n",
                 u.c_str());
  }
  if (prefill) {
    unreachable.clear();
    if (Status s = prefill->check(&unreachable); !s.ok()) return fail(s);
    for (const std::string& u : unreachable) {
      std::fprintf(stderr, "warning: prefill instance %s is not up yet; it joins when it is\n",
                   u.c_str());
    }
    prefill->start();
  }
  shared->start();

  OpenAiRouterOptions router_options;
  router_options.http = options.http;
  router_options.api_key = options.api_key;
  router_options.timeouts.connect = std::chrono::milliseconds(options.connect_timeout_ms);
  router_options.timeouts.read = std::chrono::seconds(options.read_timeout_s);
  auto router = OpenAiRouter::create(router_options, shared, prefill);
  if (!router.ok()) return fail(router.status());
  // Before the lines that say it serves: a signal sent on seeing them drains (below).
  startup_exit.done();
  std::fprintf(stderr,
               "role router: OpenAI API on http://%s:%u over %d decode instance%s (%s), health "
               "checks every %d ms (Ctrl-C to stop)\n",
               options.http.host.c_str(), static_cast<unsigned>((*router)->port()), shared->size(),
               shared->size() == 1 ? "" : "s", options.decode_instances.c_str(),
               options.health_interval_ms);
  if (prefill) {
    std::fprintf(stderr,
                 "role router: suggests the least loaded of %d prefill instance%s (%s) to the "
                 "decode instances\n",
                 prefill->size(), prefill->size() == 1 ? "" : "s",
                 options.prefill_instances.c_str());
  }
  std::fflush(stderr);

  OpenAiRouter* raw = router->get();
  const auto shutdown_timeout = std::chrono::seconds(options.shutdown_timeout_s);
  std::thread signal_waiter([signals, raw, shutdown_timeout] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr,
                 "\nsignal %d: draining — no new requests, /health 503, requests in flight have "
                 "%lld s (signal again to exit at once)\n",
                 sig, static_cast<long long>(shutdown_timeout.count()));
    std::fflush(stderr);
    raw->begin_drain();
    const auto deadline = std::chrono::steady_clock::now() + shutdown_timeout;
    while (raw->active_requests() > 0 && std::chrono::steady_clock::now() < deadline) {
      timespec poll{0, 50'000'000};
      if (sigtimedwait(&signals, nullptr, &poll) > 0) {
        std::fprintf(stderr, "second signal: exiting now\n");
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
    // The requests left are cut off from their instances and told so; then what was handed
    // to the clients gets as long again to be written out.
    raw->shut_down(std::max<std::chrono::milliseconds>(std::chrono::seconds(1), shutdown_timeout));
  });
  (*router)->run();
  signal_waiter.join();
  router->reset();
  // Both health loops end before either set goes (each may read the other's identity).
  if (prefill) prefill->stop();
  shared->stop();
  return 0;
}

}  // namespace peerserve

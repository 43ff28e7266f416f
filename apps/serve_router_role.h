// `peerserve serve --role router`: the OpenAI front end over decode instances
// (serve/openai_router.h); no model is loaded.
#pragma once

#include <optional>
#include <string>

#include "serve/http_server.h"

namespace peerserve {

struct RouterRoleOptions {
  std::string decode_instances;   // "host:port,..."
  std::string prefill_instances;  // "host:port,..." suggested to the decode instances, or ""
  HttpServerOptions http;
  std::optional<std::string> api_key;
  int connect_timeout_ms = 2000;
  int read_timeout_s = 300;
  int health_interval_ms = 1000;
  int shutdown_timeout_s = 30;
};

// Runs until SIGINT/SIGTERM (drains first); the process exit code.
int run_router_role(const RouterRoleOptions& options);

}  // namespace peerserve

// The expert-parallel flags of the commands that run the model (generate, score).
#pragma once

#include <CLI/CLI.hpp>

#include "dist/ep_session.h"

namespace peerserve {

// Adds --ep, --ep-dispatch-dtype, --ep-transport, --ep-timeout-ms, --ep-split-rows,
// --eplb-interval and --eplb-redundant-experts to a command.
void add_ep_options(CLI::App* command, EpCli* cli);

}  // namespace peerserve

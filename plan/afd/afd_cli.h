// `peerserve plan afd`: the Attention/FFN ratio planner on the command line.
// Declared here for apps/cmd_plan.cc; defined in apps/plan_afd_command.cc because only apps/
// parses flags (plan/ itself never depends on CLI11).
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace peerserve::plan {

// Adds the `afd` subcommand to `plan` (the `peerserve plan` subcommand).
void add_plan_afd_command(CLI::App& plan);

}  // namespace peerserve::plan

// `peerserve plan placement`: expert placement from routing traces on the command line.
// Declared here for apps/cmd_plan.cc; defined in apps/plan_placement_command.cc because only
// apps/ parses flags and reads files named by the user.
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace peerserve::plan {

// Adds the `placement` subcommand to `plan` (the `peerserve plan` subcommand).
void add_plan_placement_command(CLI::App& plan);

}  // namespace peerserve::plan

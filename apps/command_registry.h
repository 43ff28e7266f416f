// Subcommands of the `peerserve` binary register themselves here, one file per command
// (apps/cmd_<name>.cc), so that adding a command never touches main.
//
//   namespace {
//   const bool kRegistered = peerserve::register_command([](CLI::App& root) {
//     auto* sub = root.add_subcommand("generate", "Generate text from a model");
//     auto options = std::make_shared<GenerateOptions>();
//     sub->add_option("--model", options->model_dir, "...")->required();
//     sub->callback([options] { peerserve::set_command_exit_code(run_generate(*options)); });
//   });
//   }  // namespace
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace peerserve {

using CommandSetup = std::function<void(CLI::App& root)>;

// Returns true so that it can initialise a namespace-scope constant.
bool register_command(CommandSetup setup);
void setup_registered_commands(CLI::App& root);

// Exit statuses: 0 success; kExitFailure for every error a command reports once it runs
// (its own option checks included); kExitUsage when the parser refuses the command line
// (an unknown option, a malformed or out-of-range value, a missing or excluded option).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The process exit code of the command that ran (default 0).
void set_command_exit_code(int code);
int command_exit_code();

}  // namespace peerserve

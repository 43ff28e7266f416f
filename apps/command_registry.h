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

// The process exit code of the command that ran (default 0).
void set_command_exit_code(int code);
int command_exit_code();

}  // namespace peerserve

// peerserve: one binary, one subcommand per role or tool (see README.md).
#include <CLI/CLI.hpp>

#include "apps/command_registry.h"
#include "apps/whole_number_validator.h"

int main(int argc, char** argv) {
  CLI::App app{"peerserve: a serving engine for DeepSeek-V3-family mixture-of-experts models"};
  app.set_version_flag("--version", PEERSERVE_VERSION);
  app.require_subcommand(1);
  peerserve::setup_registered_commands(app);
  peerserve::require_decimal_integers(app);
  CLI11_PARSE(app, argc, argv);
  return peerserve::command_exit_code();
}

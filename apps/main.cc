// peerserve: one binary, one subcommand per role or tool (see README.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/command_registry.h"
#include "apps/whole_number_validator.h"

int main(int argc, char** argv) {
  CLI::App app{"peerserve: a serving engine for DeepSeek-V3-family mixture-of-experts models"};
  app.set_version_flag("--version", PEERSERVE_VERSION);
  app.require_subcommand(1);
  peerserve::setup_registered_commands(app);
  peerserve::require_decimal_integers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // A mistyped option (--modle) leaves the one it meant missing, and CLI11 reports the
    // missing one ("--model is required"); the unknown option is what to fix.
    if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr) {
      if (std::vector<std::string> extras = app.remaining(/*recurse=*/true); !extras.empty()) {
        std::reverse(extras.begin(), extras.end());  // ExtrasError prints them in reverse
        app.exit(CLI::ExtrasError(std::move(extras)));
        return peerserve::kExitUsage;
      }
    }
    // --help and --version end parsing with status 0. Any other parse error is a command
    // line the parser refused: status 2, as argparse programs exit (CLI11's own codes are
    // 104-114), while a command that starts and fails exits 1 (command_registry.h).
    return app.exit(error) == 0 ? 0 : peerserve::kExitUsage;
  } catch (const std::exception& error) {
    // What no command turned into a Status (a thread pool that could not start, memory
    // exhausted inside a parallel loop): said, not a bare std::terminate.
    std::fprintf(stderr, "error: %s\n", error.what());
    return peerserve::kExitFailure;
  }
  return peerserve::command_exit_code();
}

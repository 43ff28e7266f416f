#include "apps/command_registry.h"

#include <vector>

namespace peerserve {
namespace {

std::vector<CommandSetup>& registry() {
  static std::vector<CommandSetup> setups;
  return setups;
}

int g_exit_code = 0;

}  // namespace

bool register_command(CommandSetup setup) {
  registry().push_back(std::move(setup));
  return true;
}

void setup_registered_commands(CLI::App& root) {
  for (auto& setup : registry()) setup(root);
}

void set_command_exit_code(int code) {
  g_exit_code = code;
}
int command_exit_code() {
  return g_exit_code;
}

}  // namespace peerserve

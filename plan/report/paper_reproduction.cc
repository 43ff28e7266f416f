#include "plan/report/paper_reproduction.h"

namespace peerserve::plan {

Result<const HardwareProfile*> find_hardware(const HardwareSet& hardware, const std::string& name) {
  auto it = hardware.find(name);
  if (it != hardware.end()) return &it->second;
  std::string available;
  for (const auto& [key, profile] : hardware) available += (available.empty() ? "" : ", ") + key;
  return not_found("the reproduction needs the hardware profile '" + name + "' (data/hardware/" +
                   name + ".json); loaded: " + (available.empty() ? "none" : available));
}

}  // namespace peerserve::plan

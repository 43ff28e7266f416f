// "host:port,host:port,..." as given to --prefill and --decode: the peers a role talks to.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace peerserve {

// The entries in order. InvalidArgument naming `flag` for an empty entry, one without a host
// or port, or one listed twice.
Result<std::vector<std::string>> parse_endpoint_list(const std::string& members,
                                                     const std::string& flag);

}  // namespace peerserve

// Token ids given on the command line as a comma-separated list ("0,17,523"), shared by
// the subcommands that take them (generate/score --prompt-ids, tokenize --decode).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve {

// Items may be surrounded by spaces or tabs; each must be a whole number in [0, 2^31).
// An empty item or an empty list is an error naming `flag`.
Result<std::vector<int32_t>> parse_token_id_list(std::string_view flag, const std::string& list);

}  // namespace peerserve

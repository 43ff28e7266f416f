#include "apps/token_id_list.h"

#include <cstdint>
#include <sstream>

namespace peerserve {

Result<std::vector<int32_t>> parse_token_id_list(std::string_view flag, const std::string& list) {
  const std::string name(flag);
  std::vector<int32_t> ids;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const size_t start = item.find_first_not_of(" \t");
    const size_t end = item.find_last_not_of(" \t");
    const std::string number =
        start == std::string::npos ? std::string() : item.substr(start, end - start + 1);
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(number, &used);
    } catch (...) {
      used = 0;
    }
    if (number.empty() || used != number.size() || value < 0 || value > INT32_MAX) {
      return invalid_argument(name + ": '" + number +
                              "' is not a token id (expected e.g. 0,17,523)");
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  // getline drops an empty last item: "1,2," would pass as "1,2".
  if (!list.empty() && list.back() == ',') {
    return invalid_argument(name + ": '' is not a token id (expected e.g. 0,17,523)");
  }
  if (ids.empty()) return invalid_argument(name + ": expected at least one token id");
  return ids;
}

}  // namespace peerserve

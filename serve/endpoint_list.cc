#include "serve/endpoint_list.h"

#include <algorithm>

#include "base/host_port.h"

namespace peerserve {

Result<std::vector<std::string>> parse_endpoint_list(const std::string& members,
                                                     const std::string& flag) {
  std::vector<std::string> endpoints;
  size_t start = 0;
  while (start <= members.size()) {
    const size_t comma = std::min(members.find(',', start), members.size());
    std::string endpoint = members.substr(start, comma - start);
    if (Status valid = check_host_port(endpoint, flag); !valid.ok()) {
      return endpoint == members ? valid
                                 : invalid_argument(valid.message() + " in '" + members + "'");
    }
    if (std::find(endpoints.begin(), endpoints.end(), endpoint) != endpoints.end()) {
      return invalid_argument(flag + " lists " + endpoint + " twice");
    }
    endpoints.push_back(std::move(endpoint));
    start = comma + 1;
  }
  return endpoints;
}

}  // namespace peerserve

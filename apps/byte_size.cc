#include "apps/byte_size.h"

#include <cctype>
#include <limits>
#include <map>

namespace peerserve {

Result<uint64_t> parse_byte_size(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return invalid_argument(flag + " '" + text +
                            "': expected a byte count such as 1073741824, 512M or 4G");
  };
  size_t pos = 0;
  uint64_t number = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    const uint64_t digit = static_cast<uint64_t>(text[pos] - '0');
    if (number > (std::numeric_limits<uint64_t>::max() - digit) / 10) return bad();
    number = number * 10 + digit;
    ++pos;
  }
  if (pos == 0) return bad();
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, int> kShift = {
      {"", 0},     {"b", 0},  {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},  {"mb", 20},
      {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30}, {"t", 40},   {"tb", 40}, {"tib", 40}};
  auto shift = kShift.find(unit);
  if (shift == kShift.end()) return bad();
  if (number > (std::numeric_limits<uint64_t>::max() >> shift->second)) return bad();
  return number << shift->second;
}

}  // namespace peerserve

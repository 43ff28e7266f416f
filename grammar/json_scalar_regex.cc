#include "grammar/json_scalar_regex.h"

#include <algorithm>

namespace peerserve::grammar {
namespace {

constexpr std::string_view kInteger = R"(-?(?:0|[1-9][0-9]*))";
// Numbers equal to zero, and numbers above zero (some non-zero digit, no sign).
// Exponents of at most two digits, as kJsonNumber's.
constexpr std::string_view kZero = R"(-?0(?:\.0+)?(?:[eE][+\-]?[0-9]{1,2})?)";
constexpr std::string_view kPositive =
    R"((?:[1-9][0-9]*(?:\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)(?:[eE][+\-]?[0-9]{1,2})?)";
constexpr std::string_view kDate =
    R"([0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-)"
    R"((?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|[12][0-9])))";
constexpr std::string_view kTime = R"((?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?)"
                                   R"((?:[zZ]|[+\-](?:[01][0-9]|2[0-3]):[0-5][0-9]))";
constexpr std::string_view kUuid =
    R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";

std::string any_digits(size_t count) {
  if (count == 0) return "";
  if (count == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(count) + "}";
}

std::string digit_range(char lo, char hi) {
  if (lo == hi) return std::string(1, lo);
  return std::string("[") + lo + "-" + hi + "]";
}

// Every decimal string from lo to hi, both of the same length: split at the first digit
// into the rest of lo's leading digit, the whole digits between, and hi's leading digit.
std::string same_length_range(const std::string& lo, const std::string& hi) {
  if (lo == hi) return lo;
  if (lo[0] == hi[0]) return lo.substr(0, 1) + same_length_range(lo.substr(1), hi.substr(1));
  const size_t rest = lo.size() - 1;
  const std::string lo_rest = lo.substr(1);
  const std::string hi_rest = hi.substr(1);
  const bool lo_rest_smallest = lo_rest == std::string(rest, '0');
  const bool hi_rest_largest = hi_rest == std::string(rest, '9');
  std::vector<std::string> alternatives;
  char middle_lo = static_cast<char>(lo[0] + 1);
  char middle_hi = static_cast<char>(hi[0] - 1);
  if (lo_rest_smallest) {
    middle_lo = lo[0];
  } else {
    alternatives.push_back(lo[0] + same_length_range(lo_rest, std::string(rest, '9')));
  }
  if (hi_rest_largest) middle_hi = hi[0];
  if (middle_lo <= middle_hi) {
    alternatives.push_back(digit_range(middle_lo, middle_hi) + any_digits(rest));
  }
  if (!hi_rest_largest) {
    alternatives.push_back(hi[0] + same_length_range(std::string(rest, '0'), hi_rest));
  }
  return regex_alternation(alternatives);
}

int64_t power_of_ten(size_t exponent) {
  int64_t value = 1;
  for (size_t i = 0; i < exponent; ++i) value *= 10;
  return value;
}

// Decimal integers (no sign, no leading zero) from lo (>= 0) to hi (absent: unbounded).
std::string non_negative_range(int64_t lo, std::optional<int64_t> hi) {
  const size_t lo_digits = std::to_string(lo).size();
  const size_t hi_digits = hi ? std::to_string(*hi).size() : lo_digits;
  std::vector<std::string> alternatives;
  for (size_t digits = lo_digits; digits <= hi_digits; ++digits) {
    const int64_t smallest = std::max(lo, digits == 1 ? int64_t{0} : power_of_ten(digits - 1));
    const int64_t largest = std::min(hi.value_or(INT64_MAX), power_of_ten(digits) - 1);
    alternatives.push_back(same_length_range(std::to_string(smallest), std::to_string(largest)));
  }
  if (!hi) alternatives.push_back("[1-9][0-9]{" + std::to_string(lo_digits) + ",}");
  return regex_alternation(alternatives);
}

}  // namespace

std::string regex_alternation(const std::vector<std::string>& alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(?:";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) out += '|';
    out += alternatives[i];
  }
  return out + ")";
}

std::string regex_repeat(const std::string& group, int64_t lo, int64_t hi) {
  if (hi == 0) return "";
  if (hi < 0) {
    if (lo == 0) return group + "*";
    if (lo == 1) return group + "+";
    return group + "{" + std::to_string(lo) + ",}";
  }
  if (lo == hi) return lo == 1 ? group : group + "{" + std::to_string(lo) + "}";
  if (lo == 0 && hi == 1) return group + "?";
  return group + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

std::string json_string_regex(int64_t min_length, int64_t max_length) {
  return "\"" + regex_repeat(std::string(kJsonStringChar), min_length, max_length) + "\"";
}

std::optional<std::string> json_string_format_regex(std::string_view format) {
  std::string body;
  if (format == "date") {
    body = kDate;
  } else if (format == "time") {
    body = kTime;
  } else if (format == "date-time") {
    body = std::string(kDate) + "[tT]" + std::string(kTime);
  } else if (format == "uuid") {
    body = kUuid;
  } else {
    return std::nullopt;
  }
  return "\"" + body + "\"";
}

std::string json_integer_regex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (!lo && !hi) return std::string(kInteger);
  std::vector<std::string> alternatives;
  if (!lo || *lo < 0) {
    // -m for m from max(1, -hi) to -lo.
    const int64_t magnitude_lo = hi ? std::max<int64_t>(1, -*hi) : 1;
    const std::optional<int64_t> magnitude_hi = lo ? std::optional<int64_t>(-*lo) : std::nullopt;
    if (!magnitude_hi || magnitude_lo <= *magnitude_hi) {
      alternatives.push_back("-" + non_negative_range(magnitude_lo, magnitude_hi));
    }
  }
  if (!hi || *hi >= 0) {
    const int64_t from = lo ? std::max<int64_t>(0, *lo) : 0;
    alternatives.push_back(non_negative_range(from, hi));
    if (from == 0) alternatives.push_back("-0");  // JSON's other spelling of zero
  }
  return regex_alternation(alternatives);
}

std::optional<std::string> json_number_regex(ZeroBound lower, ZeroBound upper) {
  if (lower == ZeroBound::kNone && upper == ZeroBound::kNone) return std::string(kJsonNumber);
  std::vector<std::string> alternatives;
  if (lower != ZeroBound::kExclusive && upper != ZeroBound::kExclusive) {
    alternatives.emplace_back(kZero);
  }
  if (upper == ZeroBound::kNone) alternatives.emplace_back(kPositive);
  if (lower == ZeroBound::kNone) alternatives.push_back("-" + std::string(kPositive));
  if (alternatives.empty()) return std::nullopt;
  return regex_alternation(alternatives);
}

}  // namespace peerserve::grammar

// Regexes for JSON scalars (strings, integers in a range, numbers against 0, string formats)
// and the two combinators the JSON schema converter builds its regexes with. The dialect is
// json_schema_regex.h's; every result can be concatenated without a group around it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peerserve::grammar {

// One character of a JSON string's text: a character JSON allows as itself, or an escape.
// \u escapes of UTF-16 surrogates are left out: a lone one is not text (nlohmann's parser, the
// server's own, refuses it), and a pair is one character where the regex would count two
// (characters beyond U+FFFF are written as themselves).
inline constexpr std::string_view kJsonStringChar =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))";
// Any JSON number whose exponent has at most two digits: a double holds every such number,
// where 5e-9691 parses as 0 (and passed an exclusive minimum of 0) and 1e400 overflows.
inline constexpr std::string_view kJsonNumber =
    R"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+\-]?[0-9]{1,2})?)";

// `(?:a|b|...)`, or the one alternative as it is; `alternatives` is not empty.
std::string regex_alternation(const std::vector<std::string>& alternatives);

// `group` (one regex atom) repeated lo..hi times; hi < 0: unbounded; hi == 0: "".
std::string regex_repeat(const std::string& group, int64_t lo, int64_t hi);

// A JSON string of min_length..max_length characters (max_length < 0: unbounded), where an
// escape counts as one character.
std::string json_string_regex(int64_t min_length, int64_t max_length);

// A quoted RFC 3339 "date" (days per month checked, February 29 in any year), "time" (with
// its offset), "date-time", or an RFC 4122 "uuid"; nullopt for other formats.
std::optional<std::string> json_string_format_regex(std::string_view format);

// The JSON integers from lo to hi (absent: open), exactly: plain form, no leading zeros, and
// "-0" when 0 is in range. lo <= hi when both are given; |lo|, |hi| < 1e17.
std::string json_integer_regex(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A bound at 0 for a number: absent, inclusive (>= 0 / <= 0) or exclusive (> 0 / < 0).
enum class ZeroBound { kNone, kInclusive, kExclusive };

// The JSON numbers within the lower and upper bounds at 0 (any fraction and exponent; a
// number is 0 when all its digits are); nullopt when none is.
std::optional<std::string> json_number_regex(ZeroBound lower, ZeroBound upper);

}  // namespace peerserve::grammar

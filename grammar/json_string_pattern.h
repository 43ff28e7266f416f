// A JSON Schema "pattern" (an ECMA-262 regex over a string's decoded value) rewritten as a
// regex over the string's JSON text between the quotes, in the dialect of the constrained-
// decoding engine (see json_schema_regex.h). The value's '"', '\' and control characters
// appear in JSON text as escapes, so every atom that could match one is rewritten to the
// escape; all other characters are matched as themselves. Only the canonical spelling of each
// character is accepted (the one nlohmann::json's dump() writes: "\n", not "\u000a"; "/",
// not "\/"), which is every text the model needs in order to write any matching value.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace peerserve::grammar {

// The regex for the JSON-encoded contents of strings whose value full-matches `pattern`. As
// in Outlines and vLLM, the pattern is anchored at both ends: a leading '^' and a trailing
// '$' are dropped. Accepted: literals, escapes (\d \D \w \W \s \S with ECMAScript's meaning,
// \n \r \t \f \v \0 \xHH \uHHHH, escaped punctuation), '.', classes, groups (capturing, named
// and (?:...), all made non-capturing), '|', and the quantifiers * + ? {n} {n,} {n,m} (n, m
// <= 1000; a lazy '?' after them is dropped, which changes nothing for a full match).
// Refused with InvalidArgument: anchors elsewhere, word boundaries, backreferences,
// lookarounds, flags, \p{...}, and an empty class '[]' or '[^]' (which means something else
// in Python's re).
Result<std::string> json_string_pattern_regex(std::string_view pattern);

}  // namespace peerserve::grammar

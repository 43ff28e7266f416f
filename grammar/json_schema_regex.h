// JSON Schema -> regular expression, for structured outputs (vLLM's guided_json, OpenAI's
// response_format {"type": "json_schema"} and {"type": "json_object"}), in the spirit of
// Outlines' build_regex_from_schema. The regex full-matches the compact JSON texts that are
// instances of the schema, with options.whitespace allowed between tokens; the decoding
// engine compiles it to a DFA and masks the tokens that would leave it.
//
// Dialect of the result (what the engine reads; it means the same in ECMAScript std::regex
// and Python's re): literals (UTF-8 passes through), escapes, [..] / [^..] classes, (?:..),
// '|', * + ? {n} {n,} {n,m} with n, m <= 1000; no anchors, no '.'.
//
// Supported:
//  - type: string, integer, number, boolean, null, object, array, or a list of them; with no
//    "type", the types whose keywords appear (properties -> object, ...), else any value.
//    "nullable": true (OpenAPI) adds null.
//  - string: minLength/maxLength (<= 1000, counted in characters, an escape counts one),
//    pattern (see json_string_pattern.h), format date / time / date-time (RFC 3339; February
//    29 is allowed in any year, second 60 never) / uuid. No \u escape of a UTF-16 surrogate
//    (characters past U+FFFF are written as themselves).
//  - integer: minimum/maximum/exclusiveMinimum/exclusiveMaximum (both drafts' forms), exact,
//    for bounds within +-1e15. number: only bounds equal to 0 (>= 0, > 0, <= 0, < 0) are
//    exactly expressible, others are refused. Exponents have at most two digits.
//  - enum/const with any JSON values (matched as their compact dump(), whitespace allowed
//    where the option puts it); with other keywords beside them, only the values the rest of
//    the schema accepts (for values of the types they have).
//  - object: properties in the order the JSON object iterates them (nlohmann::json sorts keys
//    alphabetically; pass an nlohmann::ordered_json to keep the order written), required
//    ones present, optional ones each present or absent; a required name missing from
//    properties comes last, valued by additionalProperties. No other keys appear, whatever
//    additionalProperties says (a subset of the instances when it allows more). With no
//    properties and no required: additionalProperties false -> {}, a schema -> any keys with
//    such values, absent or true -> any object. unevaluatedProperties false, with no
//    additionalProperties, counts as additionalProperties false (allOf and $ref are merged
//    by then).
//  - array: items, prefixItems (or draft-4 items as a list with additionalItems),
//    minItems/maxItems (<= 1000). No items -> any values.
//  - anyOf and oneOf (as anyOf), allOf (members merged keyword by keyword; one member's
//    additionalProperties applies to the properties only another lists, its items to another's
//    prefixItems), $ref to a JSON
//    pointer inside the schema ("#", "#/$defs/x", "#/definitions/x", ...), siblings of $ref
//    and anyOf merged into it. Recursion through $ref is expanded until max_nesting; there an
//    alternative, an optional property or an array's further items that would need more
//    depth are dropped; an error only if the schema then has no instance.
//  - annotations are ignored, as are keywords this file does not know (the JSON Schema rule).
// max_nesting counts every object and array, empty ones too: with 2, {"a":[1]} matches and
// {"a":[[]]} does not. A value of any type ({}, true, no type keywords) nests at most 4 deep
// (5 is past the automaton's bounds).
// Refused (InvalidArgument, naming the JSON pointer of the schema and the keyword): not,
// if/then/else, patternProperties, propertyNames, dependentRequired, dependentSchemas,
// dependencies, multipleOf, contains, minProperties > 0, maxProperties, uniqueItems true,
// unevaluatedItems, unevaluatedProperties other than false, $dynamicRef, $recursiveRef,
// other formats, numeric bounds other than the above, pattern with minLength/maxLength, format
// with either, a $ref outside the document, bad keyword values, a schema nested deeper than
// 64 levels (the converter's own recursion: $ref, allOf, anyOf, subschemas), a schema with no
// instance within max_nesting, and a regex over 1 MiB.
// Integers are matched in plain form only ("1", not "1.0" or "1e0").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve::grammar {

struct JsonRegexOptions {
  // Depth bound for nested objects and arrays (a top-level object is depth 1), including
  // inside "any JSON value"; >= 0. At 5, json_object's automaton takes ~0.3 s to build (~1,400
  // states once minimized); at 6, 2.2 s, and more states than RegexLimits allows while it is
  // built (4x per level).
  int max_nesting = 5;
  // Regex put between JSON tokens (after '{', '[', ',', ':' and before '}', ']'), verbatim.
  // One from a request must pass check_whitespace_pattern.
  std::string whitespace = "[ ]?";
};

// Whether `pattern` may be JsonRegexOptions::whitespace: at most kMaxWhitespacePatternBytes,
// and a regular expression by itself (grammar/regex_automaton.h), so that between tokens it
// cannot reach into what is around it (as `)|(?:` would). A longer one could make even the
// shallowest json_object_regex outgrow 1 MiB.
inline constexpr size_t kMaxWhitespacePatternBytes = 256;
Status check_whitespace_pattern(std::string_view pattern);

// The regex for instances of `schema`.
Result<std::string> json_schema_to_regex(const nlohmann::json& schema,
                                         const JsonRegexOptions& options = {});
// The same with properties in the order they were written.
Result<std::string> json_schema_to_regex(const nlohmann::ordered_json& schema,
                                         const JsonRegexOptions& options = {});

// Any JSON object (OpenAI's response_format {"type": "json_object"}), nesting bounded by
// options.max_nesting, lowered (to at least 1) as far as needed for the regex to fit 1 MiB.
// options.whitespace must pass check_whitespace_pattern.
std::string json_object_regex(const JsonRegexOptions& options = {});

}  // namespace peerserve::grammar

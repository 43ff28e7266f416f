// Reading a JSON Schema's keywords, for json_schema_regex: annotations and refused keywords,
// the types a schema allows, counts and numeric bounds, and merging two schemas into one
// (allOf, and the siblings of $ref and anyOf). Errors name the JSON pointer of the schema
// that holds the keyword: "json schema at /properties/age: 'minimum' must be a number".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve::grammar {

// Schemas are read in this type so that properties keep the order they came in.
using SchemaJson = nlohmann::ordered_json;

// Repetition counts above this are refused (the regex dialect's limit).
inline constexpr int64_t kMaxSchemaCount = 1000;

// "json schema at <path>: " (the root is "/").
std::string schema_where(const std::string& path);
// InvalidArgument "json schema at <path>: <what>".
Status schema_error(const std::string& path, const std::string& what);
// The schema has no instance within the bounds (schema false, nesting beyond max_nesting):
// OutOfRange, so that the converter can drop an alternative, an optional property or an
// optional array item in its place, and report InvalidArgument if nothing is left.
Status no_instance(const std::string& path, const std::string& what);
bool is_no_instance(const Status& status);

// `path` extended by one JSON pointer token (RFC 6901 escaping), or by a key and an index.
std::string pointer_child(const std::string& path, std::string_view key);
std::string pointer_child(const std::string& path, std::string_view key, size_t index);

bool is_annotation(std::string_view keyword);
// Whether the schema has a keyword other than `keyword` and annotations.
bool constrains_besides(const SchemaJson& schema, std::string_view keyword);
// InvalidArgument naming the first keyword that constrains in a way not supported (not,
// if/then/else, patternProperties, multipleOf, uniqueItems true, ...).
Status check_keywords(const SchemaJson& schema, const std::string& path);

enum TypeBits : unsigned {
  kNullType = 1,
  kBooleanType = 2,
  kObjectType = 4,
  kArrayType = 8,
  kNumberType = 16,
  kStringType = 32,
  kIntegerType = 64,
  kAllTypes = 127,
};

// The types the schema allows: its "type"; without one (and with `infer`), the types its
// keywords are about (properties -> object, ...), else all; "nullable": true adds null.
Result<unsigned> schema_types(const SchemaJson& schema, const std::string& path, bool infer);
// Whether the schema has a keyword that applies to one type only.
bool has_type_keywords(const SchemaJson& schema);
// Whether `value` has one of `types` (an integral float counts as an integer).
bool has_type(const SchemaJson& value, unsigned types);

// A count keyword (minLength, maxItems, ...): absent, or an integer in [0, kMaxSchemaCount].
Result<std::optional<int64_t>> schema_count(const SchemaJson& schema, const std::string& keyword,
                                            const std::string& path);

struct Bound {
  double value = 0;
  bool exclusive = false;
  std::string keyword;  // the one it came from, for errors
};

// The tighter of minimum / exclusiveMinimum (lower) or of maximum / exclusiveMaximum, in the
// draft-4 (boolean exclusive*) and later (numeric exclusive*) forms.
Result<std::optional<Bound>> schema_bound(const SchemaJson& schema, const std::string& path,
                                          bool lower);

// One schema with the keywords of both (their allOf): types intersected, required lists and
// properties united (a property in both gets an allOf of the two), tighter bounds, common
// enum values; other keywords in both must be equal. `a` and `b` are objects without $ref or
// allOf.
Result<SchemaJson> merge_schemas(SchemaJson a, const SchemaJson& b, const std::string& path);

}  // namespace peerserve::grammar

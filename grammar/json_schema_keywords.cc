#include "grammar/json_schema_keywords.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace peerserve::grammar {
namespace {

constexpr std::array<std::string_view, 18> kAnnotations = {
    "title",           "description",   "default",
    "examples",        "$schema",       "$id",
    "$comment",        "deprecated",    "readOnly",
    "writeOnly",       "$defs",         "definitions",
    "$anchor",         "discriminator", "contentMediaType",
    "contentEncoding", "contentSchema", "$vocabulary"};

// Keywords that constrain in ways a regex here does not express.
constexpr std::array<std::string_view, 17> kRefused = {"not",
                                                       "if",
                                                       "then",
                                                       "else",
                                                       "patternProperties",
                                                       "propertyNames",
                                                       "dependentRequired",
                                                       "dependentSchemas",
                                                       "dependencies",
                                                       "multipleOf",
                                                       "contains",
                                                       "minContains",
                                                       "maxContains",
                                                       "maxProperties",
                                                       "unevaluatedItems",
                                                       "$dynamicRef",
                                                       "$recursiveRef"};

constexpr std::array<std::pair<std::string_view, unsigned>, 7> kTypeNames = {
    {{"null", kNullType},
     {"boolean", kBooleanType},
     {"object", kObjectType},
     {"array", kArrayType},
     {"number", kNumberType},
     {"string", kStringType},
     {"integer", kIntegerType}}};

// The keywords that say which type a schema without "type" is about.
constexpr std::array<std::pair<std::string_view, unsigned>, 16> kTypeKeywords = {
    {{"minLength", kStringType},
     {"maxLength", kStringType},
     {"pattern", kStringType},
     {"format", kStringType},
     {"minimum", kNumberType},
     {"maximum", kNumberType},
     {"exclusiveMinimum", kNumberType},
     {"exclusiveMaximum", kNumberType},
     {"properties", kObjectType},
     {"required", kObjectType},
     {"additionalProperties", kObjectType},
     {"items", kArrayType},
     {"prefixItems", kArrayType},
     {"additionalItems", kArrayType},
     {"minItems", kArrayType},
     {"maxItems", kArrayType}}};

// The "type" keyword as bits; kAllTypes when absent.
Result<unsigned> parse_type(const SchemaJson& schema, const std::string& path) {
  if (!schema.contains("type")) return unsigned{kAllTypes};
  const SchemaJson& type = schema.at("type");
  std::vector<const SchemaJson*> names;
  if (type.is_string()) names.push_back(&type);
  if (type.is_array()) {
    for (const auto& name : type) names.push_back(&name);
  }
  if (names.empty()) {
    return schema_error(path, "'type' must be a type name or a non-empty array of them");
  }
  unsigned bits = 0;
  for (const SchemaJson* name : names) {
    const auto found = std::find_if(kTypeNames.begin(), kTypeNames.end(), [&](const auto& entry) {
      return name->is_string() && name->get_ref<const std::string&>() == entry.first;
    });
    if (found == kTypeNames.end()) {
      return schema_error(path, "'type' has an unknown type " + name->dump());
    }
    bits |= found->second;
  }
  return bits;
}

bool is_one_of(std::string_view key, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

}  // namespace

std::string schema_where(const std::string& path) {
  return "json schema at " + (path.empty() ? std::string("/") : path) + ": ";
}

Status schema_error(const std::string& path, const std::string& what) {
  return invalid_argument(schema_where(path) + what);
}

Status no_instance(const std::string& path, const std::string& what) {
  return out_of_range(schema_where(path) + what);
}

bool is_no_instance(const Status& status) {
  return status.code() == StatusCode::kOutOfRange;
}

std::string pointer_child(const std::string& path, std::string_view key) {
  std::string out = path + "/";
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string pointer_child(const std::string& path, std::string_view key, size_t index) {
  return pointer_child(path, key) + "/" + std::to_string(index);
}

bool is_annotation(std::string_view keyword) {
  return std::find(kAnnotations.begin(), kAnnotations.end(), keyword) != kAnnotations.end();
}

bool constrains_besides(const SchemaJson& schema, std::string_view keyword) {
  for (const auto& [k, v] : schema.items()) {
    if (k != keyword && !is_annotation(k)) return true;
  }
  return false;
}

Status check_keywords(const SchemaJson& schema, const std::string& path) {
  for (const auto& [k, v] : schema.items()) {
    if (std::find(kRefused.begin(), kRefused.end(), k) != kRefused.end()) {
      return schema_error(path, "'" + k + "' is not supported");
    }
    if (k == "uniqueItems" && v != false) {
      return schema_error(path, "'uniqueItems': true is not supported");
    }
    if (k == "unevaluatedProperties" && v != false) {
      return schema_error(path, "'unevaluatedProperties' other than false is not supported");
    }
    if (k == "minProperties" && !(v.is_number() && v == 0)) {
      return schema_error(path, "'minProperties' other than 0 is not supported");
    }
  }
  return ok_status();
}

Result<unsigned> schema_types(const SchemaJson& schema, const std::string& path, bool infer) {
  PS_ASSIGN_OR_RETURN(unsigned bits, parse_type(schema, path));
  if (infer && !schema.contains("type")) {
    unsigned inferred = 0;
    for (const auto& [keyword, bit] : kTypeKeywords) {
      if (schema.contains(keyword)) inferred |= bit;
    }
    if (inferred != 0) bits = inferred;
  }
  if (schema.contains("nullable") && schema.at("nullable") == true) bits |= kNullType;
  return bits;
}

bool has_type_keywords(const SchemaJson& schema) {
  return std::any_of(kTypeKeywords.begin(), kTypeKeywords.end(),
                     [&](const auto& entry) { return schema.contains(entry.first); });
}

bool has_type(const SchemaJson& value, unsigned types) {
  unsigned bit = 0;
  if (value.is_null()) bit = kNullType;
  if (value.is_boolean()) bit = kBooleanType;
  if (value.is_string()) bit = kStringType;
  if (value.is_object()) bit = kObjectType;
  if (value.is_array()) bit = kArrayType;
  if (value.is_number()) {
    const double d = value.get<double>();
    const bool integral = value.is_number_integer() || (std::isfinite(d) && d == std::floor(d));
    bit = kNumberType | (integral ? kIntegerType : 0u);
  }
  return (bit & types) != 0;
}

Result<std::optional<int64_t>> schema_count(const SchemaJson& schema, const std::string& keyword,
                                            const std::string& path) {
  if (!schema.contains(keyword)) return std::optional<int64_t>();
  const SchemaJson& v = schema.at(keyword);
  const double d = v.is_number() ? v.get<double>() : -1;
  if (d < 0 || d != std::floor(d)) {
    return schema_error(path, "'" + keyword + "' must be a non-negative integer");
  }
  if (d > static_cast<double>(kMaxSchemaCount)) {
    return schema_error(
        path, "'" + keyword + "' above " + std::to_string(kMaxSchemaCount) + " is not supported");
  }
  return std::optional<int64_t>(static_cast<int64_t>(d));
}

Result<std::optional<Bound>> schema_bound(const SchemaJson& schema, const std::string& path,
                                          bool lower) {
  const std::string inclusive = lower ? "minimum" : "maximum";
  const std::string exclusive = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  std::optional<Bound> out;
  bool draft4_exclusive = false;
  if (schema.contains(exclusive)) {
    const SchemaJson& v = schema.at(exclusive);
    if (v.is_boolean()) {
      draft4_exclusive = v.get<bool>();
    } else if (v.is_number()) {
      out = Bound{v.get<double>(), true, exclusive};
    } else {
      return schema_error(path, "'" + exclusive + "' must be a number");
    }
  }
  if (schema.contains(inclusive)) {
    const SchemaJson& v = schema.at(inclusive);
    if (!v.is_number()) return schema_error(path, "'" + inclusive + "' must be a number");
    const Bound b{v.get<double>(), draft4_exclusive, inclusive};
    if (!out || (lower ? b.value > out->value : b.value < out->value)) out = b;
  }
  if (out && !std::isfinite(out->value)) {
    return schema_error(path, "'" + out->keyword + "' must be finite");
  }
  return out;
}

namespace {

// `sub` where `extra` applies too: extra's true adds nothing, false leaves nothing.
SchemaJson constrained_by(const SchemaJson& sub, const SchemaJson& extra) {
  if (extra == true) return sub;
  if (extra == false) return false;
  return SchemaJson{{"allOf", SchemaJson::array({sub, extra})}};
}

// What one side says of the other's members before the keywords are merged: its
// additionalProperties applies to the properties only the other lists, and its items (without
// prefixItems) to the other's prefixItems. Merged key by key, {"properties": {"a"},
// "additionalProperties": false} and {"properties": {"b"}} let {"b": ...} through.
void constrain_members(SchemaJson& mine, const SchemaJson& other) {
  if (const auto extra = other.find("additionalProperties");
      extra != other.end() && (extra->is_boolean() || extra->is_object())) {
    if (auto listed = mine.find("properties"); listed != mine.end() && listed->is_object()) {
      const auto theirs = other.find("properties");
      for (auto& [name, sub] : listed->items()) {
        const bool also_theirs =
            theirs != other.end() && theirs->is_object() && theirs->contains(name);
        if (!also_theirs) sub = constrained_by(sub, *extra);
      }
    }
  }
  if (const auto items = other.find("items");
      items != other.end() && !items->is_array() && !other.contains("prefixItems")) {
    if (auto prefix = mine.find("prefixItems"); prefix != mine.end() && prefix->is_array()) {
      for (auto& item : *prefix) item = constrained_by(item, *items);
    }
  }
}

}  // namespace

Result<SchemaJson> merge_schemas(SchemaJson a, const SchemaJson& b_in, const std::string& path) {
  SchemaJson b = b_in;
  constrain_members(b, a);
  constrain_members(a, b_in);
  for (const auto& [k, v] : b.items()) {
    if (is_annotation(k)) continue;
    if (!a.contains(k)) {
      a[k] = v;
      continue;
    }
    SchemaJson& mine = a[k];
    if (mine == v) continue;
    if (k == "type") {
      PS_ASSIGN_OR_RETURN(const unsigned left, parse_type(a, path));
      PS_ASSIGN_OR_RETURN(const unsigned right, parse_type(b, path));
      unsigned both = left & right;
      if ((left & kNumberType) && (right & kIntegerType)) both |= kIntegerType;
      if ((right & kNumberType) && (left & kIntegerType)) both |= kIntegerType;
      if (both == 0) return no_instance(path, "the merged 'type' lists share no type");
      mine = SchemaJson::array();
      for (const auto& [name, bit] : kTypeNames) {
        if (both & bit) mine.push_back(std::string(name));
      }
    } else if (k == "required" && mine.is_array() && v.is_array()) {
      for (const auto& name : v) {
        if (std::find(mine.begin(), mine.end(), name) == mine.end()) mine.push_back(name);
      }
    } else if (k == "properties" && mine.is_object() && v.is_object()) {
      for (const auto& [name, sub] : v.items()) {
        if (!mine.contains(name)) {
          mine[name] = sub;
        } else if (mine[name] != sub) {
          mine[name] = SchemaJson{{"allOf", SchemaJson::array({mine[name], sub})}};
        }
      }
    } else if (is_one_of(k, {"items", "additionalProperties"}) && !mine.is_array() &&
               !v.is_array()) {
      if (mine == false || v == false) {
        mine = false;
      } else if (mine == true) {
        mine = v;
      } else if (v != true) {
        mine = SchemaJson{{"allOf", SchemaJson::array({mine, v})}};
      }
    } else if (is_one_of(k, {"minimum", "minLength", "minItems", "exclusiveMinimum"}) &&
               mine.is_number() && v.is_number()) {
      if (v.get<double>() > mine.get<double>()) mine = v;
    } else if (is_one_of(k, {"maximum", "maxLength", "maxItems", "exclusiveMaximum"}) &&
               mine.is_number() && v.is_number()) {
      if (v.get<double>() < mine.get<double>()) mine = v;
    } else if (k == "enum" && mine.is_array() && v.is_array()) {
      SchemaJson common = SchemaJson::array();
      for (const auto& item : mine) {
        if (std::find(v.begin(), v.end(), item) != v.end()) common.push_back(item);
      }
      if (common.empty()) return no_instance(path, "the merged 'enum' lists share no value");
      mine = std::move(common);
    } else if (k == "const") {
      return no_instance(path, "two different 'const' values");
    } else {
      return schema_error(path, "cannot combine two different '" + k +
                                    "' (from allOf, anyOf members or $ref siblings)");
    }
  }
  return a;
}

}  // namespace peerserve::grammar

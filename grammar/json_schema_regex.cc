#include "grammar/json_schema_regex.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/json_nesting.h"
#include "grammar/json_scalar_regex.h"
#include "grammar/json_schema_keywords.h"
#include "grammar/json_string_pattern.h"
#include "grammar/regex_automaton.h"

namespace peerserve::grammar {
namespace {

constexpr int kMaxSchemaDepth = 64;
// Bounds the recursive copies and comparisons of schema values (merges, enum values).
constexpr size_t kMaxJsonNesting = 512;
constexpr size_t kMaxRegexBytes = size_t{1} << 20;
// Every converted subschema is one call; a budget keeps hostile recursive schemas cheap.
constexpr int kMaxCalls = 100000;
// Integer bounds are exact up to here (a double holds every integer below 2^53).
constexpr double kMaxIntegerBound = 1e15;

class Converter {
 public:
  Converter(const SchemaJson& root, const JsonRegexOptions& options)
      : root_(root),
        ws_(options.whitespace.find('|') == std::string::npos ? options.whitespace
                                                              : "(?:" + options.whitespace + ")") {}

  // The regex for `schema` (at JSON pointer `path`) with objects and arrays nested at most
  // `nesting` deep; `depth` counts the converter's own recursion.
  Result<std::string> value(const SchemaJson& schema, const std::string& path, int nesting,
                            int depth) {
    if (depth > kMaxSchemaDepth || ++calls_ > kMaxCalls) {
      return schema_error(path, "schema nested deeper than " + std::to_string(kMaxSchemaDepth) +
                                    " levels, or too many subschemas ($ref, allOf, anyOf, "
                                    "properties and items count)");
    }
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return any_value(nesting, path);
      return no_instance(path, "schema false has no instance");
    }
    if (!schema.is_object()) return schema_error(path, "a schema must be an object or a boolean");
    if (schema.contains("allOf") ||
        (schema.contains("$ref") && constrains_besides(schema, "$ref"))) {
      PS_ASSIGN_OR_RETURN(SchemaJson flat, flatten(schema, path, depth));
      return value(flat, path, nesting, depth + 1);
    }
    if (schema.contains("$ref")) {
      std::string target_path;
      PS_ASSIGN_OR_RETURN(const SchemaJson* target, resolve(schema, path, target_path));
      return value(*target, target_path, nesting, depth + 1);
    }
    PS_ASSIGN_OR_RETURN(std::string regex, flat_value(schema, path, nesting, depth));
    return bounded(std::move(regex), path);
  }

  // Any JSON value with objects and arrays nested at most `nesting` deep.
  // At most kMaxAnyValueNesting: nested 5 deep it is 234 KB and more automaton states than
  // RegexLimits allows, so a schema of any value ({}, true) at the top could not be used.
  // (Any object and any array at 5 hold any values at 4, and fit.)
  static constexpr int kMaxAnyValueNesting = 4;
  Result<std::string> any_value(int nesting, const std::string& path) {
    nesting = std::clamp(nesting, 0, kMaxAnyValueNesting);
    while (any_values_.size() <= static_cast<size_t>(nesting)) {
      std::string any =
          "(?:" + json_string_regex(0, -1) + "|" + std::string(kJsonNumber) + "|true|false|null";
      if (!any_values_.empty()) {
        const std::string& inner = any_values_.back();
        any += "|" + object_of(inner) + "|" + array_of(inner);
      }
      any += ")";
      if (any.size() > kMaxRegexBytes) {
        return schema_error(path, "any JSON value nested " + std::to_string(any_values_.size()) +
                                      " deep needs a regex over 1 MiB; lower max_nesting");
      }
      any_values_.push_back(std::move(any));
    }
    return any_values_[nesting];
  }

  // Any object, nesting >= 1 (the object itself is one level).
  Result<std::string> any_object(int nesting, const std::string& path) {
    PS_ASSIGN_OR_RETURN(std::string inner, any_value(nesting - 1, path));
    return bounded(object_of(inner), path);
  }

 private:
  // {"key": value, ...} with any keys.
  std::string object_of(const std::string& value) const {
    const std::string pair = json_string_regex(0, -1) + ":" + ws_ + value;
    return "\\{" + ws_ + "(?:" + pair + "(?:," + ws_ + pair + ")*" + ws_ + ")?\\}";
  }

  std::string array_of(const std::string& value) const {
    return "\\[" + ws_ + "(?:" + value + "(?:," + ws_ + value + ")*" + ws_ + ")?\\]";
  }

  static Status too_deep(const std::string& path) {
    return no_instance(path, "objects and arrays nested deeper than max_nesting");
  }

  static Result<std::string> bounded(std::string regex, const std::string& path) {
    if (regex.size() > kMaxRegexBytes) return schema_error(path, "the regex grows over 1 MiB");
    return regex;
  }

  // The schema a "$ref" (a JSON pointer into this document) names.
  Result<const SchemaJson*> resolve(const SchemaJson& schema, const std::string& path,
                                    std::string& target_path) const {
    const SchemaJson& ref = schema.at("$ref");
    if (!ref.is_string()) return schema_error(path, "'$ref' must be a string");
    const auto& text = ref.get_ref<const std::string&>();
    if (!text.starts_with("#")) {
      return schema_error(path, "'$ref' " + text + " is outside this schema (only '#...')");
    }
    // The fragment is URI-encoded: %XX spells a byte.
    std::string pointer;
    for (size_t i = 1; i < text.size(); ++i) {
      if (text[i] == '%' && i + 2 < text.size() &&
          std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
        pointer += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pointer += text[i];
      }
    }
    try {
      const SchemaJson* target = &root_.at(SchemaJson::json_pointer(pointer));
      target_path = pointer;
      return target;
    } catch (const SchemaJson::exception&) {
      return schema_error(path, "'$ref' " + text + " does not resolve in this schema");
    }
  }

  // The schema with $ref and allOf replaced by the keywords of what they name.
  Result<SchemaJson> flatten(const SchemaJson& schema, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return schema_error(path, "$ref or allOf nested too deep");
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return SchemaJson::object();
      return no_instance(path, "schema false has no instance");
    }
    if (!schema.is_object()) return schema_error(path, "a schema must be an object or a boolean");
    // Every schema here is part of the root, whose nesting json_schema_to_regex checked. The
    // definitions are not copied: $ref resolves in the root, and copying a large $defs at each
    // $ref with a sibling keyword made a 65 KB schema take 6.9 s.
    SchemaJson out = SchemaJson::object();
    for (const auto& [k, v] : schema.items()) {
      if (k != "$ref" && k != "allOf" && k != "$defs" && k != "definitions") out[k] = v;
    }
    if (schema.contains("$ref")) {
      std::string target_path;
      PS_ASSIGN_OR_RETURN(const SchemaJson* target, resolve(schema, path, target_path));
      PS_ASSIGN_OR_RETURN(SchemaJson flat, flatten(*target, target_path, depth + 1));
      PS_ASSIGN_OR_RETURN(out, merge_schemas(std::move(flat), out, path));
    }
    if (schema.contains("allOf")) {
      const SchemaJson& members = schema.at("allOf");
      if (!members.is_array() || members.empty()) {
        return schema_error(path, "'allOf' must be a non-empty array");
      }
      for (size_t i = 0; i < members.size(); ++i) {
        const std::string member_path = pointer_child(path, "allOf", i);
        PS_ASSIGN_OR_RETURN(SchemaJson flat, flatten(members[i], member_path, depth + 1));
        PS_ASSIGN_OR_RETURN(out, merge_schemas(std::move(out), flat, path));
      }
    }
    return out;
  }

  // A schema without $ref and allOf.
  Result<std::string> flat_value(const SchemaJson& schema, const std::string& path, int nesting,
                                 int depth) {
    PS_RETURN_IF_ERROR(check_keywords(schema, path));
    const bool any_of = schema.contains("anyOf");
    if (any_of && schema.contains("oneOf")) {
      return schema_error(path, "both 'anyOf' and 'oneOf' are not supported");
    }
    if (any_of || schema.contains("oneOf")) {
      return alternatives(schema, path, any_of ? "anyOf" : "oneOf", nesting, depth);
    }
    if (schema.contains("enum") || schema.contains("const")) {
      return enum_regex(schema, path, nesting, depth);
    }
    PS_ASSIGN_OR_RETURN(const unsigned types, schema_types(schema, path, true));
    if (types == kAllTypes && !has_type_keywords(schema)) return any_value(nesting, path);
    std::vector<std::string> regexes;
    std::optional<Status> dropped;
    auto add = [&](Result<std::string> regex) -> Status {
      if (regex.ok()) {
        regexes.push_back(std::move(regex).value());
      } else if (is_no_instance(regex.status())) {
        if (!dropped) dropped = regex.status();
      } else {
        return regex.status();
      }
      return ok_status();
    };
    if (types & kNullType) regexes.emplace_back("null");
    if (types & kBooleanType) {
      regexes.emplace_back("true");
      regexes.emplace_back("false");
    }
    if (types & kNumberType) {
      PS_RETURN_IF_ERROR(add(number_regex(schema, path)));  // integers are numbers too
    } else if (types & kIntegerType) {
      PS_RETURN_IF_ERROR(add(integer_regex(schema, path)));
    }
    if (types & kStringType) PS_RETURN_IF_ERROR(add(string_regex(schema, path)));
    if (types & kObjectType) PS_RETURN_IF_ERROR(add(object_regex(schema, path, nesting, depth)));
    if (types & kArrayType) PS_RETURN_IF_ERROR(add(array_regex(schema, path, nesting, depth)));
    if (regexes.empty()) return *dropped;
    return regex_alternation(regexes);
  }

  // anyOf / oneOf: any member (oneOf's "exactly one" is not checked), each merged with the
  // sibling keywords; members without an instance within the bounds are left out.
  Result<std::string> alternatives(const SchemaJson& schema, const std::string& path,
                                   const std::string& key, int nesting, int depth) {
    const SchemaJson& members = schema.at(key);
    if (!members.is_array() || members.empty()) {
      return schema_error(path, "'" + key + "' must be a non-empty array");
    }
    const bool merge_siblings = constrains_besides(schema, key);
    SchemaJson siblings = schema;
    siblings.erase(key);
    std::vector<std::string> regexes;
    std::optional<Status> dropped;
    size_t total = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      const std::string member_path = pointer_child(path, key, i);
      Result<std::string> regex = [&]() -> Result<std::string> {
        if (!merge_siblings) return value(members[i], member_path, nesting, depth + 1);
        PS_ASSIGN_OR_RETURN(SchemaJson flat, flatten(members[i], member_path, depth + 1));
        PS_ASSIGN_OR_RETURN(SchemaJson merged, merge_schemas(siblings, flat, member_path));
        return value(merged, member_path, nesting, depth + 1);
      }();
      if (!regex.ok()) {
        if (!is_no_instance(regex.status())) return regex.status();
        if (!dropped) dropped = regex.status();
        continue;
      }
      total += regex->size();
      if (total > kMaxRegexBytes) return schema_error(path, "the regex grows over 1 MiB");
      regexes.push_back(std::move(regex).value());
    }
    if (regexes.empty()) return *dropped;
    return regex_alternation(regexes);
  }

  // A JSON value as a regex: its compact text, whitespace allowed where the options put it.
  std::string literal(const SchemaJson& v) const {
    if (!v.is_structured()) return escape_regex(v.dump());
    const bool object = v.is_object();
    std::string out = (object ? "\\{" : "\\[") + ws_;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it != v.begin()) out += "," + ws_;
      if (object) out += escape_regex(SchemaJson(it.key()).dump()) + ":" + ws_;
      out += literal(*it);
    }
    return out + ws_ + (object ? "\\}" : "\\]");
  }

  // enum / const: the values of the schema's type. With other keywords beside them
  // (maxLength, minimum, pattern, properties, ...), only the values the rest of the schema
  // accepts, as the regex of the rest reads their compact text: alone, {"enum": ["a", "abcd"],
  // "maxLength": 2} let "abcd" through.
  Result<std::string> enum_regex(const SchemaJson& schema, const std::string& path, int nesting,
                                 int depth) {
    std::shared_ptr<const RegexAutomaton> rest;
    bool others = false;
    for (const auto& [k, v] : schema.items()) {
      others = others || (k != "enum" && k != "const" && k != "type" && !is_annotation(k));
    }
    if (others) {
      SchemaJson without = schema;
      without.erase("enum");
      without.erase("const");
      if (!without.contains("type")) {
        // The values' own types: the rest would otherwise take its type from its keywords
        // (maxLength: a string), and a keyword says nothing of values of other types.
        SchemaJson types = SchemaJson::array();
        auto add = [&](const SchemaJson& v) {
          const char* name = v.is_null()             ? "null"
                             : v.is_boolean()        ? "boolean"
                             : v.is_number_integer() ? "integer"
                             : v.is_number()         ? "number"
                             : v.is_string()         ? "string"
                             : v.is_object()         ? "object"
                                                     : "array";
          if (std::find(types.begin(), types.end(), name) == types.end()) types.push_back(name);
        };
        if (const auto list = schema.find("enum"); list != schema.end() && list->is_array()) {
          for (const auto& v : *list) add(v);
        }
        if (const auto single = schema.find("const"); single != schema.end()) add(*single);
        without["type"] = std::move(types);
      }
      Result<std::string> rest_regex = value(without, path, nesting, depth + 1);
      if (!rest_regex.ok()) return rest_regex.status();  // no instance: no value passes either
      Result<std::shared_ptr<const RegexAutomaton>> compiled = RegexAutomaton::compile(*rest_regex);
      if (!compiled.ok()) {
        return schema_error(
            path, "'enum' or 'const' beside other keywords: " + compiled.status().message());
      }
      rest = std::move(compiled).value();
    }
    std::vector<const SchemaJson*> values;
    if (schema.contains("enum")) {
      const SchemaJson& list = schema.at("enum");
      if (!list.is_array()) return schema_error(path, "'enum' must be an array");
      for (const auto& item : list) {
        if (!schema.contains("const") || item == schema.at("const")) values.push_back(&item);
      }
    } else {
      values.push_back(&schema.at("const"));
    }
    PS_ASSIGN_OR_RETURN(const unsigned types, schema_types(schema, path, false));
    std::vector<std::string> regexes;
    for (const SchemaJson* item : values) {
      if (!has_type(*item, types)) continue;
      try {
        if (rest != nullptr && !rest->matches(item->dump())) continue;
        regexes.push_back(literal(*item));
      } catch (const SchemaJson::exception& e) {
        return schema_error(path, std::string("an 'enum' or 'const' value: ") + e.what());
      }
    }
    if (regexes.empty()) {
      return no_instance(path, "no 'enum' or 'const' value of the schema's type and keywords");
    }
    return regex_alternation(regexes);
  }

  static Result<std::string> string_regex(const SchemaJson& schema, const std::string& path) {
    const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
    if (schema.contains("format")) {
      const SchemaJson& format = schema.at("format");
      if (!format.is_string()) return schema_error(path, "'format' must be a string");
      if (schema.contains("pattern") || has_length) {
        return schema_error(path,
                            "'format' with 'pattern', 'minLength' or 'maxLength' is not supported");
      }
      const auto& name = format.get_ref<const std::string&>();
      std::optional<std::string> regex = json_string_format_regex(name);
      if (!regex) {
        return schema_error(path, "'format': \"" + name +
                                      "\" is not supported (date, time, date-time and uuid are)");
      }
      return *std::move(regex);
    }
    if (schema.contains("pattern")) {
      const SchemaJson& pattern = schema.at("pattern");
      if (!pattern.is_string()) return schema_error(path, "'pattern' must be a string");
      if (has_length) {
        return schema_error(path, "'pattern' with 'minLength' or 'maxLength' is not supported");
      }
      Result<std::string> body = json_string_pattern_regex(pattern.get_ref<const std::string&>());
      if (!body.ok()) return schema_error(path, "'pattern': " + body.status().message());
      return "\"(?:" + *body + ")\"";
    }
    PS_ASSIGN_OR_RETURN(const std::optional<int64_t> lo, schema_count(schema, "minLength", path));
    PS_ASSIGN_OR_RETURN(const std::optional<int64_t> hi, schema_count(schema, "maxLength", path));
    if (lo && hi && *lo > *hi) return no_instance(path, "'minLength' above 'maxLength'");
    return json_string_regex(lo.value_or(0), hi.value_or(-1));
  }

  // Exact integer ranges; bounds beyond 1e15 are refused.
  static Result<std::string> integer_regex(const SchemaJson& schema, const std::string& path) {
    PS_ASSIGN_OR_RETURN(const std::optional<Bound> lo, schema_bound(schema, path, true));
    PS_ASSIGN_OR_RETURN(const std::optional<Bound> hi, schema_bound(schema, path, false));
    for (const std::optional<Bound>* b : {&lo, &hi}) {
      if (*b && std::fabs((*b)->value) > kMaxIntegerBound) {
        return schema_error(path, "'" + (*b)->keyword + "' beyond +-1e15 is not supported");
      }
    }
    std::optional<int64_t> first;
    std::optional<int64_t> last;
    if (lo) first = std::llround(lo->exclusive ? std::floor(lo->value) + 1 : std::ceil(lo->value));
    if (hi) last = std::llround(hi->exclusive ? std::ceil(hi->value) - 1 : std::floor(hi->value));
    if (first && last && *first > *last) return no_instance(path, "no integer within the bounds");
    return json_integer_regex(first, last);
  }

  // Numbers: a bound is exactly expressible here only at 0 (the sign, and whether some digit
  // is non-zero); other bounds are refused rather than approximated.
  static Result<std::string> number_regex(const SchemaJson& schema, const std::string& path) {
    PS_ASSIGN_OR_RETURN(const std::optional<Bound> lo, schema_bound(schema, path, true));
    PS_ASSIGN_OR_RETURN(const std::optional<Bound> hi, schema_bound(schema, path, false));
    auto at_zero = [&](const std::optional<Bound>& b) -> Result<ZeroBound> {
      if (!b) return ZeroBound::kNone;
      if (b->value != 0) {
        return schema_error(path, "'" + b->keyword +
                                      "' other than 0 is not supported for type number (it is "
                                      "for integer)");
      }
      return b->exclusive ? ZeroBound::kExclusive : ZeroBound::kInclusive;
    };
    PS_ASSIGN_OR_RETURN(const ZeroBound lower, at_zero(lo));
    PS_ASSIGN_OR_RETURN(const ZeroBound upper, at_zero(hi));
    std::optional<std::string> regex = json_number_regex(lower, upper);
    if (!regex) return no_instance(path, "no number within the bounds");
    return *std::move(regex);
  }

  struct Property {
    std::string name;
    const SchemaJson* schema;
    std::string path;
    bool required = false;
  };

  Result<std::string> object_regex(const SchemaJson& schema, const std::string& path, int nesting,
                                   int depth) {
    if (nesting < 1) return too_deep(path);
    static const SchemaJson kAny = true;
    const SchemaJson* additional = &kAny;
    const std::string additional_path = pointer_child(path, "additionalProperties");
    if (schema.contains("additionalProperties")) {
      additional = &schema.at("additionalProperties");
      if (!additional->is_boolean() && !additional->is_object()) {
        return schema_error(path, "'additionalProperties' must be a boolean or a schema");
      }
    } else if (const auto unevaluated = schema.find("unevaluatedProperties");
               unevaluated != schema.end() && *unevaluated == false) {
      // allOf and $ref are merged into this schema by now, so no property is left that another
      // subschema evaluates: false means no properties but the listed ones.
      static const SchemaJson kNone = false;
      additional = &kNone;
    }
    std::vector<Property> properties;
    std::unordered_map<std::string, size_t> property_index;  // by name: `required` is looked up
    if (schema.contains("properties")) {
      const SchemaJson& listed = schema.at("properties");
      if (!listed.is_object()) return schema_error(path, "'properties' must be an object");
      for (const auto& [name, sub] : listed.items()) {
        property_index.try_emplace(name, properties.size());
        properties.push_back({name, &sub, pointer_child(pointer_child(path, "properties"), name)});
      }
    }
    const SchemaJson* required = nullptr;
    if (const auto found = schema.find("required"); found != schema.end()) required = &*found;
    if (required != nullptr && !required->is_array()) {
      return schema_error(path, "'required' must be an array of strings");
    }
    for (size_t i = 0; required != nullptr && i < required->size(); ++i) {
      const SchemaJson& name = (*required)[i];
      if (!name.is_string()) return schema_error(path, "'required' must be an array of strings");
      const auto& text = name.get_ref<const std::string&>();
      const auto [it, added] = property_index.try_emplace(text, properties.size());
      if (added) {
        // Required but not listed: its value follows additionalProperties.
        if (*additional == false) {
          return no_instance(path, "required '" + text + "' is not allowed");
        }
        properties.push_back({text, additional, additional_path});
      }
      properties[it->second].required = true;
    }
    if (properties.empty()) {
      if (*additional == false) return "\\{" + ws_ + "\\}";
      if (*additional == true) return any_object(nesting, path);
      Result<std::string> inner = value(*additional, additional_path, nesting - 1, depth + 1);
      if (!inner.ok()) {
        if (!is_no_instance(inner.status())) return inner.status();
        return "\\{" + ws_ + "\\}";
      }
      return bounded(object_of(*inner), path);
    }
    std::vector<std::string> entries;
    std::vector<bool> is_required;
    size_t entry_bytes = 0;  // checked as they come: each may be ~58 KB ("any value")
    for (const Property& p : properties) {
      Result<std::string> inner = value(*p.schema, p.path, nesting - 1, depth + 1);
      if (!inner.ok()) {
        if (p.required || !is_no_instance(inner.status())) return inner.status();
        continue;  // an optional property that cannot occur
      }
      try {
        entries.push_back(escape_regex(SchemaJson(p.name).dump()) + ":" + ws_ + *inner);
      } catch (const SchemaJson::exception& e) {
        return schema_error(p.path, std::string("property name: ") + e.what());
      }
      entry_bytes += entries.back().size();
      if (entry_bytes > kMaxRegexBytes) return schema_error(path, "the regex grows over 1 MiB");
      is_required.push_back(p.required);
    }
    return object_members(entries, is_required, path);
  }

  // The properties in order, required ones present, optional ones each present or not, with
  // exactly one comma between neighbours.
  Result<std::string> object_members(const std::vector<std::string>& entries,
                                     const std::vector<bool>& required,
                                     const std::string& path) const {
    const std::string open = "\\{" + ws_;
    const std::string comma = "," + ws_;
    if (entries.empty()) return open + "\\}";
    const auto first_required = std::find(required.begin(), required.end(), true);
    if (first_required != required.end()) {
      // Optional ones before the first required one carry their comma after them, the rest
      // before them.
      const auto r = static_cast<size_t>(first_required - required.begin());
      std::string body;
      for (size_t i = 0; i < r; ++i) body += "(?:" + entries[i] + comma + ")?";
      body += entries[r];
      for (size_t i = r + 1; i < entries.size(); ++i) {
        body += required[i] ? comma + entries[i] : "(?:" + comma + entries[i] + ")?";
      }
      return bounded(open + body + ws_ + "\\}", path);
    }
    // All optional: an alternative per first present property, the later ones optional after
    // it (quadratic in their number, so the size is checked before building).
    size_t suffix = 0;
    size_t total = 0;
    for (size_t i = entries.size(); i-- > 0;) {
      total += entries[i].size() + suffix + 1;
      suffix += entries[i].size() + comma.size() + 5;
    }
    if (total > kMaxRegexBytes) return schema_error(path, "the regex grows over 1 MiB");
    std::vector<std::string> alternatives(entries.size());
    std::string later;
    for (size_t i = entries.size(); i-- > 0;) {
      alternatives[i] = entries[i] + later;
      later = "(?:" + comma + entries[i] + ")?" + later;
    }
    return bounded(open + "(?:" + regex_alternation(alternatives) + ws_ + ")?\\}", path);
  }

  Result<std::string> array_regex(const SchemaJson& schema, const std::string& path, int nesting,
                                  int depth) {
    if (nesting < 1) return too_deep(path);
    static const SchemaJson kAny = true;
    PS_ASSIGN_OR_RETURN(const std::optional<int64_t> min_items,
                        schema_count(schema, "minItems", path));
    PS_ASSIGN_OR_RETURN(std::optional<int64_t> max_items, schema_count(schema, "maxItems", path));
    const int64_t lo = min_items.value_or(0);
    // The leading items with their own schemas (prefixItems, or draft 4's items list), then
    // the schema of all further ones.
    std::vector<std::pair<const SchemaJson*, std::string>> prefix;
    const SchemaJson* rest = &kAny;
    std::string rest_path = path;
    const bool has_prefix_items = schema.contains("prefixItems");
    const bool tuple =
        !has_prefix_items && schema.contains("items") && schema.at("items").is_array();
    const std::string prefix_key = has_prefix_items ? "prefixItems" : "items";
    const std::string rest_key = tuple ? "additionalItems" : "items";
    if (has_prefix_items || tuple) {
      const SchemaJson& list = schema.at(prefix_key);
      if (!list.is_array()) return schema_error(path, "'" + prefix_key + "' must be an array");
      for (size_t i = 0; i < list.size(); ++i) {
        prefix.emplace_back(&list[i], pointer_child(path, prefix_key, i));
      }
    }
    if (schema.contains(rest_key)) {
      rest = &schema.at(rest_key);
      rest_path = pointer_child(path, rest_key);
      if (rest->is_array()) return schema_error(path, "'" + rest_key + "' must be a schema here");
    }
    // An item that cannot occur ends the array before it.
    std::vector<std::string> items;
    size_t item_bytes = 0;  // checked as they come, as object members are
    for (const auto& [item, item_path] : prefix) {
      if (max_items && static_cast<int64_t>(items.size()) >= *max_items) break;
      Result<std::string> regex = value(*item, item_path, nesting - 1, depth + 1);
      if (!regex.ok()) {
        if (!is_no_instance(regex.status())) return regex.status();
        max_items = static_cast<int64_t>(items.size());
        break;
      }
      items.push_back(std::move(regex).value());
      item_bytes += items.back().size();
      if (item_bytes > kMaxRegexBytes) return schema_error(path, "the regex grows over 1 MiB");
    }
    const auto k = static_cast<int64_t>(items.size());
    std::string rest_regex;
    if (!max_items || *max_items > k) {
      Result<std::string> regex = value(*rest, rest_path, nesting - 1, depth + 1);
      if (regex.ok()) {
        rest_regex = std::move(regex).value();
      } else if (is_no_instance(regex.status())) {
        max_items = k;
      } else {
        return regex.status();
      }
    }
    if (max_items && lo > *max_items) return no_instance(path, "no array has 'minItems' items");
    if (max_items && *max_items == 0) return "\\[" + ws_ + "\\]";
    const std::string comma = "," + ws_;
    // From the first item on (present here; the empty array is added below), each later one
    // after a comma; prefix items past minItems are optional, each with all after it.
    std::string elements;
    const int64_t rest_hi = max_items ? *max_items - std::max<int64_t>(k, 1) : -1;
    const std::string more = "(?:" + comma + rest_regex + ")";
    if (k == 0) {
      elements = rest_regex + regex_repeat(more, std::max<int64_t>(lo, 1) - 1, rest_hi);
    } else if (!max_items || *max_items > k) {
      elements = regex_repeat(more, std::max<int64_t>(lo - k, 0), rest_hi);
    }
    for (int64_t i = k - 1; i >= 0 && elements.size() <= kMaxRegexBytes; --i) {
      const std::string element = (i == 0 ? "" : comma) + items[i] + elements;
      elements = (i == 0 || i < lo) ? element : "(?:" + element + ")?";
    }
    if (lo == 0) return bounded("\\[" + ws_ + "(?:" + elements + ws_ + ")?\\]", path);
    return bounded("\\[" + ws_ + elements + ws_ + "\\]", path);
  }

  const SchemaJson& root_;
  std::string ws_;
  std::vector<std::string> any_values_;  // any_value(n), built once per n
  int calls_ = 0;
};

}  // namespace

Status check_whitespace_pattern(std::string_view pattern) {
  if (pattern.size() > kMaxWhitespacePatternBytes) {
    return invalid_argument("whitespace pattern of " + std::to_string(pattern.size()) +
                            " bytes; at most " + std::to_string(kMaxWhitespacePatternBytes));
  }
  const RegexLimits small{.max_dfa_states = 1024};
  if (Result<std::shared_ptr<const RegexAutomaton>> alone = RegexAutomaton::compile(pattern, small);
      !alone.ok()) {
    return invalid_argument("whitespace pattern: " + alone.status().message());
  }
  return ok_status();
}

Result<std::string> json_schema_to_regex(const nlohmann::ordered_json& schema,
                                         const JsonRegexOptions& options) {
  if (options.max_nesting < 0) return invalid_argument("json schema: max_nesting must be >= 0");
  PS_RETURN_IF_ERROR(check_whitespace_pattern(options.whitespace));
  PS_RETURN_IF_ERROR(check_json_nesting(schema, kMaxJsonNesting, "json schema"));
  Converter converter(schema, options);
  Result<std::string> regex = converter.value(schema, "", options.max_nesting, 0);
  // Inside, "no instance" lets an alternative drop out; at the top it is the caller's error.
  if (!regex.ok() && is_no_instance(regex.status())) {
    return invalid_argument(regex.status().message() + " (the schema has no instance)");
  }
  return regex;
}

Result<std::string> json_schema_to_regex(const nlohmann::json& schema,
                                         const JsonRegexOptions& options) {
  // Checked before the (recursive) conversion to the ordered type, which keeps json's
  // alphabetical key order.
  PS_RETURN_IF_ERROR(check_json_nesting(schema, kMaxJsonNesting, "json schema"));
  return json_schema_to_regex(nlohmann::ordered_json(schema), options);
}

std::string json_object_regex(const JsonRegexOptions& options) {
  const SchemaJson schema = SchemaJson::object();
  Converter converter(schema, options);
  // Deeper than 16 levels never fits 1 MiB (each level takes four copies of the one below).
  for (int nesting = std::clamp(options.max_nesting, 1, 16); nesting > 1; --nesting) {
    Result<std::string> regex = converter.any_object(nesting, "");
    if (regex.ok()) return std::move(regex).value();
  }
  return converter.any_object(1, "").value();
}

}  // namespace peerserve::grammar

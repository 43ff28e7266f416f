// grammar/json_schema_regex: random instances of a dozen schemas (from a small generator
// here, fixed seeds) must match, hand-written non-instances must not; each regex is run by
// std::regex (ECMAScript, the reference) and by the automaton the server compiles it to.
#include "grammar/json_schema_regex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "grammar/regex_automaton.h"
#include "tests/base/resident_memory.h"

namespace peerserve::grammar {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string head(const std::string& text) {
  return text.size() <= 300 ? text : text.substr(0, 300) + "...";
}

// One regex in both engines.
class Matcher {
 public:
  explicit Matcher(const std::string& regex) : regex_(regex), reference_(regex) {
    Result<std::shared_ptr<const RegexAutomaton>> automaton = RegexAutomaton::compile(regex);
    EXPECT_TRUE(automaton.ok()) << automaton.status().to_string() << "\n" << head(regex);
    if (automaton.ok()) automaton_ = *automaton;
  }

  void expect(const std::string& text, bool expected) const {
    EXPECT_EQ(std::regex_match(text, reference_), expected)
        << "text: " << text << "\nregex: " << head(regex_);
    if (automaton_) {
      EXPECT_EQ(automaton_->matches(text), expected) << "automaton, text: " << text;
    }
  }

 private:
  std::string regex_;
  std::regex reference_;
  std::shared_ptr<const RegexAutomaton> automaton_;
};

std::string regex_of(const ordered_json& schema, const JsonRegexOptions& options = {}) {
  Result<std::string> regex = json_schema_to_regex(schema, options);
  EXPECT_TRUE(regex.ok()) << regex.status().to_string() << "\nschema: " << schema.dump();
  return regex.ok() ? *regex : std::string("(?:refused)");
}

// Random instances of the schema subset the tests use; nullopt where nothing fits within
// the nesting bound (mirroring what the converter drops).
class InstanceGenerator {
 public:
  InstanceGenerator(const ordered_json& root, uint32_t seed) : root_(root), rng_(seed) {}

  std::optional<ordered_json> generate(const ordered_json& schema, int nesting) {
    if (schema.is_boolean()) return any(nesting);
    if (schema.contains("$ref")) {
      const auto ref = schema["$ref"].get<std::string>();
      return generate(root_.at(ordered_json::json_pointer(ref.substr(1))), nesting);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      std::vector<ordered_json> members(schema[key].begin(), schema[key].end());
      std::shuffle(members.begin(), members.end(), rng_);
      for (const auto& member : members) {
        if (auto v = generate(member, nesting)) return v;
      }
      return std::nullopt;
    }
    if (schema.contains("allOf")) {
      // The members' properties and required lists together (what the tests' allOf uses).
      ordered_json merged = ordered_json::object();
      for (const auto& member : schema["allOf"]) {
        for (const auto& [key, v] : member.items()) {
          if (key == "properties") {
            merged[key].update(v);
          } else if (key == "required") {
            for (const auto& name : v) merged[key].push_back(name);
          } else {
            merged[key] = v;
          }
        }
      }
      return generate(merged, nesting);
    }
    if (schema.contains("const")) return schema["const"];
    if (schema.contains("enum")) return schema["enum"][pick(schema["enum"].size())];
    std::vector<std::string> types;
    if (schema.contains("type") && schema["type"].is_string()) types = {schema["type"]};
    if (schema.contains("type") && schema["type"].is_array()) {
      for (const auto& t : schema["type"]) types.push_back(t);
    }
    if (types.empty()) {
      if (schema.contains("properties") || schema.contains("additionalProperties")) {
        types = {"object"};
      } else if (schema.contains("items") || schema.contains("prefixItems")) {
        types = {"array"};
      } else {
        return any(nesting);
      }
    }
    if (schema.value("nullable", false)) types.push_back("null");
    std::shuffle(types.begin(), types.end(), rng_);
    for (const auto& type : types) {
      if (auto v = typed(schema, type, nesting)) return v;
    }
    return std::nullopt;
  }

  // Compact JSON with a space at random among the places the default whitespace allows.
  std::string spaced(const ordered_json& v) {
    if (!v.is_structured()) return v.dump();
    const bool object = v.is_object();
    std::string out = object ? "{" : "[";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += first ? space() : "," + space();
      first = false;
      if (object) out += ordered_json(it.key()).dump() + ":" + space();
      out += spaced(*it);
    }
    return out + space() + (object ? "}" : "]");
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  size_t pick(size_t n) { return static_cast<size_t>(uniform(0, static_cast<int>(n) - 1)); }
  bool coin() { return uniform(0, 1) == 1; }
  std::string space() { return uniform(0, 3) == 0 ? " " : ""; }

  std::string digits(int count, int first_max = 9) {
    std::string out;
    for (int i = 0; i < count; ++i)
      out += static_cast<char>('0' + uniform(0, i == 0 ? first_max : 9));
    return out;
  }

  std::string two(int lo, int hi) {
    const int v = uniform(lo, hi);
    return std::string(1, static_cast<char>('0' + v / 10)) + static_cast<char>('0' + v % 10);
  }

  std::string date() {
    const int month = uniform(1, 12);
    const int days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return digits(4) + "-" + two(month, month) + "-" + two(1, days[month - 1]);
  }

  std::string time() {
    std::string out = two(0, 23) + ":" + two(0, 59) + ":" + two(0, 59);
    if (coin()) out += "." + digits(uniform(1, 6));
    const int zone = uniform(0, 3);
    if (zone == 0) return out + "Z";
    if (zone == 1) return out + "z";
    return out + (zone == 2 ? "+" : "-") + two(0, 23) + ":" + two(0, 59);
  }

  std::string uuid() {
    const char* hex = "0123456789abcdefABCDEF";
    std::string out;
    for (int group : {8, 4, 4, 4, 12}) {
      if (!out.empty()) out += '-';
      for (int i = 0; i < group; ++i) out += hex[uniform(0, 21)];
    }
    return out;
  }

  // Characters that stress the encoding: quotes, backslashes, controls; multi-byte ones only
  // where no length is counted (std::regex counts bytes).
  std::string text(int min_length, int max_length, bool multibyte) {
    static const std::vector<std::string> kAscii = {"a",  "Z",    "0",    " ",   "\"", "\\",
                                                    "/",  "{",    "]",    ".",   "*",  "\n",
                                                    "\t", "\x01", "\x1f", "\x7f"};
    static const std::vector<std::string> kWide = {"\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80"};
    const int length = uniform(min_length, max_length);
    std::string out;
    for (int i = 0; i < length; ++i) {
      out += (multibyte && uniform(0, 4) == 0) ? kWide[pick(kWide.size())]
                                               : kAscii[pick(kAscii.size())];
    }
    return out;
  }

  std::optional<ordered_json> any(int nesting) {
    const int kind = uniform(0, nesting > 0 ? 7 : 5);
    switch (kind) {
      case 0:
        return nullptr;
      case 1:
        return coin();
      case 2:
        return uniform(-1000, 1000);
      case 3:
        return std::uniform_real_distribution<double>(-1e3, 1e3)(rng_);
      case 4:
      case 5:
        return text(0, 6, true);
      case 6: {
        ordered_json out = ordered_json::object();
        for (int i = uniform(0, 3); i > 0; --i) out[text(0, 4, true)] = *any(nesting - 1);
        return out;
      }
      default: {
        ordered_json out = ordered_json::array();
        for (int i = uniform(0, 3); i > 0; --i) out.push_back(*any(nesting - 1));
        return out;
      }
    }
  }

  std::optional<ordered_json> typed(const ordered_json& schema, const std::string& type,
                                    int nesting) {
    if (type == "null") return nullptr;
    if (type == "boolean") return coin();
    if (type == "integer") {
      int64_t lo = schema.value("minimum", int64_t{-100000});
      int64_t hi = schema.value("maximum", int64_t{100000});
      if (schema.contains("exclusiveMinimum")) lo = schema["exclusiveMinimum"].get<int64_t>() + 1;
      if (schema.contains("exclusiveMaximum")) hi = schema["exclusiveMaximum"].get<int64_t>() - 1;
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
    }
    if (type == "number") {
      double v = std::uniform_real_distribution<double>(-1e4, 1e4)(rng_);
      if (uniform(0, 3) == 0) v = std::ldexp(v, uniform(-60, 60));
      if (uniform(0, 5) == 0) v = std::round(v);
      if (schema.contains("minimum") || schema.contains("exclusiveMinimum")) v = std::fabs(v);
      if (schema.contains("maximum") || schema.contains("exclusiveMaximum")) v = -std::fabs(v);
      if (v == 0 && (schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum"))) {
        v = schema.contains("exclusiveMinimum") ? 1 : -1;
      }
      return v;
    }
    if (type == "string") {
      const std::string format = schema.value("format", "");
      if (format == "date") return date();
      if (format == "time") return time();
      if (format == "date-time") return date() + (coin() ? "T" : "t") + time();
      if (format == "uuid") return uuid();
      const bool counted = schema.contains("minLength") || schema.contains("maxLength");
      const int min_length = schema.value("minLength", 0);
      return text(min_length, schema.value("maxLength", min_length + 12), !counted);
    }
    if (nesting < 1) return std::nullopt;
    if (type == "object") return object(schema, nesting);
    return array(schema, nesting);
  }

  std::optional<ordered_json> object(const ordered_json& schema, int nesting) {
    ordered_json out = ordered_json::object();
    const ordered_json required = schema.value("required", ordered_json::array());
    const ordered_json values = schema.value("additionalProperties", ordered_json(true));
    if (!schema.contains("properties")) {
      for (int i = uniform(0, 3); i > 0; --i) {
        if (auto v = generate(values, nesting - 1)) out[text(0, 4, true)] = *v;
      }
      return out;
    }
    ordered_json properties = schema["properties"];
    for (const auto& name : required) {
      if (!properties.contains(name)) properties[name.get<std::string>()] = values;
    }
    for (const auto& [name, sub] : properties.items()) {
      const bool is_required = std::find(required.begin(), required.end(), name) != required.end();
      if (!is_required && coin()) continue;
      std::optional<ordered_json> v = generate(sub, nesting - 1);
      if (!v && is_required) return std::nullopt;
      if (v) out[name] = *v;
    }
    return out;
  }

  std::optional<ordered_json> array(const ordered_json& schema, int nesting) {
    const bool tuple = schema.contains("items") && schema["items"].is_array();
    const ordered_json prefix =
        tuple ? schema["items"] : schema.value("prefixItems", ordered_json::array());
    const ordered_json rest = schema.value(tuple ? "additionalItems" : "items", ordered_json(true));
    const int min_items = schema.value("minItems", 0);
    const int max_items = schema.value("maxItems", min_items + 3);
    const int length = uniform(min_items, max_items);
    ordered_json out = ordered_json::array();
    for (int i = 0; i < length; ++i) {
      const bool in_prefix = i < static_cast<int>(prefix.size());
      if (!in_prefix && rest == false) break;
      std::optional<ordered_json> v = generate(in_prefix ? prefix[i] : rest, nesting - 1);
      if (!v) break;
      out.push_back(*v);
    }
    if (static_cast<int>(out.size()) < min_items) return std::nullopt;
    return out;
  }

  const ordered_json& root_;
  std::mt19937 rng_;
};

struct SchemaCase {
  const char* name;
  const char* schema;
  std::vector<std::string> instances;      // besides the generated ones
  std::vector<std::string> non_instances;  // none may match
  int max_nesting = 6;
  bool random = true;  // false: the generator does not know the schema's keywords
};

const std::vector<SchemaCase>& schema_cases() {
  static const std::vector<SchemaCase> cases = {
      {"person",
       R"({"type":"object","properties":{
           "name":{"type":"string","minLength":1,"maxLength":20},
           "age":{"type":"integer","minimum":0,"maximum":150},
           "tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3},
           "address":{"type":"object","properties":{"street":{"type":"string"},
             "zip":{"type":"string","format":"uuid"}},"required":["zip"]}},
         "required":["name","age"]})",
       {R"({"name":"a","age":0})", R"({"name":"\"\\\n","age":150,"tags":[]})",
        R"({"name":"x","age":7,"address":{"zip":"123e4567-e89b-12d3-a456-426614174000"}})"},
       {R"({"age":3})", R"({"name":"a","age":"3"})", R"({"name":"a","age":3,"extra":1})",
        R"({"name":"a","age":151})", R"({"name":"","age":3})", R"({"name":"a","age":3,})",
        R"({"name":"a","age":03})", R"({"age":3,"name":"a"})", R"({"name":"a","age":-1})",
        R"({"name":"a","age":3,"tags":["a","b","c","d"]})", R"({"name":"a","age":3.5})",
        R"({"name":"a","age":3,"address":{}})", "{\"name\":\"a\tb\",\"age\":3}",
        R"({"name":"abcdefghijklmnopqrstu","age":3})", R"({"name":"a","age":3}x)"}},
      {"all optional",
       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},
           "c":{"type":"null"},"d":{"type":"number"}}})",
       {"{}", R"({"d":-0.5e+3})", R"({"a":-0,"b":false,"c":null,"d":1E9})", "{ }"},
       {R"({,"b":true})", R"({"b":true,})", R"({"a":1"b":true})", R"({"a":1,,"b":true})",
        R"({"b":true,"a":1})", R"({"a":1,"a":1})", R"({"d":.5})", R"({"d":1.})", R"({"d":+1})",
        R"({"a":1.0})", R"({"e":1})", "{  }", ""}},
      {"array bounds",
       R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":5})",
       {"[1,2]", "[1, 2, 3, 4, 5]", "[ 1,2 ]"},
       {"[1]", "[1,2,3,4,5,6]", "[1,2,]", R"([1,"2"])", "[01,2]", "[]", "[1 ,2]", "[1,  2]"}},
      {"enum of any values",
       R"({"enum":["red",1,null,true,{"a":[1,2]},"quote\"d",1.5]})",
       {R"("red")", "1", "null", "true", R"({"a":[1,2]})", R"({ "a": [ 1, 2 ] })", R"("quote\"d")",
        "1.5"},
       {R"("blue")", "2", "false", R"({"a":[1]})", R"("quote"d")", "1.50", R"("Red")"}},
      {"const",
       R"({"const":{"k":"v","n":[1,2.5,null]}})",
       {R"({"k":"v","n":[1,2.5,null]})"},
       {R"({"k":"v"})", R"({"n":[1,2.5,null],"k":"v"})", R"({"k":"v","n":[1,2.5]})"}},
      {"anyOf",
       R"({"anyOf":[{"type":"string","maxLength":3},
           {"type":"integer","minimum":-5,"maximum":5},
           {"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"]}]})",
       {R"("")", "-5", "5", R"({"x":true})"},
       {R"("abcd")", "6", "-6", "{}", R"({"x":1})", "null"}},
      {"recursive tree",
       R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
           "properties":{"value":{"type":"integer"},
             "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
           "required":["value","children"]}}})",
       {R"({"value":1,"children":[]})", R"({"value":1,"children":[{"value":2,"children":[]}]})"},
       {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})",
        // A third node's (empty) array would be six deep, over max_nesting = 5.
        R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
       5},
      {"linked list",
       R"({"$defs":{"list":{"type":"object","properties":{"v":{"type":"integer"},
           "next":{"anyOf":[{"$ref":"#/$defs/list"},{"type":"null"}]}},
           "required":["v","next"]}},"$ref":"#/$defs/list"})",
       {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"},
       {R"({"v":1})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":{"v":4,"next":null}}}})"},
       3},
      {"formats",
       R"({"type":"object","properties":{"d":{"type":"string","format":"date"},
           "t":{"type":"string","format":"time"},"dt":{"type":"string","format":"date-time"},
           "u":{"type":"string","format":"uuid"}},"required":["d","t","dt","u"]})",
       {R"({"d":"2024-02-29","t":"23:59:59.5+05:30","dt":"1999-12-31T00:00:00Z","u":"123E4567-e89b-12d3-a456-426614174000"})"},
       {R"({"d":"2024-02-30","t":"00:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"d":"2024-13-01","t":"00:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"d":"2024-01-01","t":"24:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"d":"2024-01-01","t":"12:00:00","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"d":"2024-01-01","t":"12:00:00Z","dt":"1999-12-31 00:00:00Z","u":"123e4567-e89b-12d3-a456-426614174000"})",
        R"({"d":"2024-01-01","t":"12:00:00Z","dt":"1999-12-31T00:00:00Z","u":"123e4567-e89b-12d3-a456-42661417400"})"}},
      {"string length",
       R"({"type":"string","minLength":2,"maxLength":4})",
       {R"("ab")", R"("a\"bc")", R"("\u00e9\n\\\/")", R"("\t\t")"},
       {R"("a")", R"("abcde")", R"("a\"bcd")", R"("a\x")", R"("ab\u12")", "ab", R"("ab)"}},
      {"nullable and type lists",
       R"({"type":"object","properties":{
           "s":{"type":["string","null"],"maxLength":2},"n":{"type":"integer","nullable":true},
           "m":{"type":["integer","boolean"],"exclusiveMinimum":-3,"exclusiveMaximum":3}},
           "required":["s","n","m"]})",
       {R"({"s":null,"n":null,"m":true})", R"({"s":"ab","n":-7,"m":-2})"},
       {R"({"s":"abc","n":null,"m":true})", R"({"s":null,"n":"1","m":true})",
        R"({"s":null,"n":null,"m":3})", R"({"s":null,"n":null,"m":-3})"}},
      {"tuple",
       R"({"type":"array","prefixItems":[{"type":"string","maxLength":2},{"type":"integer"}],
           "items":false})",
       {"[]", R"(["a"])", R"(["a",1])"},
       {"[1]", R"(["a",1,2])", R"(["a","b"])"}},
      {"tuple with rest",
       R"({"type":"array","prefixItems":[{"type":"boolean"}],
           "items":{"type":"null"},"minItems":2,"maxItems":3})",
       {"[true,null]", "[false,null,null]"},
       {"[true]", "[true,null,null,null]", "[null,null]"}},
      {"map",
       R"({"type":"object","additionalProperties":{"type":"integer","minimum":1}})",
       {"{}", R"({"a":1,"b":2})", R"({"":7})"},
       {R"({"a":"x"})", R"({"a":0})", R"({"a":1,})"}},
      {"allOf",
       R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
           {"properties":{"b":{"type":"string","maxLength":4}},"required":["b"]}]})",
       {R"({"a":1,"b":"x"})"},
       {R"({"a":1})", R"({"b":"x"})", R"({"a":1,"b":"xxxxx"})"}},
      {"non-negative number",
       R"({"type":"number","minimum":0})",
       {"0", "-0", "0.0", "1e-5", "7"},
       {"-1", "-0.5", "-1e5"}},
      {"positive number",
       R"({"type":"number","exclusiveMinimum":0})",
       {"0.001", "1E-3", "12.5e+2"},
       {"0", "0.000", "-0", "0e5", "-2"}},
      {"negative number",
       R"({"type":"number","exclusiveMaximum":0})",
       {"-0.5", "-3e2"},
       {"0", "-0", "0.5", "-0.0"}},
      {"draft-4 tuple",
       R"({"type":"array","items":[{"type":"integer"},{"type":"string"}],"additionalItems":false})",
       {"[]", "[1]", R"([1,"a"])"},
       {R"([1,"a",2])", R"(["a"])", "[1,2]"}},
      {"required beyond properties",
       R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["b"],
           "additionalProperties":{"type":"boolean"}})",
       {R"({"a":1,"b":true})", R"({"b":false})"},
       {R"({"a":1})", R"({"b":1})", R"({"b":true,"c":true})", R"({"b":true,"a":1})"}},
      {"oneOf merged with its siblings",
       R"({"type":"object","properties":{"kind":{"type":"string","maxLength":3}},
           "required":["kind"],"oneOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
           {"properties":{"b":{"type":"null"}},"required":["b"]}]})",
       {R"({"kind":"x","a":1})", R"({"kind":"x","b":null})"},
       {R"({"kind":"x"})", R"({"kind":"x","a":1,"b":null})", R"({"a":1})",
        R"({"kind":"long","a":1})"},
       6,
       false},
      {"$ref with siblings, percent-encoded",
       R"({"$defs":{"a b":{"type":"integer","maximum":9}},"type":"object",
           "properties":{"x":{"$ref":"#/$defs/a%20b","minimum":3}},"required":["x"]})",
       {R"({"x":3})", R"({"x":9})"},
       {R"({"x":2})", R"({"x":10})", "{}"},
       6,
       false},
  };
  return cases;
}

TEST(JsonSchemaRegexTest, RandomInstancesMatchAndNonInstancesDoNot) {
  uint32_t seed = 1;
  for (const SchemaCase& c : schema_cases()) {
    SCOPED_TRACE(c.name);
    const ordered_json schema = ordered_json::parse(c.schema);
    const JsonRegexOptions options{.max_nesting = c.max_nesting};
    const std::string regex = regex_of(schema, options);
    const Matcher matcher(regex);
    for (const std::string& text : c.instances) matcher.expect(text, true);
    for (const std::string& text : c.non_instances) matcher.expect(text, false);
    if (!c.random) continue;
    InstanceGenerator generator(schema, seed++);
    int generated = 0;
    for (int i = 0; i < 150; ++i) {
      const std::optional<ordered_json> instance = generator.generate(schema, c.max_nesting);
      if (!instance) continue;
      const std::string text = i % 2 ? instance->dump() : generator.spaced(*instance);
      if (text.size() > 200) continue;  // std::regex recurses per character
      ++generated;
      matcher.expect(text, true);
    }
    EXPECT_GE(generated, 50);
  }
}

TEST(JsonSchemaRegexTest, IntegerBoundsAreExact) {
  struct Bounds {
    const char* schema;
    int64_t lo;
    int64_t hi;
  };
  const std::vector<Bounds> cases = {
      {R"({"type":"integer","minimum":0})", 0, INT64_MAX},
      {R"({"type":"integer","minimum":-37,"maximum":1234})", -37, 1234},
      {R"({"type":"integer","minimum":100,"maximum":999})", 100, 999},
      {R"({"type":"integer","exclusiveMinimum":-1000,"exclusiveMaximum":-9})", -999, -10},
      {R"({"type":"integer","minimum":0.5,"maximum":20.5})", 1, 20},
      {R"({"type":"integer","maximum":-250})", INT64_MIN, -250},
      {R"({"type":"integer","minimum":7,"exclusiveMinimum":true})", 8, INT64_MAX},
      {R"({"type":"integer","minimum":5,"maximum":5})", 5, 5},
      {R"({"type":"integer","minimum":-1,"maximum":0})", -1, 0},
      {R"({"type":"integer","minimum":19,"maximum":1001})", 19, 1001},
  };
  for (const Bounds& b : cases) {
    SCOPED_TRACE(b.schema);
    const std::string regex = regex_of(ordered_json::parse(b.schema));
    const std::regex reference(regex);
    const auto automaton = RegexAutomaton::compile(regex);
    ASSERT_TRUE(automaton.ok()) << automaton.status().to_string();
    for (int64_t v = -1300; v <= 1300; ++v) {
      const bool in = b.lo <= v && v <= b.hi;
      EXPECT_EQ(std::regex_match(std::to_string(v), reference), in) << v << " " << regex;
      EXPECT_EQ((*automaton)->matches(std::to_string(v)), in) << v;
    }
    for (int64_t v : {int64_t{99999}, int64_t{-99999}, int64_t{123456789012}}) {
      EXPECT_EQ((*automaton)->matches(std::to_string(v)), b.lo <= v && v <= b.hi) << v;
    }
    EXPECT_FALSE((*automaton)->matches("01"));
    EXPECT_FALSE((*automaton)->matches("+1"));
    EXPECT_EQ((*automaton)->matches("-0"), b.lo <= 0 && 0 <= b.hi);
  }
}

TEST(JsonSchemaRegexTest, PatternsMatchTheDecodedValue) {
  struct Case {
    const char* pattern;
    std::vector<std::string> values;
    std::vector<std::string> non_values;
  };
  const std::vector<Case> cases = {
      {R"(^[A-Z]{3}-\d{2,4}$)", {"ABC-12", "XYZ-1234"}, {"AB-12", "ABC-12345", "abc-12"}},
      {R"(^\w+@\w+\.com$)", {"a_1@b.com"}, {"a@b.org", "a.b@c.com", "@b.com"}},
      {"a.c", {"abc", "a\"c", "a\\c", "a\tc", "a.c"}, {"a\nc", "ac", "abbc", "a\rc"}},
      {"[^x]+", {"abc", "a\nb", "\"\\"}, {"axb", ""}},
      {"(foo|bar)?baz*", {"ba", "baz", "foobazzz", "barba"}, {"foob", "foobarbaz"}},
      {R"(\s\S)", {" a", "\ta", "\n\""}, {"ab", "  "}},
      {"[ -~]*", {"a\"b\\c{}", ""}, {"\xC3\xA9", "a\tb"}},
      {"\"quoted\"", {"\"quoted\""}, {"quoted"}},
      {R"(\x41\u0042\.\/)", {"AB./"}, {"AB.\\/", "ABx/"}},
      {R"((?<year>\d{4})-(?:\d{2}))", {"2024-05"}, {"2024-5"}},
      {"a+?b??c*?", {"ab", "aac", "aabccc"}, {"b", "abb"}},
      {R"([\d\-]{3}|[\\"])", {"1-2", "\\", "\""}, {"12", "\\\\"}},
      {"", {""}, {"a"}},
      {"^a$", {"a"}, {"ba", "ab", ""}},
      {R"(\$\^)", {"$^"}, {"$"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pattern);
    const Matcher matcher(regex_of(ordered_json{{"type", "string"}, {"pattern", c.pattern}}));
    for (const auto& v : c.values) matcher.expect(ordered_json(v).dump(), true);
    for (const auto& v : c.non_values) matcher.expect(ordered_json(v).dump(), false);
  }
}

TEST(JsonSchemaRegexTest, PropertiesComeInTheOrderTheJsonObjectIterates) {
  const char* text =
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"integer"}},
                         "required":["a","b"]})";
  const Matcher sorted(*json_schema_to_regex(json::parse(text)));
  sorted.expect(R"({"a":1,"b":2})", true);
  sorted.expect(R"({"b":2,"a":1})", false);
  const Matcher written(*json_schema_to_regex(ordered_json::parse(text)));
  written.expect(R"({"b":2,"a":1})", true);
  written.expect(R"({"a":1,"b":2})", false);
}

TEST(JsonSchemaRegexTest, WhitespaceOption) {
  const auto schema = ordered_json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array"}},"required":["a"]})");
  const Matcher spaced(regex_of(schema, {.max_nesting = 3}));
  spaced.expect(R"({"a": 1})", true);
  spaced.expect(R"({ "a": 1, "b": [ 1, 2 ] })", true);
  spaced.expect(R"({"a":  1})", false);
  spaced.expect(R"({"a" : 1})", false);
  spaced.expect("{\"a\":\n1}", false);
  const Matcher compact(regex_of(schema, {.max_nesting = 3, .whitespace = ""}));
  compact.expect(R"({"a":1,"b":[]})", true);
  compact.expect(R"({"a": 1})", false);
  const Matcher newlines(regex_of(schema, {.max_nesting = 3, .whitespace = R"((?:\n *)?| )"}));
  newlines.expect("{\n  \"a\": 1\n}", true);
  newlines.expect("{\"a\":\t1}", false);
  // A request's pattern must be a regex by itself and short: `)|(?:` would reach out of its
  // place, and ~262 KB of it made even the shallowest json_object_regex outgrow 1 MiB (an
  // abort before the check).
  EXPECT_TRUE(check_whitespace_pattern("[ ]?").ok());
  EXPECT_TRUE(check_whitespace_pattern("").ok());
  EXPECT_FALSE(check_whitespace_pattern(")|(?:").ok());
  EXPECT_FALSE(check_whitespace_pattern("[ ").ok());
  std::string longest;
  while (longest.size() < kMaxWhitespacePatternBytes) longest += "[ ]?";
  ASSERT_EQ(longest.size(), kMaxWhitespacePatternBytes);
  EXPECT_TRUE(check_whitespace_pattern(longest).ok());
  EXPECT_FALSE(check_whitespace_pattern(longest + " ").ok());
  EXPECT_FALSE(json_schema_to_regex(schema, {.whitespace = ")|(?:"}).ok());
  EXPECT_LE(json_object_regex({.whitespace = longest}).size(), size_t{1} << 20);
}

// Objects and arrays nested `depth` deep: {"a":[{"a":[...]}]}.
std::string nested(int depth) {
  if (depth == 0) return "1";
  return depth % 2 ? "{\"a\":" + nested(depth - 1) + "}" : "[" + nested(depth - 1) + "]";
}

TEST(JsonSchemaRegexTest, JsonObjectRegexBoundsNesting) {
  const Matcher three(json_object_regex({.max_nesting = 3}));
  three.expect("{}", true);
  three.expect(nested(3), true);
  three.expect(R"({"k": "v", "n": [1, -2.5e3, true, null, {"x": 1}, []]})", true);
  three.expect(R"({"n": [{"x": []}]})", false);
  three.expect(nested(5), false);
  three.expect(R"({"a":{"b":{"c":{}}}})", false);
  for (const char* not_object : {"[]", R"("s")", "1", "null", "true", "{", R"({"a"})"}) {
    three.expect(not_object, false);
  }
  // Nesting 5 (the default, what the server compiles), past std::regex's state limit (117 kB
  // of regex), so only the automaton runs it. Before minimization the subset construction
  // takes four times the states per level (a value after '[' or '{' and one after ',' are
  // different copies): 39926 here, inside RegexLimits' default of 65536; nesting 6 needs
  // 159734.
  const auto automaton = RegexAutomaton::compile(json_object_regex({.max_nesting = 5}));
  ASSERT_TRUE(automaton.ok()) << automaton.status().to_string();
  EXPECT_TRUE((*automaton)->matches(R"({"a":{"b":[{"d":{"e":1}}]}})"));
  EXPECT_FALSE((*automaton)->matches(R"({"a":{"b":[{"d":{"e":[]}}]}})"));
  const std::string full = json_object_regex();
  EXPECT_LE(full.size(), size_t{1} << 20);
  EXPECT_FALSE((*automaton)->matches("[]"));
  EXPECT_EQ(*json_schema_to_regex(json{{"type", "object"}}), full);
}

TEST(JsonSchemaRegexTest, RefusalsNameTheKeyword) {
  struct Case {
    const char* schema;
    const char* message;
  };
  const std::vector<Case> cases = {
      {R"({"not":{"type":"string"}})", "'not'"},
      {R"({"if":{"type":"string"},"then":{"minLength":1}})", "'if'"},
      {R"({"then":{"minLength":1}})", "'then'"},
      {R"({"else":{"minLength":1}})", "'else'"},
      {R"({"type":"object","patternProperties":{"^a":{}}})", "'patternProperties'"},
      {R"({"type":"object","dependentRequired":{"a":["b"]}})", "'dependentRequired'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"integer","multipleOf":2})", "'multipleOf'"},
      {R"({"type":"array","contains":{"type":"integer"}})", "'contains'"},
      {R"({"type":"object","minProperties":1})", "'minProperties'"},
      {R"({"type":"string","format":"email"})", "\"email\""},
      {R"({"properties":{"age":{"type":"integer","minimum":"x"}}})",
       "json schema at /properties/age: 'minimum' must be a number"},
      {R"({"type":"number","minimum":5})", "'minimum' other than 0"},
      {R"({"type":"integer","maximum":1e16})", "'maximum' beyond"},
      {R"({"type":"string","maxLength":2000})", "'maxLength' above 1000"},
      {R"({"type":"string","minLength":-1})", "'minLength' must be a non-negative integer"},
      {R"({"type":"array","maxItems":1.5})", "'maxItems' must be a non-negative integer"},
      {R"({"type":"strin"})", "json schema at /: 'type' has an unknown type \"strin\""},
      {R"({"$ref":"#/$defs/missing"})",
       "json schema at /: '$ref' #/$defs/missing does not resolve"},
      {R"({"$ref":"https://example.com/s.json"})", "outside this schema"},
      {R"({"type":"string","pattern":"(?=a)a"})", "'pattern': lookaround"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreferences"},
      {R"({"type":"string","pattern":"a{2000}"})", "repetition count above 1000"},
      {R"({"type":"string","pattern":"\\bword"})", "word boundary"},
      {R"({"type":"string","pattern":"a^b"})", "anchor '^'"},
      {R"({"type":"string","pattern":"[]"})", "empty class"},
      {R"({"type":"string","pattern":"\\p{L}"})", "escape '\\p'"},
      {R"({"type":"string","pattern":"a","minLength":1})", "'pattern' with 'minLength'"},
      {R"({"anyOf":"x"})", "'anyOf' must be a non-empty array"},
      {R"({"type":"object","properties":{"a":false},"required":["a"]})",
       "json schema at /properties/a: schema false has no instance"},
      // Recursion with no way out: every node needs a deeper one.
      {R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},
          "required":["next"]}},"$ref":"#/$defs/n"})",
       "nested deeper than max_nesting"},
      {R"({"$defs":{"loop":{"$ref":"#/$defs/loop"}},"$ref":"#/$defs/loop"})", "deeper than 64"},
      {R"({"allOf":[{"type":"string","pattern":"a"},{"pattern":"b"}]})",
       "cannot combine two different 'pattern'"},
      {"[1]", "a schema must be an object or a boolean"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const Result<std::string> regex = json_schema_to_regex(ordered_json::parse(c.schema));
    ASSERT_FALSE(regex.ok()) << *regex;
    EXPECT_EQ(regex.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(regex.status().message().find(c.message), std::string::npos)
        << regex.status().message();
  }
}

TEST(JsonSchemaRegexTest, SizesAreBounded) {
  // Many all-optional properties, each any JSON value: the quadratic alternation of which
  // property comes first would pass 1 MiB.
  ordered_json schema = {{"type", "object"}, {"properties", ordered_json::object()}};
  for (int i = 0; i < 40; ++i)
    schema["properties"]["p" + std::to_string(i)] = ordered_json::object();
  const Result<std::string> big = json_schema_to_regex(schema, {.max_nesting = 4});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("1 MiB"), std::string::npos) << big.status().message();
  // A schema nested far deeper than it could be expanded stops at 64 levels.
  ordered_json deep = {{"type", "string"}};
  for (int i = 0; i < 100; ++i) deep = {{"anyOf", ordered_json::array({deep})}};
  const Result<std::string> refused = json_schema_to_regex(deep, {.max_nesting = 1000});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("64"), std::string::npos);
  EXPECT_FALSE(json_schema_to_regex(json{{"type", "string"}}, {.max_nesting = -1}).ok());
}

// Sizes are checked as members come, not once they are all built: 10,000 required names of
// any value (89 KB of schema) held 2.3 GB before the 1 MiB check refused them, and looking up
// each required name among the properties was quadratic.
TEST(JsonSchemaRegexTest, LargeSchemasAreRefusedBeforeTheyAreBuilt) {
  const int64_t peak_before = testing::peak_resident_bytes();
  ordered_json required = {{"type", "object"}, {"required", ordered_json::array()}};
  ordered_json tuple = {{"type", "array"}, {"prefixItems", ordered_json::array()}};
  ordered_json listed = {{"type", "object"}, {"properties", ordered_json::object()}};
  for (int i = 0; i < 20000; ++i) {
    required["required"].push_back("r" + std::to_string(i));
    tuple["prefixItems"].push_back(ordered_json::object());
    listed["properties"]["p" + std::to_string(i)] = ordered_json::object();
  }
  listed["required"] = required["required"];
  for (const ordered_json& schema : {required, tuple, listed}) {
    const Result<std::string> refused = json_schema_to_regex(schema);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("1 MiB"), std::string::npos)
        << refused.status().message();
  }
  const int64_t grown = testing::peak_resident_bytes() - peak_before;
  EXPECT_LT(grown, int64_t{256} << 20) << "peak resident memory grew by " << grown << " bytes";
}

// What the regexes accept stays inside what JSON parsers and validators agree on: no \u
// escape of a UTF-16 surrogate (a lone one is refused by nlohmann's parser, and a pair counted
// as two characters against maxLength), exponents of two digits (5e-9691 parses as 0, past an
// exclusive minimum of 0; 1e400 overflows), no second 60.
TEST(JsonSchemaRegexTest, EscapesExponentsAndSecondsParsersAgreeOn) {
  const Matcher two_chars(regex_of(ordered_json::parse(R"({"type":"string","maxLength":2})")));
  for (const char* ok : {R"("\u00e9")", R"("\ud7ff\ue000")", R"("\uFFFF")"}) {
    two_chars.expect(ok, true);
  }
  for (const char* bad : {R"("\ud800")", R"("\uDC00x")", R"("\ud83d\ude00")"}) {
    two_chars.expect(bad, false);
  }
  const Matcher number(regex_of(ordered_json::parse(R"({"type":"number"})")));
  for (const char* ok : {"1e99", "-2.5E-07", "0e0", "12"}) number.expect(ok, true);
  for (const char* bad : {"1e400", "5.9306E-9691", "1e"}) number.expect(bad, false);
  const Matcher positive(
      regex_of(ordered_json::parse(R"({"type":"number","exclusiveMinimum":0})")));
  positive.expect("5e-99", true);
  positive.expect("5e-999", false);
  const Matcher time(regex_of(ordered_json::parse(R"({"type":"string","format":"time"})")));
  time.expect(R"("23:59:59Z")", true);
  time.expect(R"("23:59:60Z")", false);
}

// enum and const keep only the values the rest of the schema accepts; unevaluatedProperties
// false closes an object as additionalProperties false does; a schema of any value compiles.
TEST(JsonSchemaRegexTest, KeywordsBesideEnumAndUnevaluatedPropertiesConstrain) {
  const Matcher short_enum(
      regex_of(ordered_json::parse(R"({"enum":["a","abcd",7],"maxLength":2})")));
  short_enum.expect(R"("a")", true);
  short_enum.expect("7", true);  // maxLength says nothing of numbers
  short_enum.expect(R"("abcd")", false);
  const Matcher patterned(regex_of(
      ordered_json::parse(R"({"type":"string","enum":["abc","xyz"],"pattern":"^a[a-z]*$"})")));
  patterned.expect(R"("abc")", true);
  patterned.expect(R"("xyz")", false);
  const Matcher objects(regex_of(ordered_json::parse(
      R"({"enum":[{"a":1},{"a":"s"}],"properties":{"a":{"type":"integer"}}})")));
  objects.expect(R"({"a":1})", true);
  objects.expect(R"({"a":"s"})", false);
  const Result<std::string> none =
      json_schema_to_regex(ordered_json::parse(R"({"type":"integer","const":3,"minimum":5})"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no instance"), std::string::npos)
      << none.status().message();
  const Matcher closed(regex_of(ordered_json::parse(
      R"({"type":"object","properties":{"x":{"type":"integer"}},"unevaluatedProperties":false})")));
  closed.expect(R"({"x":1})", true);
  closed.expect(R"({"x":1,"y":2})", false);
  for (const ordered_json& any : {ordered_json::object(), ordered_json(true)}) {
    const Result<std::string> regex = json_schema_to_regex(any);  // default nesting (5)
    ASSERT_TRUE(regex.ok()) << regex.status().to_string();
    EXPECT_TRUE(RegexAutomaton::compile(*regex).ok());
  }
}

// allOf merges keyword by keyword, but one member's additionalProperties also applies to the
// properties only another lists, and its items to another's prefixItems.
TEST(JsonSchemaRegexTest, MergedMembersConstrainEachOthersMembers) {
  const Matcher closed(regex_of(ordered_json::parse(R"({"allOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false},
      {"properties":{"b":{"type":"string"}}}]})")));
  closed.expect(R"({"a":1})", true);
  closed.expect(R"({"b":"x"})", false);
  closed.expect(R"({"a":1,"b":"x"})", false);
  const Matcher typed(regex_of(ordered_json::parse(R"({"allOf":[
      {"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"integer"}},
      {"properties":{"b":{"type":["string","integer"]}}}]})")));
  typed.expect(R"({"b":2})", true);
  typed.expect(R"({"b":"x"})", false);
  const Matcher items(regex_of(ordered_json::parse(R"({"allOf":[
      {"type":"array","items":{"type":"string"}},{"prefixItems":[{"type":["integer","string"]}]}]})")));
  items.expect(R"(["x"])", true);
  items.expect("[]", true);
  items.expect("[1]", false);
}

TEST(JsonSchemaRegexTest, EmptyAndTrueSchemasMatchAnyValue) {
  for (const ordered_json& schema : {ordered_json::object(), ordered_json(true)}) {
    const Matcher matcher(regex_of(schema, {.max_nesting = 2}));
    for (const char* v : {"1", "-2.5E-3", R"("x\u00e9")", "null", "[[]]", R"({"a":[1,2]})"}) {
      matcher.expect(v, true);
    }
    for (const char* v : {"", "nul", "[[[]]]", R"({"a":[{}]})", "{'a':1}", "01", "\"\t\""}) {
      matcher.expect(v, false);
    }
  }
}

}  // namespace
}  // namespace peerserve::grammar

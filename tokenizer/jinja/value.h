// Values of the Jinja subset, with Python's semantics where templates can observe them
// (str(), repr(), ==, ordering, truthiness, json.dumps as transformers' tojson calls it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve::jinja {

class Value;
using List = std::vector<Value>;
// Insertion-ordered like a Python dict; small, so lookups are linear.
using Dict = std::vector<std::pair<std::string, Value>>;
// namespace(...) objects are the one mutable value: shared by reference.
using Namespace = std::map<std::string, Value>;

struct Undefined {
  std::string name;  // what was looked up, for error messages
};
struct None {};

class Value {
 public:
  Value() : data_(Undefined{}) {}
  static Value undefined(std::string name = "") { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(None{}); }
  Value(bool b) : data_(b) {}                       // NOLINT
  Value(int64_t i) : data_(i) {}                    // NOLINT
  Value(int i) : data_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : data_(d) {}                     // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  Value(List list);                                 // NOLINT
  Value(Dict dict);                                 // NOLINT
  // A namespace's members may change later, so its size is not known here: members are
  // held to kMaxNamespaceMemberDepth levels and may not hold namespaces (no cycles), and
  // the namespace counts as that deep plus one.
  Value(std::shared_ptr<Namespace> ns);  // NOLINT

  // Objects become dicts in the JSON's key order.
  static Value from_json(const nlohmann::ordered_json& json);
  // A list that prints as a Python tuple: "(1, 2)".
  static Value tuple(List items) {
    Value v(std::move(items));
    v.tuple_ = true;
    return v;
  }
  bool is_tuple() const { return tuple_ && is_list(); }

  bool is_undefined() const { return std::holds_alternative<Undefined>(data_); }
  bool is_none() const { return std::holds_alternative<None>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }
  bool is_float() const { return std::holds_alternative<double>(data_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const {
    return std::holds_alternative<std::shared_ptr<const std::string>>(data_);
  }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const List>>(data_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<const Dict>>(data_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(data_); }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  // Numeric value of a bool/int/float.
  double as_double() const;
  const std::string& as_string() const {
    return *std::get<std::shared_ptr<const std::string>>(data_);
  }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const std::string& undefined_name() const { return std::get<Undefined>(data_).name; }

  // Levels of list/dict/namespace nesting (0 for scalars), saturating.
  int depth() const { return depth_; }
  // Approximate bytes held: string bytes, kScalarWeight per scalar and per element of a
  // list or dict, saturating. Lists shared between values count once per reference. A
  // namespace's is summed over its members when asked (they change; the interpreter keeps
  // namespaces out of lists, dicts and other namespaces, so no stored weight goes stale).
  uint64_t weight() const;
  // Whether a namespace is reachable from this value.
  bool holds_namespace() const { return holds_namespace_; }

  // Python's bool(x).
  bool truthy() const;
  // Python's type name ("str", "int", "list", "dict", "NoneType", "Undefined", ...).
  const char* type_name() const;
  // Member of a dict or namespace; nullptr if absent or not a mapping.
  const Value* find(const std::string& key) const;

 private:
  explicit Value(Undefined u) : data_(std::move(u)) {}
  explicit Value(None n) : data_(n) {}
  // Strings, lists and dicts are immutable and shared, so copying a value is cheap.
  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Namespace>>
      data_;
  bool tuple_ = false;
  bool holds_namespace_ = false;
  int depth_ = 0;
  uint64_t weight_ = kScalarWeight;

 public:
  static constexpr uint64_t kScalarWeight = 16;
  static constexpr int kMaxNamespaceMemberDepth = 64;
};

// Python str(x) (what {{ x }} and ~ print; Undefined prints as "").
std::string to_str(const Value& value);
// Python repr(x).
std::string to_repr(const Value& value);
// Python repr() of a float ("1.0", "0.1", "1e-05", "1e+16").
std::string float_repr(double value);
// json.dumps's options as transformers' tojson filter passes them.
struct JsonTextOptions {
  int indent = -1;  // < 0: None
  bool sort_keys = false;
  bool ensure_ascii = false;  // escape every non-ASCII character as \uXXXX (pairs past U+FFFF)
  // Between items and between a key and its value; unset: json.dumps's defaults (", " and
  // ": ", or "," and ": " with an indent).
  std::optional<std::string> item_separator, key_separator;
  uint64_t max_bytes = UINT64_MAX;
};
// json.dumps(x, ...) as transformers' tojson filter. Fails for Undefined and namespaces,
// and when the text would pass `max_bytes`.
Result<std::string> to_json_text(const Value& value, const JsonTextOptions& options);

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <: numbers with numbers, strings with strings, lists element-wise.
Result<bool> less_than(const Value& a, const Value& b);

}  // namespace peerserve::jinja

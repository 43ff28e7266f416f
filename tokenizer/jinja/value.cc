#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>

#include "tokenizer/internal/utf8.h"

namespace peerserve::jinja {

namespace {

uint64_t saturating_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

Value::Value(std::string s) : weight_(s.size()) {
  data_ = std::make_shared<const std::string>(std::move(s));
}

Value::Value(List list) {
  for (const Value& item : list) {
    depth_ = std::max(depth_, item.depth_);
    weight_ = saturating_add(weight_, saturating_add(kScalarWeight, item.weight_));
    holds_namespace_ = holds_namespace_ || item.holds_namespace_;
  }
  depth_ = std::min(depth_, INT32_MAX - 1) + 1;
  data_ = std::make_shared<const List>(std::move(list));
}

Value::Value(Dict dict) {
  for (const auto& [key, item] : dict) {
    depth_ = std::max(depth_, item.depth_);
    weight_ = saturating_add(weight_, saturating_add(kScalarWeight + key.size(), item.weight_));
    holds_namespace_ = holds_namespace_ || item.holds_namespace_;
  }
  depth_ = std::min(depth_, INT32_MAX - 1) + 1;
  data_ = std::make_shared<const Dict>(std::move(dict));
}

uint64_t Value::weight() const {
  if (!is_namespace()) return weight_;
  uint64_t total = kScalarWeight;
  for (const auto& [key, item] : as_namespace()) {
    total = saturating_add(total, saturating_add(kScalarWeight + key.size(), item.weight()));
  }
  return total;
}

Value::Value(std::shared_ptr<Namespace> ns)
    : data_(std::move(ns)), holds_namespace_(true), depth_(kMaxNamespaceMemberDepth + 1) {}

Value Value::from_json(const nlohmann::ordered_json& json) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
      return none();
    case Type::boolean:
      return Value(json.get<bool>());
    case Type::number_integer:
      return Value(json.get<int64_t>());
    case Type::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(u))
                                                   : Value(static_cast<double>(u));
    }
    case Type::number_float:
      return Value(json.get<double>());
    case Type::string:
      return Value(json.get<std::string>());
    case Type::array: {
      List list;
      list.reserve(json.size());
      for (const auto& item : json) list.push_back(from_json(item));
      return Value(std::move(list));
    }
    case Type::object: {
      Dict dict;
      dict.reserve(json.size());
      for (const auto& [key, item] : json.items()) dict.emplace_back(key, from_json(item));
      return Value(std::move(dict));
    }
    default:
      return undefined();
  }
}

double Value::as_double() const {
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  if (is_int()) return static_cast<double>(as_int());
  return std::get<double>(data_);
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_double() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !as_list().empty();
  if (is_dict()) return !as_dict().empty();
  return true;
}

const char* Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return "list";
  if (is_dict()) return "dict";
  return "Namespace";
}

const Value* Value::find(const std::string& key) const {
  if (is_dict()) {
    for (const auto& [k, v] : as_dict()) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  if (is_namespace()) {
    auto& ns = as_namespace();
    const auto it = ns.find(key);
    return it == ns.end() ? nullptr : &it->second;
  }
  return nullptr;
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |x| < 1e16.
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -5 + 1 && exponent < 16) {
    if (exponent >= 0) {
      if (digits.size() <= static_cast<size_t>(exponent) + 1) {
        out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
               digits.substr(static_cast<size_t>(exponent) + 1);
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exp_text;
}

namespace {

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == quote) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7F) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\x%02x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += quote;
  return out;
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (c == 0x7F && ensure_ascii)) {  // json.dumps escapes DEL only then
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\u%04x", c);
          out += hex;
        } else if (c >= 0x80 && ensure_ascii) {
          // One UTF-8 character (the strings are valid UTF-8) as \uXXXX, or a surrogate pair.
          const int length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
          uint32_t cp = c & (length == 4 ? 0x07 : length == 3 ? 0x0F : 0x1F);
          for (int k = 1; k < length && i + 1 < s.size(); ++k) {
            cp = (cp << 6) | (static_cast<unsigned char>(s[++i]) & 0x3F);
          }
          char hex[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(hex, sizeof(hex), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                          0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(hex, sizeof(hex), "\\u%04x", cp);
          }
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status append_json(std::string& out, const Value& v, const JsonTextOptions& o, int depth) {
  if (out.size() > o.max_bytes) {
    return invalid_argument("tojson: the text would be longer than " + std::to_string(o.max_bytes) +
                            " bytes");
  }
  const auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent * level), ' ');
  };
  const std::string item_separator = o.item_separator.value_or(o.indent < 0 ? ", " : ",");
  const std::string key_separator = o.key_separator.value_or(": ");
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_double();
    out += std::isnan(d)   ? "NaN"
           : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                           : float_repr(d);
  } else if (v.is_string()) {
    append_json_string(out, v.as_string(), o.ensure_ascii);
  } else if (v.is_list()) {
    const List& list = v.as_list();
    if (list.empty()) {
      out += "[]";
      return ok_status();
    }
    out += '[';
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += item_separator;
      newline(depth + 1);
      PS_RETURN_IF_ERROR(append_json(out, list[i], o, depth + 1));
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict()) {
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : v.as_dict()) items.push_back(&item);
    if (o.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](auto* a, auto* b) { return a->first < b->first; });
    }
    if (items.empty()) {
      out += "{}";
      return ok_status();
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_separator;
      newline(depth + 1);
      append_json_string(out, items[i]->first, o.ensure_ascii);
      out += key_separator;
      PS_RETURN_IF_ERROR(append_json(out, items[i]->second, o, depth + 1));
    }
    newline(depth);
    out += '}';
  } else {
    return invalid_argument(std::string("tojson: a value of type ") + v.type_name() +
                            " is not JSON serializable");
  }
  return ok_status();
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_double());
  if (v.is_string()) return v.as_string();
  return to_repr(v);
}

std::string to_repr(const Value& v) {
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_list()) {
    std::string out = v.is_tuple() ? "(" : "[";
    const List& list = v.as_list();
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += ", ";
      out += to_repr(list[i]);
    }
    if (v.is_tuple()) return out + (list.size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (v.is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, item] : v.as_dict()) {
      if (!first) out += ", ";
      first = false;
      out += string_repr(key) + ": " + to_repr(item);
    }
    return out + "}";
  }
  if (v.is_namespace()) {
    std::string out = "<Namespace {";
    bool first = true;
    for (const auto& [key, item] : v.as_namespace()) {
      if (!first) out += ", ";
      first = false;
      out += string_repr(key) + ": " + to_repr(item);
    }
    return out + "}>";
  }
  return to_str(v);
}

Result<std::string> to_json_text(const Value& value, const JsonTextOptions& options) {
  std::string out;
  PS_RETURN_IF_ERROR(append_json(out, value, options, 0));
  if (out.size() > options.max_bytes) {
    return invalid_argument("tojson: the text would be longer than " +
                            std::to_string(options.max_bytes) + " bytes");
  }
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    const int64_t x = a.is_bool() ? (a.as_bool() ? 1 : 0) : a.as_int();
    const int64_t y = b.is_bool() ? (b.as_bool() ? 1 : 0) : b.as_int();
    return x == y;
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict& x = a.as_dict();
    if (x.size() != b.as_dict().size()) return false;
    for (const auto& [key, item] : x) {
      const Value* other = b.find(key);
      if (other == nullptr || !equals(item, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  return false;
}

Result<bool> less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    const int64_t x = a.is_bool() ? (a.as_bool() ? 1 : 0) : a.as_int();
    const int64_t y = b.is_bool() ? (b.as_bool() ? 1 : 0) : b.as_int();
    return x < y;
  }
  if (a.is_string() && b.is_string())
    return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return invalid_argument(std::string("'<' not supported between instances of '") + a.type_name() +
                          "' and '" + b.type_name() + "'");
}

}  // namespace peerserve::jinja

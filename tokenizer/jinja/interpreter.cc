#include "tokenizer/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <optional>
#include <unordered_map>

#include "tokenizer/internal/utf8.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/python_strings.h"

namespace peerserve::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(std::string_view source, const nlohmann::ordered_json& variables,
              const RenderLimits& limits)
      : src_(source), limits_(limits) {
    for (const auto& [key, value] : variables.items()) globals_[key] = Value::from_json(value);
    frames_.emplace_back();
  }

  Result<std::string> run(const NodeList& nodes) {
    std::string out;
    PS_ASSIGN_OR_RETURN(Flow flow, exec(nodes, out));
    (void)flow;
    return out;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  Status error(size_t offset, const std::string& what) const {
    return invalid_argument("chat template " + position_text(src_, offset) + ": " + what);
  }

  // ---- sandbox budgets (tokenizer/jinja/limits.h) ----
  Status charge_steps(uint64_t steps, size_t offset) {
    steps_ += steps;
    if (steps_ > limits_.max_steps) {
      return error(offset, "the template took more than " + std::to_string(limits_.max_steps) +
                               " steps (loop iterations, expressions and elements scanned)");
    }
    return ok_status();
  }
  // A substring search of `needle` bytes in `haystack` bytes (in, replace, split) or a strip
  // over `needle` characters: std::string::find compares up to (haystack - needle + 1) x
  // needle bytes, charged as steps of 4 KiB of comparisons, plus the scan of the haystack
  // (charge_scan). Searches of real templates cost a handful of steps; `b in a` with 30 MB
  // and 60 MB strings (10^15 comparisons) is refused before it starts instead of running for
  // hours, and "ab" in "a" * 6e7 (0.55 s, a false start at every byte) costs 1.9 M steps,
  // where the comparisons alone were 29,000.
  Status charge_search(size_t haystack, size_t needle, size_t offset) {
    const uint64_t starts = haystack >= needle ? haystack - needle + 1 : 1;
    const uint64_t width = needle > 0 ? needle : 1;
    const uint64_t compares =
        starts > UINT64_MAX / width ? UINT64_MAX : starts * static_cast<uint64_t>(width);
    PS_RETURN_IF_ERROR(charge_scan(haystack, offset));
    return charge_steps(compares / 4096 + 1, offset);
  }
  // A walk over a string's characters (strip and trim test each end's characters for
  // whitespace, int() and float() strip first and read every digit): one step per 32 bytes,
  // the rate of a step of the budget (max_steps took ~28 s of nested loops here) at the
  // 7.5 ns per byte that stripping 60 MB of spaces took. Uncharged, a loop of such calls
  // held a worker for days.
  Status charge_scan(size_t bytes, size_t offset) { return charge_steps(bytes / 32 + 1, offset); }
  // A value just computed: bounded in nesting and size, and counted against the render's
  // total of computed bytes.
  Status check_computed(const Value& v, size_t offset) {
    // A list or dict holding a namespace would keep the namespace's size as it was when it
    // was put there, while the namespace can still grow.
    if (v.holds_namespace() && !v.is_namespace()) {
      return error(offset, "a namespace cannot be put in a list or dict");
    }
    if (v.depth() > kMaxValueDepth) {
      return error(offset,
                   "a value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
    }
    if (v.weight() > limits_.max_value_bytes) {
      return error(offset,
                   "a value larger than " + std::to_string(limits_.max_value_bytes) + " bytes");
    }
    bytes_ += v.weight();
    if (bytes_ > limits_.max_computed_bytes) {
      return error(offset, "the template computed more than " +
                               std::to_string(limits_.max_computed_bytes) + " bytes of values");
    }
    return ok_status();
  }
  // What a namespace may hold. Namespaces are the one mutable value: holding none keeps
  // values acyclic and namespaces flat.
  Status check_namespace_member(const Value& value, size_t offset) const {
    if (value.holds_namespace()) return error(offset, "a namespace cannot hold a namespace");
    if (value.depth() > Value::kMaxNamespaceMemberDepth) {
      return error(offset, "a namespace attribute cannot hold a value nested deeper than " +
                               std::to_string(Value::kMaxNamespaceMemberDepth) + " levels");
    }
    return ok_status();
  }
  Status check_output(const std::string& out, size_t offset) const {
    if (out.size() > limits_.max_output_bytes) {
      return error(offset, "the rendered text is longer than " +
                               std::to_string(limits_.max_output_bytes) + " bytes");
    }
    return ok_status();
  }
  // Work that grows with a string's size (copying it out, counting its characters) is
  // charged as steps too, one per 64 bytes: a loop copying a 60 MB string cost 72 ms per
  // iteration at a few steps each, so a hostile template could hold a worker for hours.
  Status charge_bytes(size_t bytes, size_t offset) { return charge_steps(bytes / 64, offset); }

  // Strings are split into characters for iteration, indexing and slicing.
  Status check_characters(const std::string& s, size_t offset) {
    PS_RETURN_IF_ERROR(charge_bytes(s.size(), offset));
    if (static_cast<int64_t>(utf8::count_code_points(s)) > limits_.max_list_items) {
      return error(offset, "a string of more than " + std::to_string(limits_.max_list_items) +
                               " characters cannot be iterated, indexed or sliced");
    }
    return ok_status();
  }
  Status overflow(size_t offset, const std::string& what) const {
    return error(offset, "integer overflow in " + what + " (results must fit in 64 bits)");
  }
  static std::string undefined_label(const Value& v) {
    return v.undefined_name().empty() ? "undefined value"
                                      : "'" + v.undefined_name() + "' (undefined)";
  }
  static std::string describe(const Value& v) {
    return v.is_undefined() ? undefined_label(v) : std::string(v.type_name());
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    const auto found = globals_.find(name);
    if (found != globals_.end()) return found->second;
    return Value::undefined(name);
  }

  // ---- statements ----
  Result<Flow> exec(const NodeList& nodes, std::string& out) {
    for (const NodePtr& node : nodes) {
      PS_ASSIGN_OR_RETURN(Flow flow, exec_node(*node, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Result<Flow> exec_node(const Node& node, std::string& out) {
    switch (node.kind) {
      case NodeKind::kText:
        out += node.text;
        PS_RETURN_IF_ERROR(check_output(out, node.offset));
        return Flow::kNormal;
      case NodeKind::kOutput: {
        PS_ASSIGN_OR_RETURN(Value v, eval(*node.expr));
        const std::string text = to_str(v);
        PS_RETURN_IF_ERROR(charge_bytes(text.size(), node.offset));
        out += text;
        PS_RETURN_IF_ERROR(check_output(out, node.offset));
        return Flow::kNormal;
      }
      case NodeKind::kIf:
        for (const auto& [condition, body] : node.branches) {
          PS_ASSIGN_OR_RETURN(Value test, eval(*condition));
          if (test.truthy()) return exec(body, out);
        }
        return exec(node.else_body, out);
      case NodeKind::kFor:
        return exec_for(node, out);
      case NodeKind::kSet:
        PS_RETURN_IF_ERROR(exec_set(node));
        return Flow::kNormal;
      case NodeKind::kBreak:
        return Flow::kBreak;
      case NodeKind::kContinue:
        return Flow::kContinue;
      case NodeKind::kScope:
        return exec(node.body, out);
    }
    return Flow::kNormal;
  }

  Status assign_targets(const Node& node, const std::vector<std::string>& targets,
                        const Value& value) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = value;
      return ok_status();
    }
    if (!value.is_list() || value.as_list().size() != targets.size()) {
      return error(node.offset, "cannot unpack a " + describe(value) + " into " +
                                    std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = value.as_list()[i];
    return ok_status();
  }

  Status exec_set(const Node& node) {
    Value value;
    if (node.expr) {
      PS_ASSIGN_OR_RETURN(value, eval(*node.expr));
    } else {
      std::string text;
      PS_ASSIGN_OR_RETURN(Flow flow, exec(node.body, text));
      (void)flow;
      value = Value(std::move(text));
      PS_RETURN_IF_ERROR(check_computed(value, node.offset));  // a new string, like any
    }
    if (!node.attribute.empty()) {
      const Value target = lookup(node.targets[0]);
      if (!target.is_namespace()) {
        return error(node.offset, "cannot set attribute '" + node.attribute + "' on " +
                                      describe(target) + " '" + node.targets[0] +
                                      "' (only namespace() objects are assignable)");
      }
      PS_RETURN_IF_ERROR(check_namespace_member(value, node.offset));
      Namespace& ns = target.as_namespace();
      Value previous = ns[node.attribute];
      ns[node.attribute] = std::move(value);
      // The namespace as a whole is one value: many members sharing one large string would
      // print as their sum.
      if (target.weight() > limits_.max_value_bytes) {
        ns[node.attribute] = std::move(previous);
        return error(node.offset, "namespace '" + node.targets[0] + "' would hold more than " +
                                      std::to_string(limits_.max_value_bytes) + " bytes");
      }
      return ok_status();
    }
    return assign_targets(node, node.targets, value);
  }

  Result<List> iterate(const Value& v, size_t offset) {
    if (v.is_list()) return v.as_list();
    if (v.is_undefined()) return List{};
    if (v.is_dict()) {
      List keys;
      for (const auto& [key, item] : v.as_dict()) keys.emplace_back(key);
      return keys;
    }
    if (v.is_string()) {
      PS_RETURN_IF_ERROR(check_characters(v.as_string(), offset));
      List chars;
      for (std::string& cp : code_points(v.as_string())) chars.emplace_back(std::move(cp));
      return chars;
    }
    return error(offset, std::string("'") + v.type_name() + "' object is not iterable");
  }

  Result<Flow> exec_for(const Node& node, std::string& out) {
    PS_ASSIGN_OR_RETURN(Value iterable, eval(*node.expr));
    PS_ASSIGN_OR_RETURN(List items, iterate(iterable, node.expr->offset));
    PS_RETURN_IF_ERROR(charge_steps(items.size(), node.offset));  // the copy
    frames_.emplace_back();
    if (node.filter) {
      List kept;
      for (const Value& item : items) {
        PS_RETURN_IF_ERROR(charge_steps(1, node.offset));
        PS_RETURN_IF_ERROR(assign_targets(node, node.targets, item));
        PS_ASSIGN_OR_RETURN(Value keep, eval(*node.filter));
        if (keep.truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (Status charged = charge_steps(1, node.offset); !charged.ok()) {
        frames_.pop_back();
        return charged;
      }
      // Each iteration has its own scope, as in jinja2: a {% set %} in the body does not
      // carry over to the next iteration (nor out of the loop).
      frames_.back().clear();
      PS_RETURN_IF_ERROR(assign_targets(node, node.targets, items[static_cast<size_t>(i)]));
      Dict loop = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(1)},
          {"depth0", Value(0)},
          {"previtem",
           i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem")},
          {"nextitem",
           i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem")},
      };
      frames_.back()["loop"] = Value(std::move(loop));
      Result<Flow> flow = exec(node.body, out);
      if (!flow.ok()) {
        frames_.pop_back();
        return flow.status();
      }
      if (*flow == Flow::kBreak) break;
    }
    frames_.pop_back();
    if (n == 0) return exec(node.else_body, out);
    return Flow::kNormal;
  }

  // ---- expressions ----
  Result<Value> eval(const Expr& e) {
    PS_RETURN_IF_ERROR(charge_steps(1, e.offset));
    PS_ASSIGN_OR_RETURN(Value v, eval_uncounted(e));
    switch (e.kind) {
      case ExprKind::kLiteral:
      case ExprKind::kName:
      case ExprKind::kAttribute:
      case ExprKind::kItem:
        return v;  // existing data, not computed here
      default:
        PS_RETURN_IF_ERROR(check_computed(v, e.offset));
        return v;
    }
  }

  Result<Value> eval_uncounted(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        List items;
        for (const ExprPtr& arg : e.args) {
          PS_ASSIGN_OR_RETURN(Value v, eval(*arg));
          items.push_back(std::move(v));
        }
        if (e.kind == ExprKind::kTuple) return Value::tuple(std::move(items));
        return Value(std::move(items));
      }
      case ExprKind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          PS_ASSIGN_OR_RETURN(Value key, eval(*e.args[i]));
          if (!key.is_string()) return error(e.args[i]->offset, "dict keys must be strings");
          PS_ASSIGN_OR_RETURN(Value value, eval(*e.args[i + 1]));
          auto existing = std::find_if(dict.begin(), dict.end(),
                                       [&](auto& kv) { return kv.first == key.as_string(); });
          if (existing != dict.end()) {
            existing->second = std::move(value);
          } else {
            dict.emplace_back(key.as_string(), std::move(value));
          }
        }
        return Value(std::move(dict));
      }
      case ExprKind::kAttribute: {
        PS_ASSIGN_OR_RETURN(Value object, eval(*e.args[0]));
        if (object.is_undefined()) {
          return error(e.offset,
                       "cannot read attribute '" + e.name + "' of " + undefined_label(object));
        }
        if (const Value* member = object.find(e.name)) return *member;
        return Value::undefined(e.name);
      }
      case ExprKind::kItem: {
        PS_ASSIGN_OR_RETURN(Value object, eval(*e.args[0]));
        PS_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
        return get_item(object, key, e.offset);
      }
      case ExprKind::kSlice:
        return eval_slice(e);
      case ExprKind::kCall:
        return call_function(e);
      case ExprKind::kMethodCall:
        return call_method(e);
      case ExprKind::kFilter:
        return apply_filter(e);
      case ExprKind::kTest: {
        PS_ASSIGN_OR_RETURN(bool result, apply_test(e));
        return Value(result != e.negated);
      }
      case ExprKind::kNegate:
      case ExprKind::kPlus: {
        PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        if (!v.is_number()) {
          return error(e.offset, std::string("bad operand type for unary ") +
                                     (e.kind == ExprKind::kNegate ? "-" : "+") + ": " +
                                     describe(v));
        }
        if (e.kind == ExprKind::kPlus)
          return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
        if (v.is_float()) return Value(-v.as_double());
        const int64_t x = v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int();
        if (x == INT64_MIN) return overflow(e.offset, "unary -");
        return Value(-x);
      }
      case ExprKind::kNot: {
        PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        return Value(!v.truthy());
      }
      case ExprKind::kAnd: {
        PS_ASSIGN_OR_RETURN(Value left, eval(*e.args[0]));
        if (!left.truthy()) return left;
        return eval(*e.args[1]);
      }
      case ExprKind::kOr: {
        PS_ASSIGN_OR_RETURN(Value left, eval(*e.args[0]));
        if (left.truthy()) return left;
        return eval(*e.args[1]);
      }
      case ExprKind::kConditional: {
        PS_ASSIGN_OR_RETURN(Value test, eval(*e.args[1]));
        if (test.truthy()) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined();
      }
      case ExprKind::kBinary:
        return eval_binary(e);
      case ExprKind::kCompare:
        return eval_compare(e);
    }
    return error(e.offset, "internal: unknown expression");
  }

  Result<Value> get_item(const Value& object, const Value& key, size_t offset) {
    if (object.is_undefined()) {
      return error(offset, "cannot read item " + to_repr(key) + " of " + undefined_label(object));
    }
    if ((object.is_dict() || object.is_namespace()) && key.is_string()) {
      if (const Value* member = object.find(key.as_string())) return *member;
      return Value::undefined(key.as_string());
    }
    if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
      const int64_t raw = key.is_bool() ? key.as_bool() : key.as_int();
      if (object.is_list()) {
        const auto n = static_cast<int64_t>(object.as_list().size());
        const int64_t i = raw < 0 ? raw + n : raw;
        if (i < 0 || i >= n) return Value::undefined();
        return object.as_list()[static_cast<size_t>(i)];
      }
      PS_RETURN_IF_ERROR(check_characters(object.as_string(), offset));
      const std::vector<std::string> cps = code_points(object.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      const int64_t i = raw < 0 ? raw + n : raw;
      if (i < 0 || i >= n) return Value::undefined();
      return Value(cps[static_cast<size_t>(i)]);
    }
    return Value::undefined();
  }

  Result<Value> eval_slice(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Value object, eval(*e.args[0]));
    std::optional<int64_t> bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.args[static_cast<size_t>(i) + 1]) continue;
      PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[static_cast<size_t>(i) + 1]));
      if (v.is_none()) continue;
      if (!v.is_int()) return error(e.offset, "slice indices must be integers, got " + describe(v));
      bounds[i] = v.as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return error(e.offset, "slice step cannot be zero");
    List items;
    bool is_string = false;
    if (object.is_list()) {
      items = object.as_list();
    } else if (object.is_string()) {
      is_string = true;
      PS_RETURN_IF_ERROR(check_characters(object.as_string(), e.offset));
      for (std::string& cp : code_points(object.as_string())) items.emplace_back(std::move(cp));
    } else {
      return error(e.offset, "cannot slice " + describe(object));
    }
    const auto n = static_cast<int64_t>(items.size());
    // Python's slice.indices().
    const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], step > 0 ? n : -1);
    List out;
    // start and stop are within [-1, n]; a step near INT64_MAX must not wrap the index.
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      out.push_back(items[static_cast<size_t>(i)]);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (!is_string) return Value(std::move(out));
    std::string text;
    for (const Value& cp : out) text += cp.as_string();
    return Value(std::move(text));
  }

  Result<Value> eval_binary(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    PS_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    const std::string& op = e.name;
    if (op == "~") {
      std::string left = to_str(a);
      std::string right = to_str(b);
      if (left.size() + right.size() > limits_.max_value_bytes) {
        return error(e.offset, "'~' would make a string longer than " +
                                   std::to_string(limits_.max_value_bytes) + " bytes");
      }
      return Value(std::move(left) + right);
    }
    const auto type_error = [&]() {
      return error(e.offset, "unsupported operand types for " + op + ": " + describe(a) + " and " +
                                 describe(b));
    };
    if (op == "+") {
      if ((a.is_string() && b.is_string()) || (a.is_list() && b.is_list())) {
        if (a.weight() + b.weight() > limits_.max_value_bytes) {
          return error(e.offset, "'+' would make a value larger than " +
                                     std::to_string(limits_.max_value_bytes) + " bytes");
        }
      }
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        List out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(out));
      }
    }
    if (op == "*") {
      const Value* text = a.is_string() || a.is_list()   ? &a
                          : b.is_string() || b.is_list() ? &b
                                                         : nullptr;
      const Value* count = text == &a ? &b : &a;
      if (text != nullptr && (count->is_int() || count->is_bool())) {
        const int64_t times = count->is_bool() ? count->as_bool() : count->as_int();
        // Checked before allocating: the product, not the count, is what can explode.
        const uint64_t unit = text->is_string() ? text->as_string().size() : text->weight();
        const uint64_t items = text->is_string() ? 0 : text->as_list().size();
        if (times > 0 && (unit > limits_.max_value_bytes / static_cast<uint64_t>(times) ||
                          items > static_cast<uint64_t>(limits_.max_list_items / times))) {
          return error(e.offset, "repetition would make a value larger than " +
                                     std::to_string(limits_.max_value_bytes) + " bytes or " +
                                     std::to_string(limits_.max_list_items) + " items");
        }
        if (text->is_string()) {
          // '' * 10**18 passes the size check and would loop 10**18 times.
          if (text->as_string().empty() || times <= 0) return Value(std::string());
          std::string out;
          for (int64_t i = 0; i < times; ++i) out += text->as_string();
          return Value(std::move(out));
        }
        List out;
        for (int64_t i = 0; i < times; ++i)
          out.insert(out.end(), text->as_list().begin(), text->as_list().end());
        return Value(std::move(out));
      }
    }
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool floats = a.is_float() || b.is_float() || op == "/";
    if (floats || op == "**") {
      const double x = a.as_double();
      const double y = b.as_double();
      if (op == "**" && !floats) {
        const int64_t base = a.is_bool() ? a.as_bool() : a.as_int();
        const int64_t exponent = b.is_bool() ? b.as_bool() : b.as_int();
        if (exponent >= 0) {
          // Square and multiply, every product checked.
          int64_t result = 1;
          int64_t square = base;
          for (int64_t rest = exponent; rest > 0; rest >>= 1) {
            if ((rest & 1) != 0 && __builtin_mul_overflow(result, square, &result)) {
              return overflow(e.offset, "**");
            }
            if (rest > 1 && __builtin_mul_overflow(square, square, &square)) {
              return overflow(e.offset, "**");
            }
          }
          return Value(result);
        }
        return Value(std::pow(x, y));
      }
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(std::pow(x, y));
      if (y == 0.0) return error(e.offset, "division by zero");
      if (op == "/") return Value(x / y);
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") return Value(x - std::floor(x / y) * y);
      return type_error();
    }
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    int64_t result = 0;
    if (op == "+") {
      if (__builtin_add_overflow(x, y, &result)) return overflow(e.offset, "+");
      return Value(result);
    }
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &result)) return overflow(e.offset, "-");
      return Value(result);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &result)) return overflow(e.offset, "*");
      return Value(result);
    }
    if (y == 0) return error(e.offset, "integer division or modulo by zero");
    // INT64_MIN / -1 traps in hardware: its quotient 2^63 does not fit, its remainder is 0.
    if (y == -1) {
      if (op == "%") return Value(int64_t{0});
      if (op == "//") {
        if (x == INT64_MIN) return overflow(e.offset, "//");
        return Value(-x);
      }
    }
    // Python floors (the result of % takes the divisor's sign). The remainder is corrected
    // by adding y, not recomputed as x - q * y: q * y can pass INT64_MIN (INT64_MIN % 77).
    int64_t q = x / y;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;  // |y| >= 2 here, so |q| <= 2^62
      r += y;
    }
    if (op == "//") return Value(q);
    if (op == "%") return Value(r);
    return type_error();
  }

  Result<bool> contains(const Value& container, const Value& item, size_t offset) {
    if (container.is_string()) {
      if (!item.is_string()) {
        return error(offset, "'in <string>' requires a string on the left, not " + describe(item));
      }
      PS_RETURN_IF_ERROR(
          charge_search(container.as_string().size(), item.as_string().size(), offset));
      return container.as_string().find(item.as_string()) != std::string::npos;
    }
    if (container.is_list()) {
      PS_RETURN_IF_ERROR(charge_steps(container.as_list().size(), offset));
      for (const Value& v : container.as_list()) {
        if (equals(v, item)) return true;
      }
      return false;
    }
    if (container.is_dict() || container.is_namespace()) {
      return item.is_string() && container.find(item.as_string()) != nullptr;
    }
    if (container.is_undefined()) return false;
    return error(offset,
                 std::string("argument of type '") + container.type_name() + "' is not iterable");
  }

  Result<Value> eval_compare(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    PS_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    return compare(e.name, a, b, e.offset);
  }

  Result<Value> compare(const std::string& op, const Value& a, const Value& b, size_t offset) {
    // Comparing containers walks them.
    PS_RETURN_IF_ERROR(
        charge_steps(std::min(a.weight(), b.weight()) / Value::kScalarWeight, offset));
    if (op == "==") return Value(equals(a, b));
    if (op == "!=") return Value(!equals(a, b));
    if (op == "in" || op == "notin") {
      PS_ASSIGN_OR_RETURN(bool found, contains(b, a, offset));
      return Value(op == "in" ? found : !found);
    }
    Result<bool> less = op == "<" || op == ">=" ? less_than(a, b) : less_than(b, a);
    if (!less.ok()) return error(offset, less.status().message());
    if (op == "<" || op == ">") return Value(*less);
    return Value(!*less);  // <= is !(b < a); >= is !(a < b)
  }

  // ---- calls ----
  struct Args {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
    const Value* get(size_t index, const char* name) const {
      for (const auto& [key, value] : keyword) {
        if (key == name) return &value;
      }
      return index < positional.size() ? &positional[index] : nullptr;
    }
  };

  // Evaluates e.args[first..] and e.kwargs.
  Result<Args> eval_args(const Expr& e, size_t first) {
    Args args;
    for (size_t i = first; i < e.args.size(); ++i) {
      PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      PS_ASSIGN_OR_RETURN(Value v, eval(*expr));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  Result<int64_t> int_arg(const Value* v, int64_t fallback, const Expr& e, const char* what) const {
    return int_arg(v, fallback, e.offset, what);
  }
  Result<int64_t> int_arg(const Value* v, int64_t fallback, size_t offset, const char* what) const {
    if (v == nullptr || v->is_none()) return fallback;
    if (!v->is_int())
      return error(offset, std::string(what) + " must be an integer, got " + describe(*v));
    return v->as_int();
  }

  Result<Value> call_function(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Args args, eval_args(e, 0));
    if (e.name == "raise_exception") {
      const std::string message = args.positional.empty() ? "" : to_str(args.positional[0]);
      return invalid_argument("chat template raised an error: " + message);
    }
    if (e.name == "namespace") {
      auto ns = std::make_shared<Namespace>();
      for (const Value& v : args.positional) {
        if (!v.is_dict()) return error(e.offset, "namespace() takes keyword arguments or a dict");
        for (const auto& [key, item] : v.as_dict()) (*ns)[key] = item;
      }
      for (auto& [key, value] : args.keyword) (*ns)[key] = value;
      // The rules of `set ns.attr`: namespace(a=other_ns) in a loop built a chain as deep as
      // the loop was long, whose destruction overflowed the stack.
      for (const auto& [key, member] : *ns) {
        PS_RETURN_IF_ERROR(check_namespace_member(member, e.offset));
      }
      return Value(ns);
    }
    if (e.name == "strftime_now") {
      // transformers' global: the local time now, formatted (Llama 3.x templates date their
      // system prompt with it).
      if (args.positional.size() != 1 || !args.positional[0].is_string()) {
        return error(e.offset, "strftime_now() takes one format string");
      }
      const std::string& format = args.positional[0].as_string();
      if (format.size() > 64) return error(e.offset, "strftime_now() format longer than 64");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[512];
      const size_t n = std::strftime(buffer, sizeof(buffer), format.c_str(), &local);
      return Value(std::string(buffer, n));
    }
    if (e.name == "dict") {
      Dict dict;
      for (auto& [key, value] : args.keyword) dict.emplace_back(key, value);
      return Value(std::move(dict));
    }
    if (e.name == "range") {
      if (args.positional.empty() || args.positional.size() > 3) {
        return error(e.offset, "range() takes 1 to 3 integer arguments");
      }
      int64_t bounds[3] = {0, 0, 1};
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (!args.positional[i].is_int())
          return error(e.offset, "range() arguments must be integers");
      }
      if (args.positional.size() == 1) {
        bounds[1] = args.positional[0].as_int();
      } else {
        bounds[0] = args.positional[0].as_int();
        bounds[1] = args.positional[1].as_int();
        if (args.positional.size() == 3) bounds[2] = args.positional[2].as_int();
      }
      if (bounds[2] == 0) return error(e.offset, "range() step must not be zero");
      List out;
      for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1];) {
        if (static_cast<int64_t>(out.size()) >= limits_.max_list_items) {
          return error(e.offset,
                       "range() longer than " + std::to_string(limits_.max_list_items) + " items");
        }
        out.emplace_back(i);
        if (__builtin_add_overflow(i, bounds[2], &i)) break;  // past INT64 bounds: done
      }
      return Value(std::move(out));
    }
    return error(e.offset, "unsupported function '" + e.name + "()'");
  }

  Result<Value> call_method(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Value object, eval(*e.args[0]));
    PS_ASSIGN_OR_RETURN(Args args, eval_args(e, 1));
    const std::string& m = e.name;
    if (object.is_string()) {
      const std::string& s = object.as_string();
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        PS_RETURN_IF_ERROR(charge_scan(s.size(), e.offset));
        if (const Value* chars = args.get(0, "chars"); chars != nullptr && chars->is_string()) {
          PS_RETURN_IF_ERROR(check_characters(chars->as_string(), e.offset));
          // Each of up to s.size() characters is looked up among the chars: the same bound.
          PS_RETURN_IF_ERROR(charge_search(s.size() + chars->as_string().size(),
                                           chars->as_string().size(), e.offset));
        }
        return Value(strip(s, args.get(0, "chars"), m != "rstrip", m != "lstrip"));
      }
      if (m == "split") {
        const Value* sep = args.get(0, "sep");
        if (sep != nullptr && !sep->is_none() && (!sep->is_string() || sep->as_string().empty())) {
          return error(e.offset, "split() separator must be a non-empty string");
        }
        PS_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(args.get(1, "maxsplit"), -1, e, "maxsplit"));
        if (sep == nullptr || sep->is_none()) PS_RETURN_IF_ERROR(check_characters(s, e.offset));
        if (sep != nullptr && sep->is_string()) {
          PS_RETURN_IF_ERROR(charge_search(s.size(), sep->as_string().size(), e.offset));
        }
        std::optional<List> parts = split(s, sep, maxsplit, limits_.max_list_items);
        if (!parts) {
          return error(e.offset, "split() would make more than " +
                                     std::to_string(limits_.max_list_items) + " pieces");
        }
        return Value(std::move(*parts));
      }
      if (m == "startswith" || m == "endswith") {
        const Value* what = args.get(0, "prefix");
        if (what == nullptr) return error(e.offset, m + "() needs an argument");
        List options = what->is_list() ? what->as_list() : List{*what};
        for (const Value& option : options) {
          if (!option.is_string()) return error(e.offset, m + "() argument must be a string");
          const std::string& p = option.as_string();
          PS_RETURN_IF_ERROR(charge_bytes(std::min(p.size(), s.size()), e.offset));
          const bool hit = p.size() <= s.size() &&
                           (m == "startswith" ? s.compare(0, p.size(), p) == 0
                                              : s.compare(s.size() - p.size(), p.size(), p) == 0);
          if (hit) return Value(true);
        }
        return Value(false);
      }
      if (m == "upper") return Value(ascii_upper(s));
      if (m == "lower") return Value(ascii_lower(s));
      if (m == "title") return Value(title_case(s));
      if (m == "capitalize") {
        std::string out = ascii_lower(s);
        if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
        return Value(out);
      }
      if (m == "replace") {
        const Value* from = args.get(0, "old");
        const Value* to = args.get(1, "new");
        if (from == nullptr || to == nullptr || !from->is_string() || !to->is_string()) {
          return error(e.offset, "replace() takes two strings");
        }
        PS_ASSIGN_OR_RETURN(int64_t count, int_arg(args.get(2, "count"), -1, e, "count"));
        if (from->as_string().empty()) PS_RETURN_IF_ERROR(check_characters(s, e.offset));
        PS_RETURN_IF_ERROR(charge_search(s.size(), from->as_string().size(), e.offset));
        return replaced(
            replace_all(s, from->as_string(), to->as_string(), count, limits_.max_value_bytes),
            e.offset);
      }
    }
    if (object.is_dict() || object.is_namespace()) {
      Dict items;
      if (object.is_dict()) {
        items = object.as_dict();
      } else {
        for (const auto& [key, value] : object.as_namespace()) items.emplace_back(key, value);
      }
      if (m == "items") {
        List out;
        for (const auto& [key, value] : items) out.push_back(Value::tuple(List{Value(key), value}));
        return Value(std::move(out));
      }
      if (m == "keys" || m == "values") {
        List out;
        for (const auto& [key, value] : items) out.push_back(m == "keys" ? Value(key) : value);
        return Value(std::move(out));
      }
      if (m == "get") {
        const Value* key = args.get(0, "key");
        if (key == nullptr) return error(e.offset, "get() needs a key");
        if (key->is_string()) {
          if (const Value* found = object.find(key->as_string())) return *found;
        }
        const Value* fallback = args.get(1, "default");
        return fallback != nullptr ? *fallback : Value::none();
      }
    }
    return error(e.offset, "'" + std::string(object.type_name()) + "' has no method '" + m + "()'" +
                               (object.is_undefined() ? " (" + undefined_label(object) + ")" : ""));
  }

  Result<Value> replaced(std::optional<std::string> text, size_t offset) const {
    if (!text) {
      return error(offset, "replace() would make a string longer than " +
                               std::to_string(limits_.max_value_bytes) + " bytes");
    }
    return Value(std::move(*text));
  }

  // ---- filters ----
  Result<Value> apply_filter(const Expr& e) {
    PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
    PS_ASSIGN_OR_RETURN(Args args, eval_args(e, 1));
    return filter_value(e.name, std::move(v), args, FilterSite{e.offset});
  }

  // Where a filter or test is applied (for messages): the expression's offset.
  struct FilterSite {
    size_t offset;
  };

  // The items of `v` (a list, or a dict's keys, or a string's characters) kept or dropped by
  // `keep`, for select/reject/selectattr/rejectattr.
  Result<Value> filter_items(const Value& v, size_t offset,
                             const std::function<Result<bool>(const Value&)>& keep) {
    PS_ASSIGN_OR_RETURN(List items, iterate(v, offset));
    PS_RETURN_IF_ERROR(charge_steps(items.size(), offset));
    List kept;
    for (Value& item : items) {
      PS_ASSIGN_OR_RETURN(bool yes, keep(item));
      if (yes) kept.push_back(std::move(item));
    }
    return Value(std::move(kept));
  }

  // An item's attribute as jinja2's attribute= arguments read it: "a.b" walks members;
  // list items by a number ("0"). Undefined if the last is missing; an error if one before
  // it is (as jinja2's undefined raises when read further).
  Result<Value> attribute_of(const Value& item, const std::string& path, size_t offset) {
    Value current = item;
    size_t start = 0;
    while (start <= path.size()) {
      const size_t dot = path.find('.', start);
      const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      const Value* member = current.find(part);
      if (member == nullptr && current.is_list() && !part.empty() &&
          part.find_first_not_of("0123456789") == std::string::npos && part.size() < 10) {
        const size_t index = std::stoul(part);
        if (index < current.as_list().size()) member = &current.as_list()[index];
      }
      if (member == nullptr) {
        if (dot == std::string::npos) return Value::undefined(part);
        return error(offset, "cannot read '" + path.substr(dot + 1) + "' of undefined '" + part +
                                 "' (attribute '" + path + "')");
      }
      Value next = *member;  // (member points into current)
      current = std::move(next);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return current;
  }

  Result<Value> filter_value(const std::string& f, Value v, const Args& args, FilterSite site) {
    const size_t offset = site.offset;
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool want = f == "select" || f == "selectattr";
      std::string attribute;
      size_t next = 0;
      if (by_attr) {
        if (args.positional.empty() || !args.positional[0].is_string()) {
          return error(offset, f + "() needs the attribute's name");
        }
        attribute = args.positional[0].as_string();
        next = 1;
      }
      // No test: the value's truth, as jinja2.
      std::string test;
      if (args.positional.size() > next) {
        if (!args.positional[next].is_string()) return error(offset, f + "(): a test's name");
        test = args.positional[next].as_string();
        if (!is_supported_test(test)) return error(offset, "unsupported test '" + test + "'");
      }
      const Value* test_arg =
          args.positional.size() > next + 1 ? &args.positional[next + 1] : nullptr;
      return filter_items(v, offset, [&](const Value& item) -> Result<bool> {
        Value subject = item;
        if (by_attr) {
          PS_ASSIGN_OR_RETURN(subject, attribute_of(item, attribute, offset));
        }
        if (test.empty()) return subject.truthy() == want;
        PS_ASSIGN_OR_RETURN(bool passed, test_value(test, subject, test_arg, offset));
        return passed == want;
      });
    }
    if (f == "map") {
      PS_ASSIGN_OR_RETURN(List items, iterate(v, offset));
      PS_RETURN_IF_ERROR(charge_steps(items.size(), offset));
      List out;
      out.reserve(items.size());
      if (const Value* attribute = args.get(SIZE_MAX, "attribute")) {
        if (!attribute->is_string()) return error(offset, "map(attribute=) needs a string");
        const Value* fallback = args.get(SIZE_MAX, "default");
        for (const Value& item : items) {
          PS_ASSIGN_OR_RETURN(Value got, attribute_of(item, attribute->as_string(), offset));
          out.push_back(got.is_undefined() && fallback != nullptr ? *fallback : std::move(got));
        }
        return Value(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return error(offset, "map() needs a filter's name or attribute=");
      }
      const std::string name = args.positional[0].as_string();
      if (!is_supported_filter(name)) return error(offset, "unsupported filter '" + name + "'");
      Args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keyword = args.keyword;
      for (Value& item : items) {
        PS_ASSIGN_OR_RETURN(Value mapped, filter_value(name, std::move(item), rest, site));
        out.push_back(std::move(mapped));
      }
      return Value(std::move(out));
    }
    if (f == "default" || f == "d") {
      const Value* fallback = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      const bool use = v.is_undefined() || (boolean != nullptr && boolean->truthy() && !v.truthy());
      return use ? (fallback != nullptr ? *fallback : Value(std::string())) : v;
    }
    if (f == "safe") return v;
    if (f == "string") return Value(to_str(v));
    if (f == "length" || f == "count") {
      if (v.is_string()) {
        PS_RETURN_IF_ERROR(charge_bytes(v.as_string().size(), offset));
        return Value(static_cast<int64_t>(utf8::count_code_points(v.as_string())));
      }
      if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
      if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().size()));
      if (v.is_undefined()) return Value(0);
      return error(offset, "object of type '" + std::string(v.type_name()) + "' has no len()");
    }
    if (f == "trim") {
      std::string text = to_str(v);
      PS_RETURN_IF_ERROR(charge_scan(text.size(), offset));
      if (const Value* chars = args.get(0, "chars"); chars != nullptr && chars->is_string()) {
        PS_RETURN_IF_ERROR(check_characters(chars->as_string(), offset));
        PS_RETURN_IF_ERROR(charge_search(text.size() + chars->as_string().size(),
                                         chars->as_string().size(), offset));
      }
      return Value(strip(text, args.get(0, "chars"), true, true));
    }
    if (f == "upper") return Value(ascii_upper(to_str(v)));
    if (f == "lower") return Value(ascii_lower(to_str(v)));
    if (f == "title") return Value(title_case(to_str(v)));
    if (f == "capitalize") {
      std::string out = ascii_lower(to_str(v));
      if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
      return Value(out);
    }
    if (f == "replace") {
      const Value* from = args.get(0, "old");
      const Value* to = args.get(1, "new");
      if (from == nullptr || to == nullptr) return error(offset, "replace needs two arguments");
      PS_ASSIGN_OR_RETURN(int64_t count, int_arg(args.get(2, "count"), -1, offset, "count"));
      // Each converted once (message contents can be megabytes).
      const std::string text = to_str(v), old_text = to_str(*from);
      if (old_text.empty()) PS_RETURN_IF_ERROR(check_characters(text, offset));
      PS_RETURN_IF_ERROR(charge_search(text.size(), old_text.size(), offset));
      return replaced(replace_all(text, old_text, to_str(*to), count, limits_.max_value_bytes),
                      offset);
    }
    if (f == "tojson") {
      // transformers' filter: tojson(x, ensure_ascii=False, indent=None, separators=None,
      // sort_keys=False), positionally in that order.
      JsonTextOptions options;
      options.max_bytes = limits_.max_value_bytes;
      if (const Value* a = args.get(0, "ensure_ascii")) options.ensure_ascii = a->truthy();
      PS_ASSIGN_OR_RETURN(int64_t indent, int_arg(args.get(1, "indent"), -1, offset, "indent"));
      constexpr int64_t kMaxIndent = 64;
      if (indent > kMaxIndent) return error(offset, "tojson indent larger than 64");
      options.indent = static_cast<int>(std::max<int64_t>(indent, -1));
      if (const Value* separators = args.get(2, "separators");
          separators != nullptr && !separators->is_none()) {
        if (!separators->is_list() || separators->as_list().size() != 2 ||
            !separators->as_list()[0].is_string() || !separators->as_list()[1].is_string() ||
            separators->as_list()[0].as_string().size() > 16 ||
            separators->as_list()[1].as_string().size() > 16) {
          return error(offset, "tojson separators must be two short strings");
        }
        options.item_separator = separators->as_list()[0].as_string();
        options.key_separator = separators->as_list()[1].as_string();
      }
      if (const Value* sort_keys = args.get(3, "sort_keys"))
        options.sort_keys = sort_keys->truthy();
      auto text = to_json_text(v, options);
      if (!text.ok()) return error(offset, text.status().message());
      return Value(std::move(text).value());
    }
    if (f == "int") {
      if (v.is_int()) return v;
      if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
      if (v.is_float()) {
        // Python's int() truncates; out of the int64 range (or nan/inf) it cannot here.
        const double d = std::trunc(v.as_double());
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
          return error(offset,
                       "int() of " + float_repr(v.as_double()) + " does not fit in 64 bits");
        }
        return Value(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        // jinja2: int(text), else int(float(text)) ("3.9" -> 3, "1e3" -> 1000); Python's int()
        // takes surrounding space and single underscores between digits ("1_000").
        PS_RETURN_IF_ERROR(charge_scan(v.as_string().size(), offset));
        const std::string s = strip(v.as_string(), nullptr, true, true);
        std::string digits;
        bool well_placed = !s.empty() && s.front() != '_' && s.back() != '_';
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '_') {
            well_placed = well_placed && i > 0 &&
                          std::isdigit(static_cast<unsigned char>(s[i - 1])) && i + 1 < s.size() &&
                          std::isdigit(static_cast<unsigned char>(s[i + 1]));
          } else {
            digits += s[i];
          }
        }
        if (well_placed) {
          try {
            size_t used = 0;
            const long long parsed = std::stoll(digits, &used);
            if (used == digits.size()) return Value(static_cast<int64_t>(parsed));
          } catch (...) {
          }
        }
        // int(float(text)): the default for nan (ValueError) and for what float() refuses
        // ("0x1A": strtod would read 26); inf is an error, as Debian's jinja2 3.1.2 raises
        // OverflowError (3.1.6 gives the default).
        if (const std::optional<double> d = python_float(s); d && !std::isnan(*d)) {
          if (!(std::trunc(*d) >= -9223372036854775808.0 &&
                std::trunc(*d) < 9223372036854775808.0)) {
            return error(offset, "int() of '" + s + "' does not fit in 64 bits");
          }
          return Value(static_cast<int64_t>(std::trunc(*d)));
        }
      }
      const Value* fallback = args.get(0, "default");
      return fallback != nullptr ? *fallback : Value(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value(v.as_double());
      if (v.is_string()) {
        PS_RETURN_IF_ERROR(charge_scan(v.as_string().size(), offset));
        if (const std::optional<double> parsed = python_float(v.as_string())) {
          return Value(*parsed);
        }
      }
      const Value* fallback = args.get(0, "default");
      return fallback != nullptr ? *fallback : Value(0.0);
    }
    if (f == "abs") {
      if (v.is_float()) return Value(std::fabs(v.as_double()));
      if (v.is_int()) {
        if (v.as_int() == INT64_MIN) return overflow(offset, "abs()");
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
      return error(offset, "bad operand type for abs(): " + describe(v));
    }
    if (f == "round") {
      if (!v.is_number()) return error(offset, "round needs a number, got " + describe(v));
      PS_ASSIGN_OR_RETURN(int64_t precision,
                          int_arg(args.get(0, "precision"), 0, offset, "precision"));
      const Value* method = args.get(1, "method");
      const std::string how =
          method != nullptr && method->is_string() ? method->as_string() : "common";
      // "common" is Python's round(): an integer stays one (precision >= 0), and halves go
      // to the even neighbour (2.5 -> 2.0); floor and ceil give floats.
      if (how == "common" && v.is_int() && precision >= 0) return v;
      if (how == "common" && precision >= 0) {
        // Python rounds the exact binary value (2.675 is 2.67499..., so 2.67): so does
        // printf, ties to even. Past 30 places a double has nothing left to round.
        if (precision > 30 || !std::isfinite(v.as_double())) return Value(v.as_double());
        char text[512];
        std::snprintf(text, sizeof(text), "%.*f", static_cast<int>(precision), v.as_double());
        return Value(std::strtod(text, nullptr));
      }
      const double scale = std::pow(10.0, static_cast<double>(precision));
      const double x = v.as_double() * scale;
      double r;
      if (how == "floor") {
        r = std::floor(x);
      } else if (how == "ceil") {
        r = std::ceil(x);
      } else if (how == "common") {
        r = std::nearbyint(x);  // the default rounding mode: to nearest, ties to even
      } else {
        return error(offset, "round method must be common, ceil or floor");
      }
      return Value(r / scale);
    }
    if (f == "items") {
      if (v.is_undefined()) return Value(List{});
      if (!v.is_dict()) return error(offset, "items filter needs a mapping, got " + describe(v));
      List out;
      for (const auto& [key, value] : v.as_dict()) {
        out.push_back(Value::tuple(List{Value(key), value}));
      }
      return Value(std::move(out));
    }
    // Filters over sequences.
    PS_ASSIGN_OR_RETURN(List items, iterate(v, offset));
    if (f == "list") return Value(std::move(items));
    if (f == "first") return items.empty() ? Value::undefined("first") : items.front();
    if (f == "last") return items.empty() ? Value::undefined("last") : items.back();
    if (f == "join") {
      const Value* separator = args.get(0, "d");
      const std::string sep = separator != nullptr ? to_str(*separator) : "";
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += sep;
        out += to_str(items[i]);
        if (out.size() > limits_.max_value_bytes) {
          return error(offset, "join would make a string longer than " +
                                   std::to_string(limits_.max_value_bytes) + " bytes");
        }
      }
      return Value(std::move(out));
    }
    if (f == "reverse") {
      std::reverse(items.begin(), items.end());
      if (!v.is_string()) return Value(std::move(items));
      std::string out;
      for (const Value& cp : items) out += cp.as_string();
      return Value(std::move(out));
    }
    if (f == "sort" || f == "unique") {
      // jinja2: sort(reverse=False, case_sensitive=False, attribute=None) and
      // unique(case_sensitive=False, attribute=None); strings compare without case unless
      // asked, and items by their attribute ("a.b", or "a,b" for several keys to sort by).
      const bool is_sort = f == "sort";
      const Value* reverse = is_sort ? args.get(0, "reverse") : nullptr;
      const Value* case_sensitive = args.get(is_sort ? 1 : 0, "case_sensitive");
      const Value* attribute = args.get(is_sort ? 2 : 1, "attribute");
      const bool fold = case_sensitive == nullptr || !case_sensitive->truthy();
      std::vector<std::string> paths;
      if (attribute != nullptr && !attribute->is_none()) {
        const std::string spec = to_str(*attribute);
        size_t start = 0;
        while (true) {
          const size_t comma = spec.find(',', start);
          paths.push_back(
              strip(spec.substr(start, comma == std::string::npos ? comma : comma - start), nullptr,
                    true, true));
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
      }
      // The key each item is compared by.
      std::vector<List> keys;
      keys.reserve(items.size());
      for (const Value& item : items) {
        List key;
        if (paths.empty()) {
          key.push_back(item);
        } else {
          for (const std::string& path : paths) {
            PS_ASSIGN_OR_RETURN(Value part, attribute_of(item, path, offset));
            key.push_back(std::move(part));
          }
        }
        if (fold) {
          for (Value& part : key) {
            if (part.is_string()) part = Value(ascii_lower(part.as_string()));
          }
        }
        keys.push_back(std::move(key));
      }
      if (!is_sort) {
        List out;
        std::vector<size_t> kept;
        for (size_t i = 0; i < items.size(); ++i) {
          PS_RETURN_IF_ERROR(charge_steps(kept.size() + 1, offset));  // quadratic
          const bool seen = std::any_of(kept.begin(), kept.end(), [&](size_t k) {
            return equals(Value(keys[k]), Value(keys[i]));
          });
          if (!seen) {
            kept.push_back(i);
            out.push_back(items[i]);
          }
        }
        return Value(std::move(out));
      }
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      const bool descending = reverse != nullptr && reverse->truthy();
      Status failure = ok_status();
      // Stable either way, as Python's sorted(reverse=True): equal keys keep their order.
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        Result<bool> less = descending ? less_than(Value(keys[b]), Value(keys[a]))
                                       : less_than(Value(keys[a]), Value(keys[b]));
        if (!less.ok()) {
          failure = less.status();
          return false;
        }
        return *less;
      });
      if (!failure.ok()) return error(offset, failure.message());
      List out;
      out.reserve(order.size());
      for (size_t i : order) out.push_back(items[i]);
      return Value(std::move(out));
    }
    return error(offset, "unsupported filter '|" + f + "'");
  }

  // ---- tests ----
  Result<bool> apply_test(const Expr& e) {
    // The global functions are names jinja2 knows: `strftime_now is defined` is true there
    // (templates test it before calling), unless a variable of that name hides it.
    if ((e.name == "defined" || e.name == "undefined") && e.args[0]->kind == ExprKind::kName &&
        is_supported_function(e.args[0]->name) && lookup(e.args[0]->name).is_undefined()) {
      return e.name == "defined";
    }
    PS_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
    PS_ASSIGN_OR_RETURN(Args args, eval_args(e, 1));
    return test_value(e.name, v, args.get(0, "other"), e.offset);
  }

  Result<bool> test_value(const std::string& t, const Value& v, const Value* arg, size_t offset) {
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_int();
    if (t == "float") return v.is_float();
    if (t == "boolean") return v.is_bool();
    if (t == "true") return v.is_bool() && v.as_bool();
    if (t == "false") return v.is_bool() && !v.as_bool();
    if (t == "mapping") return v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    if (t == "callable") return false;
    if (t == "lower" || t == "upper") {
      if (!v.is_string()) return false;
      const std::string& s = v.as_string();
      return t == "lower" ? s == ascii_lower(s) && s != ascii_upper(s)
                          : s == ascii_upper(s) && s != ascii_lower(s);
    }
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (!v.is_int())
        return error(offset, "test '" + t + "' needs an integer, got " + describe(v));
      if (t == "odd") return v.as_int() % 2 != 0;
      if (t == "even") return v.as_int() % 2 == 0;
      if (arg == nullptr || !arg->is_int() || arg->as_int() == 0) {
        return error(offset, "divisibleby needs a non-zero integer");
      }
      if (arg->as_int() == -1) return true;  // INT64_MIN % -1 traps
      return v.as_int() % arg->as_int() == 0;
    }
    if (arg == nullptr) return error(offset, "test '" + t + "' needs an argument");
    if (t == "sameas") return equals(v, *arg) && v.type_name() == arg->type_name();
    if (t == "in") {
      PS_ASSIGN_OR_RETURN(bool found, contains(*arg, v, offset));
      return found;
    }
    static const std::unordered_map<std::string, std::string> kAliases = {
        {"eq", "=="}, {"equalto", "=="}, {"ne", "!="}, {"lt", "<"},  {"le", "<="},
        {"gt", ">"},  {"ge", ">="},      {"==", "=="}, {"!=", "!="}, {"<", "<"},
        {"<=", "<="}, {">", ">"},        {">=", ">="}};
    const auto alias = kAliases.find(t);
    if (alias == kAliases.end()) return error(offset, "unsupported test 'is " + t + "'");
    PS_ASSIGN_OR_RETURN(Value result, compare(alias->second, v, *arg, offset));
    return result.as_bool();
  }

  std::string_view src_;
  const RenderLimits limits_;
  std::unordered_map<std::string, Value> globals_;
  std::vector<Frame> frames_;
  uint64_t steps_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

Result<std::string> render_template(std::string_view source, const NodeList& nodes,
                                    const nlohmann::ordered_json& variables,
                                    const RenderLimits& limits) {
  if (!variables.is_object()) {
    return invalid_argument("chat template: variables must be a JSON object, got " +
                            std::string(variables.type_name()));
  }
  // Values are converted and printed recursively: bound the nesting of request data.
  constexpr size_t kMaxDepth = kMaxVariableDepth;
  std::vector<std::pair<const nlohmann::ordered_json*, size_t>> stack = {{&variables, 1}};
  while (!stack.empty()) {
    const auto [value, depth] = stack.back();
    stack.pop_back();
    if (depth > kMaxDepth) {
      return invalid_argument("chat template: variables are nested deeper than " +
                              std::to_string(kMaxDepth) + " levels");
    }
    if (value->is_structured()) {
      for (const auto& child : *value) stack.emplace_back(&child, depth + 1);
    }
  }
  return Interpreter(source, variables, limits).run(nodes);
}

}  // namespace peerserve::jinja

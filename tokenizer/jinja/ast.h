// Syntax tree of a parsed chat template.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace peerserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,      // literal
  kName,         // name
  kList,         // args = items
  kTuple,        // args = items (evaluates to a list)
  kDict,         // args = keys and values, alternating
  kAttribute,    // args[0].name
  kItem,         // args[0][args[1]]
  kSlice,        // args[0][args[1]:args[2]:args[3]] (null children = omitted)
  kCall,         // name(args, kwargs): a global function
  kMethodCall,   // args[0].name(args[1..], kwargs)
  kFilter,       // args[0] | name(args[1..], kwargs)
  kTest,         // args[0] is [not] name(args[1..])
  kNegate,       // -args[0]
  kPlus,         // +args[0]
  kNot,          // not args[0]
  kBinary,       // args[0] <name> args[1]: + - * / // % ** ~
  kCompare,      // args[0] <name> args[1]: == != < <= > >= in notin
  kAnd,          // args[0] and args[1]
  kOr,           // args[0] or args[1]
  kConditional,  // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  std::string name;
  Value literal;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

enum class NodeKind {
  kText,    // text
  kOutput,  // {{ expr }}
  kIf,      // branches: (condition, body)...; else_body
  kFor,     // for targets in expr [if filter]: body [else: else_body]
  kSet,     // set targets[0] (or targets[0].attribute) = expr; block set when expr null
  kBreak,
  kContinue,
  kScope,  // a block rendered in place ({% generation %})
};

struct Node {
  NodeKind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // kFor: "if" condition
  std::vector<std::string> targets;
  std::string attribute;  // kSet: "ns.attr" form
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
};

}  // namespace peerserve::jinja

#include "tokenizer/jinja/parser.h"

#include <initializer_list>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/limits.h"

namespace peerserve::jinja {
namespace {

class Parser {
 public:
  Parser(std::string_view source, const std::vector<Token>& tokens)
      : src_(source), tokens_(tokens) {}

  Result<NodeList> run() {
    NodeList nodes;
    std::string found;
    PS_RETURN_IF_ERROR(parse_body(nodes, {}, found));
    return nodes;
  }

 private:
  // ---- token helpers ----
  const Token& peek(size_t ahead = 0) const {
    const size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  Status error_at(size_t offset, const std::string& what) const {
    return invalid_argument("chat template " + position_text(src_, offset) + ": " + what);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kText:
        return "template text";
      case TokenKind::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  Status expect_op(std::string_view op) {
    if (!is_op(op))
      return error_at(peek().offset,
                      "expected '" + std::string(op) + "', found " + describe(peek()));
    next();
    return ok_status();
  }
  Status expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) {
      return error_at(peek().offset, "expected '%}', found " + describe(peek()));
    }
    next();
    return ok_status();
  }
  Result<std::string> expect_name() {
    if (peek().kind != TokenKind::kName) {
      return error_at(peek().offset, "expected a name, found " + describe(peek()));
    }
    return next().text;
  }

  // Takes levels of nesting for as long as it lives. Every recursive construct takes one,
  // and so does every link of an operator, attribute or filter chain (a chain is a loop
  // here but nests one level per link in the tree the interpreter walks recursively).
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& parser) : parser_(parser) {}
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    ~DepthGuard() { parser_.depth_ -= taken_; }
    Status enter(size_t offset) {
      ++taken_;
      if (++parser_.depth_ > kMaxSyntaxDepth) {
        return parser_.error_at(offset, "nested too deeply (more than " +
                                            std::to_string(kMaxSyntaxDepth) +
                                            " levels of blocks, operators, attributes, calls "
                                            "and filters)");
      }
      return ok_status();
    }

   private:
    Parser& parser_;
    int taken_ = 0;
  };

  static ExprPtr make(ExprKind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ---- statements ----
  // Parses nodes until a block tag whose keyword is in `terminators` (consumed; the rest
  // of that tag is left for the caller) or the end of the template.
  Status parse_body(NodeList& out, std::initializer_list<std::string_view> terminators,
                    std::string& found) {
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEnd) {
        if (terminators.size() == 0) return ok_status();
        std::string expected;
        for (std::string_view name : terminators)
          expected +=
              (expected.empty() ? "" : " or ") + std::string("{% ") + std::string(name) + " %}";
        return error_at(t.offset, "unexpected end of template, expected " + expected);
      }
      if (t.kind == TokenKind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kText;
        node->offset = t.offset;
        node->text = t.text;
        out.push_back(std::move(node));
        next();
        continue;
      }
      if (t.kind == TokenKind::kPrintBegin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kOutput;
        node->offset = t.offset;
        PS_ASSIGN_OR_RETURN(node->expr, parse_expression(true));
        if (peek().kind != TokenKind::kPrintEnd) {
          return error_at(peek().offset, "expected '}}', found " + describe(peek()));
        }
        next();
        out.push_back(std::move(node));
        continue;
      }
      if (t.kind != TokenKind::kBlockBegin) return error_at(t.offset, "unexpected " + describe(t));
      next();
      const Token& keyword = peek();
      if (keyword.kind != TokenKind::kName) {
        return error_at(keyword.offset,
                        "expected a statement name after '{%', found " + describe(keyword));
      }
      for (std::string_view name : terminators) {
        if (keyword.text == name) {
          found = keyword.text;
          next();
          return ok_status();
        }
      }
      next();
      DepthGuard block(*this);
      PS_RETURN_IF_ERROR(block.enter(keyword.offset));
      NodePtr node;
      if (keyword.text == "if") {
        PS_ASSIGN_OR_RETURN(node, parse_if(keyword.offset));
      } else if (keyword.text == "for") {
        PS_ASSIGN_OR_RETURN(node, parse_for(keyword.offset));
      } else if (keyword.text == "set") {
        PS_ASSIGN_OR_RETURN(node, parse_set(keyword.offset));
      } else if (keyword.text == "break" || keyword.text == "continue") {
        if (loop_depth_ == 0)
          return error_at(keyword.offset, "'" + keyword.text + "' outside a for loop");
        node = std::make_unique<Node>();
        node->kind = keyword.text == "break" ? NodeKind::kBreak : NodeKind::kContinue;
        node->offset = keyword.offset;
        PS_RETURN_IF_ERROR(expect_block_end());
      } else if (keyword.text == "generation") {
        // transformers' AssistantTracker block: renders its body in place.
        PS_RETURN_IF_ERROR(expect_block_end());
        node = std::make_unique<Node>();
        node->kind = NodeKind::kScope;
        node->offset = keyword.offset;
        std::string end;
        PS_RETURN_IF_ERROR(parse_body(node->body, {"endgeneration"}, end));
        PS_RETURN_IF_ERROR(expect_block_end());
      } else {
        return error_at(keyword.offset,
                        "unsupported statement '{% " + keyword.text +
                            " %}' (supported: if, for, set, break, continue, generation)");
      }
      out.push_back(std::move(node));
    }
  }

  Result<NodePtr> parse_if(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kIf;
    node->offset = offset;
    while (true) {
      PS_ASSIGN_OR_RETURN(ExprPtr condition, parse_expression(true));
      PS_RETURN_IF_ERROR(expect_block_end());
      NodeList body;
      std::string found;
      PS_RETURN_IF_ERROR(parse_body(body, {"elif", "else", "endif"}, found));
      node->branches.emplace_back(std::move(condition), std::move(body));
      if (found == "elif") continue;
      PS_RETURN_IF_ERROR(expect_block_end());
      if (found == "else") {
        PS_RETURN_IF_ERROR(parse_body(node->else_body, {"endif"}, found));
        PS_RETURN_IF_ERROR(expect_block_end());
      }
      return node;
    }
  }

  Result<NodePtr> parse_for(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kFor;
    node->offset = offset;
    const bool parenthesized = is_op("(");
    if (parenthesized) next();
    while (true) {
      PS_ASSIGN_OR_RETURN(std::string target, expect_name());
      node->targets.push_back(std::move(target));
      if (!is_op(",")) break;
      next();
    }
    if (parenthesized) PS_RETURN_IF_ERROR(expect_op(")"));
    if (!is_name("in"))
      return error_at(peek().offset, "expected 'in' in a for loop, found " + describe(peek()));
    next();
    PS_ASSIGN_OR_RETURN(node->expr, parse_expression(false));
    if (is_name("if")) {
      next();
      PS_ASSIGN_OR_RETURN(node->filter, parse_expression(false));
    }
    if (is_name("recursive"))
      return error_at(peek().offset, "unsupported construct 'recursive' loop");
    PS_RETURN_IF_ERROR(expect_block_end());
    ++loop_depth_;
    std::string found;
    Status body = parse_body(node->body, {"else", "endfor"}, found);
    --loop_depth_;
    PS_RETURN_IF_ERROR(body);
    PS_RETURN_IF_ERROR(expect_block_end());
    if (found == "else") {
      PS_RETURN_IF_ERROR(parse_body(node->else_body, {"endfor"}, found));
      PS_RETURN_IF_ERROR(expect_block_end());
    }
    return node;
  }

  Result<NodePtr> parse_set(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kSet;
    node->offset = offset;
    PS_ASSIGN_OR_RETURN(std::string target, expect_name());
    node->targets.push_back(std::move(target));
    if (is_op(".")) {
      next();
      PS_ASSIGN_OR_RETURN(node->attribute, expect_name());
    } else {
      while (is_op(",")) {
        next();
        PS_ASSIGN_OR_RETURN(std::string more, expect_name());
        node->targets.push_back(std::move(more));
      }
    }
    if (peek().kind == TokenKind::kBlockEnd && node->attribute.empty() &&
        node->targets.size() == 1) {
      next();  // block set: {% set x %}...{% endset %}
      std::string found;
      PS_RETURN_IF_ERROR(parse_body(node->body, {"endset"}, found));
      PS_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
    PS_RETURN_IF_ERROR(expect_op("="));
    PS_ASSIGN_OR_RETURN(node->expr, parse_tuple_or_expression());
    PS_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  // ---- expressions ----
  // `a, b` without brackets (right-hand side of set) becomes a tuple.
  Result<ExprPtr> parse_tuple_or_expression() {
    const size_t offset = peek().offset;
    PS_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(true));
    if (!is_op(",")) return first;
    auto tuple = make(ExprKind::kTuple, offset);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      PS_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  Result<ExprPtr> parse_expression(bool with_conditional) {
    DepthGuard guard(*this);
    PS_RETURN_IF_ERROR(guard.enter(peek().offset));
    return with_conditional ? parse_conditional() : parse_or();
  }

  Result<ExprPtr> parse_conditional() {
    PS_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    DepthGuard chain(*this);
    while (is_name("if")) {
      const size_t offset = next().offset;
      PS_RETURN_IF_ERROR(chain.enter(offset));
      auto cond = make(ExprKind::kConditional, offset);
      PS_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      cond->args.push_back(std::move(value));
      cond->args.push_back(std::move(test));
      if (is_name("else")) {
        next();
        PS_ASSIGN_OR_RETURN(ExprPtr otherwise, parse_conditional());
        cond->args.push_back(std::move(otherwise));
      } else {
        cond->args.push_back(nullptr);
      }
      value = std::move(cond);
    }
    return value;
  }

  Result<ExprPtr> parse_or() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    DepthGuard chain(*this);
    while (is_name("or")) {
      const size_t offset = next().offset;
      PS_RETURN_IF_ERROR(chain.enter(offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      auto e = make(ExprKind::kOr, offset);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    DepthGuard chain(*this);
    while (is_name("and")) {
      const size_t offset = next().offset;
      PS_RETURN_IF_ERROR(chain.enter(offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      auto e = make(ExprKind::kAnd, offset);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      const size_t offset = next().offset;
      DepthGuard guard(*this);
      PS_RETURN_IF_ERROR(guard.enter(offset));
      PS_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      auto e = make(ExprKind::kNot, offset);
      e->args.push_back(std::move(operand));
      return e;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_math1());
    ExprPtr chain;
    DepthGuard link(*this);
    while (true) {
      std::string op;
      const size_t offset = peek().offset;
      if (peek().kind == TokenKind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (chain) return error_at(offset, "chained comparisons (a < b < c) are not supported");
      PS_RETURN_IF_ERROR(link.enter(offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_math1());
      chain = make(ExprKind::kCompare, offset);
      chain->name = op;
      chain->args.push_back(std::move(left));
      chain->args.push_back(std::move(right));
    }
    return chain ? std::move(chain) : std::move(left);
  }

  Result<ExprPtr> binary(ExprPtr left, ExprPtr right, std::string op, size_t offset) {
    auto e = make(ExprKind::kBinary, offset);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  Result<ExprPtr> parse_math1() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    DepthGuard chain(*this);
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      PS_RETURN_IF_ERROR(chain.enter(op.offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      PS_ASSIGN_OR_RETURN(left, binary(std::move(left), std::move(right), op.text, op.offset));
    }
    return left;
  }

  Result<ExprPtr> parse_concat() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
    DepthGuard chain(*this);
    while (is_op("~")) {
      const Token& op = next();
      PS_RETURN_IF_ERROR(chain.enter(op.offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
      PS_ASSIGN_OR_RETURN(left, binary(std::move(left), std::move(right), "~", op.offset));
    }
    return left;
  }

  Result<ExprPtr> parse_math2() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    DepthGuard chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      PS_RETURN_IF_ERROR(chain.enter(op.offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      PS_ASSIGN_OR_RETURN(left, binary(std::move(left), std::move(right), op.text, op.offset));
    }
    return left;
  }

  Result<ExprPtr> parse_pow() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    DepthGuard chain(*this);
    while (is_op("**")) {
      const Token& op = next();
      PS_RETURN_IF_ERROR(chain.enter(op.offset));
      PS_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      PS_ASSIGN_OR_RETURN(left, binary(std::move(left), std::move(right), "**", op.offset));
    }
    return left;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      DepthGuard guard(*this);
      PS_RETURN_IF_ERROR(guard.enter(op.offset));
      PS_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      node = make(op.text == "-" ? ExprKind::kNegate : ExprKind::kPlus, op.offset);
      node->args.push_back(std::move(operand));
    } else {
      PS_ASSIGN_OR_RETURN(node, parse_primary());
    }
    PS_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      PS_ASSIGN_OR_RETURN(node, parse_filters(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        auto e = make(ExprKind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        std::string value;
        while (peek().kind == TokenKind::kString) value += next().text;  // 'a' 'b' == 'ab'
        auto e = make(ExprKind::kLiteral, t.offset);
        e->literal = Value(std::move(value));
        return e;
      }
      case TokenKind::kInteger: {
        next();
        auto e = make(ExprKind::kLiteral, t.offset);
        try {
          e->literal = Value(static_cast<int64_t>(std::stoll(t.text)));
        } catch (...) {
          return error_at(t.offset, "integer literal " + t.text + " is out of range");
        }
        return e;
      }
      case TokenKind::kFloat: {
        next();
        auto e = make(ExprKind::kLiteral, t.offset);
        try {
          e->literal = Value(std::stod(t.text));
        } catch (...) {
          return error_at(t.offset, "float literal " + t.text + " is out of range");
        }
        return e;
      }
      case TokenKind::kOperator:
        if (t.text == "(") return parse_parenthesized();
        if (t.text == "[") return parse_sequence("]", ExprKind::kList);
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    return error_at(t.offset, "expected an expression, found " + describe(t));
  }

  Result<ExprPtr> parse_parenthesized() {
    const size_t offset = next().offset;  // (
    if (is_op(")")) {
      next();
      return make(ExprKind::kTuple, offset);
    }
    PS_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(true));
    if (is_op(")")) {
      next();
      return first;
    }
    auto tuple = make(ExprKind::kTuple, offset);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (is_op(")")) break;
      PS_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      tuple->args.push_back(std::move(item));
    }
    PS_RETURN_IF_ERROR(expect_op(")"));
    return tuple;
  }

  Result<ExprPtr> parse_sequence(std::string_view close, ExprKind kind) {
    const size_t offset = next().offset;
    auto e = make(kind, offset);
    while (!is_op(close)) {
      if (!e->args.empty()) {
        PS_RETURN_IF_ERROR(expect_op(","));
        if (is_op(close)) break;
      }
      PS_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      e->args.push_back(std::move(item));
    }
    next();
    return e;
  }

  Result<ExprPtr> parse_dict() {
    const size_t offset = next().offset;  // {
    auto e = make(ExprKind::kDict, offset);
    while (!is_op("}")) {
      if (!e->args.empty()) {
        PS_RETURN_IF_ERROR(expect_op(","));
        if (is_op("}")) break;
      }
      PS_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
      PS_RETURN_IF_ERROR(expect_op(":"));
      PS_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      e->args.push_back(std::move(key));
      e->args.push_back(std::move(value));
    }
    next();
    return e;
  }

  Status parse_call_args(Expr& call) {
    PS_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        PS_RETURN_IF_ERROR(expect_op(","));
        if (is_op(")")) break;
      }
      first = false;
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        PS_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        call.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call.kwargs.empty()) {
          return error_at(peek().offset, "positional argument after a keyword argument");
        }
        PS_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        call.args.push_back(std::move(value));
      }
    }
    next();
    return ok_status();
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    DepthGuard chain(*this);
    while (true) {
      if (is_op(".") || is_op("[") || is_op("(")) PS_RETURN_IF_ERROR(chain.enter(peek().offset));
      if (is_op(".")) {
        const size_t offset = next().offset;
        if (peek().kind == TokenKind::kInteger) {  // foo.0 == foo[0]
          auto item = make(ExprKind::kItem, offset);
          auto index = make(ExprKind::kLiteral, peek().offset);
          try {
            index->literal = Value(static_cast<int64_t>(std::stoll(peek().text)));
          } catch (...) {
            return error_at(peek().offset, "index " + peek().text + " is out of range");
          }
          next();
          item->args.push_back(std::move(node));
          item->args.push_back(std::move(index));
          node = std::move(item);
          continue;
        }
        PS_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (is_op("(")) {
          if (!is_supported_method(name)) {
            return error_at(offset, "unsupported method '." + name + "()'");
          }
          auto call = make(ExprKind::kMethodCall, offset);
          call->name = name;
          call->args.push_back(std::move(node));
          PS_RETURN_IF_ERROR(parse_call_args(*call));
          node = std::move(call);
        } else {
          auto attr = make(ExprKind::kAttribute, offset);
          attr->name = name;
          attr->args.push_back(std::move(node));
          node = std::move(attr);
        }
      } else if (is_op("[")) {
        const size_t offset = next().offset;
        PS_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node), offset));
      } else if (is_op("(")) {
        if (node->kind != ExprKind::kName) {
          return error_at(peek().offset, "only named functions can be called");
        }
        if (!is_supported_function(node->name)) {
          return error_at(node->offset, "unsupported function '" + node->name + "()'");
        }
        auto call = make(ExprKind::kCall, node->offset);
        call->name = node->name;
        PS_RETURN_IF_ERROR(parse_call_args(*call));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr object, size_t offset) {
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++colons > 2) return error_at(peek().offset, "too many ':' in a slice");
        next();
        continue;
      }
      if (parts[colons])
        return error_at(peek().offset, "expected ']' or ':', found " + describe(peek()));
      PS_ASSIGN_OR_RETURN(parts[colons], parse_expression(true));
    }
    next();
    if (colons == 0) {
      if (!parts[0]) return error_at(offset, "empty subscript");
      auto item = make(ExprKind::kItem, offset);
      item->args.push_back(std::move(object));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = make(ExprKind::kSlice, offset);
    slice->args.push_back(std::move(object));
    for (auto& part : parts) slice->args.push_back(std::move(part));
    return slice;
  }

  Result<ExprPtr> parse_filters(ExprPtr node) {
    DepthGuard chain(*this);
    while (true) {
      if (is_op("|") || is_name("is")) PS_RETURN_IF_ERROR(chain.enter(peek().offset));
      if (is_op("|")) {
        const size_t offset = next().offset;
        PS_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (!is_supported_filter(name))
          return error_at(offset, "unsupported filter '|" + name + "'");
        auto filter = make(ExprKind::kFilter, offset);
        filter->name = name;
        filter->args.push_back(std::move(node));
        if (is_op("(")) PS_RETURN_IF_ERROR(parse_call_args(*filter));
        node = std::move(filter);
      } else if (is_name("is")) {
        const size_t offset = next().offset;
        auto test = make(ExprKind::kTest, offset);
        if (is_name("not")) {
          next();
          test->negated = true;
        }
        // Tests may be named by a keyword-like name ("none") or an operator alias.
        std::string name;
        if (peek().kind == TokenKind::kName) {
          name = next().text;
        } else if (peek().kind == TokenKind::kOperator &&
                   (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                    peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
          name = next().text;
        } else {
          return error_at(peek().offset,
                          "expected a test name after 'is', found " + describe(peek()));
        }
        if (!is_supported_test(name)) return error_at(offset, "unsupported test 'is " + name + "'");
        test->name = name;
        test->args.push_back(std::move(node));
        if (is_op("(")) {
          PS_RETURN_IF_ERROR(parse_call_args(*test));
        } else if ((peek().kind == TokenKind::kName || peek().kind == TokenKind::kString ||
                    peek().kind == TokenKind::kInteger || peek().kind == TokenKind::kFloat ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          // jinja2: one argument without parentheses ("x is divisibleby 3").
          if (is_name("is")) return error_at(peek().offset, "tests cannot be chained with 'is'");
          PS_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
          PS_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
          test->args.push_back(std::move(arg));
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  std::string_view src_;
  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<NodeList> parse_template(std::string_view source, const std::vector<Token>& tokens) {
  return Parser(source, tokens).run();
}

}  // namespace peerserve::jinja

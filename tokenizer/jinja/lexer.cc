#include "tokenizer/jinja/lexer.h"

#include <cctype>

#include "tokenizer/internal/utf8.h"

namespace peerserve::jinja {
namespace {

// The parser bounds its nesting anyway; this keeps the lexer's own stack small too.
constexpr size_t kMaxOpenBrackets = 256;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {}

  Result<std::vector<Token>> run() {
    bool line_starting = true;  // jinja2: the previous lexeme ended with '\n' (or none yet)
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text(src_.substr(pos_, tag - pos_));
      if (tag == src_.size()) {
        push_text(std::move(text), pos_);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only spaces/tabs between the last line start and the tag.
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = line_start < text.size();
          for (size_t i = line_start; i < text.size(); ++i) {
            if (!is_space(text[i])) blank = false;
          }
          if (blank) text.resize(line_start);
        }
      }
      push_text(std::move(text), pos_);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      char end_sign = '\0';
      if (kind == '#') {
        PS_RETURN_IF_ERROR(skip_comment(tag, end_sign));
      } else {
        tokens_.push_back({kind == '{' ? TokenKind::kPrintBegin : TokenKind::kBlockBegin,
                           kind == '{' ? "{{" : "{%", tag});
        PS_RETURN_IF_ERROR(lex_tag(kind == '{' ? '}' : '%', tag, end_sign));
      }
      line_starting = false;
      if (end_sign == '-') {
        while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
        line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
      } else if (end_sign != '+' && kind != '{' && pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;  // trim_blocks
        line_starting = true;
      }
    }
    tokens_.push_back({TokenKind::kEnd, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  void push_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::move(text), offset});
  }

  Status error(size_t offset, const std::string& what) const {
    return invalid_argument("chat template " + position_text(src_, offset) + ": " + what);
  }

  Status skip_comment(size_t tag, char& end_sign) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) return error(tag, "comment '{#' is never closed with '#}'");
    end_sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    pos_ = end + 2;
    return ok_status();
  }

  // Lexes expression tokens up to the closing "}}" or "%}" (with optional -/+ before it).
  // As in jinja2, a closer inside open brackets is not one: {{ {'a': {'b': 1}} }} is a dict.
  Status lex_tag(char closer, size_t tag, char& end_sign) {
    std::string open;  // brackets not yet closed, innermost last
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return error(tag, std::string("tag is never closed with '") + closer + "}'");
      }
      const char c = src_[pos_];
      const auto at = [&](size_t i) { return pos_ + i < src_.size() ? src_[pos_ + i] : '\0'; };
      if (!open.empty()) {
        // Inside brackets: only a bracket's own closer ends it; "}}" and "%}" are not ends.
      } else if (c == closer && at(1) == '}') {
        end_sign = '\0';
        tokens_.push_back(end_token(closer, pos_));
        pos_ += 2;
        return ok_status();
      }
      if (open.empty() && (c == '-' || c == '+') && at(1) == closer && at(2) == '}') {
        end_sign = c;
        tokens_.push_back(end_token(closer, pos_));
        pos_ += 3;
        return ok_status();
      }
      if (is_name_start(c)) {
        const size_t start = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        tokens_.push_back({TokenKind::kName, std::string(src_.substr(start, pos_ - start)), start});
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
        continue;
      }
      if (c == '\'' || c == '"') {
        PS_RETURN_IF_ERROR(lex_string());
        continue;
      }
      static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
      bool two = false;
      for (std::string_view op : kTwoChar) {
        if (src_.substr(pos_, 2) == op) {
          tokens_.push_back({TokenKind::kOperator, std::string(op), pos_});
          pos_ += 2;
          two = true;
          break;
        }
      }
      if (two) continue;
      if (std::string_view("+-*/%~<>=.,:|()[]{}").find(c) != std::string_view::npos) {
        if (c == '(' || c == '[' || c == '{') {
          if (open.size() >= kMaxOpenBrackets) return error(pos_, "brackets nested too deeply");
          open.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        } else if (c == ')' || c == ']' || c == '}') {
          if (open.empty() || open.back() != c) {
            return error(pos_, std::string("unexpected '") + c + "'");
          }
          open.pop_back();
        }
        tokens_.push_back({TokenKind::kOperator, std::string(1, c), pos_});
        ++pos_;
        continue;
      }
      return error(pos_, std::string("unexpected character '") + c + "' in a tag");
    }
  }

  static Token end_token(char closer, size_t offset) {
    return closer == '}' ? Token{TokenKind::kPrintEnd, "}}", offset}
                         : Token{TokenKind::kBlockEnd, "%}", offset};
  }

  void lex_number() {
    const size_t start = pos_;
    while (pos_ < src_.size() &&
           (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
      ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos_ = p;
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
      }
    }
    std::string text;
    for (char ch : src_.substr(start, pos_ - start)) {
      if (ch != '_') text.push_back(ch);
    }
    tokens_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInteger, text, start});
  }

  // Python string literal escapes (jinja2 decodes them with "unicode-escape").
  Status lex_string() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) return error(start, "string literal is never closed");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (pos_ >= src_.size()) return error(start, "string literal is never closed");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          // Up to three octal digits, a code point up to 0o777 ('\101' is "A").
          char32_t cp = static_cast<char32_t>(e - '0');
          for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
               ++i) {
            cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
          }
          utf8::append_code_point(value, cp);
          break;
        }
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + digits > src_.size())
            return error(pos_ - 2, "truncated \\" + std::string(1, e) + " escape");
          char32_t cp = 0;
          for (size_t i = 0; i < digits; ++i) {
            const char h = src_[pos_ + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              return error(pos_ - 2, "bad \\" + std::string(1, e) + " escape");
            }
            cp = cp * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : (std::tolower(h) - 'a' + 10));
          }
          pos_ += digits;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return error(pos_ - digits - 2, "escape is not a Unicode scalar value");
          }
          utf8::append_code_point(value, cp);
          break;
        }
        default:
          // Python keeps unknown escapes as written.
          value.push_back('\\');
          value.push_back(e);
      }
    }
    tokens_.push_back({TokenKind::kString, std::move(value), start});
    return ok_status();
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string position_text(std::string_view source, size_t offset) {
  size_t line = 1;
  size_t column = 1;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return std::to_string(line) + ":" + std::to_string(column);
}

std::string normalize_template_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

Result<std::vector<Token>> tokenize_template(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace peerserve::jinja

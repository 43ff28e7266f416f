#include "grammar/regex_automaton.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

namespace peerserve::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxCount = 1000;  // largest n or m of {n,m}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code point ranges

void normalize(Ranges& r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  r = std::move(merged);
}

// Every Unicode scalar value not in `r` (r normalized).
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

// Surrogates are not scalar values: UTF-8 never encodes them.
Ranges without_surrogates(const Ranges& r) {
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

int utf8_length(uint32_t c) {
  return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

std::array<uint8_t, 4> utf8_encode(uint32_t c) {
  std::array<uint8_t, 4> b{};
  switch (utf8_length(c)) {
    case 1:
      b[0] = static_cast<uint8_t>(c);
      break;
    case 2:
      b[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    case 3:
      b[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    default:
      b[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  }
  return b;
}

struct ByteRange {
  uint8_t lo = 0, hi = 0;
};
using ByteSequence = std::vector<ByteRange>;

// Splits [lo, hi] (no surrogates) into sequences of byte ranges whose UTF-8 encodings are
// exactly the code points of the range (the classic split at encoding-length and
// continuation-byte boundaries, as RE2 and Rust's regex do).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSequence>& out) {
  for (const uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && max < hi) {
      utf8_sequences(lo, max, out);
      utf8_sequences(max + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = utf8_encode(lo), b = utf8_encode(hi);
  ByteSequence seq(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    seq[static_cast<size_t>(i)] = {a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]};
  out.push_back(std::move(seq));
}

// ---- Parsing -------------------------------------------------------------------------

struct Node {
  enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat } kind = kEmpty;
  Ranges set;                 // kSet
  std::vector<int> children;  // kConcat, kAlt, kRepeat (one)
  int min = 0, max = 0;       // kRepeat; max -1 = unbounded
};

class Parser {
 public:
  Parser(std::string_view pattern, const RegexLimits& limits) : p_(pattern), limits_(limits) {}

  Result<int> parse() {
    if (!p_.empty() && p_.front() == '^') ++pos_;
    PS_ASSIGN_OR_RETURN(const int root, alternation(0));
    if (pos_ < p_.size()) return error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return root;
  }
  std::vector<Node>& nodes() { return nodes_; }

 private:
  Status error(std::string_view what) const {
    return invalid_argument("regex: " + std::string(what) + " at offset " + std::to_string(pos_));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  int add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  int add_set(Ranges r) {
    normalize(r);
    Node n;
    n.kind = Node::kSet;
    n.set = std::move(r);
    return add(std::move(n));
  }

  Result<int> alternation(int depth) {
    if (depth > limits_.max_nesting) return error("nesting too deep");
    Node alt;
    alt.kind = Node::kAlt;
    while (true) {
      PS_ASSIGN_OR_RETURN(const int branch, concatenation(depth));
      alt.children.push_back(branch);
      if (at_end() || p_[pos_] != '|') break;
      ++pos_;
    }
    if (alt.children.size() == 1) return alt.children[0];
    return add(std::move(alt));
  }

  Result<int> concatenation(int depth) {
    Node cat;
    cat.kind = Node::kConcat;
    while (!at_end() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$' && pos_ + 1 == p_.size()) {  // end anchor: full match anyway
        ++pos_;
        break;
      }
      PS_ASSIGN_OR_RETURN(int atom_node, atom(depth));
      PS_ASSIGN_OR_RETURN(atom_node, quantifiers(atom_node));
      cat.children.push_back(atom_node);
    }
    if (cat.children.empty()) return add(Node{});
    if (cat.children.size() == 1) return cat.children[0];
    return add(std::move(cat));
  }

  // Reads a decimal count of {n,m}; nullopt-like -1 when there are no digits.
  Result<int> count() {
    int value = -1;
    while (!at_end() && p_[pos_] >= '0' && p_[pos_] <= '9') {
      value = (value < 0 ? 0 : value) * 10 + (p_[pos_] - '0');
      if (value > kMaxCount) return error("repetition count over 1000");
      ++pos_;
    }
    return value;
  }

  Result<int> quantifiers(int node) {
    bool quantified = false;
    while (!at_end()) {
      const char c = p_[pos_];
      int min = 0, max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t open = pos_++;
        PS_ASSIGN_OR_RETURN(const int n, count());
        if (n < 0) {
          pos_ = open;
          return error("'{' is not a repetition (escape it as \\{)");
        }
        min = max = n;
        if (!at_end() && p_[pos_] == ',') {
          ++pos_;
          PS_ASSIGN_OR_RETURN(max, count());
        }
        if (at_end() || p_[pos_] != '}') return error("unterminated {n,m}");
        ++pos_;
        if (max >= 0 && max < min) return error("{n,m} with m < n");
      } else {
        return node;
      }
      if (!at_end() && p_[pos_] == '?') ++pos_;  // lazy: the same language
      if (!at_end() && p_[pos_] == '+') return error("possessive quantifiers are not supported");
      if (quantified) return error("multiple repeat");
      quantified = true;
      Node rep;
      rep.kind = Node::kRepeat;
      rep.children = {node};
      rep.min = min;
      rep.max = max;
      node = add(std::move(rep));
    }
    return node;
  }

  // One UTF-8 character of the pattern.
  Result<uint32_t> literal() {
    const auto b0 = static_cast<uint8_t>(p_[pos_]);
    const int n = b0 < 0x80         ? 1
                  : (b0 >> 5) == 6  ? 2
                  : (b0 >> 4) == 14 ? 3
                  : (b0 >> 3) == 30 ? 4
                                    : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > p_.size()) return error("invalid UTF-8");
    uint32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1Fu) : n == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
    for (int i = 1; i < n; ++i) {
      const auto b = static_cast<uint8_t>(p_[pos_ + static_cast<size_t>(i)]);
      if ((b >> 6) != 2) return error("invalid UTF-8");
      c = (c << 6) | (b & 0x3Fu);
    }
    if (utf8_length(c) != n || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) {
      return error("invalid UTF-8");
    }
    pos_ += static_cast<size_t>(n);
    return c;
  }

  Result<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      if (at_end()) return error("truncated hex escape");
      const char c = p_[pos_];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) return error("bad hex digit");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v >= 0xD800 && v <= 0xDFFF) return error("\\u escape of a surrogate");
    return v;
  }

  // An escape after '\' (pos_ at the character after it): a class or one code point.
  Result<Ranges> escape() {
    if (at_end()) return error("trailing backslash");
    const char c = p_[pos_++];
    const Ranges digit = {{'0', '9'}};
    const Ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd':
        return digit;
      case 'D':
        return complement(digit);
      case 'w':
        return word;
      case 'W':
        return complement(word);
      case 's':
        return space;
      case 'S':
        return complement(space);
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        return Ranges{{0, 0}};
      case 'x': {
        PS_ASSIGN_OR_RETURN(const uint32_t v, hex(2));
        return Ranges{{v, v}};
      }
      case 'u': {
        PS_ASSIGN_OR_RETURN(const uint32_t v, hex(4));
        return Ranges{{v, v}};
      }
      default:
        break;
    }
    static constexpr std::string_view kEscapable = "\\.*+?()[]{}|^$-/\"',:#&~<>=!%@`; ";
    if (kEscapable.find(c) == std::string_view::npos) {
      --pos_;
      return error(std::string("unsupported escape \\") + c);
    }
    const auto v = static_cast<uint32_t>(static_cast<uint8_t>(c));
    return Ranges{{v, v}};
  }

  Result<int> char_class() {  // pos_ after '['
    bool negated = false;
    if (!at_end() && p_[pos_] == '^') {
      negated = true;
      ++pos_;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (at_end()) return error("unterminated character class");
      if (p_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One member: a single code point (possibly the start of a range) or an escape class.
      Ranges member;
      if (p_[pos_] == '\\') {
        ++pos_;
        PS_ASSIGN_OR_RETURN(member, escape());
      } else if (p_[pos_] == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        return error("POSIX classes are not supported");
      } else {
        PS_ASSIGN_OR_RETURN(const uint32_t c, literal());
        member = {{c, c}};
      }
      const bool single = member.size() == 1 && member[0].first == member[0].second;
      if (single && pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = 0;
        if (p_[pos_] == '\\') {
          ++pos_;
          PS_ASSIGN_OR_RETURN(const Ranges end, escape());
          if (end.size() != 1 || end[0].first != end[0].second) {
            return error("a class cannot end a range");
          }
          hi = end[0].first;
        } else {
          PS_ASSIGN_OR_RETURN(hi, literal());
        }
        if (hi < member[0].first) return error("range out of order");
        member[0].second = hi;
      }
      set.insert(set.end(), member.begin(), member.end());
    }
    normalize(set);
    return add_set(negated ? complement(set) : set);
  }

  Result<int> atom(int depth) {
    const char c = p_[pos_];
    switch (c) {
      case '(': {
        ++pos_;
        if (!at_end() && p_[pos_] == '?') {
          if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            return error("only (?:...) groups are supported (no lookaround, flags or names)");
          }
        }
        PS_ASSIGN_OR_RETURN(const int inner, alternation(depth + 1));
        if (at_end() || p_[pos_] != ')') return error("missing ')'");
        ++pos_;
        return inner;
      }
      case '[':
        ++pos_;
        if (depth + 1 > limits_.max_nesting) return error("nesting too deep");
        return char_class();
      case '.':
        ++pos_;
        return add_set(complement(Ranges{{'\n', '\n'}}));
      case '\\': {
        ++pos_;
        if (!at_end() && p_[pos_] >= '1' && p_[pos_] <= '9') {
          return error("backreferences are not supported");
        }
        if (!at_end() && (p_[pos_] == 'b' || p_[pos_] == 'B' || p_[pos_] == 'A' ||
                          p_[pos_] == 'Z' || p_[pos_] == 'z')) {
          return error("assertions are not supported");
        }
        PS_ASSIGN_OR_RETURN(Ranges r, escape());
        return add_set(std::move(r));
      }
      case '*':
      case '+':
      case '?':
        return error("nothing to repeat");
      case '{':
        return error("'{' is not a repetition here (escape it as \\{)");
      case '^':
        return error("'^' is only supported at the start");
      case '$':
        return error("'$' is only supported at the end");
      default: {
        PS_ASSIGN_OR_RETURN(const uint32_t cp, literal());
        return add_set(Ranges{{cp, cp}});
      }
    }
  }

  std::string_view p_;
  const RegexLimits& limits_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
};

// ---- NFA (Thompson), built back to front: compile(node, out) returns the entry state ----

struct NfaState {
  // A byte edge when next >= 0 (lo..hi -> next); otherwise epsilon edges in `eps`.
  uint8_t lo = 0, hi = 0;
  int32_t next = -1;
  std::vector<int32_t> eps;
};

class NfaBuilder {
 public:
  NfaBuilder(const std::vector<Node>& nodes, size_t max_states)
      : nodes_(nodes), max_states_(max_states) {}

  Result<int32_t> build(int root) {
    match_ = add();
    return compile(root, match_, 0);
  }
  std::vector<NfaState>& states() { return states_; }
  int32_t match_state() const { return match_; }

 private:
  int32_t add() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }
  Status check_size() const {
    if (states_.size() > max_states_) {
      return invalid_argument("regex: too large once repetitions are expanded (more than " +
                              std::to_string(max_states_) + " states)");
    }
    return ok_status();
  }

  Result<int32_t> compile(int index, int32_t out, int depth) {
    PS_RETURN_IF_ERROR(check_size());
    if (depth > 512) return invalid_argument("regex: nesting too deep");
    const Node& n = nodes_[static_cast<size_t>(index)];
    switch (n.kind) {
      case Node::kEmpty:
        return out;
      case Node::kSet: {
        std::vector<ByteSequence> sequences;
        for (const auto& [lo, hi] : without_surrogates(n.set)) utf8_sequences(lo, hi, sequences);
        const int32_t entry = add();
        for (const ByteSequence& seq : sequences) {
          int32_t next = out;
          for (size_t i = seq.size(); i-- > 0;) {
            const int32_t s = add();
            states_[static_cast<size_t>(s)].lo = seq[i].lo;
            states_[static_cast<size_t>(s)].hi = seq[i].hi;
            states_[static_cast<size_t>(s)].next = next;
            next = s;
          }
          states_[static_cast<size_t>(entry)].eps.push_back(next);
        }
        return entry;  // no sequence (an empty set): a state that leads nowhere
      }
      case Node::kConcat: {
        int32_t next = out;
        for (size_t i = n.children.size(); i-- > 0;) {
          PS_ASSIGN_OR_RETURN(next, compile(n.children[i], next, depth + 1));
        }
        return next;
      }
      case Node::kAlt: {
        std::vector<int32_t> entries;
        for (const int child : n.children) {
          PS_ASSIGN_OR_RETURN(const int32_t e, compile(child, out, depth + 1));
          entries.push_back(e);
        }
        const int32_t entry = add();
        states_[static_cast<size_t>(entry)].eps = std::move(entries);
        return entry;
      }
      case Node::kRepeat: {
        const int child = n.children[0];
        int32_t next = out;
        if (n.max < 0) {
          const int32_t loop = add();
          PS_ASSIGN_OR_RETURN(const int32_t body, compile(child, loop, depth + 1));
          states_[static_cast<size_t>(loop)].eps = {body, out};
          next = loop;
        } else {
          for (int i = n.min; i < n.max; ++i) {
            PS_ASSIGN_OR_RETURN(const int32_t body, compile(child, next, depth + 1));
            const int32_t optional = add();
            states_[static_cast<size_t>(optional)].eps = {body, out};
            next = optional;
          }
        }
        for (int i = 0; i < n.min; ++i) {
          PS_ASSIGN_OR_RETURN(next, compile(child, next, depth + 1));
        }
        return next;
      }
    }
    return internal_error("regex: unknown node");
  }

  const std::vector<Node>& nodes_;
  size_t max_states_;
  std::vector<NfaState> states_;
  int32_t match_ = -1;
};

// ---- DFA (subset construction over byte classes) ----

struct KeyHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (const int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Merges equivalent states (Moore's partition refinement): two states are equivalent when
// every string takes both to acceptance or neither. Counted repetition and alternatives that
// share their tails (JSON's "a value, then more values") copy NFA fragments whose subsets
// the construction tells apart although they accept the same continuations; merging them
// makes the automaton, and the token masks cached per state, several times smaller. State 0
// stays the start. `table` is [n][classes] with kDead for no transition.
void minimize(std::vector<int32_t>& table, std::vector<uint8_t>& accepting, size_t classes,
              uint64_t max_steps) {
  const size_t n = accepting.size();
  uint64_t steps = 0;
  const size_t width = classes + 1;
  std::vector<int32_t> block(n), signature(n * width), order(n);
  for (size_t s = 0; s < n; ++s) block[s] = accepting[s];
  size_t blocks = 0;
  while (true) {
    // One round reads every row a few times (building, sorting, comparing neighbours).
    steps += static_cast<uint64_t>(n) * width * 8;
    if (steps > max_steps) return;  // over budget: the unminimized automaton stays
    for (size_t s = 0; s < n; ++s) {
      int32_t* row = &signature[s * width];
      row[0] = block[s];
      for (size_t c = 0; c < classes; ++c) {
        const int32_t to = table[s * classes + c];
        row[c + 1] = to == RegexAutomaton::kDead ? -1 : block[static_cast<size_t>(to)];
      }
    }
    for (size_t s = 0; s < n; ++s) order[s] = static_cast<int32_t>(s);
    const auto row_less = [&](int32_t a, int32_t b) {
      return std::lexicographical_compare(
          signature.begin() + static_cast<ptrdiff_t>(a) * static_cast<ptrdiff_t>(width),
          signature.begin() + (static_cast<ptrdiff_t>(a) + 1) * static_cast<ptrdiff_t>(width),
          signature.begin() + static_cast<ptrdiff_t>(b) * static_cast<ptrdiff_t>(width),
          signature.begin() + (static_cast<ptrdiff_t>(b) + 1) * static_cast<ptrdiff_t>(width));
    };
    std::sort(order.begin(), order.end(), row_less);
    std::vector<int32_t> next(n);
    int32_t id = -1;
    for (size_t i = 0; i < n; ++i) {
      if (i == 0 || row_less(order[i - 1], order[i])) ++id;
      next[static_cast<size_t>(order[i])] = id;
    }
    const auto count = static_cast<size_t>(id) + 1;
    block = std::move(next);
    if (count == blocks) break;  // refining changed nothing: stable
    blocks = count;
  }
  // Renumber blocks by first state so that the start stays 0.
  std::vector<int32_t> renumber(blocks, -1), representative;
  for (size_t s = 0; s < n; ++s) {
    int32_t& r = renumber[static_cast<size_t>(block[s])];
    if (r < 0) {
      r = static_cast<int32_t>(representative.size());
      representative.push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<int32_t> merged(blocks * classes);
  std::vector<uint8_t> merged_accepting(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const auto s = static_cast<size_t>(representative[b]);
    merged_accepting[b] = accepting[s];
    for (size_t c = 0; c < classes; ++c) {
      const int32_t to = table[s * classes + c];
      merged[b * classes + c] = to == RegexAutomaton::kDead
                                    ? to
                                    : renumber[static_cast<size_t>(block[static_cast<size_t>(to)])];
    }
  }
  table = std::move(merged);
  accepting = std::move(merged_accepting);
}

}  // namespace

RegexAutomaton::RegexAutomaton(std::string pattern, std::vector<uint8_t> byte_class,
                               size_t num_classes, std::vector<int32_t> transitions,
                               std::vector<uint8_t> accepting)
    : pattern_(std::move(pattern)),
      byte_class_(std::move(byte_class)),
      num_classes_(num_classes),
      transitions_(std::move(transitions)),
      accepting_(std::move(accepting)) {}

bool RegexAutomaton::can_continue(int32_t state) const {
  const auto row =
      transitions_.begin() + static_cast<ptrdiff_t>(state) * static_cast<ptrdiff_t>(num_classes_);
  return std::any_of(row, row + static_cast<ptrdiff_t>(num_classes_),
                     [](int32_t to) { return to != kDead; });
}

int32_t RegexAutomaton::walk(int32_t state, std::string_view bytes) const {
  for (const char b : bytes) {
    if (state == kDead) return kDead;
    state = step(state, static_cast<uint8_t>(b));
  }
  return state;
}

Result<std::shared_ptr<const RegexAutomaton>> RegexAutomaton::compile(std::string_view pattern,
                                                                      const RegexLimits& limits) {
  if (pattern.size() > limits.max_pattern_bytes) {
    return invalid_argument("regex: pattern of " + std::to_string(pattern.size()) +
                            " bytes is over the limit of " +
                            std::to_string(limits.max_pattern_bytes));
  }
  Parser parser(pattern, limits);
  PS_ASSIGN_OR_RETURN(const int root, parser.parse());
  NfaBuilder builder(parser.nodes(), limits.max_nfa_states);
  PS_ASSIGN_OR_RETURN(const int32_t nfa_start, builder.build(root));
  const std::vector<NfaState>& nfa = builder.states();
  const int32_t match = builder.match_state();

  // Byte classes: bytes no edge tells apart share a column.
  std::array<bool, 257> boundary{};
  boundary[0] = true;
  for (const NfaState& s : nfa) {
    if (s.next < 0) continue;
    boundary[s.lo] = true;
    boundary[static_cast<size_t>(s.hi) + 1] = true;
  }
  std::vector<uint8_t> byte_class(256);
  std::vector<uint8_t> representative;
  for (int b = 0; b < 256; ++b) {
    if (boundary[static_cast<size_t>(b)]) representative.push_back(static_cast<uint8_t>(b));
    byte_class[static_cast<size_t>(b)] = static_cast<uint8_t>(representative.size() - 1);
  }
  const size_t classes = representative.size();

  // Epsilon closure, keeping the states that matter for a DFA state's identity: byte edges
  // and the match state.
  std::vector<uint32_t> seen(nfa.size(), 0);
  uint32_t stamp = 0;
  std::vector<int32_t> stack;
  uint64_t steps = 0;
  auto closure = [&](const std::vector<int32_t>& from) {
    ++stamp;
    std::vector<int32_t> key;
    stack.assign(from.begin(), from.end());
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      ++steps;
      if (seen[static_cast<size_t>(s)] == stamp) continue;
      seen[static_cast<size_t>(s)] = stamp;
      const NfaState& st = nfa[static_cast<size_t>(s)];
      if (st.next >= 0 || s == match) key.push_back(s);
      for (const int32_t e : st.eps) stack.push_back(e);
    }
    std::sort(key.begin(), key.end());
    return key;
  };

  std::vector<std::vector<int32_t>> dfa_sets;
  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> index;
  std::vector<int32_t> transitions;
  auto intern = [&](std::vector<int32_t> key) -> Result<int32_t> {
    if (key.empty()) return kDead;
    if (const auto it = index.find(key); it != index.end()) return it->second;
    if (dfa_sets.size() >= limits.max_dfa_states) {
      return invalid_argument("regex: the automaton needs more than " +
                              std::to_string(limits.max_dfa_states) + " states");
    }
    const auto id = static_cast<int32_t>(dfa_sets.size());
    index.emplace(key, id);
    dfa_sets.push_back(std::move(key));
    return id;
  };
  PS_RETURN_IF_ERROR(intern(closure({nfa_start})).status());
  if (dfa_sets.empty()) return invalid_argument("regex: matches no string");
  std::vector<int32_t> targets;
  for (size_t d = 0; d < dfa_sets.size(); ++d) {
    transitions.resize((d + 1) * classes, kDead);
    for (size_t c = 0; c < classes; ++c) {
      const uint8_t b = representative[c];
      targets.clear();
      steps += dfa_sets[d].size();
      if (steps > limits.max_construction_steps) {
        return invalid_argument("regex: too complex (building its automaton took more than " +
                                std::to_string(limits.max_construction_steps) + " steps)");
      }
      for (const int32_t s : dfa_sets[d]) {
        const NfaState& st = nfa[static_cast<size_t>(s)];
        if (st.next >= 0 && st.lo <= b && b <= st.hi) targets.push_back(st.next);
      }
      if (targets.empty()) continue;
      PS_ASSIGN_OR_RETURN(const int32_t to, intern(closure(targets)));
      transitions[d * classes + c] = to;
    }
  }

  // Keep the states from which a match is reachable; the others become kDead, so that a
  // token mask never lets generation into a dead end.
  const size_t n = dfa_sets.size();
  std::vector<uint8_t> accepting(n, 0), live(n, 0);
  std::vector<std::vector<int32_t>> predecessors(n);
  std::vector<int32_t> work;
  for (size_t d = 0; d < n; ++d) {
    accepting[d] = std::binary_search(dfa_sets[d].begin(), dfa_sets[d].end(), match) ? 1 : 0;
    if (accepting[d]) {
      live[d] = 1;
      work.push_back(static_cast<int32_t>(d));
    }
    for (size_t c = 0; c < classes; ++c) {
      const int32_t to = transitions[d * classes + c];
      if (to != kDead) predecessors[static_cast<size_t>(to)].push_back(static_cast<int32_t>(d));
    }
  }
  while (!work.empty()) {
    const int32_t d = work.back();
    work.pop_back();
    for (const int32_t p : predecessors[static_cast<size_t>(d)]) {
      if (!live[static_cast<size_t>(p)]) {
        live[static_cast<size_t>(p)] = 1;
        work.push_back(p);
      }
    }
  }
  if (!live[0]) return invalid_argument("regex: matches no string");
  std::vector<int32_t> renumber(n, kDead);
  int32_t kept = 0;
  for (size_t d = 0; d < n; ++d) {
    if (live[d]) renumber[d] = kept++;
  }
  std::vector<int32_t> table(static_cast<size_t>(kept) * classes, kDead);
  std::vector<uint8_t> kept_accepting(static_cast<size_t>(kept));
  for (size_t d = 0; d < n; ++d) {
    if (!live[d]) continue;
    const auto r = static_cast<size_t>(renumber[d]);
    kept_accepting[r] = accepting[d];
    for (size_t c = 0; c < classes; ++c) {
      const int32_t to = transitions[d * classes + c];
      table[r * classes + c] = to == kDead ? kDead : renumber[static_cast<size_t>(to)];
    }
  }
  minimize(table, kept_accepting, classes, limits.max_minimization_steps);
  return std::make_shared<const RegexAutomaton>(std::string(pattern), std::move(byte_class),
                                                classes, std::move(table),
                                                std::move(kept_accepting));
}

std::string escape_regex(std::string_view text) {
  static constexpr std::string_view kMeta = "\\.*+?()[]{}|^$-/";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte < 0x20 || byte == 0x7F) {  // control characters, readable in any dialect
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
      continue;
    }
    if (kMeta.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace peerserve::grammar

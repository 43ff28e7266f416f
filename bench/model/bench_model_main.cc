// peerserve_bench_model: prefill and decode throughput of DeepseekModel on the mini test
// preset, each as a ratio of a floor computed from the machine's ceilings measured in the
// same run (bench/ceilings):
//   prefill: FLOPs of the step / measured matmul_bf16 peak  -> reported as % of peak
//   decode:  bytes of weights the step reads / measured streaming read bandwidth
//            -> reported as time / floor (1.0 = at the bandwidth limit)
// Decode counts the routed experts actually used by each step (observed through the
// ExpertBackend seam); the latent KV read per step is printed separately (not in the floor).
//
//   peerserve_bench_model [--model DIR] [--runs 5] [--threads 0] [--prompt 512]
//                         [--context 128] [--steps 16] [--profile-decode N]
// Without --model, the mini preset is written once to $TMPDIR/peerserve_bench_mini.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "model/checkpoint/test_model.h"
#include "model/deepseek_model.h"
#include "model/expert_backend.h"

namespace peerserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Counts the distinct routed experts each MoE layer call touches, then delegates.
class CountingBackend final : public ExpertBackend {
 public:
  explicit CountingBackend(std::shared_ptr<ExpertBackend> inner) : inner_(std::move(inner)) {}
  Status run(const RoutedTokens& tokens, std::span<float> out) override {
    std::set<int32_t> distinct(tokens.expert_ids.begin(), tokens.expert_ids.end());
    expert_loads += static_cast<int64_t>(distinct.size());
    return inner_->run(tokens, out);
  }
  int64_t expert_loads = 0;

 private:
  std::shared_ptr<ExpertBackend> inner_;
};

// Weight bytes and multiply-accumulates of the model, from its config (bf16 matrices,
// fp32 norms and routers, as DeepseekModel holds them).
struct ModelCost {
  const ModelConfig& c;
  int64_t attention_params() const {
    const int64_t h = c.num_attention_heads;
    int64_t q = c.q_lora_rank
                    ? c.hidden_size * *c.q_lora_rank + *c.q_lora_rank * h * c.qk_head_dim()
                    : c.hidden_size * h * c.qk_head_dim();
    return q + c.hidden_size * (c.kv_lora_rank + c.qk_rope_head_dim) +
           c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim) +
           h * c.v_head_dim * c.hidden_size;
  }
  int64_t expert_params() const { return 3 * c.hidden_size * c.moe_intermediate_size; }
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += c.is_moe_layer(l) ? 1 : 0;
    return n;
  }
  // Bytes read per decode step, except routed experts (counted per step) and the KV.
  double fixed_bytes() const {
    const int64_t moe = num_moe_layers(), dense = c.num_hidden_layers - moe;
    double params = static_cast<double>(
        c.num_hidden_layers * attention_params() + dense * 3 * c.hidden_size * c.intermediate_size +
        moe * c.n_shared_experts * expert_params() + c.vocab_size * c.hidden_size);
    const double router_bytes = 4.0 * moe * c.n_routed_experts * c.hidden_size;
    return 2.0 * params + router_bytes;
  }
  // Multiply-accumulates of a prefill of n tokens from position 0 (logits of the last
  // token only), in the plain attention form the model uses for it.
  double prefill_macs(int64_t n) const {
    const int64_t moe = num_moe_layers(), dense = c.num_hidden_layers - moe;
    const double per_token = static_cast<double>(
        c.num_hidden_layers * attention_params() + dense * 3 * c.hidden_size * c.intermediate_size +
        moe * (c.n_routed_experts * c.hidden_size +
               (c.num_experts_per_tok + c.n_shared_experts) * expert_params()));
    const double causal_pairs = static_cast<double>(n) * (n + 1) / 2.0;
    const double attention = c.num_hidden_layers * causal_pairs * c.num_attention_heads *
                             static_cast<double>(c.qk_head_dim() + c.v_head_dim);
    return per_token * n + attention + static_cast<double>(c.vocab_size) * c.hidden_size;
  }
};

struct Args {
  std::string model_dir;
  int runs = 5;
  int threads = 0;
  int64_t prompt = 512;
  int64_t context = 128;
  int64_t steps = 16;
  // > 0: only run this many batch-1 decode steps (no ceilings), e.g. under perf record.
  int64_t profile_decode = 0;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--model")
      a.model_dir = value;
    else if (key == "--runs")
      a.runs = std::stoi(value);
    else if (key == "--threads")
      a.threads = std::stoi(value);
    else if (key == "--prompt")
      a.prompt = std::stoll(value);
    else if (key == "--context")
      a.context = std::stoll(value);
    else if (key == "--steps")
      a.steps = std::stoll(value);
    else if (key == "--profile-decode")
      a.profile_decode = std::stoll(value);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return a;
}

std::vector<int32_t> tokens_for(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t s = seed * 2654435761u + 1u;
  for (auto& x : t) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<int32_t>(2 + (s >> 8) % static_cast<uint32_t>(vocab - 2));
  }
  return t;
}

int run(const Args& args) {
  std::string dir = args.model_dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp ? tmp : "/tmp") + "/peerserve_bench_mini";
  }
  if (!std::filesystem::exists(dir + "/config.json")) {
    std::fprintf(stderr, "writing the mini test model to %s ...\n", dir.c_str());
    TestModelOptions options;
    options.preset = TestModelPreset::kMini;
    if (Status s = write_test_model(dir, options); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  ModelOptions options;
  options.num_threads = args.threads;
  options.load_mtp = false;
  auto loaded = DeepseekModel::load(dir, options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  DeepseekModel& model = **loaded;
  const ModelConfig& c = model.config();
  auto counting = std::make_shared<CountingBackend>(model.expert_backend());
  model.set_expert_backend(counting);
  const ModelCost cost{c};

  if (args.profile_decode > 0) {
    const KvLayout layout = model.kv_layout(16, DType::kBF16);
    const int64_t len = args.context + args.profile_decode;
    auto cache = LatentKvCache::create(layout, layout.blocks_for_tokens(len));
    std::vector<int32_t> blocks(cache->num_blocks());
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
    std::vector<int32_t> tokens = tokens_for(len, c.vocab_size, 3);
    ForwardOutput out;
    for (int64_t pos = 0; pos < len;) {
      SequenceChunk chunk;
      const int64_t n = pos == 0 ? args.context : 1;
      chunk.tokens = std::span<const int32_t>(tokens).subspan(pos, n);
      chunk.start_pos = pos;
      chunk.block_table = blocks;
      if (!model.forward({&chunk, 1}, *cache, &out).ok()) return 1;
      pos += n;
    }
    return 0;
  }

  ThreadPool pool(args.threads);
  bench::CeilingOptions ceiling_options;
  ceiling_options.runs = std::max(args.runs, 3);
  const bench::MachineCeilings ceilings = bench::measure_machine_ceilings(pool, ceiling_options);
  std::printf(
      "machine: %d threads, isa %s; read bandwidth %.1f GB/s; matmul_bf16 peak %.1f GFLOP/s "
      "(512x2048x2048); bf16 dot peak %.1f GFLOP/s; fp32 FMA peak %.1f GFLOP/s\n",
      ceilings.threads, ceilings.isa.c_str(), ceilings.read_bandwidth_gbs,
      ceilings.matmul_bf16_gflops, ceilings.bf16_dot_gflops, ceilings.fp32_fma_gflops);
  std::printf(
      "model: %s (hidden %lld, %lld layers, %lld routed experts top-%lld, vocab %lld); "
      "bf16 activations, bf16 KV cache\n",
      dir.c_str(), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.n_routed_experts),
      static_cast<long long>(c.num_experts_per_tok), static_cast<long long>(c.vocab_size));

  constexpr int64_t kBlock = 16;
  const KvLayout layout = model.kv_layout(kBlock, DType::kBF16);

  // Prefill: one chunk of args.prompt tokens into a fresh cache.
  std::vector<double> prefill_times;
  {
    const std::vector<int32_t> prompt = tokens_for(args.prompt, c.vocab_size, 1);
    auto cache = LatentKvCache::create(layout, layout.blocks_for_tokens(args.prompt));
    std::vector<int32_t> blocks(cache->num_blocks());
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
    SequenceChunk chunk;
    chunk.tokens = prompt;
    chunk.block_table = blocks;
    ForwardOutput out;
    for (int r = 0; r < args.runs + 1; ++r) {  // the first run warms up
      const auto start = Clock::now();
      if (Status s = model.forward({&chunk, 1}, *cache, &out); !s.ok()) {
        std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
        return 1;
      }
      if (r > 0) prefill_times.push_back(seconds_since(start));
    }
  }
  const double prefill_s = bench::median(prefill_times);
  const double prefill_gflops = 2.0 * cost.prefill_macs(args.prompt) / prefill_s / 1e9;

  // Decode at batch sizes 1 and 16: prefill `context` tokens per sequence (untimed), then
  // time `steps` decode steps of one token per sequence.
  struct DecodeResult {
    int64_t batch;
    double step_s, floor_s, kv_bytes, weight_bytes;
  };
  std::vector<DecodeResult> decode;
  for (int64_t batch : {1, 16}) {
    std::vector<double> step_times, floors;
    double kv_bytes = 0, weight_bytes = 0;
    const int64_t max_len = args.context + args.steps;
    const int64_t per_seq = layout.blocks_for_tokens(max_len);
    for (int r = 0; r < args.runs; ++r) {
      auto cache = LatentKvCache::create(layout, per_seq * batch);
      std::vector<std::vector<int32_t>> tokens(batch), blocks(batch);
      for (int64_t b = 0; b < batch; ++b) {
        tokens[b] = tokens_for(args.context, c.vocab_size, 10 + static_cast<uint32_t>(b));
        for (int64_t i = 0; i < per_seq; ++i)
          blocks[b].push_back(static_cast<int32_t>(b * per_seq + i));
      }
      std::vector<SequenceChunk> chunks(batch);
      ForwardOutput out;
      for (int64_t b = 0; b < batch; ++b) {
        chunks[b].tokens = tokens[b];
        chunks[b].block_table = blocks[b];
      }
      if (Status s = model.forward(chunks, *cache, &out); !s.ok()) {
        std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
        return 1;
      }
      for (int64_t step = 0; step < args.steps; ++step) {
        for (int64_t b = 0; b < batch; ++b) {
          const auto logits = out.last_logits(b);
          tokens[b].push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                                   logits.begin()));
          chunks[b].tokens = std::span<const int32_t>(tokens[b]).subspan(tokens[b].size() - 1, 1);
          chunks[b].start_pos = static_cast<int64_t>(tokens[b].size()) - 1;
        }
        counting->expert_loads = 0;
        const auto start = Clock::now();
        if (Status s = model.forward(chunks, *cache, &out); !s.ok()) {
          std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
          return 1;
        }
        step_times.push_back(seconds_since(start));
        weight_bytes = cost.fixed_bytes() + 2.0 * cost.expert_params() * counting->expert_loads;
        floors.push_back(weight_bytes / (ceilings.read_bandwidth_gbs * 1e9));
        kv_bytes = static_cast<double>(batch) * (args.context + step + 1) * layout.num_layers *
                   layout.token_width() * 2.0;
      }
    }
    decode.push_back(
        {batch, bench::median(step_times), bench::median(floors), kv_bytes, weight_bytes});
  }

  std::printf("\n| measurement | median | floor | ratio | target |\n|---|---|---|---|---|\n");
  std::printf(
      "| prefill %lld tokens | %.3f s (%.0f tok/s, %.1f GFLOP/s) | %.3f s at matmul peak | "
      "%.0f%% of matmul peak | >= 50%% |\n",
      static_cast<long long>(args.prompt), prefill_s, args.prompt / prefill_s, prefill_gflops,
      2.0 * cost.prefill_macs(args.prompt) / (ceilings.matmul_bf16_gflops * 1e9),
      100.0 * prefill_gflops / ceilings.matmul_bf16_gflops);
  for (const DecodeResult& d : decode) {
    std::printf(
        "| decode batch %lld (context %lld) | %.2f ms/step (%.1f tok/s) | %.2f ms (%.1f MB "
        "weights; +%.1f MB KV not counted) | %.2fx floor | %s |\n",
        static_cast<long long>(d.batch), static_cast<long long>(args.context), d.step_s * 1e3,
        d.batch / d.step_s, d.floor_s * 1e3, d.weight_bytes / 1e6, d.kv_bytes / 1e6,
        d.step_s / d.floor_s, d.batch == 1 ? "<= 1.6x" : "-");
  }
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  return peerserve::run(peerserve::parse_args(argc, argv));
}

#include "plan/report/paper002_reproduction.h"

#include "plan/analytic/decode_bound.h"
#include "plan/analytic/decode_model.h"
#include "plan/analytic/deployment_presets.h"

namespace peerserve::plan {
namespace {

ReproductionRow row(const std::string& where, std::string quantity, double published,
                    double predicted, std::string note = {}) {
  ReproductionRow r;
  r.source = "paper002 " + where;
  r.quantity = std::move(quantity);
  r.published = published;
  r.predicted = predicted;
  r.note = std::move(note);
  return r;
}

// A dense GQA model, only for its KV size (Table 1 compares against two dense models).
ModelProfile gqa_kv_shape(const char* name, int layers, int kv_heads, int head_dim) {
  ModelProfile m;
  m.name = name;
  m.attention = AttentionKind::kGqa;
  m.num_layers = layers;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  return m;
}

}  // namespace

Result<PaperReproduction> reproduce_paper002(const HardwareSet& hardware) {
  PS_ASSIGN_OR_RETURN(const HardwareProfile* h800, find_hardware(hardware, "h800"));
  PS_ASSIGN_OR_RETURN(const HardwareProfile* gb200, find_hardware(hardware, "gb200"));
  PS_ASSIGN_OR_RETURN(ModelProfile v3, model_preset("deepseek-v3"));
  PS_ASSIGN_OR_RETURN(ModelProfile v2, model_preset("deepseek-v2"));
  PaperReproduction result;
  auto& rows = result.rows;

  // §2.3.2 bound, with DeepSeek-V3's real hidden size 7168 (the paper writes "7K" = 7000).
  const char* hidden_note =
      "hidden 7,168; the paper rounds it to 7K = 7,000, with which the "
      "formula gives the printed value exactly";
  const DecodeBound ib =
      decode_communication_bound(decode_bound_inputs(v3, 32, h800->scale_out.bandwidth_gb_s));
  rows.push_back(row("§2.3.2", "EP all-to-all time per layer, 400 Gb/s IB (us)", 120.96,
                     ib.comm_s * 1e6, hidden_note));
  rows.push_back(row("§2.3.2", "time per layer with dual micro-batch overlap, IB (us)", 241.92,
                     ib.layer_s * 1e6, hidden_note));
  rows.push_back(row("§2.3.2", "decode TPOT upper bound, 61 layers, IB (ms)", 14.76,
                     ib.tpot_s * 1e3, hidden_note));
  rows.push_back(row("§2.3.2", "decode speed upper bound, IB (tokens/s)", 67, ib.tokens_per_s,
                     "the paper truncates 67.8 to 67"));
  const DecodeBound nvl =
      decode_communication_bound(decode_bound_inputs(v3, 32, gb200->scale_up.bandwidth_gb_s));
  rows.push_back(row("§2.3.2", "EP all-to-all time per layer, GB200 NVL72 (us)", 6.72,
                     nvl.comm_s * 1e6, hidden_note));
  rows.push_back(row("§2.3.2", "decode TPOT upper bound, GB200 NVL72 (ms)", 0.82, nvl.tpot_s * 1e3,
                     hidden_note));
  rows.push_back(row("§2.3.2", "decode speed upper bound, GB200 NVL72 (tokens/s)", 1200,
                     nvl.tokens_per_s, "\"approximately 1200\""));

  // Table 1: KV cache per token (BF16, KB = 1000 bytes).
  const double v3_kv = kv_bytes_per_token(v3, 2.0);
  const double qwen_kv = kv_bytes_per_token(gqa_kv_shape("qwen2.5-72b", 80, 8, 128), 2.0);
  const double llama_kv = kv_bytes_per_token(gqa_kv_shape("llama3.1-405b", 126, 8, 128), 2.0);
  rows.push_back(row("Table 1", "KV cache per token, DeepSeek-V3 MLA (KB)", 70.272, v3_kv / 1e3,
                     "(512 + 64) x 2 B x 61 layers"));
  rows.push_back(row("Table 1", "KV cache per token, Qwen-2.5 72B GQA (KB)", 327.680, qwen_kv / 1e3,
                     "2 x 8 KV heads x 128 x 2 B x 80 layers"));
  rows.push_back(row("Table 1", "KV cache per token, LLaMA-3.1 405B GQA (KB)", 516.096,
                     llama_kv / 1e3, "2 x 8 KV heads x 128 x 2 B x 126 layers"));
  rows.push_back(
      row("Table 1", "KV multiplier, Qwen-2.5 72B vs DeepSeek-V3", 4.66, qwen_kv / v3_kv));
  rows.push_back(row("Table 1", "KV multiplier, LLaMA-3.1 405B vs DeepSeek-V3", 7.28,
                     llama_kv / v3_kv, "the paper's own sizes give 516.096 / 70.272 = 7.34"));

  // §2.2: parameters (activated counts include the embedding and LM head, as published).
  rows.push_back(row("§2.2.1", "DeepSeek-V3 total parameters (B)", 671, total_weights(v3) / 1e9,
                     "without the MTP module"));
  rows.push_back(row("§2.2.1", "DeepSeek-V3 activated parameters per token (B)", 37,
                     (activated_weights_per_token(v3) + 2.0 * embedding_weights(v3)) / 1e9,
                     "embedding and LM head included"));
  rows.push_back(row("§2.2.1", "DeepSeek-V2 total parameters (B)", 236, total_weights(v2) / 1e9));
  rows.push_back(row("§2.2.1", "DeepSeek-V2 activated parameters per token (B)", 21,
                     (activated_weights_per_token(v2) + 2.0 * embedding_weights(v2)) / 1e9,
                     "embedding and LM head included"));

  // Table 2: training cost per token at sequence length 4096 = 3 x forward.
  rows.push_back(row("Table 2", "DeepSeek-V3 training GFLOPs per token, sequence 4096", 250,
                     3.0 * forward_flops_per_token(v3, 4096) / 1e9,
                     "3 x (2 x activated weights + causal attention); MTP excluded"));
  rows.push_back(row("Table 2", "DeepSeek-V2 training GFLOPs per token, sequence 4096", 155,
                     3.0 * forward_flops_per_token(v2, 4096) / 1e9,
                     "3 x (2 x activated weights + causal attention)"));

  // §2.3.3: MTP speed-up of generation TPS on the DeepSeek deployment.
  PS_ASSIGN_OR_RETURN(DecodeDeployment with, decode_preset("deepseek-h800-decode"));
  with.mtp.acceptance = 0.85;
  DecodeDeployment without = with;
  without.mtp.draft_tokens = 0;
  // Per-request speed at a small batch: the paper trades "slightly hurting the throughput"
  // for latency, so the 1.8x is read as tokens/s of one request, not of the device.
  PS_ASSIGN_OR_RETURN(DecodeEstimate a, estimate_decode(v3, *h800, without, 8, 4096, 4096));
  PS_ASSIGN_OR_RETURN(DecodeEstimate b, estimate_decode(v3, *h800, with, 8, 4096, 4096));
  rows.push_back(row("§2.3.3", "generation TPS with / without MTP (ratio)", 1.8,
                     a.tpot_s / b.tpot_s,
                     "deepseek-h800-decode, 8 requests per GPU, KV 4K, acceptance 85% (the "
                     "paper's 80-90%); no batch is published"));

  result.inconsistencies = {
      "Table 1: 516.096 / 70.272 = 7.34, but the multiplier is printed as 7.28x.",
      "§2.3.2: the bound uses a hidden size of \"7K\" = 7,000; DeepSeek-V3's is 7,168 "
      "(+2.4%).",
  };
  return result;
}

}  // namespace peerserve::plan

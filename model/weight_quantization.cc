#include "model/weight_quantization.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/parallel_status.h"
#include "model/layer_linear_weights.h"

namespace peerserve {
namespace {

kernels::MatrixView<bf16> view(const LinearWeight& w) {
  return kernels::MatrixView<bf16>{w.data, w.rows, w.cols, 0};
}

// One INT8 form to build: a linear weight's, or an MLP's fused gate/up.
struct Job {
  LinearWeight* linear = nullptr;
  MlpWeights* gate_up = nullptr;
  std::string name;
};

Status run(const Job& job) {
  if (job.linear != nullptr) {
    LinearWeight& w = *job.linear;
    if (w.data == nullptr || w.int8) return ok_status();
    auto packed = kernels::PackedInt8Matrix::quantize(view(w));
    if (!packed.ok()) return packed.status().with_context("quantizing " + job.name);
    w.int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
    return ok_status();
  }
  MlpWeights& mlp = *job.gate_up;
  if (mlp.gate_up_int8) return ok_status();
  auto packed = kernels::PackedInt8Matrix::quantize_gate_up(view(mlp.gate), view(mlp.up));
  if (!packed.ok()) return packed.status().with_context("quantizing " + job.name);
  mlp.gate_up_int8 = std::make_shared<const kernels::PackedInt8Matrix>(std::move(packed).value());
  return ok_status();
}

void add(std::vector<Job>& jobs, LinearWeight& w, std::string name) {
  jobs.push_back({&w, nullptr, std::move(name)});
}

// An MLP's fused gate/up form, after its three weights: it replaces the jobs of gate and up
// (the kernels read only the fused form; separate INT8 copies of gate and up took a third of
// an expert's INT8 memory for nothing).
MlpVisitor add_gate_up(std::vector<Job>& jobs) {
  return [&jobs](MlpWeights& m, const std::string& name) {
    std::erase_if(jobs, [&](const Job& j) { return j.linear == &m.gate || j.linear == &m.up; });
    jobs.push_back({nullptr, &m, name + " gate_proj/up_proj"});
  };
}

void add_mlp(std::vector<Job>& jobs, MlpWeights& mlp, const std::string& name) {
  for_each_mlp_linear(
      mlp, name, [&](LinearWeight& w, const std::string& n) { add(jobs, w, n); },
      add_gate_up(jobs));
}

// Every weight of the layer the forward multiplies but kv_b (the absorbed attention reads
// its per-head BF16 slices).
void add_layer(std::vector<Job>& jobs, DecoderLayerWeights& layer, const std::string& name) {
  for_each_layer_linear(
      layer, name,
      [&](LinearWeight& w, const std::string& n) {
        if (&w != &layer.attention.kv_b) add(jobs, w, n);
      },
      add_gate_up(jobs));
}

Status run_all(const std::vector<Job>& jobs, ThreadPool* pool) {
  return parallel_for_each(pool, static_cast<int64_t>(jobs.size()),
                           [&](int64_t i) { return run(jobs[static_cast<size_t>(i)]); });
}

// After run_all: each weight that got an INT8 form hears `quantized` (its BF16 pages may go;
// not `keep_pages`, whose values other weights still read) and loses its BF16 form.
void drop_quantized_bf16_forms(const std::vector<Job>& jobs,
                               const std::function<void(const LinearWeight&)>& quantized,
                               const LinearWeight* keep_pages = nullptr) {
  auto release = [&](LinearWeight& w) {
    if (quantized && &w != keep_pages) quantized(w);
    drop_bf16_form(w);
  };
  for (const Job& job : jobs) {
    if (job.linear != nullptr && job.linear->int8) release(*job.linear);
    if (job.gate_up != nullptr && job.gate_up->gate_up_int8) {
      release(job.gate_up->gate);
      release(job.gate_up->up);
    }
  }
}

}  // namespace

Status quantize_mlp_int8(MlpWeights& mlp) {
  std::vector<Job> jobs;
  add_mlp(jobs, mlp, "expert");
  return run_all(jobs, nullptr);
}

Result<bool> quantize_draft_int8(DeepseekWeights& weights, ThreadPool* pool,
                                 const std::function<void(const LinearWeight&)>& quantized) {
  if (!weights.mtp) return false;
  MtpWeights& mtp = *weights.mtp;
  std::vector<Job> jobs;
  add(jobs, mtp.eh_proj, "mtp eh_proj");
  add_layer(jobs, mtp.layer, "mtp layer");
  add(jobs, mtp.head, "mtp shared_head");
  // Only weights still in BF16 (an INT8 checkpoint's or --quantize int8's MTP layer is INT8).
  std::erase_if(jobs, [](const Job& j) {
    return j.linear != nullptr
               ? j.linear->data == nullptr || j.linear->int8 != nullptr
               : j.gate_up->gate_up_int8 != nullptr || j.gate_up->gate.data == nullptr ||
                     j.gate_up->up.data == nullptr;
  });
  PS_RETURN_IF_ERROR(run_all(jobs, pool));
  // The head's values may be the LM head's or the embeddings' (DeepSeek's checkpoints store a
  // copy, which the loader shares): those keep reading the BF16 form.
  const bool head_shared = mtp.head.data != nullptr && (mtp.head.data == weights.lm_head.data ||
                                                        mtp.head.data == weights.embed.data);
  const bool layer_changed =
      std::any_of(jobs.begin(), jobs.end(), [&](const Job& j) { return j.linear != &mtp.head; });
  drop_quantized_bf16_forms(jobs, quantized, head_shared ? &mtp.head : nullptr);
  return layer_changed;
}

Status quantize_weights_int8(DeepseekWeights& weights, bool lm_head, ThreadPool* pool,
                             const std::function<void(const LinearWeight&)>& quantized) {
  // One group at a time (a layer, the MTP layer, the LM head), its matrices in parallel; then
  // `quantized` hears of each, so that at most one group's BF16 pages are resident at once
  // beyond the INT8 copies.
  std::vector<std::vector<Job>> groups;
  for (DecoderLayerWeights& layer : weights.layers) {
    add_layer(groups.emplace_back(), layer, "layer " + std::to_string(layer.index));
  }
  // The loader shares the LM head with the MTP layer's head when they hold the same values
  // (DeepSeek's checkpoints store a copy): one INT8 form for both, as an INT8 checkpoint gets.
  const bool mtp_head_shared = weights.mtp && weights.mtp->head.data != nullptr &&
                               weights.mtp->head.data == weights.lm_head.data;
  if (weights.mtp) {
    std::vector<Job>& jobs = groups.emplace_back();
    add(jobs, weights.mtp->eh_proj, "mtp eh_proj");
    add_layer(jobs, weights.mtp->layer, "mtp layer");
    if (lm_head && !mtp_head_shared) add(jobs, weights.mtp->head, "mtp shared_head");
  }
  // The LM head (one large job) joins the last group, where it runs beside that group's
  // matrices instead of alone on one thread at the end.
  if (lm_head) {
    add(groups.empty() ? groups.emplace_back() : groups.back(), weights.lm_head, "lm_head");
  }
  for (const std::vector<Job>& jobs : groups) {
    PS_RETURN_IF_ERROR(run_all(jobs, pool));
    drop_quantized_bf16_forms(jobs, quantized);
  }
  if (lm_head && mtp_head_shared) {
    LinearWeight& head = weights.mtp->head;
    head.int8 = weights.lm_head.int8;
    head.int8_compensation = weights.lm_head.int8_compensation;
    drop_bf16_form(head);
  }
  return ok_status();
}

}  // namespace peerserve

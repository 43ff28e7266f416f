#include "model/weight_quantization.h"

#include <memory>
#include <string>
#include <vector>

#include "base/parallel_status.h"

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

void add_mlp(std::vector<Job>& jobs, MlpWeights& mlp, const std::string& name) {
  add(jobs, mlp.gate, name + " gate_proj");
  add(jobs, mlp.up, name + " up_proj");
  add(jobs, mlp.down, name + " down_proj");
  jobs.push_back({nullptr, &mlp, name + " gate_proj/up_proj"});
}

void add_layer(std::vector<Job>& jobs, DecoderLayerWeights& layer, const std::string& name) {
  AttentionWeights& a = layer.attention;
  if (a.q_a) add(jobs, *a.q_a, name + " q_a_proj");
  if (a.q_b) add(jobs, *a.q_b, name + " q_b_proj");
  if (a.q_proj) add(jobs, *a.q_proj, name + " q_proj");
  add(jobs, a.kv_a, name + " kv_a_proj_with_mqa");
  add(jobs, a.o_proj, name + " o_proj");
  if (layer.dense_mlp) add_mlp(jobs, *layer.dense_mlp, name + " mlp");
  if (layer.moe) {
    if (layer.moe->shared) add_mlp(jobs, *layer.moe->shared, name + " shared expert");
    for (size_t e = 0; e < layer.moe->experts.size(); ++e) {
      add_mlp(jobs, layer.moe->experts[e], name + " expert " + std::to_string(e));
    }
  }
}

Status run_all(const std::vector<Job>& jobs, ThreadPool* pool) {
  return parallel_for_each(pool, static_cast<int64_t>(jobs.size()),
                           [&](int64_t i) { return run(jobs[static_cast<size_t>(i)]); });
}

}  // namespace

Status quantize_mlp_int8(MlpWeights& mlp) {
  std::vector<Job> jobs;
  add_mlp(jobs, mlp, "expert");
  return run_all(jobs, nullptr);
}

Status quantize_weights_int8(DeepseekWeights& weights, bool lm_head, ThreadPool* pool) {
  std::vector<Job> jobs;
  for (DecoderLayerWeights& layer : weights.layers) {
    add_layer(jobs, layer, "layer " + std::to_string(layer.index));
  }
  if (weights.mtp) {
    add(jobs, weights.mtp->eh_proj, "mtp eh_proj");
    add_layer(jobs, weights.mtp->layer, "mtp layer");
    if (lm_head) add(jobs, weights.mtp->head, "mtp shared_head");
  }
  if (lm_head) add(jobs, weights.lm_head, "lm_head");
  return run_all(jobs, pool);
}

}  // namespace peerserve

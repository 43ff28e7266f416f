// An independent plain-double reference of the DeepSeek-V3 forward pass, written straight
// from Hugging Face's modeling_deepseek.py for tests: full causal recomputation, no cache,
// no shared code with model/ (weights are read through the checkpoint's raw tensor view and
// converted here). Slow and simple on purpose.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint/checkpoint.h"

namespace peerserve::testing {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

class ReferenceModel {
 public:
  explicit ReferenceModel(Checkpoint& checkpoint);

  // Logits [tokens.size()][vocab] for every position; final_hidden (optional) receives the
  // hidden states after the final norm.
  Matrix forward(const std::vector<int32_t>& tokens, Matrix* final_hidden = nullptr);

  // MTP logits for positions p < next_tokens.size(): hidden[p] is the main model's final
  // hidden state at p, next_tokens[p] the token at p + 1.
  Matrix forward_mtp(const std::vector<int32_t>& next_tokens, const Matrix& hidden);

 private:
  const Matrix& weight(const std::string& name);  // 2-D, as double
  const std::vector<double>& vec(const std::string& name);
  Matrix linear(const Matrix& x, const std::string& name);
  // eps: config.rms_norm_eps unless given (q_a/kv_a_layernorm use the RMSNorm default 1e-6).
  Matrix rmsnorm(const Matrix& x, const std::string& name, std::optional<double> eps = {});
  Matrix decoder_layer(const Matrix& x, int64_t layer);
  Matrix attention(const Matrix& x, const std::string& prefix);
  Matrix mlp(const Matrix& x, const std::string& prefix);
  Matrix moe(const Matrix& x, const std::string& prefix);
  void rope(std::vector<double>& x, int64_t pos) const;

  Checkpoint& checkpoint_;
  ModelConfig c_;
  std::map<std::string, Matrix> matrices_;
  std::map<std::string, std::vector<double>> vectors_;
};

}  // namespace peerserve::testing

// libFuzzer target: arbitrary bytes as config.json. Parsing must never crash; an accepted
// config must describe a layout whose shapes are all positive.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/checkpoint/tensor_layout.h"
#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  peerserve::Result<peerserve::ModelConfig> config =
      peerserve::parse_model_config(text, "fuzz/config.json");
  if (!config.ok()) return 0;
  // Keep the layout small enough to enumerate: only check configs with few tensors.
  if (config->num_hidden_layers * (config->n_routed_experts + 1) > 4096) return 0;
  for (const peerserve::TensorSpec& spec : peerserve::deepseek_tensor_layout(*config)) {
    for (int64_t d : spec.shape) {
      if (d <= 0) __builtin_trap();
    }
  }
  return 0;
}

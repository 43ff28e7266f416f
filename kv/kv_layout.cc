#include "kv/kv_layout.h"

#include <string>

namespace peerserve {

Status KvLayout::validate() const {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v > 0) return ok_status();
    return invalid_argument(std::string("KV layout: ") + name + " = " + std::to_string(v) +
                            ", expected > 0");
  };
  PS_RETURN_IF_ERROR(positive("num_layers", num_layers));
  PS_RETURN_IF_ERROR(positive("latent_dim", latent_dim));
  PS_RETURN_IF_ERROR(positive("rope_dim", rope_dim));
  PS_RETURN_IF_ERROR(positive("block_size", block_size));
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    return invalid_argument("KV layout: dtype " + std::string(dtype_name(dtype)) +
                            " is not supported, expected BF16 or F32");
  }
  return ok_status();
}

}  // namespace peerserve

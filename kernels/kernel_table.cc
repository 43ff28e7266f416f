#include "kernels/internal/kernel_table.h"

namespace peerserve::kernels::internal {

const KernelTable& active_kernel_table() {
  switch (active_isa_level()) {
    case IsaLevel::kAvx512Bf16:
      return avx512_bf16_kernel_table();
    case IsaLevel::kAvx512Vnni:
      return avx512_vnni_kernel_table();
    case IsaLevel::kAvx512:
      return avx512_kernel_table();
    case IsaLevel::kAvx2:
      return avx2_kernel_table();
    case IsaLevel::kScalar:
      break;
  }
  return scalar_kernel_table();
}

}  // namespace peerserve::kernels::internal

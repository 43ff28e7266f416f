#include "kernels/race_uniforms.h"

#include "kernels/cpu_features.h"
#include "kernels/internal/race_uniforms_x86.h"

namespace peerserve::kernels {

size_t race_candidates(const float* weight, size_t n, uint64_t base, double bar, uint32_t* out) {
  const IsaLevel level = active_isa_level();
  size_t count = 0, done = 0;
  if (level >= IsaLevel::kAvx512) {
    done = n / 8 * 8;
    count = internal::race_candidates_avx512(weight, done, base, bar, out);
  } else if (level >= IsaLevel::kAvx2) {
    done = n / 4 * 4;
    count = internal::race_candidates_avx2(weight, done, base, bar, out);
  }
  for (size_t i = done; i < n; ++i) {
    const double w = weight[i];
    if (w > 0.0 && (1.0 - race_uniform(base, i)) * bar < w) out[count++] = static_cast<uint32_t>(i);
  }
  return count;
}

}  // namespace peerserve::kernels

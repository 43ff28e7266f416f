#include "kernels/internal/thread_scratch.h"

#include <vector>

namespace peerserve::kernels::internal {

float* thread_scratch_floats(size_t count) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < count) scratch.resize(count);
  return scratch.data();
}

}  // namespace peerserve::kernels::internal

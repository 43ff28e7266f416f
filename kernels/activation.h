// The gated activation of DeepSeek MLPs and experts: out[i] = silu(gate[i]) * up[i], with
// silu(g) = g / (1 + exp(-g)). out may equal gate or up; otherwise no overlap.
#pragma once

#include <cstdint>

namespace peerserve::kernels {

void silu_mul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace peerserve::kernels

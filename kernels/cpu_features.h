// CPU feature detection and the choice of instruction-set level for the kernels.
//
// Features are detected once (cpuid via __builtin_cpu_supports). Every kernel entry point
// dispatches on active_isa_level(): the best level the CPU supports, unless a level was
// forced (tests compare every available level against the scalar reference; benchmarks
// compare paths). Forcing is process-wide and must not race with running kernels.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace peerserve::kernels {

// Ordered: each level implies the ones below it.
enum class IsaLevel : uint8_t {
  kScalar = 0,      // plain C++ loops: the reference, available everywhere
  kAvx2 = 1,        // AVX2 + FMA (256-bit fp32 FMA)
  kAvx512 = 2,      // AVX-512 F/BW/VL/DQ (512-bit fp32 FMA)
  kAvx512Vnni = 3,  // + AVX512_VNNI (vpdpbusd: int8 x int8 -> int32, kernels/matmul_int8.h)
  kAvx512Bf16 = 4,  // + AVX512_BF16 (vdpbf16ps: bf16 pairs, fp32 accumulation); every CPU
                    // with AVX512_BF16 also has VNNI (Cooper Lake, Sapphire Rapids, Zen 4)
};

// "scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16".
std::string_view isa_level_name(IsaLevel level);

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
};

// Detected once, on first use.
const CpuFeatures& cpu_features();

// The highest level this CPU supports.
IsaLevel best_isa_level();
bool isa_level_supported(IsaLevel level);
// Every supported level, lowest (kScalar) first.
std::vector<IsaLevel> supported_isa_levels();

// The level kernels use now: best_isa_level() unless forced.
IsaLevel active_isa_level();

// Makes every kernel use `level` until reset_isa_level(). InvalidArgument if the CPU does
// not support it.
Status force_isa_level(IsaLevel level);
void reset_isa_level();

// Forces a level for the lifetime of the object (tests, benchmarks). REQUIRES: supported.
class ScopedIsaLevel {
 public:
  explicit ScopedIsaLevel(IsaLevel level);
  ~ScopedIsaLevel();
  ScopedIsaLevel(const ScopedIsaLevel&) = delete;
  ScopedIsaLevel& operator=(const ScopedIsaLevel&) = delete;

 private:
  int previous_;  // the forced level before this scope, or -1 for none
};

}  // namespace peerserve::kernels

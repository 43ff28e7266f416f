#include "kernels/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <string>

#include "base/check.h"

namespace peerserve::kernels {
namespace {

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  __builtin_cpu_init();
  // libgcc also checks that the OS saves the wider register state (XCR0) for these.
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // From CPUID itself: clang 14's builtin does not know "f16c". Only used with AVX2, whose
  // check above covers the OS's register state.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  return f;
}

// -1: not forced.
std::atomic<int> forced_level{-1};

}  // namespace

std::string_view isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAvx512Vnni:
      return "avx512_vnni";
    case IsaLevel::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

bool isa_level_supported(IsaLevel level) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  switch (level) {
    case IsaLevel::kScalar:
      return true;
    case IsaLevel::kAvx2:
      return avx2;
    case IsaLevel::kAvx512:
      return avx512;
    case IsaLevel::kAvx512Vnni:
      return avx512 && f.avx512_vnni;
    case IsaLevel::kAvx512Bf16:
      return avx512 && f.avx512_vnni && f.avx512_bf16;
  }
  return false;
}

IsaLevel best_isa_level() {
  static const IsaLevel best = [] {
    IsaLevel level = IsaLevel::kScalar;
    for (IsaLevel l :
         {IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Vnni, IsaLevel::kAvx512Bf16}) {
      if (isa_level_supported(l)) level = l;
    }
    return level;
  }();
  return best;
}

std::vector<IsaLevel> supported_isa_levels() {
  std::vector<IsaLevel> levels;
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Vnni,
                     IsaLevel::kAvx512Bf16}) {
    if (isa_level_supported(l)) levels.push_back(l);
  }
  return levels;
}

IsaLevel active_isa_level() {
  const int forced = forced_level.load(std::memory_order_relaxed);
  return forced < 0 ? best_isa_level() : static_cast<IsaLevel>(forced);
}

Status force_isa_level(IsaLevel level) {
  if (!isa_level_supported(level)) {
    return invalid_argument("ISA level '" + std::string(isa_level_name(level)) +
                            "' is not supported by this CPU (best: " +
                            std::string(isa_level_name(best_isa_level())) + ")");
  }
  forced_level.store(static_cast<int>(level), std::memory_order_relaxed);
  return ok_status();
}

void reset_isa_level() {
  forced_level.store(-1, std::memory_order_relaxed);
}

ScopedIsaLevel::ScopedIsaLevel(IsaLevel level)
    : previous_(forced_level.load(std::memory_order_relaxed)) {
  const Status status = force_isa_level(level);
  PS_CHECK(status.ok()) << status.to_string();
}

ScopedIsaLevel::~ScopedIsaLevel() {
  forced_level.store(previous_, std::memory_order_relaxed);
}

}  // namespace peerserve::kernels

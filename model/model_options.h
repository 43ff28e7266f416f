// How a DeepseekModel runs: threads, GEMM activation precision, attention form, MTP.
#pragma once

#include <cstdint>
#include <functional>

namespace peerserve {

// Precision of the activations fed to the weight GEMMs (accumulation is always fp32).
enum class GemmPrecision {
  kFp32,  // activations stay fp32: exact up to summation order (tests, reference checks)
  kBf16,  // activations rounded to bf16 at each GEMM input: what bf16 inference does, faster
};

enum class AttentionForm { kAuto, kPlain, kAbsorbed };

struct ModelOptions {
  // Worker threads for kernels; <= 0 means all hardware threads. Default: 0.
  int num_threads = 0;
  // Default: kBf16 (inference). Use kFp32 for exactness tests.
  GemmPrecision gemm_precision = GemmPrecision::kBf16;
  // Default: kAuto (per chunk, by FLOP count). Forcing a form is for tests and benchmarks.
  AttentionForm attention_form = AttentionForm::kAuto;
  // Load the MTP layer (when the checkpoint has one). Default: true.
  bool load_mtp = true;
  // Called while weights load: bytes done, bytes total. Default: none.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

}  // namespace peerserve

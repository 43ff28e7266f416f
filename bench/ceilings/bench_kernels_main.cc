// peerserve_bench_kernels: the machine's ceilings, then each kernel's achieved throughput
// as a fraction of its ceiling, measured in the same run (medians of several runs).
//
//   peerserve_bench_kernels [--quick] [--all-isa] [--threads N] [--cpu-time] [--int8]
//                           [--decode-batch] [--packed-bf16]
//
// --int8: only the INT8 section (matmul_int8 GEMV against the read bandwidth, GEMM against
// the int8 multiply-add peak and, in alternating pairs, against the BF16 product the
// model's BF16 path runs on the same shape, a MoE decode step of INT8 experts, and the cost
// of an expert product as its tokens grow).
//
// --packed-bf16: only the bf16 products on the two weight layouts, alternating in pairs on
// the same shapes: matmul_bf16 on the checkpoint layout and matmul_packed_bf16 on weights
// packed at load (kernels/matmul_packed_bf16.h); the median of the per-pair speed ratios.
//
// --cpu-time (with --threads 1): time with the thread's CPU clock instead of the wall clock,
// which leaves out preemption on a shared, oversubscribed machine (see TimeSource).
//
// GEMV (m = 1) is judged against the streaming read bandwidth: its weights rotate through
// copies totalling several times the last-level cache, as a decode step streams a model's
// weights from memory. GEMM (m >= 64) is judged against the arithmetic peak of its
// precision (vdpbf16ps for bf16 activations, FMA for fp32).
//
// Each kernel run is paired with a ceiling run right before it, and the ratio column is the
// median of the per-pair ratios: on a shared machine the load drifts during the benchmark,
// and a pair sees (nearly) the same conditions. The ceiling column is the median of the
// paired ceiling runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "kernels/activation.h"
#include "kernels/cpu_features.h"
#include "kernels/int8_matrix.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "kernels/matmul_packed_bf16.h"

namespace peerserve::bench {
namespace {

using kernels::ActivationPrecision;
using kernels::IsaLevel;

struct Flags {
  bool quick = false;
  bool all_isa = false;
  bool int8_only = false;
  bool decode_batch_only = false;
  bool packed_bf16_only = false;
  int threads = 0;
  TimeSource time = TimeSource::kWall;
};

struct Ceilings {
  MachineCeilings machine;
  ReadBandwidthProbe* bandwidth = nullptr;
  TimeSource time = TimeSource::kWall;
};

struct Measurement {
  double seconds = 0;     // median time of one unit of work
  double achieved = 0;    // median rate (work / s / 1e9)
  double ceiling = 0;     // median paired ceiling
  double ratio = 0;       // median of achieved / ceiling per pair
  double best_ratio = 0;  // fastest kernel run / fastest ceiling run
};

// Runs ceiling() then kernel() `runs` times (after one warm-up of each). kernel() returns the
// seconds of one unit of `work` (bytes or flops); ceiling() returns GB/s or GFLOP/s. Each
// pair's ceiling is the faster of two probe runs: a probe whose worker thread lost its time
// slice came out slower than the kernel beside it (ratios above 100% on a loaded machine).
template <typename Kernel, typename Ceiling>
Measurement measure_paired(int runs, double work, const Kernel& kernel, const Ceiling& ceiling) {
  ceiling();
  kernel();
  std::vector<double> seconds, achieved, ceilings, ratios;
  for (int r = 0; r < runs; ++r) {
    const double c = std::max(ceiling(), ceiling());
    const double t = kernel();
    seconds.push_back(t);
    achieved.push_back(work / t / 1e9);
    ceilings.push_back(c);
    ratios.push_back(work / t / 1e9 / c);
  }
  const double best = *std::max_element(achieved.begin(), achieved.end()) /
                      *std::max_element(ceilings.begin(), ceilings.end());
  return {median(seconds), median(achieved), median(ceilings), median(ratios), best};
}

// Paired ceilings: one bandwidth run on the probe; short arithmetic-peak runs.
double bandwidth_now(const Ceilings& c) {
  return c.bandwidth->measure_gbs();
}
double bf16_peak_now(ThreadPool& pool, TimeSource time) {
  return measure_bf16_dot_peak(pool, 1, 0.05, time);
}
double fp32_peak_now(ThreadPool& pool, TimeSource time) {
  return measure_fp32_fma_peak(pool, 1, 0.05, time);
}

// The experts of successive decode steps: `active` distinct experts per step (as top-k
// routing picks them), walking a fixed shuffled order of all of them, so that an expert comes
// back only after every other one was read. With all experts' bytes well over the L3 size no
// counted byte is served from cache (independent random picks repeated experts within a step
// and across neighbouring steps: up to a third of the counted bytes came from L3, and a ratio
// over 100% of the read bandwidth was printed).
class ExpertCycle {
 public:
  explicit ExpertCycle(int64_t num_experts) : order_(static_cast<size_t>(num_experts)) {
    for (size_t e = 0; e < order_.size(); ++e) order_[e] = static_cast<int64_t>(e);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (size_t i = order_.size(); i > 1; --i) {  // Fisher-Yates, fixed seed
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      std::swap(order_[i - 1], order_[s % i]);
    }
  }
  // The next expert; `active` calls in a row give distinct experts while active <= experts.
  int64_t next() {
    const int64_t e = order_[next_];
    next_ = (next_ + 1) % order_.size();
    return e;
  }

 private:
  std::vector<int64_t> order_;
  size_t next_ = 0;
};

std::vector<bf16> random_bf16(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (bf16& b : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    b = float_to_bf16(static_cast<float>(static_cast<int64_t>(s % 2001) - 1000) * 1e-5f);
  }
  return v;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (float& f : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    f = static_cast<float>(static_cast<int64_t>(s % 2001) - 1000) * 1e-3f;
  }
  return v;
}

const char* precision_name(ActivationPrecision p) {
  return p == ActivationPrecision::kBf16 ? "bf16" : "fp32";
}

void print_row(const std::string& kernel, IsaLevel level, const std::string& shape,
               const char* precision, const Measurement& m, const char* unit) {
  std::printf("%-24s %-12s %-16s %-5s %9.3f %9.1f %-7s %7.1f %6.1f%% %6.1f%%\n", kernel.c_str(),
              std::string(kernels::isa_level_name(level)).c_str(), shape.c_str(), precision,
              m.seconds * 1e3, m.achieved, unit, m.ceiling, 100.0 * m.ratio, 100.0 * m.best_ratio);
  // Above its ceiling, a kernel's ratio says the ceiling runs were disturbed, not the kernel
  // fast: flagged rather than left to be read as a figure.
  if (m.ratio > 1.0) std::printf("  ^ ratio above 100%%: the ceiling runs were disturbed\n");
}

std::string shape_name(int64_t m, int64_t n, int64_t k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

// GEMV m x n x k (m = 1, or a small decode batch) over rotating weight copies (total >=
// rotate_bytes), against the read bandwidth: the weight-streaming floor.
void bench_gemv(ThreadPool& pool, const Flags& flags, const Ceilings& c, IsaLevel level, int64_t n,
                int64_t k, ActivationPrecision precision, int64_t m = 1) {
  kernels::ScopedIsaLevel isa(level);
  const int64_t matrix_bytes = n * k * 2;
  const int64_t rotate_bytes = int64_t{flags.quick ? 128 : 384} << 20;
  const int64_t copies = std::max<int64_t>(2, rotate_bytes / matrix_bytes);
  std::vector<std::vector<bf16>> weights;
  for (int64_t i = 0; i < copies; ++i)
    weights.push_back(random_bf16(static_cast<size_t>(n * k), i + 1));
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 3);
  std::vector<float> y(static_cast<size_t>(m * n));
  kernels::MatmulBf16Args args;
  args.x = x.data();
  args.y = y.data();
  args.m = m;
  args.n = n;
  args.k = k;
  const double bytes = static_cast<double>(matrix_bytes + m * (k * 4 + n * 4));
  const Measurement r = measure_paired(
      flags.quick ? 3 : 7, bytes,
      [&] {
        const Stopwatch watch(flags.time);
        for (const auto& w : weights) {
          args.w = w.data();
          kernels::matmul_bf16(args, precision, &pool);
        }
        return watch.seconds() / static_cast<double>(copies);
      },
      [&] { return bandwidth_now(c); });
  print_row(m == 1 ? "matmul_bf16 gemv" : "matmul_bf16 decode batch", level, shape_name(m, n, k),
            precision_name(precision), r, "GB/s");
}

void bench_gemm(ThreadPool& pool, const Flags& flags, IsaLevel level, int64_t m, int64_t n,
                int64_t k, ActivationPrecision precision) {
  kernels::ScopedIsaLevel isa(level);
  const std::vector<bf16> w = random_bf16(static_cast<size_t>(n * k), 5);
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 6);
  std::vector<float> y(static_cast<size_t>(m * n));
  const kernels::MatmulBf16Args args{
      .x = x.data(), .w = w.data(), .y = y.data(), .m = m, .n = n, .k = k};
  // The ceiling of the instruction the path uses: vdpbf16ps only for bf16 activations on
  // an AVX512_BF16 CPU; fp32 FMA otherwise.
  const bool dot = precision == ActivationPrecision::kBf16 && level == IsaLevel::kAvx512Bf16;
  const Measurement r = measure_paired(
      flags.quick ? 3 : 5, 2.0 * static_cast<double>(m * n * k),
      [&] {
        const Stopwatch watch(flags.time);
        kernels::matmul_bf16(args, precision, &pool);
        return watch.seconds();
      },
      [&] { return dot ? bf16_peak_now(pool, flags.time) : fp32_peak_now(pool, flags.time); });
  print_row("matmul_bf16 gemm", level, shape_name(m, n, k), precision_name(precision), r,
            "GFLOP/s");
}

// One MoE decode step at batch 1: `active` experts of 1 token each, gate and up in one
// grouped call, silu*mul, down in a second grouped call. Experts are drawn from a pool
// larger than the cache. With grouped = false, the same work as one matmul_bf16 per
// matrix (the baseline the grouped call must beat).
void bench_experts(ThreadPool& pool, const Flags& flags, const Ceilings& c, IsaLevel level,
                   int64_t hidden, int64_t inter, int64_t num_experts, int64_t active,
                   bool grouped) {
  kernels::ScopedIsaLevel isa(level);
  struct Expert {
    std::vector<bf16> gate, up, down;
  };
  std::vector<Expert> experts;
  for (int64_t e = 0; e < num_experts; ++e) {
    experts.push_back({random_bf16(static_cast<size_t>(inter * hidden), 3 * e + 1),
                       random_bf16(static_cast<size_t>(inter * hidden), 3 * e + 2),
                       random_bf16(static_cast<size_t>(hidden * inter), 3 * e + 3)});
  }
  const std::vector<float> x = random_floats(static_cast<size_t>(hidden), 9);
  std::vector<float> gate_out(static_cast<size_t>(active * inter)),
      up_out(static_cast<size_t>(active * inter)), down_out(static_cast<size_t>(active * hidden));
  const int steps = static_cast<int>(std::max<int64_t>(8, 2 * num_experts / active));
  ExpertCycle cycle(num_experts);
  const auto step = [&] {
    std::vector<kernels::MatmulBf16Args> first, second;
    for (int64_t a = 0; a < active; ++a) {
      const Expert& e = experts[static_cast<size_t>(cycle.next())];
      kernels::MatmulBf16Args g;
      g.x = x.data();
      g.m = 1;
      g.n = inter;
      g.k = hidden;
      g.w = e.gate.data();
      g.y = gate_out.data() + a * inter;
      first.push_back(g);
      g.w = e.up.data();
      g.y = up_out.data() + a * inter;
      first.push_back(g);
      kernels::MatmulBf16Args d;
      d.x = gate_out.data() + a * inter;
      d.m = 1;
      d.n = hidden;
      d.k = inter;
      d.w = e.down.data();
      d.y = down_out.data() + a * hidden;
      second.push_back(d);
    }
    if (grouped) {
      kernels::grouped_matmul_bf16(first, ActivationPrecision::kBf16, &pool);
    } else {
      for (const auto& p : first) kernels::matmul_bf16(p, ActivationPrecision::kBf16, &pool);
    }
    kernels::silu_mul(gate_out.data(), up_out.data(), gate_out.data(), active * inter);
    if (grouped) {
      kernels::grouped_matmul_bf16(second, ActivationPrecision::kBf16, &pool);
    } else {
      for (const auto& p : second) kernels::matmul_bf16(p, ActivationPrecision::kBf16, &pool);
    }
  };
  const Measurement m = measure_paired(
      flags.quick ? 3 : 7, static_cast<double>(active * 3 * inter * hidden * 2),
      [&] {
        const Stopwatch watch(flags.time);
        for (int s = 0; s < steps; ++s) step();
        return watch.seconds() / steps;
      },
      [&] { return bandwidth_now(c); });
  print_row(
      grouped ? "experts grouped" : "experts one-by-one", level,
      std::to_string(active) + "x(" + std::to_string(hidden) + "," + std::to_string(inter) + ")",
      "bf16", m, "GB/s");
}

// ---- INT8 ----

kernels::PackedInt8Matrix random_int8(int64_t n, int64_t k, uint64_t seed) {
  const std::vector<float> w = random_floats(static_cast<size_t>(n * k), seed);
  auto packed = kernels::PackedInt8Matrix::quantize(kernels::MatrixView<float>{w.data(), n, k, 0});
  PS_CHECK(packed.ok()) << packed.status().to_string();
  return std::move(packed).value();
}

kernels::PackedInt8Matrix random_gate_up_int8(int64_t inter, int64_t k, uint64_t seed) {
  const std::vector<float> g = random_floats(static_cast<size_t>(inter * k), seed);
  const std::vector<float> u = random_floats(static_cast<size_t>(inter * k), seed + 1);
  auto packed = kernels::PackedInt8Matrix::quantize_gate_up(
      kernels::MatrixView<float>{g.data(), inter, k, 0},
      kernels::MatrixView<float>{u.data(), inter, k, 0});
  PS_CHECK(packed.ok()) << packed.status().to_string();
  return std::move(packed).value();
}

// Copies of a matrix totalling several times the last-level cache (as a decode step streams
// a model's weights from memory).
int64_t rotating_copies(const Flags& flags, int64_t matrix_bytes) {
  const int64_t rotate_bytes = int64_t{flags.quick ? 128 : 384} << 20;
  return std::max<int64_t>(2, rotate_bytes / matrix_bytes);
}

// GEMV 1 x n x k against the streaming read bandwidth: bytes = int8 weights + scales and
// corrections + x + y.
void bench_int8_gemv(ThreadPool& pool, const Flags& flags, const Ceilings& c, IsaLevel level,
                     int64_t n, int64_t k, int64_t m = 1) {
  kernels::ScopedIsaLevel isa(level);
  std::vector<kernels::PackedInt8Matrix> weights;
  const int64_t copies = rotating_copies(flags, n * k);
  for (int64_t i = 0; i < copies; ++i) weights.push_back(random_int8(n, k, i + 1));
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 3);
  std::vector<float> y(static_cast<size_t>(m * n));
  const double bytes = static_cast<double>(weights[0].bytes() + m * (k * 4 + n * 4));
  const Measurement r = measure_paired(
      flags.quick ? 3 : 7, bytes,
      [&] {
        const Stopwatch watch(flags.time);
        for (const auto& w : weights) {
          kernels::matmul_int8({x.data(), 0, &w, y.data(), 0, m, false}, &pool);
        }
        return watch.seconds() / static_cast<double>(copies);
      },
      [&] { return bandwidth_now(c); });
  print_row(m == 1 ? "matmul_int8 gemv" : "matmul_int8 decode batch", level, shape_name(m, n, k),
            "int8", r, "GB/s");
}

// GEMM m x n x k against the int8 multiply-add peak of the level's instructions, then
// against the BF16 product the model's BF16 path runs at this level (matmul_packed_bf16 on
// weights packed at load where that is fast, matmul_bf16 on the checkpoint layout elsewhere;
// bf16 activations), the two alternating in pairs: the speed-up an INT8 prefill can get from
// its products alone, before the work both paths share.
void bench_int8_gemm(ThreadPool& pool, const Flags& flags, IsaLevel level, int64_t m, int64_t n,
                     int64_t k) {
  kernels::ScopedIsaLevel isa(level);
  const kernels::PackedInt8Matrix w = random_int8(n, k, 5);
  const std::vector<bf16> wb = random_bf16(static_cast<size_t>(n * k), 5);
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 6);
  std::vector<float> y(static_cast<size_t>(m * n));
  const int runs = flags.quick ? 3 : 5;
  const double ops = 2.0 * static_cast<double>(m * n * k);
  auto run_int8 = [&] {
    const Stopwatch watch(flags.time);
    kernels::matmul_int8({x.data(), 0, &w, y.data(), 0, m, false}, &pool);
    return watch.seconds();
  };
  const Measurement r = measure_paired(
      runs, ops, run_int8, [&] { return measure_int8_dot_peak(pool, level, 1, 0.05, flags.time); });
  print_row("matmul_int8 gemm", level, shape_name(m, n, k), "int8", r, "GOP/s");

  const bool packed = kernels::packed_bf16_is_fast();
  std::optional<kernels::PackedBf16Matrix> wp;
  if (packed) {
    auto p = kernels::PackedBf16Matrix::pack({wb.data(), n, k, 0});
    PS_CHECK(p.ok()) << p.status().to_string();
    wp = std::move(p).value();
  }
  auto run_bf16 = [&] {
    const Stopwatch watch(flags.time);
    if (packed) {
      kernels::matmul_packed_bf16({x.data(), 0, &*wp, y.data(), 0, m, false}, &pool);
    } else {
      const kernels::MatmulBf16Args args{
          .x = x.data(), .w = wb.data(), .y = y.data(), .m = m, .n = n, .k = k};
      kernels::matmul_bf16(args, ActivationPrecision::kBf16, &pool);
    }
    return watch.seconds();
  };
  run_bf16();
  std::vector<double> bf16_seconds, speedup;
  for (int i = 0; i < 2 * runs + 1; ++i) {
    const double a = run_int8(), b = run_bf16();
    bf16_seconds.push_back(b);
    speedup.push_back(b / a);
  }
  const auto [lo, hi] = std::minmax_element(speedup.begin(), speedup.end());
  std::printf("%-24s %-12s %-16s %-5s %9.3f   int8 speed-up: %.2fx (pairs %.2f-%.2fx)\n",
              packed ? "  matmul_packed_bf16" : "  matmul_bf16",
              std::string(kernels::isa_level_name(level)).c_str(), shape_name(m, n, k).c_str(),
              "bf16", median(bf16_seconds) * 1e3, median(speedup), *lo, *hi);
}

// Where decode turns into prefill: one fused gate/up expert matrix (cold: rotating copies)
// with m tokens. While the time per call stays near the m = 1 time the product is bound
// by streaming the weights (GEMV regime); once it grows with m it is bound by arithmetic.
void bench_int8_rows(ThreadPool& pool, const Flags& flags, IsaLevel level, int64_t hidden,
                     int64_t inter) {
  kernels::ScopedIsaLevel isa(level);
  std::vector<kernels::PackedInt8Matrix> weights;
  const int64_t copies = rotating_copies(flags, 2 * inter * hidden);
  for (int64_t i = 0; i < copies; ++i) weights.push_back(random_gate_up_int8(inter, hidden, i));
  std::printf("gate_up_silu_int8 %s, k=%lld, 2x%lld rows (cold weights), m tokens:\n",
              std::string(kernels::isa_level_name(level)).c_str(), static_cast<long long>(hidden),
              static_cast<long long>(inter));
  std::printf("  %4s %10s %12s %12s\n", "m", "median_ms", "us/token", "vs m=1");
  double first = 0;
  for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(m * hidden), 4);
    std::vector<float> out(static_cast<size_t>(m * inter));
    std::vector<double> seconds;
    for (int r = 0; r < (flags.quick ? 3 : 7) + 1; ++r) {
      const Stopwatch watch(flags.time);
      for (const auto& w : weights) {
        kernels::gate_up_silu_int8({x.data(), 0, &w, out.data(), 0, m}, &pool);
      }
      if (r > 0) seconds.push_back(watch.seconds() / static_cast<double>(copies));
    }
    const double t = median(seconds);
    if (m == 1) first = t;
    std::printf("  %4lld %10.3f %12.1f %11.2fx\n", static_cast<long long>(m), t * 1e3,
                t * 1e6 / static_cast<double>(m), t / first);
  }
}

// One MoE decode step with INT8 experts: `active` experts of `tokens` tokens each, fused
// gate/up/SiLU in one grouped call, down in a second; against the read bandwidth.
void bench_int8_experts(ThreadPool& pool, const Flags& flags, const Ceilings& c, IsaLevel level,
                        int64_t hidden, int64_t inter, int64_t num_experts, int64_t active,
                        int64_t tokens) {
  kernels::ScopedIsaLevel isa(level);
  struct Expert {
    kernels::PackedInt8Matrix gate_up, down;
  };
  std::vector<Expert> experts;
  for (int64_t e = 0; e < num_experts; ++e) {
    experts.push_back(
        {random_gate_up_int8(inter, hidden, 3 * e + 1), random_int8(hidden, inter, 3 * e + 3)});
  }
  const std::vector<float> x = random_floats(static_cast<size_t>(tokens * hidden), 9);
  std::vector<float> act(static_cast<size_t>(active * tokens * inter)),
      down_out(static_cast<size_t>(active * tokens * hidden));
  const int steps = static_cast<int>(std::max<int64_t>(8, 2 * num_experts / active));
  ExpertCycle cycle(num_experts);
  const auto step = [&] {
    std::vector<kernels::GateUpInt8Args> first;
    std::vector<kernels::MatmulInt8Args> second;
    for (int64_t a = 0; a < active; ++a) {
      const Expert& e = experts[static_cast<size_t>(cycle.next())];
      float* h = act.data() + a * tokens * inter;
      first.push_back({x.data(), 0, &e.gate_up, h, 0, tokens});
      second.push_back({h, 0, &e.down, down_out.data() + a * tokens * hidden, 0, tokens, false});
    }
    kernels::grouped_gate_up_silu_int8(first, &pool);
    kernels::grouped_matmul_int8(second, &pool);
  };
  const Measurement m = measure_paired(
      flags.quick ? 3 : 7, static_cast<double>(active * 3 * inter * hidden),
      [&] {
        const Stopwatch watch(flags.time);
        for (int s = 0; s < steps; ++s) step();
        return watch.seconds() / steps;
      },
      [&] { return bandwidth_now(c); });
  print_row("experts int8 grouped", level,
            std::to_string(active) + "x" + std::to_string(tokens) + "x(" + std::to_string(hidden) +
                "," + std::to_string(inter) + ")",
            "int8", m, "GB/s");
}

void run_int8_section(ThreadPool& pool, const Flags& flags, const Ceilings& c,
                      const std::vector<IsaLevel>& levels) {
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;
    std::printf("ceiling: int8 multiply-add peak (%s) %.1f GOP/s\n",
                std::string(kernels::isa_level_name(level)).c_str(),
                measure_int8_dot_peak(pool, level, 3, 0.05, flags.time));
  }
  const int64_t gemv_shapes[][2] = {{2048, 2048}, {4096, 2048}, {2816, 2048}, {2048, 1408},
                                    {1024, 1024}, {2816, 1024}, {1024, 2816}};
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;
    for (const auto& s : gemv_shapes) bench_int8_gemv(pool, flags, c, level, s[0], s[1]);
    bench_int8_gemv(pool, flags, c, level, 2048, 2048, 16);
    bench_int8_gemv(pool, flags, c, level, 2816, 1024, 16);
  }
  // Prefill products: 512-token dense shapes, and the experts of a 512-token prefill (48
  // tokens per expert on average at top 6 of 64): the mini model's fused gate/up (2 x 512 x
  // 1024) and down (1024 x 512), DeepSeek-V2-Lite's (2 x 1408 x 2048, 2048 x 1408).
  const int64_t gemm_shapes[][3] = {{512, 2048, 2048}, {512, 2816, 1024}, {512, 1024, 2816},
                                    {64, 2048, 2048},  {48, 1024, 1024},  {48, 1024, 512},
                                    {48, 2816, 2048},  {48, 2048, 1408}};
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;
    for (const auto& s : gemm_shapes) bench_int8_gemm(pool, flags, level, s[0], s[1], s[2]);
  }
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;
    // The mini model's experts and DeepSeek-V2-Lite's (hidden 2048, moe_intermediate 1408).
    bench_int8_experts(pool, flags, c, level, 1024, 512, 64, 8, 1);
    bench_int8_experts(pool, flags, c, level, 2048, 1408, flags.quick ? 12 : 24, 6, 1);
    bench_int8_experts(pool, flags, c, level, 2048, 1408, flags.quick ? 12 : 24, 6, 4);
  }
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;
    bench_int8_rows(pool, flags, level, 2048, 1408);
  }
}

// matmul_bf16 (checkpoint layout) against matmul_packed_bf16 (packed layout), bf16
// activations, m x n x k, runs alternating in pairs; weights rotate through copies totalling
// several times the last-level cache when m <= 16 (decode streams them from memory).
void bench_packed_vs_checkpoint(ThreadPool& pool, const Flags& flags, int64_t m, int64_t n,
                                int64_t k) {
  const int64_t copies = m <= 16 ? rotating_copies(flags, n * k * 2) : 1;
  std::vector<std::vector<bf16>> weights;
  std::vector<kernels::PackedBf16Matrix> packed;
  for (int64_t i = 0; i < copies; ++i) {
    weights.push_back(random_bf16(static_cast<size_t>(n * k), i + 1));
    auto p = kernels::PackedBf16Matrix::pack({weights.back().data(), n, k, 0});
    PS_CHECK(p.ok()) << p.status().to_string();
    packed.push_back(std::move(p).value());
  }
  const std::vector<float> x = random_floats(static_cast<size_t>(m * k), 3);
  std::vector<float> y(static_cast<size_t>(m * n));
  auto run = [&](bool use_packed) {
    const Stopwatch watch(flags.time);
    for (int64_t i = 0; i < copies; ++i) {
      if (use_packed) {
        kernels::matmul_packed_bf16({x.data(), 0, &packed[i], y.data(), 0, m, false}, &pool);
      } else {
        const kernels::MatmulBf16Args args{.x = x.data(),
                                           .w = weights[static_cast<size_t>(i)].data(),
                                           .y = y.data(),
                                           .m = m,
                                           .n = n,
                                           .k = k};
        kernels::matmul_bf16(args, ActivationPrecision::kBf16, &pool);
      }
    }
    return watch.seconds() / static_cast<double>(copies);
  };
  run(false);
  run(true);
  std::vector<double> plain_s, packed_s, speedup;
  for (int r = 0; r < (flags.quick ? 3 : 9); ++r) {
    plain_s.push_back(run(false));
    packed_s.push_back(run(true));
    speedup.push_back(plain_s.back() / packed_s.back());
  }
  const double flops = 2.0 * static_cast<double>(m * n * k),
               bytes = 2.0 * static_cast<double>(n * k);
  const double a = median(plain_s), b = median(packed_s);
  std::printf(
      "%-16s %9.3f ms %7.1f GFLOP/s %6.1f GB/s | packed %9.3f ms %7.1f GFLOP/s %6.1f GB/s | "
      "speedup %.2fx (pairs %.2f-%.2fx)\n",
      shape_name(m, n, k).c_str(), a * 1e3, flops / a / 1e9, bytes / a / 1e9, b * 1e3,
      flops / b / 1e9, bytes / b / 1e9, median(speedup),
      *std::min_element(speedup.begin(), speedup.end()),
      *std::max_element(speedup.begin(), speedup.end()));
}

constexpr const char* kUsage = R"(usage: peerserve_bench_kernels [options]
The machine's ceilings (streaming read bandwidth, fp32 FMA, bf16 dot and int8 peaks, a large
bf16 GEMM), then each kernel's throughput as a fraction of its ceiling measured right before
it (medians; ratio = median of the per-pair ratios).
  --quick          fewer runs and smaller buffers
  --all-isa        every ISA level this CPU supports (default: the best one)
  --threads N      threads (default 0: one per core)
  --cpu-time       time with the calling thread's CPU clock (needs --threads 1)
  --int8           only the INT8 section (GEMV vs bandwidth, GEMM vs the int8 peak and vs
                   the model's BF16 product, a MoE decode step of INT8 experts, expert cost
                   by tokens)
  --decode-batch   only the batch-16 decode lines (bf16 and int8)
  --packed-bf16    only matmul_bf16 (checkpoint layout) against matmul_packed_bf16 (weights
                   packed at load), alternating in pairs, per-pair speed ratios
  --help           this text
)";

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      f.quick = true;
    } else if (std::strcmp(argv[i], "--all-isa") == 0) {
      f.all_isa = true;
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      // 0: one per core.
      f.threads = static_cast<int>(
          peerserve::bench::flag_integer("--threads", i + 1 < argc ? argv[i + 1] : "", 0, 1024));
      ++i;
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      f.time = TimeSource::kThreadCpu;
    } else if (std::strcmp(argv[i], "--int8") == 0) {
      f.int8_only = true;
    } else if (std::strcmp(argv[i], "--decode-batch") == 0) {
      f.decode_batch_only = true;
    } else if (std::strcmp(argv[i], "--packed-bf16") == 0) {
      f.packed_bf16_only = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "unknown option %s\n%s", argv[i], kUsage);
      std::exit(2);
    }
  }
  if (f.time == TimeSource::kThreadCpu && f.threads != 1) {
    std::fprintf(stderr, "--cpu-time needs --threads 1 (it times the calling thread only)\n");
    std::exit(2);
  }
  return f;
}

int run(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  ThreadPool pool(flags.threads);
  CeilingOptions options;
  if (flags.quick) {
    options.bandwidth_buffer_bytes = int64_t{256} << 20;
    options.runs = 3;
    options.peak_run_seconds = 0.05;
  }
  options.time = flags.time;
  Ceilings c{measure_machine_ceilings(pool, options)};
  // Paired bandwidth runs read 256 MiB (8x the last-level cache of the reference machine).
  ReadBandwidthProbe probe(pool, int64_t{256} << 20, flags.time);
  c.bandwidth = &probe;
  std::printf("threads %d, best ISA %s, %s\n", c.machine.threads, c.machine.isa.c_str(),
              flags.time == TimeSource::kThreadCpu ? "thread CPU time" : "wall time");
  std::printf("ceiling: read bandwidth      %8.1f GB/s\n", c.machine.read_bandwidth_gbs);
  std::printf("ceiling: fp32 FMA peak       %8.1f GFLOP/s\n", c.machine.fp32_fma_gflops);
  std::printf("ceiling: bf16 dot peak       %8.1f GFLOP/s\n", c.machine.bf16_dot_gflops);
  std::printf("measured bf16 GEMM 512x2048x2048 (%s layout): %.1f GFLOP/s\n\n",
              default_bf16_gemm_layout() == Bf16GemmLayout::kPacked ? "packed" : "checkpoint",
              c.machine.matmul_bf16_gflops);
  std::printf("%-24s %-12s %-16s %-5s %9s %9s %-7s %7s %7s %7s\n", "kernel", "isa", "m x n x k",
              "act", "median_ms", "achieved", "unit", "ceiling", "ratio", "best");
  std::printf(
      "(medians; each kernel run is paired with a ceiling run: ceiling = median of those, ratio ="
      " median of per-pair ratios, best = fastest kernel run / fastest ceiling run)\n");

  std::vector<IsaLevel> levels = {kernels::best_isa_level()};
  if (flags.all_isa) levels = kernels::supported_isa_levels();
  if (flags.int8_only) {
    run_int8_section(pool, flags, c, levels);
    return 0;
  }
  if (flags.packed_bf16_only) {
    for (IsaLevel level : levels) {
      if (level == IsaLevel::kScalar) continue;
      kernels::ScopedIsaLevel isa(level);
      std::printf(
          "\nbf16 activations, isa %s: matmul_bf16 (checkpoint layout) | "
          "matmul_packed_bf16 (packed at load)%s\n",
          std::string(kernels::isa_level_name(level)).c_str(),
          kernels::packed_bf16_is_fast() ? "" : " [the model does not pack at this level]");
      const int64_t shapes[][3] = {{1, 2048, 2048},  {4, 2048, 2048},   {16, 2048, 2048},
                                   {16, 2816, 2048}, {16, 1408, 2048},  {64, 2048, 2048},
                                   {48, 1408, 2048}, {512, 2048, 2048}, {512, 2048, 1408}};
      for (const auto& s : shapes) bench_packed_vs_checkpoint(pool, flags, s[0], s[1], s[2]);
    }
    return 0;
  }
  if (flags.decode_batch_only) {  // --decode-batch: only the batch-16 decode lines (bf16, int8)
    for (IsaLevel level : levels) {
      if (level == IsaLevel::kScalar) continue;
      bench_gemv(pool, flags, c, level, 2048, 2048, ActivationPrecision::kBf16, 16);
      bench_gemv(pool, flags, c, level, 2816, 1024, ActivationPrecision::kBf16, 16);
      bench_int8_gemv(pool, flags, c, level, 2048, 2048, 16);
      bench_int8_gemv(pool, flags, c, level, 2816, 1024, 16);
    }
    return 0;
  }
  // GEMV shapes: the issue's examples and the mini model's projections.
  const int64_t gemv_shapes[][2] = {{2048, 2048}, {4096, 2048}, {1024, 1024},
                                    {2816, 1024}, {1024, 2816}, {2048, 256}};
  for (IsaLevel level : levels) {
    for (const auto& s : gemv_shapes) {
      for (ActivationPrecision p : {ActivationPrecision::kBf16, ActivationPrecision::kFp32}) {
        bench_gemv(pool, flags, c, level, s[0], s[1], p);
      }
    }
    // Decode at batch 16 (dense projections, shared experts): still bound by streaming the
    // weights once if the kernel keeps up.
    bench_gemv(pool, flags, c, level, 2048, 2048, ActivationPrecision::kBf16, 16);
    bench_gemv(pool, flags, c, level, 2816, 1024, ActivationPrecision::kBf16, 16);
  }
  const int64_t gemm_shapes[][3] = {
      {512, 2048, 2048}, {512, 2816, 1024}, {512, 1024, 2816}, {64, 2048, 2048}};
  for (IsaLevel level : levels) {
    if (level == IsaLevel::kScalar) continue;  // seconds per call; the tests cover it
    for (const auto& s : gemm_shapes) {
      for (ActivationPrecision p : {ActivationPrecision::kBf16, ActivationPrecision::kFp32}) {
        bench_gemm(pool, flags, level, s[0], s[1], s[2], p);
      }
    }
  }
  for (IsaLevel level : levels) {
    // The mini model's experts (hidden 1024, moe_intermediate 512, 64 experts), 8 active
    // as in the issue, and the issue's larger example shape.
    bench_experts(pool, flags, c, level, 1024, 512, 64, 8, true);
    bench_experts(pool, flags, c, level, 1024, 512, 64, 8, false);
    bench_experts(pool, flags, c, level, 2048, 1024, flags.quick ? 16 : 32, 8, true);
  }
  run_int8_section(pool, flags, c, levels);
  return 0;
}

}  // namespace
}  // namespace peerserve::bench

int main(int argc, char** argv) {
  return peerserve::bench::run(argc, argv);
}

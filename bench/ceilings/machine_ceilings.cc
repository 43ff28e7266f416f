#include "bench/ceilings/machine_ceilings.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "bench/ceilings/compute_loops.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace peerserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Keeps results alive so the loops are not optimised away.
std::atomic<float> sink{0};

bool has(kernels::IsaLevel level) {
  return kernels::isa_level_supported(level);
}

// Runs loop(iterations) on every thread and returns the wall time of the slowest.
template <typename Loop>
double time_on_all_threads(ThreadPool& pool, int64_t iterations, const Loop& loop) {
  const auto start = Clock::now();
  pool.run_on_all([&](int, int) { sink.store(loop(iterations), std::memory_order_relaxed); });
  return seconds_since(start);
}

// Median rate (work units per second) of `runs` runs lasting about run_seconds each;
// `work_per_iteration` is per thread.
template <typename Loop>
double peak_rate(ThreadPool& pool, int runs, double run_seconds, double work_per_iteration,
                 const Loop& loop) {
  int64_t iterations = 1 << 14;
  // Calibrate: grow until a run lasts a tenth of the target.
  while (time_on_all_threads(pool, iterations, loop) < run_seconds / 10) iterations *= 2;
  iterations *= 10;
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) {
    const double t = time_on_all_threads(pool, iterations, loop);
    rates.push_back(work_per_iteration * static_cast<double>(iterations) * pool.num_threads() / t);
  }
  return median(rates);
}

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, int64_t buffer_bytes)
    : pool_(pool), buffer_(static_cast<size_t>(buffer_bytes / int64_t{sizeof(float)})) {
  // Touch every page from the threads that will read it.
  const int64_t n = static_cast<int64_t>(buffer_.size());
  pool_.parallel_for(
      n, [&](int64_t b, int64_t e) { std::fill(buffer_.data() + b, buffer_.data() + e, 1.0f); });
}

double ReadBandwidthProbe::measure_gbs() {
  const int64_t n = static_cast<int64_t>(buffer_.size());
  const bool avx2 = has(kernels::IsaLevel::kAvx2);
  const auto start = Clock::now();
  pool_.run_on_all([&](int t, int nt) {
    const float* begin = buffer_.data() + n * t / nt;
    const float* end = buffer_.data() + n * (t + 1) / nt;
    sink.store(avx2 ? internal::read_sum_avx2(begin, end) : internal::read_sum_scalar(begin, end),
               std::memory_order_relaxed);
  });
  return static_cast<double>(n) * sizeof(float) / seconds_since(start) / 1e9;
}

double measure_read_bandwidth(ThreadPool& pool, int64_t buffer_bytes, int runs) {
  ReadBandwidthProbe probe(pool, buffer_bytes);
  probe.measure_gbs();  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) rates.push_back(probe.measure_gbs());
  return median(rates);
}

double measure_fp32_fma_peak(ThreadPool& pool, int runs, double run_seconds) {
  using internal::kFmaChains;
  if (has(kernels::IsaLevel::kAvx512)) {
    return peak_rate(pool, runs, run_seconds, 2.0 * 16 * kFmaChains, internal::fma_loop_avx512) /
           1e9;
  }
  if (has(kernels::IsaLevel::kAvx2)) {
    return peak_rate(pool, runs, run_seconds, 2.0 * 8 * kFmaChains, internal::fma_loop_avx2) / 1e9;
  }
  return peak_rate(pool, runs, run_seconds, 2.0 * kFmaChains, internal::fma_loop_scalar) / 1e9;
}

double measure_bf16_dot_peak(ThreadPool& pool, int runs, double run_seconds) {
  if (!has(kernels::IsaLevel::kAvx512Bf16)) return 0;
  // Each vdpbf16ps: 16 lanes x 2 pairs x (multiply + add).
  return peak_rate(pool, runs, run_seconds, 4.0 * 16 * internal::kFmaChains,
                   internal::bf16_dot_loop_avx512) /
         1e9;
}

double measure_matmul_bf16_throughput(ThreadPool& pool, int64_t m, int64_t n, int64_t k, int runs) {
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  std::vector<bf16> w(static_cast<size_t>(n * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 251) / 251.0f - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(static_cast<float>(i % 241) / 2410.0f);
  kernels::MatmulBf16Args args;
  args.x = x.data();
  args.w = w.data();
  args.y = y.data();
  args.m = m;
  args.n = n;
  args.k = k;
  std::vector<double> rates;
  for (int r = 0; r < runs + 1; ++r) {
    const auto start = Clock::now();
    kernels::matmul_bf16(args, kernels::ActivationPrecision::kBf16, &pool);
    const double t = seconds_since(start);
    if (r > 0) rates.push_back(2.0 * static_cast<double>(m * n * k) / t / 1e9);
  }
  return median(rates);
}

MachineCeilings measure_machine_ceilings(ThreadPool& pool, const CeilingOptions& options) {
  MachineCeilings c;
  c.threads = pool.num_threads();
  c.isa = std::string(kernels::isa_level_name(kernels::active_isa_level()));
  c.read_bandwidth_gbs = measure_read_bandwidth(pool, options.bandwidth_buffer_bytes, options.runs);
  c.fp32_fma_gflops = measure_fp32_fma_peak(pool, options.runs, options.peak_run_seconds);
  c.bf16_dot_gflops = measure_bf16_dot_peak(pool, options.runs, options.peak_run_seconds);
  c.matmul_bf16_gflops = measure_matmul_bf16_throughput(pool, 512, 2048, 2048, options.runs);
  return c;
}

}  // namespace peerserve::bench

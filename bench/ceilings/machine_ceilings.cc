#include "bench/ceilings/machine_ceilings.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <optional>
#include <vector>

#include "base/check.h"
#include "bench/ceilings/compute_loops.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_packed_bf16.h"

namespace peerserve::bench {
namespace {

double now_seconds(TimeSource source) {
  if (source == TimeSource::kThreadCpu) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Keeps results alive so the loops are not optimised away.
std::atomic<float> sink{0};

bool has(kernels::IsaLevel level) {
  return kernels::isa_level_supported(level);
}

// Runs loop(iterations) on every thread and returns the time until the slowest is done.
template <typename Loop>
double time_on_all_threads(ThreadPool& pool, TimeSource time, int64_t iterations,
                           const Loop& loop) {
  const Stopwatch watch(time);
  pool.run_on_all([&](int, int) { sink.store(loop(iterations), std::memory_order_relaxed); });
  return watch.seconds();
}

// Median rate (work units per second) of `runs` runs lasting about run_seconds each;
// `work_per_iteration` is per thread.
template <typename Loop>
double peak_rate(ThreadPool& pool, TimeSource time, int runs, double run_seconds,
                 double work_per_iteration, const Loop& loop) {
  int64_t iterations = 1 << 14;
  // Calibrate: grow until a run lasts a tenth of the target.
  while (time_on_all_threads(pool, time, iterations, loop) < run_seconds / 10) iterations *= 2;
  iterations *= 10;
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) {
    const double t = time_on_all_threads(pool, time, iterations, loop);
    rates.push_back(work_per_iteration * static_cast<double>(iterations) * pool.num_threads() / t);
  }
  return median(rates);
}

}  // namespace

Stopwatch::Stopwatch(TimeSource source) : source_(source), start_(now_seconds(source)) {}

double Stopwatch::seconds() const {
  return now_seconds(source_) - start_;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, int64_t buffer_bytes, TimeSource time)
    : pool_(pool),
      time_(time),
      buffer_(static_cast<size_t>(buffer_bytes / int64_t{sizeof(float)})) {
  // Touch every page from the threads that will read it.
  const int64_t n = static_cast<int64_t>(buffer_.size());
  pool_.parallel_for(
      n, [&](int64_t b, int64_t e) { std::fill(buffer_.data() + b, buffer_.data() + e, 1.0f); });
}

double ReadBandwidthProbe::measure_gbs() {
  const int64_t n = static_cast<int64_t>(buffer_.size());
  const bool avx2 = has(kernels::IsaLevel::kAvx2);
  const Stopwatch watch(time_);
  pool_.run_on_all([&](int t, int nt) {
    const float* begin = buffer_.data() + n * t / nt;
    const float* end = buffer_.data() + n * (t + 1) / nt;
    sink.store(avx2 ? internal::read_sum_avx2(begin, end) : internal::read_sum_scalar(begin, end),
               std::memory_order_relaxed);
  });
  return static_cast<double>(n) * sizeof(float) / watch.seconds() / 1e9;
}

double measure_read_bandwidth(ThreadPool& pool, int64_t buffer_bytes, int runs, TimeSource time) {
  ReadBandwidthProbe probe(pool, buffer_bytes, time);
  probe.measure_gbs();  // warm-up
  std::vector<double> rates;
  for (int r = 0; r < runs; ++r) rates.push_back(probe.measure_gbs());
  return median(rates);
}

double measure_fp32_fma_peak(ThreadPool& pool, int runs, double run_seconds, TimeSource time) {
  using internal::kFmaChains;
  // The level the kernels run at (a forced --isa included), not the CPU's best.
  const kernels::IsaLevel level = kernels::active_isa_level();
  if (level >= kernels::IsaLevel::kAvx512 && has(kernels::IsaLevel::kAvx512)) {
    return peak_rate(pool, time, runs, run_seconds, 2.0 * 16 * kFmaChains,
                     internal::fma_loop_avx512) /
           1e9;
  }
  if (level >= kernels::IsaLevel::kAvx2 && has(kernels::IsaLevel::kAvx2)) {
    return peak_rate(pool, time, runs, run_seconds, 2.0 * 8 * kFmaChains, internal::fma_loop_avx2) /
           1e9;
  }
  return peak_rate(pool, time, runs, run_seconds, 2.0 * kFmaChains, internal::fma_loop_scalar) /
         1e9;
}

double measure_bf16_dot_peak(ThreadPool& pool, int runs, double run_seconds, TimeSource time) {
  if (kernels::active_isa_level() < kernels::IsaLevel::kAvx512Bf16 ||
      !has(kernels::IsaLevel::kAvx512Bf16)) {
    return 0;
  }
  // Each vdpbf16ps: 16 lanes x 2 pairs x (multiply + add).
  return peak_rate(pool, time, runs, run_seconds, 4.0 * 16 * internal::kFmaChains,
                   internal::bf16_dot_loop_avx512) /
         1e9;
}

double measure_int8_dot_peak(ThreadPool& pool, kernels::IsaLevel level, int runs,
                             double run_seconds, TimeSource time) {
  using internal::kFmaChains;
  if (level >= kernels::IsaLevel::kAvx512Vnni && has(kernels::IsaLevel::kAvx512Vnni)) {
    // Each int32 sink is converted to float only to keep it alive.
    return peak_rate(pool, time, runs, run_seconds, 2.0 * 64 * kFmaChains,
                     [](int64_t n) {
                       return static_cast<float>(internal::int8_dot_loop_avx512_vnni(n));
                     }) /
           1e9;
  }
  if (level >= kernels::IsaLevel::kAvx2 && has(kernels::IsaLevel::kAvx2)) {
    return peak_rate(
               pool, time, runs, run_seconds, 2.0 * 32 * kFmaChains,
               [](int64_t n) { return static_cast<float>(internal::int8_madd_loop_avx2(n)); }) /
           1e9;
  }
  return 0;
}

Bf16GemmLayout default_bf16_gemm_layout() {
  return kernels::packed_bf16_is_fast() ? Bf16GemmLayout::kPacked : Bf16GemmLayout::kCheckpoint;
}

double measure_matmul_bf16_throughput(ThreadPool& pool, int64_t m, int64_t n, int64_t k, int runs,
                                      TimeSource time, Bf16GemmLayout layout) {
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
  std::optional<kernels::PackedBf16Matrix> packed;
  if (layout == Bf16GemmLayout::kPacked) {
    Result<kernels::PackedBf16Matrix> p = kernels::PackedBf16Matrix::pack({w.data(), n, k, 0});
    PS_CHECK(p.ok()) << p.status().to_string();
    packed.emplace(std::move(p).value());
  }
  std::vector<double> rates;
  for (int r = 0; r < runs + 1; ++r) {
    const Stopwatch watch(time);
    if (packed) {
      kernels::matmul_packed_bf16({x.data(), 0, &*packed, y.data(), 0, m, false}, &pool);
    } else {
      kernels::matmul_bf16(args, kernels::ActivationPrecision::kBf16, &pool);
    }
    const double t = watch.seconds();
    if (r > 0) rates.push_back(2.0 * static_cast<double>(m * n * k) / t / 1e9);
  }
  return median(rates);
}

MachineCeilings measure_machine_ceilings(ThreadPool& pool, const CeilingOptions& options) {
  MachineCeilings c;
  c.threads = pool.num_threads();
  c.isa = std::string(kernels::isa_level_name(kernels::active_isa_level()));
  c.read_bandwidth_gbs =
      measure_read_bandwidth(pool, options.bandwidth_buffer_bytes, options.runs, options.time);
  c.fp32_fma_gflops =
      measure_fp32_fma_peak(pool, options.runs, options.peak_run_seconds, options.time);
  c.bf16_dot_gflops =
      measure_bf16_dot_peak(pool, options.runs, options.peak_run_seconds, options.time);
  c.matmul_bf16_gflops =
      measure_matmul_bf16_throughput(pool, 512, 2048, 2048, options.runs, options.time);
  return c;
}

}  // namespace peerserve::bench

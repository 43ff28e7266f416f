// peerserve_bench_onednn: our matmul_bf16 next to oneDNN's matmul primitive on the same
// shapes, in the same run, so that "own microkernels or oneDNN" is decided by measurement
// (docs/kernels.md). Built only when oneDNN (Debian libdnnl-dev) is installed.
//
// Both sides get the same contract: bf16 activations (oneDNN receives them pre-rounded;
// ours include the rounding), bf16 weights in the nn.Linear [n, k] layout as they sit in a
// checkpoint (oneDNN: format tag "ba", no prepacking), fp32 output. GEMV weights rotate
// through copies larger than the last-level cache, as in peerserve_bench_kernels.
//
//   peerserve_bench_onednn [--threads N] [--cpu-time]
//
// oneDNN's own thread count follows OMP_NUM_THREADS. --cpu-time (with --threads 1 and
// OMP_NUM_THREADS=1, where both run on the calling thread) times with the thread's CPU clock,
// leaving out preemption on a shared machine.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "kernels/bf16_convert.h"
#include "kernels/matmul.h"

namespace peerserve::bench {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

std::vector<bf16> pattern_bf16(size_t n, uint32_t seed) {
  std::vector<bf16> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = float_to_bf16(static_cast<float>((i * 2654435761u + seed) % 2001) * 1e-5f - 0.01f);
  }
  return v;
}

struct Timing {
  double ours_ms = 0;
  double onednn_ms = 0;
  std::string onednn_impl;
};

// m x n x k with `copies` weight matrices used in turn; median per-call time of each side.
Timing compare(ThreadPool& pool, TimeSource time, int64_t m, int64_t n, int64_t k, int64_t copies,
               int runs) {
  std::vector<std::vector<bf16>> weights;
  for (int64_t c = 0; c < copies; ++c)
    weights.push_back(pattern_bf16(static_cast<size_t>(n * k), static_cast<uint32_t>(c)));
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f - 0.5f;
  std::vector<bf16> x_bf16(x.size());
  kernels::fp32_to_bf16(x.data(), x_bf16.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(static_cast<size_t>(m * n));

  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc src_md({m, k}, dt::bf16, tag::ab);
  const dnnl::memory::desc wei_md({k, n}, dt::bf16, tag::ba);  // [n, k] row-major in memory
  const dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
  const dnnl::matmul prim(pd);
  dnnl::memory src(src_md, engine, x_bf16.data());
  dnnl::memory dst(dst_md, engine, y.data());
  std::vector<dnnl::memory> wei;
  for (auto& w : weights) wei.emplace_back(wei_md, engine, w.data());

  std::vector<double> ours, theirs;
  for (int r = 0; r < runs + 1; ++r) {
    const Stopwatch ours_watch(time);
    for (int64_t c = 0; c < copies; ++c) {
      kernels::MatmulBf16Args a;
      a.x = x.data();
      a.w = weights[static_cast<size_t>(c)].data();
      a.y = y.data();
      a.m = m;
      a.n = n;
      a.k = k;
      kernels::matmul_bf16(a, kernels::ActivationPrecision::kBf16, &pool);
    }
    const double t_ours = ours_watch.seconds() / static_cast<double>(copies);
    const Stopwatch theirs_watch(time);
    for (int64_t c = 0; c < copies; ++c) {
      prim.execute(stream, {{DNNL_ARG_SRC, src},
                            {DNNL_ARG_WEIGHTS, wei[static_cast<size_t>(c)]},
                            {DNNL_ARG_DST, dst}});
    }
    stream.wait();
    const double t_theirs = theirs_watch.seconds() / static_cast<double>(copies);
    if (r > 0) {
      ours.push_back(t_ours);
      theirs.push_back(t_theirs);
    }
  }
  return Timing{median(ours) * 1e3, median(theirs) * 1e3, pd.impl_info_str()};
}

// Whether oneDNN gives row i of a 512-row product bitwise equal to the same row computed
// alone (m = 1) and inside a 7-row batch: the batch invariance peerserve requires.
bool onednn_batch_invariant(int64_t n, int64_t k) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const std::vector<bf16> w = pattern_bf16(static_cast<size_t>(n * k), 17);
  std::vector<bf16> x(static_cast<size_t>(512 * k));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float_to_bf16(static_cast<float>((i * 40503u) % 1999) * 1e-3f - 1.0f);
  }
  const auto multiply = [&](int64_t m, const bf16* rows) {
    std::vector<float> y(static_cast<size_t>(m * n));
    const dnnl::memory::desc src_md({m, k}, dt::bf16, tag::ab);
    const dnnl::memory::desc wei_md({k, n}, dt::bf16, tag::ba);
    const dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), engine);
    dnnl::memory src(src_md, engine, const_cast<bf16*>(rows));
    dnnl::memory wei(wei_md, engine, const_cast<bf16*>(w.data()));
    dnnl::memory dst(dst_md, engine, y.data());
    dnnl::matmul(pd).execute(stream,
                             {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
    return y;
  };
  const std::vector<float> full = multiply(512, x.data());
  for (int64_t row : {0, 5, 300, 511}) {
    const std::vector<float> alone = multiply(1, x.data() + row * k);
    if (std::memcmp(alone.data(), full.data() + row * n, static_cast<size_t>(n) * sizeof(float)) !=
        0) {
      return false;
    }
  }
  const std::vector<float> seven = multiply(7, x.data() + 300 * k);
  return std::memcmp(seven.data(), full.data() + 300 * n,
                     static_cast<size_t>(7 * n) * sizeof(float)) == 0;
}

int run(int argc, char** argv) {
  int threads = 0;
  TimeSource time = TimeSource::kWall;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = static_cast<int>(peerserve::bench::flag_integer("--threads", argv[++i], 0, 1024));
    } else if (std::strcmp(argv[i], "--cpu-time") == 0) {
      time = TimeSource::kThreadCpu;
    } else {
      const bool help = std::strcmp(argv[i], "--help") == 0;
      if (!help) std::fprintf(stderr, "unknown option or missing value: %s\n", argv[i]);
      std::fprintf(help ? stdout : stderr,
                   "usage: peerserve_bench_onednn [--threads N] [--cpu-time]\n"
                   "Our matmul_bf16 beside oneDNN's matmul primitive on the same shapes in one\n"
                   "run (bf16 activations, checkpoint-layout bf16 weights, fp32 output).\n"
                   "  --threads N   our kernels' threads (default 0: one per core); oneDNN's\n"
                   "                follow OMP_NUM_THREADS, set to the same number if unset\n"
                   "  --cpu-time    time with the calling thread's CPU clock (needs --threads 1\n"
                   "                and OMP_NUM_THREADS=1)\n"
                   "  --help        this text\n");
      return help ? 0 : 2;
    }
  }
  if (time == TimeSource::kThreadCpu && threads != 1) {
    std::fprintf(stderr, "--cpu-time needs --threads 1 (and OMP_NUM_THREADS=1)\n");
    return 2;
  }
  ThreadPool pool(threads);
  // oneDNN's OpenMP threads: as many as ours unless OMP_NUM_THREADS says otherwise. The
  // OpenMP runtime reads the variable when it is loaded, before main, so the process starts
  // itself again with it set.
  const std::string ours = std::to_string(pool.num_threads());
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", ours.c_str(), 1);
    ::execv("/proc/self/exe", argv);
    std::fprintf(stderr, "cannot restart with OMP_NUM_THREADS=%s: %s\n", ours.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const std::string theirs = std::getenv("OMP_NUM_THREADS");
  if (time == TimeSource::kThreadCpu && theirs != "1") {
    std::fprintf(stderr, "--cpu-time needs oneDNN on the calling thread: OMP_NUM_THREADS=1\n");
    return 2;
  }
  const double bandwidth = measure_read_bandwidth(pool, int64_t{1} << 30, 5, time);
  double dot_peak = measure_bf16_dot_peak(pool, 5, 0.1, time);
  const char* peak_name = "bf16 dot peak";
  if (dot_peak <= 0.0) {  // no AVX512_BF16: the fp32 FMA peak bounds both sides instead
    dot_peak = measure_fp32_fma_peak(pool, 5, 0.1, time);
    peak_name = "fp32 FMA peak (no bf16 dot product on this CPU)";
  }
  std::printf(
      "threads %d (oneDNN: OMP_NUM_THREADS=%s%s); read bandwidth %.1f GB/s; %s %.1f GFLOP/s\n",
      pool.num_threads(), theirs.c_str(),
      theirs == ours ? "" : ", NOT the same: ratios compare different thread counts", bandwidth,
      peak_name, dot_peak);
  std::printf("%-16s %10s %10s %9s %9s  %s\n", "m x n x k", "ours_ms", "onednn_ms", "ours",
              "onednn", "oneDNN implementation");
  const int64_t shapes[][3] = {{1, 2048, 2048},   {1, 4096, 2048},  {1, 1024, 1024},
                               {1, 2816, 1024},   {4, 2048, 2048},  {64, 2048, 2048},
                               {512, 2048, 2048}, {512, 2816, 1024}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const bool gemv = m <= 4;
    const int64_t copies = gemv ? std::max<int64_t>(2, (int64_t{256} << 20) / (n * k * 2)) : 1;
    const Timing t = compare(pool, time, m, n, k, copies, gemv ? 5 : 3);
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    if (gemv) {
      // Ratio of the streaming-read ceiling (weights dominate the bytes).
      const double bytes = static_cast<double>(n * k * 2);
      std::printf("%-16s %10.3f %10.3f %8.1f%% %8.1f%%  %s\n", shape.c_str(), t.ours_ms,
                  t.onednn_ms, 100 * bytes / (t.ours_ms * 1e-3) / 1e9 / bandwidth,
                  100 * bytes / (t.onednn_ms * 1e-3) / 1e9 / bandwidth, t.onednn_impl.c_str());
    } else {
      const double flops = 2.0 * static_cast<double>(m * n * k);
      std::printf("%-16s %10.3f %10.3f %8.1f%% %8.1f%%  %s\n", shape.c_str(), t.ours_ms,
                  t.onednn_ms, 100 * flops / (t.ours_ms * 1e-3) / 1e9 / dot_peak,
                  100 * flops / (t.onednn_ms * 1e-3) / 1e9 / dot_peak, t.onednn_impl.c_str());
    }
  }
  std::printf("(ratios: of read bandwidth for m <= 4, of the %s otherwise)\n", peak_name);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {1024, 2816}}) {
    std::printf("oneDNN rows bitwise independent of the batch (512x%ldx%ld vs m = 1, 7): %s\n", n,
                k, onednn_batch_invariant(n, k) ? "yes" : "no");
  }
  return 0;
}

}  // namespace
}  // namespace peerserve::bench

int main(int argc, char** argv) {
  return peerserve::bench::run(argc, argv);
}

// Ceilings of this machine, measured in the same run as the benchmarks that are judged
// against them: streaming read bandwidth and the register-resident arithmetic peaks.
// They bound what any kernel can reach (decode is bandwidth-bound, prefill compute-bound);
// benchmarks print achieved / ceiling.
//
// Every figure is the median of several runs, on all threads of the given pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu_features.h"

namespace peerserve::bench {

// The clock a measurement uses. kThreadCpu is the CPU time of the calling thread: it leaves
// out time the thread was not running, so on a shared, oversubscribed machine it measures
// what the code costs while it runs (caches and memory are still shared). Only meaningful
// with a one-thread pool, where the calling thread does all the work.
enum class TimeSource { kWall, kThreadCpu };

class Stopwatch {
 public:
  explicit Stopwatch(TimeSource source);
  double seconds() const;  // since construction

 private:
  TimeSource source_;
  double start_;
};

struct CeilingOptions {
  // Bytes read per bandwidth run; far above the last-level cache. Default: 1 GiB.
  int64_t bandwidth_buffer_bytes = int64_t{1} << 30;
  // Runs per figure; the median is reported. Default: 7.
  int runs = 7;
  // Approximate duration of one arithmetic-peak run. Default: 0.1 s.
  double peak_run_seconds = 0.1;
  TimeSource time = TimeSource::kWall;  // Default: wall clock
};

struct MachineCeilings {
  int threads = 0;
  std::string isa;                // the kernels' active ISA level, e.g. "avx512_bf16"
  double read_bandwidth_gbs = 0;  // streaming read, 1e9 bytes/s
  double fp32_fma_gflops = 0;     // fused multiply-add, widest vectors available
  double bf16_dot_gflops = 0;     // vdpbf16ps (2 flops per bf16 pair); 0 without AVX512_BF16
  double matmul_bf16_gflops = 0;  // measured bf16 GEMM (kBf16) on a large GEMM
};

// Which bf16 GEMM a measurement runs: matmul_bf16 on the checkpoint layout, or
// matmul_packed_bf16 on weights packed first (kernels/matmul_packed_bf16.h).
enum class Bf16GemmLayout { kCheckpoint, kPacked };

// The layout the model's products run on at the active ISA level by default (packed where
// the level has a fast packed kernel; ModelOptions::pack_bf16).
Bf16GemmLayout default_bf16_gemm_layout();

// Streaming read bandwidth in GB/s: every thread sums its contiguous share of a buffer of
// `buffer_bytes` (allocated and touched here); median over `runs`.
double measure_read_bandwidth(ThreadPool& pool, int64_t buffer_bytes, int runs,
                              TimeSource time = TimeSource::kWall);

// The same measurement with the buffer kept between runs, so that a benchmark can measure
// the ceiling right next to each kernel run (on a shared machine the load drifts).
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool& pool, int64_t buffer_bytes, TimeSource time = TimeSource::kWall);
  // One run, GB/s.
  double measure_gbs();

 private:
  ThreadPool& pool_;
  TimeSource time_;
  std::vector<float> buffer_;
};

// Peak fp32 FMA throughput in GFLOP/s (2 flops per lane per FMA), independent
// register-resident chains on every thread, with the widest vectors the kernels use at the
// active ISA level (kernels::active_isa_level(): a forced --isa lowers it too): AVX-512 at
// avx512 and above, AVX2 at avx2, else scalar.
double measure_fp32_fma_peak(ThreadPool& pool, int runs, double run_seconds,
                             TimeSource time = TimeSource::kWall);

// Peak vdpbf16ps throughput in GFLOP/s (each bf16 pair counts 2 multiply-adds = 4 flops
// per fp32 lane); 0 if the active ISA level is below avx512_bf16.
double measure_bf16_dot_peak(ThreadPool& pool, int runs, double run_seconds,
                             TimeSource time = TimeSource::kWall);

// Peak int8 multiply-add throughput in GOP/s (2 ops per multiply-add) of the instructions
// matmul_int8 uses at `level`: vpdpbusd (64 per instruction) at avx512_vnni and above, the
// AVX2 step vpsignb + vpmaddubsw + vpmaddwd + vpaddd (32 per step) at avx2 and avx512;
// 0 at scalar.
double measure_int8_dot_peak(ThreadPool& pool, kernels::IsaLevel level, int runs,
                             double run_seconds, TimeSource time = TimeSource::kWall);

// Throughput of the bf16 GEMM (bf16 activations, `layout`) on m x n x k, in GFLOP/s
// (2 m n k flops). The best a real GEMM reaches here: the "measured matmul peak".
double measure_matmul_bf16_throughput(ThreadPool& pool, int64_t m, int64_t n, int64_t k, int runs,
                                      TimeSource time = TimeSource::kWall,
                                      Bf16GemmLayout layout = default_bf16_gemm_layout());

// All of the above (matmul on 512 x 2048 x 2048, default layout).
MachineCeilings measure_machine_ceilings(ThreadPool& pool, const CeilingOptions& options);

// The median of `values` (the mean of the two middle ones for an even count); 0 if empty.
double median(std::vector<double> values);

}  // namespace peerserve::bench

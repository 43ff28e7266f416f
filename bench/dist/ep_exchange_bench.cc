// Dispatch and combine latency and bandwidth per rank (the shape of CloudMatrix-Infer's
// Table 7), beside the MPI transport's own put latency and bandwidth for the same bytes,
// measured in the same run. Run under mpirun:
//
//   mpirun --oversubscribe --bind-to none -np 2 build/bench/dist/peerserve_bench_ep_exchange
//       [--dtype int8|bf16|fp32] [--iterations N]
//
// Shapes are the mini preset's MoE (hidden 1024, 64 routed experts, top 6); tokens per
// rank 1 .. 256, experts drawn uniformly. Per iteration every rank's time is taken and the
// slowest rank's counts (MoE layers wait for the slowest); each figure is the median over
// iterations.
//   dispatch: dispatch() + wait_dispatch() (convert, write into the owners, all arrived);
//   combine:  stage_result() of every received pair + send_results() + combine() (results
//             converted and written back, in shared memory straight into the sources'
//             windows; summed in top-k order);
//   transport: the same per-peer byte counts moved with raw window puts + a flag per peer
//              (MPI_Put, MPI_Win_flush, MPI_Accumulate), all arrived: the ceiling.
//   --receiver-reads: after each dispatch and each transport exchange, untimed, every rank
//              reads what it received (dispatch: each token dequantized, as the experts
//              do), so the next iteration's stores meet lines the peer holds, as in a
//              model's steps. Without it the transport's target lines never leave the
//              writer's cache over shared memory.
//   convert:   the dispatch's conversion alone (each token once into local memory, with the
//              dispatch's encode_token, activations in cache as for dispatch): a floor under
//              dispatch's time that no transport removes (INT8 reads 4 bytes per element
//              twice, for the scale and the rounding, to send 1).
// Bandwidth per rank = the mean over ranks of the bytes a rank writes (all peers, itself
// included) / the slowest rank's latency (equal with uniform routing, as here).
// Expert compute is left out (results are staged from a dummy row).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "dist/expert_dispatch.h"
#include "dist/mpi_communicator.h"
#include "kernels/cpu_features.h"

namespace peerserve::dist {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kHidden = 1024;
constexpr int kExperts = 64;
constexpr int kTopK = 6;
constexpr int kMaxTokens = 256;
constexpr milliseconds kTimeout(30000);
volatile float sink_ = 0.0f;  // keeps the reads below from being optimised away

// Reads `bytes` bytes at `data`, one load per cache line: brings them into this core's cache.
void read_lines(const void* data, int64_t bytes) {
  const auto* p = static_cast<const std::byte*>(data);
  float sum = 0.0f;
  for (int64_t i = 0; i + 4 <= bytes; i += 64) {
    float v;
    std::memcpy(&v, p + i, sizeof v);
    sum += v;
  }
  sink_ = sink_ + sum;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

using bench::median;  // the mean of the two middle values for an even count

// The slowest rank's value (the MoE layer waits for it).
Result<double> max_over_ranks(Communicator& comm, double us) {
  std::vector<int64_t> v = {static_cast<int64_t>(us * 1000.0)};
  PS_RETURN_IF_ERROR(comm.allreduce(v, ReduceOp::kMax, kTimeout));
  return static_cast<double>(v[0]) / 1000.0;
}

Result<double> mean_over_ranks(Communicator& comm, double value) {
  std::vector<int64_t> v = {static_cast<int64_t>(value)};
  PS_RETURN_IF_ERROR(comm.allreduce(v, ReduceOp::kSum, kTimeout));
  return static_cast<double>(v[0]) / comm.size();
}

struct Row {
  int tokens = 0;
  double dispatch_us = 0, combine_us = 0, transport_dispatch_us = 0, transport_combine_us = 0;
  double convert_us = 0;
  double dispatch_bytes = 0, combine_bytes = 0;
};

// Moves bytes_to[p] bytes to every peer p and a flag, waits for every peer's flag.
class RawTransport {
 public:
  static Result<RawTransport> create(Communicator& comm, size_t max_bytes_per_peer) {
    RawTransport t;
    t.comm_ = &comm;
    t.region_ = (max_bytes_per_peer + 63) / 64 * 64;
    PS_ASSIGN_OR_RETURN(t.window_,
                        comm.create_window(64 * comm.size() + t.region_ * comm.size(), kTimeout));
    t.source_.assign(t.region_, std::byte{1});
    return t;
  }
  // Reads what each peer p sent (bytes_from[p] bytes), as a receiver uses it.
  void read_received(const std::vector<int64_t>& bytes_from) {
    const int n = comm_->size();
    for (int p = 0; p < n; ++p) {
      read_lines(window_->local().data() + 64 * n + region_ * p, bytes_from[p]);
    }
  }
  Status exchange(const std::vector<int64_t>& bytes_to) {
    const int n = comm_->size(), me = comm_->rank();
    ++sequence_;
    for (int i = 0; i < n; ++i) {
      const int p = (me + i) % n;
      PS_RETURN_IF_ERROR(window_->put(p, 64 * n + region_ * me,
                                      std::span(source_.data(), static_cast<size_t>(bytes_to[p]))));
    }
    for (int i = 0; i < n; ++i) {
      const int p = (me + i) % n;
      PS_RETURN_IF_ERROR(window_->signal(p, 64 * me, sequence_));
    }
    const auto deadline = Clock::now() + kTimeout;
    for (int p = 0; p < n; ++p) {
      PS_RETURN_IF_ERROR(window_->wait_at_least(64 * p, sequence_, p, "transport", deadline));
    }
    return ok_status();
  }

 private:
  Communicator* comm_ = nullptr;
  size_t region_ = 0;
  std::unique_ptr<Window> window_;
  std::vector<std::byte> source_;
  uint64_t sequence_ = 0;
};

Result<Row> measure(Communicator& comm, ExpertExchange& exchange, RawTransport& transport,
                    const ExpertPlacement& placement, int tokens, int iterations,
                    bool receiver_reads) {
  const int n = comm.size(), me = comm.rank();
  std::mt19937_64 rng(1234 + me * 7 + tokens);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * kHidden), w(tokens * kTopK, 0.1f), out(tokens * kHidden);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> ids;
  std::vector<int32_t> all(kExperts);
  for (int e = 0; e < kExperts; ++e) all[e] = e;
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + kTopK);
  }
  RoutedTokens routed;
  routed.layer = 1;
  routed.num_tokens = tokens;
  routed.hidden_size = kHidden;
  routed.top_k = kTopK;
  routed.activations = x;
  routed.expert_ids = ids;
  routed.weights = w;
  std::vector<float> dummy_row(kHidden, 0.5f);
  const ExchangeLayout& layout = exchange.layout();

  std::vector<double> dispatch_us, combine_us;
  std::vector<int64_t> received_bytes(n), received_results(n);
  std::vector<float> received_row(kHidden);
  for (int it = 0; it < iterations + 3; ++it) {
    // In the model the router gate has just read these activations (its matmul runs right
    // before dispatch), so they start in cache, as the transport's source does. Without this
    // the combine phase of the previous iteration evicts them and dispatch pays the DRAM
    // read of 4 KB per token that a real step does not.
    read_lines(x.data(), static_cast<int64_t>(x.size() * sizeof(float)));
    PS_RETURN_IF_ERROR(comm.barrier(kTimeout));
    const double t0 = now_us();
    PS_RETURN_IF_ERROR(exchange.dispatch(0, routed, placement));
    PS_RETURN_IF_ERROR(exchange.wait_dispatch(0));
    const double t1 = now_us();
    for (int s = 0; s < n; ++s) {
      received_bytes[s] = 64 + exchange.received_tokens(0, s) * layout.message_bytes;
      received_results[s] = exchange.received_pairs(0, s) * layout.result_bytes;
      for (int i = 0; receiver_reads && i < exchange.received_tokens(0, s); ++i) {
        exchange.load_activation(exchange.received(0, s, i), received_row.data());
        sink_ = sink_ + received_row[0];
      }
    }
    PS_RETURN_IF_ERROR(comm.barrier(kTimeout));
    // Staging is timed: in shared memory it writes each result straight into its source's
    // window (conversion and store are the combine's transfer), as dispatch's time includes
    // its conversion; outside the timer it made shared-memory combine look faster than it is.
    const double t2 = now_us();
    for (int s = 0; s < n; ++s) {
      for (int p = 0; p < exchange.received_pairs(0, s); ++p) {
        exchange.stage_result(0, s, p, dummy_row.data());
      }
    }
    PS_RETURN_IF_ERROR(exchange.send_results(0));
    PS_RETURN_IF_ERROR(exchange.combine(0, routed, out));
    const double t3 = now_us();
    if (it < 3) continue;  // warm-up
    PS_ASSIGN_OR_RETURN(double d, max_over_ranks(comm, t1 - t0));
    PS_ASSIGN_OR_RETURN(double c, max_over_ranks(comm, t3 - t2));
    dispatch_us.push_back(d);
    combine_us.push_back(c);
  }
  // What each rank sent to each peer. Dispatch: the transpose of what each received. Combine:
  // an owner sends each source the results of the pairs it received from it, so this rank's
  // own received_results (it used to take the transpose too, timing the reverse pattern).
  std::vector<int64_t> matrix(n * n);
  PS_RETURN_IF_ERROR(comm.allgather(std::as_bytes(std::span(received_bytes)),
                                    std::as_writable_bytes(std::span(matrix)), kTimeout));
  std::vector<int64_t> dispatch_to(n), results_to(n), results_from(n);
  std::vector<int64_t> results_matrix(n * n);
  PS_RETURN_IF_ERROR(comm.allgather(std::as_bytes(std::span(received_results)),
                                    std::as_writable_bytes(std::span(results_matrix)), kTimeout));
  int64_t dispatch_sent = 0, results_sent = 0;
  for (int p = 0; p < n; ++p) {
    dispatch_to[p] = matrix[p * n + me];
    results_to[p] = received_results[p];
    results_from[p] = results_matrix[p * n + me];
    dispatch_sent += dispatch_to[p];
    results_sent += results_to[p];
  }
  std::vector<double> raw_dispatch_us, raw_combine_us;
  for (int it = 0; it < iterations + 3; ++it) {
    for (int phase = 0; phase < 2; ++phase) {
      PS_RETURN_IF_ERROR(comm.barrier(kTimeout));
      const double t0 = now_us();
      PS_RETURN_IF_ERROR(transport.exchange(phase == 0 ? dispatch_to : results_to));
      const double t1 = now_us();
      // What this rank received in the dispatch pattern is what it received in dispatch.
      if (receiver_reads) {
        transport.read_received(phase == 0 ? received_bytes : results_from);
      }
      if (it < 3) continue;
      PS_ASSIGN_OR_RETURN(double us, max_over_ranks(comm, t1 - t0));
      (phase == 0 ? raw_dispatch_us : raw_combine_us).push_back(us);
    }
  }
  // The conversion alone, into this rank's memory, laid out as messages.
  std::vector<std::byte> converted(static_cast<size_t>(tokens) * layout.message_bytes);
  std::vector<float> scales(tokens);
  std::vector<double> convert_us;
  for (int it = 0; it < iterations + 3; ++it) {
    read_lines(x.data(), static_cast<int64_t>(x.size() * sizeof(float)));
    const double t0 = now_us();
    for (int t = 0; t < tokens; ++t) {
      const float* row = x.data() + static_cast<int64_t>(t) * kHidden;
      std::byte* payload =
          converted.data() + t * layout.message_bytes + layout.message_header_bytes;
      encode_token(exchange.shape().dtype, row, kHidden, payload, &scales[t]);
    }
    const double t1 = now_us();
    if (it < 3) continue;
    PS_ASSIGN_OR_RETURN(double us, max_over_ranks(comm, t1 - t0));
    convert_us.push_back(us);
  }
  Row row;
  row.tokens = tokens;
  row.convert_us = median(convert_us);
  row.dispatch_us = median(dispatch_us);
  row.combine_us = median(combine_us);
  row.transport_dispatch_us = median(raw_dispatch_us);
  row.transport_combine_us = median(raw_combine_us);
  PS_ASSIGN_OR_RETURN(row.dispatch_bytes,
                      mean_over_ranks(comm, static_cast<double>(dispatch_sent)));
  PS_ASSIGN_OR_RETURN(row.combine_bytes, mean_over_ranks(comm, static_cast<double>(results_sent)));
  return row;
}

Status run(Communicator& comm, DispatchDtype dtype, int iterations, bool shared_memory,
           bool receiver_reads) {
  PS_ASSIGN_OR_RETURN(ExpertPlacement placement,
                      ExpertPlacement::contiguous({1}, kExperts, comm.size()));
  ExchangeShape shape;
  shape.num_ranks = comm.size();
  shape.max_tokens_per_rank = kMaxTokens;
  shape.hidden_size = kHidden;
  shape.top_k = kTopK;
  shape.slots_per_rank = placement.slots_per_rank();
  shape.dtype = dtype;
  PS_ASSIGN_OR_RETURN(auto exchange, ExpertExchange::create(comm, shape, kTimeout));
  const ExchangeLayout& layout = exchange->layout();
  PS_ASSIGN_OR_RETURN(RawTransport transport,
                      RawTransport::create(comm, std::max(layout.dispatch_region_bytes,
                                                          layout.combine_region_bytes)));
  if (comm.rank() == 0) {
    std::printf(
        "EP=%d, %s dispatch (message %zu B/token, result %zu B/pair), hidden %lld, "
        "%d experts, top %d; kernels %s; window %.1f MiB per rank "
        "(dispatch %.2f + combine %.2f MiB per microbatch); windows: %s\n",
        comm.size(), std::string(dispatch_dtype_name(dtype)).c_str(), layout.message_bytes,
        layout.result_bytes, static_cast<long long>(kHidden), kExperts, kTopK,
        std::string(kernels::isa_level_name(kernels::active_isa_level())).c_str(),
        layout.window_bytes / 1048576.0, layout.dispatch_buffer_bytes / 1048576.0,
        layout.combine_buffer_bytes / 1048576.0,
        shared_memory ? "shared memory (one copy per peer)" : "MPI one-sided puts");
    std::printf("%6s | %8s %9s %8s %9s %6s %8s | %8s %9s %8s %9s %6s\n", "tokens", "disp us",
                "disp GB/s", "xport us", "xport GB/s", "ratio", "conv us", "comb us", "comb GB/s",
                "xport us", "xport GB/s", "ratio");
  }
  for (int tokens = 1; tokens <= kMaxTokens; tokens *= 2) {
    PS_ASSIGN_OR_RETURN(
        Row r, measure(comm, *exchange, transport, placement, tokens, iterations, receiver_reads));
    if (comm.rank() == 0) {
      const double disp_bw = r.dispatch_bytes / r.dispatch_us / 1e3;
      const double disp_xport = r.dispatch_bytes / r.transport_dispatch_us / 1e3;
      const double comb_bw = r.combine_bytes / r.combine_us / 1e3;
      const double comb_xport = r.combine_bytes / r.transport_combine_us / 1e3;
      std::printf("%6d | %8.1f %9.3f %8.1f %9.3f %6.2f %8.1f | %8.1f %9.3f %8.1f %9.3f %6.2f\n",
                  r.tokens, r.dispatch_us, disp_bw, r.transport_dispatch_us, disp_xport,
                  disp_bw / disp_xport, r.convert_us, r.combine_us, comb_bw, r.transport_combine_us,
                  comb_xport, comb_bw / comb_xport);
    }
  }
  if (comm.rank() == 0) {
    std::printf(
        "(medians of %d iterations, slowest rank; ratio = bandwidth / transport "
        "bandwidth for the same bytes; transport = raw window put + flag; conv = the "
        "dispatch's conversion alone, into local memory%s)\n",
        iterations,
        receiver_reads ? "; receivers read what they got after each exchange, untimed" : "");
  }
  return comm.barrier(kTimeout);
}

}  // namespace
}  // namespace peerserve::dist

constexpr const char* kUsage =
    "usage: mpirun [--oversubscribe] -np N peerserve_bench_ep_exchange [options]\n"
    "Expert-parallel dispatch and combine latency and bandwidth per rank for 1-256 tokens per\n"
    "rank (the mini preset's MoE: hidden 1024, 64 experts, top 6), beside the MPI window\n"
    "transport's own put + flag for the same per-peer bytes, measured in the same run; the\n"
    "slowest rank's time, medians over iterations, printed by rank 0.\n"
    "  --dtype D         how tokens travel: int8 (per-token scale), bf16 or fp32 (default int8)\n"
    "  --transport T     auto (shared memory when every rank is on one host) or network\n"
    "                    (MPI one-sided puts even on one host; pick the MPI transport with\n"
    "                    mpirun's --mca options, e.g. --mca osc pt2pt --mca btl self,tcp)\n"
    "                    (default auto)\n"
    "  --iterations N    timed iterations per token count (default 31)\n"
    "  --receiver-reads  after each dispatch and transport exchange, untimed, every rank reads\n"
    "                    what it received (as the experts do), so that the next exchange's\n"
    "                    stores meet lines the peer holds; without it the transport's target\n"
    "                    lines stay in the writer's cache over shared memory\n"
    "  --isa LEVEL       force a kernel level the CPU supports (conversions and the combine\n"
    "                    sum): scalar, avx2, avx512, avx512_vnni or avx512_bf16 (default: best)\n"
    "  --help            this text\n";

int main(int argc, char** argv) {
  using namespace peerserve;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  // Flags first: the window transport is chosen when MPI starts. A bad flag ends every rank
  // (mpirun stops the job at the first non-zero exit).
  dist::DispatchDtype dtype = dist::DispatchDtype::kInt8;
  dist::MpiWindows windows = dist::MpiWindows::kAuto;
  int iterations = 31;
  bool receiver_reads = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--receiver-reads") {
      receiver_reads = true;
      --i;  // takes no value
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--dtype") {
      auto parsed = dist::parse_dispatch_dtype(value);
      if (!parsed.ok()) {
        std::fprintf(stderr, "error: %s\n", parsed.status().to_string().c_str());
        return 2;
      }
      dtype = *parsed;
    } else if (flag == "--transport") {
      auto parsed = dist::parse_mpi_windows(value);
      if (!parsed.ok()) {
        std::fprintf(stderr, "error: %s\n", parsed.status().to_string().c_str());
        return 2;
      }
      windows = *parsed;
    } else if (flag == "--isa") {
      bool supported = false;
      for (const kernels::IsaLevel level : kernels::supported_isa_levels()) {
        if (kernels::isa_level_name(level) == value)
          supported = kernels::force_isa_level(level).ok();
      }
      if (!supported) {
        std::fprintf(stderr, "error: --isa %s: not a level this CPU supports\n", value.c_str());
        return 2;
      }
    } else if (flag == "--iterations") {
      iterations = static_cast<int>(peerserve::bench::flag_integer(flag, value, 1, 1 << 24));
    } else {
      std::fprintf(stderr, "error: unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  auto comm = dist::MpiCommunicator::init(&argc, &argv, windows);
  if (!comm.ok()) {
    std::fprintf(stderr, "error: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  Status status =
      dist::run(**comm, dtype, iterations, (*comm)->shared_memory_windows(), receiver_reads);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: error: %s\n", (*comm)->rank(), status.to_string().c_str());
    if ((*comm)->broken()) return 1;
    (*comm)->abort(1);
  }
  return 0;
}

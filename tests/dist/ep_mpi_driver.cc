// Expert-parallel check across real processes, run under mpirun by ctest:
//
//   mpirun -np N dist_ep_mpi_driver [--dtype int8|bf16|fp32] [--steps S] [--direct 0|1]
//                                   [--kill-rank R --kill-step K] [--timeout-ms T]
//
// Every rank builds the same random MoE, shards its experts over the N ranks, and runs S
// steps of two interleaved microbatches with uneven token counts (some ranks idle in some
// steps). Each rank checks its outputs against LocalExpertBackend over all experts: bitwise
// for fp32 dispatch, within the unit tests' tolerances otherwise; and that the steady-state
// steps allocate nothing. With --kill-rank, rank R kills itself (SIGKILL) at step K; the
// others must fail with an error naming R within the timeout and exit non-zero.
// Exit status 0 only if every check passed on this rank.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dist/ep_expert_backend.h"
#include "dist/mpi_communicator.h"
#include "model/local_expert_backend.h"
#include "tests/dist/allocation_counter.h"
#include "tests/dist/random_moe.h"

namespace peerserve::dist {
namespace {

using testing::RandomMoe;
using testing::TokenBatch;

struct Flags {
  DispatchDtype dtype = DispatchDtype::kFp32;
  int steps = 6;
  int kill_rank = -1;
  int kill_step = 2;
  int timeout_ms = 30000;
  bool direct_stores = true;
  // Each step starts with an allgather, as the ranks' step agreement does: --kill-rank then
  // dies outside any exchange, and the others must name it from the collective's timeout.
  bool agree = false;
  // Only a window whose size differs on the last rank (as after other --max-num-batched-
  // tokens): every rank must refuse it, naming the sizes.
  bool skew_window = false;
  MpiWindows windows = MpiWindows::kAuto;
};

Result<Flags> parse_flags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return invalid_argument("flag " + arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--dtype") {
      PS_ASSIGN_OR_RETURN(flags.dtype, parse_dispatch_dtype(value));
    } else if (arg == "--steps") {
      flags.steps = std::atoi(value.c_str());
    } else if (arg == "--kill-rank") {
      flags.kill_rank = std::atoi(value.c_str());
    } else if (arg == "--kill-step") {
      flags.kill_step = std::atoi(value.c_str());
    } else if (arg == "--skew-window") {
      flags.skew_window = value != "0";
    } else if (arg == "--agree") {
      flags.agree = value != "0";
    } else if (arg == "--direct") {
      flags.direct_stores = value != "0";
    } else if (arg == "--transport") {
      PS_ASSIGN_OR_RETURN(flags.windows, parse_mpi_windows(value));
    } else if (arg == "--timeout-ms") {
      flags.timeout_ms = std::atoi(value.c_str());
    } else {
      return invalid_argument("unknown flag " + arg);
    }
  }
  return flags;
}

constexpr int kMaxTokens = 32;

int tokens_of(int rank, int step, int microbatch) {
  if ((rank + step) % 4 == 3) return 0;  // idle ranks in some steps
  return (rank * 11 + step * 7 + microbatch * 13) % (kMaxTokens + 1);
}

double relative_error(const std::vector<float>& out, const std::vector<float>& ref, int64_t hidden,
                      int64_t* mismatches) {
  double worst = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    *mismatches += std::memcmp(&out[i], &ref[i], sizeof(float)) != 0;
  }
  for (size_t t = 0; t < out.size() / hidden; ++t) {
    double diff = 0.0, norm = 0.0;
    for (int64_t k = 0; k < hidden; ++k) {
      const double d = double{out[t * hidden + k]} - ref[t * hidden + k];
      diff += d * d;
      norm += double{ref[t * hidden + k]} * ref[t * hidden + k];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

Status run(Communicator& comm, const Flags& flags) {
  if (flags.skew_window) {
    const size_t bytes = comm.rank() + 1 == comm.size() ? 8192 : 4096;
    return comm.create_window(bytes, std::chrono::milliseconds(flags.timeout_ms)).status();
  }
  {
    // Window contract: every rank's part 64-byte aligned, also as a peer sees it (the
    // exchange's layout assumes whole cache lines). An odd size: parts allocated back to
    // back would not be.
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Window> probe,
                        comm.create_window(4096 + 8, std::chrono::milliseconds(flags.timeout_ms)));
    const auto misaligned = [](const std::byte* p) {
      return reinterpret_cast<uintptr_t>(p) % 64 != 0;
    };
    if (misaligned(probe->local().data())) return internal_error("window part not 64-aligned");
    for (int r = 0; r < comm.size(); ++r) {
      if (probe->direct(r) != nullptr && misaligned(probe->direct(r))) {
        return internal_error("rank " + std::to_string(r) + "'s window part, stored into " +
                              "directly, is not 64-byte aligned");
      }
    }
  }
  const RandomMoe moe(/*hidden=*/128, /*inter=*/48, /*experts=*/16, /*top_k=*/4,
                      /*layers=*/{1, 2, 3}, /*seed=*/9);
  PS_ASSIGN_OR_RETURN(ExpertPlacement placement,
                      ExpertPlacement::contiguous(moe.moe_layers, moe.num_experts, comm.size()));
  const auto local = moe.local_experts(placement, comm.rank());
  EpExpertBackendOptions options;
  options.communicator = &comm;
  options.placement = placement;
  for (const auto& layer : local) options.local_experts_by_layer.emplace_back(layer);
  options.dispatch_dtype = flags.dtype;
  options.max_tokens_per_rank = kMaxTokens;
  options.hidden_size = moe.hidden;
  options.top_k = moe.top_k;
  options.peer_timeout = std::chrono::milliseconds(flags.timeout_ms);
  options.direct_stores = flags.direct_stores;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<EpExpertBackend> backend,
                      EpExpertBackend::create(std::move(options)));
  ExpertBackend& ep = *backend;
  std::unique_ptr<ExpertBackend::Call> calls[2] = {ep.new_call(0), ep.new_call(1)};

  std::vector<std::unique_ptr<TokenBatch>> batches[2];
  std::vector<std::vector<float>> outs[2];
  for (int step = 0; step < flags.steps; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      const int n = tokens_of(comm.rank(), step, mb);
      batches[mb].push_back(
          std::make_unique<TokenBatch>(moe, moe.moe_layers[step % moe.moe_layers.size()], n,
                                       1000003ull * comm.rank() + 7919ull * step + mb));
      outs[mb].emplace_back(n * moe.hidden);
    }
  }
  constexpr int kWarmup = 2;
  int64_t allocations_before = 0;
  std::vector<std::byte> agreement(sizeof(int64_t) * static_cast<size_t>(comm.size()));
  for (int step = 0; step < flags.steps; ++step) {
    if (step == flags.kill_step && comm.rank() == flags.kill_rank) {
      std::fprintf(stderr, "rank %d: killing itself at step %d\n", comm.rank(), step);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    if (step == kWarmup) allocations_before = testing::allocations_on_this_thread();
    if (flags.agree) {
      const int64_t mine = step;
      PS_RETURN_IF_ERROR(comm.allgather(std::as_bytes(std::span(&mine, 1)), agreement,
                                        std::chrono::milliseconds(flags.timeout_ms)));
    }
    PS_RETURN_IF_ERROR(ep.dispatch(batches[0][step]->tokens, *calls[0]));
    PS_RETURN_IF_ERROR(ep.dispatch(batches[1][step]->tokens, *calls[1]));
    PS_RETURN_IF_ERROR(ep.compute(*calls[0]));
    PS_RETURN_IF_ERROR(ep.compute(*calls[1]));
    PS_RETURN_IF_ERROR(ep.combine(*calls[0], outs[0][step]));
    PS_RETURN_IF_ERROR(ep.combine(*calls[1], outs[1][step]));
  }
  const int64_t allocations = testing::allocations_on_this_thread() - allocations_before;

  LocalExpertBackend reference(moe.all_experts(), kernels::ActivationPrecision::kFp32, nullptr);
  int64_t mismatches = 0, tokens = 0;
  double worst = 0.0;
  for (int step = 0; step < flags.steps; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      const RoutedTokens& t = batches[mb][step]->tokens;
      std::vector<float> ref(t.num_tokens * t.hidden_size);
      ExpertBackend& ref_backend = reference;
      auto call = ref_backend.new_call(0);
      PS_RETURN_IF_ERROR(ref_backend.run(t, *call, ref));
      worst = std::max(worst, relative_error(outs[mb][step], ref, moe.hidden, &mismatches));
      tokens += t.num_tokens;
    }
  }
  std::printf(
      "rank %d of %d (%s dispatch): %lld tokens, %lld elements differ bitwise, worst "
      "relative error %.5f, %lld steady-state allocations\n",
      comm.rank(), comm.size(), std::string(dispatch_dtype_name(flags.dtype)).c_str(),
      static_cast<long long>(tokens), static_cast<long long>(mismatches), worst,
      static_cast<long long>(allocations));
  if (allocations != 0) return internal_error("steady-state steps allocated");
  const double tolerance = flags.dtype == DispatchDtype::kFp32   ? 0.0
                           : flags.dtype == DispatchDtype::kBf16 ? 0.01
                                                                 : 0.03;
  if (flags.dtype == DispatchDtype::kFp32 && mismatches != 0) {
    return internal_error("fp32 dispatch is not bitwise equal to the single-process backend");
  }
  if (worst > tolerance) {
    return internal_error("relative error " + std::to_string(worst) + " above " +
                          std::to_string(tolerance));
  }
  // Everyone done before anyone tears the windows down.
  return comm.barrier(std::chrono::milliseconds(flags.timeout_ms));
}

}  // namespace
}  // namespace peerserve::dist

int main(int argc, char** argv) {
  using namespace peerserve;
  // Flags first: the window transport is chosen when MPI starts.
  auto flags = dist::parse_flags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "error: %s\n", flags.status().to_string().c_str());
    return 2;
  }
  auto comm = dist::MpiCommunicator::init(&argc, &argv, flags->windows);
  if (!comm.ok()) {
    std::fprintf(stderr, "error: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  if (flags->windows == dist::MpiWindows::kNetwork && (*comm)->shared_memory_windows()) {
    std::fprintf(stderr, "error: --transport network but the windows are shared memory\n");
    return 1;
  }
  Status status = dist::run(**comm, *flags);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: error: %s\n", (*comm)->rank(), status.to_string().c_str());
    std::fflush(stderr);
    // A broken group (lost peer) exits without the collective teardown; any other error
    // ends every rank.
    if ((*comm)->broken()) return 1;
    (*comm)->abort(1);
  }
  return 0;
}

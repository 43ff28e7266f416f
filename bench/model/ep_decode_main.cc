// Decode throughput with and without expert parallelism and the two-microbatch pipeline
// (the shape of paper 000 Figure 20, at this machine's scale). One process:
//
//   peerserve_bench_ep_decode --model DIR --threads 2 --batches 1,16,64
//                             [--pipelines mb1,mb2,always]
//
// or EP ranks, each owning batch/N of the sequences (data-parallel attention) and 1/N of
// the routed experts:
//
//   mpirun -np 2 peerserve_bench_ep_decode --model DIR --threads 1 --ep 2 ...
//
// Each batch size: prefill `context` tokens per sequence (untimed), then `steps` decode
// steps of one token per sequence, timed on rank 0 between two agreements (so every rank's
// work is inside); repeated `runs` times. With several pipelines (--pipelines), each run
// index runs every one of them in turn, the first one turning with the run, so that the
// pipelines are compared on runs a fraction of a second apart in the same process (the
// machine's drift between separate processes was larger than the differences looked for).
// Prints one line per batch and pipeline with the median tokens/s over all ranks and each
// run's figure. bench/model/ep_decode_bench.sh runs the configurations side by side and
// prints the ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "dist/ep_session.h"
#include "kv/latent_kv_cache.h"
#include "model/deepseek_model.h"
#include "runtime/microbatch_pipeline.h"

namespace peerserve {
namespace {

struct Args {
  std::string model_dir;
  int threads = 0;
  std::vector<int64_t> batches = {1, 16, 64};
  int64_t context = 64;
  int64_t steps = 16;
  int runs = 3;
  // mb1: one microbatch; mb2: two, split where measured faster; always: two, every step split.
  std::vector<std::string> pipelines;
  int microbatches = 1;            // --microbatches / --microbatch-split: one pipeline
  std::string split = "measured";  // with two microbatches: MicrobatchSplit
  EpCli ep;
};

bool parse(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (flag == "--model") {
      args->model_dir = value();
    } else if (flag == "--threads") {
      args->threads = static_cast<int>(peerserve::bench::flag_integer(flag, value(), 0, 1024));
    } else if (flag == "--batches") {
      args->batches.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) {
        args->batches.push_back(peerserve::bench::flag_integer(flag, item, 1, 1 << 20));
      }
    } else if (flag == "--context") {
      args->context = peerserve::bench::flag_integer(flag, value(), 0, int64_t{1} << 40);
    } else if (flag == "--steps") {
      args->steps = peerserve::bench::flag_integer(flag, value(), 1, int64_t{1} << 40);
    } else if (flag == "--runs") {
      args->runs = static_cast<int>(peerserve::bench::flag_integer(flag, value(), 1, 1 << 20));
    } else if (flag == "--microbatches") {
      args->microbatches = static_cast<int>(peerserve::bench::flag_integer(flag, value(), 1, 2));
    } else if (flag == "--microbatch-split") {
      args->split = value();
    } else if (flag == "--pipelines") {
      args->pipelines.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) args->pipelines.push_back(item);
    } else if (flag == "--ep") {
      args->ep.ep = static_cast<int>(peerserve::bench::flag_integer(flag, value(), 1, 4096));
    } else if (flag == "--ep-dispatch-dtype") {
      args->ep.dispatch_dtype = value();
    } else if (flag == "--eplb-redundant-experts") {
      args->ep.eplb_redundant_experts =
          static_cast<int>(peerserve::bench::flag_integer(flag, value(), 0, 1 << 20));
    } else if (flag == "--ep-transport") {
      args->ep.windows = value();
    } else if (flag == "--ep-split-rows") {
      args->ep.split_rows =
          static_cast<int>(peerserve::bench::flag_integer(flag, value(), 0, 1 << 20));
    } else {
      const bool help = flag == "--help";
      if (!help) std::fprintf(stderr, "unknown option: %s\n", flag.c_str());
      std::fprintf(
          help ? stdout : stderr,
          "usage: peerserve_bench_ep_decode --model DIR [options]\n"
          "       mpirun -np N peerserve_bench_ep_decode --model DIR --ep N [options]\n"
          "Decode tokens/s at each batch size: prefill --context tokens per sequence\n"
          "(untimed), then --steps timed decode steps; one line per batch, the median of\n"
          "--runs. With --ep each rank owns batch/N of the sequences and 1/N of the routed\n"
          "experts (bench/model/ep_decode_bench.sh runs the configurations side by side).\n"
          "  --model DIR                        checkpoint (required)\n"
          "  --threads N                        threads per process (default 0: one per core)\n"
          "  --batches B1,B2,...                batch sizes (default 1,16,64; each >= 1)\n"
          "  --context N                        tokens per sequence before the timed steps\n"
          "                                     (default 64)\n"
          "  --steps N                          timed decode steps per run (default 16)\n"
          "  --runs N                           runs per batch size (default 3)\n"
          "  --microbatches 1|2                 the two-microbatch pipeline (default 1)\n"
          "  --microbatch-split measured|always with 2: split the steps measured faster, or\n"
          "                                     every step (default measured)\n"
          "  --pipelines P1,P2,...              instead of the two above, compare several in\n"
          "                                     one process, their runs in turn: mb1 (one\n"
          "                                     microbatch), mb2 (two, measured split) or\n"
          "                                     always (two, every step split)\n"
          "  --ep N                             expert parallelism over the N MPI ranks\n"
          "  --ep-dispatch-dtype int8|bf16|fp32 dispatch payload (default int8)\n"
          "  --eplb-redundant-experts N         N extra expert slots per layer: after one\n"
          "                                     untimed run of the first batch, one EPLB\n"
          "                                     rebalance copies the hottest experts\n"
          "                                     (default 0: contiguous experts, no copies)\n"
          "  --ep-transport auto|network        shared memory on one host, or MPI puts\n"
          "                                     (default auto)\n"
          "  --ep-split-rows N                  split the attention projections, dense MLPs\n"
          "                                     and shared experts over the ranks while no\n"
          "                                     rank brings more rows (default 16; 0 = never)\n"
          "  --help                             this text\n");
      std::exit(help ? 0 : 2);
    }
  }
  for (int64_t b : args->batches) {
    if (b < 1) {
      std::fprintf(stderr, "--batches: every batch size must be >= 1\n");
      return false;
    }
  }
  if (args->model_dir.empty()) {
    std::fprintf(stderr, "--model is required (see --help)\n");
    return false;
  }
  if (args->microbatches != 1 && args->microbatches != 2) {
    std::fprintf(stderr, "--microbatches must be 1 or 2\n");
    return false;
  }
  if (args->split != "measured" && args->split != "always") {
    std::fprintf(stderr, "--microbatch-split must be measured or always\n");
    return false;
  }
  if (args->pipelines.empty()) {
    args->pipelines.push_back(args->microbatches == 1   ? "mb1"
                              : args->split == "always" ? "always"
                                                        : "mb2");
  }
  for (const std::string& p : args->pipelines) {
    if (p != "mb1" && p != "mb2" && p != "always") {
      std::fprintf(stderr, "--pipelines: '%s', expected mb1, mb2 or always\n", p.c_str());
      return false;
    }
    if (std::count(args->pipelines.begin(), args->pipelines.end(), p) > 1) {
      std::fprintf(stderr, "--pipelines: '%s' named twice\n", p.c_str());
      return false;
    }
  }
  if (args->ep.eplb_redundant_experts < 0) {
    std::fprintf(stderr, "--eplb-redundant-experts must be >= 0\n");
    return false;
  }
  if (args->ep.split_rows < 0) {
    std::fprintf(stderr, "--ep-split-rows must be >= 0\n");
    return false;
  }
  if (args->context < 1 || args->steps < 1 || args->runs < 1) {
    std::fprintf(stderr, "--context, --steps and --runs must be >= 1\n");
    return false;
  }
  return true;
}

int64_t my_share(int64_t batch, int rank, int ranks) {
  return batch / ranks + (rank < batch % ranks ? 1 : 0);
}

// `salt` changes the tokens (the EPLB warm-up runs on other tokens than the timed runs, so
// that the copies it places are not fitted to the very routing they are timed on).
Result<double> decode_tokens_per_second(const Args& args, EpSession& session, DeepseekModel& model,
                                        MicrobatchPipeline* pipeline, int64_t batch,
                                        int64_t salt = 0) {
  const int64_t mine = my_share(batch, session.rank(), session.size());
  const KvLayout layout = model.kv_layout(16, DType::kBF16);
  const int64_t per_seq = layout.blocks_for_tokens(args.context + args.steps);
  PS_ASSIGN_OR_RETURN(LatentKvCache cache,
                      LatentKvCache::create(layout, std::max<int64_t>(1, per_seq * mine)));
  std::vector<std::vector<int32_t>> tokens(mine), blocks(mine);
  for (int64_t s = 0; s < mine; ++s) {
    for (int64_t i = 0; i < args.context + args.steps; ++i) {
      tokens[s].push_back(
          static_cast<int32_t>(2 + (s * 131 + i * 17 + session.rank() * 7 + salt * 1009) %
                                       (model.config().vocab_size - 2)));
    }
    for (int64_t b = 0; b < per_seq; ++b)
      blocks[s].push_back(static_cast<int32_t>(s * per_seq + b));
  }
  auto state = model.new_forward_state();
  ForwardOutput out;
  auto step = [&](int64_t start, int64_t n) -> Status {
    std::vector<SequenceChunk> chunks(mine);
    for (int64_t s = 0; s < mine; ++s) {
      chunks[s].tokens = std::span<const int32_t>(tokens[s]).subspan(start, n);
      chunks[s].start_pos = start;
      chunks[s].block_table = blocks[s];
    }
    PS_ASSIGN_OR_RETURN(dist::StepAgreement agreement,
                        session.agree(mine * n, false, {}, pipeline ? pipeline->proposal() : 0));
    if (pipeline) pipeline->follow_agreement(agreement.leader_proposal, agreement.tokens);
    return pipeline ? pipeline->forward(chunks, cache, &out)
                    : model.forward(chunks, cache, *state, &out);
  };
  PS_RETURN_IF_ERROR(step(0, args.context));  // prefill, untimed
  PS_RETURN_IF_ERROR(session.agree(1).status());
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < args.steps; ++i) PS_RETURN_IF_ERROR(step(args.context + i, 1));
  PS_RETURN_IF_ERROR(session.agree(1).status());  // every rank's last step is done
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(batch * args.steps) / seconds;
}

int run(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, &args)) return 2;
  auto started = EpSession::start(args.ep);
  if (!started.ok()) return EpSession::report_start_error(started.status());
  EpSession& session = **started;
  ModelOptions options;
  options.num_threads = args.threads;
  options.load_mtp = false;
  if (Status s = session.plan_experts(args.model_dir, &options); !s.ok()) {
    return session.fail(s, true);
  }
  auto loaded = DeepseekModel::load(args.model_dir, options);
  if (!loaded.ok()) return session.fail(loaded.status());
  DeepseekModel& model = **loaded;
  int64_t max_rows = 0;
  for (int64_t b : args.batches) {
    max_rows = std::max(max_rows, my_share(b, 0, session.size()) * args.context);
  }
  if (Status s = session.install(model, max_rows); !s.ok()) return session.fail(s);
  // One per --pipelines entry; mb1 runs the model's forward directly (nullptr).
  const size_t count = args.pipelines.size();
  std::vector<std::unique_ptr<MicrobatchPipeline>> pipelines(count);
  for (size_t p = 0; p < count; ++p) {
    if (args.pipelines[p] == "mb1") continue;
    pipelines[p] = std::make_unique<MicrobatchPipeline>(&model, args.pipelines[p] == "always"
                                                                    ? MicrobatchSplit::kAlways
                                                                    : MicrobatchSplit::kMeasured);
  }

  if (args.ep.eplb_redundant_experts > 0 && session.distributed()) {
    // Loads to place the copies by: one untimed run of the first batch, on other tokens.
    auto warmup =
        decode_tokens_per_second(args, session, model, pipelines[0].get(), args.batches[0], 1);
    if (!warmup.ok()) return session.fail(warmup.status());
    if (Status s = session.rebalance_experts(model); !s.ok()) return session.fail(s);
  }
  for (int64_t batch : args.batches) {
    // One untimed run of each first: the first touch of a fresh KV cache's blocks and the
    // measured split's calibration belong to no steady-state step.
    std::vector<MicrobatchStats> before(count);
    for (size_t p = 0; p < count; ++p) {
      auto warm = decode_tokens_per_second(args, session, model, pipelines[p].get(), batch);
      if (!warm.ok()) return session.fail(warm.status());
      if (pipelines[p]) before[p] = pipelines[p]->stats();
    }
    std::vector<std::vector<double>> rates(count);
    for (int r = 0; r < args.runs; ++r) {
      for (size_t i = 0; i < count; ++i) {
        const size_t p = (static_cast<size_t>(r) + i) % count;  // the first turns with the run
        auto rate = decode_tokens_per_second(args, session, model, pipelines[p].get(), batch);
        if (!rate.ok()) return session.fail(rate.status());
        rates[p].push_back(*rate);
      }
    }
    if (!session.leader()) continue;
    for (size_t p = 0; p < count; ++p) {
      std::string runs;
      for (double rate : rates[p]) {
        char figure[32];
        std::snprintf(figure, sizeof figure, " %.1f", rate);
        runs += figure;
      }
      std::printf(
          "decode batch %lld [%s]: %.1f tok/s (median of %d; runs%s; ep %d, threads %d (0: one "
          "per core), dispatch %s)\n",
          static_cast<long long>(batch), args.pipelines[p].c_str(), bench::median(rates[p]),
          args.runs, runs.c_str(), session.size(), args.threads,
          session.distributed() ? args.ep.dispatch_dtype.c_str() : "none");
      if (pipelines[p]) {
        // Which way the pipeline ran this batch's steps (prefills included).
        const MicrobatchStats& now = pipelines[p]->stats();
        std::printf("  microbatches: %lld steps split, %lld whole\n",
                    static_cast<long long>(now.split_steps - before[p].split_steps),
                    static_cast<long long>(now.whole_steps - before[p].whole_steps));
      }
    }
    std::fflush(stdout);
  }
  if (Status s = session.finish(); !s.ok()) return session.fail(s);
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  return peerserve::run(argc, argv);
}

// Prefill throughput and time to first token against prompt reuse (the shape of paper 000
// Figure 23): 4,096-token prompts of which 0%, 12.5%, 50% or 90% were computed before, served
//   local:    by the same engine (its own prefix cache),
//   inproc:   by a second engine that shares an in-process caching pool with the first,
//   loopback: by a second engine that shares a `peerserve cache-server` pool over loopback
//             (--pool HOST:PORT; skipped without it).
// Every measurement uses a fresh random prefix, so only the intended cache can hold it. Each
// figure is the median over --reps requests; ratios are against 0% reuse in the same mode.
//
//   build/bench/cache/peerserve_bench_kv_pool_ttft --model DIR [--pool HOST:PORT]
//       [--prompt-len 4096] [--reps 3] [--threads 0]
// (bench/cache/kv_pool_ttft_bench.sh makes the mini preset and starts the cache server.)
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "cache/pool_client.h"
#include "kernels/cpu_features.h"
#include "kv/kv_namespace.h"
#include "model/deepseek_model.h"
#include "runtime/engine.h"
#include "runtime/model_executor.h"

namespace peerserve {
namespace {

struct Args {
  std::string model;
  std::string pool;
  int64_t prompt_len = 4096;
  int reps = 3;
  int threads = 0;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One engine over the shared model; `pool` may be null (local prefix cache only).
std::unique_ptr<Engine> make_engine(DeepseekModel* model, std::shared_ptr<KvBlockStore> pool,
                                    BlockHash root, int64_t prompt_len) {
  ModelExecutorOptions ex;
  ex.block_size = 16;
  ex.num_blocks = (prompt_len / 16 + 8) * 4;
  auto executor = ModelExecutor::create(model, ex);
  PS_CHECK(executor.ok()) << executor.status().to_string();
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 4;
  eo.scheduler.max_num_batched_tokens = 2048;
  eo.scheduler.max_model_len = prompt_len + 16;
  eo.scheduler.block_pool = {.num_blocks = static_cast<int32_t>(ex.num_blocks),
                             .block_size = 16,
                             .enable_prefix_caching = true};
  eo.scheduler.prefix_root = root;
  eo.vocab_size = model->config().vocab_size;
  eo.kv_pool = std::move(pool);
  eo.kv_pool_options.tenant = "bench";
  eo.kv_pool_options.timeout = std::chrono::milliseconds(10000);
  auto engine = Engine::create(eo, std::move(executor).value(), nullptr);
  PS_CHECK(engine.ok()) << engine.status().to_string();
  (*engine)->start();
  return std::move(engine).value();
}

// Runs one request to its end; returns the time to its first output (seconds).
double run_request(Engine& engine, std::vector<TokenId> prompt) {
  std::mutex mutex;
  std::condition_variable cv;
  double first = 0;
  bool done = false;
  EngineRequest request;
  request.prompt_tokens = std::move(prompt);
  request.params.sampling.temperature = 0;
  request.params.max_tokens = 1;
  const double start = now_s();
  auto id = engine.submit(std::move(request), [&](RequestOutput out) {
    std::lock_guard<std::mutex> lock(mutex);
    if (first == 0) first = now_s() - start;
    if (out.finished) {
      PS_CHECK(out.error.ok()) << out.error.to_string();
      done = true;
      cv.notify_all();
    }
  });
  PS_CHECK(id.ok()) << id.status().to_string();
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return done; });
  return first;
}

// Waits until `engine` has handed `blocks` blocks to the pool and they had time to land.
void wait_stored(Engine& engine, int64_t blocks) {
  for (int i = 0; i < 2000 && engine.metrics().kv_pool.blocks_stored < blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

int run(const Args& args) {
  ModelOptions options;
  options.num_threads = args.threads;
  auto model = DeepseekModel::load(args.model, options);
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
    return 1;
  }
  const int vocab = static_cast<int>((*model)->config().vocab_size);
  std::mt19937 rng(7);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(n);
    for (auto& x : t) x = static_cast<TokenId>(rng() % vocab);
    return t;
  };
  std::printf("model %s, %lld-token prompts, kernels %s, medians of %d\n", args.model.c_str(),
              static_cast<long long>(args.prompt_len),
              std::string(kernels::isa_level_name(kernels::active_isa_level())).c_str(), args.reps);
  // "prompt tok/s": the whole prompt over TTFT (reused tokens included, as a user sees it);
  // "computed tok/s": the tokens actually prefilled over TTFT (which includes the pool fetch).
  std::printf("%-9s %7s %10s %14s %14s %10s\n", "mode", "reuse", "TTFT s", "prompt tok/s",
              "computed tok/s", "TTFT/0%");

  std::vector<std::string> modes = {"local", "inproc"};
  if (!args.pool.empty()) modes.push_back("loopback");
  for (const std::string& mode : modes) {
    const BlockHash root = root_block_hash("bench-" + mode);
    std::shared_ptr<KvBlockStore> pool;
    if (mode == "inproc") {
      TieredBlockStoreOptions store;
      store.dram_bytes = uint64_t{2} << 30;
      pool = std::shared_ptr<KvBlockStore>(PoolClient::open_local(store, {}).value());
    } else if (mode == "loopback") {
      auto client = PoolClient::connect(args.pool, {});
      if (!client.ok()) {
        std::fprintf(stderr, "error: --pool %s: %s\n", args.pool.c_str(),
                     client.status().message().c_str());
        return 1;
      }
      pool = std::shared_ptr<KvBlockStore>(std::move(client).value());
    }
    auto writer = make_engine(model->get(), pool, root, args.prompt_len);
    std::unique_ptr<Engine> reader =
        pool ? make_engine(model->get(), pool, root, args.prompt_len) : nullptr;
    Engine& measured = reader ? *reader : *writer;
    double ttft_zero = 0;
    for (double reuse : {0.0, 0.125, 0.5, 0.9}) {
      std::vector<double> ttft;
      const auto reused = static_cast<int64_t>(reuse * static_cast<double>(args.prompt_len));
      for (int rep = 0; rep < args.reps; ++rep) {
        std::vector<TokenId> prefix = random_tokens(reused);
        if (reused > 0) {
          // Computed before: the prefix (plus one token, so all its blocks are full and stored).
          std::vector<TokenId> warm = prefix;
          warm.push_back(0);
          const int64_t stored_before = writer->metrics().kv_pool.blocks_stored;
          run_request(*writer, warm);
          if (pool) wait_stored(*writer, stored_before + reused / 16);
        }
        std::vector<TokenId> prompt = prefix;
        std::vector<TokenId> suffix = random_tokens(args.prompt_len - reused);
        prompt.insert(prompt.end(), suffix.begin(), suffix.end());
        ttft.push_back(run_request(measured, prompt));
      }
      const double median = bench::median(ttft);
      if (reuse == 0.0) ttft_zero = median;
      std::printf("%-9s %6.1f%% %10.3f %14.0f %14.0f %10.2f\n", mode.c_str(), reuse * 100, median,
                  static_cast<double>(args.prompt_len) / median,
                  static_cast<double>(args.prompt_len - reused) / median, median / ttft_zero);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  peerserve::Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") {
      args.model = value();
    } else if (a == "--pool") {
      args.pool = value();
    } else if (a == "--prompt-len") {
      args.prompt_len = peerserve::bench::flag_integer(a, value(), 1, 1 << 24);
    } else if (a == "--reps") {
      args.reps = static_cast<int>(peerserve::bench::flag_integer(a, value(), 1, 1 << 20));
    } else if (a == "--threads") {
      args.threads = static_cast<int>(peerserve::bench::flag_integer(a, value(), 0, 1024));
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: peerserve_bench_kv_pool_ttft --model DIR [options]\n"
          "TTFT and prefill throughput against prompt reuse (0, 12.5, 50, 90%%): local prefix\n"
          "cache, an in-process pool shared by two engines, and (with --pool) a cache-server\n"
          "pool over loopback.\n"
          "  --model DIR       checkpoint (required)\n"
          "  --pool HOST:PORT  a running `peerserve cache-server` for the loopback mode\n"
          "                    (skipped without it)\n"
          "  --prompt-len N    tokens per prompt (default 4096)\n"
          "  --reps N          requests per figure, medians reported (default 3)\n"
          "  --threads N       threads (default 0: one per core)\n"
          "  --help            this text\n");
      return 0;
    } else {
      std::fprintf(stderr, "error: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (args.model.empty() || args.prompt_len < 64 || args.reps < 1) {
    std::fprintf(stderr, "error: --model is required; --prompt-len >= 64, --reps >= 1\n");
    return 2;
  }
  return peerserve::run(args);
}

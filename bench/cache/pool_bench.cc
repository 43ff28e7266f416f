// Caching pool get/put bandwidth for one KV block of the mini preset (16 tokens, 46,080
// bytes) and for batches of 64, next to three ceilings measured in the same run:
//   memcpy      one thread copying the same blocks between distinct buffers (every pool
//               read ends in such a copy)
//   tcp         raw TCP over 127.0.0.1, 1 MiB writes (what any socket transport can reach)
//   grpc probe  the cache server's Probe RPC: Get-shaped replies of the same blocks, built
//               without the store (the ceiling of Get over this transport), measured in
//               rounds alternating with the gets it bounds
// Also the prefill->decode KV hand-off: blocks pushed over the block stream into a decode
// instance's hand-off receiver (reserved KV memory). Pools measured: the in-process pool
// (`--kv-pool local`), the pool on loopback (an in-process PoolServer on 127.0.0.1:0, or --server
// HOST:PORT) with blocks over its block-stream port (the default data path) and over gRPC, and the
// SSD tier (DRAM too small to hold the batch, so every get reads a checksummed file; the files
// are fresh in the page cache, so the row times the tier's code path, not the device).
//
// Every figure is the median of --repeats rounds of --iterations calls each; ratios use
// the medians. GB/s = 1e9 bytes/s. The pool's copies are plain memcpy (no ISA-specific
// code); numbers depend on the machine's load (this runs on whatever cores it gets).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/ceilings/machine_ceilings.h"
#include "bench/flag_value.h"
#include "cache/block_stream_client.h"
#include "cache/block_stream_server.h"
#include "cache/grpc_pool_transport.h"
#include "cache/pool_client.h"
#include "cache/pool_server.h"
#include "kv/kv_layout.h"
#include "runtime/kv_handoff_receiver.h"

namespace peerserve {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct BenchOptions {
  int repeats = 5;
  int iterations = 20;
  int batch = 64;
  std::string server;  // empty: in-process server
};

using bench::median;  // the mean of the two middle values for an even count

// Median over rounds of (bytes moved per round / seconds per round), in GB/s.
double measure_gbs(const BenchOptions& o, uint64_t bytes_per_call,
                   const std::function<void()>& call) {
  call();  // warm up (connections, page faults)
  std::vector<double> rounds;
  for (int r = 0; r < o.repeats; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < o.iterations; ++i) call();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    rounds.push_back(static_cast<double>(bytes_per_call) * o.iterations / seconds / 1e9);
  }
  return median(rounds);
}

// memcpy of `count` distinct blocks into `count` distinct buffers per call: the same bytes
// and working set that a get of `count` blocks copies.
double measure_memcpy_gbs(const BenchOptions& o, size_t block_bytes, int count) {
  std::vector<std::vector<char>> src(count, std::vector<char>(block_bytes, 1));
  std::vector<std::vector<char>> dst(count, std::vector<char>(block_bytes, 0));
  return measure_gbs(o, block_bytes * count, [&] {
    for (int b = 0; b < count; ++b) std::memcpy(dst[b].data(), src[b].data(), block_bytes);
    src[0][0] = dst[count - 1][block_bytes - 1];
  });
}

double measure_tcp_loopback_gbs(const BenchOptions& o) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcp loopback");
    std::exit(1);
  }
  const int sender = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  const int receiver = ::accept(listener, nullptr, nullptr);
  const size_t per_call = 64 << 20;
  const size_t chunk = 1 << 20;
  std::vector<char> out(chunk, 7), in(chunk);
  auto call = [&] {
    std::thread writer([&] {
      for (size_t sent = 0; sent < per_call;) {
        const ssize_t n = ::send(sender, out.data(), std::min(chunk, per_call - sent), 0);
        if (n <= 0) std::exit(1);
        sent += static_cast<size_t>(n);
      }
    });
    for (size_t got = 0; got < per_call;) {
      const ssize_t n = ::recv(receiver, in.data(), chunk, 0);
      if (n <= 0) std::exit(1);
      got += static_cast<size_t>(n);
    }
    writer.join();
  };
  BenchOptions few = o;
  few.iterations = 2;
  const double gbs = measure_gbs(few, per_call, call);
  ::close(sender);
  ::close(receiver);
  ::close(listener);
  return gbs;
}

// Medians of rounds of `a` and of `b` taken alternately, so that both see the same drift in
// the machine's load.
std::pair<double, double> measure_alternating_gbs(const BenchOptions& o, uint64_t bytes_per_call,
                                                  const std::function<void()>& a,
                                                  const std::function<void()>& b) {
  a();
  b();
  std::vector<double> rounds_a, rounds_b;
  auto round = [&](const std::function<void()>& call, std::vector<double>& out) {
    const auto start = Clock::now();
    for (int i = 0; i < o.iterations; ++i) call();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out.push_back(static_cast<double>(bytes_per_call) * o.iterations / seconds / 1e9);
  };
  for (int r = 0; r < o.repeats; ++r) {
    round(a, rounds_a);
    round(b, rounds_b);
  }
  return {median(rounds_a), median(rounds_b)};
}

struct PoolFigures {
  double put_one = 0, get_one = 0, put_batch = 0, get_batch = 0;
  // The transport's ceiling for the same shapes, measured alternately with the gets.
  double ceiling_one = 0, ceiling_batch = 0;
};

// Streams `total_bytes` through the transport without the store (empty: no ceiling).
using CeilingCall = std::function<void(uint64_t total_bytes)>;

PoolFigures measure_pool(const BenchOptions& o, PoolClient& client, size_t block_bytes,
                         const std::string& tenant, const CeilingCall& ceiling = {}) {
  const milliseconds timeout(30000);
  std::vector<std::vector<std::byte>> blocks(o.batch, std::vector<std::byte>(block_bytes));
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t i = 0; i < block_bytes; ++i) blocks[b][i] = static_cast<std::byte>(b * 31 + i);
  }
  std::vector<PoolKey> keys;
  for (int b = 0; b < o.batch; ++b) keys.push_back({tenant, 0x1000 + static_cast<uint64_t>(b)});
  std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
  std::vector<std::vector<std::byte>> out(o.batch, std::vector<std::byte>(block_bytes));
  std::vector<BlockSink> sinks;
  for (auto& b : out) sinks.push_back(sink_into(b));
  auto check_put = [](const std::vector<Status>& s) {
    for (const Status& st : s) {
      if (!st.ok()) {
        std::fprintf(stderr, "put failed: %s\n", st.to_string().c_str());
        std::exit(1);
      }
    }
  };
  auto check_get = [](const std::vector<BlockLookup>& r) {
    for (const BlockLookup& l : r) {
      if (!l.hit()) {
        std::fprintf(stderr, "get missed: %s\n", l.error.to_string().c_str());
        std::exit(1);
      }
    }
  };
  PoolFigures f;
  f.put_one =
      measure_gbs(o, block_bytes, [&] { check_put({client.put_one(keys[0], views[0], timeout)}); });
  auto get_one = [&] {
    std::vector<BlockLookup> r;
    r.push_back(client.get_one(keys[0], out[0], timeout));
    check_get(r);
  };
  auto get_batch = [&] { check_get(client.get(keys, sinks, timeout)); };
  if (ceiling) {
    std::tie(f.get_one, f.ceiling_one) =
        measure_alternating_gbs(o, block_bytes, get_one, [&] { ceiling(block_bytes); });
  } else {
    f.get_one = measure_gbs(o, block_bytes, get_one);
  }
  f.put_batch =
      measure_gbs(o, block_bytes * o.batch, [&] { check_put(client.put(keys, views, timeout)); });
  if (ceiling) {
    std::tie(f.get_batch, f.ceiling_batch) = measure_alternating_gbs(
        o, block_bytes * o.batch, get_batch, [&] { ceiling(block_bytes * o.batch); });
  } else {
    f.get_batch = measure_gbs(o, block_bytes * o.batch, get_batch);
  }
  if (out[o.batch - 1] != blocks[o.batch - 1]) {
    std::fprintf(stderr, "pool returned wrong bytes\n");
    std::exit(1);
  }
  return f;
}

int run(const BenchOptions& o) {
  const KvLayout mini{.num_layers = 5,
                      .latent_dim = 256,
                      .rope_dim = 32,
                      .block_size = 16,
                      .dtype = DType::kBF16};  // 4 decoder layers + 1 MTP layer
  const size_t block_bytes = mini.block_bytes();
  std::printf(
      "caching pool bench: block %zu bytes (mini preset, 16 tokens), batch %d, "
      "median of %d rounds x %d calls; copies are plain memcpy\n\n",
      block_bytes, o.batch, o.repeats, o.iterations);

  const double memcpy_one = measure_memcpy_gbs(o, block_bytes, 1);
  const double memcpy_batch = measure_memcpy_gbs(o, block_bytes, o.batch);
  const double tcp_gbs = measure_tcp_loopback_gbs(o);

  std::unique_ptr<PoolServer> server;
  std::string address = o.server;
  if (address.empty()) {
    TieredBlockStoreOptions store;
    store.dram_bytes = 512 << 20;
    auto opened = TieredBlockStore::open(store);
    auto started =
        PoolServer::start(std::shared_ptr<TieredBlockStore>(std::move(opened).value()), {});
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.status().to_string().c_str());
      return 1;
    }
    server = std::move(started).value();
    address = "127.0.0.1:" + std::to_string(server->port());
  }
  const milliseconds timeout(30000);
  GrpcTransportProbe prober(address);
  auto probe = [&](uint64_t total) {
    if (!prober.run(total, static_cast<uint32_t>(block_bytes), timeout).ok()) {
      std::fprintf(stderr, "probe failed\n");
      std::exit(1);
    }
  };
  PoolClientOptions grpc_only;
  grpc_only.use_block_stream = false;
  auto remote = PoolClient::connect(address, grpc_only);
  if (!remote.ok()) {
    std::fprintf(stderr, "error: --server %s: %s\n", address.c_str(),
                 remote.status().to_string().c_str());
    return 1;
  }
  const PoolFigures grpc = measure_pool(o, **remote, block_bytes, "bench", probe);
  auto streamed = PoolClient::connect(address, {});
  if (!streamed.ok()) {
    std::fprintf(stderr, "error: --server %s: %s\n", address.c_str(),
                 streamed.status().to_string().c_str());
    return 1;
  }
  const PoolFigures stream = measure_pool(o, **streamed, block_bytes, "bench-stream");
  const double probe_one = grpc.ceiling_one;
  const double probe_batch = grpc.ceiling_batch;

  TieredBlockStoreOptions local_store;
  local_store.dram_bytes = 512 << 20;
  auto local = PoolClient::open_local(local_store, {});
  const PoolFigures in_process = measure_pool(o, **local, block_bytes, "bench");

  const std::filesystem::path ssd_dir = std::filesystem::temp_directory_path() /
                                        ("peerserve_pool_bench_" + std::to_string(::getpid()));
  TieredBlockStoreOptions ssd_store;
  ssd_store.dram_bytes = block_bytes / 2;  // no block fits in DRAM: every get reads a file
  ssd_store.ssd_dir = ssd_dir.string();
  ssd_store.ssd_bytes = 1ull << 30;
  auto ssd = PoolClient::open_local(ssd_store, {});
  const PoolFigures ssd_figures = measure_pool(o, **ssd, block_bytes, "bench");
  std::filesystem::remove_all(ssd_dir);

  // The prefill->decode hand-off (runtime/kv_handoff_receiver.h): a transfer of `batch` blocks
  // (a 1,024-token mini prompt) opened, pushed over the block stream into reserved KV memory,
  // closed — per call, as a decode instance does per request. The KV memory is touched once
  // first, as a running instance's is.
  double handoff_gbs = 0;
  {
    auto receiver = std::make_shared<KvHandoffReceiver>();
    auto listening = BlockStreamServer::start(receiver, {});
    if (!listening.ok()) return 1;
    std::vector<std::byte> kv(block_bytes * static_cast<size_t>(o.batch), std::byte{1});
    std::vector<std::vector<std::byte>> blocks(o.batch, std::vector<std::byte>(block_bytes));
    std::vector<std::span<const std::byte>> views(blocks.begin(), blocks.end());
    std::vector<BlockHash> hashes;
    std::vector<std::span<std::byte>> places;
    for (int b = 0; b < o.batch; ++b) {
      hashes.push_back(0x2000 + static_cast<uint64_t>(b));
      places.emplace_back(kv.data() + block_bytes * static_cast<size_t>(b), block_bytes);
    }
    BlockStreamClient pusher("127.0.0.1", (*listening)->port(), "hand-off receiver");
    handoff_gbs = measure_gbs(o, block_bytes * o.batch, [&] {
      const std::string name = receiver->open(hashes, places);
      std::vector<PoolKey> keys;
      for (BlockHash h : hashes) keys.push_back({name, h});
      for (const Status& st : pusher.put(keys, views, Clock::now() + timeout)) {
        if (!st.ok()) {
          std::fprintf(stderr, "push failed: %s\n", st.to_string().c_str());
          std::exit(1);
        }
      }
      if (receiver->close(name) != hashes.size()) {
        std::fprintf(stderr, "hand-off incomplete\n");
        std::exit(1);
      }
    });
  }

  std::printf("ceilings (same run)\n");
  std::printf("  memcpy, 1 block                    %7.2f GB/s\n", memcpy_one);
  std::printf("  memcpy, %d blocks                  %7.2f GB/s\n", o.batch, memcpy_batch);
  std::printf("  TCP loopback, 1 MiB writes         %7.2f GB/s\n", tcp_gbs);
  std::printf("  gRPC probe, 1 block per call       %7.2f GB/s\n", probe_one);
  std::printf("  gRPC probe, %d blocks per call     %7.2f GB/s\n\n", o.batch, probe_batch);
  auto row = [&](const char* name, const PoolFigures& f, double ceiling_one, double ceiling_batch,
                 const char* ceiling_name) {
    std::printf("%-24s put 1 %7.3f  get 1 %7.3f  put %d %7.3f  get %d %7.3f GB/s\n", name,
                f.put_one, f.get_one, o.batch, f.put_batch, o.batch, f.get_batch);
    std::printf("%-24s get 1 / %s %5.2f   get %d / %s %5.2f\n", "", ceiling_name,
                f.get_one / ceiling_one, o.batch, ceiling_name, f.get_batch / ceiling_batch);
  };
  row("pool over gRPC", grpc, probe_one, probe_batch, "probe");
  std::printf("%-24s get %d / TCP loopback %5.2f\n", "", o.batch, grpc.get_batch / tcp_gbs);
  std::printf("%-24s put 1 %7.3f  get 1 %7.3f  put %d %7.3f  get %d %7.3f GB/s\n",
              "pool over block stream", stream.put_one, stream.get_one, o.batch, stream.put_batch,
              o.batch, stream.get_batch);
  std::printf("%-24s get %d / TCP loopback %5.2f   get %d / memcpy %5.2f\n", "", o.batch,
              stream.get_batch / tcp_gbs, o.batch, stream.get_batch / memcpy_batch);
  std::printf("%-24s push %d %7.3f GB/s = %.2f of TCP loopback (open, push, close per call)\n",
              "prefill->decode hand-off", o.batch, handoff_gbs, handoff_gbs / tcp_gbs);
  row("pool in-process", in_process, memcpy_one, memcpy_batch, "memcpy");
  // The files were just written and not synced: their reads hit the page cache, so this row
  // is the SSD tier's code path (files, checksums), not a device's bandwidth.
  row("pool in-process, SSD tier (page cache)", ssd_figures, memcpy_one, memcpy_batch, "memcpy");
  std::printf(
      "\ntarget: batched gets >= 0.50 of the transport's bandwidth (the default data path, the "
      "block stream, against raw TCP loopback): %s (%.2f)\n",
      stream.get_batch >= 0.5 * tcp_gbs ? "met" : "NOT met", stream.get_batch / tcp_gbs);
  std::printf("(gRPC alone: %.2f of its own probe, %.2f of raw TCP)\n",
              grpc.get_batch / probe_batch, grpc.get_batch / tcp_gbs);
  if (server) server->shutdown(milliseconds(100));
  return 0;
}

}  // namespace
}  // namespace peerserve

int main(int argc, char** argv) {
  peerserve::BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--repeats") {
      o.repeats = static_cast<int>(peerserve::bench::flag_integer(arg, value(), 1, 1 << 20));
    } else if (arg == "--iterations") {
      o.iterations = static_cast<int>(peerserve::bench::flag_integer(arg, value(), 1, 1 << 24));
    } else if (arg == "--batch") {
      o.batch = static_cast<int>(peerserve::bench::flag_integer(arg, value(), 1, 1 << 20));
    } else if (arg == "--server") {
      o.server = value();
    } else {
      const bool help = arg == "--help" || arg == "-h";
      if (!help) std::fprintf(stderr, "unknown option: %s\n", arg.c_str());
      std::fprintf(
          help ? stdout : stderr,
          "usage: peerserve_bench_cache_pool [options]\n"
          "Caching pool get/put bandwidth for one KV block of the mini preset and for batches,\n"
          "beside the memcpy, raw loopback TCP and gRPC probe ceilings measured in the same run;\n"
          "the in-process pool, the pool on loopback (block stream and gRPC), the SSD tier, and\n"
          "the prefill->decode KV hand-off.\n"
          "  --repeats N         rounds per figure, medians reported (default 5)\n"
          "  --iterations N      calls per round (default 20)\n"
          "  --batch N           blocks per batched get/put (default 64)\n"
          "  --server HOST:PORT  the gRPC address of a running `peerserve cache-server` to\n"
          "                      measure instead of an in-process server on 127.0.0.1\n"
          "  --help              this text\n");
      return help ? 0 : 2;
    }
  }
  return peerserve::run(o);
}

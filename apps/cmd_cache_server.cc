// peerserve cache-server: one member of the caching pool (a DRAM tier over an optional SSD
// tier, served over gRPC). Several servers form one pool: clients place keys on them by
// consistent hashing over the member list (--kv-pool HOST:PORT,HOST:PORT,...).
//
//   peerserve cache-server --listen 127.0.0.1:7400 --dram 4G --ssd-dir /var/cache/ps --ssd 100G
//
// Prints "cache-server listening on HOST:PORT" once it accepts calls (the port it chose when
// asked for port 0). SIGINT/SIGTERM stop it after running calls finish (1 s grace). Blocks
// on SSD survive a restart on the same --ssd-dir.
#include <signal.h>

#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/byte_size.h"
#include "apps/command_registry.h"
#include "apps/server_signals.h"
#include "cache/pool_server.h"
#include "cache/tiered_block_store.h"
#include "kv/kv_namespace.h"

namespace peerserve {
namespace {

struct CacheServerCli {
  std::string listen;
  std::string dram;
  std::string ssd_dir;
  std::string ssd;
  bool ssd_sync = false;
  std::vector<std::string> namespace_capacity;
  std::string max_block = "32M";
  int block_stream_port = 0;
};

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return kExitFailure;
}

// "1073741824", "512MiB", "512M", "2G", "64k" (binary multiples), checked for overflow.
int run_cache_server(const CacheServerCli& cli) {
  TieredBlockStoreOptions store_options;
  Result<uint64_t> dram = parse_byte_size("--dram", cli.dram);
  if (!dram.ok()) return fail(dram.status());
  if (*dram == 0) return fail(invalid_argument("--dram 0: the DRAM tier needs some capacity"));
  store_options.dram_bytes = *dram;
  if (cli.ssd_dir.empty() != cli.ssd.empty()) {
    return fail(
        invalid_argument("--ssd-dir and --ssd go together (the SSD tier's folder and size)"));
  }
  if (!cli.ssd_dir.empty()) {
    Result<uint64_t> ssd = parse_byte_size("--ssd", cli.ssd);
    if (!ssd.ok()) return fail(ssd.status());
    if (*ssd == 0) return fail(invalid_argument("--ssd 0: the SSD tier needs some capacity"));
    store_options.ssd_dir = cli.ssd_dir;
    store_options.ssd_bytes = *ssd;
    store_options.ssd_sync_writes = cli.ssd_sync;
  }
  for (const std::string& entry : cli.namespace_capacity) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      return fail(invalid_argument("--namespace-capacity '" + entry + "': expected NAME=BYTES"));
    }
    const std::string name = entry.substr(0, eq);
    if (Status s = validate_tenant_name(name); !s.ok()) return fail(s);
    if (store_options.tenant_capacity.count(name) > 0) {  // the last one won, silently
      return fail(invalid_argument("--namespace-capacity: namespace '" + name + "' given twice"));
    }
    Result<uint64_t> bytes = parse_byte_size("--namespace-capacity " + name, entry.substr(eq + 1));
    if (!bytes.ok()) return fail(bytes.status());
    store_options.tenant_capacity[name] = *bytes;
  }
  PoolServerOptions server_options;
  server_options.listen = cli.listen;
  Result<uint64_t> max_block = parse_byte_size("--max-block-bytes", cli.max_block);
  if (!max_block.ok()) return fail(max_block.status());
  if (*max_block < 1 || *max_block > kLargestMaxBlockBytes) {
    return fail(invalid_argument("--max-block-bytes " + cli.max_block +
                                 ": expected 1 .. 63M (a block returned over gRPC travels in "
                                 "one message of at most 64 MiB)"));
  }
  server_options.max_block_bytes = *max_block;
  if (cli.block_stream_port < -1 || cli.block_stream_port > 65535) {
    return fail(invalid_argument("--block-stream-port " + std::to_string(cli.block_stream_port) +
                                 ": expected -1 (off), 0 (any free port) or a port"));
  }
  server_options.block_stream_port = cli.block_stream_port;

  // Signals are taken by a dedicated thread with sigwait(); block them in every thread that
  // gRPC starts from here on. Until it listens (the SSD tier's recovery), one ends it.
  const sigset_t signals = block_server_signals();
  StartupSignalExit startup_exit(signals);

  Result<std::unique_ptr<TieredBlockStore>> store = TieredBlockStore::open(store_options);
  if (!store.ok()) return fail(store.status());
  std::shared_ptr<TieredBlockStore> shared_store(std::move(store).value());
  if (const SsdTier* ssd = shared_store->ssd(); ssd != nullptr) {
    const SsdRecovery& r = ssd->recovery();
    std::printf(
        "cache-server: SSD tier %s: recovered %llu blocks (%llu bytes); removed %llu "
        "interrupted writes, %llu bad files; evicted %llu over capacity\n",
        cli.ssd_dir.c_str(), static_cast<unsigned long long>(r.blocks),
        static_cast<unsigned long long>(r.bytes),
        static_cast<unsigned long long>(r.temp_files_removed),
        static_cast<unsigned long long>(r.bad_files_removed),
        static_cast<unsigned long long>(r.evicted_over_capacity));
  }
  Result<std::unique_ptr<PoolServer>> server = PoolServer::start(shared_store, server_options);
  if (!server.ok()) return fail(server.status());
  const std::string host = cli.listen.substr(0, cli.listen.rfind(':'));
  const std::string data_path =
      (*server)->block_stream_port() > 0
          ? ", blocks on port " + std::to_string((*server)->block_stream_port())
          : ", blocks over gRPC";
  std::printf("cache-server listening on %s:%d (DRAM %llu bytes%s%s)\n", host.c_str(),
              (*server)->port(), static_cast<unsigned long long>(store_options.dram_bytes),
              store_options.ssd_dir.empty() ? ", no SSD tier" : ", SSD tier", data_path.c_str());
  std::fflush(stdout);

  PoolServer* server_ptr = server->get();
  startup_exit.done();
  std::thread signal_waiter([signals, server_ptr] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "cache-server: shutting down (signal %d)\n", sig);
    server_ptr->shutdown(std::chrono::milliseconds(1000));
  });
  (*server)->wait();
  signal_waiter.join();
  const PoolStats s = shared_store->stats();
  std::printf("cache-server: %llu gets (%llu hits), %llu puts, %llu DRAM evictions\n",
              static_cast<unsigned long long>(s.gets), static_cast<unsigned long long>(s.hits),
              static_cast<unsigned long long>(s.puts),
              static_cast<unsigned long long>(s.dram.evictions));
  return 0;
}

const bool kRegistered = register_command([](CLI::App& root) {
  auto* sub = root.add_subcommand(
      "cache-server",
      "Run one member of the caching pool: a DRAM tier (LRU) over an optional SSD tier "
      "(checksummed block files, recovered after a restart), served over gRPC (control) and a "
      "block-stream TCP port (data). Clients list "
      "the members (--kv-pool HOST:PORT,...) and place blocks by consistent hashing.");
  auto cli = std::make_shared<CacheServerCli>();
  sub->add_option("--listen", cli->listen,
                  "HOST:PORT to serve on; port 0 picks a free port (printed at start)")
      ->required();
  sub->add_option("--dram", cli->dram,
                  "capacity of the DRAM tier in bytes (suffixes k, M, G, T: binary multiples)")
      ->required();
  auto* ssd_dir =
      sub->add_option("--ssd-dir", cli->ssd_dir,
                      "folder of the SSD tier (created if missing; blocks in it are recovered and "
                      "served again); every write is persisted there before it is acknowledged");
  sub->add_option("--ssd", cli->ssd, "capacity of the SSD tier in bytes (with --ssd-dir)");
  sub->add_flag("--ssd-sync", cli->ssd_sync,
                "fdatasync every block file before it is acknowledged (survives power loss, "
                "not only a crash of the server; slower; with --ssd-dir)")
      ->needs(ssd_dir);
  sub->add_option("--namespace-capacity", cli->namespace_capacity,
                  "NAME=BYTES: cap what namespace NAME may hold in each tier (repeatable); a "
                  "namespace over its cap evicts its own least recently used blocks");
  sub->add_option("--max-block-bytes", cli->max_block,
                  "largest block a client may store, at most 63M (default 32M)");
  sub->add_option("--block-stream-port", cli->block_stream_port,
                  "port of the block-stream data path on the --listen host (blocks of gets and "
                  "puts over plain TCP; gRPC advertises it): 0 any free port, -1 off (blocks go "
                  "over gRPC)")
      ->capture_default_str();
  sub->callback([cli] { set_command_exit_code(run_cache_server(*cli)); });
});

}  // namespace
}  // namespace peerserve

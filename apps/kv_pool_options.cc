#include "apps/kv_pool_options.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "apps/byte_size.h"
#include "base/regular_file.h"
#include "cache/block_sink.h"
#include "cache/pool_client.h"
#include "model/checkpoint_fingerprint.h"
#include "model/model_config.h"
#include "serve/endpoint_list.h"

namespace peerserve {

void add_kv_pool_options(CLI::App* command, KvPoolCli* cli) {
  // The other flags are refused without --kv-pool (they would be ignored).
  CLI::Option* pool =
      command->add_option("--kv-pool", cli->members,
                          "Caching pool for context caching: HOST:PORT,... of 'peerserve "
                          "cache-server' members (consistent hashing), or 'local' for an "
                          "in-process pool. Prompts look up their KV blocks there after the local "
                          "prefix cache; new full prompt blocks are stored there. Default: none");
  command
      ->add_option("--kv-pool-dram", cli->dram,
                   "With --kv-pool local: its DRAM tier (bytes, K/M/G suffixes)")
      ->needs(pool)
      ->capture_default_str();
  CLI::Option* ssd_dir =
      command
          ->add_option("--kv-pool-ssd-dir", cli->ssd_dir,
                       "With --kv-pool local: directory of its SSD tier (persisted blocks; "
                       "under --ep each rank uses DIR/rank-N)")
          ->needs(pool);
  command
      ->add_option("--kv-pool-ssd", cli->ssd,
                   "With --kv-pool-ssd-dir: its capacity (bytes, K/M/G suffixes; required)")
      ->needs(ssd_dir)
      ->capture_default_str();
  command
      ->add_option("--kv-namespace", cli->name_space,
                   "Pool namespace (tenant): blocks are shared only between engines of the "
                   "same namespace; 1-64 of [A-Za-z0-9._-]")
      ->needs(pool)
      ->capture_default_str();
  command
      ->add_option("--kv-model-id", cli->model_id,
                   "Identity of the weights in pool keys (default: a fingerprint of the "
                   "checkpoint files); engines with the same id must have the same weights")
      ->needs(pool);
  command
      ->add_option("--kv-pool-timeout-ms", cli->timeout_ms,
                   "Each pool call gives up after this long (then: a miss, recomputed)")
      ->needs(pool)
      ->capture_default_str();
  command
      ->add_flag("--kv-pool-store-decode", cli->store_decode_blocks,
                 "Also store blocks holding generated tokens (default: prompt blocks only)")
      ->needs(pool);
}

Status check_kv_pool_flags(const KvPoolCli& cli) {
  if (cli.members.empty()) return ok_status();
  if (cli.timeout_ms < 1 || cli.timeout_ms > 600000) {
    return invalid_argument("--kv-pool-timeout-ms " + std::to_string(cli.timeout_ms) +
                            ": expected 1..600000");
  }
  if (Status s = validate_tenant_name(cli.name_space); !s.ok()) {
    return invalid_argument("--kv-namespace: " + s.message());
  }
  if (cli.members != "local") {
    PS_RETURN_IF_ERROR(parse_endpoint_list(cli.members, "--kv-pool").status());
    // The in-process pool's tiers mean nothing for a remote one: refused, not ignored.
    if (cli.dram != KvPoolCli{}.dram || !cli.ssd_dir.empty() || cli.ssd != KvPoolCli{}.ssd) {
      return invalid_argument(
          "--kv-pool-dram, --kv-pool-ssd-dir and --kv-pool-ssd are for --kv-pool local (the "
          "members' own --dram and --ssd size a remote pool)");
    }
    return ok_status();
  }
  PS_RETURN_IF_ERROR(parse_byte_size("--kv-pool-dram", cli.dram).status());
  if (!cli.ssd_dir.empty()) {
    PS_ASSIGN_OR_RETURN(const uint64_t ssd, parse_byte_size("--kv-pool-ssd", cli.ssd));
    if (ssd == 0) return invalid_argument("--kv-pool-ssd-dir needs --kv-pool-ssd BYTES (> 0)");
  }
  return ok_status();
}

Result<KvPoolSetup> open_kv_pool(const KvPoolCli& cli, const std::string& model_dir,
                                 const KvLayout& layout, bool mtp_kv, const std::string& compute) {
  KvPoolSetup setup;
  PS_RETURN_IF_ERROR(check_kv_pool_flags(cli));
  std::string model_id = cli.model_id;
  if (model_id.empty()) {
    PS_ASSIGN_OR_RETURN(const std::string config,
                        read_regular_file(model_dir + "/config.json", kMaxConfigFileBytes));
    PS_ASSIGN_OR_RETURN(std::string weights, checkpoint_fingerprint(model_dir));
    model_id = model_identity(config, weights);
  }
  setup.name_space.tenant = cli.name_space;
  setup.name_space.model_id = model_id;
  setup.name_space.layout = layout;
  setup.name_space.mtp_kv = mtp_kv;
  setup.name_space.compute = compute;
  PS_RETURN_IF_ERROR(setup.name_space.validate());
  setup.connector.tenant = cli.name_space;
  setup.connector.timeout = std::chrono::milliseconds(cli.timeout_ms);

  PoolClientOptions client_options;
  client_options.on_member_state = [](const std::string& member, const Status* down) {
    if (down != nullptr) {
      std::fprintf(stderr,
                   "kv pool: member %s does not answer (%s); lookups of its blocks are misses, "
                   "computed here, until it does\n",
                   member.c_str(), down->message().c_str());
    } else {
      std::fprintf(stderr, "kv pool: member %s answers again\n", member.c_str());
    }
  };
  if (cli.members == "local") {
    TieredBlockStoreOptions store;
    PS_ASSIGN_OR_RETURN(store.dram_bytes, parse_byte_size("--kv-pool-dram", cli.dram));
    if (!cli.ssd_dir.empty()) {
      store.ssd_dir = cli.ssd_dir;
      PS_ASSIGN_OR_RETURN(store.ssd_bytes, parse_byte_size("--kv-pool-ssd", cli.ssd));
    }
    auto client = PoolClient::open_local(store, client_options);
    if (!client.ok()) return invalid_argument("--kv-pool local: " + client.status().message());
    setup.store = std::shared_ptr<KvBlockStore>(std::move(client).value());
    setup.description = "in-process pool (" + cli.dram + " DRAM" +
                        (cli.ssd_dir.empty() ? "" : ", SSD tier in " + cli.ssd_dir) + ")";
  } else {
    auto client = PoolClient::connect(cli.members, client_options);
    if (!client.ok())
      return invalid_argument("--kv-pool " + cli.members + ": " + client.status().message());
    setup.store = std::shared_ptr<KvBlockStore>(std::move(client).value());
    setup.description = "pool " + cli.members;
    // Said now rather than found in the metrics later: a member that does not answer makes
    // every lookup of its keys a miss (recomputed here). Keys spread over the members by
    // hash, so lookups of a few made-up keys reach each of them; one that is down is
    // reported by the client's on_member_state (and again whenever one goes or comes back).
    std::vector<PoolKey> probes;
    std::vector<std::vector<std::byte>> buffers(32);
    std::vector<BlockSink> sinks;
    for (size_t i = 0; i < buffers.size(); ++i) {
      probes.push_back(PoolKey{cli.name_space, 0x9e3779b97f4a7c15ULL * (i + 1)});
      sinks.push_back([&buffer = buffers[i]](size_t size) {
        buffer.resize(size);  // a made-up key is a miss, but take whatever comes
        return std::span<std::byte>(buffer);
      });
    }
    (void)setup.store->get(probes, sinks, setup.connector.timeout);
  }
  setup.description += ", namespace '" + cli.name_space + "', model id " + model_id;
  return setup;
}

}  // namespace peerserve

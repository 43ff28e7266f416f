// The caching-pool flags of `serve` (context caching through a shared pool; paper 000 §4.4):
//
//   --kv-pool HOST:PORT,HOST:PORT,...   members of a pool of `peerserve cache-server`s
//   --kv-pool local                     an in-process pool (--kv-pool-dram, --kv-pool-ssd-*)
//   --kv-namespace NAME                 the tenant: engines share blocks only within one
//   --kv-model-id ID                    the weights' identity (default: a fingerprint of the
//                                       checkpoint, model/checkpoint_fingerprint.h)
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "base/status.h"
#include "cache/kv_block_store.h"
#include "kv/kv_namespace.h"
#include "runtime/kv_pool_connector.h"

namespace peerserve {

struct KvPoolCli {
  std::string members;  // empty: no pool
  std::string dram = "1GiB";
  std::string ssd_dir;
  std::string ssd = "0";
  std::string name_space = "default";
  std::string model_id;
  int timeout_ms = 2000;
  bool store_decode_blocks = false;
};

void add_kv_pool_options(CLI::App* command, KvPoolCli* cli);

struct KvPoolSetup {
  std::shared_ptr<KvBlockStore> store;
  KvNamespace name_space;  // its root_hash() roots the engine's block hash chains
  KvPoolConnectorOptions connector;
  std::string description;  // for the start-up log
};

// The flags' own checks (timeout, namespace name, member list), before any model is loaded;
// open_kv_pool runs them too.
Status check_kv_pool_flags(const KvPoolCli& cli);

// Opens the pool the flags name, for a model in `model_dir` whose KV blocks have `layout`
// (and the MTP layer's KV written when `mtp_kv`: KvNamespace::mtp_kv). Errors name the flag
// (a bad member list, size, namespace or timeout; an unreadable checkpoint for the
// fingerprint).
// `compute`: KvNamespace::compute (how the engine's products differ from BF16 on the stored
// weights; empty for that default).
Result<KvPoolSetup> open_kv_pool(const KvPoolCli& cli, const std::string& model_dir,
                                 const KvLayout& layout, bool mtp_kv, const std::string& compute);

}  // namespace peerserve

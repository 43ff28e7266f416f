// KvHandoffReceiver: the decode instance's end of the direct KV hand-off (paper 000 §4.3.3).
// The decode instance reserves KV blocks for a prompt's missing blocks (Scheduler::
// reserve_blocks), opens a transfer naming them, and asks a prefill instance to compute the
// prompt and push the blocks to this receiver's block-stream port (a BlockStreamServer with
// this backend). Each pushed block is read from the socket straight into its reserved KV
// block — no staging buffer, no engine-thread copy.
//
// A transfer is named by a fresh tenant ("handoff-" and 128 random bits), so a push can only
// land in the transfer it was meant for and a peer cannot guess another transfer's name;
// blocks are matched by hash within it. Two-phase:
// a block counts only once all its bytes arrived (a prefill instance dying mid-block leaves
// it not received), and close() returns only when nobody writes into the transfer's blocks
// any more, so the caller may then publish the received ones and free the rest.
//
// Thread-safety: everything from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_stream_backend.h"
#include "kv/prefix_hash.h"

namespace peerserve {

struct KvHandoffCounters {
  int64_t transfers = 0;           // opened
  int64_t transfers_complete = 0;  // every block received by close()
  int64_t blocks_received = 0;
  int64_t bytes_received = 0;
  int64_t blocks_refused = 0;  // unknown transfer or block, wrong size, sent twice
  int64_t blocks_broken = 0;   // the connection broke inside the block
};

class KvHandoffReceiver final : public BlockStreamBackend {
 public:
  KvHandoffReceiver();

  // Opens a transfer: block `hashes[i]` is to land in `destinations[i]` (memory that stays
  // valid and untouched by anyone else until close()). Returns its name (the tenant the
  // sender must use).
  std::string open(std::vector<BlockHash> hashes, std::vector<std::span<std::byte>> destinations);
  // Waits until every block of the transfer arrived or `deadline` passed; returns how many
  // leading blocks (in hash order) have arrived.
  size_t wait(const std::string& name, std::chrono::steady_clock::time_point deadline);
  // Ends the transfer: later pushes to it are refused, and a block being received is first
  // waited for (bounded by the server's I/O timeout). Returns the leading blocks received.
  size_t close(const std::string& name);

  KvHandoffCounters counters() const;

  // BlockStreamBackend: gets always miss; puts land in the open transfers' blocks.
  Result<bool> get(const PoolKey& key, const BlockSink& sink) override;
  Result<std::span<std::byte>> begin_put(const PoolKey& key, size_t size,
                                         ScratchVector<std::byte>& scratch) override;
  Status end_put(const PoolKey& key, std::span<const std::byte> bytes, bool complete) override;

 private:
  enum class BlockState : uint8_t { kEmpty, kWriting, kDone };
  struct Transfer {
    std::vector<std::span<std::byte>> destinations;
    std::unordered_map<BlockHash, size_t> index_of;
    std::vector<BlockState> state;
    int writers = 0;
    bool closing = false;
  };
  static size_t leading_done(const Transfer& t);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, Transfer> transfers_;
  std::random_device entropy_;  // guarded by mutex_
  KvHandoffCounters counters_;
};

}  // namespace peerserve

// Executor: runs one StepPlan (the model forward over the planned chunks, then sampling of
// the chunks that end a sequence's known tokens). The engine owns one; tests use fakes and
// the planner a simulated one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "runtime/step_plan.h"

namespace peerserve {

class Executor {
 public:
  virtual ~Executor() = default;
  // Fills one StepResult entry per chunk (a token where chunk.sample). An error fails every
  // sequence of the plan; the KV written by a failed step is never published.
  virtual Result<StepResult> execute(const StepPlan& plan) = 0;

  // Whole KV blocks as bytes, for a caching pool (kv_block_bytes() each; 0 = this executor
  // cannot export or import KV, and the engine then does not use a pool). Called on the
  // engine thread between steps.
  virtual size_t kv_block_bytes() const { return 0; }
  // Tokens per KV block of this executor's cache (0 = unknown). The engine refuses a
  // scheduler whose block size differs: the KV geometry has one source, the executor's cache.
  virtual int64_t kv_block_tokens() const { return 0; }
  virtual Status read_kv_block(int32_t /*block*/, std::span<std::byte> /*out*/) const {
    return unimplemented("this executor cannot export KV blocks");
  }
  virtual Status write_kv_block(int32_t /*block*/, std::span<const std::byte> /*bytes*/) {
    return unimplemented("this executor cannot import KV blocks");
  }
  // The memory of a whole KV block (kv_block_bytes()), for KV that another thread writes in
  // place while the block is reserved (a decode instance's hand-off receiver); empty when
  // this executor cannot give it out. Asked on the engine thread; the memory stays put.
  virtual std::span<std::byte> kv_block_memory(int32_t /*block*/) { return {}; }
};

}  // namespace peerserve

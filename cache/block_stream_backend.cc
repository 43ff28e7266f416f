#include "cache/block_stream_backend.h"

#include "cache/tiered_block_store.h"

namespace peerserve {
namespace {

class TieredBackend final : public BlockStreamBackend {
 public:
  explicit TieredBackend(std::shared_ptr<TieredBlockStore> store) : store_(std::move(store)) {}

  Result<bool> get(const PoolKey& key, const BlockSink& sink) override {
    return store_->get(key, sink);
  }
  Result<std::span<std::byte>> begin_put(const PoolKey&, size_t size,
                                         ScratchVector<std::byte>& scratch) override {
    scratch.resize(size);
    return std::span<std::byte>(scratch);
  }
  Status end_put(const PoolKey& key, std::span<const std::byte> bytes, bool complete) override {
    return complete ? store_->put(key, bytes) : ok_status();
  }

 private:
  std::shared_ptr<TieredBlockStore> store_;
};

}  // namespace

std::shared_ptr<BlockStreamBackend> tiered_block_stream_backend(
    std::shared_ptr<TieredBlockStore> store) {
  return std::make_shared<TieredBackend>(std::move(store));
}

}  // namespace peerserve

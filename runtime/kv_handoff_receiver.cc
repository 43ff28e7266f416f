#include "runtime/kv_handoff_receiver.h"

#include <cstdio>
#include <random>

namespace peerserve {
namespace {

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

KvHandoffReceiver::KvHandoffReceiver() = default;

std::string KvHandoffReceiver::open(std::vector<BlockHash> hashes,
                                    std::vector<std::span<std::byte>> destinations) {
  Transfer t;
  for (size_t i = 0; i < hashes.size() && i < destinations.size(); ++i) {
    t.index_of.emplace(hashes[i], i);  // a repeated hash keeps its first place
  }
  t.destinations = std::move(destinations);
  t.state.assign(t.destinations.size(), BlockState::kEmpty);
  std::lock_guard<std::mutex> lock(mutex_);
  // 128 bits from the system's random source: a peer that saw transfer names cannot guess
  // the next one.
  auto draw = [&] { return (static_cast<uint64_t>(entropy_()) << 32) | entropy_(); };
  const uint64_t high = draw();
  std::string name = "handoff-" + hex64(high) + hex64(draw());
  transfers_.emplace(name, std::move(t));
  ++counters_.transfers;
  return name;
}

size_t KvHandoffReceiver::leading_done(const Transfer& t) {
  size_t n = 0;
  while (n < t.state.size() && t.state[n] == BlockState::kDone) ++n;
  return n;
}

size_t KvHandoffReceiver::wait(const std::string& name,
                               std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = transfers_.find(name);
  if (it == transfers_.end()) return 0;
  Transfer& t = it->second;
  changed_.wait_until(lock, deadline, [&] { return leading_done(t) == t.state.size(); });
  return leading_done(t);
}

size_t KvHandoffReceiver::close(const std::string& name) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = transfers_.find(name);
  if (it == transfers_.end()) return 0;
  Transfer& t = it->second;
  t.closing = true;
  // A block being received is still written into: its memory must not change hands yet.
  changed_.wait(lock, [&] { return t.writers == 0; });
  const size_t done = leading_done(t);
  if (done == t.state.size()) ++counters_.transfers_complete;
  transfers_.erase(it);
  return done;
}

KvHandoffCounters KvHandoffReceiver::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

Result<bool> KvHandoffReceiver::get(const PoolKey&, const BlockSink&) {
  return false;
}

Result<std::span<std::byte>> KvHandoffReceiver::begin_put(const PoolKey& key, size_t size,
                                                          ScratchVector<std::byte>&) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = transfers_.find(key.tenant);
  if (it == transfers_.end() || it->second.closing) {
    ++counters_.blocks_refused;
    return not_found("KV hand-off '" + key.tenant +
                     "' is not open here (it timed out, was cancelled or never existed)");
  }
  Transfer& t = it->second;
  auto at = t.index_of.find(key.hash);
  if (at == t.index_of.end()) {
    ++counters_.blocks_refused;
    return not_found("KV hand-off '" + key.tenant + "' expects no block " + to_string(key));
  }
  const size_t i = at->second;
  if (size != t.destinations[i].size()) {
    ++counters_.blocks_refused;
    return invalid_argument("KV hand-off block " + to_string(key) + " is " + std::to_string(size) +
                            " bytes; this instance's KV blocks are " +
                            std::to_string(t.destinations[i].size()));
  }
  if (t.state[i] != BlockState::kEmpty) {
    ++counters_.blocks_refused;
    return invalid_argument("KV hand-off block " + to_string(key) + " was already sent");
  }
  t.state[i] = BlockState::kWriting;
  ++t.writers;
  return t.destinations[i];
}

Status KvHandoffReceiver::end_put(const PoolKey& key, std::span<const std::byte> bytes,
                                  bool complete) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = transfers_.find(key.tenant);
    // begin_put() succeeded, so the transfer is open: close() waits for this writer.
    Transfer& t = it->second;
    const size_t i = t.index_of.at(key.hash);
    t.state[i] = complete ? BlockState::kDone : BlockState::kEmpty;
    --t.writers;
    if (complete) {
      ++counters_.blocks_received;
      counters_.bytes_received += static_cast<int64_t>(bytes.size());
    } else {
      ++counters_.blocks_broken;
    }
  }
  changed_.notify_all();
  return ok_status();
}

}  // namespace peerserve

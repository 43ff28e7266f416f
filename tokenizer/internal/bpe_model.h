// The BPE model of tokenizer.json ("model": {"type": "BPE"}), working on raw bytes: the
// vocabulary's byte-level strings are mapped back to bytes at load time. Merges are
// applied lowest rank first (leftmost first among equal pairs), as Hugging Face's
// Word::merge_all does. Encoded words are kept in a bounded cache shared by all threads.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve {

class BpeModel {
 public:
  // `config` is tokenizer.json's "model"; `byte_level` says whether its vocabulary is
  // written in the byte-level alphabet (a ByteLevel pre-tokenizer or decoder is present).
  // Every id must be below `id_limit` (tables are indexed by id).
  static Result<BpeModel> from_json(const nlohmann::json& config, bool byte_level,
                                    int64_t id_limit);

  BpeModel(BpeModel&& other) noexcept;
  BpeModel& operator=(BpeModel&& other) noexcept;

  // Appends the ids of one pre-tokenized piece. Bytes with no token are skipped, unless
  // the model has an unk_token, which then stands for them.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  // id -> (raw bytes, vocabulary string); ids not in the model vocabulary give empty.
  int32_t max_id() const { return max_id_; }
  bool has_id(int32_t id) const;
  const std::string& id_bytes(int32_t id) const { return id_bytes_[static_cast<size_t>(id)]; }
  const std::string& id_text(int32_t id) const { return id_text_[static_cast<size_t>(id)]; }
  // Lookup by vocabulary string.
  const std::unordered_map<std::string, int32_t>& text_to_id() const { return text_to_id_; }

 private:
  BpeModel() = default;
  void merge(std::string_view word, std::vector<int32_t>& ids) const;

  struct MergeResult {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> text_to_id_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  std::vector<std::string> id_bytes_;
  std::vector<std::string> id_text_;
  std::vector<uint8_t> id_present_;
  std::unordered_map<uint64_t, MergeResult> merges_;
  int32_t byte_ids_[256];
  int32_t unk_id_ = -1;
  int32_t max_id_ = -1;
  bool ignore_merges_ = false;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace peerserve

#include "tokenizer/internal/bpe_model.h"

#include <algorithm>
#include <queue>

#include "tokenizer/internal/byte_level.h"
#include "tokenizer/internal/utf8.h"

namespace peerserve {
namespace {

// Words longer than this are not cached (they are rare and would crowd the cache).
constexpr size_t kMaxCachedWordBytes = 256;
// The cache is cleared when it reaches this many words (bounded memory, no LRU upkeep).
constexpr size_t kMaxCachedWords = 1 << 17;

Result<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& merge, size_t index) {
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      return invalid_argument("model.merges[" + std::to_string(index) + "] = '" + text +
                              "': expected two tokens separated by one space");
    }
    return std::make_pair(text.substr(0, space), text.substr(space + 1));
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::make_pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  return invalid_argument("model.merges[" + std::to_string(index) +
                          "]: expected \"a b\" or [\"a\", \"b\"], got " + merge.dump());
}

}  // namespace

BpeModel::BpeModel(BpeModel&& other) noexcept
    : text_to_id_(std::move(other.text_to_id_)),
      bytes_to_id_(std::move(other.bytes_to_id_)),
      id_bytes_(std::move(other.id_bytes_)),
      id_text_(std::move(other.id_text_)),
      id_present_(std::move(other.id_present_)),
      merges_(std::move(other.merges_)),
      unk_id_(other.unk_id_),
      max_id_(other.max_id_),
      ignore_merges_(other.ignore_merges_) {
  std::copy(std::begin(other.byte_ids_), std::end(other.byte_ids_), byte_ids_);
}

BpeModel& BpeModel::operator=(BpeModel&& other) noexcept {
  text_to_id_ = std::move(other.text_to_id_);
  bytes_to_id_ = std::move(other.bytes_to_id_);
  id_bytes_ = std::move(other.id_bytes_);
  id_text_ = std::move(other.id_text_);
  id_present_ = std::move(other.id_present_);
  merges_ = std::move(other.merges_);
  std::copy(std::begin(other.byte_ids_), std::end(other.byte_ids_), byte_ids_);
  unk_id_ = other.unk_id_;
  max_id_ = other.max_id_;
  ignore_merges_ = other.ignore_merges_;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.clear();
  return *this;
}

Result<BpeModel> BpeModel::from_json(const nlohmann::json& config, bool byte_level,
                                     int64_t id_limit) {
  if (!config.is_object()) return invalid_argument("tokenizer.json: 'model' must be an object");
  const std::string type = config.value("type", std::string("BPE"));
  if (type != "BPE") {
    return unimplemented("tokenizer.json: model type '" + type +
                         "' is not supported (supported: BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = config.find(key);
    if (it != config.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return unimplemented(std::string("tokenizer.json: model.") + key + " = " + it->dump() +
                           " is not supported (expected null)");
    }
  }
  if (const auto it = config.find("dropout");
      it != config.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
    return unimplemented("tokenizer.json: model.dropout = " + it->dump() +
                         " is not supported (BPE dropout is for training; expected null)");
  }
  if (const auto it = config.find("byte_fallback");
      it != config.end() && it->is_boolean() && it->get<bool>()) {
    return unimplemented("tokenizer.json: model.byte_fallback = true is not supported");
  }

  BpeModel model;
  const auto vocab = config.find("vocab");
  if (vocab == config.end() || !vocab->is_object() || vocab->empty()) {
    return invalid_argument("tokenizer.json: model.vocab must be a non-empty object");
  }
  for (const auto& [text, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX / 2) {
      return invalid_argument("tokenizer.json: model.vocab['" + text + "'] = " + id_json.dump() +
                              ", expected a non-negative integer id");
    }
    if (id_json.get<int64_t>() >= id_limit) {
      return invalid_argument(
          "tokenizer.json: model.vocab['" + text + "'] = " + id_json.dump() +
          " is out of range: ids must be below " + std::to_string(id_limit) +
          " (twice the number of tokens in model.vocab and added_tokens, plus 1024)");
    }
    model.max_id_ = std::max(model.max_id_, static_cast<int32_t>(id_json.get<int64_t>()));
  }
  const size_t n = static_cast<size_t>(model.max_id_) + 1;
  model.id_bytes_.resize(n);
  model.id_text_.resize(n);
  model.id_present_.assign(n, 0);
  for (const auto& [text, id_json] : vocab->items()) {
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (model.id_present_[id]) {
      return invalid_argument("tokenizer.json: model.vocab has two tokens with id " +
                              std::to_string(id));
    }
    std::string bytes = text;
    if (byte_level) {
      // Tokens outside the byte-level alphabet keep their UTF-8 bytes, as Hugging Face's
      // ByteLevel decoder does.
      if (auto decoded = byte_level::decode_token_text(text)) bytes = std::move(*decoded);
    }
    model.id_present_[id] = 1;
    model.id_text_[id] = text;
    model.bytes_to_id_.emplace(bytes, id);
    model.id_bytes_[id] = std::move(bytes);
    model.text_to_id_.emplace(text, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = model.bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    model.byte_ids_[b] = it == model.bytes_to_id_.end() ? -1 : it->second;
  }
  if (const auto it = config.find("unk_token"); it != config.end() && it->is_string()) {
    const auto unk = model.text_to_id_.find(it->get<std::string>());
    if (unk == model.text_to_id_.end()) {
      return invalid_argument("tokenizer.json: model.unk_token '" + it->get<std::string>() +
                              "' is not in the vocabulary");
    }
    model.unk_id_ = unk->second;
  }
  if (const auto it = config.find("ignore_merges"); it != config.end() && it->is_boolean()) {
    model.ignore_merges_ = it->get<bool>();
  }

  const auto merges = config.find("merges");
  if (merges == config.end() || !merges->is_array()) {
    return invalid_argument("tokenizer.json: model.merges must be an array");
  }
  model.merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    PS_ASSIGN_OR_RETURN(auto pair, parse_merge((*merges)[rank], rank));
    const auto a = model.text_to_id_.find(pair.first);
    const auto b = model.text_to_id_.find(pair.second);
    const auto merged = model.text_to_id_.find(pair.first + pair.second);
    if (a == model.text_to_id_.end() || b == model.text_to_id_.end() ||
        merged == model.text_to_id_.end()) {
      return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) + "] = '" +
                              pair.first + " " + pair.second +
                              "' uses a token that is not in the vocabulary");
    }
    // A repeated pair keeps its first (lowest) rank, as Hugging Face does.
    model.merges_.emplace(pair_key(a->second, b->second),
                          MergeResult{static_cast<int32_t>(rank), merged->second});
  }
  return model;
}

bool BpeModel::has_id(int32_t id) const {
  return id >= 0 && id <= max_id_ && id_present_[static_cast<size_t>(id)];
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (word.size() <= kMaxCachedWordBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids;
  merge(word, word_ids);
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (word.size() <= kMaxCachedWordBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedWords) cache_.clear();
    cache_.emplace(std::string(word), std::move(word_ids));
  }
}

void BpeModel::merge(std::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    const auto it = bytes_to_id_.find(std::string(word));
    if (it != bytes_to_id_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // Symbols as a doubly linked list over the word's bytes.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t length;  // bytes covered; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_ids_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      if (unk_id_ < 0) continue;  // Hugging Face drops characters without a token
      id = unk_id_;
    }
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id;
    int32_t right_id;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.pos];
    // Skip candidates made stale by an earlier merge.
    if (left.length == 0 || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.new_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace peerserve

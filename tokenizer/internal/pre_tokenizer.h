// The pre-tokenizer of tokenizer.json: cuts normalized text into the pieces ("words") that
// BPE encodes independently. Supported components: Sequence, Split (Regex or String
// pattern, every SplitDelimiterBehavior, invert) and ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern). ByteLevel's byte-to-character mapping itself is not
// applied here: the BPE model works on raw bytes, which is equivalent.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/internal/regex.h"

namespace peerserve {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `config` is tokenizer.json's "pre_tokenizer" (null means: the whole text is one piece).
  static Result<PreTokenizer> from_json(const nlohmann::json& config);

  // Replaces `pieces` with the pre-tokenized pieces of `text` (empty pieces dropped).
  // REQUIRES: text is valid UTF-8.
  Status split(std::string_view text, std::vector<std::string>& pieces) const;

  // Whether ByteLevel is part of the pipeline (then the vocabulary is byte-level).
  bool has_byte_level() const { return has_byte_level_; }

 private:
  struct Step {
    enum class Kind { kSplit, kPrefixSpace } kind = Kind::kSplit;
    std::shared_ptr<const Regex> regex;  // kSplit
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  static Status add_component(const nlohmann::json& config, std::vector<Step>& steps,
                              bool& has_byte_level);
  Status apply(const Step& step, std::vector<std::string>& pieces) const;

  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace peerserve

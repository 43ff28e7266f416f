#include "tokenizer/incremental_detokenizer.h"

#include "tokenizer/internal/utf8.h"

namespace peerserve {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

Result<std::string> IncrementalDetokenizer::push(TokenId id) {
  if (!tokenizer_->has_token(id)) {
    return invalid_argument("detokenize: token id " + std::to_string(id) +
                            " is not in the vocabulary (ids are 0.." +
                            std::to_string(tokenizer_->vocab_size() - 1) + ")");
  }
  if (options_.skip_special_tokens && tokenizer_->is_special(id)) return std::string();
  pending_.append(tokenizer_->token_bytes(id));
  // Emit every sequence that is decided: valid characters as they are, invalid maximal
  // subparts as U+FFFD (the decision never depends on later bytes); keep an incomplete
  // tail, which later bytes may still complete.
  std::string out;
  const std::string_view bytes = pending_;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const utf8::Sequence seq = utf8::next_sequence(bytes.substr(pos));
    if (seq.kind == utf8::SequenceKind::kIncomplete) break;
    if (seq.kind == utf8::SequenceKind::kValid) {
      out.append(bytes.substr(pos, seq.length));
    } else {
      out.append(utf8::kReplacementCharacter);
    }
    pos += seq.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(utf8::kReplacementCharacter);
  pending_.clear();
  return out;
}

}  // namespace peerserve

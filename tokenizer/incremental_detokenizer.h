// IncrementalDetokenizer: turns a stream of generated token ids into a stream of text
// that is always valid UTF-8.
//
// A byte-level BPE token may end in the middle of a UTF-8 character; the bytes of an
// unfinished character are held back until the character completes. Bytes that can no
// longer become valid UTF-8 are emitted as U+FFFD at once, and finish() turns a trailing
// unfinished character into U+FFFD. The concatenation of every push() result and finish()
// is byte-for-byte Tokenizer::decode() of all the ids with the same DecodeOptions.
//
// One instance per request; not thread-safe. The Tokenizer must outlive it.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // Adds one token; returns the text that became final (possibly empty). Fails, and
  // changes nothing, if the id names no token.
  Result<std::string> push(TokenId id);

  // Ends the stream: returns the held-back bytes as U+FFFD (empty if none) and resets.
  std::string finish();

  // Bytes held back: a prefix of a UTF-8 character that may still complete (0..3 bytes).
  std::string_view pending_bytes() const { return pending_; }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;
};

}  // namespace peerserve

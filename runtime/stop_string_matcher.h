// StopStringMatcher: finds stop strings in streamed text, even when a stop string is split
// across several tokens ("Hel" + "lo" matching "Hello").
//
// Text that could still be the start of a stop string is held back until it either
// completes a match (then it is dropped, or emitted with include_stop) or can no longer
// match (then it is emitted). So the emitted stream never contains a stop string and is,
// in the end, the full text cut just before the first stop string to complete (the same
// whichever way the text was split into pieces).
//
// Input text must be valid UTF-8 (the incremental detokenizer guarantees it) and stop
// strings non-empty valid UTF-8; then held-back text always starts on a character
// boundary, so emitted pieces stay valid UTF-8.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace peerserve {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  // Empty strings in `stops` are ignored.
  StopStringMatcher(std::vector<std::string> stops, bool include_stop);

  struct Step {
    std::string text;                    // safe to emit now
    std::optional<std::string> matched;  // set when a stop string was found
  };
  // Feeds the next piece of text. After a match, further pushes are not expected.
  Step push(std::string_view text);
  // Feeds text that may begin a stop string but cannot end one: the text of the first
  // min_tokens tokens, where vLLM does not look for stop strings but lets one that ends
  // later start there. Never matches.
  Step push_context(std::string_view text);
  // The held-back text at the end of the stream (no match happened).
  std::string flush();

  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  size_t max_stop_len_ = 0;
  std::string held_;
  // How many bytes at the start of held_ came through push_context: no stop string may end
  // within them.
  size_t held_context_ = 0;

  // Moves the longest suffix of `buffer` that is a proper prefix of a stop string to held_
  // (of which the first `context` bytes of `buffer` stay context) and returns the rest.
  std::string hold_back(std::string buffer, size_t context);
};

}  // namespace peerserve

// libFuzzer target: arbitrary bytes through the shipped model's tokenizer. Encoding then
// decoding valid UTF-8 must give the text back (byte-level BPE is lossless; invalid UTF-8
// becomes U+FFFD first). The same bytes read as token ids must decode or fail cleanly,
// whole and streamed one id at a time.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/internal/utf8.h"
#include "tokenizer/tokenizer.h"

namespace {

const peerserve::Tokenizer* shipped_tokenizer() {
  static const std::unique_ptr<peerserve::Tokenizer> tokenizer = [] {
    auto loaded =
        peerserve::Tokenizer::load_from_dir(PEERSERVE_SOURCE_DIR "/models/peerserve-dsv3-tiny");
    if (!loaded.ok()) __builtin_trap();
    return std::make_unique<peerserve::Tokenizer>(std::move(loaded).value());
  }();
  return tokenizer.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const peerserve::Tokenizer& tokenizer = *shipped_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Plain text (added tokens not matched) round-trips exactly once made valid UTF-8.
  auto ids = tokenizer.encode(text, {.add_special_tokens = false, .match_added_tokens = false});
  if (!ids.ok()) __builtin_trap();
  auto decoded = tokenizer.decode(*ids);
  if (!decoded.ok()) __builtin_trap();
  const std::string valid = peerserve::utf8::make_valid(text);
  if (*decoded != valid) __builtin_trap();
  auto with_specials = tokenizer.encode(text);
  (void)with_specials;

  // The bytes as little-endian int32 ids, possibly negative or out of range.
  std::vector<peerserve::TokenId> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  auto whole = tokenizer.decode(raw);
  peerserve::IncrementalDetokenizer stream(tokenizer);
  std::string streamed;
  bool all_ok = true;
  for (const peerserve::TokenId id : raw) {
    auto piece = stream.push(id);
    if (!piece.ok()) {
      all_ok = false;
      break;
    }
    streamed += *piece;
  }
  if (all_ok) {
    streamed += stream.finish();
    if (!whole.ok() || *whole != streamed) __builtin_trap();
  }
  return 0;
}

#include "tokenizer/internal/utf8.h"

namespace peerserve::utf8 {
namespace {

// Allowed range of the second byte for each lead byte (Unicode Table 3-7); later
// continuation bytes are always 80..BF.
struct LeadInfo {
  int length;  // 0: cannot start a sequence
  uint8_t second_low;
  uint8_t second_high;
};

LeadInfo lead_info(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead < 0xC2) return {0, 0, 0};
  if (lead < 0xE0) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead < 0xF0) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead < 0xF4) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Sequence next_sequence(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const LeadInfo info = lead_info(byte(0));
  if (info.length == 0) return {SequenceKind::kInvalid, 1};
  for (int i = 1; i < info.length; ++i) {
    if (static_cast<size_t>(i) >= text.size()) return {SequenceKind::kIncomplete, text.size()};
    const uint8_t low = i == 1 ? info.second_low : 0x80;
    const uint8_t high = i == 1 ? info.second_high : 0xBF;
    if (byte(i) < low || byte(i) > high) return {SequenceKind::kInvalid, static_cast<size_t>(i)};
  }
  return {SequenceKind::kValid, static_cast<size_t>(info.length)};
}

std::string make_valid(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = next_sequence(text.substr(pos));
    if (seq.kind == SequenceKind::kValid) {
      out.append(text.substr(pos, seq.length));
    } else {
      out.append(kReplacementCharacter);
    }
    pos += seq.length;
  }
  return out;
}

bool is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = next_sequence(text.substr(pos));
    if (seq.kind != SequenceKind::kValid) return false;
    pos += seq.length;
  }
  return true;
}

char32_t decode_valid(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[i])); };
  switch (s.size()) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace peerserve::utf8

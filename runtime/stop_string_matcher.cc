#include "runtime/stop_string_matcher.h"

#include <algorithm>

namespace peerserve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    max_stop_len_ = std::max(max_stop_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Step StopStringMatcher::push(std::string_view text) {
  Step step;
  if (stops_.empty()) {
    step.text.assign(text);
    return step;
  }
  const size_t context = held_context_;
  std::string buffer = std::move(held_);
  held_.clear();
  held_context_ = 0;
  buffer.append(text);

  // The match that completes first wins (as if the text arrived one byte at a time, so the
  // result does not depend on how the text was split); among those, the longest. A match
  // must end after the context.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t from = context >= stop.size() ? context - stop.size() + 1 : 0;
    const size_t pos = buffer.find(stop, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      best = &stop;
    }
  }
  if (best != nullptr) {
    step.text = buffer.substr(0, best_pos);
    if (include_stop_) step.text += *best;
    step.matched = *best;
    return step;
  }
  step.text = hold_back(std::move(buffer), context);
  return step;
}

StopStringMatcher::Step StopStringMatcher::push_context(std::string_view text) {
  Step step;
  if (stops_.empty()) {
    step.text.assign(text);
    return step;
  }
  std::string buffer = std::move(held_);
  held_.clear();
  buffer.append(text);
  const size_t context = buffer.size();
  step.text = hold_back(std::move(buffer), context);
  return step;
}

std::string StopStringMatcher::hold_back(std::string buffer, size_t context) {
  size_t hold = 0;
  for (size_t k = std::min(buffer.size(), max_stop_len_ - 1); k > 0; --k) {
    std::string_view suffix(buffer.data() + buffer.size() - k, k);
    const bool is_prefix = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) {
      return s.size() > k && std::string_view(s).substr(0, k) == suffix;
    });
    if (is_prefix) {
      hold = k;
      break;
    }
  }
  const size_t kept = buffer.size() - hold;
  held_ = buffer.substr(kept);
  held_context_ = context > kept ? context - kept : 0;
  buffer.resize(kept);
  return buffer;
}

std::string StopStringMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  held_context_ = 0;
  return out;
}

}  // namespace peerserve

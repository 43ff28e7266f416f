#include "tokenizer/internal/pre_tokenizer.h"

#include <memory>
#include <utility>

namespace peerserve {
namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Result<SplitBehavior> parse_behavior(const nlohmann::json& value) {
  const std::string name = value.is_string() ? value.get<std::string>() : value.dump();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return unimplemented("pre_tokenizer Split: behavior '" + name +
                       "' is not supported (expected Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext or Contiguous)");
}

bool json_bool(const nlohmann::json& object, const char* key, bool fallback) {
  const auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

// Hugging Face's NormalizedString::split: the segments that a behavior keeps.
std::vector<Segment> apply_behavior(std::vector<Segment> segments, SplitBehavior behavior) {
  std::vector<Segment> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return segments;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
  }
  return segments;
}

}  // namespace

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& config) {
  PreTokenizer result;
  if (!config.is_null()) {
    PS_RETURN_IF_ERROR(add_component(config, result.steps_, result.has_byte_level_));
  }
  return result;
}

Status PreTokenizer::add_component(const nlohmann::json& config, std::vector<Step>& steps,
                                   bool& has_byte_level) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return invalid_argument("pre_tokenizer: expected an object with a string 'type', got " +
                            config.dump().substr(0, 200));
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = config.find("pretokenizers");
    if (it == config.end() || !it->is_array()) {
      return invalid_argument("pre_tokenizer Sequence: expected an array 'pretokenizers'");
    }
    for (const auto& child : *it) PS_RETURN_IF_ERROR(add_component(child, steps, has_byte_level));
    return ok_status();
  }
  if (type == "Split") {
    const auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object()) {
      return invalid_argument("pre_tokenizer Split: expected an object 'pattern'");
    }
    bool literal = false;
    std::string source;
    if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      source = (*pattern)["Regex"].get<std::string>();
    } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
      source = (*pattern)["String"].get<std::string>();
      literal = true;
    } else {
      return invalid_argument("pre_tokenizer Split: 'pattern' needs 'Regex' or 'String', got " +
                              pattern->dump().substr(0, 200));
    }
    auto regex = Regex::compile(source, literal);
    if (!regex.ok()) return regex.status().with_context("pre_tokenizer Split");
    Step step;
    step.kind = Step::Kind::kSplit;
    step.regex = std::make_shared<const Regex>(std::move(regex).value());
    PS_ASSIGN_OR_RETURN(step.behavior, parse_behavior(config.value("behavior", nlohmann::json())));
    step.invert = json_bool(config, "invert", false);
    steps.push_back(std::move(step));
    return ok_status();
  }
  if (type == "ByteLevel") {
    has_byte_level = true;
    if (json_bool(config, "add_prefix_space", false)) {
      Step step;
      step.kind = Step::Kind::kPrefixSpace;
      steps.push_back(std::move(step));
    }
    if (json_bool(config, "use_regex", true)) {
      auto regex = Regex::compile(kGpt2Pattern);
      if (!regex.ok()) return regex.status().with_context("pre_tokenizer ByteLevel");
      Step step;
      step.kind = Step::Kind::kSplit;
      step.regex = std::make_shared<const Regex>(std::move(regex).value());
      step.behavior = SplitBehavior::kIsolated;
      steps.push_back(std::move(step));
    }
    return ok_status();
  }
  return unimplemented("tokenizer.json: pre_tokenizer type '" + type +
                       "' is not supported (supported: Sequence, Split, ByteLevel)");
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (!text.empty()) pieces.emplace_back(text);
  for (const Step& step : steps_) PS_RETURN_IF_ERROR(apply(step, pieces));
  return ok_status();
}

Status PreTokenizer::apply(const Step& step, std::vector<std::string>& pieces) const {
  if (step.kind == Step::Kind::kPrefixSpace) {
    for (std::string& piece : pieces) {
      if (piece.empty() || piece[0] != ' ') piece.insert(piece.begin(), ' ');
    }
    return ok_status();
  }
  std::vector<std::string> out;
  out.reserve(pieces.size() * 2);
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Segment> segments;
  for (const std::string& piece : pieces) {
    matches.clear();
    PS_RETURN_IF_ERROR(step.regex->find_all(piece, matches));
    segments.clear();
    size_t cursor = 0;
    for (const auto& [start, end] : matches) {
      if (start > cursor) segments.push_back({cursor, start, step.invert});
      segments.push_back({start, end, !step.invert});
      cursor = end;
    }
    if (cursor < piece.size()) segments.push_back({cursor, piece.size(), step.invert});
    for (const Segment& s : apply_behavior(std::move(segments), step.behavior)) {
      if (s.end > s.start) out.emplace_back(piece, s.start, s.end - s.start);
    }
    segments.clear();
  }
  pieces = std::move(out);
  return ok_status();
}

}  // namespace peerserve

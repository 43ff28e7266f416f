#include "serve/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/json_nesting.h"
#include "base/regular_file.h"

namespace peerserve {
namespace {

using json = nlohmann::json;

// Real files are a few hundred bytes.
constexpr std::uintmax_t kMaxFileBytes = 1 << 20;
constexpr size_t kMaxDepth = 16;

}  // namespace

std::string GenerationDefaults::describe() const {
  std::ostringstream out;
  const char* separator = "";
  const auto add = [&](const char* name, const auto& value) {
    if (!value) return;
    out << separator << name << "=" << *value;
    separator = ", ";
  };
  add("temperature", temperature);
  add("top_p", top_p);
  add("top_k", top_k);
  add("min_p", min_p);
  add("repetition_penalty", repetition_penalty);
  if (!eos_token_ids.empty()) {
    out << separator << "eos_token_id=[";
    for (size_t i = 0; i < eos_token_ids.size(); ++i) out << (i ? "," : "") << eos_token_ids[i];
    out << "]";
  }
  return out.str();
}

Result<GenerationDefaults> parse_generation_defaults(const std::string& source,
                                                     const std::string& source_name) {
  const json root = json::parse(source, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return invalid_argument(source_name + ": expected a JSON object");
  }
  PS_RETURN_IF_ERROR(check_json_nesting(root, kMaxDepth, source_name));
  GenerationDefaults d;
  const auto number = [&](const char* key, std::optional<float>* out) -> Status {
    const auto it = root.find(key);
    if (it == root.end() || it->is_null()) return ok_status();
    if (!it->is_number()) {
      return invalid_argument(source_name + ": '" + key + "' must be a number, got " +
                              std::string(it->type_name()));
    }
    *out = it->get<float>();
    return ok_status();
  };
  PS_RETURN_IF_ERROR(number("temperature", &d.temperature));
  PS_RETURN_IF_ERROR(number("top_p", &d.top_p));
  PS_RETURN_IF_ERROR(number("min_p", &d.min_p));
  PS_RETURN_IF_ERROR(number("repetition_penalty", &d.repetition_penalty));
  if (const auto it = root.find("top_k"); it != root.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < -1 || it->get<int64_t>() > (1 << 30)) {
      return invalid_argument(source_name + ": 'top_k' must be an integer >= -1, got " +
                              it->dump());
    }
    // transformers' default top_k: dropped as vLLM's to_diff_dict drops it.
    if (it->get<int64_t>() != 50) d.top_k = static_cast<int32_t>(it->get<int64_t>());
  }
  if (const auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    const json list = it->is_array() ? *it : json::array({*it});
    if (list.empty() || list.size() > 64) {
      return invalid_argument(source_name + ": 'eos_token_id' must be an id or 1 to 64 ids");
    }
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return invalid_argument(source_name + ": 'eos_token_id' entries must be token ids, got " +
                                id.dump());
      }
      d.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  // The same ranges as a request's (the message names the field).
  SamplingParams check;
  d.apply_to(check);
  if (Status s = check.validate(); !s.ok()) return s.with_context(source_name);
  return d;
}

Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  Result<std::string> text = read_regular_file(path, kMaxFileBytes);
  if (text.status().code() == StatusCode::kNotFound) return GenerationDefaults{};
  if (!text.ok()) return text.status();
  return parse_generation_defaults(*text, path.string());
}

}  // namespace peerserve

// The sampling defaults a checkpoint recommends in its generation_config.json, applied to
// the requests that leave those fields out, as vLLM does under --generation-config auto (its
// default): temperature, top_p, top_k, min_p and repetition_penalty; its eos_token_id ids end
// generation besides config.json's. As vLLM reads the file (transformers' to_diff_dict), a
// value equal to transformers' own default is not a recommendation (top_k 50). Not read:
// do_sample (vLLM ignores it too) and max_new_tokens.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/sampler.h"

namespace peerserve {

struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::vector<int64_t> eos_token_ids;  // besides config.json's; the caller checks the vocabulary

  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty &&
           eos_token_ids.empty();
  }
  // The fields set over `params` (inline: the request parser needs no more than this).
  void apply_to(SamplingParams& params) const {
    if (temperature) params.temperature = *temperature;
    if (top_p) params.top_p = *top_p;
    if (top_k) params.top_k = *top_k;
    if (min_p) params.min_p = *min_p;
    if (repetition_penalty) params.repetition_penalty = *repetition_penalty;
  }
  // "temperature=0.6, top_p=0.95, eos_token_id=[1]" (for the log line).
  std::string describe() const;
};

// Reads `source` (the text of a generation_config.json, named `source_name` in errors).
// Values outside the request ranges (temperature >= 0, top_p in (0, 1], ...) are an
// InvalidArgument naming the key and the file.
Result<GenerationDefaults> parse_generation_defaults(const std::string& source,
                                                     const std::string& source_name);

// `model_dir`/generation_config.json; none when the file is absent.
Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir);

}  // namespace peerserve

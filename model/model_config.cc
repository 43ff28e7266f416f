#include "model/model_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/json_nesting.h"
#include "base/regular_file.h"
#include "model/checkpoint/tensor_layout.h"
#include "model/rotary_embedding.h"

namespace peerserve {
namespace {

// Real configs nest a few levels (rope_scaling, quantization_config's groups).
constexpr size_t kMaxConfigJsonDepth = 64;
// RoPE bases in use are 1e4 (DeepSeek) to ~1e8: a generous bound.
constexpr double kMaxRopeTheta = 1e12;

using nlohmann::json;

// Reads typed fields from the config object; every error names the field and what was
// expected, prefixed with the source file.
class FieldReader {
 public:
  FieldReader(const json& object, std::string source)
      : object_(object), source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  bool has(const char* key) const { return object_.contains(key); }
  bool is_null(const char* key) const { return !has(key) || object_.at(key).is_null(); }

  Status error(const std::string& field, const json& value, const std::string& expected) const {
    return invalid_argument(source_ + ": field '" + field + "' = " + truncated_dump(value) +
                            ", expected " + expected);
  }
  Status unsupported(const std::string& field, const json& value,
                     const std::string& supported) const {
    return unimplemented(source_ + ": field '" + field + "' = " + truncated_dump(value) +
                         " is not supported (supported: " + supported + ")");
  }
  Status missing(const std::string& field, const std::string& expected) const {
    return invalid_argument(source_ + ": missing field '" + field + "', expected " + expected);
  }

  // An integer in [min_value, max_value]; `fallback` when absent (nullopt: required).
  Result<int64_t> integer(const char* key, std::optional<int64_t> fallback, int64_t min_value,
                          int64_t max_value = int64_t{1} << 40) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      return missing(key, "an integer >= " + std::to_string(min_value));
    }
    return integer_value(key, object_.at(key), min_value, max_value);
  }

  Result<int64_t> integer_value(const std::string& field, const json& value, int64_t min_value,
                                int64_t max_value = int64_t{1} << 40) const {
    const std::string expected =
        "an integer in [" + std::to_string(min_value) + ", " + std::to_string(max_value) + "]";
    if (!value.is_number_integer()) return error(field, value, expected);
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max_value)) {
      return error(field, value, expected);
    }
    const int64_t v = value.get<int64_t>();
    if (v < min_value || v > max_value) return error(field, value, expected);
    return v;
  }

  // An integer, or null -> nullopt; absent -> `fallback`.
  Result<std::optional<int64_t>> nullable_integer(const char* key, std::optional<int64_t> fallback,
                                                  int64_t min_value,
                                                  int64_t max_value = int64_t{1} << 40) const {
    if (!has(key)) return fallback;
    if (object_.at(key).is_null()) return std::optional<int64_t>{};
    PS_ASSIGN_OR_RETURN(int64_t v, integer_value(key, object_.at(key), min_value, max_value));
    return std::optional<int64_t>{v};
  }

  Result<double> number(const char* key, std::optional<double> fallback, bool strictly_positive,
                        const json* object = nullptr, const std::string& prefix = "") const {
    const json& o = object ? *object : object_;
    const std::string field = prefix + key;
    if (!o.contains(key)) {
      if (fallback) return *fallback;
      return missing(field, "a number");
    }
    const json& value = o.at(key);
    const std::string expected = strictly_positive ? "a number > 0" : "a number >= 0";
    if (!value.is_number()) return error(field, value, expected);
    const double v = value.get<double>();
    if (!(v >= 0.0) || (strictly_positive && v == 0.0)) return error(field, value, expected);
    return v;
  }

  // A number in (low, high], or [0, high] with low 0 and `zero_allowed`: the fields whose
  // extreme values overflow fp32 arithmetic later (inf or NaN logits from a config that
  // looked valid).
  Result<double> number_in(const char* key, std::optional<double> fallback, double low, double high,
                           const json* object = nullptr, const std::string& prefix = "",
                           bool zero_allowed = false) const {
    const json& o = object ? *object : object_;
    if (!o.contains(key)) {
      if (fallback) return *fallback;
      return missing(prefix + key, "a number");
    }
    const json& value = o.at(key);
    const bool closed = zero_allowed && low == 0.0;
    auto plain = [](double v) {  // 1000000, not 1e+06
      std::ostringstream out;
      out.precision(15);
      out << std::fixed << v;
      std::string text = out.str();
      text.erase(text.find_last_not_of('0') + 1);
      if (text.back() == '.') text.pop_back();
      return text;
    };
    std::ostringstream expected;
    expected << "a number in " << (closed ? "[" : "(") << plain(low) << ", " << plain(high) << "]";
    if (!value.is_number()) return error(prefix + key, value, expected.str());
    const double v = value.get<double>();
    if ((v > low || (closed && v == low)) && v <= high) return v;
    return error(prefix + key, value, expected.str());
  }

  Result<bool> boolean(const char* key, bool fallback) const {
    if (!has(key) || object_.at(key).is_null()) return fallback;
    const json& value = object_.at(key);
    if (!value.is_boolean()) return error(key, value, "true or false");
    return value.get<bool>();
  }

  // A string; `fallback` when absent or null.
  Result<std::string> string(const char* key, const std::string& fallback) const {
    if (!has(key) || object_.at(key).is_null()) return fallback;
    const json& value = object_.at(key);
    if (!value.is_string()) return error(key, value, "a string");
    return value.get<std::string>();
  }

  const json& at(const char* key) const { return object_.at(key); }

 private:
  static std::string truncated_dump(const json& value) {
    std::string text = value.dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return text;
  }

  const json& object_;
  std::string source_;
};

struct ArchNames {
  ModelArch arch;
  const char* architecture;
  const char* model_type;
};
constexpr ArchNames kArchNames[] = {
    {ModelArch::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
    {ModelArch::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
};

Result<ModelArch> read_arch(const FieldReader& f) {
  std::optional<ModelArch> from_architectures, from_model_type;
  if (f.has("architectures")) {
    const json& list = f.at("architectures");
    if (!list.is_array() || list.empty() || !list[0].is_string()) {
      return f.error("architectures", list, "a list like [\"DeepseekV3ForCausalLM\"]");
    }
    const std::string name = list[0].get<std::string>();
    for (const ArchNames& a : kArchNames) {
      if (name == a.architecture) from_architectures = a.arch;
    }
    if (!from_architectures) {
      return f.unsupported("architectures", list, "DeepseekV3ForCausalLM, DeepseekV2ForCausalLM");
    }
  }
  if (f.has("model_type")) {
    const json& value = f.at("model_type");
    if (!value.is_string()) return f.error("model_type", value, "a string");
    const std::string name = value.get<std::string>();
    for (const ArchNames& a : kArchNames) {
      if (name == a.model_type) from_model_type = a.arch;
    }
    // Kimi-K2 ships DeepseekV3ForCausalLM weights under its own model_type.
    if (name == "kimi_k2") from_model_type = ModelArch::kDeepseekV3;
    if (!from_model_type) {
      return f.unsupported("model_type", value, "deepseek_v3, deepseek_v2, kimi_k2");
    }
  }
  if (from_architectures && from_model_type && *from_architectures != *from_model_type) {
    return f.error("model_type", f.at("model_type"),
                   "a model_type matching architectures " + f.at("architectures").dump());
  }
  if (from_architectures) return *from_architectures;
  if (from_model_type) return *from_model_type;
  return f.missing("architectures", "[\"DeepseekV3ForCausalLM\"] or model_type \"deepseek_v3\"");
}

// RoPE as Hugging Face reads it. transformers 4 wrote `rope_scaling` (null: plain RoPE) and a
// top-level `rope_theta`; transformers 5 writes `rope_parameters` {"rope_type", "rope_theta",
// ...} and reads `rope_scaling` first when both are there, with a `rope_theta` inside the
// object over the top-level one. Sets c.rope_theta and c.rope_scaling.
Status read_rope(const FieldReader& f, ModelConfig& c) {
  // Above 1: at 1 every dimension turns at the same rate and YaRN's correction range divides
  // by log(1) (NaN frequencies).
  PS_ASSIGN_OR_RETURN(c.rope_theta, f.number_in("rope_theta", 10000.0, 1.0, kMaxRopeTheta));
  const bool legacy = !f.is_null("rope_scaling") &&
                      !(f.at("rope_scaling").is_object() && f.at("rope_scaling").empty());
  const char* key = legacy ? "rope_scaling" : "rope_parameters";
  c.rope_scaling.reset();
  if (f.is_null(key)) return ok_status();
  const json& rs = f.at(key);
  const std::string prefix = std::string(key) + ".";
  if (!rs.is_object()) return f.error(key, rs, "an object or null");
  if (rs.contains("rope_theta")) {
    PS_ASSIGN_OR_RETURN(c.rope_theta,
                        f.number_in("rope_theta", std::nullopt, 1.0, kMaxRopeTheta, &rs, prefix));
  }
  // rope_type over the legacy type, as transformers reads them.
  const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
  if (!rs.contains(type_key) && legacy) return f.missing(prefix + "type", "\"yarn\"");
  const json type = rs.value(type_key, json("default"));
  if (type == "default") return ok_status();  // plain RoPE, as transformers reads it
  if (type != "yarn") return f.unsupported(prefix + type_key, type, "\"yarn\", \"default\"");
  YarnScaling y;
  PS_ASSIGN_OR_RETURN(y.factor, f.number_in("factor", std::nullopt, 0.0, 1e6, &rs, prefix));
  if (rs.contains("original_max_position_embeddings")) {
    PS_ASSIGN_OR_RETURN(y.original_max_position_embeddings,
                        f.integer_value(prefix + "original_max_position_embeddings",
                                        rs.at("original_max_position_embeddings"), 1));
  }
  // 0 would put every frequency's correction dimension at infinity (NaN frequencies).
  // The bounds keep every derived value finite (checked again on the frequencies below).
  PS_ASSIGN_OR_RETURN(y.beta_fast, f.number_in("beta_fast", 32.0, 0.0, 1e6, &rs, prefix));
  PS_ASSIGN_OR_RETURN(y.beta_slow, f.number_in("beta_slow", 1.0, 0.0, 1e6, &rs, prefix));
  // Absent mscale keys mean what they mean in the Hugging Face YaRN class (1 and 0). They
  // scale cos/sin and, squared, the softmax scale (DeepSeek-V3: 1 and 1).
  PS_ASSIGN_OR_RETURN(y.mscale, f.number_in("mscale", 1.0, 0.0, 100.0, &rs, prefix, true));
  PS_ASSIGN_OR_RETURN(y.mscale_all_dim,
                      f.number_in("mscale_all_dim", 0.0, 0.0, 100.0, &rs, prefix, true));
  c.rope_scaling = y;
  return ok_status();
}

// compressed-tensors W8A8: only the scheme the INT8 kernels run (8-bit symmetric integer
// weights per output channel; activations, if described, 8-bit per token and dynamic).
Status read_int8_quantization(const FieldReader& f, const json& q, ModelConfig& c) {
  const std::string where = "quantization_config.";
  if (q.value("format", json()) != "int-quantized") {
    return f.unsupported(where + "format", q.value("format", json()),
                         "\"int-quantized\" (W8A8 INT8)");
  }
  const json groups = q.value("config_groups", json());
  if (!groups.is_object() || groups.empty()) {
    return f.missing(where + "config_groups", "one group with 8-bit channel-wise int weights");
  }
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    const std::string g = where + "config_groups." + it.key() + ".";
    const json w = it->is_object() ? it->value("weights", json()) : json();
    const bool weights_ok =
        w.is_object() && w.value("num_bits", json()) == 8 && w.value("type", json()) == "int" &&
        w.value("symmetric", json()) == true && w.value("strategy", json()) == "channel";
    if (!weights_ok) {
      return f.unsupported(g + "weights", w,
                           "{\"num_bits\": 8, \"type\": \"int\", \"symmetric\": true, "
                           "\"strategy\": \"channel\"}");
    }
    const json a = it->value("input_activations", json());
    const bool activations_ok =
        a.is_null() ||
        (a.is_object() && a.value("num_bits", json()) == 8 && a.value("type", json()) == "int" &&
         a.value("dynamic", json()) == true && a.value("strategy", json()) == "token");
    if (!activations_ok) {
      return f.unsupported(
          g + "input_activations", a,
          "null or {\"num_bits\": 8, \"type\": \"int\", \"dynamic\": true, "
          "\"strategy\": \"token\"} (activations are quantized per token at run time)");
    }
  }
  c.int8_weights = true;
  return ok_status();
}

Status read_quantization(const FieldReader& f, ModelConfig& c) {
  if (f.is_null("quantization_config")) return ok_status();
  const json& q = f.at("quantization_config");
  if (!q.is_object()) return f.error("quantization_config", q, "an object or null");
  if (!q.contains("quant_method")) return f.missing("quantization_config.quant_method", "\"fp8\"");
  if (q.at("quant_method") == "compressed-tensors") return read_int8_quantization(f, q, c);
  if (q.at("quant_method") != "fp8") {
    return f.unsupported("quantization_config.quant_method", q.at("quant_method"),
                         "\"fp8\" or \"compressed-tensors\"");
  }
  if (q.contains("fmt") && q.at("fmt") != "e4m3") {
    return f.unsupported("quantization_config.fmt", q.at("fmt"), "\"e4m3\"");
  }
  if (!q.contains("weight_block_size")) {
    return f.missing("quantization_config.weight_block_size", "[rows, cols] like [128, 128]");
  }
  const json& block = q.at("weight_block_size");
  if (!block.is_array() || block.size() != 2) {
    return f.error("quantization_config.weight_block_size", block, "[rows, cols] like [128, 128]");
  }
  PS_ASSIGN_OR_RETURN(int64_t rows, f.integer_value("quantization_config.weight_block_size[0]",
                                                    block[0], 1, 1 << 20));
  PS_ASSIGN_OR_RETURN(int64_t cols, f.integer_value("quantization_config.weight_block_size[1]",
                                                    block[1], 1, 1 << 20));
  c.fp8_block_rows = rows;
  c.fp8_block_cols = cols;
  return ok_status();
}

// Each field is bounded on its own; the weights' shapes are products of fields, and the
// loader and the KV layout multiply them. Every product below stays under 2^40 elements (a
// real checkpoint's largest weight is ~2^31), so no size computed from the config overflows.
Status check_weight_sizes(const std::string& source, const ModelConfig& c) {
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  constexpr int64_t kMaxLayers = 1024, kMaxRoutedExperts = int64_t{1} << 16;
  if (c.num_hidden_layers > kMaxLayers) {
    return invalid_argument(source +
                            ": field 'num_hidden_layers' = " + std::to_string(c.num_hidden_layers) +
                            ", expected at most " + std::to_string(kMaxLayers));
  }
  if (c.n_routed_experts > kMaxRoutedExperts) {
    return invalid_argument(source +
                            ": field 'n_routed_experts' = " + std::to_string(c.n_routed_experts) +
                            ", expected at most " + std::to_string(kMaxRoutedExperts));
  }
  // The loader lists every expert's tensors up front: each bound alone let 1,024 layers x
  // 65,536 experts through, 200 M tensor entries (bad_alloc in `quantize`). DeepSeek-V3 has
  // 62 x 256 = 15,872, Kimi K2 62 x 384.
  constexpr int64_t kMaxRoutedExpertsInAll = int64_t{1} << 18;
  const int64_t layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (layers * c.n_routed_experts > kMaxRoutedExpertsInAll) {
    return invalid_argument(source + ": (num_hidden_layers + num_nextn_predict_layers) x " +
                            "n_routed_experts = " + std::to_string(layers) + " x " +
                            std::to_string(c.n_routed_experts) + ", expected at most " +
                            std::to_string(kMaxRoutedExpertsInAll) + " routed experts in all");
  }
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;  // each <= 2^40: no overflow
  const int64_t latent = c.kv_lora_rank + c.qk_rope_head_dim;
  const int64_t q_lora = c.q_lora_rank.value_or(1);
  struct Product {
    const char* fields;
    std::initializer_list<int64_t> factors;
  };
  const Product products[] = {
      {"vocab_size x hidden_size", {c.vocab_size, c.hidden_size}},
      {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim) x hidden_size",
       {c.num_attention_heads, qk, c.hidden_size}},
      {"num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim) x q_lora_rank",
       {c.num_attention_heads, qk, q_lora}},
      {"q_lora_rank x hidden_size", {q_lora, c.hidden_size}},
      {"(kv_lora_rank + qk_rope_head_dim) x hidden_size", {latent, c.hidden_size}},
      {"num_attention_heads x (qk_nope_head_dim + v_head_dim) x kv_lora_rank",
       {c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank}},
      {"num_attention_heads x v_head_dim x hidden_size",
       {c.num_attention_heads, c.v_head_dim, c.hidden_size}},
      {"2 x intermediate_size x hidden_size", {2, c.intermediate_size, c.hidden_size}},
      {"2 x moe_intermediate_size x max(n_shared_experts, 1) x hidden_size",
       {2, c.moe_intermediate_size, std::max<int64_t>(c.n_shared_experts, 1), c.hidden_size}},
      {"n_routed_experts x hidden_size", {c.n_routed_experts, c.hidden_size}},
      {"2 x hidden_size x hidden_size (MTP eh_proj)", {2, c.hidden_size, c.hidden_size}},
  };
  for (const Product& p : products) {
    int64_t n = 1;
    bool overflow = false;
    for (const int64_t factor : p.factors)
      overflow = overflow || __builtin_mul_overflow(n, factor, &n);
    if (overflow || n > kMaxElements) {
      return invalid_argument(source + ": " + p.fields + " is " +
                              (overflow ? std::string("beyond 2^63") : std::to_string(n)) +
                              ", more than the 2^40 elements a weight may have");
    }
  }
  return ok_status();
}

Result<ModelConfig> parse_object(const json& root, const std::string& source) {
  if (!root.is_object()) {
    return invalid_argument(source + ": expected a JSON object at the top level");
  }
  FieldReader f(root, source);
  ModelConfig c;
  PS_ASSIGN_OR_RETURN(c.arch, read_arch(f));
  const bool v3 = c.arch == ModelArch::kDeepseekV3;

  if (f.has("hidden_act") && f.at("hidden_act") != "silu") {
    return f.unsupported("hidden_act", f.at("hidden_act"), "\"silu\"");
  }
  PS_ASSIGN_OR_RETURN(bool attention_bias, f.boolean("attention_bias", false));
  if (attention_bias) return f.unsupported("attention_bias", true, "false");

  // Shape-defining fields are required: a default here would silently build the wrong model.
  PS_ASSIGN_OR_RETURN(c.vocab_size, f.integer("vocab_size", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.hidden_size, f.integer("hidden_size", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.num_hidden_layers, f.integer("num_hidden_layers", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.num_attention_heads, f.integer("num_attention_heads", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.kv_lora_rank, f.integer("kv_lora_rank", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.qk_nope_head_dim, f.integer("qk_nope_head_dim", std::nullopt, 1));
  // At most 512: RoPE rotates a head's rope part in a buffer on the stack.
  PS_ASSIGN_OR_RETURN(c.qk_rope_head_dim, f.integer("qk_rope_head_dim", std::nullopt, 2, 512));
  if (c.qk_rope_head_dim % 2 != 0) {
    return f.error("qk_rope_head_dim", c.qk_rope_head_dim, "an even number (RoPE rotates pairs)");
  }
  PS_ASSIGN_OR_RETURN(c.v_head_dim, f.integer("v_head_dim", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.q_lora_rank, f.nullable_integer("q_lora_rank", c.q_lora_rank, 1));
  PS_ASSIGN_OR_RETURN(c.num_nextn_predict_layers, f.integer("num_nextn_predict_layers", 0, 0, 16));

  PS_ASSIGN_OR_RETURN(std::optional<int64_t> routed, f.nullable_integer("n_routed_experts", 0, 0));
  c.n_routed_experts = routed.value_or(0);
  PS_ASSIGN_OR_RETURN(std::optional<int64_t> shared, f.nullable_integer("n_shared_experts", 0, 0));
  c.n_shared_experts = shared.value_or(0);
  const bool moe = c.n_routed_experts > 0;
  PS_ASSIGN_OR_RETURN(c.intermediate_size, f.integer("intermediate_size", std::nullopt, 1));
  PS_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                      f.integer("moe_intermediate_size",
                                moe ? std::nullopt : std::optional<int64_t>{0}, moe ? 1 : 0));
  PS_ASSIGN_OR_RETURN(
      c.first_k_dense_replace,
      f.integer("first_k_dense_replace", v3 ? c.first_k_dense_replace : 0, 0, c.num_hidden_layers));
  PS_ASSIGN_OR_RETURN(c.moe_layer_freq, f.integer("moe_layer_freq", 1, 1));
  // DeepSeek-V3 2.5, V2 16; fp32 turns 1e39 into inf.
  PS_ASSIGN_OR_RETURN(c.routed_scaling_factor,
                      f.number_in("routed_scaling_factor", v3 ? 2.5 : 1.0, 0.0, 1e4));
  PS_ASSIGN_OR_RETURN(c.norm_topk_prob, f.boolean("norm_topk_prob", v3));

  // Absent: Hugging Face's defaults, DeepseekV3Config's 8 and 4 (V2's: none, one group).
  // At most 1024 groups: the router keeps a group's score on the stack.
  PS_ASSIGN_OR_RETURN(std::optional<int64_t> n_group,
                      f.nullable_integer("n_group", v3 ? 8 : 1, 1, 1024));
  c.n_group = n_group.value_or(1);
  PS_ASSIGN_OR_RETURN(std::optional<int64_t> topk_group,
                      f.nullable_integer("topk_group", v3 ? 4 : 1, 1));
  c.topk_group = topk_group.value_or(1);
  const bool topk_group_null = f.has("topk_group") && !topk_group;
  PS_ASSIGN_OR_RETURN(
      std::optional<int64_t> experts_per_tok,
      f.nullable_integer("num_experts_per_tok", moe ? std::nullopt : std::optional<int64_t>{0},
                         moe ? 1 : 0));
  if (moe && !experts_per_tok) {
    return f.missing("num_experts_per_tok", "an integer >= 1 (n_routed_experts > 0)");
  }
  c.num_experts_per_tok = experts_per_tok.value_or(0);

  // Routing: V3 uses sigmoid scores with a correction bias (noaux_tc); V2 softmax with
  // greedy or group-limited greedy top-k. Other combinations have no Hugging Face reference.
  PS_ASSIGN_OR_RETURN(std::string scoring, f.string("scoring_func", v3 ? "sigmoid" : "softmax"));
  PS_ASSIGN_OR_RETURN(std::string topk, f.string("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (v3) {
    if (scoring != "sigmoid") return f.unsupported("scoring_func", scoring, "\"sigmoid\" for V3");
    if (topk != "noaux_tc") return f.unsupported("topk_method", topk, "\"noaux_tc\" for V3");
    c.scoring_func = ScoringFunc::kSigmoid;
    c.topk_method = TopkMethod::kNoAuxTc;
  } else {
    if (scoring != "softmax") return f.unsupported("scoring_func", scoring, "\"softmax\" for V2");
    if (topk == "greedy") {
      c.topk_method = TopkMethod::kGreedy;
    } else if (topk == "group_limited_greedy") {
      c.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else {
      return f.unsupported("topk_method", topk, "\"greedy\", \"group_limited_greedy\" for V2");
    }
    c.scoring_func = ScoringFunc::kSoftmax;
  }
  if (moe) {
    if (c.num_experts_per_tok > c.n_routed_experts) {
      return f.error("num_experts_per_tok", c.num_experts_per_tok,
                     "<= n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
    }
    if (c.n_routed_experts % c.n_group != 0) {
      return f.error("n_group", c.n_group,
                     "a divisor of n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
    }
    if (c.topk_group > c.n_group) {
      return f.error("topk_group", c.topk_group, "<= n_group (" + std::to_string(c.n_group) + ")");
    }
    const bool grouped = c.topk_method != TopkMethod::kGreedy;
    if (grouped && c.n_group > 1 && topk_group_null) {
      // The reference code fails there (topk with k=None); one group is a guess.
      return f.error("topk_group", nullptr, "an integer in [1, n_group] with n_group > 1");
    }
    const int64_t reachable = c.topk_group * (c.n_routed_experts / c.n_group);
    if (grouped && c.num_experts_per_tok > reachable) {
      return f.error(
          "num_experts_per_tok", c.num_experts_per_tok,
          "<= topk_group * n_routed_experts / n_group (" + std::to_string(reachable) + ")");
    }
  }

  // Absent: Hugging Face's defaults (DeepseekV3Config 4096, DeepseekV2Config 2048).
  PS_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      f.integer("max_position_embeddings", v3 ? 4096 : 2048, 1));
  // Above 1 it outweighs any activation's mean square (the norm returns ~0).
  PS_ASSIGN_OR_RETURN(c.rms_norm_eps, f.number_in("rms_norm_eps", 1e-6, 0.0, 1.0));
  PS_RETURN_IF_ERROR(read_rope(f, c));
  // The checkpoint's rope dimensions are stored as interleaved pairs (rope_interleave, true in
  // every DeepSeek checkpoint); the other layout has no kernel here.
  PS_ASSIGN_OR_RETURN(bool rope_interleave, f.boolean("rope_interleave", true));
  if (!rope_interleave) return f.unsupported("rope_interleave", false, "true");
  PS_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.boolean("tie_word_embeddings", false));

  PS_ASSIGN_OR_RETURN(c.bos_token_id, f.nullable_integer("bos_token_id", std::nullopt, 0));
  // eos_token_id: an integer or a list of them, each of which ends generation (as in
  // Hugging Face's generate); null or absent: none.
  c.eos_token_ids.clear();
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    const json& list = f.at("eos_token_id");
    if (list.empty() || list.size() > 64) {
      return f.error("eos_token_id", list, "an integer or a list of 1 to 64 integers");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string name = "eos_token_id[" + std::to_string(i) + "]";
      PS_ASSIGN_OR_RETURN(int64_t eos, f.integer_value(name, list[i], 0));
      if (eos >= c.vocab_size) {
        return f.error(name, eos, "< vocab_size (" + std::to_string(c.vocab_size) + ")");
      }
      c.eos_token_ids.push_back(eos);
    }
  } else {
    PS_ASSIGN_OR_RETURN(std::optional<int64_t> eos,
                        f.nullable_integer("eos_token_id", std::nullopt, 0));
    if (eos && *eos >= c.vocab_size) {
      return f.error("eos_token_id", *eos, "< vocab_size (" + std::to_string(c.vocab_size) + ")");
    }
    if (eos) c.eos_token_ids.push_back(*eos);
  }
  if (c.bos_token_id && *c.bos_token_id >= c.vocab_size) {
    return f.error("bos_token_id", *c.bos_token_id,
                   "< vocab_size (" + std::to_string(c.vocab_size) + ")");
  }
  PS_RETURN_IF_ERROR(check_weight_sizes(source, c));
  PS_RETURN_IF_ERROR(read_quantization(f, c));
  PS_RETURN_IF_ERROR(check_rope_values(c).with_context(source));
  return c;
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Parse again with exceptions to get the position of the error for the message (any
    // json::exception: a number too large for a double is out_of_range, not parse_error).
    try {
      [[maybe_unused]] const json reparsed = json::parse(json_text);
    } catch (const json::exception& e) {
      return invalid_argument(source + ": not valid JSON: " + e.what());
    }
    return invalid_argument(source + ": not valid JSON");
  }
  // Before anything prints a value of it (the error messages dump() them, recursively).
  PS_RETURN_IF_ERROR(check_json_nesting(root, kMaxConfigJsonDepth, source));
  return parse_object(root, source);
}

Result<ModelConfig> load_model_config(const std::string& path) {
  PS_ASSIGN_OR_RETURN(const std::string text, read_regular_file(path, kMaxConfigFileBytes));
  return parse_model_config(text, path);
}

std::string int8_quantization_config_json(const std::vector<std::string>& ignore) {
  const json weights = {{"num_bits", 8},         {"type", "int"},    {"symmetric", true},
                        {"strategy", "channel"}, {"dynamic", false}, {"group_size", nullptr}};
  const json activations = {{"num_bits", 8},       {"type", "int"},   {"symmetric", true},
                            {"strategy", "token"}, {"dynamic", true}, {"group_size", nullptr}};
  const json q = {
      {"quant_method", "compressed-tensors"},
      {"format", "int-quantized"},
      {"quantization_status", "compressed"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", activations}}}}},
      {"ignore", ignore}};
  return q.dump();
}

std::string model_config_to_json(const ModelConfig& c) {
  const bool v3 = c.arch == ModelArch::kDeepseekV3;
  nlohmann::ordered_json j;
  j["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["aux_loss_alpha"] = 0.001;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  // One id as an integer (as the checkpoints of DeepSeek write it), several as a list.
  j["eos_token_id"] = c.eos_token_ids.empty()       ? json(nullptr)
                      : c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0])
                                                    : json(c.eos_token_ids);
  j["ep_size"] = 1;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["n_group"] = c.n_group;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["pretraining_tp"] = 1;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  if (c.int8_weights) {
    j["quantization_config"] = json::parse(int8_quantization_config_json({}));
  } else if (c.fp8_block_rows && c.fp8_block_cols) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {*c.fp8_block_rows, *c.fp8_block_cols}}};
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.rope_scaling) {
    const YarnScaling& y = *c.rope_scaling;
    j["rope_scaling"] = {{"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"factor", y.factor},
                         {"mscale", y.mscale},
                         {"mscale_all_dim", y.mscale_all_dim},
                         {"original_max_position_embeddings", y.original_max_position_embeddings},
                         {"type", "yarn"}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = c.rope_theta;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
  j["seq_aux"] = true;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  switch (c.topk_method) {
    case TopkMethod::kNoAuxTc:
      j["topk_group"] = c.topk_group;
      j["topk_method"] = "noaux_tc";
      break;
    case TopkMethod::kGreedy:
      j["topk_group"] = c.topk_group;
      j["topk_method"] = "greedy";
      break;
    case TopkMethod::kGroupLimitedGreedy:
      j["topk_group"] = c.topk_group;
      j["topk_method"] = "group_limited_greedy";
      break;
  }
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = "4.46.3";
  j["use_cache"] = true;
  j["v_head_dim"] = c.v_head_dim;
  j["vocab_size"] = c.vocab_size;
  return j.dump(2) + "\n";
}

int64_t model_parameter_count(const ModelConfig& config) {
  int64_t total = 0;
  for (const TensorSpec& spec : deepseek_tensor_layout(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    total += n;
  }
  return total;
}

}  // namespace peerserve

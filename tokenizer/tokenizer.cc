#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include "base/json_nesting.h"
#include "base/regular_file.h"
#include "tokenizer/internal/added_vocabulary.h"
#include "tokenizer/internal/bpe_model.h"
#include "tokenizer/internal/pre_tokenizer.h"
#include "tokenizer/internal/utf8.h"
#include "tokenizer/jinja/python_strings.h"

namespace peerserve {
namespace {

using nlohmann::json;

// Tokenizer files come from checkpoints downloaded from a hub: untrusted. Their real
// nesting is under 10 levels; the checks below (and dump()) recurse.
constexpr size_t kMaxJsonDepth = 64;

Result<json> parse_json(std::string_view text, const std::string& name) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalid_argument(name + ": not valid JSON");
  if (!value.is_object())
    return invalid_argument(name + ": expected a JSON object at the top level");
  PS_RETURN_IF_ERROR(check_json_nesting(value, kMaxJsonDepth, name));
  return value;
}

// Ids index dense tables. Real files number their tokens densely, sometimes with a gap
// (e.g. reserved ids); an id far beyond the number of tokens would allocate gigabytes.
// So ids must be below twice the number of tokens in model.vocab and added_tokens, plus
// 1024.
int64_t id_limit(const json& root) {
  int64_t count = 0;
  if (const auto model = root.find("model"); model != root.end() && model->is_object()) {
    if (const auto vocab = model->find("vocab"); vocab != model->end() && vocab->is_object()) {
      count += static_cast<int64_t>(vocab->size());
    }
  }
  if (const auto added = root.find("added_tokens"); added != root.end() && added->is_array()) {
    count += static_cast<int64_t>(added->size());
  }
  return 2 * count + 1024;
}

std::string component_type(const json& config) {
  const auto it = config.find("type");
  return it != config.end() && it->is_string() ? it->get<std::string>()
                                               : config.dump().substr(0, 100);
}

Status check_normalizer(const json& config) {
  if (config.is_null()) return ok_status();
  const std::string type = component_type(config);
  if (type == "Sequence") {
    const auto it = config.find("normalizers");
    if (it == config.end() || !it->is_array()) {
      return invalid_argument("tokenizer.json: normalizer Sequence needs an array 'normalizers'");
    }
    for (const auto& child : *it) PS_RETURN_IF_ERROR(check_normalizer(child));
    return ok_status();
  }
  return unimplemented("tokenizer.json: normalizer type '" + type +
                       "' is not supported (supported: null or an empty Sequence)");
}

Status check_decoder(const json& config) {
  if (config.is_null()) {
    return unimplemented("tokenizer.json: decoder null is not supported (expected ByteLevel)");
  }
  const std::string type = component_type(config);
  if (type == "ByteLevel") return ok_status();
  if (type == "Sequence") {
    const auto it = config.find("decoders");
    if (it == config.end() || !it->is_array() || it->empty()) {
      return invalid_argument(
          "tokenizer.json: decoder Sequence needs a non-empty array 'decoders'");
    }
    for (const auto& child : *it) PS_RETURN_IF_ERROR(check_decoder(child));
    return ok_status();
  }
  return unimplemented("tokenizer.json: decoder type '" + type +
                       "' is not supported (supported: ByteLevel)");
}

// Token ids a post-processor puts around a single sequence.
struct SpecialTokenTemplate {
  std::vector<TokenId> before;
  std::vector<TokenId> after;
};

Status parse_post_processor(const json& config, SpecialTokenTemplate& out) {
  if (config.is_null()) return ok_status();
  const std::string type = component_type(config);
  if (type == "ByteLevel") return ok_status();  // offsets only; ids unchanged
  if (type == "Sequence") {
    const auto it = config.find("processors");
    if (it == config.end() || !it->is_array()) {
      return invalid_argument(
          "tokenizer.json: post_processor Sequence needs an array 'processors'");
    }
    for (const auto& child : *it) PS_RETURN_IF_ERROR(parse_post_processor(child, out));
    return ok_status();
  }
  if (type == "TemplateProcessing") {
    const auto single = config.find("single");
    const auto specials = config.find("special_tokens");
    if (single == config.end() || !single->is_array() || specials == config.end() ||
        !specials->is_object()) {
      return invalid_argument(
          "tokenizer.json: post_processor TemplateProcessing needs 'single' (array) and "
          "'special_tokens' (object)");
    }
    bool seen_sequence = false;
    for (const auto& piece : *single) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken") || !piece["SpecialToken"].contains("id")) {
        return invalid_argument(
            "tokenizer.json: post_processor TemplateProcessing: unexpected piece " + piece.dump());
      }
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      const auto special = specials->find(name);
      if (special == specials->end() || !special->contains("ids") ||
          !(*special)["ids"].is_array()) {
        return invalid_argument(
            "tokenizer.json: post_processor TemplateProcessing: special token '" + name +
            "' has no ids");
      }
      for (const auto& id : (*special)["ids"]) {
        // Range-checked as int64 first: get<int32_t> of 1e20 or 2^40 is undefined.
        const bool ok = id.is_number_integer() && !id.is_number_unsigned()
                            ? id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX
                            : id.is_number_unsigned() && id.get<uint64_t>() <= INT32_MAX;
        if (!ok) {
          return invalid_argument(
              "tokenizer.json: post_processor TemplateProcessing: special "
              "token '" +
              name + "' has id " + id.dump() + ", expected a non-negative integer token id");
        }
        (seen_sequence ? out.after : out.before).push_back(static_cast<TokenId>(id.get<int64_t>()));
      }
    }
    return ok_status();
  }
  return unimplemented("tokenizer.json: post_processor type '" + type +
                       "' is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
}

// bos_token/eos_token in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

}  // namespace

// DeepSeek-V3's tokenizer.json is ~8 MB.
constexpr uint64_t kMaxTokenizerFileBytes = 1ull << 30;

struct Tokenizer::Impl {
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedVocabulary added;
  SpecialTokenTemplate post_template;  // used when the config has no add_*_token keys
  bool config_sets_special = false;
  bool add_bos = false;
  bool add_eos = false;
  std::string bos_token;
  std::string eos_token;
  std::optional<TokenId> bos_id;
  std::optional<TokenId> eos_id;
  int32_t vocab_size = 0;
  size_t max_token_bytes = 1;  // the longest text one token stands for
  // An added token with lstrip/rstrip also takes the whitespace beside it, however long: no
  // bound on the text one token stands for, so no early length check.
  bool token_text_unbounded = false;
  std::optional<ChatTemplate> chat_template;
  Status chat_template_status = not_found("tokenizer_config.json has no chat_template");

  Impl(PreTokenizer p, BpeModel m, AddedVocabulary a)
      : pre_tokenizer(std::move(p)), model(std::move(m)), added(std::move(a)) {}
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load_from_dir(const std::filesystem::path& dir) {
  PS_RETURN_IF_ERROR(require_directory(dir, "the model folder"));
  TokenizerSources sources;
  PS_ASSIGN_OR_RETURN(sources.tokenizer_json,
                      read_regular_file(dir / "tokenizer.json", kMaxTokenizerFileBytes));
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    PS_ASSIGN_OR_RETURN(sources.tokenizer_config_json,
                        read_regular_file(config_path, kMaxTokenizerFileBytes));
  }
  return from_sources(sources);
}

Result<Tokenizer> Tokenizer::from_sources(const TokenizerSources& sources) {
  // nlohmann::json throws on a value of the wrong type (e.g. "add_bos_token": "yes"); such
  // files are reported as bad input rather than escaping as exceptions.
  try {
    return from_sources_unchecked(sources);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("tokenizer files: a value has the wrong type: ") +
                            e.what());
  }
}

Result<Tokenizer> Tokenizer::from_sources_unchecked(const TokenizerSources& sources) {
  PS_ASSIGN_OR_RETURN(json root, parse_json(sources.tokenizer_json, "tokenizer.json"));
  for (const char* key : {"truncation", "padding"}) {
    if (root.contains(key) && !root[key].is_null()) {
      return unimplemented(std::string("tokenizer.json: '") + key +
                           "' is not supported (expected null)");
    }
  }
  PS_RETURN_IF_ERROR(check_normalizer(root.value("normalizer", json())));
  PS_RETURN_IF_ERROR(check_decoder(root.value("decoder", json())));
  PS_ASSIGN_OR_RETURN(PreTokenizer pre_tokenizer,
                      PreTokenizer::from_json(root.value("pre_tokenizer", json())));
  if (!pre_tokenizer.has_byte_level()) {
    return unimplemented(
        "tokenizer.json: a BPE model without a ByteLevel pre_tokenizer is not supported");
  }
  if (!root.contains("model")) return invalid_argument("tokenizer.json: missing 'model'");
  const int64_t ids_below = id_limit(root);
  PS_ASSIGN_OR_RETURN(BpeModel model,
                      BpeModel::from_json(root["model"], /*byte_level=*/true, ids_below));
  PS_ASSIGN_OR_RETURN(AddedVocabulary added,
                      AddedVocabulary::from_json(root.value("added_tokens", json())));
  auto impl = std::make_unique<Impl>(std::move(pre_tokenizer), std::move(model), std::move(added));
  PS_RETURN_IF_ERROR(
      parse_post_processor(root.value("post_processor", json()), impl->post_template));

  // An added token may reuse a model token's id only for the same text (as special tokens
  // listed in both do). Otherwise Hugging Face would give it a new id, and the model token's
  // text would encode to the added token's id and decode as its content: refused, named.
  for (const AddedToken& token : impl->added.tokens()) {
    if (impl->model.has_id(token.id) && impl->model.id_bytes(token.id) != token.content) {
      return invalid_argument("tokenizer.json: added token '" + token.content + "' has id " +
                              std::to_string(token.id) + ", which is the model's token '" +
                              std::string(impl->model.id_bytes(token.id)) + "'");
    }
  }
  int32_t max_id = impl->model.max_id();
  // An added token whose id is also a model token wins for decode, as in Hugging Face.
  for (const AddedToken& token : impl->added.tokens()) max_id = std::max(max_id, token.id);
  impl->vocab_size = max_id + 1;
  // The most bytes of text one token covers: its raw bytes (counting their code points
  // undercounted multi-byte tokens, and the early length check refused texts that fit).
  for (int32_t id = 0; id <= impl->model.max_id(); ++id) {
    if (impl->model.has_id(id)) {
      impl->max_token_bytes = std::max(impl->max_token_bytes, impl->model.id_bytes(id).size());
    }
  }
  for (const AddedToken& token : impl->added.tokens()) {
    impl->max_token_bytes = std::max(impl->max_token_bytes, token.content.size());
    impl->token_text_unbounded = impl->token_text_unbounded || token.lstrip || token.rstrip;
  }
  if (max_id >= ids_below) {
    return invalid_argument(
        "tokenizer.json: added_tokens has id " + std::to_string(max_id) +
        ", out of range: ids must be below " + std::to_string(ids_below) +
        " (twice the number of tokens in model.vocab and added_tokens, plus 1024)");
  }
  // Ids the post-processor adds must be tokens: encode hands them to the model and
  // decode looks them up.
  for (const auto* ids : {&impl->post_template.before, &impl->post_template.after}) {
    for (const TokenId id : *ids) {
      if (id > max_id || (!impl->model.has_id(id) && impl->added.find_by_id(id) == nullptr)) {
        return invalid_argument("tokenizer.json: post_processor adds token id " +
                                std::to_string(id) + ", which is not in the vocabulary (" +
                                std::to_string(impl->vocab_size) + " ids)");
      }
    }
  }

  if (!sources.tokenizer_config_json.empty()) {
    PS_ASSIGN_OR_RETURN(json config,
                        parse_json(sources.tokenizer_config_json, "tokenizer_config.json"));
    if (config.value("clean_up_tokenization_spaces", false)) {
      return unimplemented(
          "tokenizer_config.json: clean_up_tokenization_spaces = true is not supported "
          "(it breaks byte-exact streaming decode; expected false)");
    }
    impl->bos_token = config_token(config, "bos_token");
    impl->eos_token = config_token(config, "eos_token");
    // transformers' LlamaTokenizerFast (DeepSeek-V3's class) defaults add_bos_token to true
    // and always rebuilds the post-processor from the two flags; other classes keep
    // tokenizer.json's post-processor unless a flag is set.
    const bool llama_fast = config.value("tokenizer_class", json()).is_string() &&
                            config["tokenizer_class"].get<std::string>() == "LlamaTokenizerFast";
    impl->config_sets_special =
        llama_fast || config.contains("add_bos_token") || config.contains("add_eos_token");
    for (const auto& [key, fallback, field] :
         {std::tuple{"add_bos_token", llama_fast, &impl->add_bos},
          std::tuple{"add_eos_token", false, &impl->add_eos}}) {
      const auto it = config.find(key);
      if (it == config.end() || it->is_null()) {
        *field = fallback;
      } else if (it->is_boolean()) {
        *field = it->get<bool>();
      } else {
        return invalid_argument(std::string("tokenizer_config.json: ") + key +
                                " must be true or false");
      }
    }
    if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
      std::optional<std::string> source;
      if (it->is_string()) {
        source = it->get<std::string>();
      } else if (it->is_array()) {
        for (const auto& named : *it) {
          if (named.value("name", "") == "default" && named.contains("template")) {
            source = named["template"].get<std::string>();
          }
        }
      }
      if (!source) {
        impl->chat_template_status = invalid_argument(
            "tokenizer_config.json: chat_template must be a string or a list with a "
            "'default' entry");
      } else {
        auto parsed = ChatTemplate::parse(*source);
        if (parsed.ok()) {
          impl->chat_template.emplace(std::move(parsed).value());
          impl->chat_template_status = ok_status();
        } else {
          impl->chat_template_status =
              parsed.status().with_context("tokenizer_config.json: chat_template");
        }
      }
    }
  }
  Tokenizer tokenizer(std::move(impl));
  Impl& self = *tokenizer.impl_;
  if (!self.bos_token.empty()) self.bos_id = tokenizer.token_id(self.bos_token);
  if (!self.eos_token.empty()) self.eos_id = tokenizer.token_id(self.eos_token);
  if (self.add_bos && !self.bos_id) {
    return invalid_argument("tokenizer_config.json: add_bos_token is true but bos_token '" +
                            self.bos_token + "' is not a token");
  }
  if (self.add_eos && !self.eos_id) {
    return invalid_argument("tokenizer_config.json: add_eos_token is true but eos_token '" +
                            self.eos_token + "' is not a token");
  }
  return tokenizer;
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text,
                                               const EncodeOptions& options) const {
  const Impl& self = *impl_;
  std::string valid_copy;
  if (!utf8::is_valid(text)) {
    valid_copy = utf8::make_valid(text);
    text = valid_copy;
  }
  const size_t limit = options.max_tokens;
  auto too_long = [limit] {
    return out_of_range("the text has more than " + std::to_string(limit) + " tokens");
  };
  if (limit > 0 && !self.token_text_unbounded && text.size() / self.max_token_bytes > limit) {
    return too_long();
  }
  std::vector<TokenId> ids;
  if (options.add_special_tokens) {
    if (self.config_sets_special) {
      if (self.add_bos) ids.push_back(*self.bos_id);
    } else {
      ids = self.post_template.before;
    }
  }
  std::vector<TextSegment> segments =
      options.match_added_tokens ? self.added.split(text) : std::vector<TextSegment>{{text, -1}};
  std::vector<std::string> pieces;
  for (const TextSegment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    PS_RETURN_IF_ERROR(self.pre_tokenizer.split(segment.text, pieces));
    for (const std::string& piece : pieces) {
      self.model.encode_word(piece, ids);
      if (limit > 0 && ids.size() > limit) return too_long();
    }
  }
  if (options.add_special_tokens) {
    if (self.config_sets_special) {
      if (self.add_eos) ids.push_back(*self.eos_id);
    } else {
      ids.insert(ids.end(), self.post_template.after.begin(), self.post_template.after.end());
    }
  }
  if (limit > 0 && ids.size() > limit) return too_long();
  return ids;
}

bool Tokenizer::has_token(TokenId id) const {
  return impl_->added.find_by_id(id) != nullptr || impl_->model.has_id(id);
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (const AddedToken* token = impl_->added.find_by_id(id)) return token->content;
  PS_CHECK(impl_->model.has_id(id)) << "token id " << id << " is not in the vocabulary";
  return impl_->model.id_bytes(id);
}

std::string_view Tokenizer::token_text(TokenId id) const {
  if (const AddedToken* token = impl_->added.find_by_id(id)) return token->content;
  PS_CHECK(impl_->model.has_id(id)) << "token id " << id << " is not in the vocabulary";
  return impl_->model.id_text(id);
}

std::optional<TokenId> Tokenizer::token_id(std::string_view text) const {
  if (const AddedToken* token = impl_->added.find_by_content(text)) return token->id;
  const auto& map = impl_->model.text_to_id();
  const auto it = map.find(std::string(text));
  if (it == map.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(TokenId id) const {
  const AddedToken* token = impl_->added.find_by_id(id);
  return token != nullptr && token->special;
}

bool Tokenizer::is_added(TokenId id) const {
  return impl_->added.find_by_id(id) != nullptr;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids,
                                      const DecodeOptions& options) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    if (!has_token(id)) {
      return invalid_argument("decode: token id " + std::to_string(id) + " at position " +
                              std::to_string(i) + " is not in the vocabulary (ids are 0.." +
                              std::to_string(impl_->vocab_size - 1) + ")");
    }
    if (options.skip_special_tokens && is_special(id)) continue;
    bytes.append(token_bytes(id));
  }
  if (utf8::is_valid(bytes)) return bytes;
  return utf8::make_valid(bytes);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

Tokenizer::IdGaps Tokenizer::id_gaps() const {
  IdGaps gaps;
  for (TokenId id = 0; id < impl_->vocab_size; ++id) {
    if (has_token(id)) continue;
    if (gaps.count++ == 0) gaps.first = id;
  }
  return gaps;
}
std::optional<TokenId> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<TokenId> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
bool Tokenizer::add_bos_token() const {
  return impl_->config_sets_special ? impl_->add_bos : !impl_->post_template.before.empty();
}
bool Tokenizer::add_eos_token() const {
  return impl_->config_sets_special ? impl_->add_eos : !impl_->post_template.after.empty();
}

const ChatTemplate* Tokenizer::chat_template() const {
  return impl_->chat_template ? &*impl_->chat_template : nullptr;
}

Status Tokenizer::chat_template_status() const {
  return impl_->chat_template_status;
}

void Tokenizer::set_chat_template(ChatTemplate chat_template) {
  impl_->chat_template.emplace(std::move(chat_template));
  impl_->chat_template_status = ok_status();
}

Result<std::string> Tokenizer::apply_chat_template(const ChatTemplateInput& input) const {
  if (!impl_->chat_template) return impl_->chat_template_status;
  if (!input.messages.is_array()) {
    return invalid_argument("chat template: messages must be an array, got " +
                            std::string(input.messages.type_name()));
  }
  nlohmann::ordered_json variables =
      input.extra_variables.is_null() ? nlohmann::ordered_json::object() : input.extra_variables;
  if (!variables.is_object()) {
    return invalid_argument("chat template: extra variables must be an object");
  }
  for (const char* reserved : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
    if (variables.contains(reserved)) {
      return invalid_argument(std::string("chat template: extra variable '") + reserved +
                              "' is set by the tokenizer and may not be overridden");
    }
  }
  std::string final_content;
  if (input.continue_final_message) {
    if (input.add_generation_prompt) {
      return invalid_argument(
          "chat template: continue_final_message and add_generation_prompt exclude each other");
    }
    const nlohmann::ordered_json* content =
        input.messages.empty() || !input.messages.back().is_object()
            ? nullptr
            : &input.messages.back()["content"];
    if (content == nullptr || !content->is_string() || content->get<std::string>().empty()) {
      return invalid_argument(
          "chat template: continue_final_message needs a final message with text content");
    }
    final_content = content->get<std::string>();
  }
  variables["messages"] = input.messages;
  variables["add_generation_prompt"] = input.add_generation_prompt;
  variables["bos_token"] = impl_->bos_token;
  variables["eos_token"] = impl_->eos_token;
  PS_ASSIGN_OR_RETURN(std::string text, impl_->chat_template->render(variables));
  if (!input.continue_final_message) return text;
  // As transformers: cut after the last occurrence of the content, or of its stripped form
  // (templates that trim messages).
  for (const std::string& needle :
       {final_content, jinja::strip(final_content, nullptr, /*left=*/true, /*right=*/true)}) {
    if (needle.empty()) continue;
    const size_t at = text.rfind(needle);
    if (at != std::string::npos) return text.substr(0, at + needle.size());
  }
  return invalid_argument(
      "chat template: continue_final_message: the template does not write the final "
      "message's content");
}

Result<std::vector<TokenId>> Tokenizer::encode_chat(const ChatTemplateInput& input,
                                                    size_t max_tokens) const {
  PS_ASSIGN_OR_RETURN(std::string text, apply_chat_template(input));
  return encode(
      text, {.add_special_tokens = false, .match_added_tokens = true, .max_tokens = max_tokens});
}

}  // namespace peerserve

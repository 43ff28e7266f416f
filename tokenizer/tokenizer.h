// Tokenizer: Hugging Face tokenizer.json byte-level BPE, as DeepSeek-V3/V2 ship it.
//
// Pipeline of encode(), in Hugging Face's order:
//   1. added tokens are cut out of the text first (leftmost-longest; tokens with
//      normalized=false are matched on the raw text, then normalized=true ones on the
//      rest, honouring lstrip/rstrip/single_word);
//   2. each remaining piece goes through the normalizer (only the empty Sequence is
//      supported), the pre-tokenizer (Sequence of Split regexes + ByteLevel; PCRE2 with
//      UTF+UCP, JIT when available) and the BPE model (merge ranks, per-word cache);
//   3. with add_special_tokens, BOS/EOS are added as transformers' LlamaTokenizerFast does:
//      tokenizer_config.json's add_bos_token / add_eos_token decide (DeepSeek-V3: BOS yes,
//      EOS no). Without those keys a TemplateProcessing post-processor is honoured.
//
// BOS, as transformers behaves (transformers/models/llama/tokenization_llama_fast.py):
// LlamaTokenizerFast.update_post_processor() replaces tokenizer.json's ByteLevel
// post-processor by TemplateProcessing "<bos>:0 $A:0" when add_bos_token is true, so
// tokenizer.encode(text) starts with one BOS. apply_chat_template(tokenize=True) renders
// the template and then tokenizes the text with add_special_tokens=False, so the
// {{ bos_token }} that DeepSeek's template writes is the only BOS (no double BOS).
// encode_chat() does exactly that. (The transformers.js port in the npm package keeps the
// ByteLevel post-processor and adds no BOS at all; the tests account for that.)
//
// Invalid UTF-8 in the input text is replaced by U+FFFD (one per maximal invalid
// subpart, as the WHATWG/Unicode "substitution of maximal subparts" rule does) before
// tokenizing; decode() replaces invalid UTF-8 in the output the same way, as Hugging
// Face's ByteLevel decoder (String::from_utf8_lossy) does.
//
// Unsupported tokenizer.json components fail at load time with an error that names the
// component (e.g. "tokenizer.json: normalizer type 'NFKC' is not supported").
//
// Thread-safety: a loaded Tokenizer is immutable except for an internal word cache that
// is guarded by a mutex; all const methods may be called from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/chat_template.h"

namespace peerserve {

using TokenId = int32_t;

struct EncodeOptions {
  // Adds BOS/EOS per add_bos_token/add_eos_token (see the file comment). Default: true,
  // as transformers' tokenizer.encode().
  bool add_special_tokens = true;
  // Whether added/special token strings inside the text become their token ids (Hugging
  // Face always does this). False encodes them as plain text, which is what a server
  // wants for untrusted user content. Default: true.
  bool match_added_tokens = true;
  // Stop as soon as the text is known to have more than this many tokens (special tokens
  // included) and return OutOfRange: a server refuses such a prompt anyway, and tokenizing
  // megabytes it will reject costs time and memory. A text longer than max_tokens + 1 times
  // the longest token's text is refused before any tokenizing (unless an added token strips
  // the whitespace beside it, which bounds nothing). 0 = no limit. Default 0.
  size_t max_tokens = 0;
};

struct DecodeOptions {
  // Drops tokens marked "special" in tokenizer.json (BOS, EOS, pad, placeholders).
  // Default: false.
  bool skip_special_tokens = false;
};

// Contents (not paths) of the two files of a Hugging Face tokenizer folder.
struct TokenizerSources {
  std::string tokenizer_json;
  // May be empty: then there is no chat template and no add_bos_token setting.
  std::string tokenizer_config_json;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and (if present) DIR/tokenizer_config.json.
  static Result<Tokenizer> load_from_dir(const std::filesystem::path& dir);
  static Result<Tokenizer> from_sources(const TokenizerSources& sources);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Fails only on internal regex errors (e.g. a PCRE2 resource limit), never on text.
  Result<std::vector<TokenId>> encode(std::string_view text,
                                      const EncodeOptions& options = {}) const;

  // Fails if an id is outside [0, vocab_size()) or names no token.
  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  // The bytes this token contributes to decoded text (byte-level decoded for model
  // tokens, the content for added tokens). REQUIRES: has_token(id).
  std::string_view token_bytes(TokenId id) const;
  // The token's string as written in tokenizer.json (e.g. "Ġhello", "<｜User｜>").
  std::string_view token_text(TokenId id) const;
  std::optional<TokenId> token_id(std::string_view token_text) const;
  bool has_token(TokenId id) const;
  bool is_special(TokenId id) const;
  bool is_added(TokenId id) const;

  // One past the largest token id (model vocab and added tokens together).
  int32_t vocab_size() const;

  // Ids below vocab_size() that name no token, and the first of them. A damaged
  // tokenizer.json has such holes; a generated token with such an id decodes to no text.
  struct IdGaps {
    int32_t count = 0;
    TokenId first = -1;
  };
  IdGaps id_gaps() const;

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  // The token strings from tokenizer_config.json ("" when absent).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  bool add_bos_token() const;
  bool add_eos_token() const;

  // nullptr when tokenizer_config.json has no chat_template, or one that did not parse.
  const ChatTemplate* chat_template() const;
  // Why chat_template() is nullptr: NotFound (there is none) or the parse error; OK otherwise.
  Status chat_template_status() const;
  // Replaces the chat template (serve --chat-template). Not thread-safe: call before the
  // tokenizer is shared.
  void set_chat_template(ChatTemplate chat_template);

  // Renders the chat template with bos_token/eos_token from the config, the messages,
  // add_generation_prompt and the extra variables of `input`.
  Result<std::string> apply_chat_template(const ChatTemplateInput& input) const;
  // apply_chat_template, then encode(text, {.add_special_tokens = false}), as
  // transformers' apply_chat_template(tokenize=True) does.
  // max_tokens as in EncodeOptions.
  Result<std::vector<TokenId>> encode_chat(const ChatTemplateInput& input,
                                           size_t max_tokens = 0) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Result<Tokenizer> from_sources_unchecked(const TokenizerSources& sources);
  std::unique_ptr<Impl> impl_;
};

}  // namespace peerserve

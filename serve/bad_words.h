// vLLM's bad_words as token sequences (SamplingParams::bad_words_ids), tokenized as vLLM
// does: each word, left-stripped, without and with a leading space (so that it is banned at
// the start of the text and after a space); the spaced form only when it is a different
// first token and the same number of tokens.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace peerserve {

Result<std::vector<std::vector<TokenId>>> bad_words_token_ids(
    const Tokenizer& tokenizer, const std::vector<std::string>& words);

}  // namespace peerserve

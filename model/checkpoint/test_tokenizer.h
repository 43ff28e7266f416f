// A small byte-level BPE tokenizer with exactly the structure of DeepSeek-V3's tokenizer.json
// (same normalizer, pre_tokenizer, post_processor, decoder, special tokens and chat
// template), for test models.
//
// Ids: 0 <｜begin▁of▁sentence｜>, 1 <｜end▁of▁sentence｜>, 2 <｜▁pad▁｜> (as in V3), then the
// 256 byte-level tokens, then BPE merges (the first merges of DeepSeek-V3's own list), then
// the remaining V3 added tokens (<｜User｜>, <｜Assistant｜>, fim, tool-call tokens, ...).
#pragma once

#include <cstdint>
#include <string>

namespace peerserve {

// Number of token ids the tokenizer uses (vocab + added tokens); config vocab_size must be
// at least this.
int64_t test_tokenizer_vocab_size();

std::string test_tokenizer_json();
// add_bos_token true, bos/eos tokens, DeepSeek-V3's chat_template.
std::string test_tokenizer_config_json();

}  // namespace peerserve

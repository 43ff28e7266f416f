// The warning `generate` and `serve` print when the checkpoint's tokenizer has ids without a
// token: the model can generate them, and they decode to no text (as in vLLM), so a damaged
// tokenizer.json would otherwise drop words from the output unseen.
#pragma once

#include "tokenizer/tokenizer.h"

namespace peerserve {

void warn_about_tokenizer_gaps(const Tokenizer& tokenizer);

}  // namespace peerserve

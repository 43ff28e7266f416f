#include "apps/tokenizer_gaps.h"

#include <cstdio>

namespace peerserve {

void warn_about_tokenizer_gaps(const Tokenizer& tokenizer) {
  const Tokenizer::IdGaps gaps = tokenizer.id_gaps();
  if (gaps.count == 0) return;
  std::fprintf(stderr,
               "warning: tokenizer.json names no token for %d of the ids below %d (the first: "
               "%d); generated tokens with those ids decode to no text\n",
               gaps.count, tokenizer.vocab_size(), gaps.first);
}

}  // namespace peerserve

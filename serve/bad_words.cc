#include "serve/bad_words.h"

#include "tokenizer/jinja/python_strings.h"

namespace peerserve {

Result<std::vector<std::vector<TokenId>>> bad_words_token_ids(
    const Tokenizer& tokenizer, const std::vector<std::string>& words) {
  std::vector<std::vector<TokenId>> out;
  for (const std::string& word : words) {
    const std::string stripped = jinja::strip(word, nullptr, /*left=*/true, /*right=*/false);
    if (stripped.empty()) continue;  // whitespace only: no token sequence to ban
    PS_ASSIGN_OR_RETURN(std::vector<TokenId> plain,
                        tokenizer.encode(stripped, {.add_special_tokens = false}));
    PS_ASSIGN_OR_RETURN(std::vector<TokenId> spaced,
                        tokenizer.encode(" " + stripped, {.add_special_tokens = false}));
    if (plain.empty()) continue;
    const bool spaced_differs =
        !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
    out.push_back(std::move(plain));
    if (spaced_differs) out.push_back(std::move(spaced));
  }
  return out;
}

}  // namespace peerserve

// Hugging Face compiles a tokenizer.json's Split patterns with Oniguruma; peerserve with
// PCRE2 (UTF + UCP). The two read a few escapes differently in Unicode mode:
//   \s  Oniguruma: U+0009-000D, U+0085 and the separators (Zs, Zl, Zp); PCRE2 adds U+180E
//       (its horizontal-space list), so "\u180e" joined a run of spaces;
//   \w  Oniguruma: Alphabetic (letters, letter numbers such as "Ⅻ" and "〇", circled
//       letters), marks, decimal digits, connector punctuation; PCRE2: letters, all numbers
//       and "_" (no combining marks or circled letters, but "²");
//   \h  Oniguruma: a hexadecimal digit; PCRE2: horizontal whitespace.
// This rewrites them (and \S, \W, \H) into explicit classes with Oniguruma's meaning before
// PCRE2 compiles the pattern. Inside a character class, \s, \w and \h become the class's
// members; \S and \W keep PCRE2's meaning there (a negated set cannot be spliced into a class;
// they differ only on the characters above), and \H there is refused.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace peerserve {

Result<std::string> oniguruma_escapes_for_pcre2(std::string_view pattern);

}  // namespace peerserve

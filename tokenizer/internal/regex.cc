#include "tokenizer/internal/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "tokenizer/internal/oniguruma_escapes.h"
#include "tokenizer/internal/utf8.h"

namespace peerserve {
namespace {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? "PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<char*>(buffer));
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};

// The default JIT stack (32 KiB on the machine stack) can be too small for long runs of
// backtracking (e.g. `\s+(?!\S)` over a megabyte of spaces); such calls retry with this.
constexpr size_t kLargeJitStackBytes = 64 << 20;

}  // namespace

struct Regex::Impl {
  std::string pattern;
  std::unique_ptr<pcre2_code, CodeDeleter> code;
  bool jit = false;
};

Regex::Regex(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL admits no UCP (a literal has no classes to interpret anyway).
  // \C matches one byte even in UTF mode: it would cut characters in half, and the pieces
  // are matched again without a UTF check. Patterns come from downloaded files: refuse it.
  const uint32_t options =
      literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C);
  // Hugging Face's engine (Oniguruma) reads \s, \w and \h its own way.
  std::string source(pattern);
  if (!literal) {
    PS_ASSIGN_OR_RETURN(source, oniguruma_escapes_for_pcre2(pattern));
  }
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return invalid_argument("regex /" + std::string(pattern) + "/ does not compile at offset " +
                            std::to_string(error_offset) +
                            (source == pattern ? "" : " (of it with \\s, \\w, \\h spelled out)") +
                            ": " + pcre2_error_text(error_code));
  }
  auto impl = std::make_unique<Impl>();
  impl->pattern = std::string(pattern);
  impl->code.reset(code);
  impl->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(impl));
}

bool Regex::jit_compiled() const {
  return impl_->jit;
}
const std::string& Regex::pattern() const {
  return impl_->pattern;
}

Status Regex::find_all(std::string_view subject,
                       std::vector<std::pair<size_t, size_t>>& matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(impl_->code.get(), nullptr));
  if (!data) return resource_exhausted("regex: out of memory for match data");
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;

  // Checked once here, so the matches below can skip PCRE2's own check (which would scan
  // the whole subject again at every offset).
  if (!utf8::is_valid(subject)) {
    return invalid_argument("regex /" + impl_->pattern + "/: the text is not valid UTF-8");
  }
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t first_match = matches.size();
  size_t offset = 0;
  while (offset <= subject.size()) {
    int rc = pcre2_match(impl_->code.get(), text, subject.size(), offset, PCRE2_NO_UTF_CHECK,
                         data.get(), context.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !jit_stack) {
      context.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(32 << 10, kLargeJitStackBytes, nullptr));
      if (!context || !jit_stack) return resource_exhausted("regex: out of memory for JIT stack");
      pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
      continue;  // retry the same offset with the large stack
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      matches.resize(first_match);
      // A property of this text (the same text fails the same way every time), not a passing
      // overload: InvalidArgument, which a server answers 400, not 429 "retry later".
      return invalid_argument("regex /" + impl_->pattern + "/ failed on a " +
                              std::to_string(subject.size()) +
                              "-byte text: " + pcre2_error_text(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end > start) {
      matches.emplace_back(start, end);
      offset = end;
    } else {
      // Empty match: step over one whole character, as Hugging Face's find_iter does.
      if (start >= subject.size()) break;
      offset = start + 1;
      while (offset < subject.size() &&
             (static_cast<unsigned char>(subject[offset]) & 0xC0) == 0x80) {
        ++offset;
      }
    }
  }
  return ok_status();
}

}  // namespace peerserve

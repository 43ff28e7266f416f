#include "apps/attention_form_option.h"

namespace peerserve {

void add_attention_form_option(CLI::App* command, std::string* form) {
  command
      ->add_option("--attention-form", *form,
                   "MLA attention form: auto (per chunk, whichever costs fewer FLOPs: plain for "
                   "prefills, absorbed for decode), plain or absorbed. A fixed form makes a "
                   "sequence's logits bitwise independent of how its prompt is split into "
                   "chunks; in bf16 the two forms agree to ~4e-3, not bitwise")
      ->check(CLI::IsMember({"auto", "plain", "absorbed"}))
      ->capture_default_str();
}

AttentionForm attention_form_named(const std::string& form) {
  if (form == "plain") return AttentionForm::kPlain;
  if (form == "absorbed") return AttentionForm::kAbsorbed;
  return AttentionForm::kAuto;
}

}  // namespace peerserve

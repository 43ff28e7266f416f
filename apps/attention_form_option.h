// --attention-form auto|plain|absorbed for the commands that load the model (generate,
// score, serve): which MLA form the attention runs in (model/mla_attention.h). auto picks
// per chunk by cost; fixing one form makes a sequence's logits bitwise independent of how
// the scheduler splits its prompt (docs/kernels.md "Batch invariance").
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "model/model_options.h"

namespace peerserve {

void add_attention_form_option(CLI::App* command, std::string* form);
// The form named by a value the option accepted.
AttentionForm attention_form_named(const std::string& form);

}  // namespace peerserve

// Renders a parsed chat template: jinja2 semantics for the supported subset, with
// jinja2's default Undefined (prints as "", is falsy, iterates as empty; arithmetic,
// attribute access and comparisons on it fail).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/limits.h"

namespace peerserve::jinja {

// `variables` must be a JSON object (the template's global names). Breaking a limit is an
// InvalidArgument error naming it.
Result<std::string> render_template(std::string_view source, const NodeList& nodes,
                                    const nlohmann::ordered_json& variables,
                                    const RenderLimits& limits = {});

}  // namespace peerserve::jinja

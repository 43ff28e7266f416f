#include "tokenizer/chat_template.h"

#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace peerserve {

struct ChatTemplate::Impl {
  std::string source;
  jinja::NodeList nodes;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  auto impl = std::make_unique<Impl>();
  impl->source = jinja::normalize_template_source(source);
  PS_ASSIGN_OR_RETURN(std::vector<jinja::Token> tokens, jinja::tokenize_template(impl->source));
  PS_ASSIGN_OR_RETURN(impl->nodes, jinja::parse_template(impl->source, tokens));
  return ChatTemplate(std::move(impl));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  return jinja::render_template(impl_->source, impl_->nodes, variables);
}

const std::string& ChatTemplate::source() const {
  return impl_->source;
}

}  // namespace peerserve

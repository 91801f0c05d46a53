#include "services/router/chat_renderer.h"

#include <memory>

#include "common/text/chat_template.h"

namespace pw::router {

Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer) {
  if (tokenizer.chat_template().empty()) {
    return Unsupported("tokenizer_config.json has no chat_template");
  }
  auto parsed = ChatTemplate::Parse(tokenizer.chat_template());
  if (!parsed.ok()) return parsed.status().WithContext("tokenizer_config.json chat_template");
  auto tmpl = std::make_shared<ChatTemplate>(std::move(*parsed));
  std::optional<std::string> bos, eos;
  if (!tokenizer.bos_token().empty()) bos = tokenizer.bos_token();
  if (!tokenizer.eos_token().empty()) eos = tokenizer.eos_token();
  return ChatRenderer([tmpl, bos, eos](const std::vector<router::ChatMessage>& messages) {
    ChatTemplateInputs in;
    for (const auto& m : messages) in.messages.push_back({{"role", m.role}, {"content", m.content}});
    in.add_generation_prompt = true;
    in.bos_token = bos;
    in.eos_token = eos;
    return tmpl->Render(in);
  });
}

}  // namespace pw::router

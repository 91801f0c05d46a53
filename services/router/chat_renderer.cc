#include "services/router/chat_renderer.h"

namespace pw::router {

Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer) {
  if (tokenizer.chat_template().empty()) {
    return Unsupported("tokenizer_config.json has no chat_template");
  }
  // The template engine (common/chat_template.h) is not available in this build.
  return Unsupported("no chat template engine in this build");
}

}  // namespace pw::router

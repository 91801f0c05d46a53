// MakeChatRenderer: the model's chat template (tokenizer_config.json "chat_template") as a
// ChatRenderer for the router.
#pragma once

#include "common/text/tokenizer.h"
#include "services/router/tokenizer_codec.h"

namespace pw::router {

// Renders with add_generation_prompt and the tokenizer's bos/eos tokens, as HF's
// apply_chat_template does. Errors: kUnsupported when the model has no chat template or one the
// template engine (common/text/chat_template.h) cannot run; kInvalidArgument when it is malformed.
// The router then refuses chat completions with that message; completions still work.
Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer);

}  // namespace pw::router

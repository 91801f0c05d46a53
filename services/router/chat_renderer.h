// MakeChatRenderer: the model's chat template (tokenizer_config.json "chat_template") as a
// ChatRenderer for the router.
#pragma once

#include "common/tokenizer.h"
#include "services/router/tokenizer_codec.h"

namespace pw::router {

// Errors: kUnsupported when the model has no chat template, or one the template engine cannot
// run (chat completions are then refused with that message; completions still work).
Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer);

}  // namespace pw::router

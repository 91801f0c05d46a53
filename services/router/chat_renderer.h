// MakeChatRenderer: the model's chat template (chat_template.jinja beside the tokenizer, else
// tokenizer_config.json "chat_template") as a ChatRenderer for the router.
#pragma once

#include <string>

#include "common/text/tokenizer.h"
#include "services/router/tokenizer_codec.h"

namespace pw::router {

// Renders with the tokenizer's bos/eos tokens, as HF's apply_chat_template does. The template is
// `model_dir`/chat_template.jinja when that file exists (where transformers 5 saves it; it wins
// over tokenizer_config.json, as in transformers), else the tokenizer's chat_template. Errors:
// kUnsupported when the model has no chat template or one the template engine
// (common/text/chat_template.h) cannot run, naming the file, line and column; kInvalidArgument
// when it is malformed. The router then answers chat requests with ChatUnavailable's error;
// completions still work.
Result<ChatRenderer> MakeChatRenderer(const Tokenizer& tokenizer, const std::string& model_dir = "");

// Whether the template reads a message's content as a list of parts: it loops over something
// named content, or tests a value with `is string` / `is not string` / `is iterable` /
// `is sequence` / `is mapping` (what templates written for parts do). When it does not (it adds
// content to strings, as ChatML templates do, and would fail on a list under HF), the renderer
// gives it each list of text parts as one string, the texts joined by "\n": vLLM's "string"
// content format. Templates that take parts get the list as HF does.
bool ChatTemplateTakesContentParts(const std::string& source);

// A renderer that refuses every conversation with `why` (kUnsupported, "chat completions are
// unavailable: ..."), for a model whose template cannot be used.
ChatRenderer ChatUnavailable(const Status& why);

}  // namespace pw::router

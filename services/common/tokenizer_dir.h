// Where the served model's tokenizer is: the model directory, or the one `--tokenizer DIR|FILE`
// names (vLLM's flag) for a checkpoint that ships none. The router reads tokenizer.json,
// tokenizer_config.json and chat_template.jinja there; `pw serve` checks them there first.
#pragma once

#include <string>

#include "common/status.h"

namespace pw::service {

// `tokenizer` "" -> `model_dir`. A directory -> itself; a file -> its directory, when the file is
// a tokenizer.json (tokenizer_config.json and chat_template.jinja are read beside it). Errors
// name the path: kNotFound when it does not exist, kInvalidArgument for a file of another name.
// Whether tokenizer.json is there is the caller's check (its message says what to do).
Result<std::string> TokenizerDir(const std::string& model_dir, const std::string& tokenizer);

}  // namespace pw::service

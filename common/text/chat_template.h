// Chat templates: renders a conversation into a prompt string the way HF transformers'
// `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` does, for templates
// written in the subset of Jinja that chat templates use.
//
// Environment as HF sets it up: trim_blocks and lstrip_blocks on; variables `messages` (a list
// of {role, content} dicts), `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and
// `documents` (None), and the functions `raise_exception(msg)` and `range(...)`.
//
// Supported syntax:
//   text, {{ expr }}, {# comment #}, whitespace control {%- -%} {{- -}} {#- -#}, {%+ (no lstrip);
//   {% for x in expr %} ... {% endfor %} (with loop.index, index0, revindex, revindex0, first,
//   last, length); {% if %} / {% elif %} / {% else %} / {% endif %}; {% set name = expr %};
//   expressions: string/integer/true/false/none literals, list literals, names, x.attr, x['key'],
//   x[i], x[a:b:c], + - * / // % ~, == != < <= > >=, in / not in, and / or / not,
//   `a if cond else b`, tests `is [not] defined|undefined|none|string|number|boolean|sequence|
//   mapping|true|false`, filters trim, length, count, upper, lower, capitalize, title, string,
//   first, last, join, default, tojson, and string methods strip, lstrip, rstrip, upper, lower,
//   startswith, endswith, replace, split, title, capitalize; dict methods get, keys, values, items.
// Anything else (macros, includes, filters or tests not listed, for-else, break) is refused at
// parse time with kUnsupported naming the line and column; malformed templates with
// kInvalidArgument and the position. Rendering errors (raise_exception, type errors) are
// kInvalidArgument.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pw {

// One chat message. `content` is plain text (callers flatten multi-part content first).
struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = false;
  // The model's special tokens; nullopt leaves the variable undefined, as HF does when the
  // tokenizer has none (printing it gives "", concatenating it is an error).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

namespace jinja {
struct Node;  // parsed template tree (chat_template.cc)
}

class ChatTemplate {
 public:
  // Parses `source` once; the result renders any number of conversations and is immutable
  // (Render is safe to call from several threads).
  static Result<ChatTemplate> Parse(std::string_view source);

  // Renders the conversation. Output is capped at 64 MiB (kResourceExhausted beyond).
  Result<std::string> Render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Node> root_;
};

}  // namespace pw

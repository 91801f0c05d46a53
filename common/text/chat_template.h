// Chat templates: renders a conversation into a prompt string the way HF transformers'
// `apply_chat_template(messages, tools=..., tokenize=False, add_generation_prompt=...,
// continue_final_message=..., **kwargs)` does, for templates written in the Jinja that chat
// templates use. Checked byte for byte against jinja2 on the templates real checkpoints ship
// (tests/fixtures/chat_templates/, tests/common/chat_template_real_test.cc).
//
// Environment as HF sets it up: trim_blocks and lstrip_blocks on, loop controls on; variables
// `messages` (each message as given: role, content as a string or a list of parts, tool_calls,
// tool_call_id, name, reasoning_content, ...; keys whose value is null are dropped, and the
// reasoning under `reasoning_content`, `thinking` or `reasoning` is given under both
// `reasoning_content` and `thinking`, as HF does), `tools` and `documents` (None when absent),
// `add_generation_prompt`, `bos_token`, `eos_token`, the extra variables a request passes
// (chat_template_kwargs), and the functions `raise_exception(msg)`, `strftime_now(format)`,
// `namespace(...)`, `range(...)` and `dict(...)`.
//
// Supported syntax:
//   text, {{ expr }}, {# comment #}, whitespace control {%- -%} {{- -}} {#- -#}, {%+ (no lstrip);
//   {% for x[, y] in expr [if cond] %} ... [{% else %}] {% endfor %} with loop.index, index0,
//   revindex, revindex0, first, last, length, previtem, nextitem, cycle(...), and
//   {% break %} / {% continue %}; {% if %} / {% elif %} / {% else %} / {% endif %};
//   {% set name = expr %}, {% set ns.attr = expr %} on a namespace(), {% set name %}...{% endset %};
//   {% macro name(arg, arg=default) %}...{% endmacro %} and calls with positional and keyword
//   arguments; {% call[(params)] macro(args) %}...{% endcall %}, the body rendered by caller(...)
//   where the block stands; {% filter name(args) %}...{% endfilter %};
//   {% generation %}...{% endgeneration %};
//   expressions: string/integer/float/true/false/none literals, list, tuple and dict literals,
//   names, x.attr, x['key'], x[i], x[a:b:c] (strings by code point, as Python), + - * / // % ~,
//   == != < <= > >=, in / not in, and / or / not, `a if cond else b`;
//   tests `is [not]` defined, undefined, none, string, number, integer, float, boolean, sequence,
//   iterable, mapping, callable, true, false, odd, even, divisibleby, lower, upper, equalto/eq/==,
//   ne/!=, lt/<, le/<=, gt/>, ge/>=, in, sameas (with none, true or false);
//   filters trim, length, count, upper, lower, capitalize, title, string, first, last, join,
//   default/d, tojson(indent=, ensure_ascii=, sort_keys=), list, items, dictsort, unique,
//   replace, indent(width, first=, blank=), wordcount, int, float, abs, round, safe, select,
//   reject, selectattr, rejectattr, map(filter or attribute=), sort(reverse=, case_sensitive=,
//   attribute= one or several, comma-separated), min and max(case_sensitive=, attribute=),
//   format (printf-style: %s %r %d %i %%, %(name)s);
//   string methods strip, lstrip, rstrip, upper, lower, startswith, endswith, replace, split,
//   title, capitalize, format (plain fields: {}, {0}, {name}, {{ }}); dict methods get, keys,
//   values, items. The methods that modify a list or dict (append, pop, update, ...) parse and
//   fail when called, as under HF's immutable sandbox (SecurityError). Case changes (upper,
//   lower, title, capitalize, tests lower/upper) are Python's on all of Unicode
//   (common/text/unicode_case.h), the `title` filter jinja2's own (words split at '-', brackets
//   and whitespace).
// A filter or test jinja2 itself does not define (DeepSeek-V3.2's `from_json`) is refused at
// parse time, except where jinja2 defers the check to the moment it is reached (an if's test
// and branches, an inline if, outside any loop, macro or block nested there): there rendering
// fails only if it is reached, as under HF.
// Anything else (include, import, extends, recursive loops, jinja2's other filters, tests or
// functions) is refused at parse time with kUnsupported naming the line and column; malformed
// templates with kInvalidArgument and the position. Rendering errors (raise_exception, type
// errors) are kInvalidArgument.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pw {

// A plain-text chat message, for callers that have nothing but role and text.
struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateInputs {
  // The conversation as OpenAI / HF messages: an array of objects, key order kept (templates
  // iterate over dicts in insertion order, as Python does).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // Tool schemas ({"type": "function", "function": {...}}); null: `tools` is None.
  nlohmann::ordered_json tools;
  // Extra template variables (chat_template_kwargs, e.g. enable_thinking); they override the
  // ones above of the same name, as HF's **kwargs do.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = false;
  // Render the last message open, for the model to continue it (HF's continue_final_message):
  // the prompt ends right after its content. Incompatible with add_generation_prompt.
  bool continue_final_message = false;
  // The instant strftime_now() formats (Unix seconds); nullopt: now. Shown in local time (the
  // TZ environment variable, else /etc/localtime) with no zone, as HF's datetime.now() is:
  // %Z and %z give "".
  std::optional<int64_t> now_unix;
  // The model's special tokens; nullopt leaves the variable undefined, as HF does when the
  // tokenizer has none (printing it gives "", concatenating it is an error).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;

  // Messages from plain role/text pairs.
  static nlohmann::ordered_json TextMessages(const std::vector<ChatMessage>& messages);
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

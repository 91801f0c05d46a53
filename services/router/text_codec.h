// TextCodec: the router's view of the tokenizer and chat template (text <-> token ids).
//
// The router tokenizes prompts (to count them against the context and to send ids to workers)
// and detokenizes streamed ids incrementally. tokenizer_codec.h adapts the model's tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "services/router/openai_api.h"

namespace pw::router {

// Turns a stream of token ids into text. Push() returns only complete UTF-8 characters: bytes
// of a character split across tokens are held until it is complete, so a client never receives
// half a character. Flush() returns what is held at the end (invalid bytes replaced by U+FFFD).
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string Push(int32_t token) = 0;
  virtual std::string Flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Token ids of `text` (no special tokens added). Errors name the problem (invalid UTF-8).
  virtual Result<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // The model's chat template applied to a conversation (openai_api.h's ChatPrompt: messages
  // whole, tools, template kwargs).
  virtual Result<std::string> RenderChatPrompt(const ChatPrompt& prompt) const = 0;
  virtual std::unique_ptr<TextDecoder> NewDecoder() const = 0;
  virtual int32_t vocab_size() const = 0;
  // Token ids that end generation (the model's end-of-sequence token; for chat also the
  // template's end-of-turn token when the vocabulary has one).
  virtual std::vector<int32_t> stop_token_ids(Endpoint endpoint) const = 0;
  // The raw bytes a token stands for (may be part of a UTF-8 character; a special token's
  // literal content); "" for an unknown id.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Special tokens (end of text, end of turn) produce no text in a response.
  virtual bool IsSpecial(int32_t id) const = 0;
  // Text of `ids` with special tokens (invalid UTF-8 replaced by U+FFFD).
  virtual Result<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // tokenizer_config.json's bos/eos token strings ("" when absent).
  virtual std::string bos_token() const = 0;
  virtual std::string eos_token() const = 0;
};

}  // namespace pw::router

// TokenizerCodec: TextCodec over the model's byte-level BPE tokenizer (common/text/tokenizer.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/text/tokenizer.h"
#include "services/router/text_codec.h"

namespace pw::router {

// Renders a conversation to the prompt text (the model's chat template).
using ChatRenderer = std::function<Result<std::string>(const ChatPrompt&)>;

class TokenizerCodec final : public TextCodec {
 public:
  // `renderer` may be empty: chat requests then fail with a clear error.
  TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer, ChatRenderer renderer);

  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  Result<std::string> RenderChatPrompt(const ChatPrompt& prompt) const override;
  std::unique_ptr<TextDecoder> NewDecoder() const override;
  int32_t vocab_size() const override { return tokenizer_->VocabSize(); }
  std::vector<int32_t> stop_token_ids(Endpoint endpoint) const override;
  std::string TokenBytes(int32_t id) const override;
  bool IsSpecial(int32_t id) const override { return tokenizer_->IsSpecial(id); }
  Result<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return tokenizer_->Decode(ids);
  }
  std::string bos_token() const override { return tokenizer_->bos_token(); }
  std::string eos_token() const override { return tokenizer_->eos_token(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatRenderer renderer_;
  std::vector<int32_t> eos_ids_;
  std::vector<int32_t> chat_stop_ids_;
};

}  // namespace pw::router

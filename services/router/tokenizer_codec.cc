#include "services/router/tokenizer_codec.h"

#include <algorithm>

namespace pw::router {

namespace {

// Streams text for one request; special tokens (end of turn, end of text) produce no text.
class TokenizerDecoder final : public TextDecoder {
 public:
  explicit TokenizerDecoder(const Tokenizer& t) : decoder_(t, /*skip_special_tokens=*/true) {}
  std::string Push(int32_t token) override {
    auto r = decoder_.Push(token);
    // An id outside the vocabulary (a worker bug) yields no text rather than a failure here;
    // workers only sample ids of the model's vocabulary.
    return r.ok() ? std::move(*r) : std::string();
  }
  std::string Flush() override { return decoder_.Finish(); }

 private:
  IncrementalDecoder decoder_;
};

}  // namespace

TokenizerCodec::TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer, ChatRenderer renderer)
    : tokenizer_(std::move(tokenizer)), renderer_(std::move(renderer)) {
  if (auto eos = tokenizer_->eos_token_id()) eos_ids_.push_back(*eos);
  chat_stop_ids_ = eos_ids_;
  // ChatML-style templates end each turn with <|im_end|>; stop there in chat.
  for (const char* end_of_turn : {"<|im_end|>", "<|eot_id|>", "<|end|>"}) {
    if (auto id = tokenizer_->TokenToId(end_of_turn)) {
      if (std::find(chat_stop_ids_.begin(), chat_stop_ids_.end(), *id) == chat_stop_ids_.end()) {
        chat_stop_ids_.push_back(*id);
      }
    }
  }
}

Result<std::vector<int32_t>> TokenizerCodec::Encode(std::string_view text) const {
  return tokenizer_->Encode(text);
}

Result<std::string> TokenizerCodec::RenderChatPrompt(const ChatPrompt& prompt) const {
  if (!renderer_) return Unsupported("this model has no chat template");
  return renderer_(prompt);
}

std::unique_ptr<TextDecoder> TokenizerCodec::NewDecoder() const {
  return std::make_unique<TokenizerDecoder>(*tokenizer_);
}

std::vector<int32_t> TokenizerCodec::stop_token_ids(Endpoint endpoint) const {
  return endpoint == Endpoint::kChatCompletions ? chat_stop_ids_ : eos_ids_;
}

std::string TokenizerCodec::TokenBytes(int32_t id) const {
  auto b = tokenizer_->TokenBytes(id);
  return b.ok() ? std::string(*b) : std::string();
}

}  // namespace pw::router

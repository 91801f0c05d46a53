// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, giving the same token ids
// as HF `tokenizers` for the configurations it accepts (everything else is refused at load time
// with kUnsupported naming the component):
//   - model: BPE (vocab; merges as "a b" strings or [a, b] pairs; ignore_merges; unk_token and
//     fuse_unk; no dropout, no byte_fallback, no continuing_subword_prefix/end_of_word_suffix);
//   - normalizer: null;
//   - pre_tokenizer: ByteLevel (use_regex, add_prefix_space), or Sequence[Split(Regex,
//   Isolated)...,
//     ByteLevel(use_regex=false)] where each Split pattern is one of the well-known patterns
//     (GPT-2's, Qwen2's, Llama-3's), matched by hand-written code over Unicode tables;
//   - decoder: ByteLevel; post_processor: null or ByteLevel (neither changes ids);
//   - added tokens: split off before pre-tokenization (leftmost-longest match), honouring their
//     special, lstrip, rstrip, single_word and normalized flags as HF does.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal word cache guarded by a
// mutex; Encode/Decode may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace pw {

namespace utf8 {

// Byte offset of the first byte that is not part of a valid UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are invalid), or nullopt when `bytes` is valid.
std::optional<size_t> FindInvalid(std::string_view bytes);

// Appends `bytes` to `out`, replacing each maximal invalid subpart with U+FFFD (the rule of the
// Unicode standard, ch. 3 "U+FFFD substitution of maximal subparts", which Rust's
// String::from_utf8_lossy and so HF's decoders follow). When `final` is false, a trailing
// sequence that is a valid but incomplete prefix of a character is not consumed. Returns the
// number of bytes consumed (== bytes.size() when `final`).
size_t AppendLossy(std::string_view bytes, bool final, std::string* out);

}  // namespace utf8

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  // Derived as HF derives it, not read from the file: the model's id when the vocabulary has
  // `content`, otherwise the next id after the vocabulary and the earlier added tokens.
  int32_t id = -1;
  std::string content;       // the literal text matched in the input (UTF-8)
  bool special = false;      // skipped by Decode(..., skip_special_tokens=true)
  bool lstrip = false;       // the match also swallows whitespace on its left
  bool rstrip = false;       // the match also swallows whitespace on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = true;    // matched after normalization (no normalizer here: order only)
};

class Tokenizer {
 public:
  // Loads tokenizer.json. Errors: kNotFound/kIoError (file), kCorrupt (malformed JSON or a field
  // of the wrong shape; the message names the file and the field, e.g. "model.merges[12]"),
  // kUnsupported (a component or option this tokenizer does not implement, by name).
  static Result<std::unique_ptr<Tokenizer>> FromFile(const std::string& tokenizer_json_path);
  // Same, from the JSON text; `source_name` is used in error messages in place of a path.
  static Result<std::unique_ptr<Tokenizer>> FromJsonText(std::string_view json_text,
                                                         const std::string& source_name);
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json for bos_token,
  // eos_token and chat_template (a string, or a list of {name, template} where "default" wins).
  static Result<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Token ids of `text` (UTF-8), as HF's `encode(text, add_special_tokens=True)` gives them for
  // the supported configurations. Added-token text in the input (e.g. "<|im_end|>") becomes its
  // id. Invalid UTF-8 -> kInvalidArgument naming the byte offset.
  Result<std::vector<int32_t>> Encode(std::string_view text) const;

  // Text of `ids`: the tokens' bytes concatenated, invalid UTF-8 replaced by U+FFFD as HF does.
  // Ids outside the vocabulary -> kOutOfRange naming the position and id.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Raw bytes a token stands for (may be a partial UTF-8 character); kOutOfRange if unknown.
  Result<std::string_view> TokenBytes(int32_t id) const;

  // Token string as written in tokenizer.json (byte-level alphabet for model tokens, literal
  // content for added tokens), and back. Added tokens take precedence as in HF.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;

  // One more than the largest id of the model vocabulary or the added tokens.
  int32_t VocabSize() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool IsSpecial(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // From tokenizer_config.json (FromModelDir); empty/nullopt when absent.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  std::optional<int32_t> bos_token_id() const { return bos_token_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_token_id_; }
  const std::string& chat_template() const { return chat_template_; }

 private:
  friend class TokenizerLoader;
  Tokenizer();

  // A pre-tokenizer stage; see tokenizer.cc for the patterns.
  enum class SplitPattern : uint8_t { kGpt2, kQwen2, kLlama3 };
  struct PreTokStage {
    bool is_byte_level = false;
    bool add_prefix_space = false;  // ByteLevel only
    bool use_regex = false;         // ByteLevel only: split with the GPT-2 pattern first
    SplitPattern pattern = SplitPattern::kGpt2;  // Split only
  };

  // Appends the ids of one segment of input that holds no added token.
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const;
  // Appends the ids of one pre-tokenized word (raw bytes) through BPE, using the cache.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  // Model.
  std::unordered_map<std::string, int32_t> vocab_;  // byte-level token string -> id
  std::vector<std::string> id_to_token_;            // id -> token string ("" when a hole)
  std::vector<std::string> id_to_bytes_;            // id -> decoded bytes
  std::vector<uint8_t> id_flags_;                   // bit 0: exists, bit 1: special
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<int32_t> rank_to_new_id_;  // merge rank -> merged id
  int32_t byte_to_id_[256];              // id of the single-byte token, -1 when the vocab lacks it
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;

  // Pre-tokenizer pipeline; the last stage is ByteLevel.
  std::vector<PreTokStage> stages_;

  // Added tokens, and per first byte the indices of those to try (longest first), for the two
  // matching passes (normalized=false first, then normalized=true).
  std::vector<AddedToken> added_;
  std::vector<std::vector<int32_t>> added_by_first_byte_[2];
  std::unordered_map<std::string, int32_t> added_to_id_;

  std::string bos_token_, eos_token_, chat_template_;
  std::optional<int32_t> bos_token_id_, eos_token_id_;

  // Word cache: raw word bytes -> ids, for words up to kMaxCachedWordBytes.
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Streaming detokenizer for one sequence: fed one id at a time, returns the text that became
// complete. It never returns part of a UTF-8 character: bytes of an unfinished character are
// held until the next id completes them. The concatenation of every Push() and the final Finish()
// equals tokenizer.Decode(all ids, skip_special_tokens). The tokenizer must outlive the decoder.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  // Text completed by `id` (possibly empty). kOutOfRange for an unknown id (state unchanged).
  Result<std::string> Push(int32_t id);
  // Flushes held bytes: an unfinished character at the end of the stream becomes U+FFFD.
  std::string Finish();
  // Number of bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace pw

// The cluster's prefill/decode split in process, as the reference a served node must equal:
// each prompt on a prefill engine, its KV pages copied to a decode engine (whose experts and
// hooks the caller sets), greedy decode there; the prompts those tests send.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/text/tokenizer.h"
#include "engine/engine.h"

namespace pw::testing {

// Greedy continuations (`max_tokens` each, the first token from prefill) as token ids, past
// end-of-sequence when `ignore_eos`. With `one_at_a_time`, each request decodes alone before
// the next is prefilled (a cold cache per request sees them in order); otherwise all decode
// together in one batch.
inline std::vector<std::vector<int32_t>> SplitGreedyTokens(engine::Engine& pre, engine::Engine& dec,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           int max_tokens, bool one_at_a_time,
                                                           bool ignore_eos = false) {
  engine::SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  std::vector<std::vector<int32_t>> toks(prompts.size());
  auto run = [&] {
    while (dec.HasWork()) {
      auto step = dec.Step();
      if (!step.ok()) {
        ADD_FAILURE() << step.status().ToString();
        break;
      }
      for (auto& u : step->updates) {
        for (int32_t t : u.new_tokens) toks[u.id].push_back(t);
      }
    }
  };
  const engine::KvLayout& kl = dec.kv_pool().layout();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int nb = engine::BlocksForTokens(static_cast<int>(prompts[i].size()), kl.block_size);
    auto src = pre.LeaseKvBlocks(nb).value();
    auto dst = dec.LeaseKvBlocks(nb).value();
    auto first = pre.Prefill(prompts[i], src, p);
    EXPECT_TRUE(first.ok()) << first.status().ToString();
    if (!first.ok()) return toks;
    for (int b = 0; b < nb; ++b) {
      for (int l = 0; l < kl.num_layers; ++l) {
        std::memcpy(dec.LeasedKvPage(dst[b], l), pre.kv_pool().LayerPage(src[b], l),
                    kl.bytes_per_layer());
      }
    }
    EXPECT_TRUE(pre.ReturnKvBlocks(src).ok());
    toks[i].push_back(first->first_token);
    EXPECT_TRUE(dec.AddPrefilledSequence(i, prompts[i], dst, first->first_token, p).ok());
    if (one_at_a_time) run();
  }
  run();
  return toks;
}

// The same continuations decoded to text.
inline std::vector<std::string> SplitGreedy(engine::Engine& pre, engine::Engine& dec,
                                            const Tokenizer& tok,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int max_tokens, bool one_at_a_time) {
  std::vector<std::string> out;
  for (auto& t : SplitGreedyTokens(pre, dec, prompts, max_tokens, one_at_a_time)) {
    out.push_back(tok.Decode(t, /*skip_special_tokens=*/true).value());
  }
  return out;
}

// `n` prompts of 1-5 short English and code snippets, the same for the same seed.
inline std::vector<std::vector<int32_t>> SnippetPrompts(const Tokenizer& tok, int n,
                                                        uint32_t seed) {
  const char* texts[] = {"The sea",          "Once upon a time there was",
                         "int main(int argc, char** argv) {", "In the beginning",
                         "def parse(self, text):", "The manual page says"};
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::string text = texts[i % 6];
    for (int r = static_cast<int>(rng() % 5); r > 0; --r) {
      text += std::string(" ") + texts[rng() % 6];
    }
    out.push_back(tok.Encode(text).value());
  }
  return out;
}

}  // namespace pw::testing

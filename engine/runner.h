// Runner: the batched forward pass over the paged KV cache (internal to the engine).
//
// A batch is a list of items, each a run of consecutive tokens of one sequence: a decode
// token (n = 1) or a prompt chunk. Every token attends to all positions [0, its own] of its
// sequence through the sequence's block table: the KV of earlier positions must already be in
// the blocks; the items' own K/V are written there first (causal within the chunk).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "engine/kv_cache.h"
#include "engine/models/model.h"
#include "engine/layers/moe_layer.h"
#include "engine/experts/bf16_expert_provider.h"

namespace pw::engine {

enum class LogitsWanted : uint8_t { kNone, kLast, kAll };

struct ForwardItem {
  uint64_t seq_id = 0;
  const int32_t* tokens = nullptr;  // [n] input token ids (validated by the caller)
  int n = 0;
  int start_pos = 0;                // absolute position of tokens[0]
  const int32_t* blocks = nullptr;  // block table, >= BlocksForTokens(start_pos + n) entries
  LogitsWanted logits = LogitsWanted::kNone;
};

class Runner {
 public:
  Runner(const Model& model, KvBlockPool* pool, int num_threads);

  void SetHooks(const MoeHooks& hooks);
  cpu::ThreadPool* thread_pool() { return &threads_; }

  // Runs one batch. `pure_decode`: every item is a decode token (LYNX's phase gate).
  // Logits rows are appended to *logits in item order: 1 row for kLast, n rows for kAll,
  // each [vocab]. On error the KV of the batch's positions may have been partly written.
  Status Forward(std::span<const ForwardItem> items, bool pure_decode, std::vector<float>* logits);

 private:
  void Attention(int layer, size_t T);

  const Model& model_;
  const ModelConfig& cfg_;
  KvBlockPool* pool_;
  cpu::ThreadPool threads_;
  const cpu::DenseKernels& k_;
  Bf16ExpertProvider bf16_provider_;
  AllResident all_resident_;
  MoeHooks hooks_;

  // Per-token metadata of the current batch.
  std::vector<uint64_t> tok_seq_;
  std::vector<int32_t> tok_pos_;
  std::vector<const int32_t*> tok_blocks_;
  // Activations.
  std::vector<float> x_, h_, q_, k_buf_, v_buf_, attn_, tmp_, cos_, sin_;
  std::vector<float> mlp_tmp_;
  MoeScratch moe_;
};

}  // namespace pw::engine

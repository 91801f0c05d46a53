// CpuRunner: the batched forward pass on the CPU (runner.h), over the paged KV cache of a
// memory::KvBlockPool (K/V written through the pool's pages, attention read through its
// paged-KV view, kernels/cpu/paged_attention.h). Dense products split over its own thread
// pool with the CPU's best DenseKernels table.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/experts/bf16_expert_provider.h"
#include "engine/layers/gated_delta_net.h"
#include "engine/layers/moe_layer.h"
#include "engine/models/model.h"
#include "engine/runner/runner.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"
#include "memory/kv_blocks.h"

namespace pw::engine {

class CpuRunner final : public Runner {
 public:
  // `model` and `kv` are borrowed and must outlive the runner. `num_threads` includes the
  // calling thread.
  CpuRunner(const Model& model, memory::KvBlockPool* kv, int num_threads);

  Status Forward(const Batch& batch, std::vector<float>* logits) override;
  void SetHooks(const MoeHooks& hooks) override;
  void SetBlockTimes(BlockTimes* times) override { times_ = times; }

 private:
  // Sizes the buffers for T tokens, fills the embeddings, per-token metadata and RoPE tables.
  // Returns T.
  size_t Prepare(std::span<const ForwardItem> items);
  // x += o(attention(norm(x))) for layer l; writes the batch's K/V into the blocks first.
  void AttentionBlock(int layer, const LayerWeights& w, size_t T);
  // x += gated_delta_net(norm(x)) for a linear-attention layer; each item's sequence state is
  // read from (zero at position 0) and written back to its first block.
  void LinearAttentionBlock(int layer, const LayerWeights& w, size_t T,
                            std::span<const ForwardItem> items);
  // x += o(mla(norm(x))) for a multi-head latent attention layer, in the absorbed form: each
  // token's latent and RoPE key are written into the blocks (kLatent pages), each head's query
  // absorbs W_UK, attention runs over the latents (kernels/cpu/latent_attention.h), and W_UV
  // maps each head's weighted latent to its value; prefill and decode alike.
  void MlaAttentionBlock(int layer, const LayerWeights& w, size_t T);
  // q/k/v of token i after bias, q/k-norm, clipping and RoPE, with layer `layer`'s head size
  // and kv heads.
  void ShapeQkv(int layer, const LayerWeights& w, size_t i);
  void WriteKv(int layer, size_t i);
  void Attention(int layer, size_t T);
  // x += mlp(norm(x)) for layer l (routed experts through the hooks, or the dense MLP).
  Status MlpBlock(int layer, const LayerWeights& w, size_t T, bool pure_decode);
  // gemma4's feed-forward (the family's sandwich): the dense MLP and the experts side by side,
  // each output normed, then x = (x + norm(sum)) * layer_scalar.
  Status SandwichMlpBlock(int layer, const LayerWeights& w, size_t T, bool pure_decode);
  RoutingContext Routing(int layer, size_t T, bool pure_decode);
  // Final norm and lm_head on the rows the items want; appended to *logits.
  void Logits(std::span<const ForwardItem> items, std::vector<float>* logits);

  const Model& model_;
  const ModelConfig& cfg_;
  memory::KvBlockPool* kv_;
  cpu::ThreadPool threads_;
  const kernels::DenseKernels& k_;
  Bf16ExpertProvider bf16_provider_;
  AllResident all_resident_;
  MoeHooks hooks_;
  BlockTimes* times_ = nullptr;  // borrowed; SetBlockTimes

  // Per-token metadata of the current batch.
  std::vector<uint64_t> tok_seq_;
  std::vector<int32_t> tok_pos_;
  std::vector<const int32_t*> tok_blocks_;
  // Activations.
  std::vector<float> x_, h_, q_, k_buf_, v_buf_, attn_, tmp_, cos_, sin_;
  std::vector<float> mlp_tmp_;
  // Sliding layers' RoPE when they have their own (Model::sliding_rope); else empty.
  std::vector<float> sliding_cos_, sliding_sin_;
  // The sandwich's router input and expert output [T, H], and weights of 1 (unscaled norms).
  std::vector<float> router_x_, moe_out_, ones_;
  MoeScratch moe_;
  // MLA: the low-rank query, the queries [T, nh*qk], the latents [T, r + rope], the absorbed
  // queries [T, nh*(r + rope)] and the heads' weighted latents [T, nh*r].
  std::vector<float> mla_qa_, mla_q_, mla_kv_, mla_qabs_, mla_lat_;
  // Output-gated attention: q_proj's rows before the split, and the gate.
  std::vector<float> q_wide_, gate_;
  // Linear-attention layers: the batch's sequence states, contiguous while the layer runs.
  std::vector<float> states_;
  std::vector<DeltaNetSequence> delta_seqs_;
  GatedDeltaNetScratch delta_;
};

}  // namespace pw::engine

// ExpertLayerCall: everything the routed experts of one MoE layer compute for one batch, handed
// to the expert provider in ONE call (ExpertWeightProvider::RunExperts, moe.h).
//
// For every expert the batch uses, its token rows and gate weights; the provider computes
//   for each group g (ascending expert id), for each row r of g:
//     h       = act(gate_e x[token], up_e x[token])            gate_up block: [2I, H]
//     out[token] += weight * (down_e h)                        down block:    [H, I]
// at each block's width, from wherever its weights live (a mapped store, pool pages, a GPU).
// act is the call's ExpertActivation (the family's; SwiGLU: silu(gate) * up), mapped to its
// elementwise op in one place (expert_activation.h); a provider that meets a kind it does not
// implement fails the call with kUnsupported rather than computing another.
// Additions into `out` happen in group order (ascending expert), then row order, so results do
// not depend on how a provider schedules the work. A provider sees the whole layer at once:
// it may quantize x once for every expert, and split all experts' rows over its threads in
// one dispatch.
//
// Layout (FlashInfer-style indptr): groups[g] covers rows[groups[g].begin, groups[g].end) of
// `rows`; a token appears at most once per group (rows keep the router's token-major order;
// a routing hook's additions may follow). Every group is non-empty; groups do not overlap.
// A provider reads only the rows its groups cover, so a call narrowed to some of the groups
// (a wrapper splitting a layer) stays valid. Built by RunMoeLayer (moe_layer.h), which checks what a
// routing hook returned first; providers may rely on the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/models/moe_kinds.h"

namespace pw::cpu {
class ThreadPool;
}

namespace pw::engine {

class ExpertWorkspace;

// One expert of the layer and its slice of ExpertLayerCall::rows.
struct ExpertGroup {
  int32_t expert = 0;  // in [0, num_experts)
  int32_t begin = 0;   // first row in ExpertLayerCall::rows
  int32_t end = 0;     // one past the last; end > begin
  int32_t size() const { return end - begin; }
};

// One (token, weight) pair routed to a group's expert.
struct ExpertRow {
  int32_t token = 0;   // row of x and out, in [0, num_tokens)
  float weight = 0.f;  // gate weight multiplying the expert's output
};

struct ExpertLayerCall {
  int layer = 0;
  size_t num_tokens = 0;  // T
  size_t hidden = 0;      // H: columns of x and out
  size_t ffn = 0;         // I: the experts' intermediate width
  ExpertActivation activation = ExpertActivation::kSwiGlu;  // between gate_up and down
  // Expert biases (gpt_oss), by expert id; null: none. gate_up_bias [E, 2I] (an expert's gate
  // I values, then its up I) is added to gate_up's rows before act, down_bias [E, H] to down's
  // before the weight, by every CPU runner (bf16, int8, block by block). They are the model's
  // (LayerWeights), never a store's: wherever the matrices come from, the biases are the same.
  const float* gate_up_bias = nullptr;
  const float* down_bias = nullptr;
  const float* x = nullptr;              // [T, H] the layer's post-attention-normed input
  std::span<const ExpertGroup> groups;   // the experts used, ascending id
  std::span<const ExpertRow> rows;       // indexed by the groups' ranges
  float* out = nullptr;                  // [T, H] accumulated into (+=), never read otherwise
  ExpertWorkspace* workspace = nullptr;  // scratch lent by the engine for this call
  cpu::ThreadPool* pool = nullptr;       // null: run on the calling thread
};

}  // namespace pw::engine

// The MoE step and its seams.
//
// One MoE layer runs as ONE function (RunMoeLayer, see moe_layer.h) in this order:
//
//   router logits L = x . W_router^T                 [T, E]
//   (d) recorder->Record(ctx, router's selection)   optional trace of logits + choices
//   the family's gate (RunMoeGate, engine/layers/moe_gate.h): per-expert scores and each
//   token's top-k with weights: softmax -> top-k (descending probability, lower expert id on
//   ties) -> renormalised to sum 1 when the model says so (norm_topk_prob; mixtral always); or
//   (glm4_moe) sigmoid, selection by sigmoid + bias within the best groups, weights from the
//   unbiased sigmoid (GateKind in engine/models/moe_kinds.h)
//   (c) hook->Rewrite(ctx, &assignments)             LYNX remap, miss policy substitution...
//       (e) ctx.fetcher->Fetch / Admit / Evict           a miss policy's explicit weight moves
//   assignments grouped per expert (ExpertLayerCall, expert_layer_call.h), then ONE call:
//     (a) provider->RunExperts(call)                  for every used expert e:
//         h = act(gate_e x_e, up_e x_e);  out[token] += weight * down_e h
//         (act: the family's ExpertActivation, SwiGLU today)
//   shared expert (qwen2_moe): out += sigmoid(x . w_gate) * MLP_shared(x);
//   shared experts (glm4_moe): out += MLP_shared(x), ungated; dense weights, never paged
//
// (b) residency is a query the hook (and the provider) may consult; the MoE step itself never
// skips an expert: whatever the assignments name after the hook runs is computed, through the
// provider (which may fetch a non-resident block synchronously, or fail the step).
//
// All pointers in these interfaces are borrowed for the duration of the call. Implementations
// are called from the engine's driving thread only (they may use the thread pool given).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/expert_block.h"
#include "common/status.h"
#include "engine/experts/expert_layer_call.h"

namespace pw::engine {

// Which linear block of an expert (common/expert_block.h): kGateUp [2 * I, H] (rows [0, I)
// gate_proj, [I, 2I) up_proj), kDown [H, I].
using pw::ExpertProj;

// One routed (token, expert) pair.
struct ExpertAssignment {
  int32_t token = 0;   // row of the batch, in [0, num_tokens)
  int32_t expert = 0;  // in [0, num_experts)
  float weight = 0.f;  // gate weight multiplying the expert's output (after normalisation)
  int16_t rank = -1;   // 0..k-1: position in the router's top-k; -1: added by a hook
};

// (a) Supplies the routed experts of a layer: computes every expert a batch uses, at each
// block's width, in one call per MoE layer (so a provider can share work across experts:
// quantize the layer input once, split all experts' rows over its threads in one dispatch).
// The default provider reads bf16 weights from the checkpoint; the any-precision store
// implements it reading bit-planes at each block's committed width.
class ExpertWeightProvider {
 public:
  virtual ~ExpertWeightProvider() = default;
  // call.out[token] += weight * expert(call.x[token]) for every row of every group, fp32
  // accumulation, additions in group order (expert_layer_call.h). A non-OK Status (block
  // unavailable, fetch failed) fails the engine step; `out` is then unspecified.
  virtual Status RunExperts(const ExpertLayerCall& call) = 0;
  // Bits per weight the block is read at now: 16 for bf16, 3..8 for any-precision; 0 when not
  // resident (RunExperts must then fetch it or fail).
  virtual int Bits(int layer, int expert, ExpertProj proj) const = 0;
};

// (b) Which experts are resident (readable without a fetch) right now.
class ExpertResidency {
 public:
  virtual ~ExpertResidency() = default;
  virtual bool IsResident(int layer, int expert) const = 0;
};

// Every expert resident.
class AllResident final : public ExpertResidency {
 public:
  bool IsResident(int, int) const override { return true; }
};

class ExpertFetcher;

// What a hook or recorder sees of one MoE layer of one batch.
struct RoutingContext {
  int layer = 0;
  int num_tokens = 0;           // T
  int num_experts = 0;          // E
  int top_k = 0;                // k
  bool norm_topk_prob = false;  // the model renormalises the top-k weights to sum 1
  // True when every token of the batch is a decode token (no prompt work): LYNX's phase gate.
  bool pure_decode = false;
  const float* router_logits = nullptr;        // [T, E] pre-softmax logits
  const float* router_probs = nullptr;         // [T, E] the gate's scores (softmax of
                                               // router_logits for GateKind::kSoftmaxTopK,
                                               // the unbiased sigmoid for
                                               // kSigmoidGroupedTopK): the gate weights
                                               // come from these
  // What the gate ranked experts by, [T, E], higher first: router_probs for kSoftmaxTopK;
  // sigmoid + e_score_correction_bias, -inf outside the token's kept groups, for
  // kSigmoidGroupedTopK. A hook that picks other experts ranks them by these.
  const float* selection_scores = nullptr;
  // [E] the layer's e_score_correction_bias for kSigmoidGroupedTopK (router_probs + it: the
  // selection scores before the group mask); null for kSoftmaxTopK.
  const float* selection_bias = nullptr;
  GateKind gate = GateKind::kSoftmaxTopK;
  float weight_scale = 1.f;  // every routed weight's factor (routed_scaling_factor)
  const uint64_t* seq_ids = nullptr;           // [T] sequence of each token
  const int32_t* positions = nullptr;          // [T] absolute position of each token
  const ExpertResidency* residency = nullptr;  // never null inside the engine
  ExpertFetcher* fetcher = nullptr;            // null: fetches are idealised (nothing to move)
};

// (c) Rewrites the router's assignments before experts run (LYNX, miss policies). On entry
// `assignments` holds the router's top-k per token, token-major, rank order. The hook may
// change experts and weights, drop or add entries; on return every entry must have a token in
// [0, T), an expert in [0, E) and a finite weight, and (token, expert) pairs must be unique —
// the engine checks and fails the step with kInternal otherwise.
class RoutingHook {
 public:
  virtual ~RoutingHook() = default;
  virtual Status Rewrite(const RoutingContext& ctx, std::vector<ExpertAssignment>* assignments) = 0;
};

// (d) Receives each MoE layer's router logits and the router's own selection (before any
// hook), e.g. to write router-logit traces for pw-sim or routing statistics for the planner.
class RouterLogitsRecorder {
 public:
  virtual ~RouterLogitsRecorder() = default;
  virtual void Record(const RoutingContext& ctx, const std::vector<ExpertAssignment>& selected) = 0;
};

// (e) Moves expert weights when a miss policy (a routing hook) decides to, so a fetch is an
// explicit call at the routing step, not hidden inside the weight provider. Optional: without
// one the policy's decisions are applied to residency only (emulation: exact outputs, fetch
// time idealised). Called from the hook, on the engine's driving thread.
class ExpertFetcher {
 public:
  virtual ~ExpertFetcher() = default;
  // Synchronous: on OK the expert's blocks are readable by this step's expert computation.
  // A non-OK Status fails the engine step.
  virtual Status Fetch(int layer, int expert) = 0;
  // Starts an asynchronous load (background admission); the serving process tells the policy
  // when it has committed. A non-OK Status fails the step.
  virtual Status Admit(int layer, int expert) = 0;
  // The expert leaves residency; its memory may be released once no in-flight step reads it
  // (the next safe point).
  virtual void Evict(int layer, int expert) = 0;
};

// The seams an engine uses; null members mean: bf16 experts from the checkpoint, every expert
// resident, the router's choice unchanged, nothing recorded, no weight moves.
struct MoeHooks {
  ExpertWeightProvider* provider = nullptr;
  const ExpertResidency* residency = nullptr;
  RoutingHook* routing_hook = nullptr;
  RouterLogitsRecorder* recorder = nullptr;
  ExpertFetcher* fetcher = nullptr;
};

}  // namespace pw::engine

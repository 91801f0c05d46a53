#include "engine/layers/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/experts/expert_activation.h"
#include "engine/layers/moe_gate.h"
#include "engine/ops/linear.h"

namespace pw::engine {

Status RunDenseMlp(const MlpWeights& w, ExpertActivation act, const float* x, size_t T,
                   size_t hidden, float* out, std::vector<float>* tmp, cpu::ThreadPool* pool,
                   const kernels::DenseKernels& k) {
  PW_ASSIGN_OR_RETURN(const ExpertActivationFn act_fn, ExpertActivationOp(act, k));
  const size_t f = static_cast<size_t>(w.gate.rows);
  tmp->resize(T * 2 * f);
  float* gu = tmp->data();
  Linear(pool, k, x, hidden, T, w.gate, gu, 2 * f);
  Linear(pool, k, x, hidden, T, w.up, gu + f, 2 * f);
  for (size_t t = 0; t < T; ++t) act_fn(gu + t * 2 * f, gu + t * 2 * f + f, f, gu + t * 2 * f);
  Linear(pool, k, gu, 2 * f, T, w.down, out, hidden);
  return Status::Ok();
}

Status RunMoeLayer(const ModelConfig& config, const LayerWeights& w, RoutingContext ctx,
                   const float* x, float* out, const MoeHooks& hooks,
                   ExpertWeightProvider* provider, MoeScratch* s, cpu::ThreadPool* pool,
                   const kernels::DenseKernels& k, const float* router_x) {
  const size_t T = static_cast<size_t>(ctx.num_tokens);
  const size_t H = static_cast<size_t>(config.hidden_size);
  const size_t E = static_cast<size_t>(config.num_experts);
  const size_t K = static_cast<size_t>(config.num_experts_per_tok);
  const size_t I = static_cast<size_t>(config.moe_intermediate_size);
  ctx.num_experts = static_cast<int>(E);
  ctx.top_k = static_cast<int>(K);
  ctx.norm_topk_prob = config.norm_topk_prob;

  // Router: logits, then the family's gate (moe_gate.h): scores and each token's top-k.
  s->logits.resize(T * E);
  s->probs.resize(T * E);
  Linear(pool, k, router_x != nullptr ? router_x : x, H, T, w.router, s->logits.data(), E);
  if (!w.router_logits_bias.empty()) {
    for (size_t t = 0; t < T; ++t) k.axpy(1.f, w.router_logits_bias.data(), E, &s->logits[t * E]);
  }
  s->assignments.clear();
  MoeGate gate{w.gate, static_cast<int>(K), config.norm_topk_prob};
  gate.n_group = static_cast<int>(config.n_group);
  gate.topk_group = static_cast<int>(config.topk_group);
  gate.weight_scale = static_cast<float>(config.routed_scaling_factor);
  gate.bias = w.router_bias.empty() ? nullptr : w.router_bias.data();
  const bool ranks_by_probs = w.gate == GateKind::kSoftmaxTopK;
  if (!ranks_by_probs) s->selection.resize(T * E);
  Status routed = RunMoeGate(gate, s->logits.data(), T, E, k, s->probs.data(),
                             ranks_by_probs ? nullptr : s->selection.data(), &s->topk_idx,
                             &s->assignments);
  if (!routed.ok()) return routed.WithContext("layer " + std::to_string(ctx.layer));
  ctx.router_logits = s->logits.data();
  ctx.router_probs = s->probs.data();
  ctx.selection_scores = ranks_by_probs ? s->probs.data() : s->selection.data();
  ctx.selection_bias = gate.bias;
  ctx.gate = w.gate;
  ctx.weight_scale = gate.weight_scale;

  if (hooks.recorder != nullptr) hooks.recorder->Record(ctx, s->assignments);
  if (hooks.routing_hook != nullptr) {
    PW_RETURN_IF_ERROR(hooks.routing_hook->Rewrite(ctx, &s->assignments));
    // Validate what the hook returned: in range, finite, no duplicate (token, expert).
    s->seen.assign(T * E, 0);
    for (const ExpertAssignment& a : s->assignments) {
      if (a.token < 0 || static_cast<size_t>(a.token) >= T || a.expert < 0 ||
          static_cast<size_t>(a.expert) >= E || !std::isfinite(a.weight)) {
        return Internal("routing hook returned an invalid assignment (token " +
                        std::to_string(a.token) + ", expert " + std::to_string(a.expert) +
                        ") in layer " + std::to_string(ctx.layer));
      }
      uint8_t& m = s->seen[static_cast<size_t>(a.token) * E + static_cast<size_t>(a.expert)];
      if (m) {
        return Internal("routing hook returned token " + std::to_string(a.token) +
                        " twice for expert " + std::to_string(a.expert) + " in layer " +
                        std::to_string(ctx.layer));
      }
      m = 1;
    }
  }

  if (!w.expert_weight_scale.empty()) {
    for (ExpertAssignment& a : s->assignments) a.weight *= w.expert_weight_scale[a.expert];
  }

  // Group assignments per expert (counting sort, stable: token order inside an expert).
  s->offsets.assign(E + 1, 0);
  for (const ExpertAssignment& a : s->assignments) s->offsets[a.expert + 1]++;
  for (size_t e = 0; e < E; ++e) s->offsets[e + 1] += s->offsets[e];
  s->order.resize(s->assignments.size());
  {
    std::vector<int32_t> fill(s->offsets.begin(), s->offsets.end() - 1);
    for (size_t i = 0; i < s->assignments.size(); ++i) {
      s->order[fill[s->assignments[i].expert]++] = static_cast<int32_t>(i);
    }
  }

  std::memset(out, 0, T * H * sizeof(float));
  s->groups.clear();
  s->rows.resize(s->assignments.size());
  for (size_t i = 0; i < s->assignments.size(); ++i) {
    const ExpertAssignment& a = s->assignments[s->order[i]];
    s->rows[i] = {a.token, a.weight};
  }
  for (size_t e = 0; e < E; ++e) {
    if (s->offsets[e + 1] > s->offsets[e]) {
      s->groups.push_back({static_cast<int32_t>(e), s->offsets[e], s->offsets[e + 1]});
    }
  }
  if (!s->groups.empty()) {
    ExpertLayerCall call;
    call.layer = ctx.layer;
    call.num_tokens = T;
    call.hidden = H;
    call.ffn = I;
    call.activation = w.activation;
    if (!w.expert_gate_up_bias.empty()) {
      call.gate_up_bias = w.expert_gate_up_bias.data();
      call.down_bias = w.expert_down_bias.data();
    }
    call.x = x;
    call.groups = s->groups;
    call.rows = s->rows;
    call.out = out;
    call.workspace = &s->experts;
    call.pool = pool;
    PW_RETURN_IF_ERROR(provider->RunExperts(call));
  }

  if (w.has_shared_expert) {
    // out += sigmoid(x . w_gate) * MLP_shared(x), or MLP_shared(x) when it has no gate.
    const bool gated = w.shared_expert_gate.data != nullptr;
    if (gated) {
      s->shared_gate.resize(T);
      Linear(pool, k, x, H, T, w.shared_expert_gate, s->shared_gate.data(), 1);
    }
    s->ye.resize(T * H);
    PW_RETURN_IF_ERROR(
        RunDenseMlp(w.shared_expert, w.activation, x, T, H, s->ye.data(), &s->gate_up, pool, k));
    for (size_t t = 0; t < T; ++t) {
      const float g = gated ? 1.f / (1.f + std::exp(-s->shared_gate[t])) : 1.f;
      k.axpy(g, s->ye.data() + t * H, H, out + t * H);
    }
  }
  return Status::Ok();
}

}  // namespace pw::engine

// Gated DeltaNet: the linear-attention token mixer of qwen3_next's hybrid layers (HF
// transformers' Qwen3NextGatedDeltaNet).
//
// Per token: in_proj_qkvz and in_proj_ba (or, split, in_proj_qkv, in_proj_z, in_proj_b and
// in_proj_a: Qwen3.5) project the normed input; q, k, v go through a causal
// depthwise conv of kernel K with SiLU; q and k are L2-normalised per head (q also scaled by
// 1/sqrt(dk)); per value head, beta = sigmoid(b) and the decay g = -exp(A_log) *
// softplus(a + dt_bias) drive the gated delta rule over the head's [dk, dv] state
// (kernels/cpu/gated_delta_rule.h; value head v reads key head v / (nv / nk)); the output is
// RMS-normed per head, times the norm weight and silu(z), and projected by out_proj.
//
// Prefill runs the recurrence token by token (the step form of the rule, which HF's chunked
// form equals up to rounding), so a prompt chunk, a decode token and a whole prompt share one
// code path and the state after any prefix is the state decode continues from. Each
// sequence's state (LinearAttentionConfig::state_floats: the conv window, then the matrices)
// is read and written by the caller's pointer; sequences of a batch run in parallel.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "common/formats/linear_attention_config.h"
#include "engine/models/model.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/thread_pool.h"

namespace pw::engine {

// The run of consecutive batch tokens [first, first + n) of one sequence, and its state.
struct DeltaNetSequence {
  size_t first = 0;
  size_t n = 0;
  float* state = nullptr;  // [state_floats], updated in place
};

struct GatedDeltaNetScratch {
  std::vector<float> qkvz, ba, core;
};

// out[t] = the layer's output for x[t] (x: the input-normed hidden states, [T, H]; out [T, H]).
// `eps` is the gated norm's epsilon (rms_norm_eps).
void RunGatedDeltaNet(const LinearAttentionConfig& la, float eps, const GatedDeltaNetWeights& w,
                      std::span<const DeltaNetSequence> seqs, const float* x, size_t T, size_t H,
                      float* out, GatedDeltaNetScratch* scratch, cpu::ThreadPool* threads,
                      const kernels::DenseKernels& k);

}  // namespace pw::engine

// A synthetic router-logit trace: for timing pw-sim at shapes no local model has (e.g.
// OLMoE's 16 layers x 64 experts, top-8). Each layer's logits follow a random walk per
// expert, l <- 0.9 l + 0.6 n with n ~ N(0, 1) (starting from 2 n), so routing recurs from token
// to token as in a trained model; top-k by logit, gate weights the softmax over the top-k.
// Fixed seed: the same arguments write the same file. Not for quality: the logits mean nothing.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "policies/misses/router_trace.h"

namespace pw::misses {

// Writes `steps` forward passes of `tokens_per_step` tokens through every layer of `header`.
Status WriteSyntheticTrace(const std::string& path, const TraceHeader& header, int steps,
                           int tokens_per_step, uint32_t seed);

}  // namespace pw::misses

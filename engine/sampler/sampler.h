// Token sampling: greedy, temperature, top-k, top-p, per-request seed, stop tokens, max tokens.
//
// Determinism: the random number for a request's i-th generated token is a pure function of
// (seed, i) (a counter-based generator), so a request gives the same tokens whichever worker
// samples which token, after preemption and recompute, and in any batch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/sampling_check.h"
#include "common/status.h"

namespace pw::engine {

struct SamplingParams {
  // <= 0: greedy (argmax, lowest token id on ties). Otherwise logits are divided by it.
  float temperature = 0.f;
  // Keep only the k most likely tokens; 0 = no limit.
  int top_k = 0;
  // Keep the smallest set of most likely tokens whose probability sums to >= top_p (after
  // top-k); 1 = no limit. Must be in (0, 1].
  float top_p = 1.f;
  // Seeds the request's generator (see above).
  uint64_t seed = 0;
  // Generated tokens at most (>= 1). Reaching it finishes the request (reason kLength).
  int max_tokens = 16;
  // Generating one of these finishes the request (reason kStop). The stop token is reported.
  std::vector<int32_t> stop_token_ids;
  // When false, the model's eos ids (config) also stop the request.
  bool ignore_eos = false;
  // Log-probabilities of each generated token: -1 = none; N >= 0 = the token's own plus the N
  // most likely alternatives (TokenLogprobs below).
  int logprobs = -1;
};

// Largest number of alternatives a request may ask for per token (ValidateSamplingParams).
inline constexpr int kMaxLogprobs = kMaxSamplingLogprobs;

// The log-probability of one token and the most likely alternatives at its position, from
// the log-softmax of the raw logits row the sampler reads (before temperature, top-k and
// top-p: the model's own distribution, as vLLM's default and OpenAI report it).
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.f;
  // The top alternatives, most likely first (ties: lower id first); may include `token`.
  std::vector<std::pair<int32_t, float>> top;
};

// TokenLogprobs of `token` with `top_n` alternatives (0 <= top_n <= vocab_size) from
// logits[0..vocab_size). Log-softmax in double precision.
TokenLogprobs ComputeLogprobs(const float* logits, int vocab_size, int32_t token, int top_n);

// The request's own values of `p`, for CheckSampling (common/sampling_check.h).
SamplingValues ValuesOf(const SamplingParams& p);

// kInvalidArgument naming the field when a parameter is out of range: CheckSampling on the
// request's values (the check the router makes before admitting a request), then max_tokens
// and the stop ids, which the router derives (the context, the tokenizer).
Status ValidateSamplingParams(const SamplingParams& p, int vocab_size);

// Uniform double in [0, 1) for draw `index` of generator `seed` (splitmix64 of both).
double UniformDraw(uint64_t seed, uint64_t index);

// Samples one token from logits[0..vocab). `draw_index` is the number of tokens the request
// has generated before this one. `scratch` is reused between calls to avoid allocation.
// Top-k and top-p are applied to the temperature-scaled distribution, in that order, and the
// kept probabilities are renormalised before drawing. Probabilities are float (the kernels'
// softmax). The draw walks the kept tokens most likely first under top-k or top-p, and in id
// order without either (the same distribution, without ordering the vocabulary).
int32_t SampleToken(const float* logits, int vocab_size, const SamplingParams& p,
                    uint64_t draw_index, std::vector<std::pair<float, int32_t>>* scratch);

// The distribution SampleToken draws from, as (token, probability) sorted by probability
// descending (ties: lower id first); for tests and for logprob reporting. Greedy gives the
// argmax with probability 1.
std::vector<std::pair<int32_t, double>> SamplingDistribution(const float* logits, int vocab_size,
                                                             const SamplingParams& p);

}  // namespace pw::engine

// The one check of a request's sampling values, made in the arithmetic of the sampler that
// uses them (engine/sampler/sampler.h).
//
// The router reads a request's numbers as doubles; the control plane carries them as float32
// (services/proto/cluster.capnp, SamplingParams) and the sampler computes in float32. A range
// checked in double is not the range the sampler sees: top_p = 1e-320 is above 0 as a double and
// exactly 0 as a float. So the router turns each real value into the float the wire will carry
// (ToSamplingFloat) and checks that float with CheckSampling, the very function the workers call
// on what arrives: whatever the router admits, a worker accepts. A worker that refuses a
// request's values all the same (another version) says so as an invalid-request error
// (KvReady/Finish.errorKind), which the router answers with 400 and never counts against the
// worker.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pw {

// Most alternatives a request may ask for per token (logprobs, top_logprobs).
inline constexpr int kMaxSamplingLogprobs = 20;

// The sampling values a request chooses, in the types the control plane carries.
struct SamplingValues {
  float temperature = 0.f;  // 0: greedy; else the logits are scaled by 1 / temperature
  float top_p = 1.f;        // keep the most likely tokens up to this much probability
  int64_t top_k = 0;        // keep the k most likely tokens; 0 = off
  int64_t logprobs = -1;    // -1: none; N: each token's log-probability and N alternatives
};

// A refused value: the request field it came from (the OpenAI API's name) and why.
struct SamplingError {
  std::string param;    // "temperature", "top_p", "top_k" or "logprobs"
  std::string message;  // names the field, the value and what is accepted
};

// The first field of `v` the sampler cannot compute with soundly, or nullopt:
//   temperature  0, or a normal float (>= FLT_MIN; below it 1 / temperature overflows float)
//   top_p        a normal float in [FLT_MIN, 1] (0 keeps nothing)
//   top_k        >= 0
//   logprobs     -1 .. kMaxSamplingLogprobs
// NaN and infinities are refused everywhere.
std::optional<SamplingError> CheckSampling(const SamplingValues& v);

// `value` (a request's number, read as a double) as the float32 the control plane and the
// sampler carry, into *out. Refused, naming `param`, when that float does not stand for the
// value: not finite, beyond float's range, or non-zero yet 0 or subnormal as a float (1e-320
// is 0 as a float; a subnormal keeps too few bits and its reciprocal overflows). Values that
// round to a nearby normal float are taken as that float.
std::optional<SamplingError> ToSamplingFloat(std::string_view param, double value, float* out);

}  // namespace pw

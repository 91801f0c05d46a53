#include "common/sampling_check.h"

#include <cfloat>
#include <charconv>
#include <cmath>

namespace pw {
namespace {

// Shortest text that reads back as `v` in its own type, e.g. "1e-320", "0.9".
template <typename T>
std::string Num(T v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

SamplingError Refuse(std::string_view param, std::string what) {
  return {std::string(param), "'" + std::string(param) + "' " + std::move(what)};
}

bool Normal(float v) { return std::fpclassify(v) == FP_NORMAL; }

}  // namespace

std::optional<SamplingError> CheckSampling(const SamplingValues& v) {
  if (!(v.temperature == 0.f || (Normal(v.temperature) && v.temperature > 0.f))) {
    return Refuse("temperature", "must be 0 (greedy) or a finite number of at least " +
                                     Num(FLT_MIN) + ", got " + Num(v.temperature));
  }
  if (!(Normal(v.top_p) && v.top_p > 0.f && v.top_p <= 1.f)) {
    return Refuse("top_p", "must be in (0, 1] and at least " + Num(FLT_MIN) + ", got " +
                               Num(v.top_p));
  }
  if (v.top_k < 0) return Refuse("top_k", "must be >= 0 (0 = off), got " + std::to_string(v.top_k));
  if (v.logprobs < -1 || v.logprobs > kMaxSamplingLogprobs) {
    return Refuse("logprobs", "must be in [-1, " + std::to_string(kMaxSamplingLogprobs) +
                                  "], got " + std::to_string(v.logprobs));
  }
  return std::nullopt;
}

std::optional<SamplingError> ToSamplingFloat(std::string_view param, double value, float* out) {
  if (!std::isfinite(value)) return Refuse(param, "must be a finite number, got " + Num(value));
  const float f = static_cast<float>(value);
  if (std::isinf(f)) {
    return Refuse(param, "= " + Num(value) + " is beyond the float32 range the sampler uses");
  }
  if (value != 0 && !Normal(f)) {
    return Refuse(param, "= " + Num(value) + " is " + (f == 0.f ? "0" : "subnormal") +
                             " in the float32 arithmetic the sampler uses; the smallest "
                             "non-zero value accepted is " +
                             Num(FLT_MIN));
  }
  *out = f;
  return std::nullopt;
}

}  // namespace pw

#include "engine/models/rope.h"

#include <algorithm>
#include <cmath>

namespace pw::engine {
namespace {

constexpr double kPi = 3.14159265358979323846;

// HF: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32.
std::vector<float> PlainInvFreq(double base, int64_t dim) {
  std::vector<float> f(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[static_cast<size_t>(i)] = 1.0f / static_cast<float>(std::pow(base, static_cast<double>(e)));
  }
  return f;
}

// _compute_yarn_parameters: interpolation (inv_freq / factor) for the low frequencies,
// extrapolation (unchanged) for the high ones, a linear ramp between the correction dims.
std::vector<float> YarnInvFreq(const ModelConfig& c, int64_t dim) {
  const RopeScaling& s = c.rope_scaling;
  const double base = c.rope_theta;
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * kPi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a singular ramp
  const float factor = static_cast<float>(s.factor);
  std::vector<float> f(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = static_cast<float>(std::pow(base, static_cast<double>(e)));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    f[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return f;
}

// _compute_llama3_parameters: wavelengths above original/low_freq_factor divided by factor,
// below original/high_freq_factor kept, a smooth blend between.
std::vector<float> Llama3InvFreq(const ModelConfig& c, int64_t dim) {
  const RopeScaling& s = c.rope_scaling;
  std::vector<float> f = PlainInvFreq(c.rope_theta, dim);
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_context / s.low_freq_factor;
  const double high_wavelen = old_context / s.high_freq_factor;
  const float factor = static_cast<float>(s.factor);
  for (float& x : f) {
    const float wavelen = static_cast<float>(2 * kPi) / x;
    const float scaled = wavelen > low_wavelen ? x / factor : x;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      const float smooth =
          static_cast<float>((old_context / wavelen - s.low_freq_factor) /
                             (s.high_freq_factor - s.low_freq_factor));
      x = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      x = scaled;
    }
  }
  return f;
}

}  // namespace

bool RopeDependsOnLength(const ModelConfig& config, int64_t seq_len) {
  return config.rope_scaling.type == RopeType::kDynamic &&
         seq_len > config.max_position_embeddings;
}

RopeTable ComputeRope(const ModelConfig& c, int64_t seq_len) {
  // head_dim, or its rotated part (partial_rotary_factor); gemma4's full layers rotate over
  // their own head size (HF computes each layer type's frequencies from its per-layer config).
  const int64_t dim = c.full_head_dim > 0 ? c.full_head_dim : c.rotary_dim;
  const RopeScaling& s = c.rope_scaling;
  RopeTable t;
  switch (s.type) {
    case RopeType::kDefault:
      t.inv_freq = PlainInvFreq(c.rope_theta, dim);
      break;
    case RopeType::kLinear: {
      t.inv_freq = PlainInvFreq(c.rope_theta, dim);
      const float factor = static_cast<float>(s.factor);
      for (float& x : t.inv_freq) x /= factor;
      break;
    }
    case RopeType::kDynamic: {
      // _compute_dynamic_ntk_parameters: base * ((factor * L / max) - (factor - 1))^(d/(d-2)),
      // L = max(seq_len, max_position_embeddings).
      const double max_pos = static_cast<double>(c.max_position_embeddings);
      const double len = std::max(static_cast<double>(seq_len), max_pos);
      const double d = static_cast<double>(dim);
      const double base =
          c.rope_theta * std::pow((s.factor * len / max_pos) - (s.factor - 1), d / (d - 2));
      t.inv_freq = PlainInvFreq(base, dim);
      break;
    }
    case RopeType::kYarn:
      t.inv_freq = YarnInvFreq(c, dim);
      t.attention_factor = static_cast<float>(s.attention_factor);
      break;
    case RopeType::kLlama3:
      t.inv_freq = Llama3InvFreq(c, dim);
      break;
    case RopeType::kProportional: {
      // _compute_proportional_rope_parameters: int(proportion * dim // 2) rotated pairs at the
      // exponents of the whole head, the others at frequency 0.
      const int64_t rotated = static_cast<int64_t>(s.proportion * static_cast<double>(dim) / 2);
      t.inv_freq = PlainInvFreq(c.rope_theta, dim);
      const float factor = static_cast<float>(s.factor);
      for (size_t j = 0; j < t.inv_freq.size(); ++j) {
        t.inv_freq[j] = static_cast<int64_t>(j) < rotated ? t.inv_freq[j] / factor : 0.f;
      }
      break;
    }
  }
  return t;
}

RopeTable ComputeSlidingRope(const ModelConfig& c) {
  ModelConfig s = c;
  s.rope_theta = c.sliding_rope_theta;
  s.rope_scaling = c.sliding_rope_scaling;
  s.full_head_dim = 0;  // the sliding layers' heads are head_dim wide
  return ComputeRope(s, c.max_position_embeddings);
}

}  // namespace pw::engine

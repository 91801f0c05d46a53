#include "engine/sampler/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/radix_sort.h"
#include "kernels/cpu/dense.h"

namespace pw::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

// Sorts c (value, id) by value descending, equal values (and -0 / +0) by id ascending, when c
// is in id order: the order of the comparison sort in Candidates, by a stable radix sort over
// order-reversing keys of the values (a served step at temperature 1 with a 50 304-token
// vocabulary: 11.4 ms with std::sort, 7.6 ms with this; docs/benchmarks.md).
void SortDescendingById(std::vector<std::pair<float, int32_t>>* c) {
  const size_t n = c->size();
  thread_local std::vector<uint32_t> keys, tmp_keys;
  thread_local std::vector<std::pair<float, int32_t>> tmp;
  keys.resize(n);
  tmp_keys.resize(n);
  tmp.resize(n);
  for (size_t i = 0; i < n; ++i) keys[i] = ~AscendingFloatKey((*c)[i].first);
  RadixSortByKey(keys.data(), c->data(), n, tmp_keys.data(), tmp.data());
}

// Fills `probs` with the kept candidates' probabilities (float, the kernels' softmax over the
// scaled logits) and `c` with the candidates (logit / temperature, id) in the order a draw
// walks them; returns the sum of the kept probabilities. The order: probability descending,
// equal values by id (top-k, top-p, or `sorted`); otherwise c is left empty and probs is in
// id order: the same distribution, drawn without ordering the vocabulary (a 151,936-token
// vocabulary sorted for every token took 2.9 ms).
double Candidates(const float* logits, int vocab, const SamplingParams& p, bool sorted,
                  std::vector<std::pair<float, int32_t>>* c, std::vector<float>* probs) {
  const float inv_t = 1.f / p.temperature;
  // Scaled relative to the largest logit: it becomes exactly 0 and the others <= 0 (or -inf),
  // so no temperature CheckSampling accepts (down to FLT_MIN, 1 / FLT_MIN is finite) overflows
  // a logit to +inf, which would make the probabilities inf - inf = NaN.
  const float top = logits[Argmax(logits, vocab)];
  auto desc = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const bool cut = p.top_p < 1.f;
  auto in_id_order = [&] {
    c->resize(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) (*c)[i] = {(logits[i] - top) * inv_t, i};
  };
  size_t keep = static_cast<size_t>(vocab);
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) {
    in_id_order();
    keep = static_cast<size_t>(p.top_k);
    std::nth_element(c->begin(), c->begin() + keep - 1, c->end(), desc);
    c->resize(keep);
    std::sort(c->begin(), c->end(), desc);
    probs->resize(keep);
    for (size_t i = 0; i < keep; ++i) (*probs)[i] = (*c)[i].first;
  } else {
    c->clear();
    probs->resize(keep);
    for (size_t i = 0; i < keep; ++i) (*probs)[i] = (logits[i] - top) * inv_t;
  }
  // Softmax: the largest scaled logit is 0.
  cpu::Kernels().softmax(probs->data(), keep);
  double sum = 0;
  for (float q : *probs) sum += q;
  if (c->empty() && (cut || sorted)) {
    // The whole vocabulary, in id order: the top-p nucleus (for `sorted`, everything) ordered,
    // the most likely first. probs is indexed by id until the end.
    thread_local std::vector<float> by_id;
    by_id.swap(*probs);
    size_t hi = keep;
    bool nucleus_alone = false;  // c holds the nucleus and a few more, in id order
    if (cut && !sorted) {
      // The nucleus is every token above some scaled logit. A histogram of the scaled logits
      // (kBuckets steps of kBucketWidth below the largest, 0; the last holds everything lower)
      // with each bucket's probability gives the highest bucket by which the mass reaches
      // top_p: the tokens of it and of the buckets above are the nucleus and a few more, a
      // prefix of the descending order, gathered and sorted on their own.
      constexpr int kBuckets = 512;
      constexpr float kBucketWidth = 0.125f;
      thread_local std::vector<uint16_t> bucket;
      bucket.resize(keep);
      double mass[kBuckets] = {};
      size_t count[kBuckets] = {};
      for (size_t i = 0; i < keep; ++i) {
        const float steps = -(logits[i] - top) * inv_t * (1.f / kBucketWidth);  // >= 0, +inf or NaN
        const int b = steps < static_cast<float>(kBuckets - 1) ? static_cast<int>(steps) : kBuckets - 1;
        bucket[i] = static_cast<uint16_t>(b);
        mass[b] += by_id[i];
        ++count[b];
      }
      const double target = p.top_p * sum;
      double acc = 0;
      int last = 0;
      size_t n = 0;
      for (; last < kBuckets; ++last) {
        acc += mass[last];
        n += count[last];
        if (acc >= target) break;
      }
      if (last < kBuckets - 1 && n * 4 <= keep) {
        c->resize(n);
        size_t j = 0;
        for (int32_t i = 0; i < vocab; ++i) {
          if (bucket[static_cast<size_t>(i)] <= last) (*c)[j++] = {(logits[i] - top) * inv_t, i};
        }
        hi = n;
        nucleus_alone = true;
      }
    }
    if (nucleus_alone) {
      std::sort(c->begin(), c->end(), desc);
    } else {  // the whole vocabulary (`sorted`, or a nucleus of more than a quarter of it)
      in_id_order();
      SortDescendingById(c);
    }
    c->resize(hi);
    probs->resize(hi);
    for (size_t i = 0; i < hi; ++i) (*probs)[i] = by_id[static_cast<size_t>((*c)[i].second)];
    keep = hi;
  }
  if (cut) {  // c holds the candidates most likely first
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += (*probs)[n] / sum;
      ++n;
      if (cum >= p.top_p) break;
    }
    c->resize(n);
    probs->resize(n);
    sum = 0;
    for (float q : *probs) sum += q;
  }
  return sum;
}

}  // namespace

SamplingValues ValuesOf(const SamplingParams& p) {
  return {p.temperature, p.top_p, p.top_k, p.logprobs};
}

Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (auto e = CheckSampling(ValuesOf(p))) return InvalidArgument("sampling: " + e->message);
  if (p.max_tokens < 1) return InvalidArgument("sampling: max_tokens must be >= 1");
  for (int32_t t : p.stop_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return InvalidArgument("sampling: stop token id " + std::to_string(t) +
                             " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
  }
  return Status::Ok();
}

double UniformDraw(uint64_t seed, uint64_t index) {
  const uint64_t r = SplitMix64(SplitMix64(seed) ^ (index * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

int32_t SampleToken(const float* logits, int vocab_size, const SamplingParams& p,
                    uint64_t draw_index, std::vector<std::pair<float, int32_t>>* scratch) {
  if (p.temperature <= 0.f || p.top_k == 1) return Argmax(logits, vocab_size);
  thread_local std::vector<float> probs;
  const double sum = Candidates(logits, vocab_size, p, /*sorted=*/false, scratch, &probs);
  const double u = UniformDraw(p.seed, draw_index) * sum;
  double cum = 0;
  // scratch empty: probs in id order.
  auto token = [&](size_t i) { return scratch->empty() ? static_cast<int32_t>(i) : (*scratch)[i].second; };
  size_t last = 0;  // the last candidate with a probability
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.f) last = i;
    cum += probs[i];
    if (u < cum) return token(i);
  }
  return token(last);  // u rounded to the very top
}

std::vector<std::pair<int32_t, double>> SamplingDistribution(const float* logits, int vocab_size,
                                                             const SamplingParams& p) {
  if (p.temperature <= 0.f || p.top_k == 1) return {{Argmax(logits, vocab_size), 1.0}};
  std::vector<std::pair<float, int32_t>> c;
  std::vector<float> probs;
  const double sum = Candidates(logits, vocab_size, p, /*sorted=*/true, &c, &probs);
  std::vector<std::pair<int32_t, double>> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = {c[i].second, probs[i] / sum};
  return out;
}

TokenLogprobs ComputeLogprobs(const float* logits, int vocab_size, int32_t token, int top_n) {
  TokenLogprobs out;
  out.token = token;
  if (vocab_size <= 0) return out;
  double mx = logits[0];
  for (int i = 1; i < vocab_size; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < vocab_size; ++i) sum += std::exp(double(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  if (token >= 0 && token < vocab_size) {
    out.logprob = static_cast<float>(double(logits[token]) - log_z);
  }
  top_n = std::clamp(top_n, 0, vocab_size);
  if (top_n > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab_size));
    for (int i = 0; i < vocab_size; ++i) ids[static_cast<size_t>(i)] = i;
    auto desc = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(), desc);
    out.top.reserve(static_cast<size_t>(top_n));
    for (int i = 0; i < top_n; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      out.top.emplace_back(id, static_cast<float>(double(logits[id]) - log_z));
    }
  }
  return out;
}

}  // namespace pw::engine

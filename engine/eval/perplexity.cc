#include "engine/eval/perplexity.h"

#include <cmath>
#include <string>

namespace pw::engine {

double PerplexityResult::ppl() const {
  return n_tokens > 0 ? std::exp(nll_sum / static_cast<double>(n_tokens)) : NAN;
}

Result<PerplexityResult> Perplexity(Engine& engine, std::span<const int32_t> ids, int ctx,
                                    const PerplexityProgress& progress) {
  if (ctx < 2) return InvalidArgument("perplexity: ctx must be >= 2, got " + std::to_string(ctx));
  if (ids.size() < 2) return InvalidArgument("perplexity: need at least 2 tokens of text");
  const size_t V = static_cast<size_t>(engine.vocab_size());
  const size_t n = ids.size();
  const int64_t total = static_cast<int64_t>((n + ctx - 1) / ctx);
  PerplexityResult r;
  for (size_t start = 0; start < n; start += static_cast<size_t>(ctx)) {
    const size_t len = std::min(static_cast<size_t>(ctx), n - start);
    if (len >= 2) {
      auto window = ids.subspan(start, len);
      PW_ASSIGN_OR_RETURN(std::vector<float> logits, engine.ForwardLogits(window));
      for (size_t i = 0; i + 1 < len; ++i) {
        const float* row = logits.data() + i * V;
        double mx = row[0];
        for (size_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double z = 0;
        for (size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
        const double nll = std::log(z) + mx - static_cast<double>(row[window[i + 1]]);
        r.nll_sum += nll;
        r.n_tokens++;
        r.token_nll.push_back(static_cast<float>(nll));
        r.token_window.push_back(static_cast<int32_t>(r.n_windows));
      }
    }
    r.n_windows++;
    if (progress) progress(r.n_windows, total);
  }
  return r;
}

}  // namespace pw::engine

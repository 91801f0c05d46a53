#include "tools/lockstep_perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/runner/runner.h"

namespace pw::eval {

Result<engine::PerplexityResult> LockstepPerplexity(engine::Engine& eng,
                                                    std::span<const int32_t> ids,
                                                    const LockstepOptions& o,
                                                    const engine::PerplexityProgress& progress) {
  if (o.ctx < 2) return InvalidArgument("perplexity: ctx must be >= 2, got " + std::to_string(o.ctx));
  if (o.batch < 1) return InvalidArgument("perplexity: batch must be >= 1");
  if (ids.size() < 2) return InvalidArgument("perplexity: need at least 2 tokens of text");
  for (int32_t id : ids) {
    if (id < 0 || id >= eng.vocab_size()) return InvalidArgument("perplexity: token id out of range");
  }
  const size_t V = static_cast<size_t>(eng.vocab_size());
  const size_t n = ids.size(), ctx = static_cast<size_t>(o.ctx);
  const int bs = eng.kv_pool().layout().block_size;

  // Windows (start, len) with at least one prediction, and where their predictions go.
  struct Window {
    size_t start, len, out;  // out: index of its first prediction in the result
    int32_t index;           // window number as Perplexity counts them
  };
  std::vector<Window> windows;
  engine::PerplexityResult r;
  size_t preds = 0;
  for (size_t start = 0; start < n; start += ctx) {
    const size_t len = std::min(ctx, n - start);
    if (len >= 2) {
      windows.push_back({start, len, preds, static_cast<int32_t>(r.n_windows)});
      preds += len - 1;
    }
    r.n_windows++;
  }
  r.token_nll.assign(preds, 0.f);
  std::vector<double> nll(preds, 0.0);
  r.token_window.assign(preds, 0);

  std::unique_ptr<engine::Runner> runner = eng.NewRunner(o.threads);
  runner->SetHooks(o.hooks);
  const size_t B = static_cast<size_t>(o.batch);
  std::vector<std::vector<int32_t>> blocks(B);
  std::vector<engine::ForwardItem> items;
  std::vector<size_t> item_window;
  std::vector<float> logits;
  items.reserve(B);
  item_window.reserve(B);
  logits.reserve(B * V);
  int64_t done = 0;
  for (size_t g = 0; g < windows.size(); g += B) {
    const size_t m = std::min(B, windows.size() - g);
    Status st;
    size_t got = 0;
    for (; got < m; ++got) {
      auto b = eng.LeaseKvBlocks(engine::BlocksForTokens(static_cast<int>(windows[g + got].len), bs));
      if (!b.ok()) {
        st = b.status();
        break;
      }
      blocks[got] = std::move(b).value();
    }
    size_t max_len = 0;
    for (size_t s = 0; s < m; ++s) max_len = std::max(max_len, windows[g + s].len);
    for (size_t i = 0; st.ok() && i + 1 < max_len; ++i) {
      items.clear();
      item_window.clear();
      for (size_t s = 0; s < m; ++s) {
        const Window& w = windows[g + s];
        if (i + 1 >= w.len) continue;
        engine::ForwardItem it;
        it.seq_id = static_cast<uint64_t>(s + 1);
        it.tokens = ids.data() + w.start + i;
        it.n = 1;
        it.start_pos = static_cast<int>(i);
        it.blocks = blocks[s].data();
        it.logits = engine::LogitsWanted::kLast;
        items.push_back(it);
        item_window.push_back(g + s);
      }
      logits.clear();
      st = runner->Forward({items, /*pure_decode=*/true}, &logits);
      if (!st.ok()) break;
      for (size_t j = 0; j < items.size(); ++j) {
        const Window& w = windows[item_window[j]];
        const float* row = logits.data() + j * V;
        double mx = row[0];
        for (size_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double z = 0;
        for (size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
        const double nll_i = std::log(z) + mx - static_cast<double>(row[ids[w.start + i + 1]]);
        nll[w.out + i] = nll_i;
        r.token_nll[w.out + i] = static_cast<float>(nll_i);
        r.token_window[w.out + i] = w.index;
      }
    }
    for (size_t s = 0; s < got; ++s) PW_CHECK(eng.ReturnKvBlocks(blocks[s]).ok());
    if (!st.ok()) return st;
    done += static_cast<int64_t>(m);
    if (progress) progress(done, static_cast<int64_t>(windows.size()));
  }
  // Sum in text order, as Perplexity does.
  for (size_t i = 0; i < preds; ++i) r.nll_sum += nll[i];
  r.n_tokens = static_cast<int64_t>(preds);
  return r;
}

}  // namespace pw::eval

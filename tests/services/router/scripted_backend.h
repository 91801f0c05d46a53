// ScriptedTestBackend: a GenerationBackend for unit tests of the router's own logic (HTTP,
// validation, SSE, admission, cancellation, drain). It is not a model: each request "generates"
// the ids of a fixed script text, one per step, from its own thread. Cluster behaviour is tested
// against the real workers elsewhere. Log-probabilities, when asked for, are a fixed made-up
// rule (ScriptedLogprob) so the router's shapes and offsets can be checked exactly.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "services/router/backend.h"

namespace pw::router::testing {

// The made-up log-probability of `token` at output (or prompt) position `index`, with `top_n`
// alternatives: the token itself first, then token + k at logprob - k.
inline TokenLogprob ScriptedLogprob(int32_t token, size_t index, int32_t top_n) {
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = -0.25f * static_cast<float>(1 + index % 4);
  for (int32_t k = 0; k < top_n; ++k) lp.top.emplace_back(token + k, lp.logprob - float(k));
  return lp;
}

class ScriptedTestBackend final : public GenerationBackend {
 public:
  // Each request emits script[0..], then finishes with kLength at max_tokens, or kStop after
  // emitting an id in its stop_token_ids. step: delay between tokens.
  ScriptedTestBackend(std::vector<int32_t> script, std::chrono::milliseconds step)
      : script_(std::move(script)), step_(step) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedTestBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void SetEvents(GenerationEvents* events) override { events_ = events; }
  Status Submit(GenerationRequest request) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_submits_) return Unavailable("scripted: no workers");
    submitted_.push_back(request);
    active_[request.id] = State{request, 0};
    cv_.notify_all();
    return Status::Ok();
  }
  void Cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(id);
    active_.erase(id);
  }
  BackendLoad Load() const override {
    std::lock_guard<std::mutex> lock(mu_);
    BackendLoad l;
    l.capacity = capacity_;
    l.decode_workers = capacity_ > 0 ? 1 : 0;
    l.prefill_workers = capacity_ > 0 ? 1 : 0;
    l.kv_capacity_blocks = l.kv_capacity_max_blocks = kv_capacity_;
    l.kv_block_tokens = kv_block_tokens_;
    return l;
  }

  // Test controls.
  void SetCapacity(int32_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = c;
  }
  // The decode KV the backend reports (kv_admission.h); 0: none, admission by count only.
  void SetKv(int64_t capacity_blocks, int32_t block_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    kv_capacity_ = capacity_blocks;
    kv_block_tokens_ = block_tokens;
  }
  // While paused no tokens are produced.
  void SetPaused(bool p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = p;
    }
    cv_.notify_all();
  }
  void SetFailSubmits(bool f) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_submits_ = f;
  }
  std::set<uint64_t> cancelled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  std::vector<GenerationRequest> submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  size_t active() const {
    std::lock_guard<std::mutex> lock(mu_);
    return active_.size();
  }

 private:
  struct State {
    GenerationRequest request;
    size_t next = 0;
  };
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, step_, [&] { return stop_; });
      if (stop_ || paused_) continue;
      std::vector<uint64_t> done;
      for (auto& [id, st] : active_) {
        const auto& sp = st.request.sampling;
        if (st.next == 0 && sp.prompt_logprobs >= 0) {
          std::vector<TokenLogprob> prompt_lps;
          for (size_t i = 1; i < st.request.prompt.size(); ++i) {
            prompt_lps.push_back(ScriptedLogprob(st.request.prompt[i], i, sp.prompt_logprobs));
          }
          events_->OnPromptLogprobs(id, std::move(prompt_lps));
        }
        int32_t tok = script_[st.next % script_.size()];
        uint32_t index = static_cast<uint32_t>(st.next++);
        std::vector<TokenLogprob> lps;
        if (sp.logprobs >= 0) lps.push_back(ScriptedLogprob(tok, index, sp.logprobs));
        events_->OnTokens(id, index, {tok}, std::move(lps));
        const auto& stops = st.request.sampling.stop_token_ids;
        if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
          events_->OnFinished(id, FinishReason::kStop, Status::Ok(), "");
          done.push_back(id);
        } else if (static_cast<int32_t>(st.next) >= st.request.sampling.max_tokens) {
          events_->OnFinished(id, FinishReason::kLength, Status::Ok(), "");
          done.push_back(id);
        }
      }
      for (uint64_t id : done) active_.erase(id);
    }
  }

  std::vector<int32_t> script_;
  std::chrono::milliseconds step_;
  GenerationEvents* events_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, State> active_;
  std::vector<GenerationRequest> submitted_;
  std::set<uint64_t> cancelled_;
  int32_t capacity_ = 64;
  int64_t kv_capacity_ = 0;
  int32_t kv_block_tokens_ = 0;
  bool paused_ = false;
  bool fail_submits_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pw::router::testing

#include "services/workers/common/worker_common.h"

#include <unistd.h>

#include "kernels/cpu/available_cores.h"

namespace pw::workers {

engine::SamplingParams FromWire(wire::SamplingParams::Reader s) {
  engine::SamplingParams p;
  p.temperature = s.getTemperature();
  p.top_p = s.getTopP();
  p.top_k = static_cast<int>(std::min<uint32_t>(s.getTopK(), 1u << 30));
  p.seed = s.getSeed();
  p.max_tokens = static_cast<int>(std::min<uint32_t>(s.getMaxTokens(), 1u << 30));
  for (uint32_t t : s.getStopTokenIds()) p.stop_token_ids.push_back(static_cast<int32_t>(t));
  p.ignore_eos = s.getIgnoreEos();
  p.logprobs = s.getLogprobs();
  return p;
}

void ToWire(const engine::TokenLogprobs& lp, wire::TokenLogprob::Builder b) {
  b.setToken(static_cast<uint32_t>(lp.token));
  b.setLogprob(lp.logprob);
  auto ids = b.initTopTokens(static_cast<unsigned>(lp.top.size()));
  auto lps = b.initTopLogprobs(static_cast<unsigned>(lp.top.size()));
  for (size_t i = 0; i < lp.top.size(); ++i) {
    ids.set(static_cast<unsigned>(i), static_cast<uint32_t>(lp.top[i].first));
    lps.set(static_cast<unsigned>(i), lp.top[i].second);
  }
}

std::string DefaultWorkerId(const std::string& id, const char* role) {
  if (!id.empty()) return id;
  return std::string(role) + "-" + std::to_string(getpid());
}

int WorkerThreads(int threads) { return threads > 0 ? threads : cpu::AvailableCores(); }

std::string DefaultNodeName(const std::string& node) {
  if (!node.empty()) return node;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

}  // namespace pw::workers

#include "policies/misses/trace_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "common/dtype.h"

namespace pw::misses {

Budget ToBudget(const MissSettings& s) {
  Budget b;
  b.fraction = s.residency.value_or(0.0);
  b.bytes = s.residency_bytes.value_or(0);
  return b;
}

Result<int> CapacityFor(const Budget& budget, int num_moe_layers, int num_experts, int top_k,
                        double expert_bytes) {
  int cap = 0;
  if (budget.bytes > 0) {
    if (num_moe_layers <= 0 || expert_bytes <= 0) return InvalidArgument("byte budget needs the expert size");
    cap = static_cast<int>(static_cast<double>(budget.bytes) / (num_moe_layers * expert_bytes));
  } else {
    if (!(budget.fraction > 0 && budget.fraction <= 1)) {
      return InvalidArgument("residency fraction must be in (0, 1], got " + std::to_string(budget.fraction));
    }
    cap = static_cast<int>(std::lround(budget.fraction * num_experts));
  }
  if (cap < top_k || cap > num_experts) {
    return InvalidArgument("the residency budget gives " + std::to_string(cap) +
                           " resident experts per layer, outside [top_k, experts] = [" +
                           std::to_string(top_k) + ", " + std::to_string(num_experts) + "]");
  }
  return cap;
}

ReplayInput ReplayInput::From(const RouterTrace& trace) {
  ReplayInput in;
  in.header = trace.header;
  const size_t E = trace.header.num_experts;
  std::vector<uint8_t> seen(trace.header.num_layers, 0);
  size_t total = 0;
  for (const TraceLayer& L : trace.layers) total += L.num_tokens() * E;
  in.probs.resize(total);
  size_t off = 0;
  for (const TraceLayer& L : trace.layers) {
    in.records.push_back(&L);
    in.probs_offset.push_back(off);
    seen[L.layer] = 1;
    in.token_layers += L.num_tokens();
    for (size_t t = 0; t < L.num_tokens(); ++t) {
      float* p = in.probs.data() + off + t * E;
      if (trace.header.gate == TraceGate::kSigmoid) {
        // What the engine's miss hook ranks by: the sigmoid score plus the selection bias.
        const float* bias = trace.selection_bias[L.layer].data();
        for (size_t e = 0; e < E; ++e) {
          p[e] = 1.f / (1.f + std::exp(-F16ToF32(L.logits[t * E + e]))) + bias[e];
        }
        continue;
      }
      float mx = -INFINITY;
      for (size_t e = 0; e < E; ++e) {
        p[e] = F16ToF32(L.logits[t * E + e]);
        mx = std::max(mx, p[e]);
      }
      double sum = 0;
      for (size_t e = 0; e < E; ++e) {
        p[e] = std::exp(p[e] - mx);
        sum += p[e];
      }
      for (size_t e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / sum);
    }
    off += L.num_tokens() * E;
  }
  for (uint8_t s : seen) in.num_moe_layers += s;
  in.expert_bytes = 3.0 * trace.header.hidden_size * trace.header.moe_intermediate_size * 2.0;
  return in;
}

double ModelledUsPerToken(const MissStats& s, uint64_t tokens, double expert_bytes,
                          const CostModel& cost) {
  if (tokens == 0) return 0;
  const double n = static_cast<double>(tokens);
  const double fetch = cost.fetch_latency_us + expert_bytes / (cost.fetch_gbps * 1e3);
  const double compute = cost.base_us + static_cast<double>(s.slots) / n * cost.expert_us;
  const double sync = static_cast<double>(s.fetches) / n * fetch;
  const double async = static_cast<double>(s.admissions) / n * fetch;
  return compute + sync + std::max(0.0, async - compute);
}

Result<SimResult> Replay(const ReplayInput& in, const MissConfig& config, int capacity,
                         const CostModel& cost) {
  const int L = static_cast<int>(in.header.num_layers), E = static_cast<int>(in.header.num_experts);
  const int k = static_cast<int>(in.header.top_k);
  auto policy = MissPolicy::Create(config, L, E, k, capacity);
  if (!policy.ok()) return policy.status();
  MissPolicy& pol = **policy;
  pol.set_record_events(false);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<MissSlot> slots(static_cast<size_t>(k));
  for (size_t r = 0; r < in.records.size(); ++r) {
    const TraceLayer& rec = *in.records[r];
    const float* probs = in.probs.data() + in.probs_offset[r];
    for (size_t t = 0; t < rec.num_tokens(); ++t) {
      for (int j = 0; j < k; ++j) {
        slots[static_cast<size_t>(j)] = {static_cast<int32_t>(rec.experts[t * k + j]), rec.weights[t * k + j]};
      }
      pol.DecideToken(static_cast<int>(rec.layer), slots.data(), k, probs + t * E, nullptr);
    }
  }
  SimResult out;
  out.replay_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.policy = DescribeMissConfig(config);
  out.capacity = capacity;
  out.residency = static_cast<double>(capacity) / E;
  out.tokens = in.tokens();
  out.stats = pol.stats();
  const double bytes = cost.expert_bytes > 0 ? cost.expert_bytes : in.expert_bytes;
  const MissStats& s = out.stats;
  const double n = out.tokens ? static_cast<double>(out.tokens) : 1.0;
  out.fetched_bytes = static_cast<double>(s.fetches) * bytes;
  out.admitted_bytes = static_cast<double>(s.admissions) * bytes;
  out.fetches_per_token = static_cast<double>(s.fetches) / n;
  out.admissions_per_token = static_cast<double>(s.admissions) / n;
  out.substitution_rate = s.slots ? static_cast<double>(s.substitutions) / static_cast<double>(s.slots) : 0;
  out.mass_mean = s.token_layers ? s.mass_sum / static_cast<double>(s.token_layers) : 0;
  out.us_per_token = ModelledUsPerToken(s, out.tokens, bytes, cost);
  MissStats resident;
  resident.slots = s.slots;
  out.us_per_token_all_resident = ModelledUsPerToken(resident, out.tokens, bytes, cost);
  return out;
}

std::string SimResultsCsv(const std::vector<SimResult>& rows) {
  std::string out =
      "policy,capacity,residency,tokens,slots,hits,misses,fetches,substitutions,"
      "first_choice_substitutions,forced_fetches,admission_requests,admissions,evictions,"
      "fetched_bytes,admitted_bytes,fetches_per_token,substitution_rate,mass_mean,"
      "us_per_token,us_per_token_all_resident,replay_seconds\n";
  char buf[512];
  for (const SimResult& r : rows) {
    const MissStats& s = r.stats;
    std::snprintf(buf, sizeof buf,
                  "%s,%d,%.4f,%llu,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.0f,%.0f,%.6f,"
                  "%.6f,%.6f,%.3f,%.3f,%.6f\n",
                  r.policy.c_str(), r.capacity, r.residency, static_cast<unsigned long long>(r.tokens),
                  static_cast<long long>(s.slots), static_cast<long long>(s.hits),
                  static_cast<long long>(s.misses), static_cast<long long>(s.fetches),
                  static_cast<long long>(s.substitutions),
                  static_cast<long long>(s.first_choice_substitutions),
                  static_cast<long long>(s.forced_fetches), static_cast<long long>(s.admission_requests),
                  static_cast<long long>(s.admissions), static_cast<long long>(s.evictions),
                  r.fetched_bytes, r.admitted_bytes, r.fetches_per_token, r.substitution_rate,
                  r.mass_mean, r.us_per_token, r.us_per_token_all_resident, r.replay_seconds);
    out += buf;
  }
  return out;
}

std::string SimResultsJson(const std::vector<SimResult>& rows) {
  std::string out = "[\n";
  char buf[1024];
  for (size_t i = 0; i < rows.size(); ++i) {
    const SimResult& r = rows[i];
    const MissStats& s = r.stats;
    std::snprintf(buf, sizeof buf,
                  "  {\"policy\": \"%s\", \"capacity\": %d, \"residency\": %.4f, \"tokens\": %llu, "
                  "\"slots\": %lld, \"hits\": %lld, \"misses\": %lld, \"fetches\": %lld, "
                  "\"substitutions\": %lld, \"first_choice_substitutions\": %lld, "
                  "\"admissions\": %lld, \"evictions\": %lld, \"fetched_bytes\": %.0f, "
                  "\"admitted_bytes\": %.0f, \"fetches_per_token\": %.6f, \"substitution_rate\": %.6f, "
                  "\"mass_mean\": %.6f, \"us_per_token\": %.3f, \"us_per_token_all_resident\": %.3f, "
                  "\"replay_seconds\": %.6f}%s\n",
                  r.policy.c_str(), r.capacity, r.residency, static_cast<unsigned long long>(r.tokens),
                  static_cast<long long>(s.slots), static_cast<long long>(s.hits),
                  static_cast<long long>(s.misses), static_cast<long long>(s.fetches),
                  static_cast<long long>(s.substitutions),
                  static_cast<long long>(s.first_choice_substitutions),
                  static_cast<long long>(s.admissions), static_cast<long long>(s.evictions),
                  r.fetched_bytes, r.admitted_bytes, r.fetches_per_token, r.substitution_rate,
                  r.mass_mean, r.us_per_token, r.us_per_token_all_resident, r.replay_seconds,
                  i + 1 < rows.size() ? "," : "");
    out += buf;
  }
  return out + "]\n";
}

std::string SimResultsSvg(const std::vector<SimResult>& rows, const std::string& title) {
  const double W = 760, H = 480, ml = 70, mr = 230, mt = 40, mb = 50;
  double xmax = 1e-9, ymax = 1e-9;
  for (const SimResult& r : rows) {
    xmax = std::max(xmax, r.mass_mean);
    ymax = std::max(ymax, r.us_per_token);
  }
  xmax *= 1.1;
  ymax *= 1.1;
  auto X = [&](double v) { return ml + v / xmax * (W - ml - mr); };
  auto Y = [&](double v) { return H - mb - v / ymax * (H - mt - mb); };
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"%.0f\" y=\"20\" font-size=\"14\">%s</text>\n",
                W, H, ml, title.c_str());
  out += buf;
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n"
                "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n"
                "<text x=\"%.0f\" y=\"%.0f\">substituted gate mass (mean m)</text>\n"
                "<text x=\"15\" y=\"%.0f\" transform=\"rotate(-90 15 %.0f)\">modelled us per token</text>\n",
                ml, H - mb, W - mr, H - mb, ml, H - mb, ml, mt, ml + 120, H - 12, H / 2, H / 2);
  out += buf;
  for (int i = 0; i <= 4; ++i) {
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%.3f</text>\n"
                  "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.0f</text>\n",
                  X(xmax * i / 4), H - mb + 15, xmax * i / 4, ml - 5, Y(ymax * i / 4) + 4, ymax * i / 4);
    out += buf;
  }
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
                                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  std::vector<std::string> names;
  for (const SimResult& r : rows) {
    if (std::find(names.begin(), names.end(), r.policy) == names.end()) names.push_back(r.policy);
  }
  for (const SimResult& r : rows) {
    const size_t c = static_cast<size_t>(std::find(names.begin(), names.end(), r.policy) - names.begin()) % 10;
    std::snprintf(buf, sizeof buf,
                  "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\">%.0f%%</text>\n",
                  X(r.mass_mean), Y(r.us_per_token), kColors[c], X(r.mass_mean) + 5,
                  Y(r.us_per_token) - 4, r.residency * 100);
    out += buf;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    std::snprintf(buf, sizeof buf,
                  "<circle cx=\"%.0f\" cy=\"%.0f\" r=\"4\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                  W - mr + 15, mt + 16.0 * i, kColors[i % 10], W - mr + 24, mt + 16.0 * i + 4,
                  names[i].c_str());
    out += buf;
  }
  return out + "</svg>\n";
}

}  // namespace pw::misses

namespace pw::misses {

Result<std::vector<SimResult>> Sweep(const ReplayInput& in, const std::vector<MissConfig>& configs,
                                     const std::vector<int>& capacities, const CostModel& cost) {
  std::vector<SimResult> rows;
  for (int cap : capacities) {
    for (const MissConfig& c : configs) {
      auto r = Replay(in, c, cap, cost);
      if (!r.ok()) return r.status();
      rows.push_back(std::move(r).value());
    }
  }
  return rows;
}

}  // namespace pw::misses

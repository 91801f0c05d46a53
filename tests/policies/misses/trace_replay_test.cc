// pw-sim's replay (policies/misses/trace_replay.h) against a brute-force replay written from
// the rules' definitions (eager decay of every count each token, linear scans, no shared code
// with MissPolicy / ExpertCache), on small random traces: every rule, eviction and admission
// setting gives the same hits, fetches, substitutions, admissions, evictions and mass. Also
// the budget arithmetic and the cost model's formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <unistd.h>
#include <vector>

#include "common/dtype.h"
#include "policies/misses/trace_replay.h"

namespace pw::misses {
namespace {

constexpr uint32_t kL = 2, kE = 12, kK = 3;

// A trace of correlated routing: each token's logits drift from the previous token's, so the
// same experts recur (as in a real model) and caches matter.
RouterTrace MakeTrace(uint32_t seed, int steps) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("pw_replay_" + std::to_string(::getpid()) + "_" + std::to_string(seed))).string();
  TraceHeader h;
  h.num_layers = kL;
  h.num_experts = kE;
  h.top_k = kK;
  h.norm_topk_prob = true;
  h.hidden_size = 16;
  h.moe_intermediate_size = 8;
  auto w = RouterTraceWriter::Create(path, h);
  EXPECT_TRUE(w.ok());
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> state(kL * kE);
  for (float& v : state) v = 2.f * nd(rng);
  for (int s = 0; s < steps; ++s) {
    const size_t T = 1 + rng() % 4;
    for (uint32_t l = 0; l < kL; ++l) {
      std::vector<float> logits;
      std::vector<int32_t> experts;
      std::vector<float> weights;
      for (size_t t = 0; t < T; ++t) {
        for (uint32_t e = 0; e < kE; ++e) {
          float& v = state[l * kE + e];
          v = 0.9f * v + 0.6f * nd(rng);
          logits.push_back(v);
        }
        const float* row = logits.data() + t * kE;
        std::vector<int32_t> idx(kE);
        for (uint32_t e = 0; e < kE; ++e) idx[e] = static_cast<int32_t>(e);
        std::partial_sort(idx.begin(), idx.begin() + kK, idx.end(),
                          [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        float mx = row[idx[0]], sum = 0;
        for (uint32_t j = 0; j < kK; ++j) sum += std::exp(row[idx[j]] - mx);
        for (uint32_t j = 0; j < kK; ++j) {
          experts.push_back(idx[j]);
          weights.push_back(std::exp(row[idx[j]] - mx) / sum);
        }
      }
      EXPECT_TRUE((*w)->Append(l, static_cast<uint64_t>(s), T, nullptr, nullptr, logits.data(),
                               experts.data(), weights.data()).ok());
    }
  }
  EXPECT_TRUE((*w)->Close().ok());
  auto tr = RouterTrace::Read(path);
  EXPECT_TRUE(tr.ok()) << tr.status().ToString();
  std::filesystem::remove(path);
  return std::move(tr).value();
}

// The brute-force replay: one layer's cache as plain arrays, decays applied to every expert at
// every token of the layer.
struct BruteLayer {
  std::vector<bool> resident = std::vector<bool>(kE, false);
  std::vector<double> lfu = std::vector<double>(kE, 0.0);     // eager decayed counts
  std::vector<double> ema = std::vector<double>(kE, 0.0);
  std::vector<long> last = std::vector<long>(kE, -1);
  std::vector<double> lost = std::vector<double>(kE, 0.0);
  std::vector<bool> pending = std::vector<bool>(kE, false);
  std::vector<std::pair<int, long>> due;  // (expert, token at which resident)
  long clock = 0;
};

struct BruteStats {
  long hits = 0, fetches = 0, subs = 0, admissions = 0, evictions = 0, requests = 0;
  double mass = 0;
};

int BruteVictim(const BruteLayer& c, Eviction ev, const std::vector<bool>& pinned) {
  int best = -1;
  double key = 0;
  for (int e = 0; e < static_cast<int>(kE); ++e) {
    if (!c.resident[e] || pinned[e]) continue;
    const double k = ev == Eviction::kLfu ? c.lfu[e] : ev == Eviction::kLru ? static_cast<double>(c.last[e]) : c.ema[e];
    if (best < 0 || k < key) {
      best = e;
      key = k;
    }
  }
  return best;
}

void BruteInsert(BruteLayer& c, int e, Eviction ev, const std::vector<bool>& pinned, int cap, BruteStats& st) {
  int n = 0;
  for (bool r : c.resident) n += r;
  if (n >= cap) {
    const int v = BruteVictim(c, ev, pinned);
    c.resident[v] = false;
    st.evictions++;
  }
  c.resident[e] = true;
  c.last[e] = c.clock;
}

BruteStats BruteReplay(const RouterTrace& tr, const MissConfig& cfg, int cap) {
  std::vector<BruteLayer> layers(kL);
  BruteStats st;
  for (const TraceLayer& rec : tr.layers) {
    BruteLayer& c = layers[rec.layer];
    for (size_t t = 0; t < rec.num_tokens(); ++t) {
      // Softmax of the fp16 logits, as the replay scores substitutes.
      std::vector<double> p(kE);
      double mx = -1e30, sum = 0;
      for (uint32_t e = 0; e < kE; ++e) mx = std::max(mx, static_cast<double>(F16ToF32(rec.logits[t * kE + e])));
      for (uint32_t e = 0; e < kE; ++e) sum += p[e] = std::exp(F16ToF32(rec.logits[t * kE + e]) - mx);
      std::vector<float> probs(kE);
      for (uint32_t e = 0; e < kE; ++e) probs[e] = static_cast<float>(p[e] / sum);
      c.clock++;
      for (uint32_t e = 0; e < kE; ++e) {
        c.lfu[e] *= cfg.decay;
        c.ema[e] = cfg.decay * c.ema[e] + (1 - cfg.decay) * probs[e];
      }
      const std::vector<bool> none(kE, false);
      std::vector<std::pair<int, long>> keep;
      for (auto d : c.due) {
        if (d.second > c.clock) {
          keep.push_back(d);
          continue;
        }
        c.pending[d.first] = false;
        if (!c.resident[d.first]) {
          BruteInsert(c, d.first, cfg.eviction, none, cap, st);
          st.admissions++;
        }
      }
      c.due = keep;
      std::vector<int> ex(kK);
      std::vector<float> w(kK);
      int first = 0;
      float total = 0;
      for (uint32_t j = 0; j < kK; ++j) {
        ex[j] = rec.experts[t * kK + j];
        w[j] = rec.weights[t * kK + j];
        total += w[j];
        if (w[j] > w[first]) first = static_cast<int>(j);
      }
      std::vector<bool> pinned(kE, false);
      for (int e : ex) pinned[e] = true;
      float sub_w = 0;
      for (int j = 0; j < static_cast<int>(kK); ++j) {
        if (c.resident[ex[j]]) {
          st.hits++;
          continue;
        }
        bool fetch = cfg.rule == MissRule::kFetchEveryMiss || j == first ||
                     (cfg.rule == MissRule::kThreshold && w[j] >= cfg.threshold);
        int sub = -1;
        if (!fetch) {
          for (int e = 0; e < static_cast<int>(kE); ++e) {
            if (c.resident[e] && !pinned[e] && (sub < 0 || probs[e] > probs[sub])) sub = e;
          }
          if (sub < 0) fetch = true;
        }
        if (fetch) {
          st.fetches++;
          BruteInsert(c, ex[j], cfg.eviction, pinned, cap, st);
          continue;
        }
        st.subs++;
        sub_w += w[j];
        if (cfg.admission_beta > 0) {
          c.lost[ex[j]] += w[j];
          if (c.lost[ex[j]] >= cfg.admission_beta && !c.pending[ex[j]]) {
            c.lost[ex[j]] = 0;
            c.pending[ex[j]] = true;
            st.requests++;
            c.due.push_back({ex[j], c.clock + cfg.admission_delay});
          }
        }
        pinned[sub] = true;
        ex[j] = sub;
      }
      for (int e : ex) {
        c.lfu[e] += 1;
        c.last[e] = c.clock;
      }
      st.mass += total > 0 ? sub_w / total : 0;
    }
  }
  return st;
}

TEST(TraceReplay, MatchesBruteForce) {
  const RouterTrace tr = MakeTrace(21, 300);
  const ReplayInput in = ReplayInput::From(tr);
  EXPECT_EQ(in.num_moe_layers, static_cast<int>(kL));
  int checked = 0;
  for (MissRule rule : {MissRule::kFetchEveryMiss, MissRule::kThreshold, MissRule::kFirstChoice}) {
    for (Eviction ev : {Eviction::kLfu, Eviction::kLru, Eviction::kScoreEma}) {
      for (float beta : {0.f, 0.5f}) {
        for (int cap : {3, 6}) {
          MissConfig c;
          c.rule = rule;
          c.eviction = ev;
          c.decay = 0.9;
          c.threshold = 0.3f;
          c.admission_beta = beta;
          c.admission_delay = 2;
          SCOPED_TRACE(DescribeMissConfig(c) + " capacity " + std::to_string(cap));
          auto r = Replay(in, c, cap, CostModel{});
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          const BruteStats b = BruteReplay(tr, c, cap);
          EXPECT_EQ(r->stats.hits, b.hits);
          EXPECT_EQ(r->stats.fetches, b.fetches);
          EXPECT_EQ(r->stats.substitutions, b.subs);
          EXPECT_EQ(r->stats.admission_requests, b.requests);
          EXPECT_EQ(r->stats.admissions, b.admissions);
          EXPECT_EQ(r->stats.evictions, b.evictions);
          EXPECT_NEAR(r->stats.mass_sum, b.mass, 1e-6 * (1 + b.mass));
          EXPECT_EQ(r->stats.hits + r->stats.misses, r->stats.slots);
          EXPECT_EQ(r->stats.fetches + r->stats.substitutions, r->stats.misses);
          if (rule != MissRule::kFetchEveryMiss) EXPECT_GT(b.subs, 0);
          if (beta > 0 && rule != MissRule::kFetchEveryMiss) EXPECT_GT(b.admissions, 0);
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 36);
}

TEST(TraceReplay, WeightBlindSpansFetchEveryMissToFirstChoice) {
  const RouterTrace tr = MakeTrace(23, 200);
  const ReplayInput in = ReplayInput::From(tr);
  auto run = [&](MissRule rule, float q) {
    MissConfig c;
    c.rule = rule;
    c.blind_fraction = q;
    auto r = Replay(in, c, 4, CostModel{});
    EXPECT_TRUE(r.ok());
    return r->stats;
  };
  const MissStats all = run(MissRule::kFetchEveryMiss, 0), none = run(MissRule::kWeightBlind, 0.f);
  EXPECT_EQ(none.fetches, all.fetches);
  EXPECT_EQ(none.substitutions, 0);
  const MissStats fc = run(MissRule::kFirstChoice, 0), one = run(MissRule::kWeightBlind, 1.f);
  EXPECT_EQ(one.fetches, fc.fetches);
  EXPECT_EQ(one.substitutions, fc.substitutions);
  const MissStats half = run(MissRule::kWeightBlind, 0.5f);
  EXPECT_GT(half.substitutions, 0);
  EXPECT_LT(half.substitutions, fc.substitutions);
  EXPECT_EQ(half.first_choice_substitutions, 0);
  EXPECT_EQ(run(MissRule::kWeightBlind, 0.5f).substitutions, half.substitutions);  // repeatable
}

TEST(TraceReplay, CostModelAndBudget) {
  const RouterTrace tr = MakeTrace(22, 50);
  const ReplayInput in = ReplayInput::From(tr);
  EXPECT_DOUBLE_EQ(in.expert_bytes, 3.0 * 16 * 8 * 2);
  MissConfig c;  // fetch every miss
  CostModel cost;
  cost.base_us = 10;
  cost.expert_us = 1;
  cost.fetch_latency_us = 5;
  cost.fetch_gbps = 1;  // 1000 bytes per us
  cost.expert_bytes = 2000;
  auto r = Replay(in, c, 3, cost);
  ASSERT_TRUE(r.ok());
  const double n = static_cast<double>(r->tokens);
  const double expect = 10 + static_cast<double>(r->stats.slots) / n * 1 +
                        static_cast<double>(r->stats.fetches) / n * (5 + 2);
  EXPECT_NEAR(r->us_per_token, expect, 1e-9);
  EXPECT_NEAR(r->us_per_token_all_resident, 10 + kL * kK, 1e-9);
  EXPECT_DOUBLE_EQ(r->fetched_bytes, static_cast<double>(r->stats.fetches) * 2000);
  // Budgets: fractions round to experts per layer; bytes divide by layers x expert size.
  Budget b;
  b.fraction = 0.25;
  EXPECT_EQ(*CapacityFor(b, 2, 12, 3, 100), 3);
  b.fraction = 0.5;
  EXPECT_EQ(*CapacityFor(b, 2, 12, 3, 100), 6);
  b.fraction = 0.1;  // 1 expert: cannot hold a token's 3
  EXPECT_EQ(CapacityFor(b, 2, 12, 3, 100).status().code(), StatusCode::kInvalidArgument);
  Budget bytes;
  bytes.bytes = 2 * 5 * 100 + 99;
  EXPECT_EQ(*CapacityFor(bytes, 2, 12, 3, 100), 5);
  // The outputs carry every row.
  std::vector<SimResult> rows{*r, *r};
  const std::string csv = SimResultsCsv(rows);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(SimResultsJson(rows).find("\"fetches\": " + std::to_string(r->stats.fetches)), std::string::npos);
  EXPECT_NE(SimResultsSvg(rows, "t").find("<circle"), std::string::npos);
}

}  // namespace
}  // namespace pw::misses

#include "policies/planner/width_plans.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace pw::anyprec {

namespace {

struct PlanState {
  WidthMap map;
  double total_weights = 0;  // sum rows*cols
  double bit_weights = 0;    // sum rows*cols*bits
  double Average() const { return bit_weights / total_weights; }
};

Result<PlanState> StartPlan(const apw::ApwStore& store, double avg_bits, int min_bits) {
  const apw::StoreInfo& info = store.info();
  if (min_bits < kMinBits || min_bits > kMaxBits || !(avg_bits >= min_bits)) {
    return InvalidArgument("average width " + std::to_string(avg_bits) + " below the minimum " +
                           std::to_string(min_bits) + " bits");
  }
  PW_ASSIGN_OR_RETURN(WidthMap m, WidthMap::Uniform(kMaxBits, static_cast<int>(info.num_layers),
                                                    static_cast<int>(info.num_experts)));
  PlanState st{std::move(m), 0, 0};
  for (int i = 0; i < store.num_blocks(); ++i) {
    const apw::BlockData& b = store.block(i);
    st.total_weights += static_cast<double>(b.rows) * b.cols;
  }
  st.bit_weights = st.total_weights * kMaxBits;
  return st;
}

ExpertProj ProjOf(apw::BlockKind k) {
  return k == apw::BlockKind::kGateUp ? ExpertProj::kGateUp : ExpertProj::kDown;
}

}  // namespace

Result<WidthMap> PlanDamageRanked(const apw::ApwStore& store, double avg_bits, int min_bits) {
  PW_ASSIGN_OR_RETURN(PlanState st, StartPlan(store, avg_bits, min_bits));
  // Routing frequency of each block within its layer and projection (times E: the same order).
  const std::vector<double> share = apw::CalibrationShares(store);
  auto cost = [&](int i, int bits) {
    const apw::BlockData& b = store.block(i);
    return share[i] * (b.damage[bits - 1] - b.damage[bits]) / (static_cast<double>(b.rows) * b.cols / 8);
  };
  // (cost, block) min-heap; ties broken by block index for determinism.
  using Item = std::pair<double, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (int i = 0; i < store.num_blocks(); ++i) {
    if (kMaxBits > min_bits) heap.emplace(cost(i, kMaxBits), i);
  }
  while (st.Average() > avg_bits + 1e-12 && !heap.empty()) {
    const int i = heap.top().second;
    heap.pop();
    const apw::BlockData& b = store.block(i);
    const ExpertProj proj = ProjOf(b.kind);
    const int bits = st.map.Get(static_cast<int>(b.layer), static_cast<int>(b.expert), proj);
    PW_RETURN_IF_ERROR(st.map.Set(static_cast<int>(b.layer), static_cast<int>(b.expert), proj, bits - 1));
    st.bit_weights -= static_cast<double>(b.rows) * b.cols;
    if (bits - 1 > min_bits) heap.emplace(cost(i, bits - 1), i);
  }
  return std::move(st.map);
}

Result<WidthMap> PlanRandom(const apw::ApwStore& store, double avg_bits, uint64_t seed, int min_bits) {
  PW_ASSIGN_OR_RETURN(PlanState st, StartPlan(store, avg_bits, min_bits));
  std::mt19937_64 rng(seed);
  std::vector<int> open(store.num_blocks());
  std::iota(open.begin(), open.end(), 0);
  while (st.Average() > avg_bits + 1e-12 && !open.empty()) {
    const size_t k = rng() % open.size();
    const apw::BlockData& b = store.block(open[k]);
    const ExpertProj proj = ProjOf(b.kind);
    const int bits = st.map.Get(static_cast<int>(b.layer), static_cast<int>(b.expert), proj);
    PW_RETURN_IF_ERROR(st.map.Set(static_cast<int>(b.layer), static_cast<int>(b.expert), proj, bits - 1));
    st.bit_weights -= static_cast<double>(b.rows) * b.cols;
    if (bits - 1 <= min_bits) {
      open[k] = open.back();
      open.pop_back();
    }
  }
  return std::move(st.map);
}

}  // namespace pw::anyprec

// A check the family tests share: expert-miss policies over a fixture, sized from its config.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/hooks/miss_routing_hook.h"
#include "policies/misses/miss_policy.h"
#include "tests/engine/test_util.h"

namespace pw::engine::testing {

// The miss policy of `preset` over `c`'s layers, experts and k, `capacity` experts resident per
// layer (a failure is a test failure and null).
inline std::unique_ptr<misses::MissPolicy> PolicyFor(const ModelConfig& c, const std::string& preset,
                                                     int capacity) {
  auto cfg = misses::ParseMissPreset(preset);
  EXPECT_TRUE(cfg.ok()) << preset;
  if (!cfg.ok()) return nullptr;
  auto policy = misses::MissPolicy::Create(*cfg, static_cast<int>(c.num_layers), static_cast<int>(c.num_experts),
                                           static_cast<int>(c.num_experts_per_tok), capacity);
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return policy.ok() ? std::move(policy).value() : nullptr;
}

// The policy of each preset built from the fixture's config (its layers, experts and k) over a
// 40-token prompt: fetching every miss gives the all-resident logits bit for bit and substitutes
// nothing; substituting (first-choice) keeps k experts per token and finite logits. Every slot
// (`layers` x 40 token-layers, `k` slots each) is a hit, a fetch or a substitution.
inline void ExpectMissPoliciesUseKOfNFromTheConfig(const std::string& fixture, int64_t layers, int64_t k) {
  auto e = Engine::Create(FixtureModelDir(fixture), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const ModelConfig& c = (*e)->model().config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 53 + 11) % 1000 + 3);
  auto ref = (*e)->ForwardLogits(ids);
  ASSERT_TRUE(ref.ok());
  for (const char* preset : {"fetch-every-miss", "first-choice"}) {
    SCOPED_TRACE(preset);
    auto policy = PolicyFor(c, preset, 8);
    ASSERT_NE(policy, nullptr);
    MissRoutingHook hook(policy.get());
    MoeHooks h;
    h.routing_hook = &hook;
    h.residency = &hook;
    (*e)->SetMoeHooks(h);
    auto got = (*e)->ForwardLogits(ids);
    (*e)->SetMoeHooks({});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const misses::MissStats& st = hook.stats();
    EXPECT_EQ(st.token_layers, 40 * layers);
    EXPECT_EQ(st.slots, st.token_layers * k);
    EXPECT_EQ(st.hits + st.fetches + st.substitutions, st.slots);
    if (std::string(preset) == "fetch-every-miss") {
      EXPECT_EQ(std::memcmp(got->data(), ref->data(), ref->size() * sizeof(float)), 0);
      EXPECT_EQ(st.substitutions, 0);
    } else {
      EXPECT_GT(st.substitutions, 0);
      for (float v : *got) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

}  // namespace pw::engine::testing

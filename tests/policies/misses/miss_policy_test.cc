// Miss policies on hand-made routing cases (policies/misses): which misses each rule fetches
// or substitutes, the substitute and its weight, background admission at beta, eviction order
// of LRU, decayed LFU and the score EMA, and the rules' refusals.
#include <gtest/gtest.h>

#include <vector>

#include "policies/misses/miss_policy.h"

namespace pw::misses {
namespace {

constexpr int kE = 8, kK = 4;

std::unique_ptr<MissPolicy> Make(const MissConfig& c, int capacity, int layers = 1) {
  auto p = MissPolicy::Create(c, layers, kE, kK, capacity);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

MissConfig Rule(MissRule r, Eviction e = Eviction::kLru) {
  MissConfig c;
  c.rule = r;
  c.eviction = e;
  return c;
}

// Router probabilities favouring higher ids among 4..7 (6 < 7) and putting mass on 0..3.
std::vector<float> Probs() { return {0.3f, 0.2f, 0.12f, 0.08f, 0.1f, 0.05f, 0.06f, 0.09f}; }

struct Token {
  std::vector<MissSlot> slots;
  std::vector<SlotAction> actions;
  float m = 0;
};

Token Decide(MissPolicy& p, std::vector<MissSlot> slots, const std::vector<float>& probs, int layer = 0) {
  Token t;
  t.slots = std::move(slots);
  t.actions.resize(t.slots.size());
  t.m = p.DecideToken(layer, t.slots.data(), static_cast<int>(t.slots.size()), probs.data(), t.actions.data());
  return t;
}

// Resident {4, 5, 6, 7}; the token selects 4 (first, resident), 1 (0.3, heavy miss),
// 2 (0.12, light miss), 5 (resident).
std::vector<MissSlot> HeavySecond() { return {{4, 0.5f}, {1, 0.3f}, {2, 0.12f}, {5, 0.08f}}; }

TEST(MissPolicy, HeavySecondChoiceFetchedUnderThresholdSubstitutedUnderFirstChoice) {
  for (MissRule rule : {MissRule::kFetchEveryMiss, MissRule::kThreshold, MissRule::kFirstChoice}) {
    auto p = Make(Rule(rule), 4);
    p->WarmStart(0, {4, 5, 6, 7});
    const Token t = Decide(*p, HeavySecond(), Probs());
    SCOPED_TRACE(MissRuleName(rule));
    EXPECT_EQ(t.actions[0], SlotAction::kHit);
    EXPECT_EQ(t.actions[3], SlotAction::kHit);
    if (rule == MissRule::kFetchEveryMiss) {
      EXPECT_EQ(t.actions[1], SlotAction::kFetched);
      EXPECT_EQ(t.actions[2], SlotAction::kFetched);
      EXPECT_FLOAT_EQ(t.m, 0.f);
    } else if (rule == MissRule::kThreshold) {
      EXPECT_EQ(t.actions[1], SlotAction::kFetched);  // 0.3 >= 0.15
      EXPECT_EQ(t.slots[1].expert, 1);
      EXPECT_EQ(t.actions[2], SlotAction::kSubstituted);  // 0.12 < 0.15
      EXPECT_FLOAT_EQ(t.m, 0.12f / 1.0f);
    } else {
      EXPECT_EQ(t.actions[1], SlotAction::kSubstituted);
      EXPECT_EQ(t.actions[2], SlotAction::kSubstituted);
      EXPECT_FLOAT_EQ(t.m, (0.3f + 0.12f) / 1.0f);
    }
    // Weights are kept; the expert set stays distinct.
    std::vector<int> seen(kE, 0);
    for (size_t j = 0; j < t.slots.size(); ++j) {
      EXPECT_FLOAT_EQ(t.slots[j].weight, HeavySecond()[j].weight);
      EXPECT_EQ(seen[static_cast<size_t>(t.slots[j].expert)]++, 0);
      EXPECT_TRUE(p->IsResident(0, t.slots[j].expert));
    }
  }
}

TEST(MissPolicy, SubstituteIsBestResidentNotSelected) {
  // First-choice rule, residents {4, 5, 6, 7}: the two misses take 7 (0.09) then 6 (0.06);
  // 4 and 5 are the token's own.
  auto p = Make(Rule(MissRule::kFirstChoice), 4);
  p->WarmStart(0, {4, 5, 6, 7});
  const Token t = Decide(*p, HeavySecond(), Probs());
  EXPECT_EQ(t.slots[1].expert, 7);
  EXPECT_EQ(t.slots[2].expert, 6);
  EXPECT_EQ(p->stats().substitutions, 2);
  EXPECT_EQ(p->stats().fetches, 0);
  EXPECT_EQ(p->stats().first_choice_substitutions, 0);
}

TEST(MissPolicy, MissedFirstChoiceIsAlwaysFetched) {
  for (MissRule rule : {MissRule::kThreshold, MissRule::kFirstChoice}) {
    auto p = Make(Rule(rule), 4);
    p->WarmStart(0, {4, 5, 6, 7});
    // The first choice is the highest weight wherever it sits.
    const Token t = Decide(*p, {{4, 0.1f}, {0, 0.6f}, {5, 0.2f}, {6, 0.1f}}, Probs());
    EXPECT_EQ(t.actions[1], SlotAction::kFetched);
    EXPECT_TRUE(p->IsResident(0, 0));
    EXPECT_EQ(p->stats().first_choice_substitutions, 0);
  }
}

TEST(MissPolicy, NoSubstituteAvailableMeansFetch) {
  // A resident expert the token did not select substitutes a miss...
  auto p = Make(Rule(MissRule::kFirstChoice), 4);
  p->WarmStart(0, {0, 1, 2, 3});
  const Token t = Decide(*p, {{0, 0.4f}, {1, 0.3f}, {2, 0.2f}, {5, 0.1f}}, Probs());
  EXPECT_EQ(t.actions[3], SlotAction::kSubstituted);
  EXPECT_EQ(t.slots[3].expert, 3);
  // ...and with none (empty cache: every resident is the token's own) the miss is fetched.
  auto w = Make(Rule(MissRule::kFirstChoice), 4);
  const Token x = Decide(*w, {{0, 0.4f}, {1, 0.3f}, {2, 0.2f}, {3, 0.1f}}, Probs());
  for (SlotAction a : x.actions) EXPECT_EQ(a, SlotAction::kFetched);
  EXPECT_EQ(w->stats().forced_fetches, 3);  // 1, 2, 3 would have been substituted
  EXPECT_FLOAT_EQ(x.m, 0.f);
}

TEST(MissPolicy, OwnSelectionsAreNeverEvicted) {
  // LRU ages 0 (oldest), 1, 2, 3; a token selecting 0 and missing 4 evicts 1, not 0.
  auto p = Make(Rule(MissRule::kFetchEveryMiss, Eviction::kLru), 4);
  for (int e = 0; e < 4; ++e) Decide(*p, {{e, 1.f}}, Probs());
  p->ClearEvents();
  const Token t = Decide(*p, {{0, 0.6f}, {4, 0.4f}}, Probs());
  EXPECT_EQ(t.actions[0], SlotAction::kHit);
  EXPECT_EQ(t.actions[1], SlotAction::kFetched);
  EXPECT_TRUE(p->IsResident(0, 0));
  EXPECT_FALSE(p->IsResident(0, 1));
  ASSERT_EQ(p->events().size(), 2u);
  EXPECT_EQ(p->events()[0].kind, CacheEvent::kFetch);
  EXPECT_EQ(p->events()[0].expert, 4);
  EXPECT_EQ(p->events()[1].kind, CacheEvent::kEvict);
  EXPECT_EQ(p->events()[1].expert, 1);
}

TEST(MissPolicy, LruEvictsOldestUse) {
  // Tokens of one selection each, so every token ages the others.
  auto p = Make(Rule(MissRule::kFetchEveryMiss, Eviction::kLru), 4, 1);
  auto one = [&](int e) {
    std::vector<MissSlot> s{{e, 1.f}};
    SlotAction a;
    p->DecideToken(0, s.data(), 1, Probs().data(), &a);
    return a;
  };
  one(0); one(1); one(2); one(3);  // fills 0..3
  one(0); one(2);                  // ages: 1 oldest, then 3
  EXPECT_EQ(one(4), SlotAction::kFetched);
  EXPECT_FALSE(p->IsResident(0, 1));
  EXPECT_EQ(one(5), SlotAction::kFetched);
  EXPECT_FALSE(p->IsResident(0, 3));
  EXPECT_EQ(one(0), SlotAction::kHit);
}

TEST(MissPolicy, LfuEvictsLowestDecayedCount) {
  MissConfig c = Rule(MissRule::kFetchEveryMiss, Eviction::kLfu);
  c.decay = 0.5;  // strong decay: recent use outweighs old frequency
  auto p = Make(c, 4);
  auto one = [&](int e) {
    std::vector<MissSlot> s{{e, 1.f}};
    p->DecideToken(0, s.data(), 1, Probs().data(), nullptr);
  };
  for (int i = 0; i < 6; ++i) one(0);  // 0: frequent, long ago (count 1.97 after its 6th use)
  one(1); one(2); one(3);
  // At the next token: 0 -> 1.97 * 0.5^4 = 0.123, 1 -> 0.5^3 = 0.125, 2 -> 0.25, 3 -> 0.5.
  one(4);
  EXPECT_FALSE(p->IsResident(0, 0));  // old frequency decayed away
  EXPECT_TRUE(p->IsResident(0, 1));
  // With a slow decay the frequent expert is kept and the least used leaves.
  c.decay = 0.999;
  auto q = Make(c, 4);
  auto two = [&](int e) {
    std::vector<MissSlot> s{{e, 1.f}};
    q->DecideToken(0, s.data(), 1, Probs().data(), nullptr);
  };
  for (int i = 0; i < 6; ++i) two(0);
  two(1); two(1); two(2); two(2); two(3);  // 3 used once, most recently
  two(4);
  EXPECT_FALSE(q->IsResident(0, 3));
  EXPECT_TRUE(q->IsResident(0, 0));
}

TEST(MissPolicy, ScoreEmaEvictsLowestRouterProbability) {
  MissConfig c = Rule(MissRule::kFetchEveryMiss, Eviction::kScoreEma);
  auto p = Make(c, 4);
  p->WarmStart(0, {4, 5, 6, 7});
  // Probs: 4: 0.1, 5: 0.05, 6: 0.06, 7: 0.09 — 5 has the lowest average.
  std::vector<MissSlot> s{{0, 1.f}};
  p->DecideToken(0, s.data(), 1, Probs().data(), nullptr);
  EXPECT_FALSE(p->IsResident(0, 5));
  s = {{1, 1.f}};
  p->DecideToken(0, s.data(), 1, Probs().data(), nullptr);
  EXPECT_FALSE(p->IsResident(0, 6));
}

TEST(MissPolicy, AdmissionFiresAtBeta) {
  MissConfig c = Rule(MissRule::kFirstChoice, Eviction::kLru);
  c.admission_beta = 0.5f;
  c.admission_delay = 1;
  auto p = Make(c, 5);
  p->WarmStart(0, {3, 4, 5, 6, 7});  // 3 is never used: the admission's LRU victim
  // Expert 2 misses with weight 0.2 each token (substitute 7): lost 0.2, 0.4, 0.6 >= 0.5 at the
  // third.
  auto token = [&] { return Decide(*p, {{4, 0.5f}, {5, 0.2f}, {2, 0.2f}, {6, 0.1f}}, Probs()); };
  for (int i = 0; i < 2; ++i) {
    const Token t = token();
    EXPECT_EQ(t.actions[2], SlotAction::kSubstituted);
    EXPECT_EQ(p->stats().admission_requests, 0);
  }
  p->ClearEvents();
  const Token t3 = token();
  EXPECT_EQ(t3.actions[2], SlotAction::kSubstituted);
  EXPECT_EQ(p->stats().admission_requests, 1);
  EXPECT_FALSE(p->IsResident(0, 2));  // asynchronous: not yet
  bool requested = false;
  for (const CacheEvent& e : p->events()) requested |= e.kind == CacheEvent::kAdmitRequest && e.expert == 2;
  EXPECT_TRUE(requested);
  const Token t4 = token();  // resident from the next token
  EXPECT_EQ(t4.actions[2], SlotAction::kHit);
  EXPECT_FALSE(p->IsResident(0, 3));
  EXPECT_EQ(p->stats().admissions, 1);
  EXPECT_EQ(p->stats().fetches, 0);
  // Without admission it stays substituted.
  auto q = Make(Rule(MissRule::kFirstChoice, Eviction::kLru), 4);
  q->WarmStart(0, {4, 5, 6, 7});
  for (int i = 0; i < 5; ++i) {
    const Token t = Decide(*q, {{4, 0.5f}, {5, 0.2f}, {2, 0.2f}, {6, 0.1f}}, Probs());
    EXPECT_EQ(t.actions[2], SlotAction::kSubstituted);
  }
  EXPECT_EQ(q->stats().admissions, 0);
}

TEST(MissPolicy, ExternalAdmissionWaitsForAdmissionDone) {
  MissConfig c = Rule(MissRule::kFirstChoice, Eviction::kLru);
  c.admission_beta = 0.3f;
  auto p = Make(c, 5);
  p->SetExternalAdmission(true);
  p->WarmStart(0, {3, 4, 5, 6, 7});
  auto token = [&] { return Decide(*p, {{4, 0.5f}, {5, 0.1f}, {2, 0.3f}, {6, 0.1f}}, Probs()); };
  token();
  EXPECT_EQ(p->stats().admission_requests, 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(token().actions[2], SlotAction::kSubstituted);
  EXPECT_EQ(p->stats().admission_requests, 1);  // one in flight at a time
  p->ClearEvents();
  p->AdmissionDone(0, 2);
  EXPECT_TRUE(p->IsResident(0, 2));
  ASSERT_EQ(p->events().size(), 2u);
  EXPECT_EQ(p->events()[0].kind, CacheEvent::kAdmitted);
  EXPECT_EQ(p->events()[1].kind, CacheEvent::kEvict);
  EXPECT_EQ(p->events()[1].expert, 3);
  EXPECT_EQ(token().actions[2], SlotAction::kHit);
  p->AdmissionDone(0, 3);  // never requested: ignored
  EXPECT_FALSE(p->IsResident(0, 3));
}

TEST(MissPolicy, LayersAreIndependent) {
  auto p = Make(Rule(MissRule::kFetchEveryMiss), 4, 2);
  Decide(*p, {{0, 0.4f}, {1, 0.3f}, {2, 0.2f}, {3, 0.1f}}, Probs(), 0);
  EXPECT_TRUE(p->IsResident(0, 0));
  EXPECT_FALSE(p->IsResident(1, 0));
  EXPECT_EQ(p->cache().ResidentCount(0), 4);
  EXPECT_EQ(p->cache().ResidentCount(1), 0);
}

TEST(MissPolicy, PresetsAndRefusals) {
  auto q = ParseMissPreset("quality-first");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->rule, MissRule::kThreshold);
  EXPECT_FLOAT_EQ(q->threshold, 0.15f);
  EXPECT_EQ(q->eviction, Eviction::kLfu);
  EXPECT_FLOAT_EQ(q->admission_beta, 0.5f);
  auto s = ParseMissPreset("speed-first");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rule, MissRule::kFirstChoice);
  EXPECT_FLOAT_EQ(s->admission_beta, 0.5f);
  auto r = ParseMissPreset("rule-0.15");
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->admission_beta, 0.f);
  EXPECT_EQ(ParseMissPreset("fastest").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEviction("fifo").status().code(), StatusCode::kInvalidArgument);
  MissConfig bad;
  bad.decay = 1.0;
  EXPECT_FALSE(ValidateMissConfig(bad).ok());
  bad = {};
  bad.threshold = 1.5f;
  EXPECT_FALSE(ValidateMissConfig(bad).ok());
  bad = {};
  bad.admission_delay = 0;
  EXPECT_FALSE(ValidateMissConfig(bad).ok());
  EXPECT_FALSE(MissPolicy::Create({}, 1, kE, kK, kK - 1).ok());  // cannot hold a token
  EXPECT_FALSE(MissPolicy::Create({}, 1, kE, kK, kE + 1).ok());
  EXPECT_TRUE(MissPolicy::Create({}, 1, kE, kK, kK).ok());
  EXPECT_EQ(DescribeMissConfig(*q), "rule-0.15 lfu(0.98) admit(0.5 delay 1)");
}

}  // namespace
}  // namespace pw::misses

// Placement on made-up candidates: each preference of placement.h in turn, and the cases with
// no choice.
#include "policies/placement/placement.h"

#include <gtest/gtest.h>

#include <vector>

namespace pw::placement {
namespace {

DecodeCandidate D(const char* id, int64_t free_blocks, int64_t assigned = 0) {
  DecodeCandidate c;
  c.id = id;
  c.free_kv_blocks = free_blocks;
  c.assigned = assigned;
  c.max_assigned = 4;
  c.layout_hash = 7;
  return c;
}

PrefillCandidate P(const char* id, int64_t queued) {
  PrefillCandidate c;
  c.id = id;
  c.queued_tokens = queued;
  c.layout_hash = 7;
  return c;
}

TEST(Placement, DecodeByFreeBlocksLessRecentThenFewestAssigned) {
  std::vector<DecodeCandidate> d = {D("a", 100), D("b", 120), D("c", 120)};
  std::vector<PrefillCandidate> p = {P("p", 0)};
  EXPECT_EQ(Place(d, p)->decode, 1u);  // most free blocks; the tie with c keeps the first
  d[1].recent_blocks = 30;             // b's heartbeat does not show 30 blocks placed since
  EXPECT_EQ(Place(d, p)->decode, 2u);
  d[2].recent_blocks = 20;  // a 100, b 90, c 100: a and c tie on blocks, c has more of ours
  d[2].assigned = 1;
  EXPECT_EQ(Place(d, p)->decode, 0u);
}

TEST(Placement, DecodeSkipsFullDrainingUnreachableAndRanksFailedLast) {
  std::vector<DecodeCandidate> d = {D("a", 100), D("b", 50), D("c", 10)};
  std::vector<PrefillCandidate> p = {P("p", 0)};
  d[0].assigned = 4;  // no free slot
  EXPECT_EQ(Place(d, p)->decode, 1u);
  d[1].draining = true;
  EXPECT_EQ(Place(d, p)->decode, 2u);
  d[1].draining = false;
  d[1].failed_before = true;  // failed before: after every other, however free
  EXPECT_EQ(Place(d, p)->decode, 2u);
  d[2].reachable = false;
  EXPECT_EQ(Place(d, p)->decode, 1u);  // the only one left is taken, failed or not
  d[1].assigned = 4;
  EXPECT_FALSE(Place(d, p).has_value());
}

TEST(Placement, PrefillByFailedThenGroupThenQueueWithTheDecodeLayout) {
  std::vector<DecodeCandidate> d = {D("d", 10)};
  std::vector<PrefillCandidate> p = {P("a", 300), P("b", 100), P("c", 200)};
  EXPECT_EQ(Place(d, p)->prefill, 1u);  // shortest queue
  p[2].group_peer = true;               // the group's prompt is being computed there
  EXPECT_EQ(Place(d, p)->prefill, 2u);
  p[2].failed_before = true;
  EXPECT_EQ(Place(d, p)->prefill, 1u);
  p[1].layout_hash = 8;  // another KV layout than the decode worker's
  EXPECT_EQ(Place(d, p)->prefill, 0u);
  p[0].draining = true;
  EXPECT_EQ(Place(d, p)->prefill, 2u);  // failed before, but the only one left
  p[2].reachable = false;
  EXPECT_FALSE(Place(d, p).has_value());
  EXPECT_FALSE(Place(d, {}).has_value());
  EXPECT_FALSE(Place({}, p).has_value());
}

TEST(Placement, PrefillOnTheDecodeNodeWithinTheSlackThenSpread) {
  std::vector<DecodeCandidate> d = {D("d", 10)};
  d[0].node = "node-b";
  std::vector<PrefillCandidate> p = {P("a", 100), P("b", 100 + 1500), P("c", 100 + 2500)};
  p[0].node = "node-a";
  p[1].node = "node-b";
  p[2].node = "node-b";
  EXPECT_EQ(Place(d, p)->prefill, 1u);  // same node, 1500 tokens more than the shortest
  p[1].queued_tokens = 100 + kSameNodeSlackTokens + 1;  // now too far behind: load spreads
  EXPECT_EQ(Place(d, p)->prefill, 0u);
  EXPECT_EQ(Place(d, p, /*same_node_slack_tokens=*/4096)->prefill, 1u);
  p[1].queued_tokens = 100 + 1500;
  p[0].group_peer = true;  // the group's prompt outranks the node
  EXPECT_EQ(Place(d, p)->prefill, 0u);
  p[0].group_peer = false;
  d[0].node.clear();  // a 1.0 decode worker (no node): no node is its, shortest queue
  EXPECT_EQ(Place(d, p)->prefill, 0u);
  d[0].node = "node-b";
  p[0].node.clear();
  p[1].node.clear();
  p[2].node.clear();  // unknown nodes never match
  EXPECT_EQ(Place(d, p)->prefill, 0u);
}

TEST(Placement, ANodeLostPlacesAcrossNodes) {
  // Two nodes, a decode and a prefill worker on each; node-a's are the less loaded.
  std::vector<DecodeCandidate> d = {D("da", 100), D("db", 50)};
  d[0].node = "node-a";
  d[1].node = "node-b";
  std::vector<PrefillCandidate> p = {P("pb", 0), P("pa", 10)};
  p[0].node = "node-b";
  p[1].node = "node-a";
  auto c = Place(d, p);
  EXPECT_EQ(c->decode, 0u);
  EXPECT_EQ(c->prefill, 1u);  // node-a's prefill worker, though node-b's queue is shorter
  p[1].reachable = false;     // node-a's prefill worker lost: its decode worker pairs across
  c = Place(d, p);
  EXPECT_EQ(c->decode, 0u);
  EXPECT_EQ(c->prefill, 0u);
  d[0].reachable = false;  // all of node-a lost: node-b serves alone
  c = Place(d, p);
  EXPECT_EQ(c->decode, 1u);
  EXPECT_EQ(c->prefill, 0u);
}

}  // namespace
}  // namespace pw::placement

// The scheduler's batch composition without a model: what each step runs (decode tokens, prompt
// chunks within the token budget) and the chunks of a prefill pass over leased prompts.
#include "engine/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace pw::engine {
namespace {

std::unique_ptr<Scheduler> MakeScheduler(int max_batch_tokens, int num_blocks) {
  memory::KvLayout layout;
  layout.num_layers = 1;
  layout.num_kv_heads = 1;
  layout.head_dim = 4;
  layout.block_size = 4;
  auto pool = memory::KvBlockPool::Create(layout, num_blocks);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return std::make_unique<Scheduler>(SchedulerOptions{max_batch_tokens}, std::move(*pool));
}

PrefillJob Job(const std::vector<int32_t>& prompt, const std::vector<int32_t>& blocks) {
  PrefillJob j;
  j.prompt = prompt;
  j.block_ids = blocks;
  return j;
}

TEST(SchedulerPrefillPass, SplitsTheBudgetOverJobsInOrder) {
  auto s = MakeScheduler(/*max_batch_tokens=*/8, /*num_blocks=*/8);
  const std::vector<int32_t> p0 = {1, 2, 3, 4, 5};
  const std::vector<int32_t> p1 = {6, 7, 8, 9, 10, 11};
  const std::vector<int32_t> b0 = {0, 1}, b1 = {2, 3};
  std::vector<PrefillJob> jobs = {Job(p0, b0), Job(p1, b1)};

  PrefillPassPlan plan = s->ComposePrefillPass(jobs, /*first_seq_id=*/100);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.job_index, (std::vector<size_t>{0, 1}));
  // The first job whole (it samples), the second cut to what is left of the budget.
  EXPECT_EQ(plan.items[0].n, 5);
  EXPECT_EQ(plan.items[0].start_pos, 0);
  EXPECT_EQ(plan.items[0].logits, LogitsWanted::kLast);
  EXPECT_EQ(plan.items[0].blocks, b0.data());
  EXPECT_EQ(plan.items[1].n, 3);
  EXPECT_EQ(plan.items[1].logits, LogitsWanted::kNone);
  EXPECT_EQ(plan.items[1].seq_id, 99u);
  EXPECT_NE(plan.items[0].seq_id, plan.items[1].seq_id);
  // Composing changes no job.
  EXPECT_EQ(jobs[0].num_computed, 0);
  EXPECT_EQ(jobs[1].num_computed, 0);

  // The next pass skips the finished job and continues the second where it stopped.
  jobs[0].num_computed = 5;
  jobs[1].num_computed = 3;
  plan = s->ComposePrefillPass(jobs, 100);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.job_index[0], 1u);
  EXPECT_EQ(plan.items[0].start_pos, 3);
  EXPECT_EQ(plan.items[0].n, 3);
  EXPECT_EQ(plan.items[0].tokens, p1.data() + 3);
  EXPECT_EQ(plan.items[0].logits, LogitsWanted::kLast);

  jobs[1].num_computed = 6;
  EXPECT_TRUE(s->ComposePrefillPass(jobs, 100).items.empty());
}

TEST(SchedulerPrefillPass, PromptLogprobsWantEveryRowAndBudgetEndsThePass) {
  auto s = MakeScheduler(/*max_batch_tokens=*/4, /*num_blocks=*/8);
  const std::vector<int32_t> p0 = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> p1 = {7, 8};
  const std::vector<int32_t> b0 = {0, 1}, b1 = {2};
  std::vector<PrefillJob> jobs = {Job(p0, b0), Job(p1, b1)};
  jobs[0].prompt_logprobs = 2;
  PrefillPassPlan plan = s->ComposePrefillPass(jobs, 100);
  // The budget is spent on the first job's chunk: the second waits for the next pass.
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].n, 4);
  EXPECT_EQ(plan.items[0].logits, LogitsWanted::kAll);
}

TEST(SchedulerSchedule, DecodeTokensFirstThenPromptChunksWithinTheBudget) {
  auto s = MakeScheduler(/*max_batch_tokens=*/6, /*num_blocks=*/16);
  auto decoding = std::make_unique<Sequence>();
  decoding->id = 1;
  decoding->tokens = {1, 2, 3, 4};
  decoding->num_prompt = 3;
  decoding->num_generated = 1;
  decoding->num_cached = 3;
  auto leased = s->Lease(1);
  ASSERT_TRUE(leased.ok());
  s->Adopt(*leased);
  decoding->blocks = *leased;
  auto prompt = std::make_unique<Sequence>();
  prompt->id = 2;
  prompt->tokens = {5, 6, 7, 8, 9, 10, 11, 12};
  prompt->num_prompt = 8;
  s->Add(std::move(prompt));  // arrived first, but decode tokens go first
  s->Add(std::move(decoding));

  auto b = s->Schedule();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->items.size(), 2u);
  EXPECT_EQ(b->items[0].seq_id, 1u);
  EXPECT_EQ(b->items[0].n, 1);
  EXPECT_EQ(b->items[0].logits, LogitsWanted::kLast);
  EXPECT_EQ(b->items[1].seq_id, 2u);
  EXPECT_EQ(b->items[1].n, 5);  // the budget less the decode token
  EXPECT_EQ(b->items[1].logits, LogitsWanted::kNone);
  EXPECT_FALSE(b->pure_decode);
  // The prompt chunk's blocks were allocated with the batch: 5 tokens in blocks of 4.
  EXPECT_EQ(s->Find(2)->blocks.size(), 2u);
}

}  // namespace
}  // namespace pw::engine

// pw serve's parts without processes: --memory parsing, the memory plan's refusals and width
// choice, the served name of a Hugging Face cache snapshot, and the node file it writes loaded
// by the launcher as `pw-cluster up` loads it; the store cache key; the model hash kept between
// starts and recomputed when a file changes.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/formats/checkpoint_experts.h"
#include "common/formats/model_config.h"
#include "kernels/anyprec/q8.h"
#include "services/cluster/cluster_config.h"
#include "services/serve/memory_plan.h"
#include "common/formats/model_hash_cache.h"
#include "services/serve/model_source.h"
#include "services/serve/serve.h"
#include "services/serve/store_cache.h"

namespace pw::serve {
namespace {

ModelConfig TinyMoe() {
  auto c = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/models/tiny-moe/config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(ServeMemory, ParsesBytesAndSuffixes) {
  EXPECT_EQ(*ParseMemory("1073741824"), int64_t{1} << 30);
  EXPECT_EQ(*ParseMemory("8G"), int64_t{8} << 30);
  EXPECT_EQ(*ParseMemory("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseMemory("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(*ParseMemory("64k"), int64_t{64} << 10);
  for (const char* bad : {"", "G", "8X", "-1", "eight", "8GG"}) {
    auto r = ParseMemory(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--memory"), std::string::npos) << r.status().message();
  }
  auto avail = MemAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status().ToString();
  auto automatic = ParseMemory("auto");
  ASSERT_TRUE(automatic.ok()) << automatic.status().ToString();
  EXPECT_GT(*automatic, 0);
}

// The budget a refusal of PlanMemory names ("give --memory N or more"), or 0 (a failure
// recorded) when it names none.
int64_t NamedBudget(const Status& refusal) {
  const std::string& m = refusal.message();
  const size_t at = m.find("give --memory ");
  EXPECT_NE(at, std::string::npos) << m;
  if (at == std::string::npos) return 0;
  auto needed = ParseMemory(m.substr(at + 14, m.find(' ', at + 14) - at - 14));
  EXPECT_TRUE(needed.ok()) << m;
  return needed.ok() ? *needed : 0;
}

TEST(ServeMemory, BelowTheSmallestPlanIsRefusedWithTheFigureNeeded) {
  const ModelConfig c = TinyMoe();
  const int64_t ckpt = 15 << 20;
  auto plan = PlanMemory(c, ckpt, int64_t{4} << 30, "auto", "4G");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->bits, 8);  // the tiny model's experts fit at 8 bits in 4 GiB
  EXPECT_GE(plan->pool, plan->experts + 2048 / kKvBlockSize * plan->block_bytes);
  EXPECT_EQ(plan->pool % (1 << 20), 0);
  // The smallest budget that plans is the one the refusal names.
  auto refused = PlanMemory(c, ckpt, int64_t{20} << 20, "auto", "20M");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = refused.status().message();
  EXPECT_NE(m.find("--memory 20M (20.0 MiB) is too small"), std::string::npos) << m;
  EXPECT_NE(m.find("smallest plan (every expert at 3 bits"), std::string::npos) << m;
  // The figure named is enough, and a MiB less than the smallest plan's is not.
  const size_t at = m.find("give --memory ");
  ASSERT_NE(at, std::string::npos) << m;
  const std::string figure = m.substr(at + 14, m.find(' ', at + 14) - at - 14);
  auto needed = ParseMemory(figure);
  ASSERT_TRUE(needed.ok()) << figure;
  auto enough = PlanMemory(c, ckpt, *needed, "auto", figure);
  ASSERT_TRUE(enough.ok()) << enough.status().ToString();
  EXPECT_LE(enough->bits, 4);  // barely above the smallest plan
  EXPECT_FALSE(PlanMemory(c, ckpt, *needed - (int64_t{3} << 20), "auto", "less").ok());
}

TEST(ServeMemory, ThePoolIsNoLargerThanTheModelCanUse) {
  const ModelConfig c = TinyMoe();
  auto huge = PlanMemory(c, 15 << 20, int64_t{64} << 30, "auto", "64G");
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->bits, 8);
  // Every expert at 8 bits plus 64 requests of the full context, in whole MiB.
  EXPECT_EQ(huge->kv_tokens / kKvBlockSize * kKvBlockSize, huge->kv_tokens);
  EXPECT_GE(huge->kv_tokens, kMaxSequences * c.max_position_embeddings);
  EXPECT_LT(huge->kv_tokens, kMaxSequences * c.max_position_embeddings + (1 << 20) / huge->block_bytes * kKvBlockSize + kKvBlockSize);
  EXPECT_LT(huge->pool, int64_t{1} << 30);
}

TEST(ServeMemory, AutoPicksTheWidestWidthThatFits) {
  const ModelConfig c = TinyMoe();
  const int64_t ckpt = 15 << 20;
  auto wide = PlanMemory(c, ckpt, int64_t{4} << 30, "auto", "4G");
  ASSERT_TRUE(wide.ok());
  // Shrink the budget until the width drops below 8: each narrower plan still holds the
  // smallest plan's KV, and a width given explicitly beyond what fits is refused.
  int last_bits = wide->bits;
  bool narrowed = false;
  for (int64_t mb = 1024; mb >= 16; mb -= 1) {
    auto p = PlanMemory(c, ckpt, mb << 20, "auto", std::to_string(mb) + "M");
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
      break;
    }
    EXPECT_LE(p->bits, last_bits);
    EXPECT_GE(p->kv_tokens, 2048);  // the KV of one request of the context (2048) beside the experts
    if (p->bits < 8) {
      narrowed = true;
      auto eight = PlanMemory(c, ckpt, mb << 20, "8", std::to_string(mb) + "M");
      EXPECT_FALSE(eight.ok()) << mb;
    }
    last_bits = p->bits;
  }
  EXPECT_TRUE(narrowed);
  auto bf16 = PlanMemory(c, ckpt, int64_t{1} << 30, "16", "1G");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->bits, 16);
  EXPECT_EQ(bf16->store, 0);
  EXPECT_EQ(bf16->experts, 0);
}

// --dense int8 (or ap3..ap8): each worker's copy of the dense matrices comes out of the decode pool
// (twice: prefill and decode), and a refusal names it.
TEST(ServeMemory, Int8DenseCopiesComeOutOfThePool) {
  const ModelConfig c = TinyMoe();
  const int64_t ckpt = 15 << 20, copy = int64_t{3} << 20;
  // The smallest budget with bf16 dense, from its refusal.
  auto small = PlanMemory(c, ckpt, int64_t{20} << 20, "auto", "20M");
  ASSERT_FALSE(small.ok());
  const int64_t needed = NamedBudget(small.status());
  ASSERT_GT(needed, 0);
  const int64_t budget = needed + (int64_t{16} << 20);
  auto bf16 = PlanMemory(c, ckpt, budget, "auto", "B");
  auto int8 = PlanMemory(c, ckpt, budget, "auto", "B", copy);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  ASSERT_TRUE(int8.ok()) << int8.status().ToString();
  EXPECT_EQ(bf16->dense_copies, 0);
  EXPECT_EQ(int8->dense_copies, 2 * copy);
  EXPECT_EQ(int8->pool, bf16->pool - 2 * copy);
  EXPECT_NE(int8->Summary().find("dense copies 6.0 MiB"), std::string::npos) << int8->Summary();
  // The smallest bf16 budget is too small once the copies are counted, and says why.
  auto refused = PlanMemory(c, ckpt, needed, "auto", "N", copy);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the workers' dense copies (6.0 MiB)"), std::string::npos)
      << refused.status().message();
}

// --bits 16 where the decode worker packs the checkpoint's experts: its packed copy
// (PackedExpertBytes: 1.5 bytes a weight, 16-byte row tables, 4-byte row index) comes out of the
// pool once, is named in the summary and in a refusal, and counts only at 16 bits.
TEST(ServeMemory, PackedExpertsComeOutOfThePool) {
  const ModelConfig c = TinyMoe();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  auto packed = [](int64_t rows, int64_t cols) { return rows * ((cols + 63) / 64 * 96 + 16) + (rows + 1) * 4; };
  const int64_t copy = PackedExpertBytes(c);
  EXPECT_EQ(copy, c.num_layers * c.num_experts * (2 * packed(I, H) + packed(H, I)));
  const int64_t ckpt = 15 << 20;
  // A budget whose pool stays under what the model can use: the copy takes its bytes from it.
  const int64_t budget = int64_t{330} << 20;
  auto plain = PlanMemory(c, ckpt, budget - copy, "16", "B");
  auto with = PlanMemory(c, ckpt, budget, "16", "B", 0, 8, 0, copy);
  ASSERT_TRUE(plain.ok() && with.ok()) << with.status().ToString();
  EXPECT_EQ(with->expert_copy, copy);
  EXPECT_EQ(with->pool, plain->pool);
  EXPECT_LT(with->pool, PlanMemory(c, ckpt, budget, "16", "B")->pool);
  EXPECT_NE(with->Summary().find("packed experts"), std::string::npos) << with->Summary();
  auto eight = PlanMemory(c, ckpt, int64_t{1} << 30, "8", "1G", 0, 8, 0, copy);
  ASSERT_TRUE(eight.ok());
  EXPECT_EQ(eight->expert_copy, 0);  // experts from the store: nothing packed
  auto refused = PlanMemory(c, ckpt, ckpt + copy + (int64_t{1} << 20), "16", "small", 0, 8, 0, copy);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("packed experts"), std::string::npos) << refused.status().message();
}

// The planner's ceiling: by default the widest width this CPU's fast path runs at least as fast
// as bf16 (a --bits given above it is kept), and "auto" never starts above it; a --bits above a
// given --max-bits is refused naming both.
TEST(ServeMemory, ThePlannersCeilingFollowsTheFastPath) {
  const int fast = anyprec::FastWidthLimit(anyprec::BestQ8Backend());
  EXPECT_EQ(*PlannerMaxBits("auto", "auto"), fast);
  EXPECT_EQ(*PlannerMaxBits("auto", "16"), fast);
  EXPECT_EQ(*PlannerMaxBits("auto", "8"), 8);
  EXPECT_EQ(*PlannerMaxBits("auto", "3"), fast);
  EXPECT_EQ(*PlannerMaxBits("6", "4"), 6);
  EXPECT_EQ(*PlannerMaxBits("4", "auto"), 4);
  auto bad = PlannerMaxBits("4", "6");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--bits 6 is above --max-bits 4"), std::string::npos) << bad.status().message();
  const ModelConfig c = TinyMoe();
  for (int ceiling = 3; ceiling <= 8; ++ceiling) {
    auto p = PlanMemory(c, 15 << 20, int64_t{4} << 30, "auto", "4G", 0, ceiling);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->bits, ceiling);  // 4 GiB holds every width: the ceiling decides
  }
}

// The prefill worker reads the store at the node's width when that is at most
// prefill_max_bits: its int8 LUTs (2^bits values and a float scale per expert row, whole MiB)
// come out of the budget beside the pool, a wider node prefills from the checkpoint (nothing
// counted), and the smallest plan's refusal names them.
TEST(ServeMemory, ThePrefillWorkersLutsComeOutOfThePool) {
  const ModelConfig c = TinyMoe();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  const int64_t rows = moe_layers * c.num_experts * (2 * c.moe_intermediate_size + c.hidden_size);
  EXPECT_EQ(PrefillLutBytes(c, 4), rows * (16 + 4));
  EXPECT_EQ(PrefillLutBytes(c, 8), rows * (256 + 4));
  const int64_t ckpt = 15 << 20;
  auto small = PlanMemory(c, ckpt, int64_t{20} << 20, "auto", "20M");
  ASSERT_FALSE(small.ok());
  const int64_t needed = NamedBudget(small.status());
  ASSERT_GT(needed, 0);
  const int64_t budget = needed + (int64_t{32} << 20);  // beyond the smallest, below the pool's cap
  const int64_t luts4 = (PrefillLutBytes(c, 4) + (1 << 20) - 1) >> 20 << 20;
  auto bf16_prefill = PlanMemory(c, ckpt, budget, "4", "B", 0, 8, 0);
  auto store_prefill = PlanMemory(c, ckpt, budget, "4", "B", 0, 8, 5);
  ASSERT_TRUE(bf16_prefill.ok()) << bf16_prefill.status().ToString();
  ASSERT_TRUE(store_prefill.ok()) << store_prefill.status().ToString();
  EXPECT_EQ(bf16_prefill->prefill_bits, 16);
  EXPECT_EQ(bf16_prefill->prefill_luts, 0);
  EXPECT_EQ(store_prefill->prefill_bits, 4);
  EXPECT_EQ(store_prefill->prefill_luts, luts4);
  EXPECT_EQ(store_prefill->pool, bf16_prefill->pool - luts4);
  EXPECT_NE(store_prefill->Summary().find("prefill experts at 4 bits (LUTs "), std::string::npos)
      << store_prefill->Summary();
  // A node wider than the prefill limit prefills from the checkpoint.
  auto wide = PlanMemory(c, ckpt, int64_t{4} << 30, "8", "4G", 0, 8, 5);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_EQ(wide->prefill_bits, 16);
  EXPECT_EQ(wide->prefill_luts, 0);
  // The smallest budget for every expert at 8 bits is too small once the 8-bit LUTs (12.2 MiB
  // here, 13 in whole MiB) are counted, and says why.
  auto small8 = PlanMemory(c, ckpt, needed, "8", "N");  // holds the smallest plan, not 8 bits
  ASSERT_FALSE(small8.ok());
  const int64_t needed8 = NamedBudget(small8.status());
  ASSERT_GT(needed8, 0);
  ASSERT_TRUE(PlanMemory(c, ckpt, needed8, "8", "N", 0, 8, 5).ok());
  auto refused = PlanMemory(c, ckpt, needed8, "8", "N", 0, 8, 8);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the prefill worker's LUTs at 8 bits (13.0 MiB)"), std::string::npos)
      << refused.status().message();
}

// --dense auto follows the experts: bf16 with bf16 experts (packed where the packed product runs
// in registers), ap4 (lm_head ap6 with a fast 6-bit path, else int8) when they never exceed 4
// bits, int8 otherwise; a named format is taken as it is, --lm-head overrides either, and an
// unknown name is refused.
TEST(ServeDense, AutoFollowsTheExpertsCeiling) {
  auto pick = [](const std::string& dense, DenseFormat lm_head, bool bf16, int max_bits, int fast,
                 bool packed_fast = false) {
    auto c = ServeDense(dense, lm_head, bf16, max_bits, fast, packed_fast);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::string(DenseFormatName(c->dense)) + "/" + DenseFormatName(c->lm_head) : std::string();
  };
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, true, 8, 8), "bf16/bf16");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, true, 8, 8, true), "bf16-packed/bf16-packed");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, false, 8, 8, true), "int8/int8");
  EXPECT_EQ(pick("bf16", DenseFormat::kAsDense, true, 8, 8, true), "bf16/bf16");
  EXPECT_EQ(pick("bf16-packed", DenseFormat::kAsDense, true, 8, 8), "bf16-packed/bf16-packed");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, false, 8, 8), "int8/int8");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, false, 5, 5), "int8/int8");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, false, 4, 8), "ap4/ap6");
  EXPECT_EQ(pick("auto", DenseFormat::kAsDense, false, 3, 5), "ap4/int8");
  EXPECT_EQ(pick("auto", DenseFormat::kAp8, false, 4, 8), "ap4/ap8");
  EXPECT_EQ(pick("bf16", DenseFormat::kAsDense, false, 4, 8), "bf16/bf16");
  EXPECT_EQ(pick("ap5", DenseFormat::kAsDense, true, 8, 8), "ap5/ap5");
  EXPECT_EQ(pick("int8", DenseFormat::kAp6, false, 8, 8), "int8/ap6");
  auto bad = ServeDense("int4", DenseFormat::kAsDense, false, 8, 8, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--dense int4"), std::string::npos) << bad.status().ToString();
}

// The int8 copy counted for the embedded model: every attention projection and router gate of
// its 4 layers and lm_head (its embedding is not tied), each row in the int8 layout (128
// columns padded to 512) with a 4-byte scale.
TEST(ServeModel, DenseCopyBytesCountTheDenseMatrices) {
  auto src = OpenModelSource(std::string(PW_SOURCE_DIR) + "/models/tiny-moe");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const ModelConfig& c = src->config;
  ASSERT_FALSE(c.tie_word_embeddings);
  ASSERT_EQ(c.hidden_size, 128);
  const int64_t rows_per_layer = c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim +
                                 c.hidden_size + c.num_experts;
  const int64_t rows = c.num_layers * rows_per_layer + c.vocab_size;
  using pw::DenseFormat;
  EXPECT_EQ(DenseCopyBytes(*src, DenseFormat::kBf16, DenseFormat::kAsDense), 0u);
  EXPECT_EQ(static_cast<int64_t>(DenseCopyBytes(*src, DenseFormat::kInt8, DenseFormat::kAsDense)),
            rows * (512 + 4));
  // ap4: four planes of one 32-byte group per 128-column row, 16 table entries, a 4-byte scale;
  // the lm_head at ap6 instead: six planes and 64 entries for its vocab rows.
  const int64_t ap4_row = 4 * 32 + 16 + 4, ap6_row = 6 * 32 + 64 + 4;
  EXPECT_EQ(static_cast<int64_t>(DenseCopyBytes(*src, DenseFormat::kAp4, DenseFormat::kAsDense)),
            rows * ap4_row);
  EXPECT_EQ(static_cast<int64_t>(DenseCopyBytes(*src, DenseFormat::kAp4, DenseFormat::kAp6)),
            (rows - c.vocab_size) * ap4_row + c.vocab_size * ap6_row);
  EXPECT_EQ(static_cast<int64_t>(DenseCopyBytes(*src, DenseFormat::kBf16, DenseFormat::kInt8)),
            c.vocab_size * (512 + 4));
  // bf16-packed: two 96-byte chunks per 128-column row, a 16-byte table, a 4-byte row index
  // (and one more a matrix).
  EXPECT_EQ(static_cast<int64_t>(DenseCopyBytes(*src, DenseFormat::kBf16Packed, DenseFormat::kAsDense)),
            rows * (2 * 96 + 16 + 4) + 4 * (c.num_layers * 5 + 1));  // q, k, v, o, router; lm_head
}

// A store is found again only when both the checkpoint and the calibration text are the same:
// a new calibration text (or another checkpoint) gets another path.
TEST(ServeStoreCache, TheKeyChangesWithTheCheckpointAndTheCalibrationText) {
  const uint64_t model = 0x1234567890abcdefull, text = 0x0fedcba987654321ull;
  const uint64_t key = StoreKey(model, text);
  EXPECT_EQ(key, StoreKey(model, text));
  EXPECT_NE(key, StoreKey(model, text ^ 1));
  EXPECT_NE(key, StoreKey(model ^ 1, text));
  EXPECT_NE(key, model);
  const StorePaths a = StorePathsFor("/cache", key), b = StorePathsFor("/cache", StoreKey(model, text ^ 1));
  EXPECT_NE(a.store, b.store);
  EXPECT_NE(a.partial, b.partial);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(key));
  EXPECT_EQ(a.store, std::string("/cache/stores/") + hex + ".apw");
}

// The store is calibrated on the bundled text through the served tokenizer: another
// tokenizer.json (pw serve --tokenizer, or an edited one) gets another key; a missing one is
// an error naming the file.
TEST(ServeStoreCache, TheCalibrationKeyChangesWithTheTokenizer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("pw_calib_key_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string a = (dir / "a.json").string(), b = (dir / "b.json").string();
  std::ofstream(a) << R"({"model": {"vocab": {"x": 0}}})";
  std::ofstream(b) << R"({"model": {"vocab": {"y": 0}}})";
  auto ka = CalibrationKey(a), kb = CalibrationKey(b), ka2 = CalibrationKey(a);
  ASSERT_TRUE(ka.ok() && kb.ok() && ka2.ok());
  EXPECT_EQ(*ka, *ka2);
  EXPECT_NE(*ka, *kb);
  auto missing = CalibrationKey((dir / "none.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);
  fs::remove_all(dir);
}

// The hash of an unchanged checkpoint comes from <store_dir>/hashes/ on the second call; a
// shard rewritten in place with its size and mtime put back (only ctime tells) is hashed again
// and gets its new hash; so is a changed config.json; a file written just now is not cached.
TEST(ServeModelHash, KeptBetweenStartsAndRecomputedWhenAFileChanges) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("pw_serve_hash_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  const std::string model = (tmp / "model").string(), store_dir = (tmp / "cache").string();
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(std::string(PW_SOURCE_DIR) + "/models/tiny-moe/" + f, model + "/" + f);
  }
  auto direct = ModelHash(model);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  // Just copied: not settled for the default one second, so nothing is recorded yet.
  auto fresh = ModelHashCached(model, store_dir);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->hash, *direct);
  EXPECT_FALSE(fresh->from_cache);
  EXPECT_FALSE(ModelHashCached(model, store_dir)->from_cache);
  // With no settling time the entry is written, and the next call uses it.
  auto first = ModelHashCached(model, store_dir, 0.0);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->from_cache);
  auto second = ModelHashCached(model, store_dir, 0.0);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(second->hash, *direct);

  // One byte of the last expert tensor flipped in place; size and mtime restored.
  const std::string shard = model + "/model.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  {
    // The first byte of layer 0 expert 0's down_proj (safetensors: u64 header length, JSON
    // header, data; data_offsets relative to the data).
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_len));
    const auto j = nlohmann::json::parse(header);
    const auto at = static_cast<std::streamoff>(8 + header_len +
                                                j.at("model.layers.0.mlp.experts.0.down_proj.weight")
                                                    .at("data_offsets")[0].get<uint64_t>());
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(at);
    f.write(&c, 1);
  }
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, shard.c_str(), times, 0), 0);
  struct stat after {};
  ASSERT_EQ(::stat(shard.c_str(), &after), 0);
  ASSERT_EQ(after.st_size, st.st_size);
  ASSERT_EQ(after.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
  auto changed = ModelHashCached(model, store_dir, 0.0);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_FALSE(changed->from_cache);
  EXPECT_EQ(changed->hash, *ModelHash(model));
  EXPECT_NE(changed->hash, *direct);  // the byte is an expert's: a stale entry would be wrong

  // A config.json with another byte: recomputed too.
  {
    std::ofstream f(model + "/config.json", std::ios::app | std::ios::binary);
    f << "\n";
  }
  auto config_changed = ModelHashCached(model, store_dir, 0.0);
  ASSERT_TRUE(config_changed.ok());
  EXPECT_FALSE(config_changed->from_cache);
  EXPECT_EQ(config_changed->hash, *ModelHash(model));
  EXPECT_NE(config_changed->hash, changed->hash);
  EXPECT_TRUE(ModelHashCached(model, store_dir, 0.0)->from_cache);
  fs::remove_all(tmp);
}

TEST(ServeModel, CacheSnapshotsAreServedAsOrgName) {
  EXPECT_EQ(CacheSnapshotName("/h/hub/models--Qwen--Qwen3-30B-A3B/snapshots/abc123"), "Qwen/Qwen3-30B-A3B");
  EXPECT_EQ(CacheSnapshotName("/h/hub/models--Qwen--Qwen3-30B-A3B/snapshots/abc123/"), "Qwen/Qwen3-30B-A3B");
  EXPECT_EQ(CacheSnapshotName("/h/hub/models--org--name--with--dashes/snapshots/r"), "org/name--with--dashes");
  EXPECT_EQ(CacheSnapshotName("/h/models/tiny-moe"), "");
  EXPECT_EQ(CacheSnapshotName("/h/hub/models--Qwen--X/refs/main"), "");
}

// A checkpoint without a tokenizer is refused naming --tokenizer; with --tokenizer a directory
// or its tokenizer.json, the tokenizer is checked there (vLLM's flag).
TEST(ServeModel, TokenizerFromElsewhere) {
  namespace fs = std::filesystem;
  const std::string tiny = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/serve-no-tokenizer";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(tiny + "/" + f, dir + "/" + f);

  auto none = OpenModelSource(dir);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(dir + "/tokenizer.json: missing"), std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("--tokenizer DIR|FILE"), std::string::npos) << none.status().message();

  for (const std::string& t : {tiny, tiny + "/", tiny + "/tokenizer.json"}) {
    auto m = OpenModelSource(dir, t);
    ASSERT_TRUE(m.ok()) << t << ": " << m.status().ToString();
    EXPECT_EQ(m->tokenizer_dir, tiny) << t;
    EXPECT_EQ(m->dir, dir);
    EXPECT_EQ(m->tokenizer_vocab, m->config.vocab_size);
  }
  auto missing = OpenModelSource(dir, dir + "/nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--tokenizer " + dir + "/nowhere: no such file"), std::string::npos)
      << missing.status().message();
  auto other_file = OpenModelSource(dir, tiny + "/config.json");
  ASSERT_FALSE(other_file.ok());
  EXPECT_EQ(other_file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other_file.status().message().find("must be a tokenizer.json"), std::string::npos)
      << other_file.status().message();
  auto empty_dir = OpenModelSource(dir, dir);  // a directory without one: the same refusal
  ASSERT_FALSE(empty_dir.ok());
  EXPECT_NE(empty_dir.status().message().find(dir + "/tokenizer.json: missing"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ServeNodeFile, TheLauncherLoadsItWithTheServedName) {
  ServeOptions o;
  o.port = 18080;
  NodePlan p;
  p.model_dir = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  p.model_name = "Org/Tiny \"quoted\"";
  p.run_dir = std::string(PW_BINARY_DIR) + "/test-tmp/serve-run";
  p.bin_dir = "/opt/pw/bin";
  p.store = "/cache/stores/0123456789abcdef.apw";
  auto plan = PlanMemory(TinyMoe(), 15 << 20, int64_t{1} << 30, "auto", "1G");
  ASSERT_TRUE(plan.ok());
  p.memory = *plan;
  p.router_control_port = 18081;
  p.broker_control_port = 18082;
  const std::string path = std::string(PW_BINARY_DIR) + "/test-tmp/serve-node.yaml";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << NodeFileText(o, p);
  auto cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->model_name, "Org/Tiny \"quoted\"");
  EXPECT_EQ(cfg->http_port, 18080);
  EXPECT_EQ(cfg->run_dir, p.run_dir);
  ASSERT_EQ(cfg->processes.size(), 4u);  // broker, router, prefill-0, decode-0
  EXPECT_EQ(cfg->processes[0].argv[0], "/opt/pw/bin/pw-broker");
  // The planner's ceiling reaches the broker's planner.
  p.max_bits = 5;
  EXPECT_NE(NodeFileText(o, p).find("  planner: {enabled: true, max_bits: 5}\n"), std::string::npos)
      << NodeFileText(o, p);
  // The resolved dense formats (ServeDense) reach the node file's root, where both workers read them.
  EXPECT_NE(NodeFileText(o, p).find("\ndense: bf16\nlm_head: bf16\n"), std::string::npos) << NodeFileText(o, p);
  p.dense = DenseFormat::kAp4;
  p.lm_head = DenseFormat::kAp6;
  EXPECT_NE(NodeFileText(o, p).find("\ndense: ap4\nlm_head: ap6\n"), std::string::npos) << NodeFileText(o, p);
  std::ofstream(path) << NodeFileText(o, p);
  cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  p.dense = p.lm_head = DenseFormat::kBf16;
  // --tokenizer: the router's section names it (the router reads it there: router_options.cc).
  EXPECT_EQ(NodeFileText(o, p).find("tokenizer:"), std::string::npos);
  p.tokenizer_dir = "/tok/dir";
  const std::string with_tok = NodeFileText(o, p);
  const size_t router = with_tok.find("\nrouter:\n"), broker = with_tok.find("\nbroker:\n");
  const size_t tok = with_tok.find("  tokenizer: \"/tok/dir\"\n");
  ASSERT_NE(tok, std::string::npos) << with_tok;
  EXPECT_TRUE(router < tok && tok < broker) << with_tok;
  std::ofstream(path) << with_tok;
  cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  p.tokenizer_dir.clear();
  // The broker keeps the model hash in the store cache (its section: broker_options.cc).
  p.model_hash_cache = "/cache/stores";
  const std::string with_cache = NodeFileText(o, p);
  const size_t in_broker = with_cache.find("\nbroker:\n");
  const size_t cache_key = with_cache.find("  model_hash_cache: \"/cache/stores\"\n");
  ASSERT_NE(cache_key, std::string::npos) << with_cache;
  EXPECT_LT(in_broker, cache_key) << with_cache;
  EXPECT_LT(cache_key, with_cache.find("\nprefill:\n")) << with_cache;
  std::ofstream(path) << with_cache;
  cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  // A prefill worker reading the store: its section names the store, the width and the hash
  // cache, and the launcher loads it (the prefill's own section check: launcher_test).
  p.model_hash_cache = "/cache/stores";
  p.memory.prefill_bits = 4;
  const std::string with_prefill = NodeFileText(o, p);
  const size_t prefill_at = with_prefill.find("\nprefill:\n"), decode_at = with_prefill.find("\ndecode:\n");
  const size_t store_key = with_prefill.find("    store: \"/cache/stores/0123456789abcdef.apw\"\n", prefill_at);
  const size_t bits_key = with_prefill.find("    expert_bits: 4\n", prefill_at);
  const size_t hash_key = with_prefill.find("    model_hash_cache: \"/cache/stores\"\n", prefill_at);
  EXPECT_TRUE(store_key < decode_at && bits_key < decode_at && hash_key < decode_at) << with_prefill;
  std::ofstream(path) << with_prefill;
  cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  p.memory.prefill_bits = 16;
  EXPECT_EQ(NodeFileText(o, p).find("expert_bits"), std::string::npos);
  p.model_hash_cache.clear();
  // bf16 experts: no broker.
  p.store.clear();
  std::ofstream(path) << NodeFileText(o, p);
  cfg = cluster::LoadClusterConfig(path, "/unused");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->processes.size(), 3u);
}

}  // namespace
}  // namespace pw::serve

namespace pw::serve {
namespace {

ModelConfig Fixture(const std::string& name) {
  auto c = LoadModelConfig(std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/" + name + "/config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

// The plan's KV pages are the workers' own: an MLA model's page holds a block of latent rows
// (deepseek_v3 fixture: 16 tokens x (kv_lora_rank 32 + qk_rope_head_dim 8) bf16 values = 1280
// bytes, where 2 x 4 heads x 16 x 8 gave 2048), a hybrid's block counts its recurrent state's
// pages (qwen3_next fixture), and the embedded model's page is unchanged.
TEST(ServeMemory, KvPagesFollowTheModelsKvSpecs) {
  auto tiny = PlanMemory(TinyMoe(), 15 << 20, int64_t{4} << 30, "auto", "4G");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  const ModelConfig t = TinyMoe();
  EXPECT_EQ(tiny->page_bytes, 2 * t.num_kv_heads * kKvBlockSize * t.head_dim * kKvBytesPerElement);
  EXPECT_EQ(tiny->block_bytes, tiny->page_bytes * t.num_layers);

  const ModelConfig ds = Fixture("deepseek_v3");
  auto latent = PlanMemory(ds, 1 << 20, int64_t{1} << 30, "auto", "1G");
  ASSERT_TRUE(latent.ok()) << latent.status().ToString();
  EXPECT_EQ(latent->page_bytes, 1280);
  EXPECT_EQ(latent->block_bytes, 1280 * ds.num_layers);

  const ModelConfig next = Fixture("qwen3_next");
  auto hybrid = PlanMemory(next, 1 << 20, int64_t{1} << 30, "auto", "1G");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  EXPECT_EQ(hybrid->page_bytes, 2 * 2 * kKvBlockSize * 16 * kKvBytesPerElement);  // the full layers' K and V
  EXPECT_EQ(hybrid->block_bytes % hybrid->page_bytes, 0);
  EXPECT_GT(hybrid->block_bytes, hybrid->page_bytes * next.num_layers);  // the states take more than a page each
  EXPECT_EQ(hybrid->kv_tokens, (hybrid->pool - hybrid->experts) / hybrid->block_bytes * kKvBlockSize);
}

}  // namespace
}  // namespace pw::serve

// Router-logit traces (policies/misses/router_trace.h): a written trace reads back exactly
// (logits to fp16), the size bound drops records and keeps the file valid, and a truncated,
// corrupted, wrong-version or unfinished file is refused with a message saying so.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/formats/apw_store.h"
#include "common/dtype.h"
#include "policies/misses/router_trace.h"

namespace pw::misses {
namespace {

constexpr uint32_t kL = 3, kE = 16, kK = 2;

TraceHeader Header() {
  TraceHeader h;
  h.num_layers = kL;
  h.num_experts = kE;
  h.top_k = kK;
  h.norm_topk_prob = true;
  h.hidden_size = 64;
  h.moe_intermediate_size = 32;
  h.model_hash = 0x1234abcd5678ef00ull;
  return h;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("pw_trace_" + std::to_string(::getpid()) + "_" + name)).string();
}

struct Batch {
  uint32_t layer;
  uint64_t step;
  std::vector<uint64_t> seq;
  std::vector<int32_t> pos;
  std::vector<float> logits;
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

std::vector<Batch> RandomBatches(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    Batch b;
    b.layer = static_cast<uint32_t>(i) % kL;
    b.step = static_cast<uint64_t>(i) / kL;
    const size_t T = 1 + rng() % 7;
    for (size_t t = 0; t < T; ++t) {
      b.seq.push_back(100 + t);
      b.pos.push_back(static_cast<int32_t>(b.step + t));
      for (uint32_t e = 0; e < kE; ++e) b.logits.push_back(nd(rng));
      b.experts.push_back(static_cast<int32_t>(rng() % kE));
      b.experts.push_back(static_cast<int32_t>((b.experts.back() + 1 + rng() % (kE - 1)) % kE));
      b.weights.push_back(0.7f);
      b.weights.push_back(0.3f);
    }
    out.push_back(std::move(b));
  }
  return out;
}

Status Write(const std::string& path, const std::vector<Batch>& batches, uint64_t max_bytes = 0,
             TraceCounts* counts = nullptr) {
  auto w = RouterTraceWriter::Create(path, Header(), max_bytes);
  if (!w.ok()) return w.status();
  for (const Batch& b : batches) {
    PW_RETURN_IF_ERROR((*w)->Append(b.layer, b.step, b.seq.size(), b.seq.data(), b.pos.data(),
                                    b.logits.data(), b.experts.data(), b.weights.data()));
  }
  if (counts != nullptr) *counts = (*w)->counts();
  return (*w)->Close();
}

std::vector<uint8_t> Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(RouterTrace, RoundTrip) {
  const std::string path = TempPath("rt");
  const auto batches = RandomBatches(7, 20);
  ASSERT_TRUE(Write(path, batches).ok());
  auto tr = RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->header.num_layers, kL);
  EXPECT_EQ(tr->header.num_experts, kE);
  EXPECT_EQ(tr->header.top_k, kK);
  EXPECT_TRUE(tr->header.norm_topk_prob);
  EXPECT_EQ(tr->header.hidden_size, 64u);
  EXPECT_EQ(tr->header.moe_intermediate_size, 32u);
  EXPECT_EQ(tr->header.model_hash, 0x1234abcd5678ef00ull);
  ASSERT_EQ(tr->layers.size(), batches.size());
  uint64_t tokens = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    const TraceLayer& L = tr->layers[i];
    EXPECT_EQ(L.layer, b.layer);
    EXPECT_EQ(L.step, b.step);
    EXPECT_EQ(L.seq_ids, b.seq);
    EXPECT_EQ(L.positions, b.pos);
    ASSERT_EQ(L.logits.size(), b.logits.size());
    for (size_t j = 0; j < b.logits.size(); ++j) EXPECT_EQ(L.logits[j], F32ToF16(b.logits[j]));
    ASSERT_EQ(L.experts.size(), b.experts.size());
    for (size_t j = 0; j < b.experts.size(); ++j) EXPECT_EQ(L.experts[j], b.experts[j]);
    EXPECT_EQ(L.weights, b.weights);
    tokens += b.seq.size();
  }
  EXPECT_EQ(tr->counts.layer_records, batches.size());
  EXPECT_EQ(tr->counts.token_layers, tokens);
  EXPECT_EQ(tr->counts.dropped_records, 0u);
  std::filesystem::remove(path);
}

TEST(RouterTrace, SizeBoundDropsRecordsAndStaysValid) {
  const std::string path = TempPath("bound");
  const auto batches = RandomBatches(8, 40);
  TraceCounts counts;
  ASSERT_TRUE(Write(path, batches, 2000, &counts).ok());
  EXPECT_LE(std::filesystem::file_size(path), 2000u);
  EXPECT_GT(counts.dropped_records, 0u);
  EXPECT_GT(counts.layer_records, 0u);
  auto tr = RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->layers.size(), counts.layer_records);
  EXPECT_EQ(tr->counts.dropped_records, counts.dropped_records);
  EXPECT_EQ(tr->counts.layer_records + tr->counts.dropped_records, batches.size());
  std::filesystem::remove(path);
}

TEST(RouterTrace, TruncationIsRefusedAtEveryLength) {
  const std::string path = TempPath("trunc");
  ASSERT_TRUE(Write(path, RandomBatches(9, 6)).ok());
  const std::vector<uint8_t> full = Slurp(path);
  ASSERT_TRUE(RouterTrace::Parse(full.data(), full.size(), "t").ok());
  for (size_t n = 0; n < full.size(); ++n) {
    auto tr = RouterTrace::Parse(full.data(), n, "t");
    ASSERT_FALSE(tr.ok()) << "accepted a trace cut to " << n << " of " << full.size() << " bytes";
    EXPECT_EQ(tr.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(tr.status().message().find("truncated"), std::string::npos)
        << n << ": " << tr.status().ToString();
  }
  std::filesystem::remove(path);
}

TEST(RouterTrace, EveryFlippedByteIsRefused) {
  const std::string path = TempPath("flip");
  ASSERT_TRUE(Write(path, RandomBatches(10, 4)).ok());
  const std::vector<uint8_t> full = Slurp(path);
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<uint8_t> bad = full;
    bad[i] ^= 0x20;
    auto tr = RouterTrace::Parse(bad.data(), bad.size(), "t");
    EXPECT_FALSE(tr.ok()) << "accepted a flipped byte at " << i;
    if (!tr.ok()) EXPECT_EQ(tr.status().code(), StatusCode::kCorrupt);
  }
}

TEST(RouterTrace, VersionTrailingBytesAndMissingFile) {
  const std::string path = TempPath("ver");
  ASSERT_TRUE(Write(path, RandomBatches(11, 3)).ok());
  std::vector<uint8_t> full = Slurp(path);
  std::vector<uint8_t> trailing = full;
  trailing.push_back(0);
  auto t1 = RouterTrace::Parse(trailing.data(), trailing.size(), "t");
  ASSERT_FALSE(t1.ok());
  EXPECT_NE(t1.status().message().find("trailing"), std::string::npos) << t1.status().ToString();
  // A future version (its header checksum fixed up) is refused by name.
  std::vector<uint8_t> v2 = full;
  v2[8] = 2;
  const uint32_t crc = apw::Crc32(v2.data(), 60);
  std::memcpy(v2.data() + 60, &crc, 4);
  auto t2 = RouterTrace::Parse(v2.data(), v2.size(), "t");
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("version 2"), std::string::npos) << t2.status().ToString();
  auto t3 = RouterTrace::Read(path + ".absent");
  EXPECT_EQ(t3.status().code(), StatusCode::kNotFound);
  std::filesystem::remove(path);
}

TEST(RouterTrace, UnfinishedWriterIsRefused) {
  const std::string path = TempPath("unfinished");
  const auto batches = RandomBatches(12, 5);
  {
    auto w = RouterTraceWriter::Create(path, Header());
    ASSERT_TRUE(w.ok());
    for (const Batch& b : batches) {
      ASSERT_TRUE((*w)->Append(b.layer, b.step, b.seq.size(), b.seq.data(), b.pos.data(),
                               b.logits.data(), b.experts.data(), b.weights.data()).ok());
    }
    std::fflush(nullptr);
    // Copy the file as a killed writer would leave it: every record, no end record.
    std::filesystem::copy_file(path, path + ".cut", std::filesystem::copy_options::overwrite_existing);
  }
  const std::vector<uint8_t> cut = Slurp(path + ".cut");
  auto tr = RouterTrace::Parse(cut.data(), cut.size(), "t");
  // The writer buffers: the copy may end mid-record or after whole records; either is refused.
  ASSERT_FALSE(tr.ok());
  EXPECT_NE(tr.status().message().find("truncated"), std::string::npos) << tr.status().ToString();
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".cut");
}

TEST(RouterTrace, WriterRefusesBadInput) {
  TraceHeader h = Header();
  h.top_k = kE + 1;
  EXPECT_EQ(RouterTraceWriter::Create(TempPath("bad"), h).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RouterTraceWriter::Create("/nonexistent-dir/x.trace", Header()).status().code(),
            StatusCode::kNotFound);
  const std::string path = TempPath("badexp");
  auto w = RouterTraceWriter::Create(path, Header());
  ASSERT_TRUE(w.ok());
  std::vector<float> logits(kE, 0.f), weights(kK, 0.5f);
  std::vector<int32_t> experts{0, static_cast<int32_t>(kE)};
  EXPECT_EQ((*w)->Append(0, 0, 1, nullptr, nullptr, logits.data(), experts.data(), weights.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Append(kL, 0, 1, nullptr, nullptr, logits.data(), experts.data(), weights.data()).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w)->Close().ok());
  auto tr = RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_TRUE(tr->layers.empty());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pw::misses

// Router-logit traces (policies/misses/router_trace.h): a written trace reads back exactly
// (logits to fp16), the size bound drops records and keeps the file valid, a file cut short at
// any byte after its header reads as its whole records with the torn tail reported, and a
// corrupted or wrong-version file, or one shorter than its header, is refused with a message
// saying so.
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

// Where each record of a trace of `batches` starts, and where the end record ends.
std::vector<size_t> RecordStarts(const std::vector<Batch>& batches) {
  std::vector<size_t> at{64};
  for (const Batch& b : batches)
    at.push_back(at.back() + 16 + 16 + b.seq.size() * (12 + 2 * kE + 6 * kK));
  at.push_back(at.back() + 16 + 32);
  return at;
}

void ExpectLayer(const TraceLayer& L, const Batch& b, const std::string& what) {
  EXPECT_EQ(L.layer, b.layer) << what;
  EXPECT_EQ(L.step, b.step) << what;
  EXPECT_EQ(L.seq_ids, b.seq) << what;
  EXPECT_EQ(L.positions, b.pos) << what;
  ASSERT_EQ(L.logits.size(), b.logits.size()) << what;
  for (size_t j = 0; j < b.logits.size(); ++j)
    ASSERT_EQ(L.logits[j], F32ToF16(b.logits[j])) << what;
  EXPECT_EQ(L.weights, b.weights) << what;
}

// A file cut anywhere after its header (a writer killed or stopped by a full disk) reads as its
// whole records; the torn bytes after them are counted and named, never parsed.
TEST(RouterTrace, CutAtEveryLengthKeepsEveryWholeRecord) {
  const std::string path = TempPath("trunc");
  const auto batches = RandomBatches(9, 6);
  ASSERT_TRUE(Write(path, batches).ok());
  const std::vector<uint8_t> full = Slurp(path);
  const std::vector<size_t> starts = RecordStarts(batches);
  ASSERT_EQ(starts.back(), full.size());
  auto whole = RouterTrace::Parse(full.data(), full.size(), "t");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(whole->tail.complete);
  EXPECT_EQ(whole->tail.torn_bytes, 0u);
  EXPECT_TRUE(whole->tail.message.empty());
  for (size_t n = 0; n < full.size(); ++n) {
    auto tr = RouterTrace::Parse(full.data(), n, "t");
    if (n < 64) {  // not even the header: nothing to read
      ASSERT_FALSE(tr.ok()) << n;
      EXPECT_EQ(tr.status().code(), StatusCode::kCorrupt);
      EXPECT_NE(tr.status().message().find("truncated"), std::string::npos)
          << tr.status().ToString();
      continue;
    }
    ASSERT_TRUE(tr.ok()) << "cut to " << n << " of " << full.size() << ": "
                         << tr.status().ToString();
    size_t records = 0;  // layer records wholly inside the first n bytes
    while (records < batches.size() && starts[records + 1] <= n) ++records;
    const size_t boundary = starts[records];
    ASSERT_EQ(tr->layers.size(), records) << n;
    EXPECT_FALSE(tr->tail.complete) << n;
    EXPECT_EQ(tr->tail.whole_bytes, boundary) << n;
    EXPECT_EQ(tr->tail.torn_bytes, n - boundary) << n;
    EXPECT_EQ(tr->counts.layer_records, records) << n;
    EXPECT_EQ(tr->counts.dropped_records, 0u) << n;
    uint64_t tokens = 0;
    for (size_t i = 0; i < records; ++i) {
      ExpectLayer(tr->layers[i], batches[i],
                  "cut " + std::to_string(n) + " record " + std::to_string(i));
      tokens += batches[i].seq.size();
    }
    EXPECT_EQ(tr->counts.token_layers, tokens) << n;
    const std::string& m = tr->tail.message;
    EXPECT_NE(m.find("t: cut short (no end record"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(records) + " whole layer records"), std::string::npos) << m;
    if (n > boundary) {
      EXPECT_NE(
          m.find("record " + std::to_string(records) + " at byte " + std::to_string(boundary) +
                 " is torn (" + std::to_string(n - boundary) + " of "),
          std::string::npos)
          << m;
    } else {
      EXPECT_EQ(m.find("torn"), std::string::npos) << m;
    }
  }
  std::filesystem::remove(path);
}

// The case of a full disk: the last layer record cut at each of its bytes. The first five
// records replay; the sixth is reported torn with its size.
TEST(RouterTrace, TornLastRecordAtEveryOffset) {
  const std::string path = TempPath("torn");
  const auto batches = RandomBatches(13, 6);
  ASSERT_TRUE(Write(path, batches).ok());
  const std::vector<uint8_t> full = Slurp(path);
  const std::vector<size_t> starts = RecordStarts(batches);
  const size_t last = starts[5], last_size = starts[6] - starts[5];
  for (size_t cut = 1; cut < last_size; ++cut) {
    auto tr = RouterTrace::Parse(full.data(), last + cut, "decode.trace");
    ASSERT_TRUE(tr.ok()) << cut << ": " << tr.status().ToString();
    ASSERT_EQ(tr->layers.size(), 5u) << cut;
    for (size_t i = 0; i < 5; ++i)
      ExpectLayer(tr->layers[i], batches[i], "record " + std::to_string(i));
    EXPECT_EQ(tr->tail.torn_bytes, cut);
    const std::string size = cut < 16 ? "its 16-byte header" : std::to_string(last_size) + " bytes";
    EXPECT_NE(tr->tail.message.find("record 5 at byte " + std::to_string(last) + " is torn (" +
                                    std::to_string(cut) + " of " + size + "), ignored"),
              std::string::npos)
        << tr->tail.message;
  }
  std::filesystem::remove(path);
}

// Only the end may be cut: a checksum failure before the cut, in the last whole record, or in the
// torn record's own (whole) header is corruption, as in a whole file.
TEST(RouterTrace, CorruptionBeforeTheCutIsStillRefused) {
  const std::string path = TempPath("cutcorrupt");
  const auto batches = RandomBatches(14, 6);
  ASSERT_TRUE(Write(path, batches).ok());
  const std::vector<uint8_t> full = Slurp(path);
  const std::vector<size_t> starts = RecordStarts(batches);
  const size_t torn_end = starts[5] + 40;  // inside the last layer record's payload
  auto refused = [&](std::vector<uint8_t> bytes, size_t n, const std::string& want) {
    auto tr = RouterTrace::Parse(bytes.data(), n, "t");
    ASSERT_FALSE(tr.ok()) << want;
    EXPECT_EQ(tr.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(tr.status().message().find(want), std::string::npos) << tr.status().ToString();
  };
  std::vector<uint8_t> bad = full;
  bad[starts[2] + 16 + 20] ^= 0x01;  // a payload byte in the middle of the file
  refused(bad, torn_end,
          "record 2 at byte " + std::to_string(starts[2]) + ": payload checksum mismatch");
  refused(bad, starts[5], "payload checksum mismatch");  // cut at a record boundary
  bad = full;
  bad[starts[4] + 16 + 3] ^= 0x01;  // the last whole record before the cut
  refused(bad, torn_end,
          "record 4 at byte " + std::to_string(starts[4]) + ": payload checksum mismatch");
  refused(bad, starts[5],
          "record 4 at byte " + std::to_string(starts[4]) + ": payload checksum mismatch");
  bad = full;
  bad[starts[5] + 5] ^= 0x01;  // the torn record's header (its size)
  refused(bad, torn_end,
          "record 5 at byte " + std::to_string(starts[5]) + ": record header checksum mismatch");
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
    if (!tr.ok()) {
      EXPECT_EQ(tr.status().code(), StatusCode::kCorrupt);
    }
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
  v2[8] = 3;
  const uint32_t crc = apw::Crc32(v2.data(), 60);
  std::memcpy(v2.data() + 60, &crc, 4);
  auto t2 = RouterTrace::Parse(v2.data(), v2.size(), "t");
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("version 3, this reader knows versions 1 and 2"), std::string::npos)
      << t2.status().ToString();
  auto t3 = RouterTrace::Read(path + ".absent");
  EXPECT_EQ(t3.status().code(), StatusCode::kNotFound);
  std::filesystem::remove(path);
}

// A sigmoid gate's trace is version 2: the header names the gate and its groups, each layer's
// selection bias is a record before the layer's first layer record; a softmax trace stays
// version 1. A layer without its bias is refused at Append; a file whose layer record comes
// before its bias record, or with bad groups, is refused at read.
TEST(RouterTrace, SigmoidGateTracesCarryTheirGroupsAndBias) {
  const std::string path = TempPath("sigmoid");
  TraceHeader h = Header();
  h.gate = TraceGate::kSigmoid;
  h.n_group = 2;
  h.topk_group = 1;
  const auto batches = RandomBatches(13, 2 * kL);
  std::vector<std::vector<float>> bias(kL);
  {
    auto w = RouterTraceWriter::Create(path, h);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const Batch& b0 = batches[0];
    const Status missing = (*w)->Append(b0.layer, b0.step, b0.seq.size(), b0.seq.data(), b0.pos.data(),
                                        b0.logits.data(), b0.experts.data(), b0.weights.data());
    EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(missing.message().find("no selection bias"), std::string::npos) << missing.ToString();
    for (uint32_t l = 0; l < kL; ++l) {
      for (uint32_t e = 0; e < kE; ++e) bias[l].push_back(0.01f * static_cast<float>(l * kE + e));
      ASSERT_TRUE((*w)->SetSelectionBias(l, bias[l].data()).ok());
    }
    for (const Batch& b : batches) {
      ASSERT_TRUE((*w)->Append(b.layer, b.step, b.seq.size(), b.seq.data(), b.pos.data(),
                               b.logits.data(), b.experts.data(), b.weights.data()).ok());
    }
    ASSERT_TRUE((*w)->Close().ok());
  }
  std::vector<uint8_t> full = Slurp(path);
  EXPECT_EQ(full[8], 2);
  auto tr = RouterTrace::Parse(full.data(), full.size(), "t");
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->header.gate, TraceGate::kSigmoid);
  EXPECT_EQ(tr->header.n_group, 2u);
  EXPECT_EQ(tr->header.topk_group, 1u);
  EXPECT_EQ(tr->selection_bias, bias);
  EXPECT_EQ(tr->layers.size(), batches.size());
  // The first record is layer 0's bias (kind 3); dropping it leaves layer 0's records without one.
  uint32_t kind, len;
  std::memcpy(&kind, full.data() + 64, 4);
  std::memcpy(&len, full.data() + 68, 4);
  ASSERT_EQ(kind, 3u);
  std::vector<uint8_t> cut(full.begin(), full.begin() + 64);
  cut.insert(cut.end(), full.begin() + 64 + 16 + len, full.end());
  auto t1 = RouterTrace::Parse(cut.data(), cut.size(), "t");
  ASSERT_FALSE(t1.ok());
  EXPECT_NE(t1.status().message().find("layer 0 of a sigmoid gate before its bias record"), std::string::npos)
      << t1.status().ToString();
  std::vector<uint8_t> groups = full;
  groups[52] = 3;  // n_group 3 does not divide E
  const uint32_t crc = apw::Crc32(groups.data(), 60);
  std::memcpy(groups.data() + 60, &crc, 4);
  auto t2 = RouterTrace::Parse(groups.data(), groups.size(), "t");
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("bad groups in header (n_group 3"), std::string::npos)
      << t2.status().ToString();
  // A softmax trace is version 1.
  ASSERT_TRUE(Write(path, batches).ok());
  EXPECT_EQ(Slurp(path)[8], 1);
  std::filesystem::remove(path);
}

TEST(RouterTrace, UnfinishedWriterKeepsItsRecords) {
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
  // The writer buffers: the copy may end mid-record or after whole records; either way the whole
  // ones read back.
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_FALSE(tr->tail.complete);
  EXPECT_NE(tr->tail.message.find("cut short"), std::string::npos) << tr->tail.message;
  ASSERT_LE(tr->layers.size(), batches.size());
  for (size_t i = 0; i < tr->layers.size(); ++i)
    ExpectLayer(tr->layers[i], batches[i], std::to_string(i));
  EXPECT_EQ(tr->tail.whole_bytes + tr->tail.torn_bytes, cut.size());
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".cut");
}

// A bounded writer puts its header on disk at once and its records when the bound is reached,
// not at Close: a reader of the live file (or of one whose writer was killed) finds them.
TEST(RouterTrace, BoundedWriterRecordsReachTheFileBeforeClose) {
  const std::string path = TempPath("live");
  const auto batches = RandomBatches(15, 40);
  auto w = RouterTraceWriter::Create(path, Header(), 1000);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(std::filesystem::file_size(path), 64u);
  uint64_t written_at_last_drop = 0;
  for (const Batch& b : batches) {
    const uint64_t dropped = (*w)->counts().dropped_records;
    ASSERT_TRUE((*w)->Append(b.layer, b.step, b.seq.size(), b.seq.data(), b.pos.data(),
                             b.logits.data(), b.experts.data(), b.weights.data())
                    .ok());
    if ((*w)->counts().dropped_records > dropped)
      written_at_last_drop = (*w)->counts().layer_records;
  }
  ASSERT_GT((*w)->counts().dropped_records, 0u);
  ASSERT_GT(written_at_last_drop, 0u);
  const std::vector<uint8_t> live = Slurp(path);
  auto tr = RouterTrace::Parse(live.data(), live.size(), "live");
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_FALSE(tr->tail.complete);
  EXPECT_EQ(tr->tail.torn_bytes, 0u);
  EXPECT_EQ(tr->layers.size(), written_at_last_drop);
  ASSERT_TRUE((*w)->Close().ok());
  auto closed = RouterTrace::Read(path);
  ASSERT_TRUE(closed.ok()) << closed.status().ToString();
  EXPECT_TRUE(closed->tail.complete);
  EXPECT_LE(std::filesystem::file_size(path), 1000u);
  std::filesystem::remove(path);
}

// A bound is at least the smallest trace of the model with one record (header, a one-token
// layer record, the end record); below it the writer refuses to start.
TEST(RouterTrace, BoundBelowOneRecordIsRefused) {
  const uint64_t min = MinTraceBytes(kE, kK);
  EXPECT_EQ(min, 64u + 16 + 16 + (12 + 2 * kE + 6 * kK) + 16 + 32);
  EXPECT_EQ(MinTraceBytes(1, 1), kMinTraceBytesAnyModel);
  const std::string path = TempPath("minbound");
  auto refused = RouterTraceWriter::Create(path, Header(), min - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("holds no record"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(std::to_string(min) + " bytes"), std::string::npos)
      << refused.status().ToString();
  auto w = RouterTraceWriter::Create(path, Header(), min);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto batches = RandomBatches(16, 1);
  const Batch& b = batches[0];
  // One token of the batch fits exactly; the next record does not.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*w)->Append(b.layer, b.step, 1, b.seq.data(), b.pos.data(), b.logits.data(),
                             b.experts.data(), b.weights.data())
                    .ok());
  }
  EXPECT_EQ((*w)->counts().layer_records, 1u);
  EXPECT_EQ((*w)->counts().dropped_records, 1u);
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(std::filesystem::file_size(path), min);
  auto tr = RouterTrace::Read(path);
  ASSERT_TRUE(tr.ok()) << tr.status().ToString();
  EXPECT_EQ(tr->layers.size(), 1u);
  std::filesystem::remove(path);
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

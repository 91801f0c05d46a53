// The resume directory of a store build (quant/store_build_dir.h): its parts are kept for the
// same build only, the calibration statistics and the store's progress come back bit for bit,
// and a damaged or foreign file is refused with its name instead of being used.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/expert_block.h"
#include "quant/store_build_dir.h"

namespace pw::anyprec {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp/store-build-dir/" + name;
  fs::remove_all(dir);
  return dir;
}

CalibrationStats Stats(int layers, int experts, int hidden, int ffn) {
  CalibrationStats s{layers, experts, hidden, ffn, {}, {}};
  const size_t blocks = static_cast<size_t>(layers) * experts * kProjsPerExpert;
  for (size_t i = 0; i < blocks; ++i) {
    const int cols = ExpertBlockAt(i, experts).proj == ExpertProj::kGateUp ? hidden : ffn;
    s.tokens.push_back(i * 7 + 1);
    std::vector<double> v(static_cast<size_t>(cols));
    for (int j = 0; j < cols; ++j) v[static_cast<size_t>(j)] = 1.0 / (3.0 + static_cast<double>(i) + j);
    s.sums.push_back(v);
  }
  return s;
}

TEST(StoreBuildDir, KeepsItsPartsForTheSameBuildOnly) {
  const std::string dir = FreshDir("same");
  auto a = StoreBuildDir::Open(dir, "build A\n");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_FALSE(a->reused());
  ASSERT_TRUE(a->SaveStoreProgress({4096, std::vector<uint8_t>(128, 7)}).ok());
  auto again = StoreBuildDir::Open(dir, "build A\n");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->reused());
  auto kept = again->LoadStoreProgress();
  ASSERT_TRUE(kept.ok() && kept->has_value()) << kept.status().ToString();
  // Another build (other options, another model) starts from an empty directory.
  auto b = StoreBuildDir::Open(dir, "build B\n");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->reused());
  auto gone = b->LoadStoreProgress();
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  ASSERT_TRUE(b->Remove().ok());
  EXPECT_FALSE(fs::exists(dir));
}

TEST(StoreBuildDir, CalibrationStatisticsRoundTripExactly) {
  auto d = StoreBuildDir::Open(FreshDir("calib"), "build\n");
  ASSERT_TRUE(d.ok());
  auto none = d->LoadCalibration(2, 3, 8, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const CalibrationStats s = Stats(2, 3, 8, 4);
  ASSERT_TRUE(d->SaveCalibration(s).ok());
  auto back = d->LoadCalibration(2, 3, 8, 4);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ((*back)->tokens, s.tokens);
  EXPECT_EQ((*back)->sums, s.sums);  // bit for bit: a resumed build quantizes the same bytes
}

TEST(StoreBuildDir, DamagedOrForeignStatisticsAreRefusedByName) {
  auto d = StoreBuildDir::Open(FreshDir("damaged"), "build\n");
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->SaveCalibration(Stats(2, 3, 8, 4)).ok());
  const std::string path = d->dir() + "/calibration.bin";
  // Another shape.
  auto other = d->LoadCalibration(2, 3, 8, 5);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(other.status().message().find(path), std::string::npos) << other.status().message();
  // One flipped byte.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto flipped = d->LoadCalibration(2, 3, 8, 4);
  ASSERT_FALSE(flipped.ok());
  EXPECT_NE(flipped.status().message().find("checksum"), std::string::npos) << flipped.status().message();
}

// The store's progress comes back exactly; a damaged one is refused by name, not used.
TEST(StoreBuildDir, StoreProgressRoundTripsAndDamageIsNamed) {
  auto d = StoreBuildDir::Open(FreshDir("progress"), "build\n");
  ASSERT_TRUE(d.ok());
  apw::ApwWriter::Progress p{123456789, {}};
  for (int i = 0; i < 3 * 128; ++i) p.table.push_back(static_cast<uint8_t>(i * 31));
  ASSERT_TRUE(d->SaveStoreProgress(p).ok());
  auto back = d->LoadStoreProgress();
  ASSERT_TRUE(back.ok() && back->has_value()) << back.status().ToString();
  EXPECT_EQ((*back)->end, p.end);
  EXPECT_EQ((*back)->table, p.table);
  const std::string path = d->dir() + "/store-progress.bin";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x5a');
  }
  auto bad = d->LoadStoreProgress();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find(path), std::string::npos) << bad.status().ToString();
  fs::resize_file(path, 10);
  bad = d->LoadStoreProgress();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a store build's progress"), std::string::npos);
}

}  // namespace
}  // namespace pw::anyprec

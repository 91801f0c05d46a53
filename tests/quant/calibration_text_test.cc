// The default calibration of pw-quantize: the bundled text through the model's own tokenizer
// when the checkpoint has one (the embedded model), random ids when it has none; a store built
// by default is the store of the bundled text given as a file, and says so in its report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/text/tokenizer.h"
#include "common/calibration_text.h"
#include "quant/calibration_tokens.h"
#include "quant/quantize_model.h"

namespace pw::anyprec {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";

class CalibrationTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("pw_calib_text_" + std::to_string(getpid()))).string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST_F(CalibrationTextTest, TheBundledTextIsTheCommittedFile) {
  const std::string committed = ReadFile(std::string(PW_SOURCE_DIR) + "/common/calibration/calibration.txt");
  ASSERT_GT(committed.size(), 10000u);
  EXPECT_EQ(BundledCalibrationText(), committed);
}

TEST_F(CalibrationTextTest, DefaultIsTheBundledTextThroughTheModelsTokenizer) {
  CalibrationSource src;
  src.model_dir = kModel;
  const CalibrationSource resolved = ResolveDefaultCalibration(src);
  EXPECT_TRUE(resolved.bundled_text);
  EXPECT_EQ(resolved.random_tokens, 0);
  EXPECT_NE(DescribeCalibration(resolved).find("bundled text"), std::string::npos);
  auto ids = CalibrationTokens(resolved, 1 << 20);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  auto tok = Tokenizer::FromFile(kModel + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto expected = (*tok)->Encode(std::string(BundledCalibrationText()));
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(*ids, *expected);
  EXPECT_GT(ids->size(), 4000u);  // a few thousand tokens, not a handful
  // A vocabulary smaller than the tokenizer's ids is an error naming the tokenizer.
  auto small = CalibrationTokens(resolved, 10);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("tokenizer.json"), std::string::npos) << small.status().ToString();
}

TEST_F(CalibrationTextTest, WithoutATokenizerTheDefaultIsRandomIds) {
  fs::copy_file(kModel + "/config.json", dir_ + "/config.json");
  CalibrationSource src;
  src.model_dir = dir_;
  src.seed = 5;
  const CalibrationSource resolved = ResolveDefaultCalibration(src);
  EXPECT_FALSE(resolved.bundled_text);
  EXPECT_EQ(resolved.random_tokens, kDefaultRandomCalibrationTokens);
  EXPECT_EQ(resolved.seed, 5u);
  // What the options ask for is kept: a text path, or random ids.
  src.text_path = dir_ + "/t.txt";
  EXPECT_EQ(ResolveDefaultCalibration(src).text_path, src.text_path);
  EXPECT_FALSE(ResolveDefaultCalibration(src).bundled_text);
}

TEST_F(CalibrationTextTest, TheDefaultStoreIsTheStoreOfTheBundledTextAsAFile) {
  {
    std::ofstream f(dir_ + "/calib.txt", std::ios::binary);
    f << BundledCalibrationText();
  }
  QuantizeModelOptions o;
  o.model_dir = kModel;
  o.threads = 2;
  o.progress = false;
  o.out_path = dir_ + "/default.apw";
  auto a = QuantizeModel(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->calibration.rfind("bundled text", 0), 0u) << a->calibration;
  o.calib_path = dir_ + "/calib.txt";
  o.out_path = dir_ + "/file.apw";
  auto b = QuantizeModel(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->calibration.rfind("text ", 0), 0u) << b->calibration;
  EXPECT_EQ(a->calib_tokens, b->calib_tokens);
  EXPECT_EQ(ReadFile(dir_ + "/default.apw"), ReadFile(dir_ + "/file.apw"));
}

}  // namespace
}  // namespace pw::anyprec

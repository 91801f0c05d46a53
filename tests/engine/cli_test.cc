// pw-generate and pw-eval on bad input: a message on stderr naming the problem and a non-zero
// exit status, never a crash; pw-quantize's random-token calibration from the command line.
// Runs the built binaries from <build>/bin.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/common/run_command.h"

namespace {

using pw::testing::CommandResult;
using pw::testing::RunCommand;

std::string Bin(const char* name) { return std::string(PW_BINARY_DIR) + "/bin/" + name; }
std::string Fixture() { return std::string(PW_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe"; }

TEST(Cli, GenerateRejectsBadInput) {
  CommandResult r = RunCommand(Bin("pw-generate") + " --model /nonexistent/dir --prompt hi");
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/dir"), std::string::npos) << r.output;

  // The random fixture checkpoints have no tokenizer: the error names tokenizer.json.
  r = RunCommand(Bin("pw-generate") + " --model " + Fixture() + " --prompt hi");
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;

  r = RunCommand(Bin("pw-generate") + " --model " + Fixture());
  EXPECT_GT(r.status, 0) << r.output;  // --prompt is required
  r = RunCommand(Bin("pw-generate") + " --model " + Fixture() + " --prompt hi --max-tokens -3");
  EXPECT_GT(r.status, 0) << r.output;
}

TEST(Cli, EvalRejectsBadInput) {
  CommandResult r =
      RunCommand(Bin("pw-eval") + " ppl --model " + Fixture() + " --text /nonexistent/file.txt");
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/file.txt"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-eval") + " ppl --model /nonexistent/dir --text /etc/hostname");
  EXPECT_GT(r.status, 0) << r.output;
  r = RunCommand(Bin("pw-eval") + " ppl --model " + Fixture() + " --text /etc/hostname --ctx 1");
  EXPECT_GT(r.status, 0) << r.output;
  r = RunCommand(Bin("pw-eval"));
  EXPECT_GT(r.status, 0) << r.output;
}

// A generating model dir: the qwen3_moe fixture weights (vocab 4096) with the tiny model's
// tokenizer (same vocabulary size).
std::string MakeModelWithTokenizer() {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/pw_cli_model";
  fs::create_directories(dir);
  const auto over = fs::copy_options::overwrite_existing;
  fs::copy_file(Fixture() + "/config.json", dir + "/config.json", over);
  fs::copy_file(Fixture() + "/model.safetensors", dir + "/model.safetensors", over);
  const std::string tiny = std::string(PW_SOURCE_DIR) + "/models/tiny-moe";
  fs::copy_file(tiny + "/tokenizer.json", dir + "/tokenizer.json", over);
  fs::copy_file(tiny + "/tokenizer_config.json", dir + "/tokenizer_config.json", over);
  return dir;
}

TEST(Cli, GenerateRunsAndRejectsInvalidUtf8AndOverlongPrompts) {
  const std::string dir = MakeModelWithTokenizer();
  CommandResult r =
      RunCommand(Bin("pw-generate") + " --model " + dir + " --prompt 'Hello there' --max-tokens 5");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  r = RunCommand(Bin("pw-generate") + " --model " + dir +
           " --prompt 'Hi' --max-tokens 5 --temperature 0.8 --top-p 0.9 --top-k 50 --seed 7");
  EXPECT_EQ(r.status, 0) << r.output;

  r = RunCommand(Bin("pw-generate") + " --model " + dir + " --prompt \"$(printf 'ab\\377\\376')\"");
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("UTF-8"), std::string::npos) << r.output;

  std::string long_prompt;
  for (int i = 0; i < 700; ++i) long_prompt += " x";  // > 512 tokens, the fixture's context
  r = RunCommand(Bin("pw-generate") + " --model " + dir + " --prompt '" + long_prompt + "'");
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("context"), std::string::npos) << r.output;

  const std::string bad_text = ::testing::TempDir() + "/pw_cli_bad.txt";
  {
    std::ofstream f(bad_text, std::ios::binary);
    f << "valid start \xc3\x28 then invalid";
  }
  r = RunCommand(Bin("pw-eval") + " ppl --model " + dir + " --text " + bad_text);
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(bad_text), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

// --calib-random-tokens: a store from a checkpoint without a tokenizer; it excludes --calib, and
// one of the two is required.
TEST(Cli, QuantizeCalibratesOnRandomTokens) {
  if (!std::filesystem::exists(Bin("pw-quantize"))) GTEST_SKIP() << "pw-quantize not built";
  const std::string out = ::testing::TempDir() + "/pw_cli_random.apw";
  CommandResult r = RunCommand(Bin("pw-quantize") + " --model " + Fixture() +
                      " --calib-random-tokens 200 --calib-seed 5 --ctx 64 --quiet --out " + out);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("200 calibration tokens"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out));
  std::filesystem::remove(out);

  r = RunCommand(Bin("pw-quantize") + " --model " + Fixture() +
           " --calib /etc/hostname --calib-random-tokens 200 --out " + out);
  EXPECT_GT(r.status, 0) << r.output;
  // No calibration flag and no tokenizer.json beside the checkpoint (the fixture has none):
  // the bundled text cannot be tokenized, so it calibrates on random ids and says so.
  ASSERT_FALSE(std::filesystem::exists(Fixture() + "/tokenizer.json"));
  r = RunCommand(Bin("pw-quantize") + " --model " + Fixture() + " --ctx 64 --out " + out);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("4096 random ids"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out));
  std::filesystem::remove(out);
}

// --model-hash-cache (what pw serve passes): the second build takes the model hash from the
// directory instead of reading every expert byte, and writes the same store.
TEST(Cli, QuantizeTakesTheModelHashFromItsCache) {
  if (!std::filesystem::exists(Bin("pw-quantize"))) GTEST_SKIP() << "pw-quantize not built";
  namespace fs = std::filesystem;
  const std::string cache = ::testing::TempDir() + "/pw_cli_hash_cache";
  fs::remove_all(cache);
  const std::string first = ::testing::TempDir() + "/pw_cli_hash1.apw";
  const std::string second = ::testing::TempDir() + "/pw_cli_hash2.apw";
  const std::string cmd = Bin("pw-quantize") + " --model " + Fixture() +
                          " --calib-random-tokens 200 --ctx 64 --quiet --model-hash-cache " + cache + " --out ";
  CommandResult r = RunCommand(cmd + first);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("(model hash remembered)"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::is_directory(cache + "/hashes")) << r.output;
  r = RunCommand(cmd + second);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(model hash remembered)"), std::string::npos) << r.output;
  std::ifstream a(first, std::ios::binary), b(second, std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  const std::string bytes_b((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(bytes_a.empty());
  EXPECT_TRUE(bytes_a == bytes_b) << "the store built with the remembered hash differs";
  fs::remove(first);
  fs::remove(second);
  fs::remove_all(cache);
}

}  // namespace

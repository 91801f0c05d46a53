// The planner's prompt residual heads: the ridge fit on hand-made cases it must fit, the
// heads file's round trip and its refusal of truncated, corrupt and foreign files.
#include "common/formats/residual_heads.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "quant/residual_train.h"

namespace pw {
namespace {

std::string TmpPath(const std::string& name) {
  const std::string dir = std::string(PW_BINARY_DIR) + "/test-tmp";
  std::filesystem::create_directories(dir);
  return dir + "/residual_heads_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Random routing histograms over `experts` (shares summing to 1).
std::vector<double> Histogram(int experts, std::mt19937& rng) {
  std::gamma_distribution<double> g(0.5, 1.0);
  std::vector<double> h(static_cast<size_t>(experts));
  double sum = 0;
  for (auto& v : h) sum += (v = g(rng) + 1e-9);
  for (auto& v : h) v /= sum;
  return h;
}

TEST(ResidualFit, RidgeRecoversALinearFunctionExactly) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (int s = 0; s < 50; ++s) {
    x.push_back({u(rng), u(rng), u(rng)});
    y.push_back(0.3 + 2.0 * x.back()[0] - 1.0 * x.back()[1] + 0.0 * x.back()[2]);
  }
  auto w = anyprec::FitRidgeHead(x, y, 1e-9).value();
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 0.3, 1e-6);
  EXPECT_NEAR(w[1], 2.0, 1e-6);
  EXPECT_NEAR(w[2], -1.0, 1e-6);
  EXPECT_NEAR(w[3], 0.0, 1e-6);
  // A strong penalty shrinks the weights toward 0 (the bias then carries the mean).
  auto shrunk = anyprec::FitRidgeHead(x, y, 1e6).value();
  EXPECT_LT(std::fabs(shrunk[1]), 0.01);
  EXPECT_FALSE(anyprec::FitRidgeHead({}, {}, 1.0).ok());
  EXPECT_FALSE(anyprec::FitRidgeHead({{1.0}, {1.0, 2.0}}, {0.0, 1.0}, 1.0).ok());
}

// Heads over routing histograms: a target that is a linear function of the histogram plus a
// little noise is fitted with a held-out R^2 near 1; a target that is pure noise is not.
TEST(ResidualFit, HeadsFitHistogramTargetsAndScoreHeldOutPrompts) {
  constexpr int kLayers = 2, kExperts = 6;
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0, 0.01);
  const double w_true[kLayers][kExperts] = {{1.5, -0.5, 0, 0, 0.8, 0}, {0, 0, -2.0, 1.0, 0, 0.3}};
  auto make = [&](bool signal) {
    std::vector<anyprec::ResidualSample> samples;
    for (int p = 0; p < 100; ++p) {
      for (int l = 0; l < kLayers; ++l) {
        anyprec::ResidualSample s;
        s.prompt = p;
        s.layer = l;
        s.proj = p % 2 ? ExpertProj::kDown : ExpertProj::kGateUp;
        s.feature = Histogram(kExperts, rng);
        double y = signal ? 0.1 : 0.0;
        for (int e = 0; e < kExperts; ++e) y += signal ? w_true[l][e] * s.feature[e] : 0.0;
        s.target = y + (signal ? noise(rng) : 10 * noise(rng));
        s.heldout = p % 5 == 4;
        samples.push_back(std::move(s));
      }
    }
    return samples;
  };
  ResidualHeads heads(kLayers, kExperts, 42);
  auto rep = anyprec::FitResidualHeads(make(true), 1e-6, &heads).value();
  EXPECT_EQ(rep.train_prompts, 80);
  EXPECT_EQ(rep.heldout_prompts, 20);
  EXPECT_GT(rep.heldout_r2, 0.95);
  EXPECT_GT(rep.heldout_corr, 0.97);
  EXPECT_DOUBLE_EQ(heads.fit().heldout_r2, rep.heldout_r2);
  // The fitted head predicts the function on a new histogram.
  std::vector<double> f = Histogram(kExperts, rng);
  double want = 0.1;
  for (int e = 0; e < kExperts; ++e) want += w_true[0][e] * f[e];
  EXPECT_NEAR(heads.Predict(0, ExpertProj::kGateUp, f.data()), want, 0.05);

  ResidualHeads noisy(kLayers, kExperts, 42);
  auto nrep = anyprec::FitResidualHeads(make(false), 1.0, &noisy).value();
  EXPECT_LT(nrep.heldout_r2, 0.2);

  // A sample that does not fit the heads is refused.
  auto bad = make(true);
  bad[0].feature.pop_back();
  EXPECT_FALSE(anyprec::FitResidualHeads(bad, 1.0, &noisy).ok());
}

TEST(ResidualHeadsFile, RoundTripsEveryWeightAndFigure) {
  ResidualHeads h(3, 4, 0x1234abcdull, 1.5);
  for (int l = 0; l < 3; ++l)
    for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown})
      for (int k = 0; k < 5; ++k) h.head(l, p)[static_cast<size_t>(k)] = 0.01 * (l * 10 + k) - (p == ExpertProj::kDown);
  h.fit().train_prompts = 40;
  h.fit().heldout_prompts = 10;
  h.fit().ridge = 0.01;
  h.fit().heldout_r2 = 0.42;
  h.fit().heldout_corr = 0.7;
  const std::string path = TmpPath("roundtrip.pwrh");
  ASSERT_TRUE(h.Save(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto r = ResidualHeads::Load(path, 0x1234abcdull);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_layers(), 3);
  EXPECT_EQ(r->num_experts(), 4);
  EXPECT_EQ(r->clamp(), 1.5);
  EXPECT_EQ(r->fit().train_prompts, 40u);
  EXPECT_EQ(r->fit().heldout_r2, 0.42);
  for (int l = 0; l < 3; ++l)
    for (auto p : {ExpertProj::kGateUp, ExpertProj::kDown}) EXPECT_EQ(r->head(l, p), h.head(l, p));
  // Predict clamps.
  const float big[4] = {100, 100, 100, 100};
  EXPECT_EQ(r->Predict(2, ExpertProj::kGateUp, big), 1.5);
  EXPECT_EQ(r->Serialize(), h.Serialize());
  std::filesystem::remove(path);
}

TEST(ResidualHeadsFile, RefusesTruncatedCorruptForeignAndMissingFiles) {
  ResidualHeads h(2, 3, 77);
  h.head(1, ExpertProj::kDown)[2] = 0.5;
  const std::string good = h.Serialize();
  const std::string path = TmpPath("bad.pwrh");
  auto load = [&](const std::string& bytes, std::optional<uint64_t> hash = std::nullopt) {
    WriteAll(path, bytes);
    return ResidualHeads::Load(path, hash).status();
  };
  Status s = load(good.substr(0, good.size() - 9));
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos);
  s = load(good.substr(0, 20));
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.ToString();
  s = load(good + "x");
  EXPECT_NE(s.message().find("too long"), std::string::npos) << s.ToString();
  std::string flipped = good;
  flipped[good.size() - 20] ^= 0x01;  // a weight's byte
  s = load(flipped);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(load(magic).message().find("magic"), std::string::npos);
  std::string version = good;
  version[8] = 9;
  EXPECT_EQ(load(version).code(), StatusCode::kUnsupported);
  s = load(good, 78);
  EXPECT_NE(s.message().find("another model"), std::string::npos) << s.ToString();
  EXPECT_TRUE(load(good, 77).ok());
  std::filesystem::remove(path);
  EXPECT_EQ(ResidualHeads::Load(path).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pw

// A small .apw store for the broker's planner tests: random blocks (gate_up and down of every
// expert of every layer) whose damage tables are scale(layer, expert) · 2^(8 − b), and
// 1000 · scale at 0 bits; and the watermark parameters those tests plan with.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/apw_store.h"
#include "policies/planner/planner_params.h"
#include "tests/anyprec/random_block.h"

namespace pw::broker {

// test-tmp/<prefix><current test's name>.apw (its folder created).
inline std::string TestStorePath(const std::string& prefix) {
  const std::string path = std::string(PW_BINARY_DIR) + "/test-tmp/" + prefix +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".apw";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  return path;
}

// Writes the store (callers check HasFatalFailure() after it).
inline void WriteDamageScaledStore(const std::string& path, const apw::StoreInfo& info,
                                   const std::function<double(uint32_t layer, uint32_t expert)>& scale) {
  auto w = apw::ApwWriter::Create(path, info);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::mt19937 rng(5);
  std::vector<anyprec::RandomBlock> blocks;  // alive until Finish
  for (uint32_t l = 0; l < info.num_layers; ++l) {
    for (uint32_t e = 0; e < info.num_experts; ++e) {
      for (auto kind : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        const int rows = kind == ExpertProj::kGateUp ? 2 * static_cast<int>(info.ffn)
                                                     : static_cast<int>(info.hidden);
        const int cols = kind == ExpertProj::kGateUp ? static_cast<int>(info.hidden)
                                                     : static_cast<int>(info.ffn);
        anyprec::RandomBlock rb = anyprec::MakeRandomBlock(rows, cols, rng);
        apw::BlockData b;
        b.layer = l;
        b.expert = e;
        b.kind = kind;
        b.rows = rows;
        b.cols = cols;
        for (int p = 0; p < apw::kPlanes; ++p) b.planes[p] = rb.block.Plane(p);
        const double s = scale(l, e);
        for (int bits = apw::kMinBits; bits <= apw::kMaxBits; ++bits) {
          b.luts[bits] = rb.block.luts[bits].data();
          b.damage[bits] = s * std::pow(2.0, 8 - bits);
        }
        b.damage[0] = s * 1000;
        ASSERT_TRUE((*w)->Add(b).ok());
        blocks.push_back(std::move(rb));
      }
    }
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

// Enabled, low watermark 10 %, high 30 %, no headroom, no rate limit, 100 ms interval.
inline planner::PlannerParams WatermarkParams() {
  planner::PlannerParams p;
  p.enabled = true;
  p.low_watermark = 0.10;
  p.high_watermark = 0.30;
  p.headroom = 0.0;
  p.min_interval_ms = 0;
  p.interval_ms = 100;
  return p;
}

}  // namespace pw::broker

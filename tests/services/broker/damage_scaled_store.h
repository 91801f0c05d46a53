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

#include "common/formats/apw_store.h"
#include "policies/planner/planner_params.h"
#include "tests/anyprec/random_store.h"

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
  std::vector<anyprec::RandomBlock> blocks;
  anyprec::WriteRandomStore(path, info, 5, &blocks, [&](apw::BlockData& b) {
    const double s = scale(b.layer, b.expert);
    for (int bits = apw::kMinBits; bits <= apw::kMaxBits; ++bits) b.damage[bits] = s * std::pow(2.0, 8 - bits);
    b.damage[0] = s * 1000;
  });
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

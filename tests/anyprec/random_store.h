// A small .apw store of random blocks for tests: gate_up and down of every expert of every
// layer the StoreInfo holds (all, or its `layers`) at its shapes, in ExpertBlockIndex order,
// random planes and LUTs.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

#include "common/formats/apw_store.h"
#include "tests/anyprec/random_block.h"

namespace pw::anyprec {

// Writes the store; `blocks` gets its blocks (callers check HasFatalFailure() after it).
// `edit`, if given, may fill a block's damage table before it is added.
inline void WriteRandomStore(const std::string& path, const apw::StoreInfo& info, uint32_t seed,
                             std::vector<RandomBlock>* blocks,
                             const std::function<void(apw::BlockData&)>& edit = nullptr) {
  blocks->clear();
  auto w = apw::ApwWriter::Create(path, info);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::mt19937 rng(seed);
  for (uint32_t l : info.BlockLayers()) {
    for (uint32_t e = 0; e < info.num_experts; ++e) {
      for (auto kind : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        const bool gate_up = kind == ExpertProj::kGateUp;
        const int rows = static_cast<int>(gate_up ? 2 * info.ffn : info.hidden);
        const int cols = static_cast<int>(gate_up ? info.hidden : info.ffn);
        RandomBlock rb = MakeRandomBlock(rows, cols, rng);
        apw::BlockData b;
        b.layer = l;
        b.expert = e;
        b.kind = kind;
        b.rows = static_cast<uint32_t>(rows);
        b.cols = static_cast<uint32_t>(cols);
        for (int p = 0; p < apw::kPlanes; ++p) b.planes[p] = rb.block.Plane(p);
        for (int bits = apw::kMinBits; bits <= apw::kMaxBits; ++bits) {
          b.luts[bits] = rb.block.luts[bits].data();
        }
        if (edit) edit(b);
        const Status added = (*w)->Add(b);
        ASSERT_TRUE(added.ok()) << added.ToString();
        blocks->push_back(std::move(rb));
      }
    }
  }
  const Status done = (*w)->Finish();
  ASSERT_TRUE(done.ok()) << done.ToString();
}

}  // namespace pw::anyprec

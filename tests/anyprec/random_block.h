// Random any-precision blocks and activations for the kernel tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/anyprec/anyprec.h"
#include "kernels/anyprec/pack.h"

namespace pw::anyprec {

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : ptr(static_cast<uint8_t*>(std::aligned_alloc(kWorkspaceAlign, (bytes + 63) / 64 * 64 + 64))),
        size(bytes) {}
  ~AlignedBuffer() { std::free(ptr); }
  Workspace ws() const { return {ptr, size}; }
  uint8_t* ptr;
  size_t size;
};

struct RandomBlock {
  PackedBlock block;
  std::vector<uint8_t> codes;  // [rows][cols] parent codes
};

inline RandomBlock MakeRandomBlock(int rows, int cols, std::mt19937& rng) {
  RandomBlock rb;
  rb.block.rows = rows;
  rb.block.cols = cols;
  rb.codes.resize(static_cast<size_t>(rows) * cols);
  std::uniform_int_distribution<int> code_dist(0, 255);
  for (auto& c : rb.codes) c = static_cast<uint8_t>(code_dist(rng));
  rb.block.planes.resize(kNumPlanes * PlaneBytes(rows, cols));
  PackCodes(rb.codes.data(), rows, cols, rb.block.planes.data());
  std::normal_distribution<float> lut_dist(0.f, 0.5f);
  for (int b = kMinBits; b <= kMaxBits; ++b) {
    rb.block.luts[b].resize(static_cast<size_t>(rows) << b);
    for (auto& v : rb.block.luts[b]) v = F32ToF16(lut_dist(rng));
  }
  return rb;
}

inline std::vector<float> RandomX(int tokens, int cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(tokens) * cols);
  for (auto& v : x) v = d(rng);
  return x;
}

}  // namespace pw::anyprec

// RadixSortByKey (common/radix_sort.h) against std::stable_sort: keys of every byte pattern
// (all bytes varying, only the top ones as bf16 rows have, all equal), lengths around the
// four-part split, and the float keys' order against the floats' own.
#include "common/radix_sort.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace pw {
namespace {

void ExpectStableSortOrder(const std::vector<uint32_t>& keys) {
  const size_t n = keys.size();
  std::vector<int> want(n);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  std::vector<uint32_t> k = keys, tmp_k(n);
  std::vector<int> vals(n), tmp(n);
  std::iota(vals.begin(), vals.end(), 0);
  RadixSortByKey(k.data(), vals.data(), n, tmp_k.data(), tmp.data());
  ASSERT_EQ(vals, want) << "n " << n;
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(k[i], keys[want[i]]) << "n " << n << " at " << i;
}

TEST(RadixSort, IsTheStableSortForEveryLengthAndBytePattern) {
  std::mt19937 rng(3);
  const uint32_t masks[] = {0xFFFFFFFFu, 0xFFFF0000u, 0xFF000000u, 0x00FF00FFu, 0x3u, 0u};
  for (size_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 255, 1023, 2048, 5001}) {
    for (uint32_t mask : masks) {
      std::vector<uint32_t> keys(n);
      for (auto& k : keys) k = (rng() & mask) | 0x01000000u;
      ExpectStableSortOrder(keys);
    }
  }
}

TEST(RadixSort, KeysConcentratedInOneQuarterKeepTheirOrder) {
  // Every key of one value sits in one part, then in the part after: the offsets of a byte
  // value must follow the parts in order.
  for (size_t n : {64, 67, 1000}) {
    std::vector<uint32_t> keys(n, 5);
    for (size_t i = 0; i < n / 3; ++i) keys[i] = 9u << 16;
    for (size_t i = n / 2; i < n; i += 3) keys[i] = 1u << 24;
    ExpectStableSortOrder(keys);
  }
}

TEST(RadixSort, FloatKeysOrderAsTheFloats) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> f(4099);
  for (auto& v : f) v = nd(rng);
  f[0] = -0.f;
  f[1] = 0.f;
  f[2] = -1e-40f;
  f[3] = 1e-40f;
  std::vector<uint32_t> keys(f.size());
  for (size_t i = 0; i < f.size(); ++i) keys[i] = AscendingFloatKey(f[i]);
  std::vector<int> vals(f.size()), tmp(f.size());
  std::vector<uint32_t> tmp_k(f.size());
  std::iota(vals.begin(), vals.end(), 0);
  RadixSortByKey(keys.data(), vals.data(), f.size(), tmp_k.data(), tmp.data());
  for (size_t i = 1; i < f.size(); ++i) {
    ASSERT_LE(f[vals[i - 1]], f[vals[i]]) << i;
    if (f[vals[i - 1]] == f[vals[i]]) {
      ASSERT_LT(vals[i - 1], vals[i]) << i;
    }
  }
}

}  // namespace
}  // namespace pw

// Stable LSD radix sorting by 32-bit keys, and the keys that order floats: what the quantizer's
// per-row sort (kernels/anyprec/quantizer_rows.h) and the sampler's vocabulary order
// (engine/sampler/) share. Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace pw {

// Order-preserving unsigned key of a float (NaN excluded): a < b implies key(a) < key(b);
// -0 and +0 share the key of +0 (they compare equal).
inline uint32_t AscendingFloatKey(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t mag = u & 0x7FFFFFFFu;
  return (u >> 31) != 0 ? 0x80000000u - mag : 0x80000000u + mag;
}

// Sorts vals[0..n) by keys[0..n) ascending, equal keys keeping their order (stable), one pass
// per key byte, skipping passes where every key shares the byte. keys are permuted with vals;
// tmp_keys, tmp_vals: n entries of scratch each. The result is in keys / vals.
//
// Each pass counts and scatters the keys as four contiguous quarters in lockstep, each quarter
// with its own counters: a counter bumped by consecutive keys waits on its own last store, and
// the keys of a weight row or a vocabulary share a few top bytes, so one stream of keys would
// run at the latency of that store. Quarter q's keys of a byte value go after those of the
// quarters before it, so the order is the one-stream order.
template <class T>
void RadixSortByKey(uint32_t* keys, T* vals, size_t n, uint32_t* tmp_keys, T* tmp_vals) {
  if (n == 0) return;
  uint32_t any = 0, all = ~0u;
  for (size_t i = 0; i < n; ++i) {
    any |= keys[i];
    all &= keys[i];
  }
  const uint32_t varies = any ^ all;  // the bits that are not the same in every key
  constexpr int kParts = 4;
  const size_t quarter = n / kParts;
  size_t begin[kParts + 1];
  for (int p = 0; p < kParts; ++p) begin[p] = p * quarter;
  begin[kParts] = n;  // the last part takes the remainder
  uint32_t* src_k = keys;
  T* src = vals;
  uint32_t* dst_k = tmp_keys;
  T* dst = tmp_vals;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 8 * pass;
    if (((varies >> shift) & 0xFF) == 0) continue;  // one byte value
    uint32_t count[kParts][256] = {};
    for (size_t j = 0; j < quarter; ++j) {
      for (int p = 0; p < kParts; ++p) ++count[p][(src_k[begin[p] + j] >> shift) & 0xFF];
    }
    for (size_t i = begin[kParts - 1] + quarter; i < n; ++i) ++count[kParts - 1][(src_k[i] >> shift) & 0xFF];
    uint32_t at = 0;
    for (int v = 0; v < 256; ++v) {
      for (int p = 0; p < kParts; ++p) {
        const uint32_t k = count[p][v];
        count[p][v] = at;
        at += k;
      }
    }
    for (size_t j = 0; j < quarter; ++j) {
      for (int p = 0; p < kParts; ++p) {
        const size_t i = begin[p] + j;
        const uint32_t pos = count[p][(src_k[i] >> shift) & 0xFF]++;
        dst[pos] = src[i];
        dst_k[pos] = src_k[i];
      }
    }
    for (size_t i = begin[kParts - 1] + quarter; i < n; ++i) {
      const uint32_t pos = count[kParts - 1][(src_k[i] >> shift) & 0xFF]++;
      dst[pos] = src[i];
      dst_k[pos] = src_k[i];
    }
    std::swap(src, dst);
    std::swap(src_k, dst_k);
  }
  if (src != vals) {
    for (size_t i = 0; i < n; ++i) vals[i] = src[i];
    std::memcpy(keys, src_k, sizeof(uint32_t) * n);
  }
}

}  // namespace pw

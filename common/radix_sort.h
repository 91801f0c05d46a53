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
template <class T>
void RadixSortByKey(uint32_t* keys, T* vals, size_t n, uint32_t* tmp_keys, T* tmp_vals) {
  if (n == 0) return;
  uint32_t count[4][256] = {};
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = keys[i];
    ++count[0][k & 0xFF];
    ++count[1][(k >> 8) & 0xFF];
    ++count[2][(k >> 16) & 0xFF];
    ++count[3][k >> 24];
  }
  uint32_t* src_k = keys;
  T* src = vals;
  uint32_t* dst_k = tmp_keys;
  T* dst = tmp_vals;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 8 * pass;
    uint32_t* c = count[pass];
    if (c[(src_k[0] >> shift) & 0xFF] == n) continue;  // one byte value
    uint32_t at = 0;
    for (int v = 0; v < 256; ++v) {
      const uint32_t k = c[v];
      c[v] = at;
      at += k;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t pos = c[(src_k[i] >> shift) & 0xFF]++;
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

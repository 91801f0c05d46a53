#include "kernels/anyprec/quantizer_rows.h"

#include <cstring>
#include <utility>

namespace pw::anyprec::internal {
namespace {

// Order-preserving unsigned key of a finite float; -0 and +0 share the key of +0 (they
// compare equal, so the index decides, as in the comparison sort).
uint32_t SortKey(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t mag = u & 0x7FFFFFFFu;
  return (u >> 31) != 0 ? 0x80000000u - mag : 0x80000000u + mag;
}

}  // namespace

void SortOrder(const float* w, int n, int* order, uint32_t* keys, int* tmp_order, uint32_t* tmp_keys) {
  uint32_t count[4][256] = {};
  for (int i = 0; i < n; ++i) {
    const uint32_t k = SortKey(w[i]);
    keys[i] = k;
    order[i] = i;
    ++count[0][k & 0xFF];
    ++count[1][(k >> 8) & 0xFF];
    ++count[2][(k >> 16) & 0xFF];
    ++count[3][k >> 24];
  }
  int* src_o = order;
  uint32_t* src_k = keys;
  int* dst_o = tmp_order;
  uint32_t* dst_k = tmp_keys;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 8 * pass;
    uint32_t* c = count[pass];
    if (c[(src_k[0] >> shift) & 0xFF] == static_cast<uint32_t>(n)) continue;  // one byte value
    uint32_t at = 0;
    for (int v = 0; v < 256; ++v) {
      const uint32_t k = c[v];
      c[v] = at;
      at += k;
    }
    for (int i = 0; i < n; ++i) {  // stable: equal keys keep their order, hence index order
      const uint32_t pos = c[(src_k[i] >> shift) & 0xFF]++;
      dst_o[pos] = src_o[i];
      dst_k[pos] = src_k[i];
    }
    std::swap(src_o, dst_o);
    std::swap(src_k, dst_k);
  }
  if (src_o != order) std::memcpy(order, src_o, sizeof(int) * static_cast<size_t>(n));
}

int BestCutScalar(const double* sv, const double* s0, const double* s1, int a, int b) {
  const double m = s0[b] - s0[a], q = s1[b] - s1[a];
  double best = -1;
  int cut = b;
  for (int i = a + 1; i < b; ++i) {
    if (sv[i] == sv[i - 1]) continue;
    const double ml = s0[i] - s0[a], ql = s1[i] - s1[a];
    const double mr = m - ml, qr = q - ql;
    if (ml <= 0 || mr <= 0) continue;
    const double score = ql * ql / ml + qr * qr / mr;  // = const - (SSE_L + SSE_R)
    if (score > best) {
      best = score;
      cut = i;
    }
  }
  return cut;
}

void RowDamageScalar(const double* sv, const double* sh, const uint8_t* leaf, int n, const RowLuts& luts,
                     double* d, double* d64) {
  double d0 = 0;
  for (int i = 0; i < n; ++i) d0 += sh[i] * sv[i] * sv[i];
  d[0] = d0;
  d64[0] = d0;
  for (int b = kMinBits; b <= kMaxBits; ++b) {
    double s = 0, s64 = 0;
    for (int i = 0; i < n; ++i) {
      const int c = leaf[i] >> (kMaxBits - b);
      const double q = luts.lut[b][c], q64 = luts.lut64[b][c];
      s += sh[i] * (sv[i] - q) * (sv[i] - q);
      s64 += sh[i] * (sv[i] - q64) * (sv[i] - q64);
    }
    d[b] = s;
    d64[b] = s64;
  }
}

QuantizerRowFns BestQuantizerRowFns() {
  // PW_ANYPREC_BACKEND=scalar (BestBackend) runs the references here too.
  if (BestBackend() != kernels::Backend::kScalar) return {BestCutAvx2, RowDamageAvx2};
  return {BestCutScalar, RowDamageScalar};
}

}  // namespace pw::anyprec::internal

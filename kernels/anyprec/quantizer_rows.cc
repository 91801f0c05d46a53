#include "kernels/anyprec/quantizer_rows.h"

#include "common/dtype.h"
#include "common/radix_sort.h"

namespace pw::anyprec::internal {

void SortOrder(const float* w, int n, int* order, uint32_t* keys, int* tmp_order, uint32_t* tmp_keys) {
  for (int i = 0; i < n; ++i) {
    keys[i] = AscendingFloatKey(w[i]);
    order[i] = i;
  }
  // Stable: equal keys keep their order, hence index order.
  RadixSortByKey(keys, order, static_cast<size_t>(n), tmp_keys, tmp_order);
}

int BestCutScalar(const double* sv, const double* s0, const double* s1, int a, int b) {
  const double m = s0[b] - s0[a], mu = (s1[b] - s1[a]) / m;
  double best = -1;
  int cut = b;
  for (int i = a + 1; i < b; ++i) {
    if (sv[i] == sv[i - 1]) continue;
    const double ml = s0[i] - s0[a], ql = s1[i] - s1[a];
    const double mr = m - ml, cl = ql - ml * mu;
    if (ml <= 0 || mr <= 0) continue;
    const double score = cl * cl / (ml * mr);  // = (SSE - SSE_L - SSE_R) / m
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

void HalfLutScalar(const double* mu, int count, uint16_t* half, double* back) {
  for (int c = 0; c < count; ++c) {
    half[c] = F32ToF16(static_cast<float>(mu[c]));
    back[c] = F16ToF32(half[c]);
  }
}

QuantizerRowFns BestQuantizerRowFns() {
  // PW_ANYPREC_BACKEND=scalar (BestBackend) runs the references here too.
  if (BestBackend() != kernels::Backend::kScalar) return {BestCutAvx2, RowDamageAvx2, HalfLutAvx2};
  return {BestCutScalar, RowDamageScalar, HalfLutScalar};
}

}  // namespace pw::anyprec::internal

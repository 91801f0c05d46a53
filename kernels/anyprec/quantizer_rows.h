// The per-row steps of the any-precision quantizer (quantizer.h) that dominate its time, each
// with a scalar reference and, where it pays, an AVX2 backend that gives the same bits (the
// same IEEE operations in the same order per accumulator; compiled without contraction into
// FMA). Not a public interface: quantizer.cc and the tests use it.
#pragma once

#include <cstdint>

#include "kernels/anyprec/anyprec.h"

namespace pw::anyprec::internal {

// order[0..n) = the indices of w sorted by value, equal values (and -0 / +0) by index: the
// order of std::sort with (w[a] < w[b] || (w[a] == w[b] && a < b)), by a stable LSD radix sort
// over the float bits (passes where every key shares the byte are skipped: two passes for
// bf16 values). w finite. keys, tmp: n entries of scratch each.
void SortOrder(const float* w, int n, int* order, uint32_t* keys, int* tmp_order, uint32_t* tmp_keys);

// The optimal weighted 2-means cut of the sorted interval [a, b) (b - a >= 2): the first i in
// (a, b) maximizing cl^2 / (ml mr) (ml = s0[i] - s0[a], mr = m - ml, cl = s1[i] - s1[a] - ml mu,
// m = s0[b] - s0[a], mu = (s1[b] - s1[a]) / m: the left side's moment about the interval's
// mean), skipping i with sv[i] == sv[i-1] (equal weights share a code) and cuts leaving a side
// without mass; b when there is none. cl^2 m / (ml mr) is what the cut removes from the
// interval's weighted squared error, so this is the cut of least error; one division a
// candidate, and the score is about the candidates' differences, not the interval's offset
// from zero (ql^2/ml + qr^2/mr, the same cut in exact arithmetic, is q^2/m plus this).
// s0, s1: prefix sums of the sensitivities and of sensitivity * value over the sorted row.
using BestCutFn = int (*)(const double* sv, const double* s0, const double* s1, int a, int b);
int BestCutScalar(const double* sv, const double* s0, const double* s1, int a, int b);
int BestCutAvx2(const double* sv, const double* s0, const double* s1, int a, int b);

// Damage of every width of one row: for b in 3..8, d[b] = sum_i sh[i] * (sv[i] - q[b]) ^ 2 with
// q[b] = lut[b][leaf[i] >> (8 - b)] (d64: the same with lut64), summed in order of i, and
// d[0] = d64[0] = sum_i sh[i] * sv[i] * sv[i]. leaf[i]: the 8-bit code of sorted position i.
// lut[b], lut64[b]: 2^b centroids each (as doubles); other entries of d, d64 untouched.
struct RowLuts {
  const double* lut[kMaxBits + 1];
  const double* lut64[kMaxBits + 1];
};
using RowDamageFn = void (*)(const double* sv, const double* sh, const uint8_t* leaf, int n,
                             const RowLuts& luts, double* d, double* d64);
void RowDamageScalar(const double* sv, const double* sh, const uint8_t* leaf, int n, const RowLuts& luts,
                     double* d, double* d64);
void RowDamageAvx2(const double* sv, const double* sh, const uint8_t* leaf, int n, const RowLuts& luts,
                   double* d, double* d64);

// One width's LUT from its centroids: half[c] = F32ToF16(float(mu[c])) and back[c] =
// F16ToF32(half[c]) for c in [0, count); count a multiple of 8. The AVX2 backend converts with
// F16C (round to nearest even, as F32ToF16).
using HalfLutFn = void (*)(const double* mu, int count, uint16_t* half, double* back);
void HalfLutScalar(const double* mu, int count, uint16_t* half, double* back);
void HalfLutAvx2(const double* mu, int count, uint16_t* half, double* back);

// The backends this CPU runs: AVX2 when BestBackend() is a SIMD one, else the scalar references.
struct QuantizerRowFns {
  BestCutFn best_cut;
  RowDamageFn row_damage;
  HalfLutFn half_lut;
};
QuantizerRowFns BestQuantizerRowFns();

}  // namespace pw::anyprec::internal

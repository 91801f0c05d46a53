// AVX2 backend of the integer fast path (q8.h), for CPUs without AVX-512 VNNI/VBMI.
//
// One 32-byte load of a plane row is one 256-column group. For each slice k the 32 codes are
// formed with byte-wise shifts, ANDs and ORs (for b <= 4, slices k and k+4 together in the two
// nibbles; for b >= 5 all 8 slices at once by an 8x8 bit transpose across the plane
// registers), looked up in the row's signed int8 LUT with vpshufb (b <= 4: one 16-entry table;
// b >= 5: one shuffle per 16-entry part, merged by a tree of byte blends on code bits 4..b-1),
// and multiplied with the activations by vpmaddubsw on |w| and sign(x, w) (no saturation:
// |w|, |x| <= 127), then vpmaddwd into int32. At 3-4 bits the table is biased to unsigned
// (w + 32 in [1, 63], Q8LutMax): vpmaddubsw takes it as it is, two slices' sums are added in
// int16 first, one vpmaddwd for both, and the bias's share (Q8Acts::offsets) comes off at the
// end. A dense matrix quantized to at most kDenseQ8PairMax (q8.h DenseQ8Max) keeps the sign
// trick and adds two slices' sums likewise. One fp32 multiply-add per group and row.
// One token: one row at a time, its planes prefetched 2 KiB ahead; a dense int8 matrix's rows
// as four long streams (DenseAhead below).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/anyprec/q8_internal.h"
#include "kernels/cpu/prefetch_distance.h"
#include "kernels/cpu/row_streams.h"

namespace pw::anyprec::internal {
namespace avx2q8 {
#include "kernels/anyprec/q8_quantize.inc"

namespace {

template <int K, int S>
inline __m256i Shift(__m256i v) {
  if constexpr (K > S) {
    return _mm256_srli_epi16(v, K - S);
  } else if constexpr (K < S) {
    return _mm256_slli_epi16(v, S - K);
  } else {
    return v;
  }
}

// Codes of slices K (low nibble) and K + 4 (high nibble) from planes pl[0..B-1], B <= 4.
template <int B, int K, int P = 0>
inline __m256i PairCodes(const __m256i* pl) {
  constexpr int S = B - 1 - P;
  constexpr int m = 0x11 << S;
  const __m256i c = _mm256_and_si256(Shift<K, S>(pl[P]), _mm256_set1_epi8(static_cast<char>(m)));
  if constexpr (P + 1 < B) {
    return _mm256_or_si256(c, PairCodes<B, K, P + 1>(pl));
  } else {
    return c;
  }
}

// From this width on the codes of all 8 slices of a group are formed at once by transposing,
// in every byte position, the 8x8 bit matrix (register q, bit k) across 8 registers: 3 stages
// of 4 delta swaps, 6 µops each = 72 µops per 256 weights, where forming each slice plane by
// plane costs 3 per plane and slice (shift, mask, merge: 24·B - 8).
constexpr int kTransposeFrom = 5;

// Swaps bit j + D of r[i] with bit j of r[i + D] for every j with (j & D) == 0 and every i
// with (i & D) == 0, in every byte (a delta swap; the 16-bit shifts carry bits across bytes
// only into positions the mask clears).
template <int D>
inline void TransposeStage(__m256i* r) {
  constexpr int lo_bits = D == 1 ? 0x55 : D == 2 ? 0x33 : 0x0F;
  const __m256i ml = _mm256_set1_epi8(static_cast<char>(lo_bits));
  for (int i = 0; i < 8; ++i) {
    if ((i & D) != 0) continue;
    const __m256i t = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi16(r[i], D), r[i + D]), ml);
    r[i + D] = _mm256_xor_si256(r[i + D], t);
    r[i] = _mm256_xor_si256(r[i], _mm256_slli_epi16(t, D));
  }
}

// r[k] bit q = r[q] bit k (before), in every byte of the 8 registers.
inline void Transpose8x8(__m256i* r) {
  TransposeStage<4>(r);
  TransposeStage<2>(r);
  TransposeStage<1>(r);
}

template <int B>
struct Tables {
  static constexpr int kParts = B <= 4 ? 1 : 1 << (B - 4);
  __m256i t[kParts];  // 16-entry parts, each in both 128-bit lanes

  void Load(const int8_t* lut) {
    if constexpr (B == 3) {
      // 8 entries repeated to 16 (vpshufb reads 4 index bits).
      const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(lut));
      t[0] = _mm256_broadcastsi128_si256(_mm_unpacklo_epi64(e, e));
    } else {
      for (int i = 0; i < kParts; ++i) {
        t[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lut + 16 * i)));
      }
    }
  }

  // Signed weights of 32 codes; c must have bit 7 clear for B <= 4 beyond the code bits
  // (the caller masks to the low nibble).
  __m256i Look(__m256i c) const {
    if constexpr (B <= 4) {
      return _mm256_shuffle_epi8(t[0], c);
    } else {
      const __m256i lo = _mm256_and_si256(c, _mm256_set1_epi8(0x0F));
      __m256i r[kParts];
      for (int i = 0; i < kParts; ++i) r[i] = _mm256_shuffle_epi8(t[i], lo);
      int n = kParts;
      for (int bit = 4; bit < B; ++bit) {
        const __m256i sel = _mm256_slli_epi16(c, 7 - bit);  // code bit -> byte bit 7
        for (int i = 0; i < n / 2; ++i) r[i] = _mm256_blendv_epi8(r[2 * i], r[2 * i + 1], sel);
        n /= 2;
      }
      return r[0];
    }
  }
};

// kLevel: the cache level the plane streams are prefetched into (prefetch_distance.h).
template <int B, cpu::PrefetchLevel kLevel = cpu::PrefetchLevel::kL1>
struct Row {
  // At 3-4 bits the table holds each value plus kQ8LutBias, in [1, 2 * kQ8LutBias - 1]
  // (Q8LutMax): DecodeGroup gives vpmaddubsw's unsigned operand itself (no sign trick), two
  // slices' products add in int16, and the bias's share comes off once per output (Biased).
  static constexpr bool kBiased = B <= kQ8BiasedMaxBits;
  static constexpr bool paired = false;  // signed values above 4 bits reach 127
  const uint8_t* pl[B];
  Tables<B> tab;
  float scale;

  void Init(const BlockAndLut& s, int r) {
    for (int p = 0; p < B; ++p) pl[p] = s.view.PlaneRow(p, r);
    tab.Load(Q8LutRow(s.lut, r, B));
    if constexpr (kBiased) {
      for (auto& t : tab.t) t = _mm256_add_epi8(t, _mm256_set1_epi8(static_cast<char>(kQ8LutBias)));
    }
    scale = s.lut.scales[r];
  }

  // Calls use(k, w) for the 8 slices of group g, w = 32 signed weights of slice k; each plane
  // stream prefetched `ahead` bytes further down (one prefetch per 64-byte line; 0: none).
  template <class F>
  inline void DecodeGroup(int g, F&& use, size_t ahead) const {
    __m256i planes[B];
    for (int p = 0; p < B; ++p) {
      if (ahead != 0 && g % 2 == 0) cpu::PrefetchLine<kLevel>(pl[p] + 32 * g + ahead);
      planes[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pl[p] + 32 * g));
    }
    if constexpr (B <= 4) {
      const __m256i nib = _mm256_set1_epi8(0x0F);
      [&]<int... K>(std::integer_sequence<int, K...>) {
        ((void)[&] {
          const __m256i c = PairCodes<B, K>(planes);
          use(K, tab.Look(_mm256_and_si256(c, nib)));
          use(K + 4, tab.Look(_mm256_and_si256(_mm256_srli_epi16(c, 4), nib)));
        }(), ...);
      }(std::make_integer_sequence<int, 4>{});
    } else {
      static_assert(B >= kTransposeFrom);
      // r[q]: the plane whose bit k becomes code bit q (zero above B - 1). After the
      // transpose r[k] holds slice k's codes.
      __m256i r[8];
      for (int q = 0; q < 8; ++q) r[q] = q < B ? planes[B - 1 - q] : _mm256_setzero_si256();
      Transpose8x8(r);
      [&]<int... K>(std::integer_sequence<int, K...>) {
        ((void)use(K, tab.Look(r[K])), ...);
      }(std::make_integer_sequence<int, 8>{});
    }
  }
};

// Adds 16 int16 pair sums to 8 int32 lanes of acc.
inline __m256i Widen(__m256i acc, __m256i p16) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// Adds the 32 products w * x to 8 int32 lanes of acc.
inline __m256i Dot(__m256i acc, __m256i w, __m256i x) {
  return Widen(acc, _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)));
}

// Adds the 64 products of two slices of biased weights (a Row with kBiased: u = w + kQ8LutBias,
// unsigned, at most 2 * kQ8LutBias - 1 = 63) to acc: each int16 pair sum is within 2 * 63 * 127,
// so the two slices' sums add without overflow and one widening serves both.
inline __m256i DotPairBiased(__m256i acc, __m256i u0, __m256i x0, __m256i u1, __m256i x1) {
  return Widen(acc, _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1)));
}

// The same for two slices of signed weights of at most kDenseQ8PairMax in magnitude (a paired
// DenseRow), through the sign trick: each int16 pair sum is within 2 * 63 * 127.
inline __m256i DotPairSigned(__m256i acc, __m256i w0, __m256i x0, __m256i w1, __m256i x1) {
  return Widen(acc, _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0)),
                                     _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x1, w1))));
}

inline float Sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// y = row scale * (the row's scaled group sums, less the bias's share for biased rows:
// kQ8LutBias * sum_g act_scale[g] * sum_{c in g} xq[c] = Q8Acts::offsets * kQ8LutBias / 128).
template <class RowT>
inline float Output(const RowT& row, __m256 accf, const Q8Acts& a, int t) {
  if constexpr (RowT::kBiased) {
    return row.scale * (Sum8(accf) - a.offsets[t] * (static_cast<float>(kQ8LutBias) / 128.f));
  } else {
    return row.scale * Sum8(accf);
  }
}

// Slice k of group g inside a token's activation row.
inline const __m256i* XSlice(const int8_t* xq, int g, int k) {
  return reinterpret_cast<const __m256i*>(xq + (g / 2) * 512 + 64 * k + 32 * (g % 2));
}

// A row of a dense int8 matrix (Q8Matrix): 32 signed weights per slice of a group.
struct DenseRow {
  static constexpr bool kBiased = false;
  const int8_t* w;
  float scale;
  bool paired;  // |values| <= kDenseQ8PairMax: two slices per widening (DotPairSigned)

  void Init(const Q8Matrix& m, int r) {
    w = m.values + static_cast<size_t>(r) * Q8ActStride(m.cols);
    scale = m.scales[r];
    paired = m.max_value <= kDenseQ8PairMax;
  }
  template <class F>
  inline void DecodeGroup(int g, F&& use, size_t ahead) const {
    for (int k = 0; k < 8; ++k) {
      const auto* p = reinterpret_cast<const __m256i*>(w + (g / 2) * 512 + 64 * k + 32 * (g % 2));
      if (ahead != 0 && k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead, _MM_HINT_T0);
      use(k, _mm256_loadu_si256(p));
    }
  }
};

// NR initialised rows of one token, y[i] for row i; `ahead`: the prefetch distance.
template <class RowT, int NR>
void GemvRows(const RowT* rows, int cols, const Q8Acts& a, float* y, size_t ahead) {
  const int groups = (cols + kGroupCols - 1) / kGroupCols;
  __m256 accf[NR];
  for (auto& f : accf) f = _mm256_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    __m256i acc[NR];
    for (auto& c : acc) c = _mm256_setzero_si256();
    for (int i = 0; i < NR; ++i) {
      // One token is a read of the weights: a dense row keeps one widening per slice here
      // (pairing it measured slower, 845 against 480 µs for 2048x2048 on AMD Zen 1).
      if constexpr (RowT::kBiased) {
        // Slices taken two at a time in the order DecodeGroup gives them.
        __m256i first_u = _mm256_setzero_si256(), first_x = first_u;
        bool have_first = false;
        rows[i].DecodeGroup(g, [&](int k, __m256i u) {
          const __m256i x = _mm256_loadu_si256(XSlice(a.q, g, k));
          if (!have_first) {
            first_u = u;
            first_x = x;
          } else {
            acc[i] = DotPairBiased(acc[i], first_u, first_x, u, x);
          }
          have_first = !have_first;
        }, ahead);
      } else {
        rows[i].DecodeGroup(g, [&](int k, __m256i w) {
          acc[i] = Dot(acc[i], w, _mm256_loadu_si256(XSlice(a.q, g, k)));
        }, ahead);
      }
    }
    const __m256 s = _mm256_set1_ps(a.scales[g]);
    for (int i = 0; i < NR; ++i) accf[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), s, accf[i]);
  }
  for (int i = 0; i < NR; ++i) y[i] = Output(rows[i], accf[i], a, 0);
}

// One initialised row for every token, y[t * ldy] for token t.
template <class RowT>
void GemmRow(const RowT& row, int cols, const Q8Acts& a, float* y, size_t ldy) {
  const int groups = (cols + kGroupCols - 1) / kGroupCols;
  const int stride = Q8ActStride(cols), ngroups = Q8ActGroups(cols);
  __m256 accf[kMaxTokens];
  const int T = a.tokens;
  for (int t = 0; t < T; ++t) accf[t] = _mm256_setzero_ps();
  __m256i w[8];
  for (int g = 0; g < groups; ++g) {
    row.DecodeGroup(g, [&](int k, __m256i wk) { w[k] = wk; }, kPrefetchBytes);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = a.q + static_cast<size_t>(t) * stride;
      __m256i c = _mm256_setzero_si256();
      if constexpr (RowT::kBiased) {
        for (int k = 0; k < 8; k += 2) {
          c = DotPairBiased(c, w[k], _mm256_loadu_si256(XSlice(xq, g, k)), w[k + 1],
                            _mm256_loadu_si256(XSlice(xq, g, k + 1)));
        }
      } else if (row.paired) {
        for (int k = 0; k < 8; k += 2) {
          c = DotPairSigned(c, w[k], _mm256_loadu_si256(XSlice(xq, g, k)), w[k + 1],
                            _mm256_loadu_si256(XSlice(xq, g, k + 1)));
        }
      } else {
        for (int k = 0; k < 8; ++k) c = Dot(c, w[k], _mm256_loadu_si256(XSlice(xq, g, k)));
      }
      accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c),
                                _mm256_set1_ps(a.scales[static_cast<size_t>(t) * ngroups + g]), accf[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[static_cast<size_t>(t) * ldy] = Output(row, accf[t], a, t);
}

// Rows decoded side by side at one token (one: as on AVX-512, one row's b streams read faster
// than 4 rows' 4b; forced AVX2 on the Xeon, 14336x4096, 4 bits: 12.4 GB/s against 10.3); the
// plane streams are prefetched kPrefetchBytes ahead.
template <int B>
constexpr int kSideBySide = 1;
inline size_t BlockAhead(int, size_t) { return kPrefetchBytes; }
// A dense int8 matrix at one token: four long row streams, prefetched as the bf16 GEMV's
// (cpu::PrefetchBytes(): none on AMD, whose prefetchers follow the streams). On AMD Zen 1, one
// token of a 50304x2048 matrix: 5.9 -> 10.0-12.0 GB/s on one thread, 9.8-11.3 -> 20.7-21.3 on
// two, against the adjacent rows prefetched 2 KiB ahead (docs/benchmarks.md, "The int8 dense
// GEMV as four streams").
inline size_t DenseAhead() { return cpu::PrefetchBytes(); }
constexpr int kDenseStreams = cpu::kGemvStreams;
// Many tokens: one row at a time (GemmRow; no GemmRowPair here).
constexpr bool kGemmRowPairs = false;
// No one-token loop of its own (q8_rows.inc's OneToken for every width).
template <int B, cpu::PrefetchLevel>
bool OneTokenFast(const BlockAndLut&, int, const Q8Acts&, float*, int, int) { return false; }

#include "kernels/anyprec/q8_rows.inc"

}  // namespace
}  // namespace avx2q8

void QuantizeRowAvx2(const float* x, int cols, int8_t* q, float* scales, float* offset) {
  avx2q8::QuantizeRowImpl(x, cols, q, scales, offset);
}

void DenseQ8RowsAvx2(const Q8Matrix& m, const Q8Acts& acts, float* y, size_t ldy, int row_begin,
                     int row_end) {
  avx2q8::DenseRows(m, acts, y, ldy, row_begin, row_end);
}

void Q8RowsAvx2(const BlockView& view, int bits, const Q8Lut& lut, const Q8Acts& acts, float* y,
                size_t ldy, int row_begin, int row_end) {
  avx2q8::RowsAnyWidth(view, bits, lut, acts, y, ldy, row_begin, row_end);
}

}  // namespace pw::anyprec::internal

// AVX-512 (F, BW, VL) backend: the AVX2 code formation and LUT shuffles, with 512-bit F16C
// widening and FMAs. Compiled with AVX-512 flags only; used only when the CPU reports avx512f,
// avx512bw and avx512vl (not measurable on the development machine, which lacks them).
#define PW_AP_AVX512 1
#define PW_AP_NS avx512
#include "kernels/anyprec/anyprec_simd.inc"

namespace pw::anyprec::internal {
void GemmRowsAvx512(const BlockView& view, int bits, const float* x, int tokens, float* y,
                    int row_begin, int row_end, void* ws) {
  avx512::GemmRows(view, bits, x, tokens, y, row_begin, row_end, ws);
}
}  // namespace pw::anyprec::internal

// AVX2 + FMA + F16C backend (compiled with those flags only; chosen at run time).
#define PW_AP_AVX512 0
#define PW_AP_NS avx2
#include "kernels/anyprec/anyprec_simd.inc"

namespace pw::anyprec::internal {
void GemmRowsAvx2(const BlockView& view, int bits, const float* x, int tokens, float* y,
                  int row_begin, int row_end, void* ws) {
  avx2::GemmRows(view, bits, x, tokens, y, row_begin, row_end, ws);
}
}  // namespace pw::anyprec::internal

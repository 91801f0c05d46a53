#include "kernels/cpu/attention_tiles.h"

namespace pw::cpu {

// The backends' per-pair kernels (dense_avx512.cc, dense_avx2.cc) and their tiled twins.
float DotAvx512(const float* a, const float* b, size_t n);
void AxpyAvx512(float alpha, const float* x, size_t n, float* y);
void DotRowsAvx512(const float* q, size_t ldq, size_t nq, const float* keys, size_t ns, size_t D,
                   float scale, float* scores, size_t lds);
void AxpyRowsAvx512(const float* a, size_t ns, const float* values, size_t D, float* out);
float DotAvx2(const float* a, const float* b, size_t n);
void AxpyAvx2(float alpha, const float* x, size_t n, float* y);
void DotRowsAvx2(const float* q, size_t ldq, size_t nq, const float* keys, size_t ns, size_t D,
                 float scale, float* scores, size_t lds);
void AxpyRowsAvx2(const float* a, size_t ns, const float* values, size_t D, float* out);

void AttentionDots(const kernels::DenseKernels& k, const float* q, size_t ldq, size_t nq,
                   const float* keys, size_t ns, size_t D, float scale, float* scores, size_t lds) {
  if (D % 16 == 0 && k.dot == &DotAvx512) return DotRowsAvx512(q, ldq, nq, keys, ns, D, scale, scores, lds);
  if (D % 16 == 0 && k.dot == &DotAvx2) return DotRowsAvx2(q, ldq, nq, keys, ns, D, scale, scores, lds);
  for (size_t i = 0; i < nq; ++i)
    for (size_t s = 0; s < ns; ++s) scores[i * lds + s] = k.dot(q + i * ldq, keys + s * D, D) * scale;
}

void AttentionAxpys(const kernels::DenseKernels& k, const float* a, size_t ns, const float* values,
                    size_t D, float* out) {
  if (D % 16 == 0 && k.axpy == &AxpyAvx512) return AxpyRowsAvx512(a, ns, values, D, out);
  if (D % 16 == 0 && k.axpy == &AxpyAvx2) return AxpyRowsAvx2(a, ns, values, D, out);
  for (size_t s = 0; s < ns; ++s) k.axpy(a[s], values + s * D, D, out);
}

}  // namespace pw::cpu

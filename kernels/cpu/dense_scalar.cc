// Scalar reference backend: the definition of correct for every dense CPU kernel.
#include <cmath>

#include "kernels/cpu/dense.h"

namespace pw::cpu {
namespace {

// kRound: each activation rounded to bf16 first (matmul_bf16 of the bf16-activation tables).
template <bool kRound>
void MatmulBf16ScalarT(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                       size_t n_begin, size_t n_end, float* y, size_t ldy) {
  for (size_t t = 0; t < T; ++t) {
    const float* xt = x + t * ldx;
    for (size_t n = n_begin; n < n_end; ++n) {
      const uint16_t* wn = w + n * K;
      float s = 0.f;
      for (size_t k = 0; k < K; ++k)
        s += (kRound ? Bf16Bits(ToBf16Bits(xt[k])) : xt[k]) * Bf16Bits(wn[k]);
      y[t * ldy + n] = s;
    }
  }
}

void MatmulBf16Scalar(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                      size_t n_begin, size_t n_end, float* y, size_t ldy) {
  MatmulBf16ScalarT<false>(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void MatmulBf16ActsBf16Scalar(const float* x, size_t ldx, size_t T, const uint16_t* w, size_t K,
                              size_t n_begin, size_t n_end, float* y, size_t ldy) {
  MatmulBf16ScalarT<true>(x, ldx, T, w, K, n_begin, n_end, y, ldy);
}

void MatmulF32Scalar(const float* x, size_t ldx, size_t T, const float* w, size_t K, size_t n_begin,
                     size_t n_end, float* y, size_t ldy) {
  for (size_t t = 0; t < T; ++t) {
    const float* xt = x + t * ldx;
    for (size_t n = n_begin; n < n_end; ++n) {
      const float* wn = w + n * K;
      float s = 0.f;
      for (size_t k = 0; k < K; ++k) s += xt[k] * wn[k];
      y[t * ldy + n] = s;
    }
  }
}

void RmsNormScalar(const float* x, const float* w, size_t dim, float eps, float* y) {
  float ss = 0.f;
  for (size_t i = 0; i < dim; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
  for (size_t i = 0; i < dim; ++i) y[i] = w[i] * (x[i] * r);
}

void SoftmaxScalar(float* x, size_t n) {
  float mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) mx = std::fmax(mx, x[i]);
  float sum = 0.f;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void SiluMulScalar(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

float DotScalar(const float* a, const float* b, size_t n) {
  float s = 0.f;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void AxpyScalar(float alpha, const float* x, size_t n, float* y) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace

const kernels::DenseKernels kScalarKernels = {
    MatmulBf16Scalar, MatmulF32Scalar, RmsNormScalar, SoftmaxScalar,
    SiluMulScalar,    DotScalar,       AxpyScalar,
};

const kernels::DenseKernels kScalarBf16ActsKernels = {
    MatmulBf16ActsBf16Scalar,
    MatmulF32Scalar,
    RmsNormScalar,
    SoftmaxScalar,
    SiluMulScalar,
    DotScalar,
    AxpyScalar,
};

}  // namespace pw::cpu

// The dense op table's cases (kernels/dense_ops.h), shared by the op x backend tests: every op of
// the table, run on one backend's table against the scalar CPU reference on random inputs (fixed
// seed) with awkward sizes. tests/kernels_cpu/op_backend_test.cc runs them on the CPU backends,
// tests/gpu/op_backend_cuda_test.cc on kCuda; a new op of the table gets its case here, so both
// check it.
//
// A backend's ops read and write the backend's memory, so a case never hands them its host
// vectors: it copies its inputs in through the backend's OpMemory (host memory for the CPU
// backends, device memory for CUDA: tests/gpu/cuda_memory.h), runs the op on those pointers and
// copies the outputs back. Outputs are poisoned with NaN first (every entry must be written);
// entries an op must leave alone hold another value that must survive.
//
// Tolerances: products |y - ref| <= 1e-5 * sum |x w| + 1e-6 (fp32 sums in another order); norms,
// softmax and SiLU*mul 2e-5 relative to the magnitude of the result; axpy 1e-6 relative to
// |y| + |alpha x|.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/dense.h"
#include "kernels/dense_ops.h"

namespace pw::op_cases {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> Random(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> RandomBf16(std::mt19937& rng, size_t n) {
  std::vector<uint16_t> v(n);
  const auto f = Random(rng, n);
  for (size_t i = 0; i < n; ++i) v[i] = cpu::ToBf16Bits(f[i]);
  return v;
}

// |got - want| <= tol for every entry, naming the first that is not.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                        const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": entry " << i << " not written";
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol[i])
        << what << ": entry " << i << " is " << got[i] << ", reference " << want[i];
  }
}

inline void RelativeTol(const std::vector<float>& want, double rel, std::vector<double>* tol) {
  tol->resize(want.size());
  for (size_t i = 0; i < want.size(); ++i) (*tol)[i] = rel * (std::fabs(want[i]) + 1e-3);
}

// The memory a backend's ops read and write, seen from a test.
class OpMemory {
 public:
  virtual ~OpMemory() = default;
  virtual void* Alloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void CopyIn(void* dst, const void* src, size_t bytes) = 0;
  // Waits for the work queued on the backend, then copies.
  virtual void CopyOut(void* dst, const void* src, size_t bytes) = 0;
};

// The CPU backends' memory: the host's.
class HostMemory : public OpMemory {
 public:
  void* Alloc(size_t bytes) override { return std::malloc(bytes); }
  void Free(void* p) override { std::free(p); }
  void CopyIn(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void CopyOut(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
};

// The buffers of one op call in a backend's memory, freed at the end of the scope.
class Buffers {
 public:
  explicit Buffers(OpMemory& memory) : memory_(memory) {}
  ~Buffers() {
    for (void* p : owned_) memory_.Free(p);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  // A copy of `host` in the backend's memory.
  template <typename T>
  T* In(const std::vector<T>& host) {
    void* p = memory_.Alloc(std::max<size_t>(host.size(), 1) * sizeof(T));
    EXPECT_NE(p, nullptr);
    owned_.push_back(p);
    if (!host.empty()) memory_.CopyIn(p, host.data(), host.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  // n entries at `at` (in the backend's memory), copied back to the host.
  template <typename T>
  std::vector<T> Out(const T* at, size_t n) {
    std::vector<T> host(n);
    if (n > 0) memory_.CopyOut(host.data(), at, n * sizeof(T));
    return host;
  }

 private:
  OpMemory& memory_;
  std::vector<void*> owned_;
};

// One backend under test: its table and the memory its pointers live in.
struct DenseTarget {
  const kernels::DenseKernels* ops;
  OpMemory* memory;
};

// One op's check: runs `k` and the reference `ref` (a CPU table on host memory) on the same
// random inputs and compares.
using DenseCheck =
    std::function<void(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng)>;

// matmul_bf16 and matmul_f32 over every argument of the signature: strides ldx > K and
// ldy > n_end and a row range [n_begin, n_end) inside N, whose outside entries stay untouched.
template <typename W>
void CheckMatmul(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng,
                 const char* op) {
  struct Shape {
    size_t T, K, N, ldx, n_begin, n_end, ldy;
  };
  std::vector<Shape> shapes;
  for (size_t T : {1, 3, 5, 17}) {
    for (size_t K : {1, 33, 257}) shapes.push_back({T, K, 19, K, 0, 19, 19});
  }
  shapes.push_back({4, 70, 21, 75, 3, 20, 23});
  shapes.push_back({37, 129, 65, 131, 0, 64, 65});
  constexpr float kUntouched = -7.f;
  for (const Shape& s : shapes) {
    const auto x = Random(rng, s.T * s.ldx);
    std::vector<W> w;
    if constexpr (std::is_same_v<W, uint16_t>) {
      w = RandomBf16(rng, s.N * s.K);
    } else {
      w = Random(rng, s.N * s.K);
    }
    auto weight = [&](size_t n, size_t c) {
      if constexpr (std::is_same_v<W, uint16_t>) {
        return cpu::Bf16Bits(w[n * s.K + c]);
      } else {
        return w[n * s.K + c];
      }
    };
    std::vector<float> y0(s.T * s.ldy, kUntouched);
    std::vector<double> tol(y0.size(), 0.0);
    for (size_t t = 0; t < s.T; ++t) {
      for (size_t n = s.n_begin; n < s.n_end; ++n) {
        y0[t * s.ldy + n] = kNaN;
        double mag = 0;
        for (size_t c = 0; c < s.K; ++c) mag += std::fabs(x[t * s.ldx + c] * weight(n, c));
        tol[t * s.ldy + n] = 1e-5 * mag + 1e-6;
      }
    }
    std::vector<float> want = y0;
    Buffers b(*k.memory);
    const float* dx = b.In(x);
    const W* dw = b.In(w);
    float* dy = b.In(y0);
    if constexpr (std::is_same_v<W, uint16_t>) {
      k.ops->matmul_bf16(dx, s.ldx, s.T, dw, s.K, s.n_begin, s.n_end, dy, s.ldy);
      ref.matmul_bf16(x.data(), s.ldx, s.T, w.data(), s.K, s.n_begin, s.n_end, want.data(), s.ldy);
    } else {
      k.ops->matmul_f32(dx, s.ldx, s.T, dw, s.K, s.n_begin, s.n_end, dy, s.ldy);
      ref.matmul_f32(x.data(), s.ldx, s.T, w.data(), s.K, s.n_begin, s.n_end, want.data(), s.ldy);
    }
    ExpectClose(b.Out(dy, y0.size()), want, tol,
                std::string(op) + " T=" + std::to_string(s.T) + " K=" + std::to_string(s.K) +
                    " rows [" + std::to_string(s.n_begin) + ", " + std::to_string(s.n_end) + ")");
  }
}

inline void MatmulBf16(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  CheckMatmul<uint16_t>(k, ref, rng, "matmul_bf16");
}

inline void MatmulF32(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  CheckMatmul<float>(k, ref, rng, "matmul_f32");
}

// One row per call, out of place and in place (y == x).
inline void RmsNorm(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t dim : {1, 7, 64, 1000}) {
    const auto x = Random(rng, dim), w = Random(rng, dim);
    std::vector<float> want(dim, kNaN);
    std::vector<double> tol;
    ref.rms_norm(x.data(), w.data(), dim, 1e-6f, want.data());
    RelativeTol(want, 2e-5, &tol);
    Buffers b(*k.memory);
    const float* dw = b.In(w);
    float* dx = b.In(x);
    float* dy = b.In(std::vector<float>(dim, kNaN));
    k.ops->rms_norm(dx, dw, dim, 1e-6f, dy);
    ExpectClose(b.Out(dy, dim), want, tol, "rms_norm dim=" + std::to_string(dim));
    k.ops->rms_norm(dx, dw, dim, 1e-6f, dx);
    ExpectClose(b.Out(dx, dim), want, tol, "rms_norm in place dim=" + std::to_string(dim));
  }
}

inline void Softmax(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 9, 100, 1025}) {
    const auto x = Random(rng, n, -8.f, 8.f);
    auto want = x;
    std::vector<double> tol;
    ref.softmax(want.data(), n);
    RelativeTol(want, 2e-5, &tol);
    Buffers b(*k.memory);
    float* dx = b.In(x);
    k.ops->softmax(dx, n);
    ExpectClose(b.Out(dx, n), want, tol, "softmax n=" + std::to_string(n));
  }
}

inline void SiluMul(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 333, 4099}) {
    const auto g = Random(rng, n, -6.f, 6.f), u = Random(rng, n);
    std::vector<float> want(n, kNaN);
    std::vector<double> tol;
    ref.silu_mul(g.data(), u.data(), n, want.data());
    RelativeTol(want, 2e-5, &tol);
    Buffers b(*k.memory);
    const float* dg = b.In(g);
    const float* du = b.In(u);
    float* dy = b.In(std::vector<float>(n, kNaN));
    k.ops->silu_mul(dg, du, n, dy);
    ExpectClose(b.Out(dy, n), want, tol, "silu_mul n=" + std::to_string(n));
  }
}

inline void Dot(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 15, 16, 129, 5000}) {
    const auto a = Random(rng, n), c = Random(rng, n);
    double mag = 0;
    for (size_t i = 0; i < n; ++i) mag += std::fabs(a[i] * c[i]);
    Buffers b(*k.memory);
    const float got = k.ops->dot(b.In(a), b.In(c), n);
    ExpectClose({got}, {ref.dot(a.data(), c.data(), n)}, {1e-5 * mag + 1e-6},
                "dot n=" + std::to_string(n));
  }
}

inline void Axpy(const DenseTarget& k, const kernels::DenseKernels& ref, std::mt19937& rng) {
  for (size_t n : {1, 15, 16, 129, 5000}) {
    const auto x = Random(rng, n), y = Random(rng, n);
    auto want = y;
    ref.axpy(0.37f, x.data(), n, want.data());
    // Relative to the terms, not the result: where y and alpha x nearly cancel, an FMA (one
    // rounding) and the reference's multiply-then-add (two) differ by an ulp of alpha x.
    std::vector<double> tol(n);
    for (size_t i = 0; i < n; ++i) tol[i] = 1e-6 * (std::fabs(y[i]) + std::fabs(0.37f * x[i]));
    Buffers b(*k.memory);
    const float* dx = b.In(x);
    float* dy = b.In(y);
    k.ops->axpy(0.37f, dx, n, dy);
    ExpectClose(b.Out(dy, n), want, tol, "axpy n=" + std::to_string(n));
  }
}

struct DenseOp {
  const char* name;  // the table's field
  DenseCheck check;
};

// Every op of kernels::DenseKernels, in the table's order.
inline std::vector<DenseOp> DenseOps() {
  return {{"matmul_bf16", MatmulBf16},
          {"matmul_f32", MatmulF32},
          {"rms_norm", RmsNorm},
          {"softmax", Softmax},
          {"silu_mul", SiluMul},
          {"dot", Dot},
          {"axpy", Axpy}};
}

}  // namespace pw::op_cases

// Validation, dispatch, LUT and activation quantization of the integer fast path (q8.h).
#include "kernels/anyprec/q8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/dtype.h"
#include "kernels/anyprec/q8_internal.h"
#include "kernels/cpu/amx_permission.h"
#include "kernels/cpu/kernel_settings.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace pw::anyprec {

using kernels::Backend;

namespace {

// AVX2, FMA and F16C: anyprec.cc's check for its AVX2 backend (F16C asked of CPUID once).
bool CpuHasAvx2() { return BackendAvailable(Backend::kAvx2); }
bool CpuHasAvx512Q8() {
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("gfni");
}

// AMX-TILE + AMX-INT8 (CPUID.7.0:EDX bits 24, 25), the OS saving the tile state (OSXSAVE,
// XCR0 bits 17, 18), and the kernel's leave for this process to use it (Linux: arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; asked once).
bool AmxInt8Usable() {
#if defined(__x86_64__)
  static const bool usable = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (((d >> 24) & 1) == 0 || ((d >> 25) & 1) == 0) return false;
    return cpu::AmxTileStatePermitted();
  }();
  return usable;
#else
  return false;
#endif
}

internal::Q8RowsFn RowsFn(Backend backend) {
  switch (backend) {
    case Backend::kScalar: return internal::Q8RowsScalar;
    case Backend::kAvx2: return internal::Q8RowsAvx2;
    case Backend::kAvx512: return internal::Q8RowsAvx512;
    case Backend::kAmx: return internal::Q8RowsAmx;
    case Backend::kCuda: return nullptr;  // never available (Q8BackendAvailable)
  }
  return nullptr;
}

internal::QuantizeRowFn QuantizeFn() {
  static const internal::QuantizeRowFn fn = [] {
    if (CpuHasAvx512Q8()) return internal::QuantizeRowAvx512;
    if (CpuHasAvx2()) return internal::QuantizeRowAvx2;
    return internal::QuantizeRowScalar;
  }();
  return fn;
}

// Activations quantized for `cols` columns, a row range inside `rows`, y able to hold it.
Status CheckActsAndRows(const Q8Acts& acts, int cols, int rows, const float* y, size_t ldy,
                        int row_begin, int row_end) {
  if (acts.q == nullptr || acts.scales == nullptr || acts.offsets == nullptr ||
      acts.tokens < 1 || acts.tokens > kMaxTokens) {
    return InvalidArgument("anyprec q8: activations not quantized (QuantizeActs)");
  }
  if (acts.cols != cols) {
    return InvalidArgument("anyprec q8: activations have " + std::to_string(acts.cols) +
                           " columns, the weights " + std::to_string(cols));
  }
  if (row_begin < 0 || row_end > rows || row_begin > row_end) {
    return InvalidArgument("anyprec q8: row range [" + std::to_string(row_begin) + ", " +
                           std::to_string(row_end) + ") outside the weights' " +
                           std::to_string(rows) + " rows");
  }
  if (y == nullptr || ldy < static_cast<size_t>(row_end)) {
    return InvalidArgument("anyprec q8: null y or ldy below the row range");
  }
  return Status::Ok();
}

size_t AlignUp(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// A dense matrix's range (Q8Matrix::max_value) must be 1..127.
Status CheckDenseRange(int max_value) {
  if (max_value >= 1 && max_value <= 127) return Status::Ok();
  return InvalidArgument("anyprec q8: dense range " + std::to_string(max_value) + " outside 1..127");
}

}  // namespace

Status QuantizeLut(const uint16_t* lut_f16, int rows, int bits, int8_t* values, float* scales) {
  if (bits < kMinBits || bits > kMaxBits || rows < 0) {
    return InvalidArgument("anyprec q8: LUT of width " + std::to_string(bits) + ", rows " +
                           std::to_string(rows));
  }
  const int entries = LutEntries(bits);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* src = lut_f16 + static_cast<size_t>(r) * entries;
    float amax = 0.f;
    for (int i = 0; i < entries; ++i) {
      const float v = F16ToF32(src[i]);
      if (!std::isfinite(v)) {
        return InvalidArgument("anyprec q8: non-finite centroid in row " + std::to_string(r));
      }
      amax = std::max(amax, std::fabs(v));
    }
    const float most = static_cast<float>(Q8LutMax(bits));
    scales[r] = amax / most;
    int8_t* dst = values + static_cast<size_t>(r) * entries;
    for (int i = 0; i < entries; ++i) {
      const float v = F16ToF32(src[i]);
      dst[i] = amax > 0.f ? static_cast<int8_t>(std::clamp(std::nearbyint(v * (most / amax)), -most, most)) : 0;
    }
  }
  return Status::Ok();
}

int DenseQ8Max(Backend backend) {
  return backend == Backend::kAvx512 || backend == Backend::kAmx ? 127 : kDenseQ8PairMax;
}

Result<int> DenseQ8Range() {
  const char* knob = cpu::KernelKnob("PW_DENSE_Q8_MAX");
  if (knob == nullptr || *knob == '\0') return DenseQ8Max(BestQ8Backend());
  char* end = nullptr;
  const long n = std::strtol(knob, &end, 10);
  if (*end != '\0' || n < 1 || n > 127) {
    return InvalidArgument(std::string("PW_DENSE_Q8_MAX '") + knob + "': the int8 dense range is 1..127");
  }
  return static_cast<int>(n);
}

Status QuantizeBf16Rows(const uint16_t* w, int rows, int cols, int8_t* values, float* scales,
                        int max_value) {
  if (rows < 0 || cols < 1) {
    return InvalidArgument("anyprec q8: dense matrix of " + std::to_string(rows) + " x " +
                           std::to_string(cols));
  }
  PW_RETURN_IF_ERROR(CheckDenseRange(max_value));
  const float most = static_cast<float>(max_value);
  const int stride = Q8ActStride(cols);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* src = w + static_cast<size_t>(r) * cols;
    float amax = 0.f;
    for (int c = 0; c < cols; ++c) {
      uint32_t u = static_cast<uint32_t>(src[c]) << 16;
      float v;
      std::memcpy(&v, &u, sizeof v);
      if (!std::isfinite(v)) {
        return InvalidArgument("anyprec q8: non-finite weight at row " + std::to_string(r) +
                               ", column " + std::to_string(c));
      }
      amax = std::max(amax, std::fabs(v));
    }
    scales[r] = amax / most;
    int8_t* dst = values + static_cast<size_t>(r) * stride;
    std::memset(dst, 0, stride);
    const float inv = amax > 0.f ? most / amax : 0.f;
    for (int c = 0; c < cols; ++c) {
      uint32_t u = static_cast<uint32_t>(src[c]) << 16;
      float v;
      std::memcpy(&v, &u, sizeof v);
      dst[Q8ActIndex(c)] = static_cast<int8_t>(std::clamp(std::nearbyint(v * inv), -most, most));
    }
  }
  return Status::Ok();
}

Status DenseQ8Rows(Backend backend, const Q8Matrix& w, const Q8Acts& acts, float* y, size_t ldy,
                   int row_begin, int row_end) {
  if (!Q8BackendAvailable(backend)) {
    return Unsupported(std::string("anyprec q8: backend ") + BackendName(backend) +
                       " has no fast path on this CPU");
  }
  if (w.values == nullptr || w.scales == nullptr || w.rows < 1 || w.cols < 1) {
    return InvalidArgument("anyprec q8: empty dense matrix");
  }
  PW_RETURN_IF_ERROR(CheckDenseRange(w.max_value));
  PW_RETURN_IF_ERROR(CheckActsAndRows(acts, w.cols, w.rows, y, ldy, row_begin, row_end));
  if (row_begin == row_end) return Status::Ok();
  switch (backend) {
    case Backend::kScalar: internal::DenseQ8RowsScalar(w, acts, y, ldy, row_begin, row_end); break;
    case Backend::kAvx2: internal::DenseQ8RowsAvx2(w, acts, y, ldy, row_begin, row_end); break;
    case Backend::kAvx512:
    case Backend::kAmx:  // dense int8 matrices stay on the AVX-512 loops
      internal::DenseQ8RowsAvx512(w, acts, y, ldy, row_begin, row_end);
      break;
    case Backend::kCuda:  // refused above (Q8BackendAvailable)
      break;
  }
  return Status::Ok();
}

size_t Q8ActsBytes(int tokens, int cols) {
  const size_t t = static_cast<size_t>(std::max(tokens, 1));
  return AlignUp(t * Q8ActStride(std::max(cols, 1))) +
         AlignUp(t * Q8ActGroups(std::max(cols, 1)) * sizeof(float)) + AlignUp(t * sizeof(float));
}

Status QuantizeActs(const float* x, size_t ldx, int tokens, int cols, Workspace buf, Q8Acts* out) {
  if (tokens < 1 || tokens > kMaxTokens || cols < 1 || ldx < static_cast<size_t>(cols)) {
    return InvalidArgument("anyprec q8: activations of " + std::to_string(tokens) + " tokens x " +
                           std::to_string(cols) + " columns (ldx " + std::to_string(ldx) + ")");
  }
  if (x == nullptr || out == nullptr) return InvalidArgument("anyprec q8: null activations");
  const size_t need = Q8ActsBytes(tokens, cols);
  if (buf.bytes < need || buf.data == nullptr ||
      reinterpret_cast<uintptr_t>(buf.data) % kWorkspaceAlign != 0) {
    return InvalidArgument("anyprec q8: activation buffer of " + std::to_string(buf.bytes) +
                           " bytes (aligned to 64), need " + std::to_string(need));
  }
  const int stride = Q8ActStride(cols), groups = Q8ActGroups(cols);
  auto* base = static_cast<uint8_t*>(buf.data);
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* scales = reinterpret_cast<float*>(base + AlignUp(static_cast<size_t>(tokens) * stride));
  auto* offsets = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(scales) +
                                           AlignUp(static_cast<size_t>(tokens) * groups * sizeof(float)));
  PW_RETURN_IF_ERROR(QuantizeActRows(x, ldx, tokens, cols, q, scales, offsets));
  *out = Q8Acts{tokens, cols, q, scales, offsets};
  return Status::Ok();
}

Status QuantizeActRows(const float* x, size_t ldx, int tokens, int cols, int8_t* q, float* scales,
                       float* offsets) {
  if (tokens < 0 || cols < 1 || ldx < static_cast<size_t>(cols)) {
    return InvalidArgument("anyprec q8: activations of " + std::to_string(tokens) + " tokens x " +
                           std::to_string(cols) + " columns (ldx " + std::to_string(ldx) + ")");
  }
  if (tokens > 0 && (x == nullptr || q == nullptr || scales == nullptr || offsets == nullptr ||
                     reinterpret_cast<uintptr_t>(q) % kWorkspaceAlign != 0)) {
    return InvalidArgument("anyprec q8: null or unaligned activation arrays");
  }
  for (int t = 0; t < tokens; ++t) {
    const float* row = x + static_cast<size_t>(t) * ldx;
    // One pass without an early exit on the exponent bits (vectorizes with SSE2's integer
    // compares); the position only when something is wrong.
    uint32_t bad = 0;
    for (int c = 0; c < cols; ++c) {
      uint32_t u;
      std::memcpy(&u, row + c, sizeof u);
      bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
    if (bad == 0) continue;
    for (int c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c])) {
        return InvalidArgument("anyprec q8: non-finite activation at token " + std::to_string(t) +
                               ", column " + std::to_string(c));
      }
    }
  }
  const int stride = Q8ActStride(cols), groups = Q8ActGroups(cols);
  const internal::QuantizeRowFn fn = QuantizeFn();
  for (int t = 0; t < tokens; ++t) {
    fn(x + static_cast<size_t>(t) * ldx, cols, q + static_cast<size_t>(t) * stride,
       scales + static_cast<size_t>(t) * groups, offsets + t);
  }
  return Status::Ok();
}

bool Q8BackendAvailable(Backend backend) {
  switch (backend) {
    case Backend::kScalar: return true;
    case Backend::kAvx2: return CpuHasAvx2();
    case Backend::kAvx512: return CpuHasAvx512Q8();
    case Backend::kAmx: return CpuHasAvx512Q8() && AmxInt8Usable();
    case Backend::kCuda: return false;  // CPU kernels only
  }
  return false;
}

Backend BestQ8Backend() {
  static const Backend best = [] {
    if (const char* env = cpu::KernelKnob("PW_ANYPREC_BACKEND")) {
      for (Backend b : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512, Backend::kAmx}) {
        if (std::string(env) == BackendName(b) && Q8BackendAvailable(b)) return b;
      }
    }
    if (Q8BackendAvailable(Backend::kAmx)) return Backend::kAmx;
    if (Q8BackendAvailable(Backend::kAvx512)) return Backend::kAvx512;
    if (Q8BackendAvailable(Backend::kAvx2)) return Backend::kAvx2;
    return Backend::kScalar;
  }();
  return best;
}

int FastWidthLimit(Backend backend) {
  return backend == Backend::kAvx512 || backend == Backend::kAmx ? kMaxBits : 5;
}

Status ApGemmQ8Rows(Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const Q8Acts& acts, float* y, size_t ldy, int row_begin, int row_end) {
  PW_RETURN_IF_ERROR(ValidatePlanes(view, bits));
  if (!Q8BackendAvailable(backend)) {
    return Unsupported(std::string("anyprec q8: backend ") + BackendName(backend) +
                       " has no fast path on this CPU");
  }
  if ((lut.values == nullptr && (lut.pages == nullptr || lut.tile_rows < 1)) ||
      lut.scales == nullptr) {
    return InvalidArgument("anyprec q8: int8 LUT for width " + std::to_string(bits) + " missing");
  }
  PW_RETURN_IF_ERROR(CheckActsAndRows(acts, view.cols, view.rows, y, ldy, row_begin, row_end));
  if (row_begin == row_end) return Status::Ok();
  RowsFn(backend)(view, bits, lut, acts, y, ldy, row_begin, row_end);
  return Status::Ok();
}

}  // namespace pw::anyprec

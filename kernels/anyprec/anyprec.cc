// Dispatch, validation and the fused MoE of the any-precision kernels.
#include "kernels/anyprec/anyprec.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/anyprec/internal.h"
#include "kernels/cpu/kernel_settings.h"

namespace pw::anyprec {

using kernels::Backend;

namespace internal {

void PermuteX(const float* x, int tokens, int cols, bool strided, float* xp) {
  const int padded = PaddedCols(cols);
  for (int t = 0; t < tokens; ++t) {
    const float* src = x + static_cast<size_t>(t) * cols;
    float* dst = xp + static_cast<size_t>(t) * padded;
    for (int base = 0; base < padded; base += 32) {
      if (strided) {
        for (int q = 0; q < 32; ++q) {
          const int c = base + StridedSlotToByte(q);
          dst[base + q] = c < cols ? src[c] : 0.f;
        }
      } else if (base + 32 <= cols) {
        std::memcpy(dst + base, src + base, 8 * sizeof(float));
        std::memcpy(dst + base + 8, src + base + 16, 8 * sizeof(float));
        std::memcpy(dst + base + 16, src + base + 8, 8 * sizeof(float));
        std::memcpy(dst + base + 24, src + base + 24, 8 * sizeof(float));
      } else {
        for (int q = 0; q < 32; ++q) {
          const int c = base + SliceSlotToByte(q);
          dst[base + q] = c < cols ? src[c] : 0.f;
        }
      }
    }
  }
}

int SimdChunkCols(int tokens) {
  const int budget = (160 * 1024) / (4 * std::max(tokens, 1));
  return std::clamp(budget / kGroupCols * kGroupCols, kGroupCols, 16384);
}

size_t SimdWorkspaceBytes(int cols, int tokens) {
  return sizeof(float) * (256 + 2 * static_cast<size_t>(SimdChunkCols(tokens)) +
                          static_cast<size_t>(tokens) * PaddedCols(cols));
}

}  // namespace internal

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 knows no "f16c" for
// __builtin_cpu_supports, and `make fuzz` builds with clang. Asked once: every kernel call
// checks its backend, and in a virtual machine CPUID traps to the hypervisor (6.6 % of a
// batch-1 decode's samples on a KVM guest before this was cached).
bool CpuHasF16c() {
  static const bool has = [] {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1) != 0;
  }();
  return has;
}

bool CpuHasAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
}
bool CpuHasAvx512() {
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

internal::GemmRowsFn BackendFn(Backend backend) {
  switch (backend) {
    case Backend::kScalar: return internal::GemmRowsScalar;
    case Backend::kAvx2: return internal::GemmRowsAvx2;
    case Backend::kAvx512: return internal::GemmRowsAvx512;
    case Backend::kAmx: return nullptr;  // never available (BackendAvailable)
    case Backend::kCuda: return nullptr;  // never available (BackendAvailable)
  }
  return nullptr;
}

size_t AlignUp(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

Status CheckWorkspace(Workspace ws, size_t need, const char* what) {
  if (ws.bytes < need || (need > 0 && ws.data == nullptr)) {
    return InvalidArgument(std::string(what) + ": workspace of " + std::to_string(ws.bytes) +
                           " bytes, need " + std::to_string(need));
  }
  if (reinterpret_cast<uintptr_t>(ws.data) % kWorkspaceAlign != 0) {
    return InvalidArgument(std::string(what) + ": workspace not 64-byte aligned");
  }
  return Status::Ok();
}

}  // namespace

Status ValidatePlanes(const BlockView& view, int bits) {
  if (bits < kMinBits || bits > kMaxBits) {
    return InvalidArgument("anyprec: width " + std::to_string(bits) + " outside [3, 8]");
  }
  if (view.rows < 1 || view.cols < 1 || view.tile_rows < 1) {
    return InvalidArgument("anyprec: block view has rows=" + std::to_string(view.rows) +
                           " cols=" + std::to_string(view.cols) +
                           " tile_rows=" + std::to_string(view.tile_rows));
  }
  for (int p = 0; p < bits; ++p) {
    if (view.planes[p] == nullptr) {
      return InvalidArgument("anyprec: plane " + std::to_string(p) + " missing for width " +
                             std::to_string(bits));
    }
    for (int i = 0; i < view.NumPages(); ++i) {
      if (view.planes[p][i] == nullptr) {
        return InvalidArgument("anyprec: plane " + std::to_string(p) + " page " +
                               std::to_string(i) + " is null");
      }
    }
  }
  return Status::Ok();
}

Status ValidateView(const BlockView& view, int bits) {
  PW_RETURN_IF_ERROR(ValidatePlanes(view, bits));
  if (view.luts[bits] == nullptr) {
    return InvalidArgument("anyprec: LUT for width " + std::to_string(bits) + " missing");
  }
  return Status::Ok();
}

bool BackendAvailable(Backend backend) {
  switch (backend) {
    case Backend::kScalar: return true;
    case Backend::kAvx2: return CpuHasAvx2();
    case Backend::kAvx512: return CpuHasAvx512();
    case Backend::kAmx: return false;  // a fast-path backend only (q8.h)
    case Backend::kCuda: return false;  // CPU kernels only
  }
  return false;
}

Backend BestBackend() {
  static const Backend best = [] {
    if (const char* env = cpu::KernelKnob("PW_ANYPREC_BACKEND")) {
      for (Backend b : {Backend::kScalar, Backend::kAvx2, Backend::kAvx512}) {
        if (std::string(env) == BackendName(b) && BackendAvailable(b)) return b;
      }
    }
    if (BackendAvailable(Backend::kAvx512)) return Backend::kAvx512;
    if (BackendAvailable(Backend::kAvx2)) return Backend::kAvx2;
    return Backend::kScalar;
  }();
  return best;
}

size_t ApGemmWorkspaceBytes(int cols, int tokens) {
  // The maximum over 1..tokens, so a workspace sized for a batch also serves any smaller one.
  size_t most = 0;
  for (int t = 1; t <= std::clamp(tokens, 1, kMaxTokens); ++t) {
    most = std::max(most, internal::SimdWorkspaceBytes(std::max(cols, 1), t));
  }
  return AlignUp(most);
}

Status ApGemmRows(Backend backend, const BlockView& view, int bits, const float* x, int tokens,
                  float* y, int row_begin, int row_end, Workspace ws) {
  PW_RETURN_IF_ERROR(ValidateView(view, bits));
  if (!BackendAvailable(backend)) {
    return Unsupported(std::string("anyprec: backend ") + BackendName(backend) +
                       " not supported on this CPU");
  }
  if (tokens < 1 || tokens > kMaxTokens) {
    return InvalidArgument("anyprec: tokens=" + std::to_string(tokens) + " outside [1, 64]");
  }
  if (row_begin < 0 || row_end > view.rows || row_begin > row_end) {
    return InvalidArgument("anyprec: row range [" + std::to_string(row_begin) + ", " +
                           std::to_string(row_end) + ") outside the block's " +
                           std::to_string(view.rows) + " rows");
  }
  if (x == nullptr || y == nullptr) return InvalidArgument("anyprec: null x or y");
  if (backend != Backend::kScalar) {
    PW_RETURN_IF_ERROR(CheckWorkspace(ws, internal::SimdWorkspaceBytes(view.cols, tokens), "ApGemm"));
  }
  if (row_begin == row_end) return Status::Ok();
  BackendFn(backend)(view, bits, x, tokens, y, row_begin, row_end, ws.data);
  return Status::Ok();
}

Status ApGemm(Backend backend, const BlockView& view, int bits, const float* x, int tokens,
              float* y, Workspace ws) {
  return ApGemmRows(backend, view, bits, x, tokens, y, 0, view.rows, ws);
}

// ---- Fused MoE ----------------------------------------------------------------------------

namespace {

// Workspace carve-up for MoeForward (every piece 64-byte aligned).
struct MoeLayout {
  size_t offsets = 0, order = 0, xe = 0, h = 0, act = 0, ye = 0, gemm = 0, total = 0;
};

MoeLayout PlanMoe(int tokens, int num_assignments, int num_experts, int hidden, int ffn) {
  const size_t chunk = static_cast<size_t>(std::clamp(std::min(num_assignments, kMaxTokens), 1, kMaxTokens));
  MoeLayout l;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  l.offsets = take(sizeof(int32_t) * (static_cast<size_t>(num_experts) + 1));
  l.order = take(sizeof(int32_t) * static_cast<size_t>(std::max(num_assignments, 1)));
  l.xe = take(sizeof(float) * chunk * hidden);
  l.h = take(sizeof(float) * chunk * 2 * ffn);
  l.act = take(sizeof(float) * chunk * ffn);
  l.ye = take(sizeof(float) * chunk * hidden);
  l.gemm = take(ApGemmWorkspaceBytes(std::max(hidden, ffn), static_cast<int>(chunk)));
  l.total = at;
  return l;
}

Status CheckExpertBlock(const BlockView& v, int bits, int rows, int cols, int e, const char* name) {
  Status s = ValidateView(v, bits);
  if (!s.ok()) return s.WithContext("expert " + std::to_string(e) + " " + name);
  if (v.rows != rows || v.cols != cols) {
    return InvalidArgument("anyprec MoE: expert " + std::to_string(e) + " " + name + " is " +
                           std::to_string(v.rows) + "x" + std::to_string(v.cols) + ", expected " +
                           std::to_string(rows) + "x" + std::to_string(cols));
  }
  return Status::Ok();
}

}  // namespace

size_t MoeWorkspaceBytes(int tokens, int num_assignments, int num_experts, int hidden, int ffn) {
  return PlanMoe(tokens, num_assignments, num_experts, hidden, ffn).total;
}

Status MoeForward(Backend backend, const MoeExpert* experts, int num_experts,
                  const MoeAssignment* assignments, int num_assignments, const float* x,
                  int tokens, int hidden, int ffn, float* out, Workspace ws) {
  if (tokens < 0 || hidden < 1 || ffn < 1 || num_experts < 0 || num_assignments < 0) {
    return InvalidArgument("anyprec MoE: bad sizes tokens=" + std::to_string(tokens) +
                           " hidden=" + std::to_string(hidden) + " ffn=" + std::to_string(ffn));
  }
  if (!BackendAvailable(backend)) {
    return Unsupported(std::string("anyprec MoE: backend ") + BackendName(backend) +
                       " not supported on this CPU");
  }
  const MoeLayout l = PlanMoe(tokens, num_assignments, num_experts, hidden, ffn);
  PW_RETURN_IF_ERROR(CheckWorkspace(ws, l.total, "MoeForward"));
  auto* base = static_cast<uint8_t*>(ws.data);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  std::fill(offsets, offsets + num_experts + 1, 0);
  // Validate every assignment and every used expert before writing anything.
  for (int i = 0; i < num_assignments; ++i) {
    const MoeAssignment& a = assignments[i];
    if (a.token < 0 || a.token >= tokens || a.expert < 0 || a.expert >= num_experts) {
      return InvalidArgument("anyprec MoE: assignment " + std::to_string(i) + " (token " +
                             std::to_string(a.token) + ", expert " + std::to_string(a.expert) +
                             ") out of range");
    }
    if (offsets[a.expert + 1]++ == 0) {
      const MoeExpert& ex = experts[a.expert];
      PW_RETURN_IF_ERROR(CheckExpertBlock(ex.gate_up, ex.gate_up_bits, 2 * ffn, hidden, a.expert, "gate_up"));
      PW_RETURN_IF_ERROR(CheckExpertBlock(ex.down, ex.down_bits, hidden, ffn, a.expert, "down"));
    }
  }
  for (int e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
  auto* order = reinterpret_cast<int32_t*>(base + l.order);
  {
    // Counting sort of assignments by expert (stable), using order[] slots via running heads.
    // offsets[e] is advanced while placing and restored afterwards.
    for (int i = 0; i < num_assignments; ++i) order[offsets[assignments[i].expert]++] = i;
    for (int e = num_experts; e > 0; --e) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
  }
  std::fill(out, out + static_cast<size_t>(tokens) * hidden, 0.f);
  float* xe = reinterpret_cast<float*>(base + l.xe);
  float* h = reinterpret_cast<float*>(base + l.h);
  float* act = reinterpret_cast<float*>(base + l.act);
  float* ye = reinterpret_cast<float*>(base + l.ye);
  const Workspace gemm_ws{base + l.gemm, l.total - l.gemm};
  for (int e = 0; e < num_experts; ++e) {
    const MoeExpert& ex = experts[e];
    for (int begin = offsets[e]; begin < offsets[e + 1]; begin += kMaxTokens) {
      const int n = std::min(kMaxTokens, offsets[e + 1] - begin);
      for (int i = 0; i < n; ++i) {
        const int t = assignments[order[begin + i]].token;
        std::memcpy(xe + static_cast<size_t>(i) * hidden, x + static_cast<size_t>(t) * hidden,
                    sizeof(float) * hidden);
      }
      PW_RETURN_IF_ERROR(ApGemm(backend, ex.gate_up, ex.gate_up_bits, xe, n, h, gemm_ws));
      for (int i = 0; i < n; ++i) {
        const float* gate = h + static_cast<size_t>(i) * 2 * ffn;
        const float* up = gate + ffn;
        float* a = act + static_cast<size_t>(i) * ffn;
        for (int j = 0; j < ffn; ++j) a[j] = gate[j] / (1.f + std::exp(-gate[j])) * up[j];
      }
      PW_RETURN_IF_ERROR(ApGemm(backend, ex.down, ex.down_bits, act, n, ye, gemm_ws));
      for (int i = 0; i < n; ++i) {
        const MoeAssignment& a = assignments[order[begin + i]];
        float* dst = out + static_cast<size_t>(a.token) * hidden;
        const float* src = ye + static_cast<size_t>(i) * hidden;
        for (int j = 0; j < hidden; ++j) dst[j] += a.weight * src[j];
      }
    }
  }
  return Status::Ok();
}

}  // namespace pw::anyprec

// Any-precision expert kernels: y = W_b x straight from bit-planes and LUT_b, and the fused
// mixed-precision MoE built on it (DESIGN.md sections 3, 4, 6).
//
// Weight representation of one linear block W [rows = out features, cols = in features]:
//   - every weight has an 8-bit parent code; its b-bit code (b in 3..8) is the top b bits;
//   - the codes are stored as 8 bit-planes, plane 0 = most significant bit. A plane is row-major:
//     each row occupies PlaneRowBytes(cols) bytes, rows follow each other with no gap;
//   - inside a row, columns are packed in groups of 256 (32 bytes). Column c lives in byte
//     (c / 256) * 32 + (c % 32), bit (c % 256) / 32 of the row (see PlaneBitPosition). Bits of
//     padding columns (c >= cols) are zero. This order lets SIMD backends extract 32 codes at
//     once with byte-wise shifts;
//   - LUT_b: per row, 2^b fp16 centroids; the weight is LUT_b[row][code_b].
// A plane is reached through a page list: page i of a plane holds rows
// [i * tile_rows, min(rows, (i + 1) * tile_rows)) of that plane contiguously, so pages of a
// paged pool can be handed to the kernels as they are.
//
// All kernels take non-owning views, never allocate and never spawn threads: scratch memory
// comes from the caller (ApGemmWorkspaceBytes / MoeWorkspaceBytes), and callers split rows
// across threads with ApGemmRows. Accumulation is fp32 (the scalar reference uses fp64).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/plane_layout.h"
#include "common/status.h"
#include "kernels/backend.h"

namespace pw::anyprec {

// The plane layout (widths, packing groups, PlaneRowBytes, PlaneBitPosition, LutEntries) is the
// store's format too: common/plane_layout.h.
inline constexpr int kMaxTokens = 64;  // tokens per ApGemm call
inline constexpr size_t kWorkspaceAlign = 64;

// Non-owning view of one linear block. Valid for a width b when rows, cols >= 1,
// tile_rows >= 1, planes[0..b-1] are set (each an array of ceil(rows / tile_rows) page
// pointers, each page tile_rows * PlaneRowBytes(cols) bytes, the last possibly shorter) and
// luts[b] is set ([rows][2^b] fp16 bit patterns). Other entries may be null.
struct BlockView {
  int rows = 0;
  int cols = 0;
  int tile_rows = 0;
  const uint8_t* const* planes[kNumPlanes] = {};
  const uint16_t* luts[kMaxBits + 1] = {};

  int NumPages() const { return tile_rows > 0 ? (rows + tile_rows - 1) / tile_rows : 0; }
  // Start of row r of plane p (r in [0, rows)).
  const uint8_t* PlaneRow(int p, int r) const {
    return planes[p][r / tile_rows] + static_cast<size_t>(r % tile_rows) * PlaneRowBytes(cols);
  }
};

// Checks that `view` can run at width `bits` (shapes, non-null planes/LUT). Cheap.
Status ValidateView(const BlockView& view, int bits);
// The same checks without the fp16 LUT (the fast path reads an int8 LUT instead, q8.h).
Status ValidatePlanes(const BlockView& view, int bits);

// Backends are the kernels layer's (kernels/backend.h; kernels::BackendName spells them). The
// any-precision kernels run on the CPU ones only (kCuda is never available here). kAmx: the
// integer fast path's AVX-512 backend with AMX-INT8 tiles for 8-12 tokens and more (q8.h); the
// exact path has no AMX backend (BackendAvailable(kAmx) is false).
// True when this binary has the exact path's backend and the CPU running it supports it.
bool BackendAvailable(kernels::Backend backend);
// The fastest available backend (AVX-512 > AVX2 > scalar); PW_ANYPREC_BACKEND=scalar|avx2|avx512
// in the environment overrides it (when available).
kernels::Backend BestBackend();

// Caller-provided scratch memory: `data` aligned to kWorkspaceAlign, `bytes` long.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// Scratch bytes ApGemm/ApGemmRows need for `tokens` tokens of a block with `cols` columns
// (the maximum over backends, so one workspace serves any backend).
size_t ApGemmWorkspaceBytes(int cols, int tokens);

// y[t, r] = sum_c LUT_b[r][code_b(r, c)] * x[t, c] for t < tokens, r < rows.
// x: [tokens, cols] fp32 row-major; y: [tokens, rows] fp32 row-major (overwritten);
// tokens in [1, kMaxTokens]; bits in [3, 8]. Reads planes 0..bits-1 and LUT_bits only.
Status ApGemm(kernels::Backend backend, const BlockView& view, int bits, const float* x, int tokens,
              float* y, Workspace ws);
// As ApGemm, but writes only rows [row_begin, row_end) of y (other entries untouched), so
// callers can split a block's rows across threads (each with its own workspace).
Status ApGemmRows(kernels::Backend backend, const BlockView& view, int bits, const float* x,
                  int tokens, float* y, int row_begin, int row_end, Workspace ws);

// ---- Fused mixed-precision MoE ------------------------------------------------------------

// One expert of an MoE layer. gate_up: rows = 2 * ffn (gate rows, then up rows), cols = hidden;
// down: rows = hidden, cols = ffn. Each block runs at its own committed width (3..8).
struct MoeExpert {
  BlockView gate_up;
  int gate_up_bits = 0;
  BlockView down;
  int down_bits = 0;
};

// One routed (token, expert) pair with its gate weight.
struct MoeAssignment {
  int32_t token = 0;   // in [0, tokens)
  int32_t expert = 0;  // index into the experts array
  float weight = 0.f;  // gate weight the expert's output is scaled by
};

// Scratch bytes MoeForward needs for this call's sizes.
size_t MoeWorkspaceBytes(int tokens, int num_assignments, int num_experts, int hidden, int ffn);

// out[t, :] = sum over assignments a with a.token == t of
//   a.weight * down_e( SiLU(gate_e(x[t])) * up_e(x[t]) ),  e = a.expert,
// tokens grouped per expert (chunks of at most kMaxTokens), fp32 accumulation.
// x, out: [tokens, hidden] fp32 (out overwritten; rows with no assignment become 0).
// experts[e] is read only if some assignment names e; every expert used must have
// gate_up {2*ffn x hidden} and down {hidden x ffn}. Bad indices or shapes return an error
// before anything is written.
Status MoeForward(kernels::Backend backend, const MoeExpert* experts, int num_experts,
                  const MoeAssignment* assignments, int num_assignments, const float* x, int tokens,
                  int hidden, int ffn, float* out, Workspace ws);

}  // namespace pw::anyprec

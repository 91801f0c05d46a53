#include "engine/experts/q8_experts.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/experts/expert_activation.h"
#include "engine/experts/expert_tiles.h"
#include "engine/experts/expert_workspace.h"
#include "engine/ops/linear.h"

namespace pw::anyprec {
namespace {

// Quantized rows in one workspace slot: q [n][Q8ActStride(cols)], scales, offsets.
struct ActRows {
  int cols = 0;
  int8_t* q = nullptr;
  float* scales = nullptr;
  float* offsets = nullptr;
  int8_t* Q(int row) const { return q + static_cast<size_t>(row) * Q8ActStride(cols); }
  float* Scales(int row) const { return scales + static_cast<size_t>(row) * Q8ActGroups(cols); }
  // The Q8Acts view of rows [row, row + n).
  Q8Acts View(int row, int n) const { return Q8Acts{n, cols, Q(row), Scales(row), offsets + row}; }
};

size_t Align(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

ActRows TakeActRows(engine::ExpertWorkspace& ws, int slot, size_t n, int cols) {
  const size_t qb = Align(n * Q8ActStride(cols)), sb = Align(n * Q8ActGroups(cols) * sizeof(float));
  auto* base = static_cast<uint8_t*>(ws.Bytes(slot, qb + sb + std::max<size_t>(n, 1) * sizeof(float)));
  return ActRows{cols, reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + qb),
                 reinterpret_cast<float*>(base + qb + sb)};
}

// Tiles of one block per group, tokens in chunks of kMaxTokens.
void ListTiles(const engine::ExpertLayerCall& call, int32_t rows, std::vector<engine::ExpertTile>* tiles) {
  tiles->clear();
  for (size_t g = 0; g < call.groups.size(); ++g) {
    const engine::ExpertGroup& e = call.groups[g];
    for (int32_t c = e.begin; c < e.end; c += kMaxTokens) {
      engine::AppendExpertTiles(static_cast<int32_t>(g), c, std::min<int32_t>(kMaxTokens, e.end - c), rows, 0, tiles);
    }
  }
}

std::string Where(const engine::ExpertLayerCall& call, int32_t group, const char* proj) {
  return "fast-path experts (layer " + std::to_string(call.layer) + ", expert " +
         std::to_string(call.groups[group].expert) + ", " + proj + ")";
}

}  // namespace

Status RunQ8Experts(kernels::Backend backend, const engine::ExpertLayerCall& call,
                    const Q8ExpertBlock* gate_up, const Q8ExpertBlock* down,
                    const kernels::DenseKernels& k) {
  const size_t T = call.num_tokens, H = call.hidden, I = call.ffn, R = call.rows.size();
  const int h = static_cast<int>(H), f = static_cast<int>(I);
  PW_ASSIGN_OR_RETURN(const engine::ExpertActivationFn act_fn,
                      engine::ExpertActivationOp(call.activation, k));
  engine::ExpertWorkspace& ws = *call.workspace;
  // 1. The layer input, quantized once; each row's values gathered per group.
  const ActRows xq = TakeActRows(ws, 0, T, h);
  PW_RETURN_IF_ERROR(QuantizeActRows(call.x, H, static_cast<int>(T), h, xq.q, xq.scales, xq.offsets)
                         .WithContext("fast-path experts (layer " + std::to_string(call.layer) + ")"));
  const ActRows gq = TakeActRows(ws, 1, R, h);
  {
    const size_t stride = static_cast<size_t>(Q8ActStride(h)), groups = static_cast<size_t>(Q8ActGroups(h));
    for (const engine::ExpertGroup& e : call.groups) {
      for (int32_t r = e.begin; r < e.end; ++r) {
        const int32_t t = call.rows[r].token;
        std::memcpy(gq.Q(r), xq.Q(t), stride);
        std::memcpy(gq.Scales(r), xq.Scales(t), groups * sizeof(float));
        gq.offsets[r] = xq.offsets[t];
      }
    }
  }
  // 2. Every group's gate_up rows in one dispatch.
  float* gu = ws.Array<float>(2, R * 2 * I);
  std::vector<engine::ExpertTile>& tiles = ws.tiles();
  ListTiles(call, static_cast<int32_t>(2 * I), &tiles);
  PW_RETURN_IF_ERROR(engine::RunExpertTiles(call.pool, tiles, H, engine::kMinParallelMacs, [&](const engine::ExpertTile& t) {
    const Q8ExpertBlock& b = gate_up[t.group];
    Status s = ApGemmQ8Rows(backend, b.view, b.bits, b.lut, gq.View(t.row0, t.tokens),
                            gu + static_cast<size_t>(t.row0) * 2 * I, 2 * I, t.r0, t.r1);
    return s.ok() ? s : s.WithContext(Where(call, t.group, "gate_up"));
  }, engine::TileCalls::kCoalesce));
  // 3. h = act(gate, up) for every row, quantized at once.
  float* act = ws.Array<float>(3, R * I);
  const ActRows aq = TakeActRows(ws, 4, R, f);
  for (size_t g = 0; g < call.groups.size(); ++g) {
    const engine::ExpertGroup& e = call.groups[g];
    for (size_t r = static_cast<size_t>(e.begin); r < static_cast<size_t>(e.end); ++r) {
      if (call.gate_up_bias != nullptr) {
        k.axpy(1.f, call.gate_up_bias + static_cast<size_t>(e.expert) * 2 * I, 2 * I,
               gu + r * 2 * I);
      }
      act_fn(gu + r * 2 * I, gu + r * 2 * I + I, I, act + r * I);
    }
    PW_RETURN_IF_ERROR(QuantizeActRows(act + static_cast<size_t>(e.begin) * I, I, e.size(), f, aq.Q(e.begin),
                                       aq.Scales(e.begin), aq.offsets + e.begin)
                           .WithContext(Where(call, static_cast<int32_t>(g), "down input")));
  }
  // 4. Every group's down rows in one dispatch.
  float* ye = ws.Array<float>(5, R * H);
  ListTiles(call, static_cast<int32_t>(H), &tiles);
  PW_RETURN_IF_ERROR(engine::RunExpertTiles(call.pool, tiles, I, engine::kMinParallelMacs, [&](const engine::ExpertTile& t) {
    const Q8ExpertBlock& b = down[t.group];
    Status s = ApGemmQ8Rows(backend, b.view, b.bits, b.lut, aq.View(t.row0, t.tokens),
                            ye + static_cast<size_t>(t.row0) * H, H, t.r0, t.r1);
    return s.ok() ? s : s.WithContext(Where(call, t.group, "down"));
  }, engine::TileCalls::kCoalesce));
  // 5. The weighted sum (the expert's down bias first), in group order.
  for (const engine::ExpertGroup& e : call.groups) {
    for (size_t r = static_cast<size_t>(e.begin); r < static_cast<size_t>(e.end); ++r) {
      if (call.down_bias != nullptr) {
        k.axpy(1.f, call.down_bias + static_cast<size_t>(e.expert) * H, H, ye + r * H);
      }
      k.axpy(call.rows[r].weight, ye + r * H, H, call.out + static_cast<size_t>(call.rows[r].token) * H);
    }
  }
  return Status::Ok();
}

}  // namespace pw::anyprec

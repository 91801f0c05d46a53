#include "engine/experts/apw_expert_provider.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <queue>
#include <random>
#include <sstream>

#include "kernels/cpu/thread_pool.h"
#include "engine/experts/q8_experts.h"
#include "engine/experts/row_split.h"
#include "engine/experts/run_experts_by_block.h"
#include "common/formats/checkpoint_experts.h"
#include "engine/experts/q8_block.h"
#include "engine/experts/kernel_path.h"
#include "common/formats/width_map.h"

namespace pw::anyprec {

// ---- ApwExpertProvider --------------------------------------------------------------------

void ApwExpertProvider::AlignedFree::operator()(void* p) const { std::free(p); }

ApwExpertProvider::ApwExpertProvider(std::shared_ptr<const apw::ApwStore> store,
                                     const engine::Model& model, WidthMap widths)
    : store_(std::move(store)),
      bf16_(model),
      widths_(std::move(widths)),
      backend_(BestBackend()),
      q8_backend_(BestQ8Backend()) {}

Result<std::unique_ptr<ApwExpertProvider>> ApwExpertProvider::Create(
    std::shared_ptr<const apw::ApwStore> store, const engine::Model& model, WidthMap widths,
    bool check_hash, int tile_rows) {
  const ModelConfig& c = model.config();
  const apw::StoreInfo& info = store->info();
  const std::string where = store->path() + ": ";
  if (static_cast<int64_t>(info.num_layers) != c.num_layers ||
      static_cast<int64_t>(info.num_experts) != c.num_experts ||
      static_cast<int64_t>(info.hidden) != c.hidden_size ||
      static_cast<int64_t>(info.ffn) != c.moe_intermediate_size) {
    return InvalidArgument(where + "store shapes (layers " + std::to_string(info.num_layers) +
                           ", experts " + std::to_string(info.num_experts) + ", hidden " +
                           std::to_string(info.hidden) + ", ffn " + std::to_string(info.ffn) +
                           ") do not match the model");
  }
  std::vector<uint32_t> moe_layers;
  for (size_t l = 0; l < model.layers().size(); ++l) {
    if (model.layers()[l].is_moe) moe_layers.push_back(static_cast<uint32_t>(l));
  }
  PW_RETURN_IF_ERROR(apw::CheckStoreLayers(info, moe_layers, where));
  if (widths.num_layers() != static_cast<int>(info.num_layers) ||
      widths.num_experts() != static_cast<int>(info.num_experts)) {
    return InvalidArgument(where + "width map does not match the store's layers/experts");
  }
  if (check_hash) {
    PW_ASSIGN_OR_RETURN(uint64_t hash, ModelHash(model.dir()));
    if (hash != info.model_hash) {
      return InvalidArgument(where + "store was made for another model (hash mismatch with " +
                             model.dir() + ")");
    }
  }
  if (tile_rows < 1) return InvalidArgument("tile_rows must be >= 1");
  std::unique_ptr<ApwExpertProvider> p(new ApwExpertProvider(store, model, std::move(widths)));
  // pages_ in ExpertBlockIndex order over the model's layers; a dense layer's slots stay empty
  // (the engine never asks a provider for its experts).
  for (uint32_t l = 0; l < info.num_layers; ++l) {
    for (uint32_t e = 0; e < info.num_experts; ++e) {
      for (auto kind : {apw::BlockKind::kGateUp, apw::BlockKind::kDown}) {
        if (!info.HasLayer(l)) {
          p->pages_.push_back(nullptr);
          continue;
        }
        const apw::BlockData* b = store->Find(l, e, kind);
        if (b == nullptr) return Internal(where + "store lacks a block it validated");
        p->pages_.push_back(std::make_unique<PageLists>(b->planes, b->luts, static_cast<int>(b->rows),
                                                        static_cast<int>(b->cols), tile_rows));
      }
    }
  }
  p->q8_luts_.resize(p->pages_.size() * (kMaxBits + 1));
  return p;
}

int ApwExpertProvider::Bits(int layer, int expert, engine::ExpertProj proj) const {
  return widths_.Get(layer, expert, proj);
}

uint8_t* ApwExpertProvider::Workspace(int i, size_t bytes) {
  if (static_cast<int>(ws_.size()) <= i) {
    ws_.resize(i + 1);
    ws_bytes_.resize(i + 1, 0);
  }
  if (ws_bytes_[i] < bytes) {
    ws_[i].reset(static_cast<uint8_t*>(std::aligned_alloc(kWorkspaceAlign, (bytes + 63) / 64 * 64)));
    ws_bytes_[i] = bytes;
  }
  return ws_[i].get();
}

Status ApwExpertProvider::RunExperts(const engine::ExpertLayerCall& call) {
  const int layer = call.layer;
  bool any_bf16 = false, all_bf16 = true;
  for (const engine::ExpertGroup& g : call.groups) {
    if (layer < 0 || layer >= widths_.num_layers() || g.expert < 0 || g.expert >= widths_.num_experts()) {
      return InvalidArgument("apw experts: no expert " + std::to_string(g.expert) + " in layer " +
                             std::to_string(layer));
    }
    if (!store_->info().HasLayer(static_cast<uint32_t>(layer))) {
      return InvalidArgument("apw experts: layer " + std::to_string(layer) + " is dense (no blocks in the store)");
    }
    for (auto proj : {engine::ExpertProj::kGateUp, engine::ExpertProj::kDown}) {
      const bool bf16 = widths_.Get(layer, g.expert, proj) == kBf16Bits;
      any_bf16 |= bf16;
      all_bf16 &= bf16;
    }
  }
  if (all_bf16) return bf16_.RunExperts(call);
  if (path_ == KernelPath::kFast && !any_bf16) {
    // The whole layer on the fast path: x quantized once, one dispatch per projection.
    const size_t n = call.groups.size();
    auto* gate_up = call.workspace->Array<Q8ExpertBlock>(engine::ExpertWorkspace::kRunnerSlots, n);
    auto* down = call.workspace->Array<Q8ExpertBlock>(engine::ExpertWorkspace::kRunnerSlots + 1, n);
    for (size_t g = 0; g < n; ++g) {
      for (auto proj : {engine::ExpertProj::kGateUp, engine::ExpertProj::kDown}) {
        const int expert = call.groups[g].expert;
        const size_t block = ExpertBlockIndex(layer, expert, proj, widths_.num_experts());
        const int bits = widths_.Get(layer, expert, proj);
        auto lut = FastLut(block, bits);
        if (!lut.ok()) {
          return lut.status().WithContext("apw experts (layer " + std::to_string(layer) + ", expert " +
                                          std::to_string(expert) + ", " + ExpertProjName(proj) + ")");
        }
        (proj == engine::ExpertProj::kGateUp ? gate_up : down)[g] = {pages_[block]->view(), *lut, bits};
      }
    }
    return RunQ8Experts(q8_backend_, call, gate_up, down, cpu::Kernels());
  }
  // The reference path (or a layer mixing bf16 and any-precision blocks): block by block.
  return engine::RunExpertsByBlock(call, cpu::Kernels(),
                                   [&](int expert, engine::ExpertProj proj, const float* x, size_t ldx,
                                       size_t tokens, float* y, size_t ldy) {
                                     return ApplyBlock(layer, expert, proj, x, ldx, tokens, y, ldy, call.pool);
                                   });
}

Status ApwExpertProvider::ApplyBlock(int layer, int expert, engine::ExpertProj proj, const float* x,
                                     size_t ldx, size_t num_tokens, float* y, size_t ldy,
                                     cpu::ThreadPool* pool) {
  const int bits = widths_.Get(layer, expert, proj);
  if (bits == kBf16Bits) return bf16_.ApplyBlock(layer, expert, proj, x, ldx, num_tokens, y, ldy, pool);
  const size_t block = ExpertBlockIndex(layer, expert, proj, widths_.num_experts());
  const BlockView& view = pages_[block]->view();
  const int rows = view.rows, cols = view.cols;
  const int threads = pool != nullptr ? std::max(1, pool->num_threads()) : 1;
  for (size_t t0 = 0; t0 < num_tokens; t0 += kMaxTokens) {
    const int n = static_cast<int>(std::min<size_t>(kMaxTokens, num_tokens - t0));
    if (path_ == KernelPath::kFast) {
      auto lut = FastLut(block, bits);
      Status s = lut.ok() ? ApplyQ8Block(q8_backend_, view, bits, *lut, x + t0 * ldx, ldx,
                                         static_cast<size_t>(n), y + t0 * ldy, ldy, pool, &acts_)
                          : lut.status();
      if (!s.ok()) {
        return s.WithContext("apw experts (layer " + std::to_string(layer) + ", expert " +
                             std::to_string(expert) + ", " + ExpertProjName(proj) + ")");
      }
      continue;
    }
    const float* xin = x + t0 * ldx;
    if (ldx != static_cast<size_t>(cols)) {
      xbuf_.resize(static_cast<size_t>(n) * cols);
      for (int t = 0; t < n; ++t) std::memcpy(xbuf_.data() + static_cast<size_t>(t) * cols, xin + t * ldx, cols * sizeof(float));
      xin = xbuf_.data();
    }
    const bool direct = ldy == static_cast<size_t>(rows);
    if (!direct) ybuf_.resize(static_cast<size_t>(n) * rows);
    float* yout = direct ? y + t0 * ldy : ybuf_.data();
    const size_t ws_bytes = ApGemmWorkspaceBytes(cols, n);
    const int pieces = Pieces(rows, cols, n, threads);
    for (int i = 0; i < pieces; ++i) Workspace(i, ws_bytes);
    Status s = SplitRows(pool, rows, pieces, [&](int i, int r0, int r1) {
      return ApGemmRows(backend_, view, bits, xin, n, yout, r0, r1, {ws_[i].get(), ws_bytes});
    });
    if (!s.ok()) {
      return s.WithContext("apw experts (layer " + std::to_string(layer) + ", expert " +
                           std::to_string(expert) + ", " + ExpertProjName(proj) + ")");
    }
    if (!direct) {
      for (int t = 0; t < n; ++t) {
        std::memcpy(y + (t0 + t) * ldy, ybuf_.data() + static_cast<size_t>(t) * rows, rows * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

Result<Q8Lut> ApwExpertProvider::FastLut(size_t i, int bits) {
  std::unique_ptr<Q8LutCache>& slot = q8_luts_[i * (kMaxBits + 1) + bits];
  if (!slot) {
    const BlockView& v = pages_[i]->view();
    auto c = std::make_unique<Q8LutCache>();
    c->values.resize(Q8LutValueBytes(v.rows, bits));
    c->scales.resize(v.rows);
    PW_RETURN_IF_ERROR(QuantizeLut(v.luts[bits], v.rows, bits, c->values.data(), c->scales.data()));
    slot = std::move(c);
  }
  return Q8Lut{slot->values.data(), slot->scales.data()};
}

}  // namespace pw::anyprec

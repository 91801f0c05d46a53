#include "quant/apw_provider.h"

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
#include "quant/q8_experts.h"
#include "services/engine/run_experts_by_block.h"

namespace pw::anyprec {
namespace {

bool ValidBits(int bits) { return (bits >= kMinBits && bits <= kMaxBits) || bits == kBf16Bits; }

const char* ProjName(engine::ExpertProj proj) {
  return proj == engine::ExpertProj::kGateUp ? "gate_up" : "down";
}

// Splits rows only when each thread gets a meaningful share of the block.
int Pieces(int rows, int cols, int tokens, int threads) {
  return (static_cast<int64_t>(rows) * cols * tokens >= (1 << 16)) ? std::min(threads, rows) : 1;
}

// Runs piece(i, r0, r1) for `pieces` contiguous shares of [0, rows), on the pool when there is
// more than one, and returns the first error.
template <typename F>
Status SplitRows(cpu::ThreadPool* pool, int rows, int pieces, F&& piece) {
  std::vector<Status> status(pieces);
  auto run = [&](int i) {
    const int r0 = static_cast<int>(static_cast<int64_t>(rows) * i / pieces);
    const int r1 = static_cast<int>(static_cast<int64_t>(rows) * (i + 1) / pieces);
    status[i] = piece(i, r0, r1);
  };
  if (pieces > 1) {
    pool->ParallelFor(static_cast<size_t>(pieces), 1, 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) run(static_cast<int>(i));
    });
  } else {
    run(0);
  }
  for (const Status& s : status) PW_RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace

const char* KernelPathName(KernelPath path) { return path == KernelPath::kExact ? "exact" : "fast"; }

Result<KernelPath> ParseKernelPath(const std::string& name) {
  if (name == "exact") return KernelPath::kExact;
  if (name == "fast") return KernelPath::kFast;
  return InvalidArgument("kernel path '" + name + "' is not 'exact' or 'fast'");
}

Result<uint64_t> ModelHash(const engine::Model& model) {
  const std::string path = model.dir() + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(path + ": cannot read (needed for the model hash)");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string config = ss.str();
  apw::Fnv1a64 h;
  h.Update(config.data(), config.size());
  for (const engine::LayerWeights& layer : model.layers()) {
    for (const engine::MlpWeights& e : layer.experts) {
      for (const engine::Bf16Matrix* m : {&e.gate, &e.up, &e.down}) {
        h.Update(m->data, static_cast<size_t>(m->rows * m->cols) * 2);
      }
    }
  }
  return h.digest();
}

// ---- WidthMap -----------------------------------------------------------------------------

Result<WidthMap> WidthMap::Uniform(int bits, int num_layers, int num_experts) {
  if (!ValidBits(bits)) {
    return InvalidArgument("width " + std::to_string(bits) + " is not 3..8 or 16");
  }
  if (num_layers < 1 || num_experts < 1) return InvalidArgument("width map: empty model");
  WidthMap m;
  m.num_layers_ = num_layers;
  m.num_experts_ = num_experts;
  m.bits_.assign(static_cast<size_t>(num_layers) * num_experts * 2, static_cast<uint8_t>(bits));
  return m;
}

Result<WidthMap> WidthMap::FromFile(const std::string& path, int num_layers, int num_experts) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": cannot parse width map: " + e.what());
  }
  try {
    if (!root.IsMap() || !root["default_bits"]) {
      return InvalidArgument(path + ": width map needs a top-level 'default_bits'");
    }
    auto uniform = Uniform(root["default_bits"].as<int>(), num_layers, num_experts);
    if (!uniform.ok()) return uniform.status().WithContext(path + ": default_bits");
    WidthMap m = std::move(uniform).value();
    const YAML::Node blocks = root["blocks"];
    if (blocks && !blocks.IsSequence()) return InvalidArgument(path + ": 'blocks' must be a list");
    for (size_t i = 0; blocks && i < blocks.size(); ++i) {
      const YAML::Node b = blocks[i];
      const std::string where = path + ": blocks[" + std::to_string(i) + "]";
      if (!b.IsMap() || !b["layer"] || !b["expert"] || !b["proj"] || !b["bits"]) {
        return InvalidArgument(where + ": needs layer, expert, proj and bits");
      }
      const int layer = b["layer"].as<int>(), expert = b["expert"].as<int>(), bits = b["bits"].as<int>();
      const std::string proj = b["proj"].as<std::string>();
      if (layer < 0 || layer >= num_layers || expert < 0 || expert >= num_experts) {
        return InvalidArgument(where + ": (layer " + std::to_string(layer) + ", expert " +
                               std::to_string(expert) + ") not in the model");
      }
      if (proj != "gate_up" && proj != "down") return InvalidArgument(where + ": proj must be gate_up or down");
      Status s = m.Set(layer, expert, proj == "down" ? engine::ExpertProj::kDown : engine::ExpertProj::kGateUp, bits);
      if (!s.ok()) return s.WithContext(where);
    }
    return m;
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": bad width map value: " + e.what());
  }
}

Status WidthMap::Save(const std::string& path) const {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return IoError(path + ": cannot write width map");
  f << "{\"default_bits\": " << static_cast<int>(bits_.empty() ? 4 : bits_[0]) << ",\n \"blocks\": [";
  bool first = true;
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      for (auto proj : {engine::ExpertProj::kGateUp, engine::ExpertProj::kDown}) {
        f << (first ? "\n  " : ",\n  ") << "{\"layer\": " << l << ", \"expert\": " << e
          << ", \"proj\": \"" << ProjName(proj) << "\", \"bits\": " << Get(l, e, proj) << "}";
        first = false;
      }
    }
  }
  f << "\n]}\n";
  return f ? Status::Ok() : IoError(path + ": write failed");
}

Status WidthMap::Set(int layer, int expert, engine::ExpertProj proj, int bits) {
  if (layer < 0 || layer >= num_layers_ || expert < 0 || expert >= num_experts_) {
    return InvalidArgument("width map: no block (layer " + std::to_string(layer) + ", expert " +
                           std::to_string(expert) + ")");
  }
  if (!ValidBits(bits)) return InvalidArgument("width " + std::to_string(bits) + " is not 3..8 or 16");
  bits_[Index(layer, expert, proj)] = static_cast<uint8_t>(bits);
  return Status::Ok();
}

double WidthMap::AverageBits(const apw::StoreInfo& info) const {
  double num = 0, den = 0;
  const double gu = 2.0 * info.ffn * info.hidden, dn = 1.0 * info.hidden * info.ffn;
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      num += gu * Get(l, e, engine::ExpertProj::kGateUp) + dn * Get(l, e, engine::ExpertProj::kDown);
      den += gu + dn;
    }
  }
  return den > 0 ? num / den : 0;
}

// ---- Planned maps -------------------------------------------------------------------------

namespace {

struct PlanState {
  WidthMap map;
  double total_weights = 0;  // sum rows*cols
  double bit_weights = 0;    // sum rows*cols*bits
  double Average() const { return bit_weights / total_weights; }
};

Result<PlanState> StartPlan(const apw::ApwStore& store, double avg_bits, int min_bits) {
  const apw::StoreInfo& info = store.info();
  if (min_bits < kMinBits || min_bits > kMaxBits || !(avg_bits >= min_bits)) {
    return InvalidArgument("average width " + std::to_string(avg_bits) + " below the minimum " +
                           std::to_string(min_bits) + " bits");
  }
  PW_ASSIGN_OR_RETURN(WidthMap m, WidthMap::Uniform(kMaxBits, static_cast<int>(info.num_layers),
                                                    static_cast<int>(info.num_experts)));
  PlanState st{std::move(m), 0, 0};
  for (int i = 0; i < store.num_blocks(); ++i) {
    const apw::BlockData& b = store.block(i);
    st.total_weights += static_cast<double>(b.rows) * b.cols;
  }
  st.bit_weights = st.total_weights * kMaxBits;
  return st;
}

engine::ExpertProj ProjOf(apw::BlockKind k) {
  return k == apw::BlockKind::kGateUp ? engine::ExpertProj::kGateUp : engine::ExpertProj::kDown;
}

}  // namespace

Result<WidthMap> PlanDamageRanked(const apw::ApwStore& store, double avg_bits, int min_bits) {
  PW_ASSIGN_OR_RETURN(PlanState st, StartPlan(store, avg_bits, min_bits));
  // Routing frequency of each block within its layer and projection (times E: the same order).
  const std::vector<double> share = apw::CalibrationShares(store);
  auto cost = [&](int i, int bits) {
    const apw::BlockData& b = store.block(i);
    return share[i] * (b.damage[bits - 1] - b.damage[bits]) / (static_cast<double>(b.rows) * b.cols / 8);
  };
  // (cost, block) min-heap; ties broken by block index for determinism.
  using Item = std::pair<double, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (int i = 0; i < store.num_blocks(); ++i) {
    if (kMaxBits > min_bits) heap.emplace(cost(i, kMaxBits), i);
  }
  while (st.Average() > avg_bits + 1e-12 && !heap.empty()) {
    const int i = heap.top().second;
    heap.pop();
    const apw::BlockData& b = store.block(i);
    const engine::ExpertProj proj = ProjOf(b.kind);
    const int bits = st.map.Get(static_cast<int>(b.layer), static_cast<int>(b.expert), proj);
    PW_RETURN_IF_ERROR(st.map.Set(static_cast<int>(b.layer), static_cast<int>(b.expert), proj, bits - 1));
    st.bit_weights -= static_cast<double>(b.rows) * b.cols;
    if (bits - 1 > min_bits) heap.emplace(cost(i, bits - 1), i);
  }
  return std::move(st.map);
}

Result<WidthMap> PlanRandom(const apw::ApwStore& store, double avg_bits, uint64_t seed, int min_bits) {
  PW_ASSIGN_OR_RETURN(PlanState st, StartPlan(store, avg_bits, min_bits));
  std::mt19937_64 rng(seed);
  std::vector<int> open(store.num_blocks());
  std::iota(open.begin(), open.end(), 0);
  while (st.Average() > avg_bits + 1e-12 && !open.empty()) {
    const size_t k = rng() % open.size();
    const apw::BlockData& b = store.block(open[k]);
    const engine::ExpertProj proj = ProjOf(b.kind);
    const int bits = st.map.Get(static_cast<int>(b.layer), static_cast<int>(b.expert), proj);
    PW_RETURN_IF_ERROR(st.map.Set(static_cast<int>(b.layer), static_cast<int>(b.expert), proj, bits - 1));
    st.bit_weights -= static_cast<double>(b.rows) * b.cols;
    if (bits - 1 <= min_bits) {
      open[k] = open.back();
      open.pop_back();
    }
  }
  return std::move(st.map);
}

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
  if (widths.num_layers() != static_cast<int>(info.num_layers) ||
      widths.num_experts() != static_cast<int>(info.num_experts)) {
    return InvalidArgument(where + "width map does not match the store's layers/experts");
  }
  if (check_hash) {
    PW_ASSIGN_OR_RETURN(uint64_t hash, ModelHash(model));
    if (hash != info.model_hash) {
      return InvalidArgument(where + "store was made for another model (hash mismatch with " +
                             model.dir() + ")");
    }
  }
  if (tile_rows < 1) return InvalidArgument("tile_rows must be >= 1");
  std::unique_ptr<ApwExpertProvider> p(new ApwExpertProvider(store, model, std::move(widths)));
  for (uint32_t l = 0; l < info.num_layers; ++l) {
    for (uint32_t e = 0; e < info.num_experts; ++e) {
      for (auto kind : {apw::BlockKind::kGateUp, apw::BlockKind::kDown}) {
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
                                          std::to_string(expert) + ", " + ProjName(proj) + ")");
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
                             std::to_string(expert) + ", " + ProjName(proj) + ")");
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
                           std::to_string(expert) + ", " + ProjName(proj) + ")");
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

void Q8ActsScratch::Free::operator()(void* p) const { std::free(p); }

uint8_t* Q8ActsScratch::Get(size_t bytes) {
  if (bytes_ < bytes) {
    buf_.reset(static_cast<uint8_t*>(std::aligned_alloc(kWorkspaceAlign, (bytes + 63) / 64 * 64)));
    bytes_ = bytes;
  }
  return buf_.get();
}

Status ApplyQ8Block(Backend backend, const BlockView& view, int bits, const Q8Lut& lut,
                    const float* x, size_t ldx, size_t num_tokens, float* y, size_t ldy,
                    cpu::ThreadPool* pool, Q8ActsScratch* acts) {
  const int threads = pool != nullptr ? std::max(1, pool->num_threads()) : 1;
  for (size_t t0 = 0; t0 < num_tokens; t0 += kMaxTokens) {
    const int n = static_cast<int>(std::min<size_t>(kMaxTokens, num_tokens - t0));
    const size_t need = Q8ActsBytes(n, view.cols);
    Q8Acts a;
    PW_RETURN_IF_ERROR(QuantizeActs(x + t0 * ldx, ldx, n, view.cols, {acts->Get(need), need}, &a));
    float* yt = y + t0 * ldy;
    PW_RETURN_IF_ERROR(SplitRows(pool, view.rows, Pieces(view.rows, view.cols, n, threads),
                                 [&](int, int r0, int r1) {
                                   return ApGemmQ8Rows(backend, view, bits, lut, a, yt, ldy, r0, r1);
                                 }));
  }
  return Status::Ok();
}

// ---- CalibrationRecorder ------------------------------------------------------------------

CalibrationRecorder::CalibrationRecorder(const engine::Bf16ExpertProvider* inner, int num_layers,
                                         int num_experts, int hidden, int ffn)
    : inner_(inner), num_layers_(num_layers), num_experts_(num_experts) {
  sums_.resize(static_cast<size_t>(num_layers) * num_experts * 2);
  tokens_.assign(sums_.size(), 0);
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i].assign(i % 2 == 0 ? hidden : ffn, 0.0);
}

Status CalibrationRecorder::RunExperts(const engine::ExpertLayerCall& call) {
  const int layer = call.layer;
  for (const engine::ExpertGroup& g : call.groups) {
    if (layer < 0 || layer >= num_layers_ || g.expert < 0 || g.expert >= num_experts_) {
      return InvalidArgument("calibration: no expert " + std::to_string(g.expert) + " in layer " +
                             std::to_string(layer));
    }
  }
  // Block by block: the down block's input (silu(gate) * up) is recorded too.
  return engine::RunExpertsByBlock(
      call, cpu::Kernels(),
      [&](int expert, engine::ExpertProj proj, const float* x, size_t ldx, size_t num_tokens, float* y,
          size_t ldy) {
        const size_t i = Index(layer, expert, proj);
        std::vector<double>& s = sums_[i];
        for (size_t t = 0; t < num_tokens; ++t) {
          const float* row = x + t * ldx;
          for (size_t j = 0; j < s.size(); ++j) s[j] += static_cast<double>(row[j]) * row[j];
        }
        tokens_[i] += num_tokens;
        return inner_->ApplyBlock(layer, expert, proj, x, ldx, num_tokens, y, ldy, call.pool);
      });
}

}  // namespace pw::anyprec

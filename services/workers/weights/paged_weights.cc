#include "services/workers/weights/paged_weights.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "kernels/anyprec/pack.h"
#include "engine/experts/q8_experts.h"
#include "engine/experts/expert_workspace.h"
#include "services/proto/weight_kind.h"

namespace pw::workers {
namespace {

constexpr uint64_t kRetryMs = 1000;  // a block whose transfer failed waits this long

uint64_t NowMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

using memory::PartFill;
using memory::WeightPageTable;

// The engine's view of the table: each block at its committed width from its pages, a layer
// at a time on the fast path (anyprec::RunQ8Experts).
class PagedWeights::Provider final : public engine::ExpertWeightProvider {
 public:
  explicit Provider(PagedWeights* w) : w_(w), backend_(anyprec::BestQ8Backend()) {}

  Status RunExperts(const engine::ExpertLayerCall& call) override {
    const WeightPageTable& t = *w_->table_;
    const size_t n = call.groups.size();
    auto* gate_up = call.workspace->Array<anyprec::Q8ExpertBlock>(engine::ExpertWorkspace::kRunnerSlots, n);
    auto* down = call.workspace->Array<anyprec::Q8ExpertBlock>(engine::ExpertWorkspace::kRunnerSlots + 1, n);
    misses_used_ = 0;
    for (size_t g = 0; g < n; ++g) {
      const int layer = call.layer, expert = call.groups[g].expert;
      if (layer < 0 || layer >= t.num_layers() || expert < 0 || expert >= t.num_experts()) {
        return InvalidArgument("paged experts: no expert " + std::to_string(expert) + " in layer " +
                               std::to_string(layer));
      }
      PW_RETURN_IF_ERROR(Resolve(t.Index(layer, expert, engine::ExpertProj::kGateUp), &gate_up[g]));
      PW_RETURN_IF_ERROR(Resolve(t.Index(layer, expert, engine::ExpertProj::kDown), &down[g]));
    }
    return anyprec::RunQ8Experts(backend_, call, gate_up, down, cpu::Kernels());
  }

  int Bits(int layer, int expert, engine::ExpertProj proj) const override {
    const WeightPageTable& t = *w_->table_;
    return t.entry(t.Index(layer, expert, proj)).committed;
  }

 private:
  // A block fetched for one layer call: its planes, LUT and the page pointers of its view.
  struct Miss {
    std::vector<uint8_t> planes;
    std::vector<int8_t> lut;
    std::vector<float> scales;
    const uint8_t* ptrs[anyprec::kNumPlanes] = {};
  };

  // Block i as the fast path reads it: at its committed width from its pages, or fetched.
  Status Resolve(size_t i, anyprec::Q8ExpertBlock* out) {
    const WeightPageTable& t = *w_->table_;
    const WeightPageTable::Entry& e = t.entry(i);
    anyprec::BlockView v;
    v.rows = e.rows;
    v.cols = e.cols;
    anyprec::Q8Lut lut;
    int bits = e.committed;
    if (bits == 0) return FetchMissing(i, out);
    v.tile_rows = t.PlaneTileRows(e.cols);
    for (int p = 0; p < bits; ++p) v.planes[p] = e.planes[p].addrs.data();
    lut.pages = reinterpret_cast<const int8_t* const*>(e.lut.addrs.data());
    lut.tile_rows = t.LutTileRows(bits);
    lut.scales = e.lut_scales.data();
    *out = {v, lut, bits};
    return Status::Ok();
  }

  // A block that is not resident: fetched into scratch for this call only.
  Status FetchMissing(size_t i, anyprec::Q8ExpertBlock* out) {
    if (misses_used_ == misses_.size()) misses_.push_back(std::make_unique<Miss>());
    Miss& m = *misses_[misses_used_++];
    const WeightPageTable::Entry& e = w_->table_->entry(i);
    const int bits = e.desired > 0 ? e.desired : anyprec::kMinBits;
    const size_t row_bytes = anyprec::PlaneRowBytes(e.cols);
    m.planes.resize(static_cast<size_t>(bits) * e.rows * row_bytes);
    m.lut.resize(static_cast<size_t>(e.rows) << bits);
    m.scales.resize(static_cast<size_t>(e.rows));
    for (int p = 0; p < bits; ++p) {
      uint8_t* plane = m.planes.data() + static_cast<size_t>(p) * e.rows * row_bytes;
      m.ptrs[p] = plane;
      MovePart part;
      part.rows = e.rows;
      part.tile_rows = e.rows;
      part.row_bytes = row_bytes;
      const PartRef& ref = w_->Ref(i, p);
      part.remote_offset = ref.offset;
      part.bytes = ref.bytes;
      part.checksum = ref.checksum;
      part.pages = {plane};
      PW_RETURN_IF_ERROR(w_->mover_->FetchNow(part).WithContext("synchronous fetch of block " + std::to_string(i)));
      w_->stats_.sync_fetch_bytes += ref.bytes;
    }
    MovePart part;
    part.lut = true;
    part.lut_bits = bits;
    part.rows = e.rows;
    part.tile_rows = e.rows;
    part.row_bytes = static_cast<size_t>(1) << bits;
    const PartRef& ref = w_->Ref(i, anyprec::kNumPlanes + bits - anyprec::kMinBits);
    part.remote_offset = ref.offset;
    part.bytes = ref.bytes;
    part.checksum = ref.checksum;
    part.pages = {reinterpret_cast<uint8_t*>(m.lut.data())};
    part.scales = m.scales.data();
    PW_RETURN_IF_ERROR(w_->mover_->FetchNow(part).WithContext("synchronous fetch of block " + std::to_string(i)));
    w_->stats_.sync_fetch_bytes += ref.bytes;
    w_->stats_.sync_fetches++;
    anyprec::BlockView v;
    v.rows = e.rows;
    v.cols = e.cols;
    v.tile_rows = e.rows;
    for (int p = 0; p < bits; ++p) v.planes[p] = &m.ptrs[p];
    anyprec::Q8Lut lut;
    lut.values = m.lut.data();
    lut.scales = m.scales.data();
    *out = {v, lut, bits};
    return Status::Ok();
  }

  PagedWeights* w_;
  kernels::Backend backend_;
  std::vector<std::unique_ptr<Miss>> misses_;  // fetched blocks of the current call
  size_t misses_used_ = 0;
};

PagedWeights::~PagedWeights() {
  // Join the movers' threads before the table (and the pages they may write) go.
  mover_.reset();
  retiring_.clear();
}

engine::ExpertWeightProvider* PagedWeights::provider() { return provider_.get(); }

Result<std::unique_ptr<PagedWeights>> PagedWeights::Create(memory::PagePool* pool,
                                                           const ModelConfig& config,
                                                           transport::ucx::Worker& ucx,
                                                           wire::WeightManifest::Reader manifest,
                                                           PagedWeightsOptions options) {
  if (!manifest.getOk()) return Unavailable("broker: " + proto::ToString(manifest.getError()));
  if (!manifest.getAnyPrecision()) return InvalidArgument("weight manifest is not an any-precision store");
  std::unique_ptr<PagedWeights> w(new PagedWeights());
  w->pool_ = pool;
  w->options_ = options;
  const int L = static_cast<int>(config.num_layers);
  const int E = static_cast<int>(config.num_experts);
  // Blocks are numbered by the model's layers (the store's too): a dense layer's slots stay
  // empty (width 0), never loaded, raised or fetched.
  w->block_layers_.assign(static_cast<size_t>(L), false);
  for (int l = 0; l < L; ++l) w->block_layers_[static_cast<size_t>(l)] = config.IsMoeLayer(l);
  PW_ASSIGN_OR_RETURN(w->table_, WeightPageTable::Create(pool, L, E,
                                                         static_cast<int>(config.hidden_size),
                                                         static_cast<int>(config.moe_intermediate_size)));
  PW_RETURN_IF_ERROR(w->ReadManifest(manifest, &w->parts_));
  w->retry_at_ms_.assign(static_cast<size_t>(w->table_->num_blocks()), 0);
  PW_RETURN_IF_ERROR(w->StartMover(ucx, manifest));
  w->provider_ = std::make_unique<Provider>(w.get());
  return w;
}

Status PagedWeights::ReadManifest(wire::WeightManifest::Reader manifest, std::vector<PartRef>* parts) const {
  if (!manifest.getOk()) return Unavailable("broker: " + proto::ToString(manifest.getError()));
  if (!manifest.getAnyPrecision()) return InvalidArgument("weight manifest is not an any-precision store");
  PW_RETURN_IF_ERROR(proto::CheckPartChecksumKind(manifest.getChecksumKind()));
  const int moe_layers = table_->num_layers(), E = table_->num_experts();
  const uint64_t region_bytes = manifest.getMemory().getBytes();
  parts->assign(static_cast<size_t>(table_->num_blocks()) * kPartsPerBlock, PartRef{});
  for (auto p : manifest.getParts()) {
    const int layer = static_cast<int>(p.getLayer()), expert = static_cast<int>(p.getExpert());
    if (layer >= moe_layers || expert >= E) {
      return Corrupt("weight manifest: part of block (layer " + std::to_string(layer) + ", expert " +
                     std::to_string(expert) + ") outside this model");
    }
    if (!block_layers_[static_cast<size_t>(layer)]) {
      return Corrupt("weight manifest: part of block (layer " + std::to_string(layer) + ", expert " +
                     std::to_string(expert) + ") in a dense layer of this model");
    }
    const ExpertProj proj = p.getKind() == wire::WeightKind::GATE_UP ? ExpertProj::kGateUp : ExpertProj::kDown;
    const size_t i = table_->Index(layer, expert, proj);
    const auto& e = table_->entry(i);
    int slot;
    uint64_t expect;
    if (p.getPlane() >= 0 && p.getPlane() < anyprec::kNumPlanes) {
      slot = p.getPlane();
      expect = anyprec::PlaneBytes(e.rows, e.cols);
    } else if (p.getPlane() == -1 && p.getLutBits() >= anyprec::kMinBits && p.getLutBits() <= anyprec::kMaxBits) {
      slot = anyprec::kNumPlanes + p.getLutBits() - anyprec::kMinBits;
      expect = (static_cast<uint64_t>(e.rows) << p.getLutBits()) * 2;
    } else {
      return Corrupt("weight manifest: part with plane " + std::to_string(p.getPlane()) + " / LUT bits " +
                     std::to_string(p.getLutBits()));
    }
    const std::string name = "block (layer " + std::to_string(layer) + ", expert " + std::to_string(expert) +
                             ", " + (proj == ExpertProj::kGateUp ? "gate_up" : "down") + ")";
    PartRef& ref = (*parts)[i * kPartsPerBlock + static_cast<size_t>(slot)];
    if (ref.present) return Corrupt("weight manifest: " + name + " part " + std::to_string(slot) + " listed twice");
    if (p.getBytes() != expect) {
      return Corrupt("weight manifest: " + name + " part " + std::to_string(slot) + " has " +
                     std::to_string(p.getBytes()) + " bytes, this model needs " + std::to_string(expect));
    }
    if (p.getOffset() > region_bytes || p.getBytes() > region_bytes - p.getOffset()) {
      return Corrupt("weight manifest: " + name + " part " + std::to_string(slot) + " lies outside the store region");
    }
    ref = {p.getOffset(), p.getBytes(), p.getChecksum(), true};
  }
  for (size_t k = 0; k < parts->size(); ++k) {
    if (!(*parts)[k].present && HasBlock(k / kPartsPerBlock)) {
      return Corrupt("weight manifest: block " + std::to_string(k / kPartsPerBlock) + " lacks part " +
                     std::to_string(k % kPartsPerBlock));
    }
  }
  return Status::Ok();
}

Status PagedWeights::StartMover(transport::ucx::Worker& ucx, wire::WeightManifest::Reader manifest) {
  const auto mem = manifest.getMemory();
  PlaneMover::Options mo;
  mo.max_bytes_per_s = options_.max_bytes_per_s;
  mo.timeout_ms = options_.timeout_ms;
  mo.yield_to_fetches = options_.pacing == MoverPacing::kFetches || options_.pacing == MoverPacing::kSteps;
  mo.checksum_kind = manifest.getChecksumKind();
  PW_ASSIGN_OR_RETURN(mover_, PlaneMover::Start(ucx, proto::ToBytes(mem.getWorkerAddress()),
                                                proto::ToBytes(mem.getRkey()), mem.getBaseAddr(),
                                                mem.getBytes(), mo));
  store_hash_ = manifest.getStoreHash();
  return Status::Ok();
}

Status PagedWeights::Rebind(transport::ucx::Worker& ucx, wire::WeightManifest::Reader manifest) {
  std::vector<PartRef> parts;
  PW_RETURN_IF_ERROR(ReadManifest(manifest, &parts));
  if (manifest.getStoreHash() != store_hash_) {
    return InvalidArgument("the restarted broker serves another store (model hash differs)");
  }
  // The old mover's transfers fail (their blocks keep their widths); Poll takes their results
  // back and lets it go once it holds none, so this never waits.
  mover_->Cancel("broker restarted");
  retiring_.push_back(std::move(mover_));
  parts_ = std::move(parts);
  return StartMover(ucx, manifest);
}

MoveJob PagedWeights::MakeJob(size_t block, int target, const std::vector<PartFill>& fills) {
  MoveJob job;
  job.id = next_job_++;
  job.block = block;
  job.target = target;
  const auto& e = table_->entry(block);
  for (const PartFill& f : fills) {
    MovePart part;
    part.lut = f.plane < 0;
    part.lut_bits = f.lut_bits;
    part.rows = e.rows;
    part.tile_rows = f.tile_rows;
    part.row_bytes = f.row_bytes;
    const PartRef& ref = Ref(block, part.lut ? anyprec::kNumPlanes + f.lut_bits - anyprec::kMinBits : f.plane);
    part.remote_offset = ref.offset;
    part.bytes = ref.bytes;
    part.checksum = ref.checksum;
    part.pages = f.pages;
    if (part.lut) part.scales = const_cast<float*>(e.next_lut_scales.data());
    job.parts.push_back(std::move(part));
  }
  return job;
}

Status PagedWeights::StartTransition(size_t block, int target) {
  PW_ASSIGN_OR_RETURN(auto fills, table_->Begin(block, target));
  if (fills.empty()) {
    // Lowering to 0: nothing to fetch; committed at this boundary.
    return Status::Ok();
  }
  mover_->Submit(MakeJob(block, target, fills));
  ++in_flight_;
  return Status::Ok();
}

Status PagedWeights::SetDesired(const std::vector<std::pair<size_t, int>>& changes) {
  for (const auto& [i, bits] : changes) {
    if (i >= static_cast<size_t>(table_->num_blocks())) return InvalidArgument("no block " + std::to_string(i));
    if (bits != 0 && (bits < anyprec::kMinBits || bits > anyprec::kMaxBits)) {
      return InvalidArgument("block " + std::to_string(i) + ": width " + std::to_string(bits) + " is not 0 or 3..8");
    }
    if (bits != 0 && !HasBlock(i)) {
      return InvalidArgument("block " + std::to_string(i) + " is in a dense layer (no expert blocks)");
    }
  }
  for (const auto& [i, bits] : changes) table_->set_desired(i, bits);
  return Status::Ok();
}

void PagedWeights::Finish(MoveResult& r, std::vector<WidthChange>* committed) {
  --in_flight_;
  const int from = table_->entry(r.block).committed;
  if (r.status.ok()) {
    const int held_before = table_->pages_held();
    Status st = table_->Commit(r.block);
    PW_CHECK(st.ok());
    stats_.transitions_committed++;
    stats_.bytes_raised += r.bytes;
    if (r.target > from) {
      stats_.planes_raised += static_cast<uint64_t>(r.target - from);
      raise_seconds_.push_back(static_cast<double>(r.elapsed_us) * 1e-6);
    }
    if (r.target < from) stats_.planes_lowered += static_cast<uint64_t>(from - r.target);
    if (table_->pages_held() < held_before) {
      stats_.bytes_released += static_cast<uint64_t>(held_before - table_->pages_held()) * pool_->page_bytes();
    }
    if (committed != nullptr) committed->push_back({r.block, from, r.target});
  } else {
    PW_LOG(WARNING) << "block " << r.block << ": " << from << " -> " << r.target
                    << " bits failed: " << r.status.ToString() << "; stays at " << from
                    << ", retried in " << kRetryMs << " ms";
    Status st = table_->Abort(r.block);
    PW_CHECK(st.ok());
    stats_.transitions_failed++;
    retry_at_ms_[r.block] = NowMs() + kRetryMs;
  }
}

std::vector<WidthChange> PagedWeights::Poll(int reserve_pages) {
  std::vector<WidthChange> committed;
  for (MoveResult& r : mover_->TakeDone()) Finish(r, &committed);
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    for (MoveResult& r : (*it)->TakeDone()) Finish(r, &committed);
    if ((*it)->outstanding() != 0 || it->get() == held_) {
      ++it;
      continue;
    }
    const auto p = (*it)->pacing();
    retired_pacing_.waits += p.waits;
    retired_pacing_.wait_us += p.wait_us;
    it = retiring_.erase(it);
  }
  // Blocks lowered to 0 commit at once; others start while pages and slots allow.
  const size_t n = static_cast<size_t>(table_->num_blocks());
  for (size_t k = 0; k < n && in_flight_ < static_cast<size_t>(options_.max_in_flight); ++k) {
    const size_t i = (scan_from_ + k) % n;
    const auto& e = table_->entry(i);
    if (e.target >= 0 || e.desired == e.committed) continue;
    if (retry_at_ms_[i] != 0) {
      if (NowMs() < retry_at_ms_[i]) continue;
      retry_at_ms_[i] = 0;
    }
    const int from = e.committed, to = e.desired;
    // A raise takes pages only above the KV reserve. A lowering's new LUT may take reserved
    // pages: it gives back more at its commit, and it is what makes room for that KV (behind
    // the reserve it would wait for the KV it frees pages for).
    if (to > from && pool_->num_free() - table_->PagesToBegin(i, to) < reserve_pages) continue;
    Status st = StartTransition(i, to);
    if (!st.ok()) {
      if (st.code() != StatusCode::kResourceExhausted) {
        PW_LOG(WARNING) << "block " << i << ": " << st.ToString();
      }
      continue;  // waits for free pages
    }
    if (to == 0) {
      const int held_before = table_->pages_held();
      PW_CHECK(table_->Commit(i).ok());
      stats_.transitions_committed++;
      stats_.planes_lowered += static_cast<uint64_t>(from);
      stats_.bytes_released += static_cast<uint64_t>(held_before - table_->pages_held()) * pool_->page_bytes();
      committed.push_back({i, from, 0});
    }
  }
  scan_from_ = (scan_from_ + 1) % std::max<size_t>(1, n);
  return committed;
}

int PagedWeights::pending() const {
  int n = 0;
  for (int i = 0; i < table_->num_blocks(); ++i) {
    const auto& e = table_->entry(static_cast<size_t>(i));
    if (e.desired != e.committed) ++n;
  }
  return n;
}

void PagedWeights::CancelTransfers(const std::string& why) { mover_->Cancel(why); }

Status PagedWeights::LoadAll(int bits, int timeout_ms, const std::function<void()>& while_waiting) {
  std::vector<std::pair<size_t, int>> all;
  for (int i = 0; i < table_->num_blocks(); ++i) {
    if (HasBlock(static_cast<size_t>(i))) all.emplace_back(static_cast<size_t>(i), bits);
  }
  PW_RETURN_IF_ERROR(SetDesired(all));
  const auto t0 = std::chrono::steady_clock::now();
  while (pending() > 0) {
    const uint64_t failed = stats_.transitions_failed;
    (void)Poll();
    if (stats_.transitions_failed > failed) return Unavailable("loading experts: a transfer failed (see the log)");
    if (in_flight_ == 0 && pending() > 0) {
      return ResourceExhausted("loading experts at " + std::to_string(bits) + " bits: the page pool (" +
                               std::to_string(pool_->num_pages()) + " pages of " +
                               std::to_string(pool_->page_bytes()) + " bytes) is too small");
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(timeout_ms)) {
      return DeadlineExceeded("loading experts: not done after " + std::to_string(timeout_ms) + " ms");
    }
    if (while_waiting) while_waiting();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::Ok();
}

Status PagedWeights::FetchBlockNow(size_t block, int bits, uint64_t* bytes, FetchTimes* times) {
  const auto t0 = std::chrono::steady_clock::now();
  FetchTimes mine;
  struct AddTable {  // whatever the mover did not spend is table work
    FetchTimes* times;
    const FetchTimes& mine;
    std::chrono::steady_clock::time_point t0;
    ~AddTable() {
      if (times == nullptr) return;
      const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      times->get_s += mine.get_s;
      times->check_s += mine.check_s;
      times->table_s += std::max(0.0, all - mine.get_s - mine.check_s);
    }
  } add_table{times, mine, t0};
  PW_ASSIGN_OR_RETURN(auto fills, table_->FetchBegin(block, bits));
  MoveJob job = MakeJob(block, bits, fills);
  Status st = mover_->FetchNow(job.parts, &mine);
  if (!st.ok()) {
    PW_CHECK(table_->FetchAbort(block).ok());
    return st.WithContext("fetching block " + std::to_string(block));
  }
  for (const MovePart& part : job.parts) {
    if (bytes != nullptr) *bytes += part.bytes;
  }
  return table_->FetchCommit(block);
}

void PagedWeights::BeginStep() {
  table_->BeginStep();
  if (options_.pacing == MoverPacing::kSteps && held_ == nullptr && mover_) {
    held_ = mover_.get();
    held_->Hold();
  }
}

void PagedWeights::EndStep() {
  // After a rebind during the step the held mover is retiring: it lives until Poll lets it go.
  if (held_ != nullptr) held_->Release();
  held_ = nullptr;
  table_->EndStep();
}

PlaneMover::PacingStats PagedWeights::pacing() const {
  PlaneMover::PacingStats s = retired_pacing_;
  auto add = [&s](const PlaneMover& m) {
    const auto p = m.pacing();
    s.waits += p.waits;
    s.wait_us += p.wait_us;
  };
  if (mover_) add(*mover_);
  for (const auto& m : retiring_) add(*m);
  return s;
}

Result<MoverPacing> ParseMoverPacing(const std::string& name) {
  if (name == "free") return MoverPacing::kFree;
  if (name == "fetches") return MoverPacing::kFetches;
  if (name == "steps") return MoverPacing::kSteps;
  if (name == "auto") return MoverPacing::kAuto;
  return InvalidArgument("weight pacing '" + name + "' is not free, fetches, steps or auto");
}

const char* MoverPacingName(MoverPacing p) {
  switch (p) {
    case MoverPacing::kFree: return "free";
    case MoverPacing::kFetches: return "fetches";
    case MoverPacing::kSteps: return "steps";
    case MoverPacing::kAuto: return "auto";
  }
  return "?";
}

Result<std::vector<std::pair<size_t, int>>> PagedWeights::PlanChanges(wire::Plan::Reader plan) const {
  std::vector<std::pair<size_t, int>> changes;
  const WeightPageTable& t = *table_;
  for (auto e : plan.getChanges()) {
    const int l = static_cast<int>(e.getLayer()), x = static_cast<int>(e.getExpert());
    if (l >= t.num_layers() || x >= t.num_experts()) {
      return InvalidArgument("block (layer " + std::to_string(l) + ", expert " + std::to_string(x) +
                             ") outside this model");
    }
    changes.emplace_back(t.Index(l, x, proto::FromWire(e.getKind())), e.getDesiredBits());
  }
  return changes;
}

}  // namespace pw::workers

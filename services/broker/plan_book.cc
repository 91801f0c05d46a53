#include "services/broker/plan_book.h"

#include <cstdio>
#include <sstream>

namespace pw::broker {

PlanBook::PlanBook(int num_layers, int num_experts, int initial_bits, int min_bits, int max_bits,
                   std::vector<bool> block_layers)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      min_bits_(min_bits),
      max_bits_(max_bits),
      block_layers_(std::move(block_layers)),
      desired_(static_cast<size_t>(num_layers) * num_experts * 2, initial_bits) {
  for (int l = 0; l < num_layers_; ++l) {
    if (HasBlocks(l)) continue;
    for (int e = 0; e < num_experts_; ++e) {
      for (int p = 0; p < 2; ++p) desired_[Index(l, e, static_cast<ExpertProj>(p))] = 0;
    }
  }
}

Status PlanBook::CheckBits(int bits, bool allow_zero) const {
  if ((bits == 0 && allow_zero) || (bits >= min_bits_ && bits <= max_bits_)) return Status::Ok();
  return InvalidArgument("bits " + std::to_string(bits) + " outside " + std::to_string(min_bits_) +
                         ".." + std::to_string(max_bits_) + (allow_zero ? " (or 0)" : ""));
}

Status PlanBook::CheckBlock(int layer, int expert) const {
  if (layer < 0 || layer >= num_layers_) {
    return InvalidArgument("layer " + std::to_string(layer) + " outside 0.." +
                           std::to_string(num_layers_ - 1));
  }
  if (expert < 0 || expert >= num_experts_) {
    return InvalidArgument("expert " + std::to_string(expert) + " outside 0.." +
                           std::to_string(num_experts_ - 1));
  }
  return Status::Ok();
}

Status PlanBook::CheckSelection(const Selection& s, bool allow_zero) const {
  PW_RETURN_IF_ERROR(CheckBits(s.bits, allow_zero));
  if (s.layer != -1) PW_RETURN_IF_ERROR(CheckBlock(s.layer, 0));
  if (s.layer != -1 && !HasBlocks(s.layer)) {
    return InvalidArgument("layer " + std::to_string(s.layer) + " is dense: it has no expert blocks");
  }
  if (s.expert != -1) PW_RETURN_IF_ERROR(CheckBlock(0, s.expert));
  if (s.expert != -1 && s.layer == -1) return InvalidArgument("an expert needs its layer");
  if (s.proj < -1 || s.proj > 1) {
    return InvalidArgument("proj " + std::to_string(s.proj) + " is not gate_up (0) or down (1)");
  }
  return Status::Ok();
}

void PlanBook::Select(const Selection& s) {
  for (int l = 0; l < num_layers_; ++l) {
    if ((s.layer != -1 && l != s.layer) || !HasBlocks(l)) continue;
    for (int e = 0; e < num_experts_; ++e) {
      if (s.expert != -1 && e != s.expert) continue;
      for (int p = 0; p < 2; ++p) {
        if (s.proj != -1 && p != s.proj) continue;
        desired_[Index(l, e, static_cast<ExpertProj>(p))] = s.bits;
      }
    }
  }
}

Result<uint64_t> PlanBook::SetBits(int bits, int layer, int expert, int proj) {
  const Selection s{bits, layer, expert, proj};
  PW_RETURN_IF_ERROR(CheckSelection(s, false));
  Select(s);
  changed_here_ = true;
  return ++epoch_;
}

Result<uint64_t> PlanBook::Apply(const std::vector<Selection>& selections) {
  if (selections.empty()) return InvalidArgument("the plan changes nothing");
  for (size_t k = 0; k < selections.size(); ++k) {
    Status st = CheckSelection(selections[k], true);
    if (!st.ok()) return st.WithContext("entry " + std::to_string(k));
  }
  for (const Selection& s : selections) Select(s);
  changed_here_ = true;
  return ++epoch_;
}

PlanBook::MirrorState PlanBook::NewMirror() const {
  MirrorState m;
  m.committed.assign(desired_.size(), 0);
  m.told.assign(desired_.size(), -1);
  return m;
}

Status PlanBook::Mirror(const std::string& worker, const std::vector<BlockWidth>& committed) {
  MirrorState m = NewMirror();
  for (const BlockWidth& c : committed) {
    PW_RETURN_IF_ERROR(CheckBlock(c.layer, c.expert));
    if (HasBlocks(c.layer)) m.committed[Index(c.layer, c.expert, c.proj)] = c.bits;
  }
  auto it = mirrors_.find(worker);
  if (it != mirrors_.end()) m.pool = it->second.pool;
  mirrors_[worker] = std::move(m);
  return Status::Ok();
}

Status PlanBook::Acked(const std::string& worker, uint64_t epoch,
                       const std::vector<BlockWidth>& committed, bool complete) {
  auto it = mirrors_.find(worker);
  if (it == mirrors_.end()) {
    // A worker that registered before it had loaded its experts: its first ack lists them all.
    it = mirrors_.emplace(worker, NewMirror()).first;
  }
  for (const BlockWidth& c : committed) {
    PW_RETURN_IF_ERROR(CheckBlock(c.layer, c.expert));
    if (HasBlocks(c.layer)) it->second.committed[Index(c.layer, c.expert, c.proj)] = c.bits;
  }
  if (complete && epoch > it->second.pool.epoch) it->second.pool.epoch = epoch;
  return Status::Ok();
}

void PlanBook::Telemetry(const std::string& worker, const WorkerPool& pool) {
  auto it = mirrors_.find(worker);
  if (it != mirrors_.end()) {
    const uint64_t epoch = it->second.pool.epoch;
    it->second.pool = pool;
    if (epoch > it->second.pool.epoch) it->second.pool.epoch = epoch;
  }
}

void PlanBook::Residency(const std::string& worker, uint32_t capacity) {
  auto it = mirrors_.find(worker);
  if (it != mirrors_.end()) it->second.pool.residency_capacity = capacity;
}

void PlanBook::Sent(const std::string& worker, const std::vector<BlockWidth>& changes) {
  auto it = mirrors_.find(worker);
  if (it == mirrors_.end()) return;
  for (const BlockWidth& c : changes) {
    if (CheckBlock(c.layer, c.expert).ok()) it->second.told[Index(c.layer, c.expert, c.proj)] = c.bits;
  }
}

void PlanBook::Forget(const std::string& worker) { mirrors_.erase(worker); }

void PlanBook::AdoptDesired(const std::vector<BlockWidth>& desired) {
  if (changed_here_) return;
  for (const BlockWidth& c : desired) {
    if (CheckBlock(c.layer, c.expert).ok() && HasBlocks(c.layer) && (c.bits == 0 || CheckBits(c.bits, false).ok())) {
      desired_[Index(c.layer, c.expert, c.proj)] = c.bits;
    }
  }
}

std::vector<BlockWidth> PlanBook::PendingFor(const std::string& worker) const {
  std::vector<BlockWidth> out;
  auto it = mirrors_.find(worker);
  if (it == mirrors_.end()) return out;
  const MirrorState& m = it->second;
  const bool budget = m.pool.residency_capacity != 0;
  for (int l = 0; l < num_layers_; ++l) {
    if (!HasBlocks(l)) continue;
    for (int e = 0; e < num_experts_; ++e) {
      for (int p = 0; p < 2; ++p) {
        const size_t i = Index(l, e, static_cast<ExpertProj>(p));
        const bool pending = budget && m.committed[i] == 0 ? m.told[i] != desired_[i]
                                                           : m.committed[i] != desired_[i];
        if (pending) {
          out.push_back({l, e, static_cast<ExpertProj>(p), desired_[i]});
        }
      }
    }
  }
  return out;
}

std::string PlanBook::Show(bool blocks, int layer) const {
  std::ostringstream o;
  o << "plan epoch " << epoch_ << "; " << mirrors_.size() << " decode worker(s)\n";
  for (const auto& [id, m] : mirrors_) {
    const WorkerPool& p = m.pool;
    // A worker whose acknowledged table equals the desired one has committed the latest epoch
    // (also when that epoch asked it for nothing).
    const size_t pending = PendingFor(id).size();
    o << "worker " << id << ": pool pages of " << p.page_bytes << " B: kv " << p.kv << ", weights "
      << p.weights << ", free " << p.free << "; committed epoch " << (pending == 0 ? epoch_ : p.epoch)
      << ", " << pending << " change(s) pending";
    if (p.residency_capacity != 0) o << "; residency budget " << p.residency_capacity << " experts per layer";
    o << "\n";
  }
  auto histogram_row = [&](const char* what, int l, const std::vector<int>& bits) {
    int count[17] = {};
    double sum = 0;
    for (int e = 0; e < num_experts_; ++e) {
      for (int p = 0; p < 2; ++p) {
        const int b = bits[Index(l, e, static_cast<ExpertProj>(p))];
        count[b]++;
        sum += b;
      }
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%-5d %-10s", l, what);
    o << buf;
    for (int b : {0, 3, 4, 5, 6, 7, 8, 16}) {
      std::snprintf(buf, sizeof buf, " %5d", count[b]);
      o << buf;
    }
    std::snprintf(buf, sizeof buf, "  %6.2f\n", sum / (2.0 * num_experts_));
    o << buf;
  };
  o << "layer which          0     3     4     5     6     7     8    16  mean bits\n";
  for (int l = 0; l < num_layers_; ++l) {
    if (layer != -1 && l != layer) continue;
    if (!HasBlocks(l)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%-5d dense (no expert blocks)\n", l);
      o << buf;
      continue;
    }
    histogram_row("desired", l, desired_);
    for (const auto& [id, m] : mirrors_) histogram_row(id.c_str(), l, m.committed);
  }
  if (blocks) {
    o << "layer expert proj     desired";
    for (const auto& [id, m] : mirrors_) o << " " << id;
    o << "\n";
    for (int l = 0; l < num_layers_; ++l) {
      if ((layer != -1 && l != layer) || !HasBlocks(l)) continue;
      for (int e = 0; e < num_experts_; ++e) {
        for (int p = 0; p < 2; ++p) {
          const size_t i = Index(l, e, static_cast<ExpertProj>(p));
          char buf[96];
          std::snprintf(buf, sizeof buf, "%-5d %-6d %-8s %7d", l, e, ExpertProjName(static_cast<ExpertProj>(p)),
                        desired_[i]);
          o << buf;
          for (const auto& [id, m] : mirrors_) o << " " << m.committed[i];
          o << "\n";
        }
      }
    }
  }
  return o.str();
}

}  // namespace pw::broker

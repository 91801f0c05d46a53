// PlanBook: the broker's record of expert widths (DESIGN.md 4).
//
//   - desired width d_i of every expert block i (ExpertBlockIndex order; one map for the
//     model, since every decode worker of the node serves the same experts), changed by hand
//     (pw-ctl: SetBits, Apply) and, later, by the planner; every change bumps the plan epoch;
//   - a mirror of each decode worker's committed widths q_i, taken from its registration (so a
//     restarted broker rebuilds it) and moved by its PlanAcks; and its pool figures from
//     Telemetry;
//   - PendingFor(worker): the changes that worker still has to make (d_i != its q_i), which
//     the broker sends as one Plan.
//   - a dense layer (no routed experts: GLM-4.5's first layers) keeps its layer number and has
//     no blocks: never selected, never pending, shown as dense; entries a worker reports for it
//     are ignored.
//   - a worker with a residency budget (its Register/Telemetry residencyCapacity) holds only
//     the experts its miss policy keeps resident; its other blocks sit at q_i = 0 by design and
//     take the plan's width only when they become resident. For such a worker a block at 0 is
//     pending only until the worker has been sent its current desired width once (Sent); a
//     resident block (q_i != 0) is pending while q_i != d_i, as for any worker.
// Pure bookkeeping: no I/O, no clock; the broker calls it from its loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/expert_block.h"
#include "common/status.h"

namespace pw::broker {

struct BlockWidth {
  int layer = 0, expert = 0;
  ExpertProj proj = ExpertProj::kGateUp;
  int bits = 0;
};

struct WorkerPool {
  uint64_t page_bytes = 0;
  uint32_t kv = 0, weights = 0, free = 0;
  uint64_t epoch = 0;  // last epoch the worker fully committed
  uint32_t pending = 0;
  uint32_t kv_demand = 0;    // KV pages still needed and not held (services/workers/decode/kv_demand.h)
  uint32_t residency_capacity = 0;  // experts per layer under a residency budget; 0: none
  std::vector<float> mass;   // routing-mass EMA [layers * experts]; empty: none reported
  std::vector<float> prompt_features;  // routing histogram of recent prefills [layers * experts]; empty: none
};

class PlanBook {
 public:
  // `min_bits`..`max_bits`: the widths hand changes may ask for (3..8 for an .apw store, 16
  // only for a bf16 store); 0 (drop the block) is allowed by Apply only.
  // `block_layers[l]`: whether layer l has expert blocks (empty: every layer).
  PlanBook(int num_layers, int num_experts, int initial_bits, int min_bits, int max_bits,
           std::vector<bool> block_layers = {});

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  uint64_t epoch() const { return epoch_; }
  int desired(size_t i) const { return desired_[i]; }
  // Whether `layer` has expert blocks (false for a dense layer).
  bool HasBlocks(int layer) const {
    return block_layers_.empty() || (layer >= 0 && static_cast<size_t>(layer) < block_layers_.size() &&
                                     block_layers_[static_cast<size_t>(layer)]);
  }

  // A set of blocks and the width they go to: `layer` (-1: all), `expert` (-1: all; needs a
  // layer) and `proj` (-1: both, 0 gate_up, 1 down).
  struct Selection {
    int bits = 0;
    int layer = -1, expert = -1, proj = -1;
  };
  // Every block of the selection to `bits` (min..max bits). Errors name the bad value; nothing
  // changes on error. Returns the new epoch.
  Result<uint64_t> SetBits(int bits, int layer, int expert, int proj);
  // Several selections as one plan (bits may also be 0: drop the blocks), each validated
  // first: all or nothing.
  Result<uint64_t> Apply(const std::vector<Selection>& selections);

  // The worker's committed table (from Register); replaces what was mirrored. A table of
  // another size is refused.
  Status Mirror(const std::string& worker, const std::vector<BlockWidth>& committed);
  // Committed changes from a PlanAck.
  Status Acked(const std::string& worker, uint64_t epoch, const std::vector<BlockWidth>& committed,
               bool complete);
  void Telemetry(const std::string& worker, const WorkerPool& pool);
  // The worker's residency budget from its registration (experts per layer; 0: none).
  void Residency(const std::string& worker, uint32_t capacity);
  // `changes` (from PendingFor) reached the worker in a Plan: their widths are what it was told.
  void Sent(const std::string& worker, const std::vector<BlockWidth>& changes);
  void Forget(const std::string& worker);
  bool knows(const std::string& worker) const { return mirrors_.count(worker) != 0; }
  // The worker's mirrored committed widths (ExpertBlockIndex order), or null.
  const std::vector<int>* Committed(const std::string& worker) const {
    auto it = mirrors_.find(worker);
    return it == mirrors_.end() ? nullptr : &it->second.committed;
  }
  // The worker's pool figures from its last Telemetry (page_bytes 0 before any), or null.
  const WorkerPool* Pool(const std::string& worker) const {
    auto it = mirrors_.find(worker);
    return it == mirrors_.end() ? nullptr : &it->second.pool;
  }
  // Blocks whose desired width differs from the worker's mirrored committed width (with a
  // residency budget, non-resident blocks only until told; see the file comment).
  std::vector<BlockWidth> PendingFor(const std::string& worker) const;
  // When a broker restarts, the workers' desired widths are the best record of what was asked:
  // adopt a registering worker's desired widths while no change was made here.
  void AdoptDesired(const std::vector<BlockWidth>& desired);

  // pw-ctl show: per layer a histogram of committed widths (first worker, and the desired
  // map), pool pages by tenant per worker; every block when `blocks`.
  std::string Show(bool blocks, int layer) const;

 private:
  size_t Index(int layer, int expert, ExpertProj proj) const {
    return ExpertBlockIndex(layer, expert, proj, num_experts_);
  }
  Status CheckBits(int bits, bool allow_zero) const;
  Status CheckSelection(const Selection& s, bool allow_zero) const;
  void Select(const Selection& s);
  Status CheckBlock(int layer, int expert) const;

  int num_layers_, num_experts_;
  int min_bits_, max_bits_;
  std::vector<bool> block_layers_;
  uint64_t epoch_ = 0;
  bool changed_here_ = false;
  std::vector<int> desired_;
  struct MirrorState {
    std::vector<int> committed;
    std::vector<int> told;  // width last sent in a Plan, -1: none since the mirror began
    WorkerPool pool;
  };
  MirrorState NewMirror() const;
  std::map<std::string, MirrorState> mirrors_;
};

}  // namespace pw::broker

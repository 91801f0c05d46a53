// Runner: the seam between the device-independent scheduler and a device that executes one
// batch (batch.h). The engine's Step composes a batch (engine/scheduler/), hands it to its
// Runner, and samples from the logits it returns; how the forward pass runs (threads and
// dense kernels on the CPU, streams and kernels on a GPU) is the runner's alone.
//
// Implementations: CpuRunner (cpu_runner.h). A CUDA runner implements the same interface over
// the same block tables.
#pragma once

#include <vector>

#include "common/status.h"
#include "engine/experts/moe.h"
#include "engine/runner/batch.h"
#include "engine/runner/block_times.h"

namespace pw::engine {

class Runner {
 public:
  virtual ~Runner() = default;

  // Runs one batch: writes each item's K/V into its blocks, then appends logits rows to
  // *logits in item order: 1 row for kLast, n rows for kAll, each [vocab] fp32. Non-OK when a
  // weight provider or routing hook fails; the KV of the batch's positions may then have been
  // partly written and *logits is unspecified. A hybrid's recurrent states (kept in each
  // item's first block, read at start_pos > 0 and zeroed at 0) advance as the batch runs, so
  // after a failure a sequence's state is unspecified too: rerunning the same positions is
  // not idempotent as a KV write is; the sequence must be recomputed from position 0.
  virtual Status Forward(const Batch& batch, std::vector<float>* logits) = 0;

  // The MoE seams (moe.h) used by the next Forward calls; pointers borrowed.
  virtual void SetHooks(const MoeHooks& hooks) = 0;

  // Where the next Forward calls add each layer block's wall time (borrowed; null: nowhere,
  // no clock read).
  virtual void SetBlockTimes(BlockTimes* times) = 0;
};

}  // namespace pw::engine

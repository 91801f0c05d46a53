// DecodeTrace: router-logit trace recording in a decode worker (policies/misses/router_trace.h,
// docs/formats.md), for pw-sim replays of real serving traffic.
//
// It is the engine's recorder (engine/experts/moe.h, seam (d)) while it runs: every MoE layer
// goes on to the worker's routing statistics (`next`, the planner's input) and, for every
// `sample_every`-th forward pass, whole, into the trace through the engine's TraceRecorder.
// The file is bounded: a record that would take it past `max_bytes` is dropped and counted,
// so it stays a valid trace of what it holds. Close (or the destructor) writes the end record;
// a worker killed before that (or stopped by a full disk) leaves a trace cut short, which the
// reader reads up to its last whole record. The first write
// error stops recording (logged once; serving goes on). Driving thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "policies/misses/router_trace.h"
#include "engine/experts/moe.h"
#include "engine/hooks/trace_recorder.h"

namespace pw::workers {

struct DecodeTraceOptions {
  std::string path;       // empty: no recording
  int sample_every = 1;   // >= 1: every N-th forward pass
  uint64_t max_bytes = 0; // > 0: the file's bound
};

class DecodeTrace final : public engine::RouterLogitsRecorder {
 public:
  // Creates (truncates) the file. kInvalidArgument on a bad option, max_bytes below the
  // smallest trace of this model with one record among them (misses::MinTraceBytes); the
  // writer's error when the file cannot be created. `next` (may be null) is borrowed.
  static Result<std::unique_ptr<DecodeTrace>> Create(const DecodeTraceOptions& options, const ModelConfig& config,
                                                     engine::RouterLogitsRecorder* next);
  ~DecodeTrace() override;

  void Record(const engine::RoutingContext& ctx, const std::vector<engine::ExpertAssignment>& selected) override;
  // Writes the end record and closes the file; later layers go to `next` only.
  Status Close();

  const misses::TraceCounts& counts() const { return writer_->counts(); }
  uint64_t bytes() const { return writer_->bytes(); }

 private:
  DecodeTrace() = default;

  DecodeTraceOptions options_;
  engine::RouterLogitsRecorder* next_ = nullptr;
  std::unique_ptr<misses::RouterTraceWriter> writer_;
  std::unique_ptr<engine::TraceRecorder> recorder_;
  bool closed_ = false;
  bool error_logged_ = false;
};

}  // namespace pw::workers

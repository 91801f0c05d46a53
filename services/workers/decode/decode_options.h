// The pw-decode process's options, declared once (common/formats/options.h): its flags and its entry in
// the `decode:` list of the node file (deploy/local.yaml), LYNX, the miss policy and the
// router-logit trace included, come from DeclareDecodeOptions.
#pragma once

#include <cstdint>

#include "common/formats/options.h"
#include "kernels/cpu/kernel_settings.h"
#include "policies/misses/trace_options.h"
#include "services/common/node_config.h"
#include "services/workers/decode/decode_worker.h"

namespace pw::workers {

// The worker's options plus the few values flags and files give in another form, turned into
// `worker` by ResolveDecodeOptions.
struct DecodeProcessOptions {
  DecodeWorkerOptions worker;
  uint64_t weight_rate_mb_s = 0;  // MiB/s -> worker.weight_bytes_per_s; 0 = no limit
  // LYNX (alpha, beta) -> worker.lynx_options.params; 0 / -1 = derived from k/N.
  float lynx_alpha = 0.f;
  int lynx_beta = -1;
  // The router-logit trace (policies/misses/trace_options.h) -> worker.trace; bounded (64 MB)
  // unless the file or a flag says otherwise.
  misses::TraceOptions trace{.path = {}, .max_mb = 64.0};
  cpu::KernelSettings kernels;  // the root's kernels: map (kernel_options.h)
};

// Binds every option of `o` (its current values are the defaults). `router`, `broker` and
// `metrics` are endpoints, and planner_min_bits / planner_max_bits / planner_min_mean_bits /
// plans_at_request_boundaries follow the broker's planner; a node file derives them.
void DeclareDecodeOptions(options::OptionSet* s, DecodeProcessOptions* o);

// pw-decode's loading, after its flags were parsed into `set` (declared over `o`): the node file
// of `f` (service::ApplyNodeConfig, checking the broker's section with its table too), and
// with the broker's planner enabled its widths (planner_min_bits, planner_max_bits,
// planner_min_mean_bits: held reservations count what lowering to them frees) and
// async_movement: false as plans_at_request_boundaries; then ResolveDecodeOptions.
Status LoadDecodeOptions(const service::ConfigFlags& f, options::OptionSet* set, DecodeProcessOptions* o);

// Fills `worker` from the other forms and checks the rules between options (LYNX alpha with
// beta, a miss policy with a budget and a broker, the planner's widths). kInvalidArgument
// naming the flags.
Status ResolveDecodeOptions(DecodeProcessOptions* o);

}  // namespace pw::workers

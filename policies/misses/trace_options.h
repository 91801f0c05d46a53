// TraceOptions: where a process records its router-logit trace (router_trace.h,
// docs/formats.md), declared once (common/formats/options.h) for pw-decode (its node file entry's
// `trace: {path, max_mb, sample}`) and the offline tools pw-eval and pw-generate: the flags
// --record-trace FILE, --trace-max-mb M and --trace-sample N come from DeclareTraceOptions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/formats/options.h"
#include "common/status.h"

namespace pw::misses {

struct TraceOptions {
  std::string path;  // empty: no trace
  // The file's bound in MB (1e6 bytes); unset: unbounded. A bound must hold one record of some
  // model: at least kMinTraceBytesAnyModel bytes (0.000164 MB).
  std::optional<double> max_mb;
  int sample = 1;  // record every sample-th forward pass, >= 1

  // max_mb in bytes (rounded to the nearest byte); 0 when unbounded.
  uint64_t max_bytes() const;
};

// Declares trace.path (--record-trace), trace.max_mb (--trace-max-mb) and trace.sample
// (--trace-sample), and the rule that a `trace:` map in a file gives its path.
void DeclareTraceOptions(options::OptionSet* s, TraceOptions* t);

// The bound's rule for a value a flag gave (a file's is checked as it loads): kInvalidArgument
// "--trace-max-mb ... holds no record ..." when max_mb is set and below one record.
Status CheckTraceOptions(const TraceOptions& t);

}  // namespace pw::misses

// TraceMetrics: a decode worker's router-logit trace (decode_trace.h) on /metrics, refreshed
// with the worker's telemetry.
//
//   pagedweight_decode_trace_bytes                            bytes in the trace file so far
//   pagedweight_decode_trace_records_total{result="written|dropped"}
//                                                             layer records written, and those
//                                                             left out (sampling, size bound)
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "policies/misses/router_trace.h"
#include "services/workers/decode/decode_trace.h"

namespace pw::workers {

class TraceMetrics {
 public:
  static std::unique_ptr<TraceMetrics> Register(prometheus::Registry& registry, const std::string& worker_id);
  // Sets the gauge and adds what the counts gained since the last call.
  void Export(const DecodeTrace& trace);

 private:
  prometheus::Gauge* bytes_ = nullptr;
  prometheus::Counter *written_ = nullptr, *dropped_ = nullptr;
  misses::TraceCounts last_;
};

}  // namespace pw::workers

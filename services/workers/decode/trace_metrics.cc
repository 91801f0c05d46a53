#include "services/workers/decode/trace_metrics.h"

namespace pw::workers {

std::unique_ptr<TraceMetrics> TraceMetrics::Register(prometheus::Registry& r, const std::string& worker_id) {
  auto m = std::make_unique<TraceMetrics>();
  m->bytes_ = &prometheus::BuildGauge().Name("pagedweight_decode_trace_bytes")
                   .Help("Bytes written to the decode worker's router-logit trace")
                   .Register(r).Add({{"worker", worker_id}});
  auto& rec = prometheus::BuildCounter().Name("pagedweight_decode_trace_records_total")
                  .Help("Router-logit trace layer records: written, or dropped (sampling, size bound)")
                  .Register(r);
  m->written_ = &rec.Add({{"worker", worker_id}, {"result", "written"}});
  m->dropped_ = &rec.Add({{"worker", worker_id}, {"result", "dropped"}});
  return m;
}

void TraceMetrics::Export(const DecodeTrace& trace) {
  const misses::TraceCounts& c = trace.counts();
  bytes_->Set(static_cast<double>(trace.bytes()));
  written_->Increment(static_cast<double>(c.layer_records - last_.layer_records));
  dropped_->Increment(static_cast<double>(c.dropped_records - last_.dropped_records));
  last_ = c;
}

}  // namespace pw::workers

#include "services/workers/decode/decode_trace.h"

#include "common/logging.h"

namespace pw::workers {

Result<std::unique_ptr<DecodeTrace>> DecodeTrace::Create(const DecodeTraceOptions& options,
                                                         const ModelConfig& config,
                                                         engine::RouterLogitsRecorder* next) {
  if (options.path.empty()) return InvalidArgument("router trace: a path is required");
  if (options.sample_every < 1) {
    return InvalidArgument("router trace: sample_every " + std::to_string(options.sample_every) + " is not >= 1");
  }
  if (options.max_bytes == 0) {
    return InvalidArgument("router trace: a serving process's trace needs a size bound (max_bytes > 0)");
  }
  std::unique_ptr<DecodeTrace> t(new DecodeTrace());
  t->options_ = options;
  t->next_ = next;
  PW_ASSIGN_OR_RETURN(t->writer_, misses::RouterTraceWriter::Create(options.path, engine::TraceHeaderFor(config),
                                                                    options.max_bytes));
  t->recorder_ = std::make_unique<engine::TraceRecorder>(t->writer_.get(), options.sample_every);
  return t;
}

DecodeTrace::~DecodeTrace() {
  Status st = Close();
  if (!st.ok()) PW_LOG(WARNING) << "router trace " << options_.path << ": " << st.ToString();
}

void DecodeTrace::Record(const engine::RoutingContext& ctx, const std::vector<engine::ExpertAssignment>& selected) {
  if (next_ != nullptr) next_->Record(ctx, selected);
  if (closed_) return;
  recorder_->Record(ctx, selected);
  if (!recorder_->status().ok() && !error_logged_) {
    error_logged_ = true;
    PW_LOG(WARNING) << "router trace " << options_.path << ": recording stopped: "
                    << recorder_->status().ToString();
  }
}

Status DecodeTrace::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  Status st = writer_->Close();
  const misses::TraceCounts& c = writer_->counts();
  PW_LOG(INFO) << "router trace " << options_.path << ": " << c.layer_records << " layer records ("
               << c.token_layers << " token-layers), " << c.dropped_records << " dropped, "
               << writer_->bytes() << " bytes";
  if (!recorder_->status().ok()) return recorder_->status();
  return st;
}

}  // namespace pw::workers

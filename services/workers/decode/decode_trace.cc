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
  // The writer first: a DecodeTrace always has one (its destructor closes it).
  auto writer = misses::RouterTraceWriter::Create(options.path, engine::TraceHeaderFor(config),
                                                  options.max_bytes);
  if (!writer.ok()) {
    // The model's own floor (the configuration checked only the one of any model).
    if (writer.status().code() == StatusCode::kInvalidArgument) {
      return writer.status().WithContext("trace max_mb (--trace-max-mb)");
    }
    return writer.status();
  }
  std::unique_ptr<DecodeTrace> t(new DecodeTrace());
  t->options_ = options;
  t->next_ = next;
  t->writer_ = std::move(writer).value();
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

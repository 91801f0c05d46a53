#include "services/workers/prefill/prefill_options.h"

#include "services/common/main_loop_beat.h"
#include "services/workers/common/worker_model_options.h"

namespace pw::workers {

void DeclarePrefillOptions(options::OptionSet* s, PrefillWorkerOptions* o) {
  DeclareWorkerModelOptions(s, o, "prefill", "decode",
                            "broker control endpoint (registration only)");
  s->Add("max_batch_tokens", &o->max_batch_tokens, "prompt tokens per forward pass").Range(1, 1 << 20);
  s->Add("max_batch_prompts", &o->max_batch_prompts, "prompts sharing forward passes at once")
      .Range(1, 1 << 16);
  s->Add("put_timeout_ms", &o->put_timeout_ms, "bound of one KV transfer's puts and of its flush")
      .Range(1, 3600000);
  s->Add("heartbeat_ms", &o->heartbeat_ms, "heartbeat interval").Shared().Range(10, 60000);
  s->Add("metrics", &o->metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101").NoKey();
  service::DeclareMainLoopStaleOption(s, &o->main_loop_stale_ms);
}

}  // namespace pw::workers

#include "services/workers/prefill/prefill_options.h"

#include "services/common/main_loop_beat.h"
#include "services/workers/common/worker_model_options.h"

namespace pw::workers {

void DeclarePrefillOptions(options::OptionSet* s, PrefillWorkerOptions* o) {
  DeclareWorkerModelOptions(s, o, "prefill", "decode",
                            "broker control endpoint (registration only)");
  s->Add("store", &o->store_path,
         "any-precision .apw store (the broker's) whose experts the prompts run at expert_bits "
         "(default: the checkpoint's bf16 experts)")
      .NonEmpty();
  s->Add("expert_bits", &o->expert_bits,
         "width of every expert block read from store, 3..8; 16: the checkpoint's bf16 experts")
      .Range(3, 16);
  s->Add("model_hash_cache", &o->model_hash_cache,
         "directory remembering the checkpoint's hash between starts (pw serve's store cache); "
         "unset: the experts are hashed at start when store is given")
      .NonEmpty();
  // One rule for flags and files: a store needs a width to read it at, and a width below 16
  // a store (PrefillWorker::OpenStoreExperts says the same for options built in code).
  s->AddCheck("", [](const config::ConfigValue& v) -> std::string {
    const bool store = v.Has("store");
    const int64_t bits = v.Has("expert_bits") ? v["expert_bits"].AsInt() : 16;
    if (bits > 8 && bits != 16) return "expert_bits " + std::to_string(bits) + ": 3..8, or 16 (bf16)";
    if (store != (bits != 16)) return "store and expert_bits 3..8 go together (16: no store)";
    return "";
  });
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

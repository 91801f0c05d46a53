#include "services/workers/prefill/prefill_options.h"

namespace pw::workers {

void DeclarePrefillOptions(options::OptionSet* s, PrefillWorkerOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory (config.json, *.safetensors)")
      .Flag("--model").Shared().Required().NonEmpty();
  s->Add("router", &o->router_endpoint, "router control endpoint, e.g. tcp://127.0.0.1:5555")
      .NoKey().Required();
  s->Add("broker", &o->broker_endpoint, "broker control endpoint (registration only)").NoKey();
  s->Add("id", &o->id, "worker id (default prefill-<pid>)").NonEmpty();
  s->Add("model_name", &o->model_name, "model name reported to the router").Shared();
  s->Add("kv_blocks", &o->num_kv_blocks, "KV pool blocks").Range(1, 1 << 24);
  s->AddChoice("kv_dtype", &o->kv_dtype, {{"bf16", engine::KvDtype::kBf16}, {"fp32", engine::KvDtype::kF32}},
               "KV elements (must equal the decode workers')")
      .Shared();
  s->Add("block_size", &o->block_size, "tokens per KV block").Range(1, 4096);
  s->Add("threads", &o->threads, "compute threads").Range(1, 1024);
  s->Add("no_mmap", &o->copy_weights,
         "read the checkpoint into this process's memory instead of mapping it (llama.cpp's --no-mmap)");
  s->Add("max_batch_tokens", &o->max_batch_tokens, "prompt tokens per forward pass").Range(1, 1 << 20);
  s->Add("max_batch_prompts", &o->max_batch_prompts, "prompts sharing forward passes at once")
      .Range(1, 1 << 16);
  s->Add("put_timeout_ms", &o->put_timeout_ms, "bound of one KV transfer's puts and of its flush")
      .Range(1, 3600000);
  s->Add("heartbeat_ms", &o->heartbeat_ms, "heartbeat interval").Shared().Range(10, 60000);
  s->Add("metrics", &o->metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101").NoKey();
}

}  // namespace pw::workers

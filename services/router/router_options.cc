#include "services/router/router_options.h"

#include "services/common/main_loop_beat.h"

namespace pw::router {

void DeclareRouterOptions(options::OptionSet* s, RouterAppOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory (tokenizer.json, config.json)")
      .Flag("--model").Shared().Required().NonEmpty();
  s->Add("tokenizer", &o->tokenizer,
         "the tokenizer's directory (tokenizer.json, tokenizer_config.json, chat_template.jinja) "
         "or its tokenizer.json, for a checkpoint that ships none (default: the model directory)");
  s->Add("model_name", &o->model_name, "model id clients send (default: directory name)").Shared();
  s->Add("context_length", &o->context_length,
         "context length in tokens (0: config.json max_position_embeddings)")
      .Flag("--context").Range(0, 1 << 24);
  s->Add("host", &o->http.bind_address, "HTTP bind address").Shared().NonEmpty();
  s->Add("port", &o->http.port, "HTTP port (0 = any free port)").Range(0, 65535);
  s->Add("workers", &o->cluster.bind, "ZeroMQ ROUTER endpoint workers connect to").NoKey();
  s->Add("heartbeat_ms", &o->cluster.heartbeat_ms, "control-plane heartbeat interval")
      .Shared().Range(10, 60000);
  service::DeclareMainLoopStaleOption(s, &o->cluster.main_loop_stale_ms);
  s->Add("lease_ms", &o->cluster.lease_ms, "KV reservation lease").Range(100, 3600000);
  s->Add("prefill_ahead", &o->cluster.prefill_ahead,
         "requests per decode worker prefilled beyond its full batch (-1: maxBatch/4)")
      .Range(-1, 1 << 20);
  s->Add("max_waiting", &o->router.max_waiting, "admission queue bound (then 429)").Range(1, 1000000);
  // Admission by decode KV (kv_admission.h).
  s->Add("max_queued_kv", &o->router.max_queued_kv,
         "waiting requests may need at most this many times the KV the decode workers can hold (then 429)")
      .Range(0.01, 1000);
  s->Add("max_tokens_default", &o->router.default_max_tokens, "max_tokens when a request gives none")
      .Range(1, 1 << 24);
  s->Add("request_timeout_ms", &o->router.request_timeout, "per-request timeout").Range(1, 86400000);
  s->Add("drain_timeout_ms", &o->drain_timeout, "longest drain on SIGTERM").Shared().Range(0, 3600000);
  s->Add("header_timeout_ms", &o->http.header_timeout, "time allowed for request headers")
      .Range(1, 3600000);
  s->Add("body_timeout_ms", &o->http.body_timeout,
         "time allowed for a request body after its headers (then 408)")
      .Range(1, 3600000);
  s->Add("max_body_bytes", &o->http.max_body_bytes, "request body limit (then 413)").Range(1, 1 << 30);
  s->Add("api_keys", &o->api_keys,
         "API key clients must send as 'Authorization: Bearer KEY' (repeatable; also "
         "--api-key-file and the PW_API_KEY environment variable, comma-separated)")
      .Flag("--api-key").NoKey().Secret();
  s->Add("api_key_file", &o->api_key_file, "file with one API key per line");
  s->Add("protect_health", &o->router.protect_health, "with API keys: /health needs a key too (default: open)");
  s->Add("protect_metrics", &o->router.protect_metrics,
         "with API keys: /metrics needs a key too (default: open)");
}

}  // namespace pw::router

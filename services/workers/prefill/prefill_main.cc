// pw-prefill: prefill worker (services/workers/prefill/prefill_worker.h). SIGTERM/SIGINT drain.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"
#include "services/workers/common/kernel_report.h"
#include "services/workers/prefill/prefill_worker.h"
#include "services/common/stop_signals.h"

int main(int argc, char** argv) {
  pw::workers::PrefillWorkerOptions o;
  CLI::App app{"PagedWeight prefill worker"};
  app.add_option("--model", o.model_dir, "model directory (config.json, *.safetensors)")
      ->required();
  app.add_option("--router", o.router_endpoint,
                 "router control endpoint, e.g. tcp://127.0.0.1:5555")
      ->required();
  app.add_option("--broker", o.broker_endpoint, "broker control endpoint (registration only)");
  app.add_option("--id", o.id, "worker id (default prefill-<pid>)");
  app.add_option("--model-name", o.model_name, "model name reported to the router");
  app.add_option("--kv-blocks", o.num_kv_blocks, "KV pool blocks")->check(CLI::Range(1, 1 << 24));
  std::string kv_dtype = "bf16";
  app.add_option("--kv-dtype", kv_dtype, "KV elements (must equal the decode workers')")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--block-size", o.block_size, "tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_flag("--no-mmap", o.copy_weights,
               "read the checkpoint into this process's memory instead of mapping it (llama.cpp's --no-mmap)");
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "prompt tokens per forward pass")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batch-prompts", o.max_batch_prompts,
                 "prompts sharing forward passes at once")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--put-timeout-ms", o.put_timeout_ms,
                 "bound of one KV transfer's puts and of its flush")
      ->check(CLI::Range(1, 3600000));
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "heartbeat interval")
      ->check(CLI::Range(10, 60000));
  app.add_option("--metrics", o.metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101");
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  o.kv_dtype = kv_dtype == "fp32" ? pw::engine::KvDtype::kF32 : pw::engine::KvDtype::kBf16;
  pw::SetLogProcessTag(o.id.empty() ? "prefill" : o.id);
  PW_LOG(INFO) << pw::workers::KernelBackendsLine();
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-prefill", o.router_endpoint); !s.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", s.message().c_str());
    return 2;
  }
  pw::service::InstallStopHandlers();
  auto w = pw::workers::PrefillWorker::Create(o);
  if (!w.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", w.status().ToString().c_str());
    return 1;
  }
  pw::Status st = (*w)->Run(pw::service::StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "pw-prefill: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// pw-decode: decode worker (services/workers/decode_worker.h). SIGTERM/SIGINT drain.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/logging.h"
#include "services/workers/decode_worker.h"
#include "services/workers/signals.h"

int main(int argc, char** argv) {
  pw::workers::DecodeWorkerOptions o;
  CLI::App app{"PagedWeight decode worker"};
  app.add_option("--model", o.model_dir, "model directory (config.json, *.safetensors)")->required();
  app.add_option("--router", o.router_endpoint, "router control endpoint, e.g. tcp://127.0.0.1:5555")->required();
  app.add_option("--broker", o.broker_endpoint, "broker control endpoint (experts come from it); empty = checkpoint");
  app.add_option("--id", o.id, "worker id (default decode-<pid>)");
  app.add_option("--model-name", o.model_name, "model name reported to the router");
  app.add_option("--kv-blocks", o.num_kv_blocks, "KV pool blocks")->check(CLI::Range(1, 1 << 24));
  app.add_option("--block-size", o.block_size, "tokens per KV block")->check(CLI::Range(1, 4096));
  app.add_option("--threads", o.threads, "compute threads")->check(CLI::Range(1, 1024));
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "tokens per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-batch", o.max_batch, "running sequences")->check(CLI::Range(1, 1 << 16));
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "heartbeat interval")->check(CLI::Range(10, 60000));
  app.add_option("--quarantine-max-ms", o.quarantine_max_ms,
                 "quarantined KV blocks return to the pool after this long without the router's word")
      ->check(CLI::Range(1, 86400000));
  app.add_option("--router-lost-quarantine-ms", o.router_lost_quarantine_ms,
                 "... or this long once the router is lost")
      ->check(CLI::Range(1, 86400000));
  app.add_option("--metrics", o.metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101");
  CLI11_PARSE(app, argc, argv);
  pw::SetLogProcessTag(o.id.empty() ? "decode" : o.id);
  pw::workers::InstallStopHandlers();
  auto w = pw::workers::DecodeWorker::Create(o);
  if (!w.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", w.status().ToString().c_str());
    return 1;
  }
  pw::Status st = (*w)->Run(pw::workers::StopFlag());
  if (!st.ok()) {
    std::fprintf(stderr, "pw-decode: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// pw-router: the OpenAI-compatible HTTP front end of a PagedWeight cluster.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "services/router/api_keys.h"
#include "services/router/router_app.h"
#include "services/transport/control_auth.h"
#include "services/transport/service_setup.h"

int main(int argc, char** argv) {
  pw::router::RouterAppOptions o;
  CLI::App app{"pw-router: OpenAI-compatible HTTP router for PagedWeight workers"};
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t header_timeout_ms = 10000, body_timeout_ms = 30000, request_timeout_ms = 300000,
          drain_timeout_ms = 60000;
  size_t max_body = 1 << 20;
  app.add_option("--model", o.model_dir, "model directory (tokenizer.json, config.json)")
      ->required();
  app.add_option("--model-name", o.model_name, "model id clients send (default: directory name)");
  app.add_option("--context", o.context_length,
                 "context length in tokens (default: config.json max_position_embeddings)");
  app.add_option("--host", host, "HTTP bind address");
  app.add_option("--port", port, "HTTP port (0 = any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--workers", o.cluster.bind, "ZeroMQ ROUTER endpoint workers connect to");
  app.add_option("--heartbeat-ms", o.cluster.heartbeat_ms, "control-plane heartbeat interval");
  app.add_option("--lease-ms", o.cluster.lease_ms, "KV reservation lease");
  app.add_option("--prefill-ahead", o.cluster.prefill_ahead,
                 "requests per decode worker prefilled beyond its full batch (-1: maxBatch/4)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--max-waiting", o.router.max_waiting, "admission queue bound (then 429)");
  app.add_option("--max-queued-kv", o.router.max_queued_kv,
                 "waiting requests may need at most this many times the KV the decode workers can hold "
                 "(then 429)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-tokens-default", o.router.default_max_tokens,
                 "max_tokens when a request gives none");
  app.add_option("--request-timeout-ms", request_timeout_ms, "per-request timeout");
  app.add_option("--drain-timeout-ms", drain_timeout_ms, "longest drain on SIGTERM");
  app.add_option("--header-timeout-ms", header_timeout_ms, "time allowed for request headers");
  app.add_option("--body-timeout-ms", body_timeout_ms,
                 "time allowed for a request body after its headers (then 408)");
  app.add_option("--max-body-bytes", max_body, "request body limit (then 413)");
  std::vector<std::string> api_keys;
  std::string api_key_file;
  app.add_option("--api-key", api_keys,
                 "API key clients must send as 'Authorization: Bearer KEY' (repeatable; also "
                 "--api-key-file and the PW_API_KEY environment variable, comma-separated)");
  app.add_option("--api-key-file", api_key_file, "file with one API key per line");
  app.add_flag("--protect-health", o.router.protect_health,
               "with API keys: /health needs a key too (default: open)");
  app.add_flag("--protect-metrics", o.router.protect_metrics,
               "with API keys: /metrics needs a key too (default: open)");
  pw::transport::ServiceSecurityFlags security;
  app.add_option("--control-keys", security.control_keys, pw::transport::kControlKeysHelp);
  app.add_flag("--insecure", security.insecure, pw::transport::kInsecureHelp);
  CLI11_PARSE(app, argc, argv);
  auto keys = pw::router::LoadApiKeys(api_keys, api_key_file, std::getenv(pw::router::kApiKeyEnv));
  if (!keys.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", keys.status().ToString().c_str());
    return 1;
  }
  o.router.api_keys = std::move(*keys);
  if (pw::Status s = pw::transport::SetUpServiceTransport(security, "pw-router", o.cluster.bind);
      !s.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", s.message().c_str());
    return 2;
  }
  o.http.bind_address = host;
  o.http.port = static_cast<uint16_t>(port);
  o.http.header_timeout = std::chrono::milliseconds(header_timeout_ms);
  o.http.body_timeout = std::chrono::milliseconds(body_timeout_ms);
  o.http.max_body_bytes = max_body;
  o.router.request_timeout = std::chrono::milliseconds(request_timeout_ms);
  o.drain_timeout = std::chrono::milliseconds(drain_timeout_ms);
  return pw::router::RunRouterApp(std::move(o));
}

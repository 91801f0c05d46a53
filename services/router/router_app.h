// RunRouterApp: the pw-router process (its main() only parses flags and calls this).
//
// Loads the tokenizer and config.json (the context length, and the model workers' registrations
// are checked against: cluster_backend.h) from the model directory, binds the workers' ROUTER
// socket and the HTTP port, serves until SIGTERM/SIGINT, then drains:
// new generation requests get 503, requests in flight finish (up to drain_timeout), and the
// process exits 0. A second signal exits at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "services/router/cluster_backend.h"
#include "services/router/http_server.h"
#include "services/router/router.h"

namespace pw::router {

struct RouterAppOptions {
  std::string model_dir;       // tokenizer.json, tokenizer_config.json, config.json
  std::string tokenizer;       // "" = model_dir; else the tokenizer's directory or tokenizer.json
                               // (services/common/tokenizer_dir.h), its chat template with it
  std::string model_name;      // "" = the model directory's base name
  int64_t context_length = 0;  // 0 = config.json max_position_embeddings (else 2048)
  HttpServerOptions http;
  RouterOptions router;  // model_name / context_length are filled from the above
  ClusterBackendOptions cluster;
  std::chrono::milliseconds drain_timeout{60000};
  // API keys as given (--api-key, --api-key-file); main adds PW_API_KEY and loads them into
  // router.api_keys (api_keys.h).
  std::vector<std::string> api_keys;
  std::string api_key_file;
};

// Returns the process exit code. Startup errors are printed naming the file or flag.
int RunRouterApp(RouterAppOptions options);

}  // namespace pw::router

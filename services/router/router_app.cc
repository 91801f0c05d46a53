#include "services/router/router_app.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <future>

#include "common/logging.h"
#include "common/formats/model_config.h"
#include "services/router/generation_defaults.h"
#include "common/text/tokenizer.h"
#include "services/common/tokenizer_dir.h"
#include "services/router/chat_renderer.h"
#include "services/router/tokenizer_codec.h"

namespace pw::router {

int RunRouterApp(RouterAppOptions o) {
  SetLogProcessTag("router");
  // Signals are taken by sigwait below; every thread created from here on inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Each client connection is a descriptor: allow as many as the hard limit permits.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);
  }

  namespace fs = std::filesystem;
  auto tok_dir = service::TokenizerDir(o.model_dir, o.tokenizer);
  if (!tok_dir.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", tok_dir.status().ToString().c_str());
    return 1;
  }
  auto tok = Tokenizer::FromModelDir(*tok_dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "pw-router: cannot load the tokenizer from %s: %s\n", tok_dir->c_str(),
                 tok.status().ToString().c_str());
    return 1;
  }
  // config.json: the context length, and the model workers' registrations are checked against.
  const std::string config_path = (fs::path(o.model_dir) / "config.json").string();
  auto cfg = LoadModelConfig(config_path);
  if (!cfg.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  int64_t context = o.context_length;
  if (context == 0) context = cfg->MaxContext();
  if (context <= 1) context = 2048;
  std::string model_name = o.model_name;
  if (model_name.empty()) {
    model_name = fs::path(o.model_dir).filename().string();
    if (model_name.empty()) model_name = fs::path(o.model_dir).parent_path().filename().string();
  }

  ChatRenderer renderer;
  auto chat = MakeChatRenderer(**tok, *tok_dir);
  if (chat.ok()) {
    renderer = std::move(*chat);
  } else {  // completions are served; chat requests get this reason in a 400
    PW_LOG(WARNING) << "chat completions disabled: " << chat.status().ToString();
    renderer = ChatUnavailable(chat.status());
  }
  TokenizerCodec codec(std::move(*tok), std::move(renderer));

  o.cluster.model_name = model_name;
  o.cluster.registration.model = std::move(*cfg);
  auto backend = ClusterBackend::Create(o.cluster);
  if (!backend.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  o.router.model_name = model_name;
  o.router.context_length = context;
  auto generation = LoadGenerationDefaults(o.model_dir, codec.vocab_size());
  if (!generation.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", generation.status().ToString().c_str());
    return 1;
  }
  o.router.generation_defaults = std::move(*generation);
  auto metrics = std::make_shared<RouterMetrics>(std::make_shared<prometheus::Registry>());
  Router router(o.router, &codec, backend->get(), metrics);
  auto server =
      HttpServer::Create(o.http, [&router](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
        router.Handle(std::move(req), std::move(ex));
      });
  if (!server.ok()) {
    std::fprintf(stderr, "pw-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  router.SetServer(server->get());
  (*backend)->Start();
  (*server)->Start();
  if (!o.router.api_keys.empty()) {  // how many, never which
    PW_LOG(INFO) << "API keys: " << o.router.api_keys.size() << " configured; /health "
                 << (o.router.protect_health ? "protected" : "open") << ", /metrics "
                 << (o.router.protect_metrics ? "protected" : "open");
  }
  PW_LOG(INFO) << "serving model '" << model_name << "' (context " << context << ") on http://"
               << o.http.bind_address << ":" << (*server)->port() << ", workers connect to "
               << (*backend)->endpoint();
  std::printf("pw-router: listening on http://%s:%u workers=%s\n", o.http.bind_address.c_str(),
              static_cast<unsigned>((*server)->port()), (*backend)->endpoint().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  PW_LOG(INFO) << "signal " << sig << ": draining (up to " << o.drain_timeout.count() << " ms)";
  auto drained = std::make_shared<std::promise<void>>();
  auto done = drained->get_future();
  (*server)->Post([&router, drained] { router.BeginDrain([drained] { drained->set_value(); }); });
  // Wait for the drain, the drain timeout, or a second signal.
  auto deadline = std::chrono::steady_clock::now() + o.drain_timeout;
  int code = 0;
  while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() >= deadline) {
      PW_LOG(WARNING) << "drain timed out; exiting with requests in flight";
      code = 1;
      break;
    }
    timespec ts{0, 50 * 1000 * 1000};
    if (sigtimedwait(&sigs, nullptr, &ts) > 0) {
      PW_LOG(WARNING) << "second signal: exiting now";
      code = 1;
      break;
    }
  }
  (*backend)->Stop();  // cancels what is left on the workers
  (*server)->FlushWrites(std::chrono::milliseconds(2000));
  (*server)->Stop();
  PW_LOG(INFO) << "stopped";
  return code;
}

}  // namespace pw::router

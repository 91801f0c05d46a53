// pw: one command for the node's tools.
//
//   pw serve MODEL_DIR [--memory BYTES|auto] [--port N] [--host H] [--served-model-name NAME]
//            [--bits auto|3..8|16] [--tokenizer DIR|FILE] [--store-dir DIR] [--run-dir DIR]
//            [--config FILE]
//   pw quantize ...   pw ctl ...   pw cluster ...   pw status ...   pw config ...
//   pw eval ...   pw sim ...   pw loadgen ...
//
// serve is services/serve/serve.h; the others run the binary beside `pw` with the same
// arguments (pw-quantize, pw-ctl, pw-cluster, pw-eval, pw-sim, pw-loadgen; status and config
// are pw-cluster's), so scripts keep using those names. --config FILE gives serve's options as YAML keys (memory: 8G, port:
// 8080, ...; the flags win).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/formats/options.h"
#include "common/formats/yaml_config.h"
#include "services/common/self_dir.h"
#include "services/serve/serve.h"
#include "services/serve/serve_options.h"

namespace {

// The subcommands that are another binary: {pw subcommand, binary, its first argument or ""}.
struct Forward {
  const char* sub;
  const char* binary;
  const char* first;
};
constexpr Forward kForwards[] = {{"quantize", "pw-quantize", ""}, {"ctl", "pw-ctl", ""},
                                 {"cluster", "pw-cluster", ""},   {"status", "pw-cluster", "status"},
                                 {"config", "pw-cluster", "config"}, {"eval", "pw-eval", ""},
                                 {"sim", "pw-sim", ""},           {"loadgen", "pw-loadgen", ""}};

int Exec(const Forward& f, int argc, char** argv) {
  const std::string bin = pw::service::SelfDir() + "/" + f.binary;
  std::vector<char*> args = {const_cast<char*>(bin.c_str())};
  if (f.first[0] != '\0') args.push_back(const_cast<char*>(f.first));
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(bin.c_str(), args.data());
  std::fprintf(stderr, "pw: cannot run %s: %s\n", bin.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2) {
    for (const Forward& f : kForwards) {
      if (std::strcmp(argv[1], f.sub) == 0) return Exec(f, argc, argv);
    }
  }
  CLI::App app{"pw: serve a checkpoint (pw serve MODEL_DIR); quantize, ctl, cluster, status, config, "
               "eval, sim and loadgen run pw-quantize, pw-ctl, pw-cluster, pw-eval, pw-sim and pw-loadgen"};
  app.require_subcommand(1);
  auto* serve = app.add_subcommand("serve", "serve a checkpoint directory: store built and cached, memory planned");
  pw::serve::ServeOptions o;
  pw::options::OptionSet set;
  pw::serve::DeclareServeOptions(&set, &o);
  set.AddToCli(serve);
  std::string config_path;
  serve->add_option("--config", config_path, "YAML file of these options' keys (the flags win)");
  for (const auto& f : kForwards) app.add_subcommand(f.sub, std::string("run ") + f.binary)->allow_extras();
  CLI11_PARSE(app, argc, argv);
  if (!config_path.empty()) {
    auto root = pw::config::LoadYamlConfig(config_path, set.SectionSchema());
    pw::Status st = root.ok() ? set.ApplyFile(*root, *root) : root.status();
    if (!st.ok()) {
      std::fprintf(stderr, "pw serve: %s\n", st.message().c_str());
      return 2;
    }
  }
  if (o.model_dir.empty()) {
    std::fprintf(stderr, "pw serve: MODEL_DIR is required (a checkpoint directory, or model_dir in --config)\n%s",
                 serve->help().c_str());
    return 2;
  }
  pw::Status st = pw::serve::RunServe(o, pw::service::SelfDir());
  std::fprintf(stderr, "pw serve: %s\n", st.message().c_str());
  return 1;
}

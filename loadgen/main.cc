// pw-loadgen: a load generator for OpenAI-compatible servers with the flags and result keys of
// `vllm bench serve`, plus trace replay, ramp-up, sweeps and a live progress line.
// The work is in the pw_loadgen library (loadgen/*.h); this file is the command line.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "loadgen/loadgen_cli.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  pw::loadgen::CliOptions opts;
  CLI::App app{"pw-loadgen: benchmark an OpenAI-compatible server (vllm bench serve flags)"};
  pw::loadgen::AddFlags(app, &opts);
  CLI11_PARSE(app, argc, argv);
  opts.num_prompts_given = app.count("--num-prompts") > 0;
  opts.drain_timeout_given = app.count("--drain-timeout") > 0;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return pw::loadgen::RunCli(opts, &g_stop);
}

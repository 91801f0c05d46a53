// The pw-loadgen command line: its flags (vLLM's names where vLLM has the flag) and the run:
// plan the arrivals, run one benchmark or a sweep over request rates, print the table (or one
// row per rate), and save the result JSON.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace pw::loadgen {

struct CliOptions {
  // Target (vLLM).
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string backend = "openai";  // openai | openai-chat | vllm (chat if the endpoint is chat)
  std::string model = "tiny-moe";
  std::string tokenizer;  // model directory with tokenizer.json
  // Dataset (vLLM): random token ids, or windows of a text file.
  std::string dataset_name = "random";
  std::string dataset_path;
  int num_prompts = 1000;
  bool num_prompts_given = false;  // set by the caller: --num-prompts was on the command line
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0;
  int random_token_min = 16;  // ours: the id range of random prompts
  int random_token_max = 4000;
  bool ignore_eos = false;
  double temperature = 0;
  // Arrivals (vLLM).
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int max_concurrency = 0;
  std::string ramp_up_strategy;  // "" or linear
  double ramp_up_start_rps = 0, ramp_up_end_rps = 0;
  int num_warmups = 0;
  int seed = 0;
  // Ours: trace replay, duration, sweep.
  std::string trace;
  double trace_speedup = 1.0;
  std::string trace_window;  // START:END seconds of the trace
  int clip_context = 0;
  int clip_output = 0;
  double duration = 0;        // > 0: seconds in which requests are sent (benchmark.h)
  double drain_timeout = 30;  // then, seconds in-flight requests may run before they are cancelled
  bool drain_timeout_given = false;  // set by the caller: --drain-timeout was on the command line
  std::string sweep;  // comma-separated request rates
  // Results (vLLM).
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir;
  std::string result_filename;
  // Ours: client.
  bool quiet = false;
  int io_threads = 2;
  // How output tokens are counted and timed (stream_client.h): auto (probe the server: usage,
  // else logprobs, else chunks), usage, logprobs or chunks.
  std::string token_count = "auto";
  double request_timeout_s = 600;
};

void AddFlags(CLI::App& app, CliOptions* o);
// Runs what the options say; returns the process exit code (0: every request sent succeeded or
// was cancelled at the end of --duration's drain, 1: some failed, 2: bad options or input).
int RunCli(const CliOptions& o, const std::atomic<bool>* stop);

}  // namespace pw::loadgen

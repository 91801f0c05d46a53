// pw-generate: generate a continuation of a prompt with the CPU engine.
//   pw-generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T --top-p P
//               --top-k K --seed S] [--threads T]
//               [--record-trace FILE [--trace-max-mb M] [--trace-sample N]]
// Greedy by default. The continuation is streamed to stdout through the incremental decoder
// (never half a UTF-8 character); prompt/decode speed goes to stderr. --record-trace writes
// the router's logits and selection of every MoE layer (prompt and decode) for pw-sim.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/text/tokenizer.h"
#include "engine/engine.h"
#include "engine/models/model.h"
#include "engine/hooks/trace_recorder.h"
#include "policies/misses/router_trace.h"
#include "policies/misses/trace_options.h"

namespace {

int Fail(const pw::Status& s) {
  std::fprintf(stderr, "pw-generate: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pw-generate: continue a prompt"};
  std::string model, prompt;
  pw::engine::SamplingParams sp;
  sp.max_tokens = 64;
  int threads = 2;
  app.add_option("--model", model, "model directory")->required();
  app.add_option("--prompt", prompt, "prompt text (UTF-8)")->required();
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate at most")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", sp.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", sp.top_p, "nucleus sampling mass, (0, 1]");
  app.add_option("--top-k", sp.top_k, "keep the k most likely tokens, 0 = all")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--seed", sp.seed, "random seed");
  app.add_option("--threads", threads, "compute threads")->check(CLI::Range(1, 256));
  pw::misses::TraceOptions trace;  // unbounded unless --trace-max-mb
  pw::options::OptionSet trace_options;
  pw::misses::DeclareTraceOptions(&trace_options, &trace);
  trace_options.AddToCli(&app);
  CLI11_PARSE(app, argc, argv);
  if (auto s = pw::misses::CheckTraceOptions(trace); !s.ok()) return Fail(s);

  auto tok = pw::Tokenizer::FromModelDir(model);
  if (!tok.ok()) return Fail(tok.status());
  auto ids = (*tok)->Encode(prompt);
  if (!ids.ok()) return Fail(ids.status().WithContext("--prompt"));
  if (ids->empty()) return Fail(pw::InvalidArgument("--prompt: empty prompt"));
  pw::engine::EngineOptions opt;
  opt.num_threads = threads;
  auto engine = pw::engine::Engine::Create(model, opt);
  if (!engine.ok()) return Fail(engine.status());
  auto& e = **engine;
  if (static_cast<int64_t>(ids->size()) >= e.max_context()) {
    return Fail(pw::OutOfRange("--prompt: " + std::to_string(ids->size()) +
                               " tokens do not fit the model's context of " +
                               std::to_string(e.max_context())));
  }
  const int64_t longest =
      std::min<int64_t>(static_cast<int64_t>(ids->size()) + sp.max_tokens + 1, e.max_context());
  const int need = pw::engine::BlocksForTokens(static_cast<int>(longest), opt.block_size);
  if (need > e.kv_pool().num_blocks()) {
    // Re-create with a pool large enough for this request (bounded by the context anyway).
    opt.num_kv_blocks = need;
    engine = pw::engine::Engine::Create(model, opt);
    if (!engine.ok()) return Fail(engine.status());
  }
  auto& eng = **engine;
  std::unique_ptr<pw::misses::RouterTraceWriter> trace_writer;
  std::unique_ptr<pw::engine::TraceRecorder> recorder;
  if (!trace.path.empty()) {
    auto w = pw::misses::RouterTraceWriter::Create(
        trace.path, pw::engine::TraceHeaderFor(eng.model().config()), trace.max_bytes());
    if (!w.ok()) return Fail(w.status());
    trace_writer = std::move(w).value();
    recorder = std::make_unique<pw::engine::TraceRecorder>(trace_writer.get(), trace.sample);
    pw::engine::MoeHooks hooks;
    hooks.recorder = recorder.get();
    eng.SetMoeHooks(hooks);
  }
  if (auto s = eng.AddSequence(1, *ids, sp); !s.ok()) return Fail(s.WithContext("--prompt"));
  pw::IncrementalDecoder dec(**tok, /*skip_special_tokens=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  int generated = 0;
  while (eng.HasWork()) {
    auto r = eng.Step();
    if (!r.ok()) return Fail(r.status());
    for (const auto& u : r->updates) {
      for (int32_t t : u.new_tokens) {
        if (generated++ == 0) t_first = std::chrono::steady_clock::now();
        if (u.reason == pw::engine::FinishReason::kStop) continue;  // do not print the stop token
        auto text = dec.Push(t);
        if (!text.ok()) return Fail(text.status());
        std::fwrite(text->data(), 1, text->size(), stdout);
        std::fflush(stdout);
      }
    }
  }
  const std::string tail = dec.Finish();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const auto t1 = std::chrono::steady_clock::now();
  if (trace_writer) {
    if (!recorder->status().ok()) return Fail(recorder->status());
    if (auto s = trace_writer->Close(); !s.ok()) return Fail(s);
    std::fprintf(stderr, "pw-generate: trace %s, %llu layer records, %llu bytes\n", trace.path.c_str(),
                 static_cast<unsigned long long>(trace_writer->counts().layer_records),
                 static_cast<unsigned long long>(trace_writer->bytes()));
  }
  const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
  const double decode_s = std::chrono::duration<double>(t1 - t_first).count();
  std::fprintf(stderr,
               "pw-generate: prompt %zu tokens in %.3f s (%.1f tokens/s); %d tokens generated, "
               "decode %.1f tokens/s\n",
               ids->size(), prefill_s, prefill_s > 0 ? ids->size() / prefill_s : 0.0, generated,
               decode_s > 0 && generated > 1 ? (generated - 1) / decode_s : 0.0);
  return 0;
}

// pw-eval: model evaluation.
//   pw-eval ppl --model DIR --text FILE [--ctx N] [--threads T]
// Teacher-forced perplexity over non-overlapping windows of N tokens (rule in
// services/engine/perplexity.h). Progress goes to stderr; stdout ends with `ppl <value>`.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/tokenizer.h"
#include "services/engine/engine.h"
#include "services/engine/perplexity.h"

namespace {

int Fail(const pw::Status& s) {
  std::fprintf(stderr, "pw-eval: %s\n", s.ToString().c_str());
  return 1;
}

int RunPpl(const std::string& model_dir, const std::string& text_path, int ctx, int threads) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(pw::NotFound("cannot open --text file " + text_path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  auto tok = pw::Tokenizer::FromModelDir(model_dir);
  if (!tok.ok()) return Fail(tok.status());
  auto ids = (*tok)->Encode(text);
  if (!ids.ok()) return Fail(ids.status().WithContext(text_path));
  pw::engine::EngineOptions opt;
  opt.num_threads = threads;
  opt.block_size = 16;
  opt.num_kv_blocks = pw::engine::BlocksForTokens(ctx, opt.block_size) + 1;
  opt.max_batch_tokens = std::min(ctx, 512);
  auto engine = pw::engine::Engine::Create(model_dir, opt);
  if (!engine.ok()) return Fail(engine.status());
  if (ctx > (*engine)->max_context()) {
    return Fail(pw::OutOfRange("--ctx " + std::to_string(ctx) + " exceeds the model's context of " +
                               std::to_string((*engine)->max_context())));
  }
  std::fprintf(stderr, "pw-eval: %zu tokens, windows of %d\n", ids->size(), ctx);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = pw::engine::Perplexity(**engine, *ids, ctx, [&](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\rpw-eval: window %lld/%lld  %.1f s", static_cast<long long>(done),
                 static_cast<long long>(total), s);
  });
  std::fprintf(stderr, "\n");
  if (!r.ok()) return Fail(r.status());
  std::printf("tokens %lld\nnll_sum %.6f\nppl %.6f\n", static_cast<long long>(r->n_tokens),
              r->nll_sum, r->ppl());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pw-eval: evaluate a model"};
  app.require_subcommand(1);
  auto* ppl = app.add_subcommand("ppl", "teacher-forced perplexity over non-overlapping windows");
  std::string model, text;
  int ctx = 512, threads = 2;
  ppl->add_option("--model", model, "model directory (config.json, safetensors, tokenizer.json)")
      ->required();
  ppl->add_option("--text", text, "UTF-8 text file")->required();
  ppl->add_option("--ctx", ctx, "window length in tokens")->check(CLI::Range(2, 1 << 20));
  ppl->add_option("--threads", threads, "compute threads")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  if (ppl->parsed()) return RunPpl(model, text, ctx, threads);
  return 2;
}

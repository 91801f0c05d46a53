// pw-eval: model evaluation.
//   pw-eval ppl --model DIR --text FILE [--ctx N] [--threads T]
//               [--store STORE.apw (--bits B | --bits-map MAP.json) [--kernel-path fast|exact]]
//               [--dense bf16|int8] [--nll-out FILE]
//               [--batch B [--lynx [--lynx-rule lynx|piggyback] [--lynx-alpha A --lynx-beta B]
//                           [--lynx-gate-weights renorm|mass] [--lynx-exempt L,..]
//                           [--lynx-keep K'] [--lynx-config FILE]]]
// With --store, routed experts run from the any-precision store at width B (3..8, or 16 for
// the checkpoint's bf16) or at each block's width in MAP (quant/apw_provider.h),
// through the integer fast path (default) or the exact fp16-LUT path.
// Teacher-forced perplexity over non-overlapping windows of N tokens (rule in
// services/engine/perplexity.h). Progress goes to stderr; stdout ends with `ppl <value>`.
// --nll-out writes one line per prediction, "<window> <nll>", for paired comparisons of two
// runs over the same text (tools/compare_nll.py).
// --batch B scores the same windows as B streams decoded in lockstep, one token per stream per
// step (tools/lockstep_perplexity.h), so every forward pass is a pure-decode batch of up to B
// tokens; --lynx then runs a batch remap rule (LYNX or the piggyback baseline, tools/lynx_cli.h)
// as the routing hook and reports the distinct experts per layer before and after. Without
// --batch the windows run whole, as before.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/apw_store.h"
#include "common/tokenizer.h"
#include "quant/apw_provider.h"
#include "services/engine/engine.h"
#include "services/engine/lynx_routing_hook.h"
#include "services/engine/model.h"
#include "services/engine/perplexity.h"
#include "tools/lockstep_perplexity.h"
#include "tools/lynx_cli.h"

namespace {

int Fail(const pw::Status& s) {
  std::fprintf(stderr, "pw-eval: %s\n", s.ToString().c_str());
  return 1;
}

// Any-precision experts for pw-eval: an empty store path keeps the bf16 checkpoint experts.
struct ApwFlags {
  std::string store;
  int bits = 0;
  std::string bits_map;
  std::string kernel_path = "fast";
  bool dense_int8 = false;
};

int RunPpl(const std::string& model_dir, const std::string& text_path, int ctx, int threads,
           const ApwFlags& apw, const std::string& nll_out, int batch,
           const pw::tools::LynxFlags& lynx) {
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
  opt.dense_int8 = apw.dense_int8;
  opt.block_size = 16;
  opt.num_kv_blocks = std::max(batch, 1) * pw::engine::BlocksForTokens(ctx, opt.block_size) + 1;
  opt.max_batch_tokens = std::min(ctx, 512);
  auto engine = pw::engine::Engine::Create(model_dir, opt);
  if (!engine.ok()) return Fail(engine.status());
  if (ctx > (*engine)->max_context()) {
    return Fail(pw::OutOfRange("--ctx " + std::to_string(ctx) + " exceeds the model's context of " +
                               std::to_string((*engine)->max_context())));
  }
  std::unique_ptr<pw::anyprec::ApwExpertProvider> provider;
  if (!apw.store.empty()) {
    auto store = pw::apw::ApwStore::Open(apw.store);
    if (!store.ok()) return Fail(store.status());
    const auto& info = (*store)->info();
    auto widths = apw.bits_map.empty()
                      ? pw::anyprec::WidthMap::Uniform(apw.bits, info.num_layers, info.num_experts)
                      : pw::anyprec::WidthMap::FromFile(apw.bits_map, info.num_layers, info.num_experts);
    if (!widths.ok()) return Fail(widths.status());
    std::fprintf(stderr, "pw-eval: experts from %s, average %.4f bits\n", apw.store.c_str(),
                 widths->AverageBits(info));
    auto p = pw::anyprec::ApwExpertProvider::Create(std::move(store).value(), (*engine)->model(),
                                                    std::move(widths).value());
    if (!p.ok()) return Fail(p.status());
    provider = std::move(p).value();
    auto path = pw::anyprec::ParseKernelPath(apw.kernel_path);
    if (!path.ok()) return Fail(path.status());
    provider->set_kernel_path(*path);
    std::fprintf(stderr, "pw-eval: %s kernel path\n", pw::anyprec::KernelPathName(*path));
  }
  pw::engine::MoeHooks hooks;
  hooks.provider = provider.get();
  std::unique_ptr<pw::lynx::BatchRemapper> remapper;
  std::unique_ptr<pw::engine::LynxRoutingHook> lynx_hook;
  if (lynx.on) {
    const auto& cfg = (*engine)->model().config();
    std::string desc;
    auto r = pw::tools::MakeRemapper(lynx, static_cast<int>(cfg.num_experts),
                                     static_cast<int>(cfg.num_experts_per_tok), &desc);
    if (!r.ok()) return Fail(r.status());
    remapper = std::move(r).value();
    lynx_hook = std::make_unique<pw::engine::LynxRoutingHook>(remapper.get());
    lynx_hook->Reserve(batch, static_cast<int>(cfg.num_experts),
                       static_cast<int>(cfg.num_experts_per_tok));
    hooks.routing_hook = lynx_hook.get();
    std::fprintf(stderr, "pw-eval: %s\n", desc.c_str());
    std::printf("remap %s\n", desc.c_str());
  }
  std::fprintf(stderr, "pw-eval: %zu tokens, windows of %d", ids->size(), ctx);
  if (batch > 0) std::fprintf(stderr, ", %d streams in lockstep", batch);
  std::fprintf(stderr, "\n");
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\rpw-eval: window %lld/%lld  %.1f s", static_cast<long long>(done),
                 static_cast<long long>(total), s);
  };
  pw::Result<pw::engine::PerplexityResult> r = pw::Internal("not run");
  if (batch > 0) {
    pw::eval::LockstepOptions lo;
    lo.ctx = ctx;
    lo.batch = batch;
    lo.threads = threads;
    lo.hooks = hooks;
    r = pw::eval::LockstepPerplexity(**engine, *ids, lo, progress);
  } else {
    if (hooks.provider != nullptr) (*engine)->SetMoeHooks(hooks);
    r = pw::engine::Perplexity(**engine, *ids, ctx, progress);
  }
  std::fprintf(stderr, "\n");
  if (!r.ok()) return Fail(r.status());
  if (lynx_hook) {
    const pw::engine::LynxHookStats& st = lynx_hook->stats();
    const double calls = st.applied_calls ? static_cast<double>(st.applied_calls) : 1;
    std::printf("remapped_layer_calls %lld of %lld\n", static_cast<long long>(st.applied_calls),
                static_cast<long long>(st.calls));
    std::printf("distinct_experts_per_layer_before %.3f\ndistinct_experts_per_layer_after %.3f\n",
                st.distinct_before / calls, st.distinct_after / calls);
    std::printf("tokens_changed_fraction %.4f\npairs_replaced_fraction %.4f\n",
                st.tokens ? static_cast<double>(st.tokens_changed) / st.tokens : 0.0,
                st.tokens ? static_cast<double>(st.pairs_replaced) /
                                (st.tokens * (*engine)->model().config().num_experts_per_tok)
                          : 0.0);
    std::printf("remap_seconds %.4f\n", st.seconds);
  }
  if (!nll_out.empty()) {
    std::FILE* f = std::fopen(nll_out.c_str(), "w");
    if (f == nullptr) return Fail(pw::Internal("cannot write --nll-out file " + nll_out));
    for (size_t i = 0; i < r->token_nll.size(); ++i) {
      std::fprintf(f, "%d %.9g\n", r->token_window[i], static_cast<double>(r->token_nll[i]));
    }
    if (std::fclose(f) != 0) return Fail(pw::Internal("cannot write --nll-out file " + nll_out));
  }
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
  ApwFlags apw;
  ppl->add_option("--store", apw.store, "any-precision expert store (.apw) to run experts from");
  auto* bits_opt = ppl->add_option("--bits", apw.bits, "uniform expert width with --store (3..8, 16 = bf16)")
                       ->check(CLI::IsMember({3, 4, 5, 6, 7, 8, 16}));
  auto* map_opt = ppl->add_option("--bits-map", apw.bits_map, "per-block width map (JSON/YAML) with --store");
  bits_opt->excludes(map_opt);
  ppl->add_option("--kernel-path", apw.kernel_path, "with --store: fast (int8 LUT and activations) or exact (fp16 LUT)")
      ->check(CLI::IsMember({"fast", "exact"}));
  std::string dense = "bf16";
  ppl->add_option("--dense", dense, "dense weights (attention, lm_head, dense MLPs): bf16 or int8")
      ->check(CLI::IsMember({"bf16", "int8"}));
  std::string nll_out;
  ppl->add_option("--nll-out", nll_out, "write \"<window> <nll>\" per prediction to this file");
  int batch = 0;
  ppl->add_option("--batch", batch, "score as B streams decoded in lockstep (0: whole windows)")
      ->check(CLI::Range(0, 4096));
  pw::tools::LynxFlags lynx;
  pw::tools::AddLynxFlags(ppl, &lynx);
  CLI11_PARSE(app, argc, argv);
  if (lynx.on && batch < 1) return Fail(pw::InvalidArgument("--lynx needs --batch B"));
  if (!apw.store.empty() && apw.bits == 0 && apw.bits_map.empty()) {
    return Fail(pw::InvalidArgument("--store needs --bits or --bits-map"));
  }
  if (apw.store.empty() && (apw.bits != 0 || !apw.bits_map.empty())) {
    return Fail(pw::InvalidArgument("--bits and --bits-map need --store"));
  }
  apw.dense_int8 = dense == "int8";
  if (ppl->parsed()) return RunPpl(model, text, ctx, threads, apw, nll_out, batch, lynx);
  return 2;
}

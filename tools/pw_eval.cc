// pw-eval: model evaluation.
//   pw-eval ppl --model DIR --text FILE [--ctx N] [--threads T]
//               [--store STORE.apw (--bits B | --bits-map MAP.json) [--kernel-path fast|exact]]
//               [--dense bf16|int8|ap3..ap8] [--lm-head FORMAT] [--nll-out FILE]
//               [--batch B [--lynx [--lynx-rule lynx|piggyback] [--lynx-alpha A --lynx-beta B]
//                           [--lynx-gate-weights renorm|mass] [--lynx-exempt L,..]
//                           [--lynx-keep K'] [--lynx-config FILE]]]
//               [--residency F | --residency-bytes N] [--miss-policy P [--miss-eviction E]
//                [--miss-threshold X] [--miss-admission-beta B] [--miss-admission-delay D]]
//               [--miss-config FILE]   the same settings as YAML (policies/misses/miss_options.h)
//               [--record-trace FILE [--trace-max-mb M] [--trace-sample N]]
// With --store, routed experts run from the any-precision store at width B (3..8, or 16 for
// the checkpoint's bf16) or at each block's width in MAP (engine/experts/apw_expert_provider.h),
// through the integer fast path (default) or the exact fp16-LUT path.
// Teacher-forced perplexity over non-overlapping windows of N tokens (rule in
// engine/eval/perplexity.h). Progress goes to stderr; stdout ends with `ppl <value>`.
// --nll-out writes one line per prediction, "<window> <nll>", for paired comparisons of two
// runs over the same text (tools/compare_nll.py).
//   pw-eval loglik --model DIR --pairs FILE.jsonl [--threads T]
// Log-likelihood of continuations: FILE has one JSON object per line, {"context": ...,
// "continuation": ...}; each is tokenized as an evaluation harness does (trailing whitespace of
// the context moves to the continuation; the continuation's tokens are those of
// context + continuation after the context's own tokens) and scored teacher-forced. stdout has
// one line per pair, "ll <index> <log-likelihood> <tokens> <greedy 0|1>", then
// `loglik_sum <value>`.
// --batch B scores the same windows as B streams decoded in lockstep, one token per stream per
// step (tools/lockstep_perplexity.h), so every forward pass is a pure-decode batch of up to B
// tokens; --lynx then runs a batch remap rule (LYNX or the piggyback baseline, tools/lynx_cli.h)
// as the routing hook and reports the distinct experts per layer before and after. Without
// --batch the windows run whole, as before.
// --residency F (or --residency-bytes) with --miss-policy P emulates a residency budget: only
// round(F * E) experts per MoE layer are resident (cold start, kept across windows) and the
// policy (policies/misses) decides every miss as the cache evolves, token by token; outputs
// are exact (the substitutes really run), fetch time is idealised. With --lynx the remap runs
// first, then the miss policy. It prints the policy's counts (misses_* lines).
// --record-trace writes the router's logits and selection of every MoE layer to FILE for
// pw-sim (with a miss policy: the logits of the emulated run).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/formats/apw_store.h"
#include "common/text/tokenizer.h"
#include "engine/experts/apw_expert_provider.h"
#include "engine/engine.h"
#include "engine/hooks/lynx_routing_hook.h"
#include "engine/hooks/miss_routing_hook.h"
#include "engine/hooks/routing_hook_chain.h"
#include "engine/hooks/trace_recorder.h"
#include "engine/models/model.h"
#include "engine/eval/perplexity.h"
#include "tools/lockstep_perplexity.h"
#include "tools/dense_cli.h"
#include "tools/lynx_cli.h"
#include "policies/misses/miss_options.h"
#include "policies/misses/router_trace.h"
#include "policies/misses/trace_options.h"
#include "policies/misses/trace_replay.h"
#include "common/formats/width_map.h"

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
  pw::DenseFormat dense = pw::DenseFormat::kBf16;
  pw::DenseFormat lm_head = pw::DenseFormat::kAsDense;
  pw::engine::Bf16ExpertForm bf16_experts = pw::engine::Bf16ExpertForm::kPlain;
};

int RunPpl(const std::string& model_dir, const std::string& text_path, int ctx, int threads,
           const ApwFlags& apw, const std::string& nll_out, int batch,
           const pw::tools::LynxFlags& lynx, const pw::misses::MissSettings& miss,
           const pw::misses::TraceOptions& trace) {
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
  opt.dense = apw.dense;
  opt.lm_head = apw.lm_head;
  opt.bf16_experts = apw.bf16_experts;
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
                      : pw::anyprec::WidthMap::FromFile(apw.bits_map, info);
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
  const auto& cfg = (*engine)->model().config();
  int moe_layers = 0;
  for (const auto& layer : (*engine)->model().layers()) moe_layers += layer.is_moe ? 1 : 0;
  std::unique_ptr<pw::misses::MissPolicy> policy;
  std::unique_ptr<pw::engine::MissRoutingHook> miss_hook;
  const pw::misses::Budget budget = pw::misses::ToBudget(miss);
  if (budget.fraction > 0 || budget.bytes > 0) {
    auto mc = pw::misses::ToMissConfig(miss);
    if (!mc.ok()) return Fail(mc.status());
    const double expert_bytes = 3.0 * cfg.hidden_size * cfg.moe_intermediate_size * 2.0;
    auto cap = pw::misses::CapacityFor(budget, moe_layers,
                                       static_cast<int>(cfg.num_experts),
                                       static_cast<int>(cfg.num_experts_per_tok), expert_bytes);
    if (!cap.ok()) return Fail(cap.status());
    auto p = pw::misses::MissPolicy::Create(*mc, static_cast<int>(cfg.num_layers),
                                            static_cast<int>(cfg.num_experts),
                                            static_cast<int>(cfg.num_experts_per_tok), *cap);
    if (!p.ok()) return Fail(p.status());
    policy = std::move(p).value();
    policy->set_record_events(false);
    miss_hook = std::make_unique<pw::engine::MissRoutingHook>(policy.get());
    hooks.residency = miss_hook.get();
    const std::string desc = pw::misses::DescribeMissConfig(*mc);
    std::fprintf(stderr, "pw-eval: miss policy %s, %d of %lld experts resident per layer\n",
                 desc.c_str(), *cap, static_cast<long long>(cfg.num_experts));
    std::printf("miss_policy %s\nresident_per_layer %d\n", desc.c_str(), *cap);
  } else if (!miss.policy.empty()) {
    return Fail(pw::InvalidArgument("--miss-policy needs --residency F or --residency-bytes N"));
  }
  std::unique_ptr<pw::engine::RoutingHookChain> chain;
  hooks.routing_hook = pw::engine::ComposeRouting(lynx_hook.get(), miss_hook.get(), &chain);
  std::unique_ptr<pw::misses::RouterTraceWriter> trace_writer;
  std::unique_ptr<pw::engine::TraceRecorder> recorder;
  if (!trace.path.empty()) {
    auto w = pw::misses::RouterTraceWriter::Create(trace.path, pw::engine::TraceHeaderFor(cfg),
                                                   trace.max_bytes());
    if (!w.ok()) return Fail(w.status());
    trace_writer = std::move(w).value();
    recorder = std::make_unique<pw::engine::TraceRecorder>(trace_writer.get(), trace.sample);
    hooks.recorder = recorder.get();
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
    if (hooks.provider != nullptr || hooks.routing_hook != nullptr || hooks.recorder != nullptr ||
        hooks.residency != nullptr) {
      (*engine)->SetMoeHooks(hooks);
    }
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
  if (miss_hook) {
    const pw::misses::MissStats& st = miss_hook->stats();
    const double tl = st.token_layers ? static_cast<double>(st.token_layers) : 1.0;
    const double tokens = static_cast<double>(st.token_layers) / std::max(1, moe_layers);
    std::printf("misses_token_layers %lld\nmisses_slots %lld\nmisses_hits %lld\nmisses_misses %lld\n",
                static_cast<long long>(st.token_layers), static_cast<long long>(st.slots),
                static_cast<long long>(st.hits), static_cast<long long>(st.misses));
    std::printf("misses_fetches %lld\nmisses_substitutions %lld\nmisses_first_choice_substitutions %lld\n",
                static_cast<long long>(st.fetches), static_cast<long long>(st.substitutions),
                static_cast<long long>(st.first_choice_substitutions));
    std::printf("misses_forced_fetches %lld\nmisses_admissions %lld\nmisses_evictions %lld\n",
                static_cast<long long>(st.forced_fetches), static_cast<long long>(st.admissions),
                static_cast<long long>(st.evictions));
    std::printf("misses_admissions_per_token %.6f\n", tokens > 0 ? st.admissions / tokens : 0.0);
    std::printf("misses_fetches_per_token %.6f\nmisses_substitution_rate %.6f\nmisses_mass_mean %.6f\n",
                tokens > 0 ? st.fetches / tokens : 0.0,
                st.slots ? static_cast<double>(st.substitutions) / static_cast<double>(st.slots) : 0.0,
                st.mass_sum / tl);
    std::printf("misses_policy_seconds %.4f\n", miss_hook->seconds());
  }
  if (trace_writer) {
    if (!recorder->status().ok()) return Fail(recorder->status());
    const pw::misses::TraceCounts counts = trace_writer->counts();
    if (auto s = trace_writer->Close(); !s.ok()) return Fail(s);
    std::printf("trace_records %llu\ntrace_dropped_records %llu\ntrace_bytes %llu\n",
                static_cast<unsigned long long>(counts.layer_records),
                static_cast<unsigned long long>(counts.dropped_records),
                static_cast<unsigned long long>(trace_writer->bytes()));
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

// Python's str.rstrip() for the ASCII whitespace an evaluation harness meets.
size_t TrailingSpaces(const std::string& s) {
  size_t n = 0;
  while (n < s.size()) {
    const char c = s[s.size() - 1 - n];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') break;
    ++n;
  }
  return n;
}

int RunLoglik(const std::string& model_dir, const std::string& pairs_path, int threads) {
  std::ifstream in(pairs_path, std::ios::binary);
  if (!in) return Fail(pw::NotFound("cannot open --pairs file " + pairs_path));
  auto tok = pw::Tokenizer::FromModelDir(model_dir);
  if (!tok.ok()) return Fail(tok.status());
  pw::engine::EngineOptions eo;
  eo.num_threads = threads;
  eo.num_kv_blocks = 512;
  auto engine = pw::engine::Engine::Create(model_dir, eo);
  if (!engine.ok()) return Fail(engine.status());
  const int V = (*engine)->vocab_size();
  std::string line;
  int index = 0;
  double total = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("context") || !j.contains("continuation") ||
        !j["context"].is_string() || !j["continuation"].is_string()) {
      return Fail(pw::InvalidArgument(pairs_path + ": line " + std::to_string(index + 1) +
                                      " is not {\"context\": string, \"continuation\": string}"));
    }
    std::string context = j["context"], continuation = j["continuation"];
    if (context.empty()) {
      return Fail(pw::InvalidArgument(pairs_path + ": line " + std::to_string(index + 1) +
                                      ": empty context"));
    }
    const size_t spaces = TrailingSpaces(context);
    continuation = context.substr(context.size() - spaces) + continuation;
    context.resize(context.size() - spaces);
    auto whole = (*tok)->Encode(context + continuation);
    auto ctx_ids = (*tok)->Encode(context);
    if (!whole.ok()) return Fail(whole.status());
    if (!ctx_ids.ok()) return Fail(ctx_ids.status());
    const size_t ctx_len = ctx_ids->size();
    if (ctx_len == 0 || ctx_len >= whole->size()) {
      return Fail(pw::InvalidArgument(pairs_path + ": line " + std::to_string(index + 1) +
                                      ": the continuation adds no token"));
    }
    auto logits = (*engine)->ForwardLogits(*whole);
    if (!logits.ok()) return Fail(logits.status());
    double ll = 0;
    bool greedy = true;
    for (size_t pos = ctx_len; pos < whole->size(); ++pos) {
      const float* row = logits->data() + (pos - 1) * static_cast<size_t>(V);
      const auto lp = pw::engine::ComputeLogprobs(row, V, (*whole)[pos], 1);
      ll += lp.logprob;
      greedy &= lp.top[0].first == (*whole)[pos];
    }
    total += ll;
    std::printf("ll %d %.6f %zu %d\n", index, ll, whole->size() - ctx_len, greedy ? 1 : 0);
    ++index;
  }
  std::printf("loglik_sum %.6f\n", total);
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
  pw::tools::AddDenseFlags(ppl, &apw.dense, &apw.lm_head);
  pw::tools::AddBf16ExpertsFlag(ppl, &apw.bf16_experts);
  std::string nll_out;
  ppl->add_option("--nll-out", nll_out, "write \"<window> <nll>\" per prediction to this file");
  int batch = 0;
  ppl->add_option("--batch", batch, "score as B streams decoded in lockstep (0: whole windows)")
      ->check(CLI::Range(0, 4096));
  pw::tools::LynxFlags lynx;
  pw::tools::AddLynxFlags(ppl, &lynx);
  pw::misses::MissToolOptions miss;
  pw::options::OptionSet miss_options;
  pw::misses::DeclareMissToolOptions(&miss_options, &miss);
  miss_options.AddToCli(ppl);
  pw::misses::TraceOptions trace;  // unbounded unless --trace-max-mb
  pw::options::OptionSet trace_options;
  pw::misses::DeclareTraceOptions(&trace_options, &trace);
  trace_options.AddToCli(ppl);
  auto* loglik = app.add_subcommand("loglik", "log-likelihood of continuations (JSON lines)");
  std::string pairs;
  loglik->add_option("--model", model, "model directory")->required();
  loglik->add_option("--pairs", pairs, "JSON lines of {context, continuation}")->required();
  loglik->add_option("--threads", threads, "compute threads")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  if (loglik->parsed()) return RunLoglik(model, pairs, threads);
  if (lynx.on && batch < 1) return Fail(pw::InvalidArgument("--lynx needs --batch B"));
  if (!apw.store.empty() && apw.bits == 0 && apw.bits_map.empty()) {
    return Fail(pw::InvalidArgument("--store needs --bits or --bits-map"));
  }
  if (apw.store.empty() && (apw.bits != 0 || !apw.bits_map.empty())) {
    return Fail(pw::InvalidArgument("--bits and --bits-map need --store"));
  }
  if (auto s = pw::misses::LoadMissToolOptions(&miss_options, &miss); !s.ok()) return Fail(s);
  if (auto s = pw::misses::CheckTraceOptions(trace); !s.ok()) return Fail(s);
  if (ppl->parsed()) return RunPpl(model, text, ctx, threads, apw, nll_out, batch, lynx, miss.settings, trace);
  return 2;
}

// pw-quantize: builds an any-precision expert store (.apw) from a checkpoint and calibration
// text, and plans per-block width maps from a store.
//   pw-quantize --model DIR --out STORE [--seed-bits 3] [--max-bits 8] [--threads N] [--verbose]
//   pw-quantize --model DIR --calib FILE --out STORE [...]
//   pw-quantize --model DIR --calib-random-tokens N [--calib-seed S] --out STORE [...]
//   pw-quantize ... --resume-dir DIR   (keep the build's progress there: a killed build resumes)
//   pw-quantize plan --store STORE --avg-bits B --out MAP.json [--random-seed S] [--min-bits 3]
//   pw-quantize residuals --model DIR --store STORE (--calib FILE | --calib-random-tokens N)
//               --out HEADS.pwrh [--prompt-tokens 64] [--max-prompts N] [--ridge R]
//   pw-quantize residuals ... --evaluate HEADS.pwrh   (score heads on other prompts)
// The work is QuantizeModel (quant/quantize_model.h) and PlanDamageRanked /
// PlanRandom (policies/planner/width_plans.h) and TrainResidualHeads (quant/residual_train.h: the
// planner's prompt residual heads, a file beside the store); this is their command line.
// Without --calib or --calib-random-tokens the store is calibrated on the bundled text
// (common/calibration/) through the model's tokenizer, or, for a checkpoint without one,
// on 4096 random ids (--calib-seed); the line it ends with says which.
// --calib-random-tokens calibrates on N token ids drawn uniformly from the vocabulary instead of
// text, so a checkpoint without a tokenizer (make_synthetic_moe's) gets a store: its widths and
// damage tables then reflect random inputs, fine for speed figures, not for quality ones.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

#include "common/formats/apw_store.h"
#include "engine/experts/apw_expert_provider.h"
#include "quant/quantize_model.h"
#include "quant/residual_train.h"
#include "policies/planner/width_plans.h"

namespace {

int Fail(const pw::Status& s) {
  std::fprintf(stderr, "pw-quantize: %s\n", s.ToString().c_str());
  return 1;
}

int RunPlan(const std::string& store_path, double avg_bits, const std::string& out,
            std::optional<uint64_t> random_seed, int min_bits) {
  auto store = pw::apw::ApwStore::Open(store_path);
  if (!store.ok()) return Fail(store.status());
  auto map = random_seed ? pw::anyprec::PlanRandom(**store, avg_bits, *random_seed, min_bits)
                         : pw::anyprec::PlanDamageRanked(**store, avg_bits, min_bits);
  if (!map.ok()) return Fail(map.status());
  const pw::apw::StoreInfo& info = (*store)->info();
  pw::Status s = map->Save(out, &info);
  if (!s.ok()) return Fail(s);
  int hist[17] = {};
  for (int l = 0; l < map->num_layers(); ++l)
    if (info.HasLayer(static_cast<uint32_t>(l)))  // a dense layer has no blocks
      for (int e = 0; e < map->num_experts(); ++e)
      for (auto p : {pw::engine::ExpertProj::kGateUp, pw::engine::ExpertProj::kDown}) ++hist[map->Get(l, e, p)];
  std::fprintf(stderr, "pw-quantize plan: %s map, average %.4f bits; blocks per width:",
               random_seed ? "random" : "damage-ranked", map->AverageBits((*store)->info()));
  for (int b = 3; b <= 8; ++b) std::fprintf(stderr, " %d:%d", b, hist[b]);
  std::fprintf(stderr, " -> %s\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pw::anyprec::QuantizeModelOptions o;
  CLI::App app{"Quantize a MoE checkpoint's experts into an any-precision .apw store"};
  app.require_subcommand(0, 1);
  app.add_option("--model", o.model_dir, "checkpoint directory (config.json, *.safetensors)");
  auto* calib = app.add_option("--calib", o.calib_path,
                               "calibration text (UTF-8; default: the bundled text through the model's tokenizer, "
                               "or 4096 random ids for a checkpoint without one)");
  auto* random_tokens =
      app.add_option("--calib-random-tokens", o.calib_random_tokens,
                     "calibrate on this many random token ids instead of --calib (no tokenizer)")
          ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  calib->excludes(random_tokens);
  app.add_option("--calib-seed", o.calib_seed, "seed of --calib-random-tokens");
  app.add_option("--out", o.out_path, "output store path (.apw)");
  app.add_option("--tokenizer", o.tokenizer_path, "tokenizer.json (default: <model>/tokenizer.json)");
  app.add_option("--seed-bits", o.seed_bits, "bits of the seed clustering")->check(CLI::Range(3, 8));
  app.add_option("--max-bits", o.max_bits, "largest width to upscale to")->check(CLI::Range(3, 8));
  app.add_option("--threads", o.threads, "worker threads")->check(CLI::Range(1, 1024));
  app.add_option("--ctx", o.ctx, "calibration window in tokens")->check(CLI::Range(2, 1 << 20));
  app.add_option("--max-calib-tokens", o.max_calib_tokens, "use at most this many calibration tokens (0 = all)");
  bool quiet = false, verbose = false;
  app.add_flag("--quiet", quiet, "no progress bar");
  app.add_flag("--verbose", verbose, "print where the time went, phase by phase");
  app.add_option("--resume-dir", o.resume_dir,
                 "keep the calibration statistics and the layers written to OUT.tmp here, so that a killed "
                 "build started again with the same options and OUT resumes; removed once the store is written");
  app.add_option("--model-hash-cache", o.model_hash_cache,
                 "directory where the checkpoint's hash is remembered between runs (pw serve's store cache); "
                 "default: every expert byte is hashed");

  auto* plan = app.add_subcommand("plan", "write a per-block width map at a target average width");
  std::string plan_store, plan_out;
  double avg_bits = 4.0;
  std::optional<uint64_t> random_seed;
  int min_bits = 3;
  plan->add_option("--store", plan_store, "the .apw store")->required();
  plan->add_option("--avg-bits", avg_bits, "target average bits per expert weight")->required();
  plan->add_option("--out", plan_out, "width map to write (JSON)")->required();
  plan->add_option("--random-seed", random_seed, "random map with this seed instead of damage-ranked");
  plan->add_option("--min-bits", min_bits, "lowest width a block may get")->check(CLI::Range(3, 8));
  auto* res = app.add_subcommand("residuals", "train the planner's prompt residual heads beside a store");
  pw::anyprec::ResidualTrainOptions ro;
  res->add_option("--model", ro.model_dir, "checkpoint directory")->required();
  res->add_option("--store", ro.store_path, "the .apw store the heads go beside")->required();
  auto* rcalib = res->add_option("--calib", ro.calib_path, "calibration text (UTF-8), split into prompts");
  auto* rrandom = res->add_option("--calib-random-tokens", ro.calib_random_tokens,
                                  "prompts of this many random token ids in all instead of --calib")
                      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  rcalib->excludes(rrandom);
  res->add_option("--calib-seed", ro.calib_seed, "seed of --calib-random-tokens");
  res->add_option("--tokenizer", ro.tokenizer_path, "tokenizer.json (default: <model>/tokenizer.json)");
  res->add_option("--prompt-tokens", ro.prompt_tokens, "tokens per calibration prompt")->check(CLI::Range(2, 1 << 20));
  res->add_option("--max-prompts", ro.max_prompts, "use at most this many prompts (0 = all)")->check(CLI::Range(0, 1 << 24));
  res->add_option("--holdout-every", ro.holdout_every, "every Nth prompt is held out for the fit figures")
      ->check(CLI::Range(2, 1000));
  res->add_option("--ridge", ro.ridge, "L2 penalty relative to the features' variance")->check(CLI::Range(0.0, 1e6));
  res->add_option("--clamp", ro.clamp, "largest |residual| a head may predict")->check(CLI::Range(1e-6, 8.0));
  res->add_option("--threads", ro.threads, "engine threads")->check(CLI::Range(1, 1024));
  auto* rout = res->add_option("--out", ro.out_path, "heads file to write (.pwrh)");
  auto* reval = res->add_option("--evaluate", ro.evaluate_heads,
                                "score these heads on the prompts (every prompt held out) instead of training");
  rout->excludes(reval);
  CLI11_PARSE(app, argc, argv);
  if (plan->parsed()) return RunPlan(plan_store, avg_bits, plan_out, random_seed, min_bits);
  if (res->parsed()) {
    if (ro.out_path.empty() && ro.evaluate_heads.empty()) {
      std::fprintf(stderr, "pw-quantize residuals: --out (or --evaluate) is required\n");
      return 2;
    }
    if (ro.calib_path.empty() && ro.calib_random_tokens == 0) {
      std::fprintf(stderr, "pw-quantize residuals: --calib or --calib-random-tokens is required\n");
      return 2;
    }
    auto r = pw::anyprec::TrainResidualHeads(ro);
    if (!r.ok()) return Fail(r.status());
    std::fprintf(stderr,
                 "pw-quantize residuals: %d prompts (%d train, %d held out), %d samples; train R^2 %.3f, "
                 "held-out R^2 %.3f, correlation %.3f (target sd %.3f); %.1fs -> %s\n",
                 r->prompts, r->train_prompts, r->heldout_prompts, r->samples, r->train_r2, r->heldout_r2,
                 r->heldout_corr, r->target_sd, r->seconds,
                 ro.evaluate_heads.empty() ? ro.out_path.c_str() : "(evaluated, nothing written)");
    return 0;
  }

  if (o.model_dir.empty() || o.out_path.empty()) {
    std::fprintf(stderr, "pw-quantize: --model and --out are required\n%s",
                 app.help().c_str());
    return 2;
  }
  if (o.seed_bits > o.max_bits) return Fail(pw::InvalidArgument("--seed-bits must not exceed --max-bits"));
  o.progress = !quiet;
  auto r = pw::anyprec::QuantizeModel(o);
  if (!r.ok()) return Fail(r.status());
  std::fprintf(stderr,
               "pw-quantize: %d blocks, %lld calibration tokens (%s)%s%s; calibration %.1fs, quantization "
               "%.1fs (%d layers reused), total %.1fs -> %s\n",
               r->num_blocks, static_cast<long long>(r->calib_tokens), r->calibration.c_str(),
               r->calibration_reused ? " (statistics reused)" : "",
               r->hash_remembered ? " (model hash remembered)" : "", r->calib_seconds, r->quantize_seconds,
               r->layers_reused, r->total_seconds, o.out_path.c_str());
  if (verbose) {
    std::fprintf(stderr,
                 "pw-quantize: time by phase (s): load %.2f, model hash %.2f%s, calibration tokens %.2f, "
                 "forward passes %.2f, sensitivities %.2f, per-row fit %.2f, write %.2f, "
                 "assemble %.2f\n",
                 r->load_seconds, r->hash_seconds, r->hash_beside_forward ? " (beside the forward passes)" : "",
                 r->tokens_seconds, r->forward_seconds, r->prepare_seconds,
                 r->fit_seconds, r->write_seconds, r->assemble_seconds);
  }
  return 0;
}

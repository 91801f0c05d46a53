// pw-quantize: builds an any-precision expert store (.apw) from a checkpoint and calibration
// text. The work is QuantizeModel (kernels/anyprec/quantize_model.h); this is its command line.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "kernels/anyprec/quantize_model.h"

int main(int argc, char** argv) {
  pw::anyprec::QuantizeModelOptions o;
  CLI::App app{"Quantize a MoE checkpoint's experts into an any-precision .apw store"};
  app.add_option("--model", o.model_dir, "checkpoint directory (config.json, *.safetensors)")->required();
  app.add_option("--calib", o.calib_path, "calibration text (UTF-8)")->required();
  app.add_option("--out", o.out_path, "output store path (.apw)")->required();
  app.add_option("--tokenizer", o.tokenizer_path, "tokenizer.json (default: <model>/tokenizer.json)");
  app.add_option("--seed-bits", o.seed_bits, "bits of the seed clustering")->check(CLI::Range(3, 8));
  app.add_option("--max-bits", o.max_bits, "largest width to upscale to")->check(CLI::Range(3, 8));
  app.add_option("--threads", o.threads, "worker threads")->check(CLI::Range(1, 1024));
  app.add_option("--ctx", o.ctx, "calibration window in tokens")->check(CLI::Range(2, 1 << 20));
  app.add_option("--max-calib-tokens", o.max_calib_tokens, "use at most this many calibration tokens (0 = all)");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress bar");
  CLI11_PARSE(app, argc, argv);
  o.progress = !quiet;
  auto r = pw::anyprec::QuantizeModel(o);
  if (!r.ok()) {
    std::fprintf(stderr, "pw-quantize: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr,
               "pw-quantize: %d blocks, %lld calibration tokens; calibration %.1fs, quantization "
               "%.1fs, total %.1fs -> %s\n",
               r->num_blocks, static_cast<long long>(r->calib_tokens), r->calib_seconds,
               r->quantize_seconds, r->total_seconds, o.out_path.c_str());
  return 0;
}

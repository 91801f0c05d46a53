// make_synthetic_moe: writes a random-weight MoE checkpoint at real dimensions (default:
// OLMoE-1B-7B's, 2 layers, about 2.1 GB of bf16) for speed measurements. Never commit its output.
//
//   make_synthetic_moe --out DIR [--type olmoe|qwen2_moe|qwen3_moe|mixtral|glm4_moe|qwen3_next|
//                            gpt_oss|gemma4|deepseek_v3]
//                      [--layers 2] [--seed 1] [--experts N] [--vocab N] [--hidden N]
//                      [--expert-ffn N] [--linear-key-heads N --linear-value-heads N
//                      --linear-head-dim N]
// (--hidden / --expert-ffn make a store with a real model's block count at a small size; the
// --linear-* sizes shrink qwen3_next's recurrent state with it: at 16 / 32 heads of 128 the
// state is 2 MiB a linear layer, reserved in every KV block: docs/architecture.md.)
// glm4_moe takes GLM-4.5-Air's shape at half width (synthetic_moe.h, Glm4MoeAirHalfSpec): the
// first layer dense, the rest MoE with one shared expert. qwen3_next takes Qwen3-Next-80B-A3B's
// layer at a quarter of its expert width (Qwen3NextQuarterSpec: 512 experts top-10, 3 of every 4
// layers Gated DeltaNet, a gated shared expert).
// gpt_oss takes gpt-oss-20b's experts and vocabulary (synthetic_moe.h, GptOss20bSpec).
// gemma4 takes Gemma-4's MoE layout at the sizes of synthetic_moe.h's Gemma4MoeSpec.
// deepseek_v3 takes DeepSeek-V3's shape at a quarter of its width with its MLA head dimensions
// (DeepseekV3QuarterSpec: latent KV of 576 values per token, 64 experts top-8 in 8 groups).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "common/logging.h"
#include "common/formats/synthetic_moe.h"

int main(int argc, char** argv) {
  pw::SetLogProcessTag("make_synthetic_moe");
  CLI::App app{"Write a random-weight MoE checkpoint (config.json + model.safetensors)"};
  std::string out, type = "olmoe";
  pw::SyntheticMoeSpec spec;
  app.add_option("--out", out, "output directory")->required();
  app.add_option("--type", type, "model type")
      ->check(CLI::IsMember(
          {"olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "glm4_moe", "qwen3_next", "gpt_oss",
           "gemma4", "deepseek_v3"}));
  app.add_option("--layers", spec.layers, "number of layers")->check(CLI::Range(1, 64));
  app.add_option("--seed", spec.seed, "random seed");
  app.add_option("--experts", spec.experts, "experts per layer")->check(CLI::Range(1, 1024));
  app.add_option("--vocab", spec.vocab, "vocabulary size")->check(CLI::Range(1, 1 << 22));
  app.add_option("--hidden", spec.hidden, "hidden size (a store's block count at a small size)")
      ->check(CLI::Range(8, 65536));
  app.add_option("--expert-ffn", spec.expert_ffn, "one expert's FFN size")
      ->check(CLI::Range(1, 65536));
  app.add_option("--n-group", spec.n_group, "glm4_moe, deepseek_v3: expert groups (n_group)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--topk-group", spec.topk_group,
                 "glm4_moe, deepseek_v3: groups kept per token (topk_group)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--linear-key-heads", spec.linear_key_heads, "qwen3_next: linear_num_key_heads")
      ->check(CLI::Range(1, 1024));
  app.add_option("--linear-value-heads", spec.linear_value_heads,
                 "qwen3_next: linear_num_value_heads (a multiple of the key heads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--linear-head-dim", spec.linear_head_dim,
                 "qwen3_next: linear_key_head_dim = linear_value_head_dim")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  // A family with a real model's shape starts from it; what the command line gave stays.
  auto from_shape = [&](pw::SyntheticMoeSpec shaped) {
    shaped.seed = spec.seed;
    if (app.count("--layers") > 0) shaped.layers = spec.layers;
    if (app.count("--experts") > 0) shaped.experts = spec.experts;
    if (app.count("--vocab") > 0) shaped.vocab = spec.vocab;
    if (app.count("--hidden") > 0) shaped.hidden = spec.hidden;
    if (app.count("--expert-ffn") > 0) shaped = pw::WithExpertFfn(shaped, spec.expert_ffn);
    if (app.count("--linear-key-heads") > 0) shaped.linear_key_heads = spec.linear_key_heads;
    if (app.count("--linear-value-heads") > 0) shaped.linear_value_heads = spec.linear_value_heads;
    if (app.count("--linear-head-dim") > 0) shaped.linear_head_dim = spec.linear_head_dim;
    return shaped;
  };
  if (type == "glm4_moe") {
    pw::SyntheticMoeSpec glm = pw::Glm4MoeAirHalfSpec();  // GLM-4.5-Air's shape at half width
    glm.n_group = spec.n_group;
    glm.topk_group = spec.topk_group;
    spec = from_shape(glm);
  }
  if (type == "deepseek_v3") {
    pw::SyntheticMoeSpec ds = pw::DeepseekV3QuarterSpec();  // its real grouping unless given
    if (app.count("--n-group") > 0) ds.n_group = spec.n_group;
    if (app.count("--topk-group") > 0) ds.topk_group = spec.topk_group;
    spec = from_shape(ds);
  }
  if (type == "qwen3_next") spec = from_shape(pw::Qwen3NextQuarterSpec());
  if (type == "gpt_oss") spec = from_shape(pw::GptOss20bSpec());
  if (type == "gemma4") spec = from_shape(pw::Gemma4MoeSpec());
  if (type == "qwen2_moe") spec.type = pw::ModelType::kQwen2Moe;
  if (type == "qwen3_moe") spec.type = pw::ModelType::kQwen3Moe;
  if (type == "mixtral") spec.type = pw::ModelType::kMixtral;
  if (spec.top_k > spec.experts) spec.top_k = spec.experts;

  const double gb = static_cast<double>(pw::SyntheticMoeBytes(spec)) / 1e9;
  PW_LOG(INFO) << "writing " << type << " with " << spec.layers << " layers (" << gb
               << " GB of bf16) to " << out;
  auto t0 = std::chrono::steady_clock::now();
  pw::Status s = pw::WriteSyntheticMoe(spec, out);
  if (!s.ok()) {
    std::fprintf(stderr, "make_synthetic_moe: %s\n", s.ToString().c_str());
    return 1;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PW_LOG(INFO) << "done in " << secs << " s";
  return 0;
}

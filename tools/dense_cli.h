// The --dense, --lm-head and --bf16-experts flags pw-eval and pw-bench-engine share: the formats
// of common/dense_format.h by name (EngineOptions::dense, ::lm_head) and how the checkpoint's
// bf16 experts are held (EngineOptions::bf16_experts).
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>

#include "common/dense_format.h"
#include "engine/experts/bf16_experts.h"

namespace pw::tools {

inline void AddDenseFlags(CLI::App* app, DenseFormat* dense, DenseFormat* lm_head) {
  const auto dense_choices = DenseFormatChoices();
  const auto lm_head_choices = LmHeadFormatChoices();
  app->add_option("--dense", *dense, "dense weights (attention, lm_head, dense MLPs): bf16, bf16-packed (the same values packed "
                  "losslessly), int8 or ap3..ap8")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DenseFormat>(dense_choices.begin(), dense_choices.end())));
  app->add_option("--lm-head", *lm_head, "the lm_head's own format: one of --dense's, or dense (the same)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DenseFormat>(lm_head_choices.begin(), lm_head_choices.end())));
}

inline void AddBf16ExpertsFlag(CLI::App* app, engine::Bf16ExpertForm* form) {
  app->add_option("--bf16-experts", *form,
                  "the checkpoint's bf16 experts: plain, packed (the same values losslessly in ~12 bits a "
                  "weight) or auto (packed with AVX512-BF16 and bf16 activations)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, engine::Bf16ExpertForm>{
          {"plain", engine::Bf16ExpertForm::kPlain},
          {"packed", engine::Bf16ExpertForm::kPacked},
          {"auto", engine::Bf16ExpertForm::kAuto}}));
}

}  // namespace pw::tools

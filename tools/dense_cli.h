// The --dense and --lm-head flags pw-eval and pw-bench-engine share: the formats of
// common/dense_format.h by name (EngineOptions::dense, ::lm_head).
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>

#include "common/dense_format.h"

namespace pw::tools {

inline void AddDenseFlags(CLI::App* app, DenseFormat* dense, DenseFormat* lm_head) {
  const auto dense_choices = DenseFormatChoices();
  const auto lm_head_choices = LmHeadFormatChoices();
  app->add_option("--dense", *dense, "dense weights (attention, lm_head, dense MLPs): bf16, int8 or ap3..ap8")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DenseFormat>(dense_choices.begin(), dense_choices.end())));
  app->add_option("--lm-head", *lm_head, "the lm_head's own format: one of --dense's, or dense (the same)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DenseFormat>(lm_head_choices.begin(), lm_head_choices.end())));
}

}  // namespace pw::tools

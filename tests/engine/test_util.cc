#include "tests/engine/test_util.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pw::engine::testing {

std::vector<RefPrompt> ReadRefLogits(const std::string& path, int64_t vocab) {
  std::vector<RefPrompt> out;
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    ADD_FAILURE() << file.status().ToString();
    return out;
  }
  for (int i = 0;; ++i) {
    const std::string p = "p" + std::to_string(i);
    if (!(*file)->Has(p + ".ids")) break;
    auto ids = (*file)->Get(p + ".ids");
    auto logits = (*file)->Get(p + ".logits");
    if (!ids.ok() || !logits.ok() || ids->dtype != DType::kI32 || logits->dtype != DType::kF32 ||
        ids->shape.size() != 1 || logits->shape != std::vector<int64_t>{ids->shape[0], vocab}) {
      ADD_FAILURE() << path << ": bad reference tensors for " << p;
      return out;
    }
    RefPrompt r;
    r.ids.resize(static_cast<size_t>(ids->shape[0]));
    std::memcpy(r.ids.data(), ids->data, ids->nbytes);
    r.logits.resize(static_cast<size_t>(logits->numel()));
    std::memcpy(r.logits.data(), logits->data, logits->nbytes);
    out.push_back(std::move(r));
  }
  EXPECT_FALSE(out.empty()) << path << " holds no prompts";
  return out;
}

}  // namespace pw::engine::testing

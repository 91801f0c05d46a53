#include "engine/models/family.h"

namespace pw::engine {

// Defined one per file, engine/models/<model_type>.cc.
extern const ModelFamily kQwen2MoeFamily;
extern const ModelFamily kQwen3MoeFamily;
extern const ModelFamily kOlmoeFamily;
extern const ModelFamily kMixtralFamily;
extern const ModelFamily kGlm4MoeFamily;
extern const ModelFamily kQwen3NextFamily;
extern const ModelFamily kQwen35MoeFamily;
extern const ModelFamily kGptOssFamily;
extern const ModelFamily kGemma4Family;
extern const ModelFamily kDeepseekV3Family;

namespace {

// The registered families; a new one adds its line.
const ModelFamily* const kFamilies[] = {
    &kQwen2MoeFamily,  &kQwen3MoeFamily,  &kOlmoeFamily,  &kMixtralFamily, &kGlm4MoeFamily,
    &kQwen3NextFamily, &kQwen35MoeFamily, &kGptOssFamily, &kGemma4Family, &kDeepseekV3Family,
};

}  // namespace

const ModelFamily* FindFamily(ModelType type) {
  for (const ModelFamily* f : kFamilies) {
    if (f->type == type) return f;
  }
  return nullptr;
}

const ModelFamily* FindFamily(std::string_view model_type) {
  for (const ModelFamily* f : kFamilies) {
    if (model_type == f->model_type) return f;
  }
  return nullptr;
}

}  // namespace pw::engine

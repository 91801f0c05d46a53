#include "services/serve/model_source.h"

#include <filesystem>

#include "common/formats/safetensors.h"
#include "common/text/tokenizer.h"
#include "kernels/anyprec/dense_ap.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/packed_bf16.h"
#include "services/common/model_name.h"
#include "services/common/tokenizer_dir.h"

namespace pw::serve {

namespace {

// ModelSource::dense_matrices of `ckpt`.
Result<std::vector<DenseShape>> DenseMatrices(const Checkpoint& ckpt, const ModelConfig& config) {
  std::vector<DenseShape> out;
  bool lm_head = false;
  std::vector<DenseShape> embed;
  for (const std::string& name : ckpt.TensorNames()) {
    PW_ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name));
    if (t.shape.size() != 2) continue;
    if (name.find(".experts.") != std::string::npos) continue;  // routed experts: the store's
    const int64_t rows = t.shape[0], cols = t.shape[1];
    if (rows < 1 || cols < 1 || cols > (int64_t{1} << 30) || rows > (int64_t{1} << 30)) continue;
    if (name.find("embed_tokens") != std::string::npos) {
      embed.push_back({rows, cols, true});
      continue;
    }
    const bool head = name.find("lm_head") != std::string::npos;
    lm_head = lm_head || head;
    out.push_back({rows, cols, head});
  }
  if (!lm_head && config.tie_word_embeddings) out.insert(out.end(), embed.begin(), embed.end());
  return out;
}

}  // namespace

uint64_t DenseCopyBytes(const ModelSource& m, DenseFormat dense, DenseFormat lm_head) {
  lm_head = LmHeadFormat(dense, lm_head);
  uint64_t total = 0;
  for (const DenseShape& d : m.dense_matrices) {
    const DenseFormat f = d.lm_head ? lm_head : dense;
    const int rows = static_cast<int>(d.rows), cols = static_cast<int>(d.cols);
    if (f == DenseFormat::kInt8) {
      total += anyprec::Q8MatrixValueBytes(rows, cols) + sizeof(float) * static_cast<uint64_t>(rows);
    } else if (f == DenseFormat::kBf16Packed) {
      total += cpu::PackedBf16Bytes(d.rows, d.cols);
    } else if (DenseApBits(f) > 0) {
      total += anyprec::DenseApBytes(rows, cols, DenseApBits(f));
    }
  }
  return total;
}

namespace fs = std::filesystem;

std::string CacheSnapshotName(const std::string& dir) {
  const fs::path p = fs::path(dir).lexically_normal();
  fs::path rev = p;
  if (!rev.has_filename()) rev = rev.parent_path();  // a trailing '/'
  const fs::path snapshots = rev.parent_path();
  const std::string repo = snapshots.parent_path().filename().string();
  if (snapshots.filename() != "snapshots" || repo.rfind("models--", 0) != 0) return "";
  // models--ORG--NAME (NAME may itself hold "--"; ORG may not).
  const std::string rest = repo.substr(8);
  const size_t sep = rest.find("--");
  if (sep == std::string::npos || sep == 0 || sep + 2 >= rest.size()) return rest;
  return rest.substr(0, sep) + "/" + rest.substr(sep + 2);
}

Result<ModelSource> OpenModelSource(const std::string& model_dir, const std::string& tokenizer) {
  ModelSource m;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return NotFound(model_dir + ": not a directory (give a checkpoint directory: config.json, "
                    "*.safetensors, tokenizer.json)");
  }
  m.dir = fs::absolute(model_dir, ec).lexically_normal().string();
  while (m.dir.size() > 1 && m.dir.back() == '/') m.dir.pop_back();
  m.default_name = CacheSnapshotName(m.dir);
  if (m.default_name.empty()) m.default_name = service::ModelNameFromDir(m.dir);

  const std::string config_path = m.dir + "/config.json";
  if (!fs::exists(config_path, ec)) {
    return NotFound(config_path + ": missing; a checkpoint directory holds the model's config.json "
                    "(download it with the weights, e.g. `huggingface-cli download ORG/NAME`)");
  }
  auto cfg = LoadModelConfig(config_path);
  if (!cfg.ok()) {
    if (cfg.status().code() == StatusCode::kUnsupported) {
      return Status(StatusCode::kUnsupported,
                    cfg.status().message() + " (pw serve runs checkpoints of the model types named there)");
    }
    return cfg.status();
  }
  m.config = std::move(*cfg);

  auto ckpt = Checkpoint::Open(m.dir);
  if (!ckpt.ok()) {
    return Status(ckpt.status().code(),
                  ckpt.status().message() + " (the checkpoint's weights are incomplete: download every "
                                            "file of model.safetensors.index.json again)");
  }
  m.checkpoint_bytes = (*ckpt)->total_bytes();
  PW_ASSIGN_OR_RETURN(m.dense_matrices, DenseMatrices(**ckpt, m.config));

  PW_ASSIGN_OR_RETURN(m.tokenizer_dir, service::TokenizerDir(m.dir, tokenizer));
  const std::string tok_path = m.tokenizer_dir + "/tokenizer.json";
  if (!fs::exists(tok_path, ec)) {
    return NotFound(tok_path + ": missing; the router tokenizes every request with the model's own "
                    "tokenizer (copy tokenizer.json and tokenizer_config.json from the model's "
                    "repository into " + m.tokenizer_dir + ", or give --tokenizer DIR|FILE: the "
                    "directory holding them, or that tokenizer.json)");
  }
  auto tok = Tokenizer::FromModelDir(m.tokenizer_dir);
  if (!tok.ok()) return Status(tok.status().code(), tok.status().message() + " (" + tok_path + ")");
  m.tokenizer_vocab = (*tok)->VocabSize();
  if (m.tokenizer_vocab > m.config.vocab_size) {
    return InvalidArgument(tok_path + ": the tokenizer has ids up to " + std::to_string(m.tokenizer_vocab - 1) +
                           " but " + config_path + " says vocab_size " + std::to_string(m.config.vocab_size) +
                           ": it is another model's tokenizer (copy this model's tokenizer.json and "
                           "tokenizer_config.json, or give --tokenizer DIR|FILE with them)");
  }
  return m;
}

}  // namespace pw::serve

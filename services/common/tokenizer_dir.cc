#include "services/common/tokenizer_dir.h"

#include <filesystem>

namespace pw::service {

namespace fs = std::filesystem;

Result<std::string> TokenizerDir(const std::string& model_dir, const std::string& tokenizer) {
  if (tokenizer.empty()) return model_dir;
  std::error_code ec;
  const fs::path p = fs::absolute(tokenizer, ec).lexically_normal();
  if (fs::is_directory(p, ec)) {
    std::string dir = p.string();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return dir;
  }
  if (!fs::exists(p, ec)) {
    return NotFound("--tokenizer " + tokenizer +
                    ": no such file or directory (give the directory holding the model's "
                    "tokenizer.json, or that file)");
  }
  if (p.filename() != "tokenizer.json") {
    return InvalidArgument("--tokenizer " + tokenizer +
                           ": a file must be a tokenizer.json (its tokenizer_config.json and "
                           "chat_template.jinja are read beside it); give that file or its "
                           "directory");
  }
  return p.parent_path().string();
}

}  // namespace pw::service

#include "services/common/model_name.h"

namespace pw::service {

std::string ModelNameFromDir(const std::string& model_dir) {
  std::string s = model_dir;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

}  // namespace pw::service

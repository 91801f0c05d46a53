#include "engine/experts/kernel_path.h"

namespace pw::anyprec {

const char* KernelPathName(KernelPath path) { return path == KernelPath::kExact ? "exact" : "fast"; }

Result<KernelPath> ParseKernelPath(const std::string& name) {
  if (name == "exact") return KernelPath::kExact;
  if (name == "fast") return KernelPath::kFast;
  return InvalidArgument("kernel path '" + name + "' is not 'exact' or 'fast'");
}

}  // namespace pw::anyprec

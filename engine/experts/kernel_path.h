// How the expert blocks of an .apw store at 3..8 bits are multiplied.
#pragma once

#include <string>

#include "common/status.h"

namespace pw::anyprec {

// How expert blocks at 3..8 bits are multiplied: kExact = fp16 LUT and fp32 activations (the
// reference, anyprec.h); kFast = int8 LUT and int8 activations (q8.h).
enum class KernelPath { kExact, kFast };
const char* KernelPathName(KernelPath path);
// "exact" or "fast".
Result<KernelPath> ParseKernelPath(const std::string& name);

}  // namespace pw::anyprec

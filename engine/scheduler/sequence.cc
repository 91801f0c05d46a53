#include "engine/scheduler/sequence.h"

namespace pw::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
  }
  return "unknown";
}

}  // namespace pw::engine

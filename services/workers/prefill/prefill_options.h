// The pw-prefill process's options, declared once (common/formats/options.h): its flags and its entry
// in the `prefill:` list of the node file (deploy/local.yaml) come from DeclarePrefillOptions.
#pragma once

#include "common/formats/options.h"
#include "services/workers/prefill/prefill_worker.h"

namespace pw::workers {

// Binds every option of `o` (its current values are the defaults). `router`, `broker` and
// `metrics` are endpoints a node file derives from `host` and the ports of its sections.
void DeclarePrefillOptions(options::OptionSet* s, PrefillWorkerOptions* o);

}  // namespace pw::workers

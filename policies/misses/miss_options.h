// The miss-policy settings (miss_settings.h) as declared options (common/formats/options.h): the
// serving decode worker's `misses:` map and its --miss-* / --residency flags come from
// DeclareMissOptions.
#pragma once

#include <string>

#include "common/formats/options.h"
#include "policies/misses/miss_settings.h"

namespace pw::misses {

// Declares every MissSettings key under `prefix` ("misses." gives misses.policy, ...): flags
// --miss-<key> and --residency / --residency-bytes. Every key is optional (unset: the preset's
// value). The rules between keys (a policy needs a budget, one budget at most) are checked on
// the map at `prefix` in files.
void DeclareMissOptions(options::OptionSet* s, MissSettings* m, const std::string& prefix);

}  // namespace pw::misses

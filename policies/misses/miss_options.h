// The miss-policy settings (miss_settings.h) as declared options (common/formats/options.h): the
// serving decode worker's `misses:` map and its --miss-* / --residency flags come from
// DeclareMissOptions; the offline tools' (pw-eval, pw-sim) flags and their --miss-config file
// from DeclareMissToolOptions over the same declaration.
#pragma once

#include <string>
#include <string_view>

#include "common/formats/options.h"
#include "common/status.h"
#include "policies/misses/miss_settings.h"

namespace pw::misses {

// Whether a map of the settings that names a policy must give its budget too.
enum class PolicyBudget {
  kInTheMap,        // a node file's `misses:` map
  kMayBeElsewhere,  // a --miss-config file: a flag may give it (or pw-sim's --residencies)
};

// Declares every MissSettings key under `prefix` ("misses." gives misses.policy, ...): flags
// --miss-<key> and --residency / --residency-bytes. Every key is optional (unset: the preset's
// value). The rules between keys (one budget at most; a policy needs a budget, per `rule`) are
// checked on the map at `prefix` in files.
void DeclareMissOptions(options::OptionSet* s, MissSettings* m, const std::string& prefix,
                        PolicyBudget rule = PolicyBudget::kInTheMap);

// The offline tools' miss options: the settings' keys at the top level (the flags above) and
// --miss-config FILE, a YAML map of the same keys, e.g.
//
//   policy: quality-first
//   eviction: lru
//   residency: 0.25
//
// checked against the same declaration as a node file's `misses:` map (a bad key, type or value
// is refused with file:line:col). Flags given on the command line win over the file, key by key;
// a budget flag (--residency or --residency-bytes) replaces the file's budget. A file may name
// a policy and leave its budget to the command line (the tool refuses a policy with none).
struct MissToolOptions {
  MissSettings settings;
  std::string config_file;  // --miss-config; empty: none
};

void DeclareMissToolOptions(options::OptionSet* s, MissToolOptions* o);

// After the command line was parsed into `s` (declared over `o`): the --miss-config file fills
// what the flags left unset. kNotFound / kIoError naming an unreadable file, kInvalidArgument
// "<file>:<line>:<col>: <key>: ..." for a bad one, or naming the flags when --residency and
// --residency-bytes are both given.
Status LoadMissToolOptions(options::OptionSet* s, MissToolOptions* o);

// `text` read as a --miss-config file without flags; `label` names it in messages.
Result<MissSettings> ParseMissSettingsYaml(std::string_view text, const std::string& label);

}  // namespace pw::misses

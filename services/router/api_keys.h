// API keys of the router's HTTP API: where they come from and how a presented key is checked.
//
// Sources, all optional and combined: --api-key (repeatable), --api-key-file (one key per
// line; blank lines and lines starting with '#' are skipped) and the environment variable
// PW_API_KEY (several keys separated by commas). A key is printable ASCII without spaces.
// Error messages name the source and line, never a key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pw::router {

inline constexpr const char* kApiKeyEnv = "PW_API_KEY";

// The keys from the three sources, duplicates removed, in order of appearance. `env_value` is
// the environment variable's value (nullptr: unset).
Result<std::vector<std::string>> LoadApiKeys(const std::vector<std::string>& flag_keys,
                                             const std::string& key_file, const char* env_value);

// True when `presented` equals `key`; the time depends on key.size() only (every byte of the
// key is compared whatever is presented).
bool ConstantTimeEquals(std::string_view presented, std::string_view key);

}  // namespace pw::router

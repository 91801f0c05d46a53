#include "services/router/api_keys.h"

#include <algorithm>
#include <fstream>

namespace pw::router {

namespace {

Status CheckKey(std::string_view key, const std::string& where) {
  if (key.empty()) return InvalidArgument(where + ": empty API key");
  for (unsigned char c : key) {
    if (c <= 0x20 || c >= 0x7f) {
      return InvalidArgument(where + ": an API key must be printable ASCII without spaces");
    }
  }
  return Status::Ok();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

Result<std::vector<std::string>> LoadApiKeys(const std::vector<std::string>& flag_keys,
                                             const std::string& key_file, const char* env_value) {
  std::vector<std::string> keys;
  auto add = [&](std::string_view k, const std::string& where) -> Status {
    PW_RETURN_IF_ERROR(CheckKey(k, where));
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.emplace_back(k);
    return Status::Ok();
  };
  for (size_t i = 0; i < flag_keys.size(); ++i) {
    PW_RETURN_IF_ERROR(add(flag_keys[i], "--api-key #" + std::to_string(i + 1)));
  }
  if (!key_file.empty()) {
    std::ifstream in(key_file);
    if (!in) return NotFound("cannot open --api-key-file " + key_file);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      std::string_view k = Trim(line);
      if (k.empty() || k.front() == '#') continue;
      PW_RETURN_IF_ERROR(add(k, key_file + ":" + std::to_string(line_no)));
    }
  }
  if (env_value != nullptr) {
    std::string_view v = env_value;
    int n = 0;
    while (true) {
      const size_t comma = v.find(',');
      std::string_view k = Trim(v.substr(0, comma));
      ++n;
      if (!k.empty()) {
        PW_RETURN_IF_ERROR(add(k, std::string(kApiKeyEnv) + " entry " + std::to_string(n)));
      }
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  return keys;
}

bool ConstantTimeEquals(std::string_view presented, std::string_view key) {
  unsigned diff = presented.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= p ^ static_cast<unsigned char>(key[i]);
  }
  // Read through a volatile so the loop is not turned into an early-exit comparison.
  volatile unsigned result = diff;
  return result == 0;
}

}  // namespace pw::router

#include "services/router/generation_defaults.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/sampling_check.h"

namespace pw::router {

using json = nlohmann::json;

Result<GenerationDefaults> ParseGenerationDefaults(const std::string& text,
                                                   const std::string& label, int64_t vocab_size) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(label + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgument(label + ": top level is not a JSON object");
  auto bad = [&](const std::string& key, const std::string& what) {
    return InvalidArgument(label + ": field '" + key + "' " + what);
  };
  GenerationDefaults d;
  for (auto [key, out] : {std::pair{"temperature", &d.temperature}, {"top_p", &d.top_p}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number()) return bad(key, "must be a number, got " + it->dump());
    if (auto e = ToSamplingFloat(key, it->get<double>(), out)) return bad(key, e->message);
  }
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > vocab_size) {
      return bad("top_k", "must be an integer in [0, " + std::to_string(vocab_size) + "], got " +
                              it->dump());
    }
    d.top_k = static_cast<int32_t>(it->get<int64_t>());
  }
  if (auto e = CheckSampling({d.temperature, d.top_p, d.top_k, -1})) {
    return bad(e->param, "is out of range: " + e->message);
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    const json ids = it->is_array() ? *it : json::array({*it});
    for (size_t i = 0; i < ids.size(); ++i) {
      const json& v = ids[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size) {
        return bad(it->is_array() ? "eos_token_id[" + std::to_string(i) + "]" : "eos_token_id",
                   "must be a token id in [0, " + std::to_string(vocab_size) + "), got " +
                       v.dump());
      }
      d.eos_token_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }
  return d;
}

Result<GenerationDefaults> LoadGenerationDefaults(const std::string& model_dir,
                                                  int64_t vocab_size) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationDefaults{};
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(path + ": cannot read");
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseGenerationDefaults(ss.str(), path, vocab_size);
}

}  // namespace pw::router

#include "services/ctl/plan_file.h"

#include "common/formats/yaml_config.h"

namespace pw::ctl {

using config::ConfigValue;
using config::Schema;

namespace {

Schema Bits() {
  return Schema::Int().Range(0, 8).Check([](const ConfigValue& v) -> std::string {
    const int64_t b = v.AsInt();
    return (b == 0 || b >= 3) ? "" : "bits must be 0 or 3..8";
  });
}

const Schema& PlanSchema() {
  static const Schema schema = Schema::Map({
      {"blocks", Schema::List(Schema::Map({
                     {"layer", Schema::Int().Range(0, 1 << 20).Required()},
                     {"expert", Schema::Int().Range(0, 1 << 20).Required()},
                     {"proj", Schema::String().OneOf({"gate_up", "down"})},
                     {"bits", Bits().Required()},
                 }))},
      {"layers", Schema::List(Schema::Map({
                     {"layer", Schema::Int().Range(0, 1 << 20).Required()},
                     {"bits", Bits().Required()},
                 }))},
  });
  return schema;
}

}  // namespace

Result<std::vector<PlanEntry>> LoadPlanFile(const std::string& path) {
  PW_ASSIGN_OR_RETURN(ConfigValue cfg, config::LoadYamlConfig(path, PlanSchema()));
  std::vector<PlanEntry> out;
  if (cfg.Has("layers")) {
    for (const auto& l : cfg["layers"].Items()) {
      out.push_back({static_cast<int>(l["layer"].AsInt()), -1, -1, static_cast<int>(l["bits"].AsInt())});
    }
  }
  if (cfg.Has("blocks")) {
    for (const auto& b : cfg["blocks"].Items()) {
      PlanEntry e;
      e.layer = static_cast<int>(b["layer"].AsInt());
      e.expert = static_cast<int>(b["expert"].AsInt());
      e.proj = b.Has("proj") ? (b["proj"].AsString() == "gate_up" ? 0 : 1) : -1;
      e.bits = static_cast<int>(b["bits"].AsInt());
      out.push_back(e);
    }
  }
  if (out.empty()) return InvalidArgument(path + ": the plan lists no blocks or layers");
  return out;
}

}  // namespace pw::ctl

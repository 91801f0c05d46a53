#include "common/formats/width_map.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

namespace pw::anyprec {

Result<WidthMap> WidthMap::Uniform(int bits, int num_layers, int num_experts) {
  if (!ValidWidth(bits)) {
    return InvalidArgument("width " + std::to_string(bits) + " is not 3..8 or 16");
  }
  if (num_layers < 1 || num_experts < 1) return InvalidArgument("width map: empty model");
  WidthMap m;
  m.num_layers_ = num_layers;
  m.num_experts_ = num_experts;
  m.bits_.assign(static_cast<size_t>(num_layers) * num_experts * 2, static_cast<uint8_t>(bits));
  return m;
}

Result<WidthMap> WidthMap::FromFile(const std::string& path, int num_layers, int num_experts) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": cannot parse width map: " + e.what());
  }
  try {
    if (!root.IsMap() || !root["default_bits"]) {
      return InvalidArgument(path + ": width map needs a top-level 'default_bits'");
    }
    auto uniform = Uniform(root["default_bits"].as<int>(), num_layers, num_experts);
    if (!uniform.ok()) return uniform.status().WithContext(path + ": default_bits");
    WidthMap m = std::move(uniform).value();
    const YAML::Node blocks = root["blocks"];
    if (blocks && !blocks.IsSequence()) return InvalidArgument(path + ": 'blocks' must be a list");
    for (size_t i = 0; blocks && i < blocks.size(); ++i) {
      const YAML::Node b = blocks[i];
      const std::string where = path + ": blocks[" + std::to_string(i) + "]";
      if (!b.IsMap() || !b["layer"] || !b["expert"] || !b["proj"] || !b["bits"]) {
        return InvalidArgument(where + ": needs layer, expert, proj and bits");
      }
      const int layer = b["layer"].as<int>(), expert = b["expert"].as<int>(), bits = b["bits"].as<int>();
      const std::string proj = b["proj"].as<std::string>();
      if (layer < 0 || layer >= num_layers || expert < 0 || expert >= num_experts) {
        return InvalidArgument(where + ": (layer " + std::to_string(layer) + ", expert " +
                               std::to_string(expert) + ") not in the model");
      }
      if (proj != "gate_up" && proj != "down") return InvalidArgument(where + ": proj must be gate_up or down");
      Status s = m.Set(layer, expert, proj == "down" ? ExpertProj::kDown : ExpertProj::kGateUp, bits);
      if (!s.ok()) return s.WithContext(where);
    }
    return m;
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": bad width map value: " + e.what());
  }
}

Result<WidthMap> WidthMap::FromFile(const std::string& path, const apw::StoreInfo& info) {
  PW_ASSIGN_OR_RETURN(WidthMap m, FromFile(path, static_cast<int>(info.num_layers), static_cast<int>(info.num_experts)));
  try {
    const YAML::Node blocks = YAML::LoadFile(path)["blocks"];
    for (size_t i = 0; blocks && i < blocks.size(); ++i) {
      const int layer = blocks[i]["layer"].as<int>();
      if (!info.HasLayer(static_cast<uint32_t>(layer))) {
        return InvalidArgument(path + ": blocks[" + std::to_string(i) + "]: layer " + std::to_string(layer) +
                               " is dense: the store holds expert blocks for layers " +
                               apw::LayerListString(info.BlockLayers()));
      }
    }
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": bad width map value: " + e.what());
  }
  return m;
}

Status WidthMap::Save(const std::string& path, const apw::StoreInfo* info) const {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return IoError(path + ": cannot write width map");
  f << "{\"default_bits\": " << static_cast<int>(bits_.empty() ? 4 : bits_[0]) << ",\n \"blocks\": [";
  bool first = true;
  for (int l = 0; l < num_layers_; ++l) {
    if (info != nullptr && !info->HasLayer(static_cast<uint32_t>(l))) continue;  // dense: no blocks
    for (int e = 0; e < num_experts_; ++e) {
      for (auto proj : {ExpertProj::kGateUp, ExpertProj::kDown}) {
        f << (first ? "\n  " : ",\n  ") << "{\"layer\": " << l << ", \"expert\": " << e
          << ", \"proj\": \"" << ExpertProjName(proj) << "\", \"bits\": " << Get(l, e, proj) << "}";
        first = false;
      }
    }
  }
  f << "\n]}\n";
  return f ? Status::Ok() : IoError(path + ": write failed");
}

Status WidthMap::Set(int layer, int expert, ExpertProj proj, int bits) {
  if (layer < 0 || layer >= num_layers_ || expert < 0 || expert >= num_experts_) {
    return InvalidArgument("width map: no block (layer " + std::to_string(layer) + ", expert " +
                           std::to_string(expert) + ")");
  }
  if (!ValidWidth(bits)) return InvalidArgument("width " + std::to_string(bits) + " is not 3..8 or 16");
  bits_[Index(layer, expert, proj)] = static_cast<uint8_t>(bits);
  return Status::Ok();
}

double WidthMap::AverageBits(const apw::StoreInfo& info) const {
  double num = 0, den = 0;
  const double gu = 2.0 * info.ffn * info.hidden, dn = 1.0 * info.hidden * info.ffn;
  for (int l = 0; l < num_layers_; ++l) {
    if (!info.HasLayer(static_cast<uint32_t>(l))) continue;  // a dense layer has no blocks
    for (int e = 0; e < num_experts_; ++e) {
      num += gu * Get(l, e, ExpertProj::kGateUp) + dn * Get(l, e, ExpertProj::kDown);
      den += gu + dn;
    }
  }
  return den > 0 ? num / den : 0;
}

}  // namespace pw::anyprec

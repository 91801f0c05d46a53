#include "tools/lynx_cli.h"

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>

#include "policies/lynx/lynx_remap.h"
#include "policies/lynx/piggyback_remap.h"

namespace pw::tools {

void AddLynxFlags(CLI::App* app, LynxFlags* f) {
  app->add_flag("--lynx", f->on, "remap decode batches' expert choices (LYNX or piggyback)");
  app->add_option("--lynx-rule", f->rule, "lynx or piggyback")->check(CLI::IsMember({"lynx", "piggyback"}));
  app->add_option("--lynx-alpha", f->alpha, "bins per logit (default from k/N)");
  app->add_option("--lynx-beta", f->beta, "lowest bin -beta (default from k/N)");
  app->add_option("--lynx-gate-weights", f->gate_weights, "renorm or mass")
      ->check(CLI::IsMember({"renorm", "mass"}));
  app->add_option("--lynx-exempt", f->exempt, "comma-separated layers left unchanged");
  app->add_option("--lynx-keep", f->keep, "piggyback: router choices each token keeps")
      ->check(CLI::Range(1, 64));
  app->add_option("--lynx-config", f->config, "YAML: rule, alpha, beta, gate_weights, exempt_layers, keep");
}

namespace {

Status ParseLayers(const std::string& s, std::vector<int>* out) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 100000) {
      return InvalidArgument("bad --lynx-exempt entry '" + item + "'");
    }
    out->push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return Status::Ok();
}

// Fills the fields the command line left at their defaults from the YAML file.
Status ApplyConfig(LynxFlags* f, std::vector<int>* exempt) {
  YAML::Node y;
  try {
    y = YAML::LoadFile(f->config);
  } catch (const std::exception& e) {
    return InvalidArgument("--lynx-config " + f->config + ": " + e.what());
  }
  try {
    if (y["rule"] && f->rule == "lynx") f->rule = y["rule"].as<std::string>();
    if (y["alpha"] && f->alpha == 0.f) f->alpha = y["alpha"].as<float>();
    if (y["beta"] && f->beta < 0) f->beta = y["beta"].as<int>();
    if (y["gate_weights"] && f->gate_weights == "renorm") f->gate_weights = y["gate_weights"].as<std::string>();
    if (y["keep"] && f->keep == 1) f->keep = y["keep"].as<int>();
    if (y["exempt_layers"] && f->exempt.empty()) {
      for (const auto& n : y["exempt_layers"]) exempt->push_back(n.as<int>());
    }
  } catch (const std::exception& e) {
    return InvalidArgument("--lynx-config " + f->config + ": " + e.what());
  }
  if (f->rule != "lynx" && f->rule != "piggyback") {
    return InvalidArgument("--lynx-config " + f->config + ": rule must be lynx or piggyback");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<lynx::BatchRemapper>> MakeRemapper(const LynxFlags& flags, int num_experts,
                                                          int top_k, std::string* description) {
  LynxFlags f = flags;
  std::vector<int> exempt;
  if (!f.config.empty()) PW_RETURN_IF_ERROR(ApplyConfig(&f, &exempt));
  PW_RETURN_IF_ERROR(ParseLayers(f.exempt, &exempt));
  PW_ASSIGN_OR_RETURN(lynx::GateWeights gw, lynx::ParseGateWeights(f.gate_weights));
  std::string exempt_text;
  for (int l : exempt) exempt_text += (exempt_text.empty() ? " exempt " : ",") + std::to_string(l);
  char buf[160];
  if (f.rule == "piggyback") {
    if (f.keep >= top_k) {
      return InvalidArgument("--lynx-keep must be below k = " + std::to_string(top_k));
    }
    lynx::PiggybackOptions o;
    o.keep = f.keep;
    o.gate_weights = gw;
    o.exempt_layers = exempt;
    std::snprintf(buf, sizeof buf, "piggyback keep %d %s", f.keep, lynx::GateWeightsName(gw));
    *description = buf + exempt_text;
    return std::unique_ptr<lynx::BatchRemapper>(new lynx::PiggybackRemapper(o));
  }
  lynx::LynxOptions o;
  o.gate_weights = gw;
  o.exempt_layers = exempt;
  lynx::LynxParams p = lynx::DefaultLynxParams(num_experts, top_k);
  const bool custom = f.alpha != 0.f || f.beta >= 0;
  if (f.alpha != 0.f) p.alpha = f.alpha;
  if (f.beta >= 0) p.beta = f.beta;
  PW_RETURN_IF_ERROR(lynx::ValidateLynxParams(p));
  if (custom) o.params = p;
  std::snprintf(buf, sizeof buf, "lynx alpha %g beta %d (%s) %s", static_cast<double>(p.alpha), p.beta,
                custom ? "per-model" : "default from k/N", lynx::GateWeightsName(gw));
  *description = buf + exempt_text;
  return std::unique_ptr<lynx::BatchRemapper>(new lynx::LynxRemapper(o));
}

}  // namespace pw::tools

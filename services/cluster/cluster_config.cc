#include "services/cluster/cluster_config.h"

#include <filesystem>
#include <set>

#include "services/broker/broker_options.h"
#include "services/router/router_options.h"
#include "services/workers/decode/decode_options.h"
#include "services/workers/prefill/prefill_options.h"

namespace pw::cluster {

using config::ConfigValue;

Result<std::string> ProcessConfigYaml(const std::string& path, Role role, const std::string& name, int indent) {
  const ConfigFlags flags{path, name, false};
  options::OptionSet set;
  Status st;
  router::RouterAppOptions r;
  broker::BrokerOptions b;
  workers::PrefillWorkerOptions p;
  workers::DecodeProcessOptions d;
  switch (role) {
    case Role::kRouter:
      router::DeclareRouterOptions(&set, &r);
      st = ApplyNodeConfig(flags, role, &set);
      break;
    case Role::kBroker:
      broker::DeclareBrokerOptions(&set, &b);
      st = ApplyNodeConfig(flags, role, &set);
      if (st.ok()) st = b.planner.Validate();
      break;
    case Role::kPrefill:
      workers::DeclarePrefillOptions(&set, &p);
      st = ApplyNodeConfig(flags, role, &set);
      break;
    case Role::kDecode:
      workers::DeclareDecodeOptions(&set, &d);
      st = ApplyNodeConfig(flags, role, &set);
      if (st.ok()) st = workers::ResolveDecodeOptions(&d);
      break;
  }
  if (!st.ok()) {  // file errors carry the file's position already; the others name the process
    return st.message().rfind(path, 0) == 0 ? st : Status(st.code(), path + ": " + name + ": " + st.message());
  }
  return set.DumpYaml(indent);
}

Result<ClusterConfig> LoadClusterConfig(const std::string& path, const std::string& default_bin_dir) {
  PW_ASSIGN_OR_RETURN(ConfigValue root, LoadNodeFile(path));
  LauncherOptions lo;
  options::OptionSet ls;
  DeclareLauncherOptions(&ls, &lo);
  PW_RETURN_IF_ERROR(ls.ApplyFile(root, root));
  ClusterConfig out;
  std::error_code ec;
  out.config_path = std::filesystem::absolute(path, ec).lexically_normal().string();
  if (ec) out.config_path = path;
  out.model_dir = lo.model_dir;
  out.host = lo.host;
  out.run_dir = lo.run_dir;
  out.drain_timeout_ms = lo.drain_timeout_ms;
  out.restart = lo.restart;
  const std::string bin = lo.bin_dir.empty() ? default_bin_dir : lo.bin_dir;
  const ConfigValue& router = root["router"];
  const ConfigValue& broker = root["broker"];
  {
    router::RouterAppOptions r;
    options::OptionSet rs;
    router::DeclareRouterOptions(&rs, &r);
    PW_RETURN_IF_ERROR(rs.ApplyFile(root, router));
    out.http_port = r.http.port;
  }

  // Distinct ports and ids, each error pointing at the offending value.
  std::set<int64_t> ports;
  std::set<std::string> ids = {"router", "broker"};
  auto use_port = [&](const ConfigValue* v) -> Status {
    if (v == nullptr || v->AsInt() == 0) return Status::Ok();
    if (!ports.insert(v->AsInt()).second) return v->Error("port " + std::to_string(v->AsInt()) + " is used twice");
    return Status::Ok();
  };
  if (router.Has("port")) {
    PW_RETURN_IF_ERROR(use_port(router.Find("port")));
  } else {
    ports.insert(out.http_port);
  }
  PW_RETURN_IF_ERROR(use_port(router.Find("control_port")));
  const bool broker_on = broker["enabled"].AsBool();
  if (broker_on) {
    PW_RETURN_IF_ERROR(use_port(broker.Find("control_port")));
    PW_RETURN_IF_ERROR(use_port(broker.Find("metrics_port")));
  }
  auto metrics = [&](const ConfigValue& section) {
    const int64_t port = section["metrics_port"].AsInt();
    return port == 0 ? std::string() : out.host + ":" + std::to_string(port);
  };
  auto spec = [&](const std::string& name, Role role, const char* binary, int start, int stop) {
    return ProcessSpec{name, {bin + "/" + binary, "--config", out.config_path, "--section", name}, start, stop, role};
  };
  if (broker_on) {
    out.processes.push_back(spec("broker", Role::kBroker, "pw-broker", 0, 2));
    if (const std::string m = metrics(broker); !m.empty()) out.scrape_targets.push_back({"broker", "broker", m});
  }
  out.processes.push_back(spec("router", Role::kRouter, "pw-router", 1, 0));
  out.scrape_targets.push_back({"router", "router", out.host + ":" + std::to_string(out.http_port)});
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    for (const ConfigValue& w : root[RoleName(role)].Items()) {
      const std::string id = w["id"].AsString();
      if (!ids.insert(id).second) return w["id"].Error("id '" + id + "' is used twice");
      PW_RETURN_IF_ERROR(use_port(w.Find("metrics_port")));
      out.processes.push_back(spec(id, role, role == Role::kPrefill ? "pw-prefill" : "pw-decode", 2, 1));
      if (const std::string m = metrics(w); !m.empty()) out.scrape_targets.push_back({id, RoleName(role), m});
    }
  }
  // Each process's options as it will load them: a bad combination stops the node here.
  for (const ProcessSpec& p : out.processes) {
    PW_RETURN_IF_ERROR(ProcessConfigYaml(path, p.role, p.name).status());
  }
  return out;
}

Result<std::string> DumpNodeConfig(const std::string& path) {
  PW_ASSIGN_OR_RETURN(ClusterConfig cfg, LoadClusterConfig(path, "."));
  std::string out = "# The effective options of every process of " + path + " (defaults filled in).\n";
  for (const ProcessSpec& p : cfg.processes) {
    PW_ASSIGN_OR_RETURN(std::string yaml, ProcessConfigYaml(path, p.role, p.name, 2));
    out += p.name + ":  # " + RoleName(p.role) + "\n" + yaml;
  }
  return out;
}

}  // namespace pw::cluster

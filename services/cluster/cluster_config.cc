#include "services/cluster/cluster_config.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <set>

#include "services/common/model_name.h"
#include "services/router/http_server.h"

namespace pw::cluster {

using config::ConfigValue;

Result<ClusterConfig> LoadClusterConfig(const std::string& path, const std::string& default_bin_dir) {
  PW_ASSIGN_OR_RETURN(ConfigValue root, service::LoadNodeFile(path, service::NodeTables{}));
  service::LauncherOptions lo;
  options::OptionSet ls;
  service::DeclareLauncherOptions(&ls, &lo);
  PW_RETURN_IF_ERROR(ls.ApplyFile(root, root));
  ClusterConfig out;
  std::error_code ec;
  out.config_path = std::filesystem::absolute(path, ec).lexically_normal().string();
  if (ec) out.config_path = path;
  out.model_dir = lo.model_dir;
  // The name every process serves (router_options.h: model_name, default the directory's).
  out.model_name = lo.model_name.empty() ? service::ModelNameFromDir(lo.model_dir) : lo.model_name;
  out.host = lo.host;
  out.run_dir = lo.run_dir;
  out.drain_timeout_ms = lo.drain_timeout_ms;
  out.restart = lo.restart;
  const std::string bin = lo.bin_dir.empty() ? default_bin_dir : lo.bin_dir;
  const ConfigValue& router = root["router"];
  const ConfigValue& broker = root["broker"];

  // Distinct ports and ids, each error pointing at the offending value. The router's HTTP port
  // is its own option (router_options.h); its default, 8000, when the file has none.
  std::set<int64_t> ports;
  std::set<std::string> ids = {"router", "broker"};
  auto use_port = [&](const ConfigValue& section, const char* key) -> Status {
    const ConfigValue* v = section.Find(key);
    if (v == nullptr || v->kind() != ConfigValue::Kind::kInt || v->AsInt() == 0) return Status::Ok();
    if (v->AsInt() < 0 || v->AsInt() > 65535) return v->Error(std::to_string(v->AsInt()) + " is out of range [1, 65535]");
    if (!ports.insert(v->AsInt()).second) return v->Error("port " + std::to_string(v->AsInt()) + " is used twice");
    return Status::Ok();
  };
  out.http_port = router.Has("port") ? router["port"].AsInt() : router::HttpServerOptions{}.port;
  PW_RETURN_IF_ERROR(use_port(router, "port"));
  if (!router.Has("port")) ports.insert(out.http_port);
  PW_RETURN_IF_ERROR(use_port(router, "control_port"));
  const bool broker_on = broker["enabled"].AsBool();
  if (broker_on) {
    PW_RETURN_IF_ERROR(use_port(broker, "control_port"));
    PW_RETURN_IF_ERROR(use_port(broker, "metrics_port"));
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
    for (const ConfigValue& w : root[service::RoleName(role)].Items()) {
      const std::string id = w["id"].AsString();
      if (!ids.insert(id).second) return w["id"].Error("id '" + id + "' is used twice");
      PW_RETURN_IF_ERROR(use_port(w, "metrics_port"));
      out.processes.push_back(spec(id, role, role == Role::kPrefill ? "pw-prefill" : "pw-decode", 2, 1));
      if (const std::string m = metrics(w); !m.empty()) out.scrape_targets.push_back({id, service::RoleName(role), m});
    }
  }
  return out;
}

namespace {

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

Result<std::string> CheckProcesses(const ClusterConfig& cfg) {
  std::string out = "# The effective options of every process of " + cfg.config_path + " (defaults filled in).\n";
  for (const ProcessSpec& p : cfg.processes) {
    std::string cmd;
    for (const auto& a : p.argv) cmd += Quote(a) + " ";
    cmd += "--print-config 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    if (f == nullptr) return IoError("cannot run " + p.argv[0]);
    std::string text;
    std::array<char, 4096> buf;
    for (size_t n; (n = fread(buf.data(), 1, buf.size(), f)) > 0;) text.append(buf.data(), n);
    const int st = pclose(f);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      while (!text.empty() && text.back() == '\n') text.pop_back();
      return InvalidArgument(p.name + " (" + p.argv[0] + ") refuses its options: " + text);
    }
    out += p.name + ":  # " + service::RoleName(p.role) + "\n";
    for (size_t pos = 0; pos < text.size();) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      out += "  " + text.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
  }
  return out;
}

}  // namespace pw::cluster

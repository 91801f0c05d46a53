#include "services/common/node_config.h"

#include <CLI/CLI.hpp>

#include "common/peer_id.h"

namespace pw::service {

using config::ConfigValue;
using config::Schema;

const char* RoleName(Role r) {
  switch (r) {
    case Role::kRouter:
      return "router";
    case Role::kBroker:
      return "broker";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "?";
}

void AddConfigFlags(CLI::App* app, ConfigFlags* f) {
  app->add_option("--config", f->path,
                  "node YAML file (deploy/local.yaml); flags given as well override its values");
  app->add_option("--section", f->section,
                  "this process's section of --config: router, broker or a worker's id (default: the "
                  "process's own; a worker: its --id, else the first of its list)");
  app->add_flag("--print-config", f->print, "print the effective options (defaults filled in) as YAML and exit");
}

void DeclareLauncherOptions(options::OptionSet* s, LauncherOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory").Required().NonEmpty();
  s->Add("model_name", &o->model_name, "model id clients send (default: directory name)");
  s->Add("host", &o->host, "the host of every endpoint of the node").NonEmpty();
  s->Add("run_dir", &o->run_dir, "directory for per-process logs and the control keys").NonEmpty();
  s->Add("bin_dir", &o->bin_dir, "directory of the binaries (default: pw-cluster's)").NonEmpty();
  s->Add("drain_timeout_ms", &o->drain_timeout_ms, "SIGINT/SIGTERM: how long each group may drain")
      .Range(0, 3600000);
  RestartPolicy& r = o->restart;
  s->Add("restart.initial_backoff_ms", &r.initial_backoff_ms, "first restart delay").Range(0, 600000);
  s->Add("restart.max_backoff_ms", &r.max_backoff_ms, "longest restart delay").Range(0, 3600000);
  s->Add("restart.stable_after_ms", &r.stable_after_ms, "up this long resets the backoff").Range(0, 3600000);
  s->Add("restart.fail_fast_ms", &r.fail_fast_ms, "an exit this soon after start counts as quick").Range(0, 3600000);
  s->Add("restart.fail_fast_exits", &r.fail_fast_exits, "quick exits in a row that stop the node (0: never)")
      .Range(0, 1000);
}

namespace {

Schema Port(int64_t def) { return Schema::Int().Range(1, 65535).Default(def); }
Schema OptPort() { return Schema::Int().Range(0, 65535).Default(int64_t{0}); }

// A worker entry names itself: the id is required in the file (a worker given flags only may
// go without).
std::string NeedsId(const ConfigValue& v) { return v.Has("id") ? "" : "id: required key is missing"; }

// A section: its table's keys with the wiring keys, or (no table) the wiring keys alone.
Schema Section(const options::OptionSet* table, std::vector<std::pair<std::string, Schema>> wiring) {
  if (table != nullptr) return table->SectionSchema(std::move(wiring));
  Schema s = Schema::Map(std::move(wiring)).AllowOtherKeys();
  return s;
}

std::string Host(const ConfigValue& root) {
  return root.Has("host") ? root["host"].AsString() : LauncherOptions{}.host;
}

std::string Endpoint(const ConfigValue& root, const ConfigValue& section) {
  return "tcp://" + Host(root) + ":" + std::to_string(section["control_port"].AsInt());
}

// host:metrics_port, or "" when the port is 0.
std::string MetricsBind(const ConfigValue& root, const ConfigValue& section) {
  const int64_t port = section["metrics_port"].AsInt();
  return port == 0 ? "" : Host(root) + ":" + std::to_string(port);
}

}  // namespace

Schema NodeSchema(const NodeTables& t) {
  LauncherOptions launcher;
  options::OptionSet ls;
  DeclareLauncherOptions(&ls, &launcher);
  std::vector<std::pair<std::string, Schema>> root;
  // The shared keys: typed by the first table that declares them (a dotted key nests), else
  // unchecked.
  auto first_part = [](const std::string& k) { return k.substr(0, k.find('.')); };
  for (const char* key : kSharedKeys) {
    if (ls.Find(key) != nullptr) continue;
    bool typed = false;
    for (const options::OptionSet* table : {t.router, t.broker, t.prefill, t.decode}) {
      if (table == nullptr || typed) continue;
      for (auto& [k, schema] : table->SharedFields()) {
        if (first_part(k) != key) continue;
        root.emplace_back(k, schema);
        typed = true;
      }
    }
    if (!typed) root.emplace_back(key, Schema::Any());
  }
  for (const options::OptionSet* table : {t.router, t.broker, t.prefill, t.decode}) {
    if (table == nullptr) continue;
    for (const auto& [k, unused] : table->SharedFields()) {
      bool listed = false;
      for (const char* key : kSharedKeys) listed = listed || first_part(k) == key;
      PW_CHECK_MSG(listed, ("a Shared option not in kSharedKeys: " + k).c_str());
    }
  }
  // Without the router's table its HTTP port is read as wiring too (the launcher's scrape target).
  root.emplace_back("router", t.router != nullptr
                                  ? Section(t.router, {{"control_port", Port(5555)}})
                                  : Section(nullptr, {{"control_port", Port(5555)}, {"port", Schema::Int().Range(0, 65535)}}));
  root.emplace_back("broker", Section(t.broker, {{"enabled", Schema::Bool().Default(true)},
                                                 {"control_port", Port(5556)},
                                                 {"metrics_port", OptPort()},
                                                 {"planner.async_movement", Schema::Bool().Default(true)}}));
  if (t.broker == nullptr) {  // the planner map of an unchecked broker section: its wiring key only
    root.back().second = Schema::Map({{"enabled", Schema::Bool().Default(true)},
                                      {"control_port", Port(5556)},
                                      {"metrics_port", OptPort()},
                                      {"planner", Schema::Map({{"async_movement", Schema::Bool().Default(true)}})
                                                      .AllowOtherKeys()}})
                             .AllowOtherKeys();
  }
  for (auto [name, table] : {std::pair{"prefill", t.prefill}, std::pair{"decode", t.decode}}) {
    std::vector<std::pair<std::string, Schema>> wiring = {{"metrics_port", OptPort()}};
    if (table == nullptr) {
      wiring.emplace_back("id", Schema::String().NonEmpty().Check([](const ConfigValue& v) {
        return PeerIdProblem(v.AsString());
      }));
    }
    root.emplace_back(name, Schema::List(Section(table, std::move(wiring)).Check(NeedsId)).Size(1, 64).Required());
  }
  return ls.SectionSchema(std::move(root));
}

Result<ConfigValue> LoadNodeFile(const std::string& path, const NodeTables& tables) {
  return config::LoadYamlConfig(path, NodeSchema(tables));
}

Result<ConfigValue> SectionOf(const ConfigValue& root, Role role, const std::string& name) {
  if (role == Role::kRouter || role == Role::kBroker) {
    if (!name.empty() && name != RoleName(role)) {
      return root.Error(std::string("a ") + RoleName(role) + " reads the section '" + RoleName(role) + "', not '" +
                        name + "'");
    }
    return root[RoleName(role)];
  }
  const ConfigValue& list = root[RoleName(role)];
  std::string ids;
  for (const ConfigValue& w : list.Items()) {
    if (name.empty() || w["id"].AsString() == name) return w;
    ids += (ids.empty() ? "" : ", ") + w["id"].AsString();
  }
  return list.Error("no " + std::string(RoleName(role)) + " worker with id '" + name + "' (ids: " + ids + ")");
}

Status ApplyNodeConfig(const ConfigFlags& f, Role role, options::OptionSet* set, NodeTables others,
                       const DeriveFn& derive) {
  if (!f.path.empty()) {
    NodeTables tables = others;
    (role == Role::kRouter    ? tables.router
     : role == Role::kBroker  ? tables.broker
     : role == Role::kPrefill ? tables.prefill
                              : tables.decode) = set;
    PW_ASSIGN_OR_RETURN(ConfigValue root, LoadNodeFile(f.path, tables));
    std::string name = f.section;
    if (name.empty() && (role == Role::kPrefill || role == Role::kDecode)) {
      const options::Option* id = set->Find("id");
      if (id != nullptr) name = id->Value().AsString();  // --id picks the entry (else the first)
    }
    PW_ASSIGN_OR_RETURN(ConfigValue section, SectionOf(root, role, name));
    PW_RETURN_IF_ERROR(set->ApplyFile(root, section));
    const ConfigValue& broker = root["broker"];
    switch (role) {
      case Role::kRouter:
        PW_RETURN_IF_ERROR(set->Derive("workers", ConfigValue(Endpoint(root, section))));
        break;
      case Role::kBroker:
        PW_RETURN_IF_ERROR(set->Derive("bind", ConfigValue(Endpoint(root, section))));
        if (const std::string m = MetricsBind(root, section); !m.empty()) {
          PW_RETURN_IF_ERROR(set->Derive("metrics", ConfigValue(m)));
        }
        break;
      case Role::kPrefill:
      case Role::kDecode:
        {
          ConfigValue routers = ConfigValue::EmptyList();
          routers.Push(ConfigValue(Endpoint(root, root["router"])));
          PW_RETURN_IF_ERROR(set->Derive("router", routers));
        }
        if (broker["enabled"].AsBool()) PW_RETURN_IF_ERROR(set->Derive("broker", ConfigValue(Endpoint(root, broker))));
        if (const std::string m = MetricsBind(root, section); !m.empty()) {
          PW_RETURN_IF_ERROR(set->Derive("metrics", ConfigValue(m)));
        }
        break;
    }
    if (derive) PW_RETURN_IF_ERROR(derive(root, section));
  }
  return set->CheckRequired();
}

}  // namespace pw::service

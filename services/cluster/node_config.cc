#include "services/cluster/node_config.h"

#include <CLI/CLI.hpp>

#include "services/broker/broker_options.h"
#include "services/router/router_options.h"
#include "services/workers/decode/decode_options.h"
#include "services/workers/prefill/prefill_options.h"

namespace pw::cluster {

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

// The launcher's section is the root itself.
void DeclareLauncherOptions(options::OptionSet* s, LauncherOptions* o) {
  s->Add("model_dir", &o->model_dir, "model directory").Required().NonEmpty();
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

// A worker entry names itself: the id is required in the file (a flag-only worker may omit it).
std::string NeedsId(const ConfigValue& v) { return v.Has("id") ? "" : "id: required key is missing"; }

Schema BuildNodeSchema() {
  // The declarations fill these structs' fields only while loading; the schema keeps none.
  LauncherOptions launcher;
  router::RouterAppOptions router;
  broker::BrokerOptions broker;
  workers::PrefillWorkerOptions prefill;
  workers::DecodeProcessOptions decode;
  options::OptionSet ls, rs, bs, ps, ds;
  DeclareLauncherOptions(&ls, &launcher);
  router::DeclareRouterOptions(&rs, &router);
  broker::DeclareBrokerOptions(&bs, &broker);
  workers::DeclarePrefillOptions(&ps, &prefill);
  workers::DeclareDecodeOptions(&ds, &decode);
  ps.AddCheck("", NeedsId);
  ds.AddCheck("", NeedsId);

  // The root: the launcher's keys, the processes' shared keys (the first declaration of a
  // key gives its schema), then the sections.
  std::vector<std::pair<std::string, Schema>> root;
  auto declared = [&](const std::string& key) {
    if (ls.Find(key) != nullptr) return true;
    for (const auto& [k, unused] : root) {
      if (k == key) return true;
    }
    return false;
  };
  for (const options::OptionSet* set : {&rs, &bs, &ps, &ds}) {
    for (auto& [key, schema] : set->SharedFields()) {
      if (!declared(key)) root.emplace_back(key, schema);
    }
  }
  root.emplace_back("router", rs.SectionSchema({{"control_port", Port(5555)}}));
  root.emplace_back("broker", bs.SectionSchema({{"enabled", Schema::Bool().Default(true)},
                                                {"control_port", Port(5556)},
                                                {"metrics_port", OptPort()},
                                                {"planner.async_movement", Schema::Bool().Default(true)}}));
  root.emplace_back("prefill", Schema::List(ps.SectionSchema({{"metrics_port", OptPort()}})).Size(1, 64).Required());
  root.emplace_back("decode", Schema::List(ds.SectionSchema({{"metrics_port", OptPort()}})).Size(1, 64).Required());
  return ls.SectionSchema(std::move(root));
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

Status DeriveWorker(const ConfigValue& root, const ConfigValue& section, Role role, options::OptionSet* set) {
  PW_RETURN_IF_ERROR(set->Derive("router", ConfigValue(Endpoint(root, root["router"]))));
  const ConfigValue& b = root["broker"];
  if (b["enabled"].AsBool()) PW_RETURN_IF_ERROR(set->Derive("broker", ConfigValue(Endpoint(root, b))));
  if (const std::string m = MetricsBind(root, section); !m.empty()) {
    PW_RETURN_IF_ERROR(set->Derive("metrics", ConfigValue(m)));
  }
  if (role != Role::kDecode || !b["enabled"].AsBool()) return Status::Ok();
  // The broker's effective planner, through its own declarations.
  broker::BrokerOptions bo;
  options::OptionSet bs;
  broker::DeclareBrokerOptions(&bs, &bo);
  PW_RETURN_IF_ERROR(bs.ApplyFile(root, b));
  if (!bo.planner.enabled) return Status::Ok();
  // Held reservations count what a lowering to the planner's floors would free.
  PW_RETURN_IF_ERROR(set->Derive("planner_min_bits", ConfigValue(bo.planner.min_bits)));
  PW_RETURN_IF_ERROR(set->Derive("planner_max_bits", ConfigValue(bo.planner.max_bits)));
  PW_RETURN_IF_ERROR(set->Derive("planner_min_mean_bits", ConfigValue(bo.planner.min_mean_bits)));
  if (!b["planner"]["async_movement"].AsBool()) {
    PW_RETURN_IF_ERROR(set->Derive("plans_at_request_boundaries", ConfigValue(true)));
  }
  return Status::Ok();
}

}  // namespace

const Schema& NodeSchema() {
  static const Schema schema = BuildNodeSchema();
  return schema;
}

Result<ConfigValue> LoadNodeFile(const std::string& path) { return config::LoadYamlConfig(path, NodeSchema()); }

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

Status ApplyNodeConfig(const ConfigFlags& f, Role role, options::OptionSet* set) {
  if (!f.path.empty()) {
    PW_ASSIGN_OR_RETURN(ConfigValue root, LoadNodeFile(f.path));
    std::string name = f.section;
    if (name.empty() && (role == Role::kPrefill || role == Role::kDecode)) {
      const options::Option* id = set->Find("id");
      if (id != nullptr) name = id->Value().AsString();  // --id picks the entry (else the first)
    }
    PW_ASSIGN_OR_RETURN(ConfigValue section, SectionOf(root, role, name));
    PW_RETURN_IF_ERROR(set->ApplyFile(root, section));
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
        PW_RETURN_IF_ERROR(DeriveWorker(root, section, role, set));
        break;
    }
  }
  return set->CheckRequired();
}

}  // namespace pw::cluster

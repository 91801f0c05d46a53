// The node file (deploy/local.yaml): one YAML for every process of a node. pw-cluster reads it
// to start the node; each process given `--config FILE [--section NAME]` reads the same file
// and takes its own section, so a Kubernetes ConfigMap holding the file configures a single
// process as well as a launcher.
//
// Layout. The root holds the keys the processes share (kSharedKeys: each process's options
// marked Shared) and the launcher's (run_dir, bin_dir, restart); then one section per process:
//   router:   the options of router_options.h            + control_port (5555)
//   broker:   the options of broker_options.h            + enabled (true), control_port (5556),
//                                                          metrics_port (0), planner.async_movement
//   prefill:  [ the options of prefill_options.h, each    + metrics_port (0) ]   (1..64, by id)
//   decode:   [ the options of decode_options.h, each     + metrics_port (0) ]   (1..64, by id)
// The keys after '+' are the node's wiring, from which a process derives what it would
// otherwise be given as flags:
//   router --workers, prefill/decode --router   tcp://<host>:<router.control_port>
//   broker --bind, prefill/decode --broker      tcp://<host>:<broker.control_port> (broker.enabled)
//   --metrics                                   <host>:<metrics_port> (0 = none)
//   decode: the broker planner's widths and async_movement (decode_options.h)
// A process checks the root, its own section and the sections whose tables it is given
// (NodeTables) fully, and the other sections' wiring keys only; pw-cluster checks the wiring,
// then has every process check its own section before it starts any (`--print-config`).
// Precedence in a process: its flags, then its section (and the shared root keys), then the
// derived values, then the defaults of its options struct.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/formats/options.h"
#include "common/formats/yaml_config.h"
#include "common/status.h"

namespace CLI {
class App;
}

namespace pw::service {

enum class Role { kRouter, kBroker, kPrefill, kDecode };
const char* RoleName(Role r);  // "router", "broker", "prefill", "decode"

// The root keys processes share. A process option declared Shared must be one of these (so
// that every process accepts the key even when it does not read it).
// A dotted key ("kernels.cpu_isa") is under its first part.
inline constexpr const char* kSharedKeys[] = {"model_dir", "model_name",       "host",    "heartbeat_ms",
                                              "kv_dtype",  "drain_timeout_ms", "kernels", "dense",
                                              "lm_head"};

// --config FILE, --section NAME, --print-config: the flags every process adds.
struct ConfigFlags {
  std::string path;     // the node file; empty: flags only
  std::string section;  // router | broker | a worker's id; empty: the role's (a worker: its
                        // --id, else the first entry of its list)
  bool print = false;   // print the effective options as YAML and exit 0
};
void AddConfigFlags(CLI::App* app, ConfigFlags* f);

// The launcher's own keys (pw-cluster), at the root of the node file.
struct RestartPolicy {
  int64_t initial_backoff_ms = 500;   // first restart delay; doubles per quick death
  int64_t max_backoff_ms = 10000;
  int64_t stable_after_ms = 10000;    // a process up this long resets its backoff
  // Fail fast: a process that exits within fail_fast_ms of its start fail_fast_exits times in
  // a row (a bad model directory, a port in use) stops the node instead of being restarted
  // forever; an exit after a longer run resets the count. fail_fast_exits = 0: never.
  int64_t fail_fast_ms = 5000;
  int64_t fail_fast_exits = 3;
};
struct LauncherOptions {
  std::string model_dir;
  std::string model_name;          // for the curl line it prints; "" = the directory's name
  std::string host = "127.0.0.1";  // every endpoint's host
  std::string run_dir = "build/run";
  std::string bin_dir;             // empty: the directory of pw-cluster
  int64_t drain_timeout_ms = 30000;
  RestartPolicy restart;
};
// The launcher's section is the root itself.
void DeclareLauncherOptions(options::OptionSet* s, LauncherOptions* o);

// The option tables a reader of the file knows; the sections of the others are checked for
// their wiring keys only.
struct NodeTables {
  const options::OptionSet* router = nullptr;
  const options::OptionSet* broker = nullptr;
  const options::OptionSet* prefill = nullptr;
  const options::OptionSet* decode = nullptr;
};

// The schema of the node file for a reader that knows `tables`.
config::Schema NodeSchema(const NodeTables& tables);

// Loads `path` and checks it against NodeSchema(tables) (errors: file:line:col: key path: ...).
Result<config::ConfigValue> LoadNodeFile(const std::string& path, const NodeTables& tables);

// The section of process `name` in `root`: "router", "broker", or a worker's id (the entry of
// prefill: or decode: with that id, as `role` says; "" = the first). kInvalidArgument naming
// the file and the ids there are when there is none.
Result<config::ConfigValue> SectionOf(const config::ConfigValue& root, Role role, const std::string& name);

// Values a process derives from other parts of the file than its section (decode_options.h).
using DeriveFn = std::function<Status(const config::ConfigValue& root, const config::ConfigValue& section)>;

// For a process of `role` with options `set` (declared, its flags parsed): when f.path is set,
// loads the node file (checked with `set` as the role's table, plus `others`), applies the
// process's section, the wiring the file derives for it (see the top of this file) and
// `derive`; then checks every required option was given.
Status ApplyNodeConfig(const ConfigFlags& f, Role role, options::OptionSet* set, NodeTables others = {},
                       const DeriveFn& derive = nullptr);

}  // namespace pw::service

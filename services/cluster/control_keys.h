// The node's control-plane credentials: pw-cluster generates fresh CURVE keys for every run
// into <run_dir>/control.keys (mode 0600, see services/transport/curve_keys.h) and passes the
// file to every child with --control-keys; restarted children reuse it. With `insecure`
// (tests only) no keys are written and every child gets --insecure instead.
#pragma once

#include <string>

#include "common/status.h"
#include "services/cluster/cluster_config.h"

namespace pw::cluster {

// The key file of a run directory.
std::string ControlKeysPath(const std::string& run_dir);

// Creates the run directory if needed, writes fresh keys (or, with `insecure`, nothing) and
// appends the matching flag to every process of `cfg`.
Status PrepareControlKeys(ClusterConfig* cfg, bool insecure);

}  // namespace pw::cluster

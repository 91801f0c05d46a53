#include "services/cluster/control_keys.h"

#include <filesystem>

#include "common/logging.h"
#include "services/transport/curve_keys.h"

namespace pw::cluster {

std::string ControlKeysPath(const std::string& run_dir) { return run_dir + "/control.keys"; }

Status PrepareControlKeys(ClusterConfig* cfg, bool insecure) {
  if (insecure) {
    PW_LOG(WARNING) << "**** --insecure: the node's control plane is NOT authenticated; any "
                       "local process can pose as one of its workers. Tests only. ****";
    for (ProcessSpec& p : cfg->processes) p.argv.push_back("--insecure");
    return Status::Ok();
  }
  std::error_code ec;
  std::filesystem::create_directories(cfg->run_dir, ec);
  if (ec) return IoError("cannot create run directory '" + cfg->run_dir + "': " + ec.message());
  PW_ASSIGN_OR_RETURN(transport::CurveKeys keys, transport::GenerateCurveKeys());
  const std::string path = ControlKeysPath(cfg->run_dir);
  PW_RETURN_IF_ERROR(transport::WriteCurveKeys(path, keys));
  for (ProcessSpec& p : cfg->processes) {
    p.argv.push_back("--control-keys");
    p.argv.push_back(path);
  }
  return Status::Ok();
}

}  // namespace pw::cluster

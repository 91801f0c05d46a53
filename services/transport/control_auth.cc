#include "services/transport/control_auth.h"

#include <mutex>

#include "common/logging.h"

namespace pw::transport {

namespace {
std::mutex& AuthMu() {
  static std::mutex mu;
  return mu;
}
ControlAuth& AuthSlot() {
  static ControlAuth* auth = new ControlAuth();  // never destroyed: sockets may outlive main
  return *auth;
}
}  // namespace

void SetDefaultControlAuth(ControlAuth auth) {
  std::lock_guard<std::mutex> lock(AuthMu());
  AuthSlot() = std::move(auth);
}

ControlAuth DefaultControlAuth() {
  std::lock_guard<std::mutex> lock(AuthMu());
  return AuthSlot();
}

Result<ControlAuth> ControlAuthFromFlags(const std::string& keys_path, bool insecure,
                                         const std::string& process) {
  if (!keys_path.empty() && insecure) {
    return InvalidArgument("--control-keys and --insecure exclude each other");
  }
  if (insecure) {
    for (int i = 0; i < 3; ++i) {
      PW_LOG(WARNING) << "**** " << process
                      << ": --insecure: the control plane is NOT authenticated; any process that "
                         "reaches its ports can register as a worker or silence one. Tests only. "
                         "****";
    }
    return ControlAuth{};
  }
  if (keys_path.empty()) {
    return InvalidArgument(
        "no control-plane keys: pass --control-keys FILE (pw-cluster up writes "
        "<run_dir>/control.keys and passes it) or --insecure (tests only)");
  }
  PW_ASSIGN_OR_RETURN(CurveKeys keys, ReadCurveKeys(keys_path));
  PW_LOG(INFO) << process << ": control plane authenticated with CURVE (server key "
               << keys.server.public_z85.substr(0, 8) << "...)";
  ControlAuth auth;
  auth.curve = std::move(keys);
  return auth;
}

}  // namespace pw::transport

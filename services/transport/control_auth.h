// ControlAuth: how this process's control-plane sockets prove who they are.
//
// With CURVE keys (the cluster's CurveKeys, see curve_keys.h), every ZeroMQ ROUTER this
// process binds is a CURVE server that accepts only the cluster's client key (a ZAP handler
// in this process checks it), and every DEALER it connects is a CURVE client of the cluster's
// server key: frames are authenticated and encrypted, and a connection without the keys never
// completes its handshake. Without keys the control plane is plaintext and any process that
// can reach a control port can register as a worker or take over a worker's routing id; that
// is for tests only (`--insecure`), and ControlAuthFromFlags logs it loudly.
//
// The process default (SetDefaultControlAuth) is what ZmqRouterTransport::Bind and
// ZmqDealerTransport::Connect use unless given an explicit ControlAuth; the service mains set
// it once from their flags before creating any socket. Unset, it is plaintext.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "services/transport/curve_keys.h"

namespace pw::transport {

struct ControlAuth {
  std::optional<CurveKeys> curve;  // nullopt: plaintext
  bool secure() const { return curve.has_value(); }
};

void SetDefaultControlAuth(ControlAuth auth);
ControlAuth DefaultControlAuth();

// The service flags `--control-keys FILE` / `--insecure`: exactly one must be given. Reads and
// checks the key file, or logs a warning banner naming `process` for --insecure.
Result<ControlAuth> ControlAuthFromFlags(const std::string& keys_path, bool insecure,
                                         const std::string& process);

// Flag help texts, shared by the mains.
inline constexpr const char* kControlKeysHelp =
    "control-plane key file (ZeroMQ CURVE; pw-cluster writes it into the run directory, 0600)";
inline constexpr const char* kInsecureHelp =
    "plaintext, unauthenticated control plane: any local process can pose as a worker (tests "
    "only)";

}  // namespace pw::transport

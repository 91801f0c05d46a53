// What every cluster process (pw-router, pw-broker, pw-prefill, pw-decode) sets up before it
// creates a socket: how its control plane authenticates (--control-keys FILE or --insecure,
// see control_auth.h) and the one interface its UCX listeners may use (the host of its
// control endpoint, or the address it advertises, see ucx::SetBindHost).
#pragma once

#include <string>

#include "common/status.h"

namespace pw::transport {

struct ServiceSecurityFlags {
  std::string control_keys;  // --control-keys FILE
  bool insecure = false;     // --insecure
};

// Applies `flags` as the process default and confines UCX to the interface of
// `advertise_host` (an IPv4 address of this host) or, when that is empty, of the host of
// `endpoint` ("tcp://HOST:PORT"). `process` names the process in log lines and errors.
Status SetUpServiceTransport(const ServiceSecurityFlags& flags, const std::string& process,
                             const std::string& endpoint, const std::string& advertise_host = "");

}  // namespace pw::transport

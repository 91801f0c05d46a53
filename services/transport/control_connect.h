// A control client over a ZeroMQ DEALER, made the one way every process that talks to a
// server makes it (workers to the router and the broker, pw-ctl to the broker).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "common/clock.h"
#include "services/transport/control.h"

namespace pw::transport {

// Connects a DEALER with routing id `options.id` to `endpoint` (the process's default control
// auth) and wraps it in a ControlClient; Start() is the caller's.
Result<std::unique_ptr<ControlClient>> ConnectControlClient(const std::string& endpoint,
                                                            const Clock* clock,
                                                            ControlClient::Options options);

}  // namespace pw::transport

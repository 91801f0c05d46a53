// The pw-router process's options, declared once (common/formats/options.h): its flags and its
// `router:` section of the node file (deploy/local.yaml) come from DeclareRouterOptions.
#pragma once

#include "common/formats/options.h"
#include "services/router/router_app.h"

namespace pw::router {

// Binds every option of `o` (its current values are the defaults). API keys are flags only
// (a key in a shared file would leak it); `workers` is the control endpoint, derived in a node
// file from `host` and router.control_port.
void DeclareRouterOptions(options::OptionSet* s, RouterAppOptions* o);

}  // namespace pw::router

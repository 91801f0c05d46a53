// The pw-broker process's options, declared once (common/formats/options.h): its flags and its
// `broker:` section of the node file (deploy/local.yaml), planner included, come from
// DeclareBrokerOptions.
#pragma once

#include "common/formats/options.h"
#include "services/broker/broker.h"

namespace pw::broker {

// Binds every option of `o` (its current values are the defaults). `bind` and `metrics` are
// endpoints a node file derives from `host` and broker.control_port / broker.metrics_port.
void DeclareBrokerOptions(options::OptionSet* s, BrokerOptions* o);

}  // namespace pw::broker

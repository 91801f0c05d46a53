#include "services/transport/service_setup.h"

#include "services/transport/control_auth.h"
#include "services/transport/ucx.h"

namespace pw::transport {

Status SetUpServiceTransport(const ServiceSecurityFlags& flags, const std::string& process,
                             const std::string& endpoint, const std::string& advertise_host) {
  PW_ASSIGN_OR_RETURN(ControlAuth auth,
                      ControlAuthFromFlags(flags.control_keys, flags.insecure, process));
  SetDefaultControlAuth(std::move(auth));
  if (!advertise_host.empty()) {
    Status st = ucx::SetBindHost(advertise_host);
    if (!st.ok()) return InvalidArgument("advertise_host: " + st.message());
    return Status::Ok();
  }
  Status st = ucx::SetBindHostFromEndpoint(endpoint);
  if (!st.ok()) return InvalidArgument("UCX bind host from '" + endpoint + "': " + st.message());
  return Status::Ok();
}

}  // namespace pw::transport

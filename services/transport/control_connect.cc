#include "services/transport/control_connect.h"

#include "services/transport/zmq_transport.h"

namespace pw::transport {

Result<std::unique_ptr<ControlClient>> ConnectControlClient(const std::string& endpoint,
                                                            const Clock* clock,
                                                            ControlClient::Options options) {
  PW_ASSIGN_OR_RETURN(auto t, ZmqDealerTransport::Connect(endpoint, options.id));
  return std::make_unique<ControlClient>(std::move(t), clock, std::move(options));
}

}  // namespace pw::transport

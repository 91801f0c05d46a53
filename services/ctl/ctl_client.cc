#include "services/ctl/ctl_client.h"

#include <unistd.h>

#include <chrono>
#include <optional>

#include "services/proto/codec.h"
#include "services/transport/control.h"
#include "services/transport/control_connect.h"

namespace pw::ctl {

struct CtlClient::Impl {
  std::unique_ptr<transport::ControlClient> client;
  int timeout_ms = 5000;

  // Sends the request and waits for the reply.
  Result<CtlResult> Call(proto::OutMessage& m) {
    PW_RETURN_IF_ERROR(client->Send(m));
    std::optional<Result<CtlResult>> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!got && std::chrono::steady_clock::now() < deadline) {
      client->Poll(20, [&](const std::string&, const proto::InMessage& in) -> Status {
        if (in.which() != proto::Body::CTL_REPLY) return Status::Ok();
        auto r = in.body().getCtlReply();
        if (!r.getOk()) {
          got = Result<CtlResult>(InvalidArgument(proto::ToString(r.getError())));
        } else {
          got = Result<CtlResult>(CtlResult{proto::ToString(r.getText()), r.getEpoch()});
        }
        return Status::Ok();
      });
    }
    if (!got) return DeadlineExceeded("no answer from the broker in " + std::to_string(timeout_ms) + " ms");
    return *got;
  }
};

CtlClient::CtlClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CtlClient::~CtlClient() = default;

Result<std::unique_ptr<CtlClient>> CtlClient::Connect(const std::string& broker, int timeout_ms) {
  auto impl = std::make_unique<Impl>();
  impl->timeout_ms = timeout_ms;
  const std::string id = "pw-ctl-" + std::to_string(getpid());
  transport::ControlClient::Options o;
  o.id = id;
  o.role = wire::Role::CLIENT;
  o.heartbeat_ms = 500;
  PW_ASSIGN_OR_RETURN(impl->client, transport::ConnectControlClient(broker, SteadyClock::Get(), o));
  PW_RETURN_IF_ERROR(impl->client->Start());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!impl->client->registered() && std::chrono::steady_clock::now() < deadline) {
    impl->client->Poll(20, [](const std::string&, const proto::InMessage&) { return Status::Ok(); });
  }
  if (!impl->client->registered()) {
    return Unavailable("no broker answering at " + broker + " (waited " + std::to_string(timeout_ms) + " ms)");
  }
  return std::unique_ptr<CtlClient>(new CtlClient(std::move(impl)));
}

Result<CtlResult> CtlClient::Show(bool blocks, int layer) {
  proto::OutMessage m;
  auto s = m.body().initCtlRequest().initShow();
  s.setBlocks(blocks);
  s.setLayer(layer);
  return impl_->Call(m);
}

Result<CtlResult> CtlClient::SetBits(int bits, int layer, int expert, int proj) {
  proto::OutMessage m;
  auto s = m.body().initCtlRequest().initSetBits();
  s.setBits(static_cast<uint8_t>(bits));
  s.setLayer(layer);
  s.setExpert(expert);
  s.setKind(static_cast<int8_t>(proj));
  return impl_->Call(m);
}

Result<CtlResult> CtlClient::Apply(const std::vector<PlanEntry>& plan) {
  proto::OutMessage m;
  auto list = m.body().initCtlRequest().initApply(static_cast<unsigned>(plan.size()));
  for (size_t i = 0; i < plan.size(); ++i) {
    auto s = list[static_cast<unsigned>(i)];
    s.setBits(static_cast<uint8_t>(plan[i].bits));
    s.setLayer(plan[i].layer);
    s.setExpert(plan[i].expert);
    s.setKind(static_cast<int8_t>(plan[i].proj));
  }
  return impl_->Call(m);
}

}  // namespace pw::ctl

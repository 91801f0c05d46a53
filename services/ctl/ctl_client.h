// CtlClient: pw-ctl's side of the control plane. Registers with the broker as a client,
// sends one CtlRequest, waits for the CtlReply.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/ctl/plan_file.h"

namespace pw::ctl {

struct CtlResult {
  std::string text;
  uint64_t epoch = 0;
};

class CtlClient {
 public:
  // `broker`: e.g. tcp://127.0.0.1:5556. Fails when the broker does not answer in time.
  static Result<std::unique_ptr<CtlClient>> Connect(const std::string& broker, int timeout_ms);
  ~CtlClient();

  Result<CtlResult> Show(bool blocks, int layer);
  // bits 3..8; layer/expert -1 = all; proj -1 both, 0 gate_up, 1 down.
  Result<CtlResult> SetBits(int bits, int layer, int expert, int proj);
  // One plan of several entries (the broker expands layer-wide ones and checks ranges).
  Result<CtlResult> Apply(const std::vector<PlanEntry>& plan);

 private:
  struct Impl;
  explicit CtlClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pw::ctl

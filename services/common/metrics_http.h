// MetricsHttp: the HTTP endpoint on a service process's metrics port (civetweb, as
// prometheus-cpp's Exposer serves /metrics, on one port): /metrics (a registry in Prometheus'
// text format), /live (main_loop_beat.h: 200 "live" or 503 with the reason) and the routes the
// process adds (a worker's /ready).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

class CivetServer;
namespace prometheus {
class Registry;
}

namespace pw::service {

class MainLoopBeat;

class MetricsHttp {
 public:
  struct Reply {
    int code = 200;
    std::string body;
  };
  // A GET route: answers from any HTTP thread.
  using Route = std::function<Reply()>;

  // `bind` "127.0.0.1:9100" (port 0: any free port). `registry` and `beat` must outlive the
  // endpoint. kUnavailable when it cannot listen there.
  static Result<std::unique_ptr<MetricsHttp>> Create(const std::string& bind,
                                                     std::shared_ptr<prometheus::Registry> registry,
                                                     const MainLoopBeat* beat,
                                                     std::vector<std::pair<std::string, Route>> routes = {});
  ~MetricsHttp();
  uint16_t port() const;

 private:
  class Handler;
  MetricsHttp() = default;
  std::vector<std::unique_ptr<Handler>> handlers_;
  std::unique_ptr<CivetServer> server_;  // declared last: stopped first
};

}  // namespace pw::service

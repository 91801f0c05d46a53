#include "services/common/metrics_http.h"

#include <CivetServer.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>

#include "services/common/main_loop_beat.h"

namespace pw::service {

class MetricsHttp::Handler : public CivetHandler {
 public:
  Handler(Route route, std::string type) : route_(std::move(route)), type_(std::move(type)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    const Reply r = route_();
    mg_printf(conn,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n",
              r.code, r.code == 200 ? "OK" : "Service Unavailable", type_.c_str(), r.body.size());
    mg_write(conn, r.body.data(), r.body.size());
    return true;
  }

 private:
  Route route_;
  std::string type_;
};

MetricsHttp::~MetricsHttp() { server_.reset(); }  // no handler runs past here

Result<std::unique_ptr<MetricsHttp>> MetricsHttp::Create(const std::string& bind,
                                                         std::shared_ptr<prometheus::Registry> registry,
                                                         const MainLoopBeat* beat,
                                                         std::vector<std::pair<std::string, Route>> routes) {
  std::unique_ptr<MetricsHttp> m(new MetricsHttp());
  routes.emplace_back("/live", [beat] {
    const std::string why = beat->NotLive();
    return Reply{why.empty() ? 200 : 503, why.empty() ? "live\n" : "not live: " + why + "\n"};
  });
  try {
    m->server_ = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", bind, "num_threads", "2"});
    m->handlers_.push_back(std::make_unique<Handler>(
        [registry] { return Reply{200, prometheus::TextSerializer().Serialize(registry->Collect())}; },
        "text/plain; version=0.0.4; charset=utf-8"));
    m->server_->addHandler("/metrics", m->handlers_.back().get());
    for (auto& [path, route] : routes) {
      m->handlers_.push_back(std::make_unique<Handler>(std::move(route), "text/plain; charset=utf-8"));
      m->server_->addHandler(path, m->handlers_.back().get());
    }
  } catch (const std::exception& e) {
    return Unavailable("cannot serve /metrics on '" + bind + "': " + e.what());
  }
  return m;
}

uint16_t MetricsHttp::port() const {
  auto ports = server_->getListeningPorts();
  return ports.empty() ? 0 : static_cast<uint16_t>(ports[0]);
}

}  // namespace pw::service

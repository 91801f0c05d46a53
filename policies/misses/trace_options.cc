#include "policies/misses/trace_options.h"

#include <cmath>
#include <cstdio>

#include "policies/misses/router_trace.h"

namespace pw::misses {
namespace {

uint64_t Bytes(double mb) { return mb > 0 ? static_cast<uint64_t>(std::llround(mb * 1e6)) : 0; }

// "" when a bound of `mb` MB holds a record of some model, else why not (a writer refuses one
// below its own model's floor when it starts, MinTraceBytes).
std::string Bound(double mb) {
  const uint64_t bytes = Bytes(mb);
  if (bytes >= kMinTraceBytesAnyModel) return "";
  char m[64];
  std::snprintf(m, sizeof m, "%g MB (%llu bytes)", mb, static_cast<unsigned long long>(bytes));
  return std::string(m) + " holds no record: a router trace with one record takes at least " +
         std::to_string(kMinTraceBytesAnyModel) +
         " bytes (0.000164 MB: its 64-byte header, a record, the end record; more for a real model)";
}

}  // namespace

uint64_t TraceOptions::max_bytes() const { return max_mb ? Bytes(*max_mb) : 0; }

void DeclareTraceOptions(options::OptionSet* s, TraceOptions* t) {
  s->Add("trace.path", &t->path, "write a router-logit trace to FILE (docs/formats.md)")
      .Flag("--record-trace").NonEmpty();
  s->Add("trace.max_mb", &t->max_mb, "bound the trace file (MB; at least 0.000164, one record)")
      .Flag("--trace-max-mb").Max(1e6)
      .Check([](const config::ConfigValue& v) { return Bound(v.AsDouble()); });
  s->Add("trace.sample", &t->sample, "record every N-th forward pass")
      .Flag("--trace-sample").Range(1, 1 << 30);
  s->AddCheck("trace", [](const config::ConfigValue& v) -> std::string {
    return v.size() > 0 && !v.Has("path") ? "a trace needs its path" : "";
  });
}

Status CheckTraceOptions(const TraceOptions& t) {
  if (!t.max_mb) return Status::Ok();
  if (const std::string why = Bound(*t.max_mb); !why.empty()) {
    return InvalidArgument("--trace-max-mb " + why);
  }
  return Status::Ok();
}

}  // namespace pw::misses

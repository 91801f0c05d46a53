#include "services/workers/decode/decode_options.h"

#include "kernels/anyprec/q8.h"
#include "services/broker/broker_options.h"
#include "services/common/main_loop_beat.h"
#include "services/workers/common/kernel_options.h"
#include "policies/misses/miss_options.h"
#include "services/workers/common/worker_model_options.h"
#include "services/workers/weights/paged_residency.h"

namespace pw::workers {

void DeclareDecodeOptions(options::OptionSet* s, DecodeProcessOptions* p) {
  DecodeWorkerOptions* o = &p->worker;
  DeclareWorkerModelOptions(
      s, o, "decode", "prefill",
      "broker control endpoint (experts come from it); empty = checkpoint");
  s->Add("max_batch_tokens", &o->max_batch_tokens, "tokens per step").Range(1, 1 << 20);
  s->Add("max_batch", &o->max_batch, "running sequences").Range(1, 1 << 16);
  s->Add("heartbeat_ms", &o->heartbeat_ms, "heartbeat interval").Shared().Range(10, 60000);
  s->Add("quarantine_max_ms", &o->quarantine_max_ms,
         "quarantined KV blocks return to the pool after this long without the router's word")
      .Range(1, 86400000);
  s->Add("router_lost_quarantine_ms", &o->router_lost_quarantine_ms, "... or this long once the router is lost")
      .Range(1, 86400000);
  s->Add("metrics", &o->metrics_bind, "Prometheus bind address, e.g. 127.0.0.1:9101").NoKey();
  service::DeclareMainLoopStaleOption(s, &o->main_loop_stale_ms);
  // The page pool shared by KV and expert planes: MiB in files, bytes as a flag (0 = kv_blocks
  // of KV plus every expert at 8 bits); the page size (0 = one layer of one KV block).
  s->Add("pool_mb", &o->pool_bytes,
         "page pool budget shared by KV and expert planes (0: kv-blocks of KV plus every expert at 8 bits); "
         "the flag in bytes, the key in MiB")
      .Flag("--pool-bytes").Scale(int64_t{1} << 20).Range(0, 1 << 24);
  s->Add("page_bytes", &o->page_bytes, "page size (0: one layer of one KV block)").Range(0, 1 << 30);
  s->Add("weight_rate_mb_s", &p->weight_rate_mb_s, "plane transfer rate limit in MiB/s (0: none)")
      .Range(0, 1 << 20);
  s->Add("weight_max_in_flight", &o->weight_max_in_flight, "expert width changes in flight").Range(1, 4096);
  s->AddChoice("weight_pacing", &o->weight_pacing,
               {{"free", MoverPacing::kFree}, {"fetches", MoverPacing::kFetches},
                {"steps", MoverPacing::kSteps}, {"auto", MoverPacing::kAuto}},
               "background width changes give way to the step: free, fetches (while a synchronous fetch "
               "runs), steps (for every whole step) or auto (steps with a residency budget, else free)");
  s->AddChoice("bf16_experts", &o->bf16_experts,
               {{"auto", engine::Bf16ExpertForm::kAuto}, {"plain", engine::Bf16ExpertForm::kPlain},
                {"packed", engine::Bf16ExpertForm::kPacked}},
               "bf16 experts (the checkpoint's or the broker's): plain, packed (the same values losslessly "
               "in ~12 bits a weight, kernels/cpu/packed_bf16.h) or auto (packed with AVX512-BF16 and bf16 "
               "activations)");
  // Below the router's 30 s reservation timeout.
  s->Add("reserve_wait_ms", &o->reserve_wait_ms,
         "a KV reservation that fits only after lowering expert widths waits up to this long (0: answered at once)")
      .Range(0, 20000);
  s->Add("planner_min_bits", &o->lower_floors.min_bits,
         "the broker planner's lowest width: a reservation is held only if lowering to it makes room; "
         "given (with the other --planner-* floors), the KV capacity the router admits against counts "
         "what lowering to them frees")
      .NoKey().Range(anyprec::kMinBits, anyprec::kMaxBits);
  s->Add("planner_max_bits", &o->lower_floors.max_bits, "the broker planner's highest width")
      .NoKey().Range(anyprec::kMinBits, anyprec::kMaxBits);
  s->Add("planner_min_mean_bits", &o->lower_floors.min_mean_bits,
         "the broker planner's floor on the mean width (0: none)")
      .NoKey().Range(0, anyprec::kMaxBits);
  s->Add("demand_horizon_tokens", &o->demand_horizon_tokens,
         "KV demand counts each request's next this many tokens only (0: its growth to max_tokens)")
      .Range(0, static_cast<double>(int64_t{1} << 20));
  s->Add("plans_at_request_boundaries", &o->plans_at_request_boundaries,
         "ablation: expert width changes only where a request joins or leaves the batch")
      .NoKey();
  // LYNX (DESIGN.md 5.3).
  s->Add("lynx.enabled", &o->lynx, "LYNX: remap decode batches' expert choices (pagedweight_lynx_*)")
      .Flag("--lynx");
  s->Add("lynx.alpha", &p->lynx_alpha, "LYNX bins per logit (0: from k/N)").Range(0, 1000);
  s->Add("lynx.beta", &p->lynx_beta, "LYNX lowest bin -beta (-1: from k/N)").Range(-1, 64);
  s->AddChoice("lynx.gate_weights", &o->lynx_options.gate_weights,
               {{"renorm", lynx::GateWeights::kRenormalize}, {"mass", lynx::GateWeights::kOriginalMass}},
               "renorm or mass");
  s->Add("lynx.exempt_layers", &o->lynx_options.exempt_layers, "layers LYNX leaves unchanged")
      .Flag("--lynx-exempt").Range(0, 100000);
  s->AddCheck("lynx", [](const config::ConfigValue& v) -> std::string {
    const bool alpha = v.Has("alpha") && v["alpha"].AsDouble() > 0;
    const bool beta = v.Has("beta") && v["beta"].AsInt() >= 0;
    return alpha != beta ? "alpha and beta go together (or neither: from k/N)" : "";
  });
  // Expert residency budget and miss policy (policies/misses/miss_settings.h); absent or
  // without a budget = every expert resident.
  misses::DeclareMissOptions(s, &o->misses, "misses.");
  DeclareKernelOptions(s, &p->kernels);
  // Router-logit trace of the served tokens (decode_trace.h): every `sample`-th forward pass,
  // the file bounded by max_mb.
  misses::DeclareTraceOptions(s, &p->trace);
}

Status LoadDecodeOptions(const service::ConfigFlags& f, options::OptionSet* set, DecodeProcessOptions* o) {
  broker::BrokerOptions b;
  options::OptionSet bs;
  broker::DeclareBrokerOptions(&bs, &b);
  service::NodeTables others;
  others.broker = &bs;
  auto derive = [&](const config::ConfigValue& root, const config::ConfigValue&) -> Status {
    const config::ConfigValue& section = root["broker"];
    if (!section["enabled"].AsBool()) return Status::Ok();
    PW_RETURN_IF_ERROR(bs.ApplyFile(root, section));
    if (!b.planner.enabled) return Status::Ok();
    PW_RETURN_IF_ERROR(set->Derive("planner_min_bits", config::ConfigValue(b.planner.min_bits)));
    PW_RETURN_IF_ERROR(set->Derive("planner_max_bits", config::ConfigValue(b.planner.max_bits)));
    PW_RETURN_IF_ERROR(set->Derive("planner_min_mean_bits", config::ConfigValue(b.planner.min_mean_bits)));
    if (!section["planner"]["async_movement"].AsBool()) {
      PW_RETURN_IF_ERROR(set->Derive("plans_at_request_boundaries", config::ConfigValue(true)));
    }
    return Status::Ok();
  };
  PW_RETURN_IF_ERROR(service::ApplyNodeConfig(f, service::Role::kDecode, set, others, derive));
  // Told the planner's floors (flags, or derived from the broker's planner): the KV capacity the
  // router admits against counts what lowering to them frees.
  o->worker.planner_lowers = set->Given("planner_min_bits") || set->Given("planner_max_bits") ||
                             set->Given("planner_min_mean_bits");
  return ResolveDecodeOptions(o);
}

Status ResolveDecodeOptions(DecodeProcessOptions* p) {
  DecodeWorkerOptions& o = p->worker;
  o.weight_bytes_per_s = p->weight_rate_mb_s << 20;
  if (o.lower_floors.max_bits < o.lower_floors.min_bits) {
    return InvalidArgument("--planner-max-bits is below --planner-min-bits");
  }
  if (p->lynx_alpha != 0.f || p->lynx_beta >= 0) {
    if (p->lynx_alpha == 0.f || p->lynx_beta < 0) return InvalidArgument("--lynx-alpha and --lynx-beta go together");
    o.lynx_options.params = lynx::LynxParams{p->lynx_alpha, p->lynx_beta};
    PW_RETURN_IF_ERROR(lynx::ValidateLynxParams(*o.lynx_options.params));
  }
  if (o.misses.residency && o.misses.residency_bytes) {
    return InvalidArgument("--residency and --residency-bytes exclude each other");
  }
  if (!PagedResidency::Enabled(o.misses) && !o.misses.policy.empty()) {
    return InvalidArgument("--miss-policy needs --residency F or --residency-bytes N");
  }
  if (PagedResidency::Enabled(o.misses)) {
    PW_RETURN_IF_ERROR(misses::ToMissConfig(o.misses).status());
    if (o.broker_endpoint.empty()) return InvalidArgument("--residency needs --broker (an .apw store)");
  }
  PW_RETURN_IF_ERROR(misses::CheckTraceOptions(p->trace));
  o.trace.path = p->trace.path;
  o.trace.sample_every = p->trace.sample;
  o.trace.max_bytes = p->trace.max_bytes();
  return Status::Ok();
}

}  // namespace pw::workers

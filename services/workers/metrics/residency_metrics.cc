#include "services/workers/metrics/residency_metrics.h"

namespace pw::workers {

std::unique_ptr<ResidencyMetrics> ResidencyMetrics::Register(prometheus::Registry& r,
                                                             const std::string& worker_id) {
  auto m = std::make_unique<ResidencyMetrics>();
  const std::map<std::string, std::string> id{{"worker", worker_id}};
  auto with = [&](const char* k, const char* v) {
    return std::map<std::string, std::string>{{"worker", worker_id}, {k, v}};
  };
  auto& sel = prometheus::BuildCounter().Name("pagedweight_expert_selections_total")
                  .Help("Experts selected by the router (after any remap): resident (hit) or not (miss)")
                  .Register(r);
  m->hits_ = &sel.Add(with("result", "hit"));
  m->misses_ = &sel.Add(with("result", "miss"));
  auto& miss = prometheus::BuildCounter().Name("pagedweight_expert_misses_total")
                   .Help("Expert misses by the policy's action: fetched synchronously or substituted")
                   .Register(r);
  m->fetched_ = &miss.Add(with("action", "fetched"));
  m->substituted_ = &miss.Add(with("action", "substituted"));
  m->mass_ = &prometheus::BuildCounter().Name("pagedweight_substituted_gate_mass_total")
                  .Help("Sum over (token, MoE layer) of the gate mass served by substitutes")
                  .Register(r).Add(id);
  m->token_layers_ = &prometheus::BuildCounter().Name("pagedweight_expert_token_layers_total")
                          .Help("(token, MoE layer) pairs the miss policy decided")
                          .Register(r).Add(id);
  auto& fetches = prometheus::BuildCounter().Name("pagedweight_expert_fetches_total")
                      .Help("Synchronous expert fetches: into pool pages, or to scratch (no free pages above the KV reserve, or loading already)")
                      .Register(r);
  m->fetch_pages_ = &fetches.Add(with("path", "pages"));
  m->fetch_scratch_ = &fetches.Add(with("path", "scratch"));
  m->fetch_bytes_ = &prometheus::BuildCounter().Name("pagedweight_expert_fetch_bytes_total")
                         .Help("Bytes read from the broker's store by synchronous expert fetches into pages")
                         .Register(r).Add(id);
  m->fetch_seconds_ = &prometheus::BuildHistogram().Name("pagedweight_expert_fetch_seconds")
                           .Help("Time of one synchronous expert fetch (both blocks)")
                           .Register(r)
                           .Add(id, prometheus::Histogram::BucketBoundaries{
                                        1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1});
  const prometheus::Histogram::BucketBoundaries fine{1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1};
  auto& phase = prometheus::BuildHistogram().Name("pagedweight_expert_fetch_phase_seconds")
                    .Help("Where one expert fetch into pages spent its time: UCX gets, checksums and LUT quantization, page-table work")
                    .Register(r);
  m->phase_get_ = &phase.Add(with("phase", "get"), fine);
  m->phase_check_ = &phase.Add(with("phase", "check"), fine);
  m->phase_table_ = &phase.Add(with("phase", "table"), fine);
  m->step_wait_ = &prometheus::BuildHistogram().Name("pagedweight_step_fetch_wait_seconds")
                       .Help("Per engine step that fetched experts: its time waiting on synchronous fetches")
                       .Register(r)
                       .Add(id, prometheus::Histogram::BucketBoundaries{
                                    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1});
  auto& adm = prometheus::BuildCounter().Name("pagedweight_expert_admissions_total")
                  .Help("Background expert admissions: started, and committed (resident)")
                  .Register(r);
  m->admit_started_ = &adm.Add(with("state", "started"));
  m->admit_committed_ = &adm.Add(with("state", "committed"));
  m->evictions_ = &prometheus::BuildCounter().Name("pagedweight_expert_evictions_total")
                       .Help("Experts evicted from residency (their pages return at the next boundary)")
                       .Register(r).Add(id);
  m->resident_ = &prometheus::BuildGauge().Name("pagedweight_experts_resident")
                      .Help("Experts resident for the miss policy, all MoE layers").Register(r).Add(id);
  m->capacity_ = &prometheus::BuildGauge().Name("pagedweight_experts_resident_capacity")
                      .Help("The residency budget: resident experts per MoE layer times the layers")
                      .Register(r).Add(id);
  return m;
}

void ResidencyMetrics::Export(PagedResidency& residency) {
  const misses::MissStats& p = residency.policy().stats();
  const ResidencyStats& s = residency.stats();
  auto add = [](prometheus::Counter* c, double d) { if (d > 0) c->Increment(d); };
  add(hits_, static_cast<double>(p.hits - last_policy_.hits));
  add(misses_, static_cast<double>(p.misses - last_policy_.misses));
  add(fetched_, static_cast<double>(p.fetches - last_policy_.fetches));
  add(substituted_, static_cast<double>(p.substitutions - last_policy_.substitutions));
  add(mass_, p.mass_sum - last_policy_.mass_sum);
  add(token_layers_, static_cast<double>(p.token_layers - last_policy_.token_layers));
  add(evictions_, static_cast<double>(p.evictions - last_policy_.evictions));
  add(fetch_pages_, static_cast<double>(s.fetches - last_.fetches));
  add(fetch_scratch_, static_cast<double>(s.scratch_fetches - last_.scratch_fetches));
  add(fetch_bytes_, static_cast<double>(s.fetch_bytes - last_.fetch_bytes));
  add(admit_started_, static_cast<double>(s.admissions_started - last_.admissions_started));
  add(admit_committed_, static_cast<double>(s.admissions_committed - last_.admissions_committed));
  for (double sec : residency.TakeFetchSeconds()) fetch_seconds_->Observe(sec);
  for (const FetchTimes& t : residency.TakeFetchPhases()) {
    phase_get_->Observe(t.get_s);
    phase_check_->Observe(t.check_s);
    phase_table_->Observe(t.table_s);
  }
  for (double sec : residency.TakeStepWaits()) step_wait_->Observe(sec);
  resident_->Set(residency.resident_experts());
  capacity_->Set(static_cast<double>(residency.capacity()) * residency.num_moe_layers());
  last_policy_ = p;
  last_ = s;
}

}  // namespace pw::workers

#!/usr/bin/env python3
"""Writes the Grafana dashboards of deploy/grafana/dashboards/ (JSON, schema 39) from the panel
lists below; run it after editing them (`python3 deploy/grafana/make_dashboards.py`).

Two dashboards:
  pagedweight-serving.json  what operators know from vLLM's dashboards: healthy instances,
                            request rate, TTFT/ITL/E2E/queue-time percentiles, running/waiting,
                            KV usage, finish reasons, token throughput, rejections
  pagedweight-memory.json   PagedWeight's own: memory split weights/KV/free over time, weight
                            bytes by width, committed-bits distribution per layer (heatmap),
                            expert misses and substituted gate mass, LYNX distinct experts
                            before/after and remapped assignments, plane transfers
Every panel holds the real PromQL of the metric it shows (the metrics are listed in
docs/architecture.md "Metrics" and "Paged memory").
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"


def q(expr, legend="", fmt=None):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True}
    if fmt:
        t["format"] = fmt
    return t


def pct(metric, label):
    return [q(f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket[{RI}])))", f"{label} p{int(p * 100)}")
            for p in (0.5, 0.9, 0.99)] + [
        q(f"rate({metric}_sum[{RI}]) / rate({metric}_count[{RI}])", f"{label} mean")]


def panel(title, targets, unit="short", kind="timeseries", w=12, h=8, desc="", stack=False,
          extra=None):
    p = {"type": kind, "title": title, "description": desc, "datasource": DS, "targets": targets,
         "gridPos": {"w": w, "h": h},
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "options": {"legend": {"showLegend": True, "displayMode": "table", "placement": "bottom",
                                "calcs": ["lastNotNull", "max"]},
                     "tooltip": {"mode": "multi"}}}
    if kind == "timeseries" and stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 40}
    if extra:
        p.update(extra)
    return p


SERVING = [
    panel("Healthy instances", [q('sum by (pw_role) (up{job="pagedweight"})', "{{pw_role}}")],
          kind="stat", w=6, h=5, desc="Processes whose /metrics Prometheus scraped successfully"),
    panel("Live decode workers (router's view)", [q("pagedweight_router_backend_decode_workers", "decode workers")],
          kind="stat", w=6, h=5),
    panel("Request rate by status", [q("sum by (code) (rate(pagedweight_router_requests_total"
                                       '{endpoint=~"completions|chat_completions"}[' + RI + "]))", "{{code}}")],
          unit="reqps", w=12, h=5),
    panel("Time to first token", pct("pagedweight_router_time_to_first_token_seconds", "TTFT"), unit="s"),
    panel("Inter-token latency", pct("pagedweight_router_inter_token_latency_seconds", "ITL"), unit="s"),
    panel("End-to-end request latency", pct("pagedweight_router_e2e_request_latency_seconds", "E2E"), unit="s"),
    panel("Queue time (admission to a decode slot)", pct("pagedweight_router_request_queue_time_seconds", "queue"),
          unit="s"),
    panel("Prefill worker: queue and prefill time", [
        q(f"histogram_quantile({p}, sum by (le) (rate(pagedweight_worker_request_queue_time_seconds_bucket[{RI}])))",
          f"queued p{int(p * 100)}") for p in (0.5, 0.99)] + [
        q(f"histogram_quantile({p}, sum by (le) (rate(pagedweight_worker_request_prefill_time_seconds_bucket[{RI}])))",
          f"prefill + KV write p{int(p * 100)}") for p in (0.5, 0.99)], unit="s",
          desc="PrefillRequest received -> admitted to a forward pass; admitted -> KV written"),
    panel("Requests running and waiting", [
        q("pagedweight_router_num_requests_running", "running (router)"),
        q("pagedweight_router_num_requests_waiting", "waiting (router)"),
        q("pagedweight_worker_num_requests_running", "running {{worker}}"),
        q("pagedweight_worker_num_requests_waiting", "waiting {{worker}}")]),
    panel("KV cache usage", [
        q("pagedweight_router_kv_cache_usage_perc", "all decode workers"),
        q('sum by (worker) (pagedweight_kv_blocks{state="used"}) / sum by (worker) (pagedweight_kv_blocks)',
          "{{worker}}")], unit="percentunit"),
    panel("Finish reasons", [q("sum by (finished_reason) (increase(pagedweight_router_request_success_total[" + RI + "]))",
                               "{{finished_reason}}")], stack=True),
    panel("Token throughput", [
        q(f"rate(pagedweight_router_prompt_tokens_total[{RI}])", "prompt tokens/s"),
        q(f"rate(pagedweight_router_generation_tokens_total[{RI}])", "generated tokens/s"),
        q(f"sum by (worker) (rate(pagedweight_worker_generation_tokens_total[{RI}]))", "generated {{worker}}")],
          unit="short"),
    panel("Rejected requests and preemptions", [
        q(f"sum by (reason) (rate(pagedweight_router_rejected_requests_total[{RI}]))", "rejected {{reason}}"),
        q(f"sum by (worker) (rate(pagedweight_worker_num_preemptions_total[{RI}]))", "preempted {{worker}}"),
        q(f"rate(pagedweight_router_backend_requests_replaced_total[{RI}])", "placed again (worker lost)")],
          unit="reqps"),
    panel("Prompt and generation length", [
        q(f"histogram_quantile(0.5, sum by (le) (rate(pagedweight_router_request_prompt_tokens_bucket[{RI}])))",
          "prompt p50"),
        q(f"histogram_quantile(0.5, sum by (le) (rate(pagedweight_router_request_generation_tokens_bucket[{RI}])))",
          "generation p50")]),
]

MEMORY = [
    panel("Memory split: weights, KV, free (pages)",
          [q("sum by (tenant) (pagedweight_pool_pages{tenant=~\"weights|kv|free\"})", "{{tenant}}")],
          stack=True, w=24, desc="Pages of the unified page pool by tenant, over time"),
    panel("Weight bytes by bit width", [q("sum by (bits) (pagedweight_weight_bytes)", "{{bits}} bit")],
          unit="bytes", stack=True),
    panel("Committed bits per layer", [q('sum by (bits) (pagedweight_committed_blocks_by_layer{layer=~"$layer"})',
                                         "{{bits}}", fmt="heatmap")],
          kind="heatmap", desc="Expert blocks of the layer committed at each width",
          extra={"repeat": "layer", "repeatDirection": "h", "maxPerRow": 4,
                 "options": {"calculate": False, "yAxis": {"unit": "short"},
                             "cellValues": {"unit": "short"}, "color": {"scheme": "Viridis", "mode": "scheme"}}}),
    panel("Expert misses by action", [q(f"sum by (action) (rate(pagedweight_expert_misses_total[{RI}]))",
                                        "{{action}}")], unit="ops", stack=True),
    panel("Substituted gate mass", [q(f"sum(rate(pagedweight_substituted_gate_mass_total[{RI}]))",
                                      "gate mass/s substituted")]),
    panel("LYNX: distinct experts per layer call, before and after",
          [q(f"sum by (stage) (rate(pagedweight_lynx_distinct_experts_total[{RI}])) / ignoring (stage) group_left "
             f"sum(rate(pagedweight_lynx_layer_calls_total[{RI}]))", "{{stage}}")]),
    panel("LYNX: remapped assignments and changed tokens", [
        q(f"sum(rate(pagedweight_lynx_remapped_assignments_total[{RI}]))", "remapped assignments/s"),
        q(f'sum(rate(pagedweight_lynx_tokens_total{{state="changed"}}[{RI}])) / '
          f'sum(rate(pagedweight_lynx_tokens_total{{state="seen"}}[{RI}]))', "fraction of tokens changed")]),
    panel("Plans and plane transfers", [
        q(f"sum(rate(pagedweight_plans_applied_total[{RI}]))", "plans/s"),
        q(f"sum by (direction) (rate(pagedweight_planes_moved_total[{RI}]))", "planes {{direction}}/s")]),
    panel("UCX bytes moved", [q(f"sum by (worker, op) (rate(pagedweight_ucx_bytes_total[{RI}]))",
                                "{{worker}} {{op}}")], unit="Bps"),
]


def dashboard(uid, title, panels, layer_var=False):
    x = y = 0
    row_h = 0
    for i, p in enumerate(panels):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y = 0, y + row_h
            row_h = 0
        p["gridPos"].update({"x": x, "y": y})
        p["id"] = i + 1
        x += w
        row_h = max(row_h, h)
    templating = [{"name": "datasource", "type": "datasource", "query": "prometheus",
                   "label": "Prometheus", "current": {}, "hide": 0}]
    if layer_var:
        templating.append({"name": "layer", "type": "query", "datasource": DS, "label": "layer",
                           "query": {"query": "label_values(pagedweight_committed_blocks_by_layer, layer)",
                                     "refId": "layers"},
                           "definition": "label_values(pagedweight_committed_blocks_by_layer, layer)",
                           "refresh": 2, "multi": True, "includeAll": True, "current": {}, "hide": 0})
    return {"uid": uid, "title": title, "tags": ["pagedweight"], "schemaVersion": 39, "version": 1,
            "editable": True, "timezone": "utc", "refresh": "5s",
            "time": {"from": "now-15m", "to": "now"}, "templating": {"list": templating},
            "annotations": {"list": []}, "panels": panels}


def main():
    out = os.path.join(HERE, "dashboards")
    os.makedirs(out, exist_ok=True)
    for name, d in [("pagedweight-serving.json", dashboard("pw-serving", "PagedWeight: serving", SERVING)),
                    ("pagedweight-memory.json",
                     dashboard("pw-memory", "PagedWeight: memory, precision, LYNX", MEMORY, layer_var=True))]:
        with open(os.path.join(out, name), "w") as f:
            json.dump(d, f, indent=2)
            f.write("\n")
        print("wrote", os.path.join(out, name))


if __name__ == "__main__":
    main()

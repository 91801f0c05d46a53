// The options every worker process (prefill, decode) has with the same key, flag and bounds: the
// model, its control endpoints, its id, address, node and name, its KV pool, its threads and
// how it holds the dense weights. Declared once here for both options tables
// (prefill/prefill_options.cc, decode/decode_options.cc), in this order.
#pragma once

#include <string>

#include "common/formats/options.h"
#include "common/peer_id.h"
#include "common/dense_format.h"
#include "memory/kv_layout.h"

namespace pw::workers {

// `O` is PrefillWorkerOptions or DecodeWorkerOptions. `role`: "prefill" or "decode" (the id's
// default); `peer_role`: the workers whose KV elements must match; `broker_help`: what this
// worker's help for its broker endpoint (what it takes from the broker).
template <typename O>
void DeclareWorkerModelOptions(options::OptionSet* s, O* o, const std::string& role,
                               const std::string& peer_role, const std::string& broker_help) {
  s->Add("model_dir", &o->model_dir, "model directory (config.json, *.safetensors)")
      .Flag("--model").Shared().Required().NonEmpty();
  // A list: several routers (replicas behind one Service) may place requests on this worker
  // (services/workers/common/router_links.h); one endpoint is a list of one. Not Required():
  // in a node file it is derived from the router's section when the worker's does not list
  // it, so the key may be absent; the worker refuses to start without one.
  s->Add("router", &o->router_endpoints,
         "router control endpoints, e.g. tcp://127.0.0.1:5555; every router listed may place "
         "requests here (--router repeated or comma-separated, or a YAML list)");
  s->Add("router_resolve_ms", &o->router_resolve_ms,
         "0: each router endpoint is one router; > 0: every IPv4 address of each endpoint's host "
         "is a router (router pods behind a headless Service), resolved again this often")
      .Range(0, 3600000);
  s->Add("broker", &o->broker_endpoint, std::string(broker_help)).NoKey();
  s->Add("id", &o->id, "worker id (default " + role + "-<pid>): printable ASCII without spaces, quotes or backslashes")
      .NonEmpty()
      .Check([](const config::ConfigValue& v) { return PeerIdProblem(v.AsString()); });
  // In a pod the router endpoint is a Service name, not an address of this host: the pod IP
  // (the downward API's status.podIP) is given here instead.
  s->Add("advertise_host", &o->advertise_host,
         "IPv4 address of this host whose interface the UCX listeners use (default: the first "
         "router endpoint's host)")
      .NonEmpty();
  s->Add("node", &o->node,
         "node this worker runs on, told the router for placement (default: the hostname)")
      .NonEmpty();
  s->Add("model_name", &o->model_name, "model name reported to the router").Shared();
  s->Add("kv_blocks", &o->num_kv_blocks, "KV pool blocks").Range(1, 1 << 24);
  s->AddChoice("kv_dtype", &o->kv_dtype,
               {{"bf16", memory::KvDtype::kBf16}, {"fp32", memory::KvDtype::kF32}},
               "KV elements (must equal the " + peer_role + " workers')")
      .Shared();
  s->Add("block_size", &o->block_size, "tokens per KV block").Range(1, 4096);
  s->Add("threads", &o->threads,
         "compute threads; 0: every core this process may run on (docs/architecture.md, "
         "\"One machine\")")
      .Range(0, 1024);
  s->AddChoice("dense", &o->dense, DenseFormatChoices(),
               "dense matrices (attention, dense and shared MLPs, lm_head): bf16 as the checkpoint "
               "has them, bf16-packed (the same values packed losslessly at start, ~12 bits a weight), "
               "int8 copies with one scale per row made at start (llama.cpp's q8_0), or "
               "ap3..ap8: any-precision codes at that many bits with a 2^bits-entry table per row, "
               "fitted at start (docs/quality.md, \"Dense matrices below 8 bits\")")
      .Shared();
  s->AddChoice("lm_head", &o->lm_head, LmHeadFormatChoices(),
               "the lm_head's own format, one of dense's or 'dense' (the same as the others); "
               "llama.cpp's Q4_K_M keeps its output matrix at 6 bits")
      .Shared();
  s->Add("no_mmap", &o->copy_weights,
         "read the checkpoint into this process's memory instead of mapping it (llama.cpp's "
         "--no-mmap)");
}

}  // namespace pw::workers

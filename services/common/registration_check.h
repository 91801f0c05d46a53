// The check the router and the broker make of a worker's Register (services/proto/cluster.capnp)
// before accepting it. Any process with the node's control keys can send one (docs/architecture.md,
// Threat model), and the servers act on its numbers: the router places up to maxBatch requests
// on a decode worker, sizes leases by its KV blocks and hands its KV pool's coordinates to
// prefill workers, which write pages of pageBytes into it; the broker sizes plans by the
// residency budget. So every such field must be what the served model implies or within what
// an honest worker can register.
//
// Checked for prefill and decode workers (other roles carry no KV; tools register as client):
//   kvLayout   1 <= blockTokens <= max_block_tokens, 1 <= numBlocks <= max_kv_blocks,
//              blockBytes <= layerBytes * numLayers (layerBytes is the widest layer's),
//              pageBytes >= layerBytes, pagesPerBlock (0 before protocol 1.3: numLayers) >=
//              numLayers, numBlocks * pagesPerBlock * pageBytes <= max_kv_bytes (no
//              wrap-around); with the model: a hybrid's (a recurrent state in its KV) only from
//              a worker of protocol 1.3 or later, an MLA model's (latent KV) from 1.4 or later,
//              one with layers of their own KV width (gemma4's full layers) from 1.5 or later
//              (transferable_kv.h); layoutHash = KvLayoutHash of the model's layout for
//              blockTokens and the dtype (fp32 or bf16) it names, numLayers, layerBytes (an MLA
//              model's latent rows, the widest layer: KvLayerBytes), blockBytes (the layers'
//              sum) and pagesPerBlock as that layout has them;
//   maxBatch   <= max_batch (a decode worker's 0 means the router's default);
//   decode only: kvMemory present, numBlocks * pagesPerBlock * pageBytes <= kvMemory.bytes <=
//              max_kv_bytes, baseAddr + bytes without wrap-around; with the model,
//              residencyCapacity <= its experts per layer.
#pragma once

#include <cstdint>
#include <optional>

#include "common/formats/model_config.h"
#include "common/status.h"
#include "services/proto/codec.h"

namespace pw::service {

// What a registration is checked against. The bounds default to the largest values pw-decode
// and pw-prefill can register (the ranges of the options behind them, services/workers/*_main.cc,
// and a page pool's most pages).
struct RegistrationLimits {
  // The served model. Unset (in-process tests of the protocol with stand-in workers): the KV
  // layout is checked for consistency and bounds only. pw-router and pw-broker always set it.
  std::optional<ModelConfig> model;
  // --kv-blocks goes to 2^24; a decode worker sized by --pool-bytes has up to a page pool's
  // pages (2^31 - 1, decode_worker.cc) as blocks.
  uint32_t max_kv_blocks = (1u << 31) - 1;
  uint32_t max_block_tokens = 4096;   // --block-size
  uint32_t max_batch = 1u << 16;      // --max-batch (decode), --max-batch-prompts (prefill)
  // Bound of a worker's KV pages and of a decode worker's registered pool, in bytes; 0 = this
  // host's physical memory (a node's workers run on its host, in host memory).
  uint64_t max_kv_bytes = 0;
};

// Ok, or kInvalidArgument whose message names every field out of line, e.g.
// "maxBatch 4294967295 above 65536; kvLayout.layoutHash 0000000000000000 is not ...".
// `peer_minor`: the protocol minor version of the Register's envelope. Reads fields of `reg`:
// call it inside proto::GuardWire (ControlServer::on_register is).
Status CheckRegistration(wire::Register::Reader reg, const RegistrationLimits& limits,
                         uint16_t peer_minor);

// This host's physical memory in bytes (sysconf; 0 when unknown).
uint64_t PhysicalMemoryBytes();

}  // namespace pw::service

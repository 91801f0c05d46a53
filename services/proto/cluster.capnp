# PagedWeight control-plane messages (ZeroMQ frames carrying Cap'n Proto).
#
# Every frame on the control plane is exactly one `Envelope`, serialized with Cap'n Proto's
# standard (unpacked) framing. The envelope carries the protocol version and a per-sender
# sequence number; receivers refuse another major version with a log line and drop the frame.
#
# Compatibility rules: within one major version, fields and union members are only ever added
# (with new ordinals); a receiver that meets a union member it does not know drops the frame
# with a log line. Removing or renumbering anything bumps `kProtocolMajor`.
#
# Units: times are milliseconds, sizes are bytes, token ids are vocabulary indices (UInt32).
# Socket topology (docs/architecture.md): the router and the broker bind ROUTER sockets; prefill
# and decode workers connect one DEALER to each. Every message a worker sends to the router is
# addressed by the ZeroMQ routing id the worker registered with (its `workerId`).
@0xc1bcecff0fad36d1;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pw::wire");

const kProtocolMajor :UInt16 = 1;
const kProtocolMinor :UInt16 = 5;  # 1: WeightManifest.checksumKind (CRC-32C expert checksums); 2: Register.nodeName;
                                   # 3: KvLayout.pagesPerBlock (a hybrid's recurrent state moves with its KV);
                                   # 4: an MLA model's latent layers in KvLayout.layerBytes and layoutHash
                                   # (deepseek_v3's latent KV moves prefill -> decode);
                                   # 5: attention layers of their own KV width (gemma4's full layers) in
                                   # layoutHash, KvLayout.layerBytes the widest layer, blockBytes the sum

enum Role {
  unknown @0;
  router @1;
  prefill @2;
  decode @3;
  broker @4;
  client @5;    # tools and tests that speak the control plane
}

# Where a peer's registered memory lives and how to reach it over UCX.
struct UcxMemory {
  workerAddress @0 :Data;   # ucp_worker_get_address bytes of the owner's UCX worker
  rkey @1 :Data;            # ucp_rkey_pack bytes for the region
  baseAddr @2 :UInt64;      # virtual address of byte 0 of the region in the owner
  bytes @3 :UInt64;         # region length in bytes
}

# Shape of a KV block pool; two workers exchange KV only when these agree exactly.
struct KvLayout {
  numBlocks @0 :UInt32;     # blocks in the pool
  blockTokens @1 :UInt32;   # tokens per block
  blockBytes @2 :UInt64;    # bytes of one block (all layers: layerBytes x numLayers; since 1.5 the sum of
                            # the layers' bytes, less where a layer is narrower than layerBytes)
  layoutHash @3 :UInt64;    # hash of the layout version, model, layer/head/dim/dtype; must match
  pageBytes @4 :UInt64;     # bytes of one page of the pool (memory/kv_blocks.h)
  layerBytes @5 :UInt64;    # bytes of one layer of one block inside its page: K and V of a full-
                            # attention or sliding layer; since 1.4 an MLA model's latent rows,
                            # blockTokens x (kv_lora_rank + qk_rope_head_dim) elements; since 1.5
                            # the widest layer's, when layers have their own KV width
  numLayers @6 :UInt32;     # layers of a block
  pagesPerBlock @7 :UInt32; # since 1.3: pages one block takes, its layers' in layer order (one
                            # per full-attention, sliding or latent layer, ceil(state bytes /
                            # pageBytes) per recurrent-state layer: memory/kv_blocks.h). 0 (a peer before
                            # 1.3): numLayers, one page per layer; such a peer cannot carry a
                            # hybrid's recurrent state and is refused for one
}

# ---- registration and liveness ----

struct Register {
  role @0 :Role;
  workerId @1 :Text;        # unique per process instance, equals the DEALER routing id
  pid @2 :UInt32;
  modelName @3 :Text;
  heartbeatIntervalMs @4 :UInt32;
  kvLayout @5 :KvLayout;    # decode and prefill workers: their KV pool
  kvMemory @6 :UcxMemory;   # decode workers: the registered KV pool (targets of prefill puts)
  maxBatch @7 :UInt32;      # decode: largest running batch; prefill: prompts per forward pass
  maxContext @8 :UInt32;    # tokens
  metricsPort @9 :UInt16;   # Prometheus /metrics port of this process, 0 if none
  weightTable @10 :List(WeightEntry);  # decode workers: committed expert widths (broker rebuild)
  residencyCapacity @11 :UInt32;       # decode workers with a residency budget: experts per MoE
                                       # layer kept resident (blocks of the others sit at 0 by
                                       # design); 0 = no budget, every block resident
  nodeName @12 :Text;       # since 1.2: the node (host, Kubernetes node) the worker runs on;
                            # placement pairs a prefill and a decode worker of one node. Empty
                            # (a 1.0 worker): a node of its own
}

struct RegisterAck {
  accepted @0 :Bool;
  reason @1 :Text;            # why not accepted (version, duplicate id, model mismatch)
  serverInstance @2 :UInt64;  # random per server process start; a change means it restarted
  heartbeatIntervalMs @3 :UInt32;
}

# Sent both ways every heartbeatIntervalMs. A peer silent for 3 intervals is dead.
struct Heartbeat {
  serverInstance @0 :UInt64;   # set by servers; clients re-register when it changes
  freeKvBlocks @1 :UInt32;
  usedKvBlocks @2 :UInt32;
  reservedKvBlocks @3 :UInt32; # leased but not yet admitted
  runningRequests @4 :UInt32;
  waitingRequests @5 :UInt32;
  queuedPromptTokens @6 :UInt64;
  draining @7 :Bool;           # refuses new work, finishing what it has
  kvCapacityBlocks @8 :UInt32; # decode: the most KV blocks the pool can hold at once, expert
                               # widths lowered to the planner's floors when it was told them
                               # (0: not said)
}

# A server that gets a message from an unregistered peer answers this; the peer re-registers.
struct NotRegistered {
  reason @0 :Text;
}

# ---- request path (DESIGN.md section 2) ----

struct SamplingParams {
  temperature @0 :Float32;    # 0 = greedy
  topP @1 :Float32 = 1.0;
  topK @2 :UInt32;            # 0 = off
  seed @3 :UInt64;
  maxTokens @4 :UInt32;       # generated tokens, including the first
  stopTokenIds @5 :List(UInt32);
  ignoreEos @6 :Bool;
  logprobs @7 :Int32 = -1;    # -1: none; N >= 0: each generated token's log-probability and
                              # its N most likely alternatives (TokenLogprob)
}

# A token's log-probability (natural log, from the raw logits, before temperature/top-k/top-p)
# and the most likely alternatives at its position, most likely first.
struct TokenLogprob {
  token @0 :UInt32;
  logprob @1 :Float32;
  topTokens @2 :List(UInt32);
  topLogprobs @3 :List(Float32);   # parallel to topTokens
}

# Router -> decode: reserve KV blocks for a prompt of numTokens tokens.
struct KvReserve {
  requestId @0 :UInt64;
  numTokens @1 :UInt32;       # prompt tokens whose KV prefill will write
  leaseMs @2 :UInt32;         # blocks return to the pool if KvReady does not arrive in time
  maxTokens @3 :UInt32;       # tokens still to generate after the prompt (0: not said)
}

# Decode -> router.
struct KvReserveReply {
  requestId @0 :UInt64;
  ok @1 :Bool;
  error @2 :Text;
  leaseId @3 :UInt64;             # names the reservation in StartDecode and Cancel
  blockIds @4 :List(UInt32);      # in sequence order; block i holds tokens [i*bt, (i+1)*bt)
  leaseExpiresMs @5 :UInt64;      # decode worker's steady-clock ms (informational)
  pageIds @6 :List(UInt32);       # the blocks' pages: KvLayout.pagesPerBlock P per block (numLayers
                                  # before 1.3), block i's page k at i * P + k (byte offset
                                  # pageId * pageBytes); a recurrent state sits in block 0's pages
}

# Router -> decode, about every third of a lease: the named leases' requests are still on their
# way (queued behind prefill, or prefilled and waiting for a decode slot); each live lease whose
# request id matches now expires leaseMs from its arrival. Leases it does not name are untouched.
struct KvRenew {
  leaseMs @0 :UInt32;
  requestIds @1 :List(UInt64);
  leaseIds @2 :List(UInt64);      # parallel to requestIds
}

# Router -> prefill: run a prompt and write its KV into a decode worker's reserved blocks.
struct PrefillRequest {
  requestId @0 :UInt64;
  tokens @1 :List(UInt32);        # prompt, plus already-streamed tokens when re-prefilling
  sampling @2 :SamplingParams;
  decodeWorkerId @3 :Text;
  decodeMemory @4 :UcxMemory;     # the decode worker's registered KV pool
  decodeLayout @5 :KvLayout;
  blockIds @6 :List(UInt32);      # reserved blocks, in sequence order
  leaseId @7 :UInt64;
  generatedSoFar @8 :UInt32;      # tokens of `tokens` that were generated (re-prefill); the
                                  # sampled token then has output index generatedSoFar
  pageIds @9 :List(UInt32);       # KvReserveReply.pageIds of the lease
  promptLogprobs @10 :Int32 = -1; # -1: none; N >= 0: KvReady.promptLogprobs with N alternatives
}

# Why a worker failed a request (KvReady.ok = false, Finish.reason = error).
enum ErrorKind {
  worker @0;           # the worker could not serve it (or a worker that predates errorKind said
                       # nothing): the router places the request again, counting the attempt
  invalidRequest @1;   # the request's own values are refused (errorParam names the field):
                       # placing it again cannot help; the router answers the client 400 and does
                       # not count it against the worker (common/sampling_check.h)
}

# Prefill -> router: KV is in the decode worker's blocks (puts flushed), first token sampled.
struct KvReady {
  requestId @0 :UInt64;
  ok @1 :Bool;
  error @2 :Text;
  firstToken @3 :UInt32;          # token sampled after the last of PrefillRequest.tokens
  numTokens @4 :UInt32;           # tokens whose KV was written
  leaseId @5 :UInt64;
  decodeWorkerId @6 :Text;
  firstLogprob @7 :TokenLogprob;          # sampling.logprobs >= 0: firstToken's
  promptLogprobs @8 :List(TokenLogprob);  # PrefillRequest.promptLogprobs >= 0: entry i is
                                          # tokens[i + 1] given tokens[0..i]
  promptRouting @9 :List(UInt32);  # [layers * experts] the prompt's top-k routing counts
                                   # (services/workers/common/prompt_features.h); empty: not recorded
  errorKind @10 :ErrorKind;        # ok = false: whose fault (default worker)
  errorParam @11 :Text;            # errorKind invalidRequest: the request field refused
}

# Router -> decode: admit a request whose KV arrived.
struct StartDecode {
  requestId @0 :UInt64;
  leaseId @1 :UInt64;
  tokens @2 :List(UInt32);        # the tokens whose KV is in the leased blocks
  firstToken @3 :UInt32;          # next input token (already streamed to the client)
  sampling @4 :SamplingParams;
  generatedSoFar @5 :UInt32;      # output tokens already streamed, including firstToken
  promptRouting @6 :List(UInt32); # KvReady.promptRouting of the prefill, as it came
  uncachedTokens @7 :UInt32;      # trailing tokens of `tokens` whose KV is not in the leased
                                  # blocks (a failover: the tokens streamed before firstToken,
                                  # <= generatedSoFar - 1; the lease covers them): this worker
                                  # computes it with its own experts before decoding firstToken
}

# Decode -> router: tokens generated, in order. startIndex is the output index of tokens[0]
# (0 = the first generated token), so the router detects gaps and repeats.
struct TokenChunk {
  requestId @0 :UInt64;
  startIndex @1 :UInt32;
  tokens @2 :List(UInt32);
  logprobs @3 :List(TokenLogprob);  # sampling.logprobs >= 0: one per token, else empty
}

enum FinishReason {
  stop @0;        # a stop token
  length @1;      # maxTokens or context reached
  cancelled @2;
  error @3;
}

# Decode (or prefill, on failure) -> router: the request ended; its blocks are free.
struct Finish {
  requestId @0 :UInt64;
  reason @1 :FinishReason;
  error @2 :Text;
  numGenerated @3 :UInt32;
  errorKind @4 :ErrorKind;    # reason error: whose fault (default worker)
  errorParam @5 :Text;        # errorKind invalidRequest: the request field refused
}

# Router -> prefill/decode: forget the request and free its blocks (lease or running).
struct Cancel {
  requestId @0 :UInt64;
  leaseId @1 :UInt64;       # 0 = whatever the request holds
  writerDone @2 :Bool;      # router -> decode: the prefill worker that was to write lease
                            # leaseId (non-zero) can no longer write it; its quarantined blocks
                            # may return to the pool. Touches nothing else (docs/architecture.md)
}

# Router -> worker: stop taking new work, finish in-flight requests, then exit.
struct Drain {
  deadlineMs @0 :UInt32;
}

# ---- telemetry, weights and planning ----

struct Telemetry {
  kvBlocksFree @0 :UInt32;
  kvBlocksUsed @1 :UInt32;
  ucxBytesPut @2 :UInt64;
  ucxBytesGot @3 :UInt64;
  tokensGenerated @4 :UInt64;
  expertMass @5 :List(Float32);   # [layers * experts] routing-mass EMA (services/workers/decode/routing_stats.h)
  pageBytes @6 :UInt64;           # the worker's page pool (memory/page_pool.h)
  poolPagesKv @7 :UInt32;
  poolPagesWeights @8 :UInt32;
  poolPagesFree @9 :UInt32;
  planEpoch @10 :UInt64;          # last plan epoch fully committed
  changesPending @11 :UInt32;     # blocks whose committed width differs from the desired one
  kvDemandPages @12 :UInt32;      # KV pages still needed and not held (services/workers/decode/kv_demand.h)
  promptFeatures @13 :List(Float32);  # [layers * experts] routing histogram of recent prefills
                                      # (services/workers/common/prompt_features.h); empty: none yet
  residencyCapacity @14 :UInt32;  # as Register.residencyCapacity (0 = no residency budget)
}

enum WeightKind {
  gateUp @0;
  down @1;
}

# One expert linear block as stored in the broker's host store.
struct WeightRegion {
  layer @0 :UInt32;
  expert @1 :UInt32;
  kind @2 :WeightKind;
  offset @3 :UInt64;        # bytes from UcxMemory.baseAddr
  bytes @4 :UInt64;
  bits @5 :UInt8;           # 16 = bf16 from the checkpoint; 3..8 = any-precision planes
  checksum @6 :UInt64;      # of the bytes, as WeightManifest.checksumKind says
}

# Worker -> broker: describe the store so I can load my experts.
struct WeightManifestRequest {
  modelName @0 :Text;
}

# One part of an any-precision expert block in the broker's mapped .apw store: a bit-plane
# (row-major, PlaneRowBytes(cols) bytes a row) or the fp16 LUT of one width ([rows][2^b]);
# docs/formats.md.
struct BlockPart {
  layer @0 :UInt32;
  expert @1 :UInt32;
  kind @2 :WeightKind;
  plane @3 :Int8;           # 0..7: bit-plane p (0 = most significant); -1: a LUT
  lutBits @4 :UInt8;        # the LUT's width (3..8) when plane = -1
  reserved @5 :UInt8;       # 0
  offset @6 :UInt64;        # bytes from WeightManifest.memory's baseAddr
  bytes @7 :UInt64;
  checksum @8 :UInt64;      # of the bytes, as WeightManifest.checksumKind says
}

# How the checksums of a manifest's regions and parts are computed (common/hash.h).
enum ChecksumKind {
  fnv1a64 @0;               # FNV-1a 64: brokers of protocol 1.0 (the field's default)
  crc32c @1;                # CRC-32C in the low 32 bits: brokers of protocol 1.1 and later
}

# Broker -> worker.
struct WeightManifest {
  ok @0 :Bool;
  error @1 :Text;
  memory @2 :UcxMemory;
  regions @3 :List(WeightRegion);     # bf16 stores: one region per block
  modelHash @4 :UInt64;
  anyPrecision @5 :Bool;              # true: `parts` describe an .apw store (regions empty)
  storeHash @6 :UInt64;               # the store's model hash (names the store in logs)
  parts @7 :List(BlockPart);          # every plane and every LUT width of every block
  initialBits @8 :UInt8;              # width a worker loads each block at before serving
  checksumKind @9 :ChecksumKind;      # of every region's and part's checksum
}

# Committed width of one expert block on a worker (weight page table entry, DESIGN.md 4).
struct WeightEntry {
  layer @0 :UInt32;
  expert @1 :UInt32;
  kind @2 :WeightKind;
  committedBits @3 :UInt8;  # q_i: 0 = not resident
  desiredBits @4 :UInt8;    # d_i
}

# Broker -> worker (later issues): desired widths for an epoch.
struct Plan {
  epoch @0 :UInt64;
  changes @1 :List(WeightEntry);
}

# Worker -> broker: what was committed for an epoch.
struct PlanAck {
  epoch @0 :UInt64;
  committed @1 :List(WeightEntry);
  complete @2 :Bool;        # every change of the epoch is committed (else: more acks follow)
  refused @3 :List(WeightEntry);  # changes the worker cannot make (error in `reason`)
  reason @4 :Text;
}

# pw-ctl -> broker: inspect or change expert widths by hand (the broker turns changes into
# plans for every decode worker).
struct CtlRequest {
  union {
    show @0 :CtlShow;
    setBits @1 :CtlSetBits;
    apply @2 :List(CtlSetBits);     # several selections, one plan (bits 0 = drop allowed)
  }
}

struct CtlShow {
  blocks @0 :Bool;          # list every block, not only per-layer histograms
  layer @1 :Int32 = -1;     # only this layer (-1: all)
}

struct CtlSetBits {
  bits @0 :UInt8;           # 3..8 (or 16 for a bf16 store)
  layer @1 :Int32 = -1;     # -1: every layer
  expert @2 :Int32 = -1;    # -1: every expert (with layer set: the whole layer)
  kind @3 :Int8 = -1;       # -1: both; 0 gate_up; 1 down
}

struct CtlReply {
  ok @0 :Bool;
  error @1 :Text;
  text @2 :Text;            # human-readable answer
  epoch @3 :UInt64;         # the plan epoch a change was sent as
}

struct Envelope {
  versionMajor @0 :UInt16;
  versionMinor @1 :UInt16;
  seq @2 :UInt64;           # per link (sender -> receiver), starts at 1, +1 per frame
  senderId @3 :Text;
  sentAtMs @4 :UInt64;      # sender's steady-clock ms (diagnostics only)
  body :union {
    none @5 :Void;
    register @6 :Register;
    registerAck @7 :RegisterAck;
    heartbeat @8 :Heartbeat;
    notRegistered @9 :NotRegistered;
    kvReserve @10 :KvReserve;
    kvReserveReply @11 :KvReserveReply;
    prefillRequest @12 :PrefillRequest;
    kvReady @13 :KvReady;
    startDecode @14 :StartDecode;
    tokenChunk @15 :TokenChunk;
    finish @16 :Finish;
    cancel @17 :Cancel;
    drain @18 :Drain;
    telemetry @19 :Telemetry;
    weightManifestRequest @20 :WeightManifestRequest;
    weightManifest @21 :WeightManifest;
    plan @22 :Plan;
    planAck @23 :PlanAck;
    ctlRequest @25 :CtlRequest;
    ctlReply @26 :CtlReply;
    kvRenew @27 :KvRenew;
  }
  ackSeq @24 :UInt64;       # clients: seq of the last server frame handled in the current
                            # registration (0 while unregistered); see services/transport/control.h
}

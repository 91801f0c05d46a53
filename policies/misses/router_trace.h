// Router-logit traces: per MoE layer of every forward pass, each token's router logits (fp16)
// and the router's own selection (experts and gate weights, before any routing hook), in one
// append-only file (docs/formats.md, "Router-logit trace"). pw-sim replays them
// (trace_replay.h); the engine writes them through its recorder seam
// (engine/hooks/trace_recorder.h).
//
// File: a 64-byte header, then records, each a 16-byte record header and a payload:
//   layer record: one MoE layer of one forward pass (T tokens);
//   end record:   the counts; always the last record. A file without one was cut short.
// Every header and payload carries a CRC-32 (pw::Crc32, common/hash.h). The reader
// refuses a bad magic or version, a checksum mismatch, out-of-range layers or experts, and trailing
// bytes, naming the byte offset and record index. A file cut short (its writer killed, or stopped
// by a failed write such as a full disk) is read up to its last whole record: the records read are
// kept and RouterTrace::tail says where the cut is and how many bytes of an incomplete last record
// follow it. Only the end of the file can be cut: a record that fails its checksum is corruption
// wherever it is, and so is a whole last record.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pw::misses {

// Version 1: softmax gates. Version 2: a sigmoid gate (TraceGate::kSigmoid): the header names
// the gate and its groups, and each MoE layer's selection bias is a bias record before the
// layer's first layer record. A softmax trace is still written as version 1, byte for byte.
inline constexpr uint32_t kRouterTraceVersion = 2;

// What the router's scores are: a softmax over the logits, or a sigmoid per expert whose
// selection adds a per-layer bias (e_score_correction_bias) and keeps topk_group of n_group
// expert groups (DeepSeek-V3, GLM-4.5).
enum class TraceGate : uint32_t { kSoftmax = 0, kSigmoid = 1 };

struct TraceHeader {
  uint32_t num_layers = 0;   // MoE layers are indexed by model layer, < num_layers
  uint32_t num_experts = 0;  // E
  uint32_t top_k = 0;        // k
  bool norm_topk_prob = false;
  uint32_t hidden_size = 0;             // H (an expert block is 3 * H * I weights)
  uint32_t moe_intermediate_size = 0;   // I
  uint64_t model_hash = 0;              // the writer's model identity (0: not given)
  TraceGate gate = TraceGate::kSoftmax;
  uint32_t n_group = 1, topk_group = 1;  // kSigmoid: the selection's groups
};

// One layer record, in memory.
struct TraceLayer {
  uint32_t layer = 0;
  uint64_t step = 0;               // the forward pass it belongs to (the writer's counter)
  std::vector<uint64_t> seq_ids;   // [T]
  std::vector<int32_t> positions;  // [T]
  std::vector<uint16_t> logits;    // [T, E] IEEE fp16
  std::vector<uint16_t> experts;   // [T, k] router top-k, rank order
  std::vector<float> weights;      // [T, k] their gate weights
  size_t num_tokens() const { return seq_ids.size(); }
};

struct TraceCounts {
  uint64_t layer_records = 0;
  uint64_t token_layers = 0;         // sum of T over layer records
  uint64_t dropped_records = 0;      // layer records not written (size bound, sampling)
  uint64_t dropped_token_layers = 0;
};

// The smallest bounded trace that can hold a record: the 64-byte header, one layer record of one
// token and the 48-byte end record, for E experts and top-k.
uint64_t MinTraceBytes(uint32_t num_experts, uint32_t top_k);
// The same for any model (E = k = 1): 164 bytes. A bound below it holds no record of any
// model, so configuration refuses it before the model is known.
inline constexpr uint64_t kMinTraceBytesAnyModel = 64 + (16 + 16 + 20) + (16 + 32);

// Writes a trace. Append is bounded by max_bytes (0: unbounded): a record that would cross it
// is dropped and counted, so the file stays valid. The header reaches the file at Create, and
// each drop flushes what was buffered before it, so at the bound every record written is on
// disk, not only after Close. Not thread-safe.
class RouterTraceWriter {
 public:
  // kInvalidArgument on a bad shape or a max_bytes (not 0) below MinTraceBytes(E, k).
  static Result<std::unique_ptr<RouterTraceWriter>> Create(const std::string& path,
                                                           const TraceHeader& header,
                                                           uint64_t max_bytes = 0);
  ~RouterTraceWriter();
  RouterTraceWriter(const RouterTraceWriter&) = delete;
  RouterTraceWriter& operator=(const RouterTraceWriter&) = delete;

  // One MoE layer of one forward pass: T tokens, logits fp32 [T, E] (stored as fp16),
  // experts [T, k], weights [T, k]. seq_ids/positions may be null (zeros written).
  Status Append(uint32_t layer, uint64_t step, size_t num_tokens, const uint64_t* seq_ids,
                const int32_t* positions, const float* logits, const int32_t* experts,
                const float* weights);
  // kSigmoid: layer `layer`'s selection bias [E], written as a bias record before the layer's
  // first layer record (and counted against the bound with it). Append refuses a layer whose
  // bias was not given.
  Status SetSelectionBias(uint32_t layer, const float* bias);
  // Counts a record the caller chose not to write (sampling).
  void CountDropped(size_t num_tokens) {
    counts_.dropped_records++;
    counts_.dropped_token_layers += num_tokens;
  }
  // Writes the end record and closes the file. Called by the destructor if not before (errors
  // then go to the log).
  Status Close();

  const TraceCounts& counts() const { return counts_; }
  uint64_t bytes() const { return bytes_; }
  const TraceHeader& header() const { return header_; }

 private:
  RouterTraceWriter(std::FILE* f, std::string path, const TraceHeader& h, uint64_t max_bytes);
  Status WriteRecord(uint32_t kind, const std::vector<uint8_t>& payload);

  std::FILE* f_;
  std::string path_;
  TraceHeader header_;
  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  TraceCounts counts_;
  std::vector<uint8_t> buf_;
  bool failed_ = false;
  bool unflushed_ = false;  // records written since the last fflush
  std::vector<std::vector<float>> bias_;  // kSigmoid: per layer, empty until given
  std::vector<uint8_t> bias_written_;     // per layer
};

// How a trace file ends.
struct TraceTail {
  bool complete = true;      // the end record was read
  uint64_t whole_bytes = 0;  // the header and every whole record: where a cut file's data ends
  uint64_t torn_bytes = 0;   // bytes after them: the start of a record the writer did not finish
  // Not complete: what was read and where it was cut, naming the file, e.g. "t.trace: cut
  // short (no end record): 11 whole layer records read; record 11 at byte 1484 is torn (40 of
  // 532 bytes), ignored".
  std::string message;
};

// A trace, read and validated.
struct RouterTrace {
  TraceHeader header;
  std::vector<TraceLayer> layers;  // file order
  std::vector<std::vector<float>> selection_bias;  // kSigmoid: [num_layers][E] (empty: no record)
  // The end record's; for a file cut short, those of the records read (dropped ones unknown: 0).
  TraceCounts counts;
  TraceTail tail;

  // Reads and validates `path` (rules above); kCorrupt / kNotFound with the path and offset.
  // A file cut short after its header is read (tail.complete false); one shorter than the
  // header is refused ("truncated").
  static Result<RouterTrace> Read(const std::string& path);
  // Parses an in-memory image (what Read does after loading the file); `name` for messages.
  static Result<RouterTrace> Parse(const uint8_t* data, size_t size, const std::string& name);
};

}  // namespace pw::misses

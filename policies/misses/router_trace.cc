#include "policies/misses/router_trace.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "common/hash.h"
#include "common/dtype.h"
#include "common/logging.h"

namespace pw::misses {
namespace {


constexpr char kMagic[8] = {'P', 'W', 'R', 'T', 'R', 'A', 'C', 'E'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kRecordHeaderBytes = 16;
constexpr uint32_t kLayerRecord = 1;
constexpr uint32_t kEndRecord = 2;
constexpr uint32_t kBiasRecord = 3;  // version 2: u32 layer, f32 bias[E]
constexpr size_t kEndPayload = 32;

template <typename T>
void Put(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof v);
}
template <typename T>
T Get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof v);
  return v;
}

size_t LayerPayloadBytes(size_t T, size_t E, size_t k) {
  return 16 + T * (8 + 4 + 2 * E + 2 * k + 4 * k);
}

}  // namespace

uint64_t MinTraceBytes(uint32_t num_experts, uint32_t top_k) {
  return kHeaderBytes + kRecordHeaderBytes + LayerPayloadBytes(1, num_experts, top_k) +
         kRecordHeaderBytes + kEndPayload;
}

static_assert(kMinTraceBytesAnyModel ==
              kHeaderBytes + kRecordHeaderBytes + 16 + 20 + kRecordHeaderBytes + kEndPayload);

Result<std::unique_ptr<RouterTraceWriter>> RouterTraceWriter::Create(const std::string& path,
                                                                     const TraceHeader& h,
                                                                     uint64_t max_bytes) {
  if (h.num_layers == 0 || h.num_experts == 0 || h.num_experts > 65535 || h.top_k == 0 ||
      h.top_k > h.num_experts) {
    return InvalidArgument("router trace: bad shape (" + std::to_string(h.num_layers) +
                           " layers, " + std::to_string(h.num_experts) + " experts, top-" +
                           std::to_string(h.top_k) + ")");
  }
  if (max_bytes != 0 && max_bytes < MinTraceBytes(h.num_experts, h.top_k)) {
    return InvalidArgument("router trace: a bound of " + std::to_string(max_bytes) +
                           " bytes holds no record: a trace of this model (" +
                           std::to_string(h.num_experts) + " experts, top-" +
                           std::to_string(h.top_k) + ") with one record of one token takes " +
                           std::to_string(MinTraceBytes(h.num_experts, h.top_k)) + " bytes");
  }
  if (h.gate != TraceGate::kSoftmax && h.gate != TraceGate::kSigmoid) {
    return InvalidArgument("router trace: unknown gate " + std::to_string(static_cast<uint32_t>(h.gate)));
  }
  if (h.gate == TraceGate::kSigmoid &&
      (h.n_group == 0 || h.n_group > 65535 || h.num_experts % h.n_group != 0 || h.topk_group == 0 ||
       h.topk_group > h.n_group)) {
    return InvalidArgument("router trace: " + std::to_string(h.num_experts) + " experts in n_group " +
                           std::to_string(h.n_group) + " keeping topk_group " +
                           std::to_string(h.topk_group));
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return NotFound("cannot create router trace " + path);
  std::unique_ptr<RouterTraceWriter> w(new RouterTraceWriter(f, path, h, max_bytes));
  uint8_t hdr[kHeaderBytes] = {};
  std::memcpy(hdr, kMagic, 8);
  const bool sigmoid = h.gate == TraceGate::kSigmoid;
  Put<uint32_t>(hdr, 8, sigmoid ? 2u : 1u);
  Put<uint32_t>(hdr, 12, static_cast<uint32_t>(kHeaderBytes));
  Put<uint32_t>(hdr, 16, h.num_layers);
  Put<uint32_t>(hdr, 20, h.num_experts);
  Put<uint32_t>(hdr, 24, h.top_k);
  Put<uint32_t>(hdr, 28, h.norm_topk_prob ? 1u : 0u);
  Put<uint32_t>(hdr, 32, h.hidden_size);
  Put<uint32_t>(hdr, 36, h.moe_intermediate_size);
  Put<uint64_t>(hdr, 40, h.model_hash);
  if (sigmoid) {
    Put<uint32_t>(hdr, 48, static_cast<uint32_t>(h.gate));
    Put<uint16_t>(hdr, 52, static_cast<uint16_t>(h.n_group));
    Put<uint16_t>(hdr, 54, static_cast<uint16_t>(h.topk_group));
    w->bias_.resize(h.num_layers);
    w->bias_written_.assign(h.num_layers, 0);
  }
  Put<uint32_t>(hdr, 60, Crc32(hdr, 60));
  // Flushed at once: a file that exists is a readable (empty, cut short) trace, and a full
  // disk shows here rather than at the first record.
  if (std::fwrite(hdr, 1, kHeaderBytes, f) != kHeaderBytes || std::fflush(f) != 0) {
    return Internal("cannot write router trace " + path);
  }
  w->bytes_ = kHeaderBytes;
  return w;
}

RouterTraceWriter::RouterTraceWriter(std::FILE* f, std::string path, const TraceHeader& h,
                                     uint64_t max_bytes)
    : f_(f), path_(std::move(path)), header_(h), max_bytes_(max_bytes) {}

RouterTraceWriter::~RouterTraceWriter() {
  if (f_ != nullptr) {
    const Status s = Close();
    if (!s.ok()) PW_LOG(ERROR) << "router trace: " << s.ToString();
  }
}

Status RouterTraceWriter::WriteRecord(uint32_t kind, const std::vector<uint8_t>& payload) {
  uint8_t rh[kRecordHeaderBytes];
  Put<uint32_t>(rh, 0, kind);
  Put<uint32_t>(rh, 4, static_cast<uint32_t>(payload.size()));
  Put<uint32_t>(rh, 8, Crc32(payload.data(), payload.size()));
  Put<uint32_t>(rh, 12, Crc32(rh, 12));
  if (std::fwrite(rh, 1, kRecordHeaderBytes, f_) != kRecordHeaderBytes ||
      std::fwrite(payload.data(), 1, payload.size(), f_) != payload.size()) {
    failed_ = true;
    return Internal("cannot write router trace " + path_);
  }
  bytes_ += kRecordHeaderBytes + payload.size();
  unflushed_ = true;
  return Status::Ok();
}

Status RouterTraceWriter::SetSelectionBias(uint32_t layer, const float* bias) {
  if (header_.gate != TraceGate::kSigmoid) return InvalidArgument("router trace: a softmax gate has no selection bias");
  if (layer >= header_.num_layers) {
    return InvalidArgument("router trace: layer " + std::to_string(layer) + " of " +
                           std::to_string(header_.num_layers));
  }
  if (bias_[layer].empty()) bias_[layer].assign(bias, bias + header_.num_experts);
  return Status::Ok();
}

Status RouterTraceWriter::Append(uint32_t layer, uint64_t step, size_t num_tokens,
                                 const uint64_t* seq_ids, const int32_t* positions,
                                 const float* logits, const int32_t* experts,
                                 const float* weights) {
  if (f_ == nullptr || failed_) return Internal("router trace " + path_ + " is closed or failed");
  if (layer >= header_.num_layers) {
    return InvalidArgument("router trace: layer " + std::to_string(layer) + " of " +
                           std::to_string(header_.num_layers));
  }
  const size_t T = num_tokens, E = header_.num_experts, k = header_.top_k;
  const size_t bytes = LayerPayloadBytes(T, E, k);
  if (bytes > 0xffffffffu) return InvalidArgument("router trace: record of " + std::to_string(T) + " tokens is too large");
  // A sigmoid trace's layer needs its bias record first (with the layer record, or neither).
  const bool needs_bias = header_.gate == TraceGate::kSigmoid && !bias_written_[layer];
  if (needs_bias && bias_[layer].empty()) {
    return InvalidArgument("router trace: layer " + std::to_string(layer) +
                           " of a sigmoid gate has no selection bias (SetSelectionBias)");
  }
  const size_t bias_bytes = needs_bias ? kRecordHeaderBytes + 4 + 4 * E : 0;
  // Keep room for the end record: the file stays valid at the bound.
  if (max_bytes_ != 0 &&
      bytes_ + bias_bytes + kRecordHeaderBytes + bytes + kRecordHeaderBytes + kEndPayload > max_bytes_) {
    CountDropped(T);
    // At the bound the file grows by a small record now and then at most: put what it holds on
    // disk (a small bound otherwise sits in the stdio buffer, the file empty, until Close).
    if (unflushed_) {
      unflushed_ = false;
      if (std::fflush(f_) != 0) {
        failed_ = true;
        return Internal("cannot write router trace " + path_);
      }
    }
    return Status::Ok();
  }
  if (needs_bias) {
    buf_.resize(4 + 4 * E);
    Put<uint32_t>(buf_.data(), 0, layer);
    std::memcpy(buf_.data() + 4, bias_[layer].data(), 4 * E);
    PW_RETURN_IF_ERROR(WriteRecord(kBiasRecord, buf_));
    bias_written_[layer] = 1;
  }
  buf_.resize(bytes);
  uint8_t* p = buf_.data();
  Put<uint32_t>(p, 0, layer);
  Put<uint32_t>(p, 4, static_cast<uint32_t>(T));
  Put<uint64_t>(p, 8, step);
  size_t off = 16;
  for (size_t t = 0; t < T; ++t, off += 8) Put<uint64_t>(p, off, seq_ids ? seq_ids[t] : 0);
  for (size_t t = 0; t < T; ++t, off += 4) Put<int32_t>(p, off, positions ? positions[t] : 0);
  for (size_t i = 0; i < T * E; ++i, off += 2) Put<uint16_t>(p, off, F32ToF16(logits[i]));
  for (size_t i = 0; i < T * k; ++i, off += 2) {
    if (experts[i] < 0 || static_cast<size_t>(experts[i]) >= E) {
      return InvalidArgument("router trace: expert " + std::to_string(experts[i]) + " of " +
                             std::to_string(E));
    }
    Put<uint16_t>(p, off, static_cast<uint16_t>(experts[i]));
  }
  for (size_t i = 0; i < T * k; ++i, off += 4) Put<float>(p, off, weights[i]);
  PW_RETURN_IF_ERROR(WriteRecord(kLayerRecord, buf_));
  counts_.layer_records++;
  counts_.token_layers += T;
  return Status::Ok();
}

Status RouterTraceWriter::Close() {
  if (f_ == nullptr) return Status::Ok();
  Status s = Status::Ok();
  if (!failed_) {
    std::vector<uint8_t> end(kEndPayload);
    Put<uint64_t>(end.data(), 0, counts_.layer_records);
    Put<uint64_t>(end.data(), 8, counts_.token_layers);
    Put<uint64_t>(end.data(), 16, counts_.dropped_records);
    Put<uint64_t>(end.data(), 24, counts_.dropped_token_layers);
    s = WriteRecord(kEndRecord, end);
  }
  if (std::fclose(f_) != 0 && s.ok()) s = Internal("cannot write router trace " + path_);
  f_ = nullptr;
  return s;
}

Result<RouterTrace> RouterTrace::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open router trace " + path);
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Parse(data.data(), data.size(), path);
}

Result<RouterTrace> RouterTrace::Parse(const uint8_t* data, size_t size, const std::string& name) {
  if (size < kHeaderBytes) {
    return Corrupt(name + ": truncated: " + std::to_string(size) +
                   " bytes, smaller than the 64-byte router trace header");
  }
  if (std::memcmp(data, kMagic, 8) != 0) return Corrupt(name + ": not a router trace (bad magic)");
  const uint32_t version = Get<uint32_t>(data, 8);
  if (version != 1 && version != kRouterTraceVersion) {
    return Corrupt(name + ": router trace version " + std::to_string(version) +
                   ", this reader knows versions 1 and " + std::to_string(kRouterTraceVersion));
  }
  if (Get<uint32_t>(data, 60) != Crc32(data, 60)) return Corrupt(name + ": header checksum mismatch");
  if (Get<uint32_t>(data, 12) != kHeaderBytes) return Corrupt(name + ": bad header size");
  RouterTrace tr;
  TraceHeader& h = tr.header;
  h.num_layers = Get<uint32_t>(data, 16);
  h.num_experts = Get<uint32_t>(data, 20);
  h.top_k = Get<uint32_t>(data, 24);
  h.norm_topk_prob = (Get<uint32_t>(data, 28) & 1u) != 0;
  h.hidden_size = Get<uint32_t>(data, 32);
  h.moe_intermediate_size = Get<uint32_t>(data, 36);
  h.model_hash = Get<uint64_t>(data, 40);
  if (version == 2) {
    const uint32_t gate = Get<uint32_t>(data, 48);
    if (gate != static_cast<uint32_t>(TraceGate::kSigmoid)) {
      return Corrupt(name + ": router trace version 2 names gate " + std::to_string(gate) +
                     " (version 2 is the sigmoid gate's, 1)");
    }
    h.gate = TraceGate::kSigmoid;
    h.n_group = Get<uint16_t>(data, 52);
    h.topk_group = Get<uint16_t>(data, 54);
  }
  if (h.num_layers == 0 || h.num_experts == 0 || h.num_experts > 65535 || h.top_k == 0 ||
      h.top_k > h.num_experts) {
    return Corrupt(name + ": bad shape in header");
  }
  if (h.gate == TraceGate::kSigmoid &&
      (h.n_group == 0 || h.num_experts % h.n_group != 0 || h.topk_group == 0 || h.topk_group > h.n_group)) {
    return Corrupt(name + ": bad groups in header (n_group " + std::to_string(h.n_group) +
                   ", topk_group " + std::to_string(h.topk_group) + ")");
  }
  if (h.gate == TraceGate::kSigmoid) tr.selection_bias.resize(h.num_layers);
  const size_t E = h.num_experts, k = h.top_k;
  size_t off = kHeaderBytes;
  bool ended = false;
  // A record the file ends inside of: its index, and its size when its header is whole (else 0).
  uint64_t torn_index = 0;
  size_t torn_size = 0;
  bool torn = false;
  for (uint64_t index = 0; off < size; ++index) {
    const std::string where = name + ": record " + std::to_string(index) + " at byte " + std::to_string(off);
    if (ended) return Corrupt(where + ": trailing bytes after the end record");
    if (size - off < kRecordHeaderBytes) {  // the file ends inside a record header
      torn = true;
      torn_index = index;
      break;
    }
    const uint8_t* rh = data + off;
    if (Get<uint32_t>(rh, 12) != Crc32(rh, 12)) return Corrupt(where + ": record header checksum mismatch");
    const uint32_t kind = Get<uint32_t>(rh, 0);
    const size_t len = Get<uint32_t>(rh, 4);
    if (kind != kEndRecord && kind != kLayerRecord && (kind != kBiasRecord || h.gate != TraceGate::kSigmoid)) {
      return Corrupt(where + ": unknown record kind " + std::to_string(kind));
    }
    if (kind == kEndRecord && len != kEndPayload) return Corrupt(where + ": bad end record size");
    if (kind == kBiasRecord && len != 4 + 4 * E) return Corrupt(where + ": bad bias record size");
    if (kind == kLayerRecord && (len < 16 || (len - 16) % (LayerPayloadBytes(1, E, k) - 16) != 0)) {
      return Corrupt(where + ": layer record of " + std::to_string(len) + " bytes, not 16 + T * " +
                     std::to_string(LayerPayloadBytes(1, E, k) - 16));
    }
    if (size - off - kRecordHeaderBytes < len) {  // the file ends inside its payload
      torn = true;
      torn_index = index;
      torn_size = kRecordHeaderBytes + len;
      break;
    }
    const uint8_t* p = rh + kRecordHeaderBytes;
    if (Get<uint32_t>(rh, 8) != Crc32(p, len)) return Corrupt(where + ": payload checksum mismatch");
    off += kRecordHeaderBytes + len;
    if (kind == kEndRecord) {
      tr.counts.layer_records = Get<uint64_t>(p, 0);
      tr.counts.token_layers = Get<uint64_t>(p, 8);
      tr.counts.dropped_records = Get<uint64_t>(p, 16);
      tr.counts.dropped_token_layers = Get<uint64_t>(p, 24);
      ended = true;
      continue;
    }
    if (kind == kBiasRecord) {
      const uint32_t layer = Get<uint32_t>(p, 0);
      if (layer >= h.num_layers || !tr.selection_bias[layer].empty()) {
        return Corrupt(where + ": bias record for layer " + std::to_string(layer) +
                       (layer >= h.num_layers ? " of " + std::to_string(h.num_layers) : " again"));
      }
      tr.selection_bias[layer].resize(E);
      std::memcpy(tr.selection_bias[layer].data(), p + 4, 4 * E);
      continue;
    }
    TraceLayer L;
    L.layer = Get<uint32_t>(p, 0);
    const size_t T = Get<uint32_t>(p, 4);
    L.step = Get<uint64_t>(p, 8);
    if (L.layer >= h.num_layers) {
      return Corrupt(where + ": layer " + std::to_string(L.layer) + " of " + std::to_string(h.num_layers));
    }
    if (len != LayerPayloadBytes(T, E, k)) return Corrupt(where + ": size does not match its token count");
    if (h.gate == TraceGate::kSigmoid && tr.selection_bias[L.layer].empty()) {
      return Corrupt(where + ": layer " + std::to_string(L.layer) +
                     " of a sigmoid gate before its bias record");
    }
    size_t q = 16;
    L.seq_ids.resize(T);
    L.positions.resize(T);
    L.logits.resize(T * E);
    L.experts.resize(T * k);
    L.weights.resize(T * k);
    std::memcpy(L.seq_ids.data(), p + q, T * 8);
    q += T * 8;
    std::memcpy(L.positions.data(), p + q, T * 4);
    q += T * 4;
    std::memcpy(L.logits.data(), p + q, T * E * 2);
    q += T * E * 2;
    std::memcpy(L.experts.data(), p + q, T * k * 2);
    q += T * k * 2;
    std::memcpy(L.weights.data(), p + q, T * k * 4);
    for (uint16_t e : L.experts) {
      if (e >= E) return Corrupt(where + ": expert " + std::to_string(e) + " of " + std::to_string(E));
    }
    tr.layers.push_back(std::move(L));
  }
  uint64_t token_layers = 0;
  for (const TraceLayer& L : tr.layers) token_layers += L.num_tokens();
  tr.tail.whole_bytes = off;
  tr.tail.torn_bytes = size - off;
  if (!ended) {
    tr.tail.complete = false;
    tr.counts.layer_records = tr.layers.size();
    tr.counts.token_layers = token_layers;
    std::string m = name + ": cut short (no end record; the writer did not finish): " +
                    std::to_string(tr.layers.size()) + " whole layer records read (" +
                    std::to_string(off) + " bytes)";
    if (torn) {
      m += "; record " + std::to_string(torn_index) + " at byte " + std::to_string(off) +
           " is torn (" + std::to_string(size - off) + " of " +
           (torn_size != 0 ? std::to_string(torn_size) + " bytes" : "its 16-byte header") +
           "), ignored";
    }
    tr.tail.message = std::move(m);
    return tr;
  }
  if (tr.counts.layer_records != tr.layers.size() || tr.counts.token_layers != token_layers) {
    return Corrupt(name + ": end record counts " + std::to_string(tr.counts.layer_records) +
                   " records, the file holds " + std::to_string(tr.layers.size()));
  }
  return tr;
}

}  // namespace pw::misses

#include "services/serve/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/formats/apw_store.h"
#include "kernels/anyprec/q8.h"
#include "kernels/cpu/packed_bf16.h"
#include "memory/kv_layout.h"
#include "memory/kv_spec.h"
#include "memory/weight_page_table.h"

namespace pw::serve {

std::string FormatBytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  }
  return buf;
}

Result<int64_t> MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) return static_cast<int64_t>(kib) * 1024;
  }
  return NotFound("/proc/meminfo: no MemAvailable line (give --memory BYTES)");
}

Result<int64_t> ParseMemory(const std::string& text) {
  if (text == "auto") {
    PW_ASSIGN_OR_RETURN(int64_t avail, MemAvailableBytes());
    return static_cast<int64_t>(static_cast<double>(avail) * kAutoShare);
  }
  const auto bad = [&] {
    return InvalidArgument("--memory '" + text + "': give bytes (e.g. 8G, 512M, 1073741824) or auto");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (...) {
    return bad();
  }
  std::string unit = text.substr(i);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  double scale = 1;
  if (unit.empty()) {
    scale = 1;
  } else if (unit == "K" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "M" || unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "G" || unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "t") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return bad();
  }
  const double bytes = value * scale;
  if (!(bytes >= 1) || bytes > 9e18) return bad();
  return static_cast<int64_t>(bytes);
}

int64_t StoreBytes(const ModelConfig& c) {
  const auto h = static_cast<uint32_t>(c.hidden_size), f = static_cast<uint32_t>(c.moe_intermediate_size);
  const uint64_t per_expert = (apw::BlockDataBytes(2 * f, h) + apw::kDataAlign - 1) / apw::kDataAlign * apw::kDataAlign +
                              (apw::BlockDataBytes(h, f) + apw::kDataAlign - 1) / apw::kDataAlign * apw::kDataAlign;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  const uint64_t blocks = static_cast<uint64_t>(moe_layers * c.num_experts * 2);
  return static_cast<int64_t>(apw::kDataAlign + per_expert * moe_layers * c.num_experts + blocks * 128);
}

int64_t PackedExpertBytes(const ModelConfig& c) {
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  const auto H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(c.moe_intermediate_size);
  const auto one = static_cast<int64_t>(2 * cpu::PackedBf16Bytes(I, H) + cpu::PackedBf16Bytes(H, I));
  return moe_layers * c.num_experts * one;
}

int64_t PrefillLutBytes(const ModelConfig& c, int bits) {
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  // Rows of one expert: gate_up's 2 x ffn and down's hidden.
  const int64_t rows = 2 * c.moe_intermediate_size + c.hidden_size;
  const auto per_row = static_cast<int64_t>(anyprec::Q8LutValueBytes(1, bits) + sizeof(float));
  return moe_layers * c.num_experts * rows * per_row;
}

std::string MemoryPlan::Summary() const {
  std::ostringstream s;
  s << "memory " << FormatBytes(budget) << ": checkpoint " << FormatBytes(checkpoint) << ", store "
    << FormatBytes(store) << (dense_copies > 0 ? ", dense copies " + FormatBytes(dense_copies) : std::string())
    << (expert_copy > 0 ? ", packed experts " + FormatBytes(expert_copy) : std::string())
    << ", prefill KV " << FormatBytes(prefill_kv)
    << (prefill_luts > 0 ? ", prefill experts at " + std::to_string(prefill_bits) + " bits (LUTs " +
                               FormatBytes(prefill_luts) + ")"
                         : std::string())
    << ", processes " << FormatBytes(processes)
    << ", decode pool " << FormatBytes(pool) << " (experts at " << bits << " bits "
    << (bits == 16 ? std::string("from the checkpoint") : FormatBytes(experts)) << ", KV for " << kv_tokens
    << " tokens)";
  return s.str();
}

Result<MemoryPlan> PlanMemory(const ModelConfig& c, int64_t checkpoint_bytes, int64_t budget,
                              const std::string& bits_text, const std::string& budget_text,
                              int64_t dense_copy_bytes, int auto_max_bits, int prefill_max_bits,
                              int64_t expert_copy_bytes) {
  MemoryPlan p;
  p.budget = budget;
  p.checkpoint = checkpoint_bytes;
  memory::KvLayout kl;
  kl.num_layers = static_cast<int>(c.num_layers);
  kl.num_kv_heads = static_cast<int>(c.num_kv_heads);
  kl.head_dim = static_cast<int>(c.head_dim);
  kl.block_size = kKvBlockSize;
  kl.dtype = kKvBytesPerElement == 2 ? memory::KvDtype::kBf16 : memory::KvDtype::kF32;
  // The pages the workers lay their KV out in (their default page, memory/kv_spec.h): as large
  // as the largest per-token layer needs — an MLA model's latent row, not 2 x heads x head_dim —
  // and a block takes each layer's pages (a recurrent state's several).
  const std::vector<memory::KvLayerSpec> specs = memory::ModelKvSpecs(c);
  p.page_bytes = static_cast<int64_t>(memory::MinPageBytes(kl, specs));
  PW_ASSIGN_OR_RETURN(const std::vector<int> offsets,
                      memory::BlockPageOffsets(specs, kl, static_cast<size_t>(p.page_bytes)));
  p.block_bytes = p.page_bytes * offsets.back();
  const int64_t block_bytes = p.block_bytes;
  p.prefill_kv = kPrefillKvBlocks * block_bytes;
  p.processes = 4 * kProcessBytes;
  const bool bf16 = bits_text == "16";
  p.store = bf16 ? 0 : StoreBytes(c);
  // Whole MiB: the node file gives the pool in MiB.
  p.dense_copies = 2 * dense_copy_bytes;  // the prefill and the decode worker each
  p.expert_copy = bf16 ? expert_copy_bytes : 0;
  p.pool = budget - p.checkpoint - p.store - p.dense_copies - p.expert_copy - p.prefill_kv - p.processes;
  if (p.pool > 0) p.pool = p.pool >> 20 << 20;

  const int64_t context = c.max_position_embeddings > 1 ? c.max_position_embeddings : 2048;
  const int64_t min_tokens = std::min(context, kMinKvTokens);
  const int64_t min_kv = (min_tokens + kKvBlockSize - 1) / kKvBlockSize * block_bytes;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  auto experts_at = [&](int bits) -> Result<int64_t> {
    const auto pb = static_cast<size_t>(p.page_bytes);
    const int g = memory::WeightPageTable::PagesFor(static_cast<int>(2 * c.moe_intermediate_size),
                                                    static_cast<int>(c.hidden_size), bits, pb);
    const int d = memory::WeightPageTable::PagesFor(static_cast<int>(c.hidden_size),
                                                    static_cast<int>(c.moe_intermediate_size), bits, pb);
    if (g < 0 || d < 0) {
      return Unsupported("the KV page (" + std::to_string(p.page_bytes) + " bytes) is smaller than one row of an "
                         "expert's bit-plane: serve this model with --bits 16");
    }
    return static_cast<int64_t>(g + d) * moe_layers * c.num_experts * p.page_bytes;
  };
  // The prefill worker's int8 LUTs when it reads the store at `bits` (whole MiB, as the pool):
  // out of the budget beside the pool, so a width must fit with them.
  auto prefill_luts_at = [&](int bits) -> int64_t {
    if (bf16 || bits > prefill_max_bits) return 0;
    return (PrefillLutBytes(c, bits) + (1 << 20) - 1) >> 20 << 20;
  };
  auto luts_text = [&](int bits) {
    const int64_t l = prefill_luts_at(bits);
    return l > 0 ? " and the prefill worker's LUTs at " + std::to_string(bits) + " bits (" + FormatBytes(l) + ")"
                 : std::string();
  };
  int64_t experts_min = 0;
  if (!bf16) {
    PW_ASSIGN_OR_RETURN(experts_min, experts_at(3));
  }
  p.smallest = experts_min + prefill_luts_at(3) + min_kv;
  const int64_t fixed = budget - p.pool;
  auto refuse = [&](const std::string& what, int64_t need_pool) {
    return ResourceExhausted(
        "--memory " + budget_text + " (" + FormatBytes(budget) + ") is too small: " + what + " needs a decode pool of " +
        FormatBytes(need_pool) + ", and " + FormatBytes(std::max<int64_t>(p.pool, 0)) + " is left after the checkpoint (" +
        FormatBytes(p.checkpoint) + "), the store (" + FormatBytes(p.store) + ")" +
        (p.dense_copies > 0 ? ", the workers' dense copies (" + FormatBytes(p.dense_copies) + ")" : std::string()) +
        (p.expert_copy > 0 ? ", the decode worker's packed experts (" + FormatBytes(p.expert_copy) + ")"
                           : std::string()) +
        ", the prefill KV (" +
        FormatBytes(p.prefill_kv) + ") and the processes (" + FormatBytes(p.processes) + "); give --memory " +
        std::to_string(((fixed + need_pool) >> 20) + 2) + "M or more");
  };
  if (p.pool < p.smallest) {
    return refuse(bf16 ? "the KV of one " + std::to_string(min_tokens) + "-token request"
                       : "the smallest plan (every expert at 3 bits, " + FormatBytes(experts_min) + luts_text(3) +
                             ", plus the KV of one " + std::to_string(min_tokens) + "-token request)",
                  p.smallest);
  }
  if (bf16) {
    p.bits = 16;
  } else if (bits_text == "auto") {
    p.bits = 3;
    for (int b = std::min(8, auto_max_bits); b > 3; --b) {
      PW_ASSIGN_OR_RETURN(int64_t e, experts_at(b));
      if (e + prefill_luts_at(b) + min_kv <= p.pool) {
        p.bits = b;
        break;
      }
    }
  } else {
    p.bits = std::stoi(bits_text);
    PW_ASSIGN_OR_RETURN(int64_t e, experts_at(p.bits));
    const int64_t luts = prefill_luts_at(p.bits);
    if (e + luts + min_kv > p.pool) {
      return refuse("every expert at " + bits_text + " bits (" + FormatBytes(e) + ")" + luts_text(p.bits) +
                        " plus the KV of one " + std::to_string(min_tokens) + "-token request",
                    e + luts + min_kv);
    }
  }
  if (!bf16) {
    PW_ASSIGN_OR_RETURN(p.experts, experts_at(p.bits));
  }
  p.prefill_luts = prefill_luts_at(p.bits);
  if (p.prefill_luts > 0) {
    p.prefill_bits = p.bits;
    p.pool -= p.prefill_luts;
  }
  int64_t experts_max = 0;
  if (!bf16) {
    PW_ASSIGN_OR_RETURN(experts_max, experts_at(8));
  }
  const int64_t kv_max = kMaxSequences * ((context + kKvBlockSize - 1) / kKvBlockSize) * block_bytes;
  const int64_t cap = (experts_max + kv_max + (1 << 20) - 1) >> 20 << 20;
  if (p.pool > cap) p.pool = cap;
  p.kv_tokens = (p.pool - p.experts) / block_bytes * kKvBlockSize;
  return p;
}

}  // namespace pw::serve

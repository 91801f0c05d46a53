// How `pw serve` divides a memory budget between the node's processes, and the experts' width
// it can afford. The budget is --memory, or with "auto" kAutoShare of MemAvailable
// (/proc/meminfo) at start. It must hold:
//
//   checkpoint   every safetensors file (the workers map them; the page cache holds one copy)
//   store        the .apw store (the broker maps it; 0 with bits 16)
//   dense copies with --dense int8 or ap3..ap8 (or an --lm-head format), the copies of the dense
//                matrices each of the two workers makes (DenseCopyBytes each); 0 with bf16
//   prefill KV   kPrefillKvBlocks blocks of the prefill worker
//   prefill LUTs when the prefill worker reads the store (the width is at most
//                prefill_max_bits): its int8 LUT of every expert block at that width
//                (PrefillLutBytes); the bit-planes it reads are the store's mapping
//   processes    kProcessBytes for each of the four processes' own memory
//   decode pool  the rest: one page pool for KV and the experts' bit-planes (DESIGN.md 4), at
//                most every expert at 8 bits plus the KV of kMaxSequences requests of the full
//                context (the decode worker's max_batch, written into the node file): the pool
//                is allocated and zeroed at start, so a budget beyond what the model can use
//                is not taken
//
// The smallest plan is every expert block at 3 bits (the lowest width) plus the KV of one
// request of min(context, kMinKvTokens) tokens: a budget whose decode pool is below it is
// refused, naming the figures. bits "auto" picks the widest width (8 down to 3) whose experts
// and that KV fit in the pool; a given width must fit likewise. Bits 16 keeps the checkpoint's
// bf16 experts (no store, no broker): the pool holds KV only.
#pragma once

#include <cstdint>
#include <string>

#include "common/formats/model_config.h"
#include "common/status.h"

namespace pw::serve {

inline constexpr double kAutoShare = 0.5;             // of MemAvailable, for "auto"
inline constexpr int64_t kProcessBytes = 64ll << 20;  // per process (router, broker, 2 workers)
inline constexpr int64_t kPrefillKvBlocks = 512;
inline constexpr int64_t kMinKvTokens = 2048;
inline constexpr int64_t kMaxSequences = 64;  // decode max_batch (written into the node file)
inline constexpr int kKvBlockSize = 16;  // tokens per KV block (written into the node file)
inline constexpr int kKvBytesPerElement = 2;  // bf16 KV (written into the node file)

// "auto" -> kAutoShare of MemAvailable; "8G", "512M", "1073741824" (K, M, G, T: powers of
// 1024, an optional "i", "B" after). kInvalidArgument naming the text otherwise.
Result<int64_t> ParseMemory(const std::string& text);
// MemAvailable from /proc/meminfo, in bytes.
Result<int64_t> MemAvailableBytes();

struct MemoryPlan {
  int64_t budget = 0;
  int64_t checkpoint = 0, store = 0, dense_copies = 0, prefill_kv = 0, prefill_luts = 0, processes = 0;
  int64_t expert_copy = 0;  // the decode worker's packed copy of the checkpoint's bf16 experts
  int64_t pool = 0;       // decode pool bytes (budget minus the above)
  int64_t page_bytes = 0;  // the workers' default KV page: MinPageBytes of the model's KV specs
  int64_t block_bytes = 0;  // one KV block: every layer's pages (BlockPageOffsets)
  int64_t smallest = 0;   // the smallest plan's pool bytes
  int bits = 8;           // the experts' width (16: bf16 from the checkpoint)
  int prefill_bits = 16;  // the prefill worker's: `bits` from the store, or 16 (the checkpoint's)
  int64_t experts = 0;    // pool bytes of every expert at `bits` (0 with 16)
  int64_t kv_tokens = 0;  // tokens of KV the rest of the pool holds
  std::string Summary() const;  // one line for the log
};

// `bits_text` is "auto", "3".."8" or "16" ("auto" picks at most `auto_max_bits`);
// `dense_copy_bytes`: one worker's copies of the dense matrices (DenseCopyBytes), 0 with bf16.
// `prefill_max_bits`: the widest width the prefill worker reads from the store (a node at a
// wider width, or 0, prefills from the checkpoint's bf16 experts). `expert_copy_bytes`: the
// decode worker's packed copy of the bf16 experts at bits 16 (PackedExpertBytes; 0: none).
// kResourceExhausted when the pool cannot hold the smallest plan (or the given width), with the
// figures and the --memory that would do.
Result<MemoryPlan> PlanMemory(const ModelConfig& config, int64_t checkpoint_bytes, int64_t budget,
                              const std::string& bits_text, const std::string& budget_text,
                              int64_t dense_copy_bytes = 0, int auto_max_bits = 8, int prefill_max_bits = 0,
                              int64_t expert_copy_bytes = 0);

// Bytes of every routed expert of `config` packed (kernels/cpu/packed_bf16.h, no exceptions
// counted): the decode worker's copy with bf16 experts packed.
int64_t PackedExpertBytes(const ModelConfig& config);

// Bytes of the int8 LUTs a worker running every expert block of `config` at `bits` from the
// store makes (engine/experts/apw_expert_provider.h): 2^bits values and one float scale per row.
int64_t PrefillLutBytes(const ModelConfig& config, int bits);

// Bytes of the .apw store of `config` (every expert block, page-aligned, plus its header).
int64_t StoreBytes(const ModelConfig& config);

// "1.5 GiB", "640.0 MiB".
std::string FormatBytes(int64_t bytes);

}  // namespace pw::serve

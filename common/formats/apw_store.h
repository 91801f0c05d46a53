// The any-precision expert store (.apw): every expert linear block of a model (its MoE layers';
// a dense layer has none, blocks keep the model's layer numbers) as 8 bit-planes
// of its 8-bit parent codes, one fp16 LUT per width 3..8, its damage table and calibration
// count. Written once by pw-quantize (ApwWriter, atomic), memory-mapped by readers (ApwStore),
// which validate every byte they will use. The byte layout is documented in docs/formats.md.
//
// A plane is row-major with PlaneRowBytes(cols) bytes per row (common/plane_layout.h), so
// any tile of consecutive rows of one plane is one contiguous run of the file: pages of the
// paged pool are copied (or mapped) from the store without repacking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/expert_block.h"
#include "common/hash.h"
#include "common/plane_layout.h"
#include "common/status.h"

namespace pw::apw {

// Version 2 adds the list of layers holding blocks (a model's dense layers have none). A
// store with every layer present is written as version 1, byte for byte what earlier builds
// wrote and read; this build reads both.
inline constexpr uint32_t kFormatVersion = 2;
inline constexpr uint32_t kFullStoreVersion = 1;
inline constexpr int kPlanes = anyprec::kNumPlanes;  // the plane layout: common/plane_layout.h
inline constexpr int kMinBits = anyprec::kMinBits;
inline constexpr int kMaxBits = anyprec::kMaxBits;
inline constexpr size_t kDataAlign = 4096;  // block data offsets (page-aligned for mmap)
inline constexpr size_t kPartAlign = 64;    // planes and LUTs inside a block

// A block is an expert's gate_up or down (common/expert_block.h); stored as a uint32.
using BlockKind = pw::ExpertProj;
const char* BlockKindName(BlockKind kind);

// CRC-32 of the store sections: common/hash.h.
using pw::Crc32;

// The model hash is FNV-1a (common/hash.h) over config.json's bytes followed by every expert
// weight tensor's raw bytes in (layer, expert, gate, up, down) order.
using pw::Fnv1a64;

// Model-level facts the store is made for.
// Blocks are numbered in the model's layer space (ExpertBlockIndex over num_layers): a dense
// layer (no routed experts) is a layer of the model with no blocks, so logs, plan files and
// width maps name the checkpoint's layer numbers.
struct StoreInfo {
  uint32_t num_layers = 0;   // the model's layers (dense ones included)
  uint32_t num_experts = 0;  // routed experts per MoE layer
  uint32_t hidden = 0;       // H: gate_up cols, down rows
  uint32_t ffn = 0;          // I: gate_up rows = 2I (gate rows then up rows), down cols
  uint64_t model_hash = 0;
  // The layers holding blocks (each with all its experts' blocks), ascending. Empty in a
  // writer's StoreInfo means every layer; a reader always fills it.
  std::vector<uint32_t> layers = {};

  // Whether `layer` holds blocks.
  bool HasLayer(uint32_t layer) const;
  // The layers holding blocks (every layer when `layers` is empty).
  std::vector<uint32_t> BlockLayers() const;
};

// "[1, 2, 5]" for messages.
std::string LayerListString(const std::vector<uint32_t>& layers);

// OK when the store's block layers are exactly `moe_layers` (the model's MoE layers); otherwise
// an error naming both lists.
Status CheckStoreLayers(const StoreInfo& info, const std::vector<uint32_t>& moe_layers, const std::string& where);

// One block. In a writer call the pointers are the caller's; from a reader they point into the
// mapped file (valid while the ApwStore lives).
struct BlockData {
  uint32_t layer = 0;
  uint32_t expert = 0;
  BlockKind kind = BlockKind::kGateUp;
  uint32_t rows = 0;
  uint32_t cols = 0;
  // planes[p]: rows * PlaneRowBytes(cols) bytes, plane 0 = most significant bit.
  const uint8_t* planes[kPlanes] = {};
  // luts[b] for b in 3..8: [rows][2^b] fp16 centroids; entries 0..2 unused (null).
  const uint16_t* luts[kMaxBits + 1] = {};
  // damage[b] for b in {0, 3..8}: sensitivity-weighted squared error of running the block at
  // width b (0 = dropped), sum over rows and columns of H_jj (w - w_b)^2. Other entries unused.
  double damage[kMaxBits + 1] = {};
  uint64_t calib_tokens = 0;  // calibration tokens routed to this block's expert
};

// Streams blocks to `path`.tmp, then Finish() writes the table and header, fsyncs and renames
// to `path`. A writer destroyed before Finish() removes its temporary file, unless it was
// created to be resumed (keep_unfinished, or by Resume): a resumable build (pw-quantize
// --resume-dir) writes the store once, records a Flush() after each layer, and a later process
// continues the same .tmp with Resume().
class ApwWriter {
 public:
  static Result<std::unique_ptr<ApwWriter>> Create(const std::string& path, const StoreInfo& info,
                                                   bool keep_unfinished = false);
  ~ApwWriter();
  ApwWriter(const ApwWriter&) = delete;
  ApwWriter& operator=(const ApwWriter&) = delete;

  // Appends one block (shapes checked against the StoreInfo; each (layer, expert, kind) once).
  Status Add(const BlockData& block);
  // Requires every (layer, expert, kind) of the store's layers to have been added.
  Status Finish();

  // The blocks written so far: the bytes of the .tmp in use and their table entries (the
  // store's own 128-byte entries, each with its data checksum), in the order written.
  struct Progress {
    uint64_t end = 0;
    std::vector<uint8_t> table;
  };
  // Makes the blocks written so far durable (fdatasync) and returns them.
  Result<Progress> Flush();
  // Continues `path`.tmp, left by a writer of the same StoreInfo whose Flush() gave `progress`:
  // every entry is checked as a reader checks it (in the order written, regions back to back)
  // and every block's data against its checksum; bytes past progress.end (a block being
  // written when the build stopped) are cut off. Errors name the file and the block.
  static Result<std::unique_ptr<ApwWriter>> Resume(const std::string& path, const StoreInfo& info,
                                                   const Progress& progress);
  // Whether every block of `layer` has been added.
  bool LayerComplete(uint32_t layer) const;

 private:
  ApwWriter(std::string path, const StoreInfo& info, int fd);
  static Result<StoreInfo> CheckedInfo(const std::string& path, const StoreInfo& given);
  Status Write(const void* data, size_t n, uint64_t offset);

  std::string path_;
  std::string tmp_path_;
  StoreInfo info_;
  int fd_ = -1;
  uint64_t end_ = 0;
  bool finished_ = false;
  bool keep_unfinished_ = false;
  std::vector<uint8_t> table_;  // serialized block entries
  std::vector<uint8_t> seen_;   // [layer][expert][kind]
};

class ApwStore {
 public:
  struct Options {
    bool verify_data = true;                     // check every block's data checksum on open
    std::optional<uint64_t> expected_model_hash;  // refuse a store made for another model
  };
  // Maps and validates the store; errors name the file and the block (layer, expert, kind).
  static Result<std::unique_ptr<ApwStore>> Open(const std::string& path, const Options& options);
  static Result<std::unique_ptr<ApwStore>> Open(const std::string& path) {
    return Open(path, Options{});
  }
  ~ApwStore();
  ApwStore(const ApwStore&) = delete;
  ApwStore& operator=(const ApwStore&) = delete;

  const StoreInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  const BlockData& block(int i) const { return blocks_[i]; }
  // The block of (layer, expert, kind), or null when out of range.
  const BlockData* Find(uint32_t layer, uint32_t expert, BlockKind kind) const;
  // Recomputes block i's data checksum.
  Status VerifyBlock(int i) const;
  // "block 12 (layer 1, expert 4, down)" for messages.
  std::string BlockName(int i) const;
  // The whole mapped file (what a server registers for peers to read planes and LUTs from).
  const uint8_t* map_data() const { return map_; }
  size_t map_bytes() const { return map_bytes_; }

 private:
  ApwStore() = default;

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  StoreInfo info_;
  std::vector<BlockData> blocks_;
  std::vector<uint32_t> data_crc_;
  std::vector<uint64_t> data_offset_;
  std::vector<uint64_t> data_bytes_;
  std::vector<int32_t> index_;  // [layer][expert][kind] -> block
};

// Bytes of one block's data region (planes then LUTs, each part kPartAlign-aligned).
uint64_t BlockDataBytes(uint32_t rows, uint32_t cols);

// Each block's routing share in the calibration, indexed like ApwStore::block:
//   share_i = (calib_tokens_i + 1) / (calib tokens of its layer's blocks of its kind + E) * E,
// 1 = an average expert of the layer (add-one smoothed, so an expert never routed keeps a
// small share). damage[b] is an error per routed token; share_i * damage[b] is the block's
// expected damage per token of the calibration's traffic.
std::vector<double> CalibrationShares(const ApwStore& store);

}  // namespace pw::apw

// How the engine holds the dense matrices a step reads once per token (attention projections,
// lm_head, dense and shared-expert MLPs): as the checkpoint's bf16, as int8 copies with one
// scale per row (kernels/anyprec/q8.h's Q8Matrix, llama.cpp's q8_0), or as any-precision codes
// at one width of 3..8 bits (kernels/anyprec/dense_ap.h; llama.cpp's Q4_K_M holds its output
// matrix at Q6_K and attention at Q4_K/Q6_K). The lm_head may be given its own format.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pw {

enum class DenseFormat {
  kBf16,
  kBf16Packed,  // the same bf16 values, packed losslessly in ~12 bits (kernels/cpu/packed_bf16.h)
  kInt8,
  kAp3,
  kAp4,
  kAp5,
  kAp6,
  kAp7,
  kAp8,
  kAsDense,  // the lm_head's default: whatever the other dense matrices use
};

// DenseApBits: the any-precision width of `f` (3..8), or 0 for bf16, int8 and kAsDense.
// DenseFormatName: "bf16", "bf16-packed", "int8", "ap3".."ap8", "dense".
// DenseFormatChoices / LmHeadFormatChoices: the choices of the `dense` option (bf16,
// bf16-packed, int8, ap3..ap8) and of `lm_head` (those and "dense"). In common/ and header-only: `pw serve`'s
// options and memory plan name the formats without linking the engine.
// The lm_head's format given the others' (`dense`) and its own (kAsDense: the same).
inline DenseFormat LmHeadFormat(DenseFormat dense, DenseFormat lm_head) {
  return lm_head == DenseFormat::kAsDense ? dense : lm_head;
}

inline int DenseApBits(DenseFormat f) {
  switch (f) {
    case DenseFormat::kAp3: return 3;
    case DenseFormat::kAp4: return 4;
    case DenseFormat::kAp5: return 5;
    case DenseFormat::kAp6: return 6;
    case DenseFormat::kAp7: return 7;
    case DenseFormat::kAp8: return 8;
    default: return 0;
  }
}

inline const char* DenseFormatName(DenseFormat f) {
  switch (f) {
    case DenseFormat::kBf16: return "bf16";
    case DenseFormat::kBf16Packed: return "bf16-packed";
    case DenseFormat::kInt8: return "int8";
    case DenseFormat::kAp3: return "ap3";
    case DenseFormat::kAp4: return "ap4";
    case DenseFormat::kAp5: return "ap5";
    case DenseFormat::kAp6: return "ap6";
    case DenseFormat::kAp7: return "ap7";
    case DenseFormat::kAp8: return "ap8";
    case DenseFormat::kAsDense: return "dense";
  }
  return "?";
}

inline std::vector<std::pair<std::string, DenseFormat>> DenseFormatChoices() {
  std::vector<std::pair<std::string, DenseFormat>> c;
  for (DenseFormat f : {DenseFormat::kBf16, DenseFormat::kBf16Packed, DenseFormat::kInt8, DenseFormat::kAp3, DenseFormat::kAp4,
                        DenseFormat::kAp5, DenseFormat::kAp6, DenseFormat::kAp7, DenseFormat::kAp8}) {
    c.emplace_back(DenseFormatName(f), f);
  }
  return c;
}

inline std::vector<std::pair<std::string, DenseFormat>> LmHeadFormatChoices() {
  std::vector<std::pair<std::string, DenseFormat>> c = DenseFormatChoices();
  c.emplace_back(DenseFormatName(DenseFormat::kAsDense), DenseFormat::kAsDense);
  return c;
}

}  // namespace pw

#include "common/formats/stacked_experts.h"

#include <cmath>
#include <cstring>

#include "common/dtype.h"

namespace pw {
namespace {

// One element of a float tensor as fp32.
float ElementF32(const TensorView& t, size_t i) {
  uint16_t h;
  switch (t.dtype) {
    case DType::kBF16:
      std::memcpy(&h, t.data + 2 * i, 2);
      return Bf16ToF32(h);
    case DType::kF16:
      std::memcpy(&h, t.data + 2 * i, 2);
      return F16ToF32(h);
    default: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
  }
}

// One element as bf16 bits: BF16 as stored, F16 and F32 rounded (as bf16_tensor.h).
uint16_t ElementBf16(const TensorView& t, size_t i) {
  if (t.dtype == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);
    return h;
  }
  return F32ToBf16(ElementF32(t, i));
}

Result<TensorView> FloatTensor(const Checkpoint& ckpt, const std::string& name,
                               const std::vector<int64_t>& shape) {
  PW_ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name));
  if (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32) {
    return InvalidArgument("tensor " + name + " has dtype " + std::string(DTypeName(t.dtype)) +
                           ", expected BF16, F16 or F32");
  }
  if (t.shape != shape) {
    return InvalidArgument("tensor " + name + " has shape " + ShapeToString(t.shape) +
                           ", expected " + ShapeToString(shape));
  }
  return t;
}

// The [rows, cols] MXFP4 matrix of `expert` from B{name}_blocks and B{name}_scales, as bf16.
Status ReadMxfp4(const Checkpoint& ckpt, const std::string& prefix, int64_t experts,
                 int64_t expert, int64_t rows, int64_t cols, std::vector<uint16_t>* out) {
  const std::string bn = prefix + "_blocks", sn = prefix + "_scales";
  if (cols % 32 != 0) {
    return InvalidArgument("tensor " + bn + ": " + std::to_string(cols) +
                           " columns are not a whole number of 32-value MXFP4 blocks");
  }
  const int64_t g = cols / 32;
  PW_ASSIGN_OR_RETURN(TensorView b, ckpt.Get(bn));
  PW_ASSIGN_OR_RETURN(TensorView s, ckpt.Get(sn));
  const std::vector<int64_t> bshape{experts, rows, g, 16}, sshape{experts, rows, g};
  if (b.dtype != DType::kU8 || b.shape != bshape) {
    return InvalidArgument("tensor " + bn + " is " + std::string(DTypeName(b.dtype)) + " " +
                           ShapeToString(b.shape) + ", expected U8 " + ShapeToString(bshape));
  }
  if (s.dtype != DType::kU8 || s.shape != sshape) {
    return InvalidArgument("tensor " + sn + " (MXFP4 scales) is " +
                           std::string(DTypeName(s.dtype)) + " " + ShapeToString(s.shape) +
                           ", expected U8 " + ShapeToString(sshape) + ": one per 32 values of " +
                           bn);
  }
  const size_t n = static_cast<size_t>(rows * g);
  out->resize(static_cast<size_t>(rows * cols));
  DequantizeMxfp4(b.data + static_cast<size_t>(expert) * n * 16,
                  s.data + static_cast<size_t>(expert) * n, n, out->data());
  return Status::Ok();
}

}  // namespace

void DequantizeMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t n, uint16_t* out) {
  // Every (scale, code) pair's bf16 value, computed once: a lookup per value at load.
  static const std::vector<uint16_t> table = [] {
    static constexpr float kE2M1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                        -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
    std::vector<uint16_t> t(256 * 16);
    for (int s = 0; s < 256; ++s) {
      for (int c = 0; c < 16; ++c) t[s * 16 + c] = F32ToBf16(std::ldexp(kE2M1[c], s - 127));
    }
    return t;
  }();
  for (size_t b = 0; b < n; ++b) {
    const uint16_t* v = table.data() + static_cast<size_t>(scales[b]) * 16;
    for (size_t j = 0; j < 16; ++j) {
      const uint8_t byte = blocks[b * 16 + j];
      out[b * 32 + 2 * j] = v[byte & 0xF];
      out[b * 32 + 2 * j + 1] = v[byte >> 4];
    }
  }
}

bool StackedLayoutOf(ModelType type, StackedLayout* layout) {
  if (type == ModelType::kGptOss) {
    *layout = StackedLayout::kGptOss;
    return true;
  }
  if (type == ModelType::kGemma4) {
    *layout = StackedLayout::kGemma4;
    return true;
  }
  return false;
}

bool HasMxfp4Experts(const Checkpoint& ckpt, const std::string& block) {
  return ckpt.Has(block + "experts.gate_up_proj_blocks");
}

Status ReadStackedExpert(const Checkpoint& ckpt, const std::string& block,
                         const StackedExpertShape& shape, int64_t expert,
                         std::vector<uint16_t>* gate, std::vector<uint16_t>* up,
                         std::vector<uint16_t>* down) {
  const int64_t E = shape.experts, H = shape.hidden, I = shape.ffn;
  const size_t h = static_cast<size_t>(H), f = static_cast<size_t>(I);
  gate->resize(f * h);
  up->resize(f * h);
  if (shape.layout == StackedLayout::kGemma4) {
    PW_ASSIGN_OR_RETURN(TensorView gu,
                        FloatTensor(ckpt, block + "experts.gate_up_proj", {E, 2 * I, H}));
    PW_ASSIGN_OR_RETURN(TensorView dn, FloatTensor(ckpt, block + "experts.down_proj", {E, H, I}));
    const size_t gu0 = static_cast<size_t>(expert) * 2 * f * h;
    for (size_t j = 0; j < f * h; ++j) {
      (*gate)[j] = ElementBf16(gu, gu0 + j);
      (*up)[j] = ElementBf16(gu, gu0 + f * h + j);
    }
    down->resize(h * f);
    const size_t dn0 = static_cast<size_t>(expert) * h * f;
    for (size_t j = 0; j < h * f; ++j) (*down)[j] = ElementBf16(dn, dn0 + j);
    return Status::Ok();
  }
  if (HasMxfp4Experts(ckpt, block)) {
    std::vector<uint16_t> gu;
    PW_RETURN_IF_ERROR(ReadMxfp4(ckpt, block + "experts.gate_up_proj", E, expert, 2 * I, H, &gu));
    for (size_t i = 0; i < f; ++i) {
      std::memcpy(gate->data() + i * h, gu.data() + 2 * i * h, h * 2);
      std::memcpy(up->data() + i * h, gu.data() + (2 * i + 1) * h, h * 2);
    }
    return ReadMxfp4(ckpt, block + "experts.down_proj", E, expert, H, I, down);
  }
  PW_ASSIGN_OR_RETURN(TensorView gu, FloatTensor(ckpt, block + "experts.gate_up_proj", {E, H, 2 * I}));
  PW_ASSIGN_OR_RETURN(TensorView dn, FloatTensor(ckpt, block + "experts.down_proj", {E, I, H}));
  // x @ W layouts, transposed to [out, in] rows.
  const size_t gu0 = static_cast<size_t>(expert) * h * 2 * f;
  for (size_t c = 0; c < h; ++c) {
    for (size_t i = 0; i < f; ++i) {
      (*gate)[i * h + c] = ElementBf16(gu, gu0 + c * 2 * f + 2 * i);
      (*up)[i * h + c] = ElementBf16(gu, gu0 + c * 2 * f + 2 * i + 1);
    }
  }
  down->resize(h * f);
  const size_t dn0 = static_cast<size_t>(expert) * f * h;
  for (size_t i = 0; i < f; ++i) {
    for (size_t c = 0; c < h; ++c) (*down)[c * f + i] = ElementBf16(dn, dn0 + i * h + c);
  }
  return Status::Ok();
}

Status ReadStackedExpertBiases(const Checkpoint& ckpt, const std::string& block,
                               const StackedExpertShape& shape, int64_t expert,
                               std::vector<float>* gate, std::vector<float>* up,
                               std::vector<float>* down) {
  const int64_t E = shape.experts, H = shape.hidden, I = shape.ffn;
  const size_t f = static_cast<size_t>(I), h = static_cast<size_t>(H);
  PW_ASSIGN_OR_RETURN(TensorView gu, FloatTensor(ckpt, block + "experts.gate_up_proj_bias", {E, 2 * I}));
  PW_ASSIGN_OR_RETURN(TensorView dn, FloatTensor(ckpt, block + "experts.down_proj_bias", {E, H}));
  gate->resize(f);
  up->resize(f);
  down->resize(h);
  for (size_t i = 0; i < f; ++i) {
    (*gate)[i] = ElementF32(gu, static_cast<size_t>(expert) * 2 * f + 2 * i);
    (*up)[i] = ElementF32(gu, static_cast<size_t>(expert) * 2 * f + 2 * i + 1);
  }
  for (size_t c = 0; c < h; ++c) (*down)[c] = ElementF32(dn, static_cast<size_t>(expert) * h + c);
  return Status::Ok();
}

}  // namespace pw

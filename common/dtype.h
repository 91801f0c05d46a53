// Element types of tensors and the 16-bit float conversions every component shares.
//
// DType names the element type of a tensor in a checkpoint or in memory. Conversions:
//   Bf16ToF32 / F32ToBf16  bfloat16 (1 sign, 8 exponent, 7 mantissa bits) <-> float
//   F16ToF32  / F32ToF16   IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits) <-> float
// Narrowing conversions round to nearest, ties to even, and keep NaN a NaN (quiet) and the
// sign of zero and infinity. All functions are header-only, branch-light and allocation-free,
// so kernels may call them in inner loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

namespace pw {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities
};

// Bytes per element.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

// The dtype string safetensors uses in its JSON header ("F32", "BF16", ...).
constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

// Inverse of DTypeName; nullopt for names PagedWeight does not handle (e.g. "F8_E5M2").
constexpr std::optional<DType> DTypeFromName(std::string_view name) {
  constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                            DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                            DType::kU8,  DType::kBool, DType::kF8E4M3};
  for (DType t : kAll) {
    if (DTypeName(t) == name) return t;
  }
  return std::nullopt;
}

// float8_e4m3fn (torch.float8_e4m3fn, DeepSeek-V3's FP8 weights) -> float, exact: exponent
// bias 7, subnormals below exponent 1, 0x7f / 0xff NaN, no infinities.
inline float F8E4M3ToF32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80) << 24;
  const uint32_t exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
  } else {
    uint32_t bits = ((exp + 120u) << 23) | (man << 20);  // rebias 7 -> 127
    std::memcpy(&mag, &bits, sizeof mag);
  }
  uint32_t out;
  std::memcpy(&out, &mag, sizeof out);
  out |= sign;
  float f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 bits -> float. Exact (every bf16 value is a float).
inline float Bf16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }

// float -> bfloat16 bits, round to nearest even. NaN stays NaN (quiet bit set), +-inf stays inf,
// values that round past the largest finite bf16 become inf.
inline uint16_t F32ToBf16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload bits, force quiet
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// IEEE half bits -> float. Exact (subnormal halves become normal floats).
inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf or NaN
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24; normalise
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  return F32FromBits(bits);
}

// float -> IEEE half bits, round to nearest even, including into the subnormal range.
// Overflow becomes +-inf; NaN stays NaN (quiet).
inline uint16_t F32ToF16(float f) {
  uint32_t u = F32Bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x47800000u) {  // >= 65536 (or inf): overflows half; 65520 rounds to inf below too
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {  // normal half range: >= 2^-14
    uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xfffu + mant_odd;  // round to nearest even on the 13 dropped bits
    abs -= 0x38000000u;        // rebias exponent 127 -> 15 (112 << 23)
    return static_cast<uint16_t>(sign | (abs >> 13));  // carry into exponent may give inf: right
  }
  if (abs < 0x33000000u) {  // < 2^-25: rounds to zero (2^-25 itself is a tie to even zero)
    return sign;
  }
  // Subnormal half: value = m * 2^-24, m in [1, 1023]. Shift the full significand.
  uint32_t exp = abs >> 23;                       // 102..112
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand
  uint32_t shift = 126u - exp;                    // 14..24
  uint32_t half_mant = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
  return static_cast<uint16_t>(sign | half_mant);
}

}  // namespace pw

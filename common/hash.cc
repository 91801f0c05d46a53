#include "common/hash.h"

#include <nmmintrin.h>
#include <wmmintrin.h>

#include <array>
#include <cstring>

namespace pw {
namespace {

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

// Slicing-by-8 tables of a reflected polynomial: t[0] the bytewise table, t[s] a byte followed
// by s zero bytes.
CrcTables MakeCrcTables(uint32_t poly) {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? poly ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The CRC register (not inverted) after `n` more bytes, eight at a time.
uint32_t SliceBy8(const CrcTables& t, const uint8_t* p, size_t n, uint32_t crc) {
  while (n >= 8) {
    const uint32_t lo = Load32(p) ^ crc;
    const uint32_t hi = Load32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

constexpr uint32_t kCrc32Poly = 0xEDB88320u;   // IEEE 802.3, reflected
constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, reflected

// Polynomials over GF(2) modulo the CRC-32C polynomial, in the CRC's reflected bit order (bit
// 31 is x^0). The register is linear in the data, so the register after A||B equals the
// register after A multiplied by x^(8|B|), plus B's register from zero: that joins CRCs
// computed apart.
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) product ^= b;       // a's term x^i times b
    b = (b & 1) ? (b >> 1) ^ kCrc32cPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(8n) mod P: the factor that moves a register past n zero bytes.
uint32_t XPow8n(uint64_t n) {
  uint32_t result = 0x80000000u;  // x^0
  uint32_t square = 0x00800000u;  // x^8
  for (; n != 0; n >>= 1) {
    if (n & 1) result = MulModP(square, result);
    square = MulModP(square, square);
  }
  return result;
}

// The hardware path's lanes: three streams of kLane bytes each, so that the crc32
// instruction's 3-cycle latency is hidden behind its throughput of one a cycle.
constexpr size_t kLane = 16384;
struct LaneShifts {
  uint32_t one = XPow8n(kLane), two = XPow8n(2 * kLane);
};

const CrcTables& Crc32Tables() {
  static const CrcTables t = MakeCrcTables(kCrc32Poly);
  return t;
}

}  // namespace

namespace {

// A 16-byte block folded forward by the distance of the constants `k` (Crc32Clmul).
__attribute__((target("pclmul,sse4.1"))) inline __m128i Fold(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}
__attribute__((target("pclmul,sse4.1"))) inline __m128i Load128(const uint8_t* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

}  // namespace

uint32_t Crc32Scalar(const void* data, size_t n, uint32_t crc) {
  return ~SliceBy8(Crc32Tables(), static_cast<const uint8_t*>(data), n, ~crc);
}

// The register is the remainder of the message polynomial, so 16 message bytes X followed by D
// more bits leave what X * x^D mod P leaves: a block is folded forward over the next block(s) by
// two carry-less products, its low 64 bits (the earlier ones, the CRC being reflected) times
// (x^(D+32) mod P) and its high 64 bits times (x^(D-32) mod P), both bit-reflected and shifted
// left by one, as PCLMULQDQ wants them. D = 512 folds four blocks at a time (four independent
// chains), D = 128 one. The last block's register comes from the tables, from zero: the
// initial register was xored into the first block.
__attribute__((target("pclmul,sse4.1"))) uint32_t Crc32Clmul(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  if (n >= 64) {
    const __m128i fold4 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^480, x^544 mod P
    const __m128i fold1 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^96, x^160 mod P
    __m128i x0 = _mm_xor_si128(Load128(p), _mm_cvtsi32_si128(static_cast<int>(c)));
    __m128i x1 = Load128(p + 16), x2 = Load128(p + 32), x3 = Load128(p + 48);
    p += 64;
    n -= 64;
    for (; n >= 64; p += 64, n -= 64) {
      x0 = _mm_xor_si128(Fold(x0, fold4), Load128(p));
      x1 = _mm_xor_si128(Fold(x1, fold4), Load128(p + 16));
      x2 = _mm_xor_si128(Fold(x2, fold4), Load128(p + 32));
      x3 = _mm_xor_si128(Fold(x3, fold4), Load128(p + 48));
    }
    __m128i x = _mm_xor_si128(Fold(x0, fold1), x1);
    x = _mm_xor_si128(Fold(x, fold1), x2);
    x = _mm_xor_si128(Fold(x, fold1), x3);
    for (; n >= 16; p += 16, n -= 16) x = _mm_xor_si128(Fold(x, fold1), Load128(p));
    alignas(16) uint8_t last[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(last), x);
    c = SliceBy8(Crc32Tables(), last, 16, 0);
  }
  return ~SliceBy8(Crc32Tables(), p, n, c);
}

bool Crc32ClmulAvailable() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") != 0 && __builtin_cpu_supports("sse4.1") != 0;
  }();
  return available;
}

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  static const auto fn = Crc32ClmulAvailable() ? &Crc32Clmul : &Crc32Scalar;
  return fn(data, n, crc);
}

uint32_t Crc32cScalar(const void* data, size_t n, uint32_t crc) {
  static const CrcTables t = MakeCrcTables(kCrc32cPoly);
  return ~SliceBy8(t, static_cast<const uint8_t*>(data), n, ~crc);
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const void* data, size_t n,
                                                          uint32_t crc) {
  static const LaneShifts shifts;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n >= 3 * kLane) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + kLane;
    for (; p < end; p += 8) {
      c = _mm_crc32_u64(c, Load64(p));
      c1 = _mm_crc32_u64(c1, Load64(p + kLane));
      c2 = _mm_crc32_u64(c2, Load64(p + 2 * kLane));
    }
    c = MulModP(shifts.two, static_cast<uint32_t>(c)) ^
        MulModP(shifts.one, static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
    p += 2 * kLane;
    n -= 3 * kLane;
  }
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, Load64(p));
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool Crc32cHardwareAvailable() {
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return available;
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  static const auto fn = Crc32cHardwareAvailable() ? &Crc32cHardware : &Crc32cScalar;
  return fn(data, n, crc);
}

}  // namespace pw

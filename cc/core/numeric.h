// Storage and compute types for the TensorFlow-free core.
//
// Variables may be stored as half, bfloat16, float or double; every rule computes
// in `ComputeType<T>` (float for the 16-bit types, so half/bfloat16 math happens in
// float32 registers and is rounded once on store). The 16-bit types are plain
// bit containers, layout-compatible with Eigen::half / Eigen::bfloat16 /
// numpy.float16 / ml_dtypes.bfloat16, so the TF binding and the pybind11 module can
// reinterpret their buffers without conversion. Conversions round to nearest even,
// like Eigen and NumPy, so results agree bit for bit with a float32 computation
// rounded by either library.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FO_HOST_DEVICE inline
#endif
// For the host, too, always inlined: a loop the CPU engine calls once per row, which its
// vector-ISA clones (cpu_isa.h) must compile with their own instructions, not call at the
// baseline's.
#if defined(__CUDACC__) || !defined(__GNUC__)
#define FO_HOST_DEVICE_INLINE FO_HOST_DEVICE
#else
#define FO_HOST_DEVICE_INLINE inline __attribute__((always_inline))
#endif

namespace fusedopt {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

namespace detail {
FO_HOST_DEVICE uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
FO_HOST_DEVICE float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace detail

FO_HOST_DEVICE float ToFloat(half_t h) {
  // Re-bias the exponent; subnormal halves become normal floats via one exact
  // float subtraction, Inf/NaN keep an all-ones exponent.
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t u = (static_cast<uint32_t>(h.bits) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & u;
  u += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    u += (128u - 16u) << 23;
  } else if (exp == 0) {
    u += 1u << 23;
    u = detail::FloatBits(detail::BitsFloat(u) - detail::BitsFloat(113u << 23));
  }
  u |= (static_cast<uint32_t>(h.bits) & 0x8000u) << 16;
  return detail::BitsFloat(u);
}

FO_HOST_DEVICE half_t ToHalf(float f) {
  uint32_t u = detail::FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  uint16_t out;
  if (u >= (143u << 23)) {  // >= 65536: overflow to Inf; NaN stays (quiet) NaN.
    out = u > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {  // below half's normal range: let one float add round.
    const float magic = detail::BitsFloat(((127u - 15u) + (23u - 10u) + 1u) << 23);
    out = static_cast<uint16_t>(detail::FloatBits(detail::BitsFloat(u) + magic) -
                                detail::FloatBits(magic));
  } else {  // normal: re-bias, round to nearest even on the 13 dropped bits.
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu + mantissa_odd;
    out = static_cast<uint16_t>(u >> 13);
  }
  return half_t{static_cast<uint16_t>(out | sign)};
}

FO_HOST_DEVICE float ToFloat(bfloat16_t b) {
  return detail::BitsFloat(static_cast<uint32_t>(b.bits) << 16);
}

FO_HOST_DEVICE bfloat16_t ToBfloat16(float f) {
  const uint32_t u = detail::FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN with its sign.
    return bfloat16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bfloat16_t{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// ComputeType<T>: the register type rules compute in.
template <typename T>
struct ComputeTypeOf {
  using type = float;
};
template <>
struct ComputeTypeOf<double> {
  using type = double;
};
template <typename T>
using ComputeType = typename ComputeTypeOf<T>::type;

// Load/Store move between storage and compute types.
FO_HOST_DEVICE float Load(half_t x) { return ToFloat(x); }
FO_HOST_DEVICE float Load(bfloat16_t x) { return ToFloat(x); }
FO_HOST_DEVICE float Load(float x) { return x; }
FO_HOST_DEVICE double Load(double x) { return x; }

FO_HOST_DEVICE void Store(half_t& dst, float x) { dst = ToHalf(x); }
FO_HOST_DEVICE void Store(bfloat16_t& dst, float x) { dst = ToBfloat16(x); }
FO_HOST_DEVICE void Store(float& dst, float x) { dst = x; }
FO_HOST_DEVICE void Store(double& dst, double x) { dst = x; }

// Compact slot storage: a float32 variable may keep its slots as half or bfloat16 (the
// rules still compute in float32; a slot is rounded once, on store). Rounding is to
// nearest even, or, opt-in, stochastic: up with probability equal to the dropped
// fraction, so small increments survive in expectation where nearest would drop them.
// The random bits are a hash of the value being stored and of a salt: the bits of the
// variable's element before the update, the slot's number, and the call's salt (CallSalt
// of the op's rounding seed, which the front ends set to the step number). The seed makes
// each step's decision fresh even where nothing else changes (a learning rate of 0, an
// update below half a 16-bit step, a repeated gradient): without it such an element would
// take the same decision every step, a bias. Deterministic: the same bits on every run,
// thread count and engine given the same float32 value and seed (CPU, CUDA, XLA's custom
// call; XLA's HLO reproduces the bit operations exactly, but where XLA contracts a*b+c
// into an FMA the value rounded can differ in its last bit).
template <typename S>
constexpr bool IsCompactStorage() {
  return sizeof(S) == 2;
}

// murmur3's 32-bit finaliser: every input bit flips each output bit with p ~ 1/2.
FO_HOST_DEVICE uint32_t MixBits(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  x ^= x >> 16;
  return x;
}

// The random bits for storing `value` into slot number `slot` of an element whose
// variable held `salt_bits` before the update.
FO_HOST_DEVICE uint32_t RoundingNoise(float value, uint32_t salt_bits, int slot) {
  return MixBits(detail::FloatBits(value) ^
                 MixBits(salt_bits + 0x9e3779b9u * static_cast<uint32_t>(slot + 1)));
}
// The salt a call's rounding seed adds to every element's: both halves of the seed mixed
// (the step number, or any 64-bit value the caller changes every call).
FO_HOST_DEVICE uint32_t CallSalt(uint64_t seed) {
  return MixBits(static_cast<uint32_t>(seed) ^
                 MixBits(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9u));
}
FO_HOST_DEVICE uint32_t SaltBits(float x) { return detail::FloatBits(x); }
FO_HOST_DEVICE uint32_t SaltBits(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof(u));
  return static_cast<uint32_t>(u) ^ static_cast<uint32_t>(u >> 32);
}

// bfloat16 keeps float's top 16 bits: add 16 random bits below them and truncate.
FO_HOST_DEVICE bfloat16_t ToBfloat16Stochastic(float f, uint32_t noise) {
  const uint32_t u = detail::FloatBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return ToBfloat16(f);  // Inf, NaN: as nearest
  return bfloat16_t{static_cast<uint16_t>((u + (noise & 0xffffu)) >> 16)};
}

// half: the same on the 13 bits its normal range drops; outside that range (subnormal,
// overflow, Inf, NaN) to nearest.
FO_HOST_DEVICE half_t ToHalfStochastic(float f, uint32_t noise) {
  uint32_t u = detail::FloatBits(f);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude < (113u << 23) || magnitude >= (143u << 23)) return ToHalf(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t rounded = (magnitude + ((15u - 127u) << 23) + (noise & 0x1fffu)) >> 13;
  return half_t{static_cast<uint16_t>(rounded | sign)};  // a carry to 0x7c00 is Inf
}

FO_HOST_DEVICE void StoreStochastic(half_t& dst, float x, uint32_t noise) {
  dst = ToHalfStochastic(x, noise);
}
FO_HOST_DEVICE void StoreStochastic(bfloat16_t& dst, float x, uint32_t noise) {
  dst = ToBfloat16Stochastic(x, noise);
}

// A slot's store: stochastic only where asked and the storage is 16-bit.
template <bool kStochastic, typename S, typename C>
FO_HOST_DEVICE void StoreSlot(S& dst, C x, uint32_t salt_bits, int slot) {
  if constexpr (kStochastic && IsCompactStorage<S>()) {
    StoreStochastic(dst, x, RoundingNoise(x, salt_bits, slot));
  } else {
    Store(dst, x);
  }
}

// Math with overloads for both compute types, usable in device code.
FO_HOST_DEVICE float Sqrt(float x) { return sqrtf(x); }
FO_HOST_DEVICE double Sqrt(double x) { return sqrt(x); }
FO_HOST_DEVICE float Abs(float x) { return fabsf(x); }
FO_HOST_DEVICE double Abs(double x) { return fabs(x); }
// NaN-propagating max (std::max would drop a NaN in its second argument).
template <typename C>
FO_HOST_DEVICE C MaxPropagateNaN(C a, C b) {
  return (a != a || a > b) ? a : b;
}

}  // namespace fusedopt

"""NumPy model of compact slot storage (cc/core/numeric.h), for every engine's tests.

A float32 variable's slots stored as bfloat16/float16: the engines compute in float32 and
round each slot once on store, to nearest even (ml_dtypes' casts) or stochastically with
noise hashed from the stored value and a salt (the variable element's bits before the
update, the call's salt from its rounding seed, and the slot's number): ``call_salt``,
``element_salt``, ``rounding_noise``, ``to_bf16_stochastic``, ``to_f16_stochastic``
reproduce numeric.h bit for bit.
"""
import ml_dtypes
import numpy as np

U32 = np.uint32


_MASK = np.uint64(0xFFFFFFFF)


def _u32(x):
    # uint64 arithmetic with uint64 constants only: NumPy 1.x's value-based casting turns
    # 0-d uint64 with a Python int into float64.
    return np.asarray(x).astype(np.uint64) & _MASK


def mix_bits(x):
    """murmur3's fmix32 on uint32 arrays (numeric.h MixBits)."""
    x = _u32(x)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & _MASK
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & _MASK
    x ^= x >> np.uint64(16)
    return x


def float_bits(x):
    return _u32(np.asarray(x, np.float32).view(U32))


def call_salt(seed):
    """numeric.h CallSalt: a 64-bit seed (Python int, may be negative) -> uint32."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    low, high = seed & 0xFFFFFFFF, seed >> 32
    return mix_bits(np.uint64(low) ^ mix_bits((np.uint64(high) + np.uint64(0x9E3779B9)) & _MASK))


def element_salt(var_before, seed):
    """The salt of each element's slot stores: var's float32 bits before the update with
    the call's salt mixed in (numeric.h; per-row slots take their row's first element)."""
    return float_bits(var_before) ^ call_salt(seed)


def rounding_noise(value, salt_bits, slot):
    """numeric.h RoundingNoise: value float32, salt_bits uint32 (arrays broadcast)."""
    salt = (_u32(salt_bits) + np.uint64(0x9E3779B9 * (slot + 1) & 0xFFFFFFFF)) & _MASK
    return mix_bits(float_bits(value) ^ mix_bits(salt))


def to_bf16_stochastic(value, noise):
    value = np.asarray(value, np.float32)
    u = float_bits(value)
    special = (u & np.uint64(0x7F800000)) == np.uint64(0x7F800000)
    bits = (((u + (_u32(noise) & np.uint64(0xFFFF))) & _MASK) >> np.uint64(16)).astype(np.uint16)
    out = bits.view(ml_dtypes.bfloat16)
    return np.where(special, value.astype(ml_dtypes.bfloat16), out)


def to_f16_stochastic(value, noise):
    value = np.asarray(value, np.float32)
    u = float_bits(value)
    magnitude = u & np.uint64(0x7FFFFFFF)
    nearest = (magnitude < np.uint64(113 << 23)) | (magnitude >= np.uint64(143 << 23))
    rebias = np.int64((15 - 127) << 23)  # negative: done in int64
    noise13 = (_u32(noise) & np.uint64(0x1FFF)).astype(np.int64)
    rounded = ((magnitude.astype(np.int64) + rebias + noise13) >> np.int64(13)).astype(np.uint64)
    bits = (rounded | ((u >> np.uint64(16)) & np.uint64(0x8000))).astype(np.uint16)
    with np.errstate(over="ignore"):  # the nearest branch of out-of-range values: Inf
        return np.where(nearest, value.astype(np.float16), bits.view(np.float16))


def round_slot(value, dtype, stochastic=False, salt_bits=None, slot=0):
    """A float32 slot value stored as `dtype` (ml_dtypes.bfloat16 or np.float16)."""
    value = np.asarray(value, np.float32)
    if not stochastic:
        return value.astype(dtype)
    noise = rounding_noise(value, salt_bits, slot)
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        return to_bf16_stochastic(value, noise)
    return to_f16_stochastic(value, noise)

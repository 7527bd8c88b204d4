/* half.h — the one conversion between f32 and the 16-bit floats (bf16,
 * IEEE f16), in plain C on integer bits.  The interpreter converts with
 * these; jit_cpu/codegen.c emits the same steps as IR and jit_gpu's CUDA C
 * has the same functions (DESIGN §13), so compiled and interpreted code
 * round alike, bit for bit; tests/test_half.c checks every 16-bit pattern
 * against an independent reference and the JIT against these.
 *
 * f32 -> half rounds to nearest, ties to even; values past the largest
 * finite half become Inf; f16 subnormals are exact; a NaN stays a NaN of
 * the same sign, quieted, keeping the payload's top bits.  half -> f32 is
 * exact: bf16 is the f32's top half (a shift, as PyTorch widens it: a
 * signaling NaN stays signaling until an op quiets it), an f16 NaN is
 * quieted (as F16C's vcvtph2ps does). */
#ifndef VM_HALF_H
#define VM_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t vm_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline float vm_f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline float vm_bf16_to_f32(uint16_t h) { return vm_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t vm_f32_to_bf16(float x) {
  uint32_t u = vm_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float vm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return vm_f32_from_bits(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0));
  if (e == 0) /* zero or subnormal: m * 2^-24, exact in f32 */
    return vm_f32_from_bits(sign | vm_f32_bits((float)m * 5.9604644775390625e-8f));
  return vm_f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t vm_f32_to_f16(float x) {
  uint32_t u = vm_f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: Inf */
  if (a >= 0x38800000u) /* a normal half: rebias the exponent, round away 13 bits */
    return (uint16_t)(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));
  uint32_t e = a >> 23;
  if (e < 102) return (uint16_t)sign; /* at most half the least subnormal: 0 */
  /* a subnormal half: the significand in units of 2^-24, ties to even */
  uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  q += (rem > half) | ((rem == half) & q);
  return (uint16_t)(sign | q);
}

/* x rounded to the precision of a half and back: what storing it does */
static inline float vm_round_bf16(float x) { return vm_bf16_to_f32(vm_f32_to_bf16(x)); }
static inline float vm_round_f16(float x) { return vm_f16_to_f32(vm_f32_to_f16(x)); }

#endif

/* rng.c — Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11) and the uniform/normal fills built on it.
 * Layout: f32 uses one u32 per uniform, f64 two; normals come in
 * Box-Muller pairs.  A block gives 4 f32 values or 2 f64 values. */
#include "rng.h"

#include <math.h>

#include "pool.h"
#include "state.h"

void vm_philox(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
  uint32_t k0 = key[0], k1 = key[1];
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint64_t vm_rng_blocks(int64_t n, kiln_dtype dt) {
  int per_block = dt == KILN_F64 ? 2 : 4; /* f32 values (halves round them) or f64 */
  return (uint64_t)((n + per_block - 1) / per_block);
}

static void rng_lock(vm_process_state *ps) {
  while (atomic_flag_test_and_set_explicit(&ps->rng_lock, memory_order_acquire)) {
  }
}

void vm_rng_reserve(uint64_t blocks, uint64_t *seed, uint64_t *counter) {
  vm_process_state *ps = vm_process();
  rng_lock(ps);
  *seed = ps->rng_seed;
  *counter = ps->rng_counter;
  ps->rng_counter += blocks;
  atomic_flag_clear_explicit(&ps->rng_lock, memory_order_release);
}

void vm_rng_seed(uint64_t seed) {
  vm_process_state *ps = vm_process();
  rng_lock(ps);
  ps->rng_seed = seed;
  ps->rng_counter = 0;
  atomic_flag_clear_explicit(&ps->rng_lock, memory_order_release);
}

typedef struct {
  void *data;
  int64_t n;
  bool normal, f64;
  uint32_t key[2];
  uint64_t counter;
} rng_job;

static inline double unit53(uint32_t hi, uint32_t lo) { /* [0, 1) */
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

static void fill_blocks(void *p, int64_t begin, int64_t end) {
  const rng_job *j = p;
  const double two_pi = 6.283185307179586476925;
  for (int64_t b = begin; b < end; b++) {
    uint64_t c = j->counter + (uint64_t)b;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, r[4];
    vm_philox(j->key, ctr, r);
    if (!j->f64) {
      float v[4];
      if (!j->normal) {
        for (int k = 0; k < 4; k++) v[k] = (float)(r[k] >> 8) * 0x1p-24f;
      } else {
        for (int k = 0; k < 4; k += 2) {
          double u1 = ((r[k] >> 8) + 1.0) * 0x1p-24, u2 = (r[k + 1] >> 8) * 0x1p-24;
          double rad = sqrt(-2.0 * log(u1));
          v[k] = (float)(rad * cos(two_pi * u2));
          v[k + 1] = (float)(rad * sin(two_pi * u2));
        }
      }
      for (int k = 0; k < 4 && b * 4 + k < j->n; k++) ((float *)j->data)[b * 4 + k] = v[k];
    } else {
      double v[2];
      if (!j->normal) {
        v[0] = unit53(r[0], r[1]);
        v[1] = unit53(r[2], r[3]);
      } else {
        double u1 = 1.0 - unit53(r[0], r[1]), u2 = unit53(r[2], r[3]); /* u1 in (0, 1] */
        double rad = sqrt(-2.0 * log(u1));
        v[0] = rad * cos(two_pi * u2);
        v[1] = rad * sin(two_pi * u2);
      }
      for (int k = 0; k < 2 && b * 2 + k < j->n; k++) ((double *)j->data)[b * 2 + k] = v[k];
    }
  }
}

void vm_rng_fill(vm_tensor *out, bool normal, uint64_t seed, uint64_t counter) {
  rng_job job = {vm_data(out),
                 out->numel,
                 normal,
                 out->dtype == KILN_F64,
                 {(uint32_t)seed, (uint32_t)(seed >> 32)},
                 counter};
  vm_parallel_for((int64_t)vm_rng_blocks(out->numel, out->dtype), 1 << 12, fill_blocks, &job);
}

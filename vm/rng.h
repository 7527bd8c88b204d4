/* rng.h — Kiln's counter-based RNG (Philox4x32-10).  Element i of a draw
 * depends only on (seed, counter at the call, i): the numbers never depend
 * on the thread count or on how the work is split. */
#ifndef VM_RNG_H
#define VM_RNG_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

/* Philox blocks (4 x u32 each) a draw of n values of dt uses */
uint64_t vm_rng_blocks(int64_t n, kiln_dtype dt);
/* reserves the blocks for a draw from the process generator; returns the
   counter of the first one and the seed */
void vm_rng_reserve(uint64_t blocks, uint64_t *seed, uint64_t *counter);
void vm_rng_seed(uint64_t seed);
/* fills a contiguous float tensor with U[0,1) (normal=false) or N(0,1) */
void vm_rng_fill(vm_tensor *out, bool normal, uint64_t seed, uint64_t counter);
/* one Philox4x32-10 block (exposed for tests against known answers) */
void vm_philox(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

#endif

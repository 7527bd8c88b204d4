/* key.h — the canonical key of a trace (DESIGN §4): per node op, dtype,
 * shape and the attributes that change code; per leaf dtype, shape, layout
 * class and aliasing; the output set; the device.  Host scalars and RNG
 * counters are parameters, never key bytes — except a scalar's class (zero,
 * one, other), so that exact identities (x*1, x-0) can be specialized
 * without recompiling for every other value.  Also the key *family*: the same
 * bytes with every extent erased (for the recompile budget). */
#ifndef TR_KEY_H
#define TR_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "flush.h"

typedef struct tr_bytes {
  uint8_t *data;
  size_t len, cap;
  bool failed; /* out of memory */
} tr_bytes;

typedef struct tr_key {
  uint64_t lo, hi; /* XXH3-128 */
} tr_key;

/* canonical bytes of t (with_shapes false: the family's bytes) */
void tr_key_bytes(const tr_trace *t, bool with_shapes, tr_bytes *out);
tr_key tr_key_hash(const tr_bytes *b);
void tr_bytes_free(tr_bytes *b);

/* 0 other, 1 +0, 2 one, 3 -0 */
int tr_scalar_class(double v);

#endif

/* ptrmap.h — a small open-addressing map from pointers to ints, for the
 * per-flush and per-backward indexes of nodes.  Keys are never removed. */
#ifndef TR_PTRMAP_H
#define TR_PTRMAP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct tr_ptrmap {
  const void **keys;
  int *vals;
  int slots, count;
} tr_ptrmap;

static inline size_t tr_ptrmap_slot(const tr_ptrmap *m, const void *key) {
  size_t mask = (size_t)m->slots - 1, h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
  h = (h >> 17) & mask;
  while (m->keys[h] && m->keys[h] != key) h = (h + 1) & mask;
  return h;
}

/* the value stored for key, or -1 */
static inline int tr_ptrmap_get(const tr_ptrmap *m, const void *key) {
  if (!m->slots) return -1;
  size_t h = tr_ptrmap_slot(m, key);
  return m->keys[h] ? m->vals[h] : -1;
}

/* stores key -> val (growing the table); false on OOM */
static inline bool tr_ptrmap_put(tr_ptrmap *m, const void *key, int val) {
  if ((m->count + 1) * 2 > m->slots) {
    tr_ptrmap bigger = {0};
    bigger.slots = m->slots ? m->slots * 2 : 64;
    bigger.keys = calloc((size_t)bigger.slots, sizeof *bigger.keys);
    bigger.vals = malloc((size_t)bigger.slots * sizeof *bigger.vals);
    if (!bigger.keys || !bigger.vals) {
      free(bigger.keys);
      free(bigger.vals);
      return false;
    }
    for (int i = 0; i < m->slots; i++)
      if (m->keys[i]) {
        size_t h = tr_ptrmap_slot(&bigger, m->keys[i]);
        bigger.keys[h] = m->keys[i];
        bigger.vals[h] = m->vals[i];
      }
    bigger.count = m->count;
    free(m->keys);
    free(m->vals);
    *m = bigger;
  }
  size_t h = tr_ptrmap_slot(m, key);
  if (!m->keys[h]) m->count++;
  m->keys[h] = key;
  m->vals[h] = val;
  return true;
}

static inline void tr_ptrmap_free(tr_ptrmap *m) {
  free(m->keys);
  free(m->vals);
  m->keys = NULL;
  m->vals = NULL;
  m->slots = m->count = 0;
}

#endif

/* scope.h — temporaries of a composite computation: keep() registers a new
 * handle, finish() releases them all and returns a new reference to the
 * result.  A NULL flows through fe_op and keeps the first error. */
#ifndef FE_SCOPE_H
#define FE_SCOPE_H

#include <assert.h>

#include "../vm/tensor.h"

#define FE_SCOPE_MAX 48

typedef struct fe_scope {
  vm_tensor *held[FE_SCOPE_MAX];
  int n;
} fe_scope;

static inline vm_tensor *keep(fe_scope *s, vm_tensor *t) {
  assert(s->n < FE_SCOPE_MAX);
  if (t && s->n < FE_SCOPE_MAX) s->held[s->n++] = t;
  return t;
}

static inline vm_tensor *finish(fe_scope *s, vm_tensor *result) {
  vm_retain(result);
  for (int i = 0; i < s->n; i++) vm_release(s->held[i]);
  s->n = 0;
  return result;
}

#endif

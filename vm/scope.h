/* scope.h — temporaries of a composite computation: keep() registers a new
 * handle, finish() releases them all and returns a new reference to the
 * result.  A NULL flows through vm_op and keeps the first error. */
#ifndef VM_SCOPE_H
#define VM_SCOPE_H

#include <assert.h>

#include "tensor.h"

#define VM_SCOPE_MAX 48

typedef struct vm_scope {
  vm_tensor *held[VM_SCOPE_MAX];
  int n;
} vm_scope;

static inline vm_tensor *keep(vm_scope *s, vm_tensor *t) {
  assert(s->n < VM_SCOPE_MAX);
  if (t && s->n < VM_SCOPE_MAX) s->held[s->n++] = t;
  return t;
}

static inline vm_tensor *finish(vm_scope *s, vm_tensor *result) {
  vm_retain(result);
  for (int i = 0; i < s->n; i++) vm_release(s->held[i]);
  s->n = 0;
  return result;
}

#endif

/* safetensors.h — saving and loading tensors in the safetensors format
 * (8-byte little-endian header length, a JSON header, raw little-endian
 * data), the files PyTorch's, numpy's and JAX's tools read and write. */
#ifndef FE_SAFETENSORS_H
#define FE_SAFETENSORS_H

#include "../vm/tensor.h"

/* writes ts[0..n) under names[0..n) (distinct, non-empty); returns KILN_OK
   or a negative status */
int fe_save(const char *path, int n, const char *const *names, vm_tensor *const *ts);
/* reads a file: names[i] (malloc'd) and ts[i] for i < the returned count,
   in the header's order; every size, offset and dtype is validated before
   any data is read.  cap 0 with names and ts NULL returns the count alone. */
int fe_load(const char *path, int cap, char **names, vm_tensor **ts);

#endif

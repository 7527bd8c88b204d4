/* format.h — printing tensors in PyTorch's format (kiln_print, Ruby inspect). */
#ifndef FE_FORMAT_H
#define FE_FORMAT_H

#include <stdio.h>

#include "../vm/tensor.h"

/* writes "tensor([...])" and a newline; false with the error set on failure */
bool fe_format(vm_tensor *t, FILE *f);

#endif

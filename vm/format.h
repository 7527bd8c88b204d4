/* format.h — printing tensors in PyTorch's format (kiln_print, Ruby inspect). */
#ifndef VM_FORMAT_H
#define VM_FORMAT_H

#include <stdio.h>

#include "tensor.h"

/* writes "tensor([...])" and a newline; false with the error set on failure */
bool vm_format(vm_tensor *t, FILE *f);

#endif

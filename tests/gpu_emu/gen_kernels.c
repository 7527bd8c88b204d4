/* gen_kernels.c — writes every generated GPU kernel (jit_gpu/opgen) as one
 * C++ translation unit for the CPU emulation (kernels.inc) and a table of
 * their entry points (registry.inc), into the current directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit_gpu/opgen.h"
static gpu_op_key keys[4096];
int main(void) {
  int n = gpu_op_keys(keys, 4096);
  char *src = gpu_op_source_batch(keys, n);
  FILE *f = fopen("kernels.inc", "w");
  /* drop the layout static_asserts (EDG's __INTADDR__ is not g++'s) */
  for (char *line = src; *line;) {
    char *e = strchr(line, '\n');
    size_t len = e ? (size_t)(e - line + 1) : strlen(line);
    if (strncmp(line, "static_assert(", 14)) fwrite(line, 1, len, f);
    line += len;
  }
  fclose(f);
  f = fopen("registry.inc", "w");
  for (int i = 0; i < n; i++) {
    char name[128];
    gpu_op_key_name(&keys[i], name, sizeof name);
    fprintf(f, "{\"%s\", %s},\n", name, name);
  }
  fclose(f);
  printf("%d kernels\n", n);
  return 0;
}

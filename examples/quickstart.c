/* quickstart.c — a first look at Kiln: tensors, broadcasting, a softmax,
 * a matmul.  Built and run by scripts/demo. */
#include <kiln.h>
#include <stdio.h>

static int check(const void *p) {
  if (p) return 0;
  fprintf(stderr, "kiln error: %s\n", kiln_last_error());
  return 1;
}

int main(void) {
  printf("Kiln %s on %s, %d threads, OpenBLAS kernel %s\n\n", kiln_version(), kiln_cpu_isa(),
         kiln_num_threads(), kiln_blas_core());

  float xs[] = {1, 2, 3, 4, 5, 6};
  float bias[] = {10, 20, 30};
  kiln_tensor *x = kiln_from_data(xs, KILN_F32, 2, (int64_t[]){2, 3});
  kiln_tensor *b = kiln_from_data(bias, KILN_F32, 1, (int64_t[]){3});
  kiln_tensor *y = kiln_add(kiln_mul_scalar(x, 0.5), b); /* note: leaks the temporary */
  if (check(y)) return 1;
  printf("x =\n");
  kiln_print(x, stdout);
  printf("x * 0.5 + [10, 20, 30] (broadcast over rows) =\n");
  kiln_print(y, stdout);

  kiln_tensor *p = kiln_softmax(x, -1);
  if (check(p)) return 1;
  printf("softmax(x, axis=-1) =\n");
  kiln_print(p, stdout);

  kiln_tensor *xt = kiln_transpose(x, 0, 1); /* a view: no copy */
  kiln_tensor *g = kiln_matmul(x, xt);       /* [2,3] @ [3,2] */
  if (check(g)) return 1;
  printf("x @ x^T =\n");
  kiln_print(g, stdout);

  kiln_tensor *s = kiln_sum(g, 0, NULL, false);
  printf("sum(x @ x^T) = %g\n", kiln_item(s));

  kiln_tensor *tensors[] = {x, y, p, xt, g, s, b};
  for (int i = 0; i < 7; i++) kiln_release(tensors[i]);
  return 0;
}

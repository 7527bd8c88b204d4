/* outside.c — a program outside the tree, compiled against the *installed*
 * kiln.h and libkiln with `pkg-config --cflags --libs kiln` by scripts/test. */
#include <kiln.h>
#include <stdio.h>

int main(void) {
  double xs[] = {1, 2, 3, 4};
  kiln_tensor *a = kiln_from_data(xs, KILN_F64, 2, (int64_t[]){2, 2});
  kiln_tensor *b = kiln_matmul(a, a); /* [[7, 10], [15, 22]] */
  kiln_tensor *s = kiln_sum(b, 0, NULL, false);
  double total = kiln_item(s);
  kiln_release(a);
  kiln_release(b);
  kiln_release(s);
  if (total != 54.0) {
    fprintf(stderr, "outside: expected 54, got %g (%s)\n", total, kiln_last_error());
    return 1;
  }
  printf("outside: kiln %s, sum(a @ a) = %g\n", kiln_version(), total);
  return 0;
}

/* test_device.c — devices: the CPU is always there; CUDA is probed through
 * a dlopen'd driver (absent or device-less on machines without a GPU), and
 * asking for it without one is a clear KILN_ERR_DEVICE, never a crash. */
#include "ktest.h"

TEST(cpu_is_always_available) {
  CHECK(kiln_device_available(KILN_CPU));
  CHECK(!kiln_device_available((kiln_device)7));
}

TEST(to_cpu_names_the_same_value) {
  float xs[3] = {1, 2, 3};
  kiln_tensor *x = kiln_from_data(xs, KILN_F32, 1, (int64_t[]){3});
  kiln_tensor *y = kiln_to_device(x, KILN_CPU);
  CHECK(y && y != x);
  CHECK_EQ_INT(kiln_device_of(y), KILN_CPU);
  CHECK_TENSOR(y, 1, ((int64_t[]){3}), ((double[]){1, 2, 3}), 0);
  kiln_release(x);
  kiln_release(y);
}

TEST(cuda_without_a_device_is_a_device_error) {
  kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){4});
  if (kiln_device_available(KILN_CUDA)) {
    printf("test_device: a CUDA device is present; CUDA tensors are not implemented yet\n");
  } else {
    printf("test_device: no CUDA device here; GPU tests skipped\n");
  }
  CHECK_ERROR(kiln_to_device(x, KILN_CUDA), KILN_ERR_DEVICE, "kiln_to_device");
  CHECK_ERROR(kiln_to_device(x, (kiln_device)9), KILN_ERR_ARG, "invalid device 9");
  CHECK_ERROR(kiln_to_device(NULL, KILN_CPU), KILN_ERR_ARG, "kiln_to_device");
  kiln_release(x);
}

int main(void) {
  RUN(cpu_is_always_available);
  RUN(to_cpu_names_the_same_value);
  RUN(cuda_without_a_device_is_a_device_error);
  return ktest_done();
}

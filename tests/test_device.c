/* test_device.c — devices: the CPU is always there; CUDA is probed through
 * a dlopen'd driver (absent or device-less on machines without a GPU), and
 * asking for it without one is a clear KILN_ERR_DEVICE, never a crash. */
#include <sys/wait.h>
#include <unistd.h>

#include "../front/op.h"
#include "ktest.h"

extern char **environ;

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

TEST(cuda_is_there_or_a_clear_device_error) {
  kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){4});
  printf("test_device: CUDA: %s\n", kiln_device_info(KILN_CUDA));
  if (kiln_device_available(KILN_CUDA)) { /* test_gpu_ops covers it */
    kiln_tensor *g = kiln_to_device(x, KILN_CUDA);
    CHECK(g && kiln_device_of(g) == KILN_CUDA);
    kiln_release(g);
  } else {
    CHECK_ERROR(kiln_to_device(x, KILN_CUDA), KILN_ERR_DEVICE,
                "kiln_to_device: no CUDA device is available");
  }
  CHECK_ERROR(kiln_to_device(x, (kiln_device)9), KILN_ERR_ARG, "invalid device 9");
  CHECK_ERROR(kiln_to_device(NULL, KILN_CPU), KILN_ERR_ARG, "kiln_to_device");
  kiln_release(x);
}

TEST(device_info_says_what_or_why) {
  const char *cpu = kiln_device_info(KILN_CPU);
  CHECK(cpu && strstr(cpu, "CPU") && strstr(cpu, "threads"));
  const char *cuda = kiln_device_info(KILN_CUDA);
  CHECK(cuda && *cuda);
  if (!kiln_device_available(KILN_CUDA))
    CHECK(strstr(cuda, "CUDA") || strstr(cuda, "libcuda") || strstr(cuda, "device"));
  CHECK(!strcmp(kiln_device_info((kiln_device)7), "no such device"));
  kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2});
  CHECK_EQ_INT(kiln_device_of(x), KILN_CPU);
  kiln_release(x);
}

/* the rule every op follows (vm_infer_device), on handles whose device is
   set by hand: a GPU is not needed to check who may mix with whom */
TEST(an_op_over_two_devices_names_both) {
  kiln_tensor *a = kiln_ones(KILN_F32, 1, (int64_t[]){3}),
              *b = kiln_ones(KILN_F32, 1, (int64_t[]){3});
  kiln_tensor *s = kiln_scalar(2.0, KILN_F32); /* 0-d, but not a weak literal */
  vm_tensor *w = fe_weak_scalar(2, false);
  kiln_device d = KILN_CPU;
  b->device = KILN_CUDA;
  CHECK(!vm_infer_device(2, (vm_tensor *[]){a, b}, &d));
  CHECK(strstr(kiln_last_error(), "input 0 is on cpu and input 1 on cuda"));
  kiln_clear_error();
  CHECK(vm_infer_device(2, (vm_tensor *[]){b, w}, &d) &&
        d == KILN_CUDA); /* weak scalars go anywhere */
  CHECK(vm_infer_device(2, (vm_tensor *[]){w, b}, &d) && d == KILN_CUDA);
  CHECK(vm_infer_device(3, (vm_tensor *[]){a, w, a}, &d) && d == KILN_CPU);
  CHECK(!vm_infer_device(2, (vm_tensor *[]){s, b}, &d)); /* a user's 0-d tensor is on its device */
  b->device = KILN_CPU;
  kiln_clear_error();
  kiln_release(a);
  kiln_release(b);
  kiln_release(s);
  vm_release(w);
}

/* KILN_DEVICE, read once per process: checked in children */
static int child_with_device(const char *self, const char *value, const char *mode) {
  char var[64];
  snprintf(var, sizeof var, "KILN_DEVICE=%s", value);
  int n = 0;
  while (environ[n]) n++;
  char **env = calloc((size_t)n + 2, sizeof *env);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (strncmp(environ[i], "KILN_DEVICE=", 12)) env[k++] = environ[i];
  env[k++] = var;
  pid_t pid = fork();
  if (pid == 0) {
    execve(self, (char *[]){(char *)self, (char *)mode, NULL}, env);
    _exit(127);
  }
  free(env);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int child_checks(const char *mode, kiln_tensor *x, kiln_tensor *y, kiln_tensor *r) {
  if (!strcmp(mode, "--cuda")) { /* here only without a GPU: a clear error at the call */
    if (kiln_device_available(KILN_CUDA))
      return x && y && r && kiln_device_of(x) == KILN_CUDA ? 0 : 1;
    return !x && !y && !r && kiln_last_status() == KILN_ERR_DEVICE &&
                   strstr(kiln_last_error(), "kiln_rand: no CUDA device is available")
               ? 0
               : 2;
  }
  if (!strcmp(mode, "--bad")) /* names the value and the choices */
    return !x && !y && kiln_last_status() == KILN_ERR_ARG &&
                   strstr(kiln_last_error(), "KILN_DEVICE=tpu names no device (cpu or cuda)")
               ? 0
               : 3;
  return x && y && r && kiln_device_of(x) == KILN_CPU && kiln_device_of(y) == KILN_CPU ? 0 : 4;
}

static int as_child(const char *mode) {
  kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){4});
  kiln_tensor *y = kiln_from_data((float[]){1, 2}, KILN_F32, 1, (int64_t[]){2});
  kiln_tensor *r = kiln_rand(KILN_F32, 1, (int64_t[]){4});
  int rc = child_checks(mode, x, y, r);
  kiln_release(x), kiln_release(y), kiln_release(r);
  return rc;
}

static char self[4096];

TEST(kiln_device_picks_where_new_tensors_go) {
  CHECK_EQ_INT(child_with_device(self, "cuda", "--cuda"), 0);
  CHECK_EQ_INT(child_with_device(self, "tpu", "--bad"), 0);
  CHECK_EQ_INT(child_with_device(self, "cpu", "--cpu"), 0);
}

int main(int argc, char **argv) {
  if (argc == 2) return as_child(argv[1]);
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  RUN(cpu_is_always_available);
  RUN(to_cpu_names_the_same_value);
  RUN(cuda_is_there_or_a_clear_device_error);
  RUN(device_info_says_what_or_why);
  RUN(an_op_over_two_devices_names_both);
  RUN(kiln_device_picks_where_new_tensors_go);
  return ktest_done();
}

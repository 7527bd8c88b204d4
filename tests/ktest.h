/* ktest.h — the tiny test harness every C test uses.
 * TEST(name) defines a test; RUN(name) runs it; CHECK* record failures with
 * file:line and keep going; ktest_done() prints "N passed, N failed" (the
 * line CI reads) and returns the process exit code.
 *   KTEST_ONLY=a,b   runs only the tests named (the others are left out)
 *   KTEST_TRACE=1    names each test on stderr as it starts (unbuffered:
 *                    where a run hangs or dies, the last name says which) */
#ifndef KTEST_H
#define KTEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../vm/half.h"
#include "kiln.h"

static int ktest_failed_checks, ktest_passed, ktest_failed;
static const char *ktest_current;

/* --- dtypes and host values: what the op tests share ------------------------- */

static inline const char *ktest_dtype_name(kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
      return "bool";
    case KILN_I32:
      return "i32";
    case KILN_I64:
      return "i64";
    case KILN_F32:
      return "f32";
    case KILN_F64:
      return "f64";
    case KILN_BF16:
      return "bf16";
    case KILN_F16:
      return "f16";
    case KILN_U8:
      return "u8";
    case KILN_I8:
      return "i8";
    case KILN_I16:
      return "i16";
  }
  return "?";
}

static inline size_t ktest_dtype_size(kiln_dtype dt) {
  switch (dt) {
    case KILN_BOOL:
    case KILN_U8:
    case KILN_I8:
      return 1;
    case KILN_BF16:
    case KILN_F16:
    case KILN_I16:
      return 2;
    case KILN_I32:
    case KILN_F32:
      return 4;
    default:
      return 8;
  }
}

/* the value v becomes when stored as dt (v in range for integers) */
static inline double ktest_as_dtype(kiln_dtype dt, double v) {
  switch (dt) {
    case KILN_BOOL:
      return v != 0; /* NaN is nonzero */
    case KILN_I32:
      return (double)(int32_t)v;
    case KILN_I64:
      return (double)(int64_t)v;
    case KILN_F32:
      return (double)(float)v;
    case KILN_F64:
      return v;
    case KILN_BF16:
      return vm_bf16_to_f32(vm_f32_to_bf16((float)v));
    case KILN_F16:
      return vm_f16_to_f32(vm_f32_to_f16((float)v));
    case KILN_U8:
      return (double)(uint8_t)(int64_t)v;
    case KILN_I8:
      return (double)(int8_t)(int64_t)v;
    case KILN_I16:
      return (double)(int16_t)(int64_t)v;
  }
  return v;
}

/* a new tensor of dtype dt and this shape holding v (row-major doubles,
   each stored as dt stores it); NULL with kiln's error set */
static inline kiln_tensor *ktest_from_doubles(kiln_dtype dt, int ndim, const int64_t *shape,
                                              const double *v) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  size_t bytes = (size_t)(n > 0 ? n : 1) * ktest_dtype_size(dt);
  unsigned char *buf = calloc(1, bytes);
  if (!buf) return NULL;
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case KILN_BOOL:
        buf[i] = v[i] != 0;
        break;
      case KILN_I32: {
        int32_t x = (int32_t)v[i];
        memcpy(buf + 4 * i, &x, 4);
        break;
      }
      case KILN_I64: {
        int64_t x = (int64_t)v[i];
        memcpy(buf + 8 * i, &x, 8);
        break;
      }
      case KILN_F32: {
        float x = (float)v[i];
        memcpy(buf + 4 * i, &x, 4);
        break;
      }
      case KILN_F64:
        memcpy(buf + 8 * i, &v[i], 8);
        break;
      case KILN_BF16:
      case KILN_F16: {
        uint16_t x = dt == KILN_BF16 ? vm_f32_to_bf16((float)v[i]) : vm_f32_to_f16((float)v[i]);
        memcpy(buf + 2 * i, &x, 2);
        break;
      }
      case KILN_U8:
        buf[i] = (uint8_t)(int64_t)v[i];
        break;
      case KILN_I8:
        buf[i] = (uint8_t)(int8_t)(int64_t)v[i];
        break;
      case KILN_I16: {
        int16_t x = (int16_t)(int64_t)v[i];
        memcpy(buf + 2 * i, &x, 2);
        break;
      }
    }
  }
  kiln_tensor *t = kiln_from_data(buf, dt, ndim, shape);
  free(buf);
  return t;
}

/* splitmix64, the tests' deterministic generator: the next 64 bits of the
   stream whose state is *s (advanced in place) */
static inline uint64_t ktest_splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* a uniform double in [0, 1) from its top 53 bits */
static inline double ktest_unif01(uint64_t *s) {
  return (double)(ktest_splitmix64(s) >> 11) * 0x1.0p-53;
}

#define TEST(name) static void name(void)

/* whether KTEST_ONLY (a comma-separated list; unset: every test) names it */
static inline int ktest_selected(const char *name) {
  const char *only = getenv("KTEST_ONLY");
  if (!only || !*only) return 1;
  size_t n = strlen(name);
  for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
    if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
  return 0;
}

#define RUN(name)                                                                                \
  do {                                                                                           \
    if (!ktest_selected(#name)) break;                                                           \
    if (getenv("KTEST_TRACE") && *getenv("KTEST_TRACE")) fprintf(stderr, "[ktest] %s\n", #name); \
    int before_ = ktest_failed_checks;                                                           \
    ktest_current = #name;                                                                       \
    kiln_clear_error();                                                                          \
    name();                                                                                      \
    if (ktest_failed_checks == before_) {                                                        \
      ktest_passed++;                                                                            \
    } else {                                                                                     \
      ktest_failed++;                                                                            \
      fprintf(stderr, "FAIL %s\n", #name);                                                       \
    }                                                                                            \
  } while (0)

#define KTEST_FAIL(...)                                                \
  do {                                                                 \
    ktest_failed_checks++;                                             \
    fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, ktest_current); \
    fprintf(stderr, __VA_ARGS__);                                      \
    fprintf(stderr, "\n");                                             \
  } while (0)

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) KTEST_FAIL("CHECK(%s) failed (last error: %s)", #cond, kiln_last_error()); \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                       \
  do {                                                                           \
    long long a_ = (long long)(a), b_ = (long long)(b);                          \
    if (a_ != b_) KTEST_FAIL("%s == %lld, expected %s == %lld", #a, a_, #b, b_); \
  } while (0)

/* |a-b| <= tol * max(1, |b|); NaN equals NaN; infinities must match */
#define CHECK_CLOSE(a, b, tol)                                                              \
  do {                                                                                      \
    double a_ = (double)(a), b_ = (double)(b);                                              \
    int ok_ = (isnan(a_) && isnan(b_)) || a_ == b_ ||                                       \
              (isfinite(a_) && isfinite(b_) && fabs(a_ - b_) <= (tol)*fmax(1.0, fabs(b_))); \
    if (!ok_) KTEST_FAIL("%s = %.17g, expected %.17g (tol %g)", #a, a_, b_, (double)(tol)); \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                           \
  do {                                                                            \
    const char *h_ = (hay);                                                       \
    if (!h_ || !strstr(h_, (needle)))                                             \
      KTEST_FAIL("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle)); \
  } while (0)

/* the op returned NULL with this status and a message containing `needle` */
#define CHECK_ERROR(expr, status, needle)                                             \
  do {                                                                                \
    kiln_clear_error();                                                               \
    kiln_tensor *r_ = (expr);                                                         \
    if (r_) {                                                                         \
      KTEST_FAIL("%s succeeded, expected an error", #expr);                           \
      kiln_release(r_);                                                               \
    } else {                                                                          \
      if (kiln_last_status() != (status))                                             \
        KTEST_FAIL("%s: status %d, expected %d (%s)", #expr, (int)kiln_last_status(), \
                   (int)(status), kiln_last_error());                                 \
      CHECK_STR_CONTAINS(kiln_last_error(), needle);                                  \
    }                                                                                 \
    kiln_clear_error();                                                               \
  } while (0)

/* whether this build has the CPU JIT (KILN_CPU_JIT=OFF builds run every
   CPU trace on the interpreter: checks of compiled kernels do not apply) */
static inline bool ktest_cpu_jit(void) { return !strstr(kiln_device_info(KILN_CPU), "no JIT"); }

/* Runs this test binary again as a child (KILN_DUMP unset): `env` (VAR=value
   ..., or "") before it, `args` after it.  The child's first line of output
   goes into line[cap] ("" if none); true when it exited with status 0. */
static inline bool ktest_run_self(const char *env, const char *args, char *line, size_t cap) {
  char self[4096], cmd[4600];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  line[0] = 0;
  if (len <= 0) return false;
  self[len] = 0;
  snprintf(cmd, sizeof cmd, "env -u KILN_DUMP %s '%s' %s", env, self, args);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  if (!fgets(line, (int)cap, p)) line[0] = 0;
  int status = pclose(p);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static inline int ktest_done(void) {
  /* tests/each_blas_core.sh: the run must have used the OpenBLAS kernels it
     asked for (an unknown or refused OPENBLAS_CORETYPE falls back quietly) */
  const char *want_core = getenv("KILN_EXPECT_BLAS_CORE");
  if (want_core && *want_core && strcmp(kiln_blas_core(), want_core)) {
    fprintf(stderr, "OPENBLAS_CORETYPE=%s: OpenBLAS ran its %s kernels instead\n", want_core,
            kiln_blas_core());
    ktest_failed++;
  }
  printf("%d passed, %d failed\n", ktest_passed, ktest_failed);
  return ktest_failed ? 1 : 0;
}

/* element i of a buffer of dtype dt (as kiln_to_buffer writes it) as a double */
static inline double ktest_elem(kiln_dtype dt, const void *raw, int64_t i) {
  switch (dt) {
    case KILN_BOOL:
      return ((const unsigned char *)raw)[i];
    case KILN_I32:
      return ((const int32_t *)raw)[i];
    case KILN_I64:
      return (double)((const int64_t *)raw)[i];
    case KILN_F32:
      return ((const float *)raw)[i];
    case KILN_F64:
      return ((const double *)raw)[i];
    case KILN_BF16:
      return vm_bf16_to_f32(((const uint16_t *)raw)[i]);
    case KILN_F16:
      return vm_f16_to_f32(((const uint16_t *)raw)[i]);
    case KILN_U8:
      return ((const uint8_t *)raw)[i];
    case KILN_I8:
      return ((const int8_t *)raw)[i];
    case KILN_I16:
      return ((const int16_t *)raw)[i];
  }
  return 0;
}

/* reads a tensor as doubles (any dtype) into a malloc'd array */
static inline double *ktest_values(kiln_tensor *t) {
  int64_t n = kiln_numel(t);
  size_t esz = ktest_dtype_size(kiln_dtype_of(t));
  void *raw = malloc((size_t)(n ? n : 1) * esz);
  double *out = malloc((size_t)(n ? n : 1) * sizeof(double));
  if (kiln_to_buffer(t, raw, (size_t)n * esz) < 0) {
    KTEST_FAIL("kiln_to_buffer failed: %s", kiln_last_error());
    memset(out, 0, (size_t)(n ? n : 1) * sizeof(double));
  } else {
    for (int64_t i = 0; i < n; i++) out[i] = ktest_elem(kiln_dtype_of(t), raw, i);
  }
  free(raw);
  return out;
}

/* the tensors of a safetensors file (kiln_load), by name */
typedef struct {
  int n;
  char **names;
  kiln_tensor **ts;
} ktest_file;

static inline bool ktest_file_load(ktest_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  int n = kiln_load(path, 0, NULL, NULL);
  if (n <= 0) {
    KTEST_FAIL("cannot read %s: %s", path, kiln_last_error());
    return false;
  }
  f->names = calloc((size_t)n, sizeof *f->names);
  f->ts = calloc((size_t)n, sizeof *f->ts);
  f->n = kiln_load(path, n, f->names, f->ts);
  return f->n == n;
}

static inline kiln_tensor *ktest_file_get(const ktest_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->names[i], name)) return f->ts[i];
  KTEST_FAIL("no tensor %s in the file", name);
  return NULL;
}

static inline void ktest_file_free(ktest_file *f) {
  for (int i = 0; i < f->n; i++) free(f->names[i]), kiln_release(f->ts[i]);
  free(f->names);
  free(f->ts);
}

/* checks t's shape and all values against `expect` (n values) within tol */
#define CHECK_TENSOR(t, ndim_, shape_, expect, tol)                                           \
  do {                                                                                        \
    kiln_tensor *t_ = (t);                                                                    \
    if (!t_) {                                                                                \
      KTEST_FAIL("%s is NULL: %s", #t, kiln_last_error());                                    \
      break;                                                                                  \
    }                                                                                         \
    const int64_t *es_ = (shape_);                                                            \
    int sh_ok_ = kiln_ndim(t_) == (ndim_);                                                    \
    for (int d_ = 0; sh_ok_ && d_ < (ndim_); d_++) sh_ok_ = kiln_shape(t_)[d_] == es_[d_];    \
    if (!sh_ok_) {                                                                            \
      KTEST_FAIL("%s has the wrong shape", #t);                                               \
      break;                                                                                  \
    }                                                                                         \
    double *v_ = ktest_values(t_);                                                            \
    const double *e_ = (expect);                                                              \
    for (int64_t i_ = 0; i_ < kiln_numel(t_); i_++) {                                         \
      double a_ = v_[i_], b_ = e_[i_];                                                        \
      int ok_ = (isnan(a_) && isnan(b_)) || a_ == b_ ||                                       \
                (isfinite(a_) && isfinite(b_) && fabs(a_ - b_) <= (tol)*fmax(1.0, fabs(b_))); \
      if (!ok_) {                                                                             \
        KTEST_FAIL("%s[%lld] = %.17g, expected %.17g", #t, (long long)i_, a_, b_);            \
        break;                                                                                \
      }                                                                                       \
    }                                                                                         \
    free(v_);                                                                                 \
  } while (0)

#endif /* KTEST_H */

/* digits.h — what the digits examples share (mlp_digits.c, cnn_digits.c):
 * error checks every Kiln call goes through, a scope of temporaries, a
 * deterministic PRNG for splits and shuffles, He initialization, and the
 * data set reader (data/digits.csv.gz: 64 pixels 0..16 and a label per
 * line).  Define
 * DIGITS_PROG (the program's name, for messages) before including it. */
#ifndef DIGITS_H
#define DIGITS_H

#include <errno.h>
#include <kiln.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

enum { PIXELS = 64, CLASSES = 10 };

/* ---- error checks: every Kiln call goes through one of these ----------------- */

static inline void die(int line, const char *what) {
  fprintf(stderr, "%s:%d: %s failed: %s\n", DIGITS_PROG, line, what, kiln_last_error());
  exit(2);
}
static inline kiln_tensor *ck_ptr(kiln_tensor *t, int line, const char *what) {
  if (!t) die(line, what);
  return t;
}
static inline int ck_int(int rc, int line, const char *what) {
  if (rc < 0) die(line, what);
  return rc;
}
static inline double ck_num(double v, int line, const char *what) {
  if (isnan(v)) die(line, what);
  return v;
}
#define CK(e) ck_ptr((e), __LINE__, #e)  /* a tensor: NULL is an error */
#define CKI(e) ck_int((e), __LINE__, #e) /* a status: negative is an error */
#define CKD(e) ck_num((e), __LINE__, #e) /* kiln_item: NAN is an error */

/* A scope of temporaries released together, so no tensor leaks. */
typedef struct {
  kiln_tensor *t[64];
  int n;
} scope;
static inline kiln_tensor *keep_(scope *s, kiln_tensor *t, int line, const char *what) {
  ck_ptr(t, line, what);
  if (s->n == (int)(sizeof s->t / sizeof s->t[0])) {
    fprintf(stderr, "%s:%d: scope full\n", DIGITS_PROG, line);
    exit(2);
  }
  return s->t[s->n++] = t;
}
#define KEEP(s, e) keep_((s), (e), __LINE__, #e)
static inline void scope_release(scope *s) {
  while (s->n > 0) kiln_release(s->t[--s->n]);
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a tiny deterministic PRNG (splitmix64) for the split and the shuffles ----- */

static uint64_t rng_state;
static inline uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline void shuffle(int64_t *a, int64_t n) { /* Fisher-Yates */
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1));
    int64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- data: 64 pixels (0..16) and a label per line ------------------------------- */

typedef struct {
  float *x;   /* n x 64, scaled to [0, 1] */
  int64_t *y; /* n */
  int64_t n;
} dataset;

static inline dataset load_digits(const char *path) {
  dataset d = {0};
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open %s: %s\n", DIGITS_PROG, path,
            strerror(errno ? errno : ENOENT));
    exit(2);
  }
  int64_t cap = 2048;
  d.x = malloc(sizeof *d.x * PIXELS * (size_t)cap);
  d.y = malloc(sizeof *d.y * (size_t)cap);
  char line[1024];
  int64_t lineno = 0;
  while (d.x && d.y && gzgets(f, line, sizeof line)) {
    lineno++;
    if (line[0] == '\n' || line[0] == '\0') continue;
    if (d.n == cap) {
      cap *= 2;
      float *nx = realloc(d.x, sizeof *d.x * PIXELS * (size_t)cap);
      int64_t *ny = realloc(d.y, sizeof *d.y * (size_t)cap);
      if (nx) d.x = nx;
      if (ny) d.y = ny;
      if (!nx || !ny) break;
    }
    const char *p = line;
    for (int k = 0; k <= PIXELS; k++) {
      char *end;
      long v = strtol(p, &end, 10);
      int sep_ok = k < PIXELS ? *end == ',' : (*end == '\n' || *end == '\r' || *end == '\0');
      if (end == p || !sep_ok || v < 0 || v > (k < PIXELS ? 16 : CLASSES - 1)) {
        fprintf(stderr, "%s: %s:%lld: expected 64 pixels 0..16 and a label 0..9\n", DIGITS_PROG,
                path, (long long)lineno);
        exit(2);
      }
      if (k < PIXELS)
        d.x[d.n * PIXELS + k] = (float)v / 16.0f;
      else
        d.y[d.n] = v;
      p = end + 1;
    }
    d.n++;
  }
  int err;
  const char *msg = gzerror(f, &err);
  if (!d.x || !d.y || (err != Z_OK && err != Z_STREAM_END)) {
    fprintf(stderr, "%s: reading %s: %s\n", DIGITS_PROG, path, d.x && d.y ? msg : "out of memory");
    exit(2);
  }
  gzclose(f);
  if (d.n < 10) {
    fprintf(stderr, "%s: %s: only %lld rows\n", DIGITS_PROG, path, (long long)d.n);
    exit(2);
  }
  return d;
}

/* rows idx[0..n) of d as Kiln tensors x [n,64] f32 and y [n] i64 */
static inline void to_tensors(const dataset *d, const int64_t *idx, int64_t n, kiln_tensor **x,
                              kiln_tensor **y) {
  float *xs = malloc(sizeof *xs * PIXELS * (size_t)n);
  int64_t *ys = malloc(sizeof *ys * (size_t)n);
  if (!xs || !ys) {
    fprintf(stderr, "%s: out of memory\n", DIGITS_PROG);
    exit(2);
  }
  for (int64_t i = 0; i < n; i++) {
    memcpy(xs + i * PIXELS, d->x + idx[i] * PIXELS, sizeof *xs * PIXELS);
    ys[i] = d->y[idx[i]];
  }
  *x = CK(kiln_from_data(xs, KILN_F32, 2, (int64_t[]){n, PIXELS}));
  *y = CK(kiln_from_data(ys, KILN_I64, 1, (int64_t[]){n}));
  free(xs);
  free(ys);
}

/* He-normal weights of the given shape (fan_in inputs per output) */
static inline kiln_tensor *he(int ndim, const int64_t *shape, int64_t fan_in) {
  kiln_tensor *r = CK(kiln_randn(KILN_F32, ndim, shape));
  kiln_tensor *w = CK(kiln_mul_scalar(r, sqrt(2.0 / (double)fan_in)));
  kiln_release(r);
  return w;
}

#endif

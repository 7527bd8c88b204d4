/* fused_ops.c — the GPU backend's fused plan kernels (jit_gpu/fuse.h)
 * without a GPU.  Built twice:
 *   - with FUSED_GEN (gpu_emu_gen_fused, at build time): runs the programs
 *     below with a CPU backend whose compiled path plans each group as a
 *     fused GPU kernel, and writes those kernels' CUDA C (fused_kernels.inc)
 *     and a table of their entries (fused_registry.inc);
 *   - as test_gpu_fused_emulated: runs the same programs on the plain
 *     (planned) interpreter, then with every elementwise group run by the
 *     real runner (gpu_fused_run) on host memory with its kernel under the
 *     CPU emulation of CUDA (emu.hpp), and compares the results: bit for
 *     bit, except f32/f64 transcendentals (CUDA's math library in place of
 *     Kiln's: 4 ulps f32, 1e-12 relative f64) and NaN payloads.  It also
 *     counts that the kernels ran (every program fuses at least one group)
 *     and that a program's second variant (other extents) needs no kernel
 *     its first did not: kernels are shape-generic.
 * The plans are the ones a CUDA trace would get (plans are device-neutral),
 * so this is what can be proven of the fused path here; scripts/gpu-check
 * runs the same kernels on a GPU (test_gpu_ops). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit_gpu/fuse.h"
#include "jit_gpu/nvrtc.h"
#include "kiln.h"
#include "trace/inspect.h"
#include "vm/backend.h"
#include "vm/state.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define MAX_OUT 6

/* --- inputs -------------------------------------------------------------------------- */

static uint64_t rs;
static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

/* deterministic values of dtype dt, specials (NaN, inf, -0, huge) among them */
static kiln_tensor *input(kiln_dtype dt, int nd, const int64_t *shape, uint64_t seed, bool special) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  rs = seed * 0x9E3779B97F4A7C15ull + 1;
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(rnd() >> 11) * 0x1p-53;
    v[i] = (u - 0.5) * 8;
    if (special && rnd() % 11 == 0) {
      static const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 3e9, -3e9, 1e30};
      v[i] = sp[rnd() % 8];
    }
  }
  void *buf = malloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
      case KILN_F32: ((float *)buf)[i] = (float)v[i]; break;
      case KILN_F64: ((double *)buf)[i] = v[i]; break;
      case KILN_I32: ((int32_t *)buf)[i] = (int32_t)(rnd() % 2001) - 1000 + (rnd() % 7 == 0 ? INT32_MAX - 3 : 0); break;
      case KILN_I64: ((int64_t *)buf)[i] = (int64_t)(rnd() % 2001) - 1000 + (rnd() % 7 == 0 ? INT64_MAX - 3 : 0); break;
      default: ((uint8_t *)buf)[i] = rnd() & 1; break;
    }
  }
  kiln_tensor *t = kiln_from_data(buf, dt, nd, shape);
  free(v);
  free(buf);
  return t;
}

/* --- programs: each makes its outputs from fresh inputs ------------------------------ */

typedef struct {
  kiln_tensor *out[MAX_OUT];
  int n;
  bool transcendental; /* compared within ulps */
} outs;

static void put(outs *o, kiln_tensor *t) { o->out[o->n++] = t; }

/* broadcasts (a row and a column bias), arithmetic, comparisons, where */
static void p_bias_relu(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(R, C), 1, true), *row = input(KILN_F32, 2, S(1, C), 2, true);
  kiln_tensor *col = input(KILN_F32, 2, S(R, 1), 3, false), *g = input(KILN_F32, 2, S(R, C), 4, true);
  kiln_tensor *h = kiln_add(kiln_mul(x, col), row);
  kiln_tensor *zero = kiln_full(0, KILN_F32, 0, NULL);
  kiln_tensor *r = kiln_where(kiln_le(h, zero), zero, h);
  put(o, r);
  put(o, kiln_where(kiln_gt(r, zero), g, zero));
  put(o, kiln_mul_scalar(kiln_sub(h, g), 0.25));
}

/* f64 with host scalars, division, maximum/minimum (NaN, -0), clamp */
static void p_f64_scalars(outs *o, int64_t n) {
  kiln_tensor *x = input(KILN_F64, 1, S(n), 5, true), *y = input(KILN_F64, 1, S(n), 6, true);
  kiln_tensor *a = kiln_div(kiln_mul_scalar(kiln_sub_scalar(x, 0.5), 3.0), y);
  put(o, a);
  put(o, kiln_maximum(x, y));
  put(o, kiln_minimum(kiln_neg(x), y));
  put(o, kiln_clamp(kiln_add(a, x), -2.5, 7.0));
  put(o, kiln_floor(kiln_add_scalar(kiln_abs(y), 0.5)));
}

/* integers wrap; comparisons give bools; casts saturate */
static void p_ints(outs *o, kiln_dtype dt, int64_t R, int64_t C) {
  kiln_tensor *a = input(dt, 2, S(R, C), 7, false), *b = input(dt, 2, S(1, C), 8, false);
  kiln_tensor *f = input(KILN_F32, 2, S(R, C), 9, true);
  kiln_tensor *s = kiln_add(kiln_mul(a, b), a);
  put(o, s);
  put(o, kiln_sub(kiln_neg(s), b));
  put(o, kiln_lt(s, b));
  put(o, kiln_where(kiln_ge(a, b), kiln_abs(a), kiln_sign(b)));
  put(o, kiln_add(kiln_cast(f, dt), a));
  put(o, kiln_cast(kiln_add(s, b), KILN_F64));
}

static void p_bools(outs *o, int64_t n) {
  kiln_tensor *a = input(KILN_BOOL, 1, S(n), 10, false), *b = input(KILN_BOOL, 1, S(n), 11, false);
  kiln_tensor *x = input(KILN_F32, 1, S(n), 12, true);
  kiln_tensor *c = kiln_logical_or(kiln_logical_and(a, kiln_logical_not(b)), kiln_ne(a, b));
  put(o, c);
  put(o, kiln_where(c, x, kiln_neg(x)));
  put(o, kiln_cast(c, KILN_F32));
  put(o, kiln_eq(kiln_cast(a, KILN_I32), kiln_cast(b, KILN_I32)));
}

/* views of leaves read through strides: a transpose, a slice, an expand */
static void p_views(outs *o, int64_t R, int64_t C) {
  kiln_tensor *x = input(KILN_F32, 2, S(C, R), 13, true), *y = input(KILN_F32, 2, S(R, 2 * C), 14, true);
  kiln_tensor *v = input(KILN_F32, 1, S(C), 15, false);
  kiln_tensor *xt = kiln_transpose(x, 0, 1);                     /* [R, C], strided */
  kiln_tensor *ys = kiln_slice(y, 1, 1, 2 * C, 2);               /* [R, C], step 2 */
  kiln_tensor *ve = kiln_expand(kiln_reshape(v, 2, S(1, C)), 2, S(R, C));
  put(o, kiln_add(kiln_mul(xt, ys), ve));
  put(o, kiln_sub(ys, xt));
}

/* transcendentals: compared within ulps */
static void p_math(outs *o, kiln_dtype dt, int64_t n) {
  kiln_tensor *x = input(dt, 1, S(n), 16, false);
  o->transcendental = true;
  put(o, kiln_exp(x));
  put(o, kiln_tanh(kiln_mul_scalar(x, 0.7)));
  put(o, kiln_sigmoid(x));
  put(o, kiln_log(kiln_add_scalar(kiln_abs(x), 1e-3)));
  put(o, kiln_sqrt(kiln_abs(x)));
}

/* 0-d values and an empty tensor */
static void p_small(outs *o) {
  kiln_tensor *a = input(KILN_F32, 0, NULL, 17, false), *b = input(KILN_F32, 0, NULL, 18, false);
  put(o, kiln_add(kiln_mul(a, b), kiln_mul_scalar(a, 2)));
  kiln_tensor *e = input(KILN_F32, 2, S(0, 5), 19, false);
  put(o, kiln_add_scalar(kiln_mul(e, e), 1));
}

/* a seeded random elementwise chain over three inputs (f32 or f64) */
static void p_random(outs *o, kiln_dtype dt, uint64_t seed) {
  int64_t R = 3 + (int64_t)(seed % 5), C = 5 + (int64_t)(seed % 7);
  kiln_tensor *pool[32];
  int np = 0;
  pool[np++] = input(dt, 2, S(R, C), seed * 3 + 100, true);
  pool[np++] = input(dt, 2, S(1, C), seed * 3 + 101, true);
  pool[np++] = input(dt, 2, S(R, 1), seed * 3 + 102, true);
  rs = seed * 7919 + 5;
  int steps = 4 + (int)(rnd() % 10);
  for (int s = 0; s < steps; s++) {
    kiln_tensor *a = pool[rnd() % (uint64_t)np], *b = pool[rnd() % (uint64_t)np], *r;
    switch (rnd() % 11) {
      case 0: r = kiln_add(a, b); break;
      case 1: r = kiln_sub(a, b); break;
      case 2: r = kiln_mul(a, b); break;
      case 3: r = kiln_div(a, b); break;
      case 4: r = kiln_maximum(a, b); break;
      case 5: r = kiln_minimum(a, b); break;
      case 6: r = kiln_neg(a); break;
      case 7: r = kiln_abs(a); break;
      case 8: r = kiln_where(kiln_gt(a, b), a, b); break;
      case 9: r = kiln_mul_scalar(a, 1.5); break;
      default: r = kiln_floor(a); break;
    }
    if (np < 32) pool[np++] = r;
  }
  put(o, pool[np - 1]);
  if (np > 4) put(o, pool[np - 2]);
}

typedef struct {
  const char *name;
  void (*run)(outs *o, int variant);
} program;

static void r_bias(outs *o, int v) { p_bias_relu(o, v ? 33 : 8, v ? 70 : 16); }
static void r_f64(outs *o, int v) { p_f64_scalars(o, v ? 1000 : 37); }
static void r_i32(outs *o, int v) { p_ints(o, KILN_I32, v ? 9 : 4, v ? 40 : 5); }
static void r_i64(outs *o, int v) { p_ints(o, KILN_I64, v ? 9 : 4, v ? 40 : 5); }
static void r_bool(outs *o, int v) { p_bools(o, v ? 600 : 9); }
static void r_views(outs *o, int v) { p_views(o, v ? 17 : 3, v ? 9 : 4); }
static void r_math32(outs *o, int v) { p_math(o, KILN_F32, v ? 700 : 9); }
static void r_math64(outs *o, int v) { p_math(o, KILN_F64, v ? 700 : 9); }
static void r_small(outs *o, int v) { (void)v; p_small(o); }
static void r_rand32(outs *o, int v) { p_random(o, KILN_F32, (uint64_t)v); }
static void r_rand64(outs *o, int v) { p_random(o, KILN_F64, (uint64_t)v + 1000); }

static const program programs[] = {
    {"bias_relu", r_bias}, {"f64_scalars", r_f64}, {"int32", r_i32},     {"int64", r_i64},
    {"bools", r_bool},     {"views", r_views},     {"math_f32", r_math32}, {"math_f64", r_math64},
    {"small", r_small},
};
#define NPROG (int)(sizeof programs / sizeof programs[0])
#define NRANDOM 24

/* --- the backend: the CPU's, with fused GPU kernels as its compiled path ------------- */

static vm_backend emu_backend;
static bool fusing;
#ifndef FUSED_GEN
static long fused_launches;
#endif
/* the kernel names the current run planned (shape-generic kernels: a
   program's second variant, other extents, must need no new one) */
static char run_names[256][40];
static int nrun_names;

typedef struct {
  int n;
  gpu_fused *k;
} fused_plan;

#ifdef FUSED_GEN
typedef struct {
  char name[40];
} seen_name;
static seen_name seen[4096];
static int nseen;
static FILE *kernels_out, *registry_out;

static void collect(const gpu_fused *k) {
  for (int i = 0; i < nseen; i++)
    if (!strcmp(seen[i].name, k->name)) return;
  if (nseen == 4096) return;
  snprintf(seen[nseen++].name, sizeof seen[0].name, "%s", k->name);
  /* the layout static_asserts use EDG's __INTADDR__, which g++ lacks */
  for (const char *line = k->src; *line;) {
    const char *e = strchr(line, '\n');
    size_t len = e ? (size_t)(e - line + 1) : strlen(line);
    if (strncmp(line, "static_assert(", 14)) fwrite(line, 1, len, kernels_out);
    line += len;
  }
  fprintf(registry_out, "{\"%s\", %s},\n", k->name, k->name);
}
#else
int emu_launch(const char *name, const void *args, unsigned grid, unsigned block);
/* every distinct kernel's whole source (its layout asserts included), for
   NVRTC */
static char *all_src;
static size_t all_len;
static char all_names[1024][40];
static int nall;

static void keep_source(const gpu_fused *k) {
  for (int i = 0; i < nall; i++)
    if (!strcmp(all_names[i], k->name)) return;
  if (nall == 1024) return;
  snprintf(all_names[nall++], sizeof all_names[0], "%s", k->name);
  size_t n = strlen(k->src);
  char *g = realloc(all_src, all_len + n + 1);
  if (!g) return;
  all_src = g;
  memcpy(all_src + all_len, k->src, n + 1);
  all_len += n;
}
#endif

static bool emu_jit_enabled(void) { return fusing; }
static double emu_cost_ms(int nodes) {
  (void)nodes;
  return 0;
}

static void emu_plan_free(void *p) {
  fused_plan *f = p;
  if (!f) return;
  for (int g = 0; g < f->n; g++) free(f->k[g].src);
  free(f->k);
  free(f);
}

static void emu_compile(tr_plan *plan, const tr_trace *t) {
  fused_plan *f = calloc(1, sizeof *f);
  f->n = plan->ngroups;
  f->k = calloc((size_t)(f->n ? f->n : 1), sizeof *f->k);
  for (int g = 0; g < f->n; g++) {
    if (!gpu_fuse_group(plan, g, t, &f->k[g])) continue;
    if (nrun_names < 256) snprintf(run_names[nrun_names++], sizeof run_names[0], "%s", f->k[g].name);
#ifdef FUSED_GEN
    collect(&f->k[g]);
#else
    keep_source(&f->k[g]);
    f->k[g].fn = (void *)1; /* launched by name */
#endif
    free(f->k[g].src);
    f->k[g].src = NULL;
  }
  void *none = NULL;
  if (!atomic_compare_exchange_strong(&plan->jit, &none, f)) emu_plan_free(f);
}

static void emu_wait(void) {}

static bool emu_has_kernel(const void *compiled, int g) {
  const fused_plan *f = compiled;
  return g < f->n && f->k[g].fn;
}

#ifndef FUSED_GEN
static vm_tensor *host_alloc(kiln_dtype dt, int ndim, const int64_t *shape) {
  return vm_tensor_new(dt, ndim, shape);
}

static bool emu_launch_fused(const gpu_fused *k, const gpu_fargs *args, unsigned grid, unsigned block) {
  /* the emulation runs every block in turn: a smaller grid (the kernel
     loops over the rest) keeps it quick */
  if (grid > 4) grid = 4;
  if (!emu_launch(k->name, args, grid, block)) {
    vm_error(KILN_ERR_INTERNAL, "no emulated kernel %s (not generated at build time)", k->name);
    return false;
  }
  fused_launches++;
  return true;
}

static const gpu_fuse_target host_target = {KILN_CPU, host_alloc, emu_launch_fused};
#endif

static bool emu_group(const void *compiled, const tr_plan *plan, const tr_trace *t, int g, vm_tensor **vals,
                      int *rc, int *resume, int *last_group) {
#ifdef FUSED_GEN
  (void)compiled, (void)plan, (void)t, (void)g, (void)vals, (void)rc, (void)resume, (void)last_group;
  return false;
#else
  const fused_plan *f = compiled;
  if (!emu_has_kernel(f, g) || !gpu_fused_run(&f->k[g], &host_target, plan, t, vals, rc)) return false;
  *resume = f->k[g].last + 1;
  *last_group = g;
  return true;
#endif
}

static void install_backend(void) {
  emu_backend = *vm_backend_of(KILN_CPU);
  emu_backend.jit_enabled = emu_jit_enabled;
  emu_backend.compile_cost_ms = emu_cost_ms;
  emu_backend.compile = emu_compile;
  emu_backend.compile_wait = emu_wait;
  emu_backend.plan_free = emu_plan_free;
  emu_backend.has_kernel = emu_has_kernel;
  emu_backend.run_group = emu_group;
  vm_backend_register(&emu_backend);
}

/* --- running and comparing ------------------------------------------------------------ */

typedef struct {
  kiln_dtype dt[MAX_OUT];
  int64_t n[MAX_OUT];
  void *data[MAX_OUT];
  int count;
} results;

/* the program three times (the third runs its plan), the last results kept */
static void run_program(void (*run)(outs *, int), int variant, results *res) {
  for (int rep = 0; rep < 3; rep++) {
    outs o = {.n = 0};
    run(&o, variant);
    kiln_eval(o.n, o.out);
    for (int i = 0; i < o.n; i++) {
      if (rep == 2) {
        res->dt[i] = kiln_dtype_of(o.out[i]);
        res->n[i] = kiln_numel(o.out[i]);
        size_t bytes = (size_t)res->n[i] * (res->dt[i] == KILN_BOOL ? 1 : res->dt[i] == KILN_F32 || res->dt[i] == KILN_I32 ? 4 : 8);
        res->data[i] = malloc(bytes ? bytes : 1);
        if (kiln_to_buffer(o.out[i], res->data[i], bytes) != KILN_OK)
          fprintf(stderr, "read failed: %s\n", kiln_last_error());
      }
      kiln_release(o.out[i]);
    }
    if (rep == 2) res->count = o.n;
  }
}

#ifdef FUSED_GEN
int main(void) {
  install_backend();
  fusing = true;
  kernels_out = fopen("fused_kernels.inc", "w");
  registry_out = fopen("fused_registry.inc", "w");
  if (!kernels_out || !registry_out) return 1;
  for (int p = 0; p < NPROG; p++)
    for (int v = 0; v < 2; v++) {
      results r = {.count = 0};
      run_program(programs[p].run, v, &r);
      for (int i = 0; i < r.count; i++) free(r.data[i]);
    }
  for (int s = 0; s < NRANDOM; s++) {
    results r = {.count = 0};
    run_program(s % 2 ? r_rand64 : r_rand32, s, &r);
    for (int i = 0; i < r.count; i++) free(r.data[i]);
  }
  fclose(kernels_out);
  fclose(registry_out);
  printf("%d fused kernels\n", nseen);
  return 0;
}
#else
static int fails, checks;

static double ulps_f32(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return fabs((double)ia - (double)ib);
}

static bool same(kiln_dtype dt, const void *a, const void *b, int64_t i, bool approx) {
  switch (dt) {
    case KILN_F32: {
      float x = ((const float *)a)[i], y = ((const float *)b)[i];
      if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
      if (!approx) return !memcmp(&x, &y, 4);
      return x == y || ulps_f32(x, y) <= 4;
    }
    case KILN_F64: {
      double x = ((const double *)a)[i], y = ((const double *)b)[i];
      if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
      if (!approx) return !memcmp(&x, &y, 8);
      return x == y || fabs(x - y) <= 1e-12 * fabs(y);
    }
    case KILN_I32: return ((const int32_t *)a)[i] == ((const int32_t *)b)[i];
    case KILN_I64: return ((const int64_t *)a)[i] == ((const int64_t *)b)[i];
    default: return ((const uint8_t *)a)[i] == ((const uint8_t *)b)[i];
  }
}

static char first_names[256][40];
static int nfirst_names;

static void check_program(const char *name, void (*run)(outs *, int), int variant, bool same_kernels) {
  results ref = {.count = 0}, got = {.count = 0};
  fusing = false;
  tr_cache_reset();
  run_program(run, variant, &ref);
  fusing = true;
  tr_cache_reset();
  long before = fused_launches;
  nrun_names = 0;
  run_program(run, variant, &got);
  if (!same_kernels) { /* the first variant: remember its kernels */
    memcpy(first_names, run_names, sizeof run_names);
    nfirst_names = nrun_names;
  } else { /* other extents, the same kernels */
    for (int i = 0; i < nrun_names; i++) {
      bool known = false;
      for (int j = 0; j < nfirst_names && !known; j++) known = !strcmp(run_names[i], first_names[j]);
      if (!known) {
        printf("%s/%d: kernel %s is new: other extents must reuse the first variant's kernels\n", name,
               variant, run_names[i]);
        fails++;
        break;
      }
    }
  }
  outs probe = {.n = 0};
  run(&probe, variant); /* only to learn whether it is transcendental */
  for (int i = 0; i < probe.n; i++) kiln_release(probe.out[i]);
  checks++;
  bool ok = ref.count == got.count && ref.count > 0;
  if (fused_launches == before) {
    printf("%s/%d: no fused kernel ran\n", name, variant);
    ok = false;
  }
  for (int o = 0; ok && o < ref.count; o++) {
    if (ref.dt[o] != got.dt[o] || ref.n[o] != got.n[o]) {
      ok = false;
      break;
    }
    for (int64_t i = 0; i < ref.n[o]; i++)
      if (!same(ref.dt[o], got.data[o], ref.data[o], i, probe.transcendental)) {
        printf("%s/%d: output %d differs at %lld\n", name, variant, o, (long long)i);
        ok = false;
        break;
      }
  }
  if (!ok) fails++;
  for (int i = 0; i < ref.count; i++) free(ref.data[i]);
  for (int i = 0; i < got.count; i++) free(got.data[i]);
}

int main(void) {
  install_backend();
  for (int p = 0; p < NPROG; p++)
    for (int v = 0; v < 2; v++) check_program(programs[p].name, programs[p].run, v, v == 1);
  for (int s = 0; s < NRANDOM; s++)
    check_program(s % 2 ? "random_f64" : "random_f32", s % 2 ? r_rand64 : r_rand32, s, false);
  printf("%ld fused launches, %d distinct kernels\n", fused_launches, nall);
  /* the same sources through NVRTC, as one program (each holds the
     guarded prelude; entry names are unique): sm_90 cubins */
  char why[256];
  checks++;
  if (!gpu_nvrtc_available(why, sizeof why)) {
    printf("NVRTC compile of the fused kernels skipped: %s\n", why);
  } else if (!nall) {
    printf("no fused kernel source was kept\n");
    fails++;
  } else {
    gpu_image img = {0};
    char *log = NULL;
    if (!gpu_nvrtc_compile(all_src, "fused_ops", 90, &img, &log)) {
      printf("NVRTC rejected the fused kernels:\n%s\n", log ? log : "(no log)");
      fails++;
    } else {
      printf("NVRTC compiled %d fused kernels for sm_90 (%zu bytes of cubin)\n", nall, img.size);
    }
    free(log);
    gpu_image_free(&img);
  }
  free(all_src);
  printf("%d passed, %d failed\n", checks - fails, fails);
  return fails ? 1 : 0;
}
#endif

/* test_trace.c — the trace recorder: canonical keys, the trace cache, what a
 * flush materializes, stores, the plan passes, the plan/interpreter agreement,
 * the recompile budget, stats and dumps (DESIGN §3-§5, §8).
 *
 * Modes (the binary re-executes itself):
 *   test_trace          every test below; runs "passes" in a child process
 *   test_trace key      runs one fixed program and prints its flush key (hex)
 *   test_trace passes   the pass tests, with KILN_HOT=1 and KILN_INSPECT_IR=1
 *                       (KILN_HOT is read once per process, and the other
 *                       tests need the default of 2: cold first sighting,
 *                       planned second sighting) */
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../trace/inspect.h"
#include "ktest.h"

/* --- helpers ------------------------------------------------------------------ */

static tr_flush_info last_flush(void) {
  tr_flush_info info;
  memset(&info, 0, sizeof info);
  if (!tr_last_flush(&info)) KTEST_FAIL("tr_last_flush: no flush recorded");
  return info;
}

static bool same_key(const tr_flush_info *a, const tr_flush_info *b) {
  return a->key[0] == b->key[0] && a->key[1] == b->key[1];
}

/* families are compared on flushes that made a trace hot (the budget is
   consulted there); a zero family would make the comparison vacuous */
static bool same_family(const tr_flush_info *a, const tr_flush_info *b) {
  if (!(a->family[0] | a->family[1]) || !(b->family[0] | b->family[1]))
    KTEST_FAIL("a family of 0 (sightings %llu and %llu)", (unsigned long long)a->sightings,
               (unsigned long long)b->sightings);
  return a->family[0] == b->family[0] && a->family[1] == b->family[1];
}

static void key_hex(const tr_flush_info *i, char out[33]) { /* hi then lo, as dumps name it */
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)i->key[1], (unsigned long long)i->key[0]);
}

static kiln_stats stats_now(void) {
  kiln_stats s;
  kiln_get_stats(&s);
  return s;
}

static kiln_tensor *f32_tensor(const float *v, int ndim, const int64_t *shape) {
  return kiln_from_data(v, KILN_F32, ndim, shape);
}

static void read_f32(kiln_tensor *t, float *dst, int64_t n) {
  int rc = kiln_to_buffer(t, dst, (size_t)n * sizeof(float));
  if (rc != KILN_OK) KTEST_FAIL("kiln_to_buffer: %d (%s)", rc, kiln_last_error());
}

static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void fill_pattern(float *v, int n, float scale, float shift) {
  for (int i = 0; i < n; i++) v[i] = (float)((i * 7) % 11) * scale + shift;
}

/* --- keys ---------------------------------------------------------------------- */

enum {
  V_BASE,
  V_SHAPE,  /* [4,9] instead of [4,8] */
  V_DTYPE,  /* f64 */
  V_LAYOUT, /* the input is a materialized transposed view of an [8,4] tensor */
  V_BRANCH, /* tanh instead of exp */
  V_SCALAR, /* kiln_mul_scalar(x, 0.7) instead of 0.5 */
  V_HELD,   /* e is also read by a pending node outside the flush */
  V_STORE,  /* a pending store of e */
  V_COUNT
};

/* s = sum(exp(x * 0.5) + 1.5, axis 1) on x[4,8], read with kiln_to_buffer.
   Returns the flush info; checks the values. */
static tr_flush_info key_program(int variant) {
  int64_t cols = variant == V_SHAPE ? 9 : 8;
  int64_t shape[2] = {4, cols};
  float xs[36];
  fill_pattern(xs, 36, 0.25f, -1.0f);
  kiln_tensor *x;
  if (variant == V_DTYPE) {
    double xd[32];
    for (int i = 0; i < 32; i++) xd[i] = xs[i];
    x = kiln_from_data(xd, KILN_F64, 2, shape);
  } else if (variant == V_LAYOUT) {
    float xt[32]; /* xt[c][r] = xs[r][c], so the transposed view holds xs */
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 8; c++) xt[c * 4 + r] = xs[r * 8 + c];
    kiln_tensor *base = f32_tensor(xt, 2, (int64_t[]){8, 4});
    x = kiln_transpose(base, 0, 1);
    kiln_release(base);
    CHECK(kiln_sync() == KILN_OK); /* x is now a materialized strided view */
  } else {
    x = f32_tensor(xs, 2, shape);
  }
  double scalar = variant == V_SCALAR ? 0.7 : 0.5;
  kiln_tensor *m = kiln_mul_scalar(x, scalar);
  kiln_tensor *e = variant == V_BRANCH ? kiln_tanh(m) : kiln_exp(m);
  kiln_tensor *a = kiln_add_scalar(e, 1.5);
  kiln_tensor *s = kiln_sum(a, 1, (int[]){1}, false);
  kiln_tensor *held = NULL, *w = NULL;
  if (variant == V_HELD) held = kiln_mul_scalar(e, 2.0);
  if (variant == V_STORE) { /* a materialized tensor, rebound to e */
    float zeros[32] = {0};
    w = f32_tensor(zeros, 2, shape);
    CHECK(kiln_assign(w, e) == KILN_OK);
  }
  double got[4];
  if (variant == V_DTYPE) {
    CHECK(kiln_to_buffer(s, got, sizeof got) == KILN_OK);
  } else {
    float g[4];
    read_f32(s, g, 4);
    for (int i = 0; i < 4; i++) got[i] = g[i];
  }
  tr_flush_info info = last_flush();
  for (int r = 0; r < 4; r++) {
    double ref = 0;
    for (int c = 0; c < cols; c++) {
      double v = variant == V_SHAPE ? xs[r * cols + c] : xs[r * 8 + c];
      ref += (variant == V_BRANCH ? tanh(v * scalar) : exp(v * scalar)) + 1.5;
    }
    CHECK_CLOSE(got[r], ref, 1e-5);
  }
  kiln_stats before = stats_now();
  if (held) { /* e was not kept: this flush computes it a second time, and keeps it */
    float h[32];
    read_f32(held, h, 32);
    for (int i = 0; i < 32; i++) CHECK_CLOSE(h[i], 2 * exp(xs[i] * 0.5), 1e-5);
    CHECK_EQ_INT(stats_now().flushes - before.flushes, 1);
    tr_flush_info again = last_flush();
    CHECK_EQ_INT(again.outputs, 2); /* held, and e itself (computed before) */
  }
  if (w) { /* the store was materialized by the same flush */
    float wv[32];
    read_f32(w, wv, 32);
    for (int i = 0; i < 32; i++) CHECK_CLOSE(wv[i], exp(xs[i] * 0.5), 1e-6);
    CHECK_EQ_INT(stats_now().flushes - before.flushes, 0);
  }
  kiln_release(held);
  kiln_release(w);
  kiln_release(s);
  kiln_release(a);
  kiln_release(e);
  kiln_release(m);
  kiln_release(x);
  return info;
}

TEST(key_same_program_same_key) {
  tr_flush_info a = key_program(V_BASE), b = key_program(V_BASE);
  CHECK(same_key(&a, &b));
  CHECK(a.key[0] != 0 || a.key[1] != 0);
  CHECK_EQ_INT(a.outputs, 1);
  CHECK(!strcmp(a.reason, "read"));
}

/* this test binary's path (for children running it), false if unknown */
static bool self_path(char *self, size_t cap) {
  ssize_t len = readlink("/proc/self/exe", self, cap - 1);
  if (len <= 0) return false;
  self[len] = 0;
  return true;
}

TEST(key_same_across_processes) {
  tr_flush_info here = key_program(V_BASE);
  char mine[33], theirs[64];
  key_hex(&here, mine);
  CHECK(ktest_run_self("", "key", theirs, sizeof theirs));
  theirs[strcspn(theirs, "\n")] = 0;
  if (strcmp(mine, theirs)) KTEST_FAIL("key here %s, in a fresh process %s", mine, theirs);
}

/* nl leaves summed: separate [1, 8] tensors, but for leaves 1 and nl - 1,
   rows 0 and 1 of one materialized [2, 8] tensor (shared) or of two */
static tr_flush_info leaves_program(int nl, bool shared) {
  float v[16];
  fill_pattern(v, 16, 0.5f, 0.25f);
  kiln_tensor *base[2] = {f32_tensor(v, 2, (int64_t[]){2, 8}), NULL};
  base[1] = shared ? kiln_retain(base[0]) : f32_tensor(v, 2, (int64_t[]){2, 8});
  kiln_tensor *row[2] = {kiln_slice(base[0], 0, 0, 1, 1), kiln_slice(base[1], 0, 1, 2, 1)};
  CHECK(kiln_sync() == KILN_OK); /* the rows are materialized views now */
  kiln_tensor *total = NULL;
  for (int i = 0; i < nl; i++) {
    kiln_tensor *leaf = i == 1        ? kiln_retain(row[0])
                        : i == nl - 1 ? kiln_retain(row[1])
                                      : f32_tensor(v, 2, (int64_t[]){1, 8});
    kiln_tensor *next = total ? kiln_add(total, leaf) : kiln_retain(leaf);
    kiln_release(total);
    kiln_release(leaf);
    total = next;
  }
  float got[8];
  read_f32(total, got, 8);
  CHECK_CLOSE(got[0], (nl - 2) * v[0] + v[0] + v[8], 1e-4);
  tr_flush_info info = last_flush();
  kiln_release(total);
  for (int i = 0; i < 2; i++) kiln_release(row[i]), kiln_release(base[i]);
  return info;
}

/* two leaves over one storage key differently from two storages (a plan
   may write one in place), with few leaves and with many (looked up) */
TEST(key_sees_leaves_that_share_storage) {
  const int counts[2] = {4, 40};
  for (int c = 0; c < 2; c++) {
    tr_flush_info a = leaves_program(counts[c], true), b = leaves_program(counts[c], true),
                  sep = leaves_program(counts[c], false);
    if (!same_key(&a, &b)) KTEST_FAIL("%d leaves: the same program keyed twice", counts[c]);
    if (same_key(&a, &sep))
      KTEST_FAIL("%d leaves: shared and separate storages have one key", counts[c]);
  }
}

TEST(key_changes_with_structure_not_scalars) {
  tr_flush_info info[V_COUNT];
  for (int v = 0; v < V_COUNT; v++) info[v] = key_program(v);
  const char *names[V_COUNT] = {"base",   "shape",  "dtype", "layout",
                                "branch", "scalar", "held",  "store"};
  for (int v = 1; v < V_COUNT; v++) {
    /* a pending reader outside the flush (held) changes nothing: which
       handles are alive never changes the outputs or the key */
    bool expect_same = v == V_SCALAR || v == V_HELD;
    if (same_key(&info[0], &info[v]) != expect_same)
      KTEST_FAIL("variant %s: key %s the base key", names[v],
                 expect_same ? "differs from" : "equals");
  }
  /* the family erases extents only: compared on second sightings (hot;
     each in a cache of its own, where no family is hot before) */
  tr_flush_info fam[V_COUNT];
  const int fv[4] = {V_BASE, V_SHAPE, V_DTYPE, V_BRANCH};
  for (int k = 0; k < 4; k++) {
    tr_cache_reset();
    key_program(fv[k]);
    fam[fv[k]] = key_program(fv[k]);
    CHECK_EQ_INT(fam[fv[k]].sightings, 2);
  }
  CHECK(same_family(&fam[V_BASE], &fam[V_SHAPE]));
  CHECK(!same_family(&fam[V_BASE], &fam[V_DTYPE]));
  CHECK(!same_family(&fam[V_BASE], &fam[V_BRANCH]));
  /* same nodes, same outputs; a store is one more output */
  CHECK_EQ_INT(info[V_HELD].nodes, info[V_BASE].nodes);
  CHECK_EQ_INT(info[V_HELD].outputs, 1);
  CHECK_EQ_INT(info[V_STORE].nodes, info[V_BASE].nodes);
  CHECK_EQ_INT(info[V_STORE].outputs, 2);
  CHECK_EQ_INT(info[V_LAYOUT].nodes, info[V_BASE].nodes);
}

/* y = x * full(v): the value of kiln_full is a runtime parameter */
static tr_flush_info full_program(double v, float *out) {
  float xs[6] = {1, 2, 3, -4, 5.5f, 0.25f};
  int64_t shape[1] = {6};
  kiln_tensor *x = f32_tensor(xs, 1, shape);
  kiln_tensor *f = kiln_full(v, KILN_F32, 1, shape);
  kiln_tensor *y = kiln_mul(x, f);
  read_f32(y, out, 6);
  tr_flush_info info = last_flush();
  for (int i = 0; i < 6; i++) CHECK(out[i] == xs[i] * (float)v);
  kiln_release(y);
  kiln_release(f);
  kiln_release(x);
  return info;
}

TEST(key_ignores_host_scalar_values) {
  float out[6];
  /* three sightings: cold, planned now, cached plan — each with its own value */
  tr_flush_info a = full_program(2.0, out), b = full_program(3.0, out), c = full_program(-7.5, out);
  CHECK(same_key(&a, &b));
  CHECK(same_key(&a, &c));
  CHECK(b.planned && c.planned && !c.new_key);
  /* kiln_mul_scalar: 0.5, 0.7, 0.9 share a key and each gives its own result */
  tr_flush_info k[3];
  const double sc[3] = {0.5, 0.7, 0.9};
  for (int r = 0; r < 3; r++) {
    float xs[5] = {1, -2, 3, 4.5f, 100};
    kiln_tensor *x = f32_tensor(xs, 1, (int64_t[]){5});
    kiln_tensor *y = kiln_mul_scalar(x, sc[r]);
    float got[5];
    read_f32(y, got, 5);
    k[r] = last_flush();
    for (int i = 0; i < 5; i++) CHECK(got[i] == xs[i] * (float)sc[r]);
    kiln_release(y);
    kiln_release(x);
  }
  CHECK(same_key(&k[0], &k[1]) && same_key(&k[0], &k[2]));
  CHECK(k[2].planned);
  /* not even 0, 1, -1 or -0 specialize a key (DESIGN §4): a schedule that
     passes them compiles nothing new, and each gives its own result */
  const double special[5] = {0.0, 1.0, -1.0, -0.0, 2.0};
  const char *ops[3] = {"mul", "add", "clamp"};
  for (int op = 0; op < 3; op++) {
    tr_flush_info first = {0};
    for (int r = 0; r < 5; r++) {
      float xs[5] = {1, -2, 3, 4.5f, -0.5f}, got[5];
      kiln_tensor *x = f32_tensor(xs, 1, (int64_t[]){5});
      double v = special[r];
      kiln_tensor *y = op == 0   ? kiln_mul_scalar(x, v)
                       : op == 1 ? kiln_add_scalar(x, v)
                                 : kiln_clamp(x, v - 1, v);
      read_f32(y, got, 5);
      tr_flush_info info = last_flush();
      if (r == 0)
        first = info;
      else if (!same_key(&first, &info))
        KTEST_FAIL("%s by %g: a key of its own", ops[op], v);
      for (int i = 0; i < 5; i++) {
        float want = op == 0   ? xs[i] * (float)v
                     : op == 1 ? xs[i] + (float)v
                               : fminf(fmaxf(xs[i], (float)(v - 1)), (float)v);
        if (memcmp(&got[i], &want, sizeof want))
          KTEST_FAIL("%s by %g: element %d is %g, expected %g", ops[op], v, i, got[i], want);
      }
      kiln_release(y);
      kiln_release(x);
    }
  }
}

/* 200 steps of least squares with a host read each step.  The gradient is
   recorded before the read (as a backward pass would be), so the update's
   depth must not grow from step to step: no depth cuts, one key per step. */
TEST(training_loop_keys_are_bounded) {
  enum { N = 16, STEPS = 200 };
  float w0[N], xs[N], ys[N];
  for (int i = 0; i < N; i++) {
    w0[i] = 0.1f * (float)(i % 5);
    xs[i] = 0.05f * (float)(i + 1);
    ys[i] = 0.3f * xs[i] + 0.2f * (float)(i % 3);
  }
  int64_t shape[1] = {N};
  kiln_tensor *w = f32_tensor(w0, 1, shape), *x = f32_tensor(xs, 1, shape),
              *y = f32_tensor(ys, 1, shape);
  float rw[N]; /* float reference of the same ops */
  memcpy(rw, w0, sizeof rw);
  const double lr = 0.3;
  kiln_stats s0 = stats_now(), s10 = s0;
  int new_after_warmup = 0, unplanned_after_warmup = 0;
  for (int it = 0; it < STEPS; it++) {
    if (it == 10) s10 = stats_now();
    kiln_tensor *wx = kiln_mul(w, x);
    kiln_tensor *diff = kiln_sub(wx, y);
    kiln_tensor *sq = kiln_mul(diff, diff);
    kiln_tensor *loss = kiln_sum(sq, 0, NULL, false);
    kiln_tensor *dx = kiln_mul(diff, x);
    kiln_tensor *g = kiln_mul_scalar(dx, 2.0);
    double l = kiln_item(loss);
    tr_flush_info info = last_flush();
    CHECK(kiln_sub_scaled_(w, g, lr) == KILN_OK);
    /* reference */
    double rl = 0;
    float rg[N];
    for (int i = 0; i < N; i++) {
      volatile float t = rw[i] * xs[i];
      volatile float df = t - ys[i];
      volatile float sqv = df * df;
      rl += sqv;
      volatile float dxv = df * xs[i];
      rg[i] = dxv * 2.0f;
    }
    for (int i = 0; i < N; i++) {
      volatile float step = rg[i] * (float)lr;
      rw[i] = rw[i] - step;
    }
    CHECK_CLOSE(l, rl, 1e-5);
    if (it >= 6) { /* learning which values to keep settles by then */
      new_after_warmup += info.new_key;
      unplanned_after_warmup += !info.planned;
    }
    kiln_release(g);
    kiln_release(dx);
    kiln_release(loss);
    kiln_release(sq);
    kiln_release(diff);
    kiln_release(wx);
  }
  kiln_stats s1 = stats_now();
  float wv[N];
  read_f32(w, wv, N);
  for (int i = 0; i < N; i++) CHECK_CLOSE(wv[i], rw[i], 1e-6);
  CHECK_EQ_INT(new_after_warmup, 0);
  CHECK_EQ_INT(unplanned_after_warmup, 0);
  CHECK(s1.traces_seen - s0.traces_seen <= 3);
  CHECK_EQ_INT(s1.flushes - s0.flushes, STEPS);
  CHECK_EQ_INT(s1.cache_misses - s10.cache_misses, 0);
  CHECK_EQ_INT(s1.cache_hits - s10.cache_hits, STEPS - 10);
  kiln_release(w);
  kiln_release(x);
  kiln_release(y);
}

/* x = x*0.99 + 0.01, 10000 times, one read at the end: with KILN_LOOPS=0
   cut at depth 256; with loops rolled at 4096 deep or 4096 nodes, which
   ever comes first (trace/record.c), the same cap on every thread */
static void depth_cap_cuts(bool rolled) {
  enum { N = 8, STEPS = 10000 };
  float xs[N], ref[N], got[N];
  for (int i = 0; i < N; i++) ref[i] = xs[i] = (float)i * 3.0f - 7.0f;
  kiln_tensor *x = f32_tensor(xs, 1, (int64_t[]){N});
  kiln_stats s0 = stats_now();
  for (int it = 0; it < STEPS; it++) {
    kiln_tensor *m = kiln_mul_scalar(x, 0.99);
    kiln_tensor *nx = kiln_add_scalar(m, 0.01);
    kiln_release(m);
    kiln_release(x);
    x = nx;
  }
  kiln_stats s1 = stats_now();
  read_f32(x, got, N);
  kiln_stats s2 = stats_now();
  tr_flush_info fin = last_flush();
  CHECK(!strcmp(fin.reason, "read"));
  for (int it = 0; it < STEPS; it++)
    for (int i = 0; i < N; i++) {
      volatile float t = ref[i] * 0.99f;
      ref[i] = t + 0.01f;
    }
  for (int i = 0; i < N; i++)
    if (got[i] != ref[i]) KTEST_FAIL("x[%d] = %.9g, float reference %.9g", i, got[i], ref[i]);
  int cap_flushes = (int)(s1.flushes - s0.flushes);
  if (!rolled) { /* 2 levels of depth per step, 256 per trace: ~78 cuts */
    if (cap_flushes < 70 || cap_flushes > 90) KTEST_FAIL("%d depth flushes", cap_flushes);
  } else if (cap_flushes < 4 || cap_flushes > 12) { /* 2 nodes a step, 4096 a trace: ~5-10 */
    KTEST_FAIL("%d cap flushes with loops rolled", cap_flushes);
  }
  CHECK_EQ_INT(s2.flushes - s1.flushes, 1);
  CHECK(s2.traces_seen - s0.traces_seen <= 4);
  CHECK(s2.cache_hits - s0.cache_hits >= (uint64_t)cap_flushes - 4);
  kiln_release(x);
}

TEST(depth_cap_cuts_a_repeating_pattern) {
  setenv("KILN_LOOPS", "0", 1);
  depth_cap_cuts(false);
  unsetenv("KILN_LOOPS");
  depth_cap_cuts(true);
}

/* --- what a flush materializes ---------------------------------------------------------- */

/* e = exp(x); s = sum(e * 2); the handle of e is released early or kept */
TEST(held_intermediate_changes_nothing) {
  float xs[10];
  fill_pattern(xs, 10, 0.3f, -1.5f);
  int64_t shape[1] = {10};
  double ref = 0;
  for (int i = 0; i < 10; i++) ref += 2 * exp((double)xs[i]);
  tr_flush_info info[2];
  float got[2];
  kiln_tensor *kept = NULL, *extra = NULL;
  for (int hold = 0; hold < 2; hold++) {
    kiln_tensor *x = f32_tensor(xs, 1, shape);
    kiln_tensor *e = kiln_exp(x);
    kiln_tensor *t = kiln_mul_scalar(e, 2.0);
    kiln_tensor *s = kiln_sum(t, 0, NULL, false);
    kiln_release(t);
    if (hold) {
      kept = e;
      extra = kiln_retain(e);
    } else {
      kiln_release(e);
    }
    got[hold] = (float)kiln_item(s);
    info[hold] = last_flush();
    kiln_release(s);
    kiln_release(x);
  }
  CHECK(got[0] == got[1]);
  CHECK_CLOSE(got[0], ref, 1e-5);
  CHECK(same_key(&info[0], &info[1]));
  CHECK_EQ_INT(info[0].outputs, 1);
  CHECK_EQ_INT(info[1].outputs, 1);
  /* e was not an output, but it can still be read: recomputed from x */
  float ev[10];
  read_f32(kept, ev, 10);
  tr_flush_info re = last_flush();
  CHECK_EQ_INT(re.nodes, 1);
  CHECK_EQ_INT(re.outputs, 1);
  for (int i = 0; i < 10; i++) CHECK_CLOSE(ev[i], exp((double)xs[i]), 1e-6);
  kiln_release(extra);
  kiln_release(kept);
}

/* the same with kiln_sync as the trigger: DESIGN §3 says handle liveness
   must not change the output set of a flush */
TEST(held_intermediate_under_sync) {
  float xs[10];
  fill_pattern(xs, 10, 0.3f, -1.5f);
  int64_t shape[1] = {10};
  tr_flush_info info[2];
  for (int hold = 0; hold < 2; hold++) {
    kiln_tensor *x = f32_tensor(xs, 1, shape);
    kiln_tensor *e = kiln_exp(x);
    kiln_tensor *s = kiln_sum(e, 0, NULL, false);
    if (!hold) kiln_release(e);
    CHECK(kiln_sync() == KILN_OK);
    info[hold] = last_flush();
    double ref = 0;
    for (int i = 0; i < 10; i++) ref += exp((double)xs[i]);
    CHECK_CLOSE(kiln_item(s), ref, 1e-5);
    if (hold) kiln_release(e);
    kiln_release(s);
    kiln_release(x);
  }
  CHECK(!strcmp(info[0].reason, "sync"));
  if (!same_key(&info[0], &info[1]) || info[0].outputs != info[1].outputs)
    KTEST_FAIL("kiln_sync: %d outputs with the intermediate released, %d with it held",
               info[0].outputs, info[1].outputs);
}

/* e is read by a flush and again by a later one: the first flush does not
   keep it (a pending reader outside says nothing: it may be garbage), the
   second computes it again and keeps it, a third reads it.  The first
   flush's key learns: when that program runs again, e is kept at once. */
TEST(value_needed_again_is_computed_at_most_twice) {
  float xs[6] = {0.5f, -1, 2, 0, 1.25f, -0.75f};
  double ref = 0;
  for (int i = 0; i < 6; i++) ref += exp((double)xs[i]);
  tr_cache_reset();
  for (int round = 0; round < 2; round++) {
    kiln_tensor *x = f32_tensor(xs, 1, (int64_t[]){6});
    kiln_tensor *e = kiln_exp(x);
    kiln_tensor *s = kiln_sum(e, 0, NULL, false);
    kiln_tensor *later = kiln_mul(e, x); /* pending, outside s's flush */
    kiln_tensor *third = kiln_add(e, x);
    kiln_release(e);
    CHECK_CLOSE(kiln_item(s), ref, 1e-6);
    tr_flush_info a = last_flush();
    CHECK_EQ_INT(a.nodes, 2);
    CHECK_EQ_INT(a.outputs, round == 0 ? 1 : 2); /* round 1: learned to keep e */
    float got[6];
    read_f32(later, got, 6);
    tr_flush_info b = last_flush();
    CHECK_EQ_INT(b.nodes, round == 0 ? 2 : 1); /* exp again (kept now), then the mul */
    CHECK_EQ_INT(b.outputs, round == 0 ? 2 : 1);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(got[i], exp((double)xs[i]) * xs[i], 1e-6);
    read_f32(third, got, 6);
    tr_flush_info c = last_flush();
    CHECK_EQ_INT(c.nodes, 1); /* e is materialized: only the add */
    CHECK_EQ_INT(c.leaves, 2);
    for (int i = 0; i < 6; i++) CHECK_CLOSE(got[i], exp((double)xs[i]) + xs[i], 1e-6);
    kiln_release(third);
    kiln_release(later);
    kiln_release(s);
    kiln_release(x);
  }
}

/* --- stores ------------------------------------------------------------------------------- */

TEST(pending_store_is_materialized_by_next_flush) {
  float ws[4] = {1, 2, 3, 4}, gs[4] = {10, -20, 0.5f, 8}, us[3] = {0, 1, 2};
  kiln_tensor *w = f32_tensor(ws, 1, (int64_t[]){4});
  kiln_tensor *g = f32_tensor(gs, 1, (int64_t[]){4});
  kiln_tensor *u = f32_tensor(us, 1, (int64_t[]){3});
  CHECK(kiln_sub_scaled_(w, g, 0.1) == KILN_OK);
  kiln_stats s0 = stats_now();
  kiln_tensor *v = kiln_exp(u);
  float vv[3];
  read_f32(v, vv, 3);
  tr_flush_info info = last_flush();
  CHECK_EQ_INT(info.outputs, 2);
  CHECK_EQ_INT(info.leaves, 3); /* u, w, g */
  for (int i = 0; i < 3; i++) CHECK_CLOSE(vv[i], exp(us[i]), 1e-6);
  kiln_stats s1 = stats_now();
  float wv[4];
  read_f32(w, wv, 4);
  CHECK_EQ_INT(stats_now().flushes - s1.flushes, 0); /* already materialized */
  CHECK_EQ_INT(s1.flushes - s0.flushes, 1);
  for (int i = 0; i < 4; i++) {
    volatile float step = gs[i] * 0.1f;
    float ref = ws[i] - step;
    CHECK(wv[i] == ref);
  }
  /* the same program without the store is another trace */
  kiln_tensor *v2 = kiln_exp(u);
  read_f32(v2, vv, 3);
  tr_flush_info plain = last_flush();
  CHECK_EQ_INT(plain.outputs, 1);
  CHECK(!same_key(&plain, &info));
  kiln_release(v2);
  kiln_release(v);
  kiln_release(u);
  kiln_release(g);
  kiln_release(w);
}

/* --- plan vs interpreter ------------------------------------------------------------------ */

enum { PX_R = 8, PX_C = 16, PW_C = 12 };

/* layer_norm -> matmul -> softmax, plus reductions; three results */
static void nontrivial_program(bool sync_each, float *out_soft, float *out_rows, float *out_all,
                               tr_flush_info *info) {
  float xs[PX_R * PX_C], ws[PX_C * PW_C], gs[PX_C], bs[PX_C];
  for (int i = 0; i < PX_R * PX_C; i++)
    xs[i] = sinf((float)i * 0.37f) * 2.0f + 0.1f * (float)(i % 5);
  for (int i = 0; i < PX_C * PW_C; i++) ws[i] = cosf((float)i * 0.11f) * 0.5f;
  for (int i = 0; i < PX_C; i++) {
    gs[i] = 1.0f + 0.05f * (float)i;
    bs[i] = 0.01f * (float)(i - 8);
  }
  kiln_tensor *held[16];
  int nh = 0;
#define H(expr) (held[nh++] = (expr), sync_each ? (void)kiln_sync() : (void)0, held[nh - 1])
  kiln_tensor *x = H(f32_tensor(xs, 2, (int64_t[]){PX_R, PX_C}));
  kiln_tensor *w = H(f32_tensor(ws, 2, (int64_t[]){PX_C, PW_C}));
  kiln_tensor *g = H(f32_tensor(gs, 1, (int64_t[]){PX_C}));
  kiln_tensor *b = H(f32_tensor(bs, 1, (int64_t[]){PX_C}));
  kiln_tensor *ln = H(kiln_layer_norm(x, g, b, 1e-5));
  kiln_tensor *h = H(kiln_matmul(ln, w));
  kiln_tensor *sm = H(kiln_softmax(h, 1));
  kiln_tensor *prod = H(kiln_mul(sm, h));
  kiln_tensor *rows = H(kiln_sum(prod, 1, (int[]){1}, false));
  kiln_tensor *mx = H(kiln_max(h, 1, (int[]){1}, false));
  kiln_tensor *th = H(kiln_tanh(mx));
  kiln_tensor *rows2 = H(kiln_add(rows, th));
  kiln_tensor *hh = H(kiln_mul(h, h));
  kiln_tensor *all = H(kiln_mean(hh, 0, NULL, false));
#undef H
  read_f32(sm, out_soft, PX_R * PW_C);
  info[0] = last_flush();
  read_f32(rows2, out_rows, PX_R);
  info[1] = last_flush();
  read_f32(all, out_all, 1);
  info[2] = last_flush();
  for (int i = 0; i < nh; i++) kiln_release(held[i]);
}

typedef struct {
  float soft[PX_R * PW_C], rows[PX_R], all[1];
  tr_flush_info info[3];
} nontrivial_out;

static void nontrivial(bool sync_each, nontrivial_out *o) {
  nontrivial_program(sync_each, o->soft, o->rows, o->all, o->info);
}

TEST(plan_matches_interpreter_bitwise) {
  tr_cache_reset();
  static nontrivial_out cold, warm, hot, again, eager;
  /* first run: the interpreter; the second read recomputes h (the first
     did not keep it), and the first read's key learns to keep it */
  nontrivial(false, &cold);
  nontrivial(false, &warm); /* the learned run: the second read has h as a leaf */
  nontrivial(false, &hot);
  nontrivial(false, &again); /* every read runs a cached plan */
  for (int k = 0; k < 3; k++) {
    CHECK(cold.info[k].new_key && !cold.info[k].planned);
    CHECK(hot.info[k].planned && again.info[k].planned && !again.info[k].new_key);
    CHECK(same_key(&hot.info[k], &again.info[k]));
    CHECK(hot.info[k].plan_groups >= 1);
  }
  CHECK(same_key(&cold.info[0], &hot.info[0])); /* learning never changes a key */
  CHECK(cold.info[0].outputs < hot.info[0].outputs);
  CHECK(hot.info[1].nodes < cold.info[1].nodes); /* no recomputation of h */
  CHECK(hot.info[0].nodes >= 15);                /* the whole forward pass is one trace */
  CHECK(!memcmp(cold.soft, warm.soft, sizeof cold.soft));
  CHECK(!memcmp(cold.rows, warm.rows, sizeof cold.rows));
  CHECK(!memcmp(cold.all, warm.all, sizeof cold.all));
  CHECK(!memcmp(cold.soft, hot.soft, sizeof cold.soft));
  CHECK(!memcmp(cold.rows, hot.rows, sizeof cold.rows));
  CHECK(!memcmp(cold.all, hot.all, sizeof cold.all));
  CHECK(!memcmp(cold.soft, again.soft, sizeof cold.soft));
  CHECK(!memcmp(cold.rows, again.rows, sizeof cold.rows));
  CHECK(!memcmp(cold.all, again.all, sizeof cold.all));
  /* and the eager schedule (a flush after every call) agrees too */
  nontrivial(true, &eager);
  CHECK(!memcmp(cold.soft, eager.soft, sizeof cold.soft));
  CHECK(!memcmp(cold.rows, eager.rows, sizeof cold.rows));
  CHECK(!memcmp(cold.all, eager.all, sizeof cold.all));
  /* sanity of the values themselves: softmax rows sum to 1 */
  for (int r = 0; r < PX_R; r++) {
    double t = 0;
    for (int c = 0; c < PW_C; c++) t += hot.soft[r * PW_C + c];
    CHECK_CLOSE(t, 1.0, 1e-5);
  }
}

/* --- recompile budget ------------------------------------------------------------------------ */

static tr_flush_info budget_program(int n) {
  float xs[64];
  fill_pattern(xs, n, 0.1f, -0.4f);
  kiln_tensor *x = f32_tensor(xs, 1, (int64_t[]){n});
  kiln_tensor *e = kiln_exp(x);
  kiln_tensor *m = kiln_mul_scalar(e, 2.0);
  kiln_tensor *s = kiln_sum(m, 0, NULL, false);
  double ref = 0;
  for (int i = 0; i < n; i++) ref += 2 * exp((double)xs[i]);
  CHECK_CLOSE(kiln_item(s), ref, 1e-5);
  tr_flush_info info = last_flush();
  kiln_release(s);
  kiln_release(m);
  kiln_release(e);
  kiln_release(x);
  return info;
}

/* The budget bounds compiling: a family's plans that compile kernels stop
   at KILN_RECOMPILE_BUDGET (8).  With a JIT, every size after the first
   finds the family's kernels ready (they take no extents; a size whose
   alignment wants other kernels compiles them, counted): it is planned
   at its first sighting (the family is hot) and never refused.  Without
   one, no plan's kernels are ready, and sizes past the eighth run on the
   interpreter. */
TEST(recompile_budget_per_family) {
  tr_cache_reset();
  bool jit = ktest_cpu_jit();
  tr_flush_info first = budget_program(3), cold0 = first;
  int planned_sizes = 0;
  for (int i = 0; i < 20; i++) {
    int n = 3 + i;
    tr_flush_info a = i == 0 ? cold0 : budget_program(n), b = budget_program(n),
                  c = budget_program(n);
    CHECK(a.new_key);
    if (a.planned != (jit && i > 0))
      KTEST_FAIL("size %d: planned %d on its first sighting, expected %d", n, a.planned,
                 jit && i > 0);
    CHECK(!b.new_key && same_key(&a, &b));
    /* the flush that named its family: a sighting without a plan, or its
       admission */
    const tr_flush_info *named = jit ? &a : &b;
    if (i == 0) first = *named;
    CHECK(same_family(named, &first));
    if (i > 0) CHECK(!same_key(&a, &first));
    bool want = jit || i < 8;
    if (b.planned != want)
      KTEST_FAIL("size %d: planned %d on its second sighting, expected %d", n, b.planned, want);
    if (c.planned != want)
      KTEST_FAIL("size %d: planned %d on its third sighting, expected %d", n, c.planned, want);
    planned_sizes += b.planned;
    kiln_jit_wait(); /* its kernels ready for the next size */
  }
  CHECK_EQ_INT(planned_sizes, jit ? 20 : 8);
  /* another family is not affected */
  key_program(V_BASE);
  tr_flush_info o2 = key_program(V_BASE);
  CHECK(!same_family(&o2, &first));
  CHECK(o2.planned);
}

/* cache/trace_cache.h, internal: the budget counts only plans that compile */
bool cache_admit(const uint64_t fam[2], bool compiles);

TEST(the_budget_counts_plans_that_compile) {
  tr_cache_reset();
  const uint64_t fam[2] = {0x1234, 0x5678};
  for (int i = 0; i < 8; i++) CHECK(cache_admit(fam, true));
  CHECK(!cache_admit(fam, true));
  CHECK(cache_admit(fam, false)); /* every kernel ready: planning only */
  CHECK(!cache_admit(fam, true));
}

/* --- stats -------------------------------------------------------------------------------- */

TEST(stats_count_flushes_and_cache_use) {
  tr_cache_reset();
  kiln_stats s0 = stats_now();
  budget_program(5); /* P: new */
  kiln_stats s1 = stats_now();
  CHECK_EQ_INT(s1.flushes - s0.flushes, 1);
  CHECK_EQ_INT(s1.traces_seen - s0.traces_seen, 1);
  CHECK_EQ_INT(s1.cache_misses - s0.cache_misses, 1);
  CHECK_EQ_INT(s1.cache_hits - s0.cache_hits, 0);
  budget_program(5); /* P again: a hit (planned now) */
  budget_program(5); /* and again: a hit on the plan */
  kiln_stats s2 = stats_now();
  CHECK_EQ_INT(s2.flushes - s1.flushes, 2);
  CHECK_EQ_INT(s2.traces_seen - s1.traces_seen, 0);
  CHECK_EQ_INT(s2.cache_misses - s1.cache_misses, 0);
  CHECK_EQ_INT(s2.cache_hits - s1.cache_hits, 2);
  budget_program(6); /* Q: another shape, another key */
  kiln_stats s3 = stats_now();
  CHECK_EQ_INT(s3.flushes - s2.flushes, 1);
  CHECK_EQ_INT(s3.traces_seen - s2.traces_seen, 1);
  CHECK_EQ_INT(s3.cache_misses - s2.cache_misses, 1);
  CHECK_EQ_INT(s3.cache_hits - s2.cache_hits, 0);
  /* nothing pending: kiln_sync and reads of materialized values do not flush */
  float v[3] = {1, 2, 3};
  kiln_tensor *t = f32_tensor(v, 1, (int64_t[]){3});
  CHECK(kiln_sync() == KILN_OK);
  float back[3];
  read_f32(t, back, 3);
  kiln_stats s4 = stats_now();
  CHECK_EQ_INT(s4.flushes - s3.flushes, 0);
  CHECK_EQ_INT(s4.cache_hits + s4.cache_misses - s3.cache_hits - s3.cache_misses, 0);
  /* one sync with two independent pending values: one flush */
  kiln_tensor *a = kiln_exp(t), *b = kiln_neg(t);
  CHECK(kiln_sync() == KILN_OK);
  kiln_stats s5 = stats_now();
  CHECK_EQ_INT(s5.flushes - s4.flushes, 1);
  CHECK_EQ_INT(last_flush().outputs, 2);
  read_f32(b, back, 3);
  CHECK(back[0] == -1 && back[1] == -2 && back[2] == -3);
  CHECK_EQ_INT(stats_now().flushes - s5.flushes, 0);
  /* a reset cache forgets: P is new again */
  tr_cache_reset();
  budget_program(5);
  kiln_stats s6 = stats_now();
  CHECK_EQ_INT(s6.traces_seen - s5.traces_seen, 1);
  CHECK_EQ_INT(s6.cache_misses - s5.cache_misses, 1);
  CHECK(s6.ops_recorded > s0.ops_recorded);
  kiln_release(a);
  kiln_release(b);
  kiln_release(t);
}

/* --- dumps ------------------------------------------------------------------------------ */

static char dump_dir[256];

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

static tr_flush_info dump_program(void) {
  float xs[12];
  fill_pattern(xs, 12, 0.5f, -2.0f);
  kiln_tensor *x = f32_tensor(xs, 2, (int64_t[]){3, 4});
  kiln_tensor *a = kiln_abs(x);
  kiln_tensor *r = kiln_sqrt(a);
  kiln_tensor *s = kiln_sum(r, 1, (int[]){1}, false);
  float got[3];
  read_f32(s, got, 3);
  for (int i = 0; i < 3; i++) {
    double ref = 0;
    for (int c = 0; c < 4; c++) ref += sqrt(fabs((double)xs[i * 4 + c]));
    CHECK_CLOSE(got[i], ref, 1e-6);
  }
  tr_flush_info info = last_flush();
  kiln_release(s);
  kiln_release(r);
  kiln_release(a);
  kiln_release(x);
  return info;
}

TEST(dump_writes_ir_dot_and_manifest) {
  CHECK(dump_dir[0] != 0);
  if (!dump_dir[0]) return;
  tr_cache_reset();
  char path[512], hex[33];
  tr_flush_info cold = dump_program();
  key_hex(&cold, hex);
  snprintf(path, sizeof path, "%s/trace-%s.txt", dump_dir, hex);
  CHECK(access(path, F_OK) != 0); /* not planned yet: nothing dumped */
  tr_flush_info hot = dump_program();
  CHECK(hot.planned);
  char *txt = slurp(path);
  CHECK(txt != NULL);
  if (txt) {
    CHECK_STR_CONTAINS(txt, "group 0");
    CHECK_STR_CONTAINS(txt, hex);
    CHECK_STR_CONTAINS(txt, "abs(");
    CHECK_STR_CONTAINS(txt, "sqrt(");
    CHECK_STR_CONTAINS(txt, "sum(");
    CHECK_STR_CONTAINS(txt, "outputs:");
  }
  free(txt);
  snprintf(path, sizeof path, "%s/trace-%s.dot", dump_dir, hex);
  char *dot = slurp(path);
  CHECK(dot != NULL);
  if (dot) {
    CHECK(!strncmp(dot, "digraph", 7));
    CHECK_STR_CONTAINS(dot, "sqrt");
    CHECK(dot[strlen(dot) - 2] == '}');
  }
  free(dot);
  snprintf(path, sizeof path, "%s/manifest.tsv", dump_dir);
  char *man = slurp(path);
  CHECK(man != NULL);
  if (man) {
    char line[64];
    snprintf(line, sizeof line, "%s\t", hex);
    CHECK_STR_CONTAINS(man, line);
    CHECK_EQ_INT(count_str(man, line), 1); /* one line per planned trace */
  }
  free(man);
  dump_program(); /* a plan hit writes nothing new */
  man = slurp(path);
  if (man) {
    char line[64];
    snprintf(line, sizeof line, "%s\t", hex);
    CHECK_EQ_INT(count_str(man, line), 1);
  }
  free(man);
}

static void remove_dump_dir(void) {
  if (!dump_dir[0]) return;
  DIR *d = opendir(dump_dir);
  if (d) {
    struct dirent *e;
    char path[600];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
        snprintf(path, sizeof path, "%s/%s", dump_dir, e->d_name);
        unlink(path);
      }
    closedir(d);
  }
  rmdir(dump_dir);
}

/* --- passes (child process: KILN_HOT=1, KILN_INSPECT_IR=1) -------------------------------------
 */

typedef kiln_tensor *(*prog_fn)(kiln_tensor *x);

typedef struct {
  tr_flush_info ref, plan;
  char ir[16384];
} pass_run;

/* f(x) read into got (bytes): first as the reference, after a cache reset with
   planning off (KILN_JIT=0); then after another reset with planning on, where
   the first sighting is planned (KILN_HOT=1).  The two must agree bit for bit
   and have the same key. */
static void run_pass(prog_fn f, kiln_tensor *x, void *got, size_t bytes, pass_run *out) {
  void *ref = calloc(1, bytes);
  memset(out, 0, sizeof *out);
  tr_cache_reset();
  setenv("KILN_JIT", "0", 1);
  kiln_tensor *y = f(x);
  CHECK(y != NULL);
  CHECK(kiln_to_buffer(y, ref, bytes) == KILN_OK);
  out->ref = last_flush();
  kiln_release(y);
  unsetenv("KILN_JIT");
  tr_cache_reset();
  y = f(x);
  CHECK(kiln_to_buffer(y, got, bytes) == KILN_OK);
  out->plan = last_flush();
  snprintf(out->ir, sizeof out->ir, "%s", tr_last_plan_ir());
  kiln_release(y);
  CHECK(!out->ref.planned);
  CHECK(out->plan.planned);
  CHECK(same_key(&out->ref, &out->plan));
  if (memcmp(ref, got, bytes)) KTEST_FAIL("the plan's result differs from the interpreter's");
  free(ref);
}

static kiln_tensor *x_f32(int n, float scale, float shift) {
  float v[64];
  fill_pattern(v, n, scale, shift);
  return f32_tensor(v, 1, (int64_t[]){n});
}

static kiln_tensor *p_exp_negneg(kiln_tensor *x) {
  kiln_tensor *a = kiln_neg(x), *b = kiln_neg(a), *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_negneg(kiln_tensor *x) {
  kiln_tensor *a = kiln_neg(x), *b = kiln_neg(a);
  kiln_release(a);
  return b;
}

TEST(pass_neg_neg) {
  kiln_tensor *x = x_f32(8, 0.5f, -2.0f);
  float xs[8], got[8];
  read_f32(x, xs, 8);
  pass_run r;
  run_pass(p_exp_negneg, x, got, sizeof got, &r);
  for (int i = 0; i < 8; i++) CHECK_CLOSE(got[i], exp((double)xs[i]), 1e-6);
  CHECK(r.plan.simplified >= 1);
  CHECK(r.plan.dce >= 1); /* the inner neg is dead */
  CHECK_EQ_INT(count_str(r.ir, "= neg("), 0);
  CHECK_STR_CONTAINS(r.ir, "= exp(L0)");
  CHECK(r.plan.plan_nodes < r.plan.nodes);
  /* the whole trace reduces to its input */
  run_pass(p_negneg, x, got, sizeof got, &r);
  CHECK(!memcmp(got, xs, sizeof got));
  CHECK(r.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= neg("), 0);
  CHECK_STR_CONTAINS(r.ir, "outputs: L0");
  kiln_release(x);
}

/* x op c with c a literal of the graph (kiln_ones/kiln_zeros of x's dtype,
   0-d): the literal's value is key material, so exact identities apply */
static kiln_tensor *with_literal(kiln_tensor *x, double v,
                                 kiln_tensor *(*op)(kiln_tensor *, kiln_tensor *)) {
  kiln_tensor *c =
      v == 1 ? kiln_ones(kiln_dtype_of(x), 0, NULL) : kiln_zeros(kiln_dtype_of(x), 0, NULL);
  kiln_tensor *y = op(x, c);
  kiln_release(c);
  return y;
}
static kiln_tensor *p_mul1(kiln_tensor *x) { return with_literal(x, 1, kiln_mul); }
static kiln_tensor *p_mul2(kiln_tensor *x) { return kiln_mul_scalar(x, 2.0); }
static kiln_tensor *p_mul1_host(kiln_tensor *x) { return kiln_mul_scalar(x, 1.0); }

/* x * ones() on f32 simplifies; kiln_mul_scalar(x, 1.0) does not: a host
   scalar is a runtime parameter, and 1.0 shares its key with 2.0 (a
   learning-rate schedule that passes 1.0 compiles nothing new) */
TEST(pass_mul_one_f32) {
  kiln_tensor *x = x_f32(8, 0.5f, -2.0f);
  float xs[8], got[8];
  read_f32(x, xs, 8);
  pass_run one, two, host;
  run_pass(p_mul1, x, got, sizeof got, &one);
  CHECK(!memcmp(got, xs, sizeof got));
  CHECK(one.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(one.ir, "= mul("), 0);
  run_pass(p_mul2, x, got, sizeof got, &two);
  for (int i = 0; i < 8; i++) CHECK(got[i] == 2 * xs[i]);
  CHECK_EQ_INT(two.plan.simplified, 0);
  CHECK_EQ_INT(count_str(two.ir, "= mul("), 1);
  run_pass(p_mul1_host, x, got, sizeof got, &host);
  CHECK(!memcmp(got, xs, sizeof got));
  CHECK(same_key(&host.plan, &two.plan));
  CHECK_EQ_INT(host.plan.simplified, 0);
  kiln_release(x);
}

static kiln_tensor *p_mul1_s(kiln_tensor *x) { return with_literal(x, 1, kiln_mul); }
static kiln_tensor *p_div1_s(kiln_tensor *x) { return with_literal(x, 1, kiln_div); }
static kiln_tensor *p_pow1_s(kiln_tensor *x) { return with_literal(x, 1, kiln_pow); }
static kiln_tensor *p_sub0_s(kiln_tensor *x) { return with_literal(x, 0, kiln_sub); }
static kiln_tensor *p_add0_s(kiln_tensor *x) { return with_literal(x, 0, kiln_add); }
static kiln_tensor *p_mul2_s(kiln_tensor *x) { return kiln_mul_scalar(x, 2.0); }
static kiln_tensor *p_sub0_host(kiln_tensor *x) { return kiln_sub_scalar(x, 0.0); }

/* f64 tensors: the literal needs no cast, so each identity applies directly */
TEST(pass_scalar_identities_f64) {
  double xs[6] = {-0.0, 0.0, 1.5, -3.25, 1e300, NAN}, got[6];
  kiln_tensor *x = kiln_from_data(xs, KILN_F64, 1, (int64_t[]){6});
  struct {
    const char *name;
    prog_fn f;
    bool simplifies;
  } cases[] = {
      {"x*1", p_mul1_s, true},
      {"x/1", p_div1_s, true},
      {"x**1", p_pow1_s, true},
      {"x-(+0)", p_sub0_s, true},
      {"x+(+0)", p_add0_s, false},
      {"x*2", p_mul2_s, false},
      {"x*1 (host 1.0)", p_mul1_host, false},
      {"x-0 (host 0.0)", p_sub0_host, false},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    pass_run r;
    run_pass(cases[c].f, x, got, sizeof got, &r);
    if ((r.plan.simplified >= 1) != cases[c].simplifies)
      KTEST_FAIL("%s: simplified %d", cases[c].name, r.plan.simplified);
    if (cases[c].simplifies) {
      if (memcmp(got, xs, sizeof got)) KTEST_FAIL("%s changed x", cases[c].name);
      if (strstr(r.ir, "= mul(") || strstr(r.ir, "= div(") || strstr(r.ir, "= pow(") ||
          strstr(r.ir, "= sub(") || strstr(r.ir, "= add("))
        KTEST_FAIL("%s: the op is still in the plan:\n%s", cases[c].name, r.ir);
      if (r.plan.dce < 1) KTEST_FAIL("%s: the scalar's full node was not removed", cases[c].name);
    }
  }
  /* x + (+0) is not an identity: -0 + 0 is +0 */
  pass_run r;
  run_pass(p_add0_s, x, got, sizeof got, &r);
  CHECK(got[0] == 0 && !signbit(got[0]));
  CHECK(signbit(xs[0]));
  kiln_release(x);
}

static kiln_tensor *p_ones_times_x(kiln_tensor *x) {
  kiln_tensor *o = kiln_ones(kiln_dtype_of(x), kiln_ndim(x), kiln_shape(x));
  kiln_tensor *a = kiln_mul(o, x), *b = kiln_mul(a, o), *c = kiln_exp(b);
  kiln_release(o);
  kiln_release(a);
  kiln_release(b);
  return c;
}

TEST(pass_one_times_x_f32) { /* 1*x and x*1 with a tensor of ones */
  kiln_tensor *x = x_f32(8, 0.25f, -1.0f);
  float xs[8], got[8];
  read_f32(x, xs, 8);
  pass_run r;
  run_pass(p_ones_times_x, x, got, sizeof got, &r);
  CHECK(r.plan.simplified >= 2);
  CHECK_EQ_INT(count_str(r.ir, "= mul("), 0);
  CHECK_STR_CONTAINS(r.ir, "= exp(L0)");
  for (int i = 0; i < 8; i++) CHECK_CLOSE(got[i], exp(xs[i]), 1e-6);
  kiln_release(x);
}

static kiln_tensor *p_cast_round_trip(kiln_tensor *x) {
  kiln_tensor *a = kiln_cast(x, KILN_I64), *b = kiln_cast(a, KILN_I32), *c = kiln_add(b, x);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_cast_own(kiln_tensor *x) {
  kiln_tensor *a = kiln_cast(x, KILN_I32), *c = kiln_add(a, x);
  kiln_release(a);
  return c;
}
static kiln_tensor *p_cast_narrowing(kiln_tensor *x) { /* f32 -> i32 -> f32 truncates */
  kiln_tensor *a = kiln_cast(x, KILN_I32), *b = kiln_cast(a, KILN_F32);
  kiln_release(a);
  return b;
}

TEST(pass_casts) {
  int32_t xs[6] = {0, 1, -1, 2147483647, -2147483647 - 1, 123456789}, got[6];
  kiln_tensor *x = kiln_from_data(xs, KILN_I32, 1, (int64_t[]){6});
  pass_run r;
  run_pass(p_cast_round_trip, x, got, sizeof got, &r);
  for (int i = 0; i < 6; i++) CHECK(got[i] == (int32_t)((uint32_t)xs[i] * 2u));
  CHECK(r.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= cast("), 0);
  CHECK_STR_CONTAINS(r.ir, "= add(L0, L0)");
  run_pass(p_cast_own, x, got, sizeof got, &r);
  CHECK_EQ_INT(count_str(r.ir, "= cast("), 0);
  for (int i = 0; i < 6; i++) CHECK(got[i] == (int32_t)((uint32_t)xs[i] * 2u));
  kiln_release(x);
  float fs[4] = {1.75f, -2.5f, 3.0f, -0.25f}, fgot[4];
  kiln_tensor *f = f32_tensor(fs, 1, (int64_t[]){4});
  run_pass(p_cast_narrowing, f, fgot, sizeof fgot, &r);
  CHECK(fgot[0] == 1 && fgot[1] == -2 && fgot[2] == 3 && fgot[3] == 0);
  CHECK_EQ_INT(r.plan.simplified, 0);
  CHECK_EQ_INT(count_str(r.ir, "= cast("), 2);
  kiln_release(f);
}

static kiln_tensor *p_reshape2(kiln_tensor *x) { /* [2,6] -> [12] -> [3,4] */
  kiln_tensor *a = kiln_reshape(x, 1, (int64_t[]){12}), *b = kiln_reshape(a, 2, (int64_t[]){3, 4});
  kiln_tensor *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_reshape_back(kiln_tensor *x) { /* [2,6] -> [12] -> [2,6] */
  kiln_tensor *a = kiln_reshape(x, 1, (int64_t[]){12}), *b = kiln_reshape(a, 2, (int64_t[]){2, 6});
  kiln_tensor *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}

TEST(pass_reshape_reshape) {
  float xs[12], got[12];
  fill_pattern(xs, 12, 0.2f, -1.0f);
  kiln_tensor *x = f32_tensor(xs, 2, (int64_t[]){2, 6});
  pass_run r;
  run_pass(p_reshape2, x, got, sizeof got, &r);
  for (int i = 0; i < 12; i++) CHECK_CLOSE(got[i], exp(xs[i]), 1e-6);
  CHECK_EQ_INT(count_str(r.ir, "= reshape("), 1);
  CHECK_STR_CONTAINS(r.ir, "= reshape(L0)");
  CHECK(r.plan.dce >= 1);
  kiln_release(x);
}

/* reshape(reshape(x, [12]), [2,6]) composes to reshape(x, [2,6]), an
   identity, which must then go too (as permute∘permute does) */
TEST(pass_reshape_reshape_identity) {
  float xs[12], got[12];
  fill_pattern(xs, 12, 0.2f, -1.0f);
  kiln_tensor *x = f32_tensor(xs, 2, (int64_t[]){2, 6});
  pass_run r;
  run_pass(p_reshape_back, x, got, sizeof got, &r);
  for (int i = 0; i < 12; i++) CHECK_CLOSE(got[i], exp(xs[i]), 1e-6);
  CHECK(r.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= reshape("), 0);
  kiln_release(x);
}

/* autodiff's bias gradient: sum over the batch with keepdim, then to the
   bias's shape, then an update: the reshape becomes the reduction without
   keepdim (the same fold), so no view splits the bias update from it.
   A keepdim sum read elsewhere too stays as it is. */
static kiln_tensor *p_bias_grad(kiln_tensor *g) {
  const int rows[1] = {0};
  kiln_tensor *s = kiln_sum(g, 1, rows, true), *r = kiln_reshape(s, 1, (int64_t[]){6});
  kiln_tensor *h = kiln_mul_scalar(r, 0.5), *y = kiln_sub_scalar(h, 1.0);
  kiln_release(s), kiln_release(r), kiln_release(h);
  return y;
}
static kiln_tensor *p_bias_grad_kept(kiln_tensor *g) {
  const int rows[1] = {0};
  kiln_tensor *s = kiln_sum(g, 1, rows, true), *r = kiln_reshape(s, 1, (int64_t[]){6});
  kiln_tensor *h = kiln_mul_scalar(r, 0.5), *e = kiln_exp(s),
              *er = kiln_reshape(e, 1, (int64_t[]){6});
  kiln_tensor *y = kiln_add(h, er);
  kiln_release(s), kiln_release(r), kiln_release(h), kiln_release(e), kiln_release(er);
  return y;
}

TEST(pass_keepdim_reduction_reshaped) {
  float xs[24], got[6];
  fill_pattern(xs, 24, 0.2f, -1.0f);
  kiln_tensor *g = f32_tensor(xs, 2, (int64_t[]){4, 6});
  pass_run r;
  run_pass(p_bias_grad, g, got, sizeof got, &r);
  for (int j = 0; j < 6; j++) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += xs[i * 6 + j];
    CHECK_CLOSE(got[j], s * 0.5 - 1.0, 1e-5);
  }
  CHECK(r.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= reshape("), 0);
  CHECK_STR_CONTAINS(r.ir, "keepdim=0");
  run_pass(p_bias_grad_kept, g, got, sizeof got, &r);
  CHECK_STR_CONTAINS(r.ir, "keepdim=1");
  CHECK_EQ_INT(count_str(r.ir, "= sum("), 1); /* not computed twice */
  kiln_release(g);
}

static kiln_tensor *p_transpose2(kiln_tensor *x) {
  kiln_tensor *a = kiln_transpose(x, 0, 1), *b = kiln_transpose(a, 0, 1), *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static const int PERM_A[3] = {1, 2, 0}, PERM_B[3] = {2, 0, 1}; /* B is A's inverse */
static kiln_tensor *p_permute_compose(kiln_tensor *x) {        /* [2,3,4] -> [3,4,2] -> [4,2,3] */
  kiln_tensor *a = kiln_permute(x, PERM_A), *b = kiln_permute(a, PERM_A), *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_permute_inverse(kiln_tensor *x) {
  kiln_tensor *a = kiln_permute(x, PERM_A), *b = kiln_permute(a, PERM_B), *c = kiln_neg(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_expand_slice_identity(kiln_tensor *x) {
  kiln_tensor *a = kiln_expand(x, kiln_ndim(x), kiln_shape(x));
  kiln_tensor *b = kiln_slice(a, 0, 0, kiln_shape(x)[0], 1), *c = kiln_exp(b);
  kiln_release(a);
  kiln_release(b);
  return c;
}

TEST(pass_views) {
  float xs[24], got[24];
  fill_pattern(xs, 24, 0.1f, -0.5f);
  kiln_tensor *x = f32_tensor(xs, 2, (int64_t[]){4, 6});
  pass_run r;
  run_pass(p_transpose2, x, got, sizeof got, &r);
  for (int i = 0; i < 24; i++) CHECK_CLOSE(got[i], exp(xs[i]), 1e-6);
  CHECK(r.plan.simplified >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= permute("), 0);
  run_pass(p_expand_slice_identity, x, got, sizeof got, &r);
  for (int i = 0; i < 24; i++) CHECK_CLOSE(got[i], exp(xs[i]), 1e-6);
  CHECK(r.plan.simplified >= 2);
  CHECK_EQ_INT(count_str(r.ir, "= expand("), 0);
  CHECK_EQ_INT(count_str(r.ir, "= slice("), 0);
  kiln_release(x);
  /* composing two non-identity permutations: one permute, same values */
  kiln_tensor *y = f32_tensor(xs, 3, (int64_t[]){2, 3, 4});
  run_pass(p_permute_compose, y, got, sizeof got, &r);
  CHECK_EQ_INT(count_str(r.ir, "= permute("), 1);
  /* permute(permute(y, A), A): shape [4,2,3]; out[i][j][k] = y[j][k][i] */
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 3; k++)
        CHECK_CLOSE(got[(i * 2 + j) * 3 + k], exp(xs[(j * 3 + k) * 4 + i]), 1e-6);
  run_pass(p_permute_inverse, y, got, sizeof got, &r); /* B undoes A */
  CHECK_EQ_INT(count_str(r.ir, "= permute("), 0);
  for (int i = 0; i < 24; i++) CHECK(got[i] == -xs[i]);
  kiln_release(y);
}

static kiln_tensor *p_cse(kiln_tensor *x) {
  kiln_tensor *a = kiln_exp(x), *b = kiln_exp(x), *c = kiln_add(a, b);
  kiln_release(a);
  kiln_release(b);
  return c;
}

TEST(pass_cse) {
  kiln_tensor *x = x_f32(16, 0.3f, -1.2f);
  float xs[16], got[16];
  read_f32(x, xs, 16);
  pass_run r;
  run_pass(p_cse, x, got, sizeof got, &r);
  CHECK(r.plan.cse >= 1);
  CHECK_EQ_INT(count_str(r.ir, "= exp("), 1);
  for (int i = 0; i < 16; i++) CHECK_CLOSE(got[i], 2 * exp((double)xs[i]), 1e-6);
  kiln_release(x);
}

static double fold_a = 2, fold_b = 3;
static kiln_tensor *p_fold(kiln_tensor *x) {
  (void)x;
  kiln_tensor *a = kiln_full(fold_a, KILN_F32, 1, (int64_t[]){1000});
  kiln_tensor *b = kiln_full(fold_b, KILN_F32, 1, (int64_t[]){1000});
  kiln_tensor *c = kiln_add(a, b);
  kiln_release(a);
  kiln_release(b);
  return c;
}
static kiln_tensor *p_fold_sum(kiln_tensor *x) {
  kiln_tensor *c = p_fold(x), *s = kiln_sum(c, 0, NULL, false);
  kiln_release(c);
  return s;
}

TEST(pass_constant_folding) {
  static float got[1000];
  pass_run r;
  run_pass(p_fold, NULL, got, sizeof got, &r);
  CHECK(r.plan.folded >= 1);
  CHECK_STR_CONTAINS(r.ir, "folded");
  int bad = 0;
  for (int i = 0; i < 1000; i++) bad += got[i] != 5.0f;
  CHECK_EQ_INT(bad, 0);
  /* the same key with other values: the folded plan binds this flush's values */
  fold_a = 4;
  fold_b = 10;
  kiln_tensor *y = p_fold(NULL);
  read_f32(y, got, 1000);
  tr_flush_info again = last_flush();
  CHECK(again.planned && !again.new_key && same_key(&again, &r.plan));
  bad = 0;
  for (int i = 0; i < 1000; i++) bad += got[i] != 14.0f;
  CHECK_EQ_INT(bad, 0);
  kiln_release(y);
  fold_a = 2;
  fold_b = 3;
  float total;
  run_pass(p_fold_sum, NULL, &total, sizeof total, &r);
  CHECK(total == 5000.0f);
  CHECK(r.plan.folded >= 1);
}

TEST(pass_dce_of_rewritten_nodes) {
  /* exp(neg(neg(x))) and x*1: rewrites leave dead nodes, DCE drops them */
  kiln_tensor *x = x_f32(8, 0.5f, -2.0f);
  float got[8];
  pass_run r;
  run_pass(p_exp_negneg, x, got, sizeof got, &r);
  CHECK_EQ_INT(r.plan.nodes, 3);
  CHECK_EQ_INT(r.plan.plan_nodes, 1); /* exp(L0) */
  CHECK_EQ_INT(r.plan.simplified, 1); /* the outer neg became L0 */
  CHECK_EQ_INT(r.plan.dce, 1);        /* the inner neg is dead */
  kiln_release(x);
  double xs[4] = {1, 2, 3, 4}, dgot[4];
  kiln_tensor *d = kiln_from_data(xs, KILN_F64, 1, (int64_t[]){4});
  run_pass(p_mul1_s, d, dgot, sizeof dgot, &r);
  CHECK_EQ_INT(r.plan.plan_nodes, 0); /* mul became L0, full(1) is dead */
  CHECK_EQ_INT(r.plan.dce, 1);
  CHECK_STR_CONTAINS(r.ir, "outputs: L0");
  CHECK(!memcmp(dgot, xs, sizeof xs));
  kiln_release(d);
}

static int passes_main(void) {
  RUN(pass_neg_neg);
  RUN(pass_mul_one_f32);
  RUN(pass_scalar_identities_f64);
  RUN(pass_one_times_x_f32);
  RUN(pass_casts);
  RUN(pass_reshape_reshape);
  RUN(pass_reshape_reshape_identity);
  RUN(pass_keepdim_reduction_reshaped);
  RUN(pass_views);
  RUN(pass_cse);
  RUN(pass_constant_folding);
  RUN(pass_dce_of_rewritten_nodes);
  return ktest_done();
}

/* runs "passes" in a child (KILN_HOT is read once per process) */
TEST(passes_in_child_process) {
  char self[4096];
  bool found = self_path(self, sizeof self);
  CHECK(found);
  if (!found) return;
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "KILN_HOT=1 KILN_PAYOFF=0 KILN_INSPECT_IR=1 '%s' passes", self);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  if (!p) return;
  char line[512];
  int passed = -1, failed = -1;
  while (fgets(line, sizeof line, p)) {
    printf("  passes: %s", line);
    sscanf(line, "%d passed, %d failed", &passed, &failed);
  }
  int status = pclose(p);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_EQ_INT(failed, 0);
  CHECK(passed + failed >= 11); /* every pass test ran */
}

/* --- a deep graph on a small stack ---------------------------------------------------------- */

enum { DEEP_CHAIN = 200000 };

/* a leaf that requires grad, multiplied DEEP_CHAIN times: autodiff keeps
   every node's inputs, so the chain stays one linked graph, and dropping
   its end frees all of it at once.  Freeing recursed once per node (a
   million-op chain crashed the main thread's 8 MiB stack; a Ruby thread's
   is smaller); now it walks a worklist */
static void *deep_chain(void *arg) {
  double *sum = arg;
  kiln_tensor *x = kiln_full(1.0, KILN_F64, 1, (int64_t[]){4});
  kiln_set_requires_grad(x, true);
  kiln_tensor *y = kiln_retain(x);
  for (int i = 0; i < DEEP_CHAIN; i++) {
    kiln_tensor *z = kiln_mul_scalar(y, 1.0000001);
    kiln_release(y);
    y = z;
  }
  kiln_tensor *s = kiln_sum(y, 0, NULL, false);
  *sum = kiln_item(s);
  kiln_release(s);
  kiln_release(y); /* the whole chain goes here */
  kiln_release(x);
  return NULL;
}

TEST(a_deep_autodiff_graph_is_freed_on_a_small_stack) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (size_t)512 << 10);
  pthread_t th;
  double sum = 0;
  CHECK(pthread_create(&th, &attr, deep_chain, &sum) == 0);
  pthread_join(th, NULL);
  pthread_attr_destroy(&attr);
  CHECK_CLOSE(sum, 4.0 * pow(1.0000001, DEEP_CHAIN), 1e-9);
}

/* --- the trace cache's byte cap (KILN_TRACE_CACHE_MB) ---------------------------------------- */

enum { CAP_PROGRAMS = 120, CAP_CHAIN = 150 };

/* child: CAP_PROGRAMS programs of distinct shapes (each a new key), each a
   chain of CAP_CHAIN adds read back; prints the cache's most bytes and
   entries seen after any program, its bytes and entries at the end, and
   whether every program's result was right */
static int cache_bytes_main(void) {
  double most_bytes = 0, most_entries = 0;
  int wrong = 0;
  for (int p = 0; p < CAP_PROGRAMS; p++) {
    int64_t n = p + 1;
    kiln_tensor *x = kiln_full(0.5, KILN_F64, 1, &n), *y = kiln_retain(x);
    for (int i = 0; i < CAP_CHAIN; i++) {
      kiln_tensor *z = kiln_add_scalar(y, 1.0);
      kiln_release(y);
      y = z;
    }
    kiln_tensor *s = kiln_sum(y, 0, NULL, false);
    wrong += kiln_item(s) != (double)n * (0.5 + CAP_CHAIN);
    kiln_release(s);
    kiln_release(y);
    kiln_release(x);
    double b = kiln_stat("trace_cache_bytes"), e = kiln_stat("trace_cache_entries");
    most_bytes = b > most_bytes ? b : most_bytes;
    most_entries = e > most_entries ? e : most_entries;
  }
  printf("%.0f %.0f %.0f %.0f %d\n", most_bytes, most_entries, kiln_stat("trace_cache_bytes"),
         kiln_stat("trace_cache_entries"), wrong);
  return 0;
}

static bool cache_bytes_child(const char *env, double *most_bytes, double *most_entries,
                              double *bytes, double *entries, int *wrong) {
  char line[256];
  return ktest_run_self(env, "cachebytes", line, sizeof line) &&
         sscanf(line, "%lf %lf %lf %lf %d", most_bytes, most_entries, bytes, entries, wrong) == 5;
}

/* A program over ever new shapes (a recurrent model over new pairs of
   lengths) makes a new key at every step; the cache holds their key bytes
   up to KILN_TRACE_CACHE_MB, least recently sighted out first, and gives
   the same results either way. */
TEST(trace_cache_holds_at_most_its_bytes) {
  double mb, me, b, e;
  int wrong = -1;
  CHECK(cache_bytes_child("KILN_TRACE_CACHE_MB=1", &mb, &me, &b, &e, &wrong));
  CHECK_EQ_INT(wrong, 0);
  if (mb > 1 << 20) KTEST_FAIL("the cache held %.0f bytes under a 1 MiB cap", mb);
  CHECK(e >= 1 && e < CAP_PROGRAMS);
  double all_b, all_e, end_b, end_e;
  wrong = -1;
  CHECK(cache_bytes_child("", &all_b, &all_e, &end_b, &end_e, &wrong));
  CHECK_EQ_INT(wrong, 0);
  /* the default cap (64 MiB) keeps every key, and they are more than 1 MiB:
     the cap above is what bounded them */
  CHECK(end_e >= CAP_PROGRAMS);
  if (end_b <= 1 << 20) KTEST_FAIL("%.0f bytes of keys: too few to test the cap", end_b);
  printf("  %d keys: %.0f bytes; under a 1 MiB cap %.0f bytes in %.0f keys\n", CAP_PROGRAMS, end_b,
         b, e);
}

/* --- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "key")) {
    tr_flush_info info = key_program(V_BASE);
    char hex[33];
    key_hex(&info, hex);
    printf("%s\n", hex);
    return ktest_failed_checks ? 1 : 0;
  }
  if (argc > 1 && !strcmp(argv[1], "cachebytes")) return cache_bytes_main();
  if (argc > 1 && !strcmp(argv[1], "passes")) {
    setenv("KILN_HOT", "1", 1);
    setenv("KILN_INSPECT_IR", "1", 1);
    unsetenv("KILN_JIT");
    unsetenv("KILN_DUMP");
    unsetenv("KILN_RECOMPILE_BUDGET");
    return passes_main();
  }
  unsetenv("KILN_HOT");
  unsetenv("KILN_JIT");
  unsetenv("KILN_RECOMPILE_BUDGET");
  unsetenv("KILN_INSPECT_IR");
  strcpy(dump_dir, "/tmp/kiln-test-trace-XXXXXX");
  if (mkdtemp(dump_dir))
    setenv("KILN_DUMP", dump_dir, 1);
  else
    dump_dir[0] = 0;
  RUN(key_same_program_same_key);
  RUN(key_same_across_processes);
  RUN(key_changes_with_structure_not_scalars);
  RUN(key_sees_leaves_that_share_storage);
  RUN(key_ignores_host_scalar_values);
  RUN(training_loop_keys_are_bounded);
  RUN(depth_cap_cuts_a_repeating_pattern);
  RUN(held_intermediate_changes_nothing);
  RUN(held_intermediate_under_sync);
  RUN(value_needed_again_is_computed_at_most_twice);
  RUN(pending_store_is_materialized_by_next_flush);
  RUN(plan_matches_interpreter_bitwise);
  RUN(recompile_budget_per_family);
  RUN(the_budget_counts_plans_that_compile);
  RUN(stats_count_flushes_and_cache_use);
  RUN(trace_cache_holds_at_most_its_bytes);
  RUN(a_deep_autodiff_graph_is_freed_on_a_small_stack);
  RUN(dump_writes_ir_dot_and_manifest);
  remove_dump_dir();
  unsetenv("KILN_DUMP");
  fflush(stdout);
  RUN(passes_in_child_process);
  return ktest_done();
}

/* format.c — PyTorch's tensor printing: one element formatter chosen from
 * the values shown (integer-valued floats as "1.", fixed "%.4f", or
 * scientific "%.4e" when magnitudes span too much), a common width, rows
 * wrapped at 80 columns, and tensors over 1000 elements summarized to
 * their first and last three entries per dimension. */
#include "format.h"

#include <math.h>
#include <string.h>

#include "../trace/record.h"
#include "../vm/ops.h"
#include "../vm/state.h"

#define LINE_WIDTH 80
#define SUMMARY_THRESHOLD 1000
#define EDGE_ITEMS 3

typedef enum { MODE_INT, MODE_BOOL, MODE_FLOAT_INT, MODE_FIXED, MODE_SCI } fmt_mode;

typedef struct {
  const vm_tensor *t; /* contiguous */
  fmt_mode mode;
  int width;
  bool summarize;
  FILE *f;
} printer;

static int format_elem(const printer *p, int64_t i, char *buf, size_t n) {
  const void *d = vm_data(p->t);
  switch (p->mode) {
    case MODE_BOOL:
      return snprintf(buf, n, "%s", ((const bool *)d)[i] ? "True" : "False");
    case MODE_INT:
      return snprintf(buf, n, "%lld",
                      p->t->dtype == KILN_I64 ? (long long)((const int64_t *)d)[i]
                                              : (long long)vm_load_f64(d, p->t->dtype, i));
    default:
      break;
  }
  double v = vm_load_f64(d, p->t->dtype, i);
  if (isnan(v)) return snprintf(buf, n, "nan");
  if (isinf(v)) return snprintf(buf, n, v > 0 ? "inf" : "-inf");
  if (p->mode == MODE_FLOAT_INT) return snprintf(buf, n, "%.0f.", v);
  if (p->mode == MODE_FIXED) return snprintf(buf, n, "%.4f", v);
  return snprintf(buf, n, "%.4e", v);
}

/* visits the flat indices that are shown, in order */
typedef void (*visit_fn)(printer *p, int64_t i, void *ctx);

static void visit(printer *p, int dim, int64_t base, visit_fn fn, void *ctx) {
  const vm_tensor *t = p->t;
  if (dim == t->ndim) {
    fn(p, base, ctx);
    return;
  }
  int64_t size = t->shape[dim];
  for (int64_t i = 0; i < size; i++) {
    if (p->summarize && size > 2 * EDGE_ITEMS && i == EDGE_ITEMS) i = size - EDGE_ITEMS;
    visit(p, dim + 1, base + i * t->strides[dim], fn, ctx);
  }
}

typedef struct {
  double max_abs, min_abs;
  bool all_int, any_finite;
} float_stats;

static void collect(printer *p, int64_t i, void *ctx) {
  float_stats *s = ctx;
  double v = vm_load_f64(vm_data(p->t), p->t->dtype, i);
  if (!isfinite(v)) return;
  if (v != floor(v)) s->all_int = false;
  double a = fabs(v);
  if (a == 0) return;
  if (!s->any_finite || a > s->max_abs) s->max_abs = a;
  if (!s->any_finite || a < s->min_abs) s->min_abs = a;
  s->any_finite = true;
}

static void measure(printer *p, int64_t i, void *ctx) {
  (void)ctx;
  char buf[64];
  int w = format_elem(p, i, buf, sizeof buf);
  if (w > p->width) p->width = w;
}

static void choose_mode(printer *p) {
  kiln_dtype dt = p->t->dtype;
  if (dt == KILN_BOOL) {
    p->mode = MODE_BOOL;
  } else if (!vm_dtype_is_float(dt)) {
    p->mode = MODE_INT;
  } else {
    float_stats s = {0, 0, true, false};
    visit(p, 0, 0, collect, &s);
    bool wide = s.any_finite && (s.max_abs / s.min_abs > 1000.0 || s.max_abs > 1e8);
    if (s.all_int)
      p->mode = wide ? MODE_SCI : MODE_FLOAT_INT;
    else
      p->mode = (wide || (s.any_finite && s.min_abs < 1e-4)) ? MODE_SCI : MODE_FIXED;
  }
  p->width = 0;
  visit(p, 0, 0, measure, NULL);
}

static void put_elem(printer *p, int64_t i) {
  char buf[64];
  format_elem(p, i, buf, sizeof buf);
  fprintf(p->f, "%*s", p->width, buf);
}

static void put_spaces(FILE *f, int n) {
  for (int i = 0; i < n; i++) fputc(' ', f);
}

static void print_dim(printer *p, int dim, int64_t base, int indent) {
  const vm_tensor *t = p->t;
  int64_t size = t->shape[dim];
  bool cut = p->summarize && size > 2 * EDGE_ITEMS;
  fputc('[', p->f);
  if (dim == t->ndim - 1) {
    int per_line = (LINE_WIDTH - indent) / (p->width + 2);
    if (per_line < 1) per_line = 1;
    int on_line = 0;
    for (int64_t i = 0; i < size; i++) {
      if (i > 0) {
        fputc(',', p->f);
        if (on_line == per_line) {
          fputc('\n', p->f);
          put_spaces(p->f, indent + 1);
          on_line = 0;
        } else {
          fputc(' ', p->f);
        }
      }
      if (cut && i == EDGE_ITEMS) {
        fputs(" ...", p->f);
        i = size - EDGE_ITEMS - 1;
      } else {
        put_elem(p, base + i * t->strides[dim]);
      }
      on_line++;
    }
  } else {
    int rest = t->ndim - dim;
    for (int64_t i = 0; i < size; i++) {
      if (i > 0) {
        fputc(',', p->f);
        for (int k = 0; k < rest - 1; k++) fputc('\n', p->f);
        put_spaces(p->f, indent + 1);
      }
      if (cut && i == EDGE_ITEMS) {
        fputs("...", p->f);
        i = size - EDGE_ITEMS - 1;
        continue;
      }
      print_dim(p, dim + 1, base + i * t->strides[dim], indent + 1);
    }
  }
  fputc(']', p->f);
}

bool fe_format(vm_tensor *t, FILE *f) {
  if (!f) {
    vm_error(KILN_ERR_ARG, "the FILE is NULL");
    return false;
  }
  vm_tensor *v = tr_value(t);
  vm_tensor *c = v ? vm_value_host_contiguous(v) : NULL;
  if (!c) return false;
  printer p = {c, MODE_FIXED, 0, c->numel > SUMMARY_THRESHOLD, f};
  fputs("tensor(", f);
  bool default_dtype = c->dtype == KILN_F32 || c->dtype == KILN_I64 || c->dtype == KILN_BOOL;
  if (c->numel == 0) {
    fputs("[]", f);
    if (c->ndim != 1) {
      fputs(", size=(", f);
      for (int d = 0; d < c->ndim; d++) fprintf(f, d ? ", %lld" : "%lld", (long long)c->shape[d]);
      fputs(")", f);
    }
  } else {
    choose_mode(&p);
    if (c->ndim == 0) {
      char buf[64];
      format_elem(&p, 0, buf, sizeof buf);
      fputs(buf, f);
    } else {
      print_dim(&p, 0, 0, 7);
    }
  }
  if (!default_dtype) fprintf(f, ", dtype=%s", vm_dtype_name(c->dtype));
  fputs(")\n", f);
  vm_release(c);
  return !ferror(f);
}

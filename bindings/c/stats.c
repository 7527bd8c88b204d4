/* stats.c — the public counters (kiln_get_stats, kiln_stat,
 * kiln_reset_stats) and the KILN_STATS=1 table printed at exit, all read
 * from one list (vm/stats.def): a counter added there is named, reset and
 * printed without touching this file. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../vm/state.h"
#include "kiln.h"

enum { COUNT, GAUGE };

static const struct counter {
  const char *name;
  size_t offset;
  double scale;
  int kind;
} counters[] = {
#define X(field, name, scale, kind) {name, offsetof(vm_counters, field), scale, kind},
#include "../../vm/stats.def"
#undef X
};

enum { NCOUNTERS = sizeof counters / sizeof *counters };

static atomic_uint_fast64_t *field_of(vm_counters *c, const struct counter *k) {
  return (atomic_uint_fast64_t *)((char *)c + k->offset);
}

static double value_of(vm_counters *c, const struct counter *k) {
  return (double)atomic_load(field_of(c, k)) * k->scale;
}

void kiln_get_stats(kiln_stats *out) {
  if (!out) return;
  vm_counters *c = &vm_process()->stats;
  vm_post_ops();
  memset(out, 0, sizeof *out);
  out->ops_recorded = atomic_load(&c->ops_recorded);
  out->eager_ops = atomic_load(&c->eager_ops);
  out->kernels_launched = atomic_load(&c->kernels_launched);
  out->flushes = atomic_load(&c->flushes);
  out->traces_seen = atomic_load(&c->traces_seen);
  out->cache_hits = atomic_load(&c->cache_hits);
  out->cache_misses = atomic_load(&c->cache_misses);
  out->flush_ms = (double)atomic_load(&c->flush_us) / 1000.0;
  out->compiles = atomic_load(&c->compiles);
  out->compile_failures = atomic_load(&c->compile_failures);
  out->disk_hits = atomic_load(&c->disk_hits);
  out->compile_ms = (double)atomic_load(&c->compile_us) / 1000.0;
}

void kiln_reset_stats(void) {
  vm_counters *c = &vm_process()->stats;
  vm_thread()->ops_unposted = 0;
  for (int i = 0; i < NCOUNTERS; i++)
    if (counters[i].kind == COUNT) atomic_store(field_of(c, &counters[i]), 0);
}

double kiln_stat(const char *name) {
  vm_set_api("kiln_stat");
  vm_counters *c = &vm_process()->stats;
  vm_post_ops();
  for (int i = 0; name && i < NCOUNTERS; i++)
    if (!strcmp(name, counters[i].name)) return value_of(c, &counters[i]);
  vm_error(KILN_ERR_ARG, "no counter named '%s'", name ? name : "(null)");
  return NAN;
}

/* KILN_STATS=1: every counter at exit, in stats.def's order */
static void print_stats(void) {
  vm_counters *c = &vm_process()->stats;
  vm_post_ops();
  fputs("kiln stats\n", stderr);
  for (int i = 0; i < NCOUNTERS; i++) {
    double v = value_of(c, &counters[i]);
    if (counters[i].scale == 1)
      fprintf(stderr, "  %-20s %.0f\n", counters[i].name, v);
    else
      fprintf(stderr, "  %-20s %.1f\n", counters[i].name, v);
  }
  double hits = (double)atomic_load(&c->cache_hits), misses = (double)atomic_load(&c->cache_misses);
  fprintf(stderr, "  %-20s %.1f%%\n", "hit rate",
          hits + misses ? 100.0 * hits / (hits + misses) : 0.0);
}

__attribute__((constructor)) static void stats_at_exit(void) {
  const char *s = getenv("KILN_STATS");
  if (s && !strcmp(s, "1")) atexit(print_stats);
}

/* dump.c — KILN_LOG and KILN_DUMP.  The dump directory is
 * private (created 0700, checked on its descriptor) and every dump file is
 * created in it with O_EXCL | O_NOFOLLOW, so nothing planted there is
 * followed or appended to (DESIGN §11). */
#include "dump.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../vm/dist.h"
#include "../vm/private_dir.h"
#include "../vm/state.h"

static const char *group_kind_name(tr_group_kind k) {
  static const char *names[] = {"elementwise", "reduce", "matmul", "data"};
  return names[k];
}

static void put_ref(FILE *f, int ref) {
  if (ref >= 0)
    fprintf(f, "%%%d", ref);
  else
    fprintf(f, "L%d", -1 - ref);
}

static void put_meta(FILE *f, const vm_meta *m) {
  fprintf(f, "%s[", vm_dtype_name(m->dtype));
  for (int d = 0; d < m->ndim; d++) fprintf(f, d ? ",%lld" : "%lld", (long long)m->shape[d]);
  fputc(']', f);
}

static void put_attrs(FILE *f, const tr_pnode *p) {
  const vm_attr *a = &p->attr;
  switch (vm_op_table[p->op].kind) {
    case VM_KIND_REDUCE:
      fprintf(f, " axes=0x%x keepdim=%d", a->axes_mask, a->keepdim);
      break;
    case VM_KIND_VIEW:
      if (p->op == VM_OP_permute) {
        fprintf(f, " perm=(");
        for (int d = 0; d < p->meta.ndim; d++) fprintf(f, d ? ",%d" : "%d", a->perm[d]);
        fputc(')', f);
      } else if (p->op == VM_OP_slice) {
        fprintf(f, " axis=%d %lld:%lld:%lld", a->axis, (long long)a->start, (long long)a->stop,
                (long long)a->step);
      }
      break;
    case VM_KIND_INDEX:
    case VM_KIND_CONCAT:
      fprintf(f, " axis=%d", a->axis);
      break;
    case VM_KIND_SORT:
      fprintf(f, " axis=%d descending=%d", a->axis, a->keepdim);
      break;
    case VM_KIND_COLLECTIVE:
      fprintf(f, " op=%s seq=$%d", vm_reduce_name(a->axis), p->src);
      break;
    case VM_KIND_CONV:
      fprintf(f, " stride=%d,%d padding=%d,%d dilation=%d,%d groups=%d", a->perm[0], a->perm[1],
              a->perm[2], a->perm[3], a->perm[4], a->perm[5], a->axis);
      break;
    case VM_KIND_ATTENTION:
      fprintf(f, " scale=%.17g causal=%d", a->scalar[0], a->keepdim);
      break;
    case VM_KIND_LEAF:
      if (p->op == VM_OP_full) fprintf(f, " value=$%d%s", p->src, a->weak ? " weak" : "");
      if (p->op == VM_OP_arange) fprintf(f, " start,step=$%d", p->src);
      if (p->op == VM_OP_rand || p->op == VM_OP_randn) fprintf(f, " counter=$%d", p->src);
      break;
    default:
      break;
  }
}

void tr_write_ir(FILE *f, const tr_trace *t, const tr_plan *plan, tr_key key) {
  fprintf(f, "# kiln trace %016llx%016llx: %d nodes, %d leaves -> plan of %d nodes in %d groups\n",
          (unsigned long long)key.hi, (unsigned long long)key.lo, t->n, t->nleaves, plan->n,
          plan->ngroups);
  fprintf(f, "# passes: simplified %d, cse %d, dce %d, folded %d; %d buffers\n",
          plan->passes.simplified, plan->passes.cse, plan->passes.dce, plan->passes.folded,
          plan->nbuffers);
  fprintf(f, "# $i: a runtime parameter bound from the flush's node i\n");
  for (int j = 0; j < t->nleaves; j++) {
    const vm_tensor *v = t->leaves[j]->value;
    fprintf(f, "L%d : ", j);
    put_meta(f, &t->leaves[j]->meta);
    fprintf(f, "%s\n", vm_is_contiguous(v) ? "" : " (strided)");
  }
  for (int g = 0; g < plan->ngroups; g++) {
    const tr_group *grp = &plan->groups[g];
    fprintf(f, "\ngroup %d %s {\n", g, group_kind_name(grp->kind));
    for (int i = grp->first; i <= grp->last; i++) {
      const tr_pnode *p = &plan->nodes[i];
      fprintf(f, "  %%%d = %s(", i, vm_op_table[p->op].name);
      for (int k = 0; k < p->nin; k++) {
        if (k) fputs(", ", f);
        put_ref(f, tr_pnode_input(p, k));
      }
      fputc(')', f);
      put_attrs(f, p);
      fputs(" : ", f);
      put_meta(f, &p->meta);
      if (p->fold) fputs(" folded", f);
      if (p->buffer >= 0) fprintf(f, " -> buf%d", p->buffer);
      fputc('\n', f);
    }
    fputs("}\n", f);
  }
  fputs("\noutputs:", f);
  for (int c = 0; c < t->n; c++)
    if (t->is_output[c]) {
      fputc(' ', f);
      put_ref(f, plan->outputs[c]);
    }
  fputc('\n', f);
}

static void write_dot(FILE *f, const tr_trace *t, const tr_plan *plan) {
  static const char *colors[] = {"#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f",
                                 "#cab2d6", "#ffff99", "#1f78b4", "#33a02c"};
  fprintf(
      f,
      "digraph kiln {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n");
  for (int j = 0; j < t->nleaves; j++)
    fprintf(f, "  L%d [label=\"L%d\", fillcolor=\"#eeeeee\"];\n", j, j);
  for (int g = 0; g < plan->ngroups; g++) {
    const tr_group *grp = &plan->groups[g];
    fprintf(f, "  subgraph cluster_%d {\n    label=\"group %d (%s)\";\n", g, g,
            group_kind_name(grp->kind));
    for (int i = grp->first; i <= grp->last; i++) {
      const tr_pnode *p = &plan->nodes[i];
      fprintf(f, "    n%d [label=\"%%%d %s\\n", i, i, vm_op_table[p->op].name);
      put_meta(f, &p->meta);
      fprintf(f, "\", fillcolor=\"%s\"];\n", colors[g % 8]);
    }
    fputs("  }\n", f);
  }
  for (int i = 0; i < plan->n; i++)
    for (int k = 0; k < plan->nodes[i].nin; k++) {
      int r = tr_pnode_input(&plan->nodes[i], k);
      if (r >= 0)
        fprintf(f, "  n%d -> n%d;\n", r, i);
      else
        fprintf(f, "  L%d -> n%d;\n", -1 - r, i);
    }
  fputs("}\n", f);
}

/* ---- the dump directory ---- */

int tr_dump_dir_open(void) {
  static atomic_flag warned = ATOMIC_FLAG_INIT;
  const char *dir = getenv("KILN_DUMP");
  if (!dir || !*dir) return -1;
  vm_dir_status status;
  const char *why = NULL;
  int fd = vm_private_dir_open(dir, true, &status, &why);
  if (fd < 0 && !atomic_flag_test_and_set(&warned))
    fprintf(stderr, "kiln: KILN_DUMP: nothing is dumped: %s is %s%s\n", dir, why,
            status == VM_DIR_UNTRUSTED
                ? " (it must be a directory owned by you and writable by no one else)"
                : "");
  return fd;
}

FILE *tr_dump_create(int dir_fd, const char *name) {
  int fd = vm_private_file_create(dir_fd, name);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f && fd >= 0) close(fd);
  return f;
}

bool tr_dump_path(int dir_fd, const char *name, char *out, size_t out_len) {
  int fd = vm_private_file_create(dir_fd, name);
  if (fd < 0) return false;
  close(fd);
  return vm_fd_path(dir_fd, name, out, out_len);
}

FILE *tr_dump_append(int dir_fd, const char *name) {
  int fd = openat(dir_fd, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                  0600);
  struct stat st;
  const char *why;
  if (fd >= 0 && (fstat(fd, &st) != 0 || !vm_private_file_check(&st, &why))) {
    close(fd);
    fd = -1;
  }
  if (fd < 0) return tr_dump_create(dir_fd, name);
  FILE *f = fdopen(fd, "a");
  if (!f) close(fd);
  return f;
}

static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;

void tr_dump_plan(const tr_trace *t, const tr_plan *plan, tr_key key) {
  const char *dir = getenv("KILN_DUMP");
  if (!dir || !*dir) return;
  pthread_mutex_lock(&dump_lock);
  int dfd = tr_dump_dir_open();
  if (dfd < 0) {
    pthread_mutex_unlock(&dump_lock);
    return;
  }
  char path[64], name[40];
  snprintf(name, sizeof name, "%016llx%016llx", (unsigned long long)key.hi,
           (unsigned long long)key.lo);
  snprintf(path, sizeof path, "trace-%s.txt", name);
  FILE *f = tr_dump_create(dfd, path);
  if (f) {
    tr_write_ir(f, t, plan, key);
    fclose(f);
  }
  snprintf(path, sizeof path, "trace-%s.dot", name);
  if ((f = tr_dump_create(dfd, path))) {
    write_dot(f, t, plan);
    fclose(f);
  }
  if ((f = tr_dump_append(dfd, "manifest.tsv"))) {
    fprintf(f, "%s\t%d\t%d\t%d\t", name, t->n, plan->n, plan->ngroups);
    for (int i = 0; i < plan->n; i++)
      fprintf(f, i ? ",%s" : "%s", vm_op_table[plan->nodes[i].op].name);
    fputc('\n', f);
    fclose(f);
  }
  close(dfd);
  pthread_mutex_unlock(&dump_lock);
}

void tr_dump_text(const char *name, const char *text) {
  const char *dir = getenv("KILN_DUMP");
  if (!dir || !*dir) return;
  pthread_mutex_lock(&dump_lock);
  int dfd = tr_dump_dir_open();
  FILE *f = dfd >= 0 ? tr_dump_create(dfd, name) : NULL;
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  if (dfd >= 0) close(dfd);
  pthread_mutex_unlock(&dump_lock);
}

int tr_log_level(void) {
  const char *s = getenv("KILN_LOG");
  if (!s) return 0;
  if (!strcmp(s, "debug")) return 2;
  return !strcmp(s, "info") ? 1 : 0;
}

void tr_log_loop(const tr_loop *lp, tr_key key, bool rolled) {
  if (!tr_log_level()) return;
  fprintf(
      stderr,
      "kiln: loop in key %016llx: %d copies of a %d-node body from node %d (inputs: %d carried, "
      "%d invariant, %d stepped, %d per step; outputs: %d last, %d stacked), body %016llx; %s\n",
      (unsigned long long)key.hi, lp->copies, lp->body, lp->start, lp->carried, lp->invariant,
      lp->stepped, lp->per_step, lp->last_outputs, lp->stacked_outputs,
      (unsigned long long)lp->body_hash,
      rolled         ? "run rolled"
      : !lp->carried ? "not rolled (it carries nothing)"
      : !lp->barrier ? "not rolled (elementwise: its copies fuse)"
                     : "not rolled (KILN_ROLL_LOOPS=0, or its nodes on two devices)");
}

static void log_line(const char *what, int nodes, int outs, tr_key key, const cache_sighting *seen,
                     bool planned, double ms, int rc) {
  char declined[160] = "";
  if (seen->declined) /* the payoff rule (trace/flush.c: pays) */
    snprintf(declined, sizeof declined,
             ", not compiled: does not pay yet (would have saved %.3g ms so far, costs %.3g ms; "
             "KILN_PAYOFF=0 compiles it)",
             seen->saving_ms, seen->price_ms);
  fprintf(stderr,
          "kiln: %s %d nodes -> %d outputs, key %016llx: %s, seen %llu%s%s, %s, %.3f ms%s%s\n",
          what, nodes, outs, (unsigned long long)key.hi, seen->new_key ? "miss" : "hit",
          (unsigned long long)seen->sightings, seen->make_plan ? ", planned now" : "",
          seen->over_budget ? ", family over budget" : declined, planned ? "plan" : "interpreter",
          ms, rc ? " FAILED: " : "", rc ? vm_thread()->message : "");
}

void tr_log_steps(int steps, int nodes, int outputs, tr_key key, const cache_sighting *seen,
                  bool planned, double ms) {
  if (!tr_log_level()) return;
  char what[48];
  snprintf(what, sizeof what, "  %d loop step%s of", steps, steps == 1 ? "" : "s");
  log_line(what, nodes, outputs, key, seen, planned, ms, KILN_OK);
}

void tr_log_flush(const tr_trace *t, const char *what, tr_key key, const cache_sighting *seen,
                  bool planned, double ms, int rc) {
  int level = tr_log_level();
  if (!level) return;
  int outs = 0;
  for (int i = 0; i < t->n; i++) outs += t->is_output[i];
  log_line(what, t->n, outs, key, seen, planned, ms, rc);
  if (level < 2) return;
  for (int i = 0; i < t->n; i++) {
    const tr_node *n = t->nodes[i];
    fprintf(stderr, "kiln:   %%%d = %s(", i, vm_op_table[n->op].name);
    for (int k = 0; k < n->nin; k++) {
      if (k) fputs(", ", stderr);
      put_ref(stderr, t->refs[i][k]);
    }
    fputs(") : ", stderr);
    put_meta(stderr, &n->meta);
    /* recomputed: an earlier flush computed it without keeping it */
    fputs(n->state == TR_RECOMPUTABLE ? " recomputed" : "", stderr);
    fputs(t->is_output[i] ? " output\n" : "\n", stderr);
  }
}

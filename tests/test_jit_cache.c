/* test_jit_cache.c — the kernel caches end to end, across processes: a warm
 * disk cache compiles nothing; a corrupted cache file is recovered from; two
 * processes sharing one cache directory both succeed; KILN_CACHE=0 writes
 * nothing; without binutils on PATH the JIT is off with one message;
 * KILN_JIT_OPT_INFO=1 reports vectorized loops; kiln_jit_wait.  The
 * work runs in child processes of this binary ("work" mode),
 * each with its own environment. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ktest.h"

static char self[4096];

/* child: a fused elementwise + reduction program, seen twice so it is
   planned and compiled; prints its result bits and the stats */
static int work(void) {
  int64_t n = 1 << 16, shape[1] = {n};
  kiln_tensor *x = kiln_arange(0, (double)n, 1, KILN_F32);
  kiln_sync(); /* x is a leaf of the trace below, not part of it */
  double total = 0;
  for (int it = 0; it < 3; it++) {
    kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *c = kiln_mul(b, b),
                *s = kiln_sum(c, 0, NULL, false);
    total = kiln_item(s);
    kiln_tensor *all[] = {a, b, c, s};
    for (int i = 0; i < 4; i++) kiln_release(all[i]);
  }
  (void)shape;
  kiln_release(x);
  kiln_stats st;
  kiln_get_stats(&st);
  printf("%a %llu %llu %.0f %.0f %llu\n", total, (unsigned long long)st.compiles,
         (unsigned long long)st.disk_hits, kiln_stat("compiler_processes"),
         kiln_stat("kernels_compiled"), (unsigned long long)st.compile_failures);
  return 0;
}

/* x*1e-4 -> tanh -> square -> sum, run three times (hot, compiled) */
static double tanh_program(kiln_tensor *x) {
  double total = 0;
  for (int it = 0; it < 3; it++) {
    kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *c = kiln_mul(b, b),
                *s = kiln_sum(c, 0, NULL, false);
    total = kiln_item(s);
    kiln_tensor *all[] = {a, b, c, s};
    for (int i = 0; i < 4; i++) kiln_release(all[i]);
  }
  return total;
}

/* child: compiles one program through the helper, then moves
   KILN_CACHE_DIR to `second` (nothing in flight: kiln_jit_wait) and
   compiles another; prints compiler processes and failures */
static int move_cache_work(const char *second) {
  kiln_tensor *x = kiln_arange(0, 1 << 12, 1, KILN_F32);
  kiln_sync();
  tanh_program(x);
  kiln_jit_wait();
  setenv("KILN_CACHE_DIR", second, 1);
  kiln_tensor *y = kiln_arange(0, 1000, 1, KILN_F64); /* other kernels */
  kiln_sync();
  tanh_program(y);
  kiln_jit_wait();
  printf("%.0f %.0f\n", kiln_stat("compiler_processes"), kiln_stat("compile_failures"));
  kiln_release(x);
  kiln_release(y);
  return 0;
}

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* child: a hot trace queued for the background compiler, then main
   returns at once; prints the monotonic time it returned at */
static int exit_work(void) {
  kiln_tensor *x = kiln_arange(0, 1 << 12, 1, KILN_F32);
  kiln_sync();
  for (int it = 0; it < 3; it++) {
    kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *c = kiln_mul(b, b),
                *s = kiln_sum(c, 0, NULL, false);
    (void)kiln_item(s);
    kiln_tensor *all[] = {a, b, c, s};
    for (int i = 0; i < 4; i++) kiln_release(all[i]);
  }
  kiln_release(x);
  struct timespec pause = {0, 200 * 1000000}; /* the compiler process is running by now */
  nanosleep(&pause, NULL);
  printf("%.3f %.0f\n", mono_ms(), kiln_stat("compiler_processes"));
  fflush(stdout);
  return 0;
}

/* child: with the default background compiler, a hot trace runs compiled
   once kiln_jit_wait() returns; prints "1" when it did */
static int async_work(bool wait) {
  kiln_tensor *x = kiln_arange(0, 1 << 15, 1, KILN_F32);
  kiln_sync(); /* x is a leaf of the trace below, not part of it */
  double first = 0, last = 0;
  for (int it = 0; it < 3; it++) {
    kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *s = kiln_sum(b, 0, NULL, false);
    last = kiln_item(s);
    if (it == 0) first = last;
    kiln_tensor *all[] = {a, b, s};
    for (int i = 0; i < 3; i++) kiln_release(all[i]);
  }
  if (wait) kiln_jit_wait();
  kiln_stats before, after;
  kiln_get_stats(&before);
  kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *s = kiln_sum(b, 0, NULL, false);
  last = kiln_item(s);
  kiln_get_stats(&after);
  kiln_tensor *all[] = {a, b, s, x};
  for (int i = 0; i < 4; i++) kiln_release(all[i]);
  /* compiled: no op ran on the interpreter (eager_ops counts those) */
  printf("%d\n", after.eager_ops == before.eager_ops && fabs(last - first) <= 1e-5 * fabs(first));
  return 0;
}

typedef struct {
  double total;
  unsigned long long compiles, disk_hits;
  double processes, kernels;
  unsigned long long failures;
  int ok;
} result;

static result read_result(FILE *p) {
  result r = {0};
  if (!p) return r;
  r.ok = fscanf(p, "%la %llu %llu %lf %lf %llu", &r.total, &r.compiles, &r.disk_hits, &r.processes,
                &r.kernels, &r.failures) == 6;
  r.ok = pclose(p) == 0 && r.ok;
  return r;
}

static result run_child(const char *env) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "env %s KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work", env, self);
  return read_result(popen(cmd, "r"));
}

static void corrupt_all(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "kernel-", 7) != 0) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r+b");
    if (!f) continue;
    fseek(f, 200, SEEK_SET); /* inside the ELF payload */
    int ch = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
  }
  if (d) closedir(d);
}

/* kernel files in dir whose names end in suffix ("" for all) */
static int count_suffix(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  size_t ls = strlen(suffix);
  while (d && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    n += !strncmp(e->d_name, "kernel-", 7) && l > ls && !strcmp(e->d_name + l - ls, suffix);
  }
  if (d) closedir(d);
  return n;
}

static char *read_text(const char *path, char *text, size_t cap) {
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(text, 1, cap - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  return text;
}

/* keyed by this build's ID (by_source false) or by the kernels' printed
   source, as builds without an ID are */
static void warm_cache_case(bool by_source) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", env[256];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s KILN_CACHE_BY_SOURCE=%d", dir, by_source);
  result cold = run_child(env), warm = run_child(env);
  CHECK(cold.ok && warm.ok);
  CHECK(cold.compiles >= 1);
  CHECK_EQ_INT(cold.disk_hits, 0);
  CHECK(count_suffix(dir, "") >= 1);
  CHECK_EQ_INT(warm.compiles, 0);
  CHECK(warm.disk_hits >= 1);
  CHECK(warm.total == cold.total);
  /* a corrupted file is deleted and recompiled, with the same result */
  corrupt_all(dir);
  result again = run_child(env);
  CHECK(again.ok);
  CHECK(again.compiles >= 1);
  CHECK(again.total == cold.total);
  result after = run_child(env);
  CHECK(after.ok && after.compiles == 0 && after.disk_hits >= 1);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

TEST(warm_disk_cache_compiles_nothing) {
  warm_cache_case(false);
  warm_cache_case(true);
}

TEST(two_processes_share_a_cache_directory) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[12000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(
      cmd, sizeof cmd,
      "env KILN_CACHE_DIR=%s KILN_ASYNC=0 '%s' work > %s/a.out & pa=$!;"
      " env KILN_CACHE_DIR=%s KILN_ASYNC=0 '%s' work > %s/b.out & pb=$!;"
      " wait $pa && wait $pb && [ \"$(cut -d' ' -f1 %s/a.out)\" = \"$(cut -d' ' -f1 %s/b.out)\" ]",
      dir, self, dir, dir, self, dir, dir, dir);
  CHECK(system(cmd) == 0); /* both succeeded, with the same result */
  CHECK(count_suffix(dir, "") >= 1);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

TEST(cache_off_writes_nothing) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", env[256];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(env, sizeof env, "KILN_CACHE=0 KILN_CACHE_DIR=%s", dir);
  result r = run_child(env), r2 = run_child(env);
  CHECK(r.ok && r2.ok);
  CHECK(r.compiles >= 1 && r2.compiles >= 1); /* nothing was kept between them */
  CHECK_EQ_INT(r2.disk_hits, 0);
  CHECK_EQ_INT(count_suffix(dir, ""), 0);
  rmdir(dir);
}

/* without binutils on PATH the JIT says so once and the program still
   computes the same result on the interpreter */
TEST(missing_toolchain_is_reported_once) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", env[512], log[600], cmd[9000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s", dir);
  result ref = run_child(env);
  snprintf(log, sizeof log, "%s/stderr", dir);
  snprintf(env, sizeof env, "PATH=%s KILN_CACHE_DIR=%s", dir, dir);
  snprintf(cmd, sizeof cmd, "env %s KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work 2>'%s'", env,
           self, log);
  result r = read_result(popen(cmd, "r"));
  CHECK(ref.ok && r.ok);
  CHECK_EQ_INT(r.compiles, 0);
  CHECK_CLOSE(r.total, ref.total, 1e-5);
  char text[4096];
  CHECK_STR_CONTAINS(read_text(log, text, sizeof text),
                     "the CPU JIT is off: the assembler 'as' is not on PATH");
  const char *second = strstr(text, "CPU JIT is off");
  CHECK(second && !strstr(second + 1, "CPU JIT is off")); /* once */
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* KILN_JIT_OPT_INFO=1 passes GCC's vectorization report through to
   stderr while compiling (the reduction's lane loop is vectorized); off by
   default */
TEST(opt_info_reports_vectorized_loops) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000], log[600];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(log, sizeof log, "%s/stderr", dir);
  for (int on = 0; on <= 1; on++) {
    snprintf(cmd, sizeof cmd,
             "env KILN_CACHE=0 KILN_JIT_OPT_INFO=%d KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' "
             "work >/dev/null 2>'%s'",
             on, self, log);
    CHECK(system(cmd) == 0);
    char text[1 << 15];
    read_text(log, text, sizeof text);
    if (on)
      CHECK_STR_CONTAINS(text, "loop vectorized");
    else
      CHECK(!strstr(text, "vectorized"));
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* kiln_jit_wait waits for the background compiler; a warm start needs no wait */
TEST(jit_wait_then_compiled) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR=%s '%s' async", dir, self);
  FILE *p = popen(cmd, "r");
  int ok = 0;
  CHECK(p && fscanf(p, "%d", &ok) == 1);
  if (p) CHECK(pclose(p) == 0);
  CHECK_EQ_INT(ok, 1);
  /* a warm start: the plan loads from the disk cache when it is planned,
     so it runs compiled right away, with no wait */
  snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR=%s '%s' async-nowait", dir, self);
  p = popen(cmd, "r");
  ok = 0;
  CHECK(p && fscanf(p, "%d", &ok) == 1);
  if (p) CHECK(pclose(p) == 0);
  CHECK_EQ_INT(ok, 1);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* kernels compile in kiln-jitc processes (jit_cpu/jitc.h), with results
   equal to compiling in this process (KILN_COMPILER=thread) and to the
   interpreter */
TEST(compiles_run_in_the_compiler_process) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", env[512];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s", dir);
  result outside = run_child(env);
  CHECK(outside.ok);
  CHECK(outside.processes >= 1);
  CHECK(outside.kernels >= 1);
  CHECK_EQ_INT(outside.failures, 0);
  CHECK(count_suffix(dir, ".idx") >= 1 && count_suffix(dir, ".so") >= 1);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s/in KILN_COMPILER=thread", dir);
  result inside = run_child(env);
  CHECK(inside.ok && inside.processes == 0 && inside.kernels >= 1);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s/eager KILN_JIT=0", dir);
  result eager = run_child(env);
  CHECK(eager.ok && eager.kernels == 0);
  CHECK(outside.total == inside.total && outside.total == eager.total);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* child: counts the SIGCHLDs this process gets while its kernels compile
   in the compiler process; prints them, compiler processes, kernels */
static volatile sig_atomic_t sigchlds;
static void on_sigchld(int sig) {
  (void)sig;
  sigchlds++;
}
static int sigchld_work(void) {
  struct sigaction sa = {.sa_handler = on_sigchld};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  kiln_tensor *x = kiln_arange(0, 1 << 12, 1, KILN_F32);
  kiln_sync();
  tanh_program(x);
  kiln_jit_wait();
  kiln_release(x);
  printf("%d %.0f %.0f\n", (int)sigchlds, kiln_stat("compiler_processes"),
         kiln_stat("kernels_compiled"));
  return 0;
}

/* A compile in the compiler process sends this process no SIGCHLD
   (kiln-jitc is the child of a watcher that ends with no signal).  A
   runtime that catches SIGCHLD (Ruby 3.1) stops the evaluation in flight
   on each one, and it started over: Ruby ran a long flush twice per
   compile batch. */
TEST(a_compile_sends_no_sigchld) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[5000], line[256] = "";
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR=%s KILN_HOT=2 '%s' sigchld", dir, self);
  FILE *f = popen(cmd, "r");
  CHECK(f != NULL);
  if (f && !fgets(line, sizeof line, f)) line[0] = 0;
  if (f) CHECK(pclose(f) == 0);
  int signals = -1;
  double processes = 0, kernels = 0;
  CHECK(sscanf(line, "%d %lf %lf", &signals, &processes, &kernels) == 3);
  CHECK(processes >= 1 && kernels >= 1);
  CHECK_EQ_INT(signals, 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* the compiler process dying mid-compile costs that compile: the program
   goes on, on the interpreter, with the same result, and says so once */
TEST(compiler_crash_costs_a_compile) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", env[512], log[600], cmd[9000], text[8192];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(env);
  snprintf(log, sizeof log, "%s/stderr", dir);
  snprintf(cmd, sizeof cmd,
           "env KILN_CACHE_DIR=%s KILN_JITC_FAULT=crash KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' "
           "work 2>'%s'",
           dir, self, log);
  result r = read_result(popen(cmd, "r"));
  CHECK(ref.ok && r.ok);
  CHECK(r.processes >= 1);
  CHECK_EQ_INT(r.kernels, 0);
  CHECK(r.failures >= 1);
  CHECK(r.total == ref.total);
  CHECK_STR_CONTAINS(read_text(log, text, sizeof text), "the compiler process died of signal 6");
  CHECK_EQ_INT(count_suffix(dir, ".idx"), 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* A batch's index records are written before its object: a compiler
   that dies between the two leaves records that name no object, never an
   object no record names.  The next process misses on them, compiles, and
   stores the object. */
TEST(a_compiler_dying_mid_store_leaves_no_orphan_object) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(cmd);
  snprintf(cmd, sizeof cmd,
           "env KILN_CACHE_DIR=%s/c KILN_JITC_FAULT=after-index KILN_HOT=2 KILN_PAYOFF=0 "
           "KILN_ASYNC=0 '%s' work "
           "2>/dev/null",
           dir, self);
  result r = read_result(popen(cmd, "r"));
  CHECK(r.ok && ref.ok && r.total == ref.total);
  CHECK(r.kernels == 0 && r.failures >= 1);
  char cache[700];
  snprintf(cache, sizeof cache, "%s/c", dir);
  CHECK(count_suffix(cache, ".idx") >= 1);
  CHECK_EQ_INT(count_suffix(cache, ".so"), 0); /* no object without its records */
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/c", dir);
  result again = run_child(cmd);
  CHECK(again.ok && again.total == ref.total);
  CHECK(again.kernels >= 1 && again.failures == 0);
  CHECK(count_suffix(cache, ".so") >= 1);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* a kiln-jitc from other sources refuses; the library says so once and
   compiles in its own process, with the same result */
TEST(stale_compiler_process_is_refused) {
  /* in the build tree: a helper under /tmp (writable by all) is never run */
  char dir[700], log[800], fake[800], cmd[9000], text[8192];
  char cwd[600];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  snprintf(dir, sizeof dir, "%s/kiln-cache-test-XXXXXX", cwd);
  CHECK(mkdtemp(dir) != NULL);
  snprintf(fake, sizeof fake, "%s/kiln-jitc", dir);
  FILE *f = fopen(fake, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(
      "#!/bin/sh\ncat >/dev/null\necho 'KILNJC-STALE: built from sources 0000, the library from "
      "1111'\nexit 3\n",
      f);
  fclose(f);
  CHECK(chmod(fake, 0700) == 0);
  snprintf(log, sizeof log, "%s/stderr", dir);
  snprintf(cmd, sizeof cmd,
           "env KILN_CACHE_DIR=%s/c KILN_JITC='%s' KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work "
           "2>'%s'",
           dir, fake, self, log);
  result r = read_result(popen(cmd, "r"));
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(cmd);
  CHECK(r.ok && ref.ok);
  CHECK(r.kernels >= 1); /* compiled here instead */
  CHECK(r.total == ref.total);
  CHECK_STR_CONTAINS(read_text(log, text, sizeof text),
                     "was built from other sources than this library");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* a planted helper is never run (DESIGN §11): one beside this statically
   linked program (where the library looked before), and one named by
   KILN_JITC in a directory others can write to; each would leave a marker
   file.  The kernels compile in the process instead, to the same result. */
TEST(a_planted_helper_is_never_run) {
  char cwd[600], dir[700], fake[800], marker[800], beside[4200], log[800], cmd[9000], text[8192];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  snprintf(dir, sizeof dir, "%s/kiln-planted-XXXXXX", cwd);
  CHECK(mkdtemp(dir) != NULL);
  snprintf(marker, sizeof marker, "%s/ran", dir);
  char script[1200];
  snprintf(script, sizeof script, "#!/bin/sh\ntouch '%s'\ncat >/dev/null\nexit 1\n", marker);
  snprintf(fake, sizeof fake, "%s/kiln-jitc", dir);
  FILE *f = fopen(fake, "w");
  if (f) fputs(script, f), fclose(f);
  CHECK(chmod(fake, 0755) == 0 && chmod(dir, 0777) == 0); /* others may write the directory */
  char self_dir[sizeof self];
  memcpy(self_dir, self, sizeof self);
  char *slash = strrchr(self_dir, '/');
  if (slash) *slash = 0;
  snprintf(beside, sizeof beside, "%s/kiln-jitc", slash ? self_dir : ".");
  bool planted = access(beside, F_OK) != 0;
  if (planted && (f = fopen(beside, "w"))) fputs(script, f), fclose(f), chmod(beside, 0755);
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(cmd);
  for (int k = 0; k < 2; k++) {
    snprintf(log, sizeof log, "%s/stderr%d", dir, k);
    char helper_var[900] = "-u KILN_JITC"; /* case 0: the one beside the program */
    if (k == 1) snprintf(helper_var, sizeof helper_var, "KILN_JITC='%s'", fake);
    snprintf(cmd, sizeof cmd,
             "env %s KILN_CACHE_DIR=%s/c%d KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work 2>'%s'",
             helper_var, dir, k, self, log);
    result r = read_result(popen(cmd, "r"));
    CHECK(r.ok && ref.ok);
    CHECK(r.kernels >= 1); /* compiled in the process */
    CHECK(r.total == ref.total);
    if (access(marker, F_OK) == 0) KTEST_FAIL("case %d: the planted helper ran", k);
    if (k == 1)
      CHECK_STR_CONTAINS(read_text(log, text, sizeof text), "not running the compiler helper");
  }
  if (planted) unlink(beside);
  chmod(dir, 0700);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* our own helper in a sticky world-writable directory (a build tree under
   /tmp) runs: others may add files there but not replace ours */
TEST(our_helper_in_a_sticky_directory_runs) {
  const char *real = getenv("KILN_JITC");
  if (!real || !*real) {
    printf(
        "our_helper_in_a_sticky_directory_runs: skipped (KILN_JITC unset: run it under ctest)\n");
    return;
  }
  char dir[] = "/tmp/kiln-sticky-XXXXXX", copy[600], cmd[9000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(copy, sizeof copy, "%s/kiln-jitc", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 0755 '%s' && chmod 01777 '%s'", real, copy, copy,
           dir);
  CHECK(system(cmd) == 0);
  snprintf(cmd, sizeof cmd,
           "env KILN_JITC='%s' KILN_CACHE_DIR=%s/c KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work",
           copy, dir, self);
  result r = read_result(popen(cmd, "r"));
  CHECK(r.ok);
  CHECK(r.processes >= 1);
  CHECK(r.kernels >= 1);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* A setuid program ignores KILN_JITC (read with secure_getenv): run as
   nobody, a setuid-root copy of this test given a helper that would leave
   a marker as root compiles in its own process instead.  Needs root to
   make the copy and setpriv to drop to nobody; skipped otherwise, or where
   the filesystem ignores the setuid bit. */
TEST(a_setuid_program_ignores_KILN_JITC) {
  if (geteuid() != 0 || system("command -v setpriv >/dev/null 2>&1") != 0) {
    printf("a_setuid_program_ignores_KILN_JITC: skipped (needs root and setpriv)\n");
    return;
  }
  char cwd[600], dir[700], prog[800], fake[800], marker[800], cmd[9000];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  snprintf(dir, sizeof dir, "%s/kiln-setuid-XXXXXX", cwd);
  CHECK(mkdtemp(dir) != NULL);
  snprintf(prog, sizeof prog, "%s/prog", dir);
  snprintf(fake, sizeof fake, "%s/kiln-jitc", dir);
  char marks[760];
  snprintf(marks, sizeof marks, "%s/marks",
           dir); /* writable by the helper whatever user the shell drops to */
  CHECK(mkdir(marks, 0700) == 0 && chmod(marks, 01777) == 0);
  snprintf(marker, sizeof marker, "%s/helper-ran", marks);
  FILE *f = fopen(fake, "w");
  if (f) fprintf(f, "#!/bin/sh\ntouch '%s'\ncat >/dev/null\nexit 1\n", marker), fclose(f);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 4755 '%s' && chmod 0755 '%s' '%s'", self, prog,
           prog, fake, dir);
  CHECK(system(cmd) == 0);
  /* the cache belongs to root, whom the program runs as */
  snprintf(cmd, sizeof cmd,
           "cd / && env KILN_JITC='%s' KILN_CACHE_DIR='%s/c' KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 "
           "setpriv --reuid=65534 --regid=65534 --clear-groups '%s' euid-work 2>/dev/null",
           fake, dir, prog);
  FILE *p = popen(cmd, "r");
  unsigned euid = 1;
  double kernels = -1;
  bool read_ok = p && fscanf(p, "%u %lf", &euid, &kernels) == 2;
  if (p) pclose(p);
  if (!read_ok || euid != 0) {
    printf("a_setuid_program_ignores_KILN_JITC: skipped (the setuid bit did not take here)\n");
  } else {
    if (access(marker, F_OK) == 0) KTEST_FAIL("a setuid-root program ran the caller's KILN_JITC");
    CHECK(kernels >= 1); /* compiled in its own process */
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* libgccjit's driver finds `as` and `ld` through PATH: with "." on PATH
   an `as` planted in the working directory would run.  A process whose
   PATH has a relative entry (or COMPILER_PATH set) compiles nothing in
   itself — the kernels stay interpreted, with one message — and the
   planted program never runs; kiln-jitc, whose PATH is the system's,
   still compiles them. */
TEST(a_relative_path_never_runs_a_planted_assembler) {
  char cwd[600], dir[700], marker[800], as[800], cmd[9000], text[8192], log[800];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  snprintf(dir, sizeof dir, "%s/kiln-planted-as-XXXXXX", cwd);
  CHECK(mkdtemp(dir) != NULL);
  snprintf(marker, sizeof marker, "%s/ran", dir);
  snprintf(as, sizeof as, "%s/as", dir);
  FILE *f = fopen(as, "w");
  if (f) fprintf(f, "#!/bin/sh\ntouch '%s'\nexit 1\n", marker), fclose(f);
  CHECK(chmod(as, 0755) == 0);
  snprintf(log, sizeof log, "%s/stderr", dir);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && env PATH=.:\"$PATH\" KILN_CACHE=0 KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 "
           "'%s' work 2>'%s'",
           dir, self, log);
  result r = read_result(popen(cmd, "r"));
  result ref = run_child("KILN_CACHE=0 KILN_JIT=0");
  CHECK(r.ok && ref.ok);
  CHECK(r.total == ref.total);
  CHECK(r.kernels == 0); /* in this process: nothing compiled */
  if (access(marker, F_OK) == 0) KTEST_FAIL("the planted ./as ran");
  CHECK_STR_CONTAINS(read_text(log, text, sizeof text), "PATH has a relative entry");
  /* with the compiler helper (a cache to store into), the kernels compile */
  snprintf(cmd, sizeof cmd,
           "cd '%s' && env PATH=.:\"$PATH\" KILN_CACHE_DIR='%s/c' KILN_HOT=2 KILN_PAYOFF=0 "
           "KILN_ASYNC=0 '%s' work 2>/dev/null",
           dir, dir, self);
  r = read_result(popen(cmd, "r"));
  CHECK(r.ok && r.total == ref.total);
  CHECK(r.processes >= 1 && r.kernels >= 1);
  if (access(marker, F_OK) == 0) KTEST_FAIL("the planted ./as ran (with the helper)");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* a helper that never answers is killed after KILN_COMPILE_TIMEOUT
   seconds; its kernels run on the interpreter and the program goes on */
TEST(a_stuck_helper_is_killed_after_the_timeout) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", log[600], cmd[9000], text[8192];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(log, sizeof log, "%s/stderr", dir);
  snprintf(cmd, sizeof cmd,
           "env KILN_CACHE_DIR=%s/c KILN_JITC_FAULT=sleep:600000 KILN_COMPILE_TIMEOUT=1 "
           "KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work 2>'%s'",
           dir, self, log);
  double t0 = mono_ms();
  result r = read_result(popen(cmd, "r"));
  double took = mono_ms() - t0;
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(cmd);
  CHECK(r.ok && ref.ok);
  CHECK(r.total == ref.total);
  if (took > 60000) KTEST_FAIL("the program took %.0f ms with a 1 s compile timeout", took);
  CHECK_STR_CONTAINS(read_text(log, text, sizeof text),
                     "did not answer in 1 s (KILN_COMPILE_TIMEOUT)");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* The helper takes its environment once (a copy: reading `environ` at each
   spawn raced with setenv on the caller's threads), but stores where the
   library looks at each spawn: a program that moves KILN_CACHE_DIR
   between compiles finds the second compile's kernels in the new directory. */
TEST(the_helper_stores_where_the_library_looks_now) {
  char first[] = "/tmp/kiln-cache-test-XXXXXX", second[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000];
  CHECK(mkdtemp(first) != NULL && mkdtemp(second) != NULL);
  snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR=%s KILN_HOT=2 KILN_PAYOFF=0 '%s' move-cache '%s'",
           first, self, second);
  FILE *p = popen(cmd, "r");
  double processes = 0, failures = -1;
  CHECK(p && fscanf(p, "%lf %lf", &processes, &failures) == 2);
  CHECK(p && pclose(p) == 0);
  CHECK(processes >= 2);
  CHECK(failures == 0);
  int objects[2] = {0, 0};
  const char *dirs[2] = {first, second};
  for (int k = 0; k < 2; k++) {
    DIR *d = opendir(dirs[k]);
    for (struct dirent *e; d && (e = readdir(d));) objects[k] += strstr(e->d_name, ".so") != NULL;
    if (d) closedir(d);
  }
  if (objects[0] < 1 || objects[1] < 1)
    KTEST_FAIL("compiled objects: %d in the first directory, %d in the second", objects[0],
               objects[1]);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", first, second);
  CHECK(system(cmd) == 0);
}

/* A cache directory that can be read but not written — a read-only
   mount, a full disk — compiles in memory, says so once, and runs the
   kernels compiled (it kept every kernel on the interpreter, failing each
   compile, before).  The mounts need root (CI is root); elsewhere a
   directory without write permission stands in for them. */
TEST(a_cache_that_cannot_be_written_compiles_in_memory) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000], log[600], text[8192];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd, "KILN_CACHE_DIR=%s/ref KILN_JIT=0", dir);
  result ref = run_child(cmd);
  static const char *const mounts[] = {"-o size=1m,mode=0700,ro", "-o size=16k,mode=0700"};
  bool root = geteuid() == 0;
  for (int k = 0; k < (root ? 2 : 1); k++) {
    char at[700];
    snprintf(at, sizeof at, "%s/m%d", dir, k);
    CHECK(mkdir(at, 0700) == 0);
    if (root) {
      snprintf(cmd, sizeof cmd, "mount -t tmpfs %s tmpfs '%s' 2>/dev/null", mounts[k], at);
      if (system(cmd) != 0) {
        printf(
            "a_cache_that_cannot_be_written_compiles_in_memory: skipped (cannot mount a tmpfs "
            "here)\n");
        break;
      }
    } else {
      CHECK(chmod(at, 0500) == 0);
    }
    snprintf(log, sizeof log, "%s/stderr%d", dir, k);
    snprintf(cmd, sizeof cmd,
             "env KILN_CACHE_DIR='%s' KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' work 2>'%s'", at,
             self, log);
    result r = read_result(popen(cmd, "r"));
    CHECK(r.ok && ref.ok);
    CHECK(r.total == ref.total);
    CHECK(r.kernels >= 1); /* compiled, in memory */
    CHECK(r.failures == 0);
    const char *said = read_text(log, text, sizeof text);
    CHECK_STR_CONTAINS(said, "cannot be written");
    CHECK_STR_CONTAINS(said, "kernels compile in memory");
    int times = 0;
    for (const char *at_msg = said; at_msg && (at_msg = strstr(at_msg, "cannot be written"));
         at_msg++)
      times++;
    CHECK_EQ_INT(times, 1);
    if (root) {
      snprintf(cmd, sizeof cmd, "umount '%s'", at);
      CHECK(system(cmd) == 0);
    } else {
      chmod(at, 0700);
    }
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* exit never waits for a compile: a process whose compile is in flight
   (the compiler process sleeps 1.5 s first) ends at once; the compile
   finishes into the cache on its own, and the next process loads it */
TEST(exit_does_not_wait_for_a_compile) {
  char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(
      cmd, sizeof cmd,
      "exec env KILN_CACHE_DIR=%s KILN_JITC_FAULT=sleep:1500 KILN_HOT=2 KILN_PAYOFF=0 '%s' exit",
      dir, self);
  FILE *p = popen(cmd, "r");
  double returned = 0, processes = 0;
  CHECK(p && fscanf(p, "%lf %lf", &returned, &processes) == 2);
  /* to its end: nothing the compile runs in holds the child's stdout (the
     watcher of kiln-jitc closes every descriptor; a copy of this pipe held
     it open until the compile ended) */
  while (p && fgetc(p) != EOF) {
  }
  int status = p ? pclose(p) : -1;
  double ended = mono_ms();
  CHECK_EQ_INT(status, 0);
  CHECK(processes >= 1);
  CHECK(ended - returned < 500);              /* the compile had over 1 s to go */
  CHECK_EQ_INT(count_suffix(dir, ".idx"), 0); /* still in flight */
  for (int i = 0; i < 300 && count_suffix(dir, ".idx") == 0; i++) {
    struct timespec ts = {0, 100 * 1000000};
    nanosleep(&ts, NULL);
  }
  CHECK(count_suffix(dir, ".idx") >= 1);
  /* the orphaned compile left a valid cache: the same work loads it */
  char env[512];
  snprintf(env, sizeof env, "KILN_CACHE_DIR=%s", dir);
  result warm = run_child(env);
  CHECK(warm.ok && warm.disk_hits >= 1 && warm.kernels == 0 && warm.processes == 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* child: a GRU cell's gates, read as column slices of two [B, 3H] matmul
   results (step argv[2] along the last axis: 1 as a GRU's, 2 as a strided
   view), computed three times so the chain is compiled; prints the bits of
   a few outputs */
static int gates_work(int step) {
  int64_t B = 8, H = 32, in[2] = {B, 16}, w[2] = {16, 3 * H * step};
  kiln_manual_seed(3);
  kiln_tensor *x = kiln_randn(KILN_F32, 2, in), *wx = kiln_randn(KILN_F32, 2, w),
              *wh = kiln_randn(KILN_F32, 2, w);
  kiln_sync();
  float got[3] = {0};
  for (int it = 0; it < 3; it++) {
    kiln_tensor *gx = kiln_matmul(x, wx), *gh = kiln_matmul(x, wh), *g[6];
    for (int k = 0; k < 3; k++) {
      g[k] = kiln_slice(gx, 1, k * H * step, (k + 1) * H * step, step);
      g[3 + k] = kiln_slice(gh, 1, k * H * step, (k + 1) * H * step, step);
    }
    kiln_tensor *sr = kiln_add(g[0], g[3]), *r = kiln_sigmoid(sr), *sz = kiln_add(g[1], g[4]),
                *z = kiln_sigmoid(sz), *rn = kiln_mul(r, g[5]), *sn = kiln_add(g[2], rn),
                *n = kiln_tanh(sn), *out = kiln_mul(z, n);
    float all[8 * 32];
    if (kiln_to_buffer(out, all, sizeof all) != KILN_OK) return 1;
    got[0] = all[0], got[1] = all[77], got[2] = all[255];
    kiln_tensor *tmp[] = {gx, gh, g[0], g[1], g[2], g[3], g[4], g[5], sr, r, sz, z, rn, sn, n, out};
    for (int i = 0; i < 16; i++) kiln_release(tmp[i]);
  }
  kiln_release(x), kiln_release(wx), kiln_release(wh);
  printf("%a %a %a %.0f\n", got[0], got[1], got[2],
         kiln_stat("kernels_compiled") + kiln_stat("disk_hits"));
  return 0;
}

/* how a fused kernel reads its operands: a column slice of a fresh value
   (a GRU gate) has unit inner stride and is read at off + j, a loop GCC
   vectorizes; a slice stepping 2 along the last axis is read at
   off + j*step.  Both give the interpreter's bits. */
static bool kernels_contain(const char *dir, const char *needle) {
  DIR *d = opendir(dir);
  bool found = false;
  struct dirent *e;
  while (d && (e = readdir(d)) && !found) {
    size_t l = strlen(e->d_name);
    if (strncmp(e->d_name, "kernel-", 7) || l < 3 || strcmp(e->d_name + l - 2, ".c") ||
        strstr(e->d_name, "reproducer"))
      continue;
    char path[8192], text[1 << 16];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    found = strstr(read_text(path, text, sizeof text), needle) != NULL;
  }
  if (d) closedir(d);
  return found;
}

TEST(sliced_operands_are_read_at_unit_stride) {
  for (int step = 1; step <= 2; step++) {
    char dir[] = "/tmp/kiln-cache-test-XXXXXX", cmd[9000], want[256] = "", got[256] = "";
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "env KILN_JIT=0 '%s' gates %d", self, step);
    FILE *p = popen(cmd, "r");
    CHECK(p && fgets(want, sizeof want, p));
    if (p) pclose(p);
    snprintf(cmd, sizeof cmd,
             "env KILN_CACHE=0 KILN_DUMP='%s' KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' gates %d",
             dir, self, step);
    p = popen(cmd, "r");
    CHECK(p && fgets(got, sizeof got, p));
    if (p) CHECK(pclose(p) == 0);
    double kernels = 0;
    CHECK(sscanf(got, "%*s %*s %*s %lf", &kernels) == 1 && kernels >= 1);
    char *cw = strrchr(want, ' '), *cg = strrchr(got, ' '); /* the bits, not the counts */
    if (cw) *cw = 0;
    if (cg) *cg = 0;
    CHECK(cw && cg);
    if (strcmp(got, want))
      fprintf(stderr, "step %d: compiled %s, interpreted %s\n", step, got, want);
    CHECK(!strcmp(got, want));
    CHECK(count_suffix(dir, ".c") >= 1);
    if (step == 1)
      CHECK(!kernels_contain(dir, "* step_"));
    else
      CHECK(kernels_contain(dir, "* step_"));
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
  }
}

/* the bits of n floats, folded (FNV-1a) */
static unsigned long long bits_of(const float *v, size_t n) {
  unsigned long long h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)v;
  for (size_t i = 0; i < n * sizeof *v; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* one of fills_work's programs on x16 (16 values) and m ([64, 300]); its
   result's bits */
static unsigned long long fill_program(int which, kiln_tensor *x16, kiln_tensor *m) {
  static float out[64 * 300];
  kiln_tensor *r = NULL;
  if (which == 0) { /* W5: 100 scalar ops, one kernel reading 100 fills */
    r = kiln_retain(x16);
    for (int k = 0; k < 100; k++) {
      kiln_tensor *next = k % 2 ? kiln_add_scalar(r, 0.01) : kiln_mul_scalar(r, 1.01);
      kiln_release(r);
      r = next;
    }
  } else {
    kiln_tensor *a = kiln_mul_scalar(m, which == 3 ? 0.5 : 1.5),
                *b = kiln_add_scalar(a, which == 2 ? -1.0 : 0.25);
    if (which == 1) r = kiln_sum(b, 0, NULL, false);       /* a reduction over every element */
    if (which == 2) r = kiln_sum(b, 1, (int[]){0}, false); /* a column reduction */
    if (which == 3) r = kiln_softmax(b, -1);               /* a row kernel */
    kiln_release(a);
    kiln_release(b);
  }
  size_t n = (size_t)kiln_numel(r);
  if (kiln_to_buffer(r, out, n * sizeof *out) != KILN_OK) n = 0;
  kiln_release(r);
  return bits_of(out, n);
}

/* child: programs whose kernels read host scalars from outside their group
   (fill_program), each run 4 times; prints per program its result's bits
   and how many ops its last run ran on the interpreter */
static int fills_work(void) {
  float init[16];
  for (int i = 0; i < 16; i++) init[i] = 0.1f * (float)i;
  int64_t n16 = 16;
  kiln_tensor *x16 = kiln_from_data(init, KILN_F32, 1, &n16);
  kiln_tensor *flat = kiln_arange(0, 64 * 300, 1, KILN_F32),
              *shaped = kiln_reshape(flat, 2, (int64_t[]){64, 300});
  kiln_tensor *m = kiln_mul_scalar(shaped, 1e-3);
  kiln_eval(1, &m); /* a leaf of the programs below */
  for (int which = 0; which < 4; which++) {
    unsigned long long bits = 0;
    kiln_stats before = {0}, after = {0};
    for (int it = 0; it < 4; it++) {
      kiln_get_stats(&before);
      bits = fill_program(which, x16, m);
      kiln_get_stats(&after);
    }
    printf("%016llx %llu %llu ", bits, (unsigned long long)(after.eager_ops - before.eager_ops),
           (unsigned long long)(after.kernels_launched - before.kernels_launched));
  }
  printf("\n");
  kiln_tensor *all[] = {x16, flat, shaped, m};
  for (int i = 0; i < 4; i++) kiln_release(all[i]);
  return 0;
}

/* per program of fills_work: bits, interpreted ops, kernels launched */
static bool read_fills(const char *line, unsigned long long (*r)[3]) {
  int at = 0, used = 0;
  for (int w = 0; w < 4; w++, at += used)
    if (sscanf(line + at, "%llx %llu %llu %n", &r[w][0], &r[w][1], &r[w][2], &used) != 3)
      return false;
  return true;
}

/* Fills are never a kernel's outputs and kernels take the scalars of those
   made outside their group as values: once compiled, a chain of 100
   scalar ops, a sum, a column sum and a row softmax over scaled inputs are
   one kernel launch each and nothing on the interpreter, with the
   interpreter's bits.  (The fills were a kernel of their own, storing a
   0-d tensor per fill per run: W5 spent a fifth of its time there.) */
TEST(fills_are_values_not_buffers) {
  char cmd[9000], want[512] = "", got[512] = "";
  snprintf(cmd, sizeof cmd, "env KILN_JIT=0 '%s' fills", self);
  FILE *p = popen(cmd, "r");
  CHECK(p && fgets(want, sizeof want, p));
  if (p) CHECK(pclose(p) == 0);
  snprintf(cmd, sizeof cmd, "env KILN_CACHE=0 KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 '%s' fills",
           self);
  p = popen(cmd, "r");
  CHECK(p && fgets(got, sizeof got, p));
  if (p) CHECK(pclose(p) == 0);
  unsigned long long w[4][3] = {{0}}, g[4][3] = {{0}};
  CHECK(read_fills(want, w));
  CHECK(read_fills(got, g));
  for (int k = 0; k < 4; k++) {
    if (g[k][0] != w[k][0] || g[k][1] != 0 || g[k][2] != 1)
      fprintf(
          stderr,
          "program %d: bits %016llx (interpreter %016llx), %llu interpreted ops, %llu launches\n",
          k, g[k][0], w[k][0], g[k][1], g[k][2]);
    CHECK(g[k][0] == w[k][0]);
    CHECK(g[k][1] == 0 && g[k][2] == 1);
    CHECK(w[k][1] > 0); /* the counts are live */
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "work")) return work();
  if (argc > 1 && !strcmp(argv[1], "fills")) return fills_work();
  if (argc > 1 && !strcmp(argv[1], "sigchld")) return sigchld_work();
  if (argc > 2 && !strcmp(argv[1], "move-cache")) return move_cache_work(argv[2]);
  if (argc > 1 && !strcmp(argv[1], "euid-work")) { /* the setuid test's child */
    kiln_tensor *x = kiln_arange(0, 1 << 12, 1, KILN_F32);
    kiln_sync();
    tanh_program(x);
    kiln_jit_wait();
    printf("%u %.0f\n", (unsigned)geteuid(), kiln_stat("kernels_compiled"));
    kiln_release(x);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "exit")) return exit_work();
  if (argc > 1 && !strcmp(argv[1], "async")) return async_work(true);
  if (argc > 1 && !strcmp(argv[1], "async-nowait")) return async_work(false);
  if (argc > 2 && !strcmp(argv[1], "gates")) return gates_work(atoi(argv[2]));
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return 1;
  self[len] = 0;
  setenv("KILN_PAYOFF", "0", 1); /* the children compile at KILN_HOT, also when run by hand */
  RUN(warm_disk_cache_compiles_nothing);
  RUN(two_processes_share_a_cache_directory);
  RUN(cache_off_writes_nothing);
  RUN(missing_toolchain_is_reported_once);
  RUN(jit_wait_then_compiled);
  RUN(opt_info_reports_vectorized_loops);
  RUN(sliced_operands_are_read_at_unit_stride);
  RUN(fills_are_values_not_buffers);
  RUN(compiles_run_in_the_compiler_process);
  RUN(a_compile_sends_no_sigchld);
  RUN(compiler_crash_costs_a_compile);
  RUN(stale_compiler_process_is_refused);
  RUN(a_compiler_dying_mid_store_leaves_no_orphan_object);
  RUN(a_planted_helper_is_never_run);
  RUN(our_helper_in_a_sticky_directory_runs);
  RUN(a_setuid_program_ignores_KILN_JITC);
  RUN(a_relative_path_never_runs_a_planted_assembler);
  RUN(a_stuck_helper_is_killed_after_the_timeout);
  RUN(the_helper_stores_where_the_library_looks_now);
  RUN(a_cache_that_cannot_be_written_compiles_in_memory);
  RUN(exit_does_not_wait_for_a_compile);
  return ktest_done();
}

/* test_cache_trust.c — the disk cache and KILN_DUMP trust nothing on disk
 * (DESIGN §11, issue 13 items 1 and 5): a planted shared object (its
 * constructor writes a marker file) under a predictable kernel name, with a
 * forged checksum trailer, is never run — in a 0777 directory, a shared
 * sticky directory, a directory of another user (root only: chown to
 * nobody), behind a symlinked directory, as a hard link, as a symlink, or
 * swapped in after the checks; results stay right, a sticky directory
 * full of junk still caches, and loading through reused descriptor
 * numbers still gives each file its own object.  Dumps go into a 0700 directory and never
 * follow planted symlinks.  Temp files of killed writers (ours and
 * libgccjit's) are reclaimed. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../cache/disk.h"
#include "ktest.h"

#define NOBODY 65534

static char self[PATH_MAX];
static char work[PATH_MAX - 128]; /* everything this test makes lives here */
static char good_so[PATH_MAX], evil_so[PATH_MAX], marker[PATH_MAX];
static char evil_payload[1 << 16];
static size_t evil_len;

static const uint64_t H1[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};

static void rm_rf(const char *dir) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static bool planted_code_ran(void) { return exists(marker); }

/* a fresh directory under work/ with the given mode */
static void make_dir(char *out, const char *name, mode_t mode) {
  snprintf(out, PATH_MAX, "%s/%s", work, name);
  rm_rf(out);
  if (mkdir(out, 0700) != 0 || chmod(out, mode) != 0)
    KTEST_FAIL("cannot make %s: %s", out, strerror(errno));
}

static bool compile_so(const char *src_text, const char *out) {
  char src[PATH_MAX + 8], cmd[3 * PATH_MAX];
  snprintf(src, sizeof src, "%s.c", out);
  FILE *f = fopen(src, "w");
  if (!f) return false;
  fputs(src_text, f);
  fclose(f);
  const char *compilers[] = {"cc", "gcc", "clang"};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o '%s' '%s' 2>/dev/null", compilers[i], out, src);
    if (system(cmd) == 0 && exists(out)) return true;
  }
  return false;
}

/* the good object answers 42; the evil one's constructor creates `marker` */
static bool build_objects(void) {
  snprintf(good_so, sizeof good_so, "%s/good.so", work);
  snprintf(evil_so, sizeof evil_so, "%s/evil.so", work);
  snprintf(marker, sizeof marker, "%s/PLANTED-CODE-RAN", work);
  char src[PATH_MAX + 512];
  snprintf(src, sizeof src,
           "#include <fcntl.h>\n#include <unistd.h>\n"
           "__attribute__((constructor)) static void planted(void) {\n"
           "  int fd = open(\"%s\", O_WRONLY | O_CREAT, 0644);\n  if (fd >= 0) close(fd);\n}\n"
           "int kiln_test_answer(void) { return 666; }\n",
           marker);
  if (!compile_so("int kiln_test_answer(void) { return 42; }\n", good_so) ||
      !compile_so(src, evil_so))
    return false;
  FILE *f = fopen(evil_so, "rb");
  evil_len = f ? fread(evil_payload, 1, sizeof evil_payload, f) : 0;
  if (f) fclose(f);
  return evil_len > 0 && evil_len < sizeof evil_payload;
}

static void file_name(const uint64_t h[2], char *out) {
  snprintf(out, 64, "kernel-v%d-%016" PRIx64 "%016" PRIx64 ".so", CACHE_DISK_FORMAT, h[0], h[1]);
}

/* writes the evil object with a forged trailer for h (the checksum has no
   secret: anyone can compute it) to `path` */
static void forge(const char *path, const uint64_t h[2]) {
  uint8_t t[CACHE_DISK_TRAILER_SIZE];
  uint64_t fields[4] = {h[0], h[1], evil_len, XXH3_64bits(evil_payload, evil_len)};
  memcpy(t, "KILNKC", 6);
  t[6] = CACHE_DISK_FORMAT;
  t[7] = 0;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 8; i++) t[8 + 8 * k + i] = (uint8_t)(fields[k] >> (8 * i));
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(evil_payload, 1, evil_len, f) != evil_len ||
      fwrite(t, 1, sizeof t, f) != sizeof t)
    KTEST_FAIL("cannot write %s", path);
  if (f) fclose(f);
}

/* plants the forged object under h's name in dir */
static void plant(const char *dir, const uint64_t h[2], char *path_out) {
  char name[64];
  file_name(h, name);
  snprintf(path_out, PATH_MAX, "%s/%s", dir, name);
  forge(path_out, h);
}

/* loads h and calls it: 42 (good), 666 (planted), -1 (a miss) */
static int load_answer(const uint64_t h[2]) {
  void *handle = cache_disk_load(h);
  if (!handle) return -1;
  int (*fn)(void) = (int (*)(void))dlsym(handle, "kiln_test_answer");
  int v = fn ? fn() : -2;
  dlclose(handle);
  return v;
}

/* the planted object is not loaded, and the marker says its code never ran */
static void check_refused(const char *dir, const char *what) {
  setenv("KILN_CACHE_DIR", dir, 1);
  int got = load_answer(H1);
  if (got != -1) KTEST_FAIL("%s: load gave %d, not a miss", what, got);
  if (planted_code_ran()) KTEST_FAIL("%s: the planted object's constructor ran", what);
  unlink(marker);
}

TEST(planted_object_in_world_writable_dir_never_runs) {
  char dir[PATH_MAX], path[PATH_MAX];
  make_dir(dir, "open-0777", 0777);
  plant(dir, H1, path);
  check_refused(dir, "0777 directory");
  CHECK(cache_disk_dir() == NULL); /* the disk cache is off there */
  CHECK(!cache_disk_store(H1, good_so));
}

/* as root: the directory and the planted file belong to nobody */
TEST(planted_object_in_another_users_dir_never_runs) {
  if (geteuid() != 0) {
    printf("  (skipped: needs root to make a directory of another user; CI runs as root)\n");
    return;
  }
  char dir[PATH_MAX], path[PATH_MAX];
  make_dir(dir, "other-user", 0755);
  plant(dir, H1, path);
  CHECK(chown(path, NOBODY, NOBODY) == 0 && chown(dir, NOBODY, NOBODY) == 0);
  check_refused(dir, "a directory owned by nobody");
  /* the same directory made by a child running as nobody */
  make_dir(dir, "made-by-nobody", 0755);
  CHECK(chown(dir, NOBODY, NOBODY) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(2);
    plant(dir, H1, path);
    _exit(ktest_failed_checks ? 1 : 0);
  }
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0);
  check_refused(dir, "a directory nobody planted in");
}

/* A shared sticky directory (1777, like /tmp) with junk under the victim's
   names: the junk is never loaded, and caching still works (a private
   "kiln-<euid>" directory inside it), so runs do not recompile forever. */
TEST(sticky_shared_dir_with_junk_still_caches) {
  char dir[PATH_MAX], path[PATH_MAX];
  make_dir(dir, "sticky", 01777);
  plant(dir, H1, path);
  if (geteuid() == 0) CHECK(chown(path, NOBODY, NOBODY) == 0 && chown(dir, NOBODY, NOBODY) == 0);
  check_refused(dir, "a sticky shared directory");
  CHECK(cache_disk_store(H1, good_so));
  CHECK_EQ_INT(load_answer(H1), 42);
  CHECK_EQ_INT(load_answer(H1), 42); /* a second run loads it too */
  CHECK(!planted_code_ran());
  const char *used = cache_disk_dir();
  char expect[PATH_MAX + 32];
  snprintf(expect, sizeof expect, "%s/kiln-%lu", dir, (unsigned long)geteuid());
  CHECK(used && !strcmp(used, expect));
  struct stat st;
  CHECK(stat(expect, &st) == 0 && (st.st_mode & 0777) == 0700 && st.st_uid == geteuid());
  /* another user's directory of that name is refused, not used */
  if (geteuid() == 0) {
    rm_rf(expect);
    CHECK(mkdir(expect, 0755) == 0 && chown(expect, NOBODY, NOBODY) == 0);
    plant(expect, H1, path);
    check_refused(dir, "another user's kiln-<uid> directory");
  }
}

TEST(symlinked_cache_dir_is_not_followed) {
  char target[PATH_MAX], link[PATH_MAX], path[PATH_MAX];
  make_dir(target, "link-target", 0700);
  plant(target, H1, path);
  snprintf(link, sizeof link, "%s/cache-link", work);
  unlink(link);
  CHECK(symlink(target, link) == 0);
  check_refused(link, "a symlinked cache directory");
  CHECK(exists(path)); /* nothing behind the link was touched */
}

TEST(hard_linked_file_is_not_loaded) {
  char dir[PATH_MAX], path[PATH_MAX + 64], other[PATH_MAX + 16];
  make_dir(dir, "hard-link", 0700);
  snprintf(other, sizeof other, "%s/elsewhere.so", work);
  forge(other, H1);
  char name[64];
  file_name(H1, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  CHECK(link(other, path) == 0);
  check_refused(dir, "a hard-linked file");
  CHECK(!exists(path)); /* the bad name is removed; the other link stays */
  CHECK(exists(other));
  CHECK(cache_disk_store(H1, good_so));
  CHECK_EQ_INT(load_answer(H1), 42);
  unlink(other);
}

TEST(symlinked_file_is_not_loaded) {
  char dir[PATH_MAX], path[PATH_MAX + 64], other[PATH_MAX + 16];
  make_dir(dir, "file-link", 0700);
  snprintf(other, sizeof other, "%s/elsewhere.so", work);
  forge(other, H1);
  char name[64];
  file_name(H1, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  CHECK(symlink(other, path) == 0);
  check_refused(dir, "a symlinked file");
  CHECK(!exists(path));
  CHECK(exists(other));
  unlink(other);
}

/* A file swapped under the checked name between the checks and the load:
   the descriptor that was checked is what gets loaded.  (Watches the good
   file being opened, then renames the planted one over it while the
   loader is still verifying a large payload.) */
typedef struct {
  int inotify;
  const char *from, *to;
} swapper;

static void *swap_on_open(void *arg) {
  swapper *s = arg;
  char buf[4096];
  if (read(s->inotify, buf, sizeof buf) > 0) (void)rename(s->from, s->to);
  return NULL;
}

TEST(file_swapped_after_checks_is_not_loaded) {
  char dir[PATH_MAX], path[PATH_MAX + 64], big_so[PATH_MAX + 16], evil[PATH_MAX + 16],
      src[PATH_MAX + 32];
  make_dir(dir, "swap", 0700);
  /* a good object with 32 MiB of data: verifying it takes a while */
  snprintf(big_so, sizeof big_so, "%s/big.so", work);
  snprintf(src, sizeof src,
           "static const char pad[32 << 20] = {1};\n"
           "int kiln_test_answer(void) { return 42 + pad[0] - 1; }\n");
  CHECK(compile_so(src, big_so));
  setenv("KILN_CACHE_DIR", dir, 1);
  CHECK(cache_disk_store(H1, big_so));
  char name[64];
  file_name(H1, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(evil, sizeof evil, "%s/.planted", dir);
  for (int round = 0; round < 3; round++) {
    forge(evil, H1);
    swapper s = {inotify_init1(IN_CLOEXEC), evil, path};
    CHECK(s.inotify >= 0 && inotify_add_watch(s.inotify, path, IN_OPEN) >= 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, swap_on_open, &s) == 0);
    int got = load_answer(H1);
    pthread_join(th, NULL);
    close(s.inotify);
    if (planted_code_ran())
      KTEST_FAIL("round %d: the object swapped in after the checks ran", round);
    unlink(marker);
    CHECK(got == 42 || got == -1);
    CHECK(cache_disk_store(H1, big_so)); /* the good file back for the next round */
  }
}

/* Loading through "/proc/self/fd/N": the dynamic loader returns an object
   already loaded under the same name, and descriptor numbers are reused;
   a second file loaded while the first stays open must still be itself. */
TEST(reused_descriptor_numbers_load_the_right_object) {
  char dir[PATH_MAX], seven[PATH_MAX + 16];
  make_dir(dir, "fd-reuse", 0700);
  snprintf(seven, sizeof seven, "%s/seven.so", work);
  CHECK(compile_so("int kiln_test_answer(void) { return 7; }\n", seven));
  setenv("KILN_CACHE_DIR", dir, 1);
  const uint64_t h2[2] = {0x1111111111111111ull, 0x2222222222222222ull};
  CHECK(cache_disk_store(H1, good_so) && cache_disk_store(h2, seven));
  void *first = cache_disk_load(H1); /* kept loaded */
  CHECK(first != NULL);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(load_answer(h2), 7);
  void *again = cache_disk_load(H1);
  int (*fn)(void) = again ? (int (*)(void))dlsym(again, "kiln_test_answer") : NULL;
  CHECK(fn && fn() == 42);
  if (again) dlclose(again);
  if (first) dlclose(first);
}

/* end to end: a program run with a 0777 cache directory in which every
   kernel file it would load was planted (the names are predictable: run
   the same program with the same library) computes the right result and
   never runs the planted code */
static int child_work(void) {
  kiln_tensor *x = kiln_arange(0, 1 << 14, 1, KILN_F32);
  kiln_sync(); /* x is a leaf of the traces below, not part of them */
  double total = 0;
  for (int it = 0; it < 3; it++) {
    kiln_tensor *a = kiln_mul_scalar(x, 1e-4), *b = kiln_tanh(a), *s = kiln_sum(b, 0, NULL, false);
    total = kiln_item(s);
    kiln_release(a), kiln_release(b), kiln_release(s);
  }
  kiln_release(x);
  kiln_stats st;
  kiln_get_stats(&st);
  printf("%a %llu %llu\n", total, (unsigned long long)st.compiles,
         (unsigned long long)st.disk_hits);
  return 0;
}

typedef struct {
  double total;
  unsigned long long compiles, disk_hits;
  int ok;
} result;

static result run_child(const char *cache_dir, const char *extra_env) {
  char cmd[4 * PATH_MAX];
  snprintf(cmd, sizeof cmd,
           "env KILN_CACHE_DIR='%s' KILN_HOT=2 KILN_PAYOFF=0 KILN_ASYNC=0 %s '%s' work 2>/dev/null",
           cache_dir, extra_env, self);
  result r = {0, 0, 0, 0};
  FILE *p = popen(cmd, "r");
  if (!p) return r;
  r.ok = fscanf(p, "%la %llu %llu", &r.total, &r.compiles, &r.disk_hits) == 3;
  r.ok = pclose(p) == 0 && r.ok;
  return r;
}

TEST(program_with_planted_cache_computes_right_and_runs_nothing) {
  char warm[PATH_MAX], open_dir[PATH_MAX];
  make_dir(warm, "e2e-private", 0700);
  make_dir(open_dir, "e2e-0777", 0777);
  result ref = run_child(warm, "KILN_JIT=0"), first = run_child(warm, "");
  CHECK(ref.ok && first.ok && first.compiles >= 1);
  int planted = 0;
  DIR *d = opendir(warm);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    uint64_t h[2];
    char path[PATH_MAX + 256];
    if (sscanf(e->d_name, "kernel-v%*d-%16" SCNx64 "%16" SCNx64 ".so", &h[0], &h[1]) != 2) continue;
    snprintf(path, sizeof path, "%s/%s", open_dir, e->d_name);
    forge(path, h);
    planted++;
  }
  if (d) closedir(d);
  CHECK(planted >= 1);
  result r = run_child(open_dir, "");
  CHECK(r.ok);
  CHECK(!planted_code_ran());
  CHECK_EQ_INT(r.disk_hits, 0);
  CHECK(r.compiles >= 1); /* compiled in memory instead */
  CHECK_CLOSE(r.total, ref.total, 1e-5 * fabs(ref.total));
  CHECK(r.total == first.total);
  unlink(marker);
}

/* KILN_DUMP: the directory is created 0700; planted symlinks under the dump
   names (the manifest, a trace's files) are not followed */
TEST(dump_dir_is_private_and_follows_no_symlink) {
  char first[PATH_MAX], second[PATH_MAX], victim[PATH_MAX + 16], cache[PATH_MAX];
  snprintf(first, sizeof first, "%s/dump-new/sub", work);
  make_dir(cache, "dump-cache", 0700);
  char env[2 * PATH_MAX];
  snprintf(env, sizeof env, "KILN_DUMP='%s'", first);
  result r = run_child(cache, env);
  CHECK(r.ok);
  struct stat st;
  CHECK(stat(first, &st) == 0 && (st.st_mode & 0777) == 0700);
  char parent[PATH_MAX + 16];
  snprintf(parent, sizeof parent, "%s/dump-new", work);
  CHECK(stat(parent, &st) == 0 && (st.st_mode & 0777) == 0700);
  /* the same dumps into a directory whose every name is a symlink to a victim */
  snprintf(victim, sizeof victim, "%s/victim.txt", work);
  FILE *f = fopen(victim, "w");
  if (f) fputs("precious\n", f), fclose(f);
  make_dir(second, "dump-planted", 0700);
  int links = 0;
  DIR *d = opendir(first);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", second, e->d_name);
    links += symlink(victim, path) == 0;
  }
  if (d) closedir(d);
  CHECK(links >= 3);                   /* trace-*.txt, trace-*.dot, manifest.tsv at least */
  make_dir(cache, "dump-cache", 0700); /* compile again, so the kernel dumps are written too */
  snprintf(env, sizeof env, "KILN_DUMP='%s'", second);
  r = run_child(cache, env);
  CHECK(r.ok);
  char text[64] = {0};
  f = fopen(victim, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  CHECK(!strcmp(text, "precious\n"));
  d = opendir(second);
  int regular = 0;
  while (d && (e = readdir(d))) {
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", second, e->d_name);
    if (e->d_name[0] != '.' && lstat(path, &st) == 0) {
      if (S_ISLNK(st.st_mode)) KTEST_FAIL("%s is still a symlink", e->d_name);
      regular += S_ISREG(st.st_mode);
    }
  }
  if (d) closedir(d);
  CHECK_EQ_INT(regular, links);
  /* a dump directory others can write is refused: nothing is written there */
  char open_dump[PATH_MAX];
  make_dir(open_dump, "dump-0777", 0777);
  make_dir(cache, "dump-cache", 0700);
  snprintf(env, sizeof env, "KILN_DUMP='%s'", open_dump);
  r = run_child(cache, env);
  CHECK(r.ok);
  d = opendir(open_dump);
  int any = 0;
  while (d && (e = readdir(d))) any += e->d_name[0] != '.';
  if (d) closedir(d);
  CHECK_EQ_INT(any, 0);
}

static int count_prefix(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

/* child: one cache lookup, which is this process's first use of the cache */
static int child_lookup(void) { return load_answer(H1) == -1 ? 0 : 1; }

/* A writer killed in the middle of a store (it blocks reading a FIFO as
   its source) leaves its temp file; the next process to open the cache
   reclaims it at once, since its pid is gone. */
TEST(killed_writers_temp_file_is_reclaimed_at_startup) {
  char dir[PATH_MAX], fifo[PATH_MAX + 16];
  make_dir(dir, "killed-writer", 0700);
  setenv("KILN_CACHE_DIR", dir, 1);
  snprintf(fifo, sizeof fifo, "%s/source.fifo", work);
  unlink(fifo);
  CHECK(mkfifo(fifo, 0600) == 0);
  pid_t pid = fork();
  if (pid == 0) _exit(cache_disk_store(H1, fifo) ? 0 : 1);
  int w = open(fifo, O_WRONLY);
  CHECK(w >= 0 && write(w, "\177ELF", 4) == 4);
  for (int i = 0; i < 500 && count_prefix(dir, ".kernel-tmp-") < 1; i++) usleep(10000);
  CHECK_EQ_INT(count_prefix(dir, ".kernel-tmp-"), 1); /* the writer is mid-store */
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  if (w >= 0) close(w);
  CHECK_EQ_INT(count_prefix(dir, ".kernel-tmp-"), 1); /* left behind */
  char cmd[3 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "env KILN_CACHE_DIR='%s' '%s' lookup", dir, self);
  CHECK(system(cmd) == 0);
  CHECK_EQ_INT(count_prefix(dir, ".kernel-tmp-"), 0); /* reclaimed at the next start */
}

/* libgccjit's own temp directory ("libgccjit-XXXXXX" in TMPDIR) stays
   behind when a process is killed while compiling; the next compiling
   process removes such leftovers (ours, only libgccjit's files, untouched
   for ten minutes), and leaves a fresh one alone */
TEST(libgccjit_leftovers_are_reclaimed) {
  char tmp[PATH_MAX], cache[PATH_MAX], stale[PATH_MAX + 32], fresh[PATH_MAX + 32],
      file[PATH_MAX + 64];
  make_dir(tmp, "tmpdir", 0700);
  make_dir(cache, "tmpdir-cache", 0700);
  snprintf(stale, sizeof stale, "%s/libgccjit-Ab12Cd", tmp);
  snprintf(fresh, sizeof fresh, "%s/libgccjit-Ef34Gh", tmp);
  CHECK(mkdir(stale, 0700) == 0 && mkdir(fresh, 0700) == 0);
  const char *names[] = {"fake.s", "fake.so"};
  struct timespec old[2] = {{.tv_sec = time(NULL) - 3600}, {.tv_sec = time(NULL) - 3600}};
  for (int i = 0; i < 2; i++) {
    snprintf(file, sizeof file, "%s/%s", stale, names[i]);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    CHECK(utimensat(AT_FDCWD, file, old, 0) == 0);
    snprintf(file, sizeof file, "%s/%s", fresh, names[i]);
    f = fopen(file, "w");
    if (f) fclose(f);
  }
  CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);
  char env[PATH_MAX + 32];
  snprintf(env, sizeof env, "TMPDIR='%s'", tmp);
  result r = run_child(cache, env);
  CHECK(r.ok && r.compiles >= 1);
  CHECK(!exists(stale));
  CHECK(exists(fresh));
  CHECK_EQ_INT(count_prefix(tmp, "libgccjit-"), 1); /* and the run left none of its own */
  CHECK_EQ_INT(count_prefix(tmp, "kiln-"), 0);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "work")) return child_work();
  if (argc > 1 && !strcmp(argv[1], "lookup")) return child_lookup();
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return 1;
  self[len] = 0;
  const char *t = getenv("TMPDIR");
  snprintf(work, sizeof work, "%s/kiln-trust-test-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(work) || chmod(work, 0755) != 0) return 1; /* nobody must reach what is planted */
  if (!build_objects()) {
    fprintf(stderr, "cannot build shared objects with cc/gcc/clang: these tests need one\n");
    printf("0 passed, 1 failed\n");
    return 1;
  }
  unsetenv("KILN_CACHE");
  RUN(planted_object_in_world_writable_dir_never_runs);
  RUN(planted_object_in_another_users_dir_never_runs);
  RUN(sticky_shared_dir_with_junk_still_caches);
  RUN(symlinked_cache_dir_is_not_followed);
  RUN(hard_linked_file_is_not_loaded);
  RUN(symlinked_file_is_not_loaded);
  RUN(file_swapped_after_checks_is_not_loaded);
  RUN(reused_descriptor_numbers_load_the_right_object);
  RUN(program_with_planted_cache_computes_right_and_runs_nothing);
  RUN(dump_dir_is_private_and_follows_no_symlink);
  RUN(killed_writers_temp_file_is_reclaimed_at_startup);
  RUN(libgccjit_leftovers_are_reclaimed);
  rm_rf(work);
  return ktest_done();
}

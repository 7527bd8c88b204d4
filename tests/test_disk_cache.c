/* test_disk_cache.c — the on-disk kernel cache (cache/disk.c): store/load of
 * a real shared object (built here with `cc -shared -fPIC`), a second process
 * reading it, corrupt files deleted and recovered, concurrent writers, the
 * KILN_CACHE=0 switch, the LRU size bound and unusable directories.  Each
 * test gets a fresh KILN_CACHE_DIR. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../cache/disk.h"
#include "ktest.h"

static char work_dir[PATH_MAX - 64]; /* holds the test's shared object */
static char so_path[PATH_MAX];
static off_t so_size;
static char cache_dir[PATH_MAX]; /* the current test's cache directory */

static const uint64_t H1[2] = {0x0123456789abcdefull, 0xfedcba9876543210ull};
static const uint64_t H2[2] = {0x1111111111111111ull, 0x2222222222222222ull};

static void rm_rf(const char *dir) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static const char *tmp_root(void) {
  const char *t = getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

/* a new empty directory as KILN_CACHE_DIR, with every other setting unset */
static void fresh_cache(void) {
  if (cache_dir[0]) rm_rf(cache_dir);
  snprintf(cache_dir, sizeof cache_dir, "%s/kiln-disk-test-XXXXXX", tmp_root());
  if (!mkdtemp(cache_dir)) {
    KTEST_FAIL("mkdtemp: %s", strerror(errno));
    cache_dir[0] = '\0';
    return;
  }
  setenv("KILN_CACHE_DIR", cache_dir, 1);
  unsetenv("KILN_CACHE");
  unsetenv("KILN_CACHE_MAX_BYTES");
  unsetenv("KILN_CACHE_MAX_MB");
}

static bool build_so(void) {
  snprintf(work_dir, sizeof work_dir, "%s/kiln-disk-so-XXXXXX", tmp_root());
  if (!mkdtemp(work_dir)) return false;
  char src[PATH_MAX + 16], cmd[3 * PATH_MAX];
  snprintf(src, sizeof src, "%s/answer.c", work_dir);
  snprintf(so_path, sizeof so_path, "%s/answer.so", work_dir);
  FILE *f = fopen(src, "w");
  if (!f) return false;
  fputs("int kiln_test_answer(void) { return 42; }\n", f);
  fclose(f);
  const char *compilers[] = {"cc", "gcc", "clang"};
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o '%s' '%s' 2>/dev/null", compilers[i], so_path,
             src);
    struct stat st;
    if (system(cmd) == 0 && stat(so_path, &st) == 0) {
      so_size = st.st_size;
      return true;
    }
  }
  return false;
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

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

static void path_of(const uint64_t h[2], char *out) { cache_disk_path(h, out, PATH_MAX); }

/* loads h and calls its function: 42, or -1 on a miss */
static int load_answer(const uint64_t h[2]) {
  void *handle = cache_disk_load(h);
  if (!handle) return -1;
  int (*fn)(void) = (int (*)(void))dlsym(handle, "kiln_test_answer");
  int v = fn ? fn() : -2;
  dlclose(handle);
  return v;
}

static void write_at(const char *path, off_t off, const void *data, size_t len) {
  int fd = open(path, O_WRONLY);
  if (fd < 0 || pwrite(fd, data, len, off) != (ssize_t)len) KTEST_FAIL("cannot patch %s", path);
  if (fd >= 0) close(fd);
}

TEST(test_store_then_load) {
  fresh_cache();
  CHECK(cache_disk_enabled());
  CHECK(cache_disk_dir() && !strcmp(cache_disk_dir(), cache_dir));
  CHECK(cache_disk_load(H1) == NULL); /* a miss */
  CHECK(cache_disk_store(H1, so_path));
  char path[PATH_MAX];
  path_of(H1, path);
  CHECK_STR_CONTAINS(path, cache_dir);
  CHECK_STR_CONTAINS(path, "/kernel-v1-0123456789abcdeffedcba9876543210.so");
  CHECK(exists(path));
  CHECK_EQ_INT(file_size(path), so_size + CACHE_DISK_TRAILER_SIZE);
  CHECK_EQ_INT(count_entries(cache_dir), 1); /* no temp file left */
  CHECK_EQ_INT(load_answer(H1), 42);
  CHECK_EQ_INT(load_answer(H1), 42);
  CHECK(exists(so_path)); /* the caller's file is left alone */
  CHECK(cache_disk_load(H2) == NULL);
  CHECK_EQ_INT(count_entries(cache_dir), 1);
  /* storing again replaces the file and still loads */
  CHECK(cache_disk_store(H1, so_path));
  CHECK_EQ_INT(count_entries(cache_dir), 1);
  CHECK_EQ_INT(load_answer(H1), 42);
  /* a trailing slash names the same directory */
  char slashed[PATH_MAX + 2];
  snprintf(slashed, sizeof slashed, "%s/", cache_dir);
  setenv("KILN_CACHE_DIR", slashed, 1);
  CHECK_EQ_INT(load_answer(H1), 42);
  setenv("KILN_CACHE_DIR", cache_dir, 1);
}

static int child_load(const char *h0, const char *h1) {
  uint64_t h[2] = {strtoull(h0, NULL, 16), strtoull(h1, NULL, 16)};
  return load_answer(h) == 42 ? 0 : 1;
}

TEST(test_second_process_loads) {
  fresh_cache();
  CHECK(cache_disk_store(H1, so_path));
  char path[PATH_MAX];
  path_of(H1, path);
  struct stat before, after;
  CHECK(stat(path, &before) == 0);
  char a0[32], a1[32];
  snprintf(a0, sizeof a0, "%016" PRIx64, H1[0]);
  snprintf(a1, sizeof a1, "%016" PRIx64, H1[1]);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "test_disk_cache", "--child-load", a0, a1, (char *)NULL);
    _exit(127);
  }
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* the child did not store: same file, still the only one */
  CHECK(stat(path, &after) == 0);
  CHECK(before.st_ino == after.st_ino);
  CHECK_EQ_INT(count_entries(cache_dir), 1);
}

enum {
  BAD_FLIP,
  BAD_TRUNC_1,
  BAD_TRUNC_TRAILER,
  BAD_TRUNC_SMALL,
  BAD_EMPTY,
  BAD_GARBAGE_TRAILER,
  BAD_VERSION,
  BAD_LENGTH,
  BAD_WRONG_HASH,
  BAD_NOT_ELF,
  BAD_DIRECTORY,
  BAD_KINDS
};
static const char *bad_names[] = {"flipped payload byte",
                                  "truncated by 1",
                                  "trailer cut off",
                                  "truncated to 10 bytes",
                                  "empty",
                                  "garbage trailer",
                                  "wrong format version",
                                  "wrong length",
                                  "wrong hash in trailer",
                                  "valid trailer around a non-ELF payload",
                                  "a directory"};

static void make_bad(int kind, const char *path) {
  off_t size = file_size(path);
  uint8_t byte;
  switch (kind) {
    case BAD_FLIP: {
      int fd = open(path, O_RDWR);
      off_t off = size / 2;
      if (fd < 0 || pread(fd, &byte, 1, off) != 1) KTEST_FAIL("cannot read %s", path);
      byte ^= 0x01;
      if (fd >= 0) close(fd);
      write_at(path, off, &byte, 1);
      break;
    }
    case BAD_TRUNC_1:
      CHECK(truncate(path, size - 1) == 0);
      break;
    case BAD_TRUNC_TRAILER:
      CHECK(truncate(path, size - CACHE_DISK_TRAILER_SIZE) == 0);
      break;
    case BAD_TRUNC_SMALL:
      CHECK(truncate(path, 10) == 0);
      break;
    case BAD_EMPTY:
      CHECK(truncate(path, 0) == 0);
      break;
    case BAD_GARBAGE_TRAILER: {
      uint8_t junk[CACHE_DISK_TRAILER_SIZE];
      for (int i = 0; i < CACHE_DISK_TRAILER_SIZE; i++) junk[i] = (uint8_t)(i * 37 + 11);
      write_at(path, size - CACHE_DISK_TRAILER_SIZE, junk, sizeof junk);
      break;
    }
    case BAD_VERSION:
      byte = CACHE_DISK_FORMAT + 1;
      write_at(path, size - CACHE_DISK_TRAILER_SIZE + 6, &byte, 1);
      break;
    case BAD_LENGTH: /* payload length field off by one */
      byte = (uint8_t)((size - CACHE_DISK_TRAILER_SIZE + 1) & 0xff);
      write_at(path, size - CACHE_DISK_TRAILER_SIZE + 24, &byte, 1);
      break;
    case BAD_WRONG_HASH: { /* H2's valid file under H1's name */
      char other[PATH_MAX];
      CHECK(cache_disk_store(H2, so_path));
      path_of(H2, other);
      CHECK(rename(other, path) == 0);
      break;
    }
    case BAD_NOT_ELF: { /* checksum and trailer right, payload no ELF: dlopen refuses */
      const char payload[] = "this is not a shared object, but its trailer is fine";
      size_t len = sizeof payload - 1;
      uint8_t t[CACHE_DISK_TRAILER_SIZE];
      uint64_t fields[4] = {H1[0], H1[1], len, XXH3_64bits(payload, len)};
      memcpy(t, "KILNKC", 6);
      t[6] = CACHE_DISK_FORMAT;
      t[7] = 0;
      for (int f = 0; f < 4; f++)
        for (int i = 0; i < 8; i++) t[8 + 8 * f + i] = (uint8_t)(fields[f] >> (8 * i));
      FILE *fp = fopen(path, "wb");
      CHECK(fp != NULL);
      if (fp) {
        fwrite(payload, 1, len, fp);
        fwrite(t, 1, sizeof t, fp);
        fclose(fp);
      }
      break;
    }
    case BAD_DIRECTORY:
      CHECK(unlink(path) == 0);
      CHECK(mkdir(path, 0700) == 0);
      break;
  }
}

TEST(test_corrupt_files_are_deleted) {
  for (int kind = 0; kind < BAD_KINDS; kind++) {
    fresh_cache();
    char path[PATH_MAX];
    path_of(H1, path);
    CHECK(cache_disk_store(H1, so_path));
    CHECK_EQ_INT(load_answer(H1), 42);
    make_bad(kind, path);
    void *handle = cache_disk_load(H1);
    if (handle) {
      KTEST_FAIL("a file with %s was loaded", bad_names[kind]);
      dlclose(handle);
    }
    if (kind == BAD_DIRECTORY) {
      /* not removed (unlink fails on a directory), and a store cannot rename
         onto it: it fails cleanly, leaving no temp file */
      CHECK(exists(path));
      CHECK(!cache_disk_store(H1, so_path));
      CHECK_EQ_INT(count_prefix(cache_dir, ".kernel-tmp-"), 0);
      continue;
    }
    if (exists(path)) KTEST_FAIL("the file with %s was not deleted", bad_names[kind]);
    CHECK(cache_disk_load(H1) == NULL);
    CHECK(cache_disk_store(H1, so_path)); /* recovers */
    if (load_answer(H1) != 42) KTEST_FAIL("no recovery after %s", bad_names[kind]);
  }
}

TEST(test_concurrent_stores) {
  for (int round = 0; round < 4; round++) {
    fresh_cache();
    enum { WRITERS = 4 };
    int gate[2];
    CHECK(pipe(gate) == 0);
    pid_t pids[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
      pids[i] = fork();
      if (pids[i] == 0) {
        char c;
        close(gate[1]);
        while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
        }
        _exit(cache_disk_store(H1, so_path) ? 0 : 1);
      }
    }
    close(gate[0]);
    close(gate[1]); /* releases all writers at once */
    for (int i = 0; i < WRITERS; i++) {
      int status = -1;
      CHECK(pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i]);
      CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 1);
    CHECK_EQ_INT(count_entries(cache_dir), 1); /* no temp files */
    CHECK_EQ_INT(load_answer(H1), 42);
  }
}

TEST(test_disabled) {
  fresh_cache();
  char sub[PATH_MAX + 8];
  snprintf(sub, sizeof sub, "%s/sub", cache_dir);
  setenv("KILN_CACHE_DIR", sub, 1);
  setenv("KILN_CACHE", "0", 1);
  CHECK(!cache_disk_enabled());
  CHECK(cache_disk_dir() == NULL);
  char path[PATH_MAX] = "x";
  path_of(H1, path);
  CHECK_EQ_INT(strlen(path), 0);
  CHECK(!cache_disk_store(H1, so_path));
  CHECK(cache_disk_load(H1) == NULL);
  CHECK(!exists(sub)); /* nothing created */
  CHECK_EQ_INT(count_entries(cache_dir), 0);
  /* a file stored while enabled is not read while disabled */
  unsetenv("KILN_CACHE");
  CHECK(cache_disk_store(H1, so_path));
  setenv("KILN_CACHE", "0", 1);
  CHECK(cache_disk_load(H1) == NULL);
  setenv("KILN_CACHE", "1", 1);
  CHECK_EQ_INT(load_answer(H1), 42);
  unsetenv("KILN_CACHE");
}

static uint64_t hash_n(int i) { return 0xabc0000000000000ull + (uint64_t)i; }

TEST(test_lru_bound) {
  fresh_cache();
  CHECK_EQ_INT(cache_disk_max_bytes(), 512ull << 20);
  off_t f = so_size + CACHE_DISK_TRAILER_SIZE;
  char bound[32];
  snprintf(bound, sizeof bound, "%lld", (long long)(3 * f + f / 2)); /* room for 3 */
  setenv("KILN_CACHE_MAX_BYTES", bound, 1);
  CHECK_EQ_INT(cache_disk_max_bytes(), 3 * f + f / 2);
  uint64_t h[6][2];
  char path[6][PATH_MAX];
  for (int i = 0; i < 6; i++) {
    h[i][0] = hash_n(i);
    h[i][1] = ~hash_n(i);
    path_of(h[i], path[i]);
  }
  CHECK(cache_disk_store(h[0], so_path));
  CHECK(cache_disk_store(h[1], so_path));
  CHECK(cache_disk_store(h[2], so_path));
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 3);
  CHECK_EQ_INT(load_answer(h[0]), 42);    /* 0 is now the most recently used */
  CHECK(cache_disk_store(h[3], so_path)); /* evicts 1 */
  CHECK(exists(path[0]) && !exists(path[1]) && exists(path[2]) && exists(path[3]));
  CHECK(cache_disk_store(h[4], so_path)); /* evicts 2 */
  CHECK(exists(path[0]) && !exists(path[2]) && exists(path[3]) && exists(path[4]));
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 3);
  /* KILN_CACHE_MAX_MB takes a fraction: room for 2 */
  unsetenv("KILN_CACHE_MAX_BYTES");
  char mb[32];
  snprintf(mb, sizeof mb, "%.9f", (double)(2 * f + f / 2) / 1048576.0);
  setenv("KILN_CACHE_MAX_MB", mb, 1);
  CHECK(cache_disk_store(h[5], so_path)); /* evicts 0 and 3 */
  CHECK(!exists(path[0]) && !exists(path[3]) && exists(path[4]) && exists(path[5]));
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 2);
  CHECK_EQ_INT(load_answer(h[5]), 42);
  /* a bound smaller than one file keeps just the newest */
  setenv("KILN_CACHE_MAX_BYTES", "1", 1);
  CHECK(cache_disk_store(h[1], so_path));
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 1);
  CHECK_EQ_INT(load_answer(h[1]), 42);
  /* a stale temp file from a crashed writer goes too; a fresh one stays */
  char stale[PATH_MAX + 32], fresh[PATH_MAX + 32];
  snprintf(stale, sizeof stale, "%s/.kernel-tmp-stale1", cache_dir);
  snprintf(fresh, sizeof fresh, "%s/.kernel-tmp-fresh1", cache_dir);
  FILE *fp = fopen(stale, "w");
  if (fp) fclose(fp);
  fp = fopen(fresh, "w");
  if (fp) fclose(fp);
  struct timespec old[2] = {{.tv_sec = time(NULL) - 7200}, {.tv_sec = time(NULL) - 7200}};
  CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);
  CHECK(cache_disk_store(h[2], so_path));
  CHECK(!exists(stale));
  CHECK(exists(fresh));
  unsetenv("KILN_CACHE_MAX_BYTES");
  unsetenv("KILN_CACHE_MAX_MB");
}

/* a store lists the directory (a stat per entry) only when the size this
   process knows of may have passed the bound: stores far below it do not,
   and the bound still holds for each store past it */
TEST(test_stores_list_only_near_the_bound) {
  fresh_cache();
  off_t f = so_size + CACHE_DISK_TRAILER_SIZE;
  char bound[32];
  snprintf(bound, sizeof bound, "%lld", (long long)(4 * f + f / 2)); /* room for 4 */
  setenv("KILN_CACHE_MAX_BYTES", bound, 1);
  uint64_t h[8][2];
  for (int i = 0; i < 8; i++) {
    h[i][0] = hash_n(100 + i);
    h[i][1] = ~hash_n(100 + i);
  }
  uint64_t before = cache_disk_listings();
  for (int i = 0; i < 4; i++) CHECK(cache_disk_store(h[i], so_path));
  CHECK_EQ_INT(cache_disk_listings() - before, 1); /* the first store: a new directory */
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 4);
  CHECK(cache_disk_store(h[4], so_path)); /* past the bound: lists, evicts one */
  CHECK_EQ_INT(cache_disk_listings() - before, 2);
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 4);
  for (int i = 5; i < 8; i++) CHECK(cache_disk_store(h[i], so_path)); /* each lists */
  CHECK_EQ_INT(cache_disk_listings() - before, 5);
  CHECK_EQ_INT(count_prefix(cache_dir, "kernel-v"), 4);
  CHECK_EQ_INT(load_answer(h[7]), 42);
  unsetenv("KILN_CACHE_MAX_BYTES");
}

TEST(test_unusable_directory) {
  fresh_cache();
  char file[PATH_MAX + 16], under[PATH_MAX + 32];
  snprintf(file, sizeof file, "%s/file", cache_dir);
  snprintf(under, sizeof under, "%s/file/sub", cache_dir);
  FILE *fp = fopen(file, "w");
  CHECK(fp != NULL);
  if (fp) fclose(fp);
  const char *dirs[] = {under, file};
  for (int i = 0; i < 2; i++) {
    setenv("KILN_CACHE_DIR", dirs[i], 1);
    CHECK(cache_disk_enabled());
    CHECK(cache_disk_dir() == NULL);
    char path[PATH_MAX] = "x";
    path_of(H1, path);
    CHECK_EQ_INT(strlen(path), 0);
    CHECK(!cache_disk_store(H1, so_path));
    CHECK(cache_disk_load(H1) == NULL);
  }
  CHECK_EQ_INT(file_size(file), 0);
  /* bad sources: missing, not ELF, NULL; nothing is left behind */
  setenv("KILN_CACHE_DIR", cache_dir, 1);
  char missing[PATH_MAX + 16];
  snprintf(missing, sizeof missing, "%s/missing.so", cache_dir);
  CHECK(!cache_disk_store(H1, missing));
  CHECK(!cache_disk_store(H1, file)); /* empty */
  fp = fopen(file, "w");
  if (fp) {
    fputs("plain text, not a shared object\n", fp);
    fclose(fp);
  }
  CHECK(!cache_disk_store(H1, file));
  CHECK(!cache_disk_store(H1, NULL));
  CHECK_EQ_INT(count_entries(cache_dir), 1); /* just "file" */
}

TEST(test_directory_defaults) {
  fresh_cache();
  char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
  char *xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
  char expect[PATH_MAX + 32];
  unsetenv("KILN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", cache_dir, 1);
  snprintf(expect, sizeof expect, "%s/kiln", cache_dir);
  CHECK(cache_disk_dir() && !strcmp(cache_disk_dir(), expect));
  CHECK(exists(expect));
  setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
  setenv("HOME", cache_dir, 1);
  snprintf(expect, sizeof expect, "%s/.cache/kiln", cache_dir);
  CHECK(cache_disk_dir() && !strcmp(cache_disk_dir(), expect));
  CHECK(exists(expect));
  CHECK(cache_disk_store(H1, so_path));
  CHECK_EQ_INT(load_answer(H1), 42);
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  CHECK(cache_disk_dir() == NULL);
  CHECK(!cache_disk_store(H1, so_path));
  if (home) setenv("HOME", home, 1);
  if (xdg) setenv("XDG_CACHE_HOME", xdg, 1);
  free(home);
  free(xdg);
  setenv("KILN_CACHE_DIR", cache_dir, 1);
}

/* The compiler writes its object by path (libgccjit takes one).  A
   directory above the cache swapped for a link to another, after the
   cache was checked and before the write, must not redirect the write:
   the scratch path is anchored at the checked descriptor
   (/proc/<pid>/fd/N/name), so the bytes land in the checked directory. */
TEST(test_scratch_writes_cannot_be_redirected) {
  char root[PATH_MAX], real[PATH_MAX + 16], evil[PATH_MAX + 16], link[PATH_MAX + 16],
      cache[PATH_MAX + 32], moved[PATH_MAX + 32];
  snprintf(root, sizeof root, "%s/kiln-swap-XXXXXX", tmp_root());
  if (!mkdtemp(root)) {
    KTEST_FAIL("mkdtemp: %s", strerror(errno));
    return;
  }
  snprintf(real, sizeof real, "%s/real", root);
  snprintf(evil, sizeof evil, "%s/evil", root);
  snprintf(link, sizeof link, "%s/at", root);
  snprintf(cache, sizeof cache, "%s/cache", link);
  CHECK(mkdir(real, 0700) == 0 && mkdir(evil, 0700) == 0);
  snprintf(moved, sizeof moved, "%s/cache", evil);
  CHECK(mkdir(moved, 0700) == 0);
  CHECK(symlink(real, link) == 0); /* <root>/at -> real: the cache is real/cache */
  setenv("KILN_CACHE_DIR", cache, 1);
  cache_disk_scratch s;
  CHECK(cache_disk_scratch_open(&s, ".so"));
  /* the swap: <root>/at now leads to evil (whose cache/ would pass every check) */
  CHECK(unlink(link) == 0 && symlink(evil, link) == 0);
  FILE *f = fopen(s.path, "w"); /* what the compiler does with the path */
  CHECK(f != NULL);
  if (f) fputs("object bytes", f), fclose(f);
  char in_real[PATH_MAX + 128], in_evil[PATH_MAX + 128];
  snprintf(in_real, sizeof in_real, "%s/cache/%s", real, s.name);
  snprintf(in_evil, sizeof in_evil, "%s/%s", moved, s.name);
  struct stat st;
  CHECK(stat(in_real, &st) == 0 && st.st_size == 12); /* written where it was checked */
  CHECK(access(in_evil, F_OK) != 0);                  /* nothing landed elsewhere */
  int fd = cache_disk_scratch_read(&s);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  cache_disk_scratch_close(&s);
  rm_rf(root);
  fresh_cache();
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--child-load")) return child_load(argv[2], argv[3]);
  if (!build_so()) {
    fprintf(stderr,
            "cannot build a shared object with cc/gcc/clang: the disk cache tests need one\n");
    printf("0 passed, 1 failed\n");
    return 1;
  }
  RUN(test_store_then_load);
  RUN(test_second_process_loads);
  RUN(test_corrupt_files_are_deleted);
  RUN(test_concurrent_stores);
  RUN(test_disabled);
  RUN(test_lru_bound);
  RUN(test_stores_list_only_near_the_bound);
  RUN(test_unusable_directory);
  RUN(test_directory_defaults);
  RUN(test_scratch_writes_cannot_be_redirected);
  if (cache_dir[0]) rm_rf(cache_dir);
  rm_rf(work_dir);
  return ktest_done();
}

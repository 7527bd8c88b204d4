/* disk.c — the on-disk kernel cache: verified shared objects, atomic writes
 * (mkstemp + fsync + rename), LRU size bound by mtime.  No global state but a
 * "logged once" flag: every call re-reads the environment. */
#include "disk.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../vm/state.h"

#define DISK_MAGIC "KILNKC"
#define DISK_MAGIC_LEN 6
#define DISK_PREFIX "kernel-v"
#define DISK_TMP_PREFIX ".kernel-tmp-"
#define DISK_CHUNK (64 * 1024)
#define DISK_STALE_TMP_SECONDS 3600
/* room kept after the directory for "/kernel-v<n>-<32 hex>.so" */
#define DISK_NAME_ROOM 64

/* ---- logging: the first problem only, and only when KILN_LOG is set ---- */

static atomic_flag disk_logged = ATOMIC_FLAG_INIT;

static void disk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void disk_log(const char *fmt, ...) {
  const char *lv = getenv("KILN_LOG");
  if (!lv || !*lv) return;
  if (atomic_flag_test_and_set(&disk_logged)) return;
  char msg[PATH_MAX + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "kiln: disk cache: %s (further disk cache problems are not reported)\n", msg);
}

/* ---- settings ---- */

bool cache_disk_enabled(void) {
  return vm_env_long("KILN_CACHE", 1) != 0;
}

uint64_t cache_disk_max_bytes(void) {
  long bytes = vm_env_long("KILN_CACHE_MAX_BYTES", 0);
  if (bytes > 0) return (uint64_t)bytes;
  const char *s = getenv("KILN_CACHE_MAX_MB");
  if (s && *s) {
    char *end;
    double mb = strtod(s, &end);
    if (!*end && mb > 0 && mb < 1e12) return (uint64_t)(mb * 1048576.0);
  }
  return (uint64_t)CACHE_DISK_DEFAULT_MAX_MB << 20;
}

/* ---- the directory ---- */

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* mkdir -p; path is modified temporarily */
static bool ensure_dir(char *path) {
  if (is_dir(path)) return true;
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int rc = mkdir(path, 0755);
    int err = errno;
    *p = '/';
    if (rc != 0 && err != EEXIST) {
      disk_log("cannot create %s: %s", path, strerror(err));
      return false;
    }
  }
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    disk_log("cannot create %s: %s", path, strerror(errno));
    return false;
  }
  if (!is_dir(path)) {
    disk_log("%s is not a directory", path);
    return false;
  }
  return true;
}

static _Thread_local char dir_buf[PATH_MAX];

const char *cache_disk_dir(void) {
  if (!cache_disk_enabled()) return NULL;
  const char *env;
  int n;
  if ((env = getenv("KILN_CACHE_DIR")) && *env)
    n = snprintf(dir_buf, sizeof dir_buf, "%s", env);
  else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/')
    n = snprintf(dir_buf, sizeof dir_buf, "%s/kiln", env);
  else if ((env = getenv("HOME")) && *env)
    n = snprintf(dir_buf, sizeof dir_buf, "%s/.cache/kiln", env);
  else
    return NULL;
  if (n <= 0 || n >= (int)sizeof dir_buf - DISK_NAME_ROOM) return NULL;
  while (n > 1 && dir_buf[n - 1] == '/') dir_buf[--n] = '\0';
  return ensure_dir(dir_buf) ? dir_buf : NULL;
}

static void file_name(const uint64_t h[2], char *out, size_t out_len) {
  snprintf(out, out_len, DISK_PREFIX "%d-%016" PRIx64 "%016" PRIx64 ".so", CACHE_DISK_FORMAT, h[0],
           h[1]);
}

void cache_disk_path(const uint64_t h[2], char *out, size_t out_len) {
  if (!out || !out_len) return;
  const char *dir = cache_disk_dir();
  if (!dir) {
    out[0] = '\0';
    return;
  }
  char name[DISK_NAME_ROOM];
  file_name(h, name, sizeof name);
  int n = snprintf(out, out_len, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= out_len) out[0] = '\0';
}

/* ---- I/O helpers ---- */

static void put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void encode_trailer(uint8_t t[CACHE_DISK_TRAILER_SIZE], const uint64_t h[2], uint64_t len,
                           uint64_t sum) {
  memcpy(t, DISK_MAGIC, DISK_MAGIC_LEN);
  put_le(t + 6, CACHE_DISK_FORMAT, 2);
  put_le(t + 8, h[0], 8);
  put_le(t + 16, h[1], 8);
  put_le(t + 24, len, 8);
  put_le(t + 32, sum, 8);
}

/* bytes read, < len only at end of file; -1 on error */
static ssize_t pread_full(int fd, void *buf, size_t len, off_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t r = pread(fd, (char *)buf + done, len - done, off + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

static ssize_t read_full(int fd, void *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t r = read(fd, (char *)buf + done, len - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

static bool write_full(int fd, const void *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, (const char *)buf + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += (size_t)w;
  }
  return true;
}

/* sets both times to now with full clock resolution (file timestamps from
   the kernel are coarse: stores a few ms apart could tie) */
static void touch_fd(int fd) {
  struct timespec ts[2];
  clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[1] = ts[0];
  (void)futimens(fd, ts);
}

/* ---- load ---- */

enum { VERIFY_OK, VERIFY_BAD, VERIFY_IO };

static int verify(int fd, const struct stat *st, const uint64_t h[2], const char **why) {
  if (!S_ISREG(st->st_mode)) return *why = "not a regular file", VERIFY_BAD;
  if (st->st_size < CACHE_DISK_TRAILER_SIZE + 4) return *why = "too short", VERIFY_BAD;
  uint64_t len = (uint64_t)st->st_size - CACHE_DISK_TRAILER_SIZE;
  uint8_t t[CACHE_DISK_TRAILER_SIZE];
  ssize_t r = pread_full(fd, t, sizeof t, (off_t)len);
  if (r < 0) return *why = strerror(errno), VERIFY_IO;
  if (r != (ssize_t)sizeof t) return *why = "truncated", VERIFY_BAD;
  if (memcmp(t, DISK_MAGIC, DISK_MAGIC_LEN) != 0) return *why = "bad magic", VERIFY_BAD;
  if (get_le(t + 6, 2) != CACHE_DISK_FORMAT) return *why = "wrong format version", VERIFY_BAD;
  if (get_le(t + 8, 8) != h[0] || get_le(t + 16, 8) != h[1])
    return *why = "hash mismatch", VERIFY_BAD;
  if (get_le(t + 24, 8) != len) return *why = "length mismatch", VERIFY_BAD;

  uint8_t *buf = malloc(DISK_CHUNK);
  XXH3_state_t *xs = XXH3_createState();
  int rc = VERIFY_OK;
  if (!buf || !xs || XXH3_64bits_reset(xs) != XXH_OK) {
    *why = "out of memory";
    rc = VERIFY_IO;
  }
  for (uint64_t off = 0; rc == VERIFY_OK && off < len;) {
    size_t want = len - off < DISK_CHUNK ? (size_t)(len - off) : DISK_CHUNK;
    r = pread_full(fd, buf, want, (off_t)off);
    if (r < 0) {
      *why = strerror(errno);
      rc = VERIFY_IO;
    } else if ((size_t)r != want) {
      *why = "truncated while reading";
      rc = VERIFY_BAD;
    } else {
      XXH3_64bits_update(xs, buf, want);
      off += want;
    }
  }
  if (rc == VERIFY_OK && XXH3_64bits_digest(xs) != get_le(t + 32, 8)) {
    *why = "checksum mismatch";
    rc = VERIFY_BAD;
  }
  XXH3_freeState(xs);
  free(buf);
  return rc;
}

/* deletes path if it is still the file we examined (a writer may have just
   renamed a fresh one into place) */
static void discard(const char *path, const struct stat *seen, const char *why) {
  struct stat now;
  if (stat(path, &now) == 0 && now.st_dev == seen->st_dev && now.st_ino == seen->st_ino) {
    if (unlink(path) != 0 && errno != ENOENT) {
      disk_log("cannot delete bad file %s (%s): %s", path, why, strerror(errno));
      return;
    }
  }
  disk_log("deleted bad file %s: %s", path, why);
}

void *cache_disk_load(const uint64_t h[2]) {
  if (!h) return NULL;
  char path[PATH_MAX];
  cache_disk_path(h, path, sizeof path);
  if (!path[0]) return NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ELOOP) {
      struct stat st;
      if (lstat(path, &st) == 0) discard(path, &st, "a symbolic link");
    } else if (errno != ENOENT) {
      disk_log("cannot open %s: %s", path, strerror(errno));
    }
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    disk_log("cannot stat %s: %s", path, strerror(errno));
    close(fd);
    return NULL;
  }
  const char *why = NULL;
  int v = verify(fd, &st, h, &why);
  if (v != VERIFY_OK) {
    if (v == VERIFY_BAD)
      discard(path, &st, why);
    else
      disk_log("cannot read %s: %s", path, why);
    close(fd);
    return NULL;
  }
  /* Verified through fd; the loader opens the path again.  Files only ever
     appear there by rename of a complete file for the same hash. */
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *err = dlerror();
    discard(path, &st, err ? err : "dlopen failed");
    close(fd);
    return NULL;
  }
  touch_fd(fd);
  close(fd);
  return handle;
}

/* ---- eviction ---- */

typedef struct disk_file {
  char *name;
  uint64_t size;
  struct timespec mtime;
} disk_file;

static int older_first(const void *pa, const void *pb) {
  const disk_file *a = pa, *b = pb;
  if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
  if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
  return strcmp(a->name, b->name);
}

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Deletes least recently used kernel files (any format version; never
   `keep`) until the total size is at most max, and stale temp files. */
static void evict(const char *dir, const char *keep, uint64_t max) {
  DIR *d = opendir(dir);
  if (!d) {
    disk_log("cannot list %s: %s", dir, strerror(errno));
    return;
  }
  int dfd = dirfd(d);
  disk_file *files = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *name = e->d_name;
    bool kernel = !strncmp(name, DISK_PREFIX, strlen(DISK_PREFIX)) && has_suffix(name, ".so");
    bool tmp = !strncmp(name, DISK_TMP_PREFIX, strlen(DISK_TMP_PREFIX));
    if (!kernel && !tmp) continue;
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (tmp) {
      if (now - st.st_mtim.tv_sec > DISK_STALE_TMP_SECONDS) (void)unlinkat(dfd, name, 0);
      continue;
    }
    total += (uint64_t)st.st_size;
    if (!strcmp(name, keep)) continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      disk_file *nf = realloc(files, ncap * sizeof *nf);
      if (!nf) break;
      files = nf;
      cap = ncap;
    }
    char *copy = strdup(name);
    if (!copy) break;
    files[n++] = (disk_file){copy, (uint64_t)st.st_size, st.st_mtim};
  }
  if (total > max && n) {
    qsort(files, n, sizeof *files, older_first);
    for (size_t i = 0; i < n && total > max; i++) {
      if (unlinkat(dfd, files[i].name, 0) == 0 || errno == ENOENT)
        total -= files[i].size; /* ENOENT: another process evicted it */
      else
        disk_log("cannot evict %s/%s: %s", dir, files[i].name, strerror(errno));
    }
  }
  for (size_t i = 0; i < n; i++) free(files[i].name);
  free(files);
  closedir(d);
}

/* ---- store ---- */

bool cache_disk_store(const uint64_t h[2], const char *so_path) {
  if (!h || !so_path) return false;
  const char *d = cache_disk_dir();
  if (!d) return false;
  char dir[PATH_MAX], name[DISK_NAME_ROOM];
  char final[PATH_MAX + 2 * DISK_NAME_ROOM], tmp[PATH_MAX + 2 * DISK_NAME_ROOM];
  snprintf(dir, sizeof dir, "%s", d);
  file_name(h, name, sizeof name);
  snprintf(final, sizeof final, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/" DISK_TMP_PREFIX "XXXXXX", dir);

  int in = open(so_path, O_RDONLY | O_CLOEXEC);
  if (in < 0) {
    disk_log("cannot open %s: %s", so_path, strerror(errno));
    return false;
  }
  int out = mkostemp(tmp, O_CLOEXEC);
  if (out < 0) {
    disk_log("cannot create a temp file in %s: %s", dir, strerror(errno));
    close(in);
    return false;
  }
  uint8_t *buf = malloc(DISK_CHUNK);
  XXH3_state_t *xs = XXH3_createState();
  const char *fail = NULL;
  int err = 0; /* errno of the failure, 0 when it has none */
  uint64_t len = 0;
  if (!buf || !xs || XXH3_64bits_reset(xs) != XXH_OK) fail = "out of memory";
  while (!fail) {
    ssize_t r = read_full(in, buf, DISK_CHUNK);
    if (r < 0) {
      err = errno, fail = "read failed";
      break;
    }
    if (r == 0) break;
    if (len == 0 && (r < 4 || memcmp(buf, "\177ELF", 4) != 0)) {
      fail = "not an ELF shared object";
      break;
    }
    XXH3_64bits_update(xs, buf, (size_t)r);
    if (!write_full(out, buf, (size_t)r)) {
      err = errno, fail = "write failed";
      break;
    }
    len += (uint64_t)r;
  }
  if (!fail && len == 0) fail = "empty file";
  if (!fail) {
    uint8_t t[CACHE_DISK_TRAILER_SIZE];
    encode_trailer(t, h, len, XXH3_64bits_digest(xs));
    if (!write_full(out, t, sizeof t)) err = errno, fail = "write failed";
  }
  if (!fail && fsync(out) != 0) err = errno, fail = "fsync failed";
  if (!fail) touch_fd(out);
  if (close(out) != 0 && !fail) err = errno, fail = "close failed";
  if (!fail && rename(tmp, final) != 0) err = errno, fail = "rename failed";
  XXH3_freeState(xs);
  free(buf);
  close(in);
  if (fail) {
    (void)unlink(tmp);
    disk_log("cannot store %s from %s: %s%s%s%s", final, so_path, fail, err ? " (" : "",
             err ? strerror(err) : "", err ? ")" : "");
    return false;
  }
  evict(dir, name, cache_disk_max_bytes());
  return true;
}

/* disk.c — the on-disk kernel cache: a private directory checked on its
 * descriptor, verified shared objects loaded from the very descriptor that
 * was checked, atomic writes (temp file + fsync + rename), temp files named
 * by their writer's pid and reclaimed once it is gone, LRU size bound by
 * mtime.  No global state but "said once" and "reclaimed once" flags: every
 * call re-reads the environment. */
#include "disk.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../vm/private_dir.h"
#include "../vm/state.h"

#define DISK_MAGIC "KILNKC"
#define DISK_MAGIC_LEN 6
#define DISK_PREFIX "kernel-v"
#define DISK_TMP_PREFIX ".kernel-tmp-"
#define DISK_CHUNK (64 * 1024)
/* a temp file whose writer cannot be told dead (no pid in its name, or a
   pid now reused) goes after this long; no write takes minutes */
#define DISK_STALE_TMP_SECONDS 600
/* room kept after the directory for "/kernel-v<n>-<32 hex>.so" */
#define DISK_NAME_ROOM 64

/* ---- logging: KILN_LOG shows the first problem; a refused directory is
   always said, once ---- */

static atomic_flag disk_logged = ATOMIC_FLAG_INIT;
static atomic_flag disk_warned = ATOMIC_FLAG_INIT;

static void disk_say(atomic_flag *once, const char *head, const char *tail, const char *fmt,
                     va_list ap) {
  if (atomic_flag_test_and_set(once)) return;
  char msg[PATH_MAX + 512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  fprintf(stderr, "kiln: %s%s%s\n", head, msg, tail);
}

static void disk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void disk_log(const char *fmt, ...) {
  const char *lv = getenv("KILN_LOG");
  if (!lv || !*lv) return;
  va_list ap;
  va_start(ap, fmt);
  disk_say(&disk_logged, "disk cache: ", " (further disk cache problems are not reported)", fmt,
           ap);
  va_end(ap);
}

static void disk_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void disk_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  disk_say(&disk_warned, "", "", fmt, ap);
  va_end(ap);
}

/* ---- settings ---- */

bool cache_disk_enabled(void) { return vm_env_long("KILN_CACHE", 1) != 0; }

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

/* The directory is opened and checked once per call and every file in it
   is reached through that descriptor (openat and friends), so a path
   renamed or re-pointed meanwhile changes nothing. */
typedef struct disk_dir {
  int fd;
  char path[PATH_MAX];
} disk_dir;

static _Thread_local char dir_buf[PATH_MAX];

/* the configured path into out (trailing slashes dropped); false when none */
static bool configured_dir(char *out, size_t out_len) {
  const char *env;
  int n;
  if ((env = getenv("KILN_CACHE_DIR")) && *env)
    n = snprintf(out, out_len, "%s", env);
  else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/')
    n = snprintf(out, out_len, "%s/kiln", env);
  else if ((env = getenv("HOME")) && *env)
    n = snprintf(out, out_len, "%s/.cache/kiln", env);
  else
    return false;
  if (n <= 0 || n >= (int)out_len - DISK_NAME_ROOM) return false;
  while (n > 1 && out[n - 1] == '/') out[--n] = '\0';
  return true;
}

/* a world-writable sticky directory (a shared /tmp-like place) */
static bool shared_sticky(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) &&
         (st.st_mode & S_IWOTH);
}

static void reclaim_once(int dir_fd);

/* Opens the cache directory: it must be a real directory owned by the
   effective user and writable by no one else.  A shared sticky directory
   (KILN_CACHE_DIR=/tmp) holds a private "kiln-<euid>" directory instead,
   checked the same way; another user's junk in the shared directory is
   never looked at.  Anything else untrusted turns the disk cache off for
   the call, with one warning per process. */
static bool dir_open(disk_dir *d) {
  d->fd = -1;
  if (!cache_disk_enabled() || !configured_dir(d->path, sizeof d->path)) return false;
  vm_dir_status status;
  const char *why = NULL;
  d->fd = vm_private_dir_open(d->path, true, &status, &why);
  if (d->fd < 0 && status == VM_DIR_UNTRUSTED && shared_sticky(d->path)) {
    size_t n = strlen(d->path);
    snprintf(d->path + n, sizeof d->path - n, "/kiln-%lu", (unsigned long)geteuid());
    d->fd = vm_private_dir_open(d->path, true, &status, &why);
  }
  if (d->fd < 0) {
    if (status == VM_DIR_UNTRUSTED)
      disk_warn(
          "the disk cache is off: %s is %s (it must be a directory owned by you and writable by no "
          "one else; set KILN_CACHE_DIR to one); kernels are compiled and kept in memory only",
          d->path, why);
    else
      disk_log("cannot use %s: %s", d->path, why);
    return false;
  }
  reclaim_once(d->fd);
  return true;
}

static void dir_close(disk_dir *d) {
  if (d->fd >= 0) close(d->fd);
  d->fd = -1;
}

const char *cache_disk_dir(void) {
  disk_dir d;
  if (!dir_open(&d)) return NULL;
  dir_close(&d);
  snprintf(dir_buf, sizeof dir_buf, "%s", d.path);
  return dir_buf;
}

/* the directory cache_disk_writable last probed, and its answer */
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static char probed_dir[PATH_MAX];
static bool probed_writable;

static int temp_create(const disk_dir *d, const char *suffix, char *name_out, size_t name_len);

bool cache_disk_writable(void) {
  disk_dir d;
  if (!dir_open(&d)) return false;
  pthread_mutex_lock(&probe_lock);
  if (strcmp(probed_dir, d.path)) {
    char tmp[DISK_NAME_ROOM];
    static const char zeros[4096];
    int fd = temp_create(&d, ".probe", tmp, sizeof tmp), err = errno;
    bool ok = fd >= 0;
    for (int k = 0; ok && k < CACHE_DISK_PROBE_BYTES / (int)sizeof zeros; k++) {
      ok = vm_write_full(fd, zeros, sizeof zeros);
      if (!ok) err = errno;
    }
    if (fd >= 0) {
      close(fd);
      (void)unlinkat(d.fd, tmp, 0);
    }
    if (!ok)
      fprintf(stderr, "kiln: the disk cache %s cannot be written (%s); kernels compile in memory\n",
              d.path, strerror(err));
    snprintf(probed_dir, sizeof probed_dir, "%s", d.path);
    probed_writable = ok;
  }
  bool ok = probed_writable;
  pthread_mutex_unlock(&probe_lock);
  dir_close(&d);
  return ok;
}

/* ext: ".so" for shared objects, ".idx" for index records */
static void file_name_ext(const uint64_t h[2], const char *ext, char *out, size_t out_len) {
  snprintf(out, out_len, DISK_PREFIX "%d-%016" PRIx64 "%016" PRIx64 "%s", CACHE_DISK_FORMAT, h[0],
           h[1], ext);
}

static void file_name(const uint64_t h[2], char *out, size_t out_len) {
  file_name_ext(h, ".so", out, out_len);
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

/* Deletes `name` if it is still the entry we examined (a writer may have
   just renamed a fresh file into place); seen NULL: only if it is a
   symbolic link.  The directory is ours, so we can always unlink in it:
   junk never makes every later run recompile. */
static void discard(const disk_dir *d, const char *name, const struct stat *seen, const char *why) {
  struct stat now;
  if (fstatat(d->fd, name, &now, AT_SYMLINK_NOFOLLOW) != 0) return;
  bool same =
      seen ? now.st_dev == seen->st_dev && now.st_ino == seen->st_ino : S_ISLNK(now.st_mode);
  if (!same) return;
  if (unlinkat(d->fd, name, 0) != 0 && errno != ENOENT) {
    disk_log("cannot delete bad file %s/%s (%s): %s", d->path, name, why, strerror(errno));
    return;
  }
  disk_log("deleted bad file %s/%s: %s", d->path, name, why);
}

/* ---- loading the checked descriptor itself ---- */

/* the descriptor numbers N of loaded objects named "/proc/self/fd/N" */
typedef struct {
  int *fds;
  size_t n, cap;
} fd_names;

static int collect_fd_name(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  fd_names *s = arg;
  int n;
  char tail;
  if (!info->dlpi_name || sscanf(info->dlpi_name, "/proc/self/fd/%d%c", &n, &tail) != 1) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    int *g = realloc(s->fds, cap * sizeof *g);
    if (!g) return 1;
    s->fds = g;
    s->cap = cap;
  }
  s->fds[s->n++] = n;
  return 0;
}

static bool fd_name_taken(const fd_names *s, int fd) {
  for (size_t i = 0; i < s->n; i++)
    if (s->fds[i] == fd) return true;
  return false;
}

/* whether the mapping holding addr comes from the file st describes */
static bool mapped_from(const void *addr, const struct stat *st) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[PATH_MAX + 256];
  bool same = false, whole = true; /* whole: this read starts a line */
  while (fgets(line, sizeof line, f)) {
    bool start = whole;
    whole = strchr(line, '\n') != NULL;
    unsigned long lo, hi, ino;
    unsigned maj, mnr;
    if (!start || sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &lo, &hi, &maj, &mnr, &ino) != 5)
      continue;
    if ((uintptr_t)addr < lo || (uintptr_t)addr >= hi) continue;
    same = maj == major(st->st_dev) && mnr == minor(st->st_dev) && ino == st->st_ino;
    break;
  }
  fclose(f);
  return same;
}

enum { LOAD_OK, LOAD_BAD, LOAD_ENV }; /* LOAD_ENV: not the file's fault */

/* dlopen's the file open on fd through "/proc/self/fd/N", so the object
   mapped is the file that was checked, whatever its name points to now.
   The dynamic loader also matches names it has loaded before: a number
   whose name an earlier object still carries is skipped (another
   descriptor for the file is used), and the object returned must be
   mapped from this very file. */
static void *dlopen_fd(int fd, const struct stat *st, int *rc, const char **why) {
  int use = fd, spare = -1;
  void *handle = NULL;
  *rc = LOAD_ENV;
  *why = "every descriptor name tried was in use";
  /* the names in use, once: with many objects loaded (one per compiled
     batch) the free numbers can lie past many taken ones */
  fd_names taken = {0};
  dl_iterate_phdr(collect_fd_name, &taken);
  for (int attempt = 0; attempt < 16 + (int)taken.n && !handle; attempt++) {
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", use);
    if (!fd_name_taken(&taken, use)) {
      struct stat via;
      if (stat(name, &via) != 0 || via.st_dev != st->st_dev || via.st_ino != st->st_ino) {
        *why = "/proc/self/fd is not available";
        break;
      }
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char *err = dlerror();
        *rc = LOAD_BAD;
        *why = err ? err : "dlopen failed";
        break;
      }
      struct link_map *lm = NULL;
      if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm ||
          (strcmp(lm->l_name, name) != 0 && !mapped_from(lm->l_ld, st))) {
        dlclose(handle); /* an older object known by this name as well */
        handle = NULL;
      }
    }
    if (handle) break;
    int next = fcntl(fd, F_DUPFD_CLOEXEC, use + 1);
    if (spare >= 0) close(spare);
    spare = next;
    if (next < 0) {
      *why = "no descriptor left to load through";
      break;
    }
    use = next;
  }
  if (spare >= 0) close(spare);
  free(taken.fds);
  if (handle) *rc = LOAD_OK, *why = NULL;
  return handle;
}

/* opens file `name` of d for reading and checks it as every cache file is
   checked (not a link, a regular file of the user's with one link, the
   trailer and checksum of h); a bad file is deleted.  -1 when absent or bad */
static int open_verified(const disk_dir *d, const char *name, const uint64_t h[2],
                         struct stat *st) {
  int fd = openat(d->fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP)
      discard(d, name, NULL, "a symbolic link");
    else if (errno != ENOENT)
      disk_log("cannot open %s/%s: %s", d->path, name, strerror(errno));
    return -1;
  }
  const char *why = NULL;
  int v = VERIFY_IO;
  if (fstat(fd, st) != 0) {
    disk_log("cannot stat %s/%s: %s", d->path, name, strerror(errno));
  } else if (!vm_private_file_check(st, &why)) {
    discard(d, name, st, why);
  } else {
    v = verify(fd, st, h, &why);
    if (v == VERIFY_BAD) discard(d, name, st, why);
    if (v == VERIFY_IO) disk_log("cannot read %s/%s: %s", d->path, name, why);
  }
  if (v != VERIFY_OK) {
    close(fd);
    return -1;
  }
  return fd;
}

size_t cache_disk_index_get(const uint64_t h[2], void *buf, size_t cap) {
  if (!h || !buf) return 0;
  disk_dir d;
  if (!dir_open(&d)) return 0;
  char name[DISK_NAME_ROOM];
  file_name_ext(h, ".idx", name, sizeof name);
  struct stat st;
  int fd = open_verified(&d, name, h, &st);
  size_t got = 0;
  if (fd >= 0) {
    uint64_t len = (uint64_t)st.st_size - CACHE_DISK_TRAILER_SIZE;
    if (len <= cap && pread_full(fd, buf, (size_t)len, 0) == (ssize_t)len) got = (size_t)len;
    if (got) touch_fd(fd);
    close(fd);
  }
  dir_close(&d);
  return got;
}

/* ---- load ---- */

void *cache_disk_load(const uint64_t h[2]) {
  if (!h) return NULL;
  disk_dir d;
  if (!dir_open(&d)) return NULL;
  char name[DISK_NAME_ROOM];
  file_name(h, name, sizeof name);
  /* O_NONBLOCK: a FIFO under this name must not hang the open */
  int fd = openat(d.fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP)
      discard(&d, name, NULL, "a symbolic link");
    else if (errno != ENOENT)
      disk_log("cannot open %s/%s: %s", d.path, name, strerror(errno));
    dir_close(&d);
    return NULL;
  }
  void *handle = NULL;
  struct stat st;
  const char *why = NULL;
  if (fstat(fd, &st) != 0) {
    disk_log("cannot stat %s/%s: %s", d.path, name, strerror(errno));
  } else if (!vm_private_file_check(&st, &why)) {
    discard(&d, name, &st, why);
  } else {
    int v = verify(fd, &st, h, &why);
    if (v == VERIFY_BAD) discard(&d, name, &st, why);
    if (v == VERIFY_IO) disk_log("cannot read %s/%s: %s", d.path, name, why);
    int rc = LOAD_ENV;
    if (v == VERIFY_OK) handle = dlopen_fd(fd, &st, &rc, &why);
    if (v == VERIFY_OK && rc == LOAD_BAD) discard(&d, name, &st, why);
    if (v == VERIFY_OK && rc == LOAD_ENV)
      disk_warn("the disk cache cannot load %s/%s: %s; kernels are compiled and kept in memory",
                d.path, name, why);
  }
  if (handle) touch_fd(fd);
  close(fd);
  dir_close(&d);
  return handle;
}

/* ---- temp files: named by their writer's pid, reclaimed once it is gone ---- */

/* whether temp file `name` (DISK_TMP_PREFIX "<pid>-...") is a leftover:
   its writer is dead, or (no pid, or a pid reused) it is old */
static bool stale_temp(const char *name, const struct stat *st, time_t now) {
  const char *p = name + strlen(DISK_TMP_PREFIX);
  char *end;
  long pid = strtol(p, &end, 10);
  bool named = end != p && *end == '-' && pid > 0 && pid <= INT_MAX;
  if (named && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
  return now - st->st_mtim.tv_sec > DISK_STALE_TMP_SECONDS;
}

/* Creates a temp file in the directory: DISK_TMP_PREFIX "<pid>-<12 hex><suffix>",
   mode 0600, O_EXCL; its name into name_out.  -1 on failure. */
static int temp_create(const disk_dir *d, const char *suffix, char *name_out, size_t name_len) {
  static atomic_uint_fast64_t counter;
  for (int attempt = 0; attempt < 64; attempt++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
                        atomic_fetch_add(&counter, 1)};
    uint64_t r = XXH3_64bits(seed, sizeof seed) & 0xffffffffffffull;
    int n = snprintf(name_out, name_len, DISK_TMP_PREFIX "%ld-%012" PRIx64 "%s", (long)getpid(), r,
                     suffix ? suffix : "");
    if (n <= 0 || (size_t)n >= name_len) return -1;
    int fd = openat(d->fd, name_out, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
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

/* Deletes leftover temp files and, when `keep` is given, least recently
   used kernel files (.so, .idx, .blob; any format version; never `keep`) until the total
   size is at most max. */
/* Lists the directory: removes stale temp files and, past max bytes,
   the least recently used entries (but `keep`); returns the bytes of
   entries left (UINT64_MAX when it cannot list) */
static uint64_t evict(int dir_fd, const char *dir, const char *keep, uint64_t max) {
  int dfd = dup(dir_fd);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0) close(dfd);
    disk_log("cannot list %s: %s", dir, strerror(errno));
    return UINT64_MAX;
  }
  disk_file *files = NULL;
  size_t n = 0, cap = 0;
  uint64_t total = 0;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *name = e->d_name;
    bool kernel =
        keep && !strncmp(name, DISK_PREFIX, strlen(DISK_PREFIX)) &&
        (has_suffix(name, ".so") || has_suffix(name, ".idx") || has_suffix(name, ".blob"));
    bool tmp = !strncmp(name, DISK_TMP_PREFIX, strlen(DISK_TMP_PREFIX));
    if (!kernel && !tmp) continue;
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (tmp) {
      if (stale_temp(name, &st, now)) (void)unlinkat(dfd, name, 0);
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
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
  return total;
}

/* A store lists the directory only when its size may have passed the
   bound: listing stats every entry, and a cache of 13,800 files made each
   store pay 30-55 ms for it (readdir + fstatat, page cache warm), more as
   the cache grew.  So the process keeps
   what its last listing found plus what it stored since (an upper bound
   but for other processes' stores), and lists again when that passes the
   bound, when the directory is another, or after a minute (other writers;
   their stale temp files). */
static struct {
  pthread_mutex_t lock;
  bool known;
  dev_t dev;
  ino_t ino;
  uint64_t bytes;
  time_t listed;
} usage = {.lock = PTHREAD_MUTEX_INITIALIZER};

enum { DISK_RELIST_S = 60 };

static atomic_uint_fast64_t listings;

uint64_t cache_disk_listings(void) { return atomic_load_explicit(&listings, memory_order_relaxed); }

static void evict_if_full(int dir_fd, const char *dir, const char *keep, uint64_t stored) {
  struct stat st;
  if (fstat(dir_fd, &st) != 0) return;
  uint64_t max = cache_disk_max_bytes();
  time_t now = time(NULL);
  pthread_mutex_lock(&usage.lock);
  bool same = usage.known && usage.dev == st.st_dev && usage.ino == st.st_ino &&
              now - usage.listed < DISK_RELIST_S && now >= usage.listed;
  bool list = !same || usage.bytes + stored > max;
  if (!list) usage.bytes += stored;
  pthread_mutex_unlock(&usage.lock);
  if (!list) return;
  atomic_fetch_add_explicit(&listings, 1, memory_order_relaxed);
  uint64_t left = evict(dir_fd, dir, keep, max);
  pthread_mutex_lock(&usage.lock);
  usage.known = left != UINT64_MAX;
  usage.dev = st.st_dev;
  usage.ino = st.st_ino;
  usage.bytes = left;
  usage.listed = now;
  pthread_mutex_unlock(&usage.lock);
}

/* at start-up (the first time a process opens a cache directory): the
   temp files of writers that are gone */
static atomic_flag disk_reclaimed = ATOMIC_FLAG_INIT;

static void reclaim_once(int dir_fd) {
  if (!atomic_flag_test_and_set(&disk_reclaimed))
    (void)evict(dir_fd, "the cache directory", NULL, UINT64_MAX);
}

/* ---- store ---- */

/* copies the shared object open on `in` into a temp file with its trailer,
   then renames it to the name for h */
static bool store_from(const disk_dir *d, const uint64_t h[2], int in, const char *from,
                       const char *ext) {
  char name[DISK_NAME_ROOM], tmp[DISK_NAME_ROOM];
  bool elf = !strcmp(ext, ".so");
  file_name_ext(h, ext, name, sizeof name);
  int out = temp_create(d, NULL, tmp, sizeof tmp);
  if (out < 0) {
    disk_log("cannot create a temp file in %s: %s", d->path, strerror(errno));
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
    if (elf && len == 0 && (r < 4 || memcmp(buf, "\177ELF", 4) != 0)) {
      fail = "not an ELF shared object";
      break;
    }
    XXH3_64bits_update(xs, buf, (size_t)r);
    if (!vm_write_full(out, buf, (size_t)r)) {
      err = errno, fail = "write failed";
      break;
    }
    len += (uint64_t)r;
  }
  if (!fail && len == 0) fail = "empty file";
  if (!fail) {
    uint8_t t[CACHE_DISK_TRAILER_SIZE];
    encode_trailer(t, h, len, XXH3_64bits_digest(xs));
    if (!vm_write_full(out, t, sizeof t)) err = errno, fail = "write failed";
  }
  if (!fail && fsync(out) != 0) err = errno, fail = "fsync failed";
  if (!fail) touch_fd(out);
  if (close(out) != 0 && !fail) err = errno, fail = "close failed";
  if (!fail && renameat(d->fd, tmp, d->fd, name) != 0) err = errno, fail = "rename failed";
  XXH3_freeState(xs);
  free(buf);
  if (fail) {
    (void)unlinkat(d->fd, tmp, 0);
    disk_log("cannot store %s/%s from %s: %s%s%s%s", d->path, name, from, fail, err ? " (" : "",
             err ? strerror(err) : "", err ? ")" : "");
    return false;
  }
  evict_if_full(d->fd, d->path, name, len + CACHE_DISK_TRAILER_SIZE);
  return true;
}

bool cache_disk_store(const uint64_t h[2], const char *so_path) {
  if (!h || !so_path) return false;
  disk_dir d;
  if (!dir_open(&d)) return false;
  int in = open(so_path, O_RDONLY | O_CLOEXEC);
  bool ok = false;
  if (in < 0)
    disk_log("cannot open %s: %s", so_path, strerror(errno));
  else
    ok = store_from(&d, h, in, so_path, ".so");
  if (in >= 0) close(in);
  dir_close(&d);
  return ok;
}

/* ---- scratch files for the compiler ---- */

bool cache_disk_scratch_open(cache_disk_scratch *s, const char *suffix) {
  disk_dir d;
  s->dir_fd = -1;
  s->name[0] = s->path[0] = s->dir[0] = '\0';
  if (!dir_open(&d)) return false;
  int fd = temp_create(&d, suffix, s->name, sizeof s->name);
  int n = fd >= 0 ? snprintf(s->path, sizeof s->path, "/proc/%ld/fd/%d/%s", (long)getpid(), d.fd,
                             s->name)
                  : -1;
  struct stat anchored, made;
  /* the linker, our child, reaches /proc/<pid>/fd only while we are
     dumpable (a setuid program is not) */
  if (n > 0 && (size_t)n < sizeof s->path &&
      (prctl(PR_GET_DUMPABLE) != 1 || stat(s->path, &anchored) != 0 || fstat(fd, &made) != 0 ||
       anchored.st_ino != made.st_ino ||
       anchored.st_dev != made.st_dev)) /* no /proc here: the plain path */
    n = snprintf(s->path, sizeof s->path, "%s/%s", d.path, s->name);
  snprintf(s->dir, sizeof s->dir, "%s", d.path);
  if (fd >= 0) close(fd);
  if (n <= 0 || (size_t)n >= sizeof s->path) {
    if (fd >= 0) (void)unlinkat(d.fd, s->name, 0);
    disk_log("cannot create a scratch file in %s: %s", d.path,
             fd < 0 ? strerror(errno) : "path too long");
    dir_close(&d);
    s->name[0] = s->path[0] = '\0';
    return false;
  }
  s->dir_fd = d.fd;
  return true;
}

int cache_disk_scratch_read(const cache_disk_scratch *s) {
  if (s->dir_fd < 0) return -1;
  int fd = openat(s->dir_fd, s->name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  /* the compiler's output mode is its own (ld makes it executable): only
     what it is and whose it is matter in a private directory */
  if (fd >= 0 &&
      (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

bool cache_disk_store_scratch(const uint64_t h[2], const cache_disk_scratch *s) {
  if (!h || !s || s->dir_fd < 0) return false;
  int in = cache_disk_scratch_read(s);
  if (in < 0) {
    disk_log("cannot read back %s", s->path);
    return false;
  }
  disk_dir d = {.fd = s->dir_fd};
  snprintf(d.path, sizeof d.path, "%s", s->dir);
  bool ok = store_from(&d, h, in, s->path, ".so");
  close(in);
  return ok;
}

void cache_disk_scratch_close(cache_disk_scratch *s) {
  if (s->dir_fd >= 0) {
    (void)unlinkat(s->dir_fd, s->name, 0);
    close(s->dir_fd);
  }
  s->dir_fd = -1;
  s->name[0] = s->path[0] = '\0';
}

bool cache_disk_index_put(const uint64_t h[2], const void *data, size_t len) {
  if (!h || !data || !len) return false;
  disk_dir d;
  if (!dir_open(&d)) return false;
  char tmp[DISK_NAME_ROOM];
  int fd = temp_create(&d, ".rec", tmp, sizeof tmp);
  bool ok = fd >= 0 && vm_write_full(fd, data, len) && lseek(fd, 0, SEEK_SET) == 0 &&
            store_from(&d, h, fd, "an index record", ".idx");
  if (fd >= 0) {
    close(fd);
    (void)unlinkat(d.fd, tmp, 0);
  }
  dir_close(&d);
  return ok;
}

/* ---- blobs (compiled GPU code) ---- */

bool cache_disk_blob_put(const uint64_t h[2], const void *data, size_t len) {
  if (!h || !data || !len || len > CACHE_DISK_BLOB_MAX) return false;
  disk_dir d;
  if (!dir_open(&d)) return false;
  char tmp[DISK_NAME_ROOM];
  int fd = temp_create(&d, ".rec", tmp, sizeof tmp);
  bool ok = fd >= 0 && vm_write_full(fd, data, len) && lseek(fd, 0, SEEK_SET) == 0 &&
            store_from(&d, h, fd, "a blob", ".blob");
  if (fd >= 0) {
    close(fd);
    (void)unlinkat(d.fd, tmp, 0);
  }
  dir_close(&d);
  return ok;
}

void *cache_disk_blob_get(const uint64_t h[2], size_t *len) {
  if (len) *len = 0;
  if (!h || !len) return NULL;
  disk_dir d;
  if (!dir_open(&d)) return NULL;
  char name[DISK_NAME_ROOM];
  file_name_ext(h, ".blob", name, sizeof name);
  struct stat st;
  int fd = open_verified(&d, name, h, &st);
  void *data = NULL;
  if (fd >= 0) {
    uint64_t n = (uint64_t)st.st_size - CACHE_DISK_TRAILER_SIZE;
    data = n <= CACHE_DISK_BLOB_MAX ? malloc((size_t)n) : NULL;
    if (data && pread_full(fd, data, (size_t)n, 0) == (ssize_t)n) {
      *len = (size_t)n;
      touch_fd(fd);
    } else {
      if (data) disk_log("cannot read %s/%s", d.path, name);
      free(data);
      data = NULL;
    }
    close(fd);
  }
  dir_close(&d);
  return data;
}

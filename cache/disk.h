/* disk.h — the on-disk kernel cache (DESIGN §4, §11): content hash ->
 * compiled kernel object (a shared library from
 * gcc_jit_context_compile_to_file), kept across processes in KILN_CACHE_DIR.
 * Each file is the shared object followed by a trailer (magic, format
 * version, hash, payload length, XXH3-64 of the payload).  Files are written
 * to a temp file, fsync'd and renamed into place, so concurrent writers
 * (threads or processes) are safe.  The total size is bounded: least
 * recently used files (by mtime; a load touches its file) go first.
 *
 * The cache holds code Kiln executes, so it trusts the directory only, not
 * the checksum (which guards against corruption: it has no secret).  The
 * directory is created 0700 and used only when it is a real directory (not
 * a symlink) owned by the effective user and writable by no one else; a
 * shared sticky directory (/tmp) holds a private "kiln-<euid>" directory
 * instead; anything else turns the disk cache off with one warning.  A
 * file is opened O_NOFOLLOW through the directory's descriptor, must be a
 * regular file of the user's with one link, its checksum is verified on
 * that descriptor, and that very descriptor is what gets loaded
 * ("/proc/self/fd/N").  A file failing any check is deleted, never trusted.
 * Temp files carry their writer's pid and are reclaimed once it is gone.
 *
 * Every function is thread-safe, holds no state between calls (the
 * environment is read on each call) and never fails loudly: an I/O problem
 * just yields NULL/false (reported once per process on stderr when KILN_LOG is
 * set); it never sets the thread's kiln error. */
#ifndef CACHE_DISK_H
#define CACHE_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* bumped whenever the file layout or the meaning of its contents changes;
   part of every file name and trailer */
#define CACHE_DISK_FORMAT 1
/* trailer: "KILNKC", u16 format, u64 h[0], u64 h[1], u64 payload length,
   u64 XXH3-64 of the payload; little-endian, at the very end of the file */
#define CACHE_DISK_TRAILER_SIZE 40
#define CACHE_DISK_DEFAULT_MAX_MB 512

/* KILN_CACHE=0 disables the disk cache entirely (nothing is read or written). */
bool cache_disk_enabled(void);

/* The directory: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln (when absolute),
   else $HOME/.cache/kiln (in a shared sticky directory: its "kiln-<euid>");
   created on demand (mkdir -p, 0700).  NULL when disabled or unusable
   (cannot be created, not a directory, not private: see above).  The
   first call of a process reclaims temp files of writers that are gone.
   The string lives in a per-thread buffer, valid until this thread's next
   call; the environment is re-read on every call. */
const char *cache_disk_dir(void);

/* Whether new entries can be stored in the directory now: a probe file of
   CACHE_DISK_PROBE_BYTES is written and removed, once per directory per
   process (a read-only mount, a full disk, no inodes, no permission all
   fail it).  When it fails, compiles go to memory (kernels still load from
   the directory), and Kiln says so once. */
#define CACHE_DISK_PROBE_BYTES (64 * 1024)
bool cache_disk_writable(void);

/* If a valid file for content hash h exists, dlopen's it (RTLD_NOW |
   RTLD_LOCAL, through the descriptor that was checked) and returns the handle: the caller dlsym's
   its functions and dlclose's it.  A corrupt, truncated or mismatched file (or one dlopen rejects)
   is deleted and NULL returned.  A hit touches the file (LRU). */
void *cache_disk_load(const uint64_t h[2]);

/* Stores the shared object at so_path (the caller's file; it is read, not
   moved or deleted) as the file for h: payload + trailer go to a temp file in
   the cache directory, which is fsync'd and renamed atomically to its final
   name "kernel-v<FORMAT>-<32 hex>.so".  Then enforces the size bound
   (KILN_CACHE_MAX_BYTES if set, else KILN_CACHE_MAX_MB, default 512): deletes
   the least recently used kernel files (other than this one) until the total
   is within it, and temp files left behind by killed writers (their pid is
   gone, or they are older than ten minutes).  Returns true on success.  Two processes storing the
   same h at once both succeed and leave one valid file. */
bool cache_disk_store(const uint64_t h[2], const char *so_path);

/* A scratch file in the cache directory for the compiler to write (its
   output, a source dump): "<dir>/.kernel-tmp-<pid>-<12 hex><suffix>",
   created empty (0600, O_EXCL), with the directory's descriptor kept so
   it is read back through it, never by path.  Named by the pid, so one
   left by a killed process is reclaimed.  false when the disk cache is off
   or unusable. */
typedef struct cache_disk_scratch {
  int dir_fd;
  char name[64];
  char dir[4096];  /* the directory's path, for messages */
  char path[4096]; /* for the compiler, which takes a path: anchored at the
                      checked descriptor, "/proc/<pid>/fd/<dir_fd>/<name>",
                      so a directory above the cache swapped for a link
                      cannot redirect the write (the plain path where /proc
                      cannot resolve it) */
} cache_disk_scratch;
bool cache_disk_scratch_open(cache_disk_scratch *s, const char *suffix);
/* opens it for reading: -1 unless a regular file of the user's with one link */
int cache_disk_scratch_read(const cache_disk_scratch *s);
/* stores its contents as the file for h (as cache_disk_store) */
bool cache_disk_store_scratch(const uint64_t h[2], const cache_disk_scratch *s);
/* deletes it and closes the directory */
void cache_disk_scratch_close(cache_disk_scratch *s);

/* Index records: small blobs (at most a few hundred bytes) under hash h,
   "kernel-v<FORMAT>-<32 hex>.idx", written and checked exactly as shared
   objects are (temp file + rename, trailer and checksum, O_NOFOLLOW, a
   private regular file with one link; a bad one is deleted) and evicted
   with them (LRU).  The CPU JIT maps a kernel's key to the object that
   holds it.  get: the record's length (0: none) into buf (at most cap). */
bool cache_disk_index_put(const uint64_t h[2], const void *data, size_t len);
size_t cache_disk_index_get(const uint64_t h[2], void *buf, size_t cap);

/* Blobs: opaque payloads (compiled GPU code: cubins, PTX) under hash h,
   "kernel-v<FORMAT>-<32 hex>.blob", written and checked exactly as shared
   objects are (temp file + fsync + rename, trailer and checksum,
   O_NOFOLLOW, a private regular file with one link; a bad one is deleted)
   and evicted with them (LRU).  put: false when it could not be stored
   (len 0 is refused).  get: the payload (malloc'd; the caller frees it)
   and its length, read from the very descriptor that was checked; NULL
   when there is none, it is bad or larger than CACHE_DISK_BLOB_MAX, or
   the cache is off.  A hit touches the file. */
#define CACHE_DISK_BLOB_MAX ((size_t)256 << 20)
bool cache_disk_blob_put(const uint64_t h[2], const void *data, size_t len);
void *cache_disk_blob_get(const uint64_t h[2], size_t *len);

/* "<dir>/kernel-v<FORMAT>-<h[0] as 16 hex><h[1] as 16 hex>.so", or "" when
   the cache is disabled or unusable (for tests and tools). */
void cache_disk_path(const uint64_t h[2], char *out, size_t out_len);

/* the size bound in bytes (KILN_CACHE_MAX_BYTES, else KILN_CACHE_MAX_MB MiB;
   values <= 0 mean the default) */
uint64_t cache_disk_max_bytes(void);

/* how many times a store listed the directory to bound it (tests): only
   when what this process knows of its size may have passed the bound, the
   directory changed, or a minute passed */
uint64_t cache_disk_listings(void);

#endif

/* safetensors.c — kiln_save / kiln_load (the safetensors format) and the
 * small strict JSON parser its header needs.  A file is untrusted input:
 * the header length is bounded, the JSON is parsed strictly (RFC 8259, a
 * depth limit), and every dtype, shape, size and offset is checked —
 * sizes with overflow checks, offsets inside the data, the tensors tiling
 * the data section exactly (no overlap, no gap) — before a byte of data is
 * read.  Any violation is a KILN_ERR_ARG naming the problem.
 *
 * A save is durable (DESIGN §11): it writes a temp file beside the target,
 * fsyncs it, renames it over the target and fsyncs the directory, so a
 * crash at any moment leaves the old file or the new one, whole (and the
 * next save of that path removes what a killed save left).  A load
 * never blocks on something that is not a regular file (a FIFO, a device). */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../trace/record.h"
#include "../vm/private_dir.h"
#include "../vm/state.h"
#include "op.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format's byte order)"
#endif

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */
#define ST_MAX_DEPTH 64

/* the format's dtypes Kiln reads: each into the Kiln dtype that holds
   its values, stored as is (size 0) or, where Kiln has no such dtype,
   widened from elements of `size` bytes (signed or not); the stored ones
   are those written */
static const struct {
  const char *name;
  kiln_dtype dtype;
  int size;
  bool is_signed;
} st_dtypes[] = {{"F32", KILN_F32, 0, 0}, {"F64", KILN_F64, 0, 0},   {"I32", KILN_I32, 0, 0},
                 {"I64", KILN_I64, 0, 0}, {"BOOL", KILN_BOOL, 0, 0}, {"BF16", KILN_BF16, 0, 0},
                 {"F16", KILN_F16, 0, 0}, {"U8", KILN_U8, 0, 0},     {"I8", KILN_I8, 0, 0},
                 {"I16", KILN_I16, 0, 0}, {"U16", KILN_I32, 2, 0},   {"U32", KILN_I64, 4, 0},
                 {"U64", KILN_I64, 8, 0}};
#define ST_NDTYPES (sizeof st_dtypes / sizeof *st_dtypes)

static const char *st_dtype_name(kiln_dtype dt) {
  for (size_t i = 0; i < ST_NDTYPES; i++)
    if (st_dtypes[i].dtype == dt && !st_dtypes[i].size) return st_dtypes[i].name;
  return NULL;
}

/* --- a growable byte buffer ------------------------------------------------ */

typedef struct {
  char *p;
  size_t len, cap;
  bool oom;
} st_buf;

static void buf_put(st_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void buf_str(st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_fmt_u64(st_buf *b, uint64_t v) {
  char tmp[24];
  snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  buf_str(b, tmp);
}

static void buf_json_string(st_buf *b, const char *s) {
  buf_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      char e[2] = {'\\', (char)*c};
      buf_put(b, e, 2);
    } else if (*c < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", *c);
      buf_str(b, e);
    } else {
      buf_put(b, (const char *)c, 1);
    }
  }
  buf_put(b, "\"", 1);
}

/* the length of the valid UTF-8 prefix of s[0, n) (RFC 3629: no overlong
   forms, no surrogates, nothing above U+10FFFF): JSON text is UTF-8 */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 0;
    if (!len || n - i < len) return i;
    uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_of[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return i;
    i += len;
  }
  return n;
}

/* --- saving ------------------------------------------------------------------ */

/* orders positions by their names, then by position */
static int cmp_by_name(const void *a, const void *b, void *names) {
  int x = *(const int *)a, y = *(const int *)b;
  int c = strcmp(((const char *const *)names)[x], ((const char *const *)names)[y]);
  return c ? c : (x > y) - (x < y);
}

/* the first pair of equal names (by the later one's position) in *first <
   *second, or -1s; in n log n (a header may name a million tensors).
   false: out of memory (the error set) */
static bool first_duplicate(const char *const *names, int n, int *first, int *second) {
  *first = *second = -1;
  if (n < 2) return true;
  int *order = malloc((size_t)n * sizeof *order);
  if (!order) return vm_error(KILN_ERR_OOM, "out of memory"), false;
  for (int i = 0; i < n; i++) order[i] = i;
  qsort_r(order, (size_t)n, sizeof *order, cmp_by_name, (void *)names);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[order[i - 1]], names[order[i]]) && (*second < 0 || order[i] < *second)) {
      *first = order[i - 1];
      *second = order[i];
    }
  free(order);
  return true;
}

static bool check_save_args(int n, const char *const *names, vm_tensor *const *ts) {
  if (n < 0 || (n > 0 && (!names || !ts))) {
    vm_error(KILN_ERR_ARG, "bad arguments: n %d with names %p and tensors %p", n, (void *)names,
             (void *)ts);
    return false;
  }
  for (int i = 0; i < n; i++) {
    if (!ts[i]) {
      vm_error(KILN_ERR_ARG, "tensor %d is NULL", i);
      return false;
    }
    if (!names[i] || !names[i][0] || !strcmp(names[i], "__metadata__")) {
      vm_error(KILN_ERR_ARG, "name %d is %s", i,
               !names[i]      ? "NULL"
               : !names[i][0] ? "empty"
                              : "the reserved \"__metadata__\"");
      return false;
    }
    size_t len = strlen(names[i]);
    if (utf8_valid_prefix((const unsigned char *)names[i], len) != len) {
      vm_error(KILN_ERR_ARG, "name %d is not valid UTF-8 (byte %zu)", i,
               utf8_valid_prefix((const unsigned char *)names[i], len));
      return false;
    }
  }
  int first, second;
  if (!first_duplicate(names, n, &first, &second)) return false;
  if (first >= 0) {
    vm_error(KILN_ERR_ARG, "name \"%s\" is given twice (tensors %d and %d)", names[first], first,
             second);
    return false;
  }
  return true;
}

/* fsyncs the directory that holds path, so a rename in it is durable */
static bool sync_dir_of(const char *path) {
  char *copy = strdup(path);
  if (!copy) return false;
  int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(copy);
  if (fd < 0) return false;
  bool ok = fsync(fd) == 0 || errno == EINVAL; /* some filesystems cannot sync a directory */
  close(fd);
  return ok;
}

/* Removes the temp files that saves of path by processes now dead left
   ("<base>.tmp-<pid>-<n>" beside it, a whole checkpoint each); a live
   process's (another save in flight, or a reused pid) is left alone. */
static void reclaim_dead_temps(const char *path) {
  char *dcopy = strdup(path), *bcopy = strdup(path);
  DIR *dir = dcopy && bcopy ? opendir(dirname(dcopy)) : NULL;
  const char *base = bcopy ? basename(bcopy) : "";
  size_t blen = strlen(base);
  for (struct dirent *e; dir && (e = readdir(dir));) {
    if (strncmp(e->d_name, base, blen) || strncmp(e->d_name + blen, ".tmp-", 5)) continue;
    char *end;
    long pid = strtol(e->d_name + blen + 5, &end, 10);
    if (pid <= 0 || *end != '-' || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) (void)unlinkat(dirfd(dir), e->d_name, 0);
  }
  if (dir) closedir(dir);
  free(dcopy);
  free(bcopy);
}

/* the 8-byte length, the header and the data into `path`: through a temp
   file in the same directory (`path.tmp-<pid>-<n>`, created exclusively,
   never through a link), fsync'd, renamed over path, the directory fsync'd.
   Until the rename the old file is untouched; a failure removes the temp. */
static int write_durably(const char *path, const st_buf *h, int n, vm_tensor *const *vals) {
  static atomic_uint serial;
  size_t tlen = strlen(path) + 48;
  char *tmp = malloc(tlen);
  if (!tmp) return vm_error(KILN_ERR_OOM, "out of memory");
  snprintf(tmp, tlen, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) {
    int rc =
        vm_error(KILN_ERR_ARG, "cannot create '%s' to save '%s': %s", tmp, path, strerror(errno));
    free(tmp);
    return rc;
  }
  unsigned char len[8];
  for (int k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)h->len >> (8 * k));
  bool ok = vm_write_full(fd, len, 8) && vm_write_full(fd, h->p, h->len);
  for (int i = 0; ok && i < n; i++)
    ok =
        vm_write_full(fd, vm_data(vals[i]), (size_t)vals[i]->numel * vm_dtype_size(vals[i]->dtype));
  const char *step = "writing";
  if (ok && fsync(fd) != 0) ok = false, step = "syncing";
  if (close(fd) != 0 && ok) ok = false, step = "closing";
  if (ok && rename(tmp, path) != 0) ok = false, step = "renaming over";
  int err = errno;
  if (!ok) {
    unlink(tmp);
    int rc = vm_error(KILN_ERR_ARG, "%s '%s' failed: %s (the previous file, if any, is unchanged)",
                      step, path, strerror(err));
    free(tmp);
    return rc;
  }
  free(tmp);
  reclaim_dead_temps(path);
  if (!sync_dir_of(path))
    return vm_error(KILN_ERR_ARG, "saved '%s', but syncing its directory failed: %s", path,
                    strerror(errno));
  return KILN_OK;
}

int fe_save(const char *path, int n, const char *const *names, vm_tensor *const *ts) {
  if (!path) return vm_error(KILN_ERR_ARG, "path is NULL");
  if (!check_save_args(n, names, ts)) return KILN_ERR_ARG;
  vm_tensor **vals = calloc((size_t)(n ? n : 1), sizeof *vals);
  st_buf h = {0};
  int rc = KILN_OK;
  if (!vals) return vm_error(KILN_ERR_OOM, "out of memory");
  uint64_t offset = 0;
  buf_str(&h, "{");
  for (int i = 0; i < n && rc == KILN_OK; i++) {
    vm_tensor *v = tr_value(ts[i]);
    vals[i] = v ? vm_value_host_contiguous(v) : NULL;
    if (!vals[i]) {
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
      break;
    }
    uint64_t bytes = (uint64_t)vals[i]->numel * vm_dtype_size(vals[i]->dtype);
    buf_json_string(&h, names[i]);
    buf_str(&h, ":{\"dtype\":\"");
    buf_str(&h, st_dtype_name(vals[i]->dtype));
    buf_str(&h, "\",\"shape\":[");
    for (int d = 0; d < vals[i]->ndim; d++) {
      if (d) buf_str(&h, ",");
      buf_fmt_u64(&h, (uint64_t)vals[i]->shape[d]);
    }
    buf_str(&h, "],\"data_offsets\":[");
    buf_fmt_u64(&h, offset);
    buf_str(&h, ",");
    offset += bytes;
    buf_fmt_u64(&h, offset);
    buf_str(&h, "]}");
    if (i + 1 < n) buf_str(&h, ",");
  }
  buf_str(&h, "}");
  while (!h.oom && h.len % 8) buf_str(&h, " "); /* data starts 8-byte aligned */
  if (rc == KILN_OK && h.oom) rc = vm_error(KILN_ERR_OOM, "out of memory");
  if (rc == KILN_OK) rc = write_durably(path, &h, n, vals);
  for (int i = 0; i < n; i++) vm_release(vals[i]);
  free(vals);
  free(h.p);
  return rc;
}

/* --- a strict JSON parser (a small DOM) ---------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } j_type;

typedef struct j_val {
  j_type type;
  char *str;    /* J_STR: decoded, NUL-terminated (no NULs inside) */
  bool uint_ok; /* J_NUM: a non-negative integer that fits in u64 */
  uint64_t u;
  int n; /* J_ARR, J_OBJ: children */
  struct j_val *items;
  char **keys; /* J_OBJ */
} j_val;

/* each: when set, the top-level object's members go to it one at a time
   (it takes the key; the value is freed after), so a header naming a
   million tensors never holds a million parsed descriptions at once */
typedef bool (*j_member_fn)(void *ctx, char *key, const struct j_val *v);

typedef struct {
  const char *s;
  size_t len, pos;
  const char *err;
  j_member_fn each;
  void *each_ctx;
  bool each_failed; /* each said no (and set the error); members after it are only parsed */
} j_parser;

static void j_free(j_val *v) {
  free(v->str);
  for (int i = 0; i < v->n; i++) {
    j_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  memset(v, 0, sizeof *v);
}

static bool j_fail(j_parser *p, const char *why) {
  if (!p->err) p->err = why;
  return false;
}

static void j_ws(j_parser *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r'))
    p->pos++;
}

static int j_hex4(j_parser *p) {
  if (p->len - p->pos < 4) return -1;
  int v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p->s[p->pos++];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static void j_utf8(st_buf *b, uint32_t cp) {
  char o[4];
  size_t n;
  if (cp < 0x80)
    o[0] = (char)cp, n = 1;
  else if (cp < 0x800)
    o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), n = 2;
  else if (cp < 0x10000)
    o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63)),
    o[2] = (char)(0x80 | (cp & 63)), n = 3;
  else
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63)),
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63)), n = 4;
  buf_put(b, o, n);
}

/* at the opening quote; the decoded string into *out (malloc'd) */
static bool j_string(j_parser *p, char **out) {
  st_buf b = {0};
  buf_put(&b, "", 0);
  p->pos++;
  for (;;) {
    if (p->pos >= p->len) {
      free(b.p);
      return j_fail(p, "unterminated string");
    }
    unsigned char c = (unsigned char)p->s[p->pos++];
    if (c == '"') break;
    if (c < 0x20) {
      free(b.p);
      return j_fail(p, "control character in a string");
    }
    if (c != '\\') {
      buf_put(&b, (const char *)&c, 1);
      continue;
    }
    if (p->pos >= p->len) break;
    char e = p->s[p->pos++];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      buf_put(&b, &map[simple - "\"\\/bfnrt"], 1);
      continue;
    }
    int cp = e == 'u' ? j_hex4(p) : -1;
    if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
      int lo = p->len - p->pos >= 2 && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u'
                   ? (p->pos += 2, j_hex4(p))
                   : -1;
      cp = lo >= 0xDC00 && lo < 0xE000 ? 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00) : -1;
    } else if (cp >= 0xDC00 && cp < 0xE000) {
      cp = -1;
    }
    if (cp <= 0) { /* \u0000 would truncate a C string: refused too */
      free(b.p);
      return j_fail(p, "bad escape in a string");
    }
    j_utf8(&b, (uint32_t)cp);
  }
  if (b.oom) {
    free(b.p);
    return j_fail(p, "out of memory");
  }
  *out = b.p;
  return true;
}

static bool j_number(j_parser *p, j_val *v) {
  size_t start = p->pos;
  bool neg = false, integral = true, overflow = false;
  uint64_t u = 0;
  if (p->s[p->pos] == '-') neg = true, p->pos++;
  if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return j_fail(p, "bad number");
  if (p->s[p->pos] == '0') {
    p->pos++;
  } else {
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
      uint64_t d = (uint64_t)(p->s[p->pos++] - '0');
      if (u > (UINT64_MAX - d) / 10)
        overflow = true;
      else
        u = u * 10 + d;
    }
  }
  if (p->pos < p->len && p->s[p->pos] == '.') {
    integral = false;
    p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
      return j_fail(p, "bad number");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    integral = false;
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
      return j_fail(p, "bad number");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  }
  (void)start;
  v->type = J_NUM;
  v->uint_ok = integral && !neg && !overflow;
  v->u = u;
  return true;
}

static bool j_value(j_parser *p, j_val *v, int depth);

/* objects and arrays: children appended one by one */
static bool j_push(j_parser *p, j_val *v, char *key, int *cap) {
  if (v->n == *cap) {
    int nc = *cap ? *cap * 2 : 4;
    j_val *items = realloc(v->items, (size_t)nc * sizeof *items);
    if (items) v->items = items;
    char **keys = v->type == J_OBJ ? realloc(v->keys, (size_t)nc * sizeof *keys) : NULL;
    if (keys) v->keys = keys;
    if (!items || (v->type == J_OBJ && !keys)) {
      free(key);
      return j_fail(p, "out of memory");
    }
    *cap = nc;
  }
  memset(&v->items[v->n], 0, sizeof *v->items);
  if (v->type == J_OBJ) v->keys[v->n] = key;
  v->n++;
  return true;
}

static bool j_container(j_parser *p, j_val *v, int depth) {
  bool obj = p->s[p->pos] == '{';
  char close = obj ? '}' : ']';
  v->type = obj ? J_OBJ : J_ARR;
  int cap = 0;
  p->pos++;
  j_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    return true;
  }
  for (;;) {
    char *key = NULL;
    if (obj) {
      j_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != '"') return j_fail(p, "expected a string key");
      if (!j_string(p, &key)) return false;
      j_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        free(key);
        return j_fail(p, "expected ':'");
      }
      p->pos++;
    }
    if (obj && depth == 0 && p->each) { /* streamed: nothing kept in v */
      j_val member = {0};
      bool ok = j_value(p, &member, depth + 1);
      /* after each's first no, the rest is only checked as JSON: a syntax
         error anywhere is still what the caller hears */
      if (ok && !p->each_failed)
        p->each_failed = !p->each(p->each_ctx, key, &member);
      else
        free(key);
      j_free(&member);
      if (!ok) return false;
    } else if (!j_push(p, v, key, &cap) || !j_value(p, &v->items[v->n - 1], depth + 1)) {
      return false;
    }
    j_ws(p);
    if (p->pos >= p->len) return j_fail(p, "unterminated object or array");
    char c = p->s[p->pos++];
    if (c == close) return true;
    if (c != ',') return j_fail(p, "expected ',' or a closing bracket");
  }
}

static bool j_literal(j_parser *p, const char *word, j_val *v, j_type t) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n))
    return j_fail(p, "unexpected character");
  p->pos += n;
  v->type = t;
  return true;
}

static bool j_value(j_parser *p, j_val *v, int depth) {
  if (depth > ST_MAX_DEPTH) return j_fail(p, "nesting too deep");
  j_ws(p);
  if (p->pos >= p->len) return j_fail(p, "unexpected end");
  char c = p->s[p->pos];
  if (c == '{' || c == '[') return j_container(p, v, depth);
  if (c == '"') {
    v->type = J_STR;
    return j_string(p, &v->str);
  }
  if (c == '-' || (c >= '0' && c <= '9')) return j_number(p, v);
  if (c == 't') return j_literal(p, "true", v, J_BOOL);
  if (c == 'f') return j_literal(p, "false", v, J_BOOL);
  if (c == 'n') return j_literal(p, "null", v, J_NULL);
  return j_fail(p, "unexpected character");
}

static bool j_parse(const char *s, size_t len, j_val *out, j_member_fn each, void *each_ctx) {
  j_parser p = {s, len, 0, NULL, each, each_ctx, false};
  memset(out, 0, sizeof *out);
  bool ok = j_value(&p, out, 0);
  if (ok) {
    j_ws(&p);
    if (p.pos != len) ok = j_fail(&p, "trailing characters after the header object");
  }
  if (!ok) vm_error(KILN_ERR_ARG, "the header is not valid JSON: %s at byte %zu", p.err, p.pos);
  if (!ok || p.each_failed) j_free(out); /* each's no: its error stands */
  return ok && !p.each_failed;
}

/* --- loading --------------------------------------------------------------------- */

typedef struct {
  const char *name; /* borrowed from the header's names */
  kiln_dtype dtype;
  int file_size; /* bytes of a stored element when widened into dtype; 0: dtype's own */
  bool file_signed;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  uint64_t begin, end;
} st_entry;

static const j_val *j_get(const j_val *obj, const char *key) {
  for (int i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

static bool bad_entry(const char *name, const char *what) {
  vm_error(KILN_ERR_ARG, "tensor \"%s\": %s", name, what);
  return false;
}

/* one tensor's description: known keys only, each of the right type */
static bool parse_entry(const char *name, const j_val *v, uint64_t data_size, st_entry *e) {
  memset(e, 0, sizeof *e);
  e->name = name;
  if (v->type != J_OBJ) return bad_entry(name, "its description is not an object");
  for (int i = 0; i < v->n; i++)
    if (strcmp(v->keys[i], "dtype") && strcmp(v->keys[i], "shape") &&
        strcmp(v->keys[i], "data_offsets")) {
      vm_error(KILN_ERR_ARG, "tensor \"%s\": unknown key \"%s\"", name, v->keys[i]);
      return false;
    }
  const j_val *dt = j_get(v, "dtype"), *sh = j_get(v, "shape"), *off = j_get(v, "data_offsets");
  if (!dt || !sh || !off) return bad_entry(name, "dtype, shape and data_offsets are required");
  if (dt->type != J_STR) return bad_entry(name, "dtype is not a string");
  size_t k = 0;
  while (k < ST_NDTYPES && strcmp(dt->str, st_dtypes[k].name)) k++;
  if (k == ST_NDTYPES) {
    vm_error(KILN_ERR_ARG,
             "tensor \"%s\": unsupported dtype \"%s\" (Kiln reads F64, F32, BF16, F16, I64, I32, "
             "I16, I8, U64, U32, U16, U8, BOOL)",
             name, dt->str);
    return false;
  }
  e->dtype = st_dtypes[k].dtype;
  e->file_size = st_dtypes[k].size;
  e->file_signed = st_dtypes[k].is_signed;
  if (sh->type != J_ARR || sh->n > KILN_MAX_DIMS)
    return bad_entry(name, "shape is not an array of at most 8 sizes");
  e->ndim = sh->n;
  for (int d = 0; d < sh->n; d++) {
    const j_val *x = &sh->items[d];
    if (x->type != J_NUM || !x->uint_ok || x->u > (uint64_t)INT64_MAX)
      return bad_entry(name, "a shape entry is not a non-negative integer");
    e->shape[d] = (int64_t)x->u;
  }
  int64_t count; /* the rule every tensor obeys, so what counts also loads */
  if (!vm_shape_numel(e->ndim, e->shape, &count))
    return bad_entry(name, "its shape is too large (its nonzero sizes multiply past 2^60)");
  uint64_t numel = (uint64_t)count;
  uint64_t bytes;
  uint64_t esize = e->file_size ? (uint64_t)e->file_size : (uint64_t)vm_dtype_size(e->dtype);
  if (__builtin_mul_overflow(numel, esize, &bytes) || numel > (uint64_t)INT64_MAX)
    return bad_entry(name, "its byte size overflows");
  if (off->type != J_ARR || off->n != 2 || off->items[0].type != J_NUM ||
      off->items[1].type != J_NUM || !off->items[0].uint_ok || !off->items[1].uint_ok)
    return bad_entry(name, "data_offsets is not a pair of non-negative integers");
  e->begin = off->items[0].u;
  e->end = off->items[1].u;
  if (e->begin > e->end || e->end > data_size) {
    vm_error(KILN_ERR_ARG,
             "tensor \"%s\": data_offsets [%llu, %llu] are outside the %llu-byte "
             "data section",
             name, (unsigned long long)e->begin, (unsigned long long)e->end,
             (unsigned long long)data_size);
    return false;
  }
  if (e->end - e->begin != bytes) {
    vm_error(KILN_ERR_ARG,
             "tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes, but a %s "
             "tensor of %llu elements needs %llu",
             name, (unsigned long long)e->begin, (unsigned long long)e->end,
             (unsigned long long)(e->end - e->begin), dt->str, (unsigned long long)numel,
             (unsigned long long)bytes);
    return false;
  }
  return true;
}

static int cmp_entry(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* the tensors tile [0, data_size) exactly: no overlap, no gap */
static bool check_tiling(st_entry *e, int n, uint64_t data_size) {
  st_entry **order = malloc((size_t)(n ? n : 1) * sizeof *order);
  if (!order) return vm_error(KILN_ERR_OOM, "out of memory"), false;
  for (int i = 0; i < n; i++) order[i] = &e[i];
  qsort(order, (size_t)n, sizeof *order, cmp_entry);
  uint64_t at = 0;
  bool ok = true;
  for (int i = 0; ok && i < n; i++) {
    if (order[i]->begin != at) {
      vm_error(KILN_ERR_ARG,
               "tensor \"%s\" starts at byte %llu of the data, where %llu was "
               "expected (%s)",
               order[i]->name, (unsigned long long)order[i]->begin, (unsigned long long)at,
               order[i]->begin < at ? "overlapping ranges" : "a gap");
      ok = false;
    }
    at = order[i]->end;
  }
  if (ok && at != data_size) {
    vm_error(KILN_ERR_ARG, "the tensors cover %llu bytes of a %llu-byte data section",
             (unsigned long long)at, (unsigned long long)data_size);
    ok = false;
  }
  free(order);
  return ok;
}

/* a parsed header: every name (owned; __metadata__ too, for the duplicate
   check) and the tensors' entries (naming into names) */
typedef struct {
  char **names;
  int nnames, cap;
  st_entry *e;
  int n;
  uint64_t data_size;
} st_header;

static void st_header_free(st_header *h) {
  for (int i = 0; i < h->nnames; i++) free(h->names[i]);
  free(h->names);
  free(h->e);
  memset(h, 0, sizeof *h);
}

/* j_member_fn: one member of the header object, checked into h */
static bool take_member(void *ctx, char *key, const j_val *v) {
  st_header *h = ctx;
  if (h->nnames == h->cap) {
    int nc = h->cap ? 2 * h->cap : 16;
    char **names = realloc(h->names, (size_t)nc * sizeof *names);
    if (names) h->names = names;
    st_entry *e = names ? realloc(h->e, (size_t)nc * sizeof *e) : NULL;
    if (e) h->e = e;
    if (!names || !e) {
      free(key);
      return vm_error(KILN_ERR_OOM, "out of memory for the header's names"), false;
    }
    h->cap = nc;
  }
  h->names[h->nnames++] = key;
  if (!strcmp(key, "__metadata__")) { /* string to string, else ignored */
    bool strings = v->type == J_OBJ;
    for (int k = 0; strings && k < v->n; k++) strings = v->items[k].type == J_STR;
    return strings || (vm_error(KILN_ERR_ARG, "__metadata__ is not an object of strings"), false);
  }
  if (!parse_entry(key, v, h->data_size, &h->e[h->n])) return false;
  h->n++;
  return true;
}

/* parses and validates the header into h; *hlen_out: its length */
static int read_header(FILE *f, const char *path, uint64_t *hlen_out, st_header *h) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
    return vm_error(KILN_ERR_ARG, "'%s' is not a regular file", path);
  uint64_t size = (uint64_t)st.st_size;
  unsigned char len[8];
  if (size < 8 || fread(len, 1, 8, f) != 8)
    return vm_error(KILN_ERR_ARG, "'%s' (%llu bytes) is too short for the 8-byte header length",
                    path, (unsigned long long)size);
  uint64_t hlen = 0;
  for (int k = 7; k >= 0; k--) hlen = hlen << 8 | len[k];
  if (hlen > ST_MAX_HEADER)
    return vm_error(KILN_ERR_ARG, "header length %llu exceeds the limit of %u bytes",
                    (unsigned long long)hlen, ST_MAX_HEADER);
  if (hlen < 2 || hlen > size - 8)
    return vm_error(KILN_ERR_ARG, "header length %llu does not fit the %llu-byte file '%s'",
                    (unsigned long long)hlen, (unsigned long long)size, path);
  char *text = malloc((size_t)hlen);
  if (!text)
    return vm_error(KILN_ERR_OOM, "out of memory for a %llu-byte header", (unsigned long long)hlen);
  if (fread(text, 1, (size_t)hlen, f) != hlen) {
    free(text);
    return vm_error(KILN_ERR_ARG, "'%s' is truncated inside its header", path);
  }
  size_t valid = utf8_valid_prefix((const unsigned char *)text, (size_t)hlen);
  if (valid != hlen) {
    free(text);
    return vm_error(KILN_ERR_ARG, "the header is not valid UTF-8 (byte %zu)", valid);
  }
  *hlen_out = hlen;
  h->data_size = size - 8 - hlen;
  j_val top = {0}; /* the object's members stream to take_member */
  bool ok = j_parse(text, (size_t)hlen, &top, take_member, h);
  free(text);
  j_type type = top.type;
  j_free(&top);
  if (!ok) return vm_thread()->status ? vm_thread()->status : KILN_ERR_ARG;
  if (type != J_OBJ) return vm_error(KILN_ERR_ARG, "the header is not a JSON object");
  int first, second;
  if (!first_duplicate((const char *const *)h->names, h->nnames, &first, &second))
    return KILN_ERR_OOM;
  if (first >= 0)
    return vm_error(KILN_ERR_ARG, "the name \"%s\" appears twice in the header", h->names[first]);
  return check_tiling(h->e, h->n, h->data_size) ? KILN_OK : KILN_ERR_ARG;
}

/* the stored integers at raw (e->file_size bytes each, little-endian)
   into t's i32/i64 elements; false for a U64 value past int64's range */
static bool widen_ints(const st_entry *e, const unsigned char *raw, vm_tensor *t) {
  for (int64_t i = 0; i < t->numel; i++) {
    uint64_t u = 0;
    memcpy(&u, raw + i * e->file_size, (size_t)e->file_size);
    int64_t v = (int64_t)u;
    if (e->file_signed) { /* sign-extend */
      int shift = 64 - 8 * e->file_size;
      v = (int64_t)(u << shift) >> shift;
    } else if (u > (uint64_t)INT64_MAX) {
      vm_error(KILN_ERR_DTYPE,
               "tensor \"%s\": U64 value %llu (element %lld) does not fit int64, the widest "
               "integer dtype Kiln has",
               e->name, (unsigned long long)u, (long long)i);
      return false;
    }
    if (t->dtype == KILN_I32)
      ((int32_t *)vm_data(t))[i] = (int32_t)v;
    else
      ((int64_t *)vm_data(t))[i] = v;
  }
  return true;
}

static vm_tensor *read_tensor(FILE *f, const char *path, uint64_t data_start, const st_entry *e) {
  vm_tensor *t = vm_tensor_new(e->dtype, e->ndim, e->shape);
  if (!t) return NULL;
  size_t bytes = (size_t)(e->end - e->begin);
  void *raw = e->file_size ? malloc(bytes ? bytes : 1) : vm_data(t);
  if (!raw) {
    vm_release(t);
    vm_error(KILN_ERR_OOM, "out of memory reading tensor \"%s\"", e->name);
    return NULL;
  }
  if (bytes && (fseeko(f, (off_t)(data_start + e->begin), SEEK_SET) != 0 ||
                fread(raw, 1, bytes, f) != bytes)) {
    vm_error(KILN_ERR_ARG, "reading tensor \"%s\" from '%s' failed (truncated?)", e->name, path);
    if (e->file_size) free(raw);
    vm_release(t);
    return NULL;
  }
  if (e->file_size) {
    bool ok = widen_ints(e, raw, t);
    free(raw);
    if (!ok) {
      vm_release(t);
      return NULL;
    }
  }
  if (e->dtype == KILN_BOOL) { /* bool bytes become 0/1 (DESIGN §11) */
    unsigned char *p = vm_data(t);
    for (size_t i = 0; i < bytes; i++) p[i] = p[i] != 0;
  }
  kiln_device d;
  if (!vm_default_device(&d)) {
    vm_release(t);
    return NULL;
  }
  return fe_handle_from_host(t, d);
}

/* path opened for reading if it is a regular file: O_NONBLOCK so a FIFO
   or a device answers at once instead of blocking the open, and the type
   checked on the descriptor opened (a link to a regular file is fine: the
   Hugging Face cache keeps checkpoints as links into its blobs) */
static FILE *open_regular(const char *path) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    vm_error(KILN_ERR_ARG, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    vm_error(KILN_ERR_ARG, "'%s' is not a regular file", path);
    return NULL;
  }
  FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 ? NULL : fdopen(fd, "rb");
  if (!f) {
    vm_error(KILN_ERR_ARG, "cannot open '%s': %s", path, strerror(errno));
    close(fd);
  }
  return f;
}

int fe_load(const char *path, int cap, char **names, vm_tensor **ts) {
  if (!path) return vm_error(KILN_ERR_ARG, "path is NULL");
  bool count_only = cap == 0 && !names && !ts;
  if (cap < 0 || (!count_only && (!names || !ts)))
    return vm_error(KILN_ERR_ARG, "bad arguments: cap %d with names %p and tensors %p", cap,
                    (void *)names, (void *)ts);
  FILE *f = open_regular(path);
  if (!f) return KILN_ERR_ARG;
  st_header h = {0};
  uint64_t hlen = 0;
  int rc = read_header(f, path, &hlen, &h);
  st_entry *e = h.e;
  int n = h.n;
  if (rc == KILN_OK && !count_only && n > cap)
    rc = vm_error(KILN_ERR_ARG, "'%s' holds %d tensors, more than cap %d", path, n, cap);
  int done = 0;
  for (; rc == KILN_OK && !count_only && done < n; done++) {
    names[done] = strdup(e[done].name);
    ts[done] = names[done] ? read_tensor(f, path, 8 + hlen, &e[done]) : NULL;
    if (!names[done] && vm_thread()->status == KILN_OK) vm_error(KILN_ERR_OOM, "out of memory");
    if (!ts[done]) {
      rc = vm_thread()->status ? vm_thread()->status : KILN_ERR_INTERNAL;
      free(names[done]);
      names[done] = NULL;
      break;
    }
  }
  if (rc != KILN_OK)
    for (int i = 0; i < done; i++) {
      free(names[i]);
      vm_release(ts[i]);
      names[i] = NULL;
      ts[i] = NULL;
    }
  fclose(f);
  st_header_free(&h);
  return rc == KILN_OK ? n : rc;
}

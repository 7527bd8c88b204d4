/* test_gpu_alloc.c — the caching device allocator (jit_gpu/alloc.c) over a
 * fake raw allocator (malloc-backed, with a memory limit to simulate
 * out-of-memory): size classes, stream-ordered reuse, the sync-point rule
 * across streams, free-the-cache-and-retry on OOM, stats and trim.  Then
 * the CUDA runtime (jit_gpu/cuda.c) as this machine has it: without a GPU,
 * every entry point is a clear KILN_ERR_DEVICE naming why; with one, a
 * round trip through device memory and the staging buffers. */
#include <stdint.h>

#include "../cache/disk.h"
#include "../jit_gpu/alloc.h"
#include "../jit_gpu/blas.h"
#include "../jit_gpu/cuda.h"
#include "../vm/state.h"
#include "ktest.h"

/* ---- the fake raw allocator ---- */

#define FAKE_MAX 64

typedef struct fake_raw {
  size_t limit; /* bytes the "device" has */
  size_t used;
  int allocs, frees, syncs;
  bool fail_hard; /* raw_alloc reports a non-OOM error */
  void *addr[FAKE_MAX];
  size_t size[FAKE_MAX];
} fake_raw;

static int fake_alloc(void *ctx, size_t bytes, void **addr) {
  fake_raw *f = ctx;
  if (f->fail_hard) {
    kiln_clear_error();
    vm_error(KILN_ERR_DEVICE, "fake raw allocator: broken");
    return GPU_RAW_ERROR;
  }
  if (f->used + bytes > f->limit) return GPU_RAW_OOM;
  for (int i = 0; i < FAKE_MAX; i++) {
    if (f->addr[i]) continue;
    f->addr[i] = malloc(bytes);
    if (!f->addr[i]) return GPU_RAW_OOM;
    f->size[i] = bytes;
    f->used += bytes;
    f->allocs++;
    *addr = f->addr[i];
    return GPU_RAW_OK;
  }
  return GPU_RAW_OOM;
}

static void fake_free(void *ctx, void *addr) {
  fake_raw *f = ctx;
  for (int i = 0; i < FAKE_MAX; i++) {
    if (f->addr[i] != addr) continue;
    free(addr);
    f->addr[i] = NULL;
    f->used -= f->size[i];
    f->frees++;
    return;
  }
  KTEST_FAIL("raw_free of an address the fake never gave out");
}

static bool fake_sync(void *ctx) {
  ((fake_raw *)ctx)->syncs++;
  return true;
}

static gpu_alloc *fake_new(fake_raw *f, size_t limit) {
  memset(f, 0, sizeof *f);
  f->limit = limit;
  gpu_raw_ops ops = {f, fake_alloc, fake_free, fake_sync};
  return gpu_alloc_new(&ops);
}

static void fake_done(gpu_alloc *a, fake_raw *f) {
  gpu_alloc_destroy(a);
  CHECK_EQ_INT(f->used, 0);
  CHECK_EQ_INT(f->allocs, f->frees);
}

enum { S1 = 0x1001, S2 = 0x2002, S3 = 0x3003 };

/* ---- size classes ---- */

TEST(size_classes_round_up_to_eight_steps_per_power_of_two) {
  CHECK_EQ_INT(gpu_alloc_class_size(0), 512);
  CHECK_EQ_INT(gpu_alloc_class_size(1), 512);
  CHECK_EQ_INT(gpu_alloc_class_size(512), 512);
  CHECK_EQ_INT(gpu_alloc_class_size(513), 576);
  CHECK_EQ_INT(gpu_alloc_class_size(1000), 1024);
  CHECK_EQ_INT(gpu_alloc_class_size(1024), 1024);
  CHECK_EQ_INT(gpu_alloc_class_size(1025), 1152);
  CHECK_EQ_INT(gpu_alloc_class_size(3 << 20), 3 << 20);
  CHECK_EQ_INT(gpu_alloc_class_size((1 << 20) + 1), (1 << 20) + (1 << 17));
  CHECK_EQ_INT(gpu_alloc_class_size(GPU_ALLOC_MAX_BYTES), GPU_ALLOC_MAX_BYTES);
  CHECK_EQ_INT(gpu_alloc_class_size(GPU_ALLOC_MAX_BYTES + 1), 0);
  CHECK_EQ_INT(gpu_alloc_class_size(SIZE_MAX), 0);
  /* every size: the class holds it, wastes at most 1/8, and is a class of itself */
  for (size_t n = 1; n < (1u << 16); n += 7) {
    size_t c = gpu_alloc_class_size(n);
    if (c < n || (n > 512 && (double)c > n * 1.125) || gpu_alloc_class_size(c) != c) {
      KTEST_FAIL("class of %zu is %zu", n, c);
      break;
    }
  }
}

TEST(a_too_large_request_fails_with_oom_naming_the_size) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p = (void *)1;
  kiln_clear_error();
  CHECK(!gpu_alloc_get(a, SIZE_MAX, S1, &p));
  CHECK(p == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_OOM);
  CHECK_STR_CONTAINS(kiln_last_error(), "out of GPU memory allocating 18446744073709551615 bytes");
  CHECK_EQ_INT(f.allocs, 0);
  fake_done(a, &f);
}

/* ---- reuse ---- */

TEST(a_freed_block_is_reused_by_the_same_stream_at_once) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 1000, S1, &p));
  CHECK_EQ_INT(f.allocs, 1);
  CHECK_EQ_INT(f.size[0], 1024); /* the class size went to the raw allocator */
  gpu_alloc_put(a, p, S1);
  CHECK(gpu_alloc_get(a, 1020, S1, &q)); /* same class */
  CHECK(q == p);
  CHECK_EQ_INT(f.allocs, 1);
  CHECK(gpu_alloc_get(a, 2000, S1, &r)); /* another class: a new block */
  CHECK(r != p);
  CHECK_EQ_INT(f.allocs, 2);
  gpu_alloc_stats s;
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.hits, 1);
  CHECK_EQ_INT(s.raw_allocs, 2);
  gpu_alloc_put(a, q, S1);
  gpu_alloc_put(a, r, S1);
  fake_done(a, &f);
}

TEST(the_newest_freed_block_of_a_class_is_taken_first) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 4096, S1, &p));
  CHECK(gpu_alloc_get(a, 4096, S1, &q));
  gpu_alloc_put(a, p, S1);
  gpu_alloc_put(a, q, S1);
  CHECK(gpu_alloc_get(a, 4096, S1, &r));
  CHECK(r == q);
  gpu_alloc_put(a, r, S1);
  fake_done(a, &f);
}

TEST(another_stream_waits_for_a_sync_point_after_the_free) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r, *s2;
  CHECK(gpu_alloc_get(a, 8192, S1, &p));
  uint64_t early = gpu_alloc_stamp(a); /* taken before the free: proves nothing */
  gpu_alloc_put(a, p, S1);
  CHECK(gpu_alloc_get(a, 8192, S2, &q));
  CHECK(q != p); /* S1's work on p may still run */
  gpu_alloc_synced(a, S1, early);
  CHECK(gpu_alloc_get(a, 8192, S2, &r));
  CHECK(r != p && r != q);
  uint64_t late = gpu_alloc_stamp(a); /* S1 waited after the free */
  gpu_alloc_synced(a, S1, late);
  CHECK(gpu_alloc_get(a, 8192, S2, &s2));
  CHECK(s2 == p);
  CHECK_EQ_INT(f.allocs, 3);
  gpu_alloc_put(a, q, S2);
  gpu_alloc_put(a, r, S2);
  gpu_alloc_put(a, s2, S2);
  fake_done(a, &f);
}

TEST(a_block_freed_by_another_stream_waits_for_both) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 600, S1, &p)); /* S1 writes it ... */
  gpu_alloc_put(a, p, S2);              /* ... S2's thread drops it */
  CHECK(gpu_alloc_get(a, 600, S2, &q)); /* S1's work may still run */
  CHECK(q != p);
  CHECK(gpu_alloc_get(a, 600, S1, &r)); /* S2 (the freer) may still read it */
  CHECK(r != p);
  gpu_alloc_synced(a, S2, gpu_alloc_stamp(a));
  gpu_alloc_put(a, r, S1);
  void *t;
  CHECK(gpu_alloc_get(a, 600, S1, &t)); /* r is S1's own: newest and free at once */
  CHECK(t == r);
  void *u;
  CHECK(gpu_alloc_get(a, 600, S1, &u)); /* p: S2 has synced, S1 is the taker */
  CHECK(u == p);
  gpu_alloc_put(a, q, S2);
  gpu_alloc_put(a, t, S1);
  gpu_alloc_put(a, u, S1);
  fake_done(a, &f);
}

TEST(a_recorded_use_holds_the_block_for_that_stream) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 700, S1, &p));
  gpu_alloc_record_use(a, p, S3); /* S3 reads it */
  gpu_alloc_put(a, p, S1);
  CHECK(gpu_alloc_get(a, 700, S1, &q)); /* S3's read may still be running */
  CHECK(q != p);
  gpu_alloc_synced(a, S3, gpu_alloc_stamp(a));
  CHECK(gpu_alloc_get(a, 700, S1, &r));
  CHECK(r == p);
  gpu_alloc_put(a, q, S1);
  gpu_alloc_put(a, r, S1);
  fake_done(a, &f);
}

TEST(a_device_wide_sync_and_a_retired_stream_release_blocks) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r, *s;
  CHECK(gpu_alloc_get(a, 900, S1, &p));
  CHECK(gpu_alloc_get(a, 2000, S1, &q));
  gpu_alloc_put(a, p, S1);
  gpu_alloc_put(a, q, S1);
  gpu_alloc_synced(a, GPU_ALLOC_ALL_STREAMS, gpu_alloc_stamp(a));
  CHECK(gpu_alloc_get(a, 900, S2, &r));
  CHECK(r == p);
  gpu_alloc_put(a, r, S2);
  gpu_alloc_stream_retired(a, S2); /* its thread synced and exited */
  CHECK(gpu_alloc_get(a, 900, S3, &s));
  CHECK(s == p);
  gpu_alloc_put(a, s, S3);
  /* a stream made later under a retired one's id holds back no block
     freed before it started */
  gpu_alloc_stream_retired(a, S3);
  void *t, *u;
  CHECK(gpu_alloc_get(a, 100, S3, &t)); /* the new S3 */
  CHECK(gpu_alloc_get(a, 900, S1, &u));
  CHECK(u == p);
  gpu_alloc_put(a, t, S3);
  gpu_alloc_put(a, u, S1);
  fake_done(a, &f);
}

TEST(frees_from_a_thread_without_a_stream_count_only_the_users) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q;
  CHECK(gpu_alloc_get(a, 512, S1, &p));
  gpu_alloc_put(a, p, 0);
  CHECK(gpu_alloc_get(a, 512, S1, &q));
  CHECK(q == p);
  gpu_alloc_put(a, q, S1);
  fake_done(a, &f);
}

/* ---- out of memory ---- */

TEST(out_of_memory_frees_the_cache_and_retries_once) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 10000);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 4096, S1, &p));
  CHECK(gpu_alloc_get(a, 4096, S1, &q));
  gpu_alloc_put(a, p, S1);
  gpu_alloc_put(a, q, S1);
  CHECK_EQ_INT(f.used, 8192);
  /* 6000 bytes (class 6144) do not fit beside 8192 cached: the cache goes */
  CHECK(gpu_alloc_get(a, 6000, S2, &r));
  CHECK_EQ_INT(f.syncs, 1);
  CHECK_EQ_INT(f.used, 6144);
  gpu_alloc_stats s;
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.cached, 0);
  CHECK_EQ_INT(s.in_use, 6144);
  CHECK_EQ_INT(s.oom_retries, 1);
  gpu_alloc_put(a, r, S2);
  fake_done(a, &f);
}

TEST(out_of_memory_takes_a_cached_block_of_the_class_once_the_device_is_idle) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 5000);
  void *p, *q;
  CHECK(gpu_alloc_get(a, 4096, S1, &p));
  gpu_alloc_put(a, p, S1);
  CHECK(gpu_alloc_get(a, 4096, S2, &q)); /* not S2's before a sync; no room for another */
  CHECK(q == p);
  CHECK_EQ_INT(f.syncs, 1);
  CHECK_EQ_INT(f.allocs, 1);
  gpu_alloc_put(a, q, S2);
  fake_done(a, &f);
}

TEST(out_of_memory_after_the_retry_is_kiln_err_oom_with_the_numbers) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 10000);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 4096, S1, &p));
  CHECK(gpu_alloc_get(a, 2048, S1, &q));
  gpu_alloc_put(a, q, S1);
  kiln_clear_error();
  CHECK(!gpu_alloc_get(a, 8192, S1, &r));
  CHECK(r == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_OOM);
  CHECK_STR_CONTAINS(kiln_last_error(), "out of GPU memory allocating 8192 bytes");
  CHECK_STR_CONTAINS(kiln_last_error(), "4.00 KiB in use");
  CHECK_STR_CONTAINS(kiln_last_error(), "after freeing 2.00 KiB of cache");
  CHECK_EQ_INT(f.used, 4096); /* the cache went back */
  gpu_alloc_stats s;
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.in_use, 4096);
  CHECK_EQ_INT(s.cached, 0);
  kiln_clear_error();
  gpu_alloc_put(a, p, S1);
  fake_done(a, &f);
}

TEST(a_raw_allocator_error_is_passed_on) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  f.fail_hard = true;
  void *p;
  kiln_clear_error();
  CHECK(!gpu_alloc_get(a, 100, S1, &p));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  CHECK_STR_CONTAINS(kiln_last_error(), "fake raw allocator: broken");
  CHECK_EQ_INT(f.syncs, 0);
  kiln_clear_error();
  fake_done(a, &f);
}

/* ---- stats and trim ---- */

TEST(stats_count_bytes_in_use_and_cached) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q;
  CHECK(gpu_alloc_get(a, 1000, S1, &p));
  CHECK(gpu_alloc_get(a, 3000, S1, &q));
  gpu_alloc_stats s;
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.in_use, 1024 + 3072);
  CHECK_EQ_INT(s.requested, 4000);
  CHECK_EQ_INT(s.cached, 0);
  gpu_alloc_put(a, p, S1);
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.in_use, 3072);
  CHECK_EQ_INT(s.requested, 3000);
  CHECK_EQ_INT(s.cached, 1024);
  CHECK_EQ_INT(s.peak_in_use, 4096);
  gpu_alloc_put(a, q, S1);
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.in_use, 0);
  CHECK_EQ_INT(s.cached, 4096);
  fake_done(a, &f);
}

TEST(trim_returns_every_cached_block_after_a_sync) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p, *q, *r;
  CHECK(gpu_alloc_get(a, 1000, S1, &p));
  CHECK(gpu_alloc_get(a, 5000, S2, &q));
  CHECK(gpu_alloc_get(a, 9000, S2, &r));
  gpu_alloc_put(a, p, S1);
  gpu_alloc_put(a, q, S2);
  CHECK(gpu_alloc_trim(a));
  CHECK_EQ_INT(f.syncs, 1);
  CHECK_EQ_INT(f.frees, 2);
  CHECK_EQ_INT(f.used, gpu_alloc_class_size(9000));
  gpu_alloc_stats s;
  gpu_alloc_get_stats(a, &s);
  CHECK_EQ_INT(s.cached, 0);
  CHECK_EQ_INT(s.in_use, gpu_alloc_class_size(9000));
  gpu_alloc_put(a, r, S2);
  fake_done(a, &f);
}

TEST(destroy_returns_live_blocks_too) {
  fake_raw f;
  gpu_alloc *a = fake_new(&f, 1 << 20);
  void *p;
  CHECK(gpu_alloc_get(a, 1000, S1, &p));
  fake_done(a, &f);
}

/* ---- the disk cache's blobs (compiled GPU code) ---- */

TEST(blobs_round_trip_through_the_disk_cache) {
  char dir[] = "/tmp/kiln-gpu-blob-XXXXXX";
  if (!mkdtemp(dir)) {
    KTEST_FAIL("mkdtemp failed");
    return;
  }
  const char *old = getenv("KILN_CACHE_DIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("KILN_CACHE_DIR", dir, 1);
  const uint64_t h[2] = {0x1234, 0x5678}, other[2] = {0x1234, 0x5679};
  unsigned char data[3000];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7);
  CHECK(cache_disk_blob_put(h, data, sizeof data));
  size_t len = 0;
  unsigned char *got = cache_disk_blob_get(h, &len);
  CHECK(got != NULL);
  CHECK_EQ_INT(len, sizeof data);
  CHECK(got && memcmp(got, data, sizeof data) == 0);
  free(got);
  CHECK(cache_disk_blob_get(other, &len) == NULL);
  CHECK_EQ_INT(len, 0);
  CHECK(!cache_disk_blob_put(h, data, 0));
  /* a corrupt blob is deleted, never returned */
  char path[4096];
  snprintf(path, sizeof path, "%s/kernel-v%d-%016llx%016llx.blob", dir, CACHE_DISK_FORMAT,
           0x1234ull, 0x5678ull);
  FILE *fp = fopen(path, "r+b");
  CHECK(fp != NULL);
  if (fp) {
    fseek(fp, 10, SEEK_SET);
    fputc(data[10] ^ 0xff, fp);
    fclose(fp);
  }
  CHECK(cache_disk_blob_get(h, &len) == NULL);
  fp = fopen(path, "rb");
  CHECK(fp == NULL); /* deleted */
  if (fp) fclose(fp);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  if (saved)
    setenv("KILN_CACHE_DIR", saved, 1);
  else
    unsetenv("KILN_CACHE_DIR");
  free(saved);
}

/* ---- the CUDA runtime on this machine ---- */

TEST(without_a_gpu_every_entry_point_is_a_device_error) {
  const char *why = gpu_unavailable();
  CHECK(why != NULL && *why);
  printf("test_gpu_alloc: no usable GPU here: %s\n", why ? why : "?");
  CHECK_STR_CONTAINS(gpu_info(), why);
  CHECK_EQ_INT(gpu_compute_capability(), 0);
  kiln_clear_error();
  CHECK(gpu_mem_alloc(1024) == NULL);
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  CHECK_STR_CONTAINS(kiln_last_error(), "CUDA is not available: ");
  CHECK_STR_CONTAINS(kiln_last_error(), why);
  kiln_clear_error();
  char buf[16] = {0};
  CHECK(!gpu_copy_to_host(buf, (void *)64, sizeof buf));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  kiln_clear_error();
  CHECK(!gpu_copy_from_host((void *)64, buf, sizeof buf));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  kiln_clear_error();
  CHECK(!gpu_synchronize());
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  kiln_clear_error();
  gpu_op_plan plan = {0};
  CHECK(!gpu_run_op_plan(&plan));
  CHECK_EQ_INT(kiln_last_status(), KILN_ERR_DEVICE);
  kiln_clear_error();
  CHECK(gpu_stream() == NULL);
  CHECK(gpu_thread_blas_slot() == NULL);
  gpu_mem_free(NULL, 0);
  gpu_mem_free((void *)64, 1); /* never allocated here: ignored */
  gpu_alloc_stats s;
  CHECK(!gpu_mem_stats(&s));
  CHECK_EQ_INT(s.in_use, 0);
  kiln_clear_error();
}

/* with a GPU: device memory round trips through the staging buffers, in
   pieces larger than one staging half, and the cache reuses blocks */
TEST(with_a_gpu_copies_round_trip) {
  printf("test_gpu_alloc: %s\n", gpu_info());
  size_t n = (9u << 20) + 123; /* three staging chunks */
  unsigned char *host = malloc(n), *back = malloc(n);
  CHECK(host && back);
  if (!host || !back) {
    free(host);
    free(back);
    return;
  }
  for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 131 + 7);
  void *d = gpu_mem_alloc(n), *e = gpu_mem_alloc(n);
  CHECK(d && e);
  CHECK(gpu_copy_from_host(d, host, n));
  CHECK(gpu_copy_on_device(e, d, n));
  memset(back, 0, n);
  CHECK(gpu_copy_to_host(back, e, n));
  CHECK(memcmp(back, host, n) == 0);
  CHECK(gpu_mem_zero(e, 1000));
  CHECK(gpu_copy_to_host(back, e, 2000));
  bool zeros = true;
  for (size_t i = 0; i < 1000; i++) zeros = zeros && back[i] == 0;
  CHECK(zeros);
  CHECK(back[1000] == host[1000] && back[1999] == host[1999]);
  gpu_alloc_stats s;
  CHECK(gpu_mem_stats(&s));
  CHECK(s.in_use >= 2 * n);
  gpu_mem_free(e, n);
  void *f = gpu_mem_alloc(n);
  CHECK(f == e); /* the same stream takes its block back at once */
  gpu_mem_free(f, n);
  gpu_mem_free(d, n);
  CHECK(gpu_mem_trim());
  CHECK(gpu_mem_stats(&s));
  CHECK_EQ_INT(s.cached, 0);
  CHECK(gpu_synchronize());
  printf("test_gpu_alloc: cuBLAS: %s\n",
         gpu_blas_unavailable() ? gpu_blas_unavailable() : "loaded");
  free(host);
  free(back);
}

int main(void) {
  RUN(size_classes_round_up_to_eight_steps_per_power_of_two);
  RUN(a_too_large_request_fails_with_oom_naming_the_size);
  RUN(a_freed_block_is_reused_by_the_same_stream_at_once);
  RUN(the_newest_freed_block_of_a_class_is_taken_first);
  RUN(another_stream_waits_for_a_sync_point_after_the_free);
  RUN(a_block_freed_by_another_stream_waits_for_both);
  RUN(a_recorded_use_holds_the_block_for_that_stream);
  RUN(a_device_wide_sync_and_a_retired_stream_release_blocks);
  RUN(frees_from_a_thread_without_a_stream_count_only_the_users);
  RUN(out_of_memory_frees_the_cache_and_retries_once);
  RUN(out_of_memory_takes_a_cached_block_of_the_class_once_the_device_is_idle);
  RUN(out_of_memory_after_the_retry_is_kiln_err_oom_with_the_numbers);
  RUN(a_raw_allocator_error_is_passed_on);
  RUN(stats_count_bytes_in_use_and_cached);
  RUN(trim_returns_every_cached_block_after_a_sync);
  RUN(destroy_returns_live_blocks_too);
  RUN(blobs_round_trip_through_the_disk_cache);
  if (gpu_unavailable())
    RUN(without_a_gpu_every_entry_point_is_a_device_error);
  else
    RUN(with_a_gpu_copies_round_trip);
  return ktest_done();
}

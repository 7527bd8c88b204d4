/* private_dir.h — directories and files that only the effective user can
 * write (DESIGN §11), for the disk cache and KILN_DUMP: a directory is
 * created 0700 (missing parents too), opened without following a final
 * symlink and checked on that descriptor; files inside it are created with
 * O_EXCL | O_NOFOLLOW; and writing a whole buffer to a descriptor.  Nothing
 * here logs: callers decide what to say. */
#ifndef VM_PRIVATE_DIR_H
#define VM_PRIVATE_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* Why a directory could not be used: missing (and not creatable), not a
   directory at all, or present but not private (a symlink, another owner,
   group/world-writable) — only the last is a security refusal. */
typedef enum { VM_DIR_OK, VM_DIR_MISSING, VM_DIR_NOT_DIR, VM_DIR_UNTRUSTED } vm_dir_status;

/* Opens directory `path` (creating it and its missing parents 0700 when
   `create`) and returns a descriptor (O_DIRECTORY | O_NOFOLLOW |
   O_CLOEXEC) when it is a real directory owned by the effective user and
   writable by no one else; else -1, with *status and *why (a static
   string) saying why. */
int vm_private_dir_open(const char *path, bool create, vm_dir_status *status, const char **why);

/* the same checks on a directory already open (fstat of dir_fd) */
vm_dir_status vm_private_dir_check(const struct stat *st, const char **why);

/* whether fstat `st` is a regular file owned by the effective user with
   one link (*why, a static string, says what is wrong otherwise) */
bool vm_private_file_check(const struct stat *st, const char **why);

/* Creates `name` in dir_fd for writing (O_CREAT | O_EXCL | O_NOFOLLOW |
   O_CLOEXEC, mode 0600); an entry already there (an earlier run's file,
   or anything planted) is unlinked first, never followed or appended to.
   -1 with errno on failure. */
int vm_private_file_create(int dir_fd, const char *name);

/* "/proc/self/fd/<fd>/<name>": a path that reaches `name` through the
   open directory itself (however its path is renamed meanwhile), for code
   that only takes a path (libgccjit's dumps).  false when /proc is not
   there or the result does not fit. */
bool vm_fd_path(int dir_fd, const char *name, char *out, size_t out_len);

/* Programs Kiln runs (DESIGN §11, OpenSSH's StrictModes rule): a file is
   trusted when owned by root or the effective user and writable by
   neither group nor others (vm_trusted_mode, on its fstat), and every
   directory above it likewise, except that a sticky directory (/tmp) may be
   writable by others, who can add entries there but not replace ours
   (vm_trusted_dirs, on an absolute path without links; *why, in why_len
   bytes, says what failed). */
bool vm_trusted_mode(const struct stat *st);
bool vm_trusted_dirs(const char *real_path, char *why, size_t why_len);

/* writes all of buf (retrying short writes and EINTR); false on an error
   (errno says which) */
bool vm_write_full(int fd, const void *buf, size_t len);

#endif

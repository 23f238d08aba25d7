// An LD_PRELOAD shim that makes opening chosen files fail, so tests can give
// a real process (trainsup-worker, the test worker) a transient I/O error
// without a broken disk:
//
//   TRAINSUP_FAULT_OPEN_PATH   a substring; open(2), openat(2) and
//                              opendir(3) of a path containing it fail
//   TRAINSUP_FAULT_OPEN_ERRNO  the errno they fail with: a name (EIO,
//                              EMFILE, ENOMEM, ENFILE, EACCES) or a number
//   TRAINSUP_FAULT_OPEN_SKIP   let this many matching opens succeed first
//                              (default 0), to fail a later read of a file
//
// Without TRAINSUP_FAULT_OPEN_PATH every call goes straight through. Only
// calls through the dynamic symbol table are seen (ours, not glibc's own
// internal opens).
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <atomic>

namespace {

int ErrnoFromEnv() {
  const char* v = getenv("TRAINSUP_FAULT_OPEN_ERRNO");
  if (v == nullptr || *v == '\0') return EIO;
  static const struct {
    const char* name;
    int value;
  } kNames[] = {{"EIO", EIO},       {"EMFILE", EMFILE}, {"ENFILE", ENFILE},
                {"ENOMEM", ENOMEM}, {"EACCES", EACCES}, {"ENOSPC", ENOSPC}};
  for (const auto& n : kNames) {
    if (strcmp(v, n.name) == 0) return n.value;
  }
  return atoi(v);
}

std::atomic<long> g_matches{0};

// Whether opening `path` must fail now; sets errno when it must.
bool Fail(const char* path) {
  const char* pattern = getenv("TRAINSUP_FAULT_OPEN_PATH");
  if (pattern == nullptr || *pattern == '\0' || path == nullptr ||
      strstr(path, pattern) == nullptr) {
    return false;
  }
  const char* skip = getenv("TRAINSUP_FAULT_OPEN_SKIP");
  if (g_matches.fetch_add(1) < (skip != nullptr ? atol(skip) : 0)) return false;
  errno = ErrnoFromEnv();
  return true;
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

mode_t ModeArg(int flags, va_list ap) {
  return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
}

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArg(flags, ap);
  va_end(ap);
  if (Fail(path)) return -1;
  static auto next = Next<int (*)(const char*, int, ...)>("open");
  return next(path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArg(flags, ap);
  va_end(ap);
  if (Fail(path)) return -1;
  static auto next = Next<int (*)(const char*, int, ...)>("open64");
  return next(path, flags, mode);
}

int openat(int dir, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArg(flags, ap);
  va_end(ap);
  if (Fail(path)) return -1;
  static auto next = Next<int (*)(int, const char*, int, ...)>("openat");
  return next(dir, path, flags, mode);
}

int openat64(int dir, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = ModeArg(flags, ap);
  va_end(ap);
  if (Fail(path)) return -1;
  static auto next = Next<int (*)(int, const char*, int, ...)>("openat64");
  return next(dir, path, flags, mode);
}

DIR* opendir(const char* path) {
  if (Fail(path)) return nullptr;
  static auto next = Next<DIR* (*)(const char*)>("opendir");
  return next(path);
}

}  // extern "C"

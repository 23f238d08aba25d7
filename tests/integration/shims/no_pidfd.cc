// LD_PRELOAD shim for tests: pidfd_open(2) fails with ENOSYS, as on kernels
// before 5.3 or under a seccomp profile that forbids it, whether the program
// calls glibc's pidfd_open() or syscall(SYS_pidfd_open, ...). Every other
// system call goes through.
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <sys/types.h>

extern "C" int pidfd_open(pid_t, unsigned int) {
  errno = ENOSYS;
  return -1;
}

extern "C" long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& v : a) v = va_arg(ap, long);
  va_end(ap);
#ifdef SYS_pidfd_open
  if (number == SYS_pidfd_open) {
    errno = ENOSYS;
    return -1;
  }
#endif
  using Syscall = long (*)(long, ...);
  static Syscall real = reinterpret_cast<Syscall>(dlsym(RTLD_NEXT, "syscall"));
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

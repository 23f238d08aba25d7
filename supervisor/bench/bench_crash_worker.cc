// The benchmark's crashing worker: no libraries beyond libc, so the time
// from exec to main() is the kernel's and the loader's, not ours. Appends
// "start <attempt> <unix us>" first thing, sleeps 20 ms, appends
// "exit <attempt> <unix us>" and exits 3 (a crash, in docs/design.md's terms).
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long NowUs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void Stamp(const char* run_dir, const char* what, const char* attempt) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/bench-times.txt", run_dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return;
  char line[128];
  int n = snprintf(line, sizeof(line), "%s %s %lld\n", what, attempt, NowUs());
  if (write(fd, line, n) != n) _exit(2);
  close(fd);
}

int main(int argc, char** argv) {
  long long started = NowUs();
  const char* run_dir = ".";
  const char* attempt = "0";
  for (int i = 1; i + 1 < argc; ++i) {
    if (strcmp(argv[i], "--run-dir") == 0) run_dir = argv[i + 1];
    if (strcmp(argv[i], "--attempt") == 0) attempt = argv[i + 1];
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/bench-times.txt", run_dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd >= 0) {
    char line[128];
    int n = snprintf(line, sizeof(line), "start %s %lld\n", attempt, started);
    if (write(fd, line, n) != n) return 2;
    close(fd);
  }
  usleep(20000);
  Stamp(run_dir, "exit", attempt);
  _exit(3);
}

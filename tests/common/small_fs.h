// A small file system a test can fill: a tmpfs of a few megabytes mounted
// on a directory for the life of the object. Mounting needs root (or
// CAP_SYS_ADMIN); where it is not permitted, mounted() is false and error()
// says why, and the test should GTEST_SKIP with it.
#ifndef TRAINSUP_TESTS_COMMON_SMALL_FS_H_
#define TRAINSUP_TESTS_COMMON_SMALL_FS_H_

#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace trainsup::testing {

class SmallFileSystem {
 public:
  // Mounts a tmpfs of `bytes` on `dir` (created when missing).
  SmallFileSystem(std::string dir, uint64_t bytes) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0755";
    if (::mount("trainsup-test", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) !=
        0) {
      error_ = "cannot mount a " + std::to_string(bytes) + "-byte tmpfs on " + dir_ + ": " +
               std::strerror(errno) + " (the test needs root or CAP_SYS_ADMIN)";
      return;
    }
    mounted_ = true;
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  SmallFileSystem(const SmallFileSystem&) = delete;
  SmallFileSystem& operator=(const SmallFileSystem&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }

  // Takes all the space that is left: appends to DIR/.filler until the
  // file system says ENOSPC. Returns false if it never did.
  bool Fill() {
    const std::string path = dir_ + "/.filler";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    const std::vector<char> block(64 << 10, 'f');
    // The last write that fits only in part is short; the one after it
    // fails.
    bool full = false;
    for (;;) {
      if (::write(fd, block.data(), block.size()) < 0) {
        full = errno == ENOSPC;
        break;
      }
    }
    ::close(fd);
    return full;
  }
  // Gives the space back.
  void Free() { ::unlink((dir_ + "/.filler").c_str()); }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_SMALL_FS_H_

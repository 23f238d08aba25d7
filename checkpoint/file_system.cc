#include "checkpoint/file_system.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainsup::ckpt {
namespace {

absl::Status PosixError(const std::string& what, const std::string& path, int err) {
  return ErrnoStatus(what, path, err);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(std::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return PosixError("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return PosixError("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  using FileSystem::NewWritableFile;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                uint32_t mode) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
    if (fd < 0) return PosixError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::Status ReadFile(const std::string& path,
                        const std::function<absl::Status(std::string_view)>& sink) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    std::vector<char> buf(1 << 20);
    absl::Status status;
    while (true) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        status = PosixError("read", path, errno);
        break;
      }
      if (n == 0) break;
      status = sink(std::string_view(buf.data(), static_cast<size_t>(n)));
      if (!status.ok()) break;
    }
    ::close(fd);
    return status;
  }

  absl::Status ReadAt(const std::string& path, uint64_t offset, uint64_t size, char* out) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    uint64_t done = 0;
    absl::Status status;
    while (done < size) {
      const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        status = PosixError("read", path, errno);
        break;
      }
      if (n == 0) {
        status = absl::OutOfRangeError(
            absl::StrCat("read ", path, ": file ends before byte ", offset + size));
        break;
      }
      done += static_cast<uint64_t>(n);
    }
    ::close(fd);
    return status;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  bool IsDir(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  absl::Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      return PosixError("mkdir", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return PosixError("opendir", path, errno);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError(absl::StrCat("rename to ", to, " from"), from, errno);
    }
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::Status DeleteTree(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    if (S_ISDIR(st.st_mode)) {
      auto names = ListDir(path);
      if (!names.ok()) return names.status();
      for (const auto& n : *names) {
        absl::Status s = DeleteTree(JoinPath(path, n));
        if (!s.ok()) return s;
      }
      if (::rmdir(path.c_str()) != 0) return PosixError("rmdir", path, errno);
      return absl::OkStatus();
    }
    return DeleteFile(path);
  }

  absl::Status SyncDir(const std::string& path) override { return SyncPath(path, O_DIRECTORY); }
  absl::Status SyncFile(const std::string& path) override { return SyncPath(path, 0); }

 private:
  absl::Status SyncPath(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), O_RDONLY | flags | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    absl::Status status;
    if (::fsync(fd) != 0) status = PosixError("fsync", path, errno);
    ::close(fd);
    return status;
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static FileSystem* fs = new PosixFileSystem();
  return fs;
}

absl::Status FileSystem::CreateDirs(const std::string& path) {
  if (path.empty() || IsDir(path)) return absl::OkStatus();
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status s = CreateDirs(path.substr(0, slash));
    if (!s.ok()) return s;
  }
  return CreateDir(path);
}

absl::StatusOr<std::string> FileSystem::ReadSmallFile(const std::string& path) {
  std::string out;
  absl::Status s = ReadFile(path, [&](std::string_view piece) {
    out.append(piece);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::Status FileSystem::WriteSmallFile(const std::string& path, std::string_view data) {
  auto file = NewWritableFile(path);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(data);
  if (s.ok()) s = (*file)->Sync();
  absl::Status c = (*file)->Close();
  return s.ok() ? c : s;
}

absl::Status FileSystem::WriteFileAtomically(const std::string& path, std::string_view data,
                                             uint32_t mode) {
  const std::string tmp = path + ".tmp";
  // A leftover of a crash keeps its old permissions under O_TRUNC.
  if (Exists(tmp)) {
    absl::Status d = DeleteFile(tmp);
    if (!d.ok()) return d;
  }
  auto file = NewWritableFile(tmp, mode);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(data);
  if (s.ok()) s = (*file)->Sync();
  absl::Status closed = (*file)->Close();
  if (s.ok()) s = closed;
  if (s.ok()) s = Rename(tmp, path);
  if (!s.ok()) {
    DeleteFile(tmp).IgnoreError();
    return s;
  }
  const size_t slash = path.find_last_of('/');
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  return SyncDir(parent);
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  const char* name = ::strerrorname_np(err);
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err), " (",
                                       name != nullptr ? name : absl::StrCat("errno ", err), ")");
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace trainsup::ckpt

#include "proto/exit_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainsup {
namespace {

absl::Status PosixError(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

absl::Status MakeDirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError("mkdir", prefix, errno);
    }
  }
  return absl::OkStatus();
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return PosixError("open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return PosixError("fsync", path, err);
  return absl::OkStatus();
}

absl::Status WriteAll(const std::string& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError("open", path, errno);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return PosixError("write", path, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return PosixError("fsync", path, err);
  }
  if (::close(fd) != 0) return PosixError("close", path, errno);
  return absl::OkStatus();
}

}  // namespace

std::string ExitFilePath(const std::string& run_dir, int attempt, int rank) {
  return absl::StrCat(run_dir, "/attempts/", attempt, "/rank-", rank, ".exit.json");
}

absl::Status WriteExitFile(const std::string& run_dir, int attempt, int rank,
                           const ExitFile& exit_file) {
  const std::string dir = absl::StrCat(run_dir, "/attempts/", attempt);
  const std::string path = ExitFilePath(run_dir, attempt, rank);
  const std::string tmp = path + ".tmp";
  absl::Status s = MakeDirs(dir);
  if (!s.ok()) return s;
  const nlohmann::json j = {{"code", exit_file.code},
                            {"reason", exit_file.reason},
                            {"message", exit_file.message},
                            {"last_step", exit_file.last_step},
                            {"time_ms", exit_file.time_ms}};
  // Invalid UTF-8 in a message must not make the write throw.
  s = WriteAll(tmp, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("rename", tmp, errno);
  return SyncPath(dir, O_RDONLY | O_DIRECTORY);
}

absl::StatusOr<ExitFile> ReadExitFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("open", path, errno);
    return absl::InternalError(absl::StrCat("cannot read ", path));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  ExitFile out;
  auto bad_type = [&](const char* field, const char* want) {
    return absl::DataLossError(absl::StrCat(path, ": \"", field, "\" must be ", want));
  };
  const auto code = j.find("code");
  if (code == j.end()) return absl::DataLossError(absl::StrCat(path, ": \"code\" is missing"));
  if (!code->is_number_integer()) return bad_type("code", "an integer");
  out.code = code->get<int>();
  for (const char* name : {"reason", "message"}) {
    const auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_string()) return bad_type(name, "a string");
    (std::string(name) == "reason" ? out.reason : out.message) = it->get<std::string>();
  }
  for (const char* name : {"last_step", "time_ms"}) {
    const auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_number_integer()) return bad_type(name, "an integer");
    (std::string(name) == "last_step" ? out.last_step : out.time_ms) = it->get<int64_t>();
  }
  return out;
}

}  // namespace trainsup

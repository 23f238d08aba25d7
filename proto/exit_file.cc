#include "proto/exit_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "nlohmann/json.hpp"
#include "proto/run_layout.h"

namespace trainsup {
namespace {

absl::Status PosixError(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

std::string ExitFilePath(const std::string& run_dir, int attempt, int rank) {
  return RunLayout(run_dir).ExitFilePath(attempt, rank);
}

absl::Status WriteExitFile(const std::string& run_dir, int attempt, int rank,
                           const ExitFile& exit_file) {
  return WriteExitFile(ckpt::FileSystem::Default(), run_dir, attempt, rank, exit_file);
}

absl::Status WriteExitFile(ckpt::FileSystem* fs, const std::string& run_dir, int attempt, int rank,
                           const ExitFile& exit_file) {
  const RunLayout layout(run_dir);
  absl::Status s = fs->CreateDirs(layout.AttemptDir(attempt));
  if (!s.ok()) return s;
  const nlohmann::json j = {{"code", exit_file.code},
                            {"reason", exit_file.reason},
                            {"message", exit_file.message},
                            {"last_step", exit_file.last_step},
                            {"time_ms", exit_file.time_ms}};
  // Invalid UTF-8 in a message must not make the write throw.
  return fs->WriteFileAtomically(
      layout.ExitFilePath(attempt, rank),
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
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

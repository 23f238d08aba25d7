#include "contracts/exit_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "contracts/run_layout.h"
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
  nlohmann::json j = {{"code", exit_file.code},       {"reason", exit_file.reason},
                      {"message", exit_file.message}, {"last_step", exit_file.last_step},
                      {"time_ms", exit_file.time_ms}, {"first_bad_step", exit_file.first_bad_step}};
  if (exit_file.tally.present()) {
    const TrainingTally& t = exit_file.tally;
    j["tally"] = {{"steps", t.steps},
                  {"applied", t.applied},
                  {"skipped_window", t.skipped_window},
                  {"skipped_guard", t.skipped_guard},
                  {"skipped_scaler", t.skipped_scaler},
                  {"final_metric", t.final_metric},
                  {"baseline_metric", t.baseline_metric}};
  }
  // Invalid UTF-8 in a message must not make the write throw.
  return fs->WriteFileAtomically(
      layout.ExitFilePath(attempt, rank),
      j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

namespace {

// The exit file's "tally" object: its five counts (integers >= -1) and,
// when there, its two metrics (finite numbers).
absl::Status ReadTally(const nlohmann::json& t, const std::string& path, TrainingTally* out) {
  if (!t.is_object())
    return absl::DataLossError(absl::StrCat(path, ": \"tally\" must be an object"));
  for (const auto& [name, field] : {std::pair{"steps", &out->steps},
                                    {"applied", &out->applied},
                                    {"skipped_window", &out->skipped_window},
                                    {"skipped_guard", &out->skipped_guard},
                                    {"skipped_scaler", &out->skipped_scaler}}) {
    const auto f = t.find(name);
    if (f == t.end() || !f->is_number_integer() || f->get<int64_t>() < -1) {
      return absl::DataLossError(
          absl::StrCat(path, ": \"tally.", name, "\" must be an integer >= -1"));
    }
    *field = f->get<int64_t>();
  }
  for (const auto& [name, field] : {std::pair{"final_metric", &out->final_metric},
                                    {"baseline_metric", &out->baseline_metric}}) {
    const auto f = t.find(name);
    if (f == t.end()) continue;
    if (!f->is_number() || !std::isfinite(f->get<double>())) {
      return absl::DataLossError(
          absl::StrCat(path, ": \"tally.", name, "\" must be a finite number"));
    }
    *field = f->get<double>();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExitFile> ReadExitFile(const std::string& path) {
  // The run directory is the worker's: O_NONBLOCK so a FIFO in the exit
  // file's place cannot block the daemon in open(), then only a regular
  // file of at most kMaxExitFile bytes is read.
  constexpr int64_t kMaxExitFile = 1 << 20;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return PosixError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return PosixError("stat", path, err);
  }
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxExitFile) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, S_ISREG(st.st_mode) ? ": larger than 1 MiB" : ": not a regular file"));
  }
  std::string text;
  char buffer[8192];
  while (static_cast<int64_t>(text.size()) <= kMaxExitFile) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return PosixError("read", path, err);
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  if (static_cast<int64_t>(text.size()) > kMaxExitFile) {
    return absl::DataLossError(absl::StrCat(path, ": larger than 1 MiB"));
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  ExitFile out;
  auto bad_type = [&](const char* field, const char* want) {
    return absl::DataLossError(absl::StrCat(path, ": \"", field, "\" must be ", want));
  };
  // Integers are read in their full width and range-checked, never
  // narrowed: 4294967439 is not exit code 143.
  auto integer = [&](const nlohmann::json& value, const char* field, int64_t lo, int64_t hi,
                     int64_t* result) -> absl::Status {
    bool fits = false;
    int64_t v = 0;
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      v = static_cast<int64_t>(u);
      fits = u <= static_cast<uint64_t>(hi) && v >= lo;
    } else if (value.is_number_integer()) {
      v = value.get<int64_t>();
      fits = v >= lo && v <= hi;
    } else {
      return bad_type(field, "an integer");
    }
    if (fits) {
      *result = v;
      return absl::OkStatus();
    }
    return absl::DataLossError(absl::StrCat(path, ": \"", field, "\" must be an integer in [", lo,
                                            ", ", hi, "], got ", value.dump()));
  };
  const auto code = j.find("code");
  if (code == j.end()) return absl::DataLossError(absl::StrCat(path, ": \"code\" is missing"));
  int64_t value = 0;
  if (absl::Status s = integer(*code, "code", 0, 255, &value); !s.ok()) return s;
  out.code = static_cast<int>(value);
  for (const char* name : {"reason", "message"}) {
    const auto it = j.find(name);
    if (it == j.end()) continue;
    if (!it->is_string()) return bad_type(name, "a string");
    (std::string(name) == "reason" ? out.reason : out.message) = it->get<std::string>();
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (const auto it = j.find("last_step"); it != j.end()) {
    if (absl::Status s = integer(*it, "last_step", -1, kMax, &out.last_step); !s.ok()) return s;
  }
  if (const auto it = j.find("first_bad_step"); it != j.end()) {
    if (absl::Status s = integer(*it, "first_bad_step", -1, kMax, &out.first_bad_step); !s.ok()) {
      return s;
    }
  }
  if (const auto it = j.find("time_ms"); it != j.end()) {
    if (absl::Status s = integer(*it, "time_ms", 0, kMax, &out.time_ms); !s.ok()) return s;
  }
  if (const auto it = j.find("tally"); it != j.end()) {
    if (absl::Status st = ReadTally(*it, path, &out.tally); !st.ok()) return st;
  }
  return out;
}

}  // namespace trainsup

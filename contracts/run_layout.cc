#include "contracts/run_layout.h"

#include "absl/strings/str_cat.h"

namespace trainsup {

std::string JoinPaths(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  const bool a_slash = a.back() == '/';
  const bool b_slash = b.front() == '/';
  if (a_slash && b_slash) return a + b.substr(1);
  if (a_slash || b_slash) return a + b;
  return absl::StrCat(a, "/", b);
}

std::string StateLayout::StorePath() const { return JoinPaths(dir_, "trainsupd.db"); }
std::string StateLayout::DefaultSocketPath() const { return JoinPaths(dir_, "run/trainsupd.sock"); }
std::string StateLayout::AuthDir() const { return JoinPaths(dir_, "auth"); }
std::string StateLayout::TokenPath(const std::string& role) const {
  return JoinPaths(AuthDir(), role + ".token");
}
std::string StateLayout::RunsDir() const { return JoinPaths(dir_, "runs"); }
std::string StateLayout::RunDir(const std::string& run_id) const {
  return JoinPaths(RunsDir(), run_id);
}

std::string RunLayout::SpecPath() const { return JoinPaths(dir_, "spec.toml"); }
std::string RunLayout::AttemptsDir() const { return JoinPaths(dir_, "attempts"); }
std::string RunLayout::AttemptDir(int attempt) const {
  return JoinPaths(AttemptsDir(), std::to_string(attempt));
}
std::string RunLayout::LogPath(int attempt, int rank) const {
  return JoinPaths(AttemptDir(attempt), absl::StrCat("rank-", rank, ".log"));
}
std::string RunLayout::ExitFilePath(int attempt, int rank) const {
  return JoinPaths(AttemptDir(attempt), absl::StrCat("rank-", rank, ".exit.json"));
}
std::string RunLayout::CheckpointsDir() const { return JoinPaths(dir_, "checkpoints"); }
std::string RunLayout::CheckpointRoot(int /*rank*/, int /*world_size*/) const {
  return CheckpointsDir();
}

}  // namespace trainsup

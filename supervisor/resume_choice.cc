#include "supervisor/resume_choice.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "proto/run_layout.h"

namespace trainsup::supervisor {

ResumeChoice ChooseResume(const std::string& run_dir) {
  ResumeChoice c;
  const std::string root = RunLayout(run_dir).CheckpointsDir();
  if (!ckpt::FileSystem::Default()->IsDir(root)) return c;
  ckpt::CheckpointStore store(root);
  std::vector<ckpt::QuarantineReport> quarantined;
  absl::StatusOr<ckpt::CheckpointInfo> latest = store.ChooseLatest(&quarantined);
  for (const auto& q : quarantined) {
    c.notes.push_back(absl::StrCat("checkpoint step ", q.step, " quarantined: ", q.reason));
  }
  if (latest.ok()) {
    c.step = latest->step;
    c.dir = latest->path;
  } else if (latest.status().code() != absl::StatusCode::kNotFound) {
    c.error = latest.status();
  }
  return c;
}

}  // namespace trainsup::supervisor

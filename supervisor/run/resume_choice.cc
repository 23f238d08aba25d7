#include "supervisor/run/resume_choice.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "contracts/run_layout.h"

namespace trainsup::supervisor {

ResumeChoice ChooseResume(const std::string& run_dir, int64_t before_step,
                          const ckpt::QuarantineRetention& quarantine) {
  ResumeChoice c;
  const std::string root = RunLayout(run_dir).CheckpointsDir();
  if (!ckpt::FileSystem::Default()->IsDir(root)) return c;
  ckpt::CheckpointStore store(root);
  std::vector<ckpt::QuarantineReport> quarantined;
  if (before_step >= 0) {
    // A rollback: the diverged timeline's checkpoints from the first bad
    // step on are moved aside, so that no later attempt (after a crash of
    // this one, say) resumes from them and undoes the rollback, and
    // retention does not keep them over the new timeline's.
    absl::StatusOr<std::vector<ckpt::CheckpointInfo>> all = store.List();
    if (!all.ok()) {
      c.error = all.status();
      return c;
    }
    for (const ckpt::CheckpointInfo& info : *all) {
      if (info.step < before_step) continue;
      absl::StatusOr<ckpt::QuarantineReport> q = store.Quarantine(
          info, absl::StrCat("superseded: the run rolled back past step ", before_step));
      if (!q.ok()) {
        c.error = q.status();
        return c;
      }
      quarantined.push_back(*q);
    }
  }
  absl::StatusOr<ckpt::CheckpointInfo> latest = store.ChooseLatest(&quarantined, before_step);
  for (const auto& q : quarantined) {
    c.notes.push_back(absl::StrCat("checkpoint step ", q.step, " quarantined: ", q.reason));
  }
  // The quarantine is bounded; a pruning that fails is a note, not a reason
  // to hold the run back.
  absl::StatusOr<std::vector<std::string>> pruned =
      store.PruneQuarantine(quarantine, static_cast<int64_t>(std::time(nullptr)));
  if (!pruned.ok()) {
    c.notes.push_back(absl::StrCat("quarantine not pruned: ", pruned.status().message()));
  } else {
    for (const std::string& name : *pruned) {
      c.notes.push_back(absl::StrCat("quarantined checkpoint ", name,
                                     " deleted: beyond the newest ", quarantine.keep,
                                     " and older than ", quarantine.min_age_s,
                                     " s (checkpoints.quarantine_keep, quarantine_min_age_s)"));
    }
  }
  if (latest.ok()) {
    c.step = latest->step;
    c.dir = latest->path;
  } else if (latest.status().code() != absl::StatusCode::kNotFound) {
    c.error = latest.status();
  }
  return c;
}

ResumeChoice ChooseResumeShared(const std::string& run_dir, const std::string& shared_dir) {
  namespace fs = std::filesystem;
  ResumeChoice c;
  const fs::path link = RunLayout(run_dir).CheckpointsDir();
  std::error_code ec;
  const fs::path parent = fs::path(shared_dir).parent_path();
  if (!fs::is_directory(shared_dir, ec) && !fs::is_directory(parent, ec)) {
    c.error = absl::FailedPreconditionError(
        absl::StrCat("cluster.checkpoint_dir ", shared_dir, ": neither it nor its parent ",
                     parent.string(), " exists on this node: is the shared storage mounted here?"));
    return c;
  }
  // Checked at every attempt, not only at submit: a user who may write the
  // parent could swap the directory for a link to another job's store, or
  // anywhere the daemon may write, after the submit.
  if (fs::is_symlink(fs::symlink_status(shared_dir, ec))) {
    c.error = absl::FailedPreconditionError(absl::StrCat(
        "cluster.checkpoint_dir ", shared_dir,
        " is a symbolic link: refused, it may point anywhere (give the directory's real path)"));
    c.fatal = true;
    return c;
  }
  fs::create_directory(shared_dir, ec);
  if (ec) {
    c.error = absl::FailedPreconditionError(
        absl::StrCat("cluster.checkpoint_dir ", shared_dir, ": cannot create it: ", ec.message()));
    return c;
  }
  const fs::file_status st = fs::symlink_status(link, ec);
  if (st.type() == fs::file_type::not_found) {
    fs::create_directory_symlink(shared_dir, link, ec);
    if (ec) {
      c.error = absl::FailedPreconditionError(
          absl::StrCat("cannot link ", link.string(), " to ", shared_dir, ": ", ec.message()));
      return c;
    }
  } else if (st.type() != fs::file_type::symlink || fs::read_symlink(link, ec) != shared_dir) {
    c.error = absl::FailedPreconditionError(absl::StrCat(
        link.string(), " exists and is not a link to cluster.checkpoint_dir ", shared_dir));
    return c;
  }
  absl::StatusOr<std::optional<ckpt::StoreOwner>> owner = ckpt::ReadStoreOwner(shared_dir);
  if (!owner.ok()) {
    c.error = owner.status();
    c.fatal = absl::IsDataLoss(owner.status());
    return c;
  }
  c.owner = *owner;
  ckpt::CheckpointStore store(shared_dir);
  absl::StatusOr<std::vector<ckpt::CheckpointInfo>> all = store.List();
  if (!all.ok()) {
    if (all.status().code() != absl::StatusCode::kNotFound) c.error = all.status();
    return c;
  }
  std::vector<ckpt::CheckpointInfo> newest_first = *all;
  std::sort(
      newest_first.begin(), newest_first.end(),
      [](const ckpt::CheckpointInfo& a, const ckpt::CheckpointInfo& b) { return a.step > b.step; });
  for (const ckpt::CheckpointInfo& info : newest_first) {
    absl::Status v = store.Verify(info);
    if (v.ok()) {
      c.loadable.emplace_back(info.step, info.path);
      continue;
    }
    if (v.code() != absl::StatusCode::kDataLoss) {
      c.error = v;  // an I/O error is no verdict: nothing chosen
      c.loadable.clear();
      return c;
    }
    // Not quarantined here: the store is shared, and global rank 0's
    // worker handles its own; this node only leaves it out.
    c.notes.push_back(
        absl::StrCat("checkpoint step ", info.step,
                     " of the shared store does not verify on this node: ", v.message()));
  }
  if (!c.loadable.empty()) {
    c.step = c.loadable.front().first;
    c.dir = c.loadable.front().second;
  }
  return c;
}

}  // namespace trainsup::supervisor

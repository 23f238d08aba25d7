#include "supervisor/resume_choice.h"

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "proto/run_layout.h"

namespace trainsup::supervisor {

ResumeChoice ChooseResume(const std::string& run_dir, int world_size) {
  ResumeChoice c;
  const RunLayout layout(run_dir);
  ckpt::FileSystem* fs = ckpt::FileSystem::Default();
  if (world_size <= 1) {
    const std::string root = layout.CheckpointRoot(0, 1);
    if (!fs->IsDir(root)) return c;
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
  // The newest step every rank committed, verified on all of them.
  std::vector<std::unique_ptr<ckpt::CheckpointStore>> stores;
  std::vector<std::map<int64_t, ckpt::CheckpointInfo>> listed(world_size);
  std::map<int64_t, int> count;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string root = layout.CheckpointRoot(rank, world_size);
    stores.push_back(std::make_unique<ckpt::CheckpointStore>(root));
    if (!fs->IsDir(root)) continue;
    absl::StatusOr<std::vector<ckpt::CheckpointInfo>> list = stores.back()->List();
    if (!list.ok()) {
      c.error = list.status();
      return c;
    }
    for (const auto& info : *list) {
      listed[rank][info.step] = info;
      count[info.step]++;
    }
  }
  for (auto it = count.rbegin(); it != count.rend(); ++it) {
    if (it->second != world_size) continue;
    bool all_good = true;
    for (int rank = 0; rank < world_size && all_good; ++rank) {
      const ckpt::CheckpointInfo& info = listed[rank][it->first];
      absl::Status v = stores[rank]->Verify(info);
      if (v.ok()) continue;
      if (v.code() != absl::StatusCode::kDataLoss) {
        c.error = v;
        return c;
      }
      all_good = false;
      stores[rank]->Quarantine(info, std::string(v.message())).IgnoreError();
      c.notes.push_back(absl::StrCat("rank ", rank, " checkpoint step ", info.step,
                                     " quarantined: ", v.message()));
    }
    if (all_good) {
      c.step = it->first;
      c.dir = listed[0][it->first].path;
      return c;
    }
  }
  return c;
}

}  // namespace trainsup::supervisor

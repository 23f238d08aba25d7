#include "checkpoint/store.h"

#include <algorithm>
#include <ctime>
#include <functional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace trainsup::ckpt {
namespace {

constexpr char kTmpSuffix[] = ".tmp";
constexpr char kReplacedSuffix[] = ".replaced.tmp";
constexpr char kQuarantineDir[] = "quarantine";
constexpr char kQuarantineNote[] = "QUARANTINE.txt";

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

absl::Status NotVerified(const CheckpointInfo& c, const absl::Status& s) {
  return absl::UnavailableError(
      absl::StrCat("checkpoint step-", c.step, " not verified: ", s.message()));
}

}  // namespace

int64_t ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return -1;
  int64_t v = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    if (v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string StepDirName(int64_t step) { return absl::StrCat("step-", step); }

absl::Status CheckpointReadError(const absl::Status& s, const std::string& content_error) {
  if (absl::IsNotFound(s) || absl::IsOutOfRange(s) || absl::IsDataLoss(s)) {
    return absl::DataLossError(content_error);
  }
  if (absl::IsUnavailable(s)) return s;
  return absl::UnavailableError(absl::StrCat("I/O error (not a content error): ", s.message()));
}

absl::Status PendingCheckpoint::WriteFile(
    const std::string& name, const std::function<absl::Status(const ByteSink&)>& producer) {
  if (name.empty() || name.find('/') != std::string::npos || name == kManifestName) {
    failed_ = true;
    return absl::InvalidArgumentError(absl::StrCat("invalid checkpoint file name '", name, "'"));
  }
  for (const auto& f : files_) {
    if (f.name == name) {
      failed_ = true;
      return absl::AlreadyExistsError(absl::StrCat("checkpoint file '", name, "' written twice"));
    }
  }
  const std::string path = JoinPath(dir_, name);
  auto file = fs_->NewWritableFile(path);
  if (!file.ok()) {
    failed_ = true;
    return file.status();
  }
  Hasher hasher;
  uint64_t size = 0;
  absl::Status s = producer([&](std::string_view data) {
    hasher.Update(data);
    size += data.size();
    return (*file)->Append(data);
  });
  // The fsync waits for Commit: by then one journal commit flushes every
  // file's data, and the later fsyncs find little left to do.
  absl::Status c = (*file)->Close();
  if (s.ok()) s = c;
  if (!s.ok()) {
    failed_ = true;
    return Annotate(s, absl::StrCat("writing ", path));
  }
  files_.push_back(ManifestEntry{name, size, hasher.HexDigest()});
  return absl::OkStatus();
}

absl::Status PendingCheckpoint::WriteFile(const std::string& name, std::string_view data) {
  return WriteFile(name, [&](const ByteSink& sink) { return sink(data); });
}

CheckpointStore::CheckpointStore(std::string root, FileSystem* fs, StoreOptions options)
    : root_(std::move(root)), fs_(fs), options_(options) {
  if (options_.keep_last < 1) options_.keep_last = 1;
}

CheckpointStore::~CheckpointStore() { WaitForDeletions(); }

void CheckpointStore::WaitForDeletions() {
  if (deleter_.joinable()) deleter_.join();
}

absl::StatusOr<std::unique_ptr<PendingCheckpoint>> CheckpointStore::Begin(int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("negative checkpoint step ", step));
  absl::Status s = fs_->CreateDirs(root_);
  if (!s.ok()) return s;
  WaitForDeletions();
  s = CleanLeftovers();
  if (!s.ok()) return s;
  const std::string dir = JoinPath(root_, StepDirName(step) + kTmpSuffix);
  s = fs_->CreateDir(dir);
  if (!s.ok()) return s;
  return std::unique_ptr<PendingCheckpoint>(new PendingCheckpoint(fs_, step, dir));
}

absl::Status CheckpointStore::Commit(std::unique_ptr<PendingCheckpoint> pending) {
  if (pending == nullptr) return absl::InvalidArgumentError("no pending checkpoint");
  auto abort = [&](absl::Status s) {
    // Best effort: whatever stays behind is removed by the next Begin.
    fs_->DeleteTree(pending->dir()).IgnoreError();
    return s;
  };
  if (pending->failed_) {
    return abort(absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", pending->step(), " had a failed write; not committed")));
  }
  for (const auto& f : pending->files_) {
    absl::Status synced = fs_->SyncFile(JoinPath(pending->dir(), f.name));
    if (!synced.ok()) return abort(Annotate(synced, "syncing a checkpoint file"));
  }
  Manifest m;
  m.step = pending->step();
  m.created = NowRfc3339();
  m.files = pending->files_;
  absl::Status s = fs_->WriteSmallFile(JoinPath(pending->dir(), kManifestName), m.ToJson());
  if (s.ok()) s = fs_->SyncDir(pending->dir());
  if (!s.ok()) return abort(Annotate(s, "writing the manifest"));
  const std::string final_dir = JoinPath(root_, StepDirName(pending->step()));
  const std::string replaced = final_dir + kReplacedSuffix;
  const bool replacing = fs_->Exists(final_dir);
  if (replacing) {
    // Same step saved again: the old copy steps aside under a name that
    // CleanLeftovers restores (not deletes) while no step-N exists, so a
    // crash between the two renames keeps the old checkpoint.
    fs_->DeleteTree(replaced).IgnoreError();
    s = fs_->Rename(final_dir, replaced);
    if (!s.ok()) return abort(s);
  }
  s = fs_->Rename(pending->dir(), final_dir);
  if (!s.ok()) {
    if (replacing) fs_->Rename(replaced, final_dir).IgnoreError();
    return abort(s);
  }
  s = fs_->SyncDir(root_);
  if (!s.ok()) return Annotate(s, "syncing the checkpoint directory after the rename");
  if (replacing) fs_->DeleteTree(replaced).IgnoreError();
  // Deletions need no fsync: one lost in a crash is redone by the next save.
  return ApplyRetention(pending->step());
}

void CheckpointStore::Abort(std::unique_ptr<PendingCheckpoint> pending) {
  if (pending != nullptr) fs_->DeleteTree(pending->dir()).IgnoreError();
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointStore::List() {
  std::vector<CheckpointInfo> out;
  auto names = fs_->ListDir(root_);
  // No directory yet is no checkpoint; any other failure is not "none".
  if (absl::IsNotFound(names.status())) return out;
  if (!names.ok()) return names.status();
  for (const auto& name : *names) {
    const int64_t step = ParseStepDirName(name);
    const std::string path = JoinPath(root_, name);
    if (step >= 0 && fs_->IsDir(path)) out.push_back(CheckpointInfo{step, path});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

absl::StatusOr<Manifest> CheckpointStore::ReadManifest(const CheckpointInfo& checkpoint) {
  auto text = fs_->ReadSmallFile(JoinPath(checkpoint.path, kManifestName));
  if (!text.ok()) {
    return CheckpointReadError(text.status(),
                               absl::StrCat("manifest unreadable: ", text.status().message()));
  }
  auto m = Manifest::FromJson(*text);
  if (!m.ok()) return absl::DataLossError(m.status().message());
  return m;
}

absl::Status CheckpointStore::Verify(const CheckpointInfo& checkpoint) {
  auto m = ReadManifest(checkpoint);
  if (!m.ok()) return m.status();
  if (m->format_version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("manifest format version ", m->format_version,
                                            "; this build reads version ", kFormatVersion));
  }
  if (m->step != checkpoint.step) {
    return absl::DataLossError(
        absl::StrCat("manifest says step ", m->step, " in directory of step ", checkpoint.step));
  }
  std::set<std::string> listed = {kManifestName};
  for (const auto& f : m->files) {
    if (!listed.insert(f.name).second) {
      return absl::DataLossError(absl::StrCat("manifest lists '", f.name, "' twice"));
    }
  }
  auto names = fs_->ListDir(checkpoint.path);
  if (!names.ok())
    return CheckpointReadError(names.status(), std::string(names.status().message()));
  for (const auto& n : *names) {
    if (!listed.count(n))
      return absl::DataLossError(absl::StrCat("extra file '", n, "' not in the manifest"));
  }
  for (const auto& f : m->files) {
    const std::string path = JoinPath(checkpoint.path, f.name);
    auto size = fs_->FileSize(path);
    if (!size.ok())
      return CheckpointReadError(size.status(), absl::StrCat("missing file '", f.name, "'"));
    if (*size != f.size) {
      return absl::DataLossError(
          absl::StrCat("file '", f.name, "' has ", *size, " bytes; the manifest says ", f.size));
    }
    Hasher h;
    absl::Status s = fs_->ReadFile(path, [&](std::string_view piece) {
      h.Update(piece);
      return absl::OkStatus();
    });
    if (!s.ok()) {
      return CheckpointReadError(s,
                                 absl::StrCat("missing file '", f.name, "' (", s.message(), ")"));
    }
    if (h.HexDigest() != f.xxh3_128) {
      return absl::DataLossError(absl::StrCat("file '", f.name,
                                              "' does not match its hash (xxh3-128 ", h.HexDigest(),
                                              ", manifest ", f.xxh3_128, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> CheckpointStore::ChooseLatest(
    std::vector<QuarantineReport>* quarantined, int64_t before_step) {
  // Every failure but "none verifies" is an I/O error here: Unavailable.
  absl::Status restored = RestoreInterruptedReplacements();
  if (!restored.ok()) {
    return absl::UnavailableError(
        absl::StrCat("choosing a checkpoint in ", root_, ": ", restored.message()));
  }
  auto all = List();
  if (!all.ok()) {
    return absl::UnavailableError(
        absl::StrCat("listing the checkpoints in ", root_, ": ", all.status().message()));
  }
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (before_step >= 0 && it->step >= before_step) continue;
    absl::Status s = Verify(*it);
    if (s.ok()) return *it;
    // Only a content error condemns a checkpoint; after an I/O error an
    // older one must not be taken instead (it would lose the newer's work).
    if (!absl::IsDataLoss(s)) return NotVerified(*it, s);
    auto report = Quarantine(*it, std::string(s.message()));
    if (!report.ok()) {
      return absl::UnavailableError(
          absl::StrCat("checkpoint step-", it->step, " failed verification (", s.message(),
                       ") but could not be quarantined: ", report.status().message()));
    }
    if (quarantined != nullptr) quarantined->push_back(*report);
  }
  return absl::NotFoundError(absl::StrCat(
      "no checkpoint in ", root_,
      before_step >= 0 ? absl::StrCat(" before step ", before_step) : std::string(), " verifies"));
}

absl::StatusOr<QuarantineReport> CheckpointStore::Quarantine(const CheckpointInfo& checkpoint,
                                                             const std::string& reason) {
  const std::string qdir = JoinPath(root_, kQuarantineDir);
  absl::Status s = fs_->CreateDirs(qdir);
  if (!s.ok()) return s;
  std::string dest =
      JoinPath(qdir, absl::StrCat(StepDirName(checkpoint.step), ".", std::time(nullptr)));
  for (int i = 1; fs_->Exists(dest); ++i) {
    dest =
        JoinPath(qdir, absl::StrCat(StepDirName(checkpoint.step), ".", std::time(nullptr), ".", i));
  }
  s = fs_->Rename(checkpoint.path, dest);
  if (!s.ok()) return s;
  // The note is best effort: the move itself already keeps it from loading.
  fs_->WriteSmallFile(JoinPath(dest, kQuarantineNote),
                      absl::StrCat("step ", checkpoint.step, " quarantined at ", NowRfc3339(), ": ",
                                   reason, "\n"))
      .IgnoreError();
  fs_->SyncDir(qdir).IgnoreError();
  fs_->SyncDir(root_).IgnoreError();
  return QuarantineReport{checkpoint.step, reason, dest};
}

absl::StatusOr<std::vector<std::string>> CheckpointStore::PruneQuarantine(
    const QuarantineRetention& retention, int64_t now_unix_s) {
  std::vector<std::string> deleted;
  const std::string qdir = JoinPath(root_, kQuarantineDir);
  if (!fs_->IsDir(qdir)) return deleted;
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(qdir);
  if (!names.ok()) return names.status();
  // (time, name) of every entry named step-N.<time>[.i].
  std::vector<std::pair<int64_t, std::string>> entries;
  for (const std::string& name : *names) {
    const std::vector<std::string> parts = absl::StrSplit(name, '.');
    int64_t time = 0;
    if (parts.size() < 2 || parts.size() > 3 || ParseStepDirName(parts[0]) < 0 ||
        !absl::SimpleAtoi(parts[1], &time)) {
      continue;
    }
    entries.emplace_back(time, name);
  }
  std::sort(entries.begin(), entries.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(std::max(retention.keep, 0)); i < entries.size(); ++i) {
    if (now_unix_s - entries[i].first < retention.min_age_s) continue;
    absl::Status s = fs_->DeleteTree(JoinPath(qdir, entries[i].second));
    if (!s.ok()) return Annotate(s, "pruning the quarantine");
    deleted.push_back(entries[i].second);
  }
  return deleted;
}

absl::Status CheckpointStore::ApplyRetention(int64_t keep_step) {
  auto all = List();
  if (!all.ok()) return all.status();
  const int64_t n = static_cast<int64_t>(all->size());
  int64_t rollback_target = -1;
  const int64_t keep_before = keep_before_.load();
  if (keep_before >= 0) {
    for (const CheckpointInfo& c : *all) {
      if (c.step < keep_before) rollback_target = std::max(rollback_target, c.step);
    }
  }
  std::vector<std::string> doomed;
  for (int64_t i = 0; i + options_.keep_last < n; ++i) {
    const CheckpointInfo& c = (*all)[i];
    if (options_.keep_every > 0 && c.step % options_.keep_every == 0) continue;
    if (c.step == rollback_target) continue;
    // Never the checkpoint just committed, even when older steps number
    // higher (a run restarted from an earlier step).
    if (c.step == keep_step) continue;
    const std::string trash = c.path + ".deleting" + kTmpSuffix;
    absl::Status s = fs_->Rename(c.path, trash);
    if (!s.ok()) return Annotate(s, "retention");
    doomed.push_back(trash);
  }
  if (doomed.empty()) return absl::OkStatus();
  // Deleting large files costs about as much as writing them on ext4; the
  // caller need not wait for it.
  WaitForDeletions();
  FileSystem* fs = fs_;
  deleter_ = std::thread([fs, doomed = std::move(doomed)] {
    for (const auto& path : doomed) fs->DeleteTree(path).IgnoreError();
  });
  return absl::OkStatus();
}

absl::Status CheckpointStore::RestoreInterruptedReplacements() {
  if (!fs_->IsDir(root_)) return absl::OkStatus();
  auto names = fs_->ListDir(root_);
  if (!names.ok()) return names.status();
  for (const auto& name : *names) {
    const size_t r = name.size() - std::min(name.size(), sizeof(kReplacedSuffix) - 1);
    if (name.rfind("step-", 0) != 0 || name.compare(r, std::string::npos, kReplacedSuffix) != 0)
      continue;
    // A re-save of this step stopped between its two renames: the old copy
    // is the checkpoint.
    const std::string original = JoinPath(root_, name.substr(0, r));
    if (!fs_->Exists(original)) {
      absl::Status s = fs_->Rename(JoinPath(root_, name), original);
      if (!s.ok()) return Annotate(s, "restoring a replaced checkpoint");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::CleanLeftovers() {
  WaitForDeletions();
  absl::Status restored = RestoreInterruptedReplacements();
  if (!restored.ok()) return restored;
  if (!fs_->IsDir(root_)) return absl::OkStatus();
  auto names = fs_->ListDir(root_);
  if (!names.ok()) return names.status();
  for (const auto& name : *names) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, kTmpSuffix) == 0 &&
        name.rfind("step-", 0) == 0) {
      absl::Status s = fs_->DeleteTree(JoinPath(root_, name));
      if (!s.ok()) return Annotate(s, "removing an interrupted checkpoint");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<StoreOwner>> ReadStoreOwner(const std::string& root, FileSystem* fs) {
  const std::string path = JoinPath(root, kOwnerFileName);
  absl::StatusOr<std::string> text = fs->ReadSmallFile(path);
  if (absl::IsNotFound(text.status())) return std::optional<StoreOwner>();
  if (!text.ok()) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("job") || !j["job"].is_string() || !j.contains("submission") ||
      !j["submission"].is_string() || j["job"].get<std::string>().empty()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not an owner record ({\"job\": ..., \"submission\": ...})"));
  }
  return std::optional<StoreOwner>(
      StoreOwner{j["job"].get<std::string>(), j["submission"].get<std::string>()});
}

absl::Status WriteStoreOwner(const std::string& root, const StoreOwner& owner, FileSystem* fs) {
  const nlohmann::json j = {{"job", owner.job}, {"submission", owner.submission}};
  return fs->WriteFileAtomically(JoinPath(root, kOwnerFileName),
                                 j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace trainsup::ckpt

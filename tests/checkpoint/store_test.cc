// The torch-free checkpoint core: layout, atomic commit, verification,
// quarantine, retention, and faults injected through the file system.
#include "checkpoint/store.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "checkpoint/manifest.h"
#include "tests/checkpoint/fault_injection_fs.h"

namespace trainsup::ckpt {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainsup_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/checkpoints";
  }
  void TearDown() override { FileSystem::Default()->DeleteTree(dir_).IgnoreError(); }

  // Saves checkpoint `step` with two files whose contents depend on it.
  absl::Status Save(CheckpointStore& store, int64_t step) {
    auto p = store.Begin(step);
    if (!p.ok()) return p.status();
    absl::Status s = (*p)->WriteFile("weights.bin",
                                     std::string(1000 + step, static_cast<char>('a' + step % 26)));
    if (s.ok()) s = (*p)->WriteFile("trainer.json", "{\"step\": " + std::to_string(step) + "}");
    if (!s.ok()) {
      store.Abort(std::move(*p));
      return s;
    }
    return store.Commit(std::move(*p));
  }

  std::string Path(int64_t step, const std::string& file = "") {
    std::string p = root_ + "/step-" + std::to_string(step);
    return file.empty() ? p : p + "/" + file;
  }

  static void Overwrite(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  }

  int64_t Latest(CheckpointStore& store, std::vector<QuarantineReport>* q = nullptr) {
    auto c = store.ChooseLatest(q);
    return c.ok() ? c->step : -1;
  }

  std::string dir_, root_;
};

TEST_F(StoreTest, CommitWritesTheLayoutAndAManifestThatVerifies) {
  CheckpointStore store(root_);
  ASSERT_TRUE(Save(store, 7).ok());
  EXPECT_TRUE(FileSystem::Default()->IsDir(Path(7)));
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(7) + ".tmp"));
  auto m = store.ReadManifest({7, Path(7)});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format_version, kFormatVersion);
  EXPECT_EQ(m->step, 7);
  ASSERT_EQ(m->files.size(), 2u);
  EXPECT_EQ(m->files[0].name, "weights.bin");
  EXPECT_EQ(m->files[0].size, 1007u);
  EXPECT_EQ(m->files[0].xxh3_128.size(), 32u);
  EXPECT_TRUE(store.Verify({7, Path(7)}).ok());
  EXPECT_EQ(Latest(store), 7);
}

TEST_F(StoreTest, RetentionKeepsTheNewestAndEveryMth) {
  CheckpointStore store(root_, FileSystem::Default(), {/*keep_last=*/3, /*keep_every=*/4});
  for (int64_t step = 1; step <= 9; ++step) ASSERT_TRUE(Save(store, step).ok());
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  std::vector<int64_t> steps;
  for (const auto& c : *list) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 7, 8, 9}));
  // The rest was renamed out of sight at once and deleted in the background.
  store.WaitForDeletions();
  auto names = FileSystem::Default()->ListDir(root_);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"step-4", "step-7", "step-8", "step-9"}));
  CheckpointStore plain(root_ + "2");
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(Save(plain, step).ok());
  EXPECT_EQ(plain.List()->size(), 3u);
}

struct Damage {
  const char* name;
  std::function<void(StoreTest*, const std::string& dir)> apply;
  const char* reason;  // part of the quarantine reason
};

TEST_F(StoreTest, DamagedCheckpointsAreQuarantinedAndThePreviousOneChosen) {
  const Damage damages[] = {
      {"truncated file",
       [](StoreTest*, const std::string& d) { truncate((d + "/weights.bin").c_str(), 10); },
       "has 10 bytes"},
      {"flipped byte",
       [](StoreTest*, const std::string& d) {
         std::fstream f(d + "/weights.bin", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(500);
         f.put('#');
       },
       "does not match its hash"},
      {"missing file",
       [](StoreTest*, const std::string& d) { unlink((d + "/trainer.json").c_str()); },
       "missing file 'trainer.json'"},
      {"extra file", [](StoreTest*, const std::string& d) { Overwrite(d + "/stray.bin", "x"); },
       "extra file 'stray.bin'"},
      {"other format version",
       [](StoreTest*, const std::string& d) {
         auto text = FileSystem::Default()->ReadSmallFile(d + "/MANIFEST.json");
         std::string t = *text;
         t.replace(t.find("\"format_version\": 1"), 19, "\"format_version\": 2");
         Overwrite(d + "/MANIFEST.json", t);
       },
       "format version 2"},
      {"manifest lies about a size",
       [](StoreTest*, const std::string& d) {
         auto text = FileSystem::Default()->ReadSmallFile(d + "/MANIFEST.json");
         std::string t = *text;
         t.replace(t.find("\"size\": 1012"), 12, "\"size\": 1013");
         Overwrite(d + "/MANIFEST.json", t);
       },
       "the manifest says 1013"},
      {"garbage manifest",
       [](StoreTest*, const std::string& d) { Overwrite(d + "/MANIFEST.json", "{oops"); },
       "not a JSON object"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    FileSystem::Default()->DeleteTree(root_).IgnoreError();
    CheckpointStore store(root_);
    ASSERT_TRUE(Save(store, 11).ok());
    ASSERT_TRUE(Save(store, 12).ok());
    damage.apply(this, Path(12));
    std::vector<QuarantineReport> q;
    EXPECT_EQ(Latest(store, &q), 11);
    ASSERT_EQ(q.size(), 1u);
    EXPECT_EQ(q[0].step, 12);
    EXPECT_NE(q[0].reason.find(damage.reason), std::string::npos) << q[0].reason;
    // Moved aside with the reason, not deleted, and no longer listed.
    EXPECT_TRUE(FileSystem::Default()->Exists(q[0].moved_to + "/QUARANTINE.txt"));
    EXPECT_TRUE(FileSystem::Default()->Exists(q[0].moved_to + "/weights.bin") ||
                std::string(damage.name) == "missing file");
    EXPECT_FALSE(FileSystem::Default()->Exists(Path(12)));
    EXPECT_EQ(store.List()->size(), 1u);
  }
}

// Issue 42, 12: the quarantine keeps the newest `keep` entries and every
// entry younger than min_age_s; older ones beyond those go, and entries of
// another name are left alone.
TEST_F(StoreTest, TheQuarantineKeepsTheNewestAndTheYoungAndDropsTheRest) {
  CheckpointStore store(root_);
  const std::string q = root_ + "/quarantine";
  ASSERT_TRUE(FileSystem::Default()->CreateDirs(q).ok());
  for (const char* name : {"step-1.100", "step-2.200", "step-3.300", "step-3.300.1", "step-4.900",
                           "step-5.950", "notes", "step-x.100"}) {
    ASSERT_TRUE(FileSystem::Default()->CreateDirs(q + "/" + name).ok()) << name;
  }
  // At 1000 with keep 2, min age 75: the newest two are step-5.950 and
  // step-4.900; step-4.900 and below are older than 75 s, so beyond the
  // newest two every old one goes: step-3.300.1, step-3.300, step-2.200,
  // step-1.100.
  QuarantineRetention r;
  r.keep = 2;
  r.min_age_s = 75;
  absl::StatusOr<std::vector<std::string>> deleted = store.PruneQuarantine(r, 1000);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted,
            (std::vector<std::string>{"step-3.300.1", "step-3.300", "step-2.200", "step-1.100"}));
  auto left = FileSystem::Default()->ListDir(q);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, (std::vector<std::string>{"notes", "step-4.900", "step-5.950", "step-x.100"}));
  // Young entries stay beyond `keep`.
  r.keep = 0;
  r.min_age_s = 200;
  deleted = store.PruneQuarantine(r, 1000);
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(deleted->empty()) << "both are younger than 200 s";
  deleted = store.PruneQuarantine(r, 1200);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, (std::vector<std::string>{"step-5.950", "step-4.900"}));
  // A store without a quarantine prunes nothing.
  CheckpointStore empty(dir_ + "/none");
  EXPECT_TRUE(empty.PruneQuarantine(r, 1000)->empty());
}

TEST_F(StoreTest, NoCheckpointThatVerifiesIsNotFound) {
  CheckpointStore store(root_);
  EXPECT_EQ(store.ChooseLatest(nullptr).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Save(store, 1).ok());
  unlink(Path(1, "weights.bin").c_str());
  std::vector<QuarantineReport> q;
  EXPECT_EQ(store.ChooseLatest(&q).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(q.size(), 1u);
}

// A read that fails for a reason other than the content (descriptors used
// up, an I/O error, no memory) is no verdict on the checkpoint: Verify and
// ChooseLatest return Unavailable naming the file and the error, nothing is
// quarantined, no older checkpoint is chosen instead, and the same one is
// chosen once the error is gone.
TEST_F(StoreTest, ReadErrorsWhileVerifyingQuarantineNothing) {
  using Fs = testing::FaultInjectionFileSystem;
  struct Fault {
    const char* name;
    int err;
    const char* file;  // under step-12 ("" for the directory itself)
    int ops;
    const char* says;  // part of the error message
  };
  const Fault faults[] = {
      {"manifest open, EMFILE", EMFILE, "MANIFEST.json", Fs::kReadFile,
       "Too many open files (EMFILE)"},
      {"manifest read, EIO", EIO, "MANIFEST.json", Fs::kReadFile, "Input/output error (EIO)"},
      {"data read, EIO", EIO, "weights.bin", Fs::kReadFile, "Input/output error (EIO)"},
      {"data read, ENOMEM", ENOMEM, "weights.bin", Fs::kReadFile,
       "Cannot allocate memory (ENOMEM)"},
      {"data open, EMFILE", EMFILE, "trainer.json", Fs::kReadFile, "Too many open files (EMFILE)"},
      {"data stat, EIO", EIO, "weights.bin", Fs::kFileSize, "Input/output error (EIO)"},
      {"listing, EMFILE", EMFILE, "", Fs::kListDir, "Too many open files (EMFILE)"},
      {"listing, ENOMEM", ENOMEM, "", Fs::kListDir, "Cannot allocate memory (ENOMEM)"},
  };
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.name);
    FileSystem::Default()->DeleteTree(root_).IgnoreError();
    Fs fs;
    CheckpointStore store(root_, &fs);
    ASSERT_TRUE(Save(store, 11).ok());
    ASSERT_TRUE(Save(store, 12).ok());
    const std::string target = *f.file ? Path(12, f.file) : Path(12);
    fs.read_errno = f.err;
    fs.read_fault_path = *f.file ? std::string("step-12/") + f.file : "step-12";
    fs.read_fault_ops = f.ops;

    absl::Status v = store.Verify({12, Path(12)});
    EXPECT_EQ(v.code(), absl::StatusCode::kUnavailable) << v;
    EXPECT_NE(std::string(v.message()).find(target), std::string::npos) << v;
    EXPECT_NE(std::string(v.message()).find(f.says), std::string::npos) << v;

    std::vector<QuarantineReport> q;
    absl::StatusOr<CheckpointInfo> chosen = store.ChooseLatest(&q);
    EXPECT_EQ(chosen.status().code(), absl::StatusCode::kUnavailable) << chosen.status();
    EXPECT_NE(std::string(chosen.status().message()).find(target), std::string::npos)
        << chosen.status();
    EXPECT_TRUE(q.empty()) << q[0].reason;
    EXPECT_GT(fs.read_faults, 0);
    EXPECT_TRUE(FileSystem::Default()->IsDir(Path(12)));
    EXPECT_FALSE(FileSystem::Default()->Exists(root_ + "/quarantine"));

    fs.read_errno = 0;
    EXPECT_EQ(Latest(store, &q), 12);
    EXPECT_TRUE(q.empty());
  }
}

// Content errors of newer checkpoints are still quarantined on the way
// down; an I/O error on the next one stops the walk there.
TEST_F(StoreTest, ReadErrorBelowACorruptCheckpointStopsTheWalk) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 11).ok());
  ASSERT_TRUE(Save(store, 12).ok());
  ASSERT_TRUE(Save(store, 13).ok());
  truncate(Path(13, "weights.bin").c_str(), 10);
  fs.read_errno = EIO;
  fs.read_fault_path = "step-12/weights.bin";
  std::vector<QuarantineReport> q;
  absl::StatusOr<CheckpointInfo> chosen = store.ChooseLatest(&q);
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kUnavailable) << chosen.status();
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].step, 13);
  EXPECT_TRUE(FileSystem::Default()->IsDir(Path(12)));
  EXPECT_TRUE(FileSystem::Default()->IsDir(Path(11)));
  fs.read_errno = 0;
  EXPECT_EQ(Latest(store), 12);
}

// Listing the checkpoints directory itself fails: Unavailable, not "none".
TEST_F(StoreTest, UnlistableRootIsUnavailableNotEmpty) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 5).ok());
  fs.read_errno = EMFILE;
  fs.read_fault_path = "/checkpoints";
  fs.read_fault_ops = testing::FaultInjectionFileSystem::kListDir;
  absl::StatusOr<CheckpointInfo> chosen = store.ChooseLatest(nullptr);
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kUnavailable) << chosen.status();
  EXPECT_NE(std::string(chosen.status().message()).find(root_), std::string::npos)
      << chosen.status();
  fs.read_errno = 0;
  EXPECT_EQ(Latest(store), 5);
}

TEST_F(StoreTest, CrashBetweenWritingAndRenamingLeavesThePreviousCheckpoint) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 5).ok());
  fs.crash_before_rename = true;
  EXPECT_FALSE(Save(store, 6).ok());
  EXPECT_TRUE(FileSystem::Default()->IsDir(Path(6) + ".tmp"));  // the leftover
  fs.crash_before_rename = false;
  // A restarted process: the leftover is invisible, then cleaned by the next save.
  CheckpointStore restarted(root_, &fs);
  EXPECT_EQ(Latest(restarted), 5);
  ASSERT_TRUE(Save(restarted, 7).ok());
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(6) + ".tmp"));
  EXPECT_EQ(Latest(restarted), 7);
}

TEST_F(StoreTest, DiskFullDuringASaveIsAStatusAndKeepsThePreviousCheckpoint) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 1).ok());
  fs.space_left = 500;
  absl::Status s = Save(store, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(std::string(s.message()).find("No space left"), std::string::npos) << s;
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(2)));
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(2) + ".tmp"));
  fs.space_left = -1;
  EXPECT_EQ(Latest(store), 1);
  EXPECT_TRUE(store.Verify({1, Path(1)}).ok());
}

TEST_F(StoreTest, ShortWriteIsAnErrorNotASilentTruncation) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 1).ok());
  fs.appends = 0;
  fs.short_write_at = 1;
  EXPECT_FALSE(Save(store, 2).ok());
  fs.short_write_at = 0;
  EXPECT_EQ(Latest(store), 1);
}

TEST_F(StoreTest, FailedFsyncKeepsThePreviousCheckpoint) {
  for (int at : {1, 2, 3, 4}) {  // a file, the manifest, the directory
    SCOPED_TRACE("fsync " + std::to_string(at));
    FileSystem::Default()->DeleteTree(root_).IgnoreError();
    testing::FaultInjectionFileSystem fs;
    CheckpointStore store(root_, &fs);
    ASSERT_TRUE(Save(store, 1).ok());
    fs.syncs = 0;
    fs.fail_sync_at = at;
    absl::Status s = Save(store, 2);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("fsync"), std::string::npos) << s;
    fs.fail_sync_at = 0;
    EXPECT_EQ(Latest(store), 1);
    EXPECT_FALSE(FileSystem::Default()->Exists(Path(2)));
  }
}

TEST_F(StoreTest, SavingTheSameStepAgainReplacesIt) {
  CheckpointStore store(root_);
  ASSERT_TRUE(Save(store, 3).ok());
  ASSERT_TRUE(Save(store, 3).ok());
  EXPECT_EQ(store.List()->size(), 1u);
  EXPECT_TRUE(store.Verify({3, Path(3)}).ok());
}

TEST_F(StoreTest, ACrashWhileReplacingAStepKeepsTheOldCopy) {
  testing::FaultInjectionFileSystem fs;
  CheckpointStore store(root_, &fs);
  ASSERT_TRUE(Save(store, 4).ok());
  fs.crash_before_rename = true;  // the old copy steps aside, then the process dies
  EXPECT_FALSE(Save(store, 4).ok());
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(4)));
  fs.crash_before_rename = false;
  CheckpointStore restarted(root_, &fs);
  EXPECT_EQ(Latest(restarted), 4);
  EXPECT_TRUE(restarted.Verify({4, Path(4)}).ok());
  ASSERT_TRUE(Save(restarted, 5).ok());
  restarted.WaitForDeletions();
  EXPECT_EQ(*FileSystem::Default()->ListDir(root_), (std::vector<std::string>{"step-4", "step-5"}));
}

// A guard's bad step at 5: the newest checkpoint before it (step-4) is a
// rollback's target and outlives keep_last while the guard counts step 5.
TEST_F(StoreTest, RetentionKeepsTheNewestCheckpointBeforeKeepBefore) {
  CheckpointStore store(root_, FileSystem::Default(), {/*keep_last=*/2, 0});
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(Save(store, step).ok());
  store.set_keep_before(5);
  for (int64_t step = 5; step <= 8; ++step) ASSERT_TRUE(Save(store, step).ok());
  auto steps = [&] {
    std::vector<int64_t> out;
    const absl::StatusOr<std::vector<CheckpointInfo>> list = store.List();
    for (const auto& c : *list) out.push_back(c.step);
    return out;
  };
  EXPECT_EQ(steps(), (std::vector<int64_t>{4, 7, 8}));
  store.set_keep_before(-1);
  ASSERT_TRUE(Save(store, 9).ok());
  EXPECT_EQ(steps(), (std::vector<int64_t>{8, 9}));
}

TEST_F(StoreTest, RetentionNeverDeletesTheCheckpointJustCommitted) {
  CheckpointStore store(root_, FileSystem::Default(), {/*keep_last=*/2, 0});
  ASSERT_TRUE(Save(store, 100).ok());
  ASSERT_TRUE(Save(store, 200).ok());
  // A run restarted from scratch saves lower steps than the ones on disk.
  ASSERT_TRUE(Save(store, 10).ok());
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  bool has10 = false;
  for (const auto& c : *list) has10 = has10 || c.step == 10;
  EXPECT_TRUE(has10);
}

TEST_F(StoreTest, BadFileNamesAreRejected) {
  CheckpointStore store(root_);
  auto p = store.Begin(1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->WriteFile("../escape", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*p)->WriteFile("MANIFEST.json", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Commit(std::move(*p)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(FileSystem::Default()->Exists(Path(1)));
}

TEST(StepDirName, ParsesOnlyStepDirectories) {
  EXPECT_EQ(ParseStepDirName("step-0"), 0);
  EXPECT_EQ(ParseStepDirName("step-12345"), 12345);
  EXPECT_EQ(ParseStepDirName("step-12.tmp"), -1);
  EXPECT_EQ(ParseStepDirName("step--1"), -1);
  EXPECT_EQ(ParseStepDirName("quarantine"), -1);
  EXPECT_EQ(StepDirName(42), "step-42");
}

TEST(Manifest, RoundTripsAndRejectsMalformedJson) {
  Manifest m;
  m.step = 9;
  m.created = "2026-11-29T00:00:00Z";
  m.files.push_back({"a.bin", 3, std::string(32, 'f')});
  auto back = Manifest::FromJson(m.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 9);
  EXPECT_EQ(back->files[0].name, "a.bin");
  EXPECT_FALSE(Manifest::FromJson("[]").ok());
  EXPECT_FALSE(
      Manifest::FromJson(R"({"format": "trainsup-checkpoint", "format_version": 1})").ok());
  std::string bad = m.ToJson();
  bad.replace(bad.find("a.bin"), 5, "../..");
  EXPECT_FALSE(Manifest::FromJson(bad).ok());
}

TEST(Hasher, IsXxh3OfTheBytesWhateverThePieces) {
  Hasher one, two;
  one.Update("hello world");
  two.Update("hello ");
  two.Update("world");
  EXPECT_EQ(one.HexDigest(), two.HexDigest());
  Hasher other;
  other.Update("hello worle");
  EXPECT_NE(one.HexDigest(), other.HexDigest());
}

}  // namespace
}  // namespace trainsup::ckpt

// The state store's schema and files: older versions migrated, a newer
// one refused, other programs' databases and non-databases refused, file
// mode and journal mode.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "supervisor/store/state_store.h"
#include "tests/supervisor/store/state_store_test_util.h"

namespace trainsup::supervisor {
namespace {

TEST_F(StateStoreTest, VersionTwoStoreIsMigrated) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("two"), "").ok());
    v1::Attempt a;
    a.set_number(1);
    a.set_stop_requested(true);
    ASSERT_TRUE(store->UpsertAttempt("two", a).ok());
  }
  ASSERT_EQ(RawSql("ALTER TABLE attempts DROP COLUMN generation;"
                   " ALTER TABLE runs DROP COLUMN cluster_submission;"
                   " ALTER TABLE runs DROP COLUMN rollbacks;"
                   " ALTER TABLE runs DROP COLUMN skip_windows;"
                   " ALTER TABLE attempts DROP COLUMN world_size; DROP TABLE drains;"
                   " ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 2 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "2");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
  absl::StatusOr<v1::Run> run = (*store)->GetRun("two");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->attempts_size(), 1);
  EXPECT_TRUE(run->attempts(0).stop_requested());
  EXPECT_EQ(run->attempts(0).generation(), 0);
  v1::Attempt a = run->attempts(0);
  a.set_generation(7);
  ASSERT_TRUE((*store)->UpsertAttempt("two", a).ok());
  EXPECT_EQ((*store)->GetRun("two")->attempts(0).generation(), 7);
}

// A version-3 store (no runs.cluster_submission) opens, keeps its runs
// (none of them in a submission) and is migrated; the column then round-trips.
TEST_F(StateStoreTest, VersionThreeStoreIsMigrated) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("three"), "").ok());
  }
  ASSERT_EQ(RawSql("ALTER TABLE runs DROP COLUMN cluster_submission;"
                   " ALTER TABLE runs DROP COLUMN rollbacks;"
                   " ALTER TABLE runs DROP COLUMN skip_windows;"
                   " ALTER TABLE attempts DROP COLUMN world_size; DROP TABLE drains;"
                   " ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 3 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "3");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
  absl::StatusOr<v1::Run> run = (*store)->GetRun("three");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->cluster_submission(), "");
  run->set_cluster_submission("5f0c1a2b");
  ASSERT_TRUE((*store)->UpdateRun(*run).ok());
  EXPECT_EQ((*store)->GetRun("three")->cluster_submission(), "5f0c1a2b");
}

// A version-1 store (no attempts.stop_requested) opens, keeps its rows and
// is migrated to the current version.
// 4 -> 5: a run's rollbacks and skip windows (docs/guard.md) start empty
// and are stored from then on.
TEST_F(StateStoreTest, VersionFourStoreIsMigrated) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("four"), "").ok());
  }
  ASSERT_EQ(RawSql("ALTER TABLE runs DROP COLUMN rollbacks;"
                   " ALTER TABLE runs DROP COLUMN skip_windows;"
                   " ALTER TABLE attempts DROP COLUMN world_size; DROP TABLE drains;"
                   " ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 4 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "4");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
  absl::StatusOr<v1::Run> run = (*store)->GetRun("four");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->rollbacks(), 0);
  EXPECT_EQ(run->skip_windows_size(), 0);
  run->set_rollbacks(2);
  v1::SkipWindow* w = run->add_skip_windows();
  w->set_first_step(37);
  w->set_last_step(56);
  w->set_attempt(2);
  w->set_resumed_from_step(30);
  w->set_reason("step 37: loss nan");
  ASSERT_TRUE((*store)->UpdateRun(*run).ok());
  store->reset();
  store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<v1::Run> back = (*store)->GetRun("four");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rollbacks(), 2);
  ASSERT_EQ(back->skip_windows_size(), 1);
  EXPECT_EQ(back->skip_windows(0).first_step(), 37);
  EXPECT_EQ(back->skip_windows(0).last_step(), 56);
  EXPECT_EQ(back->skip_windows(0).attempt(), 2);
  EXPECT_EQ(back->skip_windows(0).resumed_from_step(), 30);
  EXPECT_EQ(back->skip_windows(0).reason(), "step 37: loss nan");
  // ListRuns carries them too.
  absl::StatusOr<RunPage> list = (*store)->ListRuns({}, 10, "");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->runs.size(), 1u);
  EXPECT_EQ(list->runs[0].rollbacks(), 2);
}

TEST_F(StateStoreTest, VersionOneStoreIsMigrated) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    v1::Run run = MakeRun("old");
    ASSERT_TRUE(store->CreateRun(run, "").ok());
    v1::Attempt a;
    a.set_number(1);
    a.set_ended_ms(5);
    a.set_exit_class(v1::EXIT_CLASS_STOPPED);
    ASSERT_TRUE(store->UpsertAttempt("old", a).ok());
  }
  // Back to what version 1 wrote.
  ASSERT_EQ(RawSql("ALTER TABLE attempts DROP COLUMN stop_requested;"
                   " ALTER TABLE attempts DROP COLUMN generation;"
                   " ALTER TABLE runs DROP COLUMN cluster_submission;"
                   " ALTER TABLE runs DROP COLUMN rollbacks;"
                   " ALTER TABLE runs DROP COLUMN skip_windows;"
                   " ALTER TABLE attempts DROP COLUMN world_size; DROP TABLE drains;"
                   " ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 1 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "1");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
  absl::StatusOr<v1::Run> run = (*store)->GetRun("old");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->attempts_size(), 1);
  EXPECT_FALSE(run->attempts(0).stop_requested());
  EXPECT_EQ(run->attempts(0).exit_class(), v1::EXIT_CLASS_STOPPED);
  v1::Attempt a = run->attempts(0);
  a.set_stop_requested(true);
  ASSERT_TRUE((*store)->UpsertAttempt("old", a).ok());
  EXPECT_TRUE((*store)->GetRun("old")->attempts(0).stop_requested());
}

TEST_F(StateStoreTest, NewerSchemaIsRefusedAndLeftAlone) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
  }
  const std::string newer = absl::StrCat(StateStore::kSchemaVersion + 1);
  ASSERT_EQ(RawSql("UPDATE meta SET value = " + newer +
                   " WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            newer);
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"), newer);
}

TEST_F(StateStoreTest, AnotherProgramsDatabaseIsRefused) {
  ASSERT_EQ(RawSql("CREATE TABLE things (x); SELECT 'ok'"), "ok");
  EXPECT_EQ(StateStore::Open(path_).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RawSql("SELECT count(*) FROM sqlite_master WHERE name = 'runs'"), "0");
}

TEST_F(StateStoreTest, AFileThatIsNotADatabaseIsDataLoss) {
  std::ofstream(path_) << std::string(8192, 'x');
  EXPECT_EQ(StateStore::Open(path_).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(StateStoreTest, AMissingDirectoryIsNotFound) {
  EXPECT_EQ(StateStore::Open(dir_ + "/no/such/dir/state.db").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StateStoreTest, FilesArePrivateWhateverTheUmask) {
  const mode_t old_umask = umask(0);
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
    EXPECT_EQ(Mode(path_), 0600);
    EXPECT_EQ(Mode(path_ + "-wal"), 0600);
  }
  umask(old_umask);
  // A file someone opened up is made private again.
  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(Mode(path_), 0600);
}

TEST_F(StateStoreTest, JournalModeIsWal) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
  }
  EXPECT_EQ(RawSql("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
}
// 5 -> 6: an attempt's world size (0 for attempts of before elastic gangs)
// and the operators' drains, stored and listed by slot.
TEST_F(StateStoreTest, VersionFiveStoreIsMigratedAndKeepsDrains) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("five"), "").ok());
    v1::Attempt a;
    a.set_number(1);
    ASSERT_TRUE(store->UpsertAttempt("five", a).ok());
  }
  ASSERT_EQ(RawSql("ALTER TABLE attempts DROP COLUMN world_size; DROP TABLE drains;"
                   " ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 5 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "5");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"),
            absl::StrCat(StateStore::kSchemaVersion));
  absl::StatusOr<v1::Run> run = (*store)->GetRun("five");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->attempts_size(), 1);
  EXPECT_EQ(run->attempts(0).world_size(), 0);
  v1::Attempt a = run->attempts(0);
  a.set_number(2);
  a.set_world_size(3);
  ASSERT_TRUE((*store)->UpsertAttempt("five", a).ok());
  EXPECT_EQ((*store)->GetRun("five")->attempts(1).world_size(), 3);

  ASSERT_TRUE((*store)->SetDrain({"GPU-7f3a", "fan noise", 1000}).ok());
  ASSERT_TRUE((*store)->SetDrain({"cpu:2", "bios update", 2000}).ok());
  ASSERT_TRUE((*store)->SetDrain({"cpu:2", "bios update, again", 3000}).ok());
  store->reset();
  store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<StoredDrain>> drains = (*store)->ListDrains();
  ASSERT_TRUE(drains.ok()) << drains.status();
  ASSERT_EQ(drains->size(), 2u);
  EXPECT_EQ((*drains)[0].slot, "GPU-7f3a");
  EXPECT_EQ((*drains)[1].slot, "cpu:2");
  EXPECT_EQ((*drains)[1].reason, "bios update, again");
  EXPECT_EQ((*drains)[1].drained_ms, 3000);
  ASSERT_TRUE((*store)->ClearDrain("cpu:2").ok());
  ASSERT_TRUE((*store)->ClearDrain("cpu:9").ok()) << "clearing what is not drained is no error";
  drains = (*store)->ListDrains();
  ASSERT_TRUE(drains.ok());
  ASSERT_EQ(drains->size(), 1u);
  EXPECT_EQ((*drains)[0].slot, "GPU-7f3a");
}

}  // namespace
// 6 -> 7: a run's requested stop (issue 42): none after the migration, and
// stored, read back and cleared by UpdateRun.
TEST_F(StateStoreTest, VersionSixStoreIsMigratedAndKeepsARequestedStop) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("six"), "").ok());
  }
  ASSERT_EQ(RawSql("ALTER TABLE runs DROP COLUMN stop_request;"
                   " UPDATE meta SET value = 6 WHERE key = 'schema_version';"
                   " SELECT value FROM meta WHERE key = 'schema_version'"),
            "6");
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawSql("SELECT value FROM meta WHERE key = 'schema_version'"), "7");
  absl::StatusOr<v1::Run> run = (*store)->GetRun("six");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->has_stop_request());
  run->mutable_stop_request()->set_kind(v1::StopRequest::KIND_CANCEL);
  run->mutable_stop_request()->set_reason("cancelled: enough");
  run->mutable_stop_request()->set_attempt(3);
  ASSERT_TRUE((*store)->UpdateRun(*run).ok());
  store->reset();
  store = StateStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  run = (*store)->GetRun("six");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(run->has_stop_request());
  EXPECT_EQ(run->stop_request().kind(), v1::StopRequest::KIND_CANCEL);
  EXPECT_EQ(run->stop_request().reason(), "cancelled: enough");
  EXPECT_EQ(run->stop_request().attempt(), 3);
  run->clear_stop_request();
  ASSERT_TRUE((*store)->UpdateRun(*run).ok());
  EXPECT_FALSE((*store)->GetRun("six")->has_stop_request());
}

}  // namespace trainsup::supervisor

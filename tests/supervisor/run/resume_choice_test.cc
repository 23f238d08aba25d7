// Which checkpoint an attempt resumes from, on real files: the newest of the
// run's one store that verifies, whatever the world size.
#include "supervisor/run/resume_choice.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/file_system.h"
#include "checkpoint/store.h"
#include "contracts/run_layout.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

void Commit(ckpt::CheckpointStore& store, int64_t step) {
  auto pending = store.Begin(step);
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_TRUE(
      (*pending)->WriteFile("state.json", "{\"step\": " + std::to_string(step) + "}\n").ok());
  ASSERT_TRUE(store.Commit(std::move(*pending)).ok());
}

TEST(ChooseResume, NoCheckpointsIsFromScratch) {
  trainsup::testing::TempDir dir("resume_choice_test");
  const ResumeChoice c = ChooseResume(dir.path());
  EXPECT_EQ(c.step, -1);
  EXPECT_TRUE(c.dir.empty());
  EXPECT_TRUE(c.notes.empty());
  EXPECT_TRUE(c.error.ok()) << c.error;
}

// The per-rank stores of the layout before issue 12 are not read.
TEST(ChooseResume, AnOldPerRankStoreIsIgnored) {
  trainsup::testing::TempDir dir("resume_choice_test");
  ckpt::CheckpointStore old(RunLayout(dir.path()).CheckpointsDir() + "/rank-0");
  Commit(old, 20);
  const ResumeChoice c = ChooseResume(dir.path());
  EXPECT_TRUE(c.error.ok()) << c.error;
  EXPECT_EQ(c.step, -1);
  EXPECT_TRUE(c.notes.empty());
}

// The store rank 0 wrote is the one every rank resumes from; a corrupt
// newest checkpoint is quarantined, reported, and the one before chosen.
TEST(ChooseResume, TheNewestVerifiedCheckpointOfTheOneStoreQuarantiningCorruptOnes) {
  trainsup::testing::TempDir dir("resume_choice_test");
  const std::string root = RunLayout(dir.path()).CheckpointRoot(0, 2);
  ASSERT_EQ(root, RunLayout(dir.path()).CheckpointsDir());
  ckpt::CheckpointStore store(root, ckpt::FileSystem::Default(), ckpt::StoreOptions{5});
  Commit(store, 5);
  Commit(store, 10);
  ResumeChoice c = ChooseResume(dir.path());
  EXPECT_EQ(c.step, 10);
  EXPECT_EQ(c.dir, root + "/step-10");
  EXPECT_TRUE(c.notes.empty());

  {
    std::fstream f(root + "/step-10/state.json", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('[');
  }
  c = ChooseResume(dir.path());
  EXPECT_TRUE(c.error.ok()) << c.error;
  EXPECT_EQ(c.step, 5);
  EXPECT_EQ(c.dir, root + "/step-5");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("checkpoint step 10 quarantined"), std::string::npos) << c.notes[0];
  auto left = store.List();
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ(left->front().step, 5);
}

}  // namespace
}  // namespace trainsup::supervisor

namespace trainsup::supervisor {
namespace {

// A rollback past step 40 (docs/guard.md): the newest checkpoint below 40 is
// chosen, and the diverged timeline's 40 and 50 are moved aside, so that a
// later attempt's plain choice cannot resume from them.
TEST(ChooseResume, ARollbackResumesBelowItsStepAndMovesTheNewerCheckpointsAside) {
  trainsup::testing::TempDir dir("resume_choice_test");
  ckpt::CheckpointStore store(RunLayout(dir.path()).CheckpointsDir(), ckpt::FileSystem::Default(),
                              ckpt::StoreOptions{5});
  for (int64_t step : {20, 30, 40, 50}) Commit(store, step);
  ResumeChoice c = ChooseResume(dir.path(), 40);
  EXPECT_TRUE(c.error.ok()) << c.error;
  EXPECT_EQ(c.step, 30);
  ASSERT_EQ(c.notes.size(), 2u);
  EXPECT_NE(c.notes[0].find("superseded: the run rolled back past step 40"), std::string::npos)
      << c.notes[0];
  c = ChooseResume(dir.path());
  EXPECT_EQ(c.step, 30);
  // Nothing below the step: from scratch, the newer ones aside.
  c = ChooseResume(dir.path(), 20);
  EXPECT_TRUE(c.error.ok()) << c.error;
  EXPECT_EQ(c.step, -1);
}

// Issue 42, 12: rollbacks fill the quarantine; the choice prunes it to the
// retention, saying what it deleted.
TEST(ChooseResume, TheQuarantineIsPrunedToItsRetention) {
  trainsup::testing::TempDir dir("resume_choice_test");
  ckpt::CheckpointStore store(RunLayout(dir.path()).CheckpointsDir(), ckpt::FileSystem::Default(),
                              ckpt::StoreOptions{10});
  for (int64_t step : {10, 20, 30, 40}) Commit(store, step);
  const ckpt::QuarantineRetention keep_all{100, 0};
  ResumeChoice c = ChooseResume(dir.path(), 20, keep_all);  // 20, 30, 40 aside
  EXPECT_EQ(c.step, 10);
  const std::string q = RunLayout(dir.path()).CheckpointsDir() + "/quarantine";
  ASSERT_EQ(ckpt::FileSystem::Default()->ListDir(q)->size(), 3u);
  c = ChooseResume(dir.path(), -1, ckpt::QuarantineRetention{1, 0});
  EXPECT_EQ(c.step, 10);
  EXPECT_EQ(ckpt::FileSystem::Default()->ListDir(q)->size(), 1u);
  int deleted = 0;
  for (const std::string& note : c.notes) {
    deleted += note.find("deleted: beyond the newest 1") != std::string::npos;
  }
  EXPECT_EQ(deleted, 2) << ::testing::PrintToString(c.notes);
  // Young entries stay whatever their number.
  for (int64_t step : {50, 60}) Commit(store, step);
  c = ChooseResume(dir.path(), 50, ckpt::QuarantineRetention{0, 3600});
  EXPECT_EQ(ckpt::FileSystem::Default()->ListDir(q)->size(), 3u);
}

}  // namespace
}  // namespace trainsup::supervisor

namespace trainsup::supervisor {
namespace {

// Issue 42, 14: a multi-node job's shared store replaced by a symbolic link
// after the submit is refused at the next attempt, and the run fails
// rather than write through the link.
TEST(ChooseResumeShared, ACheckpointDirThatIsALinkIsRefused) {
  trainsup::testing::TempDir dir("resume_choice_shared");
  const std::string run_dir = dir.path() + "/run";
  const std::string elsewhere = dir.path() + "/elsewhere";
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(run_dir);
  std::filesystem::create_directories(elsewhere);
  ResumeChoice c = ChooseResumeShared(run_dir, shared);
  EXPECT_TRUE(c.error.ok()) << c.error;
  std::filesystem::remove_all(shared);
  std::filesystem::create_directory_symlink(elsewhere, shared);
  c = ChooseResumeShared(run_dir, shared);
  EXPECT_EQ(c.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c.fatal);
  EXPECT_NE(std::string(c.error.message()).find("is a symbolic link: refused"), std::string::npos)
      << c.error;
}

}  // namespace
}  // namespace trainsup::supervisor

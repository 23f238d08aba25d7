// The supervisor's state store on real files in a temporary directory:
// round trips, idempotency, paging, event numbering, transactions,
// persistence across reopen and process exit, schema versioning, file mode
// and journal mode.
#include "supervisor/store/state_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/supervisor/store/state_store_test_util.h"

namespace trainsup::supervisor {
namespace {

using ::google::protobuf::util::MessageDifferencer;

TEST_F(StateStoreTest, CreateThenGetReturnsEveryStoredField) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  v1::Run run = MakeRun("r1", v1::RUN_STATE_RUNNING);
  run.add_attempts()->set_number(9);     // ignored by CreateRun
  run.add_checkpoints()->set_step(100);  // never stored
  ASSERT_TRUE(store->CreateRun(run, "").ok());

  absl::StatusOr<v1::Run> got = store->GetRun("r1");
  ASSERT_TRUE(got.ok()) << got.status();
  v1::Run expected = run;
  expected.clear_attempts();
  expected.clear_checkpoints();
  EXPECT_TRUE(MessageDifferencer::Equals(*got, expected)) << got->DebugString();
}

TEST_F(StateStoreTest, AnUnsetProgressStaysUnset) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  v1::Run run = MakeRun("r1");
  run.clear_progress();
  ASSERT_TRUE(store->CreateRun(run, "").ok());
  absl::StatusOr<v1::Run> got = store->GetRun("r1");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_progress());

  run.mutable_progress();  // set, but all defaults
  ASSERT_TRUE(store->UpdateRun(run).ok());
  got = store->GetRun("r1");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->has_progress());
}

TEST_F(StateStoreTest, UpdateRunChangesStateButNotSpecOrCreationTime) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const v1::Run original = MakeRun("r1");
  ASSERT_TRUE(store->CreateRun(original, "").ok());
  v1::Attempt attempt;
  attempt.set_number(1);
  ASSERT_TRUE(store->UpsertAttempt("r1", attempt).ok());

  v1::Run changed = original;
  changed.set_state(v1::RUN_STATE_FAILED);
  changed.set_reason("crash loop");
  changed.set_updated_ms(9000);
  changed.set_ended_ms(9001);
  changed.set_restarts(5);
  *changed.mutable_progress() = MakeProgress(55);
  changed.set_spec_toml("changed");
  changed.set_created_ms(1);
  ASSERT_TRUE(store->UpdateRun(changed).ok());

  absl::StatusOr<v1::Run> got = store->GetRun("r1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), v1::RUN_STATE_FAILED);
  EXPECT_EQ(got->reason(), "crash loop");
  EXPECT_EQ(got->ended_ms(), 9001);
  EXPECT_EQ(got->restarts(), 5);
  EXPECT_EQ(got->progress().step(), 55);
  EXPECT_EQ(got->spec_toml(), original.spec_toml());
  EXPECT_EQ(got->created_ms(), original.created_ms());
  ASSERT_EQ(got->attempts_size(), 1);  // untouched by UpdateRun
}

TEST_F(StateStoreTest, MissingThingsAreNotFound) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  v1::Attempt attempt;
  attempt.set_number(1);
  v1::RankStatus rank;
  v1::RunEvent event = MakeEvent("nope", "x");

  EXPECT_EQ(store->GetRun("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->UpdateRun(MakeRun("nope")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->UpsertAttempt("nope", attempt).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->UpsertRank("r1", 1, rank, {}).code(),
            absl::StatusCode::kNotFound);  // no attempt 1
  EXPECT_EQ(store->GetRankPrivate("r1", 1, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->SetLearning("nope", {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetLearning("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->AppendEvent(&event).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->ListEvents("nope", 0, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->FindRunByRequestId("nope").status().code(), absl::StatusCode::kNotFound);
  absl::Status s = store->UpsertAttempt("nope", attempt);
  EXPECT_NE(std::string(s.message()).find("UpsertAttempt nope"), std::string::npos) << s;
}

TEST_F(StateStoreTest, BadArgumentsAreInvalid) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  v1::Attempt attempt;  // number 0
  v1::RankStatus rank;
  rank.set_rank(-1);
  v1::RunEvent no_run;
  EXPECT_EQ(store->CreateRun(MakeRun(""), "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->UpsertAttempt("r1", attempt).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->UpsertRank("r1", 1, rank, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AppendEvent(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->AppendEvent(&no_run).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->FindRunByRequestId("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StateStoreTest, DuplicateRunIdIsAlreadyExistsAndChangesNothing) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  v1::Run other = MakeRun("r1");
  other.set_name("impostor");
  absl::Status s = store->CreateRun(other, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(s.message()).find("CreateRun r1"), std::string::npos) << s;
  absl::StatusOr<v1::Run> got = store->GetRun("r1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name(), "name-r1");
  EXPECT_EQ(store->NextRunSeq().value(), 2);
}

TEST_F(StateStoreTest, RequestIdIsAnIdempotencyKey) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "req-1").ok());
  absl::StatusOr<std::string> found = store->FindRunByRequestId("req-1");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "r1");

  EXPECT_EQ(store->CreateRun(MakeRun("r2"), "req-1").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->GetRun("r2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->FindRunByRequestId("req-2").status().code(), absl::StatusCode::kNotFound);

  // Runs without a key do not collide with each other.
  EXPECT_TRUE(store->CreateRun(MakeRun("r3"), "").ok());
  EXPECT_TRUE(store->CreateRun(MakeRun("r4"), "").ok());
}

TEST_F(StateStoreTest, NextRunSeqCountsSubmissions) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->NextRunSeq().value(), 1);
  ASSERT_TRUE(store->CreateRun(MakeRun("b"), "").ok());
  EXPECT_EQ(store->NextRunSeq().value(), 2);
  ASSERT_TRUE(store->CreateRun(MakeRun("a"), "").ok());
  EXPECT_EQ(store->NextRunSeq().value(), 3);
}

TEST_F(StateStoreTest, ListRunsIsNewestFirstFilteredAndPaged) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const v1::RunState states[] = {v1::RUN_STATE_PENDING, v1::RUN_STATE_RUNNING,
                                 v1::RUN_STATE_SUCCEEDED, v1::RUN_STATE_FAILED};
  // r1..r8; run_ids sort differently from submit order on purpose.
  for (int i = 1; i <= 8; ++i) {
    ASSERT_TRUE(
        store->CreateRun(MakeRun(absl::StrCat("r", 9 - i, "-", i), states[(i - 1) % 4]), "").ok());
  }
  std::vector<std::string> all;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<RunPage> page = store->ListRuns({}, 3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->runs.size(), 3u);
    for (const v1::Run& r : page->runs) {
      EXPECT_TRUE(r.spec_toml().empty());
      EXPECT_EQ(r.attempts_size(), 0);
      EXPECT_EQ(r.progress().step(), 7);
      all.push_back(r.run_id());
    }
    token = page->next_page_token;
    ++pages;
    // A run submitted meanwhile does not shift the following pages.
    if (pages == 1) {
      ASSERT_TRUE(store->CreateRun(MakeRun("late"), "").ok());
    }
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(all, (std::vector<std::string>{"r1-8", "r2-7", "r3-6", "r4-5", "r5-4", "r6-3", "r7-2",
                                           "r8-1"}));

  const std::vector<v1::RunState> active_states = {v1::RUN_STATE_PENDING, v1::RUN_STATE_RUNNING};
  absl::StatusOr<RunPage> active = store->ListRuns(active_states, 2, "");
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(Ids(active->runs), (std::vector<std::string>{"late", "r3-6"}));
  ASSERT_FALSE(active->next_page_token.empty());
  active = store->ListRuns(active_states, 2, active->next_page_token);
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(Ids(active->runs), (std::vector<std::string>{"r4-5", "r7-2"}));
  ASSERT_FALSE(active->next_page_token.empty());
  active = store->ListRuns(active_states, 2, active->next_page_token);
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(Ids(active->runs), (std::vector<std::string>{"r8-1"}));
  EXPECT_TRUE(active->next_page_token.empty());

  // An exactly full last page carries no token.
  absl::StatusOr<RunPage> failed = store->ListRuns({v1::RUN_STATE_FAILED}, 2, "");
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(Ids(failed->runs), (std::vector<std::string>{"r1-8", "r5-4"}));
  EXPECT_TRUE(failed->next_page_token.empty());
}

TEST_F(StateStoreTest, ListRunsRejectsBadArguments) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  EXPECT_EQ(store->ListRuns({}, 10, "not a token!").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListRuns({}, 10, absl::WebSafeBase64Escape("seq:x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListRuns({}, 10, absl::WebSafeBase64Escape("seq:0")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListRuns({}, -1, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListRuns({static_cast<v1::RunState>(99)}, 10, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StateStoreTest, ListRunsDefaultsAndCapsThePageSize) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store
                  ->Transaction([&]() -> absl::Status {
                    for (int i = 0; i < StateStore::kMaxPageSize + 1; ++i) {
                      absl::Status s = store->CreateRun(MakeRun(absl::StrCat("r", i)), "");
                      if (!s.ok()) return s;
                    }
                    return absl::OkStatus();
                  })
                  .ok());
  absl::StatusOr<RunPage> page = store->ListRuns({}, 0, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->runs.size(), static_cast<size_t>(StateStore::kDefaultPageSize));
  page = store->ListRuns({}, 100000, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->runs.size(), static_cast<size_t>(StateStore::kMaxPageSize));
  ASSERT_FALSE(page->next_page_token.empty());
  page = store->ListRuns({}, 100000, page->next_page_token);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(Ids(page->runs), std::vector<std::string>{"r0"});
  EXPECT_TRUE(page->next_page_token.empty());
}

TEST_F(StateStoreTest, LoadUnfinishedRunsReturnsFullNonTerminalRunsInSubmitOrder) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("z", v1::RUN_STATE_RESTARTING), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("done", v1::RUN_STATE_SUCCEEDED), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("bad", v1::RUN_STATE_FAILED), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("gone", v1::RUN_STATE_CANCELLED), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("a", v1::RUN_STATE_PENDING), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("m", v1::RUN_STATE_RUNNING), "").ok());
  v1::Attempt attempt;
  attempt.set_number(1);
  ASSERT_TRUE(store->UpsertAttempt("m", attempt).ok());
  v1::RankStatus rank;
  rank.set_rank(0);
  rank.set_pid(1234);
  rank.set_alive(true);
  ASSERT_TRUE(store->UpsertRank("m", 1, rank, {}).ok());

  absl::StatusOr<std::vector<v1::Run>> runs = store->LoadUnfinishedRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  EXPECT_EQ(Ids(*runs), (std::vector<std::string>{"z", "a", "m"}));
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[2].spec_toml(), MakeRun("m").spec_toml());
  ASSERT_EQ((*runs)[2].attempts_size(), 1);
  ASSERT_EQ((*runs)[2].attempts(0).ranks_size(), 1);
  EXPECT_EQ((*runs)[2].attempts(0).ranks(0).pid(), 1234);
}

TEST_F(StateStoreTest, AttemptsAndRanksRoundTripInOrderWithPrivateFields) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  v1::Attempt a1, a2;
  a1.set_number(1);
  a1.set_started_ms(100);
  a1.set_ended_ms(200);
  a1.set_resumed_from_step(-1);
  a1.set_exit_class(v1::EXIT_CLASS_OOM);
  a1.set_exit_reason("hard OOM");
  a2.set_number(2);
  a2.set_started_ms(300);
  a2.set_resumed_from_step(50);
  a2.set_resumed_from("/runs/r1/checkpoints/step-50");
  a2.add_ranks()->set_rank(7);  // ignored by UpsertAttempt
  ASSERT_TRUE(store->UpsertAttempt("r1", a2).ok());
  ASSERT_TRUE(store->UpsertAttempt("r1", a1).ok());

  v1::RankStatus r0, r1;
  r0.set_rank(0);
  r0.set_pid(4000);
  r0.set_slot(0);
  r0.set_gpu("0");
  r0.set_alive(true);
  r0.set_exit_code(-1);
  r0.set_last_heartbeat_ms(310);
  *r0.mutable_progress() = MakeProgress(51);
  r0.set_log_path("/runs/r1/attempts/2/rank-0.log");
  r1 = r0;
  r1.set_rank(1);
  r1.set_pid(4001);
  r1.set_gpu("1");
  r1.clear_progress();
  RankPrivate p1;
  p1.pgid = 4001;
  p1.start_ticks = UINT64_MAX - 5;  // beyond int64: must survive storage
  p1.token = "secret-1";
  ASSERT_TRUE(store->UpsertRank("r1", 2, r1, p1).ok());
  ASSERT_TRUE(store->UpsertRank("r1", 2, r0, {4000, 123456, "secret-0"}).ok());

  absl::StatusOr<v1::Run> run = store->GetRun("r1");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->attempts_size(), 2);
  v1::Attempt want1 = a1, want2 = a2;
  want2.clear_ranks();
  *want2.add_ranks() = r0;
  *want2.add_ranks() = r1;
  EXPECT_TRUE(MessageDifferencer::Equals(run->attempts(0), want1))
      << run->attempts(0).DebugString();
  EXPECT_TRUE(MessageDifferencer::Equals(run->attempts(1), want2))
      << run->attempts(1).DebugString();

  absl::StatusOr<RankPrivate> got = store->GetRankPrivate("r1", 2, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->pgid, 4001);
  EXPECT_EQ(got->start_ticks, UINT64_MAX - 5);
  EXPECT_EQ(got->token, "secret-1");

  // Overwriting an attempt keeps its ranks; overwriting a rank replaces it.
  a2.set_ended_ms(999);
  a2.set_exit_class(v1::EXIT_CLASS_CRASH);
  ASSERT_TRUE(store->UpsertAttempt("r1", a2).ok());
  r1.set_alive(false);
  r1.set_exit_code(1);
  r1.set_exit_class(v1::EXIT_CLASS_CRASH);
  ASSERT_TRUE(store->UpsertRank("r1", 2, r1, {4001, 77, "secret-2"}).ok());
  run = store->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->attempts(1).ended_ms(), 999);
  EXPECT_EQ(run->attempts(1).exit_class(), v1::EXIT_CLASS_CRASH);
  ASSERT_EQ(run->attempts(1).ranks_size(), 2);
  EXPECT_FALSE(run->attempts(1).ranks(1).alive());
  EXPECT_EQ(run->attempts(1).ranks(1).exit_code(), 1);
  got = store->GetRankPrivate("r1", 2, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->start_ticks, 77u);
  EXPECT_EQ(got->token, "secret-2");
}

TEST_F(StateStoreTest, LearningRoundTrips) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("r1"), "").ok());
  absl::StatusOr<RunLearning> l = store->GetLearning("r1");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->slowest_step_s, 0);
  EXPECT_EQ(l->steps_observed, 0);
  ASSERT_TRUE(store->SetLearning("r1", {2.75, 1234}).ok());
  l = store->GetLearning("r1");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->slowest_step_s, 2.75);
  EXPECT_EQ(l->steps_observed, 1234);
  // UpdateRun does not touch what was learnt.
  ASSERT_TRUE(store->UpdateRun(MakeRun("r1", v1::RUN_STATE_RUNNING)).ok());
  EXPECT_EQ(store->GetLearning("r1")->steps_observed, 1234);
}

TEST_F(StateStoreTest, EventsAreNumberedPerRunWithoutGaps) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("a"), "").ok());
  ASSERT_TRUE(store->CreateRun(MakeRun("b"), "").ok());
  for (int i = 1; i <= 5; ++i) {
    v1::RunEvent ea = MakeEvent("a", absl::StrCat("a", i));
    *ea.mutable_progress() = MakeProgress(i);
    absl::StatusOr<int64_t> seq = store->AppendEvent(&ea);
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(*seq, i);
    EXPECT_EQ(ea.seq(), i);
    if (i <= 2) {
      v1::RunEvent eb = MakeEvent("b", absl::StrCat("b", i));
      ASSERT_EQ(store->AppendEvent(&eb).value(), i);
    }
    // A failed append does not use up a number.
    v1::RunEvent stray = MakeEvent("nope", "x");
    ASSERT_FALSE(store->AppendEvent(&stray).ok());
    EXPECT_EQ(stray.seq(), 0);
  }

  absl::StatusOr<std::vector<v1::RunEvent>> all = store->ListEvents("a", 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*all)[i].seq(), i + 1);
    EXPECT_EQ((*all)[i].run_id(), "a");
    EXPECT_EQ((*all)[i].reason(), absl::StrCat("a", i + 1));
    EXPECT_EQ((*all)[i].kind(), v1::EVENT_KIND_LOG);
    EXPECT_EQ((*all)[i].rank(), -1);
    EXPECT_EQ((*all)[i].progress().step(), i + 1);
  }
  absl::StatusOr<std::vector<v1::RunEvent>> some = store->ListEvents("a", 2, 2);
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 2u);
  EXPECT_EQ((*some)[0].seq(), 3);
  EXPECT_EQ((*some)[1].seq(), 4);
  some = store->ListEvents("a", 5, 0);
  ASSERT_TRUE(some.ok());  // a known run with nothing newer
  EXPECT_TRUE(some->empty());
  absl::StatusOr<std::vector<v1::RunEvent>> b = store->ListEvents("b", 0, 0);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[1].reason(), "b2");
}

TEST_F(StateStoreTest, TransactionRollbackLeavesNothing) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateRun(MakeRun("kept"), "").ok());
  absl::Status s = store->Transaction([&]() -> absl::Status {
    if (absl::Status c = store->CreateRun(MakeRun("r1"), "req"); !c.ok()) return c;
    v1::RunEvent e = MakeEvent("r1", "created");
    if (!store->AppendEvent(&e).ok()) return absl::InternalError("append failed");
    v1::RunEvent k = MakeEvent("kept", "touched");
    if (!store->AppendEvent(&k).ok()) return absl::InternalError("append failed");
    return absl::AbortedError("changed my mind");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "changed my mind");
  EXPECT_EQ(store->GetRun("r1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->FindRunByRequestId("req").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->NextRunSeq().value(), 2);
  absl::StatusOr<std::vector<v1::RunEvent>> events = store->ListEvents("kept", 0, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
}

TEST_F(StateStoreTest, AFailedCallRollsBackTheWholeGroupWhenFnFails) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  absl::Status s = store->Transaction([&]() -> absl::Status {
    if (absl::Status c = store->CreateRun(MakeRun("r1"), ""); !c.ok()) return c;
    return store->CreateRun(MakeRun("r1"), "");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->GetRun("r1").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StateStoreTest, TransactionCommitsEveryCall) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store
                  ->Transaction([&]() -> absl::Status {
                    if (absl::Status c = store->CreateRun(MakeRun("r1"), ""); !c.ok()) return c;
                    v1::Attempt attempt;
                    attempt.set_number(1);
                    if (absl::Status c = store->UpsertAttempt("r1", attempt); !c.ok()) return c;
                    v1::RunEvent e = MakeEvent("r1", "started");
                    return store->AppendEvent(&e).status();
                  })
                  .ok());
  absl::StatusOr<v1::Run> run = store->GetRun("r1");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->attempts_size(), 1);
  EXPECT_EQ(store->ListEvents("r1", 0, 0)->size(), 1u);
}

TEST_F(StateStoreTest, NestedTransactionIsRefused) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  absl::Status inner;
  absl::Status outer = store->Transaction([&]() -> absl::Status {
    if (absl::Status c = store->CreateRun(MakeRun("r1"), ""); !c.ok()) return c;
    inner = store->Transaction([] { return absl::OkStatus(); });
    return absl::OkStatus();
  });
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(outer.ok()) << outer;
  EXPECT_TRUE(store->GetRun("r1").ok());
  // The store still takes transactions afterwards.
  EXPECT_TRUE(store->Transaction([] { return absl::OkStatus(); }).ok());
}

TEST_F(StateStoreTest, ReopenedStoreShowsEverything) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateRun(MakeRun("r1", v1::RUN_STATE_RUNNING), "req-1").ok());
    v1::Attempt attempt;
    attempt.set_number(1);
    ASSERT_TRUE(store->UpsertAttempt("r1", attempt).ok());
    v1::RankStatus rank;
    rank.set_rank(0);
    rank.set_pid(77);
    ASSERT_TRUE(store->UpsertRank("r1", 1, rank, {77, 999, "tok"}).ok());
    ASSERT_TRUE(store->SetLearning("r1", {1.5, 10}).ok());
    v1::RunEvent e = MakeEvent("r1", "one");
    ASSERT_TRUE(store->AppendEvent(&e).ok());
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<v1::Run> run = store->GetRun("r1");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->state(), v1::RUN_STATE_RUNNING);
  ASSERT_EQ(run->attempts_size(), 1);
  ASSERT_EQ(run->attempts(0).ranks_size(), 1);
  EXPECT_EQ(run->attempts(0).ranks(0).pid(), 77);
  EXPECT_EQ(store->GetRankPrivate("r1", 1, 0)->token, "tok");
  EXPECT_EQ(store->GetLearning("r1")->steps_observed, 10);
  EXPECT_EQ(store->FindRunByRequestId("req-1").value(), "r1");
  EXPECT_EQ(store->NextRunSeq().value(), 2);
  v1::RunEvent e = MakeEvent("r1", "two");
  EXPECT_EQ(store->AppendEvent(&e).value(), 2);
}

TEST_F(StateStoreTest, AProcessThatEndsWithoutClosingLosesNothing) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child exits without destructors: the connection is never closed
    // and the WAL never checkpointed into the main file.
    absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
    bool ok = store.ok() && (*store)->CreateRun(MakeRun("r1"), "").ok();
    v1::RunEvent e = MakeEvent("r1", "from the child");
    ok = ok && (*store)->AppendEvent(&e).ok();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->GetRun("r1").ok());
  absl::StatusOr<std::vector<v1::RunEvent>> events = store->ListEvents("r1", 0, 0);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].reason(), "from the child");
}

// A version-2 store (no attempts.generation) opens, keeps its rows and is
// migrated: its attempts are of local runs, generation 0.

}  // namespace
}  // namespace trainsup::supervisor

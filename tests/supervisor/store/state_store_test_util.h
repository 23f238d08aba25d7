// What the state store's tests share: rows to store, and a fixture with a
// store on real files in a temporary directory, raw SQL on it, file modes.
#ifndef TRAINSUP_TESTS_SUPERVISOR_STORE_STATE_STORE_TEST_UTIL_H_
#define TRAINSUP_TESTS_SUPERVISOR_STORE_STATE_STORE_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "supervisor/store/state_store.h"

namespace trainsup::supervisor {

inline v1::Progress MakeProgress(int64_t step) {
  v1::Progress p;
  p.set_step(step);
  p.set_total_steps(1000);
  p.set_epoch(step / 100);
  p.set_phase(v1::PHASE_TRAINING);
  p.set_loss(0.25 + step);
  p.set_samples_per_sec(12.5);
  p.set_memory_peak_bytes(int64_t{3} << 30);
  p.set_time_ms(1700000000000 + step);
  return p;
}

inline v1::Run MakeRun(const std::string& id, v1::RunState state = v1::RUN_STATE_PENDING) {
  v1::Run run;
  run.set_run_id(id);
  run.set_name("name-" + id);
  run.set_state(state);
  run.set_priority(3);
  run.set_world_size(2);
  run.set_created_ms(1000);
  run.set_updated_ms(2000);
  run.set_ended_ms(0);
  run.set_spec_toml("[run]\nname = \"" + id + "\"\n");
  run.set_reason("submitted");
  run.set_restarts(1);
  run.set_oom_restarts(2);
  *run.mutable_progress() = MakeProgress(7);
  run.set_run_dir("/var/lib/trainsup/runs/" + id);
  run.set_next_restart_ms(5000);
  return run;
}

inline v1::RunEvent MakeEvent(const std::string& run_id, const std::string& reason) {
  v1::RunEvent e;
  e.set_run_id(run_id);
  e.set_time_ms(42);
  e.set_kind(v1::EVENT_KIND_LOG);
  e.set_rank(-1);
  e.set_reason(reason);
  return e;
}

inline std::vector<std::string> Ids(const std::vector<v1::Run>& runs) {
  std::vector<std::string> ids;
  for (const v1::Run& r : runs) ids.push_back(r.run_id());
  return ids;
}

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainsup_state_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/state.db";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<StateStore> OpenStore() {
    absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Runs `sql` on a connection of its own; returns the first column of the
  // last row, or "error: ...".
  std::string RawSql(const std::string& sql) {
    sqlite3* db = nullptr;
    std::string result;
    if (sqlite3_open(path_.c_str(), &db) != SQLITE_OK) {
      sqlite3_close(db);
      return "error: open";
    }
    char* error = nullptr;
    const int rc = sqlite3_exec(
        db, sql.c_str(),
        [](void* out, int n, char** values, char**) {
          if (n > 0 && values[0] != nullptr) *static_cast<std::string*>(out) = values[0];
          return 0;
        },
        &result, &error);
    if (rc != SQLITE_OK) result = absl::StrCat("error: ", error != nullptr ? error : "?");
    sqlite3_free(error);
    sqlite3_close(db);
    return result;
  }

  static int Mode(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return -1;
    return st.st_mode & 0777;
  }

  std::string dir_, path_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_TESTS_SUPERVISOR_STORE_STATE_STORE_TEST_UTIL_H_

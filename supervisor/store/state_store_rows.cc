// The state store's rows: runs, attempts, ranks, learning and events
// (state_store.cc opens the file and runs transactions).
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "supervisor/store/state_store.h"
#include "supervisor/store/state_store_query.h"

namespace trainsup::supervisor {

using namespace store_internal;  // NOLINT: the run columns
using store_internal::kListRuns;
using store_internal::kSelectRun;
using store_internal::PageToken;
using store_internal::ParsePageToken;

namespace {

// runs.skip_windows: the run's windows as a Run message holding only them
// (a BLOB, as runs.progress is).
v1::Run SkipWindowsOf(const v1::Run& run) {
  v1::Run windows;
  *windows.mutable_skip_windows() = run.skip_windows();
  return windows;
}

// The runs columns that UpdateRun writes, and CreateRun with them: one
// list, from which both statements and their bindings are made, so that the
// two cannot disagree. CreateRun also writes the columns that never change
// (run_id, seq, request_id, created_ms, spec_toml).
struct UpdatedColumn {
  const char* name;
  void (*bind)(StateStore::Query& q, const v1::Run& run);
};
constexpr UpdatedColumn kUpdatedRunColumns[] = {
    {"name", [](StateStore::Query& q, const v1::Run& r) { q.BindText(r.name()); }},
    {"state", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.state()); }},
    {"priority", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.priority()); }},
    {"world_size", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.world_size()); }},
    {"updated_ms", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.updated_ms()); }},
    {"ended_ms", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.ended_ms()); }},
    {"reason", [](StateStore::Query& q, const v1::Run& r) { q.BindText(r.reason()); }},
    {"restarts", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.restarts()); }},
    {"oom_restarts", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.oom_restarts()); }},
    {"progress",
     [](StateStore::Query& q, const v1::Run& r) { q.BindMessage(r.has_progress(), r.progress()); }},
    {"run_dir", [](StateStore::Query& q, const v1::Run& r) { q.BindText(r.run_dir()); }},
    {"next_restart_ms",
     [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.next_restart_ms()); }},
    {"cluster_submission",
     [](StateStore::Query& q, const v1::Run& r) { q.BindText(r.cluster_submission()); }},
    {"rollbacks", [](StateStore::Query& q, const v1::Run& r) { q.BindInt(r.rollbacks()); }},
    {"skip_windows",
     [](StateStore::Query& q, const v1::Run& r) {
       q.BindMessage(r.skip_windows_size() > 0, SkipWindowsOf(r));
     }},
    {"stop_request",
     [](StateStore::Query& q, const v1::Run& r) {
       q.BindMessage(r.has_stop_request(), r.stop_request());
     }},
};
// CreateRun binds these first, in this order, then kUpdatedRunColumns.
constexpr const char* kCreatedRunColumns[] = {"run_id", "seq", "request_id", "created_ms",
                                              "spec_toml"};

void BindUpdatedRunColumns(StateStore::Query& q, const v1::Run& run) {
  for (const UpdatedColumn& c : kUpdatedRunColumns) c.bind(q, run);
}

// "INSERT INTO runs (run_id, ..., skip_windows) VALUES (?1, ..., ?20)".
std::string InsertRunSql() {
  std::string names;
  std::string values;
  int n = 0;
  auto add = [&](const char* name) {
    absl::StrAppend(&names, n == 0 ? "" : ", ", name);
    absl::StrAppend(&values, n == 0 ? "" : ", ", "?", n + 1);
    ++n;
  };
  for (const char* name : kCreatedRunColumns) add(name);
  for (const UpdatedColumn& c : kUpdatedRunColumns) add(c.name);
  return absl::StrCat("INSERT INTO runs (", names, ") VALUES (", values, ")");
}

// "UPDATE runs SET name = ?2, ..., skip_windows = ?16 WHERE run_id = ?1".
std::string UpdateRunSql() {
  std::string sets;
  int n = 2;
  for (const UpdatedColumn& c : kUpdatedRunColumns) {
    absl::StrAppend(&sets, n == 2 ? "" : ", ", c.name, " = ?", n);
    ++n;
  }
  return absl::StrCat("UPDATE runs SET ", sets, " WHERE run_id = ?1");
}

}  // namespace

absl::Status StateStore::CreateRun(const v1::Run& run, const std::string& request_id) {
  const std::string op = absl::StrCat("CreateRun ", run.run_id());
  if (run.run_id().empty()) return absl::InvalidArgumentError("CreateRun: empty run_id");
  return InTransaction(true, op, [&]() -> absl::Status {
    absl::StatusOr<int64_t> seq = ReadNextRunSeq(op);
    if (!seq.ok()) return seq.status();
    static const std::string sql = InsertRunSql();
    absl::StatusOr<Query> q = Prepare(sql.c_str(), op);
    if (!q.ok()) return q.status();
    q->BindText(run.run_id())
        .BindInt(*seq)
        .BindTextOrNull(request_id)
        .BindInt(run.created_ms())
        .BindText(run.spec_toml());
    BindUpdatedRunColumns(*q, run);
    return q->Run();
  });
}

absl::StatusOr<std::string> StateStore::FindRunByRequestId(const std::string& request_id) {
  if (request_id.empty()) return absl::InvalidArgumentError("FindRunByRequestId: empty request_id");
  const std::string op = absl::StrCat("FindRunByRequestId ", request_id);
  absl::StatusOr<Query> q = Prepare("SELECT run_id FROM runs WHERE request_id = ?1", op);
  if (!q.ok()) return q.status();
  q->BindText(request_id);
  absl::StatusOr<bool> row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(op, ": no run has this request_id"));
  return q->Text(0);
}

absl::Status StateStore::UpdateRun(const v1::Run& run) {
  const std::string op = absl::StrCat("UpdateRun ", run.run_id());
  static const std::string sql = UpdateRunSql();
  absl::StatusOr<Query> q = Prepare(sql.c_str(), op);
  if (!q.ok()) return q.status();
  q->BindText(run.run_id());
  BindUpdatedRunColumns(*q, run);
  if (absl::Status s = q->Run(); !s.ok()) return s;
  if (q->Changes() == 0) return absl::NotFoundError(absl::StrCat(op, ": no such run"));
  return absl::OkStatus();
}

absl::Status StateStore::RunFromRow(const Query& q, v1::Run* run) {
  run->set_run_id(q.Text(kRunId));
  run->set_name(q.Text(kName));
  run->set_state(static_cast<v1::RunState>(q.Int(kState)));
  run->set_priority(static_cast<int32_t>(q.Int(kPriority)));
  run->set_world_size(static_cast<int32_t>(q.Int(kWorldSize)));
  run->set_created_ms(q.Int(kCreatedMs));
  run->set_updated_ms(q.Int(kUpdatedMs));
  run->set_ended_ms(q.Int(kEndedMs));
  run->set_reason(q.Text(kReason));
  run->set_restarts(static_cast<int32_t>(q.Int(kRestarts)));
  run->set_oom_restarts(static_cast<int32_t>(q.Int(kOomRestarts)));
  run->set_run_dir(q.Text(kRunDir));
  run->set_next_restart_ms(q.Int(kNextRestartMs));
  run->set_spec_toml(q.Text(kSpecToml));
  run->set_cluster_submission(q.Text(kClusterSubmission));
  run->set_rollbacks(static_cast<int32_t>(q.Int(kRollbacks)));
  {
    v1::Run windows;
    bool present = false;
    if (absl::Status s = q.Message(kSkipWindows, &windows, &present); !s.ok()) return s;
    if (present) *run->mutable_skip_windows() = std::move(*windows.mutable_skip_windows());
  }
  v1::Progress progress;
  bool present = false;
  if (absl::Status s = q.Message(kProgress, &progress, &present); !s.ok()) return s;
  if (present) *run->mutable_progress() = std::move(progress);
  v1::StopRequest stop;
  if (absl::Status s = q.Message(kStopRequest, &stop, &present); !s.ok()) return s;
  if (present) *run->mutable_stop_request() = std::move(stop);
  return absl::OkStatus();
}

absl::Status StateStore::ReadAttempts(v1::Run* run, const std::string& op) {
  std::map<int64_t, v1::Attempt*> by_number;
  {
    absl::StatusOr<Query> q = Prepare(
        "SELECT number, started_ms, ended_ms, resumed_from_step, resumed_from, exit_class, "
        "exit_reason, stop_requested, generation, world_size"
        " FROM attempts WHERE run_id = ?1 ORDER BY number",
        op);
    if (!q.ok()) return q.status();
    q->BindText(run->run_id());
    absl::Status rows = q->ForEachRow([&]() -> absl::Status {
      v1::Attempt* a = run->add_attempts();
      a->set_number(static_cast<int32_t>(q->Int(0)));
      a->set_started_ms(q->Int(1));
      a->set_ended_ms(q->Int(2));
      a->set_resumed_from_step(q->Int(3));
      a->set_resumed_from(q->Text(4));
      a->set_exit_class(static_cast<v1::ExitClass>(q->Int(5)));
      a->set_exit_reason(q->Text(6));
      a->set_stop_requested(q->Int(7) != 0);
      a->set_generation(q->Int(8));
      a->set_world_size(static_cast<int32_t>(q->Int(9)));
      by_number[a->number()] = a;
      return absl::OkStatus();
    });
    if (!rows.ok()) return rows;
  }
  absl::StatusOr<Query> q = Prepare(
      "SELECT attempt, rank, pid, slot, gpu, alive, exit_code, signal, exit_class, exit_reason,"
      " last_heartbeat_ms, progress, log_path FROM ranks WHERE run_id = ?1 ORDER BY attempt, rank",
      op);
  if (!q.ok()) return q.status();
  q->BindText(run->run_id());
  absl::Status rows = q->ForEachRow([&]() -> absl::Status {
    auto it = by_number.find(q->Int(0));
    // The foreign key makes every rank's attempt exist.
    if (it == by_number.end())
      return absl::DataLossError(absl::StrCat(op, ": rank of a missing attempt"));
    v1::RankStatus* r = it->second->add_ranks();
    r->set_rank(static_cast<int32_t>(q->Int(1)));
    r->set_pid(static_cast<int32_t>(q->Int(2)));
    r->set_slot(static_cast<int32_t>(q->Int(3)));
    r->set_gpu(q->Text(4));
    r->set_alive(q->Int(5) != 0);
    r->set_exit_code(static_cast<int32_t>(q->Int(6)));
    r->set_signal(static_cast<int32_t>(q->Int(7)));
    r->set_exit_class(static_cast<v1::ExitClass>(q->Int(8)));
    r->set_exit_reason(q->Text(9));
    r->set_last_heartbeat_ms(q->Int(10));
    bool present = false;
    if (absl::Status s = q->Message(11, r->mutable_progress(), &present); !s.ok()) return s;
    if (!present) r->clear_progress();
    r->set_log_path(q->Text(12));
    return absl::OkStatus();
  });
  return rows;
}

absl::StatusOr<v1::Run> StateStore::ReadFullRun(const std::string& run_id, const std::string& op) {
  v1::Run run;
  {
    absl::StatusOr<Query> q = Prepare(kSelectRun, op);
    if (!q.ok()) return q.status();
    q->BindText(run_id);
    absl::StatusOr<bool> row = q->Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::NotFoundError(absl::StrCat(op, ": no such run"));
    if (absl::Status s = RunFromRow(*q, &run); !s.ok()) return s;
  }
  if (absl::Status s = ReadAttempts(&run, op); !s.ok()) return s;
  return run;
}

absl::StatusOr<v1::Run> StateStore::GetRun(const std::string& run_id) {
  const std::string op = absl::StrCat("GetRun ", run_id);
  absl::StatusOr<v1::Run> run;
  absl::Status s = InTransaction(false, op, [&]() -> absl::Status {
    run = ReadFullRun(run_id, op);
    return run.status();
  });
  if (!s.ok()) return s;
  return run;
}

absl::StatusOr<RunPage> StateStore::ListRuns(const std::vector<v1::RunState>& states, int page_size,
                                             const std::string& page_token) {
  const std::string op = "ListRuns";
  if (page_size < 0)
    return absl::InvalidArgumentError(absl::StrCat(op, ": negative page_size ", page_size));
  if (page_size == 0) page_size = kDefaultPageSize;
  if (page_size > kMaxPageSize) page_size = kMaxPageSize;
  int64_t mask = 0;
  for (v1::RunState state : states) {
    if (!v1::RunState_IsValid(state) || state < 0 || state > 62) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": unknown run state ", static_cast<int>(state)));
    }
    mask |= int64_t{1} << state;
  }
  int64_t before = INT64_MAX;
  if (!page_token.empty()) {
    absl::StatusOr<int64_t> seq = ParsePageToken(page_token);
    if (!seq.ok()) return seq.status();
    before = *seq;
  }
  absl::StatusOr<Query> q = Prepare(kListRuns, op);
  if (!q.ok()) return q.status();
  // One row more than the page tells whether another page follows.
  q->BindInt(before).BindInt(mask).BindInt(page_size + 1);
  RunPage page;
  int64_t last_seq = 0;
  for (;;) {
    absl::StatusOr<bool> row = q->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (static_cast<int>(page.runs.size()) == page_size) {
      page.next_page_token = PageToken(last_seq);
      break;
    }
    v1::Run& run = page.runs.emplace_back();
    if (absl::Status s = RunFromRow(*q, &run); !s.ok()) return s;
    run.clear_spec_toml();
    last_seq = q->Int(kSeq);
  }
  return page;
}

absl::StatusOr<std::vector<v1::Run>> StateStore::LoadUnfinishedRuns() {
  const std::string op = "LoadUnfinishedRuns";
  std::vector<v1::Run> runs;
  absl::Status s = InTransaction(false, op, [&]() -> absl::Status {
    std::vector<std::string> ids;
    {
      absl::StatusOr<Query> q =
          Prepare("SELECT run_id FROM runs WHERE state NOT IN (?1, ?2, ?3) ORDER BY seq", op);
      if (!q.ok()) return q.status();
      q->BindInt(v1::RUN_STATE_SUCCEEDED)
          .BindInt(v1::RUN_STATE_FAILED)
          .BindInt(v1::RUN_STATE_CANCELLED);
      absl::Status rows = q->ForEachRow([&]() -> absl::Status {
        ids.push_back(q->Text(0));
        return absl::OkStatus();
      });
      if (!rows.ok()) return rows;
    }
    for (const std::string& id : ids) {
      absl::StatusOr<v1::Run> run = ReadFullRun(id, absl::StrCat(op, " ", id));
      if (!run.ok()) return run.status();
      runs.push_back(*std::move(run));
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return runs;
}

absl::Status StateStore::UpsertAttempt(const std::string& run_id, const v1::Attempt& attempt) {
  const std::string op = absl::StrCat("UpsertAttempt ", run_id, " attempt ", attempt.number());
  if (attempt.number() < 1)
    return absl::InvalidArgumentError(absl::StrCat(op, ": number must be >= 1"));
  absl::StatusOr<Query> q = Prepare(
      "INSERT INTO attempts (run_id, number, started_ms, ended_ms, resumed_from_step, resumed_from,"
      " exit_class, exit_reason, stop_requested, generation, world_size)"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
      " ON CONFLICT (run_id, number) DO UPDATE SET started_ms = excluded.started_ms,"
      " ended_ms = excluded.ended_ms, resumed_from_step = excluded.resumed_from_step,"
      " resumed_from = excluded.resumed_from, exit_class = excluded.exit_class,"
      " exit_reason = excluded.exit_reason, stop_requested = excluded.stop_requested,"
      " generation = excluded.generation, world_size = excluded.world_size",
      op);
  if (!q.ok()) return q.status();
  q->BindText(run_id)
      .BindInt(attempt.number())
      .BindInt(attempt.started_ms())
      .BindInt(attempt.ended_ms())
      .BindInt(attempt.resumed_from_step())
      .BindText(attempt.resumed_from())
      .BindInt(attempt.exit_class())
      .BindText(attempt.exit_reason())
      .BindInt(attempt.stop_requested() ? 1 : 0)
      .BindInt(attempt.generation())
      .BindInt(attempt.world_size());
  return q->Run();
}

absl::Status StateStore::UpsertRank(const std::string& run_id, int attempt,
                                    const v1::RankStatus& rank, const RankPrivate& priv) {
  const std::string op =
      absl::StrCat("UpsertRank ", run_id, " attempt ", attempt, " rank ", rank.rank());
  if (attempt < 1 || rank.rank() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": attempt must be >= 1 and rank >= 0"));
  }
  absl::StatusOr<Query> q = Prepare(
      "INSERT INTO ranks (run_id, attempt, rank, pid, pgid, start_ticks, slot, gpu, token, alive,"
      " exit_code, signal, exit_class, exit_reason, last_heartbeat_ms, progress, log_path)"
      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
      " ON CONFLICT (run_id, attempt, rank) DO UPDATE SET pid = excluded.pid, pgid = excluded.pgid,"
      " start_ticks = excluded.start_ticks, slot = excluded.slot, gpu = excluded.gpu,"
      " token = excluded.token, alive = excluded.alive, exit_code = excluded.exit_code,"
      " signal = excluded.signal, exit_class = excluded.exit_class,"
      " exit_reason = excluded.exit_reason, last_heartbeat_ms = excluded.last_heartbeat_ms,"
      " progress = excluded.progress, log_path = excluded.log_path",
      op);
  if (!q.ok()) return q.status();
  // start_ticks is stored as the signed 64-bit integer SQLite has; the cast
  // back in GetRankPrivate restores the value.
  q->BindText(run_id)
      .BindInt(attempt)
      .BindInt(rank.rank())
      .BindInt(rank.pid())
      .BindInt(priv.pgid)
      .BindInt(static_cast<int64_t>(priv.start_ticks))
      .BindInt(rank.slot())
      .BindText(rank.gpu())
      .BindText(priv.token)
      .BindInt(rank.alive() ? 1 : 0)
      .BindInt(rank.exit_code())
      .BindInt(rank.signal())
      .BindInt(rank.exit_class())
      .BindText(rank.exit_reason())
      .BindInt(rank.last_heartbeat_ms())
      .BindMessage(rank.has_progress(), rank.progress())
      .BindText(rank.log_path());
  return q->Run();
}

absl::StatusOr<RankPrivate> StateStore::GetRankPrivate(const std::string& run_id, int attempt,
                                                       int rank) {
  const std::string op =
      absl::StrCat("GetRankPrivate ", run_id, " attempt ", attempt, " rank ", rank);
  absl::StatusOr<Query> q = Prepare(
      "SELECT pgid, start_ticks, token FROM ranks WHERE run_id = ?1 AND attempt = ?2 AND rank = ?3",
      op);
  if (!q.ok()) return q.status();
  q->BindText(run_id).BindInt(attempt).BindInt(rank);
  absl::StatusOr<bool> row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(op, ": no such rank"));
  RankPrivate priv;
  priv.pgid = static_cast<int>(q->Int(0));
  priv.start_ticks = static_cast<uint64_t>(q->Int(1));
  priv.token = q->Text(2);
  return priv;
}

absl::Status StateStore::SetLearning(const std::string& run_id, const RunLearning& learning) {
  const std::string op = absl::StrCat("SetLearning ", run_id);
  absl::StatusOr<Query> q =
      Prepare("UPDATE runs SET slowest_step_s = ?2, steps_observed = ?3 WHERE run_id = ?1", op);
  if (!q.ok()) return q.status();
  q->BindText(run_id).BindDouble(learning.slowest_step_s).BindInt(learning.steps_observed);
  if (absl::Status s = q->Run(); !s.ok()) return s;
  if (q->Changes() == 0) return absl::NotFoundError(absl::StrCat(op, ": no such run"));
  return absl::OkStatus();
}

absl::StatusOr<RunLearning> StateStore::GetLearning(const std::string& run_id) {
  const std::string op = absl::StrCat("GetLearning ", run_id);
  absl::StatusOr<Query> q =
      Prepare("SELECT slowest_step_s, steps_observed FROM runs WHERE run_id = ?1", op);
  if (!q.ok()) return q.status();
  q->BindText(run_id);
  absl::StatusOr<bool> row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(op, ": no such run"));
  RunLearning learning;
  learning.slowest_step_s = q->Double(0);
  learning.steps_observed = q->Int(1);
  return learning;
}

absl::Status StateStore::SetDrain(const StoredDrain& drain) {
  const std::string op = absl::StrCat("SetDrain ", drain.slot);
  if (drain.slot.empty()) return absl::InvalidArgumentError("SetDrain: empty slot");
  absl::StatusOr<Query> q = Prepare(
      "INSERT INTO drains (slot, reason, drained_ms) VALUES (?1, ?2, ?3)"
      " ON CONFLICT (slot) DO UPDATE SET reason = excluded.reason,"
      " drained_ms = excluded.drained_ms",
      op);
  if (!q.ok()) return q.status();
  q->BindText(drain.slot).BindText(drain.reason).BindInt(drain.drained_ms);
  return q->Run();
}

absl::Status StateStore::ClearDrain(const std::string& slot) {
  absl::StatusOr<Query> q = Prepare("DELETE FROM drains WHERE slot = ?1", "ClearDrain " + slot);
  if (!q.ok()) return q.status();
  q->BindText(slot);
  return q->Run();
}

absl::StatusOr<std::vector<StoredDrain>> StateStore::ListDrains() {
  absl::StatusOr<Query> q =
      Prepare("SELECT slot, reason, drained_ms FROM drains ORDER BY slot", "ListDrains");
  if (!q.ok()) return q.status();
  std::vector<StoredDrain> drains;
  absl::Status rows = q->ForEachRow([&]() -> absl::Status {
    drains.push_back({q->Text(0), q->Text(1), q->Int(2)});
    return absl::OkStatus();
  });
  if (!rows.ok()) return rows;
  return drains;
}

absl::StatusOr<int64_t> StateStore::AppendEvent(v1::RunEvent* event) {
  if (event == nullptr) return absl::InvalidArgumentError("AppendEvent: null event");
  if (event->run_id().empty()) return absl::InvalidArgumentError("AppendEvent: empty run_id");
  const std::string op = absl::StrCat("AppendEvent ", event->run_id());
  int64_t seq = 0;
  absl::Status s = InTransaction(true, op, [&]() -> absl::Status {
    {
      absl::StatusOr<Query> q =
          Prepare("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?1", op);
      if (!q.ok()) return q.status();
      q->BindText(event->run_id());
      absl::StatusOr<bool> row = q->Step();
      if (!row.ok()) return row.status();
      seq = q->Int(0);
    }
    v1::RunEvent stored = *event;
    stored.set_seq(seq);
    absl::StatusOr<Query> q = Prepare(
        "INSERT INTO events (run_id, seq, time_ms, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)", op);
    if (!q.ok()) return q.status();
    q->BindText(stored.run_id())
        .BindInt(seq)
        .BindInt(stored.time_ms())
        .BindInt(stored.kind())
        .BindMessage(true, stored);
    return q->Run();
  });
  if (!s.ok()) return s;
  event->set_seq(seq);
  return seq;
}

absl::StatusOr<std::vector<v1::RunEvent>> StateStore::ListEvents(const std::string& run_id,
                                                                 int64_t after_seq, int limit) {
  const std::string op = absl::StrCat("ListEvents ", run_id);
  std::vector<v1::RunEvent> events;
  {
    absl::StatusOr<Query> q = Prepare(
        "SELECT seq, payload FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3", op);
    if (!q.ok()) return q.status();
    // A negative LIMIT is no limit in SQLite.
    q->BindText(run_id).BindInt(after_seq).BindInt(limit > 0 ? limit : -1);
    absl::Status rows = q->ForEachRow([&]() -> absl::Status {
      v1::RunEvent& event = events.emplace_back();
      bool present = false;
      if (absl::Status s = q->Message(1, &event, &present); !s.ok()) return s;
      event.set_seq(q->Int(0));
      event.set_run_id(run_id);
      return absl::OkStatus();
    });
    if (!rows.ok()) return rows;
  }
  if (events.empty()) {
    absl::StatusOr<bool> exists = RunExists(run_id, op);
    if (!exists.ok()) return exists.status();
    if (!*exists) return absl::NotFoundError(absl::StrCat(op, ": no such run"));
  }
  return events;
}

}  // namespace trainsup::supervisor

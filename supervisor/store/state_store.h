// The supervisor's persistent state: runs, their attempts and ranks, and each
// run's event history, in one SQLite file under the state directory, so that
// a restarted trainsupd (and `trainctl` after it) sees the full history.
// Checkpoints are not stored here: the daemon lists them from the run
// directory.
//
// Durability: WAL journal, synchronous=FULL (a call that returned OK survives
// a crash of the process or the machine), foreign keys enforced. The file is
// created with mode 0600 (it holds per-attempt worker tokens) and set to 0600
// again on every open. Every call that writes more than one row runs in a
// transaction; a failed call leaves the store as it was and returns the
// error with the operation and run named in its message.
//
// Not thread-safe: one StateStore owns one SQLite connection and is used by
// the daemon's event-loop thread only. Other connections to the file (the
// sqlite3 shell, a backup) are tolerated: a call waits up to kBusyTimeoutMs
// for their locks before it returns Unavailable.
//
// Error codes: NotFound (no such run, attempt or rank), AlreadyExists (a
// duplicate run_id or request_id), InvalidArgument (a bad argument or page
// token), FailedPrecondition (the file is of a newer schema, or not a
// trainsup store), DataLoss (the file or a stored row is corrupt),
// Unavailable (the database stayed locked past the busy timeout; retry),
// ResourceExhausted (disk full), Internal (anything else SQLite reports).
#ifndef TRAINSUP_SUPERVISOR_STORE_STATE_STORE_H_
#define TRAINSUP_SUPERVISOR_STORE_STATE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainsup/v1/supervisor.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace trainsup::supervisor {

// What the daemon keeps about a rank beyond its public RankStatus: enough to
// tell, after a daemon restart, whether a pid still is our worker (pid reuse)
// and to authenticate its reconnecting heartbeat stream.
struct RankPrivate {
  int pgid = 0;
  uint64_t start_ticks = 0;  // process start time (/proc/PID/stat field 22)
  std::string token;         // the attempt's TRAINSUP_TOKEN
};

// What the daemon has learnt about a run's step times, from which it derives
// the adaptive progress timeout.
struct RunLearning {
  double slowest_step_s = 0;
  int64_t steps_observed = 0;
};

// A slot an operator drained (trainctl drain): `slot` is the GPU's UUID
// for a GPU slot (its index may change across reboots), "cpu:N" for a CPU
// slot.
struct StoredDrain {
  std::string slot;
  std::string reason;
  int64_t drained_ms = 0;
};

struct RunPage {
  std::vector<v1::Run> runs;
  std::string next_page_token;  // empty on the last page
};

class StateStore {
 public:
  // The schema this build reads and writes (meta.schema_version).
  // A file of an older version is migrated on Open.
  static constexpr int kSchemaVersion = 7;
  static constexpr int kDefaultPageSize = 50;
  static constexpr int kMaxPageSize = 500;
  // How long a call waits for a lock held by another connection.
  static constexpr int kBusyTimeoutMs = 5000;

  // Opens the store at `path`, creating the file (mode 0600) and its schema
  // when missing; the directory must exist. FailedPrecondition if the file
  // was written by a newer schema version (it is left untouched) or holds
  // tables of something else; DataLoss if it is not a SQLite database.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& path);

  // Closes the connection; everything committed is already durable.
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Inserts a new run and gives it the next submit sequence number
  // (NextRunSeq). `run.attempts` and `run.checkpoints` are ignored.
  // `request_id` is the client's idempotency key; empty means none.
  // InvalidArgument on an empty run_id; AlreadyExists when run_id or
  // request_id is taken (nothing is written then).
  absl::Status CreateRun(const v1::Run& run, const std::string& request_id);

  // The run_id created with `request_id`. NotFound if none was;
  // InvalidArgument on an empty request_id.
  absl::StatusOr<std::string> FindRunByRequestId(const std::string& request_id);

  // Overwrites the stored run's scalar fields and progress with `run`'s.
  // run_id, created_ms and spec_toml are fixed at CreateRun and not
  // changed; attempts and checkpoints are ignored. NotFound if no such run.
  absl::Status UpdateRun(const v1::Run& run);

  // The full run: every field CreateRun/UpdateRun stored, with its attempts
  // in ascending number, each with its ranks in ascending rank. checkpoints
  // is empty. NotFound if no such run.
  absl::StatusOr<v1::Run> GetRun(const std::string& run_id);

  // One page of runs, newest submitted first, whose state is in `states`
  // (empty: every state), without attempts and spec_toml. `page_size` 0
  // means kDefaultPageSize and is capped at kMaxPageSize. `page_token` is
  // empty for the first page, else a next_page_token from an earlier call
  // (runs created since do not shift later pages). InvalidArgument on a
  // negative page_size, an unknown state or a malformed token.
  absl::StatusOr<RunPage> ListRuns(const std::vector<v1::RunState>& states, int page_size,
                                   const std::string& page_token);

  // Every run not in a terminal state (SUCCEEDED, FAILED, CANCELLED), full
  // as GetRun returns it, in submit order: what a restarted daemon resumes.
  absl::StatusOr<std::vector<v1::Run>> LoadUnfinishedRuns();

  // Inserts or overwrites attempt `attempt.number` (>= 1) of the run;
  // `attempt.ranks` is ignored (see UpsertRank). NotFound if no such run.
  absl::Status UpsertAttempt(const std::string& run_id, const v1::Attempt& attempt);

  // Inserts or overwrites rank `rank.rank` (>= 0) of an attempt, with its
  // private fields. NotFound if the attempt was not stored first.
  absl::Status UpsertRank(const std::string& run_id, int attempt, const v1::RankStatus& rank,
                          const RankPrivate& priv);

  // The private fields of a stored rank. NotFound if no such rank.
  absl::StatusOr<RankPrivate> GetRankPrivate(const std::string& run_id, int attempt, int rank);

  // Stores / reads what was learnt about the run's step times (zeros for a
  // new run). NotFound if no such run.
  absl::Status SetLearning(const std::string& run_id, const RunLearning& learning);
  absl::StatusOr<RunLearning> GetLearning(const std::string& run_id);

  // Appends `event` to its run's history (event->run_id names the run):
  // gives it the run's next sequence number (1, 2, ... without gaps), sets
  // event->seq to it and returns it. InvalidArgument on a null event or an
  // empty run_id; NotFound if no such run. Inside a Transaction that rolls
  // back, the number is given out again by the next append.
  absl::StatusOr<int64_t> AppendEvent(v1::RunEvent* event);

  // The run's events with seq > `after_seq`, ascending, at most `limit` of
  // them (limit <= 0: all). NotFound if no such run.
  absl::StatusOr<std::vector<v1::RunEvent>> ListEvents(const std::string& run_id, int64_t after_seq,
                                                       int limit);

  // The operators' drains: stored (replacing one of the same slot),
  // removed (none is no error), all of them by slot.
  absl::Status SetDrain(const StoredDrain& drain);
  absl::Status ClearDrain(const std::string& slot);
  absl::StatusOr<std::vector<StoredDrain>> ListDrains();

  // Runs `fn`, which calls the methods above, as one atomic and durable
  // change: committed when `fn` returns OK, rolled back (nothing of it
  // stored) when it returns an error, which is then returned. A call inside
  // `fn` that fails is undone on its own; `fn` decides whether the whole
  // group fails. FailedPrecondition when called from inside `fn` (nesting
  // is not supported).
  absl::Status Transaction(const std::function<absl::Status()>& fn);

  // The sequence number the next CreateRun will give (1 for an empty store).
  absl::StatusOr<int64_t> NextRunSeq();

  // A prepared statement in use (state_store_query.h): named here for the
  // store's own files; nothing outside supervisor/store/ has its definition.
  class Query;

 private:
  struct DbCloser {
    void operator()(sqlite3* db) const;
  };
  struct StmtFinalizer {
    void operator()(sqlite3_stmt* stmt) const;
  };

  explicit StateStore(std::unique_ptr<sqlite3, DbCloser> db);

  // Pragmas, then the schema created or checked.
  absl::Status Initialize();
  // Brings a store of schema version `from` to kSchemaVersion (inside
  // Initialize's transaction).
  absl::Status Migrate(int64_t from);
  // The statement for `sql`, prepared once and cached, ready to bind;
  // errors are reported as those of operation `op`.
  absl::StatusOr<Query> Prepare(const char* sql, const std::string& op);
  // Runs a statement that returns no rows.
  absl::Status Exec(const char* sql, const std::string& op);
  // Runs `fn` in a transaction (BEGIN IMMEDIATE when `write`), or as part of
  // the enclosing one when a transaction is already open.
  absl::Status InTransaction(bool write, const std::string& op,
                             const std::function<absl::Status()>& fn);
  absl::StatusOr<int64_t> ReadNextRunSeq(const std::string& op);
  // GetRun without its own transaction.
  absl::StatusOr<v1::Run> ReadFullRun(const std::string& run_id, const std::string& op);
  absl::Status ReadAttempts(v1::Run* run, const std::string& op);
  absl::StatusOr<bool> RunExists(const std::string& run_id, const std::string& op);
  // Fills `run` from a row of a run SELECT (columns in RunColumn order).
  static absl::Status RunFromRow(const Query& q, v1::Run* run);

  std::unique_ptr<sqlite3, DbCloser> db_;
  // Declared after db_, so statements are finalized before it closes.
  std::unordered_map<std::string, std::unique_ptr<sqlite3_stmt, StmtFinalizer>> statements_;
  bool in_transaction_ = false;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_STORE_STATE_STORE_H_

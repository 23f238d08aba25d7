// Internal to the state store (state_store.cc, state_store_rows.cc): the
// statement wrapper, the run columns and the helpers both files use.
#ifndef TRAINSUP_SUPERVISOR_STORE_STATE_STORE_QUERY_H_
#define TRAINSUP_SUPERVISOR_STORE_STATE_STORE_QUERY_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "supervisor/store/state_store.h"

namespace trainsup::supervisor {
namespace store_internal {

// The absl code for SQLite result code `rc`.
absl::StatusCode CodeOf(int rc);
// The status for SQLite result `rc` of operation `op`, with its message.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& op);
// ListRuns page tokens: an opaque form of the seq to continue below.
std::string PageToken(int64_t seq);
absl::StatusOr<int64_t> ParsePageToken(const std::string& token);

// Column order shared by the two run SELECTs and RunFromRow.
enum RunColumn {
  kRunId,
  kName,
  kState,
  kPriority,
  kWorldSize,
  kCreatedMs,
  kUpdatedMs,
  kEndedMs,
  kReason,
  kRestarts,
  kOomRestarts,
  kProgress,
  kRunDir,
  kNextRestartMs,
  kSpecToml,
  kSeq,
  kClusterSubmission,
  kRollbacks,
  kSkipWindows,
  kStopRequest,
};

inline constexpr char kSelectRun[] =
    "SELECT run_id, name, state, priority, world_size, created_ms, updated_ms, ended_ms, reason,"
    " restarts, oom_restarts, progress, run_dir, next_restart_ms, spec_toml, seq,"
    " cluster_submission, rollbacks, skip_windows, stop_request FROM runs WHERE run_id = ?1";

// ?2 is a bit mask of the wanted states, 0 for all of them.
inline constexpr char kListRuns[] =
    "SELECT run_id, name, state, priority, world_size, created_ms, updated_ms, ended_ms, reason,"
    " restarts, oom_restarts, progress, run_dir, next_restart_ms, '', seq, cluster_submission,"
    " rollbacks, skip_windows, stop_request FROM runs WHERE seq < ?1 AND (?2 = 0 OR (state BETWEEN "
    "0 AND 62 AND "
    "(?2 >> state) & 1 = 1))"
    " ORDER BY seq DESC LIMIT ?3";

}  // namespace store_internal

// A cached statement in use: parameters are bound in order (?1, ?2, ...),
// and the destructor resets it, so that no statement keeps a read
// transaction open between calls.
class StateStore::Query {
 public:
  Query(sqlite3* db, sqlite3_stmt* stmt, std::string op)
      : db_(db), stmt_(stmt), op_(std::move(op)) {}
  Query(Query&& other) noexcept
      : db_(other.db_),
        stmt_(std::exchange(other.stmt_, nullptr)),
        op_(std::move(other.op_)),
        next_(other.next_),
        status_(std::move(other.status_)) {}
  Query& operator=(Query&&) = delete;
  ~Query() {
    if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
  }

  Query& BindInt(int64_t v) { return Check(sqlite3_bind_int64(stmt_, next_++, v)); }
  Query& BindDouble(double v) { return Check(sqlite3_bind_double(stmt_, next_++, v)); }
  Query& BindText(const std::string& v) {
    return Check(
        sqlite3_bind_text64(stmt_, next_++, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  // Empty binds NULL (no value; UNIQUE allows any number of them).
  Query& BindTextOrNull(const std::string& v) {
    if (v.empty()) return Check(sqlite3_bind_null(stmt_, next_++));
    return BindText(v);
  }
  // An unset message binds NULL, a set one its serialization (maybe empty).
  Query& BindMessage(bool present, const google::protobuf::Message& m) {
    if (!present) return Check(sqlite3_bind_null(stmt_, next_++));
    std::string bytes;
    if (!m.SerializeToString(&bytes)) {
      if (status_.ok())
        status_ = absl::InternalError(absl::StrCat(op_, ": cannot serialize ", m.GetTypeName()));
      ++next_;
      return *this;
    }
    // A non-null pointer even when empty: a null one would bind NULL.
    return Check(sqlite3_bind_blob64(stmt_, next_++, bytes.data(), bytes.size(), SQLITE_TRANSIENT));
  }

  // True with a row to read, false when done.
  absl::StatusOr<bool> Step() {
    if (!status_.ok()) return status_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return store_internal::SqliteError(db_, rc, op_);
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    absl::StatusOr<bool> row = Step();
    if (!row.ok()) return row.status();
    if (*row) return absl::InternalError(absl::StrCat(op_, ": statement returned a row"));
    return absl::OkStatus();
  }
  // Steps through every row, calling `on_row` while it is OK; its first
  // error, or a step's, is returned.
  absl::Status ForEachRow(const std::function<absl::Status()>& on_row) {
    for (;;) {
      absl::StatusOr<bool> row = Step();
      if (!row.ok()) return row.status();
      if (!*row) return absl::OkStatus();
      if (absl::Status s = on_row(); !s.ok()) return s;
    }
  }
  // Rows changed by the last Run.
  int Changes() const { return sqlite3_changes(db_); }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) const { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
  }
  // Parses a message column; a NULL column leaves `m` unset (*present false).
  absl::Status Message(int col, google::protobuf::Message* m, bool* present) const {
    *present = !IsNull(col);
    if (!*present) return absl::OkStatus();
    if (!m->ParseFromString(Blob(col))) {
      return absl::DataLossError(
          absl::StrCat(op_, ": stored ", m->GetTypeName(), " does not parse"));
    }
    return absl::OkStatus();
  }

 private:
  Query& Check(int rc) {
    if (rc != SQLITE_OK && status_.ok()) status_ = store_internal::SqliteError(db_, rc, op_);
    return *this;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string op_;
  int next_ = 1;
  absl::Status status_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_STORE_STATE_STORE_QUERY_H_

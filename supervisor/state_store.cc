#include "supervisor/state_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace trainsup::supervisor {
namespace {

constexpr char kPageTokenPrefix[] = "seq:";

// Version 2 (version 1 lacked attempts.stop_requested; Initialize migrates
// it). A later version adds a migration from each older one in Initialize
// and bumps kSchemaVersion; nothing is ever renumbered.
constexpr char kSchema[] = R"sql(
CREATE TABLE runs (
  run_id          TEXT PRIMARY KEY NOT NULL,
  seq             INTEGER NOT NULL UNIQUE,
  request_id      TEXT UNIQUE,
  name            TEXT NOT NULL DEFAULT '',
  state           INTEGER NOT NULL DEFAULT 0,
  priority        INTEGER NOT NULL DEFAULT 0,
  world_size      INTEGER NOT NULL DEFAULT 0,
  created_ms      INTEGER NOT NULL DEFAULT 0,
  updated_ms      INTEGER NOT NULL DEFAULT 0,
  ended_ms        INTEGER NOT NULL DEFAULT 0,
  spec_toml       TEXT NOT NULL DEFAULT '',
  reason          TEXT NOT NULL DEFAULT '',
  restarts        INTEGER NOT NULL DEFAULT 0,
  oom_restarts    INTEGER NOT NULL DEFAULT 0,
  progress        BLOB,
  run_dir         TEXT NOT NULL DEFAULT '',
  next_restart_ms INTEGER NOT NULL DEFAULT 0,
  slowest_step_s  REAL NOT NULL DEFAULT 0,
  steps_observed  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_state ON runs (state, seq);
CREATE TABLE attempts (
  run_id            TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  number            INTEGER NOT NULL,
  started_ms        INTEGER NOT NULL DEFAULT 0,
  ended_ms          INTEGER NOT NULL DEFAULT 0,
  resumed_from_step INTEGER NOT NULL DEFAULT -1,
  resumed_from      TEXT NOT NULL DEFAULT '',
  exit_class        INTEGER NOT NULL DEFAULT 0,
  exit_reason       TEXT NOT NULL DEFAULT '',
  stop_requested    INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, number)
);
CREATE TABLE ranks (
  run_id            TEXT NOT NULL,
  attempt           INTEGER NOT NULL,
  rank              INTEGER NOT NULL,
  pid               INTEGER NOT NULL DEFAULT 0,
  pgid              INTEGER NOT NULL DEFAULT 0,
  start_ticks       INTEGER NOT NULL DEFAULT 0,
  slot              INTEGER NOT NULL DEFAULT 0,
  gpu               TEXT NOT NULL DEFAULT '',
  token             TEXT NOT NULL DEFAULT '',
  alive             INTEGER NOT NULL DEFAULT 0,
  exit_code         INTEGER NOT NULL DEFAULT -1,
  signal            INTEGER NOT NULL DEFAULT 0,
  exit_class        INTEGER NOT NULL DEFAULT 0,
  exit_reason       TEXT NOT NULL DEFAULT '',
  last_heartbeat_ms INTEGER NOT NULL DEFAULT 0,
  progress          BLOB,
  log_path          TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (run_id, attempt, rank),
  FOREIGN KEY (run_id, attempt) REFERENCES attempts (run_id, number) ON DELETE CASCADE
);
CREATE TABLE events (
  run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  seq     INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  kind    INTEGER NOT NULL,
  payload BLOB NOT NULL,
  PRIMARY KEY (run_id, seq)
);
)sql";

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
};

constexpr char kSelectRun[] =
    "SELECT run_id, name, state, priority, world_size, created_ms, updated_ms, ended_ms, reason,"
    " restarts, oom_restarts, progress, run_dir, next_restart_ms, spec_toml, seq"
    " FROM runs WHERE run_id = ?1";

// ?2 is a bit mask of the wanted states, 0 for all of them.
constexpr char kListRuns[] =
    "SELECT run_id, name, state, priority, world_size, created_ms, updated_ms, ended_ms, reason,"
    " restarts, oom_restarts, progress, run_dir, next_restart_ms, '', seq"
    " FROM runs WHERE seq < ?1 AND (?2 = 0 OR (state BETWEEN 0 AND 62 AND (?2 >> state) & 1 = 1))"
    " ORDER BY seq DESC LIMIT ?3";

absl::StatusCode CodeOf(int rc) {
  switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE:
      return absl::StatusCode::kAlreadyExists;
    case SQLITE_CONSTRAINT_FOREIGNKEY:
      return absl::StatusCode::kNotFound;
    default:
      break;
  }
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG:
      return absl::StatusCode::kInvalidArgument;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInternal;
  }
}

// `rc` came from the most recent call on `db`, so sqlite3_errmsg describes it.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& op) {
  std::string what = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) {
    what = absl::StrCat("no such run or attempt (", what, ")");
  }
  return absl::Status(CodeOf(rc), absl::StrCat(op, ": ", what, " [sqlite ", rc, "]"));
}

absl::Status ErrnoError(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// SQLite gives the -wal and -shm files the main file's mode, so 0600 here
// covers them too. A new file's directory entry is made durable before any
// transaction is committed into it.
absl::Status PrepareFile(const std::string& path) {
  bool created = true;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  }
  if (fd < 0) return ErrnoError(errno, absl::StrCat("opening ", path));
  const int chmod_rc = fchmod(fd, 0600);
  const int chmod_err = errno;
  close(fd);
  if (chmod_rc != 0) return ErrnoError(chmod_err, absl::StrCat("chmod 0600 ", path));
  if (created) {
    const std::string dir = DirName(path);
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return ErrnoError(errno, absl::StrCat("opening ", dir));
    const int sync_rc = fsync(dfd);
    const int sync_err = errno;
    close(dfd);
    if (sync_rc != 0) return ErrnoError(sync_err, absl::StrCat("fsync ", dir));
  }
  return absl::OkStatus();
}

std::string PageToken(int64_t seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenPrefix, seq));
}

absl::StatusOr<int64_t> ParsePageToken(const std::string& token) {
  std::string raw;
  int64_t seq = 0;
  const absl::string_view prefix(kPageTokenPrefix);
  if (!absl::WebSafeBase64Unescape(token, &raw) || !absl::StartsWith(raw, prefix) ||
      !absl::SimpleAtoi(absl::string_view(raw).substr(prefix.size()), &seq) || seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ListRuns: malformed page_token '", token, "'"));
  }
  return seq;
}

}  // namespace

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
    return SqliteError(db_, rc, op_);
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
    if (rc != SQLITE_OK && status_.ok()) status_ = SqliteError(db_, rc, op_);
    return *this;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string op_;
  int next_ = 1;
  absl::Status status_;
};

void StateStore::DbCloser::operator()(sqlite3* db) const { sqlite3_close_v2(db); }
void StateStore::StmtFinalizer::operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }

StateStore::StateStore(std::unique_ptr<sqlite3, DbCloser> db) : db_(std::move(db)) {}

StateStore::~StateStore() = default;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path) {
  const std::string op = absl::StrCat("opening state store ", path);
  if (absl::Status s = PrepareFile(path); !s.ok()) return s;
  sqlite3* raw = nullptr;
  // sqlite3_open_v2 may hand back a connection even when it fails; it is
  // owned (and closed) either way.
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<sqlite3, DbCloser> db(raw);
  if (rc != SQLITE_OK) return SqliteError(db.get(), rc, op);
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  std::unique_ptr<StateStore> store(new StateStore(std::move(db)));
  if (absl::Status s = store->Initialize(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(op, ": ", s.message()));
  }
  return store;
}

absl::Status StateStore::Initialize() {
  if (absl::Status s = Exec("PRAGMA synchronous = FULL", "setting synchronous"); !s.ok()) return s;
  if (absl::Status s = Exec("PRAGMA foreign_keys = ON", "setting foreign_keys"); !s.ok()) return s;
  {
    absl::StatusOr<Query> q = Prepare("PRAGMA foreign_keys", "reading foreign_keys");
    if (!q.ok()) return q.status();
    absl::StatusOr<bool> row = q->Step();
    if (!row.ok()) return row.status();
    if (!*row || q->Int(0) != 1) {
      return absl::InternalError("this SQLite does not enforce foreign keys");
    }
  }
  // The schema is checked before anything else is written, so that a file
  // of a newer version is left as it was.
  const std::string op = "checking the schema";
  absl::Status schema = InTransaction(true, op, [&]() -> absl::Status {
    if (absl::Status s = Exec(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value NOT NULL)", op);
        !s.ok()) {
      return s;
    }
    int64_t version = 0;
    bool found = false;
    {
      absl::StatusOr<Query> q = Prepare("SELECT value FROM meta WHERE key = 'schema_version'", op);
      if (!q.ok()) return q.status();
      absl::StatusOr<bool> row = q->Step();
      if (!row.ok()) return row.status();
      found = *row;
      if (found) version = q->Int(0);
    }
    if (found) {
      if (version > kSchemaVersion) {
        return absl::FailedPreconditionError(
            absl::StrCat("schema_version ", version, " is newer than this build's ", kSchemaVersion,
                         "; use a newer trainsupd"));
      }
      if (version < 1) return absl::DataLossError(absl::StrCat("bad schema_version ", version));
      if (version == 1) {
        // 1 -> 2: attempts.stop_requested.
        if (absl::Status s = Exec("ALTER TABLE attempts ADD COLUMN stop_requested INTEGER NOT NULL"
                                  " DEFAULT 0",
                                  "migrating the schema from version 1");
            !s.ok()) {
          return s;
        }
        absl::StatusOr<Query> q =
            Prepare("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", op);
        if (!q.ok()) return q.status();
        q->BindInt(kSchemaVersion);
        return q->Run();
      }
      return absl::OkStatus();
    }
    {
      absl::StatusOr<Query> q =
          Prepare("SELECT count(*) FROM sqlite_master WHERE tbl_name != 'meta'", op);
      if (!q.ok()) return q.status();
      absl::StatusOr<bool> row = q->Step();
      if (!row.ok()) return row.status();
      if (*row && q->Int(0) != 0) {
        return absl::FailedPreconditionError(
            "the database holds other tables and no schema_version: not a trainsup state store");
      }
    }
    char* error = nullptr;
    const int rc = sqlite3_exec(db_.get(), kSchema, nullptr, nullptr, &error);
    sqlite3_free(error);
    if (rc != SQLITE_OK) return SqliteError(db_.get(), rc, "creating the schema");
    absl::StatusOr<Query> q =
        Prepare("INSERT INTO meta (key, value) VALUES ('schema_version', ?1)", op);
    if (!q.ok()) return q.status();
    q->BindInt(kSchemaVersion);
    return q->Run();
  });
  if (!schema.ok()) return schema;
  // Persistent in the file: switched once, kept on every later open.
  {
    absl::StatusOr<Query> q = Prepare("PRAGMA journal_mode = WAL", "setting journal_mode");
    if (!q.ok()) return q.status();
    absl::StatusOr<bool> row = q->Step();
    if (!row.ok()) return row.status();
    const std::string mode = *row ? q->Text(0) : std::string();
    if (mode != "wal") {
      return absl::FailedPreconditionError(absl::StrCat("journal_mode is '", mode, "', not 'wal'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateStore::Query> StateStore::Prepare(const char* sql, const std::string& op) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* raw = nullptr;
    const int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
    std::unique_ptr<sqlite3_stmt, StmtFinalizer> stmt(raw);
    if (rc != SQLITE_OK) return SqliteError(db_.get(), rc, op);
    it = statements_.emplace(sql, std::move(stmt)).first;
  }
  // One Query per statement at a time: a second one would reset the first
  // under its reader.
  if (sqlite3_stmt_busy(it->second.get())) {
    return absl::InternalError(absl::StrCat(op, ": statement already in use: ", sql));
  }
  return Query(db_.get(), it->second.get(), op);
}

absl::Status StateStore::Exec(const char* sql, const std::string& op) {
  absl::StatusOr<Query> q = Prepare(sql, op);
  if (!q.ok()) return q.status();
  return q->Run();
}

absl::Status StateStore::InTransaction(bool write, const std::string& op,
                                       const std::function<absl::Status()>& fn) {
  if (in_transaction_) return fn();
  if (absl::Status s = Exec(write ? "BEGIN IMMEDIATE" : "BEGIN", op); !s.ok()) return s;
  in_transaction_ = true;
  absl::Status s = fn();
  in_transaction_ = false;
  // Some errors (disk full, I/O) make SQLite roll the whole transaction
  // back by itself; committing then would store half of `fn`.
  const bool still_open = sqlite3_get_autocommit(db_.get()) == 0;
  if (s.ok() && !still_open) {
    s = absl::AbortedError(absl::StrCat(op, ": SQLite rolled the transaction back"));
  }
  if (s.ok()) s = Exec("COMMIT", op);
  if (!s.ok() && sqlite3_get_autocommit(db_.get()) == 0) Exec("ROLLBACK", op).IgnoreError();
  return s;
}

absl::Status StateStore::Transaction(const std::function<absl::Status()>& fn) {
  if (in_transaction_) {
    return absl::FailedPreconditionError("Transaction: nested transactions are not supported");
  }
  return InTransaction(true, "Transaction", fn);
}

absl::StatusOr<int64_t> StateStore::ReadNextRunSeq(const std::string& op) {
  absl::StatusOr<Query> q = Prepare("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs", op);
  if (!q.ok()) return q.status();
  absl::StatusOr<bool> row = q->Step();
  if (!row.ok()) return row.status();
  return q->Int(0);
}

absl::StatusOr<int64_t> StateStore::NextRunSeq() { return ReadNextRunSeq("NextRunSeq"); }

absl::StatusOr<bool> StateStore::RunExists(const std::string& run_id, const std::string& op) {
  absl::StatusOr<Query> q = Prepare("SELECT 1 FROM runs WHERE run_id = ?1", op);
  if (!q.ok()) return q.status();
  q->BindText(run_id);
  return q->Step();
}

absl::Status StateStore::CreateRun(const v1::Run& run, const std::string& request_id) {
  const std::string op = absl::StrCat("CreateRun ", run.run_id());
  if (run.run_id().empty()) return absl::InvalidArgumentError("CreateRun: empty run_id");
  return InTransaction(true, op, [&]() -> absl::Status {
    absl::StatusOr<int64_t> seq = ReadNextRunSeq(op);
    if (!seq.ok()) return seq.status();
    absl::StatusOr<Query> q = Prepare(
        "INSERT INTO runs (run_id, seq, request_id, name, state, priority, world_size, created_ms,"
        " updated_ms, ended_ms, spec_toml, reason, restarts, oom_restarts, progress, run_dir,"
        " next_restart_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "?15, ?16, ?17)",
        op);
    if (!q.ok()) return q.status();
    q->BindText(run.run_id())
        .BindInt(*seq)
        .BindTextOrNull(request_id)
        .BindText(run.name())
        .BindInt(run.state())
        .BindInt(run.priority())
        .BindInt(run.world_size())
        .BindInt(run.created_ms())
        .BindInt(run.updated_ms())
        .BindInt(run.ended_ms())
        .BindText(run.spec_toml())
        .BindText(run.reason())
        .BindInt(run.restarts())
        .BindInt(run.oom_restarts())
        .BindMessage(run.has_progress(), run.progress())
        .BindText(run.run_dir())
        .BindInt(run.next_restart_ms());
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
  absl::StatusOr<Query> q = Prepare(
      "UPDATE runs SET name = ?2, state = ?3, priority = ?4, world_size = ?5, updated_ms = ?6,"
      " ended_ms = ?7, reason = ?8, restarts = ?9, oom_restarts = ?10, progress = ?11, run_dir = "
      "?12,"
      " next_restart_ms = ?13 WHERE run_id = ?1",
      op);
  if (!q.ok()) return q.status();
  q->BindText(run.run_id())
      .BindText(run.name())
      .BindInt(run.state())
      .BindInt(run.priority())
      .BindInt(run.world_size())
      .BindInt(run.updated_ms())
      .BindInt(run.ended_ms())
      .BindText(run.reason())
      .BindInt(run.restarts())
      .BindInt(run.oom_restarts())
      .BindMessage(run.has_progress(), run.progress())
      .BindText(run.run_dir())
      .BindInt(run.next_restart_ms());
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
  v1::Progress progress;
  bool present = false;
  if (absl::Status s = q.Message(kProgress, &progress, &present); !s.ok()) return s;
  if (present) *run->mutable_progress() = std::move(progress);
  return absl::OkStatus();
}

absl::Status StateStore::ReadAttempts(v1::Run* run, const std::string& op) {
  std::map<int64_t, v1::Attempt*> by_number;
  {
    absl::StatusOr<Query> q = Prepare(
        "SELECT number, started_ms, ended_ms, resumed_from_step, resumed_from, exit_class, "
        "exit_reason, stop_requested"
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
      " exit_class, exit_reason, stop_requested) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
      " ON CONFLICT (run_id, number) DO UPDATE SET started_ms = excluded.started_ms,"
      " ended_ms = excluded.ended_ms, resumed_from_step = excluded.resumed_from_step,"
      " resumed_from = excluded.resumed_from, exit_class = excluded.exit_class,"
      " exit_reason = excluded.exit_reason, stop_requested = excluded.stop_requested",
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
      .BindInt(attempt.stop_requested() ? 1 : 0);
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

#include "supervisor/store/state_store.h"

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
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "supervisor/store/state_store_query.h"

namespace trainsup::supervisor {

namespace store_internal {

constexpr char kPageTokenPrefix[] = "seq:";

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

absl::Status SqliteError(sqlite3* db, int rc, const std::string& op) {
  std::string what = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) {
    what = absl::StrCat("no such run or attempt (", what, ")");
  }
  return absl::Status(CodeOf(rc), absl::StrCat(op, ": ", what, " [sqlite ", rc, "]"));
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

}  // namespace store_internal

using store_internal::CodeOf;
using store_internal::SqliteError;

namespace {

// Version 7 (version 1 lacked attempts.stop_requested, version 2
// attempts.generation, version 3 runs.cluster_submission, version 4
// runs.rollbacks and runs.skip_windows, version 5 attempts.world_size and
// the drains table, version 6 runs.stop_request; Initialize migrates them).
// Each version's changes from the one before (nothing is ever renumbered; a
// new version appends its row).
struct Migration {
  int64_t to;
  std::vector<const char*> sql;
};
const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> kMigrations = {
      // attempts.stop_requested.
      {2, {"ALTER TABLE attempts ADD COLUMN stop_requested INTEGER NOT NULL DEFAULT 0"}},
      // attempts.generation (multi-node runs).
      {3, {"ALTER TABLE attempts ADD COLUMN generation INTEGER NOT NULL DEFAULT 0"}},
      // runs.cluster_submission (a multi-node job's identity).
      {4, {"ALTER TABLE runs ADD COLUMN cluster_submission TEXT NOT NULL DEFAULT ''"}},
      // runs.rollbacks and runs.skip_windows (the guard's rollbacks, docs/guard.md).
      {5,
       {"ALTER TABLE runs ADD COLUMN rollbacks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN skip_windows BLOB"}},
      // attempts.world_size and the operators' drains (elastic gangs,
      // docs/distributed.md).
      {6,
       {"ALTER TABLE attempts ADD COLUMN world_size INTEGER NOT NULL DEFAULT 0",
        "CREATE TABLE drains (slot TEXT PRIMARY KEY NOT NULL, reason TEXT NOT NULL DEFAULT '',"
        " drained_ms INTEGER NOT NULL DEFAULT 0)"}},
      // runs.stop_request (a requested stop outlives the daemon, issue 42).
      {7, {"ALTER TABLE runs ADD COLUMN stop_request BLOB"}},
  };
  return kMigrations;
}

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
  steps_observed  INTEGER NOT NULL DEFAULT 0,
  cluster_submission TEXT NOT NULL DEFAULT '',
  rollbacks       INTEGER NOT NULL DEFAULT 0,
  skip_windows    BLOB,
  stop_request    BLOB
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
  generation        INTEGER NOT NULL DEFAULT 0,
  world_size        INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, number)
);
CREATE TABLE drains (
  slot       TEXT PRIMARY KEY NOT NULL,
  reason     TEXT NOT NULL DEFAULT '',
  drained_ms INTEGER NOT NULL DEFAULT 0
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

// `rc` came from the most recent call on `db`, so sqlite3_errmsg describes it.

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

}  // namespace

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

absl::Status StateStore::Migrate(int64_t from) {
  for (const Migration& m : Migrations()) {
    if (m.to <= from) continue;
    for (const char* sql : m.sql) {
      if (absl::Status s = Exec(sql, absl::StrCat("migrating the schema from version ", from));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
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
      if (version == kSchemaVersion) return absl::OkStatus();
      if (absl::Status s = Migrate(version); !s.ok()) return s;
      absl::StatusOr<Query> q =
          Prepare("UPDATE meta SET value = ?1 WHERE key = 'schema_version'", op);
      if (!q.ok()) return q.status();
      q->BindInt(kSchemaVersion);
      return q->Run();
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

}  // namespace trainsup::supervisor

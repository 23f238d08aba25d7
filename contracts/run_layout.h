// Where things are on disk, defined once for trainsupd, the worker, trainctl
// and the tests (after LevelDB's db/filename.cc). Two trees:
//
//   STATE_DIR/                      the daemon's state directory
//     trainsupd.db                  the state store (SQLite, 0600)
//     run/trainsupd.sock            the API socket, unless configured
//     auth/operator.token           generated tokens (0600)
//     auth/viewer.token             (0640)
//     runs/RUN_ID/                  one run directory per run:
//
//   RUN_DIR/
//     spec.toml                     the frozen spec, written once at submit
//     attempts/A/rank-R.log         the rank's stdout and stderr (A from 1)
//     attempts/A/rank-R.exit.json   its exit file (contracts/exit_file.h)
//     checkpoints/                  the run's one checkpoint store, whatever
//       step-N/                     its world size: rank 0 writes it, every
//                                   rank resumes from it (checkpoint/store.h
//                                   names the step-N directories)
//
// Pure string functions: nothing here touches the file system. Paths are
// joined with exactly one '/' between components, so a state directory of
// "/" gives "/runs/ID", never "//runs/ID".
#ifndef TRAINSUP_CONTRACTS_RUN_LAYOUT_H_
#define TRAINSUP_CONTRACTS_RUN_LAYOUT_H_

#include <string>

namespace trainsup {

// Joins two path components with one '/' ("" on either side: the other).
std::string JoinPaths(const std::string& a, const std::string& b);

class StateLayout {
 public:
  explicit StateLayout(std::string state_dir) : dir_(std::move(state_dir)) {}
  const std::string& dir() const { return dir_; }
  std::string StorePath() const;                         // STATE_DIR/trainsupd.db
  std::string DefaultSocketPath() const;                 // STATE_DIR/run/trainsupd.sock
  std::string AuthDir() const;                           // STATE_DIR/auth
  std::string TokenPath(const std::string& role) const;  // STATE_DIR/auth/ROLE.token
  std::string RunsDir() const;                           // STATE_DIR/runs
  std::string RunDir(const std::string& run_id) const;   // STATE_DIR/runs/RUN_ID

 private:
  std::string dir_;
};

class RunLayout {
 public:
  explicit RunLayout(std::string run_dir) : dir_(std::move(run_dir)) {}
  const std::string& dir() const { return dir_; }
  std::string SpecPath() const;                           // RUN_DIR/spec.toml
  std::string AttemptsDir() const;                        // RUN_DIR/attempts
  std::string AttemptDir(int attempt) const;              // RUN_DIR/attempts/A
  std::string LogPath(int attempt, int rank) const;       // .../A/rank-R.log
  std::string ExitFilePath(int attempt, int rank) const;  // .../A/rank-R.exit.json
  std::string CheckpointsDir() const;                     // RUN_DIR/checkpoints
  // The checkpoint store `rank` of a `world_size` gang writes (rank 0) and
  // resumes from (every rank): CheckpointsDir() for every rank and world
  // size, since a gang has one store. The arguments stay so that a caller
  // says whose store it means.
  std::string CheckpointRoot(int rank, int world_size) const;

 private:
  std::string dir_;
};

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_RUN_LAYOUT_H_

// What trainctl prints, as pure functions of the API's messages: the runs
// table, `describe`, the `watch` progress line and event lines, node text,
// JSON, and the exit codes scripts rely on (docs/trainctl.md). Nothing here
// reads a clock, a terminal or the network; times come in as `now_ms` (unix
// milliseconds).
#ifndef TRAINSUP_SUPERVISOR_CTL_CTL_FORMAT_H_
#define TRAINSUP_SUPERVISOR_CTL_CTL_FORMAT_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {

// trainctl's exit codes. Stable: scripts test them.
inline constexpr int kExitOk = 0;               // done; watch: the run SUCCEEDED
inline constexpr int kExitRunFailed = 1;        // watch / submit --watch: the run FAILED
inline constexpr int kExitUsage = 2;            // bad command line
inline constexpr int kExitNotFound = 3;         // no such run
inline constexpr int kExitDenied = 4;           // unauthenticated or permission denied
inline constexpr int kExitUnreachable = 5;      // daemon unavailable or deadline exceeded
inline constexpr int kExitInvalidArgument = 6;  // the daemon rejected the request (e.g. the spec)
inline constexpr int kExitRunCancelled = 7;     // watch: the run was CANCELLED
inline constexpr int kExitOther = 8;            // anything else

// The exit code for a failed (or OK) call.
int ExitCodeForStatus(grpc::StatusCode code);
// The exit code of `watch` for a run that ended in `state`: kExitOk,
// kExitRunFailed or kExitRunCancelled; kExitOther for a state that is not final.
int ExitCodeForRunState(v1::RunState state);
// SUCCEEDED, FAILED or CANCELLED.
bool IsFinal(v1::RunState state);

// Enum names without their prefix ("RUNNING", "OOM", "ATTEMPT_STARTED");
// the number for a value this build does not know.
std::string ToString(v1::RunState state);
std::string ToString(v1::ExitClass exit_class);
std::string ToString(v1::Phase phase);
std::string ToString(v1::EventKind kind);
std::string ToString(v1::SlotState state);
// Parses a state, case-insensitively, with or without its prefix
// ("running", "RUN_STATE_RUNNING"). InvalidArgument listing the valid names.
absl::StatusOr<v1::RunState> RunStateFromString(absl::string_view name);
// Parses a comma-separated list of states ("running,failed"); empty items
// are skipped.
absl::StatusOr<std::vector<v1::RunState>> RunStatesFromString(absl::string_view list);

// "45s", "3m12s", "2h05m", "3d04h"; negative durations count as 0.
std::string FormatDuration(int64_t ms);
// "2026-11-29T13:45:01Z" (UTC, seconds); "-" for 0.
std::string FormatTimestamp(int64_t unix_ms);
// "512 B", "1.5 KiB", "3.2 GiB".
std::string FormatBytes(int64_t bytes);

// Milliseconds until `current.total_steps` is reached. From the step rate
// between `previous` and `current` when `previous` is given and is an earlier
// report with fewer steps; else from `current.samples_per_sec` and
// `samples_per_step` (samples one step of the reporting rank processes: its
// batch size; 0 when unknown). nullopt when the total or every rate is
// unknown.
std::optional<int64_t> EstimateEtaMs(const v1::Progress& current, const v1::Progress* previous,
                                     int64_t samples_per_step);

// The runs table of `ls`: a header (ID NAME STATE STEP/TOTAL RESTARTS AGE)
// and one aligned row per run; AGE is since the run was created.
std::string FormatRunsTable(const std::vector<v1::Run>& runs, int64_t now_ms);
// `describe`: state and reason, progress, attempts (exit class, reason, the
// step resumed from, ranks with pid, slot, GPU, heartbeat age and log path),
// checkpoints and the last heartbeat. Ends with a newline.
std::string FormatRunDescription(const v1::Run& run, int64_t now_ms);
// The step `run` has reached as far as its messages tell, the one every
// view shows: the total for a SUCCEEDED run that knows it (exit 0 means
// every step ran, while the last progress report, sent once per heartbeat
// interval, may be a few steps older); else the newer of the last progress
// report and the last checkpoint (a run stopped on request checkpoints
// after its last report).
int64_t ReachedStep(const v1::Run& run);

// The one-line progress of `watch`, without a newline:
// "[#####.....] 512/1000 51% loss 0.423 12.3 samples/s ETA 3m12s restarts 1",
// at ReachedStep, followed by the state when it is not RUNNING ("RESTARTING
// in 2s"; no ETA once the run is final), else by the phase when it is not
// training ("checkpointing") and "last report 1m05s ago" when rank 0's last
// report is older than 30 s. With `width` > 0 (a terminal's columns) the
// line has at most width - 1 characters, so it never wraps: the bar
// shrinks first (to 3 cells, then it is dropped), then fields are left out
// (samples/s, loss, restarts, last report, ETA, phase, in that order; the
// step and the state stay), then the text is cut.
std::string FormatProgressLine(const v1::Run& run, std::optional<int64_t> eta_ms, int64_t now_ms,
                               int width = 0);
// One event as a line without a newline, for logs and pipes:
// "2026-11-29T13:45:01Z run-1 attempt 2 RESTART exit 1 (crash); backoff 2.0 s".
std::string FormatEventLine(const v1::RunEvent& event);
// Whether `watch` on a terminal prints `event` above the progress line
// (everything but progress reports).
bool IsNotable(const v1::RunEvent& event);
// Folds `event` into `run` (state, reason, progress, restarts, next restart
// time) so that `watch` can redraw without asking the daemon again.
void ApplyEvent(const v1::RunEvent& event, v1::Run* run);
// `node`: host, version, uptime, run counts, GPUs and slots. Ends with a newline.
std::string FormatNode(const v1::Node& node);

// The message as JSON with the proto field names ("run_id"), every field
// including defaults; indented, or on one line (JSON Lines) when `indent` is
// false; no trailing newline. Enums keep their full proto names and int64
// fields are strings (the proto3 JSON mapping).
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool indent = true);

// The log file of rank `rank` in attempt `attempt` (0: the newest) of `run`:
// the rank's reported log_path, else <run_dir>/attempts/A/rank-R.log.
// FailedPrecondition when the run has no attempt yet, NotFound for an
// attempt it does not have, InvalidArgument for a rank outside the world.
absl::StatusOr<std::string> LogPath(const v1::Run& run, int attempt, int rank);
// The newest attempt's number; 0 when there is none.
int LatestAttempt(const v1::Run& run);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CTL_CTL_FORMAT_H_

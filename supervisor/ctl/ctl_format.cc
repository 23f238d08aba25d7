#include "supervisor/ctl/ctl_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"

namespace trainsup::supervisor {
namespace {

constexpr int kBarWidth = 10;
constexpr int kMinBarWidth = 3;
constexpr int64_t kStaleReportMs = 30'000;

// `line` cut to width - 1 columns (every character here is one column);
// unchanged when width <= 0. A line that filled the last column would leave
// the cursor waiting to wrap, where some terminals move it on the next
// character and "\r" no longer reaches the line's start.
std::string FitWidth(std::string line, int width) {
  if (width > 0 && static_cast<int>(line.size()) > width - 1) {
    line.resize(static_cast<size_t>(std::max(width - 1, 0)));
  }
  return line;
}

// Every enum of the API names its zero value <PREFIX>UNSPECIFIED; the
// prefix is derived from it rather than spelled out per enum.
std::string EnumPrefix(const google::protobuf::EnumDescriptor* d) {
  const std::string& zero = d->value(0)->name();
  return zero.substr(0, zero.size() - std::string("UNSPECIFIED").size());
}

template <typename E>
std::string ShortName(E value) {
  const google::protobuf::EnumDescriptor* d = google::protobuf::GetEnumDescriptor<E>();
  const google::protobuf::EnumValueDescriptor* v = d->FindValueByNumber(value);
  if (v == nullptr) return absl::StrCat(static_cast<int>(value));
  return std::string(absl::StripPrefix(v->name(), EnumPrefix(d)));
}

// Left-aligned columns two spaces apart; the last column is not padded.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::string& indent = "") {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Ago(int64_t then_ms, int64_t now_ms) {
  if (then_ms <= 0) return "-";
  return absl::StrCat(FormatDuration(now_ms - then_ms), " ago");
}

std::string StepOfTotal(int64_t step, const v1::Progress& p) {
  return absl::StrCat(step, "/", p.total_steps() > 0 ? absl::StrCat(p.total_steps()) : "?");
}

std::string StepOfTotal(const v1::Progress& p) { return StepOfTotal(p.step(), p); }

std::string Field(const std::string& label, const std::string& value) {
  return absl::StrFormat("%-16s%s\n", label + ":", value);
}

std::string Lower(v1::ExitClass c) { return absl::AsciiStrToLower(ToString(c)); }

const v1::Attempt* FindAttempt(const v1::Run& run, int number) {
  for (const auto& a : run.attempts()) {
    if (a.number() == number) return &a;
  }
  return nullptr;
}

std::string RankStatusText(const v1::RankStatus& r) {
  if (r.alive()) return "alive";
  if (r.signal() != 0) return absl::StrCat("signal ", r.signal(), " ", ToString(r.exit_class()));
  if (r.exit_code() >= 0)
    return absl::StrCat("exit ", r.exit_code(), " ", ToString(r.exit_class()));
  return ToString(r.exit_class());
}

}  // namespace

int ExitCodeForStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::NOT_FOUND:
      return kExitNotFound;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kExitDenied;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnreachable;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return kExitInvalidArgument;
    default:
      return kExitOther;
  }
}

int ExitCodeForRunState(v1::RunState state) {
  switch (state) {
    case v1::RUN_STATE_SUCCEEDED:
      return kExitOk;
    case v1::RUN_STATE_FAILED:
      return kExitRunFailed;
    case v1::RUN_STATE_CANCELLED:
      return kExitRunCancelled;
    default:
      return kExitOther;
  }
}

bool IsFinal(v1::RunState state) {
  return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED ||
         state == v1::RUN_STATE_CANCELLED;
}

std::string ToString(v1::RunState state) { return ShortName(state); }
std::string ToString(v1::ExitClass exit_class) { return ShortName(exit_class); }
std::string ToString(v1::Phase phase) { return ShortName(phase); }
std::string ToString(v1::EventKind kind) { return ShortName(kind); }
std::string ToString(v1::SlotState state) { return ShortName(state); }

absl::StatusOr<v1::RunState> RunStateFromString(absl::string_view name) {
  const google::protobuf::EnumDescriptor* d = v1::RunState_descriptor();
  const std::string prefix = EnumPrefix(d);
  std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(name));
  if (!absl::StartsWith(upper, prefix)) upper = prefix + upper;
  std::vector<std::string> valid;
  for (int i = 1; i < d->value_count(); ++i) {
    if (d->value(i)->name() == upper) return static_cast<v1::RunState>(d->value(i)->number());
    valid.push_back(absl::AsciiStrToLower(absl::StripPrefix(d->value(i)->name(), prefix)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown run state '", name, "'; expected one of ", absl::StrJoin(valid, ", ")));
}

absl::StatusOr<std::vector<v1::RunState>> RunStatesFromString(absl::string_view list) {
  std::vector<v1::RunState> states;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    absl::StatusOr<v1::RunState> s = RunStateFromString(item);
    if (!s.ok()) return s.status();
    states.push_back(*s);
  }
  return states;
}

std::string FormatDuration(int64_t ms) {
  const int64_t s = std::max<int64_t>(ms, 0) / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string FormatTimestamp(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit + 1 < 5) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::optional<int64_t> EstimateEtaMs(const v1::Progress& current, const v1::Progress* previous,
                                     int64_t samples_per_step) {
  if (current.total_steps() <= 0) return std::nullopt;
  const int64_t remaining = std::max<int64_t>(current.total_steps() - current.step(), 0);
  if (remaining == 0) return 0;
  if (previous != nullptr && previous->time_ms() < current.time_ms() &&
      previous->step() < current.step()) {
    const double ms_per_step = static_cast<double>(current.time_ms() - previous->time_ms()) /
                               static_cast<double>(current.step() - previous->step());
    return std::llround(remaining * ms_per_step);
  }
  if (samples_per_step > 0 && current.samples_per_sec() > 0) {
    return std::llround(1000.0 * remaining * samples_per_step / current.samples_per_sec());
  }
  return std::nullopt;
}

std::string FormatRunsTable(const std::vector<v1::Run>& runs, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "STEP/TOTAL", "RESTARTS", "AGE"}};
  for (const v1::Run& run : runs) {
    rows.push_back({run.run_id(), run.name().empty() ? "-" : run.name(), ToString(run.state()),
                    StepOfTotal(ReachedStep(run), run.progress()), absl::StrCat(run.restarts()),
                    FormatDuration(now_ms - run.created_ms())});
  }
  return FormatTable(rows);
}

namespace {

// `arg` as a POSIX shell word: bare when it is only safe characters, else
// in single quotes.
std::string ShellQuoted(const std::string& arg) {
  const bool bare = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
           absl::string_view("_-./=:,+@%").find(c) != absl::string_view::npos;
  });
  if (bare) return arg;
  return absl::StrCat("'", absl::StrReplaceAll(arg, {{"'", "'\\''"}}), "'");
}

}  // namespace

namespace {

// "4", or for an elastic spec "4 (elastic: 2 to 4)" (the spec's range).
std::string WorldSizeText(const v1::Run& run, const absl::StatusOr<RunSpec>& spec) {
  std::string out = absl::StrCat(run.world_size());
  if (spec.ok() && spec->min_world_size < spec->world_size) {
    absl::StrAppend(&out, " (elastic: ", spec->min_world_size, " to ", spec->world_size, ")");
  }
  return out;
}

// describe's first block: who, when, where, and a command run's command.
std::string DescribeRun(const v1::Run& run, int64_t now_ms) {
  const absl::StatusOr<RunSpec> spec = ParseRunSpec(run.spec_toml());
  std::string out = Field("Run", run.run_id());
  absl::StrAppend(&out, Field("Name", run.name()), Field("State", ToString(run.state())));
  if (!run.reason().empty()) absl::StrAppend(&out, Field("Reason", run.reason()));
  absl::StrAppend(&out, Field("Priority", absl::StrCat(run.priority())),
                  Field("World size", WorldSizeText(run, spec)),
                  Field("Created", absl::StrCat(FormatTimestamp(run.created_ms()), " (",
                                                Ago(run.created_ms(), now_ms), ")")),
                  Field("Updated", FormatTimestamp(run.updated_ms())));
  if (run.ended_ms() > 0) absl::StrAppend(&out, Field("Ended", FormatTimestamp(run.ended_ms())));
  absl::StrAppend(&out, Field("Run dir", run.run_dir()));
  if (!run.spec_toml().empty()) {
    if (spec.ok() && spec->has_command) {
      std::vector<std::string> words;
      for (const std::string& arg : spec->command.argv) words.push_back(ShellQuoted(arg));
      absl::StrAppend(
          &out, Field("Command", absl::StrJoin(words, " ")),
          Field("Heartbeats", spec->command.heartbeats ? "yes (frozen and hung detection)"
                                                       : "no (judged by exit code)"));
    }
  }
  return out;
}

// Progress, validation, memory, splits, restarts and the last heartbeat.
std::string DescribeProgress(const v1::Run& run, int64_t now_ms) {
  const v1::Progress& p = run.progress();
  std::string out;
  const int64_t step = ReachedStep(run);
  std::string progress = absl::StrCat("step ", StepOfTotal(step, p));
  if (p.total_steps() > 0) absl::StrAppend(&progress, " (", step * 100 / p.total_steps(), "%)");
  absl::StrAppend(&progress, ", epoch ", p.epoch());
  if (p.phase() != v1::PHASE_UNSPECIFIED) absl::StrAppend(&progress, ", ", ToString(p.phase()));
  if (p.step() > 0) absl::StrAppend(&progress, absl::StrFormat(", loss %.4g", p.loss()));
  if (p.samples_per_sec() > 0) {
    absl::StrAppend(&progress, absl::StrFormat(", %.1f samples/s", p.samples_per_sec()));
  }
  absl::StrAppend(&out, Field("Progress", progress));
  if (p.val_miou() > 0 || p.baseline_miou() > 0) {
    absl::StrAppend(
        &out, Field("Validation", absl::StrFormat("mIoU %.3f (majority-class baseline %.3f), "
                                                  "last step accuracy %.3f",
                                                  p.val_miou(), p.baseline_miou(), p.accuracy())));
  }
  if (p.memory_peak_bytes() > 0 || p.memory_budget_bytes() > 0) {
    absl::StrAppend(
        &out, Field("Memory",
                    absl::StrCat(FormatBytes(p.memory_current_bytes()), " now, ",
                                 FormatBytes(p.memory_peak_bytes()), " peak, budget ",
                                 p.memory_budget_bytes() > 0 ? FormatBytes(p.memory_budget_bytes())
                                                             : "none")));
  }
  if (p.splits() > 0 || p.oom_retries() > 0 || p.dropped_pieces() > 0) {
    absl::StrAppend(&out, Field("Splits", absl::StrCat(p.splits(), " splits, ", p.oom_retries(),
                                                       " OOM retries, ", p.dropped_pieces(),
                                                       " dropped pieces, ", p.wasted_forwards(),
                                                       " wasted forwards")));
  }
  if (p.nonfinite_steps() > 0 || p.spike_steps() > 0 || p.window_skipped_steps() > 0) {
    absl::StrAppend(
        &out, Field("Guard", absl::StrCat(p.nonfinite_steps(), " non-finite and ", p.spike_steps(),
                                          " spiking steps not applied, ", p.window_skipped_steps(),
                                          " steps of skip windows (this attempt)")));
  }
  if (p.has_tally() && p.tally().steps() >= 0) {
    const v1::TrainingTally& t = p.tally();
    std::string trained = absl::StrCat(t.applied(), " of ", t.steps(),
                                       " steps applied; skipped: ", t.skipped_window(),
                                       " in windows, ", t.skipped_guard(), " by the guard, ",
                                       t.skipped_scaler(), " by the loss scaler");
    if (t.final_metric() >= 0 && t.baseline_metric() >= 0) {
      absl::StrAppend(&trained, absl::StrFormat("; val mIoU %.4g vs baseline %.4g",
                                                t.final_metric(), t.baseline_metric()));
    }
    absl::StrAppend(&out, Field("Trained", trained));
  }
  absl::StrAppend(
      &out, Field("Restarts",
                  absl::StrCat(
                      run.restarts(), " (", run.oom_restarts(), " after OOM)",
                      run.rollbacks() > 0 ? absl::StrCat(", rollbacks ", run.rollbacks()) : "")));
  for (const v1::SkipWindow& w : run.skip_windows()) {
    std::string where =
        w.attempt() > 0
            ? absl::StrCat(
                  "after attempt ", w.attempt(), " diverged, ",
                  run.attempts_size() <= w.attempt()
                      ? absl::StrCat("the next attempt resumes before step ", w.first_step())
                  : w.resumed_from_step() >= 0
                      ? absl::StrCat("resumed from step ", w.resumed_from_step())
                      : std::string("resumed from scratch"))
            : std::string("from the spec");
    absl::StrAppend(&out, Field("Skip window", absl::StrCat("steps ", w.first_step(), "..",
                                                            w.last_step(), " (", where, ")",
                                                            w.reason().empty() || w.attempt() == 0
                                                                ? ""
                                                                : absl::StrCat(": ", w.reason()))));
  }
  if (run.state() == v1::RUN_STATE_RESTARTING && run.next_restart_ms() > 0) {
    absl::StrAppend(
        &out,
        Field("Next attempt", absl::StrCat("in ", FormatDuration(run.next_restart_ms() - now_ms))));
  }
  int64_t last_heartbeat = p.time_ms();
  if (const v1::Attempt* latest = FindAttempt(run, LatestAttempt(run))) {
    for (const auto& r : latest->ranks())
      last_heartbeat = std::max(last_heartbeat, r.last_heartbeat_ms());
  }
  absl::StrAppend(&out, Field("Last heartbeat", Ago(last_heartbeat, now_ms)));
  return out;
}

// Every attempt with its ranks.
std::string DescribeAttempts(const v1::Run& run, int64_t now_ms) {
  std::string out;
  if (run.attempts_size() > 0) absl::StrAppend(&out, "\nAttempts:\n");
  for (const v1::Attempt& a : run.attempts()) {
    const std::string ended = a.ended_ms() > 0 ? FormatTimestamp(a.ended_ms()) : "running";
    const int64_t took = (a.ended_ms() > 0 ? a.ended_ms() : now_ms) - a.started_ms();
    absl::StrAppend(&out, "  #", a.number(), "  ", FormatTimestamp(a.started_ms()), " .. ", ended,
                    a.started_ms() > 0 ? absl::StrCat(" (", FormatDuration(took), ")") : "", ", ");
    if (a.generation() > 0) absl::StrAppend(&out, "job generation ", a.generation(), ", ");
    if (a.world_size() > 0) {
      absl::StrAppend(&out, a.world_size(), a.world_size() == 1 ? " rank" : " ranks",
                      a.world_size() < run.world_size()
                          ? absl::StrCat(" of ", run.world_size(), " (elastic, smaller)")
                          : "",
                      ", ");
    }
    if (a.resumed_from_step() >= 0) {
      absl::StrAppend(&out, "resumed from step ", a.resumed_from_step(),
                      a.resumed_from().empty() ? "" : absl::StrCat(" (", a.resumed_from(), ")"),
                      "\n");
    } else {
      absl::StrAppend(&out, "from scratch\n");
    }
    if (a.exit_class() != v1::EXIT_CLASS_UNSPECIFIED) {
      absl::StrAppend(&out, "      exit ", ToString(a.exit_class()),
                      a.exit_reason().empty() ? "" : absl::StrCat(": ", a.exit_reason()), "\n");
    }
    if (a.ranks_size() == 0) continue;
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "PID", "SLOT", "GPU", "STATUS", "HEARTBEAT", "LOG"}};
    std::string reasons;
    for (const v1::RankStatus& r : a.ranks()) {
      rows.push_back({absl::StrCat(r.rank()), absl::StrCat(r.pid()), absl::StrCat(r.slot()),
                      r.gpu().empty() ? "-" : r.gpu(), RankStatusText(r),
                      Ago(r.last_heartbeat_ms(), now_ms), r.log_path()});
      if (!r.exit_reason().empty()) {
        absl::StrAppend(&reasons, "      rank ", r.rank(), ": ", r.exit_reason(), "\n");
      }
      if (r.straggler_ratio() > 0) {
        absl::StrAppend(
            &reasons, "      rank ", r.rank(), " (slot ", r.slot(), "): straggler: step compute ",
            absl::StrFormat("%.3g s, %.2g", r.window_compute_seconds(), r.straggler_ratio()),
            " times the other ranks' median\n");
      }
    }
    absl::StrAppend(&out, FormatTable(rows, "      "), reasons);
  }
  return out;
}

// A multi-node job's nodes (nothing for a single-node run).
std::string DescribeCluster(const v1::Run& run) {
  std::string out;
  if (run.has_cluster() && !run.cluster().job().empty()) {
    const v1::ClusterStatus& c = run.cluster();
    absl::StrAppend(&out, "\nJob ", c.job(), " (", c.nodes_expected(), " nodes x ",
                    c.ranks_per_node(), " ranks), generation ", c.generation(), ", ", c.restarts(),
                    " restarts of the job; this node: ", c.this_node(), "\n");
    if (!run.cluster_submission().empty()) {
      absl::StrAppend(&out, "  submission ", run.cluster_submission(), "\n");
    }
    absl::StrAppend(&out, "  etcd ", c.etcd_endpoints(), ": ",
                    c.etcd_reachable() ? "reachable" : "UNREACHABLE",
                    c.etcd_error().empty() ? "" : absl::StrCat(" (", c.etcd_error(), ")"), "\n");
    if (!c.last_reason().empty()) absl::StrAppend(&out, "  last change: ", c.last_reason(), "\n");
    std::vector<std::vector<std::string>> rows = {
        {"NODE", "NODE RANK", "RUN", "STATE", "GENERATION", "RANKS", "LEASE"}};
    for (const v1::ClusterNode& n : c.nodes()) {
      std::vector<std::string> ranks;
      for (const v1::RankStatus& r : n.ranks()) {
        ranks.push_back(
            absl::StrCat(r.rank(), ":", r.alive() ? "alive" : ToString(r.exit_class()),
                         r.progress().step() > 0 ? absl::StrCat("@", r.progress().step()) : ""));
      }
      rows.push_back({n.node(), n.node_rank() >= 0 ? absl::StrCat(n.node_rank()) : "-",
                      n.run_id().empty() ? "-" : n.run_id(), ToString(n.state()),
                      absl::StrCat(n.generation()), ranks.empty() ? "-" : absl::StrJoin(ranks, " "),
                      n.lease_alive() ? "alive" : "none"});
    }
    absl::StrAppend(&out, FormatTable(rows, "  "));
  }
  return out;
}

// The run's checkpoints.
std::string DescribeCheckpoints(const v1::Run& run) {
  std::string out;
  if (run.checkpoints_size() > 0) {
    absl::StrAppend(&out, "\nCheckpoints:\n");
    std::vector<std::vector<std::string>> rows = {{"STEP", "CREATED", "SIZE", "PATH"}};
    for (const v1::Checkpoint& c : run.checkpoints()) {
      rows.push_back({absl::StrCat(c.step()), FormatTimestamp(c.created_ms()),
                      FormatBytes(c.bytes()), c.path()});
    }
    absl::StrAppend(&out, FormatTable(rows, "  "));
  }

  return out;
}

}  // namespace

std::string FormatRunDescription(const v1::Run& run, int64_t now_ms) {
  return absl::StrCat(DescribeRun(run, now_ms), DescribeProgress(run, now_ms),
                      DescribeAttempts(run, now_ms), DescribeCluster(run),
                      DescribeCheckpoints(run));
}

int64_t ReachedStep(const v1::Run& run) {
  const v1::Progress& p = run.progress();
  if (run.state() == v1::RUN_STATE_SUCCEEDED && p.total_steps() > 0) return p.total_steps();
  return std::max(p.step(), p.last_checkpoint_step());
}

std::string FormatProgressLine(const v1::Run& run, std::optional<int64_t> eta_ms, int64_t now_ms,
                               int width) {
  const v1::Progress& p = run.progress();
  const int64_t step = ReachedStep(run);
  // The fields after the bar, in order, each with the rank at which it is
  // given up when the line is too wide (0: never; higher: later).
  struct Part {
    std::string text;
    int drop_rank;
  };
  std::vector<Part> parts;
  if (p.total_steps() > 0) {
    parts.push_back(
        {absl::StrCat(step, "/", p.total_steps(), " ",
                      std::clamp<int64_t>(step, 0, p.total_steps()) * 100 / p.total_steps(), "%"),
         0});
  } else {
    parts.push_back({absl::StrCat("step ", step), 0});
  }
  if (step > 0) parts.push_back({absl::StrFormat(" loss %.3f", p.loss()), 2});
  if (p.samples_per_sec() > 0) {
    parts.push_back({absl::StrFormat(" %.1f samples/s", p.samples_per_sec()), 1});
  }
  if (eta_ms.has_value() && !IsFinal(run.state())) {
    parts.push_back({absl::StrCat(" ETA ", FormatDuration(*eta_ms)), 5});
  }
  parts.push_back({absl::StrCat(" restarts ", run.restarts()), 3});
  if (run.state() != v1::RUN_STATE_RUNNING) {
    std::string state = absl::StrCat(" ", ToString(run.state()));
    if (run.state() == v1::RUN_STATE_RESTARTING && run.next_restart_ms() > now_ms) {
      absl::StrAppend(&state, " in ", FormatDuration(run.next_restart_ms() - now_ms));
    }
    parts.push_back({state, 0});
  } else {
    if (p.phase() != v1::PHASE_TRAINING && p.phase() != v1::PHASE_UNSPECIFIED) {
      parts.push_back({absl::StrCat(" ", absl::AsciiStrToLower(ToString(p.phase()))), 6});
    }
    if (p.time_ms() > 0 && now_ms - p.time_ms() > kStaleReportMs) {
      parts.push_back({absl::StrCat(" last report ", Ago(p.time_ms(), now_ms)), 4});
    }
  }
  const auto join = [&parts] {
    std::string line;
    for (const Part& part : parts) line += part.text;
    return line;
  };
  std::string line = join();
  // On a terminal the last column stays free (see FitWidth). First the bar
  // gives up cells, down to kMinBarWidth ("[", "] " cost 3 more columns),
  // then it goes, then the fields by rank, then the text is cut.
  const int room = width > 0 ? width - 1 : std::numeric_limits<int>::max();
  int cells = p.total_steps() > 0 ? kBarWidth : 0;
  if (cells > 0 && static_cast<int64_t>(line.size()) + 3 + cells > room) {
    const int64_t left = static_cast<int64_t>(room) - static_cast<int64_t>(line.size()) - 3;
    cells = left >= kMinBarWidth ? static_cast<int>(left) : 0;
  }
  for (int rank = 1; cells == 0 && static_cast<int64_t>(line.size()) > room && rank <= 6; ++rank) {
    parts.erase(std::remove_if(parts.begin(), parts.end(),
                               [rank](const Part& part) { return part.drop_rank == rank; }),
                parts.end());
    line = join();
  }
  if (cells == 0) return FitWidth(line, width);
  const int64_t clamped = std::clamp<int64_t>(step, 0, p.total_steps());
  const int filled = static_cast<int>(clamped * cells / p.total_steps());
  return absl::StrCat("[", std::string(filled, '#'), std::string(cells - filled, '.'), "] ", line);
}

std::string FormatEventLine(const v1::RunEvent& e) {
  std::string line = absl::StrCat(FormatTimestamp(e.time_ms()), " ", e.run_id());
  if (e.attempt() > 0) absl::StrAppend(&line, " attempt ", e.attempt());
  absl::StrAppend(&line, " ", ToString(e.kind()));
  const bool about_rank = e.kind() == v1::EVENT_KIND_WORKER_EXIT ||
                          e.kind() == v1::EVENT_KIND_HANG || e.kind() == v1::EVENT_KIND_OOM_SPLIT;
  if (about_rank && e.rank() >= 0) absl::StrAppend(&line, " rank ", e.rank());
  switch (e.kind()) {
    case v1::EVENT_KIND_STATE:
      absl::StrAppend(&line, " ", ToString(e.state()));
      if (!e.reason().empty()) absl::StrAppend(&line, ": ", e.reason());
      return line;
    case v1::EVENT_KIND_PROGRESS: {
      const v1::Progress& p = e.progress();
      absl::StrAppend(&line, " step ", StepOfTotal(p), absl::StrFormat(" loss %.3f", p.loss()));
      if (p.samples_per_sec() > 0)
        absl::StrAppend(&line, absl::StrFormat(" %.1f samples/s", p.samples_per_sec()));
      return line;
    }
    case v1::EVENT_KIND_CHECKPOINT:
      absl::StrAppend(&line, " step ", e.checkpoint_step());
      break;
    default:
      break;
  }
  if (!e.reason().empty()) absl::StrAppend(&line, " ", e.reason());
  if (e.exit_class() != v1::EXIT_CLASS_UNSPECIFIED)
    absl::StrAppend(&line, " (", Lower(e.exit_class()), ")");
  if (e.kind() == v1::EVENT_KIND_RESTART)
    absl::StrAppend(&line, absl::StrFormat("; backoff %.1f s", e.delay_s()));
  return line;
}

bool IsNotable(const v1::RunEvent& event) { return event.kind() != v1::EVENT_KIND_PROGRESS; }

void ApplyEvent(const v1::RunEvent& e, v1::Run* run) {
  switch (e.kind()) {
    case v1::EVENT_KIND_STATE:
      run->set_state(e.state());
      run->set_reason(e.reason());
      if (IsFinal(e.state())) run->set_ended_ms(e.time_ms());
      break;
    case v1::EVENT_KIND_PROGRESS:
      *run->mutable_progress() = e.progress();
      break;
    case v1::EVENT_KIND_RESTART:
      if (e.exit_class() == v1::EXIT_CLASS_DIVERGED) {
        run->set_rollbacks(run->rollbacks() + 1);
        break;
      }
      run->set_restarts(run->restarts() + 1);
      if (e.exit_class() == v1::EXIT_CLASS_OOM) run->set_oom_restarts(run->oom_restarts() + 1);
      run->set_next_restart_ms(e.time_ms() + std::llround(e.delay_s() * 1000));
      break;
    case v1::EVENT_KIND_CHECKPOINT:
      run->mutable_progress()->set_last_checkpoint_step(e.checkpoint_step());
      break;
    default:
      break;
  }
  run->set_updated_ms(std::max(run->updated_ms(), e.time_ms()));
}

std::string FormatNode(const v1::Node& node) {
  std::string out = Field("Host", node.hostname());
  absl::StrAppend(
      &out, Field("Version", node.version()), Field("Started", FormatTimestamp(node.started_ms())),
      Field("Uptime", FormatDuration(node.uptime_s() * 1000)),
      Field("Runs", absl::StrCat(node.runs_pending(), " pending, ", node.runs_active(), " active")),
      Field("NVML", node.nvml() ? "found" : "not found"));
  if (node.gpus_size() > 0) {
    std::vector<std::vector<std::string>> rows = {{"GPU", "NAME", "UUID", "MEMORY", "HEALTH"}};
    for (const v1::Gpu& g : node.gpus()) {
      std::string health = g.healthy() ? "healthy" : absl::StrCat("unhealthy: ", g.reason());
      if (!g.health_error().empty()) {
        absl::StrAppend(&health, " (not read: ", g.health_error(), ")");
      }
      rows.push_back({absl::StrCat(g.index()), g.name(), g.uuid(),
                      absl::StrCat(FormatBytes(g.memory_used_bytes()), " / ",
                                   FormatBytes(g.memory_total_bytes())),
                      health});
    }
    absl::StrAppend(&out, "\n", FormatTable(rows));
  }
  if (node.slots_size() > 0) {
    std::vector<std::vector<std::string>> rows = {
        {"SLOT", "DEVICE", "STATE", "RUN", "RANK", "REASON"}};
    for (const v1::Slot& s : node.slots()) {
      const bool busy = !s.run_id().empty();
      // A drained slot says why, and who drained it; a rank still there is
      // being stopped.
      std::string reason = s.reason();
      if (s.state() == v1::SLOT_STATE_DRAINED) {
        reason = absl::StrCat(s.drain_reason(), " (", s.drain_source(), ")");
      }
      rows.push_back({s.name().empty() ? absl::StrCat(s.index()) : s.name(),
                      s.gpu() ? absl::StrCat("gpu ", s.gpu_index()) : "cpu", ToString(s.state()),
                      busy ? s.run_id() : "-", busy ? absl::StrCat(s.rank()) : "-", reason});
    }
    absl::StrAppend(&out, "\n", FormatTable(rows));
  }
  return out;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool indent) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = indent;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  return std::string(absl::StripTrailingAsciiWhitespace(json));
}

int LatestAttempt(const v1::Run& run) {
  int latest = 0;
  for (const auto& a : run.attempts()) latest = std::max(latest, a.number());
  return latest;
}

absl::StatusOr<std::string> LogPath(const v1::Run& run, int attempt, int rank) {
  if (run.world_size() > 0 && (rank < 0 || rank >= run.world_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the run's world of ", run.world_size()));
  }
  if (attempt == 0) attempt = LatestAttempt(run);
  if (attempt == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", run.run_id(), " has not started yet"));
  }
  const v1::Attempt* a = FindAttempt(run, attempt);
  if (a == nullptr) {
    return absl::NotFoundError(absl::StrCat("run ", run.run_id(), " has no attempt ", attempt));
  }
  for (const auto& r : a->ranks()) {
    if (r.rank() == rank && !r.log_path().empty()) return r.log_path();
  }
  return RunLayout(run.run_dir()).LogPath(attempt, rank);
}

}  // namespace trainsup::supervisor

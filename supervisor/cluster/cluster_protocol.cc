#include "supervisor/cluster/cluster_protocol.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainsup::supervisor {
namespace {

using nlohmann::json;

const char* ActionName(GenerationRecord::Action a) {
  switch (a) {
    case GenerationRecord::Action::kRun:
      return "run";
    case GenerationRecord::Action::kFail:
      return "fail";
    case GenerationRecord::Action::kCancel:
      return "cancel";
  }
  return "run";
}

// Parses `text` as a JSON object; InvalidArgument naming `what` otherwise.
absl::StatusOr<json> ParseObject(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  }
  return j;
}

}  // namespace

JobKeys::Parsed JobKeys::Parse(const std::string& key) const {
  Parsed p;
  if (key.compare(0, prefix_.size(), prefix_) != 0) return p;
  const std::string rest = key.substr(prefix_.size());
  if (rest == "spec" || rest == "generation") {
    p.kind = rest;
  } else if (rest.rfind("nodes/", 0) == 0 && rest.size() > 6) {
    p.kind = "node";
    p.node = rest.substr(6);
  } else if (rest.rfind("rdzv/", 0) == 0) {
    const size_t slash = rest.find('/', 5);
    int64_t g = 0;
    if (slash != std::string::npos && slash + 1 < rest.size() &&
        absl::SimpleAtoi(rest.substr(5, slash - 5), &g)) {
      p.kind = "join";
      p.generation = g;
      p.node = rest.substr(slash + 1);
    }
  }
  return p;
}

std::string EncodeJoin(const JoinRecord& r) {
  return json{{"node", r.node},       {"run_id", r.run_id}, {"attempt", r.attempt},
              {"address", r.address}, {"port", r.port},     {"steps", r.steps}}
      .dump();
}

absl::StatusOr<JoinRecord> DecodeJoin(const std::string& text) {
  absl::StatusOr<json> j = ParseObject(text, "join record");
  if (!j.ok()) return j.status();
  JoinRecord r;
  try {
    r.node = j->at("node").get<std::string>();
    r.run_id = j->value("run_id", "");
    r.attempt = j->value("attempt", 0);
    r.address = j->at("address").get<std::string>();
    r.port = j->at("port").get<int>();
    r.steps = j->value("steps", std::vector<int64_t>{});
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("join record: ", e.what()));
  }
  return r;
}

std::string EncodeGeneration(const GenerationRecord& r) {
  json history = json::array();
  for (const AttemptEnd& e : r.history) {
    history.push_back({{"end_s", e.end_s},
                       {"class", ToString(e.cls)},
                       {"made_progress", e.made_progress},
                       {"detail", e.detail}});
  }
  return json{{"generation", r.generation},
              {"action", ActionName(r.action)},
              {"restarts", r.restarts},
              {"delay_s", r.delay_s},
              {"by", r.by},
              {"reason", r.reason},
              {"history", history}}
      .dump();
}

absl::StatusOr<GenerationRecord> DecodeGeneration(const std::string& text) {
  absl::StatusOr<json> j = ParseObject(text, "generation record");
  if (!j.ok()) return j.status();
  GenerationRecord r;
  try {
    r.generation = j->at("generation").get<int64_t>();
    const std::string action = j->value("action", "run");
    if (action == "run") {
      r.action = GenerationRecord::Action::kRun;
    } else if (action == "fail") {
      r.action = GenerationRecord::Action::kFail;
    } else if (action == "cancel") {
      r.action = GenerationRecord::Action::kCancel;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("generation record: unknown action \"", action, "\""));
    }
    r.restarts = j->value("restarts", int64_t{0});
    r.delay_s = j->value("delay_s", 0.0);
    r.by = j->value("by", "");
    r.reason = j->value("reason", "");
    for (const json& e : j->value("history", json::array())) {
      AttemptEnd end;
      end.end_s = e.value("end_s", 0.0);
      end.cls = ExitClassFromString(e.value("class", "crash")).value_or(ExitClass::kCrash);
      end.made_progress = e.value("made_progress", false);
      end.detail = e.value("detail", "");
      r.history.push_back(end);
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("generation record: ", e.what()));
  }
  if (r.generation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation record: generation ", r.generation, " < 1"));
  }
  return r;
}

GenerationRecord NextGeneration(const GenerationRecord& current, const AttemptEnd& end,
                                const RestartPolicy& policy, const std::string& by,
                                const std::string& reason) {
  GenerationRecord next;
  next.generation = current.generation + 1;
  next.by = by;
  next.history = current.history;
  next.history.push_back(end);
  if (next.history.size() > GenerationRecord::kMaxHistory) {
    next.history.erase(next.history.begin(), next.history.end() - GenerationRecord::kMaxHistory);
  }
  // No jitter: every node reads the one delay written here.
  const RestartDecision d = DecideRestart(policy, next.history, /*jitter_unit=*/0.5);
  next.restarts = current.restarts;
  if (d.action == Action::kRestart) {
    next.action = GenerationRecord::Action::kRun;
    next.restarts = current.restarts + 1;
    next.delay_s = d.delay_s;
    next.reason = absl::StrCat(reason, "; ", d.reason);
  } else {
    next.action = GenerationRecord::Action::kFail;
    next.reason = absl::StrCat(reason, "; ", d.reason);
  }
  return next;
}

absl::StatusOr<std::optional<Agreement>> Agree(const std::vector<JoinRecord>& joined, int nodes,
                                               const std::string& self) {
  std::vector<const JoinRecord*> sorted;
  for (const JoinRecord& r : joined) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(),
            [](const JoinRecord* a, const JoinRecord* b) { return a->node < b->node; });
  if (static_cast<int>(sorted.size()) > nodes) {
    std::vector<std::string> names;
    for (const JoinRecord* r : sorted) names.push_back(r->node);
    return absl::InvalidArgumentError(absl::StrCat(sorted.size(), " nodes joined a job of ", nodes,
                                                   " (", absl::StrJoin(names, ", "),
                                                   "): check cluster.nodes and node names"));
  }
  if (static_cast<int>(sorted.size()) < nodes) return std::optional<Agreement>();
  Agreement a;
  std::set<int64_t> common;
  for (size_t i = 0; i < sorted.size(); ++i) {
    a.nodes.push_back(sorted[i]->node);
    if (sorted[i]->node == self) a.node_rank = static_cast<int>(i);
    std::set<int64_t> steps(sorted[i]->steps.begin(), sorted[i]->steps.end());
    if (i == 0) {
      common = steps;
    } else {
      std::set<int64_t> both;
      std::set_intersection(common.begin(), common.end(), steps.begin(), steps.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (a.node_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", self, " is not among the nodes that joined"));
  }
  a.master_addr = sorted[0]->address;
  a.master_port = sorted[0]->port;
  a.resume_step = common.empty() ? -1 : *common.rbegin();
  return std::optional<Agreement>(std::move(a));
}

}  // namespace trainsup::supervisor

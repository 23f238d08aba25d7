#include "supervisor/policy/cluster_protocol.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
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

// The integer at `key` of `j`, `fallback` when absent (nullopt: required).
// InvalidArgument naming `what` and the key unless it is a JSON integer in
// [lo, hi]: a float (1e300) or a string is refused, never converted.
absl::StatusOr<int64_t> IntField(const json& j, const char* what, const char* key,
                                 std::optional<int64_t> fallback, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(what, ": no \"", key, "\""));
  }
  bool in_range = false;
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(hi);
    v = in_range ? static_cast<int64_t>(u) : 0;
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
    in_range = v >= lo && v <= hi;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" is not an integer"));
  }
  if (!in_range || v < lo) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"", key, "\" out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

// `s` cut to at most `max` bytes on a UTF-8 character boundary, marked
// with "..." when cut.
std::string Truncated(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max - 3;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

}  // namespace

JobKeys::Parsed JobKeys::Parse(const std::string& key) const {
  Parsed p;
  if (key.compare(0, prefix_.size(), prefix_) != 0) return p;
  const std::string rest = key.substr(prefix_.size());
  if (rest == "spec" || rest == "generation" || rest == "submission") {
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
              {"address", r.address}, {"port", r.port},     {"steps", r.steps},
              {"sees", r.sees}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<JoinRecord> DecodeJoin(const std::string& text) {
  absl::StatusOr<json> j = ParseObject(text, "join record");
  if (!j.ok()) return j.status();
  JoinRecord r;
  constexpr const char* what = "join record";
  try {
    r.node = j->at("node").get<std::string>();
    r.run_id = j->value("run_id", "");
    r.sees = j->value("sees", "");
    absl::StatusOr<int64_t> attempt = IntField(*j, what, "attempt", 0, 0, INT32_MAX);
    if (!attempt.ok()) return attempt.status();
    r.attempt = static_cast<int>(*attempt);
    r.address = j->at("address").get<std::string>();
    // MASTER_ADDR for every rank: a host name or an IP address, nothing else.
    const bool form = !r.address.empty() && r.address.size() <= 253 &&
                      std::all_of(r.address.begin(), r.address.end(), [](char ch) {
                        return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '.' ||
                               ch == '-' || ch == ':' || ch == '_';
                      });
    if (!form) {
      return absl::InvalidArgumentError(absl::StrCat("join record: address \"",
                                                     absl::CHexEscape(r.address.substr(0, 64)),
                                                     "\" is not a host name or an IP address"));
    }
    absl::StatusOr<int64_t> port = IntField(*j, what, "port", std::nullopt, 1, 65535);
    if (!port.ok()) return port.status();
    r.port = static_cast<int>(*port);
    const json steps = j->value("steps", json::array());
    if (!steps.is_array())
      return absl::InvalidArgumentError("join record: \"steps\" is not a list");
    for (const json& step : steps) {
      absl::StatusOr<int64_t> v =
          IntField(json{{"step", step}}, what, "step", std::nullopt, 0, INT64_MAX);
      if (!v.ok()) return v.status();
      r.steps.push_back(*v);
    }
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
              {"history", history},
              {"members", r.members},
              {"left_out", r.left_out},
              {"grow", r.grow},
              {"resize", r.resize}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<GenerationRecord> DecodeGeneration(const std::string& text) {
  absl::StatusOr<json> j = ParseObject(text, "generation record");
  if (!j.ok()) return j.status();
  GenerationRecord r;
  constexpr const char* what = "generation record";
  try {
    absl::StatusOr<int64_t> generation =
        IntField(*j, what, "generation", std::nullopt, 1, INT64_MAX - 1);
    if (!generation.ok()) return generation.status();
    r.generation = *generation;
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
    absl::StatusOr<int64_t> restarts = IntField(*j, what, "restarts", 0, 0, INT64_MAX - 1);
    if (!restarts.ok()) return restarts.status();
    r.restarts = *restarts;
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
    for (const char* key : {"members", "left_out"}) {
      const json names = j->value(key, json::array());
      if (!names.is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat("generation record: \"", key, "\" is not a list"));
      }
      std::vector<std::string>& out = std::string(key) == "members" ? r.members : r.left_out;
      for (const json& name : names) {
        if (!name.is_string() || name.get<std::string>().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("generation record: \"", key, "\" holds something not a node name"));
        }
        out.push_back(name.get<std::string>());
      }
    }
    r.grow = j->value("grow", false);
    r.resize = j->value("resize", "");
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("generation record: ", e.what()));
  }
  if (r.delay_s < 0) return absl::InvalidArgumentError("generation record: \"delay_s\" < 0");
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
  next.history.back().detail = Truncated(end.detail, GenerationRecord::kMaxDetailBytes);
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
  next.reason = Truncated(next.reason, GenerationRecord::kMaxReasonBytes);
  return next;
}

GenerationRecord ResizeGeneration(const GenerationRecord& current, const std::string& by,
                                  const std::string& reason) {
  GenerationRecord next = current;
  next.generation = current.generation + 1;
  next.action = GenerationRecord::Action::kRun;
  next.delay_s = 0;
  next.by = by;
  next.members.clear();
  next.left_out.clear();
  next.grow = true;
  next.resize = Truncated(reason, GenerationRecord::kMaxReasonBytes);
  next.reason = next.resize;
  return next;
}

GenerationRecord CloseRendezvous(const GenerationRecord& current, std::vector<std::string> joined,
                                 std::vector<std::string> left_out, const std::string& reason) {
  GenerationRecord closed = current;
  std::sort(joined.begin(), joined.end());
  std::sort(left_out.begin(), left_out.end());
  closed.members = std::move(joined);
  closed.left_out = std::move(left_out);
  closed.resize = Truncated(reason, GenerationRecord::kMaxReasonBytes);
  return closed;
}

absl::StatusOr<std::optional<Agreement>> Agree(const std::vector<JoinRecord>& joined, int nodes,
                                               const std::string& self,
                                               const std::vector<std::string>& members) {
  std::vector<const JoinRecord*> sorted;
  const std::set<std::string> closed(members.begin(), members.end());
  for (const JoinRecord& r : joined) {
    if (closed.empty() || closed.count(r.node) != 0) sorted.push_back(&r);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const JoinRecord* a, const JoinRecord* b) { return a->node < b->node; });
  if (!closed.empty()) {
    // Every member's record, then the agreement among them; a node left
    // out waits for the generation that takes it in.
    if (sorted.size() < closed.size() || closed.count(self) == 0) {
      return std::optional<Agreement>();
    }
    nodes = static_cast<int>(closed.size());
  }
  if (static_cast<int>(sorted.size()) > nodes) {
    std::vector<std::string> names;
    for (const JoinRecord* r : sorted) names.push_back(r->node);
    return absl::InvalidArgumentError(absl::StrCat(sorted.size(), " nodes joined a job of ", nodes,
                                                   " (", absl::StrJoin(names, ", "),
                                                   "): check cluster.nodes and node names"));
  }
  if (static_cast<int>(sorted.size()) < nodes) return std::optional<Agreement>();
  for (const JoinRecord* r : sorted) {
    if (r->sees != sorted[0]->sees) return std::optional<Agreement>();
  }
  Agreement a;
  a.sees = sorted[0]->sees;
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

std::string RendezvousTimeoutReason(int64_t generation,
                                    const std::map<std::string, JoinRecord>& joined, int64_t nodes,
                                    double timeout_s) {
  std::vector<std::string> names, sees;
  for (const auto& [node, r] : joined) {
    names.push_back(node);
    sees.push_back(absl::StrCat(node, ": ", r.sees.empty() ? "none" : absl::CHexEscape(r.sees)));
  }
  if (names.size() >= static_cast<size_t>(nodes)) {
    return absl::StrCat("rendezvous of generation ", generation, ": all ", names.size(),
                        " nodes joined but do not see the same owner record "
                        "(trainsup-job.json) in cluster.checkpoint_dir (",
                        absl::StrJoin(sees, ", "), ") within ", timeout_s, " s; the job fails");
  }
  return absl::StrCat("rendezvous of generation ", generation, ": only ", names.size(), " of ",
                      nodes, " nodes joined within ", timeout_s, " s (", absl::StrJoin(names, ", "),
                      "); the job fails");
}

std::vector<JoinRecord> BoundJoins(const std::map<std::string, JoinRecord>& joins,
                                   const std::map<std::string, int64_t>& node_leases,
                                   std::vector<std::string>* unbound) {
  std::vector<JoinRecord> bound;
  for (const auto& [node, r] : joins) {
    auto lease = node_leases.find(node);
    if (r.lease != 0 && lease != node_leases.end() && lease->second == r.lease) {
      bound.push_back(r);
    } else {
      unbound->push_back(node);
    }
  }
  return bound;
}

}  // namespace trainsup::supervisor

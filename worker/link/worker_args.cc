#include "worker/link/worker_args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "contracts/data_roots.h"

namespace trainsup::worker {

absl::StatusOr<WorkerArgs> ParseWorkerArgs(const std::vector<std::string>& argv) {
  const auto usage = [](const std::string& message) { return absl::InvalidArgumentError(message); };
  std::map<std::string, std::string> args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) return usage("unexpected argument " + a);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      args[a.substr(2, eq - 2)] = a.substr(eq + 1);
    } else if (i + 1 < argv.size()) {
      args[a.substr(2)] = argv[++i];
    } else {
      return usage("missing value for " + a);
    }
  }
  for (const auto& [k, v] : args) {
    if (k != "run-dir" && k != "rank" && k != "world-size" && k != "attempt" && k != "supervisor" &&
        k != "resume") {
      return usage("unknown option --" + k);
    }
  }
  WorkerArgs w;
  w.run_dir = args["run-dir"];
  if (w.run_dir.empty()) return usage("--run-dir is required");
  if (!absl::SimpleAtoi(args.count("rank") ? args["rank"] : "0", &w.rank) || w.rank < 0) {
    return usage("--rank: not a rank: " + args["rank"]);
  }
  if (args.count("world-size") &&
      (!absl::SimpleAtoi(args["world-size"], &w.world_size) || w.world_size < 1)) {
    return usage("--world-size: not a size: " + args["world-size"]);
  }
  if (args.count("attempt") && (!absl::SimpleAtoi(args["attempt"], &w.attempt) || w.attempt < 1)) {
    return usage("--attempt: not an attempt number: " + args["attempt"]);
  }
  w.supervisor = args["supervisor"];
  if (args.count("resume")) w.resume = args["resume"];
  return w;
}

absl::Status CheckResume(const std::string& resume) {
  int64_t step = 0;
  if (resume != "latest" && resume != "none" && (!absl::SimpleAtoi(resume, &step) || step < 0)) {
    return absl::InvalidArgumentError("--resume: latest, none or a step number, got " + resume);
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerEnv> ParseWorkerEnv(const std::map<std::string, std::string>& env) {
  const auto get = [&env](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  WorkerEnv w;
  // The launch contract's rendezvous (docs/design.md): rank 0 hosts the store.
  if (const std::string* addr = get("MASTER_ADDR"); addr != nullptr && !addr->empty()) {
    w.master_addr = *addr;
  }
  if (const std::string* port = get("MASTER_PORT"); port != nullptr && !port->empty()) {
    if (!absl::SimpleAtoi(*port, &w.master_port) || w.master_port < 1 || w.master_port > 65535) {
      return absl::InvalidArgumentError("MASTER_PORT: not a port: " + *port);
    }
  }
  if (const std::string* addr = get("TRAINSUP_NODE_ADDR")) w.node_addr = *addr;
  if (const std::string* ifname = get("GLOO_SOCKET_IFNAME")) w.gloo_ifname = *ifname;
  if (const std::string* budget = get("TRAINSUP_MEMORY_BUDGET_MB")) {
    if (!absl::SimpleAtoi(*budget, &w.memory_budget_mb)) w.memory_budget_mb = 0;
  }
  const std::string* roots_text = get(kDataRootsEnv);
  absl::StatusOr<std::optional<std::vector<std::string>>> roots =
      ParseDataRoots(roots_text == nullptr ? nullptr : roots_text->c_str());
  if (!roots.ok()) return roots.status();
  w.data_roots = *roots;
  if (const std::string* id = get("TRAINSUP_RUN_ID")) w.run_id = *id;
  if (const std::string* token = get("TRAINSUP_TOKEN")) w.token = *token;
  if (const std::string* windows = get("TRAINSUP_SKIP_WINDOWS")) {
    absl::StatusOr<std::vector<StepWindow>> parsed = ParseStepWindows(*windows);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINSUP_SKIP_WINDOWS: ", parsed.status().message()));
    }
    w.skip_windows = std::move(*parsed);
  }
  if (const std::string* factor = get("TRAINSUP_LR_FACTOR")) {
    if (!absl::SimpleAtod(*factor, &w.lr_factor) || !(w.lr_factor > 0 && w.lr_factor <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINSUP_LR_FACTOR: must be a number in (0, 1], got \"", *factor, "\""));
    }
  }
  return w;
}

}  // namespace trainsup::worker

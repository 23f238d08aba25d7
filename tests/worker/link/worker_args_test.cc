// The worker contract from both ends: what the daemon launches
// (BuildWorkerLaunch, supervisor/policy/launch_plan.h) is what the worker
// parses back (ParseWorkerArgs, ParseWorkerEnv), field by field; and each
// usage mistake with its exact message.
#include "worker/link/worker_args.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "supervisor/policy/launch_plan.h"

namespace trainsup::worker {
namespace {

struct Parsed {
  WorkerArgs args;
  WorkerEnv env;
};

Parsed RoundTrip(const supervisor::WorkerLaunch& launch) {
  const supervisor::LaunchSpec spec = supervisor::BuildWorkerLaunch(launch);
  EXPECT_EQ(spec.binary, launch.binary);
  absl::StatusOr<WorkerArgs> args = ParseWorkerArgs(spec.args);
  EXPECT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(CheckResume(args->resume).ok()) << args->resume;
  std::map<std::string, std::string> env;
  for (const char* name : kWorkerEnvNames) {
    auto it = spec.env.find(name);
    if (it != spec.env.end()) env[name] = it->second;
  }
  absl::StatusOr<WorkerEnv> parsed_env = ParseWorkerEnv(env);
  EXPECT_TRUE(parsed_env.ok()) << parsed_env.status();
  return {*args, *parsed_env};
}

void ExpectSame(const supervisor::WorkerLaunch& w, const Parsed& p) {
  EXPECT_EQ(p.args.run_dir, w.run_dir);
  EXPECT_EQ(p.args.rank, w.rank);
  EXPECT_EQ(p.args.world_size, w.world_size);
  EXPECT_EQ(p.args.attempt, w.attempt);
  EXPECT_EQ(p.args.supervisor, w.supervisor_endpoint);
  EXPECT_EQ(p.args.resume, w.resume_step >= 0 ? std::to_string(w.resume_step) : "none");
  EXPECT_EQ(p.env.master_addr, w.master_addr);
  EXPECT_EQ(p.env.master_port, w.master_port);
  EXPECT_EQ(p.env.memory_budget_mb, w.memory_budget_mb);
  ASSERT_TRUE(p.env.data_roots.has_value());
  EXPECT_EQ(*p.env.data_roots, w.data_roots);
  EXPECT_EQ(p.env.run_id, std::optional<std::string>(w.run_id));
  EXPECT_EQ(p.env.token, w.token);
  EXPECT_EQ(p.env.node_addr, w.node_addr);
  EXPECT_EQ(p.env.gloo_ifname,
            w.daemon_env.count("GLOO_SOCKET_IFNAME") ? w.daemon_env.at("GLOO_SOCKET_IFNAME") : "");
}

TEST(WorkerArgs, WhatTheDaemonLaunchesTheWorkerParsesBack) {
  supervisor::WorkerLaunch fresh;
  fresh.binary = "/usr/bin/trainsup-worker";
  fresh.run_id = "r-1";
  fresh.run_dir = "/var/lib/trainsup/runs/r-1";
  fresh.supervisor_endpoint = "unix:/run/trainsup/trainsupd.sock";
  fresh.token = "secret-1";
  fresh.master_port = 29500;
  fresh.data_roots = {"/data"};

  supervisor::WorkerLaunch gang = fresh;
  gang.run_id = "r-2";
  gang.run_dir = "/srv/runs/r 2";  // a space survives: argv, not a shell line
  gang.attempt = 7;
  gang.rank = 3;
  gang.world_size = 4;
  gang.local_rank = 1;
  gang.local_world_size = 2;
  gang.resume_step = 1200;
  gang.memory_budget_mb = 512;
  gang.master_addr = "10.0.0.2";
  gang.node_addr = "10.0.0.7";
  gang.daemon_env["GLOO_SOCKET_IFNAME"] = "eth1";
  gang.master_port = 40001;
  gang.data_roots = {"/data/a", "/data/b"};
  gang.gpu = "1";

  supervisor::WorkerLaunch unconfined = fresh;
  unconfined.supervisor_endpoint = "";  // a debugging launch without a daemon
  unconfined.resume_step = 0;
  unconfined.data_roots = {};

  for (const supervisor::WorkerLaunch* w : {&fresh, &gang, &unconfined}) {
    SCOPED_TRACE(w->run_id + " rank " + std::to_string(w->rank));
    ExpectSame(*w, RoundTrip(*w));
  }
}

TEST(WorkerArgs, BothSpellingsOfAFlagAndTheDefaults) {
  absl::StatusOr<WorkerArgs> a = ParseWorkerArgs({"--run-dir=/r", "--rank", "2", "--world-size=3"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->run_dir, "/r");
  EXPECT_EQ(a->rank, 2);
  EXPECT_EQ(a->world_size, 3);
  EXPECT_EQ(a->attempt, 1);
  EXPECT_EQ(a->supervisor, "");
  EXPECT_EQ(a->resume, "latest");
}

std::string Error(const std::vector<std::string>& args) {
  absl::StatusOr<WorkerArgs> a = ParseWorkerArgs(args);
  return a.ok() ? "ok" : std::string(a.status().message());
}

TEST(WorkerArgs, EachMistakeIsNamed) {
  EXPECT_EQ(Error({"/r"}), "unexpected argument /r");
  EXPECT_EQ(Error({"--run-dir", "/r", "--rank"}), "missing value for --rank");
  EXPECT_EQ(Error({"--run-dir", "/r", "--ranks", "1"}), "unknown option --ranks");
  EXPECT_EQ(Error({"--rank", "1"}), "--run-dir is required");
  EXPECT_EQ(Error({"--run-dir", "/r", "--rank", "-1"}), "--rank: not a rank: -1");
  EXPECT_EQ(Error({"--run-dir", "/r", "--rank", "one"}), "--rank: not a rank: one");
  EXPECT_EQ(Error({"--run-dir", "/r", "--world-size", "0"}), "--world-size: not a size: 0");
  EXPECT_EQ(Error({"--run-dir", "/r", "--attempt", "0"}), "--attempt: not an attempt number: 0");
  EXPECT_EQ(CheckResume("yesterday").message(),
            "--resume: latest, none or a step number, got yesterday");
  EXPECT_EQ(CheckResume("-3").message(), "--resume: latest, none or a step number, got -3");
  for (const char* ok : {"latest", "none", "0", "1200"}) EXPECT_TRUE(CheckResume(ok).ok()) << ok;
}

TEST(WorkerArgs, TheEnvironmentsMistakesAreNamed) {
  EXPECT_EQ(ParseWorkerEnv({{"MASTER_PORT", "70000"}}).status().message(),
            "MASTER_PORT: not a port: 70000");
  EXPECT_EQ(ParseWorkerEnv({{"MASTER_PORT", "x"}}).status().message(),
            "MASTER_PORT: not a port: x");
  absl::StatusOr<WorkerEnv> none = ParseWorkerEnv({});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->data_roots.has_value());  // unset: no confinement
  EXPECT_FALSE(none->run_id.has_value());
  EXPECT_EQ(none->master_addr, "127.0.0.1");
  absl::StatusOr<WorkerEnv> bad_budget = ParseWorkerEnv({{"TRAINSUP_MEMORY_BUDGET_MB", "lots"}});
  ASSERT_TRUE(bad_budget.ok());
  EXPECT_EQ(bad_budget->memory_budget_mb, 0);  // ignored: the spec's budget holds
}

}  // namespace
}  // namespace trainsup::worker
